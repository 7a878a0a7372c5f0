/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Named channels hosted by the daemon (chan.h). Responsible for the channel registry, each
 * channel's items and waiting readers, handles per session, deadlines of waiting reads and the
 * limits per uid and per channel, and which item goes inline, into a reader's allocation or
 * held for a reader (items that do not ride inline are copied by chancopy.c). Not responsible
 * for sessions or frames (local/). Everything runs on the daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "chan.h"
#include "chancopy.h"
#include "chanx.h"
#include "config.h"
#include "core.h"
#include "local.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

#define CHAN_WAITS_PER_HANDLE 64u /* reads one handle may have waiting at once */
#define CHAN_HANDLES_PER_SESSION 1024u
#define CHAN_NO_DEADLINE UINT32_MAX
/* Freed buffers of items copied in by reference kept for the next ones (malloc() would map and
 * unmap, and the kernel zero, every large item's pages): at most this many, this many bytes,
 * daemon-wide. */
#define CHAN_SPARE_MAX 8u
#define CHAN_SPARE_BYTES (64ull << 20)

/* A staging buffer a writer lent to a channel (ChanOp.lend): items of the channel lie in it. The
 * daemon keeps it mapped until the last of them leaves, and charges the channel owner's
 * chan-bytes-per-uid the whole buffer meanwhile, besides the items (tpd_chans.lent). */
struct chan_lend {
	struct tpu_list node;	/* in chan_handle.lends; unlinked once the handle is gone */
	struct chan_handle *h;	/* the lender, told when the last item leaves; NULL once gone */
	struct chan *c;
	struct tpb_buffer *buf; /* with a reference */
	uint32_t items;
};

struct chan_item {
	struct tpu_list node;
	size_t len;
	/* A write's item still in the writer's memory (no @data yet): where, with a reference
	 * (tpd_chan_copy_put()). In a channel's list only when @lend: its bytes stay there. */
	bool ref;
	struct tpb_mem src;
	struct chan_lend *lend;
	size_t cap; /* an item copied in: @data's bytes, reusable (tpd_chans.spare); else 0 */
	uint8_t data[];
};

/* What a read asks for. */
struct chan_read {
	uint64_t req_id;
	uint32_t max;	    /* items one answer may carry (>= 1) */
	bool fast;	    /* the reader takes held items (client minor >= 7) */
	bool dst_set;	    /* the read names where a large item goes: */
	struct tpb_mem dst; /* with a reference (tpd_chan_copy_put()) */
	uint64_t room;
};

struct chan {
	struct tpu_list node; /* in tpd_chans.chans while named, then tpd_chans.unlinked */
	char *name;
	uid_t uid;
	Tpw__V1__Access access;
	gid_t gid;
	Tpw__V1__RemoteAccess remote; /* who on other hosts may open it (NONE, ANY_PEER, PEERS) */
	char **remote_peers;	      /* REMOTE_PEERS: the identities allowed */
	size_t n_remote_peers;
	bool persistent, closed, named;
	uint32_t cap_items;
	uint64_t cap_bytes;
	struct tpu_list items;	 /* chan_item, oldest first */
	struct tpu_list waiters; /* chan_wait of reads, oldest first */
	struct tpu_list writers; /* chan_wait of writes waiting for room, oldest first */
	uint32_t n_items, n_handles, n_waiters, n_writers, n_remote;
	/* @bytes counts the items in @items, those held for a handle or being copied to a reader
	 * (@n_outs of them) and the batches being copied in (@res_items items). */
	uint64_t bytes, written, read;
	uint32_t res_items, n_outs;
	struct tpu_list copies; /* chan_copy running; the channel stays while there are some */
	struct tpd_chans *cs;
};

/* Whom a handle answers: a local session, or a peer link (the handle another host's daemon
 * opened for its client, whose uid there is @uid: a claim, never a permission). */
struct chan_who {
	struct tpd_session *s; /* NULL for a peer link's */
	struct tpd_peer *pr;
	uint32_t uid;
};

struct chan_handle {
	struct tpu_list node; /* in tpd_chans.handles */
	struct chan_who who;
	uint64_t id;
	struct chan *c;
	unsigned waits;	 /* reads waiting */
	bool write_waits; /* a write waiting (one at most: its batch is held here) */
	struct chan_item *held; /* an item too large to answer inline, out of @c for this handle's
				 * next READ with take_held (ChanReply.held_len) */
	struct tpu_list lends;	/* chan_lend of buffers this handle lent */
	uint64_t *released;	/* ids of its lent buffers given up, for its next write's answer */
	uint32_t n_released, cap_released;
};

struct chan_wait {
	struct tpu_list node; /* in chan.waiters */
	struct chan_handle *h;
	uint64_t req_id;
	struct event *ev;
	struct tpd_chans *cs;
	bool write;		/* a write waiting for room: its batch */
	bool lend;		/* its items may stay in the buffer the writer lends */
	struct tpu_list batch; /* chan_item */
	size_t n;
	uint64_t bytes;
	struct chan_read rd; /* a read's */
};

/* A copy running between a client's memory and the daemon (chancopy.c): a batch of items
 * coming in (its room reserved in the channel), or an item going out to a reader. */
struct chan_copy {
	struct tpu_list node; /* in chan.copies */
	struct chan *c;
	struct chan_handle *h; /* NULL once the handle is gone: nobody is answered */
	uint64_t req_id;
	struct tpu_list batch; /* in: the items being filled */
	size_t n;
	uint64_t bytes;
	struct chan_item *item; /* out: the item */
};

struct tpd_chans {
	struct tpd_daemon *d;
	struct tpu_list chans;
	/* Channels unlinked while something keeps them (a handle, a copy): no longer found by
	 * name, still charged to their owner's chans-per-uid and chan-bytes-per-uid. */
	struct tpu_list unlinked;
	struct tpu_list handles;
	uint64_t next_id;
	struct tpd_chanx *x; /* channels and queues of other hosts (chanx.c) */
	struct tpu_list spare; /* chan_item buffers to reuse, oldest first (CHAN_SPARE_*) */
	unsigned n_spare;
	uint64_t spare_bytes;
	/* Bytes of lent buffers per channel owner, whether the channel is named or not. */
	struct chan_lent_uid {
		uid_t uid;
		uint64_t bytes;
	} *lent;
	size_t n_lent, cap_lent;
};

/* Where @it's bytes lie: in the daemon, or in the buffer its writer lent. */
static const uint8_t *item_bytes(const struct chan_item *it)
{
	return it->lend ? (const uint8_t *)(uintptr_t)it->src.addr : it->data;
}

static struct tpd_chans *chans_of(struct tpd_session *s)
{
	return tpd_daemon_chans(tpd_session_daemon(s));
}

