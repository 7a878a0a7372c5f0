/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * WRITE and READ on the daemon's channels (chan_int.h): a batch admitted, refused or waiting
 * for room, a read answered, refused or waiting for an item, with their deadlines; which item
 * goes inline, into a reader's allocation or held for a reader; the copies of items by
 * reference in and of large items out (chancopy.c, or over a peer link: chanxbig.c). Leaves
 * channels, handles, OPEN, UNLINK, CLOSE and RELEASE to chan.c, and the items and lent buffers
 * themselves to chanitem.c. Everything runs on the daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <event2/event.h>

#include "chan_int.h"
#include "chancopy.h"
#include "chanx.h"
#include "config.h"
#include "core.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

/* Frees @w, made by wait_new() and never queued (nothing counted it but wait_new()). */
static void wait_discard(struct chan_wait *w)
{
	if (w->ev)
		event_free(w->ev);
	if (w->acct)
		tpd_quota_release_wait(w->acct);
	if (w->link)
		tpd_handix_wait_del(&w->cs->ix, w->link);
	free(w);
}

void tpd_chan_io_wait_free(struct chan_wait *w)
{
	tpu_list_remove(&w->node);
	if (w->write) {
		tpd_chan_item_batch_free(w->cs, &w->batch);
		if (w->payer)
			tpd_chan_payer_charge(w->payer, -(int64_t)w->held);
		tpd_chan_payer_unref(w->payer);
		w->h->c->n_writers--;
		w->h->write_waits = false;
	} else {
		tpd_chan_copy_put(&w->rd.dst);
		w->h->c->n_waiters--;
		w->h->waits--;
	}
	wait_discard(w);
}

/* Answers @rd with the oldest items of @c, inline: the first, and while @rd takes more, the
 * following ones that ride inline too, up to the daemon's inline limit in all, and for a packed
 * read (@rd->pack) while they fit its room packed (the first was checked against it). */
static void deliver_inline(struct chan_handle *h, const struct chan_read *rd)
{
	uint32_t inline_max = tpd_daemon_limits(h->c->cs->d)->inline_max;
	/* a reader on another host: the batch within that daemon's frames too */
	uint64_t room = h->who.pr ? TPU_MIN(inline_max, tpd_peer_chan_tail_max(h->who.pr))
				  : inline_max;

	/* a far reader's packed batch: 256 KiB in all (answers of 1 MiB crossed the link at about
	 * half the bytes a second of 256 KiB ones in bench_chanx: docs/benchmarks.md) */
	if (h->who.pr && rd->pack)
		room = TPU_MIN(room, TPW_CHAN_INLINE_ITEM);
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct chan *c = h->c;
	uint64_t one_len, total = 0, end = 0, off = 0;
	struct iovec one_iov, *iov = &one_iov;
	uint64_t *lens = &one_len;
	struct chan_item *it;
	size_t n = 0, max = rd->max;

	if (max > 1 && (!(iov = calloc(max, sizeof(*iov))) || !(lens = calloc(max, sizeof(*lens))))) {
		free(iov);
		iov = &one_iov;
		lens = &one_len;
		max = 1; /* without memory for a batch, one item */
	}
	tpu_list_for_each(it, &c->items, node) {
		if (n && (n == max || it->len > TPW_CHAN_INLINE_ITEM || total + it->len > room ||
			  it->desc))
			break; /* (a message item is for a message read: chan_deliver()) */
		if (rd->pack && !tpw_chan_pack_at(end, it->len, rd->room, &off))
			break; /* stays first in the channel, for this or another reader */
		end = rd->pack ? off + it->len : 0;
		iov[n] = (struct iovec){ .iov_base = (void *)tpd_chan_item_bytes(it),
					 .iov_len = it->len };
		lens[n++] = it->len;
		total += it->len;
	}
	r.req_id = rd->req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = h->id;
	r.closed = c->closed;
	r.n_lengths = n;
	r.lengths = lens;
	tpd_chan_reply_send(&h->who, &r, iov, n);
	for (size_t i = 0; i < n; i++)
		tpd_chan_item_done(c, tpd_chan_item_take(c));
	if (iov != &one_iov)
		free(iov);
	if (lens != &one_len)
		free(lens);
}

static void copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
		     const struct tpb_mem *dst);
static void copy_out_packed(struct chan_handle *h, const struct chan_read *rd);

/* Refuses a byte read (@rd) a message item: it stays where it is (first in the channel, or
 * held), and a client of an older minor is never handed one as bytes. */
static void refuse_msg(struct chan_handle *h, const struct chan_read *rd)
{
	tpd_chan_answer(&h->who, rd->req_id, -EOPNOTSUPP, "the oldest item is a message "
			"(metadata, payloads, tensors): read it with tp_chan_read_descriptor()",
			h->id, h->c->closed, NULL);
}

/* Whether @h (a reader told of retirements) was sent the fd of buffer @key and not told it is
 * gone. */
static bool sent_has(const struct chan_handle *h, uint64_t key)
{
	for (uint32_t i = 0; i < h->n_sent; i++)
		if (h->sent[i] == key)
			return true;
	return false;
}

/* @h was sent the fd of @b: remembered, to tell it once @b is gone (CHAN_SENT_MAX at most,
 * the oldest forgotten first). */
