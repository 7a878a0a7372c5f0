/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Cross-host group joins through a coordinator daemon (issue 24; docs/collectives.md). Two
 * roles, both in every daemon:
 *
 * - member side: a client's GroupJoin with bootstrap COORDINATOR ("tpip://HOST[:PORT]") is
 *   forwarded as PeerGroupJoin over the peer link to that daemon (or handled here when the
 *   address is this daemon's own), with the client's SO_PEERCRED uid and pid. The answer
 *   (PeerGroupJoined: global rank, size, host index, hosts, local rank and size, every member)
 *   places the client in this host's part of the group, a struct tpd_group of local-size
 *   members with its own arena (group.c), formed once every local member has its answer.
 * - coordinator side: PeerGroupJoins (and this daemon's own members') are collected per (name,
 *   uid as the forwarding daemon attests it); when all members joined, they are grouped by the
 *   instance of the daemon they joined through (never by address or rank arithmetic), hosts
 *   numbered by their lowest rank, and every member's daemon is answered with the membership.
 *   A member gone (PeerGroupGone) or a peer link that fails is told to every other member's
 *   daemon, which fails its arena naming the rank (and tpipctl names the host).
 *
 * Trust: joins are accepted only over links whose far daemon authenticated (TLS with the
 * pre-shared key or a certificate of the cluster CA); the uid in a PeerGroupJoin is that
 * daemon's attestation of its client's SO_PEERCRED uid. So a user can join only groups of
 * their own uid, provided uids mean the same user on every host of the cluster (as Slurm and
 * NFS assume), and anyone holding the peer key is trusted as a daemon is.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core.h"
#include "group_int.h"
#include "grparena.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

#define XJOIN_SLACK_MS 1000u /* the coordinator's timeout answer comes first */
#define COORD_MAX (TPW_TPIP_HOST_MAX + 8)

/* Member side: one client's join sent (or to be sent) to a coordinator. */
struct xjoin {
	struct tpu_list node; /* gs->xjoins */
	struct tpd_groups *gs;
	struct tpd_session *s;
	uint64_t req_id;
	uint64_t join_id;
	char name[TPW_GROUP_NAME_MAX + 1];
	int32_t rank;
	uint32_t size, timeout_ms;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct tpd_peer *pr; /* NULL: this daemon coordinates */
	char coord[COORD_MAX];
	bool sent;
	struct event *ev_timeout;
};

/* Member side: what a host's part of a cross-host group adds to its struct tpd_group. */
struct tpd_groupx {
	struct tpd_peer *pr; /* the link to the coordinator; NULL: this daemon, or @lost */
	bool self;
	bool lost;
	uint64_t cid; /* the coordinator's group id */
	char coord[COORD_MAX];
	uint32_t size, hosts, host_index;
	char hosts_text[200];
	uint32_t *rank;	   /* per local member: its rank in the group */
	uint64_t *join_id; /* per local member: its join's id here */
};

/* Coordinator side. */
struct cmember {
	bool joined, gone;
	struct tpd_peer *pr; /* the link it joined over; NULL: this daemon */
	uint64_t join_id;
	uint64_t instance; /* the host identity: the instance of the daemon it joined through */
	uint32_t pid;
	char host[64];
};

struct cgroup {
	struct tpu_list node; /* gs->cgroups */
	struct tpd_groups *gs;
	uint64_t id;
	char *name;
	uid_t uid;
	uint32_t size, joined, live;
	bool formed;
	bool answering; /* cgroup_form() is answering: a member gone waits until it is done */
	struct event *ev_timeout;
	struct cmember m[];
};

static void coord_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);
static void cgroup_tell_gone(struct cgroup *cg, uint32_t rank, uint32_t why, const char *text);
static void member_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);

/* ---- sending both ways ---------------------------------------------------------------------- */

static void to_coord(struct tpd_groups *gs, struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	if (pr)
		tpd_peer_send(pr, m, NULL, 0);
	else
		coord_msg(gs, NULL, m);
}

static void to_member(struct tpd_groups *gs, struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	if (pr)
		tpd_peer_send(pr, m, NULL, 0);
	else
		member_msg(gs, NULL, m);
}

