/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Lent channel items read by mapping (issue 25 part map; chan_int.h, docs/channels.md). A
 * handle of a channel of this host (tp_chan.map) stages and lends only buffers of its own:
 * fresh memfds, sealed against writes by anyone but this library's own mapping, that serve
 * that handle and that channel alone and never go to the context's staging pool (which pipes
 * use), so that a reader that maps one sees bytes of that channel's items only. A read takes
 * an item lying in such a buffer by mapping the buffer read-only (the fd the daemon hands over
 * once; CHAN_MAP_MAX mappings kept per handle, the least recently used unmapped first) and
 * copying the item out itself, then tells the daemon (ChanOp.map_done), which copies none of
 * its bytes and counts the item read only then. Leaves the requests to chan.c, the staging of
 * items to chanwrite.c and the reads themselves to chanread.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chan_int.h"
#include "internal.h"
#include "reduce.h"

void tpc_chan_map_op(struct tp_chan *ch, Tpw__V1__ChanOp *op, uint64_t *keys,
		     struct chan_req *cr)
{
	size_t n = 0;

	pthread_mutex_lock(&ch->ctx->lock);
	if (!ch->map_read) {
		pthread_mutex_unlock(&ch->ctx->lock);
		return;
	}
	op->map_ok = true;
	cr->map_req = true;
	for (unsigned i = 0; i < ch->n_maps; i++)
		if (!ch->maps[i].retired)
			keys[n++] = ch->maps[i].key;
	pthread_mutex_unlock(&ch->ctx->lock);
	op->n_mapped = n;
	op->mapped = n ? keys : NULL;
}

int tpc_chan_map_on_reply(struct tp_context *ctx, struct chan_req *cr,
			  const Tpw__V1__ChanReply *m)
{
	/* validated: one item, inside map_size, no tail */
	int fd = m->map_fd ? tpc_pring_take_fd(ctx) : -EBADF;

	/* several items only for a packed read that said it takes them, no more than it asked */
	if (!cr->map_req || (m->map_fd && fd < 0) ||
	    (m->n_lengths > 1 && (!cr->pack_mapped || m->n_lengths > cr->pack_max))) {
		if (fd >= 0)
			close(fd);
		return -EPROTO; /* (the items stay out until the handle is released) */
	}
	cr->items = calloc(m->n_lengths, sizeof(*cr->items));
	if (cr->items && m->n_lengths > 1 &&
	    (cr->map_offs = malloc(m->n_lengths * sizeof(*cr->map_offs))))
		memcpy(cr->map_offs, m->map_offs, m->n_lengths * sizeof(*cr->map_offs));
	if (!cr->items || (m->n_lengths > 1 && !cr->map_offs)) {
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_lengths; i++) /* validated: one offset each when several */
		cr->items[i] = (struct iovec){ .iov_base = NULL, .iov_len = m->lengths[i] };
	cr->n = m->n_lengths;
	cr->map_pending = true;
	cr->map_key = m->map_key;
	cr->map_off = m->map_off;
	cr->map_fd = fd;
	cr->map_has_fd = fd >= 0;
	return 0;
}

/* The mapping of @key kept by @ch (not retired), with one more reference; lock held. Return:
 * it, or NULL. */
static struct chan_map *map_find_locked(struct tp_chan *ch, uint64_t key)
{
	for (unsigned i = 0; i < ch->n_maps; i++) {
		if (ch->maps[i].key != key || ch->maps[i].retired)
			continue;
		ch->maps[i].refs++;
		ch->maps[i].used = ++ch->map_tick;
		return &ch->maps[i];
	}
	return NULL;
}

/* Maps @fd (borrowed) read-only, the whole file as fstat() says (the daemon hands out only
 * files sealed against shrinking), and keeps it as @key in @ch, in place of the least recently
 * used mapping no copy uses when CHAN_MAP_MAX are kept. Return: a copy of the entry with one
 * reference in *@ret (@ret->key 0: not kept, unmap it after use), or -errno. */
