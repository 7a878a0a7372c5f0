/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Hand-off of a write to readers already waiting (docs/channels.md, "Items handed off"): a
 * batch whose items by reference lie in the writer's shared buffers, written to a channel that
 * holds no item and copies no other batch in, goes with one copy: its first items straight
 * into the allocations the oldest waiting reads named, one each, oldest first; the rest into
 * items of the daemon; all in one copy job. Then the readers are answered, the rest appended
 * (contiguous), and the writer answered: a write still completes when its items are delivered
 * or in the channel. An item whose reader went during the copy is copied in again from the
 * writer's memory (still the write's: it is not answered yet) and goes, with the rest, to the
 * head of the channel. Responsible for choosing the readers and for the hand-off's outcome;
 * not for deciding that a write fits (chanio.c) nor for channels' state (chan.c).
 */
#include <errno.h>
#include <stdlib.h>

#include "chan_int.h"
#include "chancopy.h"
#include "core.h"
#include "tpu.h"
#include "frame.h"
#include "validate.h"

/* Does the item by reference @it qualify: in a shared buffer of its writer, above the size that
 * rides inline from one, a byte item? */
static bool item_ok(const struct chan_item *it)
{
	return it->ref && !it->lend && !it->desc && it->src.loc == TPB_LOC_LOCAL && it->src.buf &&
	       it->len > TPW_CHAN_SHM_ITEM;
}

/* Does [@a, @a + @alen) meet [@b, @b + @blen)? (Ranges resolved inside one mapping: no wrap.) */
static bool overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

/* Can the waiting read @w take @it straight into its allocation: a local byte read naming a
 * shared buffer with room (packed: for an item above the inline size), which no item of @batch
 * is read from (a session may read and write
 * one buffer: the copy would run over its own source)? */
static bool reader_ok(const struct chan_wait *w, const struct chan_item *it,
		      const struct tpu_list *batch)
{
	const struct chan_read *rd = &w->rd;
	const struct chan_item *o;

	if (!w->h->who.s || rd->msg || !rd->dst_set || rd->dst.loc != TPB_LOC_LOCAL ||
	    !rd->dst.buf || it->len > rd->room || (rd->pack && it->len <= TPW_CHAN_INLINE_ITEM))
		return false; /* (a packed read takes such an item inline, with those after it) */
	tpu_list_for_each(o, batch, node)
		if (o->src.buf == rd->dst.buf && overlap(o->src.addr, o->len, rd->dst.addr, it->len))
			return false;
	return true;
}

/* How many of @batch's first items the oldest waiting reads of @c take, one each (0: none). */
static size_t readers_for(const struct chan *c, const struct tpu_list *batch)
{
	const struct tpu_list *wn = c->waiters.next;
	const struct chan_item *it;
	size_t k = 0;

	tpu_list_for_each(it, batch, node) {
		if (wn == &c->waiters ||
		    !reader_ok(tpu_container_of(wn, struct chan_wait, node), it, batch))
			break;
		k++;
		wn = wn->next;
	}
	return k;
}

/* Answers the read @to: its item of @len bytes is in its allocation. */
static void reader_answer(const struct chan *c, const struct chan_hand *to, uint64_t len)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;

	r.req_id = to->req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = to->h->id;
	r.closed = c->closed;
	r.n_lengths = 1;
	r.lengths = &len;
	r.copied = true;
	tpd_chan_reply_send(&to->h->who, &r, NULL, 0);
}

/* The copy in of a hand-off's items whose readers went, with the rest of its batch (@cp->batch,
 * in order) ended: they go to the head of the channel, closed or not (the batch was admitted
 * before), and the writer is answered; on failure (the daemon stops) nothing goes in. */
