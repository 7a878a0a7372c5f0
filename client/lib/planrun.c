/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Runs one leader's cross-host schedule (plan.h): for each step of tpc_plan_steps(), exchanges
 * the step's segments with the step's peers in chunks through a caller-supplied transport and
 * folds or copies what arrives as the step says, keeping TPC_PLAN_DEPTH chunks on the wire
 * across the steps' boundaries while they are folded. Knows nothing of sockets, daemons or
 * threads.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"

/* Elements [*@ret_off, +*@ret_n) of the schedule's segments [@seg, @seg + @nseg) of a tensor of
 * @count elements. */
static void seg_range(const struct tpc_plan_run_args *a, size_t count, uint32_t seg,
		      uint32_t nseg, size_t *ret_off, size_t *ret_n)
{
	size_t off, n, end;

	if (nseg == 0) {
		*ret_off = 0, *ret_n = 0;
		return;
	}
	tpc_plan_segment(count, a->es, a->nhosts, seg, &off, &n);
	tpc_plan_segment(count, a->es, a->nhosts, seg + nseg - 1, &end, &n);
	*ret_off = off;
	*ret_n = end + n - off;
}

/* Folds @n received elements at element @off as @how says (what a step copies was received in
 * place). */
static void land(const struct tpc_plan_run_args *a, enum tpc_plan_recv how, size_t off, size_t n)
{
	uint8_t *mine = (uint8_t *)a->buf + off * a->es, *in = (uint8_t *)a->scratch + off * a->es;

	if (n == 0 || how == TPC_PLAN_COPY)
		return;
	if (how == TPC_PLAN_FOLD_RIGHT) {
		a->fold(mine, in, n, a->dtype, a->user);
		return;
	}
	if (a->fold_left) {
		a->fold_left(mine, in, n, a->dtype, a->user);
		return;
	}
	a->fold(in, mine, n, a->dtype, a->user);
	memcpy(mine, in, n * a->es);
}

/* An exchange started and not yet landed: what it sends and where what it receives lands. */
struct inflight {
	size_t so, sn, ro, rn; /* elements sent from @a->buf and received into @a->scratch */
	enum tpc_plan_recv how;
	size_t start;	       /* of the run's segment (tpc_plan_run_args.seg) it belongs to */
};

/* The exchanges in flight, oldest first (the transport ends them in that order). */
struct run {
	struct inflight q[TPC_PLAN_DEPTH];
	unsigned head, n;
	size_t started; /* elements whose every exchange has started: whole segments */
	size_t done;	/* elements reported done (tpc_plan_run_args.done) */
};

/* Reports the segments whose every exchange has landed. */
static void report_done(const struct tpc_plan_run_args *a, struct run *run)
{
	size_t to = run->started;

	if (run->n && run->q[run->head % TPC_PLAN_DEPTH].start < to)
		to = run->q[run->head % TPC_PLAN_DEPTH].start;
	if (to > run->done) {
		run->done = to;
		if (a->done)
			a->done(a->t, to);
	}
}

static bool overlap(size_t a, size_t an, size_t b, size_t bn)
{
	return an && bn && a < b + bn && b < a + an;
}

/* Ends the oldest exchange and folds or copies what it received. */
static int land_oldest(const struct tpc_plan_run_args *a, struct run *run)
{
	struct inflight *f = &run->q[run->head % TPC_PLAN_DEPTH];
	int r = a->ops->wait(a->t);

	run->head++;
	run->n--;
	if (r == 0) {
		land(a, f->how, f->ro, f->rn);
		report_done(a, run);
	}
	return r;
}

/*
 * Starts exchange @x once nothing in flight would land where it sends from or receives into
 * (so a ring's step t + 1 sends chunk k as soon as step t's chunk k has landed, with no drain
 * between steps; recursive doubling, whose step sends what the last one received, waits for
 * all of it), nothing in flight still sends from where a copy (received straight into the
 * leader's segments, not through the scratch) would land, and a slot is free.
 */
static int start_one(const struct tpc_plan_run_args *a, const struct tpc_plan_step *st,
		     struct run *run, const struct inflight *x)
{
	int r = 0;

	for (unsigned i = 0; r == 0 && i < run->n; i++) {
		const struct inflight *y = &run->q[(run->head + i) % TPC_PLAN_DEPTH];

		if (!overlap(y->ro, y->rn, x->so, x->sn) && !overlap(y->ro, y->rn, x->ro, x->rn) &&
		    (x->how != TPC_PLAN_COPY || !overlap(y->so, y->sn, x->ro, x->rn)))
			continue;
		/* land everything up to and including y; the queue moved: look again */
		for (unsigned k = 0; r == 0 && k <= i; k++)
			r = land_oldest(a, run);
		i = (unsigned)-1;
	}
	while (r == 0 && run->n >= TPC_PLAN_DEPTH)
		r = land_oldest(a, run);
	if (r < 0)
		return r;
	r = a->ops->start(a->t, x->sn ? st->send_to : -1, (uint8_t *)a->buf + x->so * a->es,
			  x->sn * a->es, x->rn ? st->recv_from : -1,
			  (uint8_t *)(x->how == TPC_PLAN_COPY ? a->buf : a->scratch) + x->ro * a->es,
			  x->rn * a->es);
	if (r == 0)
		run->q[(run->head + run->n++) % TPC_PLAN_DEPTH] = *x;
	return r;
}

/* One step over the run's segment of @count elements from element @base, chunk by chunk, each
 * chunk started as start_one() allows. */
static int run_step(const struct tpc_plan_run_args *a, const struct tpc_plan_step *st,
		    size_t per, struct run *run, size_t base, size_t count)
{
	size_t so, sn, ro, rn;
	int r = 0;

	seg_range(a, count, st->send_seg, st->send_to >= 0 ? st->send_nseg : 0, &so, &sn);
	seg_range(a, count, st->recv_seg, st->recv_from >= 0 ? st->recv_nseg : 0, &ro, &rn);
	so += base;
	ro += base;
	while (r == 0 && (sn > 0 || rn > 0)) {
		struct inflight x = { .so = so, .sn = sn < per ? sn : per, .ro = ro,
				      .rn = rn < per ? rn : per, .how = st->recv,
				      .start = base };

		r = start_one(a, st, run, &x);
		so += x.sn, sn -= x.sn, ro += x.rn, rn -= x.rn;
	}
	return r;
}

int tpc_plan_run(const struct tpc_plan_run_args *a)
{
	struct tpc_plan_step *steps;
	struct run run = { .head = 0 };
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
	for (size_t base = 0; r == 0 && (base < a->count || base == 0); ) {
		size_t len = a->seg && a->seg < a->count - base ? a->seg : a->count - base;

		if (a->ready && (r = a->ready(a->t, base + len, false)) == 0) {
			while (r == 0 && run.n > 0) /* land what is in flight meanwhile */
				r = land_oldest(a, &run);
			if (r == 0)
				r = a->ready(a->t, base + len, true);
		}
		if (r < 0)
			break;
		r = 0;
		for (uint32_t k = 0; r == 0 && k < n; k++)
			r = run_step(a, &steps[k], per, &run, base, len);
		if (r == 0) {
			run.started = base + len;
			report_done(a, &run);
		}
		base += len;
		if (len == 0)
			break;
	}
	while (run.n > 0) { /* the last chunks; on an error, the buffers back before failing */
		int e = land_oldest(a, &run);

		r = r ? r : e;
	}
	free(steps);
	return r;
}