static int map_new(struct tp_chan *ch, uint64_t key, int fd, struct chan_map *ret)
{
	struct chan_map *e, old = { 0 };
	struct stat st;
	void *addr;
	int victim = -1;

	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > SIZE_MAX)
		return -EPROTO;
	addr = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		return -errno;
	*ret = (struct chan_map){ .key = 0, .addr = addr, .size = (size_t)st.st_size, .refs = 1 };
	pthread_mutex_lock(&ch->ctx->lock);
	e = map_find_locked(ch, key); /* another thread mapped it meanwhile */
	if (e) {
		old = *ret;
		*ret = *e;
	}
	for (unsigned i = 0; !e && i < ch->n_maps; i++)
		if (!ch->maps[i].refs && (victim < 0 || ch->maps[i].used < ch->maps[victim].used))
			victim = (int)i;
	if (!e && ch->n_maps == CHAN_MAP_MAX && victim >= 0) {
		old = ch->maps[victim];
		ch->maps[victim] = ch->maps[--ch->n_maps];
	}
	if (!e && ch->n_maps < CHAN_MAP_MAX) {
		ret->key = key;
		ret->used = ++ch->map_tick;
		ch->maps[ch->n_maps++] = *ret;
	}
	pthread_mutex_unlock(&ch->ctx->lock);
	if (old.addr)
		munmap((void *)old.addr, old.size);
	return 0;
}

/* Drops the reference of @e (a copy of the entry); one not kept, or retired and used by no
 * other copy, is unmapped. */
static void map_put(struct tp_chan *ch, const struct chan_map *e)
{
	struct chan_map old = { 0 };

	if (!e->key)
		return (void)munmap((void *)e->addr, e->size);
	pthread_mutex_lock(&ch->ctx->lock);
	for (unsigned i = 0; i < ch->n_maps; i++) {
		if (ch->maps[i].addr != e->addr || !ch->maps[i].refs)
			continue;
		if (--ch->maps[i].refs == 0 && ch->maps[i].retired) {
			old = ch->maps[i];
			ch->maps[i] = ch->maps[--ch->n_maps];
		}
		break;
	}
	pthread_mutex_unlock(&ch->ctx->lock);
	if (old.addr)
		munmap((void *)old.addr, old.size);
}

/* The handle @id of @ctx named by a notice, or NULL (released meanwhile, or not ours); lock
 * held. */
static struct tp_chan *chan_of_notice(struct tp_context *ctx, uint64_t id)
{
	struct tp_chan *ch, *found = NULL;

	tpu_list_for_each(ch, &ctx->chans, ctx_node)
		if (ch->id == id)
			found = ch;
	return found;
}

void tpc_chan_map_on_retired(struct tp_context *ctx, const Tpw__V1__ChanReply *m)
{
	struct tp_chan *ch = chan_of_notice(ctx, m->chan_id);

	if (!ch)
		return; /* released meanwhile, or no handle of ours */
	/* Only exact keys of this handle's mappings: nothing else is ever unmapped. */
	for (size_t k = 0; k < m->n_retired; k++) {
		for (unsigned i = 0; i < ch->n_maps; i++) {
			if (ch->maps[i].key != m->retired[k] || ch->maps[i].retired)
				continue;
			ch->maps[i].retired = true;
			if (ch->maps[i].refs)
				break; /* the last copy out of it unmaps it (map_put()) */
			munmap((void *)ch->maps[i].addr, ch->maps[i].size);
			ch->maps[i] = ch->maps[--ch->n_maps];
			break;
		}
	}
}

/*
 * The pages of @cr's items (checked inside mapping @e) in a mapping just made, each item of 64
 * KiB or more mapped by one call (MADV_POPULATE_READ, Linux 5.14) rather than a fault every few
 * pages under the copy out. Only the items' own pages: never the rest of the writer's buffer,
 * which may be sparse. Best effort.
 */
static void map_prefault(const struct chan_map *e, const struct chan_req *cr)
{
#ifdef MADV_POPULATE_READ
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

	for (size_t i = 0; i < cr->n; i++) {
		uint64_t off = cr->map_offs ? cr->map_offs[i] : cr->map_off;
		uintptr_t lo = (uintptr_t)e->addr + (uintptr_t)off;
		uintptr_t hi = lo + cr->items[i].iov_len;

		if (cr->items[i].iov_len < (64u << 10))
			continue;
		lo &= ~(page - 1);
		(void)madvise((void *)lo, hi - lo, MADV_POPULATE_READ);
	}
#else
	(void)e;
	(void)cr;
#endif
}

/* Tells the daemon that @ch's item handed out by mapping was copied out (or, @fail, could not
 * be: it goes back to the head of the channel). Not answered. */
static void map_ack(struct tp_chan *ch, bool fail)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.map_done = true;
	op.map_fail = fail;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	pthread_mutex_lock(&ch->ctx->send_lock);
	tpc_wire_send(ch->ctx, &m, NULL, 0, -EBADF); /* failure: the session ends, the item too */
	pthread_mutex_unlock(&ch->ctx->send_lock);
}

/*
 * The several items of @cr's answer (ChanOp.pack_mapped) out of mapping @e: each to its packed
 * place in the caller's buffer @cr->dst (checked within @cr->dst_len), or, when its caller gave
 * up or there is none, to an allocation of its own. Return: 0, or -EPROTO or -ENOMEM (nothing
 * of the caller's kept in @cr->items).
 */
