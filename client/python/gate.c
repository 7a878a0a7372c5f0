/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd gates: for objects whose library calls block in the calling thread (channels,
 * pipe sets), the count of threads inside a call, so that release or free waits for them to
 * leave instead of freeing what they use. Those calls wait in slices (tpy_gate_slice()) and
 * leave within one once tpy_gate_drain() began; and the lifetime of a library handle that one
 * object owns around such a gate (tpy_handle: channels, work queues). Not the waiting itself
 * (chan.c, wq.c, fan.c).
 */
#include <time.h>
#include "tpy.h"

void tpy_gate_init(struct tpy_gate *g)
{
	g->inflight = 0;
	g->closing = false;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->idle, NULL);
}

void tpy_gate_done(struct tpy_gate *g)
{
	pthread_mutex_destroy(&g->lock);
	pthread_cond_destroy(&g->idle);
}

int tpy_gate_enter(struct tpy_gate *g, const void *handle, const tpy_context *ctx,
		   const char *what)
{
	if (!handle || g->closing || !ctx->ctx || ctx->closed) {
		tpy_module_closed(what);
		return -1;
	}
	g->inflight++;
	return 0;
}

void tpy_gate_leave(struct tpy_gate *g)
{
	if (--g->inflight > 0)
		return;
	pthread_mutex_lock(&g->lock);
	pthread_cond_broadcast(&g->idle);
	pthread_mutex_unlock(&g->lock);
}

void tpy_gate_drain(struct tpy_gate *g)
{
	g->closing = true;
	while (g->inflight > 0) {
		struct timespec ts;

		/* inflight changes only with the GIL held, which this thread gives up here:
		 * re-read after each wake-up, bounded so a missed broadcast costs a slice. */
		Py_BEGIN_ALLOW_THREADS
		pthread_mutex_lock(&g->lock);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += TPY_SLICE_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&g->idle, &g->lock, &ts);
		pthread_mutex_unlock(&g->lock);
		Py_END_ALLOW_THREADS
	}
}

int64_t tpy_gate_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tpy_gate_slice(int64_t until)
{
	int64_t left;

	if (until < 0)
		return TPY_SLICE_MS;
	left = until - tpy_gate_now_ms();
	return left <= 0 ? 0 : left < TPY_SLICE_MS ? (int)left : TPY_SLICE_MS;
}

int tpy_gate_again(struct tpy_gate *g, int r, int slice, int64_t until)
{
	if (r != -ETIMEDOUT || slice == 0)
		return 0;
	if (until >= 0 && tpy_gate_now_ms() >= until)
		return 0;
	if (PyErr_CheckSignals() < 0)
		return -1;
	return g->closing ? 0 : 1;
}

/* ---- handles ------------------------------------------------------------------------------ */

static void handle_on_context_close(struct tpy_child *c)
{
	tpy_handle_release(TPY_CONTAINER(c, struct tpy_handle, child));
}

void tpy_handle_init(struct tpy_handle *h, tpy_context *ctx, void *lib, int (*release)(void *),
		     const char *what)
{
	h->ctx = (tpy_context *)Py_NewRef(ctx);
	h->lib = lib;
	h->release = release;
	h->what = what;
	tpy_gate_init(&h->gate);
	h->child.close = handle_on_context_close;
	tpy_module_link(ctx, &h->child);
}

int tpy_handle_enter(struct tpy_handle *h)
{
	return tpy_gate_enter(&h->gate, h->lib, h->ctx, h->what);
}

int tpy_handle_release(struct tpy_handle *h)
{
	void *lib;
	int r;

	tpy_module_unlink(&h->child);
	tpy_gate_drain(&h->gate);
	lib = h->lib;
	h->lib = NULL;
	if (!lib)
		return 0;
	Py_BEGIN_ALLOW_THREADS
	r = h->release(lib);
	Py_END_ALLOW_THREADS
	return r;
}

bool tpy_handle_released(const struct tpy_handle *h)
{
	return h->lib == NULL || h->gate.closing;
}

void tpy_handle_done(struct tpy_handle *h)
{
	tpy_handle_release(h);
	tpy_gate_done(&h->gate);
	Py_CLEAR(h->ctx);
}
