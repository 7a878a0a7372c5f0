/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The read paths of the library's channels (chan_int.h): tp_chan_read(), tp_chan_read_into()
 * and tp_chan_read_many(), an item held by the daemon read into an allocation (ChanOp.take_held),
 * a staged item copied out, and the late reads whose items the next read returns. Leaves the
 * handles and the requests' sending and answers to chan.c, the segments and staging buffers to
 * chanwrite.c.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "chan_int.h"
#include "internal.h"

/* Takes the oldest late read of @ch if it holds its item; lock held. Return: owned, or NULL. */
static struct chan_req *late_take_locked(struct tp_chan *ch)
{
	struct chan_req *cr;

	if (!tpc_chan_late_ready_locked(ch))
		return NULL;
	cr = tpu_list_first(&ch->late, struct chan_req, node);
	tpu_list_remove(&cr->node);
	return cr;
}

/* Sends READ @op of @ch for @cr (owned; its destination set) and waits for it. Return: owned
 * chan_req to answer the call with (@cr, or an older late read's with its items), or NULL
 * (-ENOMEM or a send error in *@ret_err). */
/* Makes the answered item of @cr, now at @from, the read's own (lock held): copied to the
 * read's allocation or, when that is its caller's (@into), to one of its own (the caller gets
 * another item there). Without memory the item is lost. */
static void read_keep_locked(struct chan_req *cr, const void *from)
{
	void *to = cr->dst;

	if (cr->into && !(to = malloc(cr->items[0].iov_len ? cr->items[0].iov_len : 1))) {
		cr->n = 0;
		return;
	}
	memcpy(to, from, cr->items[0].iov_len);
	cr->items[0].iov_base = to;
	cr->dst = to;
	cr->into = false;
}

/* Makes the items of @cr's answer that its caller's memory holds the read's own (lock held):
 * the one inline item put there (read_keep_locked()), or a packed read's items, each copied to
 * memory of its own; the caller's memory is no longer the read's. Without memory the items
 * not copied yet are lost. */
static void read_keep_caller_locked(struct chan_req *cr)
{
	if (!cr->into || cr->next >= cr->n || cr->items[cr->next].iov_base != cr->dst)
		return;
	if (!cr->pack || cr->n - cr->next == 1)
		return read_keep_locked(cr, cr->dst);
	for (size_t i = cr->next; i < cr->n; i++) {
		size_t len = cr->items[i].iov_len;
		void *c = malloc(len ? len : 1);

		if (!c) {
			cr->n = i; /* the others stay in the caller's memory: never freed */
			break;
		}
		memcpy(c, cr->items[i].iov_base, len);
		cr->items[i].iov_base = c;
	}
	cr->dst = NULL; /* (nothing of this library's to free: tpc_chan_req_free()) */
	cr->dst_len = 0;
	cr->into = false;
	cr->pack = false;
}

/*
 * An answered read's item out of its staging buffer (lock held), kept by read_keep_locked().
 * Return: the staging buffer, to give back once the lock is dropped, or NULL.
 */
static struct tpc_buf *read_unstage_locked(struct chan_req *cr)
{
	struct tpc_buf *b = cr->stage;

	if (!b || !cr->req.done)
		return NULL;
	cr->stage = NULL;
	if (cr->n && cr->items[0].iov_base == b->addr)
		read_keep_locked(cr, b->addr);
	return b;
}

/* read_unstage_locked() for the read a call returns (no lock held). */
static void read_unstage(struct tp_context *ctx, struct chan_req *cr)
{
	struct tpc_buf *b;

	if (!cr || !cr->stage)
		return;
	if (cr->n && cr->items[0].iov_base == cr->stage->addr) { /* unlocked: the caller's own */
		memcpy(cr->dst, cr->stage->addr, cr->items[0].iov_len);
		cr->items[0].iov_base = cr->dst;
	}
	pthread_mutex_lock(&ctx->lock);
	b = read_unstage_locked(cr);
	pthread_mutex_unlock(&ctx->lock);
	tpc_buffer_stage_put(ctx, b, true);
}

static struct chan_req *chan_read_call(struct tp_chan *ch, Tpw__V1__ChanOp *op,
				       struct chan_req *cr, int timeout_ms, int *ret_err)
{
	struct tp_context *ctx = ch->ctx;
	struct tpc_buf *stage = NULL;
	struct chan_req *got;
	int r;

