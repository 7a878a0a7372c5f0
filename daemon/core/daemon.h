/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_daemon: the process-wide state of tpipd: the event loop, the control socket and its
 * accept loop (with EMFILE back-off), the list of sessions and pipes, the listener registry,
 * the copy engine, signal handling and graceful stop. Sessions and pipes do the protocol work.
 */
#ifndef TPD_DAEMON_H
#define TPD_DAEMON_H

#include <event2/event.h>
#include "config.h"
#include "copier.h"
#include "peerauth.h"
#include "listener.h"
#include "quota.h"
#include "stats.h"
#include "ring.h"
#include "tpu.h"

struct tpd_peertls;

struct tpd_daemon {
	struct tpd_config cfg;
	struct event_base *base;
	int listen_fd;
	char socket_path[108]; /* resolved control socket path */
	bool socket_bound;     /* we created the socket file and unlink it at exit */
	bool socket_activated; /* the service manager passed the socket */
	struct event *ev_tick; /* watchdog pings and STATUS= updates */
	uint64_t watchdog_usec;
	char last_status[160];
	struct event *ev_accept;
	struct event *ev_accept_resume;
	struct tpd_ratelog accept_log;
	struct event *ev_signals[4];
	struct event *ev_drain;
	struct event *ev_spin;	/* polls busy control rings between events */
	bool spinning;		/* ev_spin is active */
	uint64_t spin_until_ns; /* stop polling then, unless a ring moves */
	uint64_t slept_ns;	/* when the rings' sleeping flags were last set */
	struct tpu_spin spin;
	unsigned xh_running;	/* cross-host transfers on the stripe threads */
	uint8_t *scratch;	/* frames packed straight into a control ring */
	size_t scratch_cap;
	struct tpu_list sessions;
	unsigned n_sessions;
	struct tpd_quota quota;	/* per-uid sessions and bytes held for clients (quota.c) */
	uint64_t next_session_id;
	struct tpd_registry registry;
	struct tpu_list pipes;
	struct tpu_list flow_dirty; /* pipe ends with FlowCredit to send at the end of the pass */
	struct tpu_list budget_wait; /* pipe ends waiting for the daemon-wide budget, FIFO */
	unsigned n_pipes;
	struct tpu_list xwaits;	/* peers' connects waiting for a listener (xpipe.c) */
	uint64_t next_pipe_id;
	struct tpd_copier *copier;
	uint64_t start_ns;
	uint64_t drain_deadline_ns;
	uint64_t bytes_moved;
	uint64_t messages_moved;
	bool stopping;
	bool cma_viable;
	struct tpw_limits limits; /* wire limits enforced on every session */
	struct tpd_stats stats;
	struct tpd_metrics *metrics; /* NULL when off */

	/* Peer links (peer.c, peerhs.c, peerlisten.c). */
	struct tpb_rdma *gdr;	 /* rdma and cuda_gdr: the ports (backends/rdma) */
	struct event *ev_rdma; /* its event fd */
	struct tpu_list peers;
	struct tpu_list peer_flushq; /* peers with control frames to send at the end of the pass */
	unsigned n_peers;
	uint64_t next_peer_id;
	struct tpu_list peer_conns; /* accepted, first frame not read yet */
	struct tpu_list data_dials; /* data connections being dialled */
	int peer_fd;
	struct event *ev_peer_accept;
	struct event *ev_peer_accept_resume; /* accepts paused (EMFILE); freed by the daemon */
	struct tpd_ratelog peer_accept_log;
	char peer_listen_addr[80];  /* bound address, "" when off */
	uint16_t peer_port_bound;
	char hostname[256];
	uint8_t boot_id[16];
	char boot_id_hex[33];
	uint64_t instance;
	struct tpd_peer_key peer_key;
	bool peer_keyed;
	struct tpd_peertls *peer_tls; /* NULL: no authentication configured, or --peer-insecure */
	struct evdns_base *dns;	    /* created on first dial */
};

/*
 * tpd_daemon_spin_kick() - a control ring moved: poll every ring session from the event loop
 * (between other events) until none moves for the spin budget (--spin-us, adaptive), then set
 * the rings' sleeping flags so that clients ring the doorbell, and sleep in the event loop.
 */
void tpd_daemon_spin_kick(struct tpd_daemon *d);

/*
 * tpd_daemon_new() - bind the control socket, probe backends, start copy threads.
 * @cfg: borrowed; copied.
 * @ret: returns owned daemon, free with tpd_daemon_free().
 * Return: 0 or -errno (logged).
 */
int tpd_daemon_new(const struct tpd_config *cfg, struct tpd_daemon **ret);

/* Runs the loop until a stop signal has been handled. Return: 0 or -errno. */
int tpd_daemon_run(struct tpd_daemon *d);

/* Closes every session, frees everything, unlinks the socket. Accepts NULL. */
void tpd_daemon_free(struct tpd_daemon *d);

/*
 * tpd_daemon_reload() - re-read the configuration file and flags; apply what can change live,
 * log what needs a restart. A bad file leaves the running configuration in force.
 * Return: 0 or the error of the reload (logged).
 */
int tpd_daemon_reload(struct tpd_daemon *d);

/* Starts a graceful stop, as SIGTERM does. */
void tpd_daemon_stop(struct tpd_daemon *d, const char *why);

/* Uptime in milliseconds. */
uint64_t tpd_daemon_uptime_ms(const struct tpd_daemon *d);

/*
 * Settings and shared services of the daemon, for the parts outside core/ (local, broker, peer,
 * ctl): they read these through the accessors below, never through the fields of
 * struct tpd_daemon. Each returns a pointer borrowed from @d, valid until tpd_daemon_free();
 * the configuration may change on SIGHUP (tpd_daemon_reload()), between loop passes only.
 */
const struct tpd_config *tpd_daemon_cfg(const struct tpd_daemon *d);
struct event_base *tpd_daemon_base(const struct tpd_daemon *d);
/* Wire limits every session and peer frame is checked against. */
const struct tpw_limits *tpd_daemon_limits(const struct tpd_daemon *d);
/* Per-channel counters (stats.c): tpd_stats_record() updates them. */
struct tpd_stats *tpd_daemon_stats(struct tpd_daemon *d);
/* The listener registry (local/listener.c). */
struct tpd_registry *tpd_daemon_registry(struct tpd_daemon *d);
/* Per-uid accounting (quota.c). */
struct tpd_quota *tpd_daemon_quota(struct tpd_daemon *d);
/* The copy threads (backends' engine). */
struct tpd_copier *tpd_daemon_copier(const struct tpd_daemon *d);
/* True once a graceful stop began. */
bool tpd_daemon_stopping(const struct tpd_daemon *d);
/* The RDMA context of rdma and cuda_gdr (backends/rdma/rdma.h). */
struct tpb_rdma *tpd_daemon_rdma(const struct tpd_daemon *d);

#endif