static void send_gone(struct tpd_groups *gs, struct tpd_peer *pr, bool to_coordinator,
		      uint64_t join_id, uint64_t group_id, uint32_t rank, uint32_t pid,
		      uint32_t why, const char *text)
{
	Tpw__V1__PeerGroupGone g = TPW__V1__PEER_GROUP_GONE__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	g.join_id = join_id;
	g.group_id = group_id;
	g.rank = rank;
	g.pid = pid;
	g.why = why;
	g.message = (char *)text;
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_GONE;
	m.group_gone = &g;
	if (to_coordinator)
		to_coord(gs, pr, &m);
	else
		to_member(gs, pr, &m);
}

/* ---- coordinator side ----------------------------------------------------------------------- */

static void cgroup_free(struct cgroup *cg)
{
	if (cg->ev_timeout)
		event_free(cg->ev_timeout);
	tpu_list_remove(&cg->node);
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

/* A refusal of a join that never got a slot. */
static void coord_refuse(struct tpd_groups *gs, struct tpd_peer *pr, uint64_t join_id, int err,
			 const char *fmt, ...) _printf_(5, 6);
static void coord_refuse(struct tpd_groups *gs, struct tpd_peer *pr, uint64_t join_id, int err,
			 const char *fmt, ...)
{
	struct cmember cm = { .pr = pr, .join_id = join_id };
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	tpu_log(TPU_LOG_INFO, "group join from %s refused: %s",
		pr ? tpd_peer_name(pr) : "this host", why);
	gs->refused++;
	coord_answer(gs, &cm, err, why, NULL);
}

static void cgroup_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct cgroup *cg = arg;
	char missing[128] = "", why[256];
	size_t len = 0;

	(void)fd;
	(void)what;
	for (uint32_t i = 0; i < cg->size && len + 12 < sizeof(missing); i++)
		if (!cg->m[i].joined)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
						len ? ", " : "", i);
	snprintf(why, sizeof(why), "group '%s': %u of %u members joined the coordinator before "
		 "the join timeout (missing ranks %s)", cg->name, cg->joined, cg->size, missing);
	tpu_log(TPU_LOG_INFO, "%s", why);
	cg->gs->refused += cg->joined;
	for (uint32_t i = 0; i < cg->size; i++)
		if (cg->m[i].joined)
			coord_answer(cg->gs, &cg->m[i], -ETIMEDOUT, why, NULL);
	cgroup_free(cg);
}

static struct cgroup *cgroup_find(struct tpd_groups *gs, uid_t uid, const char *name)
{
	struct cgroup *cg;

	tpu_list_for_each(cg, &gs->cgroups, node)
		if (cg->uid == uid && strcmp(cg->name, name) == 0)
			return cg;
	return NULL;
}