static int map_take_packed(struct chan_req *cr, const struct chan_map *e)
{
	bool own = !(cr->pack && cr->into && !cr->ch && cr->dst);
	uint64_t end = 0, off = 0;
	size_t i;
	int r = 0;

	for (i = 0; r == 0 && i < cr->n; i++) {
		size_t len = cr->items[i].iov_len;
		void *to = NULL;

		if (own && !(to = malloc(len)))
			r = -ENOMEM;
		else if (!own && !tpw_chan_pack_at(end, len, cr->dst_len, &off))
			r = -EPROTO; /* (the daemon checked the read's room) */
		if (r < 0)
			break;
		if (!own)
			to = (uint8_t *)cr->dst + off;
		end = off + len;
		tpc_copy_far(to, e->addr + cr->map_offs[i], len);
		cr->items[i].iov_base = to;
	}
	if (r < 0) {
		for (size_t k = 0; k < i; k++) {
			if (own)
				free(cr->items[k].iov_base);
			cr->items[k].iov_base = NULL;
		}
		return r;
	}
	if (own) { /* the caller's buffer is no longer the read's */
		cr->into = false;
		cr->pack = false;
		cr->dst = NULL;
	}
	return 0;
}

int tpc_chan_map_take(struct tp_chan *ch, struct chan_req *cr)
{
	size_t len = cr->items[0].iov_len;
	struct chan_map e = { 0 }, *found;
	void *to = NULL;
	int r = 0;

	if (!cr->map_pending)
		return 0;
	cr->map_pending = false;
	pthread_mutex_lock(&ch->ctx->lock);
	found = map_find_locked(ch, cr->map_key);
	if (found)
		e = *found;
	pthread_mutex_unlock(&ch->ctx->lock);
	/* No fd for a buffer no longer mapped: another thread's read unmapped it after this
	 * read listed it (-ESTALE: the item goes back, the read is made again). */
	if (!found)
		r = cr->map_has_fd ? map_new(ch, cr->map_key, cr->map_fd, &e) : -ESTALE;
	if (cr->map_has_fd)
		close(cr->map_fd); /* mapped, or not needed: one mapping a buffer */
	cr->map_has_fd = false;
	/* Everything the daemon said is checked against what this process mapped. */
	for (size_t i = 0; r == 0 && i < cr->n; i++)
		if (!tpu_range_ok(cr->map_offs ? cr->map_offs[i] : cr->map_off,
				  cr->items[i].iov_len, e.size))
			r = -EPROTO;
	if (r == 0 && !found)
		map_prefault(&e, cr);
	if (r == 0 && cr->n > 1) {
		r = map_take_packed(cr, &e);
		map_put(ch, &e);
		map_ack(ch, r < 0);
		if (r < 0)
			cr->n = 0;
		return r;
	}
	if (r == 0 && cr->dst && len > cr->dst_len)
		r = -EPROTO; /* (the daemon checked the read's room) */
	/* The read's allocation, unless its caller gave up (it may use that memory again): then,
	 * as without one, an allocation of the item's own. */
	if (r == 0 && cr->into && cr->ch)
		cr->into = false;
	else if (r == 0 && cr->dst)
		to = cr->dst;
	if (r == 0 && !to)
		to = malloc(len ? len : 1);
	if (r == 0 && !to)
		r = -ENOMEM;
	if (r == 0)
		tpc_copy_far(to, e.addr + cr->map_off, len);
	if (r == 0 || e.addr)
		map_put(ch, &e);
	map_ack(ch, r < 0);
	if (r < 0) {
		if (to && to != cr->dst)
			free(to);
		cr->n = 0;
		return r;
	}
	cr->items[0].iov_base = to;
	cr->dst = to;
	return 0;
}

void tpc_chan_map_open(struct tp_chan *ch)
{
	pthread_mutex_lock(&ch->ctx->lock);
	tpu_list_insert_tail(&ch->ctx->chans, &ch->ctx_node);
	pthread_mutex_unlock(&ch->ctx->lock);
}

