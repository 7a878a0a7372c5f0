/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Messages as items, the library's side shared by channels and work queues (msgitem.h):
 * messages checked, their wire descriptors and items (gathered, CUDA tensors copied to host
 * memory), descriptors for readers, and reads of an item into an allocation (scattered inline,
 * or planned over shared buffers and staging). Leaves requests and their answers to chanmsg.c
 * (channels) and wqmsg.c (work queues).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "chan_int.h"
#include "internal.h"
#include "msgitem.h"
#include "validate.h"



struct tpc_msg_desc *tpc_msgitem_desc_of(struct tp_descriptor *d)
{
	struct tpc_msg_desc *cd = (struct tpc_msg_desc *)d;

	return cd && cd->magic == TPC_MSG_DESC_MAGIC ? cd : NULL;
}

static const void *desc_bytes(char **cur, const ProtobufCBinaryData *b)
{
	void *p = *cur;

	if (!b->len)
		return NULL;
	memcpy(p, b->data, b->len);
	*cur += b->len;
	return p;
}

static struct tp_device desc_device(const Tpw__V1__Device *d)
{
	if (d && d->type == TPW__V1__DEVICE_TYPE__DEVICE_CUDA)
		return (struct tp_device){ TP_DEVICE_CUDA, (int)d->index };
	return (struct tp_device){ TP_DEVICE_CPU, 0 };
}

/* A descriptor of @m (validated) for an item of @len bytes; NULL @m: a byte item, one payload.
 * Return: owned (free()), or NULL. */
struct tpc_msg_desc *tpc_msgitem_desc_new(const Tpw__V1__Descriptor *m, uint64_t len)
{
	size_t np = m ? m->n_payloads : 1, nt = m ? m->n_tensors : 0;
	size_t bytes = m ? m->metadata.len : 0, wire;
	struct tp_payload_desc *pd;
	struct tp_tensor_desc *td;
	struct tpc_msg_desc *d;
	char *cur;

	for (size_t i = 0; m && i < np; i++)
		bytes += m->payloads[i]->metadata.len;
	for (size_t i = 0; m && i < nt; i++)
		bytes += m->tensors[i]->metadata.len;
	wire = m ? protobuf_c_message_get_packed_size(&m->base) : 0;
	d = malloc(sizeof(*d) + np * sizeof(*pd) + nt * sizeof(*td) + bytes + wire);
	if (!d)
		return NULL;
	pd = (struct tp_payload_desc *)(d + 1);
	td = (struct tp_tensor_desc *)(pd + np);
	cur = (char *)(td + nt);
	*d = (struct tpc_msg_desc){ .magic = TPC_MSG_DESC_MAGIC, .len = len, .wire_len = wire };
	if (m) { /* for a release that writes the item back (a channel take that gave up) */
		protobuf_c_message_pack(&m->base, (uint8_t *)cur + bytes);
		d->wire = (const uint8_t *)cur + bytes;
	}
	tpu_list_init(&d->node);
	d->pub = (struct tp_descriptor){ .n_payloads = np, .payloads = pd, .n_tensors = nt,
					 .tensors = td };
	if (!m) {
		pd[0] = (struct tp_payload_desc){ .length = len };
		return d;
	}
	d->pub.metadata_len = m->metadata.len;
	d->pub.metadata = desc_bytes(&cur, &m->metadata);
	for (size_t i = 0; i < np; i++) {
		pd[i] = (struct tp_payload_desc){ .length = m->payloads[i]->length,
						  .metadata_len = m->payloads[i]->metadata.len };
		pd[i].metadata = desc_bytes(&cur, &m->payloads[i]->metadata);
	}
	for (size_t i = 0; i < nt; i++) {
		const Tpw__V1__TensorDesc *t = m->tensors[i];

		td[i] = (struct tp_tensor_desc){ .length = t->length,
						 .metadata_len = t->metadata.len,
						 .device = desc_device(t->device) };
		td[i].metadata = desc_bytes(&cur, &t->metadata);
		td[i].has_target = t->target &&
				   t->target->type != TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED;
		if (td[i].has_target)
			td[i].target = desc_device(t->target);
	}
	return d;
}

/* The wire descriptor of message @m: its parts' arrays in @pd/@td and their pointers in @pp/@tp,
 * devices in @dev (two per tensor). Borrows @m: the result points into it. */