	*ret_err = tpc_chan_send(ctx, op, NULL, 0, cr);
	if (*ret_err < 0) {
		if (!cr->into)
			free(cr->dst); /* never sent: nobody copies into it */
		tpc_buffer_stage_put(ctx, cr->stage, true);
		free(cr);
		return NULL;
	}
	pthread_mutex_lock(&ctx->lock);
	r = tpc_chan_wait_locked(ctx, cr, timeout_ms, ch);
	if (cr->req.done && tpc_chan_late_ready_locked(ch)) {
		stage = read_unstage_locked(cr); /* not returned: its items must be its own */
		read_keep_caller_locked(cr); /* inline items put in the caller's memory */
	}
	if (!cr->req.done || (cr->n && tpc_chan_late_ready_locked(ch))) {
		/* Gave up, or an older read's item came: this read's item waits on the handle. */
		cr->ch = ch;
		tpu_list_insert_tail(&ch->late, &cr->node);
		got = r == -ETIMEDOUT ? NULL : late_take_locked(ch);
		if (!got) { /* gave up: answer with a copy of the status and message */
			got = calloc(1, sizeof(*got));
			if (got) {
				got->req = cr->req;
				got->req.done = false;
				got->req.status = -ETIMEDOUT;
			}
		}
	} else if (tpc_chan_late_ready_locked(ch)) { /* failed, but an older read's item came */
		tpc_chan_req_free(cr);
		got = late_take_locked(ch);
	} else {
		got = cr;
	}
	pthread_mutex_unlock(&ctx->lock);
	tpc_buffer_stage_put(ctx, stage, true);
	if (!got)
		*ret_err = tpc_error(-ENOMEM, "out of memory");
	return got;
}

/*
 * @g: where the daemon copies a read's item of up to @len bytes bound for @dst: @dst itself when
 * it lies in one of the context's shared buffers, else a staging buffer (*@ret_stage; the item
 * is copied on to @dst here), else @dst by CMA. Return: 0, or -EOPNOTSUPP (none of them).
 */
static int read_dst(struct tp_context *ctx, void *dst, size_t len, bool stage,
		    Tpw__V1__Segment *g, Tpw__V1__ShmRef *ref, struct tpc_buf **ret_stage)
{
	struct tpc_buf *b = NULL;

	*ret_stage = NULL;
	if (tpc_chan_ref(ctx, dst, len, false, g, ref) == 0)
		return 0;
	pthread_mutex_lock(&ctx->send_lock);
	if (!stage || tpc_buffer_stage_get(ctx, len, &b) < 0)
		b = NULL;
	pthread_mutex_unlock(&ctx->send_lock);
	if (!b)
		return tpc_chan_ref(ctx, dst, len, true, g, ref);
	g->length = len;
	g->loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g->shm = ref;
	ref->buf_id = b->id;
	ref->gen = b->gen;
	ref->offset = 0;
	*ret_stage = b;
	return 0;
}

/* A new read request of @ch with destination @dst (@len bytes; @into: the caller's memory) or
 * none. Return: owned, or NULL. */
static struct chan_req *read_req_new(void *dst, size_t len, bool into)
{
	struct chan_req *cr = calloc(1, sizeof(*cr));

	if (cr) {
		cr->dst = dst;
		cr->dst_len = len;
		cr->into = into;
	}
	return cr;
}

/* The READ of @ch that takes the item the daemon holds for it (@len bytes) into a new
 * allocation, by CMA. Return: as chan_read_call(). */
static struct chan_req *read_held_call(struct tp_chan *ch, uint64_t len, bool stage,
				       int timeout_ms, int *ret_err)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	uint64_t keys[CHAN_MAP_MAX];
	void *buf = len <= SIZE_MAX ? malloc(len) : NULL;
	struct chan_req *cr = buf ? read_req_new(buf, len, false) : NULL;

	if (!cr) {
		free(buf);
		*ret_err = tpc_error(-ENOMEM, "out of memory for an item of %llu bytes",
				     (unsigned long long)len);
		return NULL;
	}
	/* A private allocation: through a staging buffer, else by CMA (the daemon held the item
	 * because this context had CMA; it answers with an error if that changed). */
	if (read_dst(ch->ctx, buf, len, stage, &g, &ref, &cr->stage) < 0) {
		g.length = len;
		g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
		g.cma_addr = (uint64_t)(uintptr_t)buf;
	}
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	op.take_held = true;
	op.n_segments = 1;
	op.segments = (Tpw__V1__Segment *[]){ &g };
	tpc_chan_map_op(ch, &op, keys, cr);
	cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	if (cr && cr->req.status == -ENOENT && tpc_chan_stage_refused(ch->ctx, cr->stage))
		cr->req.status = -EAGAIN; /* the daemon refused the staging buffer: again without */
	read_unstage(ch->ctx, cr);
	return cr;
}

