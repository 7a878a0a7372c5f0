/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to daemon/group/ (group.c: one host; groupx.c: joins through a coordinator daemon).
 * Holds the registry's structures and what one file calls in the other; the rest of the
 * daemon uses group.h only.
 */
#ifndef TPD_GROUP_INT_H
#define TPD_GROUP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "group.h"
#include "quota.h"
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_session;
struct tpd_groupx;
struct tpd_peer;

/* Which peer daemons may take part in a cross-host group (GroupJoin.remote, remote_peers). */
struct tpd_groupx_remote {
	Tpw__V1__RemoteAccess mode; /* UNSPECIFIED is kept as NONE */
	size_t n;		    /* PEERS: 1..TPW_REMOTE_PEERS_MAX identities */
	char **peers;
};

struct member {
	struct tpd_group *grp;
	struct tpd_session *s; /* NULL: free slot, or gone after forming */
	uint64_t req_id;
	pid_t pid;
	bool joined;
	bool ready;
	bool gone; /* formed, then left or died */
	bool unsent; /* its GroupJoined or the arena's fd could not be sent */
	uint32_t gone_why; /* TPU_GRPARENA_DIED or _LEFT */
	struct event *ev_timeout;
};

struct tpd_group {
	struct tpu_list node;
	struct tpd_groups *gs;
	uint64_t id;
	uid_t uid;
	gid_t gid;
	char *name;
	uint32_t size;
	uint32_t joined;
	uint32_t ready;
	uint32_t live; /* formed: members not gone */
	bool formed;
	int fd; /* the arena's sealed memfd, owned while the members are answered; else -EBADF */
	struct tpu_grparena_hdr *arena;
	uint64_t bytes; /* arena bytes (reserved from the first join) */
	uint64_t chunk;
	uint64_t created_ns;
	char failure[256]; /* the first member gone, for tpipctl */
	struct tpd_groupx *x; /* a host's members of a cross-host group (groupx.c); NULL: local */
	struct member m[];
};

struct tpd_groups {
	struct tpd_daemon *d;
	struct tpu_list list;
	uint64_t next_id;
	uint64_t formed, failed, refused; /* since start (metrics) */
	uint64_t gone_activity[TPD_GROUP_ACTIVITY_N]; /* of groups freed since start (metrics) */
	/* groupx.c: joins sent to a coordinator, and the groups this daemon coordinates */
	struct tpu_list xjoins;
	struct tpu_list cgroups;
	uint64_t next_join_id;
	uint64_t next_cgroup_id;
	/* Lines a local user's joins provoke at will (refusals, groups formed, failed, timed
	 * out), each uid within a budget of its own: tpd_group_log_ok() */
	struct tpd_ratelog_keys log;
};

/* What tpd_group_log_ok() allows: lines of one uid in each window, of all uids together. */
#define TPD_GROUP_LOG_WINDOW_MS 10000
#define TPD_GROUP_LOG_BURST 20
#define TPD_GROUP_LOG_ALL_BURST 100

/*
 * tpd_group_log_ok() - may a line about a group of local user @uid (a join refused, a group
 * formed, failed or timed out) be logged now? A user joins and leaves groups as fast as it
 * likes, each a line or two: each uid has its own budget (TPD_GROUP_LOG_BURST lines in each
 * TPD_GROUP_LOG_WINDOW_MS), all uids together a larger one, so that one user's loop neither
 * fills the log nor hides another user's lines. Lines about what a peer daemon's members did
 * take tpd_peer_log_ok() instead.
 * @ret_suppressed: @uid's lines refused since its last logged one (written when true).
 * Return: true to log.
 */
bool tpd_group_log_ok(struct tpd_groups *gs, uid_t uid, unsigned *ret_suppressed);

/* ---- group.c ------------------------------------------------------------------------------ */

/*
 * tpd_group_make() - a new group @name of @size members of @uid/@gid on this host, within the
 * uid's limits, added to @gs; no member yet, no join timers armed.
 * @ret: returns the group, owned by @gs's list (freed when its last member goes).
 * Return: 0 or -errno (-ENOBUFS: a limit, -ENOMEM) with @why.
 */
int tpd_group_make(struct tpd_groups *gs, uid_t uid, gid_t gid, const char *name, uint32_t size,
		   struct tpd_group **ret, char *why, size_t wl);

/* tpd_group_form() - every member of @grp joined: make the arena and answer every member
 * (GroupJoined); frees @grp when the arena cannot be made. */
void tpd_group_form(struct tpd_group *grp);

/* tpd_group_drop() - free @grp, which no session uses any more (a join that failed). */
void tpd_group_drop(struct tpd_group *grp);

/*
 * tpd_group_fail() - a member on another host is gone (or the link to it): fail @grp's arena
 * naming rank @rank and @pid (@why: TPU_GRPARENA_*), and record @text for tpipctl. Borrows all.
 */
void tpd_group_fail(struct tpd_group *grp, uint32_t rank, uint32_t pid, uint32_t why,
		    uint64_t calls, const char *text);

/*
 * tpd_group_refuse() - answer @s's join @req_id with @err and @why (logged at info), counted
 * as refused. Borrows @s and @why.
 */
void tpd_group_refuse(struct tpd_session *s, uint64_t req_id, int err, const char *why);

