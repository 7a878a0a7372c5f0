/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Runs one leader's cross-host schedule (plan.h): for each step of tpc_plan_steps(), exchanges
 * the step's segments with the step's peers in chunks through a caller-supplied transport and
 * folds or copies what arrives as the step says. Knows nothing of sockets, daemons or threads;
 * each exchange returns before the chunk it received is folded (no overlap inside one leader).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"

/* Elements [*@ret_off, +*@ret_n) of segments [@seg, @seg + @nseg) of @a's tensor. */
static void seg_range(const struct tpc_plan_run_args *a, uint32_t seg, uint32_t nseg,
		      size_t *ret_off, size_t *ret_n)
{
	size_t off, n, end;

	if (nseg == 0) {
		*ret_off = 0, *ret_n = 0;
		return;
	}
	tpc_plan_segment(a->count, a->es, a->nhosts, seg, &off, &n);
	tpc_plan_segment(a->count, a->es, a->nhosts, seg + nseg - 1, &end, &n);
	*ret_off = off;
	*ret_n = end + n - off;
}

/* Folds or copies @n received elements at element @off as @how says. */
static void land(const struct tpc_plan_run_args *a, enum tpc_plan_recv how, size_t off, size_t n)
{
	uint8_t *mine = (uint8_t *)a->buf + off * a->es, *in = (uint8_t *)a->scratch + off * a->es;

	if (n == 0)
		return;
	if (how == TPC_PLAN_FOLD_RIGHT) {
		a->fold(mine, in, n, a->dtype, a->user);
		return;
	}
	if (how == TPC_PLAN_FOLD_LEFT)
		a->fold(in, mine, n, a->dtype, a->user);
	memcpy(mine, in, n * a->es);
}

/* One step: chunk k of the send range goes out while chunk k of the receive range comes in. */
static int run_step(const struct tpc_plan_run_args *a, const struct tpc_plan_step *st,
		    size_t per)
{
	size_t so, sn, ro, rn;

	seg_range(a, st->send_seg, st->send_to >= 0 ? st->send_nseg : 0, &so, &sn);
	seg_range(a, st->recv_seg, st->recv_from >= 0 ? st->recv_nseg : 0, &ro, &rn);
	while (sn > 0 || rn > 0) {
		size_t s = sn < per ? sn : per, r = rn < per ? rn : per;
		int e = a->ops->xchg(a->t, s ? st->send_to : -1, (uint8_t *)a->buf + so * a->es,
				     s * a->es, r ? st->recv_from : -1,
				     (uint8_t *)a->scratch + ro * a->es, r * a->es);

		if (e < 0)
			return e;
		land(a, st->recv, ro, r);
		so += s, sn -= s, ro += r, rn -= r;
	}
	return 0;
}

int tpc_plan_run(const struct tpc_plan_run_args *a)
{
	struct tpc_plan_step *steps;
	uint32_t n;
	size_t per;
	int r = 0;

	if (a->algo == TPC_PLAN_NONE || a->nhosts <= 1)
		return a->host < (a->nhosts ? a->nhosts : 1) ? 0 : -EINVAL;
	if (a->es == 0 || !a->fold || !a->ops || !a->ops->xchg || (a->count && (!a->buf ||
	    !a->scratch)) || a->count > SIZE_MAX / a->es)
		return -EINVAL;
	n = tpc_plan_nsteps(a->nhosts, a->algo);
	if (n == 0)
		return -EINVAL;
	steps = calloc(n, sizeof(*steps));
	if (!steps)
		return -ENOMEM;
	if (tpc_plan_steps(a->nhosts, a->algo, a->host, steps) != (int)n)
		r = -EINVAL;
	per = a->chunk / a->es ? a->chunk / a->es : (a->chunk ? 1 : SIZE_MAX);
	for (uint32_t k = 0; r == 0 && k < n; k++)
		r = run_step(a, &steps[k], per);
	free(steps);
	return r;
}
