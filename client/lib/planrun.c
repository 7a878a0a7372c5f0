/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Runs one leader's cross-host schedule (plan.h): for each step of tpc_plan_steps(), exchanges
 * the step's segments with the step's peers in chunks through a caller-supplied transport and
 * folds or copies what arrives as the step says, keeping the next chunk on the wire while one
 * is folded. Knows nothing of sockets, daemons or threads.
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

/* A step's progress: what is left to start of each range, and where the next chunk lands. */
struct step_run {
	size_t so, sn, ro, rn;	       /* next chunk to start: send and receive ranges left */
	size_t land_off[TPC_PLAN_DEPTH]; /* started, not yet landed: receive offset and length */
	size_t land_n[TPC_PLAN_DEPTH];
	unsigned started, landed;
};

static int chunk_start(const struct tpc_plan_run_args *a, const struct tpc_plan_step *st,
		       struct step_run *sr, size_t per)
{
	size_t s = sr->sn < per ? sr->sn : per, r = sr->rn < per ? sr->rn : per;
	uint8_t *sp = (uint8_t *)a->buf + sr->so * a->es;
	uint8_t *rp = (uint8_t *)a->scratch + sr->ro * a->es;
	int e = a->ops->start(a->t, s ? st->send_to : -1, sp, s * a->es, r ? st->recv_from : -1, rp,
			      r * a->es);

	if (e < 0)
		return e;
	sr->land_off[sr->started % TPC_PLAN_DEPTH] = sr->ro;
	sr->land_n[sr->started % TPC_PLAN_DEPTH] = r;
	sr->started++;
	sr->so += s, sr->sn -= s, sr->ro += r, sr->rn -= r;
	return 0;
}

/* One step: chunk k + 1 is started before chunk k is folded (different ranges of @a->buf and
 * @a->scratch, so neither touches what the other is using). */
static int run_step(const struct tpc_plan_run_args *a, const struct tpc_plan_step *st,
		    size_t per)
{
	struct step_run sr = { 0 };
	int r = 0;

	seg_range(a, st->send_seg, st->send_to >= 0 ? st->send_nseg : 0, &sr.so, &sr.sn);
	seg_range(a, st->recv_seg, st->recv_from >= 0 ? st->recv_nseg : 0, &sr.ro, &sr.rn);
	while (r == 0 && (sr.sn > 0 || sr.rn > 0 || sr.landed < sr.started)) {
		while (r == 0 && (sr.sn > 0 || sr.rn > 0) &&
		       sr.started - sr.landed < TPC_PLAN_DEPTH)
			r = chunk_start(a, st, &sr, per);
		if (r == 0 && sr.landed < sr.started) {
			unsigned k = sr.landed++ % TPC_PLAN_DEPTH;

			r = a->ops->wait(a->t);
			if (r == 0)
				land(a, st->recv, sr.land_off[k], sr.land_n[k]);
		}
	}
	while (sr.landed < sr.started) /* give the buffers back before failing */
		sr.landed++, a->ops->wait(a->t);
	return r;
}

int tpc_plan_run(const struct tpc_plan_run_args *a)
{
	struct tpc_plan_step *steps;
	uint32_t n;
	size_t per;
	int r = 0;

	if (a->algo == TPC_PLAN_NONE || a->nhosts <= 1)
		return a->host < (a->nhosts ? a->nhosts : 1) ? 0 : -EINVAL;
	if (a->es == 0 || !a->fold || !a->ops || !a->ops->start || !a->ops->wait ||
	    (a->count && (!a->buf || !a->scratch)) || a->count > SIZE_MAX / a->es)
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