void tpc_chan_map_drop(struct tp_chan *ch)
{
	/* no notice nor the io thread reaches it from now on */
	pthread_mutex_lock(&ch->ctx->lock);
	tpu_list_remove(&ch->ctx_node);
	ch->ctx->chan_own -= ch->n_own;
	ch->ctx->chan_back -= ch->n_back;
	pthread_mutex_unlock(&ch->ctx->lock);
	for (unsigned i = 0; i < ch->n_back; i++) /* no item in them: a pool one is reused */
		tpc_buffer_stage_put(ch->ctx, ch->back[i], !ch->back[i]->chan);
	ch->n_back = 0;
	for (unsigned i = 0; i < ch->n_maps; i++)
		munmap((void *)ch->maps[i].addr, ch->maps[i].size);
	ch->n_maps = 0;
	for (unsigned i = 0; i < ch->n_own; i++)
		tpc_buffer_stage_put(ch->ctx, ch->own[i], false);
	ch->n_own = 0;
	ch->own_bytes = 0;
}

struct tpc_buf *tpc_chan_own_get(struct tp_chan *ch, uint64_t size)
{
	struct tpc_buf *b = NULL;
	unsigned best = 0;

	pthread_mutex_lock(&ch->ctx->lock);
	for (unsigned i = 0; i < ch->n_own; i++)
		if (ch->own[i]->size >= size && (!b || ch->own[i]->size < b->size)) {
			b = ch->own[i];
			best = i;
		}
	if (b && b->size / 2 > size)
		b = NULL; /* too large to lend for it (chan_may_lend()): a new one */
	if (b) {
		ch->own[best] = ch->own[--ch->n_own];
		ch->own_bytes -= b->size;
		ch->ctx->chan_own--;
	}
	/* else one a notice gave back that the io thread has not filed yet (a write that waited
	 * for it, chanwrite.c): taken here rather than a new one made beside it */
	for (unsigned i = 0; !b && i < ch->n_back; i++) {
		if (!ch->back[i]->chan || ch->back[i]->size < size || ch->back[i]->size / 2 > size)
			continue;
		b = ch->back[i];
		ch->back[i] = ch->back[--ch->n_back];
		ch->ctx->chan_back--;
	}
	pthread_mutex_unlock(&ch->ctx->lock);
	if (b || size > SIZE_MAX)
		return b;
	return tpc_buffer_chan_new(ch->ctx, (size_t)size, &b) == 0 ? b : NULL;
}

/* Keeps @b (a buffer of @ch's own, not lent) among @ch's free ones if it may, the least
 * recently kept going to @evict (room for CHAN_OWN_FREE) beyond CHAN_OWN_FREE and
 * CHAN_LENT_BYTES; lock held. Return: whether it was kept; *@ret_wake: the io thread, which
 * may wait with no timeout, must be woken for it. */
static bool own_keep_locked(struct tp_chan *ch, struct tpc_buf *b, struct tpc_buf **evict,
			    unsigned *n_evict, bool *ret_wake)
{
	if (b->failed || ch->ctx->dead || b->size > CHAN_LENT_BYTES)
		return false;
	while (ch->n_own && (ch->n_own == CHAN_OWN_FREE ||
			     ch->own_bytes + b->size > CHAN_LENT_BYTES)) {
		evict[(*n_evict)++] = ch->own[0];
		ch->own_bytes -= ch->own[0]->size;
		ch->own[0] = ch->own[--ch->n_own];
		ch->ctx->chan_own--;
	}
	b->used_ns = tpu_now_ns();
	ch->ctx->chan_own_put_ns = b->used_ns;
	ch->own[ch->n_own++] = b;
	ch->own_bytes += b->size;
	/* the first: the io thread may wait with no timeout (not within a second of the last
	 * one: tpc_chan_own_timeout_locked()) */
	*ret_wake = ch->ctx->chan_own++ == 0 && ch->ctx->io_untimed;
	return true;
}

void tpc_chan_own_put(struct tp_chan *ch, struct tpc_buf *b, bool reuse)
{
	struct tpc_buf *evict[CHAN_OWN_FREE];
	unsigned n_evict = 0;
	bool wake = false;

	if (!b)
		return;
	pthread_mutex_lock(&ch->ctx->lock);
	if (reuse && own_keep_locked(ch, b, evict, &n_evict, &wake))
		b = NULL;
	pthread_mutex_unlock(&ch->ctx->lock);
	if (wake)
		tpc_context_wake(ch->ctx);
	for (unsigned i = 0; i < n_evict; i++)
		tpc_buffer_stage_put(ch->ctx, evict[i], false);
	tpc_buffer_stage_put(ch->ctx, b, false);
}