static void back_on_done(void *arg, int status, const char *why)
{
	struct chan_copy *cp = arg;
	struct chan *c = cp->c;

	c->res_items -= (uint32_t)cp->n;
	c->n_outs -= (uint32_t)cp->n;
	c->bytes -= cp->bytes;
	if (status == 0) {
		tpu_list_splice_head(&c->items, &cp->batch);
		c->n_items += (uint32_t)cp->n;
		c->bytes += cp->bytes;
		c->written += cp->n;
	}
	if (cp->h && status == 0)
		tpd_chan_io_write_answer(cp->h, cp->req_id);
	else if (cp->h)
		tpd_chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed, NULL);
	tpd_chan_io_serve(c);
	tpd_chan_io_copy_free(cp);
}

/* Copies in @back (@n items left of the hand-off @cp, @bytes: the writer's by reference whose
 * reader went, and those copied in already), for back_on_done(). Takes @back's items. */
static void hand_back(struct chan_copy *cp, struct tpu_list *back, size_t n, uint64_t bytes)
{
	struct chan *c = cp->c;
	struct chan_copy *b = tpd_chan_io_copy_new(c, cp->h, cp->req_id);
	int r = -ENOMEM;

	if (b) {
		b->n = n; /* (the copy's size) */
		b->bytes = bytes;
		r = tpd_chan_io_copy_in_start(b, back, back_on_done);
	}

	if (r < 0) {
		tpd_chan_item_batch_free(c->cs, back);
		if (b)
			tpd_chan_io_copy_free(b);
		if (cp->h)
			tpd_chan_answer(&cp->h->who, cp->req_id, r, "cannot copy the items whose "
					"reader went into the channel", cp->h->id, c->closed, NULL);
		return;
	}
	c->res_items += (uint32_t)n;
	c->n_outs += (uint32_t)n;
	c->bytes += bytes;
}

/*
 * The hand-off's copy ended. Each read still there gets its item; the rest of the batch is
 * appended (a closed channel too: some of the batch may be delivered, and a batch goes whole)
 * and the writer answered, unless a reader went: then its item and the rest are copied in
 * (hand_back()). A copy that failed (only when the daemon stops) fails the readers and the
 * write: nothing of the batch is delivered.
 */
static void hand_on_done(void *arg, int status, const char *why)
{
	struct chan_copy *cp = arg;
	struct chan *c = cp->c;
	struct tpu_list back = TPU_LIST_INIT(back);
	struct chan_item *it, *tmp;
	size_t i = 0, n_back = 0, gone = 0;
	uint64_t back_bytes = 0;

	c->res_items -= (uint32_t)cp->n;
	c->handing -= (uint32_t)cp->n;
	c->n_outs -= (uint32_t)cp->n;
	c->bytes -= cp->bytes;
	tpu_list_for_each_safe(it, tmp, &cp->batch, node) {
		struct chan_hand *to = i < cp->k ? &cp->to[i] : NULL;

		i++;
		if (status < 0 && to && to->h)
			tpd_chan_answer(&to->h->who, to->req_id, status, why, to->h->id, c->closed,
					NULL);
		if (status < 0)
			continue; /* (freed with @cp) */
		if (to && to->h) {
			reader_answer(c, to, it->len);
			tpu_list_remove(&it->node);
			tpd_chan_item_free(c->cs, it);
			c->written++;
			c->read++;
			c->handed++;
			c->cs->handed++;
			continue;
		}
		gone += to != NULL;
		tpu_list_remove(&it->node);
		tpu_list_insert_tail(&back, &it->node);
		n_back++;
		back_bytes += tpd_chan_item_charge(it);
	}
	if (status < 0 && cp->h)
		tpd_chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed, NULL);
	if (status == 0 && gone) {
		c->handed_back += gone;
		hand_back(cp, &back, n_back, back_bytes);
	} else if (status == 0) {
		tpd_chan_io_append(c, &back, n_back, back_bytes);
		if (cp->h)
			tpd_chan_io_write_answer(cp->h, cp->req_id);
	}
	tpd_chan_io_serve(c);
	tpd_chan_io_copy_free(cp);
}

