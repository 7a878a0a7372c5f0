/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the group suites (grouptest.h): member processes and their shared results.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "grouptest.h"

struct gt_shared *gt_shared_new(void)
{
	void *p = mmap(NULL, sizeof(struct gt_shared), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void gt_shared_free(struct gt_shared *sh)
{
	if (sh)
		munmap(sh, sizeof(*sh));
}

uint64_t gt_hash(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

int gt_member_main(void *arg)
{
	struct gt_member *m = arg;
	struct tp_group_options o = { .size = sizeof(o), .rank = m->rank_ask, .nranks = m->n,
				      .join_timeout_ms = m->join_ms, .op_timeout_ms = m->op_ms };
	int r;

	if (m->sh->features_off[m->idx][0])
		setenv("TP_GROUP_FEATURES_OFF", m->sh->features_off[m->idx], 1);
	if (m->sh->reduce_isa[m->idx][0])
		setenv("TP_REDUCE_ISA", m->sh->reduce_isa[m->idx], 1);
	r = tpt_ctx_new(m->d, 0, NULL, &m->ctx);
	if (r < 0) {
		fprintf(stderr, "member %u: context: %s\n", m->idx, tp_strerror(r));
		return 2;
	}
	r = tp_group_join(m->ctx, m->name, &o, &m->g);
	if (r < 0) {
		fprintf(stderr, "member %u: join: %s\n", m->idx, tp_last_error());
		snprintf(m->sh->msg[m->idx], sizeof(m->sh->msg[0]), "%s", tp_last_error());
		tp_context_free(m->ctx);
		return 3;
	}
	m->sh->rank_of[m->idx] = tp_group_rank(m->g);
	m->sh->pid[m->idx] = getpid();
	r = m->body ? m->body(m) : 0;
	tp_group_leave(m->g);
	tp_context_free(m->ctx);
	return r;
}

bool gt_run(const struct tpt_daemon *d, const char *name, unsigned n, bool assign,
	    gt_body_fn body, void *arg, struct gt_shared *sh, int timeout_ms)
{
	pid_t pids[GT_MAX];
	bool ok = true;

	for (unsigned i = 0; i < n; i++) {
		struct gt_member m = { .d = d, .name = name, .idx = i, .n = n,
				       .rank_ask = assign ? -1 : (int)i, .join_ms = timeout_ms,
				       .sh = sh, .body = body, .arg = arg };

		pids[i] = tpt_fork(gt_member_main, &m);
		if (pids[i] < 0)
			return false;
	}
	for (unsigned i = 0; i < n; i++) {
		char what[32];

		snprintf(what, sizeof(what), "member %u", i);
		ok &= tpt_wait_ok(pids[i], timeout_ms, what);
	}
	return ok;
}
