/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The write path of the library's channels (chan_int.h): tp_chan_write(), its items inline, by
 * reference (a range of a shared buffer, or the caller's memory by CMA) or staged, the staging
 * buffers lent to the channel (ChanOp.lend) and given back (ChanReply.released). Leaves the
 * handles and the requests' sending and answers to chan.c, reads to chanread.c.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <syslog.h>

#include "chan_int.h"
#include "internal.h"
#include "reduce.h"

/* @g: [@p, @p + @len) by reference: a range of one of the context's shared buffers, else (with
 * @cma) the caller's memory by CMA. Return: 0, or -EOPNOTSUPP (neither). */
int tpc_chan_ref(struct tp_context *ctx, const void *p, size_t len, bool cma,
		 Tpw__V1__Segment *g, Tpw__V1__ShmRef *ref)
{
	struct tpc_buf *b;

	tpw__v1__segment__init(g);
	tpw__v1__shm_ref__init(ref);
	g->length = len;
	pthread_mutex_lock(&ctx->lock);
	b = tpc_buffer_lookup_locked(ctx, p, len);
	if (b && !b->failed) {
		ref->buf_id = b->id;
		ref->gen = b->gen;
		ref->offset = (uint64_t)((uintptr_t)p - (uintptr_t)b->addr);
		g->loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g->shm = ref;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM)
		return 0;
	if (!cma || !__atomic_load_n(&ctx->cma_ok, __ATOMIC_RELAXED))
		return -EOPNOTSUPP;
	g->loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g->cma_addr = (uint64_t)(uintptr_t)p;
	return 0;
}

/* The arrays of a write whose items go by segment. */
struct chan_segs {
	Tpw__V1__Segment *seg;
	Tpw__V1__Segment **segp;
	Tpw__V1__ShmRef *ref;
	struct iovec *iov; /* the inline items */
	size_t n_iov;
	struct tpc_buf *stage; /* the staging buffer of items copied by the library, or NULL */
	uint64_t staged;       /* bytes of it the items take */
	int timeout_ms;	       /* the write's: the most it may wait for a lent buffer back */
	uint64_t waited_ns;    /* what it waited */
	bool stalled;	       /* and nothing came back */
};

static void chan_segs_free(struct tp_chan *ch, struct chan_segs *w, bool reuse)
{
	if (w->stage && w->stage->chan) /* the handle's own: back to it, never to the pool */
		tpc_chan_own_put(ch, w->stage, reuse);
	else
		tpc_buffer_stage_put(ch->ctx, w->stage, reuse);
	free(w->seg);
	free(w->segp);
	free(w->ref);
	free(w->iov);
}

/* Did the daemon refuse staging buffer @b (NULL: none) of @ctx? */
bool tpc_chan_stage_refused(struct tp_context *ctx, const struct tpc_buf *b)
{
	bool failed;

	if (!b)
		return false;
	pthread_mutex_lock(&ctx->lock);
	failed = b->failed;
	pthread_mutex_unlock(&ctx->lock);
	return failed;
}

/* Does item @it (not in a shared buffer) go through a staging buffer? */
static bool chan_staged(const struct iovec *it)
{
	return it->iov_len > TPW_CHAN_SHM_ITEM;
}

/* Staged items start at multiples of 64 bytes. */
#define CHAN_STAGE_ALIGN(x) (((uint64_t)(x) + 63) & ~(uint64_t)63)

/* May @ch stage @total bytes in a buffer of its own and lend it: a free one, one given back,
 * or room for a new one (CHAN_LENT_MAX, CHAN_LENT_BYTES)? ctx->lock held. */
static bool chan_lend_room_for(const struct tp_chan *ch, uint64_t total)
{
	return ch->map && tpc_chan_lend_room(ch) && ch->lent_bytes <= CHAN_LENT_BYTES &&
	       tpc_buffer_stage_class(total) <= CHAN_LENT_BYTES - ch->lent_bytes;
}

/*
 * Whether @ch may lend a buffer for @total staged bytes (chan_lend_room_for()), after waiting
 * for one of its lent buffers to come back where it has lent all it may: otherwise the batch
 * goes through the context's pool, which the daemon copies in (a third copy of every byte, the
 * write waiting for it), so a writer ahead of its readers by CHAN_LENT_BYTES would pay that for
 * a share of its items (a 16 MiB item in 12, in a row of bench_chan) and keep the daemon busy
 * besides. The wait lasts about what that copy would take (CHAN_LEND_WAIT_MS_PER_MIB, within
 * CHAN_LEND_WAIT_MIN_MS and CHAN_LEND_WAIT_MAX_MS), never longer than @w->timeout_ms (0: no
 * wait), never on the io thread (it takes the notices that give buffers back), and not again
 * once a wait of the handle ended with nothing back until something comes back (@ch->
 * lend_stalled: a channel nobody reads costs one wait, not one a write). ctx->lock held (the
 * wait drops it).
 */
static bool chan_lend_wait_locked(struct tp_chan *ch, uint64_t total, struct chan_segs *w)
{
	struct tp_context *ctx = ch->ctx;
	uint64_t ms = (total >> 20) * CHAN_LEND_WAIT_MS_PER_MIB, t0;
	struct timespec ts;
	bool lend = chan_lend_room_for(ch, total);

	if (lend || !ch->map || !ch->n_lent || ch->lend_stalled || w->timeout_ms == 0 ||
	    ctx->dead || tpc_context_on_io_thread(ctx))
		return lend;
	ms = TPU_MIN(TPU_MAX(ms, CHAN_LEND_WAIT_MIN_MS), CHAN_LEND_WAIT_MAX_MS);
	if (w->timeout_ms > 0)
		ms = TPU_MIN(ms, (uint64_t)w->timeout_ms);
	t0 = tpu_now_ns();
	tpc_deadline(&ts, (int)ms);
	ctx->chan_lend_waiters++;
	while (!(lend = chan_lend_room_for(ch, total)) && !ctx->dead &&
	       pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) != ETIMEDOUT)
		;
	ctx->chan_lend_waiters--;
	lend = chan_lend_room_for(ch, total);
	ch->lend_stalled = w->stalled = !lend;
	w->waited_ns = tpu_now_ns() - t0;
	return lend;
}

