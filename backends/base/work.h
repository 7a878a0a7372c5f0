/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_work: the thread engine the backends share. A job is a list of segments (only their
 * lengths matter here) cut into chunks by one rule (tpb_work_chunk_size()); worker threads that
 * belong to the engine's user (the copy threads, a stripe's senders) claim chunks with a cursor
 * (oldest job first, optionally in turns), move the bytes, and report each chunk back. The
 * engine keeps per job the first error and why, the chunks in flight and the bytes done; a job
 * completes once nothing is left to claim (or it stopped) and no worker touches its memory, and
 * its done callback runs on the loop thread from tpb_work_progress(), through a completion queue
 * (cq.h) whose eventfd the owner polls. It moves no bytes and knows no channel or socket.
 */
#ifndef TPB_WORK_H
#define TPB_WORK_H

#include <stdbool.h>
#include <stdint.h>
#include "cq.h"
#include "tpu.h"

/* The default chunk: large enough that a chunk costs far more than its claim, small enough
 * that a tensor of a few MiB keeps every worker busy. */
#define TPB_WORK_CHUNK (1u << 20)
/* The smallest piece a job is cut into to spread it over every worker, unless the engine's
 * config says otherwise (see tpb_work_chunk_size()). */
#define TPB_WORK_CHUNK_MIN (256u << 10)

struct tpb_work;
struct tpb_work_job;

typedef void (*tpb_work_done_fn)(struct tpb_work_job *job);
/* The length of segment @seg of @job (called under the engine's lock: must not block). */
typedef uint64_t (*tpb_work_len_fn)(const struct tpb_work_job *job, size_t seg);

struct tpb_work_job {
	/* Set by the owner before tpb_work_submit(); borrowed by the engine until @done. */
	size_t n_segs;
	tpb_work_len_fn seg_len;
	tpb_work_done_fn done; /* runs once, from tpb_work_progress(), never inside a call */
	/* NULL, or runs once on the worker thread that ends the job's last chunk, before @done is
	 * queued (not for a job canceled before any chunk ran): release what only the chunks used. */
	tpb_work_done_fn last;
	/* 0, or no chunk is cut smaller than this (UINT64_MAX: one chunk per segment): a copy the
	 * GPU runs asynchronously gains nothing from being cut, and each cut costs a sync. */
	uint64_t chunk_min;

	/* Results, valid in @done. */
	int status;	/* 0, or the first -errno (-ECANCELED once canceled) */
	char why[160];	/* the first error's reason when @status < 0 */
	uint64_t bytes; /* bytes of the chunks that ended well */

	/* Private to the engine (its lock). */
	struct tpu_list node; /* in the claim queue, then in the completion queue */
	uint64_t chunk;	      /* bytes per chunk of this job */
	size_t next_seg;      /* the next chunk to claim starts at (next_seg, next_off) */
	uint64_t next_off;
	unsigned busy;	      /* chunks claimed and not finished */
	unsigned turn;	      /* chunks claimed in its turn at the queue head */
	bool canceled, queued_done, last_ran;
};

/* One claimed chunk: bytes [@off, @off + @len) of segment @seg of @job. */
struct tpb_work_chunk {
	struct tpb_work_job *job;
	size_t seg;
	uint64_t off;
	uint64_t len;
};

struct tpb_work_config {
	uint32_t chunk;	  /* the largest chunk (TPB_WORK_CHUNK when 0) */
	uint32_t spread_min; /* the smallest piece a job is cut into to spread it over the
				workers (TPB_WORK_CHUNK_MIN when 0; @chunk or more: never cut a
				job below a chunk) */
	unsigned workers; /* threads that claim: a job is cut to keep them all busy (1 when 0) */
	bool rows;	  /* a job at the queue head takes one row (a chunk per worker), then
			     goes to the tail; false: the oldest job until all is claimed */
	struct tpb_cq *cq; /* borrowed: finished jobs are pushed here (job->node) for the owner to
			      pop and deliver, with other news of its own; NULL: the engine's own
			      queue, delivered by tpb_work_progress() */
};

/*
 * tpb_work_chunk_size() - the one chunking rule: a job of @total bytes is cut into chunks of
 * @chunk bytes, except that a job smaller than one chunk per worker is cut into one piece per
 * worker, rounded up to 64 KiB and not below @spread_min (nor above @chunk), so that it too
 * moves on every worker at once. @workers 0 counts as 1.
 * Return: bytes per chunk (>= 1 when @chunk >= 1).
 */
