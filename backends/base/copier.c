/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copy threads. See copier.h. Each worker owns a bounce buffer for process-to-process CMA and
 * claims chunks from the copier's engine (work.h), which owns the queue, the cursor, the first
 * error and the completion; this file runs the channel kernel on each chunk.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "copier.h"

#define BOUNCE_BYTES (4u << 20)

struct tpb_copier {
	struct tpb_work *work;
	pthread_t *threads;
	unsigned n_threads;
	/* The waiter thread and the jobs waiting for their clients' CUDA work (wait_lock). */
	pthread_mutex_t wait_lock;
	pthread_cond_t wait_cond;
	struct tpu_list waiting;
	unsigned n_waiting;
	pthread_t waiter;
	bool waiter_started, stopping;
};

static uint64_t job_seg_len(const struct tpb_work_job *w, size_t seg)
{
	return tpu_container_of(w, struct tpb_copy_job, work)->xfers[seg].len;
}

static void job_on_done(struct tpb_work_job *w)
{
	struct tpb_copy_job *job = tpu_container_of(w, struct tpb_copy_job, work);

	job->status = w->status;
	snprintf(job->why, sizeof(job->why), "%s", w->status < 0 ? w->why : "");
	job->done(job);
}

/* Copy thread, after the last chunk: unmap what only this transfer needed before it completes. */
static void job_on_last(struct tpb_work_job *w)
{
	struct tpb_copy_job *job = tpu_container_of(w, struct tpb_copy_job, work);

	job->maps_busy = false;
	tpb_cuda_maps_idle(job->maps, job->n_maps);
}

struct tpb_copy_job *tpb_copier_job_new(size_t n, size_t n_refs)
{
	struct tpb_copy_job *job = calloc(1, sizeof(*job));

	if (!job)
		return NULL;
	job->xfers = calloc(n ? n : 1, sizeof(*job->xfers));
	job->channels = calloc(n ? n : 1, sizeof(*job->channels));
	job->ns = calloc(n ? n : 1, sizeof(*job->ns));
	job->refs = calloc(n_refs ? n_refs : 1, sizeof(*job->refs));
	job->maps = calloc(n_refs ? 2 * n_refs : 1, sizeof(*job->maps));
	if (!job->xfers || !job->channels || !job->ns || !job->refs || !job->maps) {
		tpb_copier_job_free(job);
		return NULL;
	}
	return job;
}

int tpb_copier_job_hold_proc(struct tpb_copy_job *job, struct tpb_proc *p)
{
	for (size_t i = 0; p && i < TPU_ARRAY_SIZE(job->procs); i++) {
		if (job->procs[i] == p)
			return 0;
		if (!job->procs[i]) {
			job->procs[i] = tpb_proc_ref(p);
			return 0;
		}
	}
	return p ? -ENOBUFS : 0;
}

void tpb_copier_job_free(struct tpb_copy_job *job)
{
	if (!job)
		return;
	for (size_t i = 0; i < job->n_refs; i++)
		tpb_buffer_unref(job->refs[i]);
	if (job->maps_busy) /* never ran to its end */
		tpb_cuda_maps_idle(job->maps, job->n_maps);
	for (size_t i = 0; i < job->n_maps; i++)
		tpb_cuda_map_unref(job->maps[i]);
	tpb_proc_unref(job->procs[0]);
	tpb_proc_unref(job->procs[1]);
	free(job->maps);
	free(job->refs);
	free(job->channels);
	free(job->ns);
	free(job->xfers);
	free(job);
}

static struct tpb_mem mem_at(struct tpb_mem m, uint64_t off)
{
	m.addr += off;
	return m;
}

/* Runs the channel kernel on chunk @k; adds its time to its transfer's. Return: 0 or -errno,
 * with the reason in @why. */
static int chunk_run(const struct tpb_work_chunk *k, struct tpb_scratch *s, char *why,
		     size_t why_len)
{
	struct tpb_copy_job *job = tpu_container_of(k->job, struct tpb_copy_job, work);
	const struct tpb_xfer *x = &job->xfers[k->seg];
	struct tpb_xfer c = { .src = mem_at(x->src, k->off), .dst = mem_at(x->dst, k->off),
			      .len = k->len };
	uint64_t t0 = tpu_now_ns();
	int r;

	s->why[0] = '\0';
	if (__atomic_load_n(&job->abandoned, __ATOMIC_ACQUIRE)) {
		snprintf(why, why_len, "cancelled: an end of its pipe left");
		return -ECANCELED;
	}
	r = tpb_copy(job->channels[k->seg], &c, s);
	__atomic_fetch_add(&job->ns[k->seg], tpu_now_ns() - t0, __ATOMIC_RELAXED);
	if (r < 0)
		snprintf(why, why_len, "%s copy of %llu bytes failed: %s",
			 tpb_name(job->channels[k->seg]), (unsigned long long)k->len,
			 s->why[0] ? s->why : strerror(-r));
	return r;
}