/* Groups this daemon coordinates that have a member (joined, not gone) over @pr. */
static uint32_t link_groups(struct tpd_groups *gs, const struct tpd_peer *pr)
{
	struct cgroup *cg;
	uint32_t n = 0;

	tpu_list_for_each(cg, &gs->cgroups, node)
		for (uint32_t i = 0; i < cg->size; i++)
			if (cg->m[i].joined && !cg->m[i].gone && cg->m[i].pr == pr) {
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
	    !(cg->ev_timeout = evtimer_new(tpd_daemon_base(gs->d), cgroup_on_timeout, cg))) {
		if (cg)
			free(cg->name);
		free(cg);
		return -ENOMEM;
	}
	tpu_list_init(&cg->node);
	cg->gs = gs;
	cg->id = ++gs->next_cgroup_id;
	cg->uid = j->uid;
	cg->size = j->size;
	evtimer_add(cg->ev_timeout, &tv);
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

	event_del(cg->ev_timeout);
	if (!mv || !mp || !host) {
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
		tpw__v1__peer_group_member__init(&mv[r]);
		mv[r].rank = r;
		mv[r].host_index = host[r];
		mv[r].pid = cg->m[r].pid;
		mv[r].host = cg->m[r].host;
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
	cg->gs->formed++;
	tpu_log(TPU_LOG_INFO, "group %llu '%s' (uid %u): coordinated, %u members on %u hosts",
		(unsigned long long)cg->id, cg->name, (unsigned)cg->uid, cg->size, hosts);
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
			cgroup_tell_gone(cg, r, TPU_GRPARENA_DIED, "a member could not set up its "
					 "part of the group");
	if (cg->live == 0)
		cgroup_free(cg);
out:
	free(mv);
	free(mp);
	free(host);
}

static void coord_on_join(struct tpd_groups *gs, struct tpd_peer *pr,
			  const Tpw__V1__PeerGroupJoin *j)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(gs->d);
	struct cgroup *cg;
	struct cmember *cm;
	int32_t rank = j->rank;

	if (pr && !tpd_peer_group_authenticated(pr)) {
		coord_refuse(gs, pr, j->join_id, -EACCES, "group '%s': the coordinator takes joins "
			     "only over authenticated peer links (a key or certificate)", j->name);
		return;
	}
	if (j->size > cfg->group_members_max) {
		coord_refuse(gs, pr, j->join_id, -ENOBUFS, "group '%s': %u members is over the "
			     "coordinator's limit of %u (group-members-max)", j->name, j->size,
			     cfg->group_members_max);
		return;
	}
	cg = cgroup_find(gs, j->uid, j->name);
	if (!cg) {
		uint32_t n = pr ? link_groups(gs, pr) : 0;

		if (pr && n >= cfg->group_peer_groups_max) {
			coord_refuse(gs, pr, j->join_id, -ENOBUFS, "group '%s': the coordinator has "
				     "%u groups with members over the link from %s, the limit "
				     "(group-peer-groups-max)", j->name, n,
				     tpd_peer_group_host(pr));
			return;
		}
		if (cgroup_new(gs, j, &cg) < 0) {
			coord_refuse(gs, pr, j->join_id, -ENOMEM, "out of memory");
			return;
		}
	}
	if (cg->formed) {
		coord_refuse(gs, pr, j->join_id, -EBUSY, "group '%s' is formed (or still ending) "
			     "at the coordinator: leave it on every member first", j->name);
		return;
	}
	if (j->size != cg->size) {
		coord_refuse(gs, pr, j->join_id, -EINVAL, "group '%s' has %u members, this join "
			     "says %u", j->name, cg->size, j->size);
		return;
	}
	if (rank >= 0 && cg->m[rank].joined) {
		coord_refuse(gs, pr, j->join_id, -EADDRINUSE, "group '%s': rank %d already joined "
			     "(pid %u on %s)", j->name, (int)rank, cg->m[rank].pid,
			     cg->m[rank].host);
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
	if (++cg->joined == cg->size)
		cgroup_form(cg);
}

/* Tells every member's daemon but @except's (NULL: none) that @cg lost rank @rank. */
static void cgroup_tell_gone(struct cgroup *cg, uint32_t rank, uint32_t why, const char *text)
{
	for (uint32_t i = 0; i < cg->size; i++) {
		struct cmember *cm = &cg->m[i];
		bool told = false;

		if (cm->gone)
			continue;
		for (uint32_t q = 0; q < i && !told; q++) /* once per daemon */
			told = !cg->m[q].gone && cg->m[q].pr == cm->pr;
		if (!told)
			send_gone(cg->gs, cm->pr, false, 0, cg->id, rank, cg->m[rank].pid, why,
				  text);
	}
}

/* Member @rank of @cg is gone (@why); frees @cg after the last. Return: true if freed. */
static bool cmember_gone(struct cgroup *cg, uint32_t rank, uint32_t why, const char *text)
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
	cgroup_tell_gone(cg, rank, why, text);
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

			if (!cm->joined || cm->pr != pr || cm->join_id != g->join_id)
				continue;
			snprintf(text, sizeof(text), "rank %u (pid %u) on %s %s", i, cm->pid,
				 cm->host, g->why == TPU_GRPARENA_LEFT ? "left" : "died");
			cmember_gone(cg, i, g->why, text);
			return;
		}
}

static void coord_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOIN)
		coord_on_join(gs, pr, m->group_join);
	else if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_GONE)
		coord_on_gone(gs, pr, m->group_gone);
}