/*
 * Copies the items of @items above TPW_CHAN_SHM_ITEM that are not in a shared buffer (their
 * segments still inline, @w->seg) into one staging buffer of the context and names them there:
 * a memcpy here and one in the daemon cost less than a CMA access each (backends/cma runs every
 * access in a task of its own). Without a staging buffer they stay as they are.
 */
static void chan_write_stage(struct tp_chan *ch, const struct iovec *items, size_t n,
			     struct chan_segs *w)
{
	struct tp_context *ctx = ch->ctx;
	uint64_t total = 0, off = 0, ahead;
	bool lend, far;

	for (size_t i = 0; i < n; i++)
		if (w->seg[i].loc_case != TPW__V1__SEGMENT__LOC_SHM && chan_staged(&items[i]))
			total += CHAN_STAGE_ALIGN(items[i].iov_len);
	if (!total || total > SIZE_MAX)
		return;
	/* A channel whose readers map lent buffers: one of the handle's own, which nothing but
	 * this channel's items ever touches (chanmap.c); else, or without one (the daemon's
	 * buffer limits, the io thread), the context's pool, and then it is never lent. */
	pthread_mutex_lock(&ctx->lock);
	lend = chan_lend_wait_locked(ch, total, w);
	ahead = ch->lent_bytes;
	pthread_mutex_unlock(&ctx->lock);
	if (w->stalled)
		tpc_context_log(ctx, LOG_DEBUG,
				"channel '%s': no lent buffer came back within %llu ms: its writes "
				"go through the daemon's copy until one does", ch->name,
				(unsigned long long)(w->waited_ns / 1000000u));
	if (lend)
		w->stage = tpc_chan_own_get(ch, total);
	/* Readers behind by a quarter of the cache or more find a lent batch in memory, not in a
	 * cache, whatever the copy does: its stores need not read every line first. Not the
	 * pool's buffers (below), which the daemon copies at once. */
	far = w->stage && ahead + total >= tpc_cache_bytes() / 4;
	pthread_mutex_lock(&ctx->send_lock);
	if (!w->stage && tpc_buffer_stage_get(ctx, (size_t)total, &w->stage) < 0)
		w->stage = NULL;
	pthread_mutex_unlock(&ctx->send_lock);
	w->staged = total;
	for (size_t i = 0; w->stage && i < n; i++) {
		Tpw__V1__Segment *g = &w->seg[i];

		if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM || !chan_staged(&items[i]))
			continue;
		/* its readers copy it out on their cores, later (tpc_copy_far()); from memory
		 * when they are far behind (@far) */
		if (far && items[i].iov_len >= CHAN_STREAM_ITEM_MIN)
			tpc_copy_stream((uint8_t *)w->stage->addr + off, items[i].iov_base,
					items[i].iov_len);
		else
			tpc_copy_far((uint8_t *)w->stage->addr + off, items[i].iov_base,
				     items[i].iov_len);
		tpw__v1__segment__init(g);
		tpw__v1__shm_ref__init(&w->ref[i]);
		g->length = items[i].iov_len;
		g->loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g->shm = &w->ref[i];
		w->ref[i].buf_id = w->stage->id;
		w->ref[i].gen = w->stage->gen;
		w->ref[i].offset = off;
		off += CHAN_STAGE_ALIGN(items[i].iov_len);
	}
}

