/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Groups in libtpclient (tpclient.h, "groups and collectives"): joining through the daemon
 * (GroupJoin, its GroupJoined answer, checking and mapping the arena memfd sent with it, the
 * start barrier),
 * the queries, abort and leave, and the order of collectives: a blocking call runs on the
 * caller's thread when nothing is queued, otherwise behind the queued asynchronous calls that
 * the group's own thread runs one at a time. What one collective does is coll.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "group.h"
#include "internal.h"
#include "reduce.h"

#define GROUP_JOIN_MS_DEFAULT 30000
/* Slot bytes a daemon may announce (its group-chunk is at most 64 MiB): keeps the arena's size
 * arithmetic far from overflow. */
#define GROUP_CHUNK_MAX (1ull << 30)

struct join_req {
	struct tpc_req req;
	uint64_t group_id;
	uint32_t rank, size, local_rank, local_size, host_index, hosts;
	uint64_t arena_bytes, chunk;
	int fd; /* the arena's memfd, owned; -EBADF until the answer brought it */
	/* across hosts (hosts > 1): owned copies of the answer's lists, join_req_free() */
	uint32_t *member_hosts;
	size_t n_member_hosts;
	char **addrs;
	size_t naddrs;
	uint8_t token[TPW_GROUP_TOKEN_BYTES];
	size_t tlen;
};

static void join_req_free(struct join_req *j)
{
	j->fd = tpu_close(j->fd);
	free(j->member_hosts);
	for (size_t i = 0; i < j->naddrs; i++)
		free(j->addrs[i]);
	free(j->addrs);
}

/* Copies the answer's lists for a group over several hosts. Return: 0 or -ENOMEM. */
static int join_copy_hosts(struct join_req *j, const Tpw__V1__GroupJoined *m)
{
	if (m->n_member_hosts) {
		j->member_hosts = calloc(m->n_member_hosts, sizeof(*j->member_hosts));
		if (!j->member_hosts)
			return -ENOMEM;
		memcpy(j->member_hosts, m->member_hosts, m->n_member_hosts *
		       sizeof(*j->member_hosts));
		j->n_member_hosts = m->n_member_hosts;
	}
	if (m->n_host_addrs) {
		j->addrs = calloc(m->n_host_addrs, sizeof(*j->addrs));
		if (!j->addrs)
			return -ENOMEM;
		j->naddrs = m->n_host_addrs;
		for (size_t i = 0; i < m->n_host_addrs; i++)
			if (!(j->addrs[i] = strdup(m->host_addrs[i])))
				return -ENOMEM;
	}
	if (m->token.len == sizeof(j->token)) {
		memcpy(j->token, m->token.data, sizeof(j->token));
		j->tlen = sizeof(j->token);
	}
	return 0;
}

/* Connection lost before the answer (@r NULL); a Reply is never the answer to a join. */
static void join_on_reply(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r)
{
	tpc_context_req_done(ctx, req, r);
}

/* Records in @req why the daemon's successful answer @m cannot be used: it has no arena fd
 * (@fd < 0). */
static void joined_no_fd(struct tpc_req *req, const Tpw__V1__GroupJoined *m, int fd)
{
	req->status = -EPROTO;
	if (!m->arena_fd)
		snprintf(req->msg, sizeof(req->msg), "the daemon names the arena by a path (an "
			 "older tpipd); this libtpclient maps only an arena handed over as a sealed "
			 "memfd: upgrade tpipd");
	else
		snprintf(req->msg, sizeof(req->msg), "the daemon announced the arena's memfd but "
			 "none came with its answer (%s)", tp_strerror(fd));
}

void tpc_group_on_joined(struct tp_context *ctx, const Tpw__V1__GroupJoined *m)
{
	struct tpc_req *req = tpc_map_del(&ctx->reqs, m->req_id);
	bool ok = m->status == TPW__V1__STATUS__STATUS_OK;
	/* Taken whatever becomes of it: the next frame's fd must not be mistaken for it. */
	_cleanup_close_ int fd = ok && m->arena_fd ? tpc_pring_take_fd(ctx) : -EBADF;
	struct join_req *j;

	if (!req || req->on_reply != join_on_reply)
		return; /* a join given up: the fd is closed */
	j = tpu_container_of(req, struct join_req, req);
	req->status = tpw_status_to_errno(m->status);
	snprintf(req->msg, sizeof(req->msg), "%s",
		 m->message && *m->message ? m->message : tp_strerror(req->status));
	if (req->status == 0) {
		j->group_id = m->group_id;
		j->rank = m->rank;
		j->size = m->size;
		j->local_rank = m->local_rank;
		j->local_size = m->local_size;
		j->host_index = m->host_index;
		j->hosts = m->hosts;
		j->arena_bytes = m->arena_bytes;
		j->chunk = m->chunk_bytes;
		if (fd < 0)
			joined_no_fd(req, m, fd);
		else
			j->fd = TAKE_FD(fd);
		if (req->status == 0 && m->hosts > 1 && join_copy_hosts(j, m) < 0) {
			req->status = -ENOMEM;
			snprintf(req->msg, sizeof(req->msg), "out of memory");
		}
	}
	req->done = true;
	pthread_cond_broadcast(&ctx->cond);
}