/* Sends @r (its @n_lengths items in @tail, @n_tail pieces: one at most to a peer link). */
static void chan_reply_send(const struct chan_who *who, Tpw__V1__ChanReply *r,
			    const struct iovec *tail, size_t n_tail)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

	if (who->pr)
		return tpd_chanx_reply(who->pr, r, n_tail ? tail : NULL);
	m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	m.chan_reply = r;
	tpd_session_send(who->s, &m, n_tail ? tail : NULL, (int)n_tail);
}

static void chan_answer(const struct chan_who *who, uint64_t req_id, int err, const char *why,
			uint64_t id, bool closed, const struct chan_item *it)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct iovec tail;
	uint64_t len;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(err);
	r.message = (char *)(why ? why : "");
	r.chan_id = id;
	r.closed = closed;
	if (it) {
		len = it->len;
		r.n_lengths = 1;
		r.lengths = &len;
		tail.iov_base = (void *)item_bytes(it);
		tail.iov_len = it->len;
	}
	chan_reply_send(who, &r, &tail, it ? 1 : 0);
}

/* Answers a read with the length of an item it did not get: held for it (@err 0), or too large
 * for its allocation (@err -EMSGSIZE). */
static void chan_answer_len(const struct chan_handle *h, uint64_t req_id, int err,
			    const char *why, uint64_t len)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(err);
	r.message = (char *)(why ? why : "");
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.held_len = len;
	chan_reply_send(&h->who, &r, NULL, 0);
}

/* The bytes of buffers lent to channels of @uid: its entry in @cs (@add: made if missing), or
 * NULL. */
static uint64_t *lent_of(struct tpd_chans *cs, uid_t uid, bool add)
{
	struct chan_lent_uid *v;

	for (size_t i = 0; i < cs->n_lent; i++)
		if (cs->lent[i].uid == uid)
			return &cs->lent[i].bytes;
	if (!add)
		return NULL;
	if (cs->n_lent == cs->cap_lent) {
		v = realloc(cs->lent, (cs->cap_lent * 2 + 4) * sizeof(*v));
		if (!v)
			return NULL;
		cs->lent = v;
		cs->cap_lent = cs->cap_lent * 2 + 4;
	}
	cs->lent[cs->n_lent] = (struct chan_lent_uid){ .uid = uid };
	return &cs->lent[cs->n_lent++].bytes;
}

/* Bytes the channels created by @uid hold, named or unlinked and still alive, and the buffers
 * lent to any of them (whole); their number in *@ret_count. */
static uint64_t uid_bytes(const struct tpd_chans *cs, uid_t uid, uint32_t *ret_count)
{
	const uint64_t *lent = lent_of((struct tpd_chans *)cs, uid, false);
	const struct chan *c;
	uint64_t b = lent ? *lent : 0;
	uint32_t n = 0;

	tpu_list_for_each(c, &cs->chans, node)
		if (c->uid == uid) {
			b += c->bytes;
			n++;
		}
	tpu_list_for_each(c, &cs->unlinked, node)
		if (c->uid == uid) {
			b += c->bytes;
			n++;
		}
	if (ret_count)
		*ret_count = n;
	return b;
}

static void item_free(struct tpd_chans *cs, struct chan_item *it);

/* One item of lent buffer @l left its channel; the last one gives the buffer back to its lender
 * (the id in its handle's next write answer) and the channel owner the buffer's charge. */
static void lend_put(struct chan_lend *l)
{
	struct chan_handle *h = l->h;
	uint64_t *v;

	uint64_t *lent;

	if (--l->items)
		return;
	lent = lent_of(l->c->cs, l->c->uid, false);
	if (lent) /* there since lend_batch() */
		*lent -= l->buf->size;
	if (lent && !*lent) { /* the owner lends nothing more: its entry goes */
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
	if (h && h->n_released < h->cap_released)
		h->released[h->n_released++] = l->buf->id;
	tpu_list_remove(&l->node);
	tpb_buffer_unref(l->buf);
	free(l);
}

static void chan_free(struct chan *c)
{
	struct chan_item *it, *tmp;

	if (!c)
		return;
	tpu_list_remove(&c->node);
	tpu_list_for_each_safe(it, tmp, &c->items, node)
		item_free(c->cs, it);
	for (size_t i = 0; i < c->n_remote_peers; i++)
		free(c->remote_peers[i]);
	free(c->remote_peers);
	free(c->name);
	free(c);
}

/* Frees @c once nothing keeps it: no handle, no copy, and neither persistent nor named. */
static void chan_maybe_free(struct chan *c)
{
	if (c->n_handles == 0 && tpu_list_empty(&c->copies) && (!c->persistent || !c->named))
		chan_free(c);
}

/* Frees @it, or keeps its buffer in @cs (may be NULL) for a later item copied in. */
static void item_free(struct tpd_chans *cs, struct chan_item *it)
{
	struct chan_item *old;

	if (it && it->lend)
		lend_put(it->lend);
	if (it && it->ref)
		tpd_chan_copy_put(&it->src);
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
 * one. Return: owned (item_free()), or NULL. */
static struct chan_item *item_new_copied(struct tpd_chans *cs, size_t len)
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

static void batch_free(struct tpd_chans *cs, struct tpu_list *batch)
{
	struct chan_item *it, *tmp;

	tpu_list_for_each_safe(it, tmp, batch, node)
		item_free(cs, it);
	tpu_list_init(batch);
}

static void wait_free(struct chan_wait *w)
{
	tpu_list_remove(&w->node);
	if (w->write) {
		batch_free(w->cs, &w->batch);
		w->h->c->n_writers--;
		w->h->write_waits = false;
	} else {
		tpd_chan_copy_put(&w->rd.dst);
		w->h->c->n_waiters--;
		w->h->waits--;
	}
	if (w->ev)
		event_free(w->ev);
	free(w);
}

/* Takes the oldest item out of @c's list; it stays charged to @c (@n_outs) until delivered. */
static struct chan_item *item_take(struct chan *c)
{
	struct chan_item *it = tpu_list_first(&c->items, struct chan_item, node);

	tpu_list_remove(&it->node);
	c->n_items--;
	c->n_outs++;
	return it;
}

/* An item taken out goes back to the head of @c: its read failed or its reader went. */
static void item_give_back(struct chan *c, struct chan_item *it)
{
	tpu_list_insert_head(&c->items, &it->node);
	c->n_items++;
	c->n_outs--;
}

/* An item taken out was delivered: it leaves @c. */
static void item_done(struct chan *c, struct chan_item *it)
{
	c->n_outs--;
	c->bytes -= it->len;
	c->read++;
	item_free(c->cs, it);
}

/* Answers @rd with the oldest items of @c, inline: the first, and while @rd takes more, the
 * following ones that ride inline too, up to the daemon's inline limit in all. */
static void deliver_inline(struct chan_handle *h, const struct chan_read *rd)
{
	uint32_t inline_max = tpd_daemon_limits(h->c->cs->d)->inline_max;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct chan *c = h->c;
	uint64_t one_len, total = 0;
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
		if (n && (n == max || it->len > TPW_CHAN_INLINE_ITEM || total + it->len > inline_max))
			break;
		iov[n] = (struct iovec){ .iov_base = (void *)item_bytes(it), .iov_len = it->len };
		lens[n++] = it->len;
		total += it->len;
	}
	r.req_id = rd->req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = h->id;
	r.closed = c->closed;
	r.n_lengths = n;
	r.lengths = lens;
	chan_reply_send(&h->who, &r, iov, n);
	for (size_t i = 0; i < n; i++)
		item_done(c, item_take(c));
	if (iov != &one_iov)
		free(iov);
	if (lens != &one_len)
		free(lens);
}

static void copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
		     const struct tpb_mem *dst);

