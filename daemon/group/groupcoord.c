/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The coordinator's side of cross-host group joins (issue 24; docs/collectives.md; the member's
 * side is groupx.c). PeerGroupJoins (and this daemon's own members' joins) are collected per
 * (name, uid as the forwarding daemon claims it, remote access the join states), over
 * authenticated peer links only, each admitted only if the remote access it states allows the
 * identity its link authenticated with (a remote daemon is its own kind of principal; its uid
 * is a claim). Joins stating another access are another group, so that no party a join's
 * setting does not allow shapes the group it meets; a mismatch is refused like another size
 * only where the other group has a member the join's setting admits (of this host, or over a
 * link it allows), so that honest misconfiguration still fails at once. When
 * all members joined they are grouped by the instance of the daemon they joined through (never
 * by address or rank arithmetic; a join over a link that states this daemon's instance or that
 * of another peer's member is refused), hosts numbered by their lowest rank, and every member's
 * daemon is answered with the whole membership. A member gone (PeerGroupGone) or a peer link
 * that fails is told to every other member's daemon. Bounded by group-members-max (members of
 * a group) and group-peer-groups-max (groups with members over one link).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <event2/event.h>

#include "core.h"
#include "group_int.h"
#include "grparena.h"
#include "peer.h"
#include "tpu.h"
#include "validate.h"

struct cmember {
	bool joined, gone;
	struct tpd_peer *pr; /* the link it joined over; NULL: this daemon */
	uint64_t join_id;
	uint64_t instance; /* the host identity: the instance of the daemon it joined through */
	uint32_t pid;
	char host[64];
	char peer[TPD_PEER_PRINCIPAL_LEN]; /* the identity its link authenticated with; "": here */
};

struct cgroup {
	struct tpu_list node; /* gs->cgroups */
	struct tpd_groups *gs;
	uint64_t id;
	char *name;
	uid_t uid;
	uint32_t size, joined, live;
	uint8_t token[TPW_GROUP_TOKEN_BYTES]; /* what the hosts' leaders prove to each other */
	bool formed;
	bool answering; /* cgroup_form() is answering: a member gone waits until it is done */
	struct tpd_groupx_remote remote; /* its first member's statement, every member's */
	struct event *ev_timeout;
	struct cmember m[];
};

static void cgroup_tell_gone(struct cgroup *cg, uint32_t rank, uint32_t why, uint64_t calls,
			     const char *text);

/* To a member's daemon: over its link, or to this daemon's member side. */
static void to_member(struct tpd_groups *gs, struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	if (pr)
		tpd_peer_send(pr, m, NULL, 0);
	else
		tpd_groupx_member_msg(gs, NULL, m);
}

static void send_gone(struct tpd_groups *gs, struct tpd_peer *pr, uint64_t group_id,
		      uint32_t rank, uint32_t pid, uint32_t why, uint64_t calls, const char *text)
{
	Tpw__V1__PeerGroupGone g = TPW__V1__PEER_GROUP_GONE__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	g.group_id = group_id;
	g.rank = rank;
	g.pid = pid;
	g.why = why;
	g.calls = calls;
	g.message = (char *)text;
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_GONE;
	m.group_gone = &g;
	to_member(gs, pr, &m);
}

static void cgroup_free(struct cgroup *cg)
{
	if (cg->ev_timeout)
		event_free(cg->ev_timeout);
	tpu_list_remove(&cg->node);
	tpd_groupx_remote_done(&cg->remote);
	free(cg->name);
	free(cg);
}

static void coord_answer(struct tpd_groups *gs, const struct cmember *cm, int err,
			 const char *why, Tpw__V1__PeerGroupJoined *tmpl)
{
	Tpw__V1__PeerGroupJoined j = TPW__V1__PEER_GROUP_JOINED__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (tmpl)
		j = *tmpl;
	j.join_id = cm->join_id;
	j.status = err < 0 ? tpw_status_from_errno(err) : TPW__V1__STATUS__STATUS_OK;
	j.message = (char *)(why ? why : "");
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOINED;
	m.group_joined = &j;
	to_member(gs, cm->pr, &m);
}

/* A refusal of a join (of uid @uid, as its member's daemon states it) that never got a slot. A
 * peer daemon sends joins as fast as its link carries them: the refusals of its joins are
 * logged within its link's budget (tpd_peer_log_ok()), so that they hide no other peer's;
 * this host's within their uid's (tpd_group_log_ok()). */