static void sent_add(struct chan_handle *h, struct tpb_buffer *b)
{
	b->map_shown = true;
	if (sent_has(h, b->map_key))
		return;
	if (h->n_sent == CHAN_SENT_MAX) {
		memmove(&h->sent[0], &h->sent[1], (CHAN_SENT_MAX - 1) * sizeof(h->sent[0]));
		h->n_sent--;
		h->c->maps_held--;
	}
	h->sent[h->n_sent++] = b->map_key;
	h->c->maps_held++;
}

/* Whether a packed read being served may take several large items of @c: only while no other
 * read waits (the one being served may itself be the one waiting read), so that readers who
 * wait each get one and copy in parallel, and one reader alone gets whole batches. */
static bool packed_alone(const struct chan *c)
{
	return c->n_waiters <= 1;
}

/*
 * A packed read (@rd, ChanOp.pack_mapped) that took @h->mapped by mapping buffer @b also takes
 * the items after it that lie in @b (the same writer's) while each is above
 * TPW_CHAN_INLINE_ITEM (not a message) and fits @rd's room packed, at most @rd->max in all:
 * out of the channel into @h->map_rest, their lengths and offsets in @b into @r (owned: the
 * caller frees them). Without memory, none (the first goes alone).
 */
static void map_more(struct chan_handle *h, const struct chan_read *rd, struct tpb_buffer *b,
		     Tpw__V1__ChanReply *r)
{
	struct chan_item *it;
	uint64_t end = h->mapped->len, off;
	size_t n = 1;

	tpu_list_for_each(it, &h->c->items, node) {
		if (n == rd->max || it->len <= TPW_CHAN_INLINE_ITEM || it->desc || !it->lend ||
		    it->lend->buf != b || !tpw_chan_pack_at(end, it->len, rd->room, &off))
			break;
		end = off + it->len;
		n++;
	}
	if (n == 1)
		return;
	r->lengths = calloc(n, sizeof(*r->lengths));
	r->map_offs = calloc(n, sizeof(*r->map_offs));
	h->map_rest = calloc(n - 1, sizeof(*h->map_rest));
	if (!r->lengths || !r->map_offs || !h->map_rest) {
		free(r->lengths);
		free(r->map_offs);
		free(h->map_rest);
		r->lengths = NULL;
		r->map_offs = NULL;
		h->map_rest = NULL;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		it = i ? tpd_chan_item_take(h->c) : h->mapped;
		if (i)
			h->map_rest[i - 1] = it;
		r->lengths[i] = it->len;
		r->map_offs[i] = it->src.addr - (uint64_t)(uintptr_t)b->map; /* inside @b */
	}
	h->n_map_rest = n - 1;
	r->n_lengths = n;
	r->n_map_offs = n;
}

/*
 * Hands @it (the oldest item of @h's channel, or the item @h holds: @taken) to @h's read @rd by
 * mapping, when @rd takes it so (ChanOp.map_ok), @it lies in a buffer its writer lent whose fd
 * the daemon keeps and that is sealed against writes (tpb_buffer_reader_fd()), @h is a reader
 * of the lender's own uid, and @h has no such item out yet: the answer names the buffer, the
 * item's offset and length; a read-only fd
 * of the buffer goes ahead of it unless @rd lists the buffer as mapped. The item stays out of
 * the channel, charged to it, until the reader's READ with map_done (map_done()); the daemon
 * copies none of its bytes. Return: true if answered so (@it is @h->mapped), false if @it goes
 * the way of a copy (nothing done).
 */
static bool map_offer(struct chan_handle *h, const struct chan_read *rd, struct chan_item *it,
		      bool taken)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct tpb_buffer *b = it->lend ? it->lend->buf : NULL;
	uint64_t len = it->len;
	bool listed = false, track;
	int fd;

	if (!rd->map || !b || h->mapped || it->desc || !h->who.s || !tpb_buffer_reader_ok(b))
		return false;
	/* A reader keeps what it maps, fd and pages, as long as it likes: the buffer's later items
	 * (the writer stages its next ones there, whoever reads them) and the bytes of earlier
	 * ones. Only the writer's own uid may see those; another uid's reader gets its item
	 * copied, as it would from any other host or library. */
	if (it->lend->uid != (uint32_t)tpd_session_uid(h->who.s))
		return false;
	track = tpd_session_client_minor(h->who.s) >= TPW_MINOR_CHAN_RETIRE;
	for (size_t i = 0; i < rd->n_mapped; i++)
		listed |= rd->mapped[i] == b->map_key;
	/* A reader told of retirements: a key counts as mapped only while it is one it was
	 * sent and not told is gone (a READ sent before the notice came may list it still). */
	if (listed && track && !sent_has(h, b->map_key))
		listed = false;
	if (!listed) {
		fd = tpb_buffer_reader_fd(b);
		if (fd < 0 || tpd_session_send_fd(h->who.s, fd) < 0) {
			if (fd >= 0)
				close(fd);
			return false; /* (not a ring session, its socket full): copied */
		}
		close(fd);
		if (track)
			sent_add(h, b);
	}
	h->mapped = taken ? it : tpd_chan_item_take(h->c);
	if (!taken && rd->pack_mapped && rd->max > 1 && packed_alone(h->c))
		map_more(h, rd, b, &r);
	r.req_id = rd->req_id;
	r.status = tpw_status_from_errno(0);
	r.message = (char *)"";
	r.chan_id = h->id;
	r.closed = h->c->closed;
	if (!r.n_lengths) {
		r.n_lengths = 1;
		r.lengths = &len;
	}
	r.map_key = b->map_key;
	r.map_off = it->src.addr - (uint64_t)(uintptr_t)b->map; /* resolved inside @b */
	r.map_size = b->size;
	r.map_fd = !listed;
	tpd_chan_reply_send(&h->who, &r, NULL, 0);
	tpd_session_log(h->who.s, TPU_LOG_DEBUG, "channel '%s': %zu item(s), the first of %zu "
			"bytes, read by mapping buffer %llu%s", h->c->name, r.n_lengths, it->len,
			(unsigned long long)b->map_key, listed ? "" : " (fd sent)");
	if (r.lengths != &len)
		free(r.lengths);
	free(r.map_offs);
	return true;
}

