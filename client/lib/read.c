/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reading messages: descriptors pushed by the daemon are queued per pipe and handed FIFO to
 * tp_pipe_read_descriptor() calls; tp_pipe_read() then either copies an eager message's bytes
 * out of its descriptor (and acknowledges it) or sends the daemon a Read naming a destination
 * per segment (shared buffer, CMA address, or a staging buffer copied out after ReadDone).
 * Reads, acknowledgements and discards reach the daemon in msg_id order: a descriptor freed
 * out of order is marked dropped and discarded when its turn comes. A CUDA tensor slot is
 * exported as a CUDA IPC reference (rendezvous) or filled by a host-to-device copy on its
 * stream (eager), both before any lock is taken (cuda.c). Writing is write.c's job.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define STAGE_ALIGN 64

struct read_plan {
	Tpw__V1__ClientMsg m;
	Tpw__V1__Read rd;
	Tpw__V1__Segment *seg;
	Tpw__V1__Segment **segp;
	Tpw__V1__ShmRef *shm;
	size_t stage_len;
	struct tpc_cuda_seg *cuda; /* CUDA slots' references, NULL without any */
	size_t n_cuda;
};

/* ---- descriptors --------------------------------------------------------------------------- */

static const void *read_take_bytes(char **cur, const void *src, size_t len)
{
	void *p = *cur;

	if (!len)
		return NULL;
	memcpy(p, src, len);
	*cur += len;
	return p;
}

static void read_device(struct tp_device *d, const Tpw__V1__Device *src, bool *ret_has)
{
	bool has = src && src->type != TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED;

	d->type = has && src->type == TPW__V1__DEVICE_TYPE__DEVICE_CUDA ? TP_DEVICE_CUDA
									: TP_DEVICE_CPU;
	d->index = has && d->type == TP_DEVICE_CUDA ? (int)TPU_MIN(src->index, (uint32_t)INT32_MAX)
						    : 0;
	if (ret_has)
		*ret_has = has;
}

/*
 * Descriptor blocks with inline bytes (up to the eager size each) are kept for the next
 * messages, TPC_DESC_KEEP and DESC_KEEP_BYTES per context, in slots taken and filled by atomic
 * exchange (the io thread allocates, the reader's thread frees). Freed to malloc, a block of
 * 64 KiB let glibc trim the heap, and the next message's block faulted its pages in again: the
 * reader of a stream of 64 KiB messages took about 4 page faults per message (0.5 now).
 */
#define DESC_KEEP_MIN (16u << 10)  /* smaller blocks come from malloc's own caches */
#define DESC_KEEP_MAX (1u << 20)   /* larger ones are not kept (a multiple of the grain) */
#define DESC_KEEP_GRAIN (16u << 10) /* kept blocks are sized in these */
#define DESC_KEEP_BYTES (2u << 20)  /* of the blocks kept by one context */

static struct tpc_desc *desc_block_get(struct tp_context *ctx, size_t need)
{
	struct tpc_desc *d;

	if (need < DESC_KEEP_MIN || need > DESC_KEEP_MAX)
		return NULL;
	for (unsigned i = 0; i < TPC_DESC_KEEP; i++) {
		d = __atomic_exchange_n(&ctx->desc_keep[i], NULL, __ATOMIC_ACQUIRE);
		if (!d)
			continue;
		__atomic_sub_fetch(&ctx->desc_kept, d->cap, __ATOMIC_RELAXED);
		if (d->cap >= need)
			return d;
		free(d); /* too small for the messages now coming */
	}
	return NULL;
}

static struct tpc_desc *desc_block_new(struct tp_context *ctx, size_t need)
{
	struct tpc_desc *d = desc_block_get(ctx, need);
	size_t cap = need;

	if (d)
		return d;
	if (need >= DESC_KEEP_MIN && need <= DESC_KEEP_MAX)
		cap = (need + DESC_KEEP_GRAIN - 1) / DESC_KEEP_GRAIN * DESC_KEEP_GRAIN;
	d = malloc(cap);
	if (d)
		d->cap = cap;
	return d;
}