/*
 * One read of up to @max items of @ch (@into: the caller's allocation for one item, or for
 * @max > 1 for items packed into it, ChanOp.pack, where @ch->pack; or NULL):
 * items a late read holds first, else one READ (and, for an item the daemon holds, the READ
 * that takes it). Return: owned chan_req whose items from @next on answer the call (status 0),
 * or NULL with *@ret_err (message set).
 */
static struct chan_req *chan_read_one_wire(struct tp_chan *ch, size_t max,
					   const struct iovec *into, bool stage, int timeout_ms,
					   int *ret_err)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g, *gp[1] = { &g };
	uint64_t keys[CHAN_MAP_MAX];
	Tpw__V1__ShmRef ref;
	struct tpc_buf *buf = NULL;
	bool held_stage = true;
	struct chan_req *cr;

	pthread_mutex_lock(&ch->ctx->lock);
	cr = late_take_locked(ch); /* an item that came after its reader gave up goes first */
	pthread_mutex_unlock(&ch->ctx->lock);
	if (cr)
		return cr;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	if (tpc_chan_fast(ch)) {
		op.max_items = max > 1 ? (uint32_t)TPU_MIN(max, ch->ctx->lim.segments_max) : 0;
		op.inline_only = !__atomic_load_n(&ch->ctx->cma_ok, __ATOMIC_RELAXED);
		op.pack = into && op.max_items > 1; /* only where ch->pack (the callers') */
	}
	if (into) {
		if (read_dst(ch->ctx, into->iov_base, into->iov_len, stage, &g, &ref, &buf) < 0) {
			*ret_err = tpc_error(-EOPNOTSUPP, "tp_chan_read_into: the allocation is "
					     "not in a shared buffer, and neither a staging buffer "
					     "nor CMA is available");
			return NULL;
		}
		op.n_segments = 1;
		op.segments = gp;
		/* the caller's own shared buffer: the daemon may copy several large items there */
		op.pack_copied = op.pack && !buf && g.loc_case == TPW__V1__SEGMENT__LOC_SHM;
	}
	cr = into ? read_req_new(into->iov_base, into->iov_len, true) : read_req_new(NULL, 0, 0);
	if (!cr) {
		tpc_buffer_stage_put(ch->ctx, buf, true);
		*ret_err = tpc_error(-ENOMEM, "out of memory");
		return NULL;
	}
	cr->stage = buf;
	cr->pack = op.pack;
	cr->pack_copied = op.pack_copied;
	cr->pack_max = op.max_items;
	tpc_chan_map_op(ch, &op, keys, cr);
	op.pack_mapped = op.pack && op.map_ok; /* several items of one writer's buffer */
	cr->pack_mapped = op.pack_mapped;
	cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	if (into && stage && cr && cr->req.status == -ENOENT &&
	    tpc_chan_stage_refused(ch->ctx, cr->stage)) { /* refused before any item was taken */
		read_unstage(ch->ctx, cr);
		tpc_chan_req_free(cr);
		return chan_read_one_wire(ch, max, into, false, timeout_ms, ret_err);
	}
	read_unstage(ch->ctx, cr);
	/* An item held for the handle: take it into a new allocation. Another thread reading the
	 * handle may take it first (-ENOENT): then read again. */
	for (unsigned tries = 0; cr && cr->req.status == 0 && !cr->n && cr->held_len && !into;) {
		uint64_t len = cr->held_len;

		tpc_chan_req_free(cr);
		cr = read_held_call(ch, len, held_stage, timeout_ms, ret_err);
		if (cr && cr->req.status == -EAGAIN)
			held_stage = false; /* its staging buffer was refused: the item is still held */
		else if (!cr || cr->req.status != -ENOENT || ++tries == 16)
			break;
		tpc_chan_req_free(cr);
		if (!(cr = read_req_new(NULL, 0, false))) {
			*ret_err = tpc_error(-ENOMEM, "out of memory");
			break;
		}
		cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	}
	return cr;
}

/*
 * chan_read_one_wire(), and an item handed out by mapping copied out of its writer's buffer
 * (tpc_chan_map_take()). One that cannot be went back to the channel and the read is made
 * again: without mapping, as are this handle's next ones (a mapping refused, an answer that
 * does not fit what was mapped), or as before (a buffer another thread unmapped meanwhile).
 * Return: as chan_read_one_wire().
 */