bool tpd_chan_io_mapped_back(struct chan_handle *h)
{
	if (!h->mapped)
		return false;
	for (size_t i = h->n_map_rest; i-- > 0;) /* the last first: the first ends up first */
		tpd_chan_item_give_back(h->c, h->map_rest[i]);
	tpd_chan_item_give_back(h->c, h->mapped);
	free(h->map_rest);
	h->map_rest = NULL;
	h->n_map_rest = 0;
	h->mapped = NULL;
	return true;
}

/* The reader's READ with map_done: the items it took by mapping leave the channel, or (with
 * map_fail: it could not copy them out) go back to the head, in order, for the next reader.
 * Not answered; without such items it does nothing. */
static void map_done(struct chan_handle *h, const Tpw__V1__ChanOp *o)
{
	if (!h->mapped)
		return;
	if (o->map_fail) {
		tpd_chan_io_mapped_back(h);
	} else {
		h->c->mapped += 1 + h->n_map_rest;
		tpd_chan_item_done(h->c, h->mapped);
		for (size_t i = 0; i < h->n_map_rest; i++)
			tpd_chan_item_done(h->c, h->map_rest[i]);
		free(h->map_rest);
		h->map_rest = NULL;
		h->n_map_rest = 0;
		h->mapped = NULL;
	}
	tpd_chan_io_serve(h->c);
}

/* Hands the oldest item of @c to @h's read @rd (which must be there): inline, into the read's
 * allocation, or held for @h (a large item and a reader that takes held items, or any item
 * for a message read, answered by its descriptor); a read that cannot take it fails and leaves
 * it first in @c. */
static void chan_deliver(struct chan_handle *h, const struct chan_read *rd)
{
	struct chan *c = h->c;
	struct chan_item *it = tpu_list_first(&c->items, struct chan_item, node);
	/* a reader on another host: an inline item within its daemon's frames (the link fails
	 * on a larger frame) */
	bool fits = !h->who.pr || it->len <= tpd_peer_chan_tail_max(h->who.pr);
	char why[200];

	if (rd->msg) { /* another read of @h (another thread) may hold one already */
		if (!h->held)
			h->held = tpd_chan_item_take(c);
		return tpd_chan_msg_answer_held(h, rd->req_id, h->held);
	}
	if (it->desc)
		return refuse_msg(h, rd);
	if (rd->dst_set && it->len > rd->room) {
		snprintf(why, sizeof(why), "an item of %zu bytes does not fit the read's %llu",
			 it->len, (unsigned long long)rd->room);
		return tpd_chan_answer_len(h, rd->req_id, -EMSGSIZE, why, it->len);
	}
	if (rd->pack && it->len <= TPW_CHAN_INLINE_ITEM && fits) /* inline whatever the allocation */
		return deliver_inline(h, rd);
	if (rd->dst_set && (it->len > TPW_CHAN_INLINE_ITEM ||
			    (rd->dst.buf && it->len > TPW_CHAN_SHM_ITEM))) {
		if (map_offer(h, rd, it, false))
			return;
		if (rd->pack_copied && rd->dst.buf && rd->max > 1 && packed_alone(c))
			return copy_out_packed(h, rd);
		return copy_out(h, rd->req_id, tpd_chan_item_take(c), &rd->dst);
	}
	if (it->len <= TPW_CHAN_INLINE_ITEM && fits)
		return deliver_inline(h, rd);
	if (rd->fast && !h->held && map_offer(h, rd, it, false))
		return; /* (no allocation named: the reader allocates for it) */
	if (rd->fast) { /* another read of @h (another thread) may have been answered first */
		if (!h->held)
			h->held = tpd_chan_item_take(c);
		return tpd_chan_answer_len(h, rd->req_id, 0, NULL, h->held->len);
	}
	if (it->len <= tpd_daemon_limits(c->cs->d)->inline_max && fits)
		return deliver_inline(h, rd);
	if (!fits)
		snprintf(why, sizeof(why), "an item of %zu bytes is above the %u that cross to "
			 "%.60s inline (its frame-max less 64 KiB)", it->len,
			 tpd_peer_chan_tail_max(h->who.pr), tpd_peer_name(h->who.pr));
	else
		snprintf(why, sizeof(why), "an item of %zu bytes is above the inline limit %u%s",
			 it->len, tpd_daemon_limits(c->cs->d)->inline_max, h->who.pr ?
			 " (items cross hosts inline)" : ": this client library reads no larger item");
	tpd_chan_answer(&h->who, rd->req_id, -EMSGSIZE, why, h->id, c->closed, NULL);
}

static bool chan_fits(const struct chan *c, size_t n, uint64_t bytes)
{
	return c->n_items + c->res_items + n <= c->cap_items && c->bytes + bytes <= c->cap_bytes;
}