/*
 * Workers claim chunks, not jobs: every idle worker takes the next unclaimed chunk of the oldest
 * job, so the chunks of one large tensor are copied by all workers at once. After an error the
 * engine hands out no more of that job's chunks; a chunk claimed before is skipped.
 */
static void *worker_main(void *arg)
{
	struct tpb_copier *c = arg;
	struct tpb_scratch s = { .bounce = malloc(BOUNCE_BYTES), .bounce_len = BOUNCE_BYTES };
	struct tpb_work_chunk k;
	char why[160];

	if (!s.bounce)
		s.bounce_len = 0;
	while (tpb_work_claim(c->work, &k) == 0) {
		int r = 0;

		why[0] = '\0';
		if (!tpb_work_stopped(c->work, k.job))
			r = chunk_run(&k, &s, why, sizeof(why));
		tpb_work_finish(c->work, &k, r, why);
	}
	tpb_cuda_scratch_done(&s);
	free(s.bounce);
	return NULL;
}

int tpb_copier_progress(struct tpb_copier *c)
{
	return tpb_work_progress(c->work);
}

int tpb_copier_event_fd(const struct tpb_copier *c)
{
	return tpb_work_event_fd(c->work);
}

/*
 * Locked: sleeps @n steps into a wait that nothing ended, from 20 us doubling up to 1 ms (a
 * stream held for long costs little CPU), unless a new job or an abandon signals first.
 * Return: 0 when signalled, else ETIMEDOUT.
 */
static int waiter_sleep(struct tpb_copier *c, unsigned n)
{
	uint64_t us = TPU_MIN(20ull << TPU_MIN(n, 6u), 1000ull);
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += (long)(us * 1000);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return pthread_cond_timedwait(&c->wait_cond, &c->wait_lock, &ts);
}

/*
 * The waiter: polls the client events of every waiting job without blocking on any one, and
 * submits each job whose events completed (or that was abandoned) to the engine; yields while a
 * poll found something still pending, then sleeps in growing steps once nothing moved for a
 * while.
 */
static void *waiter_main(void *arg)
{
	struct tpb_copier *c = arg;
	unsigned idle = 0;

	pthread_mutex_lock(&c->wait_lock);
	while (!c->stopping) {
		struct tpu_list batch, *n;
		bool moved = false;

		if (tpu_list_empty(&c->waiting)) {
			idle = 0;
			pthread_cond_wait(&c->wait_cond, &c->wait_lock);
			continue;
		}
		tpu_list_init(&batch); /* poll outside the lock: submitters only append */
		tpu_list_splice_tail(&batch, &c->waiting);
		pthread_mutex_unlock(&c->wait_lock);
		for (n = batch.next; n != &batch;) {
			struct tpb_copy_job *job = tpu_container_of(n, struct tpb_copy_job, wait_node);

			n = n->next;
			if (!__atomic_load_n(&job->abandoned, __ATOMIC_ACQUIRE) &&
			    !tpb_cuda_xfers_ready(job->xfers, job->n, job->procs))
				continue;
			tpu_list_remove(&job->wait_node);
			pthread_mutex_lock(&c->wait_lock);
			c->n_waiting--;
			pthread_mutex_unlock(&c->wait_lock);
			tpb_work_submit(c->work, &job->work);
			moved = true;
		}
		pthread_mutex_lock(&c->wait_lock);
		tpu_list_splice_head(&c->waiting, &batch); /* oldest first again */
		idle = moved ? 0 : idle + 1;
		if (idle < 200) {
			pthread_mutex_unlock(&c->wait_lock);
			sched_yield();
			pthread_mutex_lock(&c->wait_lock);
		} else if (waiter_sleep(c, idle - 200) == 0) {
			idle = 0; /* a new job or an abandon: poll at once */
		}
	}
	pthread_mutex_unlock(&c->wait_lock);
	return NULL;
}

/* Hands @job to the waiter (started on first use). Return: false if it cannot run. */
static bool waiter_push(struct tpb_copier *c, struct tpb_copy_job *job)
{
	bool ok;

	pthread_mutex_lock(&c->wait_lock);
	if (!c->waiter_started && !c->stopping &&
	    pthread_create(&c->waiter, NULL, waiter_main, c) == 0)
		c->waiter_started = true;
	ok = c->waiter_started && !c->stopping;
	if (ok) {
		tpu_list_insert_tail(&c->waiting, &job->wait_node);
		c->n_waiting++;
		pthread_cond_signal(&c->wait_cond);
	}
	pthread_mutex_unlock(&c->wait_lock);
	return ok;
}

int tpb_copier_new(unsigned threads, struct tpb_copier **ret)
{
	/* A copy is not cut below a chunk: memcpy and CMA threads gain nothing from splitting a
	 * tensor of a chunk or less, and measured slower for 1 MiB CMA copies on a busy host. */
	struct tpb_work_config cfg = { .workers = threads, .spread_min = TPB_WORK_CHUNK };
	struct tpb_copier *c = calloc(1, sizeof(*c));
	pthread_condattr_t ca;
	int r;

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->wait_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->wait_cond, &ca);
	pthread_condattr_destroy(&ca);
	tpu_list_init(&c->waiting);
	r = tpb_work_new(&cfg, &c->work);
	if (r < 0) {
		free(c);
		return r;
	}
	c->threads = calloc(threads, sizeof(*c->threads));
	if (!c->threads)
		goto fail;
	for (; c->n_threads < threads; c->n_threads++)
		if (pthread_create(&c->threads[c->n_threads], NULL, worker_main, c) != 0)
			goto fail;
	*ret = c;
	return 0;
