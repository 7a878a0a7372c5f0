/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channels hosted by the daemon (tpclient.h, "channels"; docs/channels.md). Responsible for
 * the tp_chan_* calls: each sends one ChanOp and waits for its ChanReply, whose data tail holds
 * the items of a read (one, or a batch: tp_chan_read_many()). Items larger than
 * TPW_CHAN_INLINE_ITEM go by reference to a daemon of minor >= 7 (a shared buffer's range, or
 * the caller's memory by CMA), and a read gets such an item copied into its allocation: a
 * read naming none first learns the item's length (ChanReply.held_len: the daemon holds it for
 * the handle), allocates, and names it (ChanOp.take_held). Not responsible for the channel's
 * state (the daemon keeps it) nor for the connection (context.c, wire.c).
 *
 * An item the daemon hands out is never dropped here: a read whose caller gave up waiting
 * (tp_context_options.reply_timeout_ms past its timeout) stays filed on its handle (tp_chan.late);
 * its late item is returned by the handle's next tp_chan_read(), or written back to the channel
 * when the handle is released first.
 *
 * A write's private items go through a staging buffer, which the library lends to the channel
 * (ChanOp.lend) while it has fewer than CHAN_LENT_MAX lent: the daemon keeps the items there
 * instead of copying them in, and names the buffer in a later write's answer once they have
 * all left the channel (ChanReply.released); only then does it go back to the staging pool.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "internal.h"

#define CHAN_LENT_MAX 8u		   /* staging buffers one handle lends at once, at most */
#define CHAN_LENT_BYTES (64ull << 20) /* and their bytes */

struct tp_chan {
	struct tp_context *ctx;
	uint64_t id;
	char *name;
	long owner_uid;	      /* as opened: a release reopens the channel to give items back */
	bool remote;	      /* hosted by another host's daemon: items ride inline, unless */
	bool remote_refs;     /* its daemon streams large items over the link (ChanReply 591) */
	struct tpu_list late; /* chan_req of reads whose caller gave up, oldest first: waiting for
			       * the daemon, or done with an item; under ctx->lock */
	/* Staging buffers lent to the channel (ChanReply.lent), not yet given back; under
	 * ctx->lock. */
	struct tpc_buf *lent[CHAN_LENT_MAX];
	unsigned n_lent;
	uint64_t lent_bytes;
};

struct chan_req {
	struct tpc_req req;   /* first: the reply handler finds the chan_req from it */
	struct tpu_list node; /* in ch->late */
	struct tp_chan *ch;   /* set once the read's caller gave up: heap-allocated, on ch->late */
	struct iovec *items;  /* the answer's items, each malloc()ed (but see @into), @next first */
	size_t n, next;
	bool closed;
	uint64_t chan_id;
	bool remote_refs;
	uint64_t held_len; /* the daemon holds an item of this length for the handle (or, with
			    * -EMSGSIZE, the item that did not fit the read's allocation) */
	/* A read naming where its item goes (ChanOp.segments): @dst, @dst_len bytes; the caller's
	 * memory (@into) or a buffer this library allocated for the item. Never freed while the
	 * daemon may still copy into it: a read released unanswered leaves it allocated. */
	void *dst;
	size_t dst_len;
	bool into;
	/* A staging buffer of the context the daemon copies the item into (then copied to @dst by
	 * read_unstage()), or NULL. One whose read is never answered stays registered until the
	 * context goes (the daemon may still copy into it). */
	struct tpc_buf *stage;
	/* A write (@write) and its answer: its staging buffer was lent; ids of buffers given back
	 * (malloc()ed). */
	bool write, lent;
	uint64_t *released;
	size_t n_released;
};

static void chan_req_free(struct chan_req *cr)
{
	for (size_t i = cr->next; i < cr->n; i++)
		free(cr->items[i].iov_base);
	if (cr->dst && !cr->into && !cr->n && cr->req.done)
		free(cr->dst); /* answered without an item: nobody copies into it any more */
	free(cr->items);
	free(cr);
}

/* Drops @cr, a read whose caller gave up, once it is answered without an item; lock held. */
static void late_forget_locked(struct chan_req *cr)
{
	if (!cr->ch || (cr->req.done && cr->n))
		return; /* its caller waits for it, or it keeps an item for the next read */
	tpu_list_remove(&cr->node);
	chan_req_free(cr);
}

