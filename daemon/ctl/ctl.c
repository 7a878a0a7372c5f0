/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Builds CtlReply snapshots from the daemon's live state. Every array is allocated for the
 * reply and freed once the frame is queued. A caller that is not an admin (root or the admin
 * group) sees only its own sessions, listeners and pipes, and counts of only those: other users'
 * command names, context names and listener names never reach it. Requests are dispatched
 * through one const table indexed by CtlWhat (ctl_cmds), whose entries say which need an admin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ctl.h"
#include "chan.h"
#include "chanx.h"
#include "wq.h"
#include "group.h"
#include "peer.h"
#include "core.h"
#include "rdma/rdma.h"
#include "pipe.h"
#include "session.h"
#include "sessmsg.h"
#include "tpb.h"
#include "tpconfig.h"
#include "log.h"

/* Storage behind a reply's arrays, freed once the reply is queued. */
struct ctl_bufs {
	Tpw__V1__CtlBackend *backends;
	char *(*caps)[12]; /* one per cap_names entry at most */
	Tpw__V1__CtlChannelStats *stats;
	Tpw__V1__CtlSession *sessions;
	Tpw__V1__CtlListener *listeners;
	Tpw__V1__CtlPipe *pipes;
	Tpw__V1__CtlPipeEnd *ends;
	char (*channels)[64];
	bool verbose;		/* CtlRequest.verbose: channel reasons of each pipe */
	size_t reasons_left;	/* bytes of channel reasons the reply may still carry */
	bool own_only; /* the caller is not an admin: only objects of uid @viewer */
	uid_t viewer;
};

/* Root, or a member of the configured admin group. */
static bool is_admin(const struct tpd_session *s)
{
	gid_t g = (gid_t)tpd_daemon_cfg(tpd_session_daemon(s))->admin_gid;

	if (tpd_session_uid(s) == 0)
		return true;
	if (!g)
		return false;
	return tpd_session_in_group(s, g);
}

static bool sees_uid(const struct ctl_bufs *b, uid_t uid)
{
	return !b->own_only || uid == b->viewer;
}

/* Either local end of pipe @pi belongs to a uid the caller may see. */
static bool sees_pipe(const struct ctl_bufs *b, const struct tpd_pipe_info *pi)
{
	for (int i = 0; i < 2; i++)
		if (pi->end[i].session && sees_uid(b, tpd_session_uid(pi->end[i].session)))
			return true;
	return false;
}

/* Counts in status: every object, or only the caller's. */
static void count_visible(struct tpd_daemon *d, const struct ctl_bufs *b, Tpw__V1__CtlStatus *st)
{
	struct tpd_broker *br = tpd_daemon_broker(d);
	struct tpd_pipe_info pi;
	struct tpd_session *s;
	struct tpd_listener *l;
	struct tpd_pipe *p;

	if (!b->own_only)
		return;
	st->sessions = st->pipes = st->listeners = 0;
	tpd_local_for_each_session(s, tpd_daemon_local(d))
		st->sessions += sees_uid(b, tpd_session_uid(s));
	for (p = tpd_broker_pipe_next(br, NULL); p; p = tpd_broker_pipe_next(br, p)) {
		tpd_pipe_info(p, &pi);
		st->pipes += sees_pipe(b, &pi);
	}
	tpu_list_for_each(l, &tpd_daemon_registry(d)->listeners, node)
		st->listeners += sees_uid(b, l->uid);
}

/* Bytes held for clients, refusals and session limits (core/quota.c). A caller who is not an
 * admin gets the limits and the queues of its own pipes, not the daemon-wide totals (they would
 * show how busy other users are). */