static int join_ask(struct tp_context *ctx, const char *name, const struct tp_group_options *o,
		    int join_ms, struct join_req *j)
{
	Tpw__V1__GroupJoin gj = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	int r;

	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && tpc_context_req_start_locked(ctx, &j->req, join_on_reply) < 0)
		r = tpc_error(-ENOMEM, "out of memory");
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		return r;
	gj.req_id = j->req.id;
	gj.name = (char *)name;
	gj.rank = o->rank;
	gj.size = o->nranks;
	gj.bootstrap = (Tpw__V1__GroupBootstrap)o->bootstrap;
	gj.timeout_ms = (uint32_t)join_ms;
	gj.coordinator = (char *)(o->coordinator ? o->coordinator : "");
	/* checked by join_check() */
	(void)tpc_remote_wire(o->remote, o->remote_peers, o->n_remote_peers, &gj.remote,
			      &gj.remote_peers, &gj.n_remote_peers);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &gj;
	pthread_mutex_lock(&ctx->send_lock);
	tpc_wire_send(ctx, &m, NULL, 0, -EBADF); /* failure: connection loss fails the request */
	pthread_mutex_unlock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_req_wait_locked(ctx, &j->req, join_ms + ctx->reply_ms);
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		return tpc_error(r, "cannot join group '%s': %s", name, j->req.msg);
	return 0;
}

/* Checks that @fd (taken), the arena the daemon sent, is a memfd of the announced size, sealed
 * against shrinking and growing (so that no member can make the others' mappings fault), and
 * maps it. */