/* The items of answer @m into @cr (@tail: the inline ones back to back; lock held): copies of
 * them, or the one the daemon copied into @cr->dst. Return: 0 or -ENOMEM. */
static int chan_req_take_items(struct chan_req *cr, const Tpw__V1__ChanReply *m,
			       const uint8_t *tail)
{
	size_t off = 0;

	cr->items = calloc(m->n_lengths, sizeof(*cr->items));
	if (!cr->items)
		return -ENOMEM;
	if (m->copied) { /* validated: one item, no tail */
		void *c = cr->stage ? cr->stage->addr : cr->dst;

		if (!cr->dst || m->lengths[0] > cr->dst_len)
			return -EPROTO;
		if (cr->ch && (cr->into || cr->stage)) { /* its caller gave up: a copy of its own */
			void *from = c;

			c = malloc(m->lengths[0] ? m->lengths[0] : 1);
			if (!c)
				return -ENOMEM;
			memcpy(c, from, m->lengths[0]);
			if (!cr->into)
				free(cr->dst); /* this library's, unused: the item went to the stage */
			cr->dst = c;
			cr->into = false;
			cr->stage = NULL; /* registered until the context goes: nobody to give it back */
		}
		cr->items[0] = (struct iovec){ .iov_base = c, .iov_len = m->lengths[0] };
		cr->n = 1;
		return 0;
	}
	for (size_t i = 0; i < m->n_lengths; i++) { /* validated: they add up to the tail */
		void *c = malloc(m->lengths[i] ? m->lengths[i] : 1);

		if (!c)
			return -ENOMEM;
		memcpy(c, tail + off, m->lengths[i]);
		off += m->lengths[i];
		cr->items[cr->n++] = (struct iovec){ .iov_base = c, .iov_len = m->lengths[i] };
	}
	return 0;
}

/* The map's handler for a request answered by ChanReply: only a lost connection (@r NULL)
 * reaches it through the map; a Reply naming the id fails the call too. */
static void chan_req_on_reply(struct tp_context *ctx, struct tpc_req *req,
			      const Tpw__V1__Reply *r)
{
	tpc_context_req_done(ctx, req, r);
	if (r && req->status == 0)
		req->status = -EPROTO;
	late_forget_locked((struct chan_req *)req);
}

void tpc_chan_on_reply(struct tp_context *ctx, const Tpw__V1__ChanReply *m, const uint8_t *tail,
		       size_t tail_len)
{
	struct tpc_req *req = tpc_map_get(&ctx->reqs, m->req_id);
	struct chan_req *cr;

	if (!req || req->on_reply != chan_req_on_reply)
		return; /* the call gave up waiting, or not one of ours */
	tpc_map_del(&ctx->reqs, m->req_id);
	cr = (struct chan_req *)req;
	req->status = tpw_status_to_errno(m->status);
	snprintf(req->msg, sizeof(req->msg), "%s",
		 m->message && *m->message ? m->message : tp_strerror(req->status));
	cr->closed = m->closed;
	cr->chan_id = m->chan_id;
	cr->remote_refs = m->remote_refs;
	cr->held_len = m->held_len;
	cr->lent = m->lent;
	/* validated: at most TPW_CHAN_RELEASED_MAX */
	if (cr->write && m->n_released && !cr->released) {
		cr->released = malloc(m->n_released * sizeof(*cr->released));
		if (cr->released) {
			memcpy(cr->released, m->released, m->n_released * sizeof(*cr->released));
			cr->n_released = m->n_released;
		}
	}
	(void)tail_len; /* validated: the items add up to it */
	if (req->status == 0 && m->n_lengths) {
		req->status = chan_req_take_items(cr, m, tail);
		for (size_t i = 0; req->status < 0 && i < cr->n; i++)
			if (cr->items[i].iov_base != cr->dst)
				free(cr->items[i].iov_base);
		if (req->status < 0)
			cr->n = 0;
		if (req->status < 0)
			snprintf(req->msg, sizeof(req->msg), "%s", req->status == -ENOMEM ?
				 "out of memory for an item" : "an item copied to nowhere");
	}
	req->done = true;
	late_forget_locked(cr);
	pthread_cond_broadcast(&ctx->cond);
}

/* True when the oldest late read of @ch holds its item; lock held. */
static bool late_ready_locked(struct tp_chan *ch)
{
	return !tpu_list_empty(&ch->late) &&
	       tpu_list_first(&ch->late, struct chan_req, node)->req.done;
}

