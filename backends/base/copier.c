/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copy threads. See copier.h. Each worker owns a bounce buffer for process-to-process CMA.
 * All copier fields and the claim counters of queued jobs are protected by the copier's lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"

#define BOUNCE_BYTES (4u << 20)

struct tpb_copier {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct tpu_list todo;
	struct tpb_cq cq; /* finished jobs, for tpb_copier_progress() */
	bool stopping;
	unsigned busy;
	pthread_t *threads;
	unsigned n_threads;
};

struct tpb_copy_job *tpb_copier_job_new(size_t n, size_t n_refs)
{
	struct tpb_copy_job *job = calloc(1, sizeof(*job));

	if (!job)
		return NULL;
	tpu_list_init(&job->node);
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

/* Runs transfer @i of @job on this worker; records its time and the job's first error. */
static int xfer_run(struct tpb_copy_job *job, size_t i, struct tpb_scratch *s)
{
	uint64_t t0 = tpu_now_ns();
	int r;

	s->why[0] = '\0';
	r = tpb_copy(job->channels[i], &job->xfers[i], s);

	job->ns[i] = tpu_now_ns() - t0;
	return r;
}

/* Lock held: one transfer of @job ended with @r; the last one completes the job. */
static void xfer_finished(struct tpb_copier *c, struct tpb_copy_job *job, size_t i, int r,
			  const char *why)
{
	if (r < 0 && job->status == 0) {
		job->status = r;
		snprintf(job->why, sizeof(job->why), "%s copy of %llu bytes failed: %s",
			 tpb_name(job->channels[i]), (unsigned long long)job->xfers[i].len,
			 why && *why ? why : strerror(-r));
	}
	if (++job->finished < job->n)
		return;
	tpb_cq_push(&c->cq, &job->node);
}

/*
 * Workers claim transfers, not jobs: every idle worker takes the next unclaimed transfer of the
 * oldest job, so the chunks of one large tensor are copied by all workers at once. A job leaves
 * the queue when its last transfer is claimed and completes when its last one finishes; after
 * an error its remaining transfers are skipped.
 */
static void *worker_main(void *arg)
{
	struct tpb_copier *c = arg;
	struct tpb_scratch s = { .bounce = malloc(BOUNCE_BYTES), .bounce_len = BOUNCE_BYTES };

	if (!s.bounce)
		s.bounce_len = 0;
	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct tpb_copy_job *job;
		size_t i;
		int r = 0;

		while (!c->stopping && tpu_list_empty(&c->todo))
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->stopping)
			break;
		job = tpu_list_first(&c->todo, struct tpb_copy_job, node);
		i = job->next++;
		if (job->next == job->n)
			tpu_list_remove(&job->node);
		else
			pthread_cond_signal(&c->cond); /* more of this job for another worker */
		if (job->status == 0) {
			pthread_mutex_unlock(&c->lock);
			r = xfer_run(job, i, &s);
			pthread_mutex_lock(&c->lock);
		}
		if (job->finished + 1 == job->n && job->maps_busy) {
			/* The last one: unmap what only this transfer needed before it completes. */
			job->maps_busy = false;
			pthread_mutex_unlock(&c->lock);
			tpb_cuda_maps_idle(job->maps, job->n_maps);
			pthread_mutex_lock(&c->lock);
		}
		xfer_finished(c, job, i, r, s.why);
	}
	pthread_mutex_unlock(&c->lock);
	tpb_cuda_scratch_done(&s);
	free(s.bounce);
	return NULL;
}

int tpb_copier_progress(struct tpb_copier *c)
{
	struct tpu_list *n;
	int done = 0;

	tpb_cq_ack(&c->cq);
	while ((n = tpb_cq_pop(&c->cq))) {
		struct tpb_copy_job *job = tpu_container_of(n, struct tpb_copy_job, node);

		c->busy--;
		job->done(job);
		done++;
	}
	return done;
}

int tpb_copier_event_fd(const struct tpb_copier *c)
{
	return tpb_cq_event_fd(&c->cq);
}

int tpb_copier_new(unsigned threads, struct tpb_copier **ret)
{
	struct tpb_copier *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	tpu_list_init(&c->todo);
	c->threads = calloc(threads, sizeof(*c->threads));
	if (tpb_cq_init(&c->cq) < 0 || !c->threads)
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

void tpb_copier_submit(struct tpb_copier *c, struct tpb_copy_job *job)
{
	job->status = 0;
	job->next = job->finished = 0;
	pthread_mutex_lock(&c->lock);
	c->busy++;
	if (job->n == 0) {
		/* Nothing to copy (zero-length segments only): complete on the loop, later. */
		tpb_cq_push(&c->cq, &job->node);
	} else {
		if (!job->maps_busy)
			tpb_cuda_maps_busy(job->maps, job->n_maps);
		job->maps_busy = true;
		tpu_list_insert_tail(&c->todo, &job->node);
		pthread_cond_signal(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
}

unsigned tpb_copier_busy(const struct tpb_copier *c)
{
	return c->busy;
}

void tpb_copier_free(struct tpb_copier *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < c->n_threads; i++)
		pthread_join(c->threads[i], NULL);
	/* Finished jobs complete normally, queued ones are canceled. */
	if (c->cq.efd >= 0)
		tpb_copier_progress(c);
	while (!tpu_list_empty(&c->todo)) {
		struct tpb_copy_job *job = tpu_list_first(&c->todo, struct tpb_copy_job, node);
		tpu_list_remove(&job->node);
		c->busy--;
		job->status = -ECANCELED;
		snprintf(job->why, sizeof(job->why), "daemon stopping");
		job->done(job);
	}
	tpb_cq_done(&c->cq);
	free(c->threads);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
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