int tpc_chan_own_timeout_locked(struct tp_context *ctx)
{
	uint64_t idle = (uint64_t)CHAN_OWN_IDLE_MS * 1000000u, now, due = UINT64_MAX;
	struct tp_chan *ch;

	if (!ctx->chan_own) {
		/* None free now, but one was put back lately: a stream whose buffer goes back and
		 * forth. Wait until a second after that, not forever, so that the next put back
		 * need not wake this thread (a cross-CPU wake-up an item). */
		if (!ctx->chan_own_put_ns)
			return -1;
		due = ctx->chan_own_put_ns + idle;
		now = tpu_now_ns();
		if (due <= now) {
			ctx->chan_own_put_ns = 0; /* quiet: the next put back wakes the thread */
			return -1;
		}
		return (int)((due - now + 999999u) / 1000000u);
	}
	tpu_list_for_each(ch, &ctx->chans, ctx_node)
		for (unsigned i = 0; i < ch->n_own; i++)
			due = TPU_MIN(due, ch->own[i]->used_ns + idle);
	now = tpu_now_ns();
	if (due == UINT64_MAX)
		return -1;
	return due <= now ? 0 : (int)((due - now + 999999u) / 1000000u);
}

void tpc_chan_own_expire(struct tp_context *ctx)
{
	uint64_t idle = (uint64_t)CHAN_OWN_IDLE_MS * 1000000u, now = tpu_now_ns();
	struct tpc_buf *old[2 * CHAN_OWN_FREE];
	struct tp_chan *ch;
	size_t n = 0;

	pthread_mutex_lock(&ctx->lock);
	if (tpc_chan_own_timeout_locked(ctx) != 0) { /* none due: the usual case */
		pthread_mutex_unlock(&ctx->lock);
		return;
	}
	tpu_list_for_each(ch, &ctx->chans, ctx_node) {
		for (unsigned i = 0; i < ch->n_own && n < TPU_ARRAY_SIZE(old); i++) {
			if (ch->own[i]->used_ns + idle > now)
				continue;
			old[n++] = ch->own[i];
			ch->own_bytes -= ch->own[i]->size;
			ch->own[i--] = ch->own[--ch->n_own];
			ctx->chan_own--;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	for (size_t i = 0; i < n; i++) /* unregistered: the daemon retires them for readers */
		tpc_buffer_stage_put(ctx, old[i], false);
}

bool tpc_chan_lend_room(const struct tp_chan *ch)
{
	return ch->n_lent + ch->n_back < CHAN_LENT_MAX;
}

bool tpc_chan_lend_file(struct tp_chan *ch, struct tpc_buf *b)
{
	if (!tpc_chan_lend_room(ch))
		return false;
	ch->lent[ch->n_lent++] = b;
	ch->lent_bytes += b->size;
	return true;
}

void tpc_chan_on_released(struct tp_context *ctx, const Tpw__V1__ChanReply *m)
{
	struct tp_chan *ch = chan_of_notice(ctx, m->chan_id);

	if (!ch)
		return; /* released meanwhile, or no handle of ours */
	/* Only buffers this handle lent: nothing else is ever given back. */
	for (size_t i = 0; i < m->n_released; i++) {
		for (unsigned k = 0; k < ch->n_lent; k++) {
			if (ch->lent[k]->id != m->released[i])
				continue;
			if (ch->n_back >= CHAN_LENT_MAX)
				return; /* never: filing keeps @lent and @back within it together */
			ch->back[ch->n_back++] = ch->lent[k];
			ch->lent_bytes -= ch->lent[k]->size;
			ch->lent[k] = ch->lent[--ch->n_lent];
			ctx->chan_back++;
			ch->lend_stalled = false;
			break;
		}
	}
	if (!ch->lend_stalled && ctx->chan_lend_waiters)
		pthread_cond_broadcast(&ctx->cond); /* a write waits for one (chanwrite.c) */
}

void tpc_chan_back_run(struct tp_context *ctx)
{
	struct tpc_buf *put[CHAN_OWN_FREE + 1], *b = NULL;
	struct tp_chan *ch;
	unsigned n;
	bool wake;

	for (;;) { /* one buffer a round: the handle may be released as soon as the lock goes */
		n = 0;
		pthread_mutex_lock(&ctx->lock);
		if (!ctx->chan_back) {
			pthread_mutex_unlock(&ctx->lock);
			return;
		}
		tpu_list_for_each(ch, &ctx->chans, ctx_node) {
			if (!ch->n_back)
				continue;
			b = ch->back[--ch->n_back];
			ctx->chan_back--;
			if (!b->chan || !own_keep_locked(ch, b, put, &n, &wake))
				put[n++] = b; /* a pool buffer (reused there), or not kept */
			break;
		}
		pthread_mutex_unlock(&ctx->lock);
		if (!n)
			continue;
		for (unsigned i = 0; i < n; i++) /* this channel's again, nobody else's */
			tpc_buffer_stage_put(ctx, put[i], put[i] == b && !b->chan);
	}
}