/* Moves the late reads of @ch that hold their item to @to, oldest first; lock held. */
static void late_take_done_locked(struct tp_chan *ch, struct tpu_list *to)
{
	struct chan_req *cr, *tmp;

	tpu_list_for_each_safe(cr, tmp, &ch->late, node) {
		if (!cr->req.done)
			continue;
		tpu_list_remove(&cr->node);
		tpu_list_insert_tail(to, &cr->node);
	}
}

/* Files @cr and sends @op (its req_id filled here) with @items as the data tail. Keeps @cr
 * filed until its answer or chan_wait_locked()'s give-up. Return: 0 or -errno. */
static int chan_send(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		     size_t n, struct chan_req *cr)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	int r;

	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && tpc_context_req_start_locked(ctx, &cr->req, chan_req_on_reply) < 0)
		r = tpc_error(-ENOMEM, "out of memory");
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		return r;
	op->req_id = cr->req.id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	pthread_mutex_lock(&ctx->send_lock);
	tpc_wire_send(ctx, &m, items, n, -EBADF); /* failure: connection loss fails the request */
	pthread_mutex_unlock(&ctx->send_lock);
	return 0;
}

/*
 * Waits (lock held, dropped while waiting) up to @wait_ms plus the reply timeout for the answer
 * to @cr, or with @late (a read's handle) until the oldest late read of @late holds its item.
 * Leaves @cr filed when it gives up. Return: the daemon's status or -errno when @cr is done;
 * -ETIMEDOUT (the caller gave up) or 1 (a late item is ready) when it is not.
 */
static int chan_wait_locked(struct tp_context *ctx, struct chan_req *cr, int wait_ms,
			    struct tp_chan *late)
{
	struct timespec ts;

	if (wait_ms < 0 || wait_ms > INT_MAX - ctx->reply_ms)
		wait_ms = INT_MAX - ctx->reply_ms;
	tpc_deadline(&ts, wait_ms + ctx->reply_ms);
	for (;;) {
		if (cr->req.done)
			return cr->req.status;
		if (late && late_ready_locked(late))
			return 1;
		if (pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) == ETIMEDOUT &&
		    !cr->req.done && !(late && late_ready_locked(late))) {
			snprintf(cr->req.msg, sizeof(cr->req.msg), "no answer from the daemon "
				 "within %d ms (tp_context_options.reply_timeout_ms)",
				 wait_ms + ctx->reply_ms);
			return -ETIMEDOUT;
		}
	}
}

/* chan_send() and chan_wait_locked() for a call whose late answer matters to nobody: a given
 * up request is unfiled. Return: the daemon's status or -errno. */
