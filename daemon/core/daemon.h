/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_daemon: the process-wide state of tpipd: the event loop, the control socket and its
 * accept loop (with EMFILE back-off), the local part's state (sessions: local.h), the broker's
 * state (its pipes: pipe.h), the listener registry, the copy engine, signal handling and
 * graceful stop. Sessions and pipes do the protocol work.
 */
#ifndef TPD_DAEMON_H
#define TPD_DAEMON_H

#include <event2/event.h>
#include "config.h"
#include "copier.h"
#include "listener.h"
#include "quota.h"
#include "stats.h"
#include "ring.h"
#include "tpu.h"

struct tpd_broker;
struct tpd_local;
struct tpd_peers;

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
	struct tpd_local *local; /* sessions, their spin loop (local/local.c) */
	struct tpd_quota quota;	/* per-uid sessions and bytes held for clients (quota.c) */
	struct tpd_registry registry;
	struct tpd_broker *broker; /* pipes and their transfers (broker/) */
	struct tpb_copier *copier;
	struct event *ev_copier; /* the copier's event fd: its completions run from the loop */
	struct tpb_ctx *mpt;	 /* the mpt channel's context (cross-host transfers) */
	struct event *ev_mpt;	 /* its event fd */
	uint64_t start_ns;
	uint64_t drain_deadline_ns;
	bool stopping;
	bool cma_viable;
	struct tpw_limits limits; /* wire limits enforced on every session */
	struct tpd_stats stats;
	struct tpd_metrics *metrics; /* NULL when off */

	/* Peer links (peer/). */
	struct tpb_rdma *gdr;	 /* rdma and cuda_gdr: the ports (backends/rdma) */
	struct event *ev_rdma; /* its event fd */
	struct tpd_peers *peers; /* the peer part's own state (tpd_peers_new()) */
};

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
struct tpb_copier *tpd_daemon_copier(const struct tpd_daemon *d);
/* True once a graceful stop began. */
bool tpd_daemon_stopping(const struct tpd_daemon *d);
/* The broker's state (broker/pipe.h): pipes, their queues and totals. */
struct tpd_broker *tpd_daemon_broker(const struct tpd_daemon *d);
/* The local part's state (local/local.h): the sessions; borrowed, as above. */
struct tpd_local *tpd_daemon_local(const struct tpd_daemon *d);
/* Did the backend probe at start find CMA viable on this host? */
bool tpd_daemon_cma_viable(const struct tpd_daemon *d);
/* Copies or cross-host transfers in flight: the control rings' spin loop yields to them. */
bool tpd_daemon_bulk_running(const struct tpd_daemon *d);
/* The peer part (peer/, tpd_peers_new()); NULL before it is made. */
struct tpd_peers *tpd_daemon_peers(const struct tpd_daemon *d);
/* The mpt channel's context (tpb.h op table): each peer link opens its endpoint there. */
struct tpb_ctx *tpd_daemon_mpt(const struct tpd_daemon *d);
/* The RDMA context of rdma and cuda_gdr (backends/rdma/rdma.h). */
struct tpb_rdma *tpd_daemon_rdma(const struct tpd_daemon *d);
/* The control socket's resolved path: borrowed from @d, valid until tpd_daemon_free(). */
const char *tpd_daemon_socket_path(const struct tpd_daemon *d);
/* When the daemon started, on tpu_now_ns()'s clock (pipes' ages are counted from it). */
uint64_t tpd_daemon_start_ns(const struct tpd_daemon *d);

#endif