/* Hands the oldest item of @c to @h's read @rd (which must be there): inline, into the read's
 * allocation, or held for @h (a large item and a reader that takes held items); a read that
 * cannot take it fails and leaves it first in @c. */
static void chan_deliver(struct chan_handle *h, const struct chan_read *rd)
{
	struct chan *c = h->c;
	struct chan_item *it = tpu_list_first(&c->items, struct chan_item, node);
	char why[160];

	if (rd->dst_set && it->len > rd->room) {
		snprintf(why, sizeof(why), "an item of %zu bytes does not fit the read's %llu",
			 it->len, (unsigned long long)rd->room);
		return chan_answer_len(h, rd->req_id, -EMSGSIZE, why, it->len);
	}
	if (rd->dst_set && (it->len > TPW_CHAN_INLINE_ITEM ||
			    (rd->dst.buf && it->len > TPW_CHAN_SHM_ITEM)))
		return copy_out(h, rd->req_id, item_take(c), &rd->dst);
	if (it->len <= TPW_CHAN_INLINE_ITEM)
		return deliver_inline(h, rd);
	if (rd->fast) { /* another read of @h (another thread) may have been answered first */
		if (!h->held)
			h->held = item_take(c);
		return chan_answer_len(h, rd->req_id, 0, NULL, h->held->len);
	}
	if (it->len <= tpd_daemon_limits(c->cs->d)->inline_max)
		return deliver_inline(h, rd);
	snprintf(why, sizeof(why), "an item of %zu bytes is above the inline limit %u%s", it->len,
		 tpd_daemon_limits(c->cs->d)->inline_max, h->who.pr ? " (items cross hosts "
		 "inline)" : ": this client library reads no larger item");
	chan_answer(&h->who, rd->req_id, -EMSGSIZE, why, h->id, c->closed, NULL);
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
static void chan_append(struct chan *c, struct tpu_list *batch, size_t n, uint64_t bytes)
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

	tpu_list_for_each_safe(w, tmp, &c->writers, node) {
		if (c->closed) {
			chan_answer(&w->h->who, w->req_id, -EPIPE, "the channel was closed",
				    w->h->id, true, NULL);
		} else if (!chan_fits(c, w->n, w->bytes)) {
			break;
		} else if (uid_bytes(cs, c->uid, NULL) + w->bytes >
			   tpd_daemon_cfg(cs->d)->chan_bytes_per_uid) {
			chan_answer(&w->h->who, w->req_id, -ENOBUFS, "the channel owner's "
				    "chan-bytes-per-uid is spent", w->h->id, false, NULL);
		} else {
			chan_admit(w->h, w->req_id, &w->batch, w->n, w->bytes, w->lend);
		}
		wait_free(w);
	}
}

/* Gives items to waiting readers and room to waiting writers, oldest first, until neither can
 * go on. */
static void chan_serve(struct chan *c)
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
			chan_answer(&w->h->who, w->req_id, -EPIPE,
				    "the channel is closed and drained", w->h->id, true, NULL);
		} else {
			break;
		}
		wait_free(w);
	}
}

static void wait_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct chan_wait *w = arg;

	(void)fd;
	(void)what;
	chan_answer(&w->h->who, w->req_id, -ETIMEDOUT, w->write ? "the channel stayed full: nothing "
		    "written" : "no item within the timeout", w->h->id, w->h->c->closed, NULL);
	wait_free(w);
}

/* May the far daemon of @pr open @c for its client? Decided on the channel's remote access and
 * the link's authenticated identity only, as for a listener (tpd_listener_permits_remote()). */
static bool chan_permits_remote(const struct chan *c, const struct tpd_peer *pr)
{
	switch (c->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER:
		return true;
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS:
		for (size_t i = 0; tpd_peer_identity(pr) && i < c->n_remote_peers; i++)
			if (tpd_peer_identity_matches(c->remote_peers[i], pr))
				return true;
		return false;
	default:
		return false;
	}
}

static bool chan_permits(const struct chan *c, const struct tpd_session *s)
{
	uid_t uid = tpd_session_uid(s);

	if (uid == 0 || uid == c->uid || c->access == TPW__V1__ACCESS__ACCESS_ANYONE)
		return true;
	return c->access == TPW__V1__ACCESS__ACCESS_GROUP &&
	       (tpd_session_gid(s) == c->gid || tpd_session_in_group(s, c->gid));
}

static struct chan *chan_find(struct tpd_chans *cs, uid_t uid, const char *name)
{
	struct chan *c;