/* Is @c closed with nothing left to read: no item in it, none out for a reader? */
static bool chan_drained(const struct chan *c)
{
	return c->closed && !c->n_items && !c->n_outs;
}

/* Moves @batch (@n items, @bytes) to the end of @c, contiguous: nothing runs in between. */
void tpd_chan_io_append(struct chan *c, struct tpu_list *batch, size_t n, uint64_t bytes)
{
	struct chan_item *it, *tmp;

	tpu_list_for_each_safe(it, tmp, batch, node) {
		tpu_list_remove(&it->node);
		tpu_list_insert_tail(&c->items, &it->node);
	}
	c->n_items += (uint32_t)n;
	c->bytes += bytes;
	c->written += n;
}

static void serve_readers(struct chan *c);

static void chan_admit(struct chan_handle *h, uint64_t req_id, struct tpu_list *batch, size_t n,
		       uint64_t bytes, bool lend);

static void write_answer(struct chan_handle *h, uint64_t req_id, bool lent);

/* Lets the oldest waiting writes in while they fit; on close fails them all. */
static void serve_writers(struct tpd_chans *cs, struct chan *c)
{
	struct chan_wait *w, *tmp;
	const char *over;

	tpu_list_for_each_safe(w, tmp, &c->writers, node) {
		if (c->closed) {
			tpd_chan_answer(&w->h->who, w->req_id, -EPIPE, "the channel was closed",
					w->h->id, true, NULL);
		} else if (!chan_fits(c, w->n, w->bytes)) {
			break;
		} else {
			tpd_chan_payer_charge(w->payer, -(int64_t)w->held); /* not twice */
			w->held = 0;
			if ((over = tpd_chan_over_bytes(c, &w->h->who, w->bytes)))
				tpd_chan_answer(&w->h->who, w->req_id, -ENOBUFS, over, w->h->id,
						false, NULL);
			else
				chan_admit(w->h, w->req_id, &w->batch, w->n, w->bytes, w->lend);
		}
		tpd_chan_io_wait_free(w);
	}
}

/* Gives items to waiting readers and room to waiting writers, oldest first, until neither can
 * go on. */
void tpd_chan_io_serve(struct chan *c)
{
	uint32_t before;

	do { /* every pass that does something ends a wait: this ends */
		before = c->n_waiters + c->n_writers;
		serve_readers(c);
		serve_writers(c->cs, c);
	} while (c->n_waiters + c->n_writers != before);
}

/* Gives items to waiting readers, oldest reader first; on a closed, empty channel tells every
 * remaining reader it is drained. */
static void serve_readers(struct chan *c)
{
	struct chan_wait *w, *tmp;

	tpu_list_for_each_safe(w, tmp, &c->waiters, node) {
		if (c->n_items) {
			chan_deliver(w->h, &w->rd);
		} else if (chan_drained(c)) {
			tpd_chan_answer(&w->h->who, w->req_id, -EPIPE,
					"the channel is closed and drained", w->h->id, true, NULL);
		} else {
			break;
		}
		tpd_chan_io_wait_free(w);
	}
}

static void wait_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct chan_wait *w = arg;

	(void)fd;
	(void)what;
	tpd_chan_answer(&w->h->who, w->req_id, -ETIMEDOUT, w->write ? "the channel stayed full: "
			"nothing written" : "no item within the timeout", w->h->id, w->h->c->closed,
			NULL);
	tpd_chan_io_wait_free(w);
}

/* A wait of @h for @req_id, with a timer unless @timeout_ms is CHAN_NO_DEADLINE, charged to
 * the uid of @h's session (waits-per-uid), or counted for its peer link (chan-peer-ops-max,
 * tpd_handix_peer_waits()). Return: 0 with *@ret owned (tpd_chan_io_wait_free() once queued,
 * wait_discard() before), or -ENOBUFS (over the limit) or -ENOMEM, with @why set. */