void tpc_msgitem_wire(const struct tp_message *m, Tpw__V1__Descriptor *w, Tpw__V1__PayloadDesc *pd,
		     Tpw__V1__PayloadDesc **pp, Tpw__V1__TensorDesc *td, Tpw__V1__TensorDesc **tp,
		     Tpw__V1__Device *dev)
{
	tpw__v1__descriptor__init(w);
	w->metadata = (ProtobufCBinaryData){ m->metadata_len, (uint8_t *)m->metadata };
	w->n_payloads = m->n_payloads;
	w->payloads = pp;
	w->n_tensors = m->n_tensors;
	w->tensors = tp;
	for (size_t i = 0; i < m->n_payloads; i++) {
		const struct tp_payload *p = &m->payloads[i];

		tpw__v1__payload_desc__init(&pd[i]);
		pd[i].length = p->length;
		pd[i].metadata = (ProtobufCBinaryData){ p->metadata_len, (uint8_t *)p->metadata };
		pp[i] = &pd[i];
	}
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct tp_tensor *t = &m->tensors[i];
		Tpw__V1__Device *src = &dev[2 * i], *dst = &dev[2 * i + 1];

		tpw__v1__tensor_desc__init(&td[i]);
		tpw__v1__device__init(src);
		tpw__v1__device__init(dst);
		td[i].length = t->length;
		td[i].metadata = (ProtobufCBinaryData){ t->metadata_len, (uint8_t *)t->metadata };
		src->type = t->device.type == TP_DEVICE_CUDA ? TPW__V1__DEVICE_TYPE__DEVICE_CUDA
							     : TPW__V1__DEVICE_TYPE__DEVICE_CPU;
		src->index = t->device.type == TP_DEVICE_CUDA ? (uint32_t)t->device.index : 0;
		td[i].device = src;
		if (t->has_target) {
			dst->type = t->target.type == TP_DEVICE_CUDA ?
				    TPW__V1__DEVICE_TYPE__DEVICE_CUDA :
				    TPW__V1__DEVICE_TYPE__DEVICE_CPU;
			dst->index = t->target.type == TP_DEVICE_CUDA ? (uint32_t)t->target.index
								      : 0;
			td[i].target = dst;
		}
		tp[i] = &td[i];
	}
}

/* Checks message @m (number @k) against the daemon's limits. Return: 0, -EINVAL, -E2BIG,
 * -EMSGSIZE (message set). */
int tpc_msgitem_check(const struct tp_context *ctx, const struct tp_message *m, size_t k,
		     uint64_t *ret_len)
{
	uint64_t meta = m->metadata_len, len = 0;
	size_t parts = m->n_payloads + m->n_tensors;

	if ((m->n_payloads && !m->payloads) || (m->n_tensors && !m->tensors) ||
	    (m->metadata_len && !m->metadata))
		return tpc_error(-EINVAL, "message %zu: NULL array with a nonzero count", k);
	if (parts < m->n_payloads || parts > ctx->lim.segments_max)
		return tpc_error(-E2BIG, "message %zu: %zu payloads and tensors (the daemon takes "
				 "%u)", k, parts, ctx->lim.segments_max);
	for (size_t i = 0; i < parts; i++) {
		bool is_p = i < m->n_payloads;
		const struct tp_tensor *t = is_p ? NULL : &m->tensors[i - m->n_payloads];
		size_t l = is_p ? m->payloads[i].length : t->length;
		const void *data = is_p ? m->payloads[i].data : t->data;
		size_t ml = is_p ? m->payloads[i].metadata_len : t->metadata_len;
		const void *md = is_p ? m->payloads[i].metadata : t->metadata;

		if ((l && !data) || (ml && !md) ||
		    (t && t->device.type != TP_DEVICE_CPU && t->device.type != TP_DEVICE_CUDA))
			return tpc_error(-EINVAL, "message %zu: part %zu without data or with an "
					 "unknown device", k, i);
		meta += ml;
		len += l;
	}
	if (meta > ctx->lim.metadata_max)
		return tpc_error(-EMSGSIZE, "message %zu: %llu metadata bytes (the daemon takes %u)",
				 k, (unsigned long long)meta, ctx->lim.metadata_max);
	if (len > SIZE_MAX / 2)
		return tpc_error(-EMSGSIZE, "message %zu of %llu bytes", k,
				 (unsigned long long)len);
	*ret_len = len;
	return 0;
}

/* Part @i of @m: its bytes, length and (for a CUDA tensor) device memory. */
static const void *msg_part(const struct tp_message *m, size_t i, size_t *ret_len, bool *ret_cuda)
{
	if (i < m->n_payloads) {
		*ret_len = m->payloads[i].length;
		*ret_cuda = false;
		return m->payloads[i].data;
	}
	*ret_len = m->tensors[i - m->n_payloads].length;
	*ret_cuda = m->tensors[i - m->n_payloads].device.type == TP_DEVICE_CUDA;
	return m->tensors[i - m->n_payloads].data;
}

