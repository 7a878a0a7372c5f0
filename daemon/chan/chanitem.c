/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The items of the daemon's channels (chan_int.h): where an item's bytes lie, items and batches
 * made and freed, the spare buffers of items copied in kept for the next ones, the oldest item
 * taken out of a channel and given back, a write's batch built from its op, and the staging
 * buffers writers lend (ChanOp.lend) with their charge to the lender, and the charge of items
 * to the uid or far daemon whose write put them there (their payer). Leaves channels,
 * handles and the limits per uid to chan.c, and when items move (writes, reads, copies) to
 * chanio.c. Everything runs on the daemon's loop thread.
 */
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"
#include "chancopy.h"
#include "config.h"
#include "core.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

/* Where @it's bytes lie: in the daemon, or in the buffer its writer lent. */
const uint8_t *tpd_chan_item_bytes(const struct chan_item *it)
{
	return it->lend ? (const uint8_t *)(uintptr_t)it->src.addr : it->data;
}

/* Tells @h now of its lent buffers given up (ids taken from @h->released): notices of at most
 * TPW_CHAN_RELEASED_MAX ids each, req_id 0. */
static void released_notice(struct chan_handle *h)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint32_t off = 0;

	r.status = tpw_status_from_errno(0);
	r.message = (char *)"";
	r.chan_id = h->id;
	r.closed = h->c->closed;
	while (off < h->n_released) {
		r.n_released = TPU_MIN(h->n_released - off, TPW_CHAN_RELEASED_MAX);
		r.released = h->released + off;
		tpd_chan_reply_send(&h->who, &r, NULL, 0);
		off += (uint32_t)r.n_released;
	}
	tpd_session_log(h->who.s, TPU_LOG_DEBUG, "channel '%s': %u lent buffer(s) given back, "
			"handle %llu told", h->c->name, off, (unsigned long long)h->id);
	h->n_released = 0;
}

/* The end of a turn of the loop that gave up lent buffers: each handle waiting for a notice
 * gets one (those whose next write's answer took the ids meanwhile get none). */
static void chans_on_notice(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_chans *cs = arg;
	struct chan_handle *h;

	(void)fd;
	(void)what;
	while (!tpu_list_empty(&cs->noticing)) {
		h = tpu_list_first(&cs->noticing, struct chan_handle, notice_node);
		tpu_list_remove(&h->notice_node);
		h->noticing = false;
		if (h->n_released)
			released_notice(h);
	}
}

/* @h has an id more in @h->released: a client that takes notices (minor >= 13) is told at the
 * end of this turn of the loop, once for all its ids (at most one pending notice a handle);
 * others wait for their next write's answer. */
static void released_due(struct chan_handle *h)
{
	struct tpd_chans *cs = h->c->cs;

	if (h->noticing || !h->who.s ||
	    tpd_session_client_minor(h->who.s) < TPW_MINOR_CHAN_RELEASED)
		return;
	if (!cs->notice_ev)
		cs->notice_ev = event_new(tpd_daemon_base(cs->d), -1, 0, chans_on_notice, cs);
	if (!cs->notice_ev)
		return; /* out of memory: its next write's answer says it */
	if (tpu_list_empty(&cs->noticing))
		event_active(cs->notice_ev, EV_TIMEOUT, 0);
	tpu_list_insert_tail(&cs->noticing, &h->notice_node);
	h->noticing = true;
}

/* One item of lent buffer @l left its channel; the last one gives the buffer back to its lender
 * (the id in its handle's next write answer, or a notice before it) and the lender's uid the
 * buffer's charge. */