/* Fills @op's segments for @items: by reference where they can be, those above
 * TPW_CHAN_SHM_ITEM in a shared buffer (the caller's, or a staging one they are copied into)
 * and, without a staging buffer, those above TPW_CHAN_INLINE_ITEM in private memory (CMA); the
 * others inline (their bytes in @w->iov). Return: 0 or -errno (message set). */
static int chan_write_segs(struct tp_chan *ch, const struct iovec *items, size_t n,
			   bool stage, Tpw__V1__ChanOp *op, struct chan_segs *w)
{
	uint64_t off = 0;

	w->seg = calloc(n, sizeof(*w->seg));
	w->segp = calloc(n, sizeof(*w->segp));
	w->ref = calloc(n, sizeof(*w->ref));
	w->iov = calloc(n, sizeof(*w->iov));
	if (!w->seg || !w->segp || !w->ref || !w->iov)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) { /* the items in the caller's shared buffers first */
		w->segp[i] = &w->seg[i];
		if (items[i].iov_len > TPW_CHAN_SHM_ITEM)
			tpc_chan_ref(ch->ctx, items[i].iov_base, items[i].iov_len, false,
				     &w->seg[i], &w->ref[i]);
	}
	if (stage)
		chan_write_stage(ch, items, n, w);
	for (size_t i = 0; i < n; i++) {
		Tpw__V1__Segment *g = &w->seg[i];

		if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM ||
		    (items[i].iov_len > TPW_CHAN_INLINE_ITEM &&
		     tpc_chan_ref(ch->ctx, items[i].iov_base, items[i].iov_len, true, g,
				  &w->ref[i]) == 0))
			continue;
		tpw__v1__segment__init(g);
		g->length = items[i].iov_len;
		g->loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
		g->inline_off = off;
		off += items[i].iov_len;
		if (off > ch->ctx->lim.inline_max)
			return tpc_error(-EMSGSIZE, "items of more than %u bytes inline (the "
					 "daemon's inline limit): without CMA, a large item must "
					 "be in a shared buffer (tp_buffer_alloc())",
					 ch->ctx->lim.inline_max);
		w->iov[w->n_iov++] = items[i];
	}
	op->n_segments = n;
	op->segments = w->segp;
	return 0;
}