static int wait_new(struct tpd_chans *cs, struct chan_handle *h, uint64_t req_id,
		    uint32_t timeout_ms, struct chan_wait **ret, char *why, size_t wl)
{
	struct tpd_uid_acct *acct = h->who.s ? h->who.s->acct : NULL;
	struct chan_wait *w;
	struct timeval tv;
	int r;

	if (acct && (r = tpd_quota_charge_wait(tpd_daemon_cfg(cs->d), acct, why, wl)) < 0)
		return r;
	w = calloc(1, sizeof(*w));
	if (!w) {
		if (acct)
			tpd_quota_release_wait(acct);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	w->acct = acct;
	w->cs = cs;
	tpu_list_init(&w->node);
	tpu_list_init(&w->batch);
	if (timeout_ms != CHAN_NO_DEADLINE) {
		w->ev = evtimer_new(tpd_daemon_base(cs->d), wait_on_timeout, w);
		tv.tv_sec = timeout_ms / 1000;
		tv.tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000;
		/* The deadline runs from now, not from the loop pass's cached start. */
		event_base_update_cache_time(tpd_daemon_base(cs->d));
		if (!w->ev || tpd_timer_add(w->ev, &tv) < 0) {
			wait_discard(w);
			return tpu_why(-ENOMEM, why, wl, "out of memory");
		}
	}
	w->h = h;
	w->req_id = req_id;
	if (h->who.pr && tpd_handix_wait_add(&cs->ix, h->who.pr) < 0) {
		wait_discard(w);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	w->link = h->who.pr;
	*ret = w;
	return 0;
}

void tpd_chan_io_copy_free(struct chan_copy *cp)
{
	struct chan *c = cp->c;

	tpu_list_remove(&cp->node);
	tpd_chan_item_batch_free(c->cs, &cp->batch);
	free(cp->outs);
	free(cp->to);
	free(cp);
	tpd_chan_maybe_free(c);
}

/* A batch copied in (@status 0) goes to the end of its channel, unless the channel was closed
 * meanwhile; its writer, if still there, is answered. */
static void copy_in_on_done(void *arg, int status, const char *why)
{
	struct chan_copy *cp = arg;
	struct chan *c = cp->c;

	c->res_items -= (uint32_t)cp->n;
	c->bytes -= cp->bytes;
	if (status == 0 && c->closed) {
		status = -EPIPE;
		why = "the channel was closed while the batch was copied";
	}
	if (status == 0)
		tpd_chan_io_append(c, &cp->batch, cp->n, cp->bytes);
	if (cp->h && status == 0)
		write_answer(cp->h, cp->req_id, false);
	else if (cp->h)
		tpd_chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed, NULL);
	tpd_chan_io_serve(c);
	tpd_chan_io_copy_free(cp);
}

/* Starts copying the items by reference of @batch into items of the daemon; they take the
 * place of the references in @batch; @done when copied. Return: 0 or -errno (@batch
 * unchanged). */
int tpd_chan_io_copy_in_start(struct chan_copy *cp, struct tpu_list *batch,
			      tpd_chan_copy_done_fn done)
{
	struct tpb_xfer *x = calloc(cp->n, sizeof(*x));
	struct chan_item *it, *tmp, *dup;
	size_t k = 0;
	int r = -ENOMEM;

	if (!x)
		return -ENOMEM;
	tpu_list_for_each(it, batch, node) {
		dup = it->ref ? tpd_chan_item_new_copied(cp->c->cs, it->len) : NULL;
		if (it->ref && !dup)
			goto fail;
		if (!dup)
			continue;
		x[k++] = (struct tpb_xfer){ .src = it->src, .len = it->len,
					    .dst = { .loc = TPB_LOC_LOCAL,
						     .addr = (uint64_t)(uintptr_t)dup->data } };
		tpu_list_insert_tail(&cp->batch, &dup->node);
	}
	if (cp->h && cp->h->who.pr) /* a peer's write: its items come over the link */
		r = tpd_chanx_big_copy_in(cp->c->cs->d, cp->h->who.pr, cp->req_id, cp->h->id, x,
					  k, done, cp);
	else
		r = tpd_chan_copy_start(cp->c->cs->d, x, k, done, cp);
	if (r < 0)
		goto fail;
	/* The copy holds its own references: the batch's items by reference give way to theirs,
	 * in order, and the inline ones stay. */
	tpu_list_for_each_safe(it, tmp, batch, node) {
		if (!it->ref)
			continue;
		dup = tpu_list_first(&cp->batch, struct chan_item, node);
		tpu_list_remove(&dup->node);
		tpu_list_insert_tail(&it->node, &dup->node); /* before @it */
		tpd_chan_item_move_desc(dup, it);
		tpu_list_remove(&it->node);
		tpd_chan_item_free(NULL, it);
	}
	tpu_list_splice_tail(&cp->batch, batch);
	free(x);
	return 0;
fail:
	tpd_chan_item_batch_free(cp->c->cs, &cp->batch);
	free(x);
	return r;
}

struct chan_copy *tpd_chan_io_copy_new(struct chan *c, struct chan_handle *h, uint64_t req_id)
{
	struct chan_copy *cp = calloc(1, sizeof(*cp));

	if (!cp)
		return NULL;
	cp->c = c;
	cp->h = h;
	cp->req_id = req_id;
	tpu_list_init(&cp->batch);
	tpu_list_insert_tail(&c->copies, &cp->node);
	return cp;
}

/* Answers @h's write @req_id: done, its items lent (@lent) or copied, with the ids of the
 * buffers @h lent that the channel gave up since its last answer. */
static void write_answer(struct chan_handle *h, uint64_t req_id, bool lent)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint32_t n = TPU_MIN(h->n_released, TPW_CHAN_RELEASED_MAX);

	r.req_id = req_id;
	r.status = tpw_status_from_errno(0);
	r.message = (char *)"";
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.lent = lent;
	r.n_released = n;
	r.released = h->released;
	tpd_chan_reply_send(&h->who, &r, NULL, 0);
	h->n_released -= n;
	if (h->n_released) /* (none: @h->released may be NULL) */
		memmove(h->released, h->released + n, h->n_released * sizeof(*h->released));
}

void tpd_chan_io_write_answer(struct chan_handle *h, uint64_t req_id)
{
	write_answer(h, req_id, false);
}

/* Puts @batch (@n items, @bytes, room checked) into @h's channel and answers @req_id: at once
 * when every item is in the daemon already or stays in the buffer the writer lends (@lend),
 * else once its items by reference are handed off to waiting readers (chanhand.c) or copied in
 * (their room reserved meanwhile). Takes @batch's items. */