static struct chan_req *chan_read_one(struct tp_chan *ch, size_t max, const struct iovec *into,
				      bool stage, int timeout_ms, int *ret_err)
{
	struct chan_req *cr;

	int r;

	for (;;) { /* (a late read's items may be mapped too: each taken once) */
		cr = chan_read_one_wire(ch, max, into, stage, timeout_ms, ret_err);
		if (!cr || !cr->map_pending || (r = tpc_chan_map_take(ch, cr)) == 0)
			return cr;
		tpc_chan_req_free(cr);
		if (r == -ESTALE)
			continue;
		pthread_mutex_lock(&ch->ctx->lock);
		ch->map_read = false;
		pthread_mutex_unlock(&ch->ctx->lock);
	}
}

/* The status of @cr's read of @ch as the call returns it; frees @cr on failure. @timeout_ms:
 * the call's (0: an empty channel is -EAGAIN). */
static int chan_read_status(struct tp_chan *ch, struct chan_req *cr, int timeout_ms)
{
	int r = cr->req.status;

	if (r == -ETIMEDOUT && timeout_ms == 0 && cr->req.done)
		r = -EAGAIN;
	if (r == 0 && cr->next >= cr->n)
		r = -EPROTO;
	if (r < 0) {
		r = tpc_error(r, "channel '%s': %s", ch->name,
			      r == -EPROTO && !cr->req.status ? "an answer without an item"
							       : cr->req.msg);
		tpc_chan_req_free(cr);
		return r < 0 ? r : -EPROTO; /* negative, so that no caller uses @cr (gcc -O3) */
	}
	for (size_t i = cr->next; i < cr->n; i++) /* some by the daemon's CMA */
		tpc_mem_written(cr->items[i].iov_base, cr->items[i].iov_len);
	return r;
}

/* Files what is left of @cr (items not taken) first on @ch's late reads, or frees it. */
static void chan_req_keep(struct tp_chan *ch, struct chan_req *cr)
{
	if (cr->next >= cr->n)
		return tpc_chan_req_free(cr);
	pthread_mutex_lock(&ch->ctx->lock);
	cr->ch = ch;
	tpu_list_insert_head(&ch->late, &cr->node);
	pthread_mutex_unlock(&ch->ctx->lock);
}

TP_EXPORT int tp_chan_read(struct tp_chan *ch, void **ret_item, size_t *ret_len, int timeout_ms)
{
	struct chan_req *cr;
	bool closed;
	int r;

	if (!ch || !ret_item || !ret_len)
		return tpc_error(-EINVAL, "tp_chan_read: NULL argument");
	cr = chan_read_one(ch, 1, NULL, true, timeout_ms, &r);
	if (!cr)
		return r;
	r = chan_read_status(ch, cr, timeout_ms);
	if (r < 0)
		return r;
	*ret_item = cr->items[cr->next].iov_base;
	*ret_len = cr->items[cr->next++].iov_len;
	closed = cr->closed;
	chan_req_keep(ch, cr);
	return closed ? TP_CHAN_CLOSED : 0;
}

TP_EXPORT int tp_chan_read_into(struct tp_chan *ch, void *buf, size_t size, size_t *ret_len,
				int timeout_ms)
{
	struct iovec into = { .iov_base = buf, .iov_len = size };
	struct chan_req *cr;
	struct iovec *it;
	bool closed;
	int r;

	if (!ch || !buf || !size || !ret_len)
		return tpc_error(-EINVAL, "tp_chan_read_into: NULL argument or no room");
	if (!tpc_chan_fast(ch))
		return tpc_error(-EOPNOTSUPP, "tp_chan_read_into: channel '%s' %s", ch->name,
				 ch->remote ? "is on a host whose daemon cannot stream large items"
					    : "is on a daemon before "
				 "protocol minor 7");
	cr = chan_read_one(ch, 1, &into, true, timeout_ms, &r);
	if (!cr)
		return r;
	if (cr->req.status == -EMSGSIZE && cr->held_len)
		*ret_len = cr->held_len; /* the item stays first in the channel */
	r = chan_read_status(ch, cr, timeout_ms);
	if (r < 0)
		return r;
	it = &cr->items[cr->next];
	if (it->iov_base != buf) { /* inline, or a late read's */
		if (it->iov_len > size) {
			*ret_len = it->iov_len;
			chan_req_keep(ch, cr);
			return tpc_error(-EMSGSIZE, "channel '%s': an item of %zu bytes kept by this "
					 "handle does not fit %zu", ch->name, it->iov_len, size);
		}
		memcpy(buf, it->iov_base, it->iov_len);
		free(it->iov_base);
	}
	*ret_len = it->iov_len;
	cr->next++;
	closed = cr->closed;
	chan_req_keep(ch, cr);
	return closed ? TP_CHAN_CLOSED : 0;
}