	tpu_list_for_each(c, &cs->chans, node)
		if (c->uid == uid && strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

static bool who_same(const struct chan_who *a, const struct chan_who *b)
{
	return a->s == b->s && a->pr == b->pr;
}

static struct chan_handle *handle_find(struct tpd_chans *cs, const struct chan_who *who,
				       uint64_t id)
{
	struct chan_handle *h;

	tpu_list_for_each(h, &cs->handles, node)
		if (who_same(&h->who, who) && h->id == id)
			return h;
	return NULL;
}

static void handle_free(struct chan_handle *h, bool answer)
{
	struct chan_wait *w, *tmp;
	struct chan *c = h->c;
	struct chan_lend *l, *ltmp;
	struct chan_copy *cp;

	/* Its lent buffers stay with their items, and nobody is told when they leave. */
	tpu_list_for_each_safe(l, ltmp, &h->lends, node) {
		tpu_list_remove(&l->node);
		l->h = NULL;
	}
	free(h->released);
	tpu_list_for_each_safe(w, tmp, &c->waiters, node) {
		if (w->h != h)
			continue;
		if (answer)
			chan_answer(&h->who, w->req_id, -ECANCELED, "the handle was released", h->id,
				    c->closed, NULL);
		wait_free(w);
	}
	tpu_list_for_each_safe(w, tmp, &c->writers, node) {
		if (w->h != h)
			continue;
		if (answer)
			chan_answer(&h->who, w->req_id, -ECANCELED, "the handle was released", h->id,
				    c->closed, NULL);
		wait_free(w);
	}
	tpu_list_for_each(cp, &c->copies, node)
		if (cp->h == h)
			cp->h = NULL; /* the copy ends, answering nobody */
	tpu_list_remove(&h->node);
	c->n_handles--;
	c->n_remote -= h->who.pr != NULL;
	if (h->held) { /* never read: back to the head, for the oldest waiting reader */
		item_give_back(c, h->held);
		chan_serve(c);
	}
	free(h);
	chan_maybe_free(c);
}

/* @o's remote access into @c (validated: peers only with REMOTE_PEERS). Return: 0 or -ENOMEM. */
static int chan_set_remote(struct chan *c, const Tpw__V1__ChanOp *o)
{
	c->remote = o->remote ? o->remote : TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	if (!o->n_remote_peers)
		return 0;
	c->remote_peers = calloc(o->n_remote_peers, sizeof(*c->remote_peers));
	if (!c->remote_peers)
		return -ENOMEM;
	for (size_t i = 0; i < o->n_remote_peers; i++) {
		c->remote_peers[i] = strdup(o->remote_peers[i]);
		if (!c->remote_peers[i])
			return -ENOMEM;
		c->n_remote_peers++;
	}
	return 0;
}

/* Creates channel @o->name of @uid. Return: 0 or -errno with a reason in *why. */
static int chan_create(struct tpd_chans *cs, uid_t uid, const Tpw__V1__ChanOp *o,
		       struct chan **ret, const char **why)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(cs->d);
	uint32_t n;
	struct chan *c;

	uid_bytes(cs, uid, &n);
	if (n >= cfg->chans_per_uid) {
		*why = "this uid has chans-per-uid channels already";
		return -ENOBUFS;
	}
	if (o->capacity_items > cfg->chan_items_max || o->capacity_bytes > cfg->chan_bytes_max) {
		*why = "capacity above the daemon's chan-items-max or chan-bytes-max";
		return -ENOBUFS;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->name = strdup(o->name))) {
		free(c);
		*why = "out of memory";
		return -ENOMEM;
	}
	tpu_list_init(&c->node);
	tpu_list_init(&c->items);
	tpu_list_init(&c->copies);
	c->cs = cs;
	if (chan_set_remote(c, o) < 0) {
		chan_free(c);
		*why = "out of memory";
		return -ENOMEM;
	}
	c->uid = uid;
	c->access = o->access ? o->access : TPW__V1__ACCESS__ACCESS_OWNER;
	c->gid = o->gid;
	c->persistent = o->persistent;
	c->named = true;
	c->cap_items = o->capacity_items ? o->capacity_items : cfg->chan_items_max;
	c->cap_bytes = o->capacity_bytes ? o->capacity_bytes : cfg->chan_bytes_max;
	tpu_list_init(&c->items);
	tpu_list_init(&c->waiters);
	tpu_list_init(&c->writers);
	tpu_list_insert_tail(&cs->chans, &c->node);
	*ret = c;
	return 0;
}

static unsigned who_handles(const struct tpd_chans *cs, const struct chan_who *who)
{
	const struct chan_handle *h;
	unsigned n = 0;

	tpu_list_for_each(h, &cs->handles, node)
		n += who_same(&h->who, who);
	return n;
}

/* A new handle of @who on @c. Return: owned by @cs (handle_free()), or NULL without memory. */
static struct chan_handle *handle_new(struct tpd_chans *cs, const struct chan_who *who,
				      struct chan *c)
{
	struct chan_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->who = *who;
	h->id = ++cs->next_id;
	h->c = c;
	tpu_list_init(&h->lends);
	c->n_handles++;
	c->n_remote += who->pr != NULL;
	tpu_list_insert_tail(&cs->handles, &h->node);
	return h;
}

/* The local uid that channels created from other hosts belong to (chan-remote-create-uid)
 * if link @pr may create and unlink channels here (an authenticated one), else 0. */
static uid_t remote_creator(const struct tpd_chans *cs, const struct tpd_peer *pr)
{
	return tpd_peer_identity(pr) ? tpd_daemon_cfg(cs->d)->chan_remote_create_uid : 0;
}

/* Creates channel @o->name of uid @owner for the far daemon of @who's link, with @o's flags and
 * limits as a local creator of that uid gets them; its remote access admits that link always.
 * Return: 0 or -errno with the reason in *@why. */
static int chan_create_remote(struct tpd_chans *cs, const struct chan_who *who,
			      const Tpw__V1__ChanOp *o, uid_t owner, struct chan **ret,
			      const char **why)
{
	const char *id = tpd_peer_identity(who->pr);
	Tpw__V1__ChanOp co = *o;
	char *peers[TPW_REMOTE_PEERS_MAX + 1];
	bool in = false;

	for (size_t i = 0; i < o->n_remote_peers; i++) /* validated: TPW_REMOTE_PEERS_MAX */
		in |= tpd_peer_identity_matches(o->remote_peers[i], who->pr);
	if (co.remote != TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER && !in) {
		for (size_t i = 0; i < o->n_remote_peers; i++)
			peers[i] = o->remote_peers[i];
		peers[o->n_remote_peers] = (char *)id;
		co.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
		co.remote_peers = peers;
		co.n_remote_peers = o->n_remote_peers + 1;
	}
	return chan_create(cs, owner, &co, ret, why);
}

/*
 * OPEN from another host's daemon: an existing channel whose remote access admits the link, or,
 * with create on a daemon whose chan-remote-create-uid names a uid and over an authenticated
 * link, a new channel of that uid (looked up under it unless the op names its owner). A channel
 * that does not admit the link is, to the far daemon, no channel at all (the same status and
 * text), so that names cannot be probed from other hosts.
 */
static void op_open_remote(struct tpd_chans *cs, const struct chan_who *who,
			   const Tpw__V1__ChanOp *o)
{
	uid_t creator = o->create ? remote_creator(cs, who->pr) : 0;
	uid_t owner = o->owner_set ? o->owner_uid : creator ? creator : who->uid;
	struct chan *c = chan_find(cs, owner, o->name);
	const char *cwhy = NULL;
	struct chan_handle *h;
	char why[320];
	int r;

	if (!c && creator && owner == creator) {
		if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
			return chan_answer(who, o->req_id, -ENOBUFS, "this peer link has 1024 "
					   "channel handles here", 0, false, NULL);
		r = chan_create_remote(cs, who, o, owner, &c, &cwhy);
		if (r < 0)
			return chan_answer(who, o->req_id, r, cwhy, 0, false, NULL);
		h = handle_new(cs, who, c);
		if (!h) {
			chan_maybe_free(c);
			return chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false,
					   NULL);
		}
		tpu_log_info("peer %s: created channel '%s' of uid %u", tpd_peer_name(who->pr),
			     c->name, (unsigned)c->uid);
		return chan_answer(who, o->req_id, 0, NULL, h->id, c->closed, NULL);
	}
	if (!c || !chan_permits_remote(c, who->pr)) {
		snprintf(why, sizeof(why), "no channel '%.64s' of uid %u on %.60s accepts handles "
			 "from other hosts%s", o->name, (unsigned)owner, tpd_peers_hostname(cs->d),
			 !o->create || creator ? "" : ", and it creates none for other hosts "
			 "(chan-remote-create-uid)");
		return chan_answer(who, o->req_id, -ENOENT, why, 0, false, NULL);
	}
	if (o->create && o->exclusive)
		return chan_answer(who, o->req_id, -EADDRINUSE, "the channel exists", 0, false,
				   NULL);
	if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
		return chan_answer(who, o->req_id, -ENOBUFS, "this peer link has 1024 channel "
				   "handles here", 0, false, NULL);
	h = handle_new(cs, who, c);
	if (!h)
		return chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false, NULL);
	chan_answer(who, o->req_id, 0, NULL, h->id, c->closed, NULL);
}