/* The link @pr failed: its members leave the groups this daemon coordinates. */
static void coord_link_failed(struct tpd_groups *gs, struct tpd_peer *pr, const char *why)
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
			if (cmember_gone(cg, i, TPU_GRPARENA_HOST, text))
				break;
		}
}

/* ---- member side ---------------------------------------------------------------------------- */

static void xjoin_free(struct xjoin *xj)
{
	if (xj->ev_timeout)
		event_free(xj->ev_timeout);
	tpu_list_remove(&xj->node);
	free(xj);
}

static void xjoin_refuse(struct xjoin *xj, int err, const char *fmt, ...) _printf_(3, 4);
static void xjoin_refuse(struct xjoin *xj, int err, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	tpd_group_refuse(xj->s, xj->req_id, err, why);
	xjoin_free(xj);
}

static void xjoin_send(struct xjoin *xj)
{
	Tpw__V1__PeerGroupJoin j = TPW__V1__PEER_GROUP_JOIN__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	j.join_id = xj->join_id;
	j.name = xj->name;
	j.rank = xj->rank;
	j.size = xj->size;
	j.uid = (uint32_t)xj->uid;
	j.pid = (uint32_t)xj->pid;
	j.timeout_ms = xj->timeout_ms;
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	xj->sent = true;
	to_coord(xj->gs, xj->pr, &m); /* may answer (and free @xj) before it returns */
}

static void xjoin_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct xjoin *xj = arg;
	char dial[200] = "";

	(void)fd;
	(void)what;
	if (xj->sent)
		send_gone(xj->gs, xj->pr, true, xj->join_id, 0, 0, (uint32_t)xj->pid,
			  TPU_GRPARENA_DIED, "");
	if (xj->pr && !tpd_peer_is_up(xj->pr))
		xjoin_refuse(xj, -ETIMEDOUT, "group '%s': coordinator %s not reachable within the "
			     "join timeout (%u ms)%s%s", xj->name, xj->coord, xj->timeout_ms,
			     *tpd_peer_dial_text(xj->pr, dial, sizeof(dial)) ? ": " : "", dial);
	else
		xjoin_refuse(xj, -ETIMEDOUT, "group '%s': no answer from coordinator %s within "
			     "the join timeout (%u ms)", xj->name, xj->coord, xj->timeout_ms);
}

/* Is "HOST:PORT" this daemon's own peer listener address? */
static bool coord_is_self(struct tpd_groups *gs, const char *host, uint16_t port)
{
	const char *la = tpd_peers_listen_addr(gs->d);
	char me[COORD_MAX + 4];

	snprintf(me, sizeof(me), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, (unsigned)port);
	return *la && strcmp(la, me) == 0;
}

