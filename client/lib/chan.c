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
 * when the handle is released first. A message read that gave up (tp_chan.late_msg, chanmsg.c)
 * keeps the descriptor of the item the daemon holds for the handle for the next
 * tp_chan_read_descriptor(); at release the daemon gives that item back itself. A take that
 * gave up (tp_chan.late_takes) keeps the item itself, which a release writes back.
 *
 * A write's private items go through a staging buffer, which the library lends to the channel
 * (ChanOp.lend) while it has fewer than CHAN_LENT_MAX lent: the daemon keeps the items there
 * instead of copying them in, and names the buffer in a later write's answer once they have
 * all left the channel (ChanReply.released); only then does it go back to the staging pool, or,
 * with a daemon of minor 9, to the handle, which then stages and lends only buffers of its own
 * and reads lent items by mapping their writer's buffer (chanmap.c).
 *
 * This file keeps the handles (open, close, release, unlink) and the requests with their
 * answers; writes are in chanwrite.c, reads in chanread.c, what they share in chan_int.h.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "chan_int.h"
#include "internal.h"

void tpc_chan_req_free(struct chan_req *cr)
{
	if (cr->map_has_fd) /* an item by mapping never taken: the daemon gives it back */
		close(cr->map_fd);
	for (size_t i = cr->next; i < cr->n; i++)
		free(cr->items[i].iov_base);
	if (cr->dst && !cr->into && !cr->n && cr->req.done)
		free(cr->dst); /* answered without an item: nobody copies into it any more */
	free(cr->items);
	free(cr->map_offs);
	free(cr);
}

/* Drops @cr, a read whose caller gave up, once it is answered without an item; lock held. */
static void late_forget_locked(struct chan_req *cr)
{
	if ((cr->msg_read || cr->msg_take) && cr->ch && cr->req.done)
		return tpc_chan_msg_late_locked(cr);
	if (!cr->ch || (cr->req.done && cr->n))
		return; /* its caller waits for it, or it keeps an item for the next read */
	tpu_list_remove(&cr->node);
	tpc_chan_req_free(cr);
}

/* The inline items of answer @m (@tail: back to back) to packed read @cr, whose caller still
 * waits: straight into its memory, each where tpw_chan_pack_at() puts it, once every one is
 * checked to fit there (the daemon is not trusted to have packed them so). Lock held.
 * Return: 0, or -EPROTO (more items than asked for, or they do not fit: none copied). */
static int chan_req_take_packed(struct chan_req *cr, const Tpw__V1__ChanReply *m,
				const uint8_t *tail)
{
	uint64_t end = 0, off;
	size_t t = 0;

	if (m->n_lengths > cr->pack_max)
		return -EPROTO;
	for (size_t i = 0; i < m->n_lengths; i++) {
		if (!tpw_chan_pack_at(end, m->lengths[i], cr->dst_len, &off))
			return -EPROTO;
		end = off + m->lengths[i];
	}
	end = 0;
	for (size_t i = 0; i < m->n_lengths; i++) {
		(void)tpw_chan_pack_at(end, m->lengths[i], cr->dst_len, &off); /* checked above */
		memcpy((uint8_t *)cr->dst + off, tail + t, m->lengths[i]);
		t += m->lengths[i];
		end = off + m->lengths[i];
		cr->items[i] = (struct iovec){ .iov_base = (uint8_t *)cr->dst + off,
					       .iov_len = m->lengths[i] };
	}
	cr->n = m->n_lengths;
	return 0;
}

/* The items the daemon copied into packed read @cr's shared buffer (answer @m, several): each
 * checked to lie where tpw_chan_pack_at() puts it within the buffer, and no more than asked
 * for (the daemon is not trusted to have packed them so). A caller that gave up gets copies of
 * its own, as for one item copied (it may use the buffer again). Lock held. Return: 0, -ENOMEM
 * or -EPROTO. */
static int chan_req_take_copied(struct chan_req *cr, const Tpw__V1__ChanReply *m)
{
	uint64_t end = 0, off;

	if (!cr->pack_copied || !cr->dst || cr->stage || m->n_lengths > cr->pack_max)
		return -EPROTO;
	for (size_t i = 0; i < m->n_lengths; i++) {
		if (!tpw_chan_pack_at(end, m->lengths[i], cr->dst_len, &off))
			return -EPROTO; /* (@cr->n stays 0: nothing of the caller's is freed) */
		end = off + m->lengths[i];
		cr->items[i] = (struct iovec){ .iov_base = (uint8_t *)cr->dst + off,
					       .iov_len = m->lengths[i] };
	}
	cr->n = m->n_lengths;
	if (!cr->ch)
		return 0;
	for (size_t i = 0; i < cr->n; i++) { /* its caller gave up: copies of its own */
		void *c = malloc(cr->items[i].iov_len);

		if (!c) {
			for (size_t k = 0; k < i; k++)
				free(cr->items[k].iov_base);
			cr->n = 0;
			return -ENOMEM;
		}
		memcpy(c, cr->items[i].iov_base, cr->items[i].iov_len);
		cr->items[i].iov_base = c;
	}
	cr->into = false;
	cr->pack = false;
	cr->dst = NULL;
	return 0;
}