static void chan_admit(struct chan_handle *h, uint64_t req_id, struct tpu_list *batch, size_t n,
		       uint64_t bytes, bool lend)
{
	struct chan *c = h->c;
	struct chan_payer *p = tpd_chan_payer_get(c->cs, &h->who);
	struct chan_copy *cp = NULL;
	struct chan_item *it;
	bool refs = false, lent;
	int r = -ENOMEM;

	if (!p) {
		tpd_chan_item_batch_free(c->cs, batch);
		return tpd_chan_answer(&h->who, req_id, -ENOMEM, "out of memory", h->id, false,
				       NULL);
	}
	tpd_chan_item_pay(p, batch); /* the writer pays, wherever its items go from here */
	tpd_chan_payer_unref(p);
	if (!lend && tpd_chan_hand_try(h, req_id, batch, n, bytes))
		return;
	lent = lend && tpd_chan_item_lend_batch(h, batch);
	tpu_list_for_each(it, batch, node)
		refs |= it->ref && !it->lend;
	if (!refs) {
		tpd_chan_io_append(c, batch, n, bytes);
		return write_answer(h, req_id, lent);
	}
	cp = tpd_chan_io_copy_new(h->c, h, req_id);
	if (cp) {
		cp->n = n;
		cp->bytes = bytes;
		r = tpd_chan_io_copy_in_start(cp, batch, copy_in_on_done);
	}
	if (r < 0) {
		tpd_chan_item_batch_free(c->cs, batch);
		if (cp)
			tpd_chan_io_copy_free(cp);
		return tpd_chan_answer(&h->who, req_id, r, r == -ENOMEM ? "out of memory" :
				       "no channel copies the writer's memory", h->id, false, NULL);
	}
	c->res_items += (uint32_t)n;
	c->bytes += bytes;
}

/* A copy of an item to a reader ended: delivered (@status 0, the reader still there), or the
 * item goes back to the head of its channel for the next reader. */
static void copy_out_on_done(void *arg, int status, const char *why)
{
	struct chan_copy *cp = arg;
	struct chan *c = cp->c;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct chan_item **outs = cp->outs ? cp->outs : &cp->item;
	size_t n = cp->outs ? cp->n_outs : 1;
	uint64_t one_len = cp->item->len, *lens = &one_len;

	if (status == 0 && cp->h && n > 1 && !(lens = calloc(n, sizeof(*lens)))) {
		status = -ENOMEM; /* (every item back, in order) */
		why = "out of memory";
	}
	if (status == 0 && cp->h) {
		for (size_t i = 0; i < n; i++) {
			lens[i] = outs[i]->len;
			tpd_chan_item_done(c, outs[i]);
		}
		r.req_id = cp->req_id;
		r.status = tpw_status_from_errno(0);
		r.chan_id = cp->h->id;
		r.closed = c->closed;
		r.n_lengths = n;
		r.lengths = lens;
		r.copied = true;
		r.msg_taken = cp->msg;
		tpd_chan_reply_send(&cp->h->who, &r, NULL, 0);
		if (lens != &one_len)
			free(lens);
	} else {
		for (size_t i = n; i-- > 0;) /* the last first: the first ends up at the head */
			tpd_chan_item_give_back(c, outs[i]);
		if (cp->h)
			tpd_chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed,
					NULL);
	}
	tpd_chan_io_serve(c);
	tpd_chan_io_copy_free(cp);
}

/*
 * tpd_chan_io_copy_out() - copies @it (taken out of @h's channel) into the reader's allocation:
 * the @n transfers @x, whose sources this fills in (@it's bytes back to back, in order; their
 * lengths add up to @it's), and answers @req_id once done (@msg: a message read's take); on
 * failure the item goes back to the head. One transfer only to another host. Borrows @x.
 * Return: 0, or -errno (answered, the item given back).
 */
int tpd_chan_io_copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
			 const struct tpb_xfer *x, size_t n, bool msg)
{
	struct tpb_xfer *xs = calloc(n ? n : 1, sizeof(*xs));
	struct chan_copy *cp = xs ? tpd_chan_io_copy_new(h->c, h, req_id) : NULL;
	int r = -ENOMEM;

	for (size_t i = 0; cp && i < n; i++)
		xs[i] = x[i];
	if (cp)
		tpd_chan_item_srcs(it, xs, n);
	if (cp)
		r = n == 1 && x[0].dst.loc == TPB_LOC_REMOTE ?
		    tpd_chanx_big_copy_out(h->who.pr, &xs[0], copy_out_on_done, cp) :
		    tpd_chan_copy_start(h->c->cs->d, xs, n, copy_out_on_done, cp);
	free(xs);
	if (r == 0) {
		cp->item = it;
		cp->msg = msg;
		return 0;
	}
	if (cp)
		tpd_chan_io_copy_free(cp);
	tpd_chan_item_give_back(h->c, it);
	tpd_chan_answer(&h->who, req_id, r, "cannot copy the item into the read's allocation",
			h->id, h->c->closed, NULL);
	return r;
}

/* Copies @it (taken out of @h's channel) into the reader's allocation @dst and answers
 * @req_id once done; on failure the item goes back to the head. Borrows @dst. */
static void copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
		     const struct tpb_mem *dst)
{
	struct tpb_xfer x = { .dst = *dst, .len = it->len };

	(void)tpd_chan_io_copy_out(h, req_id, it, &x, 1, false);
}

/*
 * A packed read (@rd, ChanOp.pack_copied) into the reader's shared buffer whose oldest item is
 * copied: that item and those following it while each is above TPW_CHAN_INLINE_ITEM (not a
 * message) and fits @rd's room packed, at most @rd->max, taken out of the channel and copied
 * in one job straight to their packed places (tpw_chan_pack_at()); answered once all are
 * there, with one length each. On failure every one goes back to the head, in order.
 */
