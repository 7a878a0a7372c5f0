/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copies of channel items between clients' memory and the daemon (chancopy.h). Responsible for
 * resolving a segment into memory of its own client only, and for running a copy job on the
 * copy threads with the references it needs. Not responsible for channels' state (chan.c).
 * Resolving runs on the loop thread; the copies on the copy threads; completions on the loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "buffer.h"
#include "chancopy.h"
#include "copier.h"
#include "core.h"
#include "session.h"

struct chan_copy_run {
	tpd_chan_copy_done_fn done;
	void *arg;
};

int tpd_chan_copy_resolve(struct tpd_session *s, const Tpw__V1__Segment *g, struct tpb_mem *ret,
			  char *why, size_t wl)
{
	struct tpb_buffer *b;
	void *ptr;
	int r;

	*ret = (struct tpb_mem){ .loc = TPB_LOC_LOCAL };
	if (g->loc_case == TPW__V1__SEGMENT__LOC_CMA_ADDR) {
		if (!tpd_session_cma(s)) {
			snprintf(why, wl, "cross-memory attach is not available for this client");
			return -EINVAL;
		}
		*ret = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .addr = g->cma_addr,
					 .proc = tpb_proc_ref(tpd_session_proc(s)) };
		return 0;
	}
	if (g->loc_case != TPW__V1__SEGMENT__LOC_SHM || !g->shm) {
		snprintf(why, wl, "neither a shared buffer nor an address");
		return -EINVAL;
	}
	r = tpd_session_buffer_range(s, g->shm, g->length, &b, &ptr, why, wl);
	if (r < 0)
		return r;
	ret->addr = (uint64_t)(uintptr_t)ptr;
	ret->buf = tpb_buffer_ref(b);
	return 0;
}

void tpd_chan_copy_put(struct tpb_mem *m)
{
	tpb_buffer_unref(m->buf);
	tpb_proc_unref(m->proc);
	m->buf = NULL;
	m->proc = NULL;
}

static void copy_on_done(struct tpb_copy_job *job)
{
	struct chan_copy_run *run = job->arg;

	run->done(run->arg, job->status, job->status < 0 ? job->why : NULL);
	free(run);
	tpb_copier_job_free(job);
}

/* The job keeps the buffer or process of @m (one side of a transfer) alive. */
static int job_hold(struct tpb_copy_job *job, const struct tpb_mem *m)
{
	if (m->buf)
		job->refs[job->n_refs++] = tpb_buffer_ref(m->buf);
	return tpb_copier_job_hold_proc(job, m->proc);
}

int tpd_chan_copy_start(struct tpd_daemon *d, const struct tpb_xfer *x, size_t n,
			tpd_chan_copy_done_fn done, void *arg)
{
	struct tpb_copy_job *job = tpb_copier_job_new(n, 2 * n);
	struct chan_copy_run *run = calloc(1, sizeof(*run));
	int r = -ENOMEM;

	if (!job || !run)
		goto fail;
	for (size_t i = 0; i < n; i++) {
		int channel = tpb_select(x[i].src.loc, x[i].dst.loc);

		r = channel;
		if (channel < 0)
			goto fail;
		r = job_hold(job, &x[i].src);
		if (r == 0)
			r = job_hold(job, &x[i].dst);
		if (r < 0)
			goto fail;
		job->xfers[job->n] = x[i];
		job->channels[job->n++] = channel;
		job->bytes += x[i].len;
	}
	run->done = done;
	run->arg = arg;
	job->done = copy_on_done;
	job->arg = run;
	tpb_copier_submit(tpd_daemon_copier(d), job);
	return 0;
fail:
	free(run);
	tpb_copier_job_free(job);
	return r;
}