static int chan_call(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		     size_t n, int wait_ms, struct chan_req *cr)
{
	int r = chan_send(ctx, op, items, n, cr);

	if (r < 0)
		return r;
	pthread_mutex_lock(&ctx->lock);
	r = chan_wait_locked(ctx, cr, wait_ms, NULL);
	if (!cr->req.done && tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
		tpc_map_del(&ctx->reqs, cr->req.id);
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

int tpc_access_wire(int access, long gid, long owner_uid, struct tpc_access_wire *ret)
{
	*ret = (struct tpc_access_wire){ .gid = 0 };
	switch (access) {
	case TP_ACCESS_OWNER:
		ret->access = TPW__V1__ACCESS__ACCESS_OWNER;
		break;
	case TP_ACCESS_GROUP:
		ret->access = TPW__V1__ACCESS__ACCESS_GROUP;
		ret->gid = (uint32_t)gid;
		break;
	case TP_ACCESS_ANYONE:
		ret->access = TPW__V1__ACCESS__ACCESS_ANYONE;
		break;
	default:
		return tpc_error(-EINVAL, "unknown access mode %d", access);
	}
	if (owner_uid < -1 || owner_uid > (long)UINT32_MAX - 1)
		return tpc_error(-EINVAL, "owner uid %ld", owner_uid);
	ret->owner_set = owner_uid >= 0;
	ret->owner_uid = ret->owner_set ? (uint32_t)owner_uid : 0;
	return 0;
}

int tpc_remote_wire(int remote, const char *const *peers, size_t n,
		    Tpw__V1__RemoteAccess *ret_remote, char ***ret_peers, size_t *ret_n)
{
	*ret_peers = NULL;
	*ret_n = 0;
	switch (remote) {
	case TP_REMOTE_NONE:
		*ret_remote = TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
		return 0;
	case TP_REMOTE_ANY_PEER:
		*ret_remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
		return 0;
	case TP_REMOTE_PEERS:
		break;
	default:
		return tpc_error(-EINVAL, "unknown remote access %d", remote);
	}
	if (!peers || n == 0 || n > TPW_REMOTE_PEERS_MAX)
		return tpc_error(-EINVAL, "TP_REMOTE_PEERS takes 1..%u peer identities",
				 TPW_REMOTE_PEERS_MAX);
	for (size_t i = 0; i < n; i++)
		if (!peers[i] || !*peers[i] || strnlen(peers[i], TPW_NAME_MAX + 1) > TPW_NAME_MAX)
			return tpc_error(-EINVAL, "remote peer %zu: 1..%d bytes", i, TPW_NAME_MAX);
	*ret_remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	*ret_peers = (char **)peers;
	*ret_n = n;
	return 0;
}

bool tpc_object_name_ok(const char *name)
{
	char host[TPW_TPIP_HOST_MAX + 1];
	const char *n;
	uint16_t port;

	if (tpw_name_valid(name))
		return true;
	return strnlen(name, TPW_TPIP_ADDR_MAX + 1) <= TPW_TPIP_ADDR_MAX &&
	       tpw_tpip_parse(name, 1, host, &port, &n, NULL, 0) == 0;
}

static int chan_options(const struct tp_chan_options *opts, Tpw__V1__ChanOp *op)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tpc_access_wire aw;
	int r;

	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_chan_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
	}
	if (o.flags & ~(TP_CHAN_CREATE | TP_CHAN_EXCL | TP_CHAN_PERSISTENT))
		return tpc_error(-EINVAL, "unknown channel flags 0x%x", o.flags);
	r = tpc_access_wire((int)o.access, (long)o.gid, o.owner_uid, &aw);
	if (r < 0)
		return r;
	r = tpc_remote_wire((int)o.remote, o.remote_peers, o.n_remote_peers, &op->remote,
			    &op->remote_peers, &op->n_remote_peers);
	if (r < 0)
		return r;
	op->access = aw.access;
	op->gid = aw.gid;
	op->owner_set = aw.owner_set;
	op->owner_uid = aw.owner_uid;
	op->create = o.flags & TP_CHAN_CREATE;
	op->exclusive = o.flags & TP_CHAN_EXCL;
	op->persistent = o.flags & TP_CHAN_PERSISTENT;
	op->capacity_items = o.capacity_items;
	op->capacity_bytes = o.capacity_bytes;
	return 0;
}

TP_EXPORT int tp_chan_open(struct tp_context *ctx, const char *name,
			   const struct tp_chan_options *o, struct tp_chan **ret)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	struct tp_chan *ch;
	int r;

	if (!ctx || !name || !ret)
		return tpc_error(-EINVAL, "tp_chan_open: NULL argument");
	if (!tpc_object_name_ok(name))
		return tpc_error(-EINVAL, "'%.64s' is not a channel name (1 to 255 bytes of "
				 "[A-Za-z0-9._@:+-]) nor tpip://HOST[:PORT]/NAME", name);
	r = chan_options(o, &op);
	if (r < 0)
		return r;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	ch = calloc(1, sizeof(*ch));
	if (!ch || !(ch->name = strdup(name))) {
		free(ch);
		return tpc_error(-ENOMEM, "out of memory");
	}
	r = chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0) {
		free(ch->name);
		free(ch);
		return tpc_error(r, "cannot open channel '%s': %s", name, cr.req.msg);
	}
	ch->ctx = ctx;
	ch->id = cr.chan_id;
	ch->remote = strncmp(name, "tpip://", 7) == 0;
	ch->remote_refs = ch->remote && cr.remote_refs;
	ch->owner_uid = -1;
	if (o && o->size >= offsetof(struct tp_chan_options, owner_uid) + sizeof(o->owner_uid))
		ch->owner_uid = o->owner_uid;
	tpu_list_init(&ch->late);
	*ret = ch;
	return 0;
}

/* Does @ch take items by reference and batch reads? A channel of this host's daemon, minor 7,
 * or of another host whose daemon streams large items (its handle says so). */
