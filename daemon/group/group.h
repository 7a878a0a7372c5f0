/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_group: the daemon's registry of collective groups (daemon/group/). A group is a name
 * within one uid (the joining session's SO_PEERCRED uid; another user never sees or joins it)
 * with a fixed number of members. This part forms groups from GroupJoin messages, creates each
 * group's shared-memory arena and hands its path to the members, watches members' sessions and
 * marks the group failed in the arena (naming the member) when one ends, and bounds groups per
 * uid, members per group and arena bytes per uid. The collectives themselves run in the client
 * library over the arena (client/lib/coll.c); this part never reduces or copies tensor bytes.
 * Joins across hosts (coordinator, Slurm) go through a coordinator daemon over peer links
 * (groupx.c, the member's side; groupcoord.c, the coordinator's), admitted only from the peer
 * identities the group's remote access names; each host's members still form a group here.
 */
#ifndef TPD_GROUP_H
#define TPD_GROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_groups;
struct tpd_local;

/*
 * tpd_group_new() - the part's state for @d (borrowed; must outlive it): no group.
 * @ret: returns owned state, free with tpd_group_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_group_new(struct tpd_daemon *d, struct tpd_groups **ret);

/* Frees every group (unmapping its arena) and @g. Accepts NULL. Call after
 * the sessions are gone (tpd_local_free()). */
void tpd_group_free(struct tpd_groups *g);

/* Registers this part's ops on @l (borrowed), so that sessions hand group messages and their
 * end up to it. Called once, before the first session attaches. */
void tpd_group_serve_local(struct tpd_local *l);

/* Counts for tpipctl status and metrics: groups, members joined, arena bytes. Borrows @g. */
void tpd_group_counts(const struct tpd_groups *g, uint32_t *ret_groups, uint32_t *ret_members,
		      uint64_t *ret_bytes);

/*
 * tpd_group_ctl() - describe the groups for tpipctl groups: every group, or with @own_only only
 * those of uid @viewer.
 * @ret, @n: returns an owned array of owned messages, free with tpd_group_ctl_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_group_ctl(struct tpd_groups *g, bool own_only, uid_t viewer, Tpw__V1__CtlGroup ***ret,
		  size_t *n);
void tpd_group_ctl_free(Tpw__V1__CtlGroup **v, size_t n);

/* Totals since start for metrics: groups formed, groups that failed (a member died, left or
 * aborted while others remained), joins refused or timed out. Borrows @g. */
void tpd_group_totals(const struct tpd_groups *g, uint64_t *ret_formed, uint64_t *ret_failed,
		      uint64_t *ret_refused);

/* What the members' libraries counted in their arenas (struct tpu_grparena_stats), summed over
 * every member of every group since start, the groups already freed included. */
enum {
	TPD_GROUP_CALLS,	/* collectives finished */
	TPD_GROUP_BYTES,	/* bytes of their inputs */
	TPD_GROUP_XBYTES_OUT,	/* a host's leader: bytes to the other hosts' leaders */
	TPD_GROUP_XBYTES_IN,	/* and from them */
	TPD_GROUP_ACTIVITY_N
};

/* tpd_group_activity() - the sums above into @ret (TPD_GROUP_ACTIVITY_N values; numbers as the
 * members wrote them, saturating). Borrows @g. */
void tpd_group_activity(const struct tpd_groups *g, uint64_t *ret);

#endif
