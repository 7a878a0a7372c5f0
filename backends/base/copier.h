/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_copier: the copy threads. Worker threads run the byte copies of a transfer (shm memcpy,
 * CMA) off the event loop, several workers on the chunks of one job at once: they claim the
 * chunks from the shared thread engine (work.h), which cuts the transfers, keeps the job's
 * first error and completes it through its completion queue, whose eventfd the daemon polls on
 * its loop; the done callback runs from tpb_copier_progress() there: it never touches the loop.
 * Jobs own everything a worker touches (transfer list, buffer references), so a session that
 * goes away mid-copy cannot pull memory from under a worker. The copier knows nothing about
 * pipes or sessions.
 */
#ifndef TPB_COPIER_H
#define TPB_COPIER_H

#include "buffer.h"
#include "cq.h"
#include "tpb.h"
#include "tpu.h"
#include "work.h"

struct tpb_copy_job;
typedef void (*tpb_copy_done_fn)(struct tpb_copy_job *job);

struct tpb_copy_job {
	struct tpb_work_job work; /* the engine's view: one segment per transfer */
	struct tpb_xfer *xfers; /* owned; cut into chunks by the engine (tpb_work_chunk_size()) */
	int *channels;		/* registry index per xfer, owned */
	uint64_t *ns;		/* time its chunks took per xfer, summed by the workers, owned */
	size_t n;
	struct tpb_buffer **refs; /* owned references, dropped when the job is freed */
	size_t n_refs;
	struct tpb_cuda_map **maps; /* owned references to CUDA mappings (2 * n_refs slots) */
	size_t n_maps;
	bool maps_busy; /* submitted: @maps are in use until its last transfer ends (cudamap.c) */
	struct tpb_proc *procs[2]; /* owned references to the client processes (writer, reader) */
	uint64_t bytes;
	int status;		/* set when it ends: 0 or the first -errno */
	char why[160];
	tpb_copy_done_fn done;	/* runs on the loop thread (tpb_copier_progress()) */
	void *arg;
	struct tpu_list wait_node; /* the copier's: while its clients' CUDA work is pending */
	bool abandoned; /* atomic: tpb_copier_abandon() */
};

struct tpb_copier;

/*
 * tpb_copier_new() - start @threads workers; their completions wait for tpb_copier_progress().
 * @ret: returns owned copier, free with tpb_copier_free().
 * Return: 0 or -errno.
 */
int tpb_copier_new(unsigned threads, struct tpb_copier **ret);

/*
 * tpb_copier_event_fd() - the fd that turns readable when finished jobs wait: poll it on the
 * loop and call tpb_copier_progress(). Borrows @c.
 * Return: the fd, borrowed (valid until tpb_copier_free(); never close it).
 */
int tpb_copier_event_fd(const struct tpb_copier *c);

/*
 * tpb_copier_progress() - run the done callbacks of the finished jobs, on the calling (loop)
 * thread; never blocks. Borrows @c; each callback gets its job back.
 * Return: how many ran.
 */
int tpb_copier_progress(struct tpb_copier *c);

/*
 * tpb_copier_submit() - queue @job. Takes @job: its done callback runs exactly once, later, from
 * tpb_copier_progress() (with status -ECANCELED if the copier is freed first); the callback must
 * free it with tpb_copier_job_free(). A job whose transfers wait for a client's CUDA event (the
 * work the client queued on its stream first) goes to the copier's waiter thread, which polls
 * the events of every such job and hands each to the copy threads once its events completed
 * (or its client exited): a stream that never completes holds no copy thread.
 */
void tpb_copier_submit(struct tpb_copier *c, struct tpb_copy_job *job);

/*
 * tpb_copier_abandon() - nobody wants @job's result any more (an end of its pipe left): it
 * stops waiting for its clients' CUDA work, and its chunks not yet started fail at once with
 * -ECANCELED; its done callback still runs exactly once. Loop thread. Borrows @c and @job.
 */
void tpb_copier_abandon(struct tpb_copier *c, struct tpb_copy_job *job);

/* Jobs waiting for their clients' CUDA work, queued or running. */
unsigned tpb_copier_busy(const struct tpb_copier *c);

/* Stops the workers (waiting for running copies), runs the done callbacks of finished jobs and
 * completes queued ones with -ECANCELED, on the calling thread. Takes @c. Accepts NULL. */
void tpb_copier_free(struct tpb_copier *c);

/*
 * tpb_copier_engine() - @c as the engine of the same-host channels' contexts (struct
 * tpb_engine, tpb_ctx_new()): each op submitted becomes one job of @c, whose workers run the
 * op's channel kernel on its transfers; the job's completion, on the loop thread, calls
 * tpb_sync_engine_done(), and the context delivers it from its next tpb_progress().
 * Ownership: the engine borrows @c, which must outlive every context made with it; a job still
 * queued when @c is freed completes with -ECANCELED.
 */
void tpb_copier_engine(struct tpb_copier *c, struct tpb_engine *ret);

/* Allocates a job for @n transfers, @n_refs buffer references and 2 * @n_refs CUDA mapping
 * references. Return: job or NULL. */
struct tpb_copy_job *tpb_copier_job_new(size_t n, size_t n_refs);
/*
 * tpb_copier_job_hold_proc() - make @job keep a reference to @p (NULL: nothing) until it is freed;
 * a job touches at most two processes (its writer's and its reader's).
 * Return: 0, or -ENOBUFS for a third process.
 */
int tpb_copier_job_hold_proc(struct tpb_copy_job *job, struct tpb_proc *p);

/* Drops the job's buffer references and frees it. Accepts NULL. */
void tpb_copier_job_free(struct tpb_copy_job *job);

#endif