/* ---- groupx.c ----------------------------------------------------------------------------- */

/*
 * tpd_groupx_remote_set() - @r (the caller's, zeroed or done) becomes a copy of @mode and
 * @peers (@n of them; validated), UNSPECIFIED kept as NONE. Borrows @peers.
 * Return: 0 or -ENOMEM (@r then holds nothing).
 */
int tpd_groupx_remote_set(struct tpd_groupx_remote *r, Tpw__V1__RemoteAccess mode,
			  char *const *peers, size_t n);
/* Frees what @r holds and zeroes it; accepts a zeroed one. */
void tpd_groupx_remote_done(struct tpd_groupx_remote *r);
/* Whether @a and @b state the same setting (the peers as sets). Borrows both. */
bool tpd_groupx_remote_same(const struct tpd_groupx_remote *a,
			    const struct tpd_groupx_remote *b);
/* Whether @r lets the far daemon of link @pr take part: NONE none; ANY_PEER any that
 * authenticated; PEERS one whose authenticated identity an entry names
 * (tpd_peer_identity_matches()). An unauthenticated link never. Borrows both. */
bool tpd_groupx_remote_allows(const struct tpd_groupx_remote *r, const struct tpd_peer *pr);
/* @r as text for messages and tpipctl: "none", "any peer" or "peers psk, cert:gn02". */
char *tpd_groupx_remote_text(const struct tpd_groupx_remote *r, char *buf, size_t len);

/* Sets up and tears down groupx.c's part of @gs (its lists; the peer group ops). */
void tpd_groupx_init(struct tpd_groups *gs);
void tpd_groupx_done(struct tpd_groups *gs);

/* A client's GroupJoin with bootstrap COORDINATOR: forward it (or refuse it). Borrows both. */
void tpd_groupx_join(struct tpd_session *s, const Tpw__V1__GroupJoin *j);

/* @s ended: forget its joins still waiting for the coordinator (telling the coordinator). */
void tpd_groupx_session_end(struct tpd_groups *gs, struct tpd_session *s);

/* Member @idx of cross-host @grp (its local index) is gone (@why), or, before @grp formed here,
 * gave up or ended after the coordinator's answer: tell the coordinator. */
void tpd_groupx_member_gone(struct tpd_group *grp, uint32_t idx, uint32_t why, uint64_t calls);

/* The rank in the whole group of local member @idx of cross-host @grp. */
uint32_t tpd_groupx_rank(const struct tpd_group *grp, uint32_t idx);

/* What GroupJoined says of local member @idx of cross-host @grp. */
void tpd_groupx_joined_fill(const struct tpd_group *grp, uint32_t idx, Tpw__V1__GroupJoined *j);

/* The plan line and hosts of cross-host @grp for tpipctl. Writes at most @len bytes. */
void tpd_groupx_describe(const struct tpd_group *grp, char *buf, size_t len, uint32_t *ret_hosts);

/*
 * tpd_groupx_ctl() - adds to @c (tpipctl's view of cross-host @grp, its local members in
 * place) the group's remote access and its members on other hosts as remote principals: the
 * identity of their daemon, its host and the uid it claims, never a local uid. @c's new
 * strings are borrowed from @grp (valid while it is); @c->members is reallocated.
 * Return: 0 or -ENOMEM (@c stays consistent for ctl_group_free()).
 */
int tpd_groupx_ctl(const struct tpd_group *grp, Tpw__V1__CtlGroup *c);

/* Frees @grp's cross-host part (accepts NULL). */
void tpd_groupx_free(struct tpd_groupx *x);

/* A PeerGroupJoined or coordinator's PeerGroupGone for this daemon's members (@pr: the link it
 * came over; NULL: from this daemon's own coordinator side). Borrows all. */
void tpd_groupx_member_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);

/* ---- groupcoord.c ------------------------------------------------------------------------- */

/* A PeerGroupJoin or member's PeerGroupGone for the groups this daemon coordinates (@pr: the
 * link it came over; NULL: from this daemon's own member side). Borrows all. */
void tpd_group_coord_msg(struct tpd_groups *gs, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);

/* The link @pr failed (@why): its members leave the groups this daemon coordinates, and the
 * other members' daemons are told. Borrows all; @pr is not used again. */
void tpd_group_coord_link_failed(struct tpd_groups *gs, struct tpd_peer *pr, const char *why);

/* The groups this daemon coordinates (joining or formed). */
size_t tpd_group_coord_count(const struct tpd_groups *gs);

/*
 * tpd_group_coord_ctl() - tpipctl's view of every group this daemon coordinates into @v (room
 * for tpd_group_coord_count() entries): coordinated set, each member that joined, those of
 * other hosts as remote principals (their link's identity, their daemon's host, the uid it
 * claims; uid_claimed where no member is of this host: its uid is then only a claim). For
 * admins only. Strings are borrowed from the groups; free each entry as tpd_group_ctl_free()
 * does.
 * Return: 0 with @n entries, or -ENOMEM (none left in @v).
 */
int tpd_group_coord_ctl(struct tpd_groups *gs, Tpw__V1__CtlGroup **v, size_t *n);

/* Frees every group this daemon coordinates (daemon shutdown). */
void tpd_group_coord_done(struct tpd_groups *gs);

#endif