static void coord_refuse(struct tpd_groups *gs, struct tpd_peer *pr, uid_t uid, uint64_t join_id,
			 int err, const char *fmt, ...) _printf_(6, 7);
static void coord_refuse(struct tpd_groups *gs, struct tpd_peer *pr, uid_t uid, uint64_t join_id,
			 int err, const char *fmt, ...)
{
	struct cmember cm = { .pr = pr, .join_id = join_id };
	char why[256];
	unsigned held;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (!pr) {
		if (tpd_group_log_ok(gs, uid, &held))
			tpu_log(TPU_LOG_INFO,
				"group join from this host refused: %s (%u lines about "
				"groups of this uid not logged before this one)",
				why, held);
	} else if (tpd_peer_log_ok(pr, &held))
		tpu_log(TPU_LOG_INFO, "group join from %s refused: %s (%u lines about this peer "
			"not logged before this one)", tpd_peer_name(pr), why, held);
	gs->refused++;
	coord_answer(gs, &cm, err, why, NULL);
}

static struct cgroup *cgroup_conflict(struct tpd_groups *gs, uid_t uid, const char *name,
				      const struct tpd_groupx_remote *st);

/* May a line about @cg be logged now? Within the budget of its first member in rank order that
 * joined: its peer's (tpd_peer_log_ok(); a peer whose link is gone: the budget of no peer in
 * particular) or, one of this host, its uid's (tpd_group_log_ok()). */
static bool cgroup_log_ok(struct cgroup *cg, unsigned *ret_suppressed)
{
	for (uint32_t i = 0; i < cg->size; i++) {
		const struct cmember *cm = &cg->m[i];

		if (!cm->joined)
			continue;
		if (cm->pr || cm->peer[0])
			return tpd_peer_log_ok(cm->pr, ret_suppressed);
		break;
	}
	return tpd_group_log_ok(cg->gs, cg->uid, ret_suppressed);
}

static void cgroup_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct cgroup *cg = arg;
	char missing[128] = "", why[320];
	size_t len = 0;
	unsigned held;

	(void)fd;
	(void)what;
	for (uint32_t i = 0; i < cg->size && len + 12 < sizeof(missing); i++)
		if (!cg->m[i].joined)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
						len ? ", " : "", i);
	/* joins of the name that state another remote access wait apart: named only where the
	 * group's own setting admits one of their members (as a mismatch at a join is) */
	snprintf(why, sizeof(why), "group '%s': %u of %u members joined the coordinator before "
		 "the join timeout (missing ranks %s)%s", cg->name, cg->joined, cg->size, missing,
		 cgroup_conflict(cg->gs, cg->uid, cg->name, &cg->remote) ?
			 "; members of the name stating another remote access joined apart: "
			 "every member must state the same" : "");
	if (cgroup_log_ok(cg, &held))
		tpu_log(TPU_LOG_INFO, "%s (%u lines about this group's first member's side not "
			"logged before this one)", why, held);
	cg->gs->refused += cg->joined;
	for (uint32_t i = 0; i < cg->size; i++)
		if (cg->m[i].joined)
			coord_answer(cg->gs, &cg->m[i], -ETIMEDOUT, why, NULL);
	cgroup_free(cg);
}

/* The group of (@name, @uid) whose members state the remote access @st, or NULL. */
static struct cgroup *cgroup_find(struct tpd_groups *gs, uid_t uid, const char *name,
				  const struct tpd_groupx_remote *st)
{
	struct cgroup *cg;

	tpu_list_for_each(cg, &gs->cgroups, node)
		if (cg->uid == uid && strcmp(cg->name, name) == 0 &&
		    tpd_groupx_remote_same(&cg->remote, st))
			return cg;
	return NULL;
}

/*
 * Whether the remote access @st admits a member of @cg (joined, not gone): one of this host
 * (its uid is the kernel's), or one over a link whose identity @st allows. Only such a member
 * may tell a join stating @st anything: another party is no one that join trusts.
 */
static bool cgroup_trusted_by(const struct cgroup *cg, const struct tpd_groupx_remote *st)
{
	for (uint32_t i = 0; i < cg->size; i++) {
		const struct cmember *cm = &cg->m[i];

		if (!cm->joined || cm->gone)
			continue;
		if (cm->pr ? tpd_groupx_remote_allows(st, cm->pr) : !cm->peer[0])
			return true;
	}
	return false;
}