static void copy_out_packed(struct chan_handle *h, const struct chan_read *rd)
{
	struct chan *c = h->c;
	struct chan_item *it, **outs = calloc(rd->max, sizeof(*outs));
	struct tpb_xfer *xs = calloc(rd->max, sizeof(*xs));
	struct chan_copy *cp = outs && xs ? tpd_chan_io_copy_new(c, h, rd->req_id) : NULL;
	uint64_t end = 0, off;
	size_t n = 0;
	int r;

	if (!cp) {
		free(outs);
		free(xs);
		return copy_out(h, rd->req_id, tpd_chan_item_take(c), &rd->dst);
	}
	tpu_list_for_each(it, &c->items, node) {
		if (n == rd->max || (n && (it->len <= TPW_CHAN_INLINE_ITEM || it->desc)) ||
		    !tpw_chan_pack_at(end, it->len, rd->room, &off))
			break; /* (the first fits the room: chan_deliver()) */
		xs[n] = (struct tpb_xfer){ .dst = rd->dst, .len = it->len };
		xs[n].dst.addr += off;
		tpd_chan_item_srcs(it, &xs[n], 1);
		n++;
		end = off + it->len;
	}
	for (size_t i = 0; i < n; i++)
		outs[i] = tpd_chan_item_take(c);
	cp->item = outs[0];
	cp->outs = outs;
	cp->n_outs = n;
	r = tpd_chan_copy_start(c->cs->d, xs, n, copy_out_on_done, cp);
	free(xs);
	if (r == 0)
		return;
	for (size_t i = n; i-- > 0;)
		tpd_chan_item_give_back(c, outs[i]);
	tpd_chan_io_copy_free(cp);
	tpd_chan_answer(&h->who, rd->req_id, r, "cannot copy the items into the read's allocation",
			h->id, c->closed, NULL);
}

/* Appends @o's batch (validated: lengths add up to the inline items in @tail) or refuses all
 * of it; a write that does not fit waits for room up to its timeout, behind earlier waiting
 * writes. Items by reference are copied in once the batch is admitted. */
void tpd_chan_io_write(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		       const uint8_t *tail, size_t tail_len)
{
	struct tpu_list batch = TPU_LIST_INIT(batch);
	struct chan *c = h->c;
	uint64_t bytes = tail_len, held;
	struct chan_wait *w;
	const char *over;
	char why[200];
	bool fits;
	int r = tpd_chan_msg_write_check(cs, o, &bytes, why, sizeof(why));

	if (r < 0) /* a bad message descriptor fails this write only */
		return tpd_chan_answer(&h->who, o->req_id, r, why, h->id, c->closed, NULL);
	held = bytes; /* inline bytes and descriptors: what a waiting write holds here */
	for (size_t i = 0; o->n_segments && i < o->n_lengths; i++)
		bytes += o->segments[i]->loc_case == TPW__V1__SEGMENT__LOC_INLINE_OFF ?
			 0 : o->lengths[i]; /* validated: no overflow */
	for (size_t i = 0; i < o->n_streamed; i++)
		bytes += o->streamed[i] ? o->lengths[i] : 0;
	if (c->closed)
		return tpd_chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed", h->id,
				       true, NULL);
	if (o->n_lengths > c->cap_items || bytes > c->cap_bytes)
		return tpd_chan_answer(&h->who, o->req_id, -EMSGSIZE, "the batch exceeds the "
				       "channel's capacity", h->id, false, NULL);
	if ((over = tpd_chan_over_bytes(c, &h->who, bytes)))
		return tpd_chan_answer(&h->who, o->req_id, -ENOBUFS, over, h->id, false, NULL);
	fits = tpu_list_empty(&c->writers) && chan_fits(c, o->n_lengths, bytes);
	if (!fits && (o->timeout_ms == 0 || h->write_waits))
		return tpd_chan_answer(&h->who, o->req_id, -ENOBUFS, h->write_waits ? "a write of "
				       "this handle already waits" : "the channel is full", h->id,
				       false, NULL);
	r = tpd_chan_item_batch_build(h->who.s, o, tail, &batch, why, sizeof(why));
	if (r < 0)
		return tpd_chan_answer(&h->who, o->req_id, r, why, h->id, false, NULL);
	if (fits) {
		chan_admit(h, o->req_id, &batch, o->n_lengths, bytes, o->lend);
		return tpd_chan_io_serve(c);
	}
	r = wait_new(cs, h, o->req_id, o->timeout_ms, &w, why, sizeof(why));
	if (r == 0 && !(w->payer = tpd_chan_payer_get(cs, &h->who))) {
		wait_discard(w); /* (not queued: nothing of it counted yet) */
		r = tpu_why(-ENOMEM, why, sizeof(why), "out of memory");
	}
	if (r < 0) {
		tpd_chan_item_batch_free(cs, &batch);
		return tpd_chan_answer(&h->who, o->req_id, r, why, h->id, false, NULL);
	}
	w->write = true;
	w->lend = o->lend;
	tpu_list_insert_tail(&batch, &w->batch); /* the batch's items now hang off w->batch */
	tpu_list_remove(&batch);
	w->n = o->n_lengths;
	w->bytes = bytes;
	/* held <= bytes, which the writer's chan-bytes-per-uid took above: waiting writes hold
	 * no more than it, however many handles wait (1024 a session) */
	w->held = held;
	tpd_chan_payer_charge(w->payer, (int64_t)held);
	h->write_waits = true;
	c->n_writers++;
	tpu_list_insert_tail(&c->writers, &w->node);
}