/* The items of answer @m into @cr (@tail: the inline ones back to back; lock held): copies of
 * them, or the one the daemon copied into @cr->dst, or for a read into its caller's memory
 * still waited for, straight there. Return: 0, -ENOMEM or -EPROTO. */
static int chan_req_take_items(struct chan_req *cr, const Tpw__V1__ChanReply *m,
			       const uint8_t *tail)
{
	size_t off = 0;

	cr->items = calloc(m->n_lengths, sizeof(*cr->items));
	if (!cr->items)
		return -ENOMEM;
	if (m->copied && m->n_lengths > 1) /* validated: none empty, no tail */
		return chan_req_take_copied(cr, m);
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
	if (cr->pack && !cr->ch)
		return chan_req_take_packed(cr, m, tail);
	if (cr->into && !cr->ch && m->n_lengths == 1 && m->lengths[0] <= cr->dst_len) {
		/* one inline item for a read into its caller's memory, still waited for: straight
		 * there (a malloc()ed copy freed at once let glibc trim the heap, and the next
		 * item's copy faulted all its pages in again) */
		memcpy(cr->dst, tail, m->lengths[0]);
		cr->items[0] = (struct iovec){ .iov_base = cr->dst, .iov_len = m->lengths[0] };
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
	struct tpc_req *req;
	struct chan_req *cr;

	if (m->n_retired) /* a notice (validated: nothing else, req_id 0) */
		return tpc_chan_map_on_retired(ctx, m);
	if (!m->req_id && m->n_released) /* a notice of buffers given back (validated so) */
		return tpc_chan_on_released(ctx, m);
	req = tpc_map_get(&ctx->reqs, m->req_id);
	if (!req || req->on_reply != chan_req_on_reply) {
		if (m->map_fd) { /* the fd sent ahead of it: taken, so that the next fits its frame */
			int fd = tpc_pring_take_fd(ctx);

			if (fd >= 0)
				close(fd);
		}
		return; /* the call gave up waiting, or not one of ours */
	}
	tpc_map_del(&ctx->reqs, m->req_id);
	cr = (struct chan_req *)req;
	req->status = tpw_status_to_errno(m->status);
	snprintf(req->msg, sizeof(req->msg), "%s",
		 m->message && *m->message ? m->message : tp_strerror(req->status));
	cr->closed = m->closed;
	cr->chan_id = m->chan_id;
	cr->remote_refs = m->remote_refs;
	cr->held_len = m->held_len;
	cr->pack_reads = m->pack_reads;
	cr->lent = m->lent;
	if (cr->write && m->lent && cr->lend_buf && tpc_chan_lend_file(cr->wch, cr->lend_buf))
		cr->lend_kept = true;
	/* validated: at most TPW_CHAN_RELEASED_MAX */
	if (cr->write && m->n_released && !cr->released) {
		cr->released = malloc(m->n_released * sizeof(*cr->released));
		if (cr->released) {
			memcpy(cr->released, m->released, m->n_released * sizeof(*cr->released));
			cr->n_released = m->n_released;
		}
	}
	(void)tail_len; /* validated: the items add up to it */
	cr->msg_held = m->msg_held;
	cr->msg_taken = m->msg_taken;
	if (req->status == 0 && (m->msg_held || m->msg_taken)) {
		/* a message read: its descriptor, or its bytes inline into the read's slots (the
		 * ones copied by the daemon or dropped leave nothing to do here) */
		if (m->msg_held)
			req->status = tpc_chan_msg_on_held(ctx, cr, m);
		else if (!m->copied && m->n_lengths)
			req->status = tpc_chan_msg_on_taken(cr, m, tail);
		if (req->status < 0)
			snprintf(req->msg, sizeof(req->msg), "%s", tp_last_error());
	} else if (req->status == 0 && m->map_key) { /* copied out by the caller (chanmap.c) */
		req->status = tpc_chan_map_on_reply(ctx, cr, m);
		if (req->status < 0)
			snprintf(req->msg, sizeof(req->msg), "an item to map that cannot be");
	} else if (m->map_fd) { /* (validated: only with map_key) an fd with a failure */
		int fd = tpc_pring_take_fd(ctx);

		if (fd >= 0)
			close(fd);
		req->status = req->status ? req->status : -EPROTO;
	} else if (req->status == 0 && m->n_lengths) {
		req->status = chan_req_take_items(cr, m, tail);
		for (size_t i = 0; req->status < 0 && i < cr->n; i++)
			if (cr->items[i].iov_base != cr->dst)
				free(cr->items[i].iov_base);
		if (req->status < 0)
			cr->n = 0;
		if (req->status < 0)
			snprintf(req->msg, sizeof(req->msg), "%s", req->status == -ENOMEM ?
				 "out of memory for an item" : cr->pack ? "items that do not fit "
				 "the read's allocation packed" : "an item copied to nowhere");
	}
	req->done = true;
	late_forget_locked(cr);
	pthread_cond_broadcast(&ctx->cond);
}

/* True when the oldest late read of @ch holds its item; lock held. */
bool tpc_chan_late_ready_locked(struct tp_chan *ch)
{
	return !tpu_list_empty(&ch->late) &&
	       tpu_list_first(&ch->late, struct chan_req, node)->req.done;
}

/* True when @ch has what @cr's caller returns instead of its own answer: the item of a late
 * byte read, or the descriptor a late message read brought; lock held. */
static bool late_ready_for_locked(const struct chan_req *cr, struct tp_chan *ch)
{
	if (cr->msg_read)
		return ch->late_desc || (!tpu_list_empty(&ch->late_takes) &&
					 tpu_list_first(&ch->late_takes, struct chan_req,
							node)->req.done);
	return tpc_chan_late_ready_locked(ch);
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
 * filed until its answer or tpc_chan_wait_locked()'s give-up. Return: 0 or -errno. */
int tpc_chan_send(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
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
 * to @cr, or with @late (a read's handle) until the oldest late read of @late holds its item
 * (for a message read: until a late message read of @late brought a descriptor). Leaves @cr
 * filed when it gives up. Return: the daemon's status or -errno when @cr is done; -ETIMEDOUT
 * (the caller gave up) or 1 (a late item is ready) when it is not.
 */
int tpc_chan_wait_locked(struct tp_context *ctx, struct chan_req *cr, int wait_ms,
			 struct tp_chan *late)
{
	struct timespec ts;

	if (wait_ms < 0 || wait_ms > INT_MAX - ctx->reply_ms)
		wait_ms = INT_MAX - ctx->reply_ms;
	tpc_deadline(&ts, wait_ms + ctx->reply_ms);
	for (;;) {
		if (cr->req.done)
			return cr->req.status;
		if (late && late_ready_for_locked(cr, late))
			return 1;
		if (pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) == ETIMEDOUT &&
		    !cr->req.done && !(late && late_ready_for_locked(cr, late))) {
			snprintf(cr->req.msg, sizeof(cr->req.msg), "no answer from the daemon "
				 "within %d ms (tp_context_options.reply_timeout_ms)",
				 wait_ms + ctx->reply_ms);
			return -ETIMEDOUT;
		}
	}
}

/* tpc_chan_send() and tpc_chan_wait_locked() for a call whose late answer matters to nobody: a
 * given up request is unfiled. Return: the daemon's status or -errno. */
int tpc_chan_call(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		  size_t n, int wait_ms, struct chan_req *cr)
{
	int r = tpc_chan_send(ctx, op, items, n, cr);

	if (r < 0)
		return r;
	pthread_mutex_lock(&ctx->lock);
	r = tpc_chan_wait_locked(ctx, cr, wait_ms, NULL);
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
	r = tpc_chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0) {
		free(ch->name);
		free(ch);
		return tpc_error(r, "cannot open channel '%s': %s", name, cr.req.msg);
	}
	ch->ctx = ctx;
	ch->id = cr.chan_id;
	ch->remote = strncmp(name, "tpip://", 7) == 0;
	ch->remote_refs = ch->remote && cr.remote_refs;
	/* Packed batch reads: this host's daemon says it takes them (one that does not would fail
	 * the session on a READ naming an allocation and more than one item); for another host's
	 * channel, this host's daemon says so when it forwards them packed (the far daemon takes
	 * a peer's packed reads and streams large items). */
	ch->pack = (!ch->remote || ch->remote_refs) && ctx->daemon_minor >= TPW_MINOR_CHAN_FAST &&
		   cr.pack_reads;
	/* Lent items read by mapping: this host's channels, a daemon of minor 9 and control
	 * rings (the fds come beside them). */
	ch->map = !ch->remote && ctx->daemon_minor >= TPW_MINOR_CHAN_MAP && ctx->ring;
	ch->map_read = ch->map;
	ch->owner_uid = -1;
	if (o && o->size >= offsetof(struct tp_chan_options, owner_uid) + sizeof(o->owner_uid))
		ch->owner_uid = o->owner_uid;
	tpu_list_init(&ch->late);
	tpu_list_init(&ch->descs);
	tpu_list_init(&ch->late_msg);
	tpu_list_init(&ch->late_takes);
	tpc_chan_map_open(ch);
	*ret = ch;
	return 0;
}

/* Does @ch take items by reference and batch reads? A channel of this host's daemon, minor 7,
 * or of another host whose daemon streams large items (its handle says so). */
bool tpc_chan_fast(const struct tp_chan *ch)
{
	return (!ch->remote || ch->remote_refs) && ch->ctx->daemon_minor >= TPW_MINOR_CHAN_FAST;
}

static int chan_simple(struct tp_chan *ch, Tpw__V1__ChanOpKind kind, const char *what)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	op.op = kind;
	op.chan_id = ch->id;
	r = tpc_chan_call(ch->ctx, &op, NULL, 0, 0, &cr);
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
		tpc_chan_req_free(cr);
	}
	if (r < 0)
		return tpc_error(r, "%u item(s) that came after their read gave up could not be "
				 "given back to channel '%s': %s", lost, name, tp_strerror(r));
	return 0;
}