/* May @ch lend staging buffer @b (NULL: none), @staged bytes of it used, to its channel? Not
 * one of more than twice that: the daemon charges the owner's quota the whole buffer. Buffer
 * ids are never reused in a context (tp_context.next_buf_id), so a released id is this one. */
static bool chan_may_lend(struct tp_chan *ch, const struct tpc_buf *b, uint64_t staged)
{
	bool ok;

	if (!b || b->size / 2 > staged || (ch->map && !b->chan))
		return false; /* (a pool buffer goes to no reader: never lent where they map) */
	pthread_mutex_lock(&ch->ctx->lock);
	ok = tpc_chan_lend_room(ch) && ch->lent_bytes + b->size <= CHAN_LENT_BYTES;
	pthread_mutex_unlock(&ch->ctx->lock);
	return ok;
}

/* After a write's answer @cr: its staging buffer @w->stage is the channel's if the daemon kept
 * it (lent; filed in @ch->lent by the reply handler, room permitting), and the buffers the
 * daemon gave back go back to @ch or into the staging pool. */
static void chan_lent_update(struct tp_chan *ch, struct chan_req *cr, struct chan_segs *w)
{
	struct tp_context *ctx = ch->ctx;
	struct tpc_buf *back[CHAN_LENT_MAX], *drop = NULL;
	unsigned n_back = 0;

	pthread_mutex_lock(&ctx->lock);
	if (cr->lent && !cr->lend_kept) /* another thread's lent buffers took the room: never */
		drop = w->stage;	  /* reused */
	if (cr->lent)
		w->stage = NULL;
	if (cr->n_released) {
		ch->lend_stalled = false;
		if (ctx->chan_lend_waiters) /* another thread's write may wait for one */
			pthread_cond_broadcast(&ctx->cond);
	}
	for (size_t i = 0; i < cr->n_released; i++) {
		for (unsigned k = 0; k < ch->n_lent; k++) {
			if (ch->lent[k]->id != cr->released[i])
				continue; /* not ours: ignored */
			back[n_back++] = ch->lent[k];
			ch->lent_bytes -= ch->lent[k]->size;
			ch->lent[k] = ch->lent[--ch->n_lent];
			break;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	free(cr->released);
	cr->released = NULL;
	cr->n_released = 0;
	for (unsigned k = 0; k < n_back; k++) {
		if (back[k]->chan)
			tpc_chan_own_put(ch, back[k], true); /* this channel's again, nobody else's */
		else
			tpc_buffer_stage_put(ctx, back[k], true);
	}
	tpc_buffer_stage_put(ctx, drop, false);
}

/* At release: the buffers still lent are never reused (the daemon may still hold items in
 * them, and keeps its mapping until they leave); they are unregistered. */
void tpc_chan_lent_drop(struct tp_chan *ch)
{
	for (unsigned k = 0; k < ch->n_lent; k++)
		tpc_buffer_stage_put(ch->ctx, ch->lent[k], false);
	ch->n_lent = 0;
	ch->lent_bytes = 0;
}

/* Does the frame of WRITE @op with @n_tail inline pieces @tail fit the daemon's frame limit?
 * (Message descriptors can make it larger than the inline items alone.) Return: 0 or
 * -EMSGSIZE (message set). */
static int chan_frame_check(const struct tp_chan *ch, Tpw__V1__ChanOp *op,
			    const struct iovec *tail, size_t n_tail)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	size_t len = 16; /* room for the req_id, still 0 here */

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	for (size_t i = 0; i < n_tail; i++)
		len += tail[i].iov_len;
	len += tpw_frame_size(&m.base);
	if (len > ch->ctx->lim.frame_max)
		return tpc_error(-EMSGSIZE, "a write's frame of %zu bytes exceeds the daemon's "
				 "limit of %u (tpipd --frame-max)", len, ch->ctx->lim.frame_max);
	return 0;
}

TP_EXPORT int tp_chan_write(struct tp_chan *ch, const struct iovec *items, size_t n,
			    int timeout_ms)
{
	return tpc_chan_write_items(ch, items, n, NULL, timeout_ms);
}

int tpc_chan_write_items(struct tp_chan *ch, const struct iovec *items, size_t n,
			 Tpw__V1__Descriptor **msgs, int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	struct chan_segs w = { 0 };
	_cleanup_free_ uint64_t *lens = NULL;
	uint64_t total = 0;
	bool refs = false;
	int r;

	if (!ch || !items || n == 0)
		return tpc_error(-EINVAL, "tp_chan_write: no item");
	if (n > ch->ctx->lim.segments_max)
		return tpc_error(-EMSGSIZE, "a batch of %zu items exceeds the daemon's %u", n,
				 ch->ctx->lim.segments_max);
	lens = calloc(n, sizeof(*lens));
	if (!lens)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if ((items[i].iov_len == 0 && !msgs) || (!items[i].iov_base))
			return tpc_error(-EINVAL, "item %zu is empty", i);
		lens[i] = items[i].iov_len;
		total += lens[i];
		refs |= lens[i] > TPW_CHAN_SHM_ITEM;
	}
	refs &= tpc_chan_fast(ch);
	if (!refs && total > ch->ctx->lim.inline_max)
		return tpc_error(-EMSGSIZE, "a batch of more than %u bytes (the daemon's inline "
				 "limit)", ch->ctx->lim.inline_max);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = ch->id;
	op.n_lengths = n;
	op.lengths = lens;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	op.n_msgs = msgs ? n : 0;
	op.msgs = msgs;
	w.timeout_ms = timeout_ms;
	r = refs ? chan_write_segs(ch, items, n, true, &op, &w) : 0;
	if (timeout_ms > 0 && w.waited_ns) { /* the wait for a lent buffer back is the write's */
		uint64_t left = w.waited_ns / 1000000u;

		timeout_ms = left >= (uint64_t)timeout_ms ? 1 : timeout_ms - (int)left;
		op.timeout_ms = (uint32_t)timeout_ms;
	}
	op.lend = r == 0 && refs && chan_may_lend(ch, w.stage, w.staged);
	cr.write = true;
	cr.wch = ch;
	cr.lend_buf = op.lend ? w.stage : NULL;
	if (r == 0 && msgs)
		r = chan_frame_check(ch, &op, refs ? w.iov : items, refs ? w.n_iov : n);
	if (r == 0)
		r = tpc_chan_call(ch->ctx, &op, refs ? w.iov : items, refs ? w.n_iov : n,
				  timeout_ms, &cr);
	if (cr.req.done)
		chan_lent_update(ch, &cr, &w);
	if (r == -ENOENT && tpc_chan_stage_refused(ch->ctx, w.stage)) {
		/* The daemon refused the staging buffer (its quota): nothing was written; again
		 * without it. */
		chan_segs_free(ch, &w, false);
		w = (struct chan_segs){ 0 };
		cr = (struct chan_req){ .write = true, .wch = ch };
		r = chan_write_segs(ch, items, n, false, &op, &w);
		op.lend = false;
		if (r == 0)
			r = tpc_chan_call(ch->ctx, &op, w.iov, w.n_iov, timeout_ms, &cr);
		if (cr.req.done)
			chan_lent_update(ch, &cr, &w);
	}
	/* A write given up may still be copied from its staging buffer: never reuse that one. */
	chan_segs_free(ch, &w, !(r == -ETIMEDOUT && !cr.req.done));
	if (r == -ETIMEDOUT && !cr.req.done)
		return tpc_error(-EINPROGRESS, "channel '%s': %s: the batch may be written yet",
				 ch->name, cr.req.msg);
	if (r < 0 && cr.req.msg[0])
		return tpc_error(r, "channel '%s': %s", ch->name, cr.req.msg);
	return r;
}
