/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Named channels hosted by the daemon (chan.h). Responsible for the channel registry, each
 * channel's items and waiting readers, handles per session, deadlines of waiting reads and the
 * limits per uid and per channel. Not responsible for sessions or frames (local/) nor for
 * moving shared-buffer items (not built: items ride in data tails). Everything runs on the
 * daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "chan.h"
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

struct chan_item {
	struct tpu_list node;
	size_t len;
	uint8_t data[];
};

struct chan {
	struct tpu_list node; /* in tpd_chans.chans while named */
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
	uint64_t bytes, written, read;
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
};

struct chan_wait {
	struct tpu_list node; /* in chan.waiters */
	struct chan_handle *h;
	uint64_t req_id;
	struct event *ev;
	struct tpd_chans *cs;
	bool write;		/* a write waiting for room: its batch */
	struct tpu_list batch; /* chan_item */
	size_t n;
	uint64_t bytes;
};

struct tpd_chans {
	struct tpd_daemon *d;
	struct tpu_list chans;
	struct tpu_list handles;
	uint64_t next_id;
	struct tpd_chanx *x; /* channels and queues of other hosts (chanx.c) */
};

static struct tpd_chans *chans_of(struct tpd_session *s)
{
	return tpd_daemon_chans(tpd_session_daemon(s));
}

static void chan_answer(const struct chan_who *who, uint64_t req_id, int err, const char *why,
			uint64_t id, bool closed, const struct chan_item *it)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
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
		tail.iov_base = (void *)it->data;
		tail.iov_len = it->len;
	}
	if (who->pr)
		return tpd_chanx_reply(who->pr, &r, it ? &tail : NULL);
	m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &r;
	tpd_session_send(who->s, &m, it ? &tail : NULL, it ? 1 : 0);
}

/* Bytes the channels created by @uid hold. */
static uint64_t uid_bytes(const struct tpd_chans *cs, uid_t uid, uint32_t *ret_count)
{
	const struct chan *c;
	uint64_t b = 0;
	uint32_t n = 0;

	tpu_list_for_each(c, &cs->chans, node)
		if (c->uid == uid) {
			b += c->bytes;
			n++;
		}
	if (ret_count)
		*ret_count = n;
	return b;
}

static void chan_free(struct chan *c)
{
	struct chan_item *it, *tmp;

	if (!c)
		return;
	tpu_list_remove(&c->node);
	tpu_list_for_each_safe(it, tmp, &c->items, node)
		free(it);
	for (size_t i = 0; i < c->n_remote_peers; i++)
		free(c->remote_peers[i]);
	free(c->remote_peers);
	free(c->name);
	free(c);
}

/* Frees @c once nothing keeps it: no handle and neither persistent nor named. */
static void chan_maybe_free(struct chan *c)
{
	if (c->n_handles == 0 && (!c->persistent || !c->named))
		chan_free(c);
}

static void batch_free(struct tpu_list *batch)
{
	struct chan_item *it, *tmp;

	tpu_list_for_each_safe(it, tmp, batch, node)
		free(it);
	tpu_list_init(batch);
}

static void wait_free(struct chan_wait *w)
{
	tpu_list_remove(&w->node);
	if (w->write) {
		batch_free(&w->batch);
		w->h->c->n_writers--;
		w->h->write_waits = false;
	} else {
		w->h->c->n_waiters--;
		w->h->waits--;
	}
	if (w->ev)
		event_free(w->ev);
	free(w);
}

/* Hands the oldest item of @c to @h's request @req_id (which must be there). */
static void chan_deliver(struct chan_handle *h, uint64_t req_id)
{
	struct chan *c = h->c;
	struct chan_item *it = tpu_list_first(&c->items, struct chan_item, node);

	tpu_list_remove(&it->node);
	c->n_items--;
	c->bytes -= it->len;
	c->read++;
	chan_answer(&h->who, req_id, 0, NULL, h->id, c->closed, it);
	free(it);
}

static bool chan_fits(const struct chan *c, size_t n, uint64_t bytes)
{
	return c->n_items + n <= c->cap_items && c->bytes + bytes <= c->cap_bytes;
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
			chan_append(c, &w->batch, w->n, w->bytes);
			chan_answer(&w->h->who, w->req_id, 0, NULL, w->h->id, false, NULL);
		}
		wait_free(w);
	}
}

/* Gives items to waiting readers and room to waiting writers, oldest first, until neither can
 * go on. */
static void chan_serve(struct chan *c)
{
	struct tpd_chans *cs = NULL;
	uint32_t before;

	if (!tpu_list_empty(&c->writers))
		cs = tpu_list_first(&c->writers, struct chan_wait, node)->cs;
	do { /* every pass that does something ends a wait: this ends */
		before = c->n_waiters + c->n_writers;
		serve_readers(c);
		if (cs)
			serve_writers(cs, c);
	} while (c->n_waiters + c->n_writers != before);
}

/* Gives items to waiting readers, oldest reader first; on a closed, empty channel tells every
 * remaining reader it is drained. */