static void desc_block_put(struct tp_context *ctx, struct tpc_desc *d)
{
	if (d->cap < DESC_KEEP_MIN || d->cap > DESC_KEEP_MAX) {
		free(d);
		return;
	}
	/* counted first, so that racing frees cannot both pass the byte bound */
	if (__atomic_add_fetch(&ctx->desc_kept, d->cap, __ATOMIC_RELAXED) <= DESC_KEEP_BYTES)
		for (unsigned i = 0; i < TPC_DESC_KEEP; i++) {
			struct tpc_desc *none = NULL;

			if (__atomic_compare_exchange_n(&ctx->desc_keep[i], &none, d, false,
							__ATOMIC_RELEASE, __ATOMIC_RELAXED))
				return;
		}
	__atomic_sub_fetch(&ctx->desc_kept, d->cap, __ATOMIC_RELAXED);
	free(d);
}

void tpc_read_desc_keep_free(struct tp_context *ctx)
{
	for (unsigned i = 0; i < TPC_DESC_KEEP; i++)
		free(__atomic_exchange_n(&ctx->desc_keep[i], NULL, __ATOMIC_ACQUIRE));
}

/* One allocation: the public descriptor, its arrays, metadata and eager bytes. */
static struct tpc_desc *read_desc_new(struct tp_pipe *p, const Tpw__V1__Descriptor *m,
				      const uint8_t *tail, size_t tail_len)
{
	size_t np = m->n_payloads, nt = m->n_tensors, bytes = m->metadata.len, cap;
	struct tp_payload_desc *pd;
	struct tp_tensor_desc *td;
	struct tpc_desc *d;
	char *cur;

	for (size_t i = 0; i < np; i++)
		bytes += m->payloads[i]->metadata.len;
	for (size_t i = 0; i < nt; i++)
		bytes += m->tensors[i]->metadata.len;
	if (!m->eager)
		tail_len = 0;
	d = desc_block_new(p->ctx, sizeof(*d) + np * sizeof(*pd) + nt * sizeof(*td) + bytes +
			   tail_len);
	if (!d)
		return NULL;
	cap = d->cap;
	pd = (struct tp_payload_desc *)(d + 1);
	td = (struct tp_tensor_desc *)(pd + np);
	cur = (char *)(td + nt);
	*d = (struct tpc_desc){ .pipe = p, .cap = cap, .msg_id = m->msg_id, .eager = m->eager,
				 .ring_only = m->ring_only };
	d->pub = (struct tp_descriptor){ .n_payloads = np, .payloads = pd, .n_tensors = nt,
					 .tensors = td, .metadata_len = m->metadata.len };
	d->pub.metadata = read_take_bytes(&cur, m->metadata.data, m->metadata.len);
	for (size_t i = 0; i < np; i++) {
		const Tpw__V1__PayloadDesc *s = m->payloads[i];
		pd[i] = (struct tp_payload_desc){ .length = s->length,
						  .metadata_len = s->metadata.len };
		pd[i].metadata = read_take_bytes(&cur, s->metadata.data, s->metadata.len);
	}
	for (size_t i = 0; i < nt; i++) {
		const Tpw__V1__TensorDesc *s = m->tensors[i];
		td[i] = (struct tp_tensor_desc){ .length = s->length, .metadata_len = s->metadata.len };
		td[i].metadata = read_take_bytes(&cur, s->metadata.data, s->metadata.len);
		read_device(&td[i].device, s->device, NULL);
		read_device(&td[i].target, s->target, &td[i].has_target);
	}
	d->data = read_take_bytes(&cur, tail, tail_len);
	d->data_len = tail_len;
	tpu_list_init(&d->node);
	return d;
}

void tpc_read_desc_free(struct tpc_desc *d)
{
	if (!d)
		return;
	tpu_list_remove(&d->node);
	desc_block_put(d->pipe->ctx, d);
}

void tpc_read_on_descriptor(struct tp_context *ctx, const Tpw__V1__Descriptor *m,
			    const uint8_t *tail, size_t tail_len)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, m->pipe_id);
	struct tpc_desc *d;

	if (!p)
		return;
	d = read_desc_new(p, m, tail, tail_len);
	if (!d) {
		tpc_pipe_fail_locked(p, -ENOMEM, "out of memory for a descriptor");
		return;
	}
	tpu_list_insert_tail(&p->descs, &d->node);
	tpc_read_match_locked(p);
}