static bool chan_fast(const struct tp_chan *ch)
{
	return (!ch->remote || ch->remote_refs) && ch->ctx->daemon_minor >= TPW_MINOR_CHAN_FAST;
}

/* @g: [@p, @p + @len) by reference: a range of one of the context's shared buffers, else (with
 * @cma) the caller's memory by CMA. Return: 0, or -EOPNOTSUPP (neither). */
static int chan_ref(struct tp_context *ctx, const void *p, size_t len, bool cma,
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
};

static void chan_segs_free(struct tp_context *ctx, struct chan_segs *w, bool reuse)
{
	tpc_buffer_stage_put(ctx, w->stage, reuse);
	free(w->seg);
	free(w->segp);
	free(w->ref);
	free(w->iov);
}

/* Did the daemon refuse staging buffer @b (NULL: none) of @ctx? */
static bool chan_stage_refused(struct tp_context *ctx, const struct tpc_buf *b)
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

/*
 * Copies the items of @items above TPW_CHAN_SHM_ITEM that are not in a shared buffer (their
 * segments still inline, @w->seg) into one staging buffer of the context and names them there:
 * a memcpy here and one in the daemon cost less than a CMA access each (backends/cma runs every
 * access in a task of its own). Without a staging buffer they stay as they are.
 */
static void chan_write_stage(struct tp_context *ctx, const struct iovec *items, size_t n,
			     struct chan_segs *w)
{
	uint64_t total = 0, off = 0;

	for (size_t i = 0; i < n; i++)
		if (w->seg[i].loc_case != TPW__V1__SEGMENT__LOC_SHM && chan_staged(&items[i]))
			total += CHAN_STAGE_ALIGN(items[i].iov_len);
	if (!total || total > SIZE_MAX)
		return;
	pthread_mutex_lock(&ctx->send_lock);
	if (tpc_buffer_stage_get(ctx, (size_t)total, &w->stage) < 0)
		w->stage = NULL;
	pthread_mutex_unlock(&ctx->send_lock);
	w->staged = total;
	for (size_t i = 0; w->stage && i < n; i++) {
		Tpw__V1__Segment *g = &w->seg[i];

		if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM || !chan_staged(&items[i]))
			continue;
		memcpy((uint8_t *)w->stage->addr + off, items[i].iov_base, items[i].iov_len);
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
			chan_ref(ch->ctx, items[i].iov_base, items[i].iov_len, false, &w->seg[i],
				 &w->ref[i]);
	}
	if (stage)
		chan_write_stage(ch->ctx, items, n, w);
	for (size_t i = 0; i < n; i++) {
		Tpw__V1__Segment *g = &w->seg[i];

		if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM ||
		    (items[i].iov_len > TPW_CHAN_INLINE_ITEM &&
		     chan_ref(ch->ctx, items[i].iov_base, items[i].iov_len, true, g,
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

	if (!b || b->size / 2 > staged)
		return false;
	pthread_mutex_lock(&ch->ctx->lock);
	ok = ch->n_lent < CHAN_LENT_MAX && ch->lent_bytes + b->size <= CHAN_LENT_BYTES;
	pthread_mutex_unlock(&ch->ctx->lock);
	return ok;
}

/* After a write's answer @cr: keeps its staging buffer @w->stage if the daemon kept it (lent),
 * and puts the buffers the daemon gave back into the staging pool. */
static void chan_lent_update(struct tp_chan *ch, struct chan_req *cr, struct chan_segs *w)
{
	struct tp_context *ctx = ch->ctx;
	struct tpc_buf *back[CHAN_LENT_MAX], *drop = NULL;
	unsigned n_back = 0;

	pthread_mutex_lock(&ctx->lock);
	if (cr->lent && w->stage && ch->n_lent < CHAN_LENT_MAX) {
		ch->lent[ch->n_lent++] = w->stage;
		ch->lent_bytes += w->stage->size;
	} else if (cr->lent) { /* another thread's lent buffers took the room: never reused */
		drop = w->stage;
	}
	if (cr->lent)
		w->stage = NULL;
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
	for (unsigned k = 0; k < n_back; k++)
		tpc_buffer_stage_put(ctx, back[k], true);
	tpc_buffer_stage_put(ctx, drop, false);
}

/* At release: the buffers still lent are never reused (the daemon may still hold items in
 * them, and keeps its mapping until they leave); they are unregistered. */
static void chan_lent_drop(struct tp_chan *ch)
{
	for (unsigned k = 0; k < ch->n_lent; k++)
		tpc_buffer_stage_put(ch->ctx, ch->lent[k], false);
	ch->n_lent = 0;
	ch->lent_bytes = 0;
}

TP_EXPORT int tp_chan_write(struct tp_chan *ch, const struct iovec *items, size_t n,
			    int timeout_ms)
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
		if (items[i].iov_len == 0 || (!items[i].iov_base))
			return tpc_error(-EINVAL, "item %zu is empty", i);
		lens[i] = items[i].iov_len;
		total += lens[i];
		refs |= lens[i] > TPW_CHAN_SHM_ITEM;
	}
	refs &= chan_fast(ch);
	if (!refs && total > ch->ctx->lim.inline_max)
		return tpc_error(-EMSGSIZE, "a batch of more than %u bytes (the daemon's inline "
				 "limit)", ch->ctx->lim.inline_max);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = ch->id;
	op.n_lengths = n;
	op.lengths = lens;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = refs ? chan_write_segs(ch, items, n, true, &op, &w) : 0;
	op.lend = r == 0 && refs && chan_may_lend(ch, w.stage, w.staged);
	cr.write = true;
	if (r == 0)
		r = chan_call(ch->ctx, &op, refs ? w.iov : items, refs ? w.n_iov : n, timeout_ms,
			      &cr);
	if (cr.req.done)
		chan_lent_update(ch, &cr, &w);
	if (r == -ENOENT && chan_stage_refused(ch->ctx, w.stage)) {
		/* The daemon refused the staging buffer (its quota): nothing was written; again
		 * without it. */
		chan_segs_free(ch->ctx, &w, false);
		w = (struct chan_segs){ 0 };
		cr = (struct chan_req){ .write = true };
		r = chan_write_segs(ch, items, n, false, &op, &w);
		op.lend = false;
		if (r == 0)
			r = chan_call(ch->ctx, &op, w.iov, w.n_iov, timeout_ms, &cr);
		if (cr.req.done)
			chan_lent_update(ch, &cr, &w);
	}
	/* A write given up may still be copied from its staging buffer: never reuse that one. */
	chan_segs_free(ch->ctx, &w, !(r == -ETIMEDOUT && !cr.req.done));
	if (r == -ETIMEDOUT && !cr.req.done)
		return tpc_error(-EINPROGRESS, "channel '%s': %s: the batch may be written yet",
				 ch->name, cr.req.msg);
	if (r < 0 && cr.req.msg[0])
		return tpc_error(r, "channel '%s': %s", ch->name, cr.req.msg);
	return r;
}

