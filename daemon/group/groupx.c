/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Cross-host group joins through a coordinator daemon (issue 24; docs/collectives.md): the
 * member's side (the coordinator's is groupcoord.c) and the peer link events of both. A
 * client's GroupJoin with bootstrap COORDINATOR ("tpip://HOST[:PORT]") is forwarded as
 * PeerGroupJoin over the peer link to that daemon (or to this daemon's coordinator side when
 * the address is its own), with the client's SO_PEERCRED uid and pid. The answer
 * (PeerGroupJoined: global rank, size, host index, hosts, local rank and size, every member)
 * places the client in this host's part of the group, a struct tpd_group of local-size members
 * with its own arena (group.c), formed once every local member has its answer. A member gone
 * here is told to the coordinator; one gone elsewhere, or a lost link, fails the arena.
 *
 * Trust: a remote daemon is its own kind of principal, as for listeners. Every member states
 * the group's remote access (GroupJoin.remote: none, any authenticated peer, or named peer
 * identities); this side sends a join to a coordinator on another host only over a link whose
 * authenticated identity that setting allows, of a daemon that enforces the setting itself
 * (peer minor TPW_PEER_MINOR_GROUP_REMOTE), and takes answers only over that link. The uid in
 * a PeerGroupJoin is the forwarding daemon's claim of its client's SO_PEERCRED uid: groups are
 * keyed by it, but what admits a member from another host is its link's identity.
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
	struct tpd_groupx_remote remote;
	struct event *ev_timeout;
};

/* Member side: what the coordinator says of a member of the group (tpipctl). */
struct xmember {
	uint32_t pid;
	char *host; /* the host name its daemon states */
	char *peer; /* its daemon's identity: as this daemon verified it, else the coordinator's */
};

/* Member side: what a host's part of a cross-host group adds to its struct tpd_group. */
struct tpd_groupx {
	struct tpd_peer *pr; /* the link to the coordinator; NULL: this daemon, or @lost */
	bool self;
	bool lost;
	uint64_t cid; /* the coordinator's group id */
	char coord[COORD_MAX];
	uint32_t size, hosts, host_index;
	char hosts_text[512];
	uint32_t *rank;	   /* per local member: its rank in the group */
	uint64_t *join_id; /* per local member: its join's id here */
	/* what the members need to move data across hosts (GroupJoined): */
	uint32_t *member_hosts; /* [size]: each rank's host index */
	char **host_addrs;	/* [hosts]: "HOST:PORT" of each host's daemon, "" for this one */
	uint8_t token[TPW_GROUP_TOKEN_BYTES];
	bool has_token;
	struct tpd_groupx_remote remote; /* the group's remote access, as its members stated it */
	struct xmember *members;	/* [size], each rank's as the coordinator says */
};

/* ---- a group's remote access ---------------------------------------------------------------- */

int tpd_groupx_remote_set(struct tpd_groupx_remote *r, Tpw__V1__RemoteAccess mode,
			  char *const *peers, size_t n)
{
	r->mode = mode == TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED ?
			  TPW__V1__REMOTE_ACCESS__REMOTE_NONE : mode;
	r->n = 0;
	r->peers = NULL;
	if (tpu_strv_dup(peers, n, TPW_REMOTE_PEERS_MAX, TPW_NAME_MAX, &r->peers) < 0)
		return -ENOMEM;
	r->n = n;
	return 0;
}

void tpd_groupx_remote_done(struct tpd_groupx_remote *r)
{
	tpu_strv_free(r->peers, r->n);
	memset(r, 0, sizeof(*r));
}

/* Whether every identity of @a is one of @b's. */
static bool remote_subset(const struct tpd_groupx_remote *a, const struct tpd_groupx_remote *b)
{
	for (size_t i = 0; i < a->n; i++) {
		bool in = false;

		for (size_t k = 0; k < b->n && !in; k++)
			in = strcmp(a->peers[i], b->peers[k]) == 0;
		if (!in)
			return false;
	}
	return true;
}

bool tpd_groupx_remote_same(const struct tpd_groupx_remote *a,
			    const struct tpd_groupx_remote *b)
{
	return a->mode == b->mode && remote_subset(a, b) && remote_subset(b, a);
}

