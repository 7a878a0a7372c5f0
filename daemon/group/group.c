/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The group registry (group.h): GroupJoin, GroupReady and GroupLeave from sessions, the join
 * deadlines, forming a group (its arena: a sealed memfd handed to each member beside its
 * GroupJoined, so that no member can shrink what the daemon maps) and failing it when a
 * member's session ends. It does not run collectives (the client library does, over the
 * arena); joins through a coordinator are groupx.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <event2/event.h>

#include "core.h"
#include "group.h"
#include "group_int.h"
#include "grparena.h"
#include "local.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

#define GROUP_JOIN_MS_DEFAULT 30000u

int tpd_group_new(struct tpd_daemon *d, struct tpd_groups **ret)
{
	struct tpd_groups *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->d = d;
	tpu_list_init(&g->list);
	tpd_groupx_init(g);
	*ret = g;
	return 0;
}

/* Slot bytes for a group of @size: group-chunk up to 8 members, 8 x group-chunk / size above
 * (at least 64 KiB), a multiple of 4 KiB. */
static uint64_t group_chunk(const struct tpd_config *cfg, uint32_t size)
{
	uint64_t c = size <= 8 ? cfg->group_chunk : 8ull * cfg->group_chunk / size;

	c &= ~4095ull;
	return c < 65536 ? 65536 : c;
}

/* Adds @grp's members' counters (struct tpu_grparena_stats, what they wrote) to @sum. */
static void activity_add(const struct tpd_group *grp, uint64_t *sum)
{
	const struct tpu_grparena_stats *st;

	if (!grp->arena)
		return;
	st = (const struct tpu_grparena_stats *)((const uint8_t *)grp->arena +
						 tpu_grparena_stats_off(grp->size));
	for (uint32_t i = 0; i < grp->size; i++) {
		uint64_t v[TPD_GROUP_ACTIVITY_N] = {
			[TPD_GROUP_CALLS] = __atomic_load_n(&st[i].calls, __ATOMIC_RELAXED),
			[TPD_GROUP_BYTES] = __atomic_load_n(&st[i].bytes, __ATOMIC_RELAXED),
			[TPD_GROUP_XBYTES_OUT] = __atomic_load_n(&st[i].xbytes_out, __ATOMIC_RELAXED),
			[TPD_GROUP_XBYTES_IN] = __atomic_load_n(&st[i].xbytes_in, __ATOMIC_RELAXED),
		};

		for (int k = 0; k < TPD_GROUP_ACTIVITY_N; k++)
			sum[k] = sum[k] > UINT64_MAX - v[k] ? UINT64_MAX : sum[k] + v[k];
	}
}

void tpd_group_activity(const struct tpd_groups *g, uint64_t *ret)
{
	const struct tpd_group *grp;

	memcpy(ret, g->gone_activity, sizeof(g->gone_activity));
	tpu_list_for_each(grp, &g->list, node)
		activity_add(grp, ret);
}

static void group_free(struct tpd_group *grp)
{
	activity_add(grp, grp->gs->gone_activity);
	for (uint32_t i = 0; i < grp->size; i++)
		if (grp->m[i].ev_timeout)
			event_free(grp->m[i].ev_timeout);
	tpu_close(grp->fd);
	if (grp->arena)
		munmap(grp->arena, grp->bytes);
	tpd_groupx_free(grp->x);
	tpu_list_remove(&grp->node);
	free(grp->name);
	free(grp);
}

void tpd_group_free(struct tpd_groups *g)
{
	struct tpd_group *grp, *tmp;

	if (!g)
		return;
	tpd_groupx_done(g);
	tpu_list_for_each_safe(grp, tmp, &g->list, node)
		group_free(grp);
	free(g);
}

void tpd_group_counts(const struct tpd_groups *g, uint32_t *ret_groups, uint32_t *ret_members,
		      uint64_t *ret_bytes)
{
	const struct tpd_group *grp;
	uint32_t n = 0, m = 0;
	uint64_t b = 0;

	tpu_list_for_each(grp, &g->list, node) {
		n++;
		m += grp->formed ? grp->live : grp->joined;
		b += grp->bytes;
	}
	*ret_groups = n;
	*ret_members = m;
	*ret_bytes = b;
}

/* ---- answers ------------------------------------------------------------------------------- */

