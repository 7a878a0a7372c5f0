/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared thread engine: claim queue, cursor, first error, in-flight counts and completion of
 * jobs. See work.h. One mutex guards the queue and the private fields and results of every job
 * submitted and not yet delivered; workers hold it only to claim and to account, never while
 * they move bytes. Completions are pushed to the completion queue under that lock, so a job is
 * queued for its callback exactly once. It logs nothing: its users decide what a failure means.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "work.h"

struct tpb_work {
	pthread_mutex_t lock;
	pthread_cond_t cond;   /* workers wait here for a chunk or for stop */
	struct tpu_list todo;  /* jobs with chunks left to claim */
	struct tpb_cq own;     /* complete, not yet delivered (no borrowed queue) */
	struct tpb_cq *cq;     /* &own, or the owner's */
	uint32_t chunk, spread_min;
	unsigned workers;
	bool rows;
	bool stopping;
	unsigned busy;	       /* jobs submitted and not delivered (lock) */
	unsigned waiting;      /* workers asleep in tpb_work_claim() */
};

uint64_t tpb_work_chunk_size(uint64_t total, unsigned workers, uint32_t chunk,
			     uint32_t spread_min)
{
	uint64_t per;

	if (!workers)
		workers = 1;
	per = total / workers + (total % workers != 0);
	per = (per + (64u << 10) - 1) & ~(uint64_t)((64u << 10) - 1);
	return TPU_MAX(TPU_MIN(per, (uint64_t)chunk),
		       TPU_MIN((uint64_t)spread_min, (uint64_t)chunk));
}

int tpb_work_new(const struct tpb_work_config *cfg, struct tpb_work **ret)
{
	struct tpb_work *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	w->own.efd = -EBADF;
	w->cq = cfg->cq;
	if (!w->cq) {
		r = tpb_cq_init(&w->own);
		if (r < 0) {
			free(w);
			return r;
		}
		w->cq = &w->own;
	}
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	tpu_list_init(&w->todo);
	w->chunk = cfg->chunk ? cfg->chunk : TPB_WORK_CHUNK;
	w->spread_min = cfg->spread_min ? cfg->spread_min : TPB_WORK_CHUNK_MIN;
	w->workers = cfg->workers ? cfg->workers : 1;
	w->rows = cfg->rows;
	*ret = w;
	return 0;
}

void tpb_work_set_workers(struct tpb_work *w, unsigned workers)
{
	pthread_mutex_lock(&w->lock);
	w->workers = workers ? workers : 1;
	pthread_mutex_unlock(&w->lock);
}

int tpb_work_event_fd(const struct tpb_work *w)
{
	return tpb_cq_event_fd(w->cq);
}

/* Lock held: moves the cursor of @job past finished and empty segments. */
static void job_settle(struct tpb_work_job *job)
{
	while (job->next_seg < job->n_segs &&
	       job->next_off >= job->seg_len(job, job->next_seg)) {
		job->next_seg++;
		job->next_off = 0;
	}
}

/* Lock held: records the first error of @job. */
static void job_set_status(struct tpb_work_job *job, int status, const char *why)
{
	if (job->status < 0 || status >= 0)
		return;
	job->status = status;
	snprintf(job->why, sizeof(job->why), "%s", why && *why ? why : strerror(-status));
}

/* Lock held: completes @job once nothing is left to claim (or it stopped) and no chunk of it is
 * in flight. */
static void job_check(struct tpb_work *w, struct tpb_work_job *job)
{
	bool stopped = job->canceled || job->status < 0;

	if (stopped && tpu_list_linked(&job->node))
		tpu_list_remove(&job->node); /* hand out no more of its chunks */
	if (job->queued_done || job->busy || (!stopped && job->next_seg < job->n_segs))
		return;
	job->queued_done = true;
	if (job->canceled && job->status == 0)
		job->status = -ECANCELED; /* @why was set by tpb_work_cancel() */
	if (tpu_list_linked(&job->node))
		tpu_list_remove(&job->node);
	if (w->cq != &w->own)
		w->busy--; /* the owner delivers it */
	tpb_cq_push(w->cq, &job->node);
}