/* A group of (@name, @uid) whose members state another remote access than @st and that has a
 * member @st admits (cgroup_trusted_by()), or NULL. */
static struct cgroup *cgroup_conflict(struct tpd_groups *gs, uid_t uid, const char *name,
				      const struct tpd_groupx_remote *st)
{
	struct cgroup *cg;

	tpu_list_for_each(cg, &gs->cgroups, node)
		if (cg->uid == uid && strcmp(cg->name, name) == 0 &&
		    !tpd_groupx_remote_same(&cg->remote, st) && cgroup_trusted_by(cg, st))
			return cg;
	return NULL;
}

/* Groups this daemon coordinates that have a member (joined, not gone) over a link of @pr's
 * peer (tpd_peer_same()). */
static uint32_t peer_groups(struct tpd_groups *gs, const struct tpd_peer *pr)
{
	struct cgroup *cg;
	uint32_t n = 0;

	tpu_list_for_each(cg, &gs->cgroups, node)
		for (uint32_t i = 0; i < cg->size; i++)
			if (cg->m[i].joined && !cg->m[i].gone && tpd_peer_same(cg->m[i].pr, pr)) {
				n++;
				break;
			}
	return n;
}

static int cgroup_new(struct tpd_groups *gs, const Tpw__V1__PeerGroupJoin *j,
		      struct cgroup **ret)
{
	uint32_t ms = j->timeout_ms ? j->timeout_ms : 30000u;
	struct timeval tv = { ms / 1000, (long)(ms % 1000) * 1000 };
	struct cgroup *cg = calloc(1, sizeof(*cg) + j->size * sizeof(cg->m[0]));

	if (!cg || !(cg->name = strdup(j->name)) ||
	    tpd_groupx_remote_set(&cg->remote, j->remote, j->remote_peers, j->n_remote_peers) < 0 ||
	    !(cg->ev_timeout = evtimer_new(tpd_daemon_base(gs->d), cgroup_on_timeout, cg))) {
		if (cg) {
			tpd_groupx_remote_done(&cg->remote);
			free(cg->name);
		}
		free(cg);
		return -ENOMEM;
	}
	tpu_list_init(&cg->node);
	cg->gs = gs;
	if (getrandom(cg->token, sizeof(cg->token), 0) != (ssize_t)sizeof(cg->token)) {
		event_free(cg->ev_timeout);
		tpd_groupx_remote_done(&cg->remote);
		free(cg->name);
		free(cg);
		return -EIO;
	}
	cg->id = ++gs->next_cgroup_id;
	cg->uid = j->uid;
	cg->size = j->size;
	tpd_timer_add(cg->ev_timeout, &tv);
	tpu_list_insert_tail(&gs->cgroups, &cg->node);
	*ret = cg;
	return 0;
}