void tpc_read_match_locked(struct tp_pipe *p)
{
	struct tpc_op *op;
	struct tpc_desc *d;

	while ((op = tpu_list_first(&p->desc_reqs, struct tpc_op, node)) &&
	       (d = tpu_list_first(&p->descs, struct tpc_desc, node))) {
		tpu_list_remove(&d->node);
		tpu_list_insert_tail(&p->held, &d->node);
		p->refs++; /* the user's descriptor keeps the pipe */
		op->desc = d;
		tpc_op_complete_locked(p->ctx, op, 0, NULL);
	}
}

int tpc_read_descriptor_start(struct tp_pipe *p, tp_descriptor_fn cb, void *arg,
			      struct tpc_op **ret_op, uint64_t *ret_id)
{
	struct tp_context *ctx;
	struct tpc_op *op;
	int r;

	if (!p || !cb)
		return tpc_error(-EINVAL, "missing pipe or callback");
	ctx = p->ctx;
	op = tpc_op_new(TPC_OP_DESC, 0);
	if (!op)
		return tpc_error(-ENOMEM, "out of memory");
	op->cb.desc = cb;
	op->arg = arg;
	op->pipe = p;
	pthread_mutex_lock(&ctx->lock);
	r = ctx->stopping ? tpc_context_check_locked(ctx) : 0;
	/* A closed pipe still hands out the eager descriptors received before it closed. */
	if (r == 0 && tpu_list_empty(&p->descs))
		r = tpc_pipe_check_locked(p);
	if (r == 0)
		r = tpc_op_track_locked(ctx, op, true, ret_id);
	if (r == 0) {
		op->pending = true;
		tpu_list_insert_tail(&p->desc_reqs, &op->node);
		if (ret_op)
			*ret_op = op;
		tpc_read_match_locked(p);
	}
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		tpc_op_free(op);
	return r;
}

TP_EXPORT int tp_pipe_read_descriptor(struct tp_pipe *p, tp_descriptor_fn cb, void *arg)
{
	return tpc_read_descriptor_start(p, cb, arg, NULL, NULL);
}

TP_EXPORT int tp_pipe_read_descriptor_ex(struct tp_pipe *p, tp_descriptor_fn cb, void *arg,
					 uint64_t *ret_op)
{
	uint64_t id = 0;
	int r = tpc_read_descriptor_start(p, cb, arg, NULL, &id);

	if (r == 0 && ret_op)
		*ret_op = id;
	return r;
}

/* ---- consuming descriptors in order -------------------------------------------------------- */

/* Sends Read{ack_eager} or Read{discard} for @d; send_lock held. */
static void read_send_release(struct tp_context *ctx, uint64_t pipe_id, const struct tpc_desc *d)
{
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	rd.pipe_id = pipe_id;
	rd.msg_id = d->msg_id;
	rd.ack_eager = d->eager;
	rd.discard = !d->eager;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
}

/* Removes the head @d from p->held, and moves the dropped ones now at the head to @gone. */
static void read_pop_locked(struct tp_pipe *p, struct tpc_desc *d, struct tpu_list *gone)
{
	struct tpc_desc *h;

	tpu_list_remove(&d->node);
	if (d->dropped)
		tpu_list_insert_tail(gone, &d->node);
	while ((h = tpu_list_first(&p->held, struct tpc_desc, node)) && h->dropped) {
		tpu_list_remove(&h->node);
		tpu_list_insert_tail(gone, &h->node);
	}
}

/* Releases the descriptors in @gone: tells the daemon (if @at_daemon), frees them, drops their
 * pipe references (which may free @p). send_lock held, lock not held. */