fail:
	tpb_copier_free(c);
	return -ENOMEM;
}

/*
 * True when every transfer of @job is a copy the GPU runs on its own (CUDA memory on one side,
 * none of it a client's private memory, which the copy thread reads or writes by CMA): one
 * asynchronous copy per transfer then beats 1 MiB chunks, each waited for on the host.
 */
static bool job_on_gpu(const struct tpb_copy_job *job)
{
	for (size_t i = 0; i < job->n; i++) {
		const struct tpb_xfer *x = &job->xfers[i];
		if ((x->src.loc != TPB_LOC_CUDA && x->dst.loc != TPB_LOC_CUDA) ||
		    x->src.loc == TPB_LOC_PROCESS || x->dst.loc == TPB_LOC_PROCESS)
			return false;
	}
	return job->n > 0;
}

void tpb_copier_submit(struct tpb_copier *c, struct tpb_copy_job *job)
{
	job->work.chunk_min = job_on_gpu(job) ? UINT64_MAX : 0;
	job->status = 0;
	job->why[0] = '\0';
	for (size_t i = 0; i < job->n; i++)
		job->ns[i] = 0;
	job->work.n_segs = job->n;
	job->work.seg_len = job_seg_len;
	job->work.done = job_on_done;
	job->work.last = job->n && job->n_maps ? job_on_last : NULL;
	if (job->work.last && !job->maps_busy)
		tpb_cuda_maps_busy(job->maps, job->n_maps);
	job->maps_busy = job->work.last != NULL;
	if (tpb_cuda_xfers_wait(job->xfers, job->n) && waiter_push(c, job))
		return;
	tpb_work_submit(c->work, &job->work);
}

void tpb_copier_abandon(struct tpb_copier *c, struct tpb_copy_job *job)
{
	__atomic_store_n(&job->abandoned, true, __ATOMIC_RELEASE);
	pthread_mutex_lock(&c->wait_lock);
	pthread_cond_signal(&c->wait_cond);
	pthread_mutex_unlock(&c->wait_lock);
}

unsigned tpb_copier_busy(const struct tpb_copier *c)
{
	unsigned n;

	pthread_mutex_lock(&((struct tpb_copier *)c)->wait_lock);
	n = c->n_waiting;
	pthread_mutex_unlock(&((struct tpb_copier *)c)->wait_lock);
	return n + tpb_work_busy(c->work);
}

void tpb_copier_free(struct tpb_copier *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->wait_lock);
	c->stopping = true;
	pthread_cond_signal(&c->wait_cond);
	pthread_mutex_unlock(&c->wait_lock);
	if (c->waiter_started)
		pthread_join(c->waiter, NULL);
	if (c->work)
		tpb_work_stop(c->work); /* workers finish the chunk in hand, then exit */
	for (unsigned i = 0; i < c->n_threads; i++)
		pthread_join(c->threads[i], NULL);
	while (!tpu_list_empty(&c->waiting)) { /* queued now, so that the engine cancels them */
		struct tpb_copy_job *job =
			tpu_list_first(&c->waiting, struct tpb_copy_job, wait_node);

		tpu_list_remove(&job->wait_node);
		tpb_work_submit(c->work, &job->work);
	}
	/* Finished jobs complete normally, queued ones are canceled. */
	tpb_work_free(c->work, "daemon stopping");
	pthread_mutex_destroy(&c->wait_lock);
	pthread_cond_destroy(&c->wait_cond);
	free(c->threads);
	free(c);
}

/* A job made for an op of a channel context ends: hand its outcome to the context. */
static void engine_job_done(struct tpb_copy_job *job)
{
	tpb_sync_engine_done(job->arg, job->status, job->bytes, job->why);
	tpb_copier_job_free(job);
}

static int engine_submit(void *arg, int channel, struct tpb_op *op)
{
	struct tpb_copy_job *job;

	if (op->n_xfers == 0) {
		tpb_sync_engine_done(op, 0, 0, NULL); /* nothing to copy: delivered from progress */
		return 0;
	}
	job = tpb_copier_job_new(op->n_xfers, 0);
	if (!job)
		return -ENOMEM;
	for (size_t i = 0; i < op->n_xfers; i++) {
		job->xfers[i] = op->xfers[i];
		job->channels[i] = channel;
		job->bytes += op->xfers[i].len;
	}
	job->n = op->n_xfers;
	job->done = engine_job_done;
	job->arg = op;
	tpb_copier_submit(arg, job);
	return 0;
}

void tpb_copier_engine(struct tpb_copier *c, struct tpb_engine *ret)
{
	*ret = (struct tpb_engine){ .submit = engine_submit, .arg = c };
}