static int arena_map(struct tp_group *g, int fd)
{
	_cleanup_close_ int afd = fd;
	struct tpu_grparena_hdr *h;
	struct stat st;
	int seals;
	void *p;

	if (g->chunk == 0 || g->chunk > GROUP_CHUNK_MAX ||
	    g->arena_bytes != tpu_grparena_bytes(g->size, g->chunk) || g->arena_bytes > SIZE_MAX)
		return tpc_error(-EPROTO, "group '%s': an arena of %llu bytes with %llu-byte slots "
				 "for %u members does not add up", g->name,
				 (unsigned long long)g->arena_bytes, (unsigned long long)g->chunk,
				 g->size);
	if (fstat(afd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != g->arena_bytes)
		return tpc_error(-EPROTO, "group '%s': the arena fd is not a file of %llu bytes",
				 g->name, (unsigned long long)g->arena_bytes);
	seals = fcntl(afd, F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
		return tpc_error(-EPROTO, "group '%s': the arena is not a memfd sealed against "
				 "shrinking and growing (seals %#x)", g->name, (unsigned)seals);
	p = mmap(NULL, g->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
	if (p == MAP_FAILED)
		return tpc_error(-errno, "group '%s': cannot map its arena: %s", g->name,
				 strerror(errno));
	h = p;
	if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != TPU_GRPARENA_MAGIC ||
	    h->version != TPU_GRPARENA_VERSION || h->size != g->size ||
	    h->chunk_bytes != g->chunk) {
		munmap(p, g->arena_bytes);
		return tpc_error(-EPROTO, "group '%s': the arena has another layout", g->name);
	}
	g->base = p;
	g->hdr = h;
	return 0;
}

static void group_send_id(struct tp_group *g, bool leave, bool abort)
{
	Tpw__V1__GroupReady rd = TPW__V1__GROUP_READY__INIT;
	Tpw__V1__GroupLeave lv = TPW__V1__GROUP_LEAVE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	if (leave) {
		lv.group_id = g->id;
		lv.calls = g->xcall; /* the others' calls up to it still complete */
		lv.abort = abort;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_LEAVE;
		m.group_leave = &lv;
	} else {
		rd.group_id = g->id;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_READY;
		m.group_ready = &rd;
	}
	pthread_mutex_lock(&g->ctx->send_lock);
	tpc_wire_send(g->ctx, &m, NULL, 0, -EBADF);
	pthread_mutex_unlock(&g->ctx->send_lock);
}

static void group_free(struct tp_group *g)
{
	tpc_collx_free(g->x);
	for (size_t i = 0; i < g->n_remote_peers; i++)
		free(g->remote_peers[i]);
	free(g->remote_peers);
	free(g->stage);
	if (g->base)
		munmap(g->base, g->arena_bytes);
	free(g->absent);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

static int join_check(struct tp_context *ctx, const char *name, const struct tp_group_options *o,
		      struct tp_group **ret)
{
	Tpw__V1__RemoteAccess wire;
	char **peers;
	size_t n;
	int r;

	if (!ctx || !name || !o || !ret || o->size < sizeof(*o))
		return tpc_error(-EINVAL, "missing context, name, options or result pointer");
	if (!*name || strlen(name) > TPW_GROUP_NAME_MAX)
		return tpc_error(strlen(name) ? -ENAMETOOLONG : -EINVAL,
				 "a group name has 1..%u bytes", TPW_GROUP_NAME_MAX);
	if (o->nranks < 1 || o->nranks > TPW_GROUP_SIZE_MAX || o->rank < -1 ||
	    (o->rank >= 0 && (unsigned)o->rank >= o->nranks))
		return tpc_error(-EINVAL, "rank %d of %u members (1..%u members, rank -1 or below "
				 "the size)", o->rank, o->nranks, TPW_GROUP_SIZE_MAX);
	if ((unsigned)o->bootstrap > TP_GROUP_BOOTSTRAP_SLURM)
		return tpc_error(-EINVAL, "unknown bootstrap %d", (int)o->bootstrap);
	if (o->remote != TP_REMOTE_PEERS && o->n_remote_peers)
		return tpc_error(-EINVAL, "TP_REMOTE_PEERS takes 1..%u peer identities, and only "
				 "it takes any", TPW_REMOTE_PEERS_MAX);
	r = tpc_remote_wire(o->remote, o->remote_peers, o->n_remote_peers, &wire, &peers, &n);
	if (r < 0)
		return r;
	/* an older daemon would join the group without checking the peers */
	if (o->remote != TP_REMOTE_NONE && o->bootstrap == TP_GROUP_BOOTSTRAP_COORDINATOR &&
	    ctx->daemon_minor < TPW_MINOR_GROUP_REMOTE)
		return tpc_error(-EOPNOTSUPP, "group '%s': the daemon (protocol minor %u) does not "
				 "enforce a group's remote access (minor %u does)", name,
				 ctx->daemon_minor, TPW_MINOR_GROUP_REMOTE);
	return 0;
}

/* The caller's options (an older caller's shorter struct gets the defaults of what it lacks)
 * and, where they leave the remote access at its default, TP_GROUP_REMOTE's. */
struct join_opts {
	struct tp_group_options o;
	const char *peers[TPW_REMOTE_PEERS_MAX];
	char env[TPW_REMOTE_PEERS_MAX * (TPW_NAME_MAX + 1)];
};

/* TP_GROUP_REMOTE: "none", "any-peer", or peer identities separated by ';'. */
static int remote_from_env(struct join_opts *jo)
{
	const char *v = getenv("TP_GROUP_REMOTE");
	char *save = NULL, *t;
	size_t n = 0;

	if (!v || !*v || strcmp(v, "none") == 0)
		return 0;
	if (strcmp(v, "any-peer") == 0) {
		jo->o.remote = TP_REMOTE_ANY_PEER;
		return 0;
	}
	if (strlen(v) >= sizeof(jo->env))
		return tpc_error(-EINVAL, "TP_GROUP_REMOTE is over %zu bytes", sizeof(jo->env) - 1);
	memcpy(jo->env, v, strlen(v) + 1);
	for (t = strtok_r(jo->env, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
		char *e;

		while (*t == ' ')
			t++;
		for (e = t + strlen(t); e > t && e[-1] == ' ';)
			*--e = '\0';
		if (!*t)
			continue;
		if (n == TPW_REMOTE_PEERS_MAX)
			return tpc_error(-EINVAL, "TP_GROUP_REMOTE names more than %u peers",
					 TPW_REMOTE_PEERS_MAX);
		jo->peers[n++] = t;
	}
	if (!n)
		return tpc_error(-EINVAL, "TP_GROUP_REMOTE is 'none', 'any-peer' or peer "
				 "identities separated by ';'");
	jo->o.remote = TP_REMOTE_PEERS;
	jo->o.remote_peers = jo->peers;
	jo->o.n_remote_peers = n;
	return 0;
}

static int opts_take(const struct tp_group_options *in, struct join_opts *jo)
{
	if (!in || in->size < offsetof(struct tp_group_options, remote))
		return tpc_error(-EINVAL, "missing options, or tp_group_options.size not set");
	memset(&jo->o, 0, sizeof(jo->o));
	memcpy(&jo->o, in, TPU_MIN(in->size, sizeof(jo->o)));
	jo->o.size = sizeof(jo->o);
	if (jo->o.remote == TP_REMOTE_NONE && !jo->o.n_remote_peers)
		return remote_from_env(jo);
	return 0;
}

/* Keeps @o's remote access in @g (collx.c's listener takes it). Return: 0 or -ENOMEM. */
static int group_keep_remote(struct tp_group *g, const struct tp_group_options *o)
{
	g->remote = o->remote;
	if (!o->n_remote_peers)
		return 0;
	if (!(g->remote_peers = calloc(o->n_remote_peers, sizeof(*g->remote_peers))))
		return -ENOMEM;
	for (; g->n_remote_peers < o->n_remote_peers; g->n_remote_peers++)
		if (!(g->remote_peers[g->n_remote_peers] = strdup(o->remote_peers[g->n_remote_peers])))
			return -ENOMEM;
	return 0;
}

/* TP_REDUCE_ISA in the environment (reduce.h): a value the kernels' choice does not know, or
 * "avx2" where this CPU or library has no such build, fails the join naming it. */
static int reduce_isa_check(const char *v)
{
	enum tpc_reduce_isa isa;
	int r = tpc_reduce_isa_env(v, &isa);

	if (r == -EINVAL)
		return tpc_error(r, "TP_REDUCE_ISA: unknown value '%.40s' (known: auto, generic, "
				 "avx2)", v);
	if (r < 0)
		return tpc_error(r, "TP_REDUCE_ISA=avx2: this CPU lacks AVX2 or F16C, or this library "
				 "was built without AVX2 kernels");
	return 0;
}

/*
 * The Slurm bootstrap as a join through a coordinator: rank and size from Slurm's variables
 * (a rank or size the caller gives must agree), the group named "NAME@slurm:JOB.STEP" (keyed
 * by job and step), the coordinator the daemon of the first host of the step's node list at
 * the daemons' peer port; a step on one node joins through the local daemon alone (no peer
 * listener or key needed). Writes @o, @gname (TPW_GROUP_NAME_MAX + 1 bytes) and @coord (what
 * @o->coordinator points to). Return: 0 or -errno with tp_last_error() set.
 */
static int slurm_options(const char *name, const struct tp_group_options *in,
			 struct tp_group_options *o, char *gname, char *coord, size_t cl)
{
	struct tpc_slurm sl;
	size_t nl, kl;
	int r;

	if (!name || !in || in->size < sizeof(*in))
		return tpc_error(-EINVAL, "missing name or options");
	r = tpc_slurm_from_env(&sl);
	if (r < 0)
		return r; /* tp_last_error() names the variable */
	if ((in->rank >= 0 && (uint32_t)in->rank != sl.rank) ||
	    (in->nranks && in->nranks != sl.size))
		return tpc_error(-EINVAL, "Slurm bootstrap: rank %d of %u disagrees with Slurm's "
				 "rank %u of %u", in->rank, in->nranks, sl.rank, sl.size);
	nl = strlen(name);
	kl = strlen(sl.key);
	if (nl + 1 + kl > TPW_GROUP_NAME_MAX)
		return tpc_error(-ENAMETOOLONG, "Slurm bootstrap: '%s@%s' is over %u bytes", name,
				 sl.key, TPW_GROUP_NAME_MAX);
	memcpy(gname, name, nl);
	gname[nl] = '@';
	memcpy(gname + nl + 1, sl.key, kl + 1);
	snprintf(coord, cl, "tpip://%s", sl.coordinator);
	*o = *in;
	o->size = sizeof(*o);
	o->rank = (int)sl.rank;
	o->nranks = sl.size;
	o->bootstrap = sl.nodes > 1 ? TP_GROUP_BOOTSTRAP_COORDINATOR : TP_GROUP_BOOTSTRAP_LOCAL;
	o->coordinator = sl.nodes > 1 ? coord : NULL;
	return 0;
}

/*
 * Does AUTO mean Slurm for @in? In a Slurm task (SLURM_JOB_ID and SLURM_PROCID set) when the
 * caller's size is 0 or the step's task count and its rank -1 or SLURM_PROCID: the group of the
 * whole step. Any other group (a subset of the tasks) stays on the local daemon.
 */
static bool auto_is_slurm(const struct tp_group_options *in)
{
	struct tpc_slurm_vars v;
	struct tpc_slurm sl;

	if (!in || in->size < sizeof(*in) || in->bootstrap != TP_GROUP_BOOTSTRAP_AUTO)
		return false;
	tpc_slurm_vars_from_env(&v);
	if (!tpc_slurm_detected(&v) || tpc_slurm_from_env(&sl) < 0)
		return false;
	return (in->nranks == 0 || in->nranks == sl.size) &&
	       (in->rank < 0 || (uint32_t)in->rank == sl.rank);
}

TP_EXPORT int tp_group_join(struct tp_context *ctx, const char *name,
			    const struct tp_group_options *opts, struct tp_group **ret)
{
	char msg[TPC_GROUP_MSG_MAX], sname[TPW_GROUP_NAME_MAX + 1];
	char scoord[TPC_SLURM_NAME_MAX + 8];
	struct tp_group_options so;
	struct join_opts jo;
	struct join_req j;
	struct tp_group *g;
	uint32_t caps_off;
	int join_ms, r;
	long ncpu;

	r = tpc_coll_features_off(getenv("TP_GROUP_FEATURES_OFF"), &caps_off);
	if (r < 0)
		return r;
	r = reduce_isa_check(getenv("TP_REDUCE_ISA"));
	if (r < 0)
		return r;
	if (opts && name && ctx && ret) {
		r = opts_take(opts, &jo);
		if (r < 0)
			return r;
		opts = &jo.o;
	}
	if (opts && opts->size >= sizeof(*opts) &&
	    (opts->bootstrap == TP_GROUP_BOOTSTRAP_SLURM || auto_is_slurm(opts))) {
		r = slurm_options(name, opts, &so, sname, scoord, sizeof(scoord));
		if (r < 0)
			return r;
		name = sname;
		opts = &so;
	}
	r = join_check(ctx, name, opts, ret);
	if (r < 0)
		return r;
	join_ms = opts->join_timeout_ms > 0 ? opts->join_timeout_ms : GROUP_JOIN_MS_DEFAULT;
	memset(&j, 0, sizeof(j));
	j.fd = -EBADF;
	r = join_ask(ctx, name, opts, join_ms, &j);
	if (r < 0) {
		join_req_free(&j);
		return r;
	}
	if (j.local_size < 1 || j.local_size > j.size || j.local_rank >= j.local_size ||
	    (j.hosts < 2 && j.local_size != j.size)) {
		join_req_free(&j);
		return tpc_error(-EPROTO, "group '%s': the daemon's answer does not add up", name);
	}
	g = calloc(1, sizeof(*g));
	if (g && !(g->absent = calloc(j.size, sizeof(*g->absent)))) {
		free(g);
		g = NULL;
	}
	if (!g) {
		join_req_free(&j);
		return tpc_error(-ENOMEM, "out of memory");
	}
	g->ctx = ctx;
	snprintf(g->name, sizeof(g->name), "%s", name);
	g->id = j.group_id;
	g->world_rank = j.rank;
	g->world_size = j.size;
	g->rank = j.local_rank; /* the arena holds this host's members */
	g->size = j.local_size;
	g->local_rank = j.local_rank;
	g->local_size = j.local_size;
	g->host_index = j.host_index;
	g->hosts = j.hosts;
	g->arena_bytes = j.arena_bytes;
	g->chunk = j.chunk;
	g->caps_off = caps_off;
	g->op_timeout_ms = opts->op_timeout_ms;
	g->pid = getpid();
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	g->spin = ncpu > 0 && (long)g->size <= ncpu;
	g->spin_ns = TPC_BARRIER_SPIN_MAX_NS;
	g->wake_spin_ns = TPC_BARRIER_WAKE_SPIN_NS;
	/* the cache the members can count on (tpc_cache_bytes(): with the whole 105 MiB a 2-CPU
	 * guest reported, 2 members copied a 16 MiB result out with plain stores, each output line
	 * read from memory first) */
	g->stream_min = tpc_cache_bytes() / (2 * g->size);
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	tpu_list_init(&g->queue);
	tpu_list_init(&g->ctx_node);
	r = group_keep_remote(g, opts) < 0 ? tpc_error(-ENOMEM, "out of memory") :
					       arena_map(g, TAKE_FD(j.fd));
	if (r == 0 && j.hosts > 1) {
		r = tpc_collx_new(g, j.member_hosts, j.n_member_hosts, j.addrs, j.naddrs, j.token,
				  j.tlen, &g->x);
		if (r < 0)
			tpc_error(r, "group '%s': the daemon's answer for its hosts does not add "
				  "up", name);
	}
	join_req_free(&j);
	if (r == 0) {
		group_send_id(g, false, false);
		if (g->x) {
			r = tpc_collx_connect(g, join_ms, msg, sizeof(msg));
			if (r < 0) {
				tpu_grparena_fail(g->hdr, g->world_rank, (uint32_t)g->pid,
						  TPU_GRPARENA_XLINK);
				tpc_error(r, "group '%s': %s", name, msg);
			}
		}
	}
	if (r == 0) {
		r = tpc_coll_barrier(g, join_ms, msg, sizeof(msg)); /* the start barrier */
		if (r < 0)
			tpc_error(r, "group '%s': start barrier: %s", name, msg);
	}
	if (r < 0) {
		group_send_id(g, true, false);
		group_free(g);
		return r;
	}
	pthread_mutex_lock(&ctx->lock);
	tpu_list_insert_tail(&ctx->groups, &g->ctx_node);
	if (ctx->dead) /* lost while joining: nobody else will say it */
		tpu_grparena_fail(g->hdr, g->world_rank, (uint32_t)g->pid, TPU_GRPARENA_LOST);
	pthread_mutex_unlock(&ctx->lock);
	*ret = g;
	return 0;
}

void tpc_group_fail_all_locked(struct tp_context *ctx)
{
	struct tp_group *g;

	tpu_list_for_each(g, &ctx->groups, ctx_node)
		tpu_grparena_fail(g->hdr, g->world_rank, (uint32_t)g->pid, TPU_GRPARENA_LOST);
}

TP_EXPORT int tp_group_rank(const struct tp_group *g)
{
	return g ? (int)g->world_rank : -EINVAL;
}

TP_EXPORT int tp_group_size(const struct tp_group *g)
{
	return g ? (int)g->world_size : -EINVAL;
}

TP_EXPORT int tp_group_local_rank(const struct tp_group *g)
{
	return g ? (int)g->local_rank : -EINVAL;
}

TP_EXPORT int tp_group_local_size(const struct tp_group *g)
{
	return g ? (int)g->local_size : -EINVAL;
}

TP_EXPORT int tp_group_host_index(const struct tp_group *g)
{
	return g ? (int)g->host_index : -EINVAL;
}

TP_EXPORT int tp_group_hosts(const struct tp_group *g)
{
	return g ? (int)g->hosts : -EINVAL;
}

TP_EXPORT uint64_t tp_group_arena_bytes(const struct tp_group *g)
{
	return g ? g->arena_bytes : 0;
}

TP_EXPORT void tp_group_abort(struct tp_group *g)
{
	if (!g || !g->hdr)
		return;
	tpu_grparena_fail(g->hdr, g->world_rank, (uint32_t)g->pid, TPU_GRPARENA_ABORTED);
	if (g->x) /* the other hosts learn it through the daemons */
		group_send_id(g, true, true);
}

/* ---- the order of collectives -------------------------------------------------------------- */

static void req_finish_locked(struct tp_group *g, struct tp_coll_req *q, int r)
{
	q->status = r;
	q->done = true;
	if (q->orphan) {
		if (r < 0)
			g->lost_err = r;
		free(q);
	}
	pthread_cond_broadcast(&g->cond);
}

/* ---- CUDA buffers, staged through host memory ---------------------------------------------- */

/* Bytes of @c's input and of its output (elements of the call's dtype). */
static void coll_sizes(const struct tp_group *g, const struct tpc_coll *c, size_t *ret_in,
		       size_t *ret_out)
{
	size_t es = c->kind == TPC_COLL_BARRIER ? 0 : tp_dtype_size(c->dtype), n = c->count * es;

	*ret_in = *ret_out = n;
	if (c->kind == TPC_COLL_ALLGATHER)
		*ret_out = n * g->world_size;
	else if (c->kind == TPC_COLL_REDUCE_SCATTER)
		*ret_in = n * g->world_size;
	else if (c->kind == TPC_COLL_BROADCAST)
		*ret_in = (uint32_t)c->root == g->world_rank ? n : 0; /* the root's data goes in */
	if (!c->send && c->kind != TPC_COLL_BROADCAST)
		*ret_in = 0; /* uneven steps: this member contributes nothing */
}

static int cuda_copy(struct tp_group *g, const struct tpc_coll *c, bool out, void *host,
		     void *dev, size_t len, char *msg, size_t ml)
{
	struct tpc_cuda_mem m = { .data = dev, .length = len, .device = c->cuda_device,
				  .stream = c->cuda_stream };
	int status = 0, r;

	snprintf(m.what, sizeof(m.what), out ? "collective output" : "collective input");
	r = out ? tpc_cuda_copy_in(g->ctx, &m, host, &status)
		: tpc_cuda_copy_out(g->ctx, &m, host, &status);
	r = r < 0 ? r : status;
	if (r < 0)
		snprintf(msg, ml, "group '%s': %s", g->name, tp_last_error());
	return r;
}

/* A fold of tp_allreduce_cuda_fn() on the staged host copies (tpc_cuda_fold()). */
struct cuda_fold {
	struct tp_group *g;
	const struct tpc_coll *c;
	int err;
	char msg[TPC_GROUP_MSG_MAX];
};

/* A tp_reduce_fn over struct cuda_fold: a failed fold aborts the group (every member's result
 * would hold this member's unfinished slice) and the later folds of the call do nothing. */
static void cuda_fold(void *inout, const void *in, size_t n, enum tp_dtype dt, void *user)
{
	struct cuda_fold *f = user;
	struct tpc_cuda_mem m = { .data = f->c->recv, .length = n * tp_dtype_size(dt),
				  .device = f->c->cuda_device, .stream = f->c->cuda_stream };
	int r;

	if (f->err < 0 || n == 0)
		return;
	snprintf(m.what, sizeof(m.what), "user reduction");
	r = tpc_cuda_fold(f->g->ctx, &m, inout, in, n, dt, f->c->cuda_fn, f->c->user);
	if (r < 0) {
		f->err = r;
		snprintf(f->msg, sizeof(f->msg), "group '%s': %s", f->g->name, tp_last_error());
		tp_group_abort(f->g);
	}
}

/*
 * Runs @c with its CUDA buffers staged through host memory: the input copied out after the
 * work queued on the call's stream, the collective on host memory, the result copied back on
 * that stream (and waited for). An input that cannot be copied out aborts the group for every
 * member (they would otherwise reduce what this member never gave); an output that cannot be
 * copied back fails this member's call only.
 */
static int coll_staged(struct tp_group *g, const struct tpc_coll *c, char *msg, size_t ml)
{
	bool in_place = c->kind == TPC_COLL_BROADCAST ||
			(c->kind == TPC_COLL_ALLREDUCE && c->send && c->send == c->recv);
	const void *dev_in = c->kind == TPC_COLL_BROADCAST ? c->recv : c->send;
	struct cuda_fold cf = { .g = g, .c = c };
	struct tpc_coll h = *c;
	size_t in, out, need;
	uint8_t *host_in;
	int r;

	coll_sizes(g, c, &in, &out);
	need = (in + 63) / 64 * 64 + out;
	if (need > g->stage_len) {
		uint8_t *p = realloc(g->stage, need);

		if (!p)
			return tpu_why(-ENOMEM, msg, ml, "out of memory for %zu staged bytes", need);
		g->stage = p;
		g->stage_len = need;
	}
	h.cuda = false;
	h.recv = g->stage + (in + 63) / 64 * 64;
	host_in = in_place ? h.recv : g->stage;
	if (c->kind != TPC_COLL_BROADCAST)
		h.send = c->send ? host_in : NULL;
	if (in && (r = cuda_copy(g, c, false, host_in, (void *)dev_in, in, msg, ml)) < 0) {
		tp_group_abort(g);
		return r;
	}
	if (c->cuda_fn) { /* each fold on the device */
		h.fn = cuda_fold;
		h.user = &cf;
	}
	r = tpc_coll_run(g, &h, msg, ml);
	if (cf.err < 0) /* this member's own failure, not the abort it made */
		return tpu_why(cf.err, msg, ml, "%s", cf.msg);
	if (r == 0 && out && !(c->kind == TPC_COLL_ALLREDUCE && c->ret_contrib &&
			       *c->ret_contrib == 0))
		r = cuda_copy(g, c, true, h.recv, c->recv, out, msg, ml);
	return r;
}

static int coll_exec(struct tp_group *g, const struct tpc_coll *c, char *msg, size_t ml)
{
	return c->cuda && c->kind != TPC_COLL_BARRIER ? coll_staged(g, c, msg, ml)
						     : tpc_coll_run(g, c, msg, ml);
}

static void *group_thread(void *arg)
{
	struct tp_group *g = arg;
	struct tp_coll_req *q;
	int r;

	pthread_mutex_lock(&g->lock);
	for (;;) {
		q = g->busy ? NULL : tpu_list_first(&g->queue, struct tp_coll_req, node);
		if (!q) {
			if (g->stop && tpu_list_empty(&g->queue))
				break;
			pthread_cond_wait(&g->cond, &g->lock);
			continue;
		}
		tpu_list_remove(&q->node);
		g->busy = true;
		pthread_mutex_unlock(&g->lock);
		r = coll_exec(g, &q->c, q->msg, sizeof(q->msg));
		pthread_mutex_lock(&g->lock);
		g->busy = false;
		req_finish_locked(g, q, r);
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

/* Queues @q (lock held), starting the group's thread on first use. */
static int queue_locked(struct tp_group *g, struct tp_coll_req *q)
{
	if (!g->thread_up) {
		if (pthread_create(&g->thread, NULL, group_thread, g) != 0)
			return tpc_error(-EAGAIN, "cannot start the group's thread");
		g->thread_up = true;
	}
	tpu_list_insert_tail(&g->queue, &q->node);
	pthread_cond_broadcast(&g->cond);
	return 0;
}

static int coll_check(struct tp_group *g, const struct tpc_coll *c)
{
	size_t es = tp_dtype_size(c->dtype);

	if (!g)
		return tpc_error(-EINVAL, "no group");
	if (c->kind == TPC_COLL_BARRIER)
		return 0;
	if (!es)
		return tpc_error(-EINVAL, "unknown dtype %d", (int)c->dtype);
	if ((c->kind == TPC_COLL_ALLREDUCE || c->kind == TPC_COLL_REDUCE_SCATTER) &&
	    !(c->op == TPC_OP_USER ? c->fn || c->cuda_fn : tpc_reduce_op_valid((int)c->op)))
		return tpc_error(-EINVAL, "unknown reduction %u (or no function)", c->op);
	if (c->cuda_fn && !c->cuda)
		return tpc_error(-EINVAL, "a reduction on CUDA memory needs the group's collective "
				 "options to name a CUDA device (tp_group_set_coll_options())");
	if (c->kind == TPC_COLL_BROADCAST && (c->root < 0 || (uint32_t)c->root >= g->world_size))
		return tpc_error(-EINVAL, "root %d of a group of %u", c->root, g->world_size);
	if (c->count && (!c->recv || (c->kind != TPC_COLL_BROADCAST && !c->send && !c->absent)))
		return tpc_error(-EINVAL, "NULL buffer for %zu elements", c->count);
	if (c->count > SIZE_MAX / es / g->world_size)
		return tpc_error(-EOVERFLOW, "%zu elements overflow", c->count);
	return 0;
}

/* The call @c with the group's collective options as they are now. */
static struct tpc_coll coll_capture(const struct tp_group *g, const struct tpc_coll *c)
{
	struct tpc_coll cc = *c;

	cc.cuda = g->cdev.type == TP_DEVICE_CUDA;
	cc.cuda_device = g->cdev.index;
	cc.cuda_stream = g->cstream;
	return cc;
}

static int coll_blocking(struct tp_group *g, const struct tpc_coll *c0)
{
	struct tpc_coll cc = coll_capture(g, c0), *c = &cc;
	struct tp_coll_req q = { .g = g, .c = cc };
	int r = coll_check(g, c);

	if (r < 0)
		return r;
	pthread_mutex_lock(&g->lock);
	if (!g->busy && tpu_list_empty(&g->queue)) {
		g->busy = true;
		pthread_mutex_unlock(&g->lock);
		r = coll_exec(g, c, q.msg, sizeof(q.msg));
		pthread_mutex_lock(&g->lock);
		g->busy = false;
		pthread_cond_broadcast(&g->cond);
		pthread_mutex_unlock(&g->lock);
		return r < 0 ? tpc_error_msg(r, q.msg) : 0;
	}
	r = queue_locked(g, &q);
	while (r == 0 && !q.done)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (r < 0)
		return r;
	return q.status < 0 ? tpc_error_msg(q.status, q.msg) : 0;
}

static int coll_start(struct tp_group *g, const struct tpc_coll *c, struct tp_coll_req **ret)
{
	struct tp_coll_req *q;
	int r = coll_check(g, c);

	if (r < 0)
		return r;
	if (!ret)
		return tpc_error(-EINVAL, "no result pointer");
	q = calloc(1, sizeof(*q));
	if (!q)
		return tpc_error(-ENOMEM, "out of memory");
	q->g = g;
	q->c = coll_capture(g, c);
	pthread_mutex_lock(&g->lock);
	r = queue_locked(g, q);
	pthread_mutex_unlock(&g->lock);
	if (r < 0) {
		free(q);
		return r;
	}
	*ret = q;
	return 0;
}

TP_EXPORT int tp_coll_test(struct tp_coll_req *q)
{
	int done;

	if (!q)
		return tpc_error(-EINVAL, "no request");
	pthread_mutex_lock(&q->g->lock);
	done = q->done;
	pthread_mutex_unlock(&q->g->lock);
	return done;
}

TP_EXPORT int tp_coll_wait(struct tp_coll_req *q)
{
	struct tp_group *g;
	int r;

	if (!q)
		return tpc_error(-EINVAL, "no request");
	g = q->g;
	pthread_mutex_lock(&g->lock);
	while (!q->done)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	r = q->status < 0 ? tpc_error_msg(q->status, q->msg) : 0;
	free(q);
	return r;
}

TP_EXPORT void tp_coll_free(struct tp_coll_req *q)
{
	struct tp_group *g;

	if (!q)
		return;
	g = q->g;
	pthread_mutex_lock(&g->lock);
	if (q->done)
		free(q);
	else
		q->orphan = true;
	pthread_mutex_unlock(&g->lock);
}

TP_EXPORT int tp_group_leave(struct tp_group *g)
{
	int r;

	if (!g)
		return 0;
	pthread_mutex_lock(&g->lock);
	g->stop = true;
	pthread_cond_broadcast(&g->cond);
	while (g->busy || !tpu_list_empty(&g->queue))
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	if (g->thread_up)
		pthread_join(g->thread, NULL);
	r = g->lost_err;
	pthread_mutex_lock(&g->ctx->lock);
	tpu_list_remove(&g->ctx_node);
	pthread_mutex_unlock(&g->ctx->lock);
	group_send_id(g, true, false);
	group_free(g);
	return r < 0 ? tpc_error(r, "a collective of the group failed unwaited") : 0;
}

TP_EXPORT int tp_group_set_coll_options(struct tp_group *g, const struct tp_coll_options *o)
{
	int r;

	if (!g || !o || o->size < sizeof(*o))
		return tpc_error(-EINVAL, "missing group or options");
	if (o->device.type == TP_DEVICE_CPU) {
		if (o->device.index != 0 || o->cuda_stream)
			return tpc_error(-EINVAL, "CPU memory takes device index 0 and no stream");
	} else if (o->device.type == TP_DEVICE_CUDA) {
		if (o->device.index < 0)
			return tpc_error(-EINVAL, "CUDA device %d", o->device.index);
		r = tpc_cuda_check(g->ctx, false);
		if (r < 0)
			return r;
	} else {
		return tpc_error(-EINVAL, "unknown device type %d", (int)o->device.type);
	}
	g->cdev = o->device;
	g->cstream = o->cuda_stream;
	return 0;
}

/* ---- the collectives ----------------------------------------------------------------------- */

TP_EXPORT int tp_barrier(struct tp_group *g)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_BARRIER });
}

TP_EXPORT int tp_allreduce(struct tp_group *g, const void *send, void *recv, size_t count,
			   enum tp_dtype dtype, enum tp_reduce_op op)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLREDUCE, .send = send,
						    .recv = recv, .count = count, .dtype = dtype,
						    .op = (unsigned)op });
}

