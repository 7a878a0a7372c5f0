/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the group suites (test_groups.c, tests/security/test_groups.c): run N member
 * processes of one group on a test daemon, each with its own context, and collect what each
 * saw in memory shared with the parent (a hash of its results, its status, its message).
 */
#ifndef TPT_GROUPTEST_H
#define TPT_GROUPTEST_H

#include <stdbool.h>
#include <stdint.h>

#include "itest.h"

#define GT_MAX 8

struct gt_shared {
	uint64_t hash[GT_MAX][64]; /* per rank, per check: FNV-1a of the results */
	int status[GT_MAX][64];	  /* per rank, per check: the library's return */
	char msg[GT_MAX][256];	  /* per rank: tp_last_error() of the last failure */
	int rank_of[GT_MAX];	  /* per child: the rank the daemon gave */
	int pid[GT_MAX];
	/* per child: TP_GROUP_FEATURES_OFF for its join ("": unset), as a library without them */
	char features_off[GT_MAX][32];
	/* per child: TP_REDUCE_ISA for its process ("": unset), the build of its kernels */
	char reduce_isa[GT_MAX][16];
};

struct gt_member;
typedef int (*gt_body_fn)(struct gt_member *m);

/* One member: a child process with its index @idx of @n, its group @g once joined. */
struct gt_member {
	const struct tpt_daemon *d;
	const char *name; /* group name */
	unsigned idx, n;
	int rank_ask;	  /* -1: assigned */
	int join_ms, op_ms;
	struct gt_shared *sh;
	gt_body_fn body;
	void *arg;
	struct tp_context *ctx;
	struct tp_group *g;
	struct tpt_sync *sync; /* a channel to the parent, if the case needs one */
};

/* The shared results page (MAP_SHARED, zeroed); munmap with gt_shared_free(). */
struct gt_shared *gt_shared_new(void);
void gt_shared_free(struct gt_shared *sh);

/* FNV-1a of @len bytes. */
uint64_t gt_hash(const void *p, size_t len);

/* tpt_child_fn of one member: @arg is its struct gt_member (joins, runs its body, leaves).
 * Exit: the body's return; 2 no context; 3 join failed (message in sh->msg[idx]). */
int gt_member_main(void *arg);

#define GT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/*
 * gt_run() - fork @n members (idx 0..n-1) of group @name on @d, each joining (rank idx, or -1
 * with @assign), running @body, leaving; wait for all within @timeout_ms. Return: true if every
 * member exited 0 (failures are printed).
 */
bool gt_run(const struct tpt_daemon *d, const char *name, unsigned n, bool assign,
	    gt_body_fn body, void *arg, struct gt_shared *sh, int timeout_ms);

#endif
