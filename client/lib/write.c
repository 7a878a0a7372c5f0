/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Writing messages: checks a tp_message against the daemon's limits, decides where each
 * segment's bytes travel (inline in the frame's data tail, by reference into a shared buffer,
 * by CMA address, or copied into a staging buffer), sends the Write frame with the inline
 * pieces taken straight from the caller's memory, and completes writes on WriteDone. Reading is
 * read.c's job.
 *
 * Placement: a CUDA tensor travels as a CUDA IPC reference (cuda.c), exported before any
 * lock is taken, with an event recorded on its stream. A message without one whose data bytes
 * total at most eager_max travels entirely inline (the daemon completes it at once and hands it
 * to the reader with its descriptor). Otherwise, per segment: inside a tp_buffer_alloc() buffer
 * -> shm reference; up to 4 KiB -> inline; CMA allowed -> cma_addr; else -> one staging buffer
 * per message, released after WriteDone.
 *
 * Staging: the buffer, the write id and the write's place in its pipe are decided under
 * send_lock, the bytes are copied after it is released (write_copied()), and meanwhile the
 * write waits in the pipe's held FIFO (below), marked copying, with the pipe's later writes
 * behind it: a large copy delays no other pipe of the context, and its own pipe's order holds.
 *
 * Flow control (daemon minor >= 5): per pipe, the Writes sent that the daemon still queues (it
 * returns each one's room with FlowCredit) stay within the write window it announced
 * (Limits.pipe_queue_max messages, pipe_queue_bytes inline bytes). A write beyond it, and every
 * write behind one, is held here as its packed frame, its data pieces still pointing into the
 * caller's memory (which the caller keeps until the callback anyway), and goes out in order as
 * room returns (tpc_write_pump()). A write that alone exceeds the window goes once nothing else
 * is outstanding: the daemon then decides (-ENOBUFS over its hard limit). Without flow control
 * the FIFO only ever holds a staged write being copied and the writes behind it.
 *
 * The daemon-wide budget (pipe-queue-bytes-max) can turn a write back (WriteDone{resend}): it
 * and every write of the pipe sent after it (the daemon turns those back too) go back to the head
 * of the held FIFO, in order, their frames kept for this since they were built, and nothing of
 * that pipe goes until the daemon's FlowResume, which is answered before the writes are resent.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define STAGE_ALIGN 64

struct tpc_held_write {
	unsigned refs; /* the op's, and the pump's while it sends (atomic) */
	uint64_t inline_len;
	size_t body_len;
	size_t n_iov;
	struct iovec *iov; /* into the caller's memory */
	uint8_t body[];	   /* the packed ClientMsg{write}, then the iovec array */
};

struct write_plan {
	Tpw__V1__ClientMsg m;
	Tpw__V1__Write w;
	Tpw__V1__Payload *pl;
	Tpw__V1__Payload **plp;
	Tpw__V1__Tensor *tn;
	Tpw__V1__Tensor **tnp;
	Tpw__V1__Device *dev; /* device, target per tensor */
	Tpw__V1__Segment *seg;
	Tpw__V1__ShmRef *shm;
	struct iovec *iov;
	size_t n_iov;
	size_t inline_len;
	size_t stage_len;
	struct tpc_cuda_seg *cuda; /* CUDA tensors' references, NULL without any */
	size_t n_cuda;
};

static const void *write_seg(const struct tp_message *msg, size_t i, size_t *ret_len)
{
	if (i < msg->n_payloads) {
		*ret_len = msg->payloads[i].length;
		return msg->payloads[i].data;
	}
	i -= msg->n_payloads;
	*ret_len = msg->tensors[i].length;
	return msg->tensors[i].data;
}

static int write_check_part(const void *data, size_t len, const void *md, size_t md_len,
			    uint64_t *bytes, uint64_t *md_sum)
{
	if ((len && !data) || (md_len && !md))
		return tpc_error(-EINVAL, "NULL data or metadata with a nonzero length");
	if (!tpu_add_u64(*bytes, len, bytes) || !tpu_add_u64(*md_sum, md_len, md_sum))
		return tpc_error(-EMSGSIZE, "message size overflows");
	return 0;
}

static int write_check_tensor(const struct tp_tensor *t)
{
	if (t->device.type != TP_DEVICE_CPU && t->device.type != TP_DEVICE_CUDA)
		return tpc_error(-EINVAL, "unknown tensor device type %d", (int)t->device.type);
	if (t->device.type == TP_DEVICE_CUDA && t->device.index < 0)
		return tpc_error(-EINVAL, "CUDA device index %d", t->device.index);
	if (t->has_target && t->target.type != TP_DEVICE_CPU && t->target.type != TP_DEVICE_CUDA)
		return tpc_error(-EINVAL, "unknown tensor target type %d", (int)t->target.type);
	return 0;
}

static int write_check(const struct tp_context *ctx, const struct tp_message *msg,
		       uint64_t *ret_total)
{
	const struct tpc_limits *lim = &ctx->lim;
	uint64_t bytes = 0, md = msg->metadata_len;
	int r = 0;

	if ((msg->n_payloads && !msg->payloads) || (msg->n_tensors && !msg->tensors) ||
	    (msg->metadata_len && !msg->metadata))
		return tpc_error(-EINVAL, "NULL array or metadata with a nonzero count");
	if (msg->n_payloads > lim->segments_max ||
	    msg->n_tensors > lim->segments_max - msg->n_payloads)
		return tpc_error(-E2BIG, "%zu payloads + %zu tensors exceed the limit of %u (tpipd "
				 "--segments-max)",
				 msg->n_payloads, msg->n_tensors, lim->segments_max);
	for (size_t i = 0; r == 0 && i < msg->n_payloads; i++) {
		const struct tp_payload *pl = &msg->payloads[i];
		r = write_check_part(pl->data, pl->length, pl->metadata, pl->metadata_len, &bytes, &md);
	}
	for (size_t i = 0; r == 0 && i < msg->n_tensors; i++) {
		const struct tp_tensor *t = &msg->tensors[i];
		r = write_check_part(t->data, t->length, t->metadata, t->metadata_len, &bytes, &md);
		if (r == 0)
			r = write_check_tensor(t);
	}
	if (r < 0)
		return r;
	if (md > lim->metadata_max)
		return tpc_error(-EMSGSIZE, "%llu bytes of metadata exceed the limit of %u (tpipd "
				 "--metadata-max)",
				 (unsigned long long)md, lim->metadata_max);
	if (bytes > lim->message_bytes_max)
		return tpc_error(-EMSGSIZE, "%llu data bytes exceed the limit of %llu (tpipd "
				 "--message-bytes-max)",
				 (unsigned long long)bytes, (unsigned long long)lim->message_bytes_max);
	*ret_total = bytes;
	return 0;
}

static void *write_carve(char **cur, size_t size)
{
	void *p = *cur;

	*cur += (size + 15) & ~(size_t)15;
	return p;
}

static struct write_plan *write_plan_new(const struct tp_message *msg)
{
	size_t np = msg->n_payloads, nt = msg->n_tensors, n = np + nt;
	size_t size = sizeof(struct write_plan) + 16 * 8 + np * (sizeof(Tpw__V1__Payload) + 8) +
		      nt * (sizeof(Tpw__V1__Tensor) + 8 + 2 * sizeof(Tpw__V1__Device)) +
		      n * (sizeof(Tpw__V1__Segment) + sizeof(Tpw__V1__ShmRef) + sizeof(struct iovec));
	struct write_plan *pl = calloc(1, size);
	char *cur;

	if (!pl)
		return NULL;
	cur = (char *)(((uintptr_t)(pl + 1) + 15) & ~(uintptr_t)15);
	pl->pl = write_carve(&cur, np * sizeof(*pl->pl));
	pl->plp = write_carve(&cur, np * sizeof(*pl->plp));
	pl->tn = write_carve(&cur, nt * sizeof(*pl->tn));
	pl->tnp = write_carve(&cur, nt * sizeof(*pl->tnp));
	pl->dev = write_carve(&cur, 2 * nt * sizeof(*pl->dev));
	pl->seg = write_carve(&cur, n * sizeof(*pl->seg));
	pl->shm = write_carve(&cur, n * sizeof(*pl->shm));
	pl->iov = write_carve(&cur, n * sizeof(*pl->iov));
	return pl;
}

static void write_plan_free(struct write_plan *pl)
{
	if (pl)
		free(pl->cuda);
	free(pl);
}

static bool write_on_cuda(const struct tp_tensor *t)
{
	return t->device.type == TP_DEVICE_CUDA && t->length;
}

/*
 * Exports the CUDA tensors (no lock held): each becomes a CudaRef with an event recorded on its
 * stream, held in @events (an op's, or a Broadcast's shared list). An empty CUDA tensor needs no
 * memory and travels like an empty CPU one.
 */
static int write_cuda(struct tp_context *ctx, struct write_plan *pl, const struct tp_message *msg,
		      struct tpc_cuda_event **events, bool remote)
{
	size_t np = msg->n_payloads, n = 0;
	int r;

	for (size_t i = 0; i < msg->n_tensors; i++)
		n += write_on_cuda(&msg->tensors[i]);
	if (!n)
		return 0;
	r = tpc_cuda_check(ctx, true);
	if (r < 0)
		return r;
	pl->cuda = calloc(n, sizeof(*pl->cuda));
	if (!pl->cuda)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; r == 0 && i < msg->n_tensors; i++) {
		const struct tp_tensor *t = &msg->tensors[i];
		struct tpc_cuda_mem m = { t->data, t->length, t->device.index, t->cuda_stream, "",
					  false };

		if (!write_on_cuda(t))
			continue;
		snprintf(m.what, sizeof(m.what), "tensor %zu", i);
		m.remote = remote;
		r = tpc_cuda_export(ctx, &m, &pl->cuda[pl->n_cuda++], &pl->seg[np + i], events);
	}
	return r;
}