void tpb_work_submit(struct tpb_work *w, struct tpb_work_job *job)
{
	uint64_t total = 0;

	job->status = 0;
	job->why[0] = '\0';
	job->bytes = 0;
	job->next_seg = 0;
	job->next_off = 0;
	job->busy = job->turn = 0;
	job->canceled = job->queued_done = job->last_ran = false;
	tpu_list_init(&job->node);
	pthread_mutex_lock(&w->lock);
	for (size_t i = 0; i < job->n_segs; i++)
		total += job->seg_len(job, i);
	job->chunk = TPU_MAX(tpb_work_chunk_size(total, w->workers, w->chunk, w->spread_min),
			     job->chunk_min);
	w->busy++;
	job_settle(job);
	if (job->next_seg == job->n_segs) {
		job_check(w, job); /* nothing to claim */
	} else {
		tpu_list_insert_tail(&w->todo, &job->node);
		if (w->waiting)
			pthread_cond_signal(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Lock held, queue not empty: claims the next chunk of the job at the head of the queue. A job
 * whose last chunk this is leaves the queue; with rows, a job that took a row of chunks goes to
 * the tail, so concurrent jobs share the workers row by row. */
static void claim_locked(struct tpb_work *w, struct tpb_work_chunk *k)
{
	struct tpb_work_job *job = tpu_list_first(&w->todo, struct tpb_work_job, node);
	uint64_t seg_len = job->seg_len(job, job->next_seg);

	*k = (struct tpb_work_chunk){ .job = job, .seg = job->next_seg, .off = job->next_off };
	k->len = TPU_MIN(job->chunk, seg_len - job->next_off);
	job->next_off += k->len;
	job_settle(job);
	job->busy++;
	if (job->next_seg >= job->n_segs) {
		tpu_list_remove(&job->node); /* all claimed */
	} else if (w->rows && ++job->turn >= w->workers) {
		job->turn = 0;
		tpu_list_remove(&job->node);
		tpu_list_insert_tail(&w->todo, &job->node);
	}
	if (!tpu_list_empty(&w->todo) && w->waiting)
		pthread_cond_signal(&w->cond); /* more for another worker */
}

int tpb_work_claim(struct tpb_work *w, struct tpb_work_chunk *ret)
{
	int r = 0;

	pthread_mutex_lock(&w->lock);
	while (!w->stopping && tpu_list_empty(&w->todo)) {
		w->waiting++;
		pthread_cond_wait(&w->cond, &w->lock);
		w->waiting--;
	}
	if (w->stopping)
		r = -ESHUTDOWN;
	else
		claim_locked(w, ret);
	pthread_mutex_unlock(&w->lock);
	return r;
}

int tpb_work_try_claim(struct tpb_work *w, struct tpb_work_chunk *ret)
{
	int r = 0;

	pthread_mutex_lock(&w->lock);
	if (w->stopping)
		r = -ESHUTDOWN;
	else if (tpu_list_empty(&w->todo))
		r = -EAGAIN;
	else
		claim_locked(w, ret);
	pthread_mutex_unlock(&w->lock);
	return r;
}

void tpb_work_finish(struct tpb_work *w, const struct tpb_work_chunk *k, int status,
		     const char *why)
{
	struct tpb_work_job *job = k->job;

	pthread_mutex_lock(&w->lock);
	if (status < 0)
		job_set_status(job, status, why); /* after a cancel too: the first error wins */
	else
		job->bytes += k->len;
	if (job->last && !job->last_ran && job->busy == 1 &&
	    (job->canceled || job->status < 0 || job->next_seg >= job->n_segs)) {
		/* The last chunk: the hook runs while it still counts as busy, so nothing completes
		 * the job meanwhile. */
		job->last_ran = true;
		pthread_mutex_unlock(&w->lock);
		job->last(job);
		pthread_mutex_lock(&w->lock);
	}
	job->busy--;
	job_check(w, job);
	pthread_mutex_unlock(&w->lock);
}

bool tpb_work_stopped(struct tpb_work *w, const struct tpb_work_job *job)
{
	bool stopped;

	pthread_mutex_lock(&w->lock);
	stopped = job->canceled || job->status < 0;
	pthread_mutex_unlock(&w->lock);
	return stopped;
}

void tpb_work_cancel(struct tpb_work *w, struct tpb_work_job *job, const char *why)
{
	pthread_mutex_lock(&w->lock);
	if (!job->queued_done && !job->canceled) {
		job->canceled = true;
		if (job->status == 0)
			snprintf(job->why, sizeof(job->why), "%s", why && *why ? why : "canceled");
		job_check(w, job); /* or when its last chunk in flight returns */
	}
	pthread_mutex_unlock(&w->lock);
}

void tpb_work_fail_all(struct tpb_work *w, int status, const char *why)
{
	struct tpb_work_job *job;

	pthread_mutex_lock(&w->lock);
	while ((job = tpu_list_first(&w->todo, struct tpb_work_job, node))) {
		job_set_status(job, status, why);
		job_check(w, job);
	}
	pthread_mutex_unlock(&w->lock);
}

int tpb_work_progress(struct tpb_work *w)
{
	struct tpu_list *n;
	int ran = 0;

	if (w->cq != &w->own)
		return 0;
	tpb_cq_ack(w->cq);
	while ((n = tpb_cq_pop(w->cq))) {
		struct tpb_work_job *job = tpu_container_of(n, struct tpb_work_job, node);

		pthread_mutex_lock(&w->lock);
		w->busy--;
		pthread_mutex_unlock(&w->lock);
		job->done(job);
		ran++;
	}
	return ran;
}

unsigned tpb_work_busy(const struct tpb_work *w)
{
	return __atomic_load_n(&w->busy, __ATOMIC_RELAXED);
}

void tpb_work_stop(struct tpb_work *w)
{
	pthread_mutex_lock(&w->lock);
	w->stopping = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

void tpb_work_free(struct tpb_work *w, const char *why)
{
	if (!w)
		return;
	tpb_work_progress(w); /* finished jobs complete normally */
	tpb_work_fail_all(w, -ECANCELED, why);
	tpb_work_progress(w);
	tpb_cq_done(&w->own);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w);
}