/* Answers @s's join @req_id: @err and @why, or (@err >= 0) rank @rank of @grp with the arena's
 * fd ahead of the answer. Return: 0 or -errno (the answer or its fd could not be sent). */
static int joined_send(struct tpd_session *s, uint64_t req_id, int err, const char *why,
		       const struct tpd_group *grp, uint32_t rank)
{
	Tpw__V1__GroupJoined j = TPW__V1__GROUP_JOINED__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

	j.req_id = req_id;
	j.status = err < 0 ? tpw_status_from_errno(err) : TPW__V1__STATUS__STATUS_OK;
	j.message = (char *)(why ? why : "");
	if (err >= 0 && grp) {
		j.group_id = grp->id;
		j.rank = rank;
		j.size = grp->size;
		j.local_rank = rank; /* one host: every member is local */
		j.local_size = grp->size;
		j.host_index = 0;
		j.hosts = 1;
		if (grp->x)
			tpd_groupx_joined_fill(grp, rank, &j);
		j.arena_bytes = grp->bytes;
		j.chunk_bytes = grp->chunk;
		j.arena_fd = true;
	}
	m.body_case = TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED;
	m.group_joined = &j;
	if (j.arena_fd)
		return tpd_session_send_with_fd(s, &m, grp->fd);
	return tpd_session_send(s, &m, NULL, 0);
}

static void join_refuse(struct tpd_session *s, uint64_t req_id, int err, const char *fmt, ...)
	_printf_(4, 5);
static void join_refuse(struct tpd_session *s, uint64_t req_id, int err, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	tpd_group_refuse(s, req_id, err, why);
}

bool tpd_group_log_ok(struct tpd_groups *gs, uid_t uid, unsigned *ret_suppressed)
{
	return tpd_quota_ratelog_uid_ok(&gs->log, uid, TPD_GROUP_LOG_BURST, TPD_GROUP_LOG_ALL_BURST,
					TPD_GROUP_LOG_WINDOW_MS, ret_suppressed);
}

void tpd_group_refuse(struct tpd_session *s, uint64_t req_id, int err, const char *why)
{
	unsigned held;

	if (tpd_group_log_ok(tpd_daemon_groups(tpd_session_daemon(s)), tpd_session_uid(s), &held))
		tpd_session_log(s, TPU_LOG_INFO, "group join refused: %s (%u lines about groups "
				"of this uid not logged before this one)", why, held);
	tpd_daemon_groups(tpd_session_daemon(s))->refused++;
	(void)joined_send(s, req_id, err, why, NULL, 0);
}

/* ---- forming ------------------------------------------------------------------------------- */

static bool member_gone(struct member *mb, uint32_t why, uint64_t calls);

/* Creates @grp's arena: a memfd of exactly grp->bytes, sealed so that nobody can shrink or grow
 * it (or seal it further), mapped by the daemon for the failure word and the counters, its fd
 * kept in grp->fd until every member was sent it. */