TP_EXPORT int tp_chan_read_many(struct tp_chan *ch, struct tp_chan_item *items, size_t max,
				size_t *ret_n, int timeout_ms)
{
	struct chan_req *cr;
	bool closed;
	size_t k = 0;
	int r;

	if (!ch || !items || !max || !ret_n)
		return tpc_error(-EINVAL, "tp_chan_read_many: NULL argument or no room");
	cr = chan_read_one(ch, max, NULL, true, timeout_ms, &r);
	if (!cr)
		return r;
	r = chan_read_status(ch, cr, timeout_ms);
	if (r < 0)
		return r;
	while (k < max && cr->next < cr->n) {
		items[k].data = cr->items[cr->next].iov_base;
		items[k++].len = cr->items[cr->next++].iov_len;
	}
	closed = cr->closed;
	chan_req_keep(ch, cr);
	*ret_n = k;
	return closed ? TP_CHAN_CLOSED : 0;
}

/*
 * Puts the items of @cr from @next on into @buf of @size bytes, each where tpw_chan_pack_at()
 * puts it, as many as fit and @max takes, and lists them in @items: those the answer already
 * put there stay, the others (a late read's, a read of one item by copy) are copied and freed.
 * Return: how many (0: the first does not fit).
 */
static size_t read_pack_out(struct chan_req *cr, uint8_t *buf, size_t size,
			    struct tp_chan_item *items, size_t max)
{
	uint64_t end = 0, off;
	size_t k = 0;

	while (k < max && cr->next < cr->n) {
		struct iovec *it = &cr->items[cr->next];

		if (!tpw_chan_pack_at(end, it->iov_len, size, &off))
			break;
		if (it->iov_base != buf + off) {
			memcpy(buf + off, it->iov_base, it->iov_len);
			free(it->iov_base);
		}
		items[k++] = (struct tp_chan_item){ .data = buf + off, .len = it->iov_len };
		cr->next++;
		end = off + it->iov_len;
	}
	return k;
}

TP_EXPORT int tp_chan_read_many_into(struct tp_chan *ch, void *buf, size_t size,
				     struct tp_chan_item *items, size_t max, size_t *ret_n,
				     int timeout_ms)
{
	struct iovec into = { .iov_base = buf, .iov_len = size };
	struct chan_req *cr;
	bool closed;
	size_t k;
	int r;

	if (!ch || !buf || !size || !items || !max || !ret_n)
		return tpc_error(-EINVAL, "tp_chan_read_many_into: NULL argument or no room");
	/* A daemon that takes packed reads: up to @max items in one answer. Otherwise one item a
	 * call: into @buf as tp_chan_read_into() reads it (another host's channel, a daemon that
	 * does not say it takes packed reads), or, where even that is not offered (a daemon before
	 * minor 7, another host's that streams no large item), as tp_chan_read() reads it, then
	 * copied (an item that does not fit stays with the handle for its next read). */
	if (tpc_chan_fast(ch))
		cr = chan_read_one(ch, ch->pack ? max : 1, &into, true, timeout_ms, &r);
	else
		cr = chan_read_one(ch, 1, NULL, true, timeout_ms, &r);
	if (!cr)
		return r;
	if (cr->req.status == -EMSGSIZE && cr->held_len) /* it stays first in the channel */
		items[0] = (struct tp_chan_item){ .data = NULL, .len = cr->held_len };
	r = chan_read_status(ch, cr, timeout_ms);
	if (r < 0)
		return r;
	k = read_pack_out(cr, buf, size, items, max);
	if (!k) {
		items[0] = (struct tp_chan_item){ .data = NULL, .len = cr->items[cr->next].iov_len };
		chan_req_keep(ch, cr);
		return tpc_error(-EMSGSIZE, "channel '%s': an item of %zu bytes kept by this handle "
				 "does not fit %zu", ch->name, items[0].len, size);
	}
	closed = cr->closed;
	chan_req_keep(ch, cr);
	*ret_n = k;
	return closed ? TP_CHAN_CLOSED : 0;
}

_Static_assert(TP_CHAN_PACK_ALIGN == TPW_CHAN_PACK_ALIGN, "the header's alignment is the wire's");