/* Every member joined: group them by host and answer each member's daemon. */
static void cgroup_form(struct cgroup *cg)
{
	Tpw__V1__PeerGroupJoined t = TPW__V1__PEER_GROUP_JOINED__INIT;
	Tpw__V1__PeerGroupMember *mv = calloc(cg->size, sizeof(*mv));
	Tpw__V1__PeerGroupMember **mp = calloc(cg->size, sizeof(*mp));
	uint32_t *host = calloc(cg->size, sizeof(*host)), hosts = 0;
	char (*addr)[TPW_GROUP_ADDR_MAX + 1] = calloc(cg->size, sizeof(*addr));
	char **ap = calloc(cg->size, sizeof(*ap));
	unsigned held;

	event_del(cg->ev_timeout);
	if (!mv || !mp || !host || !addr || !ap) {
		for (uint32_t i = 0; i < cg->size; i++)
			coord_answer(cg->gs, &cg->m[i], -ENOMEM, "out of memory", NULL);
		cgroup_free(cg);
		goto out;
	}
	for (uint32_t r = 0; r < cg->size; r++) {
		uint32_t q = 0;

		while (q < r && cg->m[q].instance != cg->m[r].instance)
			q++;
		host[r] = q < r ? host[q] : hosts++; /* numbered by their lowest rank */
		if (q == r) { /* the host's first member: where its daemon is reached from here */
			if (cg->m[r].pr)
				tpd_peer_group_far_addr(cg->m[r].pr, addr[host[r]],
							sizeof(addr[0]));
			ap[host[r]] = addr[host[r]];
		}
		tpw__v1__peer_group_member__init(&mv[r]);
		mv[r].rank = r;
		mv[r].host_index = host[r];
		mv[r].pid = cg->m[r].pid;
		mv[r].host = cg->m[r].host;
		mv[r].peer = cg->m[r].peer;
		mp[r] = &mv[r];
	}
	cg->formed = true;
	cg->live = cg->size;
	cg->answering = true; /* answers to this daemon's own members run synchronously */
	t.group_id = cg->id;
	t.size = cg->size;
	t.hosts = hosts;
	t.n_members = cg->size;
	t.members = mp;
	t.n_host_addrs = hosts;
	t.host_addrs = ap;
	t.token.data = cg->token;
	t.token.len = sizeof(cg->token);
	cg->gs->formed++;
	if (cgroup_log_ok(cg, &held))
		tpu_log(TPU_LOG_INFO, "group %llu '%s' (uid %u): coordinated, %u members on %u "
			"hosts (%u lines about its first member's side not logged before this one)",
			(unsigned long long)cg->id, cg->name, (unsigned)cg->uid, cg->size, hosts,
			held);
	for (uint32_t r = 0; r < cg->size; r++) {
		uint32_t lr = 0, ls = 0;

		for (uint32_t q = 0; q < cg->size; q++)
			if (host[q] == host[r]) {
				lr += q < r;
				ls++;
			}
		t.rank = r;
		t.local_rank = lr;
		t.local_size = ls;
		t.host_index = host[r];
		coord_answer(cg->gs, &cg->m[r], 0, "", &t);
	}
	cg->answering = false;
	for (uint32_t r = 0; r < cg->size && cg->live; r++) /* gone while answering */
		if (cg->m[r].gone)
			cgroup_tell_gone(cg, r, TPU_GRPARENA_DIED, 0, "a member could not set up its "
					 "part of the group");
	if (cg->live == 0)
		cgroup_free(cg);
out:
	free(mv);
	free(mp);
	free(host);
	free(addr);
	free(ap);
}

/*
 * Whether a member joining over @pr (a link) states the host of another daemon: the instance
 * its daemon's Hello stated is this daemon's own, or that of a member of @cg (NULL: none yet)
 * that joined through this daemon or over a link of another peer (tpd_peer_same()). Members
 * are grouped into hosts by that instance, which is only claimed.
 */
static bool cmember_poses(const struct tpd_groups *gs, const struct cgroup *cg,
			  const struct tpd_peer *pr)
{
	uint64_t instance = tpd_peer_group_far_instance(pr);

	if (instance == tpd_peer_group_instance(gs->d))
		return true;
	for (uint32_t i = 0; cg && i < cg->size; i++) {
		const struct cmember *cm = &cg->m[i];

		if (cm->joined && !cm->gone && cm->instance == instance &&
		    (!cm->pr || !tpd_peer_same(cm->pr, pr)))
			return true;
	}
	return false;
}

/*
 * Whether join @j over @pr (NULL: this host) may take part in a group: a member from another
 * host only over a link whose authenticated identity the remote access it states allows (its
 * uid is only that daemon's claim). Joins stating other remote accesses are other groups, each
 * keyed by (name, uid, remote access), so that a party a join's setting does not allow never
 * shapes the group it meets (size, ranks, timeout, setting): a daemon the members do not trust
 * cannot squat their group by joining first. A join is refused for a mismatch only where a
 * group of the name with another setting has a member the join's own setting admits (honest
 * misconfiguration fails at once). Refuses it otherwise. Return: true if it may, with @ret_cg
 * its group (NULL: none yet).
 */