/*
 * Item @ret of message @m (@len bytes, checked): its one non-empty CPU part in place, or its
 * parts gathered into @ret_gather (owned; CUDA tensors copied out after their stream's work).
 * Return: 0 or -errno (message set).
 */
int tpc_msgitem_gather(struct tp_context *ctx, const struct tp_message *m, uint64_t len,
		    struct iovec *ret, uint8_t **ret_gather)
{
	static uint8_t none; /* an empty message's item */
	size_t parts = m->n_payloads + m->n_tensors, n_full = 0, one = 0, off = 0, l;
	bool cuda, any_cuda = false;
	int r = 0, st = 0;

	for (size_t i = 0; i < parts; i++) {
		msg_part(m, i, &l, &cuda);
		if (l) {
			n_full++;
			one = i;
			any_cuda |= cuda;
		}
	}
	*ret = (struct iovec){ .iov_base = &none, .iov_len = 0 };
	if (!n_full)
		return 0;
	if (n_full == 1 && !any_cuda) {
		ret->iov_base = (void *)msg_part(m, one, &l, &cuda);
		ret->iov_len = l;
		return 0;
	}
	if (any_cuda && (r = tpc_cuda_check(ctx, false)) < 0)
		return r;
	*ret_gather = malloc(len);
	if (!*ret_gather)
		return tpc_error(-ENOMEM, "out of memory for a message of %llu bytes",
				 (unsigned long long)len);
	for (size_t i = 0; r == 0 && st == 0 && i < parts; i++) {
		const void *p = msg_part(m, i, &l, &cuda);

		if (l && cuda) {
			const struct tp_tensor *t = &m->tensors[i - m->n_payloads];
			struct tpc_cuda_mem cm = { (void *)p, l, t->device.index, t->cuda_stream,
						   "", false };

			snprintf(cm.what, sizeof(cm.what), "tensor %zu", i - m->n_payloads);
			r = tpc_cuda_copy_out(ctx, &cm, *ret_gather + off, &st);
		} else if (l) {
			memcpy(*ret_gather + off, p, l);
		}
		off += l;
	}
	if (r == 0 && st < 0)
		r = st;
	*ret = (struct iovec){ .iov_base = *ret_gather, .iov_len = len };
	return r;
}


/* Frees @b; the gathered items too unless @keep (a write that gave up, -EINPROGRESS: the daemon
 * may still read them by CMA, so they are never freed). */
void tpc_msgitem_batch_free(struct tpc_msg_batch *b, size_t n, bool keep)
{
	for (size_t k = 0; b->gather && !keep && k < n; k++)
		free(b->gather[k]);
	free(b->gather);
	free(b->w);
	free(b->wp);
	free(b->items);
	free(b->pd);
	free(b->pp);
	free(b->td);
	free(b->tp);
	free(b->dev);
}

/* @b for @n messages of @np payloads and @nt tensors in all. Return: 0 or -ENOMEM. */
int tpc_msgitem_batch_alloc(struct tpc_msg_batch *b, size_t n, size_t np, size_t nt)
{
	b->w = calloc(n, sizeof(*b->w));
	b->wp = calloc(n, sizeof(*b->wp));
	b->items = calloc(n, sizeof(*b->items));
	b->gather = calloc(n, sizeof(*b->gather));
	b->pd = calloc(np + 1, sizeof(*b->pd));
	b->pp = calloc(np + 1, sizeof(*b->pp));
	b->td = calloc(nt + 1, sizeof(*b->td));
	b->tp = calloc(nt + 1, sizeof(*b->tp));
	b->dev = calloc(2 * nt + 1, sizeof(*b->dev));
	if (!b->w || !b->wp || !b->items || !b->gather || !b->pd || !b->pp || !b->td || !b->tp ||
	    !b->dev)
		return tpc_error(-ENOMEM, "out of memory");
	return 0;
}

/* Is @a a fit for @d: one slot per part, each with memory where it has bytes? */
int tpc_msgitem_alloc_check(const struct tp_descriptor *d, const struct tp_allocation *a)
{
	if (!a || a->n_payloads != d->n_payloads || a->n_tensors != d->n_tensors ||
	    (a->n_payloads && !a->payloads) || (a->n_tensors && !a->tensors))
		return tpc_error(-EINVAL, "an allocation of %zu payloads + %zu tensors for a "
				 "message of %zu + %zu", a ? a->n_payloads : 0,
				 a ? a->n_tensors : 0, d->n_payloads, d->n_tensors);
	for (size_t i = 0; i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);

		if (tpc_msgitem_part_len(d, i) && (!s->data || (s->device.type != TP_DEVICE_CPU &&
						    s->device.type != TP_DEVICE_CUDA)))
			return tpc_error(-EINVAL, "slot %zu has no memory or an unknown device", i);
	}
	return 0;
}