/* A READ of @h while it holds an item (or one naming it, take_held): the held item into the
 * read's allocation, or its length again. */
static void read_held(struct chan_handle *h, const struct chan_read *rd)
{
	struct chan_item *it = h->held;
	char why[120];

	if (!it)
		return tpd_chan_answer(&h->who, rd->req_id, -ENOENT, "this handle holds no item",
				       h->id, h->c->closed, NULL);
	if (rd->msg)
		return tpd_chan_msg_answer_held(h, rd->req_id, it);
	if (it->desc)
		return refuse_msg(h, rd);
	if (!rd->dst_set)
		return tpd_chan_answer_len(h, rd->req_id, 0, NULL, it->len);
	if (it->len > rd->room) {
		snprintf(why, sizeof(why), "the held item of %zu bytes does not fit the read's %llu",
			 it->len, (unsigned long long)rd->room);
		return tpd_chan_answer_len(h, rd->req_id, -EMSGSIZE, why, it->len);
	}
	h->held = NULL;
	if (!map_offer(h, rd, it, true))
		copy_out(h, rd->req_id, it, &rd->dst);
}

/* @o's READ as a struct chan_read, its destination resolved in @h's session. Return: 0 or
 * -errno (the reason in @why). */
static int read_params(struct chan_handle *h, const Tpw__V1__ChanOp *o, struct chan_read *rd,
		       char *why, size_t wl)
{
	uint32_t seg_max = tpd_daemon_limits(h->c->cs->d)->segments_max;

	*rd = (struct chan_read){ .req_id = o->req_id, .max = o->max_items ? o->max_items : 1,
				 .msg = o->msg,
				 /* a client's packed read, or a far reader's (into its daemon's
				  * receive: inline items packed within its room, chanx.c) */
				 .pack = (o->pack && h->who.s) || (o->pack_peer && h->who.pr),
				 .pack_copied = o->pack_copied && o->pack && h->who.s,
				 .pack_mapped = o->pack_mapped && o->pack && h->who.s };
	if (h->who.pr && rd->max > seg_max) /* a far daemon's batch (a client's was checked) */
		rd->max = seg_max ? seg_max : 1;
	rd->fast = (h->who.s ? tpd_session_client_minor(h->who.s) >= TPW_MINOR_CHAN_FAST
			     : tpd_peer_chan_far_minor(h->who.pr) >= TPW_PEER_MINOR_CHAN_STREAM) &&
		   !o->inline_only;
	if (h->who.pr && o->xfer_id) { /* the forwarding daemon's receive (chanx.c) */
		rd->room = o->room;
		rd->dst_set = true;
		rd->dst = (struct tpb_mem){ .loc = TPB_LOC_REMOTE, .addr = o->xfer_id };
		return 0;
	}
	rd->map = o->map_ok && h->who.s &&
		  tpd_session_client_minor(h->who.s) >= TPW_MINOR_CHAN_MAP;
	rd->n_mapped = TPU_MIN(o->n_mapped, TPW_CHAN_MAPPED_MAX); /* validated: at most that */
	if (rd->n_mapped) /* (never memcpy() from NULL, even 0 bytes) */
		memcpy(rd->mapped, o->mapped, rd->n_mapped * sizeof(*rd->mapped));
	if (!o->n_segments)
		return 0;
	rd->room = o->segments[0]->length;
	rd->dst_set = true;
	return tpd_chan_copy_resolve(h->who.s, o->segments[0], &rd->dst, why, wl);
}

void tpd_chan_io_read(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o)
{
	struct chan *c = h->c;
	struct chan_wait *w = NULL;
	struct chan_read rd;
	char why[200];
	int r;

	if (o->msg && o->take_held) /* its segments are the reader's slots */
		return tpd_chan_msg_take(cs, h, o);
	if (o->map_done)
		return map_done(h, o);
	r = read_params(h, o, &rd, why, sizeof(why));
	if (r < 0)
		return tpd_chan_answer(&h->who, o->req_id, r, why, h->id, c->closed, NULL);
	if (h->held || o->take_held) {
		read_held(h, &rd);
		return tpd_chan_copy_put(&rd.dst);
	}
	if (c->n_items && tpu_list_empty(&c->waiters)) {
		chan_deliver(h, &rd);
		tpd_chan_copy_put(&rd.dst);
		return tpd_chan_io_serve(c); /* room for waiting writers */
	}
	if (chan_drained(c))
		tpd_chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed and drained",
				h->id, true, NULL);
	else if (o->timeout_ms == 0)
		tpd_chan_answer(&h->who, o->req_id, -ETIMEDOUT, "the channel is empty", h->id,
				c->closed, NULL);
	else if (h->waits >= CHAN_WAITS_PER_HANDLE)
		tpd_chan_answer(&h->who, o->req_id, -ENOBUFS, "too many reads waiting on this "
				"handle", h->id, false, NULL);
	else if ((r = wait_new(cs, h, o->req_id, o->timeout_ms, &w, why, sizeof(why))) < 0)
		tpd_chan_answer(&h->who, o->req_id, r, why, h->id, false, NULL);
	if (!w)
		return tpd_chan_copy_put(&rd.dst);
	w->rd = rd; /* the wait keeps the destination's reference */
	h->waits++;
	c->n_waiters++;
	tpu_list_insert_tail(&c->waiters, &w->node);
	tpd_chan_io_serve(c);
}