void tpd_groupx_join(struct tpd_session *s, const Tpw__V1__GroupJoin *j)
{
	struct tpd_groups *gs = tpd_daemon_groups(tpd_session_daemon(s));
	const struct tpd_config *cfg = tpd_daemon_cfg(gs->d);
	char addr[COORD_MAX + 16], host[TPW_TPIP_HOST_MAX + 1], why[256];
	uint32_t ms = j->timeout_ms ? j->timeout_ms : 30000u;
	struct timeval tv = { (ms + XJOIN_SLACK_MS) / 1000,
			      (long)((ms + XJOIN_SLACK_MS) % 1000) * 1000 };
	const char *c = j->coordinator ? j->coordinator : "", *name;
	struct xjoin *xj;
	uint16_t port;
	size_t cl = strlen(c);
	int r;

	/* "tpip://HOST[:PORT]" (a trailing '/' allowed) parsed as the address of a listener */
	if (cl >= sizeof(addr) - 3 || strncmp(c, "tpip://", 7) != 0 || strchr(c + 7, '/') !=
	    (cl && c[cl - 1] == '/' ? c + cl - 1 : NULL)) {
		tpd_group_refuse(s, j->req_id, -EINVAL, "group join: the coordinator must be "
				 "tpip://HOST[:PORT]");
		return;
	}
	snprintf(addr, sizeof(addr), "%.*s/g", (int)(cl && c[cl - 1] == '/' ? cl - 1 : cl), c);
	r = tpw_tpip_parse(addr, (uint16_t)cfg->peer_port, host, &port, &name, why, sizeof(why));
	if (r < 0) {
		tpd_group_refuse(s, j->req_id, -EINVAL, why);
		return;
	}
	xj = calloc(1, sizeof(*xj));
	if (!xj || !(xj->ev_timeout = evtimer_new(tpd_daemon_base(gs->d), xjoin_on_timeout, xj))) {
		free(xj);
		tpd_group_refuse(s, j->req_id, -ENOMEM, "out of memory");
		return;
	}
	tpu_list_init(&xj->node);
	tpu_list_insert_tail(&gs->xjoins, &xj->node);
	xj->gs = gs;
	xj->s = s;
	xj->req_id = j->req_id;
	xj->join_id = ++gs->next_join_id;
	snprintf(xj->name, sizeof(xj->name), "%s", j->name);
	xj->rank = j->rank;
	xj->size = j->size;
	xj->timeout_ms = ms;
	xj->uid = tpd_session_uid(s);
	xj->gid = s->gid;
	xj->pid = tpd_session_pid(s);
	snprintf(xj->coord, sizeof(xj->coord), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 (unsigned)port);
	evtimer_add(xj->ev_timeout, &tv);
	if (coord_is_self(gs, host, port)) {
		xjoin_send(xj);
		return;
	}
	r = tpd_peer_get(gs->d, host, port, &xj->pr, why, sizeof(why));
	if (r < 0) {
		xjoin_refuse(xj, r, "group '%s': cannot reach coordinator %s: %s", xj->name,
			     xj->coord, why);
		return;
	}
	if (tpd_peer_is_up(xj->pr))
		xjoin_send(xj);
}

static struct tpd_group *xgroup_find(struct tpd_groups *gs, struct tpd_peer *pr, uint64_t cid)
{
	struct tpd_group *grp;

	tpu_list_for_each(grp, &gs->list, node)
		if (grp->x && !grp->x->lost && grp->x->pr == pr && grp->x->cid == cid)
			return grp;
	return NULL;
}

static int xgroup_new(struct xjoin *xj, const Tpw__V1__PeerGroupJoined *a,
		      struct tpd_group **ret, char *why, size_t wl)
{
	struct tpd_groupx *x = calloc(1, sizeof(*x));
	struct tpd_group *grp;
	size_t len = 0;
	int r;