/* Takes the oldest late read of @ch if it holds its item; lock held. Return: owned, or NULL. */
static struct chan_req *late_take_locked(struct tp_chan *ch)
{
	struct chan_req *cr;

	if (!late_ready_locked(ch))
		return NULL;
	cr = tpu_list_first(&ch->late, struct chan_req, node);
	tpu_list_remove(&cr->node);
	return cr;
}

/* Sends READ @op of @ch for @cr (owned; its destination set) and waits for it. Return: owned
 * chan_req to answer the call with (@cr, or an older late read's with its items), or NULL
 * (-ENOMEM or a send error in *@ret_err). */
/*
 * An answered read's item out of its staging buffer (lock held): copied to the read's
 * allocation, or, for the caller's allocation (@into), to one of its own (the caller gets
 * another item there). Return: the staging buffer, to give back once the lock is dropped, or
 * NULL.
 */
static struct tpc_buf *read_unstage_locked(struct chan_req *cr)
{
	struct tpc_buf *b = cr->stage;
	void *to = cr->dst;

	if (!b || !cr->req.done)
		return NULL;
	cr->stage = NULL;
	if (!cr->n || cr->items[0].iov_base != b->addr)
		return b;
	if (cr->into && !(to = malloc(cr->items[0].iov_len ? cr->items[0].iov_len : 1))) {
		cr->n = 0; /* no memory: the item is lost */
		return b;
	}
	memcpy(to, b->addr, cr->items[0].iov_len);
	cr->items[0].iov_base = to;
	cr->dst = to;
	cr->into = false;
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