void tpc_msgitem_plan_free(struct tp_context *ctx, struct tpc_take_plan *pl, bool answered)
{
	free(pl->seg);
	free(pl->segp);
	free(pl->ref);
	free(pl->direct);
	if (answered) { /* else the daemon may still copy into them: kept */
		tpc_buffer_stage_put(ctx, pl->stage, true);
		free(pl->host);
	}
}

/* Appends the range [@p, @p + @len) of staging buffer @b (NULL: @p by CMA) to @pl, merged with
 * the last segment when it continues it. */
static void plan_add(struct tpc_take_plan *pl, const struct tpc_buf *b, const uint8_t *p,
		     size_t len)
{
	Tpw__V1__Segment *g = pl->n ? &pl->seg[pl->n - 1] : NULL;

	if (g && (b ? g->loc_case == TPW__V1__SEGMENT__LOC_SHM && g->shm->buf_id == b->id &&
		      g->shm->offset + g->length == (uint64_t)(p - (const uint8_t *)b->addr)
		    : g->loc_case == TPW__V1__SEGMENT__LOC_CMA_ADDR &&
		      g->cma_addr + g->length == (uint64_t)(uintptr_t)p)) {
		g->length += len;
		return;
	}
	g = &pl->seg[pl->n];
	tpw__v1__segment__init(g);
	g->length = len;
	if (b) {
		tpw__v1__shm_ref__init(&pl->ref[pl->n]);
		pl->ref[pl->n].buf_id = b->id;
		pl->ref[pl->n].gen = b->gen;
		pl->ref[pl->n].offset = (uint64_t)(p - (const uint8_t *)b->addr);
		g->loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g->shm = &pl->ref[pl->n];
	} else {
		g->loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
		g->cma_addr = (uint64_t)(uintptr_t)p;
	}
	pl->segp[pl->n] = g;
	pl->n++;
}

/*
 * Plans the take of @d's item into @a: parts whose slot lies in a shared buffer directly
 * (unless @one: across hosts, one destination, so every part is staged), the others staged
 * (in a staging buffer if @stage, else in memory of this library by CMA).
 * Return: 0, 1 (no destination for the staged parts: take it inline), or -errno.
 */
int tpc_msgitem_plan_make(struct tp_context *ctx, const struct tp_descriptor *d,
			  const struct tp_allocation *a, bool one, bool stage,
			  struct tpc_take_plan *pl)
{
	size_t parts = d->n_payloads + d->n_tensors, staged = 0, off = 0;
	Tpw__V1__Segment g;
	Tpw__V1__ShmRef ref;

	pl->seg = calloc(parts + 1, sizeof(*pl->seg));
	pl->segp = calloc(parts + 1, sizeof(*pl->segp));
	pl->ref = calloc(parts + 1, sizeof(*pl->ref));
	pl->direct = calloc(parts + 1, sizeof(*pl->direct));
	if (!pl->seg || !pl->segp || !pl->ref || !pl->direct)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; i < parts; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);
		size_t len = tpc_msgitem_part_len(d, i);

		pl->direct[i] = len && !one && !tpc_msgitem_slot_cuda(s) &&
				tpc_chan_ref(ctx, s->data, len, false, &g, &ref) == 0;
		staged += pl->direct[i] ? 0 : len;
	}
	if (staged) {
		pthread_mutex_lock(&ctx->send_lock);
		if (!stage || tpc_buffer_stage_get(ctx, staged, &pl->stage) < 0)
			pl->stage = NULL;
		pthread_mutex_unlock(&ctx->send_lock);
		if (!pl->stage && !__atomic_load_n(&ctx->cma_ok, __ATOMIC_RELAXED))
			return 1;
		if (!pl->stage && !(pl->host = malloc(staged)))
			return tpc_error(-ENOMEM, "out of memory");
		pl->base = pl->stage ? pl->stage->addr : pl->host;
	}
	for (size_t i = 0; i < parts; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);
		size_t len = tpc_msgitem_part_len(d, i);

		if (!len)
			continue;
		if (pl->direct[i]) {
			tpc_chan_ref(ctx, s->data, len, false, &pl->seg[pl->n], &pl->ref[pl->n]);
			pl->segp[pl->n] = &pl->seg[pl->n];
			pl->n++;
			continue;
		}
		plan_add(pl, pl->stage, pl->base + off, len);
		off += len;
	}
	return 0;
}

