/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel items as messages (chan_int.h; docs/channels.md, "Items as messages"):
 * tp_chan_write_msgs() (a message as one item: its parts by reference when there is one,
 * gathered otherwise, CUDA tensors copied to host memory first, its descriptor beside it),
 * tp_chan_read_descriptor() (the held item's descriptor), tp_chan_read_msg() (the item into the
 * reader's slots: inline, scattered by the reply handler, or copied by the daemon into shared
 * buffers and staging) and tp_chan_descriptor_free() (the held item dropped); and what a call
 * that gave up waiting for the daemon leaves on the handle: a message read's late descriptor
 * (the daemon holds its item), a take's late item (the daemon no longer has it: read from here,
 * or written back at release). Leaves the requests and their answers to chan.c, segments and
 * staging buffers to chanwrite.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "chan_int.h"
#include "internal.h"
#include "validate.h"

#define CHAN_DESC_MAGIC 0x7470636873656463ull /* "tpchsedc" */

/* A channel message's descriptor: what the caller sees first, then its arrays and metadata. */
struct chan_desc {
	struct tp_descriptor pub;
	uint64_t magic;
	struct tpu_list node; /* in ch->descs */
	struct tp_chan *ch;   /* set by tp_chan_read_descriptor(); NULL once it was released */
	uint64_t len;	    /* the item's bytes: its payloads and tensors back to back */
	const uint8_t *wire; /* the daemon's descriptor, packed (NULL: a byte item), in the block */
	size_t wire_len;
	/* A take that gave up kept this item's bytes (malloc()ed): the daemon no longer has it,
	 * tp_chan_read_msg() copies from here and a release writes it back (else NULL). */
	uint8_t *bytes;
	bool late; /* its take gave up: the descriptor belongs to that take (ch->late_takes) */
};

static struct chan_desc *desc_of(struct tp_descriptor *d)
{
	struct chan_desc *cd = (struct chan_desc *)d;

	return cd && cd->magic == CHAN_DESC_MAGIC ? cd : NULL;
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
static struct chan_desc *desc_new(const Tpw__V1__Descriptor *m, uint64_t len)
{
	size_t np = m ? m->n_payloads : 1, nt = m ? m->n_tensors : 0;
	size_t bytes = m ? m->metadata.len : 0;
	struct tp_payload_desc *pd;
	struct tp_tensor_desc *td;
	struct chan_desc *d;
	char *cur;

	for (size_t i = 0; m && i < np; i++)
		bytes += m->payloads[i]->metadata.len;
	size_t wire = m ? protobuf_c_message_get_packed_size(&m->base) : 0;