/* Starts the hand-off @cp of @batch (@n items, of which the first @cp->k go to the oldest
 * waiting reads, recorded in @cp->to): the copy job, and the rest's items of the daemon taking
 * the place of their references. Return: 0 (@batch's items moved to @cp->batch) or -errno
 * (nothing changed). */
static int hand_start(struct chan_copy *cp, struct tpu_list *batch, size_t n)
{
	struct chan *c = cp->c;
	struct tpb_xfer *x = calloc(n, sizeof(*x));
	struct tpu_list dups = TPU_LIST_INIT(dups);
	const struct tpu_list *wn = c->waiters.next;
	struct chan_item *it, *tmp, *dup;
	size_t i = 0;
	int r = -ENOMEM;

	if (!x)
		return -ENOMEM;
	tpu_list_for_each(it, batch, node) {
		x[i] = (struct tpb_xfer){ .src = it->src, .len = it->len };
		if (i < cp->k) {
			const struct chan_wait *w = tpu_container_of(wn, struct chan_wait, node);

			x[i].dst = w->rd.dst;
			cp->to[i] = (struct chan_hand){ .h = w->h, .req_id = w->req_id };
			wn = wn->next;
		} else if ((dup = tpd_chan_item_new_copied(c->cs, it->len))) {
			x[i].dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
						     .addr = (uint64_t)(uintptr_t)dup->data };
			tpu_list_insert_tail(&dups, &dup->node);
		} else {
			goto fail;
		}
		i++;
	}
	r = tpd_chan_copy_start(c->cs->d, x, n, hand_on_done, cp);
	if (r < 0)
		goto fail;
	i = 0; /* the rest: the daemon's items take the place of the references */
	tpu_list_for_each_safe(it, tmp, batch, node) {
		tpu_list_remove(&it->node);
		if (i++ < cp->k) {
			tpu_list_insert_tail(&cp->batch, &it->node);
			continue;
		}
		dup = tpu_list_first(&dups, struct chan_item, node);
		tpu_list_remove(&dup->node);
		tpu_list_insert_tail(&cp->batch, &dup->node);
		tpd_chan_item_move_desc(dup, it); /* and its payer */
		tpd_chan_item_free(NULL, it);
	}
	free(x);
	return 0;
fail:
	tpd_chan_item_batch_free(c->cs, &dups);
	free(x);
	return r;
}

bool tpd_chan_hand_try(struct chan_handle *h, uint64_t req_id, struct tpu_list *batch, size_t n,
		       uint64_t bytes)
{
	struct chan *c = h->c;
	struct chan_item *it;
	struct chan_wait *w, *tmp;
	struct chan_copy *cp;
	size_t k;

	if (!h->who.s || c->n_items || c->res_items != c->handing || !c->n_waiters)
		return false;
	tpu_list_for_each(it, batch, node)
		if (!item_ok(it))
			return false;
	k = readers_for(c, batch);
	if (!k)
		return false;
	cp = tpd_chan_io_copy_new(c, h, req_id);
	if (!cp)
		return false;
	cp->to = calloc(k, sizeof(*cp->to));
	cp->k = k;
	if (!cp->to || hand_start(cp, batch, n) < 0) {
		tpd_chan_io_copy_free(cp);
		return false; /* (the normal way: copied in) */
	}
	cp->n = n;
	cp->bytes = bytes;
	c->res_items += (uint32_t)n;
	c->handing += (uint32_t)n;
	c->n_outs += (uint32_t)n;
	c->bytes += bytes;
	tpu_list_for_each_safe(w, tmp, &c->waiters, node) { /* the reads now copied into */
		if (!k--)
			break;
		tpd_chan_io_wait_free(w);
	}
	return true;
}

void tpd_chan_hand_forget(struct chan *c, const struct chan_handle *h)
{
	struct chan_copy *cp;

	tpu_list_for_each(cp, &c->copies, node)
		for (size_t i = 0; i < cp->k; i++)
			if (cp->to[i].h == h)
				cp->to[i].h = NULL;
}