static void lend_put(struct chan_lend *l)
{
	struct chan_handle *h = l->h;
	uint64_t *v;

	uint64_t *lent;

	if (--l->items)
		return;
	lent = tpd_chan_lent_of(l->c->cs, l->uid, false);
	if (lent) /* there since tpd_chan_item_lend_batch() */
		*lent -= l->buf->size;
	if (lent && !*lent) { /* the uid lends nothing more: its entry goes */
		struct tpd_chans *cs = l->c->cs;
		struct chan_lent_uid *e = tpu_container_of(lent, struct chan_lent_uid, bytes);

		*e = cs->lent[--cs->n_lent];
	}
	if (h && h->n_released == h->cap_released) {
		v = realloc(h->released, (h->cap_released * 2 + 8) * sizeof(*v));
		if (v) { /* else the lender keeps the buffer until it releases the handle */
			h->released = v;
			h->cap_released = h->cap_released * 2 + 8;
		}
	}
	if (h && h->n_released < h->cap_released) {
		h->released[h->n_released++] = l->buf->id;
		released_due(h);
	}
	if (l->buf->map_key && !--l->buf->map_lends && l->buf->map_dropped)
		tpd_chan_item_retire(l->c->cs, l->buf); /* its writer let go of it before */
	tpu_list_remove(&l->node);
	tpb_buffer_unref(l->buf);
	free(l);
}

/* Frees @it, or keeps its buffer in @cs (may be NULL) for a later item copied in. */
void tpd_chan_item_free(struct tpd_chans *cs, struct chan_item *it)
{
	struct chan_item *old;

	if (it && it->lend)
		lend_put(it->lend);
	if (it && it->ref)
		tpd_chan_copy_put(&it->src);
	if (it && it->payer) { /* read, dropped, or its channel freed: its payer's again */
		tpd_chan_payer_charge(it->payer, -(int64_t)it->paid);
		tpd_chan_payer_unref(it->payer);
		it->payer = NULL;
		it->paid = 0;
	}
	if (it) {
		free(it->desc);
		it->desc = NULL;
		it->desc_len = 0;
	}
	if (!it || !cs || !it->cap || it->cap > CHAN_SPARE_BYTES)
		return free(it);
	while (cs->n_spare && (cs->n_spare == CHAN_SPARE_MAX ||
			       cs->spare_bytes + it->cap > CHAN_SPARE_BYTES)) {
		old = tpu_list_first(&cs->spare, struct chan_item, node);
		tpu_list_remove(&old->node);
		cs->n_spare--;
		cs->spare_bytes -= old->cap;
		free(old);
	}
	tpu_list_remove(&it->node);
	tpu_list_insert_tail(&cs->spare, &it->node);
	cs->n_spare++;
	cs->spare_bytes += it->cap;
}

/* A buffer for an item of @len bytes copied in: a spare one of @cs not much larger, or a new
 * one. Return: owned (tpd_chan_item_free()), or NULL. */
struct chan_item *tpd_chan_item_new_copied(struct tpd_chans *cs, size_t len)
{
	struct chan_item *it;

	tpu_list_for_each(it, &cs->spare, node) {
		if (it->cap < len || it->cap - len > len / 4)
			continue;
		tpu_list_remove(&it->node);
		cs->n_spare--;
		cs->spare_bytes -= it->cap;
		*it = (struct chan_item){ .len = len, .cap = it->cap };
		tpu_list_init(&it->node);
		return it;
	}
	it = malloc(sizeof(*it) + len);
	if (!it)
		return NULL;
	*it = (struct chan_item){ .len = len, .cap = len };
	tpu_list_init(&it->node);
	return it;
}

void tpd_chan_item_batch_free(struct tpd_chans *cs, struct tpu_list *batch)
{
	struct chan_item *it, *tmp;

	tpu_list_for_each_safe(it, tmp, batch, node) {
		/* Unlinked first: an item kept as a spare buffer is moved by unlinking it, which
		 * would write into one freed before it (a hand-off's batch: the writer's items by
		 * reference, freed, then the daemon's, kept). */
		tpu_list_remove(&it->node);
		tpd_chan_item_free(cs, it);
	}
	tpu_list_init(batch);
}

/* Takes the oldest item out of @c's list; it stays charged to @c (@n_outs) until delivered. */
struct chan_item *tpd_chan_item_take(struct chan *c)
{
	struct chan_item *it = tpu_list_first(&c->items, struct chan_item, node);

	tpu_list_remove(&it->node);
	c->n_items--;
	c->n_outs++;
	return it;
}

/* Moves @from's message descriptor (if any) to @to: the item copied in takes the place of the
 * reference it was written as. */