/* After a take: the staged parts into their slots (CPU: memcpy; CUDA: on the slot's stream),
 * from @base (the plan's, or the inline answer's CUDA bytes at their item offsets, @all). */
int tpc_msgitem_take_finish(struct tp_context *ctx, const struct tp_descriptor *d,
		       const struct tp_allocation *a, const bool *direct, const uint8_t *base,
		       bool all)
{
	size_t off = 0, staged = 0;
	int r = 0, st = 0;

	for (size_t i = 0; r == 0 && st == 0 && i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);
		size_t len = tpc_msgitem_part_len(d, i);
		const uint8_t *from = base + (all ? off : staged);

		off += len;
		if (!len || (direct && direct[i]))
			continue;
		staged += len;
		tpc_mem_written(from, len); /* by the daemon's CMA where there was no staging buffer */
		if (tpc_msgitem_slot_cuda(s)) {
			struct tpc_cuda_mem m = { s->data, len, s->device.index, s->cuda_stream, "",
						  false };

			snprintf(m.what, sizeof(m.what), "slot %zu", i);
			r = tpc_cuda_check(ctx, false);
			if (r == 0)
				r = tpc_cuda_copy_in(ctx, &m, from, &st);
		} else if (!all) {
			memcpy(s->data, from, len);
		}
	}
	return r < 0 ? r : st;
}

int tpc_msgitem_desc_check(const struct tp_context *ctx, const Tpw__V1__Descriptor *m,
			   uint64_t len)
{
	struct tpw_limits lim = { .segments_max = ctx->lim.segments_max,
				  .metadata_max = ctx->lim.metadata_max };
	char why[160];

	/* The daemon checked it when it came; a descriptor that does not add up is refused. */
	if (m && tpw_chan_msg_check(m, len, &lim, why, sizeof(why)) < 0)
		return tpc_error(-EPROTO, "the daemon described an item badly: %s", why);
	if (len > SIZE_MAX)
		return tpc_error(-EPROTO, "an item of %llu bytes", (unsigned long long)len);
	return 0;
}

void tpc_msgitem_scatter(const struct tp_descriptor *d, const struct tp_allocation *a,
			 const uint8_t *tail, uint8_t *host)
{
	size_t off = 0;

	for (size_t i = 0; i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);
		size_t len = tpc_msgitem_part_len(d, i);

		if (len && tpc_msgitem_slot_cuda(s) && host)
			memcpy(host + off, tail + off, len); /* copied to the device later */
		else if (len && !tpc_msgitem_slot_cuda(s))
			memcpy(s->data, tail + off, len);
		off += len;
	}
}

void tpc_msgitem_desc_free(struct tp_context *ctx, struct tpc_msg_desc *d)
{
	if (ctx) {
		pthread_mutex_lock(&ctx->lock);
		tpu_list_remove(&d->node);
		pthread_mutex_unlock(&ctx->lock);
	}
	d->magic = 0;
	free(d->bytes);
	free(d);
}

void tpc_msgitem_desc_orphan(struct tp_context *ctx, struct tpu_list *list)
{
	struct tpc_msg_desc *d, *tmp;

	pthread_mutex_lock(&ctx->lock);
	tpu_list_for_each_safe(d, tmp, list, node) {
		tpu_list_remove(&d->node);
		tpu_list_init(&d->node);
		d->ch = NULL;
		d->wq = NULL;
	}
	pthread_mutex_unlock(&ctx->lock);
}

bool tpc_msgitem_small(struct tp_context *ctx, const struct tpc_msg_desc *d,
		       const struct tp_allocation *a, bool inline_only)
{
	bool shm = false;

	for (size_t i = 0; i < d->pub.n_payloads + d->pub.n_tensors; i++) {
		const struct tp_slot *s = tpc_msgitem_part_slot(a, i);
		size_t len = tpc_msgitem_part_len(&d->pub, i);
		Tpw__V1__Segment g;
		Tpw__V1__ShmRef ref;

		shm |= len > TPW_CHAN_SHM_ITEM && !tpc_msgitem_slot_cuda(s) &&
		       tpc_chan_ref(ctx, s->data, len, false, &g, &ref) == 0;
	}
	return d->len <= TPW_CHAN_SHM_ITEM || (d->len <= TPW_CHAN_INLINE_ITEM && !shm) ||
	       inline_only;
}