static bool coord_admits(struct tpd_groups *gs, struct tpd_peer *pr,
			 const Tpw__V1__PeerGroupJoin *j, struct cgroup **ret_cg)
{
	struct tpd_groupx_remote st;
	const struct cgroup *other;
	char a[256], b[256];

	if (tpd_groupx_remote_set(&st, j->remote, j->remote_peers, j->n_remote_peers) < 0) {
		coord_refuse(gs, pr, j->uid, j->join_id, -ENOMEM, "out of memory");
		return false;
	}
	if (pr && !tpd_groupx_remote_allows(&st, pr)) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EACCES,
			     "group '%s': the peer %s (%s) may not "
			     "take part: the group's remote access is %s%s",
			     j->name, tpd_peer_group_host(pr),
			     tpd_peer_identity(pr) ? tpd_peer_identity(pr) : "not authenticated",
			     tpd_groupx_remote_text(&st, a, sizeof(a)),
			     st.mode == TPW__V1__REMOTE_ACCESS__REMOTE_NONE &&
				     !tpd_peer_group_remote_ok(pr)
				 ? " (the member's daemon runs an older tpipd)"
				 : "");
		tpd_groupx_remote_done(&st);
		return false;
	}
	other = cgroup_conflict(gs, j->uid, j->name, &st);
	if (other)
		coord_refuse(gs, pr, j->uid, j->join_id, -EINVAL,
			     "group '%s' takes remote members from %s, "
			     "this join says %s",
			     j->name, tpd_groupx_remote_text(&other->remote, a, sizeof(a)),
			     tpd_groupx_remote_text(&st, b, sizeof(b)));
	else
		*ret_cg = cgroup_find(gs, j->uid, j->name, &st);
	tpd_groupx_remote_done(&st);
	return !other;
}

static void coord_on_join(struct tpd_groups *gs, struct tpd_peer *pr,
			  const Tpw__V1__PeerGroupJoin *j)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(gs->d);
	struct cgroup *cg;
	struct cmember *cm;
	int32_t rank = j->rank;

	if (pr && !tpd_peer_group_authenticated(pr)) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EACCES,
			     "group '%s': the coordinator takes joins "
			     "only over authenticated peer links (a key or certificate)",
			     j->name);
		return;
	}
	if (j->size > cfg->group_members_max) {
		coord_refuse(gs, pr, j->uid, j->join_id, -ENOBUFS,
			     "group '%s': %u members is over the "
			     "coordinator's limit of %u (group-members-max)",
			     j->name, j->size, cfg->group_members_max);
		return;
	}
	if (!coord_admits(gs, pr, j, &cg))
		return;
	if (pr && cmember_poses(gs, cg, pr)) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EACCES,
			     "group '%s': the peer %s states the "
			     "instance of another host's daemon (this one's or another peer's)",
			     j->name, tpd_peer_group_host(pr));
		return;
	}
	if (!cg) {
		uint32_t n = pr ? peer_groups(gs, pr) : 0;
		int r;

		if (pr && n >= cfg->group_peer_groups_max) {
			coord_refuse(gs, pr, j->uid, j->join_id, -ENOBUFS,
				     "group '%s': the coordinator has "
				     "%u groups with members from the peer %s, the limit "
				     "(group-peer-groups-max)",
				     j->name, n, tpd_peer_group_host(pr));
			return;
		}
		r = cgroup_new(gs, j, &cg);
		if (r < 0) {
			coord_refuse(gs, pr, j->uid, j->join_id, r,
				     r == -EIO ? "no random bytes for the "
						 "group's token"
					       : "out of memory");
			return;
		}
	}
	if (cg->formed) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EBUSY,
			     "group '%s' is formed (or still ending) "
			     "at the coordinator: leave it on every member first",
			     j->name);
		return;
	}
	if (j->size != cg->size) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EINVAL,
			     "group '%s' has %u members, this join "
			     "says %u",
			     j->name, cg->size, j->size);
		return;
	}
	if (rank >= 0 && cg->m[rank].joined) {
		coord_refuse(gs, pr, j->uid, j->join_id, -EADDRINUSE,
			     "group '%s': rank %d already joined "
			     "(pid %u on %s)",
			     j->name, (int)rank, cg->m[rank].pid, cg->m[rank].host);
		return;
	}
	for (uint32_t i = 0; rank < 0 && i < cg->size; i++)
		if (!cg->m[i].joined)
			rank = (int32_t)i;
	cm = &cg->m[rank];
	cm->joined = true;
	cm->pr = pr;
	cm->join_id = j->join_id;
	cm->instance = pr ? tpd_peer_group_far_instance(pr) : tpd_peer_group_instance(gs->d);
	cm->pid = j->pid;
	snprintf(cm->host, sizeof(cm->host), "%s",
		 pr ? tpd_peer_group_host(pr) : tpd_peers_hostname(gs->d));
	snprintf(cm->peer, sizeof(cm->peer), "%s", pr ? tpd_peer_identity(pr) : "");
	if (++cg->joined == cg->size)
		cgroup_form(cg);
}

