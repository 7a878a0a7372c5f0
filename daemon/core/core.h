/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon's state as every part reads it: struct tpd_daemon and its accessors, the settings
 * (config.h), the wire limits, the per-uid accounts (quota.h), the counters (stats.h), the
 * listener registry and the parts' own states. Reading a setting is no call into the assembler
 * (daemon.c): the accessors are inline. It does not build or run the daemon (daemon.h does).
 */
#ifndef TPD_CORE_H
#define TPD_CORE_H

#include <time.h>
#include <event2/event.h>
#include "config.h"
#include "copier.h"
#include "listener.h"
#include "quota.h"
#include "stats.h"
#include "ring.h"
#include "tpu.h"

struct tpd_broker;
struct tpd_groups;
struct tpd_chans;
struct tpd_wqs;
struct tpd_daemon;
struct tpd_local;
struct tpd_peers;
struct tpb_ctx;
struct tpb_rdma;

/*
 * What the assembler (daemon.c) does for the parts below it: they reach it through this table,
 * never by calling daemon.c. Set by tpd_daemon_new() before any part runs.
 */
struct tpd_daemon_ops {
	/* Starts a graceful stop, as SIGTERM does. Borrows @d and @why. */
	void (*stop)(struct tpd_daemon *d, const char *why);
	/* Copies or cross-host transfers in flight? Borrows @d. */
	bool (*bulk_running)(const struct tpd_daemon *d);
};

struct tpd_daemon {
	const struct tpd_daemon_ops *ops; /* daemon.c's */
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
	struct tpd_groups *groups; /* collective groups' registry (group/) */
	struct tpd_chans *chans;   /* named channels (chan/) */
	struct tpd_wqs *wqs;	   /* work queues (chan/wq.c) */
};

/* Starts a graceful stop, as SIGTERM does (through @d's ops). Borrows @d and @why. */
static inline void tpd_daemon_stop(struct tpd_daemon *d, const char *why)
{
	d->ops->stop(d, why);
}

/* Copies or cross-host transfers in flight: the control rings' spin loop yields to them. */
static inline bool tpd_daemon_bulk_running(const struct tpd_daemon *d)
{
	return d->ops->bulk_running(d);
}

/* Uptime in milliseconds. */
static inline uint64_t tpd_daemon_uptime_ms(const struct tpd_daemon *d)
{
	return (tpu_now_ns() - d->start_ns) / 1000000;
}

/*
 * Settings and shared services of the daemon, for the parts outside core/ (local, broker, peer,
 * ctl): they read these through the accessors below, never through the fields of
 * struct tpd_daemon. Each returns a pointer borrowed from @d, valid until tpd_daemon_free();
 * the configuration may change on SIGHUP (tpd_daemon_reload()), between loop passes only.
 */
static inline const struct tpd_config *tpd_daemon_cfg(const struct tpd_daemon *d)
{
	return &d->cfg;
}

static inline struct event_base *tpd_daemon_base(const struct tpd_daemon *d)
{
	return d->base;
}

/* Wire limits every session and peer frame is checked against. */
static inline const struct tpw_limits *tpd_daemon_limits(const struct tpd_daemon *d)
{
	return &d->limits;
}

/* Per-channel counters (stats.c): tpd_stats_record() updates them. */
static inline struct tpd_stats *tpd_daemon_stats(struct tpd_daemon *d)
{
	return &d->stats;
}

/* The listener registry (local/listener.c). */
static inline struct tpd_registry *tpd_daemon_registry(struct tpd_daemon *d)
{
	return &d->registry;
}

/* Per-uid accounting (quota.c). */
static inline struct tpd_quota *tpd_daemon_quota(struct tpd_daemon *d)
{
	return &d->quota;
}

/* The copy threads (backends' engine). */
static inline struct tpb_copier *tpd_daemon_copier(const struct tpd_daemon *d)
{
	return d->copier;
}

/* True once a graceful stop began. */
static inline bool tpd_daemon_stopping(const struct tpd_daemon *d)
{
	return d->stopping;
}

/* The broker's state (broker/pipe.h): pipes, their queues and totals. */
static inline struct tpd_broker *tpd_daemon_broker(const struct tpd_daemon *d)
{
	return d->broker;
}

/* The local part's state (local/local.h): the sessions; borrowed, as above. */
static inline struct tpd_local *tpd_daemon_local(const struct tpd_daemon *d)
{
	return d->local;
}

/* Did the backend probe at start find CMA viable on this host? */
static inline bool tpd_daemon_cma_viable(const struct tpd_daemon *d)
{
	return d->cma_viable;
}

/* The peer part (peer/, tpd_peers_new()); NULL before it is made. */
static inline struct tpd_peers *tpd_daemon_peers(const struct tpd_daemon *d)
{
	return d->peers;
}

/* The mpt channel's context (tpb.h op table): each peer link opens its endpoint there. */
static inline struct tpb_ctx *tpd_daemon_mpt(const struct tpd_daemon *d)
{
	return d->mpt;
}

/* The RDMA context of rdma and cuda_gdr (backends/rdma/rdma.h), or NULL where not viable. */
static inline struct tpb_rdma *tpd_daemon_rdma(const struct tpd_daemon *d)
{
	return d->gdr;
}

/* The control socket's resolved path: borrowed from @d, valid until tpd_daemon_free(). */
static inline const char *tpd_daemon_socket_path(const struct tpd_daemon *d)
{
	return d->socket_path;
}

/* When the daemon started, on tpu_now_ns()'s clock (pipes' ages are counted from it). */
static inline uint64_t tpd_daemon_start_ns(const struct tpd_daemon *d)
{
	return d->start_ns;
}

/* The group registry (group/group.h). */
static inline struct tpd_groups *tpd_daemon_groups(const struct tpd_daemon *d)
{
	return d->groups;
}

static inline struct tpd_chans *tpd_daemon_chans(const struct tpd_daemon *d)
{
	return d->chans;
}

static inline struct tpd_wqs *tpd_daemon_wqs(const struct tpd_daemon *d)
{
	return d->wqs;
}

/*
 * Arms @ev (a timer, or an fd event's timeout) to fire @tv from now and never earlier. The loop
 * reads CLOCK_MONOTONIC_COARSE, which lags by up to a clock tick: libevent's precise clock would
 * cost a timerfd_settime() on every loop pass (several a message), so a non-zero @tv is padded by
 * one tick instead and may end up to a tick late. A zero @tv runs @ev on the next pass. Borrows
 * @ev and @tv. Return: event_add()'s (0 or -1).
 */
static inline int tpd_timer_add(struct event *ev, const struct timeval *tv)
{
	static long tick_us = -1; /* per file; the loop's thread only */
	struct timeval padded = *tv;

	if (!tv->tv_sec && !tv->tv_usec)
		return event_add(ev, tv);
	if (tick_us < 0) {
		struct timespec res;

		tick_us = clock_getres(CLOCK_MONOTONIC_COARSE, &res) < 0 ? 10000
			  : (long)(res.tv_sec * 1000000 + (res.tv_nsec + 999) / 1000);
	}
	padded.tv_usec += tick_us;
	padded.tv_sec += padded.tv_usec / 1000000;
	padded.tv_usec %= 1000000;
	return event_add(ev, &padded);
}

#endif