bool tpd_groupx_remote_allows(const struct tpd_groupx_remote *r, const struct tpd_peer *pr)
{
	if (!tpd_peer_identity(pr))
		return false; /* unauthenticated (--peer-insecure): never */
	if (r->mode == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER)
		return true;
	for (size_t i = 0; r->mode == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS && i < r->n; i++)
		if (tpd_peer_identity_matches(r->peers[i], pr))
			return true;
	return false;
}

char *tpd_groupx_remote_text(const struct tpd_groupx_remote *r, char *buf, size_t len)
{
	size_t k;

	if (r->mode == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER) {
		snprintf(buf, len, "any peer");
		return buf;
	}
	if (r->mode != TPW__V1__REMOTE_ACCESS__REMOTE_PEERS || !r->n) {
		snprintf(buf, len, "none");
		return buf;
	}
	k = (size_t)snprintf(buf, len, "peers ");
	for (size_t i = 0; i < r->n && k < len; i++)
		k += (size_t)snprintf(buf + k, len - k, "%s%s", i ? ", " : "", r->peers[i]);
	return buf;
}

/* ---- sending to the coordinator ------------------------------------------------------------ */

static void to_coord(struct tpd_groups *gs, struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	if (pr)
		tpd_peer_send(pr, m, NULL, 0);
	else
		tpd_group_coord_msg(gs, NULL, m);
}

/* The member of join @join_id left or died (@why). */
static void send_gone(struct tpd_groups *gs, struct tpd_peer *pr, uint64_t join_id,
		      uint32_t rank, uint32_t pid, uint32_t why, uint64_t calls)
{
	Tpw__V1__PeerGroupGone g = TPW__V1__PEER_GROUP_GONE__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	g.join_id = join_id;
	g.rank = rank;
	g.pid = pid;
	g.why = why;
	g.calls = calls;
	g.message = (char *)"";
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_GONE;
	m.group_gone = &g;
	to_coord(gs, pr, &m);
}

/* ---- member side ---------------------------------------------------------------------------- */