TP_EXPORT int tp_allreduce_uneven(struct tp_group *g, const void *send, void *recv, size_t count,
				  enum tp_dtype dtype, enum tp_reduce_op op,
				  unsigned *ret_contributors)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLREDUCE, .send = send,
						    .recv = recv, .count = count, .dtype = dtype,
						    .op = (unsigned)op, .absent = send == NULL,
						    .ret_contrib = ret_contributors });
}

TP_EXPORT int tp_allreduce_fn(struct tp_group *g, const void *send, void *recv, size_t count,
			      enum tp_dtype dtype, tp_reduce_fn fn, void *user)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLREDUCE, .send = send,
						    .recv = recv, .count = count, .dtype = dtype,
						    .op = TPC_OP_USER, .fn = fn, .user = user });
}

TP_EXPORT int tp_allreduce_cuda_fn(struct tp_group *g, const void *send, void *recv, size_t count,
				   enum tp_dtype dtype, tp_reduce_cuda_fn fn, void *user)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLREDUCE, .send = send,
						    .recv = recv, .count = count, .dtype = dtype,
						    .op = TPC_OP_USER, .cuda_fn = fn,
						    .user = user });
}

TP_EXPORT int tp_broadcast(struct tp_group *g, void *buf, size_t count, enum tp_dtype dtype,
			   int root)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_BROADCAST, .recv = buf,
						    .count = count, .dtype = dtype,
						    .root = root });
}