static void read_flush(struct tp_context *ctx, struct tp_pipe *p, struct tpu_list *gone,
		       bool at_daemon)
{
	struct tpc_desc *d, *tmp;
	int n = 0;

	tpu_list_for_each_safe(d, tmp, gone, node) {
		if (at_daemon)
			read_send_release(ctx, p->id, d);
		tpc_read_desc_free(d);
		n++;
	}
	if (!n)
		return;
	pthread_mutex_lock(&ctx->lock);
	while (n--)
		tpc_pipe_unref_locked(p);
	pthread_mutex_unlock(&ctx->lock);
}

/* Drops @d, which may be out of order; send_lock held. */
static void read_drop(struct tpc_desc *d)
{
	struct tp_pipe *p = d->pipe;
	struct tp_context *ctx = p->ctx;
	struct tpu_list gone = TPU_LIST_INIT(gone);
	bool at;

	pthread_mutex_lock(&ctx->lock);
	d->dropped = true;
	if (tpu_list_first(&p->held, struct tpc_desc, node) == d)
		read_pop_locked(p, d, &gone);
	at = tpc_pipe_at_daemon(p);
	pthread_mutex_unlock(&ctx->lock);
	read_flush(ctx, p, &gone, at);
}

TP_EXPORT void tp_descriptor_free(struct tp_descriptor *dp)
{
	struct tpc_desc *d = dp ? tpu_container_of(dp, struct tpc_desc, pub) : NULL;
	struct tp_context *ctx;

	if (!d)
		return;
	ctx = d->pipe->ctx;
	pthread_mutex_lock(&ctx->send_lock);
	read_drop(d);
	pthread_mutex_unlock(&ctx->send_lock);
}

/*
 * Takes @d off p->held if it is the pipe's next descriptor (*ret_popped), with the dropped ones
 * that follow it in @gone. Return: 0, or why the read cannot proceed. Lock held.
 */
static int read_take_locked(struct tp_pipe *p, struct tpc_desc *d, struct tpu_list *gone,
			    bool *ret_popped)
{
	struct tp_context *ctx = p->ctx;

	*ret_popped = false;
	if (tpu_list_first(&p->held, struct tpc_desc, node) != d)
		return tpc_error(-EINVAL, "descriptor %llu is not this pipe's next one",
				 (unsigned long long)d->msg_id);
	read_pop_locked(p, d, gone);
	*ret_popped = true;
	if (ctx->stopping)
		return tpc_context_check_locked(ctx);
	/* Eager bytes are here already: only a rendezvous read needs the pipe. */
	return d->eager ? 0 : tpc_pipe_check_locked(p);
}

/* ---- reading ------------------------------------------------------------------------------- */

static struct tp_slot *read_slot(const struct tp_allocation *a, size_t i)
{
	return i < a->n_payloads ? &a->payloads[i] : &a->tensors[i - a->n_payloads];
}

static size_t read_len(const struct tpc_desc *d, size_t i)
{
	return i < d->pub.n_payloads ? d->pub.payloads[i].length
				     : d->pub.tensors[i - d->pub.n_payloads].length;
}

static int read_check_alloc(const struct tpc_desc *d, const struct tp_allocation *a)
{
	if (a->n_payloads != d->pub.n_payloads || a->n_tensors != d->pub.n_tensors)
		return tpc_error(-EINVAL, "allocation of %zu payloads + %zu tensors for a message "
				 "of %zu + %zu", a->n_payloads, a->n_tensors, d->pub.n_payloads,
				 d->pub.n_tensors);
	if ((a->n_payloads && !a->payloads) || (a->n_tensors && !a->tensors))
		return tpc_error(-EINVAL, "NULL slot array with a nonzero count");
	for (size_t i = 0; i < a->n_payloads + a->n_tensors; i++) {
		const struct tp_slot *s = read_slot(a, i);

		if (s->device.type != TP_DEVICE_CPU && s->device.type != TP_DEVICE_CUDA)
			return tpc_error(-EINVAL, "unknown slot device type %d", (int)s->device.type);
		if (s->device.type == TP_DEVICE_CUDA && i < a->n_payloads)
			return tpc_error(-EINVAL, "payload %zu: payloads go to CPU memory", i);
		if (s->device.type == TP_DEVICE_CUDA && s->device.index < 0)
			return tpc_error(-EINVAL, "CUDA device index %d", s->device.index);
		if (read_len(d, i) && !s->data)
			return tpc_error(-EINVAL, "NULL destination for %zu bytes", read_len(d, i));
	}
	return 0;
}