/* Tells every member's daemon but @except's (NULL: none) that @cg lost rank @rank. */
static void cgroup_tell_gone(struct cgroup *cg, uint32_t rank, uint32_t why, uint64_t calls,
			     const char *text)
{
	for (uint32_t i = 0; i < cg->size; i++) {
		struct cmember *cm = &cg->m[i];
		bool told = false;

		if (cm->gone)
			continue;
		for (uint32_t q = 0; q < i && !told; q++) /* once per daemon */
			told = !cg->m[q].gone && cg->m[q].pr == cm->pr;
		if (!told)
			send_gone(cg->gs, cm->pr, cg->id, rank, cg->m[rank].pid, why, calls, text);
	}
}

/* Member @rank of @cg is gone (@why; LEFT after @calls calls across hosts); frees @cg after
 * the last. Return: true if freed. */
static bool cmember_gone(struct cgroup *cg, uint32_t rank, uint32_t why, uint64_t calls,
			 const char *text)
{
	struct cmember *cm = &cg->m[rank];

	if (!cg->formed) {
		cm->joined = false;
		if (--cg->joined == 0) {
			cgroup_free(cg);
			return true;
		}
		return false;
	}
	if (cm->gone)
		return false;
	cm->gone = true;
	if (cg->answering) { /* cgroup_form() tells the others and frees once it is done */
		cg->live--;
		return false;
	}
	if (--cg->live == 0) {
		cgroup_free(cg);
		return true;
	}
	cgroup_tell_gone(cg, rank, why, calls, text);
	return false;
}

static void coord_on_gone(struct tpd_groups *gs, struct tpd_peer *pr,
			  const Tpw__V1__PeerGroupGone *g)
{
	struct cgroup *cg, *tmp;
	char text[256];

	tpu_list_for_each_safe(cg, tmp, &gs->cgroups, node)
		for (uint32_t i = 0; i < cg->size; i++) {
			struct cmember *cm = &cg->m[i];

			/* A member gone already (over a link that failed: @pr cleared) is skipped:
			 * its join id, the far daemon's, may equal a live member's here. */
			if (!cm->joined || cm->gone || cm->pr != pr || cm->join_id != g->join_id)
				continue;
			snprintf(text, sizeof(text), "rank %u (pid %u) on %s %s", i, cm->pid,
				 cm->host, g->why == TPU_GRPARENA_LEFT ? "left" : g->why ==
				 TPU_GRPARENA_ABORTED ? "aborted the group" : "died");
			cmember_gone(cg, i, g->why, g->why == TPU_GRPARENA_LEFT ? g->calls : 0, text);
			return;
		}
}

void tpd_group_coord_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOIN)
		coord_on_join(gs, pr, m->group_join);
	else if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_GONE)
		coord_on_gone(gs, pr, m->group_gone);
}

void tpd_group_coord_link_failed(struct tpd_groups *gs, struct tpd_peer *pr, const char *why)
{
	struct cgroup *cg, *tmp;
	char text[256];

	tpu_list_for_each_safe(cg, tmp, &gs->cgroups, node)
		for (uint32_t i = 0; i < cg->size; i++) {
			struct cmember *cm = &cg->m[i];

			if (!cm->joined || cm->gone || cm->pr != pr)
				continue;
			snprintf(text, sizeof(text), "the peer link to %.60s (rank %u) failed: %.80s",
				 cm->host, i, why);
			cm->pr = NULL; /* never used again: gone or cleared below */
			if (cmember_gone(cg, i, TPU_GRPARENA_HOST, 0, text))
				break;
		}
}

size_t tpd_group_coord_count(const struct tpd_groups *gs)
{
	const struct cgroup *cg;
	size_t n = 0;

	tpu_list_for_each(cg, &gs->cgroups, node)
		n++;
	return n;
}

static void ctl_cgroup_free(Tpw__V1__CtlGroup *c)
{
	for (size_t i = 0; i < c->n_members; i++)
		free(c->members[i]);
	free(c->members);
	free(c->plan);
	free(c);
}