	if (!x || !(x->rank = calloc(a->local_size, sizeof(*x->rank))) ||
	    !(x->join_id = calloc(a->local_size, sizeof(*x->join_id)))) {
		tpd_groupx_free(x);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	r = tpd_group_make(xj->gs, xj->uid, xj->gid, xj->name, a->local_size, &grp, why, wl);
	if (r < 0) {
		tpd_groupx_free(x);
		return r;
	}
	x->pr = xj->pr;
	x->self = !xj->pr;
	x->cid = a->group_id;
	snprintf(x->coord, sizeof(x->coord), "%s", xj->coord);
	x->size = a->size;
	x->hosts = a->hosts;
	x->host_index = a->host_index;
	for (uint32_t h = 0; h < a->hosts && len + 40 < sizeof(x->hosts_text); h++) {
		uint32_t n = 0, first = 0;

		for (size_t i = 0; i < a->n_members; i++)
			if (a->members[i]->host_index == h && !n++)
				first = (uint32_t)i;
		len += (size_t)snprintf(x->hosts_text + len, sizeof(x->hosts_text) - len,
					"%s%.40s (%u)", h ? ", " : "", a->members[first]->host, n);
	}
	grp->x = x;
	*ret = grp;
	return 0;
}

static void member_on_joined(struct tpd_groups *gs, struct tpd_peer *pr,
			     const Tpw__V1__PeerGroupJoined *a)
{
	struct tpd_group *grp;
	struct xjoin *xj, *it;
	struct member *mb;
	char why[256];
	int r;

	xj = NULL;
	tpu_list_for_each(it, &gs->xjoins, node)
		if (it->join_id == a->join_id && it->pr == pr)
			xj = it;
	if (!xj)
		return; /* its session ended: the coordinator was told */
	if (a->status != TPW__V1__STATUS__STATUS_OK) {
		xjoin_refuse(xj, tpw_status_to_errno(a->status), "%s", a->message);
		return;
	}
	grp = xgroup_find(gs, pr, a->group_id);
	if (grp && (grp->formed || grp->size != a->local_size)) {
		r = tpu_why(-EPROTO, why, sizeof(why), "the coordinator's answer does not fit "
			    "the group's members here");
		goto refuse;
	}
	if (!grp) {
		r = xgroup_new(xj, a, &grp, why, sizeof(why));
		if (r < 0)
			goto refuse;
	}
	mb = &grp->m[a->local_rank];
	if (mb->joined) {
		r = tpu_why(-EPROTO, why, sizeof(why), "the coordinator gave local rank %u twice",
			    a->local_rank);
		goto refuse;
	}
	mb->s = xj->s;
	mb->req_id = xj->req_id;
	mb->pid = xj->pid;
	mb->joined = true;
	grp->joined++;
	grp->x->rank[a->local_rank] = a->rank;
	grp->x->join_id[a->local_rank] = xj->join_id;
	xjoin_free(xj);
	if (grp->joined == grp->size)
		tpd_group_form(grp);
	return;
refuse:
	send_gone(gs, pr, true, xj->join_id, 0, 0, (uint32_t)xj->pid, TPU_GRPARENA_DIED, why);
	xjoin_refuse(xj, r, "group '%s': %s", xj->name, why);
}

/* The coordinator says rank @g->rank of group @g->group_id is gone. */
static void member_on_gone(struct tpd_groups *gs, struct tpd_peer *pr,
			   const Tpw__V1__PeerGroupGone *g)
{
	struct tpd_group *grp = xgroup_find(gs, pr, g->group_id);

	if (!grp)
		return;
	if (grp->formed) {
		tpd_group_fail(grp, g->rank, g->pid, g->why, g->message ? g->message : "");
		return;
	}
	for (uint32_t i = 0; i < grp->size; i++) /* not every answer is here yet */
		if (grp->m[i].joined)
			tpd_group_refuse(grp->m[i].s, grp->m[i].req_id, -ECONNRESET,
					 g->message ? g->message : "a member is gone");
	tpd_group_drop(grp);
}

static void member_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOINED)
		member_on_joined(gs, pr, m->group_joined);
	else if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_GONE)
		member_on_gone(gs, pr, m->group_gone);
}

void tpd_groupx_session_end(struct tpd_groups *gs, struct tpd_session *s)
{
	struct xjoin *xj, *tmp;

	tpu_list_for_each_safe(xj, tmp, &gs->xjoins, node) {
		if (xj->s != s)
			continue;
		if (xj->sent)
			send_gone(gs, xj->pr, true, xj->join_id, 0, 0, (uint32_t)xj->pid,
				  TPU_GRPARENA_DIED, "");
		xjoin_free(xj);
	}
}

void tpd_groupx_member_gone(struct tpd_group *grp, uint32_t idx, uint32_t why)
{
	struct tpd_groupx *x = grp->x;

	if (x->lost)
		return;
	send_gone(grp->gs, x->pr, true, x->join_id[idx], 0, x->rank[idx],
		  (uint32_t)grp->m[idx].pid, why, "");
}

uint32_t tpd_groupx_rank(const struct tpd_group *grp, uint32_t idx)
{
	return grp->x->rank[idx];
}

void tpd_groupx_joined_fill(const struct tpd_group *grp, uint32_t idx, Tpw__V1__GroupJoined *j)
{
	const struct tpd_groupx *x = grp->x;

	j->rank = x->rank[idx];
	j->size = x->size;
	j->local_rank = idx;
	j->local_size = grp->size;
	j->host_index = x->host_index;
	j->hosts = x->hosts;
}

void tpd_groupx_describe(const struct tpd_group *grp, char *buf, size_t len, uint32_t *ret_hosts)
{
	const struct tpd_groupx *x = grp->x;

	snprintf(buf, len, "%u members on %u hosts: %s; host %u here (%u members, ranks from "
		 "coordinator %s%s); across hosts: not built yet", x->size, x->hosts,
		 x->hosts_text, x->host_index, grp->size, x->coord,
		 x->lost ? ", link lost" : x->self ? ", this daemon" : "");
	*ret_hosts = x->hosts;
}