static void write_device(Tpw__V1__Device *d, const struct tp_device *src)
{
	tpw__v1__device__init(d);
	d->type = src->type == TP_DEVICE_CUDA ? TPW__V1__DEVICE_TYPE__DEVICE_CUDA
					      : TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	d->index = src->index > 0 ? (uint32_t)src->index : 0;
}

static void write_build(struct write_plan *pl, const struct tp_message *msg, uint64_t pipe_id)
{
	size_t np = msg->n_payloads;

	tpw__v1__write__init(&pl->w);
	pl->w.pipe_id = pipe_id;
	pl->w.metadata = (ProtobufCBinaryData){ msg->metadata_len, (uint8_t *)msg->metadata };
	pl->w.n_payloads = np;
	pl->w.payloads = pl->plp;
	pl->w.n_tensors = msg->n_tensors;
	pl->w.tensors = pl->tnp;
	for (size_t i = 0; i < np + msg->n_tensors; i++)
		tpw__v1__segment__init(&pl->seg[i]);
	for (size_t i = 0; i < np; i++) {
		const struct tp_payload *src = &msg->payloads[i];
		tpw__v1__payload__init(&pl->pl[i]);
		pl->pl[i].metadata = (ProtobufCBinaryData){ src->metadata_len, (uint8_t *)src->metadata };
		pl->pl[i].data = &pl->seg[i];
		pl->plp[i] = &pl->pl[i];
	}
	for (size_t i = 0; i < msg->n_tensors; i++) {
		const struct tp_tensor *src = &msg->tensors[i];
		Tpw__V1__Tensor *t = &pl->tn[i];
		tpw__v1__tensor__init(t);
		t->metadata = (ProtobufCBinaryData){ src->metadata_len, (uint8_t *)src->metadata };
		t->data = &pl->seg[np + i];
		write_device(&pl->dev[2 * i], &src->device);
		t->device = &pl->dev[2 * i];
		if (src->has_target) {
			write_device(&pl->dev[2 * i + 1], &src->target);
			t->target = &pl->dev[2 * i + 1];
		}
		pl->tnp[i] = t;
	}
	tpw__v1__client_msg__init(&pl->m);
	pl->m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	pl->m.write = &pl->w;
}

