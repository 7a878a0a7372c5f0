/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipd configuration: defaults, the INI file (/etc/tpipd/tpipd.conf, parsed with libinih) and
 * command-line flags, all described by one option table so that every option has both forms
 * and flags always win. Also says which options a reload (SIGHUP) can change live. Every
 * user-controllable resource has a hard, configurable limit here.
 */
#ifndef TPD_CONFIG_H
#define TPD_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "log.h"
#include "validate.h"

#include "tpconfig.h" /* TPD_CONFIG_DEFAULT_PATH */

/* Default of --cuda-mappings-max: CUDA allocations and events a session keeps mapped
 * (local/devmem.c drops the least recently used beyond it). */
#define TPD_DEVMEM_HOLDS 256
/* Default of --cuda-dmabufs-max: dma-bufs of CUDA allocations a session may hand over (fds the
 * daemon holds for it; local/devmem.c, backends/rdma/dmabuf.c). */
#define TPD_DEVMEM_DMABUFS 64

struct tpd_config {
	char socket_path[108];
	enum tpu_log_level log_level;
	uint32_t copy_threads;
	bool no_cma;
	bool no_shm;
	bool no_rdma; /* neither rdma nor cuda_gdr on peer links */
	uint64_t rdma_cache; /* bytes of unused RDMA registrations kept (0: none) */
	uint32_t rdma_traffic_class; /* RoCE GRH traffic class of queue pairs */
	uint32_t rdma_sl;	     /* service level */
	uint32_t rdma_gid_index;     /* GID table entry of every port; UINT32_MAX: chosen */
	uint32_t rdma_timeout;	     /* local ACK timeout exponent */
	uint32_t rdma_retry;	     /* retry count */
	uint32_t rdma_rebuild_ms;    /* first wait before rebuilding a link's queue pairs */
	uint32_t rdma_rebuild_max;   /* rebuilds in a row without a completed write (0: none) */
	char backend_priority[128]; /* "shm,cma": channels tried first, in order */
	struct tpw_limits wire;	    /* frame, inline, segments, message bytes, metadata */
	uint32_t sessions_max;
	uint32_t sessions_per_uid;  /* sessions one uid (not root) may hold */
	uint32_t sessions_reserved; /* of sessions_max, kept for root and the admin group */
	uint32_t hello_timeout_ms;  /* a session must say Hello within this */
	uint32_t hello_frame_max;   /* largest frame before Hello */
	uint64_t input_bytes_per_uid; /* partial frames held for one uid's sessions */
	uint64_t input_bytes_max;   /* partial frames held for all sessions */
	uint64_t outq_per_uid;	    /* bytes queued towards one uid's sessions */
	uint64_t outq_total;	    /* bytes queued towards all sessions */
	uint32_t pipes_max;	    /* per session */
	uint32_t pipe_queue_max;    /* messages written, not yet read, per pipe direction */
	uint64_t pipe_queue_bytes;  /* inline bytes held per pipe direction */
	uint64_t pipe_queue_bytes_total; /* bytes held for unread messages of every pipe */
	uint32_t buffers_max;	    /* shared buffers per session */
	uint64_t buffer_bytes_max;  /* shared buffer bytes per session */
	uint64_t buffer_bytes_per_uid; /* shared buffer bytes of all sessions of one uid */
	uint32_t kept_fds_per_uid;  /* clients' fds kept for one uid (not root): quota.h */
	uint32_t waits_per_uid;	    /* channel and queue calls one uid (not root) has waiting */
	uint32_t kept_fds_max;	    /* ... for all clients; 0: derived from RLIMIT_NOFILE */
	uint32_t kept_fds_cap;	    /* in force: kept_fds_max, or the derived value (finish()) */
	uint32_t bcast_pipes_max;   /* targets of one Broadcast (0: none taken) */
	uint64_t bcast_stage_bytes_per_uid; /* daemon staging of one uid's broadcasts */
	uint64_t outq_max;	    /* bytes queued towards one session before it is dropped */
	uint32_t listeners_max;	    /* per session */
	uint32_t cuda_holds_max;    /* CUDA allocations and events a session keeps mapped */
	uint32_t cuda_dmabufs_max;  /* dma-bufs of CUDA allocations a session may hand over */
	bool cuda_cache;	    /* keep them mapped between transfers (default: no) */
	bool pipe_ring;		    /* private->private through pipe rings (issue 27) */
	uint64_t pipe_ring_min;	    /* smallest message that uses one */
	uint64_t pipe_ring_bytes_max;	  /* ring bytes of every pipe together */
	uint64_t pipe_ring_bytes_per_uid; /* ... of the pipes one uid writes to */
	uint32_t groups_per_uid;    /* collective groups one uid may have (group/) */
	uint32_t group_members_max; /* members of one group */
	uint32_t group_peer_groups_max; /* coordinated groups with members over one peer link */
	uint64_t group_bytes_per_uid; /* arena bytes of one uid's groups */
	uint32_t group_chunk;	    /* arena slot bytes of a group of up to 8 members */
	uint32_t chans_per_uid;	    /* named channels one uid may create (chan/) */
	uint32_t chan_items_max;    /* items one channel holds */
	uint64_t chan_bytes_max;    /* item bytes one channel holds */
	uint64_t chan_bytes_per_uid; /* item bytes one uid's writes hold, any channel */
	uint32_t wqs_per_uid;	     /* work queues one uid may create (chan/wq.c) */
	uint32_t wq_questions_max;   /* questions one queue holds until answered and received */
	uint64_t wq_bytes_max;	     /* question bytes one queue holds */
	uint64_t wq_answer_bytes_max; /* answer bytes one queue holds for its owner */
	uint32_t chan_peer_ops_max; /* channel/queue ops of one peer link waiting, each side */
	uint32_t chan_peer_ops_per_uid; /* of those forwarded, one local uid's (0: a quarter) */
	uint32_t chan_remote_create_uid; /* owner of channels created from other hosts; 0: none */
	uint32_t chan_remote_create_per_peer; /* channels, and queues, one far daemon created here */
	uint64_t chan_remote_bytes_per_peer;  /* item bytes one far daemon's writes hold */
	uint64_t chan_peer_bytes_max; /* item bytes arriving over one peer link at once */
	uint32_t drain_ms;	    /* graceful stop: wait this long for copies */
	uint32_t ring_max;	    /* largest control ring per direction a client may map; 0: off */
	uint32_t spin_us;	    /* poll busy control rings this long before sleeping; 0: never */
	uint32_t admin_gid;	    /* members may use admin control requests (root always) */
	char metrics_listen[64];    /* "ADDR:PORT" for the Prometheus endpoint, "" = off */
	bool metrics_allow_remote;  /* metrics_listen may be a non-loopback address */
	int metrics_listen_line;    /* the config file's line that set metrics_listen, 0: none */
	char peer_listen[80];	    /* "ADDR:PORT", "*:PORT", "[v6]:PORT" or "off" */
	char peer_host_name[64];    /* the host name this daemon's PeerHello states; "": its own */
	uint32_t peer_port;	    /* default port of tpip:// addresses */
	uint32_t peer_data_conns;   /* data connections per peer link */
	char peer_key_file[PATH_MAX]; /* "" = no key (TLS with an external PSK when set) */
	char peer_cert[PATH_MAX];     /* "" = no certificate; with _cert_key and _ca: mutual TLS */
	char peer_cert_key[PATH_MAX];
	char peer_ca[PATH_MAX];
	bool peer_data_encryption;    /* no: tensor bytes unencrypted (still authenticated) */
	bool peer_insecure;	      /* plain TCP peering without authentication (test fabrics) */
	uint32_t peer_connect_timeout_ms;
	uint32_t peer_timeout_ms;   /* keepalive: silence longer than this kills a link */
	bool peer_force_cross_host; /* same-host daemons peer over TCP like other hosts */
	uint32_t peer_chunk;	    /* striping unit */
	uint32_t peer_send_size;    /* bytes per socket write on data connections */
	uint32_t peer_pending_max;  /* accepted connections whose first frame has not come */
	uint32_t peer_pending_per_source; /* of those, from one address */
	uint32_t peer_links_max;    /* links other daemons opened to this one */
	uint32_t peer_links_per_source; /* of those, from one address */
	uint32_t peer_data_conns_max; /* data connections of every link together (2 threads each) */
	uint32_t peer_connect_waits_max; /* peers' connects waiting for a listener, all links */
	uint32_t peer_connect_waits_per_peer; /* of those, one peer's (0: a quarter) */
	uint64_t peer_outq_max; /* control bytes queued towards a peer daemon that does not read */