void tpd_groupx_free(struct tpd_groupx *x)
{
	if (!x)
		return;
	free(x->rank);
	free(x->join_id);
	free(x);
}

/* ---- peer link events ----------------------------------------------------------------------- */

static void groupx_on_msg(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	struct tpd_groups *gs = tpd_daemon_groups(d);

	if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOIN ||
	    (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_GONE && m->group_gone->join_id))
		coord_msg(gs, pr, m);
	else
		member_msg(gs, pr, m);
}

/* The first join sent or to be sent over @pr, or NULL. */
static struct xjoin *xjoin_on_link(struct tpd_groups *gs, const struct tpd_peer *pr)
{
	struct xjoin *xj;

	tpu_list_for_each(xj, &gs->xjoins, node)
		if (xj->pr == pr)
			return xj;
	return NULL;
}

/* The first join waiting for @pr to come up, or NULL. */
static struct xjoin *xjoin_waiting_on(struct tpd_groups *gs, const struct tpd_peer *pr)
{
	struct xjoin *xj;

	tpu_list_for_each(xj, &gs->xjoins, node)
		if (xj->pr == pr && !xj->sent)
			return xj;
	return NULL;
}

static void groupx_on_link_up(struct tpd_daemon *d, struct tpd_peer *pr)
{
	struct tpd_groups *gs = tpd_daemon_groups(d);
	struct xjoin *xj;

	/* One at a time, from the start: a send may answer (and free) other joins at once. */
	while ((xj = xjoin_waiting_on(gs, pr)))
		xjoin_send(xj);
}

static void groupx_on_link_failed(struct tpd_daemon *d, struct tpd_peer *pr, int err,
				  const char *why)
{
	struct tpd_groups *gs = tpd_daemon_groups(d);
	struct tpd_group *grp, *gtmp;
	struct xjoin *xj;
	char text[256];

	while ((xj = xjoin_on_link(gs, pr))) { /* from the start each time, as in link_up */
		if (err == -ELOOP && !xj->sent) { /* the address is this daemon's own */
			xj->pr = NULL;
			xjoin_send(xj);
			continue;
		}
		xj->pr = NULL;
		xjoin_refuse(xj, err, "group '%s': the peer link to coordinator %s failed: %s",
			     xj->name, xj->coord, why && *why ? why : strerror(-err));
	}
	tpu_list_for_each_safe(grp, gtmp, &gs->list, node) {
		if (!grp->x || grp->x->lost || grp->x->self || grp->x->pr != pr)
			continue;
		grp->x->lost = true;
		grp->x->pr = NULL;
		snprintf(text, sizeof(text), "the peer link to coordinator %.60s failed: %.80s",
			 grp->x->coord, why && *why ? why : strerror(-err));
		if (grp->formed) {
			tpd_group_fail(grp, grp->x->rank[0], 0, TPU_GRPARENA_HOST, text);
			continue;
		}
		for (uint32_t i = 0; i < grp->size; i++)
			if (grp->m[i].joined)
				tpd_group_refuse(grp->m[i].s, grp->m[i].req_id, err, text);
		tpd_group_drop(grp);
	}
	coord_link_failed(gs, pr, why && *why ? why : strerror(-err));
}

static const struct tpd_peer_group_ops groupx_peer_ops = {
	.msg = groupx_on_msg,
	.link_up = groupx_on_link_up,
	.link_failed = groupx_on_link_failed,
};

void tpd_groupx_init(struct tpd_groups *gs)
{
	tpu_list_init(&gs->xjoins);
	tpu_list_init(&gs->cgroups);
	tpd_peer_group_set_ops(&groupx_peer_ops);
}

void tpd_groupx_done(struct tpd_groups *gs)
{
	struct xjoin *xj, *tmp;
	struct cgroup *cg, *ctmp;

	tpu_list_for_each_safe(xj, tmp, &gs->xjoins, node)
		xjoin_free(xj);
	tpu_list_for_each_safe(cg, ctmp, &gs->cgroups, node)
		cgroup_free(cg);
}