static void fill_status_limits(struct tpd_daemon *d, const struct ctl_bufs *b,
			       Tpw__V1__CtlStatus *st)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	struct tpd_broker *br = tpd_daemon_broker(d);
	struct tpd_quota *q = tpd_daemon_quota(d);
	struct tpd_pipe_info pi;
	struct tpd_pipe *p;

	if (!b->own_only) {
		st->client_input_bytes = q->in_bytes;
		st->client_queued_bytes = q->out_bytes;
		st->sessions_refused = q->refused;
		st->remote_refused = q->remote_refused;
		st->pipe_held_bytes = q->pipe_bytes;
		st->pipe_held_bytes_peak = q->pipe_bytes_peak;
		st->budget_waits = q->budget_waits;
		st->bcast_requests = tpd_bcast_stats(br)->requests;
		st->bcast_targets = tpd_bcast_stats(br)->targets;
		st->bcast_staged_bytes = tpd_bcast_stats(br)->staged_bytes;
		st->bcast_unstaged = tpd_bcast_stats(br)->unstaged;
		st->bcast_stage_held = tpd_bcast_stats(br)->stage_held;
	}
	for (p = tpd_broker_pipe_next(br, NULL); p; p = tpd_broker_pipe_next(br, p)) {
		tpd_pipe_info(p, &pi);
		for (int i = 0; i < 2 && sees_pipe(b, &pi); i++) {
			st->pipe_queued_messages += pi.end[i].queued;
			st->pipe_queued_bytes += pi.end[i].queued_bytes;
		}
	}
	st->sessions_max = cfg->sessions_max;
	st->sessions_per_uid = cfg->sessions_per_uid;
	st->sessions_reserved = cfg->sessions_reserved;
	st->kept_fds_max = cfg->kept_fds_cap;
	st->kept_fds_per_uid = cfg->kept_fds_per_uid;
	if (!b->own_only) {
		st->kept_fds = atomic_load(&q->kept_fds);
		st->kept_fds_refused = q->kept_fds_refused;
		st->parked_fds_refused = q->parked_fds_refused;
	} else {
		struct tpd_uid_acct *a = tpu_hmap_get(&q->uids, (uint64_t)b->viewer + 1);
		st->kept_fds = a ? atomic_load(&a->kept_fds) : 0;
	}
}

/* The staging buffers clients' libraries registered (those of the sessions the caller sees). */
static void count_staging(struct tpd_daemon *d, const struct ctl_bufs *b, Tpw__V1__CtlStatus *st)
{
	struct tpd_session *s;

	tpd_local_for_each_session(s, tpd_daemon_local(d)) {
		if (!sees_uid(b, tpd_session_uid(s)))
			continue;
		st->staging_buffers += tpd_session_staging_count(s);
		st->staging_bytes += tpd_session_staging_bytes(s);
	}
}

static void fill_status(struct tpd_daemon *d, const struct ctl_bufs *b, Tpw__V1__CtlStatus *st)
{
	struct tpb_rdma_cache_stats rc;

	st->version = TP_VERSION;
	st->uptime_ms = tpd_daemon_uptime_ms(d);
	st->pid = (uint32_t)getpid();
	st->sessions = tpd_local_session_count(tpd_daemon_local(d));
	st->pipes = tpd_broker_pipe_count(tpd_daemon_broker(d));
	st->listeners = tpd_daemon_registry(d)->count;
	st->bytes_moved = tpd_broker_bytes_moved(tpd_daemon_broker(d));
	st->messages_moved = tpd_broker_messages_moved(tpd_daemon_broker(d));
	tpd_pring_totals(d, &st->pipe_rings, &st->pipe_ring_bytes, &st->pipe_ring_msgs);
	st->socket_path = (char *)tpd_daemon_socket_path(d);
	st->cma_available = tpd_daemon_cma_viable(d);
	st->peer_listen = (char *)tpd_peers_listen_addr(d);
	st->peers = tpd_peers_count(d);
	st->host_id = (char *)tpd_peers_host_id(d);
	st->peer_auth = (char *)tpd_peers_auth(d);
	tpb_cuda_map_count(&st->cuda_mappings, &st->cuda_mappings_open);
	tpb_cuda_pin_count(&st->cuda_pinned_buffers, &st->cuda_pinned_bytes);
	tpb_rdma_cache_stats(tpd_daemon_rdma(d), &rc);
	st->rdma_cache_regions = rc.regions;
	st->rdma_cache_bytes = rc.bytes;
	st->rdma_cache_hits = rc.hits;
	st->rdma_cache_misses = rc.misses;
	st->rdma_cache_evictions = rc.evictions;
	st->rdma_reg_dmabuf = rc.reg_dmabuf;
	st->rdma_reg_addr = rc.reg_addr;
	st->rdma_reg_client_dmabuf = rc.reg_client_dmabuf;
	st->cuda_dmabufs = rc.dmabufs;
	st->cuda_dmabufs_refused = rc.dmabufs_refused;
	st->cuda_dmabufs_evicted = rc.dmabufs_evicted;
	count_visible(d, b, st);
	count_staging(d, b, st);
	fill_status_limits(d, b, st);
}