	/* Where the configuration came from, for reloads. */
	char config_path[PATH_MAX];
	bool config_explicit;	    /* --config given: the file must exist */
	bool check_only;	    /* --check-config */
	int argc;
	char **argv;
};

void tpd_config_defaults(struct tpd_config *c);

/*
 * tpd_config_load() - build the configuration: defaults, then the config file, then flags.
 * @argv: kept (borrowed) for tpd_config_reload().
 * @err, @err_len: receives "file:line: reason" or "--flag: reason" on failure.
 * Return: 0 to run, 1 if --help/--version was handled (exit 0), -EINVAL on a bad file or flag,
 * -errno if an explicit config file cannot be read.
 */
int tpd_config_load(struct tpd_config *c, int argc, char **argv, char *err, size_t err_len);

/*
 * tpd_config_reload() - re-read the file @old came from and re-apply its flags.
 * @ret: the new configuration, written only on success.
 * Return: 0 or < 0 with @err filled (the old configuration stays in force).
 */
int tpd_config_reload(const struct tpd_config *old, struct tpd_config *ret, char *err,
		      size_t err_len);

/*
 * tpd_config_diff() - compare @old and @new: copies live options into @live (which starts as
 * @old) and names, comma separated, the changed options that need a restart into @restart.
 * Return: number of options changed.
 */
int tpd_config_diff(const struct tpd_config *old, const struct tpd_config *new,
		    struct tpd_config *live, char *restart, size_t restart_len);

/* Writes the effective configuration in INI form to @f (for --check-config). */
/*
 * tpd_config_fd_reserve() - the fds @c lets the daemon use besides those it keeps for clients:
 * its own (listeners, event and timer fds, files it opens for a moment), three per session
 * (the socket, the client's pidfd and /proc directory), links other daemons open and links it
 * dials, their data connections, connections not yet identified, pipe rings, and the
 * clients' fds in flight that may go beyond kept_fds_cap (TPD_QUOTA_FDS_IN_FLIGHT). The fds a
 * session holds for its client besides those three (fds received ahead of their frames, fds
 * queued towards it) are charged as kept fds (tpd_quota_charge_parked_fd()). An explicit
 * kept-fds-max must fit RLIMIT_NOFILE less this; kept-fds-max 0 derives it so.
 */
uint64_t tpd_config_fd_reserve(const struct tpd_config *c);

void tpd_config_dump(const struct tpd_config *c, void *f);

#endif