	*ret_err = chan_send(ctx, op, NULL, 0, cr);
	if (*ret_err < 0) {
		if (!cr->into)
			free(cr->dst); /* never sent: nobody copies into it */
		tpc_buffer_stage_put(ctx, cr->stage, true);
		free(cr);
		return NULL;
	}
	pthread_mutex_lock(&ctx->lock);
	r = chan_wait_locked(ctx, cr, timeout_ms, ch);
	if (cr->req.done && late_ready_locked(ch))
		stage = read_unstage_locked(cr); /* not returned: its items must be its own */
	if (!cr->req.done || (cr->n && late_ready_locked(ch))) {
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
	} else if (late_ready_locked(ch)) { /* failed, but an older read's item came */
		chan_req_free(cr);
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
	if (chan_ref(ctx, dst, len, false, g, ref) == 0)
		return 0;
	pthread_mutex_lock(&ctx->send_lock);
	if (!stage || tpc_buffer_stage_get(ctx, len, &b) < 0)
		b = NULL;
	pthread_mutex_unlock(&ctx->send_lock);
	if (!b)
		return chan_ref(ctx, dst, len, true, g, ref);
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
	cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	if (cr && cr->req.status == -ENOENT && chan_stage_refused(ch->ctx, cr->stage))
		cr->req.status = -EAGAIN; /* the daemon refused the staging buffer: again without */
	read_unstage(ch->ctx, cr);
	return cr;
}

/*
 * One read of up to @max items of @ch (@into: the caller's allocation for one item, or NULL):
 * items a late read holds first, else one READ (and, for an item the daemon holds, the READ
 * that takes it). Return: owned chan_req whose items from @next on answer the call (status 0),
 * or NULL with *@ret_err (message set).
 */
static struct chan_req *chan_read_one(struct tp_chan *ch, size_t max, const struct iovec *into,
				      bool stage, int timeout_ms, int *ret_err)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g, *gp[1] = { &g };
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
	if (chan_fast(ch)) {
		op.max_items = max > 1 ? (uint32_t)TPU_MIN(max, ch->ctx->lim.segments_max) : 0;
		op.inline_only = !__atomic_load_n(&ch->ctx->cma_ok, __ATOMIC_RELAXED);
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
	}
	cr = into ? read_req_new(into->iov_base, into->iov_len, true) : read_req_new(NULL, 0, 0);
	if (!cr) {
		tpc_buffer_stage_put(ch->ctx, buf, true);
		*ret_err = tpc_error(-ENOMEM, "out of memory");
		return NULL;
	}
	cr->stage = buf;
	cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	if (into && stage && cr && cr->req.status == -ENOENT &&
	    chan_stage_refused(ch->ctx, cr->stage)) { /* refused before any item was taken */
		read_unstage(ch->ctx, cr);
		chan_req_free(cr);
		return chan_read_one(ch, max, into, false, timeout_ms, ret_err);
	}
	read_unstage(ch->ctx, cr);
	/* An item held for the handle: take it into a new allocation. Another thread reading the
	 * handle may take it first (-ENOENT): then read again. */
	for (unsigned tries = 0; cr && cr->req.status == 0 && !cr->n && cr->held_len && !into;) {
		uint64_t len = cr->held_len;

		chan_req_free(cr);
		cr = read_held_call(ch, len, held_stage, timeout_ms, ret_err);
		if (cr && cr->req.status == -EAGAIN)
			held_stage = false; /* its staging buffer was refused: the item is still held */
		else if (!cr || cr->req.status != -ENOENT || ++tries == 16)
			break;
		chan_req_free(cr);
		if (!(cr = read_req_new(NULL, 0, false))) {
			*ret_err = tpc_error(-ENOMEM, "out of memory");
			break;
		}
		cr = chan_read_call(ch, &op, cr, timeout_ms, ret_err);
	}
	return cr;
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
		chan_req_free(cr);
		return r < 0 ? r : -EPROTO; /* negative, so that no caller uses @cr (gcc -O3) */
	}
	return r;
}

/* Files what is left of @cr (items not taken) first on @ch's late reads, or frees it. */
static void chan_req_keep(struct tp_chan *ch, struct chan_req *cr)
{
	if (cr->next >= cr->n)
		return chan_req_free(cr);
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
	if (!chan_fast(ch))
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

static int chan_simple(struct tp_chan *ch, Tpw__V1__ChanOpKind kind, const char *what)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	op.op = kind;
	op.chan_id = ch->id;
	r = chan_call(ch->ctx, &op, NULL, 0, 0, &cr);
	if (r < 0)
		return tpc_error(r, "cannot %s channel '%s': %s", what, ch->name, cr.req.msg);
	return 0;
}