static int fill_sessions(struct tpd_daemon *d, Tpw__V1__CtlReply *rep, struct ctl_bufs *b)
{
	unsigned n = tpd_local_session_count(tpd_daemon_local(d));
	Tpw__V1__CtlSession *arr = b->sessions = calloc(n + 1, sizeof(*arr));
	struct tpd_session *s;
	size_t i = 0;

	rep->sessions = calloc(n + 1, sizeof(*rep->sessions));
	if (!arr || !rep->sessions)
		return -ENOMEM;
	tpd_local_for_each_session(s, tpd_daemon_local(d)) {
		Tpw__V1__CtlSession *c = &arr[i];
		const char *name = tpd_session_name(s);

		if (!sees_uid(b, tpd_session_uid(s)))
			continue;
		tpw__v1__ctl_session__init(c);
		c->id = tpd_session_id(s);
		c->pid = (uint32_t)tpd_session_pid(s);
		c->uid = (uint32_t)tpd_session_uid(s);
		c->gid = (uint32_t)tpd_session_gid(s);
		c->command = (char *)tpd_session_comm(s);
		c->name = (char *)(name ? name : "");
		c->role = tpd_session_role(s);
		c->pipes = tpd_session_pipe_count(s);
		c->listeners = tpd_session_listener_count(s);
		c->buffers = tpd_session_buffer_count(s);
		c->buffer_bytes = tpd_session_buffer_bytes(s);
		c->staging_buffers = tpd_session_staging_count(s);
		c->staging_bytes = tpd_session_staging_bytes(s);
		tpd_conn_bytes(tpd_session_conn(s), &c->bytes_in, &c->bytes_out);
		c->cma_ok = tpd_session_cma(s);
		c->transport = tpd_conn_is_ring(tpd_session_conn(s)) ? "ring" : "unix";
		c->ring_bytes = tpd_conn_ring_bytes(tpd_session_conn(s));
		rep->sessions[i++] = c;
	}
	rep->n_sessions = i;
	return 0;
}

/* End @i of pipe @pi. */
static void fill_end(const struct ctl_bufs *b, const struct tpd_pipe_info *pi, int i,
		     Tpw__V1__CtlPipeEnd *c)
{
	const struct tpd_pipe_end_info *e = &pi->end[i];

	tpw__v1__ctl_pipe_end__init(c);
	if (e->session && !sees_uid(b, tpd_session_uid(e->session))) {
		c->hidden = true; /* another user's process: not even its uid */
		c->name = "";
	} else if (e->session) {
		const char *name = tpd_session_name(e->session);

		c->session_id = tpd_session_id(e->session);
		c->pid = (uint32_t)tpd_session_pid(e->session);
		c->name = (char *)(name ? name : "");
		c->uid = (uint32_t)tpd_session_uid(e->session);
	} else if (e->remote) {
		c->name = (char *)pi->peer_addr; /* "HOST:PORT" of the other host's daemon */
		c->uid = pi->remote_uid;
		c->uid_claimed = true;
	} else {
		c->name = "";
	}
	c->messages_sent = e->msgs_sent;
	c->bytes_sent = e->bytes_sent;
	c->queued = e->queued;
}