/* Whether joined member @q of @cg is the first joined member of its host. */
static bool host_first_joined(const struct cgroup *cg, uint32_t q)
{
	for (uint32_t p = 0; p < q; p++)
		if (cg->m[p].joined && cg->m[p].instance == cg->m[q].instance)
			return false;
	return true;
}

/* Which host of @cg joined member @r is on (numbered by lowest joined rank, as the plan numbers
 * them once formed) and, for another host's, where its daemon is reached from here, into @m
 * (whose host_addr has TPW_GROUP_ADDR_MAX + 1 bytes). */
static void ctl_member_host(const struct cgroup *cg, uint32_t r, Tpw__V1__CtlGroupMember *m)
{
	uint32_t h = 0;

	for (uint32_t q = 0; q < r; q++) {
		if (!cg->m[q].joined || !host_first_joined(cg, q))
			continue;
		if (cg->m[q].instance == cg->m[r].instance)
			break;
		h++;
	}
	m->host_index = h;
	if (cg->m[r].pr)
		tpd_peer_group_far_addr(cg->m[r].pr, m->host_addr, TPW_GROUP_ADDR_MAX + 1);
}

static int ctl_cgroup(const struct cgroup *cg, Tpw__V1__CtlGroup **ret)
{
	Tpw__V1__CtlGroup *c = calloc(1, sizeof(*c));
	char plan[400], rt[256];
	bool local = false;

	if (!c)
		return -ENOMEM;
	tpw__v1__ctl_group__init(c);
	if (!(c->members = calloc(cg->size, sizeof(*c->members)))) {
		free(c);
		return -ENOMEM;
	}
	c->coordinated = true;
	c->id = cg->id;
	c->name = cg->name;
	c->uid = (uint32_t)cg->uid;
	c->size = cg->size;
	c->joined = cg->joined;
	c->state = (char *)(cg->formed ? "formed" : "joining");
	c->hosts = 0;
	c->remote = cg->remote.mode;
	c->n_remote_peers = cg->remote.n;
	c->remote_peers = cg->remote.peers;
	for (uint32_t r = 0; r < cg->size; r++) {
		const struct cmember *cm = &cg->m[r];
		Tpw__V1__CtlGroupMember *m;

		if (!cm->joined)
			continue;
		/* the member, with room for its host's address behind it */
		if (!(m = calloc(1, sizeof(*m) + TPW_GROUP_ADDR_MAX + 1))) {
			ctl_cgroup_free(c);
			return -ENOMEM;
		}
		tpw__v1__ctl_group_member__init(m);
		m->host_addr = (char *)(m + 1);
		ctl_member_host(cg, r, m);
		m->rank = r;
		m->pid = cm->pid;
		m->state = (char *)(cm->gone ? "gone" : cg->formed ? "joined" : "joining");
		m->remote = cm->pr != NULL || cm->peer[0];
		m->peer = (char *)cm->peer;
		m->host = (char *)cm->host;
		m->claimed_uid = m->remote ? (uint32_t)cg->uid : 0;
		local |= !m->remote;
		c->members[c->n_members++] = m;
	}
	c->uid_claimed = !local; /* no member of this host: only peer daemons claim the uid */
	snprintf(plan, sizeof(plan), "this daemon coordinates the group: %u of %u members "
		 "joined, remote access %s", cg->joined, cg->size,
		 tpd_groupx_remote_text(&cg->remote, rt, sizeof(rt)));
	if (!(c->plan = strdup(plan))) {
		ctl_cgroup_free(c);
		return -ENOMEM;
	}
	*ret = c;
	return 0;
}

int tpd_group_coord_ctl(struct tpd_groups *gs, Tpw__V1__CtlGroup **v, size_t *n)
{
	const struct cgroup *cg;
	size_t k = 0;

	tpu_list_for_each(cg, &gs->cgroups, node) {
		if (ctl_cgroup(cg, &v[k]) < 0) {
			while (k)
				ctl_cgroup_free(v[--k]);
			return -ENOMEM;
		}
		k++;
	}
	*n = k;
	return 0;
}

void tpd_group_coord_done(struct tpd_groups *gs)
{
	struct cgroup *cg, *tmp;

	tpu_list_for_each_safe(cg, tmp, &gs->cgroups, node)
		cgroup_free(cg);
}