void tpd_chan_item_move_desc(struct chan_item *to, struct chan_item *from)
{
	to->desc = from->desc;
	to->desc_len = from->desc_len;
	from->desc = NULL;
	from->desc_len = 0;
	to->payer = from->payer;
	to->paid = from->paid;
	from->payer = NULL;
	from->paid = 0;
}

void tpd_chan_item_pay(struct chan_payer *p, struct tpu_list *batch)
{
	struct chan_item *it;

	tpu_list_for_each(it, batch, node) {
		assert(!it->payer);
		it->payer = p;
		it->paid = tpd_chan_item_charge(it);
		tpd_chan_payer_ref(p);
		tpd_chan_payer_charge(p, (int64_t)it->paid);
	}
}

int tpd_chan_item_set_desc(struct chan_item *it, const Tpw__V1__Descriptor *m)
{
	it->desc_len = protobuf_c_message_get_packed_size(&m->base);
	it->desc = malloc(it->desc_len ? it->desc_len : 1);
	if (!it->desc) {
		it->desc_len = 0;
		return -ENOMEM;
	}
	protobuf_c_message_pack(&m->base, it->desc);
	return 0;
}

void tpd_chan_item_srcs(const struct chan_item *it, struct tpb_xfer *x, size_t n)
{
	uint64_t off = 0;

	for (size_t i = 0; i < n; i++) {
		x[i].src = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					     .addr = (uint64_t)(uintptr_t)it->data + off };
		if (it->lend) { /* the copy holds the lent buffer too */
			x[i].src = it->src;
			x[i].src.addr += off;
		}
		off += x[i].len;
	}
}

/* An item taken out goes back to the head of @c: its read failed or its reader went. */
void tpd_chan_item_give_back(struct chan *c, struct chan_item *it)
{
	tpu_list_insert_head(&c->items, &it->node);
	c->n_items++;
	c->n_outs--;
}

/* An item taken out was delivered: it leaves @c. */
void tpd_chan_item_done(struct chan *c, struct chan_item *it)
{
	assert(it->payer && it->paid == tpd_chan_item_charge(it)); /* admitted, paid */
	c->n_outs--;
	c->bytes -= tpd_chan_item_charge(it);
	c->read++;
	tpd_chan_item_free(c->cs, it);
}

/* A new item of @len bytes, its data copied from @from if not NULL. Return: owned
 * (tpd_chan_item_free()), or NULL. */
static struct chan_item *item_new(size_t len, const void *from)
{
	struct chan_item *it = malloc(sizeof(*it) + len);

	if (!it)
		return NULL;
	*it = (struct chan_item){ .len = len };
	tpu_list_init(&it->node);
	if (from)
		memcpy(it->data, from, len);
	return it;
}

/* Builds @batch from @o's items: inline ones copied from @tail now; with segments (a client's
 * write, validated), an item by reference resolved in the writer's memory (an item with @ref,
 * copied once admitted). Return: 0 or -errno with the reason in @why (@batch freed). */
int tpd_chan_item_batch_build(struct tpd_session *s, const Tpw__V1__ChanOp *o, const uint8_t *tail,
			      struct tpu_list *batch, char *why, size_t wl)
{
	const Tpw__V1__Segment *g;
	struct chan_item *it;
	size_t off = 0;
	int r;

	for (size_t i = 0; i < o->n_lengths; i++) {
		g = o->n_segments ? o->segments[i] : NULL;
		if (o->n_streamed && o->streamed[i]) { /* a peer's: over the link once admitted */
			it = item_new(0, NULL);
			r = it ? 0 : -ENOMEM;
			if (it) {
				it->ref = true;
				it->len = o->lengths[i];
				it->src.loc = TPB_LOC_REMOTE;
			}
		} else if (g && g->loc_case != TPW__V1__SEGMENT__LOC_INLINE_OFF) {
			it = item_new(0, NULL);
			r = it ? tpd_chan_copy_resolve(s, g, &it->src, why, wl) : -ENOMEM;
			if (r == 0) {
				it->ref = true;
				it->len = o->lengths[i];
			}
		} else {
			it = item_new(o->lengths[i], tail + off);
			off += o->lengths[i];
			r = it ? 0 : -ENOMEM;
		}
		if (r == 0 && o->n_msgs) /* checked: one per item (chanmsg.c) */
			r = tpd_chan_item_set_desc(it, o->msgs[i]);
		if (r < 0) {
			if (r == -ENOMEM)
				snprintf(why, wl, "out of memory");
			if (it && it->ref)
				tpd_chan_copy_put(&it->src);
			if (it)
				free(it->desc);
			free(it);
			tpd_chan_item_batch_free(NULL, batch);
			return r;
		}
		tpu_list_insert_tail(batch, &it->node);
	}
	return 0;
}