static void op_open(struct tpd_chans *cs, const struct chan_who *who, const Tpw__V1__ChanOp *o)
{
	struct tpd_session *s = who->s;
	uid_t owner = o->owner_set ? o->owner_uid : tpd_session_uid(s);
	struct chan *c = chan_find(cs, owner, o->name);
	const char *why = NULL;
	struct chan_handle *h;
	int r;

	if (c && o->create && o->exclusive)
		return chan_answer(who, o->req_id, -EADDRINUSE, "the channel exists", 0, false,
				   NULL);
	if (c && !chan_permits(c, s))
		return chan_answer(who, o->req_id, -EACCES, "the channel's access mode refuses "
				   "this uid", 0, false, NULL);
	if (!c && (!o->create || owner != tpd_session_uid(s)))
		return chan_answer(who, o->req_id, -ENOENT, "no such channel", 0, false, NULL);
	if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
		return chan_answer(who, o->req_id, -ENOBUFS, "this session has 1024 channel "
				   "handles", 0, false, NULL);
	if (!c) {
		r = chan_create(cs, tpd_session_uid(s), o, &c, &why);
		if (r < 0)
			return chan_answer(who, o->req_id, r, why, 0, false, NULL);
	}
	h = handle_new(cs, who, c);
	if (!h) {
		chan_maybe_free(c);
		return chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false, NULL);
	}
	chan_answer(who, o->req_id, 0, NULL, h->id, c->closed, NULL);
}

/* A wait of @h for @req_id, with a timer unless @timeout_ms is CHAN_NO_DEADLINE. Return: owned
 * (wait_free()), or NULL without memory. */
static struct chan_wait *wait_new(struct tpd_chans *cs, struct chan_handle *h, uint64_t req_id,
				  uint32_t timeout_ms)
{
	struct chan_wait *w = calloc(1, sizeof(*w));
	struct timeval tv;

	if (!w)
		return NULL;
	tpu_list_init(&w->node);
	tpu_list_init(&w->batch);
	if (timeout_ms != CHAN_NO_DEADLINE) {
		w->ev = evtimer_new(tpd_daemon_base(cs->d), wait_on_timeout, w);
		tv.tv_sec = timeout_ms / 1000;
		tv.tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000;
		/* The deadline runs from now, not from the loop pass's cached start. */
		event_base_update_cache_time(tpd_daemon_base(cs->d));
		if (!w->ev || evtimer_add(w->ev, &tv) < 0) {
			if (w->ev)
				event_free(w->ev);
			free(w);
			return NULL;
		}
	}
	w->h = h;
	w->req_id = req_id;
	w->cs = cs;
	return w;
}

/* A new item of @len bytes, its data copied from @from if not NULL. Return: owned
 * (item_free()), or NULL. */
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
static int batch_build(struct tpd_session *s, const Tpw__V1__ChanOp *o, const uint8_t *tail,
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
		if (r < 0) {
			if (r == -ENOMEM)
				snprintf(why, wl, "out of memory");
			free(it);
			batch_free(NULL, batch);
			return r;
		}
		tpu_list_insert_tail(batch, &it->node);
	}
	return 0;
}

static void chan_copy_free(struct chan_copy *cp)
{
	struct chan *c = cp->c;

	tpu_list_remove(&cp->node);
	batch_free(c->cs, &cp->batch);
	free(cp);
	chan_maybe_free(c);
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
		chan_append(c, &cp->batch, cp->n, cp->bytes);
	if (cp->h && status == 0)
		write_answer(cp->h, cp->req_id, false);
	else if (cp->h)
		chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed, NULL);
	chan_serve(c);
	chan_copy_free(cp);
}

/* Starts copying the items by reference of @batch into items of the daemon; they take the
 * place of the references in @cp->batch. Return: 0 or -errno (@batch unchanged). */
static int copy_in_start(struct chan_copy *cp, struct tpu_list *batch)
{
	struct tpb_xfer *x = calloc(cp->n, sizeof(*x));
	struct chan_item *it, *tmp, *dup;
	size_t k = 0;
	int r = -ENOMEM;

	if (!x)
		return -ENOMEM;
	tpu_list_for_each(it, batch, node) {
		dup = it->ref ? item_new_copied(cp->c->cs, it->len) : NULL;
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
					  k, copy_in_on_done, cp);
	else
		r = tpd_chan_copy_start(cp->c->cs->d, x, k, copy_in_on_done, cp);
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
		tpu_list_remove(&it->node);
		item_free(NULL, it);
	}
	tpu_list_splice_tail(&cp->batch, batch);
	free(x);
	return 0;
fail:
	batch_free(cp->c->cs, &cp->batch);
	free(x);
	return r;
}
/* A new copy of @h's request @req_id on its channel. Return: owned (chan_copy_free()), or
 * NULL. */
static struct chan_copy *copy_new(struct chan_handle *h, uint64_t req_id)
{
	struct chan_copy *cp = calloc(1, sizeof(*cp));

	if (!cp)
		return NULL;
	cp->c = h->c;
	cp->h = h;
	cp->req_id = req_id;
	tpu_list_init(&cp->batch);
	tpu_list_insert_tail(&h->c->copies, &cp->node);
	return cp;
}

/* Keeps the items by reference of @batch (@bytes in all, room checked) where they lie, when all
 * lie in one shared buffer of the writer (ChanOp.lend: a staging buffer it lends) and the
 * owner's chan-bytes-per-uid takes the whole buffer besides the batch: the daemon never keeps
 * more of anyone's memory mapped than it charges, whether the channel stays named or not.
 * Return: true if they stay there. */