/* The control transports of @pi's two ends: "ring", "unix", "ring,unix", "ring,tcp"... */
static const char *pipe_transport(const struct tpd_pipe_info *pi)
{
	static const char *const names[3][3] = {
		{ "tcp", "unix,tcp", "ring,tcp" },
		{ "unix,tcp", "unix", "ring,unix" },
		{ "ring,tcp", "ring,unix", "ring" },
	};
	int k[2];

	for (int i = 0; i < 2; i++) {
		const struct tpd_pipe_end_info *e = &pi->end[i];

		if (e->remote)
			k[i] = 0;
		else
			k[i] = e->session && tpd_conn_is_ring(tpd_session_conn(e->session)) ? 2 : 1;
	}
	return names[k[0]][k[1]];
}

static int fill_pipes(struct tpd_daemon *d, Tpw__V1__CtlReply *rep, struct ctl_bufs *b)
{
	struct tpd_broker *br = tpd_daemon_broker(d);
	unsigned n_pipes = tpd_broker_pipe_count(br);
	struct tpd_pipe_info pi;
	struct tpd_pipe *p;
	size_t i = 0;

	b->pipes = calloc(n_pipes + 1, sizeof(*b->pipes));
	b->ends = calloc(2 * n_pipes + 2, sizeof(*b->ends));
	b->channels = calloc(n_pipes + 1, sizeof(*b->channels));
	rep->pipes = calloc(n_pipes + 1, sizeof(*rep->pipes));
	if (!b->pipes || !b->ends || !b->channels || !rep->pipes)
		return -ENOMEM;
	for (p = tpd_broker_pipe_next(br, NULL); p; p = tpd_broker_pipe_next(br, p)) {
		Tpw__V1__CtlPipe *c = &b->pipes[i];
		bool a, z;

		tpd_pipe_info(p, &pi);
		a = pi.end[0].session || (pi.end[0].remote && !pi.end[0].gone);
		z = pi.end[1].session || (pi.end[1].remote && !pi.end[1].gone);
		if (!sees_pipe(b, &pi))
			continue;
		tpw__v1__ctl_pipe__init(c);
		c->id = pi.id;
		c->listener = (char *)pi.listener;
		c->state = pi.connecting ? "connecting"
					 : (a && z ? "open" : (a || z ? "half-closed" : "closed"));
		c->transport = (char *)pipe_transport(&pi);
		tpd_pipe_channels(p, b->channels[i], sizeof(b->channels[i]));
		c->channels = b->channels[i];
		if (b->verbose) {
			size_t n = 0;

			/* Within the frame limit: the pipes listed first get their reasons. */
			for (unsigned k = 0; k < pi.n_channel_notes; k++)
				n += strlen(pi.channel_notes[k]) + 8;
			if (n <= b->reasons_left) {
				b->reasons_left -= n;
				c->n_channel_reasons = pi.n_channel_notes;
				c->channel_reasons = (char **)pi.channel_notes;
			}
		}
		fill_end(b, &pi, 0, &b->ends[2 * i]);
		fill_end(b, &pi, 1, &b->ends[2 * i + 1]);
		c->connector = &b->ends[2 * i];
		c->acceptor = &b->ends[2 * i + 1];
		c->created_ms = (pi.created_ns - tpd_daemon_start_ns(d)) / 1000000;
		rep->pipes[i++] = c;
	}
	rep->n_pipes = i;
	return 0;
}

static int fill_listeners(struct tpd_daemon *d, Tpw__V1__CtlReply *rep, struct ctl_bufs *b)
{
	struct tpd_registry *reg = tpd_daemon_registry(d);
	Tpw__V1__CtlListener *arr = b->listeners = calloc(reg->count + 1, sizeof(*arr));
	struct tpd_listener *l;
	size_t i = 0;

	rep->listeners = calloc(reg->count + 1, sizeof(*rep->listeners));
	if (!arr || !rep->listeners)
		return -ENOMEM;
	tpu_list_for_each(l, &reg->listeners, node) {
		struct tpd_session *s = l->owner;
		Tpw__V1__CtlListener *c = &arr[i];
		if (!sees_uid(b, l->uid))
			continue;
		tpw__v1__ctl_listener__init(c);
		c->id = l->id;
		c->name = l->name;
		c->session_id = tpd_session_id(s);
		c->pid = (uint32_t)tpd_session_pid(s);
		c->uid = (uint32_t)l->uid;
		c->access = l->access;
		c->gid = (uint32_t)l->gid;
		c->accepted = l->accepted;
		c->remote = l->remote;
		c->n_remote_peers = l->n_remote_peers;
		c->remote_peers = l->remote_peers;
		rep->listeners[i++] = c;
	}
	rep->n_listeners = i;
	return 0;
}