static void write_inline(struct write_plan *pl, Tpw__V1__Segment *s, const void *data, size_t len)
{
	s->loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	s->inline_off = pl->inline_len;
	pl->inline_len += len;
	if (len)
		pl->iov[pl->n_iov++] = (struct iovec){ (void *)data, len };
}

static void write_shm(Tpw__V1__Segment *s, Tpw__V1__ShmRef *ref, uint64_t id, uint64_t gen,
		      uint64_t off)
{
	tpw__v1__shm_ref__init(ref);
	ref->buf_id = id; /* 0: staged, filled in once the staging buffer exists */
	ref->gen = gen;
	ref->offset = off;
	s->loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s->shm = ref;
}

/* Refuses a segment that starts in a shared buffer and runs past its end; lock held. */
static int write_check_ranges_locked(struct tp_context *ctx, const struct write_plan *pl,
				     const struct tp_message *msg)
{
	for (size_t i = 0; i < msg->n_payloads + msg->n_tensors; i++) {
		size_t len, np = msg->n_payloads;
		const void *data = write_seg(msg, i, &len);
		int r;

		if (pl->seg[i].loc_case == TPW__V1__SEGMENT__LOC_CUDA)
			continue;
		r = tpc_buffer_check_range_locked(ctx, data, len, i < np ? "payload" : "tensor",
						  i < np ? i : i - np);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Does a tensor of @msg ask the reader for CUDA memory (its target)? Such a message stays
 * staged: a ring-only message must land in the reader's CPU memory. */
static bool write_wants_cuda(const struct tp_message *msg)
{
	for (size_t i = 0; i < msg->n_tensors; i++)
		if (msg->tensors[i].has_target && msg->tensors[i].target.type == TP_DEVICE_CUDA)
			return true;
	return false;
}

/*
 * Decides each segment's location; lock held (buffer lookups). @p: the pipe written to, NULL
 * for a broadcast. With no CMA, a message of at least the pipe's ring_min (the daemon offered
 * its writing end a ring) names every segment by ring_addr: the library copies it into the
 * pipe ring when the daemon asks, so nothing is staged. Return: 0 or -ERANGE.
 */
static int write_place_locked(struct tp_context *ctx, const struct tp_pipe *p,
			      struct write_plan *pl, const struct tp_message *msg, uint64_t total)
{
	bool eager = total <= ctx->eager_max && !pl->n_cuda; /* CUDA memory goes by rendezvous */
	bool ring = p && p->ring_min && total >= p->ring_min && !ctx->cma_ok && !pl->n_cuda &&
		    !eager && !write_wants_cuda(msg);
	int r = write_check_ranges_locked(ctx, pl, msg);

	if (r < 0)
		return r;
	for (size_t i = 0; i < msg->n_payloads + msg->n_tensors; i++) {
		Tpw__V1__Segment *s = &pl->seg[i];
		size_t len;
		const void *data = write_seg(msg, i, &len);
		struct tpc_buf *b;

		if (s->loc_case == TPW__V1__SEGMENT__LOC_CUDA)
			continue; /* placed by write_cuda() */
		s->length = len;
		if (len == 0 || eager) {
			write_inline(pl, s, data, len);
		} else if (ring) {
			s->loc_case = TPW__V1__SEGMENT__LOC_RING_ADDR;
			s->ring_addr = (uint64_t)(uintptr_t)data;
		} else if ((b = tpc_buffer_lookup_locked(ctx, data, len))) {
			write_shm(s, &pl->shm[i], b->id, b->gen,
				  (uint64_t)((const char *)data - (const char *)b->addr));
		} else if (len <= TPC_INLINE_SMALL && pl->inline_len + len <= ctx->lim.inline_max) {
			write_inline(pl, s, data, len);
		} else if (ctx->cma_ok) {
			s->loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
			s->cma_addr = (uint64_t)(uintptr_t)data;
		} else {
			size_t off = (pl->stage_len + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
			write_shm(s, &pl->shm[i], 0, 0, off);
			pl->stage_len = off + len;
		}
	}
	return 0;
}

/*
 * Takes a staging buffer for the staged segments and names it in their references, so that the
 * frame can be packed before the bytes are there; send_lock held (a new buffer is registered),
 * lock not held. The copy is write_stage_copy()'s, with no lock held.
 */
static int write_stage_reserve(struct tp_context *ctx, struct write_plan *pl,
			       const struct tp_message *msg, struct tpc_buf **ret)
{
	struct tpc_buf *b;
	int r;

	if (!pl->stage_len)
		return 0;
	r = tpc_buffer_stage_get(ctx, pl->stage_len, &b);
	if (r < 0)
		return tpc_error(r, "no staging buffer of %zu bytes: %s", pl->stage_len,
				 tp_strerror(r));
	for (size_t i = 0; i < msg->n_payloads + msg->n_tensors; i++) {
		Tpw__V1__Segment *s = &pl->seg[i];

		if (s->loc_case != TPW__V1__SEGMENT__LOC_SHM || s->shm->buf_id != 0)
			continue;
		s->shm->buf_id = b->id;
		s->shm->gen = b->gen;
	}
	*ret = b;
	return 0;
}

/*
 * Copies the staged segments into @b (write_stage_reserve()'s); no lock held. A shared
 * reference never names a staging buffer (tpc_buffer_lookup_locked() skips them), so the
 * segments that do are exactly the staged ones.
 */
static void write_stage_copy(const struct write_plan *pl, const struct tp_message *msg,
			     const struct tpc_buf *b)
{
	for (size_t i = 0; i < msg->n_payloads + msg->n_tensors; i++) {
		const Tpw__V1__Segment *s = &pl->seg[i];
		size_t len;
		const void *data = write_seg(msg, i, &len);

		if (s->loc_case == TPW__V1__SEGMENT__LOC_SHM && s->shm->buf_id == b->id &&
		    s->shm->gen == b->gen)
			memcpy((char *)b->addr + s->shm->offset, data, len);
	}
}

/* Whether a Write of @inline_len data-tail bytes fits @p's window now; lock held. */
static bool write_fits_locked(const struct tp_pipe *p, uint64_t inline_len)
{
	const struct tpc_limits *lim = &p->ctx->lim;

	if (!p->win_msgs)
		return true; /* alone: the daemon decides */
	return p->win_msgs < lim->win_msgs && inline_len <= lim->win_bytes &&
	       p->win_bytes <= lim->win_bytes - inline_len;
}

/* Keeps the packed frame of write @op (@pl) for as long as the op is pending; lock held. */
static int write_keep_locked(struct write_plan *pl, struct tpc_op *op)
{
	size_t body = protobuf_c_message_get_packed_size(&pl->m.base);
	size_t off = (body + 15) & ~(size_t)15;
	struct tpc_held_write *h = malloc(sizeof(*h) + off + pl->n_iov * sizeof(struct iovec));

	if (!h)
		return tpc_error(-ENOMEM, "out of memory");
	h->refs = 1;
	h->body_len = protobuf_c_message_pack(&pl->m.base, h->body);
	h->inline_len = pl->inline_len;
	h->n_iov = pl->n_iov;
	h->iov = (struct iovec *)(h->body + off);
	memcpy(h->iov, pl->iov, pl->n_iov * sizeof(struct iovec));
	op->held = h;
	return 0;
}

static struct tpc_held_write *write_held_ref(struct tpc_held_write *h)
{
	__atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED);
	return h;
}

/*
 * Files the op and gives the write its ids (@ret_id: for tp_cancel()); lock held. With flow
 * control the write either takes room in the window (*@ret_send: send it now) or is held behind
 * the writes already held. A staged write (@op->stage) is held, marked copying, until its
 * thread has copied the bytes (write_copied()); with or without flow control, the writes of
 * the pipe behind it are held behind it, so the pipe's order is the order of this call.
 */
static int write_queue_locked(struct tp_pipe *p, struct write_plan *pl, struct tpc_op *op,
			      bool *ret_send, uint64_t *ret_id)
{
	bool flow = p->ctx->flow, staged = op->stage != NULL, hold;
	int r = tpc_pipe_check_locked(p);

	if (r == 0)
		r = tpc_op_track_locked(p->ctx, op, true, ret_id);
	if (r < 0)
		return r;
	pl->w.write_id = p->next_write_id + 1;
	hold = staged || !tpu_list_empty(&p->wheld) ||
	       (flow && (p->wait_resume || !write_fits_locked(p, pl->inline_len)));
	if (flow || hold) {
		r = write_keep_locked(pl, op);
		if (r < 0) {
			tpc_map_del(&p->ctx->ops, op->op_id);
			return r;
		}
	}
	if (hold) {
		tpu_list_insert_tail(&p->wheld, &op->hnode);
		op->copying = staged;
		*ret_send = false;
	} else if (flow) {
		p->win_msgs++;
		p->win_bytes += pl->inline_len;
	}
	op->pipe = p;
	op->id = ++p->next_write_id;
	op->pending = true;
	/* Sent now: the Write goes out before send_lock is released; held: tpc_write_pump(). */
	op->sent = *ret_send;
	tpu_list_insert_tail(&p->writes, &op->node);
	return 0;
}

/*
 * Copies a staged write's bytes with no lock held, then lets it go (no lock held). Until
 * @op->copying is cleared, @op, its staging buffer and its pipe stay valid whatever happens
 * meanwhile: the op's callback (which frees the op and returns the buffer) and the pipe's
 * free op behind it wait for the copy. Afterwards @op is not touched: it may complete at once.
 * @ctx must outlive the call (the caller's context: as for any call on it).
 */
static void write_copied(struct tp_context *ctx, const struct write_plan *pl,
			 const struct tp_message *msg, struct tpc_op *op, uint64_t pipe_id)
{
	bool completed;

	write_stage_copy(pl, msg, op->stage);
	pthread_mutex_lock(&ctx->lock);
	op->copying = false;
	completed = !op->pending; /* failed, closed or cancelled meanwhile: never sent */
	if (completed) /* its callback, and those behind it, may run now */
		tpc_context_wake(ctx);
	pthread_mutex_unlock(&ctx->lock);
	/* It, and the writes held behind it, in order; or, if it was cancelled, those alone. */
	tpc_write_pump(ctx, pipe_id);
}

/*
 * Places, files and sends a write. Everything that decides the pipe's order happens under
 * send_lock: placement, the staging buffer (registered before the Write that names it), the
 * write id and the op's place in the pipe's FIFO. A staged write's copy happens after
 * send_lock is released (write_copied()), so a large copy holds up no other send of the
 * context, only the writes of its own pipe queued behind it.
 */
static int write_send(struct tp_pipe *p, struct write_plan *pl, const struct tp_message *msg,
		      uint64_t total, struct tpc_op *op, uint64_t *ret_id)
{
	struct tp_context *ctx = p->ctx;
	struct tpc_held_write *h = NULL;
	uint64_t pipe_id = p->id;
	bool send = true;
	int r;

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = tpc_pipe_check_locked(p);
	if (r == 0)
		r = write_place_locked(ctx, p, pl, msg, total);
	pthread_mutex_unlock(&ctx->lock);
	/* + 16: room for the write_id, still 0 here */
	if (r == 0 && tpw_frame_size(&pl->m.base) + pl->inline_len + 16 > ctx->lim.frame_max)
		r = tpc_error(-EMSGSIZE, "frame of %zu bytes exceeds the limit of %u (tpipd "
			      "--frame-max)",
			      tpw_frame_size(&pl->m.base) + pl->inline_len, ctx->lim.frame_max);
	if (r == 0)
		r = write_stage_reserve(ctx, pl, msg, &op->stage);
	if (r == 0) {
		pthread_mutex_lock(&ctx->lock);
		r = write_queue_locked(p, pl, op, &send, ret_id);
		if (r == 0 && send && op->held)
			h = write_held_ref(op->held);
		pthread_mutex_unlock(&ctx->lock);
	}
	/* A failed send surfaces as connection loss, which completes the op. */
	if (r == 0 && send && h) {
		/* Kept for a resend: it is sent as kept, under our own reference (the pipe may
		 * fail meanwhile and the op complete). */
		tpc_wire_send_packed(ctx, h->body, h->body_len, h->iov, h->n_iov);
		tpc_write_held_free(h);
	} else if (r == 0 && send) {
		tpc_wire_send(ctx, &pl->m, pl->iov, pl->n_iov, -EBADF);
	}
	pthread_mutex_unlock(&ctx->send_lock);
	/* Not op->stage: an op that went at once may be complete and freed by now. */
	if (r == 0 && pl->stage_len)
		write_copied(ctx, pl, msg, op, pipe_id);
	return r;
}

int tpc_pipe_write(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb, void *arg,
		   uint64_t *ret_id)
{
	struct write_plan *pl;
	struct tpc_op *op;
	uint64_t total = 0, id = 0;
	int r;

	if (!p || !msg || !cb)
		return tpc_error(-EINVAL, "missing pipe, message or callback");
	r = write_check(p->ctx, msg, &total);
	if (r < 0)
		return r;
	pl = write_plan_new(msg);
	op = tpc_op_new(TPC_OP_WRITE, 0);
	if (!pl || !op) {
		r = tpc_error(-ENOMEM, "out of memory");
	} else {
		op->cb.done = cb;
		op->arg = arg;
		write_build(pl, msg, p->id);
		r = write_cuda(p->ctx, pl, msg, &op->cuda_events, TPC_PIPE_REMOTE(p));
		if (r == 0)
			r = write_send(p, pl, msg, total, op, &id);
	}
	write_plan_free(pl);
	if (r < 0 && op) {
		tpc_buffer_stage_put(p->ctx, op->stage, false);
		tpc_op_free(op);
	}
	if (r == 0 && ret_id)
		*ret_id = id;
	return r;
}

TP_EXPORT int tp_pipe_write(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb,
			    void *arg)
{
	return tpc_pipe_write(p, msg, cb, arg, NULL);
}

TP_EXPORT int tp_pipe_write_ex(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb,
			       void *arg, uint64_t *ret_op)
{
	return tpc_pipe_write(p, msg, cb, arg, ret_op);
}

/* ---- daemon fan-out (Broadcast) ------------------------------------------------------------ */

/* Whether every pipe of a broadcast may take its write now, unheld; lock held. A pipe that has
 * failed or closed does not count: its write is refused with its error (bcast_file_locked()). */
static bool bcast_all_fit_locked(struct tp_pipe *const *pipes, unsigned n, uint64_t inline_len)
{
	for (unsigned i = 0; i < n; i++) {
		struct tp_pipe *p = pipes[i];

		if (tpc_pipe_check_locked(p) < 0)
			continue;
		if (p->state != TPC_PIPE_OPEN || !tpu_list_empty(&p->wheld) ||
		    (p->ctx->flow && (p->wait_resume || !write_fits_locked(p, inline_len))))
			return false;
	}
	return true;
}

/* Files one write per pipe (op @ops[i], taken when filed), the Broadcast's targets in @tg;
 * send_lock and lock held. Return: the number of targets. */
static size_t bcast_file_locked(struct tp_pipe *const *pipes, unsigned n, struct write_plan *pl,
				struct tpc_op **ops, Tpw__V1__BroadcastTarget *tg,
				Tpw__V1__BroadcastTarget **tgp, uint64_t *ret_ops, int *ret_status)
{
	size_t k = 0;

	for (unsigned i = 0; i < n; i++) {
		bool send = true;
		uint64_t id = 0;
		int r;

		pl->w.pipe_id = pipes[i]->id;
		r = write_queue_locked(pipes[i], pl, ops[i], &send, &id);
		ret_status[i] = r;
		ret_ops[i] = 0;
		if (r < 0)
			continue;
		ops[i] = NULL; /* filed: completes through its callback */
		ret_ops[i] = id;
		tpw__v1__broadcast_target__init(&tg[k]);
		tg[k].pipe_id = pipes[i]->id;
		tg[k].write_id = pl->w.write_id;
		tgp[k] = &tg[k];
		k++;
	}
	return k;
}

/* Places @msg and files its writes on @pipes, then sends one Broadcast for them. */
static int bcast_send(struct tp_pipe *const *pipes, unsigned n, struct write_plan *pl,
		      const struct tp_message *msg, uint64_t total, struct tpc_op **ops,
		      uint64_t *ret_ops, int *ret_status)
{
	struct tp_context *ctx = pipes[0]->ctx;
	Tpw__V1__BroadcastTarget *tg = calloc(n, sizeof(*tg));
	Tpw__V1__BroadcastTarget **tgp = calloc(n, sizeof(*tgp));
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Broadcast b = TPW__V1__BROADCAST__INIT;
	size_t k = 0;
	int r = -ENOMEM;

	if (!tg || !tgp)
		goto out;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = write_place_locked(ctx, NULL, pl, msg, total);
	/* staging and holding are per pipe: the library's fan-out does them */
	if (r == 0 && (pl->stage_len || !bcast_all_fit_locked(pipes, n, pl->inline_len)))
		r = -EOPNOTSUPP;
	/* every target: at most 2 * 11 bytes of ids + 4 of framing; + 48: the Write's ids and
	 * its nesting */
	if (r == 0 && tpw_frame_size(&pl->m.base) + pl->inline_len + 48 + (size_t)n * 26 >
			      ctx->lim.frame_max)
		r = -EOPNOTSUPP;
	if (r == 0)
		k = bcast_file_locked(pipes, n, pl, ops, tg, tgp, ret_ops, ret_status);
	pthread_mutex_unlock(&ctx->lock);
	if (k > 0) {
		pl->w.pipe_id = 0;
		pl->w.write_id = 0;
		b.write = &pl->w;
		b.n_targets = k;
		b.targets = tgp;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_BROADCAST;
		m.broadcast = &b;
		/* A failed send surfaces as connection loss, which completes the ops. */
		tpc_wire_send(ctx, &m, pl->iov, pl->n_iov, -EBADF);
	}
	pthread_mutex_unlock(&ctx->send_lock);
out:
	free(tg);
	free(tgp);
	return r;
}

struct tpc_cuda_shared *tpc_cuda_shared_ref(struct tpc_cuda_shared *sh)
{
	if (sh)
		__atomic_add_fetch(&sh->refs, 1, __ATOMIC_RELAXED);
	return sh;
}

void tpc_cuda_shared_unref(struct tpc_cuda_shared *sh)
{
	if (!sh || __atomic_sub_fetch(&sh->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	tpc_cuda_events_put(sh->events);
	free(sh);
}

/* Whether @msg has CUDA tensors with bytes (and whether any of @pipes leads to another host). */
static bool bcast_cuda(struct tp_pipe *const *pipes, unsigned n, const struct tp_message *msg,
		       bool *ret_remote)
{
	bool cuda = false;

	for (size_t i = 0; i < msg->n_tensors && msg->tensors; i++)
		cuda |= write_on_cuda(&msg->tensors[i]);
	*ret_remote = false;
	for (unsigned i = 0; cuda && i < n; i++)
		*ret_remote |= TPC_PIPE_REMOTE(pipes[i]);
	return cuda;
}

int tpc_pipes_broadcast(struct tp_pipe *const *pipes, unsigned n, const struct tp_message *msg,
			tp_done_fn cb, void *const *args, uint64_t *ret_ops, int *ret_status)
{
	struct tp_context *ctx = n ? pipes[0]->ctx : NULL;
	struct write_plan *pl = NULL;
	struct tpc_op **ops = NULL;
	struct tpc_cuda_shared *sh = NULL;
	uint64_t total = 0;
	bool remote = false;
	int r;

	if (!ctx || !msg || !cb)
		return tpc_error(-EINVAL, "missing pipes, message or callback");
	if (!ctx->lim.bcast_pipes_max || n > ctx->lim.bcast_pipes_max)
		return -EOPNOTSUPP;
	/* CUDA tensors: exported once, each delivery's copy reads them (an older daemon: each
	 * delivery is a write of its own) */
	if (bcast_cuda(pipes, n, msg, &remote) && ctx->daemon_minor < TPW_MINOR_BCAST_CUDA)
		return -EOPNOTSUPP;
	r = write_check(ctx, msg, &total);
	if (r < 0)
		return r;
	pl = write_plan_new(msg);
	ops = calloc(n, sizeof(*ops));
	r = pl && ops ? 0 : tpc_error(-ENOMEM, "out of memory");
	if (r == 0 && bcast_cuda(pipes, n, msg, &remote)) {
		sh = calloc(1, sizeof(*sh));
		if (sh)
			sh->refs = 1;
		else
			r = tpc_error(-ENOMEM, "out of memory");
	}
	for (unsigned i = 0; r == 0 && i < n; i++) {
		ops[i] = tpc_op_new(TPC_OP_WRITE, 0);
		if (!ops[i])
			r = tpc_error(-ENOMEM, "out of memory");
		else {
			ops[i]->cb.done = cb;
			ops[i]->arg = args[i];
			/* each delivery keeps the events until its copy is done */
			ops[i]->cuda_shared = tpc_cuda_shared_ref(sh);
		}
	}
	if (r == 0) {
		write_build(pl, msg, 0);
		if (sh)
			r = write_cuda(ctx, pl, msg, &sh->events, remote);
	}
	if (r == 0)
		r = bcast_send(pipes, n, pl, msg, total, ops, ret_ops, ret_status);
	for (unsigned i = 0; ops && i < n; i++)
		tpc_op_free(ops[i]); /* those not filed */
	free(ops);
	write_plan_free(pl);
	tpc_cuda_shared_unref(sh);
	return r;
}

/*
 * The daemon-wide budget turned write @op back (WriteDone{resend}); lock held. Unless it is
 * the refusal of a copy sent before an earlier write was turned back (@op->stale), @op and every
 * write of @p sent after it (the daemon turns those back too: their refusals are stale) return
 * to the head of the held FIFO, in order, and @p waits for FlowResume. A write whose Cancel went
 * meanwhile is no longer at the daemon: it completes with -ECANCELED here.
 */
static void write_turned_back_locked(struct tp_context *ctx, struct tp_pipe *p, struct tpc_op *op)
{
	struct tpu_list *at = &p->wheld;
	struct tpc_op *o;

	if (op->stale) {
		op->stale--;
		return;
	}
	if (!op->sent || !op->held)
		return; /* not ours to resend: the daemon knows no such copy */
	p->wait_resume = true;
	for (o = op; &o->node != &p->writes;
	     o = tpu_container_of(o->node.next, struct tpc_op, node)) {
		if (!o->sent || o->ready)
			continue;
		o->sent = false;
		if (o != op)
			o->stale++;
		if (!o->cancel_sent) {
			tpu_list_insert_tail(at->next, &o->hnode);
			at = &o->hnode;
		}
	}
	/* Completing one may complete those behind it: look again after each. */
	for (bool again = true; again;) {
		again = false;
		tpu_list_for_each(o, &p->writes, node) {
			if (!o->sent && o->cancel_sent && !o->ready &&
			    !tpu_list_linked(&o->hnode)) {
				tpc_op_ready_locked(ctx, &p->writes, o, -ECANCELED,
						    "cancelled while the daemon-wide budget held "
						    "it back");
				again = true;
				break;
			}
		}
	}
}

void tpc_write_on_done(struct tp_context *ctx, const Tpw__V1__WriteDone *m)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, m->pipe_id);
	int err = tpw_status_to_errno(m->status);
	struct tpc_op *op;

	if (!p)
		return;
	tpu_list_for_each(op, &p->writes, node) {
		if (op->id != m->write_id)
			continue;
		if (m->resend && ctx->flow) {
			write_turned_back_locked(ctx, p, op);
		} else if (op->sent) {
			tpc_op_ready_locked(ctx, &p->writes, op, err, m->message);
			/* The other end is gone: the daemon says so by the PipeClosed right behind
			 * this answer, but a caller woken by this one may ask for a descriptor
			 * before the io thread reads it. The pipe fails now, as that frame would
			 * make it (eager messages already here stay readable). */
			if (err == -ECONNRESET && p->state == TPC_PIPE_OPEN)
				tpc_pipe_fail_locked(p, err, m->message && *m->message
								     ? m->message
								     : "the other end is gone");
		}
		/* else never sent: the daemon cannot know it */
		return;
	}
}

bool tpc_write_on_credit(struct tp_context *ctx, const Tpw__V1__FlowCredit *m)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, m->pipe_id);

	if (!p || !ctx->flow)
		return false;
	/* Never more than was sent: a daemon that returns more only gets its own refusals. */
	p->win_msgs -= TPU_MIN(m->messages, p->win_msgs);
	p->win_bytes -= TPU_MIN(m->bytes, p->win_bytes);
	return !tpu_list_empty(&p->wheld);
}