static bool lend_batch(struct chan_handle *h, struct tpu_list *batch, uint64_t bytes)
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
	if (!buf || uid_bytes(c->cs, c->uid, NULL) + bytes + buf->size >
		    tpd_daemon_cfg(c->cs->d)->chan_bytes_per_uid)
		return false; /* copied in: charged its bytes only */
	lent = lent_of(c->cs, c->uid, true);
	l = lent ? calloc(1, sizeof(*l)) : NULL;
	if (!l)
		return false;
	*l = (struct chan_lend){ .h = h, .c = c, .buf = tpb_buffer_ref(buf) };
	tpu_list_insert_tail(&h->lends, &l->node);
	tpu_list_for_each(it, batch, node) {
		if (it->ref) {
			it->lend = l;
			l->items++;
		}
	}
	*lent += buf->size;
	return true;
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
	chan_reply_send(&h->who, &r, NULL, 0);
	h->n_released -= n;
	if (h->n_released) /* (none: @h->released may be NULL) */
		memmove(h->released, h->released + n, h->n_released * sizeof(*h->released));
}

/* Puts @batch (@n items, @bytes, room checked) into @h's channel and answers @req_id: at once
 * when every item is in the daemon already or stays in the buffer the writer lends (@lend),
 * else once its items by reference are copied in (their room reserved meanwhile). Takes
 * @batch's items. */
static void chan_admit(struct chan_handle *h, uint64_t req_id, struct tpu_list *batch, size_t n,
		       uint64_t bytes, bool lend)
{
	struct chan *c = h->c;
	struct chan_copy *cp = NULL;
	struct chan_item *it;
	bool refs = false, lent = lend && lend_batch(h, batch, bytes);
	int r = -ENOMEM;

	tpu_list_for_each(it, batch, node)
		refs |= it->ref && !it->lend;
	if (!refs) {
		chan_append(c, batch, n, bytes);
		return write_answer(h, req_id, lent);
	}
	cp = copy_new(h, req_id);
	if (cp) {
		cp->n = n;
		cp->bytes = bytes;
		r = copy_in_start(cp, batch);
	}
	if (r < 0) {
		batch_free(c->cs, batch);
		if (cp)
			chan_copy_free(cp);
		return chan_answer(&h->who, req_id, r, r == -ENOMEM ? "out of memory" :
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
	uint64_t len = cp->item->len;

	if (status == 0 && cp->h) {
		item_done(c, cp->item);
		r.req_id = cp->req_id;
		r.status = tpw_status_from_errno(0);
		r.chan_id = cp->h->id;
		r.closed = c->closed;
		r.n_lengths = 1;
		r.lengths = &len;
		r.copied = true;
		chan_reply_send(&cp->h->who, &r, NULL, 0);
	} else {
		item_give_back(c, cp->item);
		if (cp->h)
			chan_answer(&cp->h->who, cp->req_id, status, why, cp->h->id, c->closed,
				    NULL);
	}
	chan_serve(c);
	chan_copy_free(cp);
}

/* Copies @it (taken out of @h's channel) into the reader's allocation @dst and answers
 * @req_id once done; on failure the item goes back to the head. Borrows @dst. */
static void copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
		     const struct tpb_mem *dst)
{
	struct tpb_xfer x = { .src = { .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)it->data },
			      .dst = *dst, .len = it->len };

	if (it->lend)
		x.src = it->src; /* the copy holds the lent buffer too */
	struct chan_copy *cp = copy_new(h, req_id);
	int r = !cp ? -ENOMEM : dst->loc == TPB_LOC_REMOTE ?
		tpd_chanx_big_copy_out(h->who.pr, &x, copy_out_on_done, cp) :
		tpd_chan_copy_start(h->c->cs->d, &x, 1, copy_out_on_done, cp);

	if (r == 0) {
		cp->item = it;
		return;
	}
	if (cp)
		chan_copy_free(cp);
	item_give_back(h->c, it);
	chan_answer(&h->who, req_id, r, "cannot copy the item into the read's allocation", h->id,
		    h->c->closed, NULL);
}

/* Appends @o's batch (validated: lengths add up to the inline items in @tail) or refuses all
 * of it; a write that does not fit waits for room up to its timeout, behind earlier waiting
 * writes. Items by reference are copied in once the batch is admitted. */
static void op_write(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		     const uint8_t *tail, size_t tail_len)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(cs->d);
	struct tpu_list batch = TPU_LIST_INIT(batch);
	struct chan *c = h->c;
	uint64_t bytes = tail_len;
	struct chan_wait *w;
	char why[200];
	bool fits;
	int r;

	for (size_t i = 0; o->n_segments && i < o->n_lengths; i++)
		bytes += o->segments[i]->loc_case == TPW__V1__SEGMENT__LOC_INLINE_OFF ?
			 0 : o->lengths[i]; /* validated: no overflow */
	for (size_t i = 0; i < o->n_streamed; i++)
		bytes += o->streamed[i] ? o->lengths[i] : 0;
	if (c->closed)
		return chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed", h->id, true,
				   NULL);
	if (o->n_lengths > c->cap_items || bytes > c->cap_bytes)
		return chan_answer(&h->who, o->req_id, -EMSGSIZE, "the batch exceeds the channel's "
				   "capacity", h->id, false, NULL);
	if (uid_bytes(cs, c->uid, NULL) + bytes > cfg->chan_bytes_per_uid)
		return chan_answer(&h->who, o->req_id, -ENOBUFS, "the channel owner's "
				   "chan-bytes-per-uid is spent", h->id, false, NULL);
	fits = tpu_list_empty(&c->writers) && chan_fits(c, o->n_lengths, bytes);
	if (!fits && (o->timeout_ms == 0 || h->write_waits))
		return chan_answer(&h->who, o->req_id, -ENOBUFS, h->write_waits ? "a write of this "
				   "handle already waits" : "the channel is full", h->id, false,
				   NULL);
	r = batch_build(h->who.s, o, tail, &batch, why, sizeof(why));
	if (r < 0)
		return chan_answer(&h->who, o->req_id, r, why, h->id, false, NULL);
	if (fits) {
		chan_admit(h, o->req_id, &batch, o->n_lengths, bytes, o->lend);
		return chan_serve(c);
	}
	w = wait_new(cs, h, o->req_id, o->timeout_ms);
	if (!w) {
		batch_free(cs, &batch);
		return chan_answer(&h->who, o->req_id, -ENOMEM, "out of memory", h->id, false, NULL);
	}
	w->write = true;
	w->lend = o->lend;
	tpu_list_insert_tail(&batch, &w->batch); /* the batch's items now hang off w->batch */
	tpu_list_remove(&batch);
	w->n = o->n_lengths;
	w->bytes = bytes;
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
		return chan_answer(&h->who, rd->req_id, -ENOENT, "this handle holds no item", h->id,
				   h->c->closed, NULL);
	if (!rd->dst_set)
		return chan_answer_len(h, rd->req_id, 0, NULL, it->len);
	if (it->len > rd->room) {
		snprintf(why, sizeof(why), "the held item of %zu bytes does not fit the read's %llu",
			 it->len, (unsigned long long)rd->room);
		return chan_answer_len(h, rd->req_id, -EMSGSIZE, why, it->len);
	}
	h->held = NULL;
	copy_out(h, rd->req_id, it, &rd->dst);
}