static const struct {
	uint32_t cap;
	const char *name;
} cap_names[] = {
	{ TPB_CAP_HOST_MEM, "host-mem" },     { TPB_CAP_SAME_HOST, "same-host" },
	{ TPB_CAP_SRC_LOCAL, "src-local" },   { TPB_CAP_SRC_PROCESS, "src-process" },
	{ TPB_CAP_DST_LOCAL, "dst-local" },   { TPB_CAP_DST_PROCESS, "dst-process" },
	{ TPB_CAP_INLINE, "inline" },	      { TPB_CAP_NEEDS_PROCESS, "needs-process" },
	{ TPB_CAP_SRC_CUDA, "src-cuda" },     { TPB_CAP_DST_CUDA, "dst-cuda" },
	{ TPB_CAP_NEEDS_CUDA, "needs-cuda" }, { TPB_CAP_CROSS_HOST, "cross-host" },
};
_Static_assert(TPU_ARRAY_SIZE(cap_names) <= 12, "struct ctl_bufs holds 12 caps per channel");

static int fill_backends(Tpw__V1__CtlReply *rep, struct ctl_bufs *b)
{
	size_t n;
	const struct tpb_channel_info *ch = tpb_registry_list(&n);

	b->backends = calloc(n, sizeof(*b->backends));
	b->caps = calloc(n, sizeof(*b->caps));
	rep->backends = calloc(n, sizeof(*rep->backends));
	if (!b->backends || !b->caps || !rep->backends)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		Tpw__V1__CtlBackend *c = &b->backends[i];
		tpw__v1__ctl_backend__init(c);
		c->name = (char *)ch[i].ops->name;
		c->kind = "channel";
		c->viable = ch[i].viable;
		c->why = (char *)ch[i].why;
		c->priority = (uint32_t)i;
		for (size_t k = 0; k < TPU_ARRAY_SIZE(cap_names) && c->n_caps < TPU_ARRAY_SIZE(b->caps[0]); k++)
			if (ch[i].ops->caps & cap_names[k].cap)
				b->caps[i][c->n_caps++] = (char *)cap_names[k].name;
		c->caps = b->caps[i];
		rep->backends[i] = c;
	}
	rep->n_backends = n;
	return 0;
}

static int fill_stats(struct tpd_daemon *d, Tpw__V1__CtlReply *rep, struct ctl_bufs *b)
{
	size_t n;
	const struct tpb_channel_info *ch = tpb_registry_list(&n);

	n = TPU_MIN(n, (size_t)TPD_STATS_CHANNELS);
	b->stats = calloc(n, sizeof(*b->stats));
	rep->channel_stats = calloc(n, sizeof(*rep->channel_stats));
	if (!b->stats || !rep->channel_stats)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		Tpw__V1__CtlChannelStats *c = &b->stats[i];
		struct tpd_channel_stats *cs = &tpd_daemon_stats(d)->ch[i];
		tpw__v1__ctl_channel_stats__init(c);
		c->name = (char *)ch[i].ops->name;
		c->transfers = cs->transfers;
		c->bytes = cs->bytes;
		c->errors = cs->errors;
		c->n_latency_us_log2 = TPD_STATS_BUCKETS;
		c->latency_us_log2 = cs->hist;
		rep->channel_stats[i] = c;
	}
	rep->n_channel_stats = n;
	return 0;
}

/* One request being answered: what a handler reads and fills. */
struct ctl_call {
	struct tpd_daemon *d;	/* @s's daemon */
	struct tpd_session *s;
	const Tpw__V1__CtlRequest *req;
	Tpw__V1__CtlReply *rep;
	Tpw__V1__CtlStatus *st;	/* the reply's status_info, where a handler sets it */
	struct ctl_bufs *b;
};