static void serve_readers(struct chan *c)
{
	struct chan_wait *w, *tmp;

	tpu_list_for_each_safe(w, tmp, &c->waiters, node) {
		if (c->n_items) {
			chan_deliver(w->h, w->req_id);
		} else if (c->closed) {
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
	tpu_list_remove(&h->node);
	c->n_handles--;
	c->n_remote -= h->who.pr != NULL;
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

/* Creates channel @o->name of @s's uid. Return: 0 or -errno with a reason in *why. */
static int chan_create(struct tpd_chans *cs, struct tpd_session *s, const Tpw__V1__ChanOp *o,
		       struct chan **ret, const char **why)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(cs->d);
	uint32_t n;
	struct chan *c;

	uid_bytes(cs, tpd_session_uid(s), &n);
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
	if (chan_set_remote(c, o) < 0) {
		chan_free(c);
		*why = "out of memory";
		return -ENOMEM;
	}
	c->uid = tpd_session_uid(s);
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
	c->n_handles++;
	c->n_remote += who->pr != NULL;
	tpu_list_insert_tail(&cs->handles, &h->node);
	return h;
}

/*
 * OPEN from another host's daemon: an existing channel whose remote access admits the link,
 * never a creation. A channel that does not admit it is, to the far daemon, no channel at all
 * (the same status and text), so that names cannot be probed from other hosts.
 */
static void op_open_remote(struct tpd_chans *cs, const struct chan_who *who,
			   const Tpw__V1__ChanOp *o)
{
	uid_t owner = o->owner_set ? o->owner_uid : who->uid;
	struct chan *c = chan_find(cs, owner, o->name);
	struct chan_handle *h;
	char why[200];

	if (!c || !chan_permits_remote(c, who->pr)) {
		snprintf(why, sizeof(why), "no channel '%.64s' of uid %u on %.60s accepts handles "
			 "from other hosts", o->name, (unsigned)owner, tpd_peers_hostname(cs->d));
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
		r = chan_create(cs, s, o, &c, &why);
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

/* Copies the items of @tail into @batch. Return: 0 or -ENOMEM (@batch freed). */
static int batch_copy(const Tpw__V1__ChanOp *o, const uint8_t *tail, struct tpu_list *batch)
{
	struct chan_item *it;
	size_t off = 0;

	for (size_t i = 0; i < o->n_lengths; i++) {
		it = malloc(sizeof(*it) + o->lengths[i]);
		if (!it) {
			batch_free(batch);
			return -ENOMEM;
		}
		it->len = o->lengths[i];
		memcpy(it->data, tail + off, it->len);
		off += it->len;
		tpu_list_insert_tail(batch, &it->node);
	}
	return 0;
}

/* Appends the batch in @tail (lengths checked against it by validation) or refuses all of it;
 * a write that does not fit waits for room up to its timeout, behind earlier waiting writes. */
static void op_write(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		     const uint8_t *tail, size_t tail_len)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(cs->d);
	struct tpu_list batch = TPU_LIST_INIT(batch);
	struct chan *c = h->c;
	struct chan_wait *w;
	bool fits;

	if (c->closed)
		return chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed", h->id, true,
				   NULL);
	if (o->n_lengths > c->cap_items || tail_len > c->cap_bytes)
		return chan_answer(&h->who, o->req_id, -EMSGSIZE, "the batch exceeds the channel's "
				   "capacity", h->id, false, NULL);
	if (uid_bytes(cs, c->uid, NULL) + tail_len > cfg->chan_bytes_per_uid)
		return chan_answer(&h->who, o->req_id, -ENOBUFS, "the channel owner's "
				   "chan-bytes-per-uid is spent", h->id, false, NULL);
	fits = tpu_list_empty(&c->writers) && chan_fits(c, o->n_lengths, tail_len);
	if (!fits && (o->timeout_ms == 0 || h->write_waits))
		return chan_answer(&h->who, o->req_id, -ENOBUFS, h->write_waits ? "a write of this "
				   "handle already waits" : "the channel is full", h->id, false,
				   NULL);
	if (batch_copy(o, tail, &batch) < 0)
		return chan_answer(&h->who, o->req_id, -ENOMEM, "out of memory", h->id, false, NULL);
	if (fits) {
		chan_append(c, &batch, o->n_lengths, tail_len);
		chan_answer(&h->who, o->req_id, 0, NULL, h->id, false, NULL);
		return chan_serve(c);
	}
	w = wait_new(cs, h, o->req_id, o->timeout_ms);
	if (!w) {
		batch_free(&batch);
		return chan_answer(&h->who, o->req_id, -ENOMEM, "out of memory", h->id, false, NULL);
	}
	w->write = true;
	tpu_list_insert_tail(&batch, &w->batch); /* the batch's items now hang off w->batch */
	tpu_list_remove(&batch);
	w->n = o->n_lengths;
	w->bytes = tail_len;
	h->write_waits = true;
	c->n_writers++;
	tpu_list_insert_tail(&c->writers, &w->node);
}

static void op_read(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o)
{
	struct chan *c = h->c;
	struct chan_wait *w;

	if (c->n_items && tpu_list_empty(&c->waiters)) {
		chan_deliver(h, o->req_id);
		return chan_serve(c); /* room for waiting writers */
	}
	if (!c->n_items && c->closed)
		return chan_answer(&h->who, o->req_id, -EPIPE, "the channel is closed and drained",
				   h->id, true, NULL);
	if (o->timeout_ms == 0)
		return chan_answer(&h->who, o->req_id, -ETIMEDOUT, "the channel is empty", h->id,
				   false, NULL);
	if (h->waits >= CHAN_WAITS_PER_HANDLE)
		return chan_answer(&h->who, o->req_id, -ENOBUFS, "too many reads waiting on this "
				   "handle", h->id, false, NULL);
	w = wait_new(cs, h, o->req_id, o->timeout_ms);
	if (!w)
		return chan_answer(&h->who, o->req_id, -ENOMEM, "out of memory", h->id, false, NULL);
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
	tpu_list_remove(&c->node); /* a later open of the name makes a new channel */
	tpu_list_init(&c->node);
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
	tpu_list_init(&cs->handles);
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
	struct chan *c, *ctmp;

	if (!cs)
		return;
	tpd_chanx_free(cs->x);
	tpu_list_for_each_safe(h, htmp, &cs->handles, node)
		handle_free(h, false); /* frees unnamed channels */
	tpu_list_for_each_safe(c, ctmp, &cs->chans, node)
		chan_free(c);
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