/* Whether lending buffer @buf of uid @lender to @c would pass @lender's chan-bytes-per-uid,
 * which pays for the batch already (its writer's) and would pay for the whole buffer too. */
static bool lend_over(const struct chan *c, uid_t lender, const struct tpb_buffer *buf)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(c->cs->d);

	return tpd_chan_uid_bytes(c->cs, lender, NULL) + buf->size > cfg->chan_bytes_per_uid;
}

/* Keeps the items by reference of @batch (room checked, paid by its writer) where
 * they lie, when all lie in one shared buffer of the writer (ChanOp.lend: a staging buffer it
 * lends) and the lender's chan-bytes-per-uid takes the whole buffer besides the batch: the daemon
 * never keeps more of anyone's memory mapped than it charges that one, whether the channel stays
 * named or not. The buffer is the lender's charge, not the owner's: a writer of another uid
 * lending a large buffer with a small item took the owner's whole chan-bytes-per-uid past the
 * channel's capacity, as long as the item stayed unread (for good once the owner had unlinked
 * the channel and let go of it).
 * Return: true if they stay there. */
bool tpd_chan_item_lend_batch(struct chan_handle *h, struct tpu_list *batch)
{
	struct chan *c = h->c;
	struct tpb_buffer *buf = NULL;
	struct chan_item *it;
	struct chan_lend *l;
	uint64_t *lent;

	tpu_list_for_each(it, batch, node) {
		if (!it->ref)
			continue;
		if (!it->src.buf || (buf && it->src.buf != buf))
			return false; /* CMA, or items in several buffers: copied in */
		buf = it->src.buf;
	}
	if (!buf || !h->who.s || lend_over(c, tpd_session_uid(h->who.s), buf))
		return false; /* copied in: charged its bytes only */
	lent = tpd_chan_lent_of(c->cs, tpd_session_uid(h->who.s), true);
	l = lent ? calloc(1, sizeof(*l)) : NULL;
	if (!l)
		return false;
	*l = (struct chan_lend){ .h = h, .c = c, .buf = tpb_buffer_ref(buf),
				 .uid = (uint32_t)tpd_session_uid(h->who.s) }; /* lends: local */
	tpu_list_insert_tail(&h->lends, &l->node);
	tpu_list_for_each(it, batch, node) {
		if (it->ref) {
			it->lend = l;
			l->items++;
		}
	}
	*lent += buf->size;
	if (buf->map_key)
		buf->map_lends++;
	return true;
}

void tpd_chan_item_retire(struct tpd_chans *cs, struct tpb_buffer *b)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint64_t key = b->map_key;
	struct chan_handle *h;
	uint32_t i;

	if (!b->map_shown)
		return; /* no reader was sent its fd since it was last retired */
	b->map_shown = false;
	r.status = tpw_status_from_errno(0);
	r.message = (char *)"";
	r.n_retired = 1;
	r.retired = &key;
	tpu_list_for_each(h, &cs->handles, node) {
		for (i = 0; i < h->n_sent && h->sent[i] != key; i++)
			;
		if (i == h->n_sent)
			continue;
		memmove(&h->sent[i], &h->sent[i + 1], (h->n_sent - i - 1) * sizeof(h->sent[0]));
		h->n_sent--;
		h->c->maps_held--;
		h->c->maps_retired++;
		r.chan_id = h->id; /* (only local sessions of minor >= 12 have keys here) */
		r.closed = h->c->closed;
		tpd_chan_reply_send(&h->who, &r, NULL, 0);
		tpd_session_log(h->who.s, TPU_LOG_DEBUG, "channel '%s': buffer %llu retired, "
				"handle %llu told", h->c->name, (unsigned long long)key,
				(unsigned long long)h->id);
	}
}