/* @o's READ as a struct chan_read, its destination resolved in @h's session. Return: 0 or
 * -errno (the reason in @why). */
static int read_params(struct chan_handle *h, const Tpw__V1__ChanOp *o, struct chan_read *rd,
		       char *why, size_t wl)
{
	*rd = (struct chan_read){ .req_id = o->req_id, .max = o->max_items ? o->max_items : 1 };
	rd->fast = (h->who.s ? tpd_session_client_minor(h->who.s) >= TPW_MINOR_CHAN_FAST
			     : tpd_peer_chan_far_minor(h->who.pr) >= TPW_PEER_MINOR_CHAN_STREAM) &&
		   !o->inline_only;
	if (h->who.pr && o->xfer_id) { /* the forwarding daemon's receive (chanx.c) */
		rd->room = o->room;
		rd->dst_set = true;
		rd->dst = (struct tpb_mem){ .loc = TPB_LOC_REMOTE, .addr = o->xfer_id };
		return 0;
	}
	if (!o->n_segments)
		return 0;
	rd->room = o->segments[0]->length;
	rd->dst_set = true;
	return tpd_chan_copy_resolve(h->who.s, o->segments[0], &rd->dst, why, wl);
}

static void op_read(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o)
{
	struct chan *c = h->c;
	struct chan_wait *w = NULL;
	struct chan_read rd;
	char why[200];
	int r = read_params(h, o, &rd, why, sizeof(why));

	if (r < 0)
		return chan_answer(&h->who, o->req_id, r, why, h->id, c->closed, NULL);
	if (h->held || o->take_held) {
		read_held(h, &rd);
		return tpd_chan_copy_put(&rd.dst);
	}
	if (c->n_items && tpu_list_empty(&c->waiters)) {
		chan_deliver(h, &rd);
		tpd_chan_copy_put(&rd.dst);
		return chan_serve(c); /* room for waiting writers */
	}
	if (chan_drained(c))
		chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed and drained",
			    h->id, true, NULL);
	else if (o->timeout_ms == 0)
		chan_answer(&h->who, o->req_id, -ETIMEDOUT, "the channel is empty", h->id,
			    c->closed, NULL);
	else if (h->waits >= CHAN_WAITS_PER_HANDLE)
		chan_answer(&h->who, o->req_id, -ENOBUFS, "too many reads waiting on this "
			    "handle", h->id, false, NULL);
	else if (!(w = wait_new(cs, h, o->req_id, o->timeout_ms)))
		chan_answer(&h->who, o->req_id, -ENOMEM, "out of memory", h->id, false, NULL);
	if (!w)
		return tpd_chan_copy_put(&rd.dst);
	w->rd = rd; /* the wait keeps the destination's reference */
	h->waits++;
	c->n_waiters++;
	tpu_list_insert_tail(&c->waiters, &w->node);
	chan_serve(c);
}

static void op_unlink(struct tpd_chans *cs, const struct chan_who *who,
		      const Tpw__V1__ChanOp *o)
{
	struct tpd_session *s = who->s;
	uid_t owner = o->owner_set ? o->owner_uid : tpd_session_uid(s);
	struct chan *c = chan_find(cs, owner, o->name);

	if (!c)
		return chan_answer(who, o->req_id, -ENOENT, "no such channel", 0, false, NULL);
	if (tpd_session_uid(s) != 0 && tpd_session_uid(s) != c->uid)
		return chan_answer(who, o->req_id, -EACCES, "only the channel's owner unlinks it",
				   0, false, NULL);
	c->named = false;
	/* A later open of the name makes a new channel; this one stays charged until freed. */
	tpu_list_remove(&c->node);
	tpu_list_insert_tail(&cs->unlinked, &c->node);
	chan_answer(who, o->req_id, 0, NULL, 0, c->closed, NULL);
	chan_maybe_free(c);
}

/* UNLINK from another host's daemon: as the uid of chan-remote-create-uid, over an
 * authenticated link, of a channel of that uid whose remote access admits the link; any other
 * channel is, to the far daemon, no channel at all. */
static void op_unlink_remote(struct tpd_chans *cs, const struct chan_who *who,
			     const Tpw__V1__ChanOp *o)
{
	uid_t creator = remote_creator(cs, who->pr);
	uid_t owner = o->owner_set ? o->owner_uid : creator;
	struct chan *c = creator ? chan_find(cs, owner, o->name) : NULL;
	char why[320];

	if (!c || c->uid != creator || !chan_permits_remote(c, who->pr)) {
		snprintf(why, sizeof(why), "no channel '%.64s' on %.60s may be unlinked from other "
			 "hosts%s", o->name, tpd_peers_hostname(cs->d), creator ? "" :
			 " (chan-remote-create-uid is not set)");
		return chan_answer(who, o->req_id, -ENOENT, why, 0, false, NULL);
	}
	c->named = false;
	tpu_list_remove(&c->node);
	tpu_list_init(&c->node);
	tpu_log_info("peer %s: unlinked channel '%s' of uid %u", tpd_peer_name(who->pr), c->name,
		     (unsigned)c->uid);
	chan_answer(who, o->req_id, 0, NULL, 0, c->closed, NULL);
	chan_maybe_free(c);
}

static void handle_op(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		      const uint8_t *tail, size_t tail_len);

static void chan_on_op(struct tpd_session *s, const Tpw__V1__ChanOp *o, const uint8_t *tail,
		       size_t tail_len)
{
	struct tpd_chans *cs = chans_of(s);
	const struct chan_who who = { .s = s };
	struct chan_handle *h;

	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN && tpd_chanx_is_address(o->name))
		return tpd_chanx_open(cs->x, s, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN)
		return op_open(cs, &who, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK && tpd_chanx_is_address(o->name))
		return tpd_chanx_unlink(cs->x, s, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		return op_unlink(cs, &who, o);
	h = handle_find(cs, &who, o->chan_id);
	if (!h && tpd_chanx_op(cs->x, s, o, tail, tail_len))
		return; /* a handle of a channel on another host: forwarded */
	if (!h)
		return chan_answer(&who, o->req_id, -ENOENT, "no such channel handle", o->chan_id,
				   false, NULL);
	handle_op(cs, h, o, tail, tail_len);
}

/* Waits (reads and writes waiting for an item or room) the handles of link @pr hold here. */
static uint32_t link_waits(const struct tpd_chans *cs, const struct tpd_peer *pr)
{
	const struct chan_handle *h;
	uint32_t n = 0;

	tpu_list_for_each(h, &cs->handles, node)
		if (h->who.pr == pr)
			n += h->waits + h->write_waits;
	return n;
}