uint64_t tpb_work_chunk_size(uint64_t total, unsigned workers, uint32_t chunk,
			     uint32_t spread_min);

/*
 * tpb_work_new() - an empty engine; its completions wait for tpb_work_progress().
 * @cfg: borrowed, copied.
 * @ret: returns owned engine, free with tpb_work_free().
 * Return: 0 or -errno (eventfd).
 */
int tpb_work_new(const struct tpb_work_config *cfg, struct tpb_work **ret);

/* Changes how many workers claim (a stripe's live connections): the chunk size of later jobs
 * and the length of a row. Borrows @w. */
void tpb_work_set_workers(struct tpb_work *w, unsigned workers);

/* The fd that turns readable when finished jobs wait (the engine's own queue): poll it on the
 * loop and call tpb_work_progress(). Return: the fd, borrowed (valid until tpb_work_free()). */
int tpb_work_event_fd(const struct tpb_work *w);

/*
 * tpb_work_submit() - reset @job's results and queue it for the workers (a job with nothing to
 * claim completes from the next tpb_work_progress()). Any thread.
 * Ownership: keeps @job until its done callback, which runs exactly once, later.
 */
void tpb_work_submit(struct tpb_work *w, struct tpb_work_job *job);

/*
 * tpb_work_claim() - wait until a chunk can be claimed, claim it into @ret and count it in flight
 * (tpb_work_finish() must follow). Worker threads. Borrows @w.
 * Return: 0, or -ESHUTDOWN once tpb_work_stop() was called.
 */
int tpb_work_claim(struct tpb_work *w, struct tpb_work_chunk *ret);

/*
 * tpb_work_try_claim() - tpb_work_claim() without waiting. Return: 0, -EAGAIN with nothing to
 * claim, or -ESHUTDOWN.
 */
int tpb_work_try_claim(struct tpb_work *w, struct tpb_work_chunk *ret);

/*
 * tpb_work_finish() - chunk @k ended with @status (0: its @len bytes are done; < 0: the job's
 * first error wins, @why says why, and no more of its chunks are handed out). The last chunk of
 * a job queues its completion. Any thread. Borrows @k and @why.
 */
void tpb_work_finish(struct tpb_work *w, const struct tpb_work_chunk *k, int status,
		     const char *why);

/* Whether @job stopped (an error or a cancel): a worker may skip the rest of its chunk's work.
 * Racy by nature; tpb_work_finish() still has to follow. */
bool tpb_work_stopped(struct tpb_work *w, const struct tpb_work_job *job);

/*
 * tpb_work_cancel() - hand out no more of @job's chunks; its done callback then runs with
 * -ECANCELED once no worker touches its memory (the chunks in flight have finished). No-op once
 * its completion is queued. Loop thread. Borrows @job.
 */
void tpb_work_cancel(struct tpb_work *w, struct tpb_work_job *job, const char *why);

/*
 * tpb_work_fail_all() - end every job still waiting to be claimed with @status and @why (a
 * job with chunks in flight completes when they finish). Borrows @why.
 */
void tpb_work_fail_all(struct tpb_work *w, int status, const char *why);

/*
 * tpb_work_progress() - run the done callbacks of finished jobs on the calling (loop) thread;
 * never blocks. A callback may submit again, but must not free @w. With a borrowed queue
 * (config @cq) it does nothing: the owner pops its queue.
 * Return: how many ran.
 */
int tpb_work_progress(struct tpb_work *w);

/* Jobs submitted and not yet delivered (with a borrowed queue: not yet pushed to it). */
unsigned tpb_work_busy(const struct tpb_work *w);

/* tpb_work_stop() - wake every waiting worker: claims now return -ESHUTDOWN (chunks in flight
 * still finish). Any thread. */
void tpb_work_stop(struct tpb_work *w);

/*
 * tpb_work_free() - complete what is left on the calling (loop) thread: finished jobs normally,
 * jobs still queued with -ECANCELED and @why (with a borrowed queue they are pushed there for
 * the owner to deliver). The workers must have stopped (no chunk in flight). Takes @w. Accepts
 * NULL.
 */
void tpb_work_free(struct tpb_work *w, const char *why);

#endif