/* Refuses a CPU slot that starts in a shared buffer and runs past its end. */
static int read_check_ranges(struct tp_context *ctx, const struct tpc_desc *d,
			     const struct tp_allocation *a)
{
	int r = 0;

	pthread_mutex_lock(&ctx->lock);
	for (size_t i = 0; r == 0 && i < a->n_payloads + a->n_tensors; i++) {
		const struct tp_slot *s = read_slot(a, i);

		if (s->device.type != TP_DEVICE_CPU)
			continue;
		r = tpc_buffer_check_range_locked(ctx, s->data, read_len(d, i),
						  i < a->n_payloads ? "payload slot" : "tensor slot",
						  i < a->n_payloads ? i : i - a->n_payloads);
	}
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

static bool read_on_cuda(const struct tp_slot *s, size_t len)
{
	return s->device.type == TP_DEVICE_CUDA && len;
}

/* The CUDA slots' bytes were copied by read_cuda_eager(). */
static void read_copy_eager(const struct tpc_desc *d, const struct tp_allocation *a)
{
	size_t off = 0;

	for (size_t i = 0; i < a->n_payloads + a->n_tensors; i++) {
		size_t len = read_len(d, i);

		if (len && !read_on_cuda(read_slot(a, i), len))
			memcpy(read_slot(a, i)->data, d->data + off, len);
		off += len;
	}
}

static struct tpc_cuda_mem read_cuda_mem(const struct tp_slot *s, size_t len, size_t i)
{
	struct tpc_cuda_mem m = { s->data, len, s->device.index, s->cuda_stream, "", false };

	snprintf(m.what, sizeof(m.what), "slot %zu", i);
	return m;
}

/*
 * Copies an eager message's bytes into its CUDA slots (no lock held): a driver failure in the
 * copy becomes @op's status, reported by its callback. Return: 0, or -errno if a slot cannot
 * take them (nothing of that slot was copied).
 */
static int read_cuda_eager(struct tp_context *ctx, const struct tpc_desc *d,
			   const struct tp_allocation *a, struct tpc_op *op)
{
	size_t off = 0;
	int r = tpc_cuda_check(ctx, false), st = 0;

	for (size_t i = 0; r == 0 && st == 0 && i < a->n_payloads + a->n_tensors; i++) {
		const struct tp_slot *s = read_slot(a, i);
		size_t len = read_len(d, i);

		if (read_on_cuda(s, len)) {
			struct tpc_cuda_mem m = read_cuda_mem(s, len, i);

			r = tpc_cuda_copy_in(ctx, &m, d->data + off, &st);
		}
		off += len;
	}
	if (r == 0 && st < 0) {
		op->status = st;
		op->errmsg = strdup(tp_last_error());
	}
	return r;
}

static void read_plan_free(struct read_plan *pl)
{
	if (pl)
		free(pl->cuda);
	free(pl);
}

static struct read_plan *read_plan_new(const struct tpc_desc *d, uint64_t pipe_id)
{
	size_t np = d->pub.n_payloads, n = np + d->pub.n_tensors;
	struct read_plan *pl = calloc(1, sizeof(*pl) + n * (sizeof(Tpw__V1__Segment) +
							     sizeof(Tpw__V1__Segment *) +
							     sizeof(Tpw__V1__ShmRef)));

	if (!pl)
		return NULL;
	pl->seg = (Tpw__V1__Segment *)(pl + 1);
	pl->shm = (Tpw__V1__ShmRef *)(pl->seg + n);
	pl->segp = (Tpw__V1__Segment **)(pl->shm + n);
	tpw__v1__read__init(&pl->rd);
	pl->rd.pipe_id = pipe_id;
	pl->rd.msg_id = d->msg_id;
	pl->rd.n_payloads = np;
	pl->rd.payloads = pl->segp;
	pl->rd.n_tensors = d->pub.n_tensors;
	pl->rd.tensors = pl->segp + np;
	tpw__v1__client_msg__init(&pl->m);
	pl->m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	pl->m.read = &pl->rd;
	for (size_t i = 0; i < n; i++) {
		tpw__v1__segment__init(&pl->seg[i]);
		tpw__v1__shm_ref__init(&pl->shm[i]);
		pl->segp[i] = &pl->seg[i];
	}
	return pl;
}

/* Decides each destination; staged ones get shm buf_id 0 for now. Lock held. */
static void read_place_locked(struct tp_context *ctx, struct read_plan *pl,
			      const struct tpc_desc *d, const struct tp_allocation *a,
			      struct tpc_op *op)
{
	for (size_t i = 0; i < a->n_payloads + a->n_tensors; i++) {
		Tpw__V1__Segment *s = &pl->seg[i];
		size_t len = read_len(d, i), off;
		void *data = read_slot(a, i)->data;
		struct tpc_buf *b;

		if (s->loc_case == TPW__V1__SEGMENT__LOC_CUDA)
			continue; /* placed by read_cuda_export() */
		s->length = len;
		if (!len)
			continue;
		if (d->ring_only) {
			/* the reader's library copies it out of the pipe ring itself */
			s->loc_case = TPW__V1__SEGMENT__LOC_RING_ADDR;
			s->ring_addr = (uint64_t)(uintptr_t)data;
		} else if ((b = tpc_buffer_lookup_locked(ctx, data, len))) {
			pl->shm[i] = (Tpw__V1__ShmRef)TPW__V1__SHM_REF__INIT;
			pl->shm[i].buf_id = b->id;
			pl->shm[i].gen = b->gen;
			pl->shm[i].offset = (uint64_t)((char *)data - (char *)b->addr);
			s->loc_case = TPW__V1__SEGMENT__LOC_SHM;
			s->shm = &pl->shm[i];
		} else if (ctx->cma_ok) {
			s->loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
			s->cma_addr = (uint64_t)(uintptr_t)data;
			op->copies[op->n_copies++] = (struct tpc_copy){ data, TPC_COPY_CMA, len };
		} else {
			off = (pl->stage_len + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
			pl->shm[i].offset = off;
			s->loc_case = TPW__V1__SEGMENT__LOC_SHM;
			s->shm = &pl->shm[i];
			op->copies[op->n_copies++] = (struct tpc_copy){ data, off, len };
			pl->stage_len = off + len;
		}
	}
}

/* send_lock held. */
static int read_stage(struct tp_context *ctx, struct read_plan *pl, size_t n, struct tpc_op *op)
{
	int r;

	if (!pl->stage_len)
		return 0;
	r = tpc_buffer_stage_get(ctx, pl->stage_len, &op->stage);
	if (r < 0)
		return tpc_error(r, "no staging buffer of %zu bytes: %s", pl->stage_len,
				 tp_strerror(r));
	for (size_t i = 0; i < n; i++) {
		if (pl->seg[i].loc_case == TPW__V1__SEGMENT__LOC_SHM && pl->shm[i].buf_id == 0) {
			pl->shm[i].buf_id = op->stage->id;
			pl->shm[i].gen = op->stage->gen;
		}
	}
	return 0;
}

/*
 * Completes an eager read (callback on the io thread); send_lock held. With @ret_inline (a
 * blocking read) and no read before it, it is complete on return: *@ret_inline is set and @op
 * is left to the caller, no callback.
 */
static void read_eager(struct tp_pipe *p, struct tpc_desc *d, const struct tp_allocation *a,
		       struct tpc_op *op, bool at, bool *ret_inline)
{
	struct tp_context *ctx = p->ctx;
	int status = op->status; /* a failed copy into a CUDA slot (read_cuda_eager()) */

	read_copy_eager(d, a);
	pthread_mutex_lock(&ctx->lock);
	if (ret_inline && status == 0 && tpu_list_empty(&p->reads)) {
		*ret_inline = true;
	} else {
		op->pending = true;
		tpu_list_insert_tail(&p->reads, &op->node);
		/* Completes now, or after the rendezvous reads before it. */
		tpc_op_ready_locked(ctx, &p->reads, op, status, op->errmsg);
		ctx->io_handed = true; /* its callback is the io thread's: it may linger */
	}
	pthread_mutex_unlock(&ctx->lock);
	if (at)
		read_send_release(ctx, p->id, d);
}

/* Sends the Read @pl for a rendezvous message and files @op; send_lock held. Borrows @pl. */
static int read_rendezvous(struct tp_pipe *p, struct tpc_desc *d, const struct tp_allocation *a,
			   struct tpc_op *op, struct read_plan *pl)
{
	struct tp_context *ctx = p->ctx;
	size_t n = a->n_payloads + a->n_tensors;
	int r;

	pthread_mutex_lock(&ctx->lock);
	read_place_locked(ctx, pl, d, a, op);
	pthread_mutex_unlock(&ctx->lock);
	r = read_stage(ctx, pl, n, op);
	if (r == 0) {
		pthread_mutex_lock(&ctx->lock);
		r = tpc_pipe_check_locked(p);
		if (r == 0) {
			op->pending = true;
			op->sent = true; /* the Read goes out before send_lock is released */
			tpu_list_insert_tail(&p->reads, &op->node);
		}
		pthread_mutex_unlock(&ctx->lock);
	}
	if (r == 0)
		tpc_wire_send(ctx, &pl->m, NULL, 0, -EBADF);
	return r;
}

static int read_start(struct tp_pipe *p, struct tpc_desc *d, const struct tp_allocation *a,
		      struct tpc_op *op, struct read_plan *pl, bool *ret_inline)
{
	struct tp_context *ctx = p->ctx;
	struct tpu_list gone = TPU_LIST_INIT(gone);
	bool popped, at;
	int r;

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = read_take_locked(p, d, &gone, &popped);
	at = tpc_pipe_at_daemon(p);
	pthread_mutex_unlock(&ctx->lock);
	if (!popped) {
		read_drop(d);
		pthread_mutex_unlock(&ctx->send_lock);
		return r;
	}
	if (r == 0 && d->eager)
		read_eager(p, d, a, op, at, ret_inline);
	else if (r == 0)
		r = read_rendezvous(p, d, a, op, pl);
	if (r < 0 && at)
		read_send_release(ctx, p->id, d); /* the message is dropped */
	/* @d's own pipe reference keeps @p alive through the flush. */
	read_flush(ctx, p, &gone, at);
	tpc_read_desc_free(d);
	pthread_mutex_lock(&ctx->lock);
	tpc_pipe_unref_locked(p);
	pthread_mutex_unlock(&ctx->lock);
	pthread_mutex_unlock(&ctx->send_lock);
	return r;
}

/* Exports the CUDA slots of a rendezvous read into @pl (no lock held); events go to @op. */
static int read_cuda_export(struct tp_context *ctx, struct read_plan *pl,
			    const struct tpc_desc *d, const struct tp_allocation *a,
			    struct tpc_op *op, size_t n_cuda)
{
	int r = tpc_cuda_check(ctx, true);

	if (r < 0)
		return r;
	pl->cuda = calloc(n_cuda, sizeof(*pl->cuda));
	if (!pl->cuda)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; r == 0 && i < a->n_payloads + a->n_tensors; i++) {
		const struct tp_slot *s = read_slot(a, i);
		size_t len = read_len(d, i);
		struct tpc_cuda_mem m;

		if (!read_on_cuda(s, len))
			continue;
		m = read_cuda_mem(s, len, i);
		m.remote = TPC_PIPE_REMOTE(d->pipe);
		r = tpc_cuda_export(ctx, &m, &pl->cuda[pl->n_cuda++], &pl->seg[i],
				    &op->cuda_events);
	}
	return r;
}

/*
 * What a read prepares before taking any lock: for a rendezvous message the Read's plan
 * (*@ret, owned by the caller) with its CUDA slots exported; for an eager one, the copies into
 * its CUDA slots.
 */
static int read_prepare(struct tp_pipe *p, const struct tpc_desc *d,
			const struct tp_allocation *a, struct tpc_op *op, struct read_plan **ret)
{
	size_t n_cuda = 0;

	for (size_t i = 0; i < a->n_payloads + a->n_tensors; i++)
		n_cuda += read_on_cuda(read_slot(a, i), read_len(d, i));
	if (d->eager)
		return n_cuda ? read_cuda_eager(p->ctx, d, a, op) : 0;
	*ret = read_plan_new(d, p->id);
	if (!*ret)
		return tpc_error(-ENOMEM, "out of memory");
	return n_cuda ? read_cuda_export(p->ctx, *ret, d, a, op, n_cuda) : 0;
}

/* Gives @op its id and files it for tp_cancel() if it is a rendezvous read. */
static int read_track(struct tp_context *ctx, struct tpc_op *op, bool eager, uint64_t *id)
{
	int r;

	pthread_mutex_lock(&ctx->lock);
	r = tpc_op_track_locked(ctx, op, !eager, id);
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

/* Takes back the id of @op, which did not start (or completed in the call). */
static void read_untrack(struct tp_context *ctx, struct tpc_op *op)
{
	pthread_mutex_lock(&ctx->lock);
	if (op->op_id)
		tpc_map_del(&ctx->ops, op->op_id);
	pthread_mutex_unlock(&ctx->lock);
}

int tpc_pipe_read(struct tp_pipe *p, struct tp_descriptor *dp, const struct tp_allocation *alloc,
		  tp_done_fn cb, void *arg, bool *ret_inline, uint64_t *ret_id)
{
	uint64_t id = 0;
	struct tpc_desc *d = dp ? tpu_container_of(dp, struct tpc_desc, pub) : NULL;
	struct read_plan *pl = NULL;
	struct tpc_op *op = NULL;
	int r;

	if (!d)
		return tpc_error(-EINVAL, "no descriptor");
	if (!p || !alloc || !cb)
		r = tpc_error(-EINVAL, "missing pipe, allocation or callback");
	else if (d->pipe != p)
		r = tpc_error(-EINVAL, "descriptor of another pipe");
	else
		r = read_check_alloc(d, alloc);
	if (r == 0)
		r = read_check_ranges(p->ctx, d, alloc);
	if (r == 0) {
		op = tpc_op_new(TPC_OP_READ, d->pub.n_payloads + d->pub.n_tensors);
		r = op ? 0 : tpc_error(-ENOMEM, "out of memory");
	}
	if (r == 0)
		r = read_prepare(p, d, alloc, op, &pl);
	if (r == 0)
		r = read_track(p->ctx, op, d->eager, &id);
	if (r < 0) {
		read_plan_free(pl);
		tpc_op_free(op);
		tp_descriptor_free(dp);
		return r;
	}
	op->cb.done = cb;
	op->arg = arg;
	op->pipe = p;
	op->id = d->msg_id;
	r = read_start(p, d, alloc, op, pl, ret_inline); /* frees @d */
	read_plan_free(pl);
	if (r < 0 || (ret_inline && *ret_inline)) {
		read_untrack(p->ctx, op);
		tpc_buffer_stage_put(p->ctx, op->stage, false);
		tpc_op_free(op);
	}
	if (r == 0 && ret_id)
		*ret_id = id;
	return r;
}

TP_EXPORT int tp_pipe_read(struct tp_pipe *p, struct tp_descriptor *dp,
			   const struct tp_allocation *alloc, tp_done_fn cb, void *arg)
{
	return tpc_pipe_read(p, dp, alloc, cb, arg, NULL, NULL);
}

TP_EXPORT int tp_pipe_read_ex(struct tp_pipe *p, struct tp_descriptor *dp,
			      const struct tp_allocation *alloc, tp_done_fn cb, void *arg,
			      uint64_t *ret_op)
{
	return tpc_pipe_read(p, dp, alloc, cb, arg, NULL, ret_op);
}

void tpc_read_on_done(struct tp_context *ctx, const Tpw__V1__ReadDone *m)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, m->pipe_id);
	struct tpc_op *op;

	if (!p)
		return;
	tpu_list_for_each(op, &p->reads, node) {
		if (op->id == m->msg_id) {
			tpc_op_ready_locked(ctx, &p->reads, op, tpw_status_to_errno(m->status),
					    m->message);
			return;
		}
	}
}