	for (size_t i = 0; m && i < nt; i++)
		bytes += m->tensors[i]->metadata.len;
	d = malloc(sizeof(*d) + np * sizeof(*pd) + nt * sizeof(*td) + bytes + wire);
	if (!d)
		return NULL;
	pd = (struct tp_payload_desc *)(d + 1);
	td = (struct tp_tensor_desc *)(pd + np);
	cur = (char *)(td + nt);
	*d = (struct chan_desc){ .magic = CHAN_DESC_MAGIC, .len = len, .wire_len = wire };
	if (m) { /* for a release that writes the item back (a take that gave up) */
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

int tpc_chan_msg_on_held(struct tp_context *ctx, struct chan_req *cr,
			 const Tpw__V1__ChanReply *m)
{
	struct tpw_limits lim = { .segments_max = ctx->lim.segments_max,
				  .metadata_max = ctx->lim.metadata_max };
	char why[160];

	/* The daemon checked it at the write; a descriptor that does not add up is refused. */
	if (m->msg_desc && tpw_chan_msg_check(m->msg_desc, m->held_len, &lim, why,
					      sizeof(why)) < 0)
		return tpc_error(-EPROTO, "the daemon described a held item badly: %s", why);
	if (m->held_len > SIZE_MAX)
		return tpc_error(-EPROTO, "a held item of %llu bytes",
				 (unsigned long long)m->held_len);
	free(cr->desc);
	cr->desc = (struct tp_descriptor *)desc_new(m->msg_desc, m->held_len);
	return cr->desc ? 0 : tpc_error(-ENOMEM, "out of memory for a descriptor");
}

static size_t part_len(const struct tp_descriptor *d, size_t i)
{
	return i < d->n_payloads ? d->payloads[i].length : d->tensors[i - d->n_payloads].length;
}

static const struct tp_slot *part_slot(const struct tp_allocation *a, size_t i)
{
	return i < a->n_payloads ? &a->payloads[i] : &a->tensors[i - a->n_payloads];
}

static bool slot_cuda(const struct tp_slot *s)
{
	return s->device.type == TP_DEVICE_CUDA;
}

int tpc_chan_msg_on_taken(struct chan_req *cr, const Tpw__V1__ChanReply *m, const uint8_t *tail)
{
	const struct tp_descriptor *d = cr->scatter_desc;
	const struct tp_allocation *a = cr->scatter;
	size_t off = 0;

	if (cr->msg_take) { /* its caller gave up: the item's bytes kept for the handle */
		if (m->n_lengths != 1 || m->lengths[0] != ((struct chan_desc *)d)->len)
			return tpc_error(-EPROTO, "a message item answered with %llu bytes",
					 (unsigned long long)(m->n_lengths ? m->lengths[0] : 0));
		cr->host = malloc(m->lengths[0] ? m->lengths[0] : 1);
		if (!cr->host)
			return tpc_error(-ENOMEM, "out of memory for a late item");
		memcpy(cr->host, tail, m->lengths[0]);
		return 0;
	}
	if (!a || m->n_lengths != 1 || m->lengths[0] != ((struct chan_desc *)d)->len)
		return tpc_error(-EPROTO, "a message item answered with %llu bytes, not %llu",
				 (unsigned long long)(m->n_lengths ? m->lengths[0] : 0),
				 (unsigned long long)((struct chan_desc *)d)->len);
	for (size_t i = 0; i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = part_slot(a, i);
		size_t len = part_len(d, i);

		if (len && slot_cuda(s))
			memcpy(cr->host + off, tail + off, len); /* copied to the device later */
		else if (len)
			memcpy(s->data, tail + off, len);
		off += len;
	}
	return 0;
}

/* ---- writing ------------------------------------------------------------------------------- */

/* The wire descriptor of message @m: its parts' arrays in @pd/@td and their pointers in @pp/@tp,
 * devices in @dev (two per tensor). Borrows @m: the result points into it. */
static void msg_wire(const struct tp_message *m, Tpw__V1__Descriptor *w, Tpw__V1__PayloadDesc *pd,
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
static int msg_check(const struct tp_context *ctx, const struct tp_message *m, size_t k,
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
static int msg_item(struct tp_context *ctx, const struct tp_message *m, uint64_t len,
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

/* The wire side of a batch of messages: descriptors and their parts' arrays, the items. */
struct msg_batch {
	Tpw__V1__Descriptor *w, **wp;
	Tpw__V1__PayloadDesc *pd, **pp;
	Tpw__V1__TensorDesc *td, **tp;
	Tpw__V1__Device *dev;
	struct iovec *items;
	uint8_t **gather; /* per item: the buffer its parts were gathered into, or NULL */
};

/* Frees @b; the gathered items too unless @keep (a write that gave up, -EINPROGRESS: the daemon
 * may still read them by CMA, so they are never freed). */
static void batch_free(struct msg_batch *b, size_t n, bool keep)
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
static int batch_alloc(struct msg_batch *b, size_t n, size_t np, size_t nt)
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

TP_EXPORT int tp_chan_write_msgs(struct tp_chan *ch, const struct tp_message *msgs, size_t n,
				 int timeout_ms)
{
	struct msg_batch b = { 0 };
	size_t np = 0, nt = 0, kp = 0, kt = 0;
	uint64_t len;
	int r = 0;

	if (!ch || !msgs || n == 0)
		return tpc_error(-EINVAL, "tp_chan_write_msgs: no message");
	if (ch->ctx->daemon_minor < TPW_MINOR_CHAN_MSG)
		return tpc_error(-EOPNOTSUPP, "channel '%s': the daemon speaks protocol minor %u: "
				 "items are byte strings (minor %u takes messages)", ch->name,
				 ch->ctx->daemon_minor, TPW_MINOR_CHAN_MSG);
	if (n > ch->ctx->lim.segments_max)
		return tpc_error(-EMSGSIZE, "a batch of %zu items exceeds the daemon's %u", n,
				 ch->ctx->lim.segments_max);
	for (size_t k = 0; k < n && r == 0; k++) {
		r = msg_check(ch->ctx, &msgs[k], k, &len);
		np += msgs[k].n_payloads;
		nt += msgs[k].n_tensors;
	}
	if (r == 0)
		r = batch_alloc(&b, n, np, nt);
	for (size_t k = 0; r == 0 && k < n; k++) {
		msg_wire(&msgs[k], &b.w[k], b.pd + kp, b.pp + kp, b.td + kt, b.tp + kt,
			 b.dev + 2 * kt);
		b.wp[k] = &b.w[k];
		kp += msgs[k].n_payloads;
		kt += msgs[k].n_tensors;
		msg_check(ch->ctx, &msgs[k], k, &len); /* checked above: its length */
		r = msg_item(ch->ctx, &msgs[k], len, &b.items[k], &b.gather[k]);
	}
	if (r == 0)
		r = tpc_chan_write_items(ch, b.items, n, b.wp, timeout_ms);
	batch_free(&b, n, r == -EINPROGRESS);
	return r;
}

/* ---- reading ------------------------------------------------------------------------------- */

static int msg_minor(struct tp_chan *ch, const char *what)
{
	if (ch->ctx->daemon_minor >= TPW_MINOR_CHAN_MSG)
		return 0;
	return tpc_error(-EOPNOTSUPP, "%s: channel '%s': the daemon speaks protocol minor %u "
			 "(minor %u reads messages)", what, ch->name, ch->ctx->daemon_minor,
			 TPW_MINOR_CHAN_MSG);
}

/* Frees message read or take @cr, the descriptor it holds and a take's kept bytes. */
static void msg_req_free(struct chan_req *cr)
{
	if (cr->desc)
		((struct chan_desc *)cr->desc)->magic = 0;
	free(cr->desc);
	cr->desc = NULL;
	free(cr->host);
	cr->host = NULL;
	tpc_chan_req_free(cr);
}

/* Whether @ch's caller holds a descriptor of an item the daemon holds for it (lock held). */
static bool descs_held_locked(struct tp_chan *ch)
{
	struct chan_desc *d;

	tpu_list_for_each(d, &ch->descs, node)
		if (!d->bytes)
			return true;
	return false;
}

/* The oldest take of @ch that gave up and holds its item, taken off the list (lock held).
 * Return: owned, or NULL. */
static struct chan_req *late_take_locked(struct tp_chan *ch)
{
	struct chan_req *cr;

	if (tpu_list_empty(&ch->late_takes))
		return NULL;
	cr = tpu_list_first(&ch->late_takes, struct chan_req, node);
	if (!cr->req.done)
		return NULL;
	tpu_list_remove(&cr->node);
	return cr;
}

/*
 * Every descriptor the daemon answers a handle's message read with describes the one item it
 * holds for the handle, until a take or a drop of it. A late answer is filed only when the
 * handle's caller has no descriptor of that item yet: none filed, none handed out and not yet
 * read or freed (tp_chan_read_msg() and tp_chan_descriptor_free() keep theirs filed until the
 * daemon answered them, so a late answer sent before a take never outlives it).
 */
void tpc_chan_msg_late_locked(struct chan_req *cr)
{
	struct tp_chan *ch = cr->ch;

	if (cr->msg_take) { /* stays filed, in order, with its bytes for the next read */
		if (cr->req.status == 0 && cr->msg_taken && cr->host)
			return;
		tpu_list_remove(&cr->node);
		return msg_req_free(cr); /* failed: the daemon kept the item (or it was lost) */
	}
	tpu_list_remove(&cr->node);
	if (cr->req.status == 0 && cr->desc && !ch->late_desc && !descs_held_locked(ch)) {
		ch->late_desc = cr;
		return;
	}
	msg_req_free(cr); /* failed, or the item described already */
}

/* @cr's descriptor filed on @ch and into *@ret, @cr freed (lock held). Return: 0 or
 * TP_CHAN_CLOSED. */
static int desc_hand_out_locked(struct tp_chan *ch, struct chan_req *cr,
				struct tp_descriptor **ret)
{
	struct chan_desc *d = (struct chan_desc *)cr->desc;
	bool closed = cr->closed;

	cr->desc = NULL;
	if (cr->msg_take) { /* the item's bytes go with the descriptor */
		d->bytes = cr->host;
		d->late = false;
		cr->host = NULL;
	}
	msg_req_free(cr);
	d->ch = ch;
	tpu_list_insert_tail(&ch->descs, &d->node);
	*ret = &d->pub;
	return closed ? TP_CHAN_CLOSED : 0;
}

/*
 * Waits for message read @cr (sent, owned) of @ch and decides the call's result (lock held):
 * its own answer, or the descriptor a late read brought (the same item: the other is dropped);
 * a read not answered yet is filed on ch->late_msg. Return: as tp_chan_read_descriptor(),
 * the reason in @why.
 */
static int desc_wait_locked(struct tp_chan *ch, struct chan_req *cr, int timeout_ms,
			    struct tp_descriptor **ret, char *why, size_t wl)
{
	struct chan_req *late, *take;
	int r = tpc_chan_wait_locked(ch->ctx, cr, timeout_ms, ch);

	if (r == -ETIMEDOUT && timeout_ms == 0 && cr->req.done)
		r = -EAGAIN;
	if (r == 0 && !cr->desc)
		r = -EPROTO;
	snprintf(why, wl, "%s", r == -EPROTO && !cr->req.status ?
		 "an answer without a descriptor" : cr->req.msg);
	if (!cr->req.done) { /* gave up, or a late read's descriptor or item came: filed */
		cr->ch = ch;
		tpu_list_insert_tail(&ch->late_msg, &cr->node);
	}
	take = late_take_locked(ch);
	if (take) { /* an item taken before the one the daemon holds now goes first */
		if (cr->req.done && r >= 0) { /* that one is kept for the next call */
			cr->ch = ch;
			tpu_list_insert_tail(&ch->late_msg, &cr->node);
			tpc_chan_msg_late_locked(cr);
		} else if (cr->req.done) {
			msg_req_free(cr);
		}
		return desc_hand_out_locked(ch, take, ret);
	}
	late = ch->late_desc;
	ch->late_desc = NULL;
	if (cr->req.done && r >= 0) {
		if (late)
			msg_req_free(late);
		return desc_hand_out_locked(ch, cr, ret);
	}
	if (cr->req.done)
		msg_req_free(cr);
	return late ? desc_hand_out_locked(ch, late, ret) : r;
}

TP_EXPORT int tp_chan_read_descriptor(struct tp_chan *ch, struct tp_descriptor **ret,
				      int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req *cr;
	char why[sizeof(cr->req.msg)];
	int r;

	if (!ch || !ret)
		return tpc_error(-EINVAL, "tp_chan_read_descriptor: NULL argument");
	r = msg_minor(ch, "tp_chan_read_descriptor");
	if (r < 0)
		return r;
	pthread_mutex_lock(&ch->ctx->lock);
	cr = late_take_locked(ch); /* an item a take that gave up kept goes first */
	if (!cr) { /* then the descriptor a read that gave up brought */
		cr = ch->late_desc;
		ch->late_desc = NULL;
	}
	if (cr)
		r = desc_hand_out_locked(ch, cr, ret);
	pthread_mutex_unlock(&ch->ctx->lock);
	if (cr)
		return r;
	cr = calloc(1, sizeof(*cr));
	if (!cr)
		return tpc_error(-ENOMEM, "out of memory");
	cr->msg_read = true;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	op.msg = true;
	r = tpc_chan_send(ch->ctx, &op, NULL, 0, cr);
	if (r < 0) {
		free(cr);
		return r;
	}
	pthread_mutex_lock(&ch->ctx->lock);
	r = desc_wait_locked(ch, cr, timeout_ms, ret, why, sizeof(why));
	pthread_mutex_unlock(&ch->ctx->lock);
	if (r < 0)
		return tpc_error(r, "channel '%s': %s", ch->name, why);
	return r;
}

void tpc_chan_msg_orphan(struct tp_chan *ch)
{
	struct tp_context *ctx = ch->ctx;
	struct chan_desc *d, *tmp;
	struct chan_req *cr, *ctmp;

	pthread_mutex_lock(&ctx->lock);
	tpu_list_for_each_safe(d, tmp, &ch->descs, node) {
		tpu_list_remove(&d->node);
		tpu_list_init(&d->node);
		d->ch = NULL;
	}
	/* the daemon gave the held item back to the channel, and canceled the waiting reads */
	tpu_list_for_each_safe(cr, ctmp, &ch->late_msg, node) {
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	if (ch->late_desc)
		msg_req_free(ch->late_desc);
	ch->late_desc = NULL;
	/* takes that gave up: given back (tpc_chan_msg_give_back()) or, answered now, lost */
	tpu_list_for_each_safe(cr, ctmp, &ch->late_takes, node) {
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	pthread_mutex_unlock(&ctx->lock);
}

bool tpc_chan_msg_kept_any(struct tp_chan *ch)
{
	struct chan_desc *d;
	bool any;

	pthread_mutex_lock(&ch->ctx->lock);
	any = !tpu_list_empty(&ch->late_takes);
	tpu_list_for_each(d, &ch->descs, node)
		any |= d->bytes != NULL;
	pthread_mutex_unlock(&ch->ctx->lock);
	return any;
}

/* What a give-back needs of @d, in a block of its own (free()): its length and packed wire
 * descriptor (the arrays stay empty). Return: owned, or NULL. */
static struct tp_descriptor *desc_copy_wire(const struct chan_desc *d)
{
	struct chan_desc *c = malloc(sizeof(*c) + d->wire_len);

	if (!c)
		return NULL;
	*c = (struct chan_desc){ .magic = CHAN_DESC_MAGIC, .len = d->len,
				 .wire_len = d->wire_len };
	if (d->wire) {
		memcpy(c + 1, d->wire, d->wire_len);
		c->wire = (const uint8_t *)(c + 1);
	}
	tpu_list_init(&c->node);
	return &c->pub;
}

/* Writes item @bytes (@len) of descriptor @wire (packed; NULL: a byte item) to @via.
 * Return: 0 or -errno. */
static int give_back_one(struct tp_chan *via, const uint8_t *wire, size_t wire_len,
			 uint8_t *bytes, uint64_t len)
{
	struct iovec iov = { .iov_base = bytes, .iov_len = len };
	Tpw__V1__Descriptor *m, *mp[1];
	int r;

	if (!via)
		return -ENOENT;
	if (!wire)
		return tp_chan_write(via, &iov, 1, via->ctx->reply_ms);
	m = tpw__v1__descriptor__unpack(NULL, wire_len, wire);
	if (!m)
		return -ENOMEM;
	mp[0] = m;
	r = tpc_chan_write_items(via, &iov, 1, mp, via->ctx->reply_ms);
	tpw__v1__descriptor__free_unpacked(m, NULL);
	return r;
}

int tpc_chan_msg_give_back(struct tp_chan *ch, struct tp_chan *via)
{
	struct tpu_list kept = TPU_LIST_INIT(kept);
	struct chan_desc *d;
	struct chan_req *cr, *tmp;
	unsigned lost = 0;
	int r = 0, w;

	/* Descriptors handed out first (their takes were older), then the takes, in order; each
	 * descriptor's bytes move to a take of its own here. The caller of a descriptor of @ch
	 * must not use it while @ch is released. */
	pthread_mutex_lock(&ch->ctx->lock);
	tpu_list_for_each(d, &ch->descs, node) {
		if (!d->bytes || !(cr = calloc(1, sizeof(*cr))))
			continue; /* without memory, the descriptor keeps them: dropped */
		cr->desc = desc_copy_wire(d);
		cr->host = d->bytes;
		d->bytes = NULL;
		tpu_list_insert_tail(&kept, &cr->node);
	}
	while ((cr = late_take_locked(ch)))
		tpu_list_insert_tail(&kept, &cr->node);
	pthread_mutex_unlock(&ch->ctx->lock);
	tpu_list_for_each_safe(cr, tmp, &kept, node) {
		d = (struct chan_desc *)cr->desc;
		w = d ? give_back_one(via, d->wire, d->wire_len, cr->host, d->len) : -ENOMEM;
		lost += w < 0;
		r = r ? r : w;
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	if (r < 0)
		return tpc_error(r, "%u message item(s) whose take gave up could not be given back "
				 "to channel '%s': %s", lost, ch->name, tp_strerror(r));
	return 0;
}

/* Frees @cd, unfiled from its handle. */
static void desc_free(struct chan_desc *cd)
{
	if (cd->ch) {
		pthread_mutex_lock(&cd->ch->ctx->lock);
		tpu_list_remove(&cd->node);
		pthread_mutex_unlock(&cd->ch->ctx->lock);
	}
	cd->magic = 0;
	free(cd->bytes);
	free(cd);
}

/* Is @a a fit for @d: one slot per part, each with memory where it has bytes? */
static int alloc_check(const struct tp_descriptor *d, const struct tp_allocation *a)
{
	if (!a || a->n_payloads != d->n_payloads || a->n_tensors != d->n_tensors ||
	    (a->n_payloads && !a->payloads) || (a->n_tensors && !a->tensors))
		return tpc_error(-EINVAL, "an allocation of %zu payloads + %zu tensors for a "
				 "message of %zu + %zu", a ? a->n_payloads : 0,
				 a ? a->n_tensors : 0, d->n_payloads, d->n_tensors);
	for (size_t i = 0; i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = part_slot(a, i);

		if (part_len(d, i) && (!s->data || (s->device.type != TP_DEVICE_CPU &&
						    s->device.type != TP_DEVICE_CUDA)))
			return tpc_error(-EINVAL, "slot %zu has no memory or an unknown device", i);
	}
	return 0;
}

/* Where the daemon copies a held item of a message read: a segment per part in a shared buffer,
 * the others (private memory, CUDA slots) back to back in one staging buffer, or, without one,
 * in memory of this library reached by CMA. */
struct take_plan {
	size_t n;
	Tpw__V1__Segment *seg, **segp;
	Tpw__V1__ShmRef *ref;
	bool *direct;	      /* per part: the daemon writes the slot itself */
	struct tpc_buf *stage; /* or NULL */
	uint8_t *host;	      /* malloc()ed, by CMA, without a staging buffer */
	uint8_t *base;	      /* the staged parts: stage->addr or @host */
};

static void plan_free(struct tp_context *ctx, struct take_plan *pl, bool answered)
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
static void plan_add(struct take_plan *pl, const struct tpc_buf *b, const uint8_t *p, size_t len)
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
static int plan_make(struct tp_chan *ch, const struct tp_descriptor *d,
		     const struct tp_allocation *a, bool one, bool stage, struct take_plan *pl)
{
	struct tp_context *ctx = ch->ctx;
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
		const struct tp_slot *s = part_slot(a, i);
		size_t len = part_len(d, i);

		pl->direct[i] = len && !one && !slot_cuda(s) &&
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
		const struct tp_slot *s = part_slot(a, i);
		size_t len = part_len(d, i);

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
static int take_finish(struct tp_context *ctx, const struct tp_descriptor *d,
		       const struct tp_allocation *a, const bool *direct, const uint8_t *base,
		       bool all)
{
	size_t off = 0, staged = 0;
	int r = 0, st = 0;

	for (size_t i = 0; r == 0 && st == 0 && i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = part_slot(a, i);
		size_t len = part_len(d, i);
		const uint8_t *from = base + (all ? off : staged);

		off += len;
		if (!len || (direct && direct[i]))
			continue;
		staged += len;
		if (slot_cuda(s)) {
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

/* @op as a take of @ch's held item. */
static void take_op(struct tp_chan *ch, Tpw__V1__ChanOp *op)
{
	op->op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op->chan_id = ch->id;
	op->msg = true;
	op->take_held = true;
}

/* Sends @op (a take of @ch's held item) with @cr and waits for its answer. Return: its status. */
static int take_call(struct tp_chan *ch, Tpw__V1__ChanOp *op, struct chan_req *cr)
{
	take_op(ch, op);
	return tpc_chan_call(ch->ctx, op, NULL, 0, 0, cr);
}

/* Files take @cr of @cd's item, whose caller gave up, on @ch: it owns @cd from now on, and
 * the reply handler keeps the item's bytes (lock held). */
static void take_file_late_locked(struct tp_chan *ch, struct chan_req *cr, struct chan_desc *cd)
{
	free(cr->host); /* the caller's CUDA bytes: its slots are not ours any more */
	cr->host = NULL;
	cr->scatter = NULL;
	cr->msg_take = true;
	cr->ch = ch;
	cr->desc = &cd->pub;
	tpu_list_remove(&cd->node);
	tpu_list_init(&cd->node);
	cd->late = true;
	tpu_list_insert_tail(&ch->late_takes, &cr->node);
}

/*
 * The take inline: CPU slots written by the reply handler, CUDA ones from its host copy. A
 * take that gives up waiting for the daemon is filed on @ch with @cd (*@ret_kept): the item
 * the daemon answers it with later goes to the handle's next tp_chan_read_descriptor().
 */
static int take_inline(struct tp_chan *ch, struct chan_desc *cd, const struct tp_allocation *a,
		       bool *ret_kept)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct tp_context *ctx = ch->ctx;
	struct chan_req *cr = calloc(1, sizeof(*cr));
	char why[sizeof(cr->req.msg)];
	int r;

	if (!cr || (cd->len && !(cr->host = malloc(cd->len)))) {
		free(cr);
		return tpc_error(-ENOMEM, "out of memory");
	}
	cr->scatter = a;
	cr->scatter_desc = &cd->pub;
	take_op(ch, &op);
	r = tpc_chan_send(ctx, &op, NULL, 0, cr);
	if (r < 0) {
		free(cr->host);
		free(cr);
		return r;
	}
	pthread_mutex_lock(&ctx->lock);
	r = tpc_chan_wait_locked(ctx, cr, 0, NULL);
	snprintf(why, sizeof(why), "%s", cr->req.msg);
	*ret_kept = !cr->req.done;
	if (*ret_kept)
		take_file_late_locked(ch, cr, cd);
	pthread_mutex_unlock(&ctx->lock);
	if (*ret_kept)
		return tpc_error(r, "channel '%s': %s (an item it answers later is kept for the "
				 "handle's next tp_chan_read_descriptor())", ch->name, why);
	if (r == 0 && !cr->msg_taken)
		r = tpc_error(-EPROTO, "a take answered without the item");
	if (r == 0)
		r = take_finish(ctx, &cd->pub, a, NULL, cr->host, true);
	else
		r = tpc_error(r, "channel '%s': %s", ch->name, why);
	free(cr->host);
	free(cr);
	return r;
}

/* The take into the plan's segments: shared-buffer slots by the daemon, the others staged.
 * Return: 0, -EAGAIN (the daemon refused the staging buffer, as a write's: the item is still
 * held, take it without), or -errno. */
static int take_segs(struct tp_chan *ch, struct chan_desc *cd, const struct tp_allocation *a,
		     struct take_plan *pl)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	op.n_segments = pl->n;
	op.segments = pl->segp;
	r = take_call(ch, &op, &cr);
	if (r == 0 && (!cr.msg_taken || cr.n || !cr.req.done))
		r = -EPROTO;
	if (r == 0)
		return take_finish(ch->ctx, &cd->pub, a, pl->direct, pl->base, false);
	if (r == -ENOENT && tpc_chan_stage_refused(ch->ctx, pl->stage)) {
		tpc_buffer_stage_put(ch->ctx, pl->stage, false);
		pl->stage = NULL;
		r = -EAGAIN;
	}
	plan_free(ch->ctx, pl, cr.req.done);
	*pl = (struct take_plan){ 0 };
	if (r == -EAGAIN)
		return r;
	return tpc_error(r, "channel '%s': %s", ch->name, r == -EPROTO && !cr.req.status ?
			 "a take answered without the item" : cr.req.msg);
}

/* The take of @cd's item into @a by a plan (@stage: with a staging buffer), or inline when the
 * plan has no destination for some part. Return: as take_segs(). */
static int take_planned(struct tp_chan *ch, struct chan_desc *cd, const struct tp_allocation *a,
			bool stage, bool *ret_kept)
{
	struct take_plan pl = { 0 };
	int r = plan_make(ch, &cd->pub, a, ch->remote, stage, &pl);

	if (r == 0 && pl.n > 1 && ch->remote) /* cannot happen: all staged, merged */
		r = tpc_error(-EOPNOTSUPP, "several destinations across hosts");
	if (r == 1 && cd->len > ch->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "channel '%s': an item of %llu bytes above the inline "
			      "limit, and neither a staging buffer nor CMA for the slots not in a "
			      "shared buffer", ch->name, (unsigned long long)cd->len);
	if (r == 1)
		r = take_inline(ch, cd, a, ret_kept);
	else if (r == 0)
		r = take_segs(ch, cd, a, &pl);
	if (pl.seg || pl.stage || pl.host)
		plan_free(ch->ctx, &pl, true);
	return r;
}

TP_EXPORT int tp_chan_read_msg(struct tp_chan *ch, struct tp_descriptor *d,
			       const struct tp_allocation *alloc)
{
	struct chan_desc *cd = desc_of(d);
	bool small, shm = false, kept = false;
	int r;

	if (!ch || !cd || cd->ch != ch)
		return tpc_error(-EINVAL, "tp_chan_read_msg: no descriptor of this channel");
	r = alloc_check(d, alloc);
	if (r < 0)
		return r;
	if (cd->bytes) { /* kept by a take that gave up: the daemon no longer has it */
		r = take_finish(ch->ctx, d, alloc, NULL, cd->bytes, false);
		desc_free(cd);
		return r;
	}
	for (size_t i = 0; i < d->n_payloads + d->n_tensors; i++) {
		const struct tp_slot *s = part_slot(alloc, i);
		size_t len = part_len(d, i);
		Tpw__V1__Segment g;
		Tpw__V1__ShmRef ref;

		shm |= len > TPW_CHAN_SHM_ITEM && !slot_cuda(s) &&
		       tpc_chan_ref(ch->ctx, s->data, len, false, &g, &ref) == 0;
	}
	/* Inline as tp_chan_read_into() would: small items, those of private memory up to 256 KiB,
	 * and every item of a channel that takes no destination (another host's, inline only). */
	small = cd->len <= TPW_CHAN_SHM_ITEM || (cd->len <= TPW_CHAN_INLINE_ITEM && !shm) ||
		!tpc_chan_fast(ch);
	if (small && cd->len > ch->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "channel '%s': an item of %llu bytes above the inline "
			      "limit on a channel that takes items inline only", ch->name,
			      (unsigned long long)cd->len);
	else
		r = small ? take_inline(ch, cd, alloc, &kept) :
			    take_planned(ch, cd, alloc, true, &kept);
	if (r == -EAGAIN)
		r = take_planned(ch, cd, alloc, false, &kept);
	if (r == -EAGAIN)
		r = tpc_error(-EIO, "channel '%s': the daemon refused a staging buffer", ch->name);
	if (!kept) /* else the take that gave up owns it */
		desc_free(cd);
	return r;
}

TP_EXPORT int tp_chan_descriptor_free(struct tp_descriptor *d)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_desc *cd = desc_of(d);
	struct chan_req cr = { 0 };
	struct tp_chan *ch;
	int r;

	if (!cd)
		return d ? tpc_error(-EINVAL, "tp_chan_descriptor_free: not a channel's") : 0;
	ch = cd->ch;
	if (!ch || cd->bytes) {
		desc_free(cd);
		return 0; /* the item went back to the channel at the release, or only we had it */
	}
	op.msg_drop = true;
	r = take_call(ch, &op, &cr);
	desc_free(cd); /* filed until answered: tpc_chan_msg_late_locked() */
	if (r < 0)
		return tpc_error(r, "channel '%s': cannot drop the held item: %s", ch->name,
				 cr.req.msg);
	return 0;
}
