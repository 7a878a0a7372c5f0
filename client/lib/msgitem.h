/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Messages as items (msgitem.c): what channel message items (chanmsg.c, docs/channels.md "Items
 * as messages") and work queue questions and answers as messages (wqmsg.c, docs/queues.md) share
 * on the library's side: a message checked against the daemon's limits, its wire descriptor and
 * its item (one part in place, or its parts gathered, CUDA tensors copied to host memory), the
 * descriptor a reader sees, an allocation checked against it, and the read of an item into its
 * slots (inline, scattered; or planned: shared-buffer slots written by the daemon, the others
 * staged and copied out). Nothing outside client/lib/chanmsg.c and wqmsg.c includes it.
 */
#ifndef TPC_MSGITEM_H
#define TPC_MSGITEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "internal.h"

#define TPC_MSG_DESC_MAGIC 0x7470636873656463ull /* "tpchsedc" */

struct tp_chan;
struct tp_wq;

/* A message item's descriptor: what the caller sees first, then its arrays and metadata. It
 * belongs to a channel handle (@ch) or a work queue handle (@wq: question or answer @qid). */
struct tpc_msg_desc {
	struct tp_descriptor pub;
	uint64_t magic;
	struct tpu_list node; /* in ch->descs or wq->descs */
	struct tp_chan *ch;   /* set by tp_chan_read_descriptor(); NULL once it was released */
	struct tp_wq *wq;     /* set by tp_wq_*_descriptor(); NULL once it was released */
	bool answer;	      /* a work queue's: an answer the owner holds (else a question) */
	uint64_t qid;	      /* a work queue's: the question's id */
	uint64_t len;	      /* the item's bytes: its payloads and tensors back to back */
	const uint8_t *wire; /* the daemon's descriptor, packed (NULL: a byte item), in the block */
	size_t wire_len;
	/* A channel take that gave up kept this item's bytes (malloc()ed): the daemon no longer
	 * has it, tp_chan_read_msg() copies from here and a release writes it back (else NULL). */
	uint8_t *bytes;
	bool late; /* its take gave up: the descriptor belongs to that take (ch->late_takes) */
};

/* The wire side of a batch of messages: descriptors and their parts' arrays, the items. */
struct tpc_msg_batch {
	Tpw__V1__Descriptor *w, **wp;
	Tpw__V1__PayloadDesc *pd, **pp;
	Tpw__V1__TensorDesc *td, **tp;
	Tpw__V1__Device *dev;
	struct iovec *items;
	uint8_t **gather; /* per item: the buffer its parts were gathered into, or NULL */
};

/* Where the daemon copies a held item of a message read: a segment per part in a shared buffer,
 * the others (private memory, CUDA slots) back to back in one staging buffer, or, without one,
 * in memory of this library reached by CMA. */
struct tpc_take_plan {
	size_t n;
	Tpw__V1__Segment *seg, **segp;
	Tpw__V1__ShmRef *ref;
	bool *direct;	      /* per part: the daemon writes the slot itself */
	struct tpc_buf *stage; /* or NULL */
	uint8_t *host;	      /* malloc()ed, by CMA, without a staging buffer */
	uint8_t *base;	      /* the staged parts: stage->addr or @host */
};

static inline size_t tpc_msgitem_part_len(const struct tp_descriptor *d, size_t i)
{
	return i < d->n_payloads ? d->payloads[i].length : d->tensors[i - d->n_payloads].length;
}

static inline const struct tp_slot *tpc_msgitem_part_slot(const struct tp_allocation *a,
							  size_t i)
{
	return i < a->n_payloads ? &a->payloads[i] : &a->tensors[i - a->n_payloads];
}

static inline bool tpc_msgitem_slot_cuda(const struct tp_slot *s)
{
	return s->device.type == TP_DEVICE_CUDA;
}

/* @d as a message descriptor of this library (magic checked), or NULL. Borrows @d. */
struct tpc_msg_desc *tpc_msgitem_desc_of(struct tp_descriptor *d);
/* A descriptor of @m (validated, borrowed) for an item of @len bytes; NULL @m: a byte item, one
 * payload. Return: owned (free()), or NULL. */
struct tpc_msg_desc *tpc_msgitem_desc_new(const Tpw__V1__Descriptor *m, uint64_t len);
/* Frees @d, unfiled first from its handle's list under @ctx's lock (NULL: filed in none, its
 * handle released). Takes @d. */
void tpc_msgitem_desc_free(struct tp_context *ctx, struct tpc_msg_desc *d);
/* At a handle's release: the descriptors filed in @list (under @ctx's lock) outlive it, filed
 * in none and belonging to no handle. */
void tpc_msgitem_desc_orphan(struct tp_context *ctx, struct tpu_list *list);
/* Checks the descriptor @m the daemon answered for an item of @len bytes against the limits it
 * announced. Return: 0 or -EPROTO (message set). */
int tpc_msgitem_desc_check(const struct tp_context *ctx, const Tpw__V1__Descriptor *m,
			   uint64_t len);
/* The wire descriptor @w of message @m (borrowed: @w points into it), with the parts' arrays
 * @pd/@pp, @td/@tp and devices @dev (two per tensor) the caller provides. */
void tpc_msgitem_wire(const struct tp_message *m, Tpw__V1__Descriptor *w, Tpw__V1__PayloadDesc *pd,
		      Tpw__V1__PayloadDesc **pp, Tpw__V1__TensorDesc *td, Tpw__V1__TensorDesc **tp,
		      Tpw__V1__Device *dev);
/* Checks message @m (number @k) against the daemon's limits; *@ret_len: its bytes. Return: 0,
 * -EINVAL, -E2BIG, -EMSGSIZE (message set). */
int tpc_msgitem_check(const struct tp_context *ctx, const struct tp_message *m, size_t k,
		      uint64_t *ret_len);
/* Item @ret of message @m (@len bytes, checked): its one non-empty CPU part in place, or its
 * parts gathered into @ret_gather (returns owned, free()). Return: 0 or -errno (message set). */
int tpc_msgitem_gather(struct tp_context *ctx, const struct tp_message *m, uint64_t len,
		       struct iovec *ret, uint8_t **ret_gather);
/* @b for @n messages of @np payloads and @nt tensors in all; freed by tpc_msgitem_batch_free()
 * (the gathered items too unless @keep: the daemon may still read them). Return: 0 or -ENOMEM. */
int tpc_msgitem_batch_alloc(struct tpc_msg_batch *b, size_t n, size_t np, size_t nt);
void tpc_msgitem_batch_free(struct tpc_msg_batch *b, size_t n, bool keep);
/* Is @a a fit for @d: one slot per part, each with memory where it has bytes? Return: 0 or
 * -EINVAL (message set). */
int tpc_msgitem_alloc_check(const struct tp_descriptor *d, const struct tp_allocation *a);
/* Copies @d's item, inline in @tail, into the CPU slots of @a; the bytes of CUDA slots into
 * @host at their offsets (NULL: left in @tail, at the same offsets). */
void tpc_msgitem_scatter(const struct tp_descriptor *d, const struct tp_allocation *a,
			 const uint8_t *tail, uint8_t *host);
/* Is @d's item, read into @a, read inline (the answer's tail), as a byte read would be: small
 * items, those of private memory up to 256 KiB, and any item with @inline_only (a handle of
 * another host's object that takes no destination)? */
bool tpc_msgitem_small(struct tp_context *ctx, const struct tpc_msg_desc *d,
		       const struct tp_allocation *a, bool inline_only);
/*
 * tpc_msgitem_plan_make() - plans the read of @d's item into @a: parts whose slot lies in a
 * shared buffer directly (unless @one: one destination, every part staged), the others staged
 * (in a staging buffer if @stage, else in memory of this library by CMA). Free @pl with
 * tpc_msgitem_plan_free() (@answered: the daemon no longer copies into it).
 * Return: 0, 1 (no destination for the staged parts: read it inline), or -errno.
 */
int tpc_msgitem_plan_make(struct tp_context *ctx, const struct tp_descriptor *d,
			  const struct tp_allocation *a, bool one, bool stage,
			  struct tpc_take_plan *pl);
void tpc_msgitem_plan_free(struct tp_context *ctx, struct tpc_take_plan *pl, bool answered);
/* After a read: the staged parts into their slots (CPU: memcpy; CUDA: on the slot's stream),
 * from @base (the plan's, or with @all an inline answer's bytes at their item offsets, whose
 * CPU parts are in place already). Return: 0 or -errno. */
int tpc_msgitem_take_finish(struct tp_context *ctx, const struct tp_descriptor *d,
			    const struct tp_allocation *a, const bool *direct, const uint8_t *base,
			    bool all);

#endif