/* Copies out the items of @ch's late reads handed out by mapping (done, not taken yet), so
 * that they are given back as the others; one that cannot be went back to the channel. */
static void late_map_take(struct tp_chan *ch)
{
	struct chan_req *cr, *found;

	for (;;) { /* each taken once (map_pending cleared); a done read stays on the list */
		found = NULL;
		pthread_mutex_lock(&ch->ctx->lock);
		tpu_list_for_each(cr, &ch->late, node)
			if (!found && cr->req.done && cr->map_pending)
				found = cr;
		pthread_mutex_unlock(&ch->ctx->lock);
		if (!found)
			return;
		(void)tpc_chan_map_take(ch, found);
	}
}

/*
 * Releases @ch, which has reads whose caller gave up: their items are written back to the
 * channel through a second handle opened first (the daemon sends every item of @ch before it
 * answers the release), or through @ch itself before the release if that open fails (then an
 * item answering a read still waiting at the release is dropped). Message items the daemon
 * no longer has (a take that gave up) go back the same way. Takes @ch.
 * Return: the release's result, else the give-back's.
 */
static int chan_release_late(struct tp_chan *ch)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = ch->owner_uid };
	struct tpu_list kept = TPU_LIST_INIT(kept);
	struct tp_context *ctx = ch->ctx;
	struct tp_chan *back = NULL;
	struct chan_req *cr, *tmp;
	int r, g = 0, g2;

	if (tp_chan_open(ctx, ch->name, &o, &back) < 0) {
		back = NULL;
		pthread_mutex_lock(&ctx->lock);
		late_take_done_locked(ch, &kept);
		pthread_mutex_unlock(&ctx->lock);
		g = chan_give_back(ch, &kept, ch->name);
		g2 = tpc_chan_msg_give_back(ch, ch);
		g = g ? g : g2;
	}
	late_map_take(ch); /* before the release gives their items back */
	r = chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, "release");
	pthread_mutex_lock(&ctx->lock);
	late_take_done_locked(ch, &kept);
	tpu_list_for_each_safe(cr, tmp, &ch->late, node) { /* canceled by the release: unfile */
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		tpc_chan_req_free(cr); /* keeps a destination a copy may still reach */
	}
	pthread_mutex_unlock(&ctx->lock);
	if (!tpu_list_empty(&kept)) {
		g2 = chan_give_back(back, &kept, ch->name);
		g = g ? g : g2;
	}
	if (back) { /* the message items the daemon no longer has */
		g2 = tpc_chan_msg_give_back(ch, back);
		g = g ? g : g2;
	}
	tpc_chan_msg_orphan(ch);
	if (back)
		tp_chan_release(back);
	tpc_chan_map_drop(ch);
	tpc_chan_lent_drop(ch);
	free(ch->name);
	free(ch);
	return r < 0 ? r : g;
}

TP_EXPORT int tp_chan_release(struct tp_chan *ch)
{
	int r;

	if (!ch)
		return 0;
	if (chan_late_any(ch) || tpc_chan_msg_kept_any(ch))
		return chan_release_late(ch);
	r = chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, "release");
	tpc_chan_msg_orphan(ch);
	tpc_chan_map_drop(ch);
	tpc_chan_lent_drop(ch);
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
	r = tpc_chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0)
		return tpc_error(r, "cannot unlink channel '%s': %s", name, cr.req.msg);
	return 0;
}