void tpd_chan_peer_op(struct tpd_chans *cs, struct tpd_peer *pr, const Tpw__V1__PeerChanOp *po,
		      const uint8_t *tail, size_t tail_len)
{
	const struct chan_who who = { .pr = pr, .uid = po->uid };
	const Tpw__V1__ChanOp *o = po->op;
	uint32_t max = tpd_daemon_cfg(cs->d)->chan_peer_ops_max;
	struct chan_handle *h;
	char why[160];

	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN)
		return op_open_remote(cs, &who, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		return op_unlink_remote(cs, &who, o);
	h = handle_find(cs, &who, o->chan_id);
	if (!h)
		return chan_answer(&who, o->req_id, -ENOENT, "no such channel handle", o->chan_id,
				   false, NULL);
	if ((o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ ||
	     o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE) && o->timeout_ms &&
	    link_waits(cs, pr) >= max) {
		snprintf(why, sizeof(why), "%u channel ops of this peer link wait on %.60s "
			 "(chan-peer-ops-max)", max, tpd_peers_hostname(cs->d));
		return chan_answer(&who, o->req_id, -ENOBUFS, why, h->id, h->c->closed, NULL);
	}
	if (tpd_chanx_big_admit(cs->d, pr, o, why, sizeof(why)) < 0) /* a remote daemon's bytes */
		return chan_answer(&who, o->req_id, -ENOBUFS, why, h->id, h->c->closed, NULL);
	handle_op(cs, h, o, tail, tail_len);
}

void tpd_chan_peer_gone(struct tpd_chans *cs, struct tpd_peer *pr)
{
	struct chan_handle *h, *tmp;

	tpu_list_for_each_safe(h, tmp, &cs->handles, node)
		if (h->who.pr == pr)
			handle_free(h, false);
}

uint64_t tpd_chan_new_id(struct tpd_chans *cs)
{
	return ++cs->next_id;
}

struct tpd_chanx *tpd_chan_x(struct tpd_chans *cs)
{
	return cs->x;
}

static void handle_op(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		      const uint8_t *tail, size_t tail_len)
{
	switch (o->op) {
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE:
		return op_write(cs, h, o, tail, tail_len);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_READ:
		return op_read(cs, h, o);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE:
		h->c->closed = true; /* idempotent */
		chan_answer(&h->who, o->req_id, 0, NULL, h->id, true, NULL);
		return chan_serve(h->c);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE:
		chan_answer(&h->who, o->req_id, 0, NULL, h->id, h->c->closed, NULL);
		return handle_free(h, true);
	default:
		return; /* validation refuses other ops */
	}
}

static void chan_on_session_end(struct tpd_session *s)
{
	struct tpd_chans *cs = chans_of(s);
	struct chan_handle *h, *tmp;

	tpd_chanx_session_end(cs->x, s);
	tpu_list_for_each_safe(h, tmp, &cs->handles, node)
		if (h->who.s == s)
			handle_free(h, false);
}

static const struct tpd_local_chan_ops chan_local_ops = {
	.op = chan_on_op,
	.session_end = chan_on_session_end,
};

void tpd_chan_serve_local(struct tpd_local *l)
{
	tpd_local_set_chan_ops(l, &chan_local_ops);
}

int tpd_chan_new(struct tpd_daemon *d, struct tpd_chans **ret)
{
	struct tpd_chans *cs = calloc(1, sizeof(*cs));

	if (!cs)
		return -ENOMEM;
	cs->d = d;
	tpu_list_init(&cs->chans);
	tpu_list_init(&cs->unlinked);
	tpu_list_init(&cs->handles);
	tpu_list_init(&cs->spare);
	if (tpd_chanx_new(d, cs, &cs->x) < 0) {
		free(cs);
		return -ENOMEM;
	}
	*ret = cs;
	return 0;
}

void tpd_chan_free(struct tpd_chans *cs)
{
	struct chan_handle *h, *htmp;
	struct chan_item *it, *itmp;
	struct chan *c, *ctmp;

	if (!cs)
		return;
	tpd_chanx_free(cs->x);
	tpu_list_for_each_safe(h, htmp, &cs->handles, node)
		handle_free(h, false); /* frees unnamed channels */
	tpu_list_for_each_safe(c, ctmp, &cs->chans, node)
		chan_free(c);
	tpu_list_for_each_safe(c, ctmp, &cs->unlinked, node)
		chan_free(c); /* kept by a copy the daemon's end cut short */
	tpu_list_for_each_safe(it, itmp, &cs->spare, node)
		free(it);
	free(cs->lent);
	free(cs);
}

static const char *chan_state(const struct chan *c)
{
	if (!c->closed)
		return "open";
	return c->n_items ? "closed" : "drained";
}

int tpd_chan_ctl(struct tpd_chans *cs, bool own_only, uid_t viewer, Tpw__V1__CtlChannel ***ret,
		 size_t *n)
{
	Tpw__V1__CtlChannel **v = NULL;
	const struct chan *c;
	size_t k = 0, cap = 0;

	tpu_list_for_each(c, &cs->chans, node)
		cap++;
	if (cap && !(v = calloc(cap, sizeof(*v))))
		return -ENOMEM;
	tpu_list_for_each(c, &cs->chans, node) {
		Tpw__V1__CtlChannel *x;

		if (own_only && c->uid != viewer)
			continue;
		x = calloc(1, sizeof(*x));
		if (!x) {
			tpd_chan_ctl_free(v, k);
			return -ENOMEM;
		}
		tpw__v1__ctl_channel__init(x);
		x->name = strdup(c->name);
		if (!x->name) {
			free(x);
			tpd_chan_ctl_free(v, k);
			return -ENOMEM;
		}
		x->uid = c->uid;
		x->access = c->access;
		x->gid = c->gid;
		x->state = (char *)chan_state(c);
		x->items = c->n_items;
		x->bytes = c->bytes;
		x->handles = c->n_handles;
		x->readers_waiting = c->n_waiters;
		x->writers_waiting = c->n_writers;
		x->persistent = c->persistent;
		x->capacity_items = c->cap_items;
		x->capacity_bytes = c->cap_bytes;
		x->items_written = c->written;
		x->items_read = c->read;
		x->remote = c->remote;
		x->remote_handles = c->n_remote;
		v[k++] = x;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_chan_ctl_free(Tpw__V1__CtlChannel **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i]->name);
		free(v[i]);
	}
	free(v);
}

void tpd_chan_counts(const struct tpd_chans *cs, uint32_t *ret_chans, uint64_t *ret_items,
		     uint64_t *ret_bytes)
{
	const struct chan *c;
	uint32_t n = 0;
	uint64_t items = 0, bytes = 0;

	tpu_list_for_each(c, &cs->chans, node) {
		n++;
		items += c->n_items;
		bytes += c->bytes;
	}
	*ret_chans = n;
	*ret_items = items;
	*ret_bytes = bytes;
}