TP_EXPORT int tp_chan_close(struct tp_chan *ch)
{
	if (!ch)
		return tpc_error(-EINVAL, "tp_chan_close: NULL channel");
	return chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE, "close");
}

static bool chan_late_any(struct tp_chan *ch)
{
	bool any;

	pthread_mutex_lock(&ch->ctx->lock);
	any = !tpu_list_empty(&ch->late);
	pthread_mutex_unlock(&ch->ctx->lock);
	return any;
}

/* Writes the items of late reads in @kept back to the channel through @via (NULL: drops them),
 * oldest first, waiting up to the reply timeout for room; frees @kept. Return: 0 or the first
 * error (message set), counting the items dropped. */
static int chan_give_back(struct tp_chan *via, struct tpu_list *kept, const char *name)
{
	struct chan_req *cr, *tmp;
	unsigned lost = 0;
	int r = 0, w;

	tpu_list_for_each_safe(cr, tmp, kept, node) {
		for (size_t i = cr->next; i < cr->n; i++) {
			w = via ? tp_chan_write(via, &cr->items[i], 1, via->ctx->reply_ms) : -ENOENT;
			if (w < 0) {
				r = r ? r : w;
				lost++;
			}
		}
		tpu_list_remove(&cr->node);
		chan_req_free(cr);
	}
	if (r < 0)
		return tpc_error(r, "%u item(s) that came after their read gave up could not be "
				 "given back to channel '%s': %s", lost, name, tp_strerror(r));
	return 0;
}

/*
 * Releases @ch, which has reads whose caller gave up: their items are written back to the
 * channel through a second handle opened first (the daemon sends every item of @ch before it
 * answers the release), or through @ch itself before the release if that open fails (then an
 * item answering a read still waiting at the release is dropped). Takes @ch.
 * Return: the release's result, else the give-back's.
 */
static int chan_release_late(struct tp_chan *ch)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = ch->owner_uid };
	struct tpu_list kept = TPU_LIST_INIT(kept);
	struct tp_context *ctx = ch->ctx;
	struct tp_chan *back = NULL;
	struct chan_req *cr, *tmp;
	int r, g = 0;

	if (tp_chan_open(ctx, ch->name, &o, &back) < 0) {
		back = NULL;
		pthread_mutex_lock(&ctx->lock);
		late_take_done_locked(ch, &kept);
		pthread_mutex_unlock(&ctx->lock);
		g = chan_give_back(ch, &kept, ch->name);
	}
	r = chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, "release");
	pthread_mutex_lock(&ctx->lock);
	late_take_done_locked(ch, &kept);
	tpu_list_for_each_safe(cr, tmp, &ch->late, node) { /* canceled by the release: unfile */
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		chan_req_free(cr); /* keeps a destination a copy may still reach */
	}
	pthread_mutex_unlock(&ctx->lock);
	if (!tpu_list_empty(&kept)) {
		int g2 = chan_give_back(back, &kept, ch->name);

		g = g ? g : g2;
	}
	if (back)
		tp_chan_release(back);
	chan_lent_drop(ch);
	free(ch->name);
	free(ch);
	return r < 0 ? r : g;
}

TP_EXPORT int tp_chan_release(struct tp_chan *ch)
{
	int r;

	if (!ch)
		return 0;
	if (chan_late_any(ch))
		return chan_release_late(ch);
	r = chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, "release");
	chan_lent_drop(ch);
	free(ch->name);
	free(ch);
	return r;
}

TP_EXPORT int tp_chan_unlink(struct tp_context *ctx, const char *name, long owner_uid)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	if (!ctx || !name || !tpc_object_name_ok(name))
		return tpc_error(-EINVAL, "tp_chan_unlink: neither a channel name nor "
				 "tpip://HOST[:PORT]/NAME");
	if (owner_uid < -1 || owner_uid > (long)UINT32_MAX - 1)
		return tpc_error(-EINVAL, "owner uid %ld", owner_uid);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK;
	op.name = (char *)name;
	op.owner_set = owner_uid >= 0;
	op.owner_uid = op.owner_set ? (uint32_t)owner_uid : 0;
	r = chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0)
		return tpc_error(r, "cannot unlink channel '%s': %s", name, cr.req.msg);
	return 0;
}