TP_EXPORT int tp_allgather(struct tp_group *g, const void *send, void *recv, size_t count,
			   enum tp_dtype dtype)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLGATHER, .send = send,
						    .recv = recv, .count = count,
						    .dtype = dtype });
}

TP_EXPORT int tp_reduce_scatter(struct tp_group *g, const void *send, void *recv, size_t count,
				enum tp_dtype dtype, enum tp_reduce_op op)
{
	return coll_blocking(g, &(struct tpc_coll){ .kind = TPC_COLL_REDUCE_SCATTER, .send = send,
						    .recv = recv, .count = count, .dtype = dtype,
						    .op = (unsigned)op });
}

TP_EXPORT int tp_allreduce_start(struct tp_group *g, const void *send, void *recv, size_t count,
				 enum tp_dtype dtype, enum tp_reduce_op op,
				 struct tp_coll_req **ret)
{
	return coll_start(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLREDUCE, .send = send,
						 .recv = recv, .count = count, .dtype = dtype,
						 .op = (unsigned)op }, ret);
}

TP_EXPORT int tp_broadcast_start(struct tp_group *g, void *buf, size_t count, enum tp_dtype dtype,
				 int root, struct tp_coll_req **ret)
{
	return coll_start(g, &(struct tpc_coll){ .kind = TPC_COLL_BROADCAST, .recv = buf,
						 .count = count, .dtype = dtype, .root = root }, ret);
}

TP_EXPORT int tp_barrier_start(struct tp_group *g, struct tp_coll_req **ret)
{
	return coll_start(g, &(struct tpc_coll){ .kind = TPC_COLL_BARRIER }, ret);
}

TP_EXPORT int tp_allgather_start(struct tp_group *g, const void *send, void *recv, size_t count,
				 enum tp_dtype dtype, struct tp_coll_req **ret)
{
	return coll_start(g, &(struct tpc_coll){ .kind = TPC_COLL_ALLGATHER, .send = send,
						 .recv = recv, .count = count, .dtype = dtype }, ret);
}

TP_EXPORT int tp_reduce_scatter_start(struct tp_group *g, const void *send, void *recv,
				      size_t count, enum tp_dtype dtype, enum tp_reduce_op op,
				      struct tp_coll_req **ret)
{
	return coll_start(g, &(struct tpc_coll){ .kind = TPC_COLL_REDUCE_SCATTER, .send = send,
						 .recv = recv, .count = count, .dtype = dtype,
						 .op = (unsigned)op }, ret);
}