static void xjoin_free(struct xjoin *xj)
{
	if (xj->ev_timeout)
		event_free(xj->ev_timeout);
	tpu_list_remove(&xj->node);
	tpd_groupx_remote_done(&xj->remote);
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

/*
 * Whether @xj may go to its coordinator on another host (over the link @xj->pr, up): the
 * link's authenticated identity must be one the group's remote access allows, and the far
 * daemon must enforce that setting for the other members (peer minor). Refuses (and frees)
 * @xj otherwise. Return: true if it may be sent.
 */
static bool xjoin_coord_allowed(struct xjoin *xj)
{
	const char *id = tpd_peer_identity(xj->pr);
	char rt[256];

	if (!tpd_groupx_remote_allows(&xj->remote, xj->pr)) {
		xjoin_refuse(xj, -EACCES, "group '%s': coordinator %s (%s) is on another host and "
			     "the group's remote access (%s) does not allow it: state which peer "
			     "daemons may take part (tp_group_options.remote, TP_GROUP_REMOTE)",
			     xj->name, xj->coord, id ? id : "not authenticated",
			     tpd_groupx_remote_text(&xj->remote, rt, sizeof(rt)));
		return false;
	}
	if (!tpd_peer_group_remote_ok(xj->pr)) {
		xjoin_refuse(xj, -EACCES, "group '%s': coordinator %s runs an older tpipd, which "
			     "does not check which peer daemons may take part in a group", xj->name,
			     xj->coord);
		return false;
	}
	return true;
}

static void xjoin_send(struct xjoin *xj)
{
	Tpw__V1__PeerGroupJoin j = TPW__V1__PEER_GROUP_JOIN__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (xj->pr && !xjoin_coord_allowed(xj))
		return;
	j.join_id = xj->join_id;
	j.name = xj->name;
	j.rank = xj->rank;
	j.size = xj->size;
	j.uid = (uint32_t)xj->uid;
	j.pid = (uint32_t)xj->pid;
	j.timeout_ms = xj->timeout_ms;
	j.remote = xj->remote.mode;
	j.n_remote_peers = xj->remote.n;
	j.remote_peers = xj->remote.peers;
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
		send_gone(xj->gs, xj->pr, xj->join_id, 0, (uint32_t)xj->pid, TPU_GRPARENA_DIED, 0);
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

/*
 * The groups of @uid here other than the cross-host group @name: its groups joining or formed
 * on this host, and the names of its joins still waiting for a coordinator's answer, once each
 * (they hold a group at the coordinator, this daemon's own included). What groups-per-uid
 * bounds, so that joins through a coordinator cannot pile up without limit.
 */
static uint32_t uid_groups(struct tpd_groups *gs, uid_t uid, const char *name)
{
	const struct tpd_group *grp;
	const struct xjoin *xj, *o;
	uint32_t n = 0;

	tpu_list_for_each(grp, &gs->list, node)
		n += grp->uid == uid && !(grp->x && strcmp(grp->name, name) == 0);
	tpu_list_for_each(xj, &gs->xjoins, node) {
		bool counted = xj->uid != uid || strcmp(xj->name, name) == 0;

		tpu_list_for_each(o, &gs->xjoins, node) {
			if (o == xj || counted)
				break;
			counted = o->uid == uid && strcmp(o->name, xj->name) == 0;
		}
		n += !counted;
	}
	return n;
}

/* The joins of @uid for the group @name waiting for a coordinator's answer. */
static uint32_t name_joins(const struct tpd_groups *gs, uid_t uid, const char *name)
{
	const struct xjoin *xj;
	uint32_t n = 0;

	tpu_list_for_each(xj, &gs->xjoins, node)
		n += xj->uid == uid && strcmp(xj->name, name) == 0;
	return n;
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
	/* No more members of one group than its size can be on their way from this host (nor
	 * more than group-members-max, which the coordinator refuses anyway): a coordinator that
	 * never answers would otherwise hold any number of joins of one name here. */
	if (j->size > cfg->group_members_max) {
		snprintf(why, sizeof(why), "group '%s' of %u members: above the limit of %u "
			 "(group-members-max)", j->name, j->size, cfg->group_members_max);
		tpd_group_refuse(s, j->req_id, -ENOBUFS, why);
		return;
	}
	if (name_joins(gs, tpd_session_uid(s), j->name) >= j->size) {
		snprintf(why, sizeof(why), "group '%s': %u joins of uid %u are waiting for "
			 "coordinator %s already, the group's size", j->name, j->size,
			 (unsigned)tpd_session_uid(s), c);
		tpd_group_refuse(s, j->req_id, -EADDRINUSE, why);
		return;
	}
	if (uid_groups(gs, tpd_session_uid(s), j->name) >= cfg->groups_per_uid) {
		snprintf(why, sizeof(why), "group '%s': uid %u has %u groups joining or formed, "
			 "the limit (groups-per-uid)", j->name, (unsigned)tpd_session_uid(s),
			 cfg->groups_per_uid);
		tpd_group_refuse(s, j->req_id, -ENOBUFS, why);
		return;
	}
	xj = calloc(1, sizeof(*xj));
	if (!xj || tpd_groupx_remote_set(&xj->remote, j->remote, j->remote_peers,
					 j->n_remote_peers) < 0 ||
	    !(xj->ev_timeout = evtimer_new(tpd_daemon_base(gs->d), xjoin_on_timeout, xj))) {
		if (xj)
			tpd_groupx_remote_done(&xj->remote);
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
	tpd_timer_add(xj->ev_timeout, &tv);
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

/*
 * Copies what the members need across hosts from the coordinator's answer: each rank's host,
 * each host's daemon address (the coordinator's own host, "" in the answer, is the address this
 * daemon reached the coordinator at; this host's is "": nobody here dials it) and the token.
 * A coordinator that sent no addresses leaves them unset (collectives then say so).
 */
static int hosts_copy(struct tpd_groupx *x, const struct xjoin *xj,
		      const Tpw__V1__PeerGroupJoined *a)
{
	x->size = a->size;
	x->hosts = a->hosts; /* tpd_groupx_free() frees that many addresses */
	if (!(x->member_hosts = calloc(a->size, sizeof(*x->member_hosts))))
		return -ENOMEM;
	for (size_t i = 0; i < a->n_members; i++)
		x->member_hosts[i] = a->members[i]->host_index;
	if (a->n_host_addrs != a->hosts || a->token.len != sizeof(x->token))
		return 0;
	if (!(x->host_addrs = calloc(a->hosts, sizeof(*x->host_addrs))))
		return -ENOMEM;
	for (uint32_t h = 0; h < a->hosts; h++) {
		const char *v = a->host_addrs[h];

		if (h == a->host_index)
			v = "";
		else if (!*v && xj->pr)
			v = xj->coord;
		if (!(x->host_addrs[h] = strdup(v)))
			return -ENOMEM;
	}
	memcpy(x->token, a->token.data, sizeof(x->token));
	x->has_token = true;
	return 0;
}

/*
 * Keeps what the coordinator says of each member for tpipctl: pid, host and the identity of
 * its daemon: "" from the coordinator names its own members, whose daemon is the coordinator
 * (this daemon verified its link's identity itself); members of this host have none.
 */
static int members_copy(struct tpd_groupx *x, const struct xjoin *xj,
			const Tpw__V1__PeerGroupJoined *a)
{
	const char *cid = xj->pr ? tpd_peer_identity(xj->pr) : NULL;

	if (!(x->members = calloc(a->n_members, sizeof(*x->members))))
		return -ENOMEM;
	for (size_t i = 0; i < a->n_members; i++) {
		const Tpw__V1__PeerGroupMember *pm = a->members[i];
		const char *peer = pm->peer && *pm->peer ? pm->peer : cid ? cid : "";

		x->members[i].pid = pm->pid;
		if (pm->host_index == a->host_index)
			peer = "";
		if (!(x->members[i].host = strdup(pm->host ? pm->host : "")) ||
		    !(x->members[i].peer = strdup(peer)))
			return -ENOMEM;
	}
	return 0;
}

/* The first member of host @h in @a (validated: every host has one). */
static const Tpw__V1__PeerGroupMember *host_first(const Tpw__V1__PeerGroupJoined *a, uint32_t h)
{
	for (size_t i = 0; i < a->n_members; i++)
		if (a->members[i]->host_index == h)
			return a->members[i];
	return a->members[0];
}

/*
 * The hosts of @a for the plan line: "gn01 (2), gn02 (2)", each host's name and its members.
 * Hosts whose daemons state the same name (two containers, namespaces or VMs named alike) are
 * told apart by where their daemon is reached: "vm [10.0.0.1:7420] (1), vm [here] (1)", or by
 * their number in the group where the coordinator gave no addresses ("vm [host 1] (1)").
 */
static void hosts_text(struct tpd_groupx *x, const Tpw__V1__PeerGroupJoined *a)
{
	size_t len = 0, cap = sizeof(x->hosts_text);

	x->hosts_text[0] = '\0';
	for (uint32_t h = 0; h < a->hosts && len + 120 < cap; h++) {
		const char *name = host_first(a, h)->host, *addr = NULL;
		char tag[96] = "";
		uint32_t n = 0;
		bool same = false;

		for (size_t i = 0; i < a->n_members; i++)
			n += a->members[i]->host_index == h;
		for (uint32_t k = 0; k < a->hosts && !same; k++)
			same = k != h && strcmp(host_first(a, k)->host, name) == 0;
		if (same && x->host_addrs)
			addr = h == a->host_index ? "here" : x->host_addrs[h];
		if (same && addr && *addr)
			snprintf(tag, sizeof(tag), " [%.80s]", addr);
		else if (same)
			snprintf(tag, sizeof(tag), " [host %u%s]", h, h == a->host_index ? ", here" : "");
		len += (size_t)snprintf(x->hosts_text + len, cap - len, "%s%.40s%s (%u)",
					h ? ", " : "", name, tag, n);
	}
}

static int xgroup_new(struct xjoin *xj, const Tpw__V1__PeerGroupJoined *a,
		      struct tpd_group **ret, char *why, size_t wl)
{
	struct tpd_groupx *x = calloc(1, sizeof(*x));
	struct tpd_group *grp;
	int r;

	if (!x || !(x->rank = calloc(a->local_size, sizeof(*x->rank))) ||
	    !(x->join_id = calloc(a->local_size, sizeof(*x->join_id))) ||
	    hosts_copy(x, xj, a) < 0 || members_copy(x, xj, a) < 0 ||
	    tpd_groupx_remote_set(&x->remote, xj->remote.mode, xj->remote.peers,
				  xj->remote.n) < 0) {
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
	hosts_text(x, a);
	grp->x = x;
	*ret = grp;
	return 0;
}

/*
 * Does the coordinator's answer @a fit join @xj and the group @grp (NULL: none yet) it names?
 * The size and rank the member asked for; a group already begun here only of the same uid and
 * name (the coordinator's group id alone must never put a member into another uid's arena),
 * with the same size, hosts and every rank's host as the answers before (the validator checked
 * that each answer adds up on its own). Return: 0 or -EPROTO with @why.
 */
static int joined_fits(const struct xjoin *xj, const struct tpd_group *grp,
		       const Tpw__V1__PeerGroupJoined *a, char *why, size_t wl)
{
	const struct tpd_groupx *x = grp ? grp->x : NULL;

	if (a->size != xj->size || (xj->rank >= 0 && a->rank != (uint32_t)xj->rank))
		return tpu_why(-EPROTO, why, wl, "the coordinator answers rank %u of %u members, "
			       "the join asked for %d of %u", a->rank, a->size, (int)xj->rank,
			       xj->size);
	if (!grp)
		return 0;
	if (grp->uid != xj->uid || strcmp(grp->name, xj->name) != 0)
		return tpu_why(-EPROTO, why, wl, "the coordinator names its group %llu, which "
			       "is another group here", (unsigned long long)a->group_id);
	if (!tpd_groupx_remote_same(&x->remote, &xj->remote))
		return tpu_why(-EINVAL, why, wl, "the group's members here state another remote "
			       "access");
	if (grp->formed || grp->size != a->local_size || x->size != a->size ||
	    x->hosts != a->hosts || x->host_index != a->host_index)
		return tpu_why(-EPROTO, why, wl, "the coordinator's answer does not fit the "
			       "group's members here");
	for (size_t i = 0; i < a->n_members; i++)
		if (x->member_hosts[i] != a->members[i]->host_index)
			return tpu_why(-EPROTO, why, wl, "the coordinator puts rank %zu on host %u, "
				       "before on host %u", i, a->members[i]->host_index,
				       x->member_hosts[i]);
	return 0;
}

static void member_on_joined(struct tpd_groups *gs, struct tpd_peer *pr,
			     const Tpw__V1__PeerGroupJoined *a)
{
	struct tpd_group *grp;
	struct xjoin *xj, *it;
	struct member *mb;
	struct timeval tv;
	char why[256];
	int r;

	xj = NULL;
	tpu_list_for_each(it, &gs->xjoins, node)
		if (it->join_id == a->join_id && it->pr == pr)
			xj = it;
	if (!xj)
		return; /* its session ended: the coordinator was told */
	if (pr && !tpd_groupx_remote_allows(&xj->remote, pr))
		return; /* never sent over such a link (xjoin_coord_allowed()) */
	if (a->status != TPW__V1__STATUS__STATUS_OK) {
		xjoin_refuse(xj, tpw_status_to_errno(a->status), "%s", a->message);
		return;
	}
	grp = xgroup_find(gs, pr, a->group_id);
	r = joined_fits(xj, grp, a, why, sizeof(why));
	if (r < 0)
		goto refuse;
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
	tv.tv_sec = xj->timeout_ms / 1000;
	tv.tv_usec = (long)(xj->timeout_ms % 1000) * 1000;
	xjoin_free(xj);
	if (grp->joined == grp->size)
		tpd_group_form(grp);
	else /* the others' answers are due now: a coordinator that holds them back times out */
		tpd_timer_add(mb->ev_timeout, &tv);
	return;
refuse:
	send_gone(gs, pr, xj->join_id, 0, (uint32_t)xj->pid, TPU_GRPARENA_DIED, 0);
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
		tpd_group_fail(grp, g->rank, g->pid, g->why, g->calls,
			       g->message ? g->message : "");
		return;
	}
	for (uint32_t i = 0; i < grp->size; i++) /* not every answer is here yet */
		if (grp->m[i].joined)
			tpd_group_refuse(grp->m[i].s, grp->m[i].req_id, -ECONNRESET,
					 g->message ? g->message : "a member is gone");
	tpd_group_drop(grp);
}

void tpd_groupx_member_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
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
			send_gone(gs, xj->pr, xj->join_id, 0, (uint32_t)xj->pid, TPU_GRPARENA_DIED, 0);
		xjoin_free(xj);
	}
}

void tpd_groupx_member_gone(struct tpd_group *grp, uint32_t idx, uint32_t why, uint64_t calls)
{
	struct tpd_groupx *x = grp->x;

	/* Not formed here yet with this daemon as coordinator: only inside its answer, which
	 * tells the others itself (and telling it now would free @grp under the caller). */
	if (x->lost || (x->self && !grp->formed))
		return;
	send_gone(grp->gs, x->pr, x->join_id[idx], x->rank[idx], (uint32_t)grp->m[idx].pid, why,
		  calls);
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
	j->n_member_hosts = x->size;
	j->member_hosts = x->member_hosts;
	if (x->has_token) {
		j->n_host_addrs = x->hosts;
		j->host_addrs = x->host_addrs;
		j->token.data = (uint8_t *)x->token;
		j->token.len = sizeof(x->token);
	}
}

void tpd_groupx_describe(const struct tpd_group *grp, char *buf, size_t len, uint32_t *ret_hosts)
{
	const struct tpd_groupx *x = grp->x;

	snprintf(buf, len, "%u members on %u hosts: %s; host %u here (%u members, ranks from "
		 "coordinator %s%s); across hosts: %s", x->size, x->hosts, x->hosts_text,
		 x->host_index, grp->size, x->coord,
		 x->lost ? ", link lost" : x->self ? ", this daemon" : "",
		 x->has_token ? "the hosts' leaders over pipes, recursive doubling below 256 KiB, "
				"a ring from there, collectives from 8 MiB pipelined in 4 MiB "
				"segments where the members ask (TP_GROUP_PIPELINE)" :
				"no host addresses from the coordinator "
				"(an older tpipd): collectives refused");
	*ret_hosts = x->hosts;
}

/* One remote member of @grp for tpipctl: rank @rank, on another host. */
static int ctl_remote_member(const struct tpd_group *grp, uint32_t rank,
			     Tpw__V1__CtlGroupMember **ret)
{
	const struct xmember *xm = &grp->x->members[rank];
	Tpw__V1__CtlGroupMember *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	tpw__v1__ctl_group_member__init(c);
	c->rank = rank;
	c->pid = xm->pid;
	c->state = (char *)(grp->formed ? "joined" : "joining");
	c->remote = true;
	c->peer = xm->peer;
	c->host = xm->host;
	c->host_index = grp->x->member_hosts[rank];
	c->host_addr = grp->x->host_addrs ? grp->x->host_addrs[c->host_index] : (char *)"";
	c->claimed_uid = (uint32_t)grp->uid; /* the coordinator keyed it with this uid */
	*ret = c;
	return 0;
}

int tpd_groupx_ctl(const struct tpd_group *grp, Tpw__V1__CtlGroup *c)
{
	const struct tpd_groupx *x = grp->x;
	Tpw__V1__CtlGroupMember **v;
	size_t n = c->n_members;

	c->remote = x->remote.mode;
	c->n_remote_peers = x->remote.n;
	c->remote_peers = x->remote.peers;
	if (!x->members || x->size <= grp->size)
		return 0;
	v = realloc(c->members, (n + x->size - grp->size) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	c->members = v;
	for (uint32_t r = 0; r < x->size; r++) {
		if (x->member_hosts[r] == x->host_index)
			continue;
		if (ctl_remote_member(grp, r, &c->members[c->n_members]) < 0)
			return -ENOMEM;
		c->n_members++;
	}
	return 0;
}

void tpd_groupx_free(struct tpd_groupx *x)
{
	if (!x)
		return;
	free(x->rank);
	free(x->join_id);
	free(x->member_hosts);
	for (uint32_t i = 0; x->members && i < x->size; i++) {
		free(x->members[i].host);
		free(x->members[i].peer);
	}
	free(x->members);
	tpd_groupx_remote_done(&x->remote);
	for (uint32_t h = 0; x->host_addrs && h < x->hosts; h++)
		free(x->host_addrs[h]);
	free(x->host_addrs);
	free(x);
}

/* ---- peer link events ----------------------------------------------------------------------- */

static void groupx_on_msg(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	struct tpd_groups *gs = tpd_daemon_groups(d);

	if (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOIN ||
	    (m->body_case == TPW__V1__PEER_MSG__BODY_GROUP_GONE && m->group_gone->join_id))
		tpd_group_coord_msg(gs, pr, m);
	else
		tpd_groupx_member_msg(gs, pr, m);
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
			tpd_group_fail(grp, grp->x->rank[0], 0, TPU_GRPARENA_HOST, 0, text);
			continue;
		}
		for (uint32_t i = 0; i < grp->size; i++)
			if (grp->m[i].joined)
				tpd_group_refuse(grp->m[i].s, grp->m[i].req_id, err, text);
		tpd_group_drop(grp);
	}
	tpd_group_coord_link_failed(gs, pr, why && *why ? why : strerror(-err));
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

	tpu_list_for_each_safe(xj, tmp, &gs->xjoins, node)
		xjoin_free(xj);
	tpd_group_coord_done(gs);
}