static int arena_create(struct tpd_group *grp, char *why, size_t wl)
{
	_cleanup_close_ int fd = -EBADF;
	void *p;

	fd = memfd_create("tpipd-group", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return tpu_why(-errno, why, wl, "cannot create the arena memfd: %s",
			       strerror(errno));
	if (ftruncate(fd, (off_t)grp->bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return tpu_why(-errno, why, wl, "cannot size or seal the arena of %llu bytes: %s",
			       (unsigned long long)grp->bytes, strerror(errno));
	p = mmap(NULL, grp->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return tpu_why(-errno, why, wl, "cannot map the arena: %s", strerror(errno));
	grp->arena = p;
	grp->arena->size = grp->size;
	grp->arena->chunk_bytes = grp->chunk;
	grp->arena->arena_bytes = grp->bytes;
	grp->arena->version = TPU_GRPARENA_VERSION;
	__atomic_store_n(&grp->arena->magic, TPU_GRPARENA_MAGIC, __ATOMIC_RELEASE);
	grp->fd = TAKE_FD(fd);
	return 0;
}

/* Answers every member of @grp, just formed (@r, @why: whether its arena was made), and closes
 * the arena's fd: the members and the daemon's mapping hold the memfd from then on. A member
 * whose answer or fd cannot be sent (its socket full) is marked unsent. */
static void form_answer(struct tpd_group *grp, int r, const char *why)
{
	for (uint32_t i = 0; i < grp->size; i++) {
		struct member *mb = &grp->m[i];
		int e;

		event_del(mb->ev_timeout);
		e = joined_send(mb->s, mb->req_id, r, r < 0 ? why : "", grp, i);
		mb->unsent = r == 0 && e < 0;
		if (mb->unsent)
			tpd_session_log(mb->s, TPU_LOG_INFO, "group %llu '%s': cannot hand "
					"over its arena: %s", (unsigned long long)grp->id,
					grp->name, strerror(-e));
	}
	grp->fd = tpu_close(grp->fd);
}

void tpd_group_form(struct tpd_group *grp)
{
	unsigned held;
	char why[256] = "";
	int r = arena_create(grp, why, sizeof(why));

	grp->formed = true;
	grp->live = grp->size;
	form_answer(grp, r, why);
	if (r < 0) {
		tpu_log(TPU_LOG_WARNING, "group %llu '%s' (uid %u): %s",
			(unsigned long long)grp->id, grp->name, (unsigned)grp->uid, why);
		for (uint32_t i = 0; i < grp->size; i++) {
			grp->m[i].gone = true;
			if (grp->x)
				tpd_groupx_member_gone(grp, i, TPU_GRPARENA_DIED, 0);
		}
		group_free(grp);
		return;
	}
	grp->gs->formed++;
	if (tpd_group_log_ok(grp->gs, grp->uid, &held))
		tpu_log(TPU_LOG_INFO,
			"group %llu '%s' (uid %u): %u members joined (%u lines about "
			"groups of this uid not logged before this one)",
			(unsigned long long)grp->id, grp->name, (unsigned)grp->uid, grp->size,
			held);
	/* A member that was not handed the arena is gone: the others' collectives fail. */
	for (uint32_t i = 0, n = grp->size; i < n; i++)
		if (grp->m[i].unsent && member_gone(&grp->m[i], TPU_GRPARENA_DIED, 0))
			return; /* that was the last: grp is freed */
}

/* ---- joining ------------------------------------------------------------------------------- */

static void member_clear(struct member *mb)
{
	if (mb->ev_timeout)
		event_del(mb->ev_timeout);
	mb->s = NULL;
	mb->joined = false;
	mb->grp->joined--;
}

static void member_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct member *mb = arg;
	struct tpd_group *grp = mb->grp;
	char missing[128] = "";
	size_t len = 0;

	(void)fd;
	(void)what;
	for (uint32_t i = 0; i < grp->size && len + 12 < sizeof(missing); i++)
		if (!grp->m[i].joined)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
						len ? ", " : "", i);
	if (grp->x) { /* answered by the coordinator, but not this host's other members */
		join_refuse(mb->s, mb->req_id, -ETIMEDOUT, "group '%s': the coordinator answered "
			    "%u of this host's %u members before the join timeout (missing local "
			    "ranks %s)", grp->name, grp->joined, grp->size, missing);
		tpd_groupx_member_gone(grp, (uint32_t)(mb - grp->m), TPU_GRPARENA_DIED, 0);
	} else {
		join_refuse(mb->s, mb->req_id, -ETIMEDOUT, "group '%s': %u of %u members joined "
			    "before the join timeout (missing ranks %s)", grp->name, grp->joined,
			    grp->size, missing);
	}
	member_clear(mb);
	if (grp->joined == 0)
		group_free(grp);
}

static struct tpd_group *group_find(struct tpd_groups *gs, uid_t uid, const char *name)
{
	struct tpd_group *grp;

	tpu_list_for_each(grp, &gs->list, node)
		if (!grp->x && grp->uid == uid && strcmp(grp->name, name) == 0)
			return grp;
	return NULL;
}

/* Checks the uid's limits for a new group of @size; 0 or -ENOBUFS with @why. */
static int group_limits(struct tpd_groups *gs, uid_t uid, uint32_t size, uint64_t bytes,
			char *why, size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(gs->d);
	struct tpd_group *grp;
	uint32_t n = 0;
	uint64_t b = 0;

	if (size > cfg->group_members_max)
		return tpu_why(-ENOBUFS, why, wl, "%u members is over the limit of %u "
			       "(group-members-max)", size, cfg->group_members_max);
	tpu_list_for_each(grp, &gs->list, node)
		if (grp->uid == uid) {
			n++;
			b += grp->bytes;
		}
	if (n >= cfg->groups_per_uid)
		return tpu_why(-ENOBUFS, why, wl, "uid %u has %u groups, the limit "
			       "(groups-per-uid)", (unsigned)uid, n);
	if (b + bytes > cfg->group_bytes_per_uid)
		return tpu_why(-ENOBUFS, why, wl, "an arena of %llu bytes would bring uid %u over "
			       "%llu bytes (group-bytes-per-uid)", (unsigned long long)bytes,
			       (unsigned)uid, (unsigned long long)cfg->group_bytes_per_uid);
	return 0;
}

int tpd_group_make(struct tpd_groups *gs, uid_t uid, gid_t gid, const char *name, uint32_t size,
		   struct tpd_group **ret, char *why, size_t wl)
{
	uint64_t chunk = group_chunk(tpd_daemon_cfg(gs->d), size);
	uint64_t bytes = tpu_grparena_bytes(size, chunk);
	struct tpd_group *grp;
	int r;

	r = group_limits(gs, uid, size, bytes, why, wl);
	if (r < 0)
		return r;
	grp = calloc(1, sizeof(*grp) + size * sizeof(grp->m[0]));
	if (!grp || !(grp->name = strdup(name))) {
		free(grp);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	tpu_list_init(&grp->node);
	grp->fd = -EBADF;
	grp->gs = gs;
	grp->id = ++gs->next_id;
	grp->uid = uid;
	grp->gid = gid;
	grp->size = size;
	grp->chunk = chunk;
	grp->bytes = bytes;
	grp->created_ns = tpu_now_ns();
	for (uint32_t i = 0; i < size; i++) {
		grp->m[i].grp = grp;
		grp->m[i].ev_timeout = evtimer_new(tpd_daemon_base(gs->d), member_on_timeout,
						   &grp->m[i]);
		if (!grp->m[i].ev_timeout) {
			group_free(grp);
			return tpu_why(-ENOMEM, why, wl, "out of memory");
		}
	}
	tpu_list_insert_tail(&gs->list, &grp->node);
	*ret = grp;
	return 0;
}

/* The slot @j asks for in @grp: its rank, or the lowest free one for -1. */
static int join_slot(struct tpd_group *grp, const Tpw__V1__GroupJoin *j, char *why, size_t wl)
{
	if (grp->formed)
		return tpu_why(-EBUSY, why, wl, "group '%s' is formed (or still ending): leave it "
			       "on every member first", grp->name);
	if (j->size != grp->size)
		return tpu_why(-EINVAL, why, wl, "group '%s' has %u members, this join says %u",
			       grp->name, grp->size, j->size);
	if (j->rank >= 0) {
		if (grp->m[j->rank].joined)
			return tpu_why(-EADDRINUSE, why, wl, "group '%s': rank %d already joined "
				       "(pid %d)", grp->name, (int)j->rank,
				       (int)grp->m[j->rank].pid);
		return j->rank;
	}
	for (uint32_t i = 0; i < grp->size; i++)
		if (!grp->m[i].joined)
			return (int)i;
	return tpu_why(-EADDRINUSE, why, wl, "group '%s' is full", grp->name);
}

static void group_on_join(struct tpd_session *s, const Tpw__V1__GroupJoin *j)
{
	struct tpd_groups *gs = tpd_daemon_groups(tpd_session_daemon(s));
	uint32_t ms = j->timeout_ms ? j->timeout_ms : GROUP_JOIN_MS_DEFAULT;
	struct timeval tv = { ms / 1000, (long)(ms % 1000) * 1000 };
	struct tpd_group *grp;
	struct member *mb;
	char why[256];
	int r;

	if (!s->group_arena_fd) {
		join_refuse(s, j->req_id, -EOPNOTSUPP, "group '%s': this daemon hands group arenas "
			    "over as sealed memfds; libtpclient is too old (it would open a file by "
			    "its path): upgrade it", j->name);
		return;
	}
	if (j->bootstrap == TPW__V1__GROUP_BOOTSTRAP__GROUP_BOOTSTRAP_COORDINATOR) {
		tpd_groupx_join(s, j);
		return;
	}
	if (j->bootstrap != TPW__V1__GROUP_BOOTSTRAP__GROUP_BOOTSTRAP_UNSPECIFIED &&
	    j->bootstrap != TPW__V1__GROUP_BOOTSTRAP__GROUP_BOOTSTRAP_LOCAL) {
		join_refuse(s, j->req_id, -EOPNOTSUPP, "group '%s': the Slurm bootstrap is not "
			    "built yet (use a coordinator, tpip://HOST[:PORT])", j->name);
		return;
	}
	grp = group_find(gs, tpd_session_uid(s), j->name);
	if (!grp) {
		r = tpd_group_make(gs, tpd_session_uid(s), s->gid, j->name, j->size, &grp, why,
				   sizeof(why));
		if (r < 0) {
			join_refuse(s, j->req_id, r, "group '%s': %s", j->name, why);
			return;
		}
	}
	r = join_slot(grp, j, why, sizeof(why));
	if (r < 0) {
		if (grp->joined == 0)
			group_free(grp);
		join_refuse(s, j->req_id, r, "%s", why);
		return;
	}
	mb = &grp->m[r];
	mb->s = s;
	mb->req_id = j->req_id;
	mb->pid = tpd_session_pid(s);
	mb->joined = true;
	grp->joined++;
	tpd_timer_add(mb->ev_timeout, &tv);
	if (grp->joined == grp->size)
		tpd_group_form(grp);
}

/* ---- members leaving ----------------------------------------------------------------------- */

/* Member @mb of a formed group goes (@why: DIED or LEFT, after @calls calls across hosts):
 * the others' collectives fail (from call @calls + 1 on, when it left after @calls > 0). */
static const char *why_word(uint32_t why)
{
	return why == TPU_GRPARENA_DIED ? "died" : why == TPU_GRPARENA_ABORTED ? "aborted the group"
									      : "left";
}

/* Return: true if that freed the group (the last member went). */
static bool member_gone(struct member *mb, uint32_t why, uint64_t calls)
{
	struct tpd_group *grp = mb->grp;
	uint32_t idx = (uint32_t)(mb - grp->m);
	uint32_t rank = grp->x ? tpd_groupx_rank(grp, idx) : idx; /* in the whole group */
	unsigned held;

	if (mb->gone)
		return false;
	mb->gone = true;
	mb->gone_why = why;
	mb->s = NULL;
	grp->live--;
	if (!grp->failure[0])
		snprintf(grp->failure, sizeof(grp->failure), "rank %u (pid %d) %s", rank,
			 (int)mb->pid, why_word(why));
	if (grp->live > 0 && grp->arena &&
	    (why == TPU_GRPARENA_LEFT && calls && grp->x
		     ? tpu_grparena_leave_after(grp->arena, rank, (uint32_t)mb->pid, calls)
		     : tpu_grparena_fail(grp->arena, rank, (uint32_t)mb->pid, why)) &&
	    ++grp->gs->failed && tpd_group_log_ok(grp->gs, grp->uid, &held))
		tpu_log(
		    why == TPU_GRPARENA_DIED ? TPU_LOG_WARNING : TPU_LOG_INFO,
		    "group %llu '%s' (uid %u): rank %u (pid %d) %s; the group fails for the "
		    "%u other members (%u lines about groups of this uid not logged before this "
		    "one)",
		    (unsigned long long)grp->id, grp->name, (unsigned)grp->uid, rank, (int)mb->pid,
		    why_word(why), grp->live, held);
	if (grp->x)
		tpd_groupx_member_gone(grp, idx, why, calls);
	if (grp->live > 0)
		return false;
	group_free(grp);
	return true;
}

void tpd_group_drop(struct tpd_group *grp)
{
	group_free(grp);
}

void tpd_group_fail(struct tpd_group *grp, uint32_t rank, uint32_t pid, uint32_t why,
		    uint64_t calls, const char *text)
{
	unsigned held;

	if (!grp->failure[0])
		snprintf(grp->failure, sizeof(grp->failure), "%s", text);
	if (grp->arena &&
	    (why == TPU_GRPARENA_LEFT && calls ? tpu_grparena_leave_after(grp->arena, rank, pid,
									  calls)
					       : tpu_grparena_fail(grp->arena, rank, pid, why)) &&
	    ++grp->gs->failed && tpd_group_log_ok(grp->gs, grp->uid, &held))
		tpu_log(TPU_LOG_WARNING, "group %llu '%s' (uid %u): %s; the group fails for its "
			"%u members here (%u lines about groups of this uid not logged before this "
			"one)", (unsigned long long)grp->id, grp->name, (unsigned)grp->uid, text,
			grp->live, held);
}

static struct member *member_of(struct tpd_groups *gs, struct tpd_session *s, uint64_t id)
{
	struct tpd_group *grp;

	tpu_list_for_each(grp, &gs->list, node)
		if (grp->id == id && grp->formed)
			for (uint32_t i = 0; i < grp->size; i++)
				if (grp->m[i].s == s)
					return &grp->m[i];
	return NULL;
}

static void group_on_ready(struct tpd_session *s, const Tpw__V1__GroupReady *rd)
{
	struct member *mb = member_of(tpd_daemon_groups(tpd_session_daemon(s)), s, rd->group_id);

	if (!mb || mb->ready)
		return;
	mb->ready = true;
	mb->grp->ready++;
}

static void group_on_leave(struct tpd_session *s, const Tpw__V1__GroupLeave *lv)
{
	struct member *mb = member_of(tpd_daemon_groups(tpd_session_daemon(s)), s, lv->group_id);

	if (mb && lv->abort && mb->grp->x)
		member_gone(mb, TPU_GRPARENA_ABORTED, 0);
	else if (mb)
		member_gone(mb, TPU_GRPARENA_LEFT, lv->calls);
}

static void group_on_session_end(struct tpd_session *s)
{
	struct tpd_groups *gs = tpd_daemon_groups(tpd_session_daemon(s));
	struct tpd_group *grp, *tmp;

	tpd_groupx_session_end(gs, s);
	tpu_list_for_each_safe(grp, tmp, &gs->list, node) {
		for (uint32_t i = 0; i < grp->size; i++) {
			struct member *mb = &grp->m[i];
			bool formed = grp->formed;
			bool last = formed ? grp->live == 1 : grp->joined == 1;

			if (mb->s != s)
				continue;
			if (formed) {
				member_gone(mb, TPU_GRPARENA_DIED, 0); /* frees grp after the last */
			} else {
				if (grp->x) /* the coordinator answered it: tell it */
					tpd_groupx_member_gone(grp, i, TPU_GRPARENA_DIED, 0);
				member_clear(mb);
				if (last)
					group_free(grp);
			}
			if (last)
				break; /* grp is freed: read nothing of it */
		}
	}
}

static const struct tpd_local_group_ops group_local_ops = {
	.join = group_on_join,
	.ready = group_on_ready,
	.leave = group_on_leave,
	.session_end = group_on_session_end,
};

void tpd_group_serve_local(struct tpd_local *l)
{
	tpd_local_set_group_ops(l, &group_local_ops);
}

/* ---- tpipctl and metrics ------------------------------------------------------------------ */

void tpd_group_totals(const struct tpd_groups *g, uint64_t *ret_formed, uint64_t *ret_failed,
		      uint64_t *ret_refused)
{
	*ret_formed = g->formed;
	*ret_failed = g->failed;
	*ret_refused = g->refused;
}

static const char *member_state(const struct tpd_group *grp, const struct member *mb)
{
	if (mb->gone)
		return mb->gone_why == TPU_GRPARENA_DIED ? "died" : mb->gone_why ==
			TPU_GRPARENA_ABORTED ? "aborted" : "left";
	if (!mb->joined)
		return "missing";
	if (!grp->formed)
		return "joining";
	return mb->ready ? "ready" : "joined";
}

static int ctl_member(const struct tpd_group *grp, uint32_t rank, Tpw__V1__CtlGroupMember **ret)
{
	const struct member *mb = &grp->m[rank];
	Tpw__V1__CtlGroupMember *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	tpw__v1__ctl_group_member__init(c);
	c->rank = grp->x ? tpd_groupx_rank(grp, rank) : rank; /* in the whole group */
	c->pid = (uint32_t)mb->pid;
	c->session_id = mb->s ? tpd_session_id(mb->s) : 0;
	c->state = (char *)member_state(grp, mb);
	if (grp->arena) {
		const struct tpu_grparena_stats *st =
			(const struct tpu_grparena_stats *)((const uint8_t *)grp->arena +
							    tpu_grparena_stats_off(grp->size)) +
			rank;

		/* what the member wrote: numbers only, shown as they are */
		c->calls = __atomic_load_n(&st->calls, __ATOMIC_RELAXED);
		c->bytes = __atomic_load_n(&st->bytes, __ATOMIC_RELAXED);
		c->busy_us = __atomic_load_n(&st->busy_ns, __ATOMIC_RELAXED) / 1000;
		c->wait_us = __atomic_load_n(&st->wait_ns, __ATOMIC_RELAXED) / 1000;
		c->xbytes_out = __atomic_load_n(&st->xbytes_out, __ATOMIC_RELAXED);
		c->xbytes_in = __atomic_load_n(&st->xbytes_in, __ATOMIC_RELAXED);
		c->xbusy_us = __atomic_load_n(&st->xbusy_ns, __ATOMIC_RELAXED) / 1000;
	}
	*ret = c;
	return 0;
}

static void ctl_group_free(Tpw__V1__CtlGroup *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_members; i++)
		free(c->members[i]);
	free(c->members);
	free(c->plan);
	free(c);
}

static int ctl_group(const struct tpd_group *grp, Tpw__V1__CtlGroup **ret)
{
	Tpw__V1__CtlGroup *c = calloc(1, sizeof(*c));
	char plan[512];

	if (!c)
		return -ENOMEM;
	tpw__v1__ctl_group__init(c);
	c->id = grp->id;
	c->name = grp->name;
	c->uid = (uint32_t)grp->uid;
	c->size = grp->size;
	c->joined = grp->joined;
	c->state = (char *)(!grp->formed ? "joining" : grp->failure[0] ? "failed" : "formed");
	c->hosts = 1;
	if (grp->x)
		tpd_groupx_describe(grp, plan, sizeof(plan), &c->hosts);
	else
		snprintf(plan, sizeof(plan), "one host, shared-memory arena: all-reduce up to "
			 "%u bytes = every member folds the %u slots in rank order, 1 barrier; "
			 "above = reduce-scatter by %u slices in rank order + all-gather, chunks of "
			 "%llu KiB, 1 barrier each + 1", TPU_GRPARENA_DIRECT_MAX / grp->size,
			 grp->size, grp->size, (unsigned long long)(grp->chunk >> 10));
	c->plan = strdup(plan);
	c->arena_bytes = grp->bytes;
	c->chunk_bytes = grp->chunk;
	c->failure = (char *)grp->failure;
	c->age_ms = (tpu_now_ns() - grp->created_ns) / 1000000;
	c->members = calloc(grp->size, sizeof(*c->members));
	if (!c->plan || !c->members) {
		ctl_group_free(c);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < grp->size; i++) {
		if (ctl_member(grp, i, &c->members[i]) < 0) {
			ctl_group_free(c);
			return -ENOMEM;
		}
		c->n_members++;
	}
	if (grp->x && tpd_groupx_ctl(grp, c) < 0) {
		ctl_group_free(c);
		return -ENOMEM;
	}
	*ret = c;
	return 0;
}

int tpd_group_ctl(struct tpd_groups *g, bool own_only, uid_t viewer, Tpw__V1__CtlGroup ***ret,
		  size_t *n)
{
	struct tpd_group *grp;
	Tpw__V1__CtlGroup **v;
	size_t k = 0, cap = 0;

	tpu_list_for_each(grp, &g->list, node)
		cap++;
	cap += own_only ? 0 : tpd_group_coord_count(g); /* their uid may be only a claim */
	v = calloc(cap + 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	tpu_list_for_each(grp, &g->list, node) {
		if (own_only && grp->uid != viewer)
			continue;
		if (ctl_group(grp, &v[k]) < 0) {
			tpd_group_ctl_free(v, k);
			return -ENOMEM;
		}
		k++;
	}
	if (!own_only) {
		size_t nc = 0;

		if (tpd_group_coord_ctl(g, v + k, &nc) < 0) {
			tpd_group_ctl_free(v, k);
			return -ENOMEM;
		}
		k += nc;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_group_ctl_free(Tpw__V1__CtlGroup **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		ctl_group_free(v[i]);
	free(v);
}