/* A request's handler. Return: 0, or -errno (the reply carries the status). */
typedef int ctl_handler_fn(struct ctl_call *c);

static int ctl_status(struct ctl_call *c)
{
	fill_status(c->d, c->b, c->st);
	c->rep->status_info = c->st;
	return 0;
}

static int ctl_sessions(struct ctl_call *c)
{
	return fill_sessions(c->d, c->rep, c->b);
}

static int ctl_pipes(struct ctl_call *c)
{
	return fill_pipes(c->d, c->rep, c->b);
}

static int ctl_listeners(struct ctl_call *c)
{
	return fill_listeners(c->d, c->rep, c->b);
}

static int ctl_backends(struct ctl_call *c)
{
	return fill_backends(c->rep, c->b);
}

static int ctl_stats(struct ctl_call *c)
{
	ctl_status(c);
	return fill_stats(c->d, c->rep, c->b);
}

static int ctl_drain(struct ctl_call *c)
{
	tpd_daemon_stop(c->d, "drain requested by tpipctl");
	return 0;
}

static int ctl_close_session(struct ctl_call *c)
{
	struct tpd_session *s = c->s;
	struct tpd_session *t = tpd_local_session_find(tpd_daemon_local(c->d), c->req->target_id);

	if (t) {
		char msg[160];

		snprintf(msg, sizeof(msg), "session %llu closed by an administrator (tpipctl "
			 "close-session by uid %u, session %llu)",
			 (unsigned long long)tpd_session_id(t), (unsigned)tpd_session_uid(s),
			 (unsigned long long)tpd_session_id(s));
		tpd_session_end(t, TPU_LOG_NOTICE, TPW__V1__STATUS__STATUS_ADMIN_CLOSED, msg);
		return 0;
	}
	c->rep->message = "no such session";
	return -ENOENT;
}

static int ctl_peers(struct ctl_call *c)
{
	return tpd_peers_ctl(c->d, &c->rep->peers, &c->rep->n_peers);
}

static int ctl_groups(struct ctl_call *c)
{
	return tpd_group_ctl(tpd_daemon_groups(c->d), c->b->own_only, c->b->viewer,
			     &c->rep->groups, &c->rep->n_groups);
}

static int ctl_queues(struct ctl_call *c)
{
	int r = tpd_wq_ctl(tpd_daemon_wqs(c->d), c->b->own_only, c->b->viewer, &c->rep->queues,
			   &c->rep->n_queues);

	/* Then the handles this host's clients hold on queues of other hosts. */
	return r < 0 ? r : tpd_chanx_ctl_queues(tpd_chan_x(tpd_daemon_chans(c->d)),
						 c->b->own_only, c->b->viewer, &c->rep->queues,
						 &c->rep->n_queues);
}

static int ctl_channels(struct ctl_call *c)
{
	int r = tpd_chan_ctl(tpd_daemon_chans(c->d), c->b->own_only, c->b->viewer,
			     &c->rep->channels, &c->rep->n_channels);

	/* Then the handles this host's clients hold on channels of other hosts. */
	return r < 0 ? r : tpd_chanx_ctl_channels(tpd_chan_x(tpd_daemon_chans(c->d)),
						   c->b->own_only, c->b->viewer,
						   &c->rep->channels, &c->rep->n_channels);
}

#define CTL_ADMIN 0x1u /* root or the admin group only; others get -EACCES */

struct ctl_cmd {
	ctl_handler_fn *fn;
	unsigned flags; /* CTL_* */
};