/* The next held write of pipe @pipe_id if it may go now, taken out of the FIFO and counted in
 * the window. Return: its frame (owned), or NULL. */
static struct tpc_held_write *write_unhold(struct tp_context *ctx, uint64_t pipe_id)
{
	struct tp_pipe *p;
	struct tpc_op *op;
	struct tpc_held_write *h = NULL;

	pthread_mutex_lock(&ctx->lock);
	p = tpc_map_get(&ctx->pipes, pipe_id);
	if (p && !ctx->dead && (p->state == TPC_PIPE_OPEN || p->state == TPC_PIPE_CONNECTING) &&
	    !p->wait_resume && (op = tpu_list_first(&p->wheld, struct tpc_op, hnode)) &&
	    !op->copying && (!ctx->flow || write_fits_locked(p, op->held->inline_len))) {
		tpu_list_remove(&op->hnode);
		h = write_held_ref(op->held); /* the op keeps its own, for a resend */
		op->sent = true; /* send_lock is held until it is: tp_cancel() waits for it */
		if (ctx->flow) {
			p->win_msgs++;
			p->win_bytes += h->inline_len;
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	return h;
}

/* Sends what may go of pipe @pipe_id's held writes; send_lock held. */
static void write_pump_sendlocked(struct tp_context *ctx, uint64_t pipe_id)
{
	struct tpc_held_write *h;

	/* The caller's memory stays valid: the op cannot complete before the daemon has seen its
	 * frame. */
	while ((h = write_unhold(ctx, pipe_id))) {
		int r = tpc_wire_send_packed(ctx, h->body, h->body_len, h->iov, h->n_iov);

		tpc_write_held_free(h);
		if (r < 0)
			break; /* connection loss fails the pipe */
	}
}

void tpc_write_pump(struct tp_context *ctx, uint64_t pipe_id)
{
	/* send_lock throughout: a new write cannot pass the held ones. */
	pthread_mutex_lock(&ctx->send_lock);
	write_pump_sendlocked(ctx, pipe_id);
	pthread_mutex_unlock(&ctx->send_lock);
}

void tpc_write_resume(struct tp_context *ctx, uint64_t pipe_id)
{
	Tpw__V1__FlowResume fr = TPW__V1__FLOW_RESUME__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tp_pipe *p;
	bool answer = false;

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	p = tpc_map_get(&ctx->pipes, pipe_id);
	if (p && !ctx->dead && tpc_pipe_at_daemon(p)) {
		p->wait_resume = false;
		fr.nothing_held = tpu_list_empty(&p->wheld);
		answer = true;
	}
	pthread_mutex_unlock(&ctx->lock);
	fr.pipe_id = pipe_id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_FLOW_RESUME;
	m.flow_resume = &fr;
	/* First the answer, then the resent writes: the daemon takes Writes again after it. */
	if (answer && tpc_wire_send(ctx, &m, NULL, 0, -EBADF) == 0)
		write_pump_sendlocked(ctx, pipe_id);
	pthread_mutex_unlock(&ctx->send_lock);
}

void tpc_write_held_free(struct tpc_held_write *h)
{
	if (h && __atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(h);
}