/* Every request tpipctl can make, indexed by CtlWhat; an empty slot is answered -EINVAL. */
static const struct ctl_cmd ctl_cmds[] = {
	[TPW__V1__CTL_WHAT__CTL_STATUS] = { ctl_status, 0 },
	[TPW__V1__CTL_WHAT__CTL_SESSIONS] = { ctl_sessions, 0 },
	[TPW__V1__CTL_WHAT__CTL_PIPES] = { ctl_pipes, 0 },
	[TPW__V1__CTL_WHAT__CTL_LISTENERS] = { ctl_listeners, 0 },
	[TPW__V1__CTL_WHAT__CTL_BACKENDS] = { ctl_backends, 0 },
	[TPW__V1__CTL_WHAT__CTL_STATS] = { ctl_stats, 0 },
	[TPW__V1__CTL_WHAT__CTL_CLOSE_SESSION] = { ctl_close_session, CTL_ADMIN },
	[TPW__V1__CTL_WHAT__CTL_DRAIN] = { ctl_drain, CTL_ADMIN },
	[TPW__V1__CTL_WHAT__CTL_PEERS] = { ctl_peers, 0 },
	[TPW__V1__CTL_WHAT__CTL_GROUPS] = { ctl_groups, 0 },
	[TPW__V1__CTL_WHAT__CTL_CHANNELS] = { ctl_channels, 0 },
	[TPW__V1__CTL_WHAT__CTL_QUEUES] = { ctl_queues, 0 },
};

/* Runs @c's request through ctl_cmds. Return: the handler's result, or -errno. */
static int ctl_run(struct ctl_call *c)
{
	const struct ctl_cmd *cmd;
	int what = (int)c->req->what;

	if (what < 0 || (size_t)what >= TPU_ARRAY_SIZE(ctl_cmds) || !ctl_cmds[what].fn) {
		c->rep->message = "unknown control request (tpipctl newer than this daemon?)";
		return -EINVAL;
	}
	cmd = &ctl_cmds[what];
	if ((cmd->flags & CTL_ADMIN) && c->b->own_only) {
		tpd_session_log(c->s, TPU_LOG_NOTICE, "admin request %d refused for uid %u", what,
				(unsigned)tpd_session_uid(c->s));
		c->rep->message = "admin requests need root or the admin group";
		return -EACCES;
	}
	return cmd->fn(c);
}

void tpd_ctl_handle(struct tpd_session *s, const Tpw__V1__CtlRequest *req)
{
	Tpw__V1__CtlReply rep = TPW__V1__CTL_REPLY__INIT;
	Tpw__V1__CtlStatus st = TPW__V1__CTL_STATUS__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct ctl_bufs b = { 0 };
	struct tpd_daemon *d = tpd_session_daemon(s);
	struct ctl_call c = { .d = d, .s = s, .req = req, .rep = &rep, .st = &st, .b = &b };
	int r;

	rep.req_id = req->req_id;
	b.verbose = req->verbose;
	b.reasons_left = tpd_daemon_cfg(d)->wire.frame_max / 2;
	b.own_only = !is_admin(s);
	b.viewer = tpd_session_uid(s);
	rep.own_only = b.own_only;
	rep.viewer_uid = (uint32_t)tpd_session_uid(s);
	r = ctl_run(&c);
	rep.status = tpw_status_from_errno(r);
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CTL_REPLY;
	dm.ctl_reply = &rep;
	if (r < 0) {
		rep.n_sessions = rep.n_pipes = rep.n_listeners = 0;
		rep.n_backends = rep.n_channel_stats = 0;
		tpd_peers_ctl_free(rep.peers, rep.n_peers);
		rep.peers = NULL;
		rep.n_peers = 0;
		if (!rep.message)
			rep.message = r == -ENOMEM ? "out of memory" : strerror(-r);
	}
	tpd_session_send(s, &dm, NULL, 0);
	tpd_peers_ctl_free(rep.peers, rep.n_peers);
	tpd_group_ctl_free(rep.groups, rep.n_groups);
	tpd_chan_ctl_free(rep.channels, rep.n_channels);
	tpd_wq_ctl_free(rep.queues, rep.n_queues);
	free(rep.sessions);
	free(rep.listeners);
	free(rep.pipes);
	free(b.sessions);
	free(b.listeners);
	free(b.pipes);
	free(b.ends);
	free(b.channels);
	free(rep.backends);
	free(rep.channel_stats);
	free(b.backends);
	free(b.caps);
	free(b.stats);
}

void tpd_ctl_start(void)
{
	tpd_sessmsg_set_ctl(tpd_ctl_handle);
}
