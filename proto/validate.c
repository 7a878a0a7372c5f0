/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Message validation and status <-> errno mapping. See validate.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "ring.h"
#include "validate.h"
#include "pring.h"

#define PIPE_ID_CLIENT_MAX (1ull << 63)
#define ADDRESS_MAX 1024

void tpw_limits_default(struct tpw_limits *lim)
{
	*lim = (struct tpw_limits){
		.frame_max = TPW_DEFAULT_FRAME_MAX,
		.inline_max = TPW_DEFAULT_INLINE_MAX,
		.segments_max = TPW_DEFAULT_SEGMENTS_MAX,
		.message_bytes_max = TPW_DEFAULT_MESSAGE_BYTES_MAX,
		.metadata_max = TPW_DEFAULT_METADATA_MAX,
	};
}

bool tpw_name_valid(const char *name)
{
	size_t n = 0;

	if (!name)
		return false;
	for (const char *p = name; *p; p++, n++) {
		char c = *p;
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			  c == '.' || c == '_' || c == '@' || c == ':' || c == '+' || c == '-';
		if (!ok || n >= TPW_NAME_MAX)
			return false;
	}
	return n > 0;
}

static bool device_valid(const Tpw__V1__Device *d, bool allow_unspecified)
{
	if (!d)
		return true; /* absent: CPU for a source, no preference for a target */
	switch (d->type) {
	case TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED:
		return allow_unspecified;
	case TPW__V1__DEVICE_TYPE__DEVICE_CPU:
	case TPW__V1__DEVICE_TYPE__DEVICE_CUDA:
		return true;
	default:
		return false;
	}
}

static bool on_cuda(const Tpw__V1__Device *d)
{
	return d && d->type == TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
}

struct seg_sum {
	uint64_t bytes;
	uint64_t metadata;
};

/* "dddd:bb:dd.f" as the driver prints it: hex digits, ':' and '.', nothing else. */
static bool bus_id_valid(const char *id)
{
	size_t n = 0;

	if (!id)
		return false;
	for (const char *p = id; *p; p++, n++) {
		bool ok = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
			  (*p >= 'A' && *p <= 'F') || *p == ':' || *p == '.';
		if (!ok || n >= TPW_BUS_ID_MAX)
			return false;
	}
	return n > 0;
}

static int check_cuda_ref(const Tpw__V1__CudaRef *c, uint64_t length, char *why, size_t wl)
{
	uint64_t end;

	if (!c)
		return tpu_why(-EBADMSG, why, wl, "empty CUDA reference");
	if (c->mem_handle.len != TPW_CUDA_HANDLE_BYTES)
		return tpu_why(-EBADMSG, why, wl, "CUDA memory handle of %zu bytes, expected %u",
			       c->mem_handle.len, TPW_CUDA_HANDLE_BYTES);
	if (c->event_handle.len != 0 && c->event_handle.len != TPW_CUDA_HANDLE_BYTES)
		return tpu_why(-EBADMSG, why, wl, "CUDA event handle of %zu bytes, expected %u",
			       c->event_handle.len, TPW_CUDA_HANDLE_BYTES);
	if (!tpu_add_u64(c->offset, length, &end) || end > c->alloc_size)
		return tpu_why(-EBADMSG, why, wl,
			       "CUDA range %llu+%llu outside its allocation of %llu bytes",
			       (unsigned long long)c->offset, (unsigned long long)length,
			       (unsigned long long)c->alloc_size);
	if (!bus_id_valid(c->pci_bus_id))
		return tpu_why(-EBADMSG, why, wl, "bad CUDA device bus id");
	if (c->gpu_uuid.len != 0 && c->gpu_uuid.len != TPW_CUDA_UUID_BYTES)
		return tpu_why(-EBADMSG, why, wl, "CUDA device UUID of %zu bytes, expected %u",
			       c->gpu_uuid.len, TPW_CUDA_UUID_BYTES);
	return 0;
}

static int check_segment(const Tpw__V1__Segment *s, const struct tpw_hdr *hdr, bool source,
			 struct seg_sum *sum, const struct tpw_limits *lim, char *why, size_t wl)
{
	if (!s)
		return tpu_why(-EBADMSG, why, wl, "segment without location");
	if (!tpu_add_u64(sum->bytes, s->length, &sum->bytes) ||
	    sum->bytes > lim->message_bytes_max)
		return tpu_why(-EMSGSIZE, why, wl, "message bytes exceed limit %llu",
			       (unsigned long long)lim->message_bytes_max);
	switch (s->loc_case) {
	case TPW__V1__SEGMENT__LOC_INLINE_OFF:
		if (!source)
			return tpu_why(-EBADMSG, why, wl, "inline destination in a read");
		if (s->inline_off > hdr->data_len || s->length > hdr->data_len - s->inline_off)
			return tpu_why(-EBADMSG, why, wl,
				       "inline segment %llu+%llu outside data tail of %u bytes",
				       (unsigned long long)s->inline_off,
				       (unsigned long long)s->length, hdr->data_len);
		return 0;
	case TPW__V1__SEGMENT__LOC_SHM:
		if (!s->shm)
			return tpu_why(-EBADMSG, why, wl, "empty shm reference");
		return 0;
	case TPW__V1__SEGMENT__LOC_CMA_ADDR: {
		uint64_t end;
		if (!tpu_add_u64(s->cma_addr, s->length, &end))
			return tpu_why(-EBADMSG, why, wl, "cma range wraps");
		return 0;
	}
	case TPW__V1__SEGMENT__LOC_RING_ADDR: {
		uint64_t end;
		if (!tpu_add_u64(s->ring_addr, s->length, &end))
			return tpu_why(-EBADMSG, why, wl, "ring address range wraps");
		return 0;
	}
	case TPW__V1__SEGMENT__LOC_CUDA:
		return check_cuda_ref(s->cuda, s->length, why, wl);
	default:
		if (s->length == 0)
			return 0; /* an empty segment needs no location */
		return tpu_why(-EBADMSG, why, wl, "segment of %llu bytes without location",
			       (unsigned long long)s->length);
	}
}

static int check_metadata(size_t len, struct seg_sum *sum, const struct tpw_limits *lim,
			  char *why, size_t wl)
{
	sum->metadata += len;
	if (sum->metadata > lim->metadata_max)
		return tpu_why(-EMSGSIZE, why, wl, "metadata exceeds limit %u", lim->metadata_max);
	return 0;
}

static int check_write(const Tpw__V1__Write *w, const struct tpw_hdr *hdr,
		       const struct tpw_limits *lim, char *why, size_t wl)
{
	struct seg_sum sum = { 0, 0 };
	int r;

	if (hdr->data_len > lim->inline_max)
		return tpu_why(-EMSGSIZE, why, wl, "inline data of %u bytes exceeds limit %u",
			       hdr->data_len, lim->inline_max);
	if (w->n_payloads > lim->segments_max || w->n_tensors > lim->segments_max - w->n_payloads)
		return tpu_why(-E2BIG, why, wl, "%zu payloads + %zu tensors exceed limit %u",
			       w->n_payloads, w->n_tensors, lim->segments_max);
	r = check_metadata(w->metadata.len, &sum, lim, why, wl);
	for (size_t i = 0; r == 0 && i < w->n_payloads; i++) {
		const Tpw__V1__Payload *p = w->payloads[i];
		r = check_metadata(p->metadata.len, &sum, lim, why, wl);
		if (r == 0)
			r = check_segment(p->data, hdr, true, &sum, lim, why, wl);
		if (r == 0 && p->data->loc_case == TPW__V1__SEGMENT__LOC_CUDA)
			r = tpu_why(-EBADMSG, why, wl, "payload %zu in CUDA memory", i);
	}
	for (size_t i = 0; r == 0 && i < w->n_tensors; i++) {
		const Tpw__V1__Tensor *t = w->tensors[i];
		r = check_metadata(t->metadata.len, &sum, lim, why, wl);
		if (r == 0)
			r = check_segment(t->data, hdr, true, &sum, lim, why, wl);
		if (r == 0 && (!device_valid(t->device, false) || !device_valid(t->target, true)))
			r = tpu_why(-EBADMSG, why, wl, "tensor %zu: bad device", i);
		if (r == 0 && t->data->length &&
		    (t->data->loc_case == TPW__V1__SEGMENT__LOC_CUDA) != on_cuda(t->device))
			r = tpu_why(-EBADMSG, why, wl, "tensor %zu: device and memory disagree", i);
	}
	return r;
}

static int check_read(const Tpw__V1__Read *rd, const struct tpw_hdr *hdr,
		      const struct tpw_limits *lim, char *why, size_t wl)
{
	struct seg_sum sum = { 0, 0 };
	int r = 0;

	if ((rd->ack_eager || rd->discard) && (rd->n_payloads || rd->n_tensors))
		return tpu_why(-EBADMSG, why, wl, "acknowledgement or discard with segments");
	if (rd->n_payloads > lim->segments_max || rd->n_tensors > lim->segments_max - rd->n_payloads)
		return tpu_why(-E2BIG, why, wl, "read with too many segments");
	for (size_t i = 0; r == 0 && i < rd->n_payloads; i++) {
		r = check_segment(rd->payloads[i], hdr, false, &sum, lim, why, wl);
		if (r == 0 && rd->payloads[i]->loc_case == TPW__V1__SEGMENT__LOC_CUDA)
			r = tpu_why(-EBADMSG, why, wl, "payload %zu in CUDA memory", i);
	}
	for (size_t i = 0; r == 0 && i < rd->n_tensors; i++)
		r = check_segment(rd->tensors[i], hdr, false, &sum, lim, why, wl);
	return r;
}

static int check_string(const char *s, size_t max, const char *what, char *why, size_t wl)
{
	if (s && strnlen(s, max + 1) > max)
		return tpu_why(-EBADMSG, why, wl, "%s longer than %zu bytes", what, max);
	return 0;
}

/* A remote access mode in range; @peers only with REMOTE_PEERS, 1..TPW_REMOTE_PEERS_MAX names. */
static int check_remote(Tpw__V1__RemoteAccess remote, char *const *peers, size_t n, char *why,
			size_t wl)
{
	if ((unsigned)remote > TPW__V1__REMOTE_ACCESS__REMOTE_PEERS)
		return tpu_why(-EBADMSG, why, wl, "unknown remote access %d", (int)remote);
	if ((remote == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS) != (n > 0))
		return tpu_why(-EBADMSG, why, wl,
			       "remote peers go with REMOTE_PEERS, and only with it");
	if (n > TPW_REMOTE_PEERS_MAX)
		return tpu_why(-EBADMSG, why, wl, "%zu remote peers (at most %u)", n,
			       TPW_REMOTE_PEERS_MAX);
	for (size_t i = 0; i < n; i++)
		if (!peers[i] || !*peers[i] || strnlen(peers[i], TPW_NAME_MAX + 1) > TPW_NAME_MAX)
			return tpu_why(-EBADMSG, why, wl, "remote peer %zu: 1..%u bytes", i,
				       TPW_NAME_MAX);
	return 0;
}

/* Listen.remote (check_remote()). */
static int check_remote_access(const Tpw__V1__Listen *l, char *why, size_t wl)
{
	return check_remote(l->remote, l->remote_peers, l->n_remote_peers, why, wl);
}

/* A channel's or queue's name in an OPEN: a name, or from a client (@tpip) also an address
 * tpip://HOST[:PORT]/NAME of one on another host (issue 25 part xhost). */
static bool object_name_valid(const char *name, bool tpip)
{
	char host[TPW_TPIP_HOST_MAX + 1];
	const char *n;
	uint16_t port;

	if (tpw_name_valid(name))
		return true;
	return tpip && name && strnlen(name, TPW_TPIP_ADDR_MAX + 1) <= TPW_TPIP_ADDR_MAX &&
	       tpw_tpip_parse(name, 1, host, &port, &n, NULL, 0) == 0;
}

/* GroupJoin: a name of 1..TPW_GROUP_NAME_MAX bytes, 1..TPW_GROUP_SIZE_MAX members, a rank
 * below the size or -1 (assigned), a known bootstrap kind. */
static int check_group_join(const Tpw__V1__GroupJoin *j, char *why, size_t wl)
{
	if (!j->name || !*j->name || strnlen(j->name, TPW_GROUP_NAME_MAX + 1) > TPW_GROUP_NAME_MAX)
		return tpu_why(-EBADMSG, why, wl, "group name: 1..%u bytes", TPW_GROUP_NAME_MAX);
	if (j->size == 0 || j->size > TPW_GROUP_SIZE_MAX)
		return tpu_why(-EBADMSG, why, wl, "group size %u (1..%u)", j->size,
			       TPW_GROUP_SIZE_MAX);
	if (j->rank < -1 || (j->rank >= 0 && (uint32_t)j->rank >= j->size))
		return tpu_why(-EBADMSG, why, wl, "rank %d of a group of %u", (int)j->rank, j->size);
	if ((unsigned)j->bootstrap > TPW__V1__GROUP_BOOTSTRAP__GROUP_BOOTSTRAP_SLURM)
		return tpu_why(-EBADMSG, why, wl, "unknown group bootstrap %d", (int)j->bootstrap);
	if (check_remote(j->remote, j->remote_peers, j->n_remote_peers, why, wl) < 0)
		return -EBADMSG;
	return check_string(j->coordinator, TPW_NAME_MAX, "coordinator", why, wl);
}

/* The largest item a channel segment may name (1 TiB): with at most segments_max items their
 * sum cannot overflow; the daemon's channel capacity bounds them further. */
#define CHAN_ITEM_MAX (1ull << 40)

/* A segment naming memory by reference: a shared buffer's range with its reference, or an
 * address range of the client's that does not wrap. */
static bool chan_ref_ok(const Tpw__V1__Segment *g)
{
	uint64_t end;

	if (g->loc_case == TPW__V1__SEGMENT__LOC_SHM)
		return g->shm != NULL;
	return g->loc_case == TPW__V1__SEGMENT__LOC_CMA_ADDR &&
	       tpu_add_u64(g->cma_addr, g->length, &end);
}

/* A WRITE's items by segment (client minor >= 7): one per length and of that length, each
 * inline (the inline ones back to back in order, adding up to the data tail exactly), a shared
 * buffer's range or an address in the writer's process; no CUDA memory. */
static int check_chan_segments(const Tpw__V1__ChanOp *c, const struct tpw_hdr *hdr, char *why,
			       size_t wl)
{
	uint64_t inl = 0;

	if (c->n_segments != c->n_lengths)
		return tpu_why(-EBADMSG, why, wl, "%zu channel item segments for %zu items",
			       c->n_segments, c->n_lengths);
	for (size_t i = 0; i < c->n_segments; i++) {
		const Tpw__V1__Segment *g = c->segments[i];

		if ((c->lengths[i] == 0 && !c->n_msgs) || c->lengths[i] > CHAN_ITEM_MAX ||
		    g->length != c->lengths[i])
			return tpu_why(-EBADMSG, why, wl, "channel item %zu of %llu bytes", i,
				       (unsigned long long)c->lengths[i]);
		switch (g->loc_case) {
		case TPW__V1__SEGMENT__LOC_INLINE_OFF:
			if (g->inline_off != inl || g->length > hdr->data_len - inl)
				return tpu_why(-EBADMSG, why, wl, "channel item %zu outside the "
					       "data tail", i);
			inl += g->length;
			break;
		case TPW__V1__SEGMENT__LOC_SHM:
		case TPW__V1__SEGMENT__LOC_CMA_ADDR:
			if (!chan_ref_ok(g))
				return tpu_why(-EBADMSG, why, wl, "channel item %zu: an empty shared "
					       "buffer reference or a wrapping address", i);
			break;
		default:
			return tpu_why(-EBADMSG, why, wl, "channel item %zu is neither inline, a "
				       "shared buffer nor the writer's memory", i);
		}
	}
	if (inl != hdr->data_len)
		return tpu_why(-EBADMSG, why, wl, "inline channel items of %llu bytes in a tail of "
			       "%u", (unsigned long long)inl, hdr->data_len);
	return 0;
}

/* A READ: no items; at most one destination (a shared buffer's range or the reader's memory,
 * not empty), required by take_held and by pack; a batch of at most segments_max items, into
 * a destination only packed (pack: no message read, no held item named). A message read's
 * take (msg, take_held) may name up to segments_max destinations, or none (the item inline, or
 * dropped with msg_drop). */
static int check_chan_read(const Tpw__V1__ChanOp *c, const struct tpw_limits *lim, bool tpip,
			   char *why, size_t wl)
{
	bool msg_take = c->msg && c->take_held;

	if (c->n_lengths || c->n_msgs || (c->n_segments > 1 && !msg_take) ||
	    c->n_segments > lim->segments_max)
		return tpu_why(-EBADMSG, why, wl, "a channel read with items");
	/* a client's batch within this daemon's limit; a peer's (peer minor >= 10), which knows
	 * no limit of this daemon, is cut to it when served */
	if (tpip && c->max_items > lim->segments_max)
		return tpu_why(-E2BIG, why, wl, "a channel read of %u items (at most %u)",
			       c->max_items, lim->segments_max);
	if (c->xfer_id && c->max_items > 1 && !c->pack_peer)
		return tpu_why(-EBADMSG, why, wl, "a batch read into one transfer");
	if (c->pack_peer && (!c->xfer_id || c->msg || c->take_held))
		return tpu_why(-EBADMSG, why, wl, "a peer's packed channel read without a transfer, "
			       "or of a message or held item");
	if (c->msg_drop && (!msg_take || c->n_segments || c->xfer_id))
		return tpu_why(-EBADMSG, why, wl, "a channel item dropped that is no held message");
	if (c->take_held && !c->n_segments && !c->xfer_id && !msg_take)
		return tpu_why(-EBADMSG, why, wl, "a held channel item without a destination");
	if (c->n_mapped > TPW_CHAN_MAPPED_MAX || (c->n_mapped && !c->map_ok) ||
	    (c->map_fail && !c->map_done) || (c->map_ok && (c->msg || c->map_done)) ||
	    (c->map_done && (c->n_segments || c->take_held || c->max_items > 1 || c->msg)))
		return tpu_why(-EBADMSG, why, wl, "a channel read's mapping fields do not go "
			       "together (at most %u keys mapped)", TPW_CHAN_MAPPED_MAX);
	/* a packed batch (a client's only: checked by the caller): its one destination is the
	 * room the items are packed into */
	if ((c->pack_copied || c->pack_mapped) && !c->pack)
		return tpu_why(-EBADMSG, why, wl, "pack_copied or pack_mapped on a channel read "
			       "that is not packed");
	if (c->pack_mapped && !c->map_ok)
		return tpu_why(-EBADMSG, why, wl, "pack_mapped on a channel read that maps nothing");
	if (c->pack && (c->n_segments != 1 || c->msg || c->take_held || c->map_done))
		return tpu_why(-EBADMSG, why, wl, "a packed channel read without one destination, "
			       "or of a message or held item");
	if (c->n_segments && ((c->max_items > 1 && !c->pack) || (c->msg && !c->take_held)))
		return tpu_why(-EBADMSG, why, wl, "a batch read into one destination");
	for (size_t i = 0; i < c->n_segments; i++) {
		const Tpw__V1__Segment *g = c->segments[i];

		if (g->length == 0 || g->length > CHAN_ITEM_MAX || !chan_ref_ok(g))
			return tpu_why(-EBADMSG, why, wl, "a channel read's destination is neither "
				       "a shared buffer nor the reader's memory, or empty");
	}
	return 0;
}

int tpw_chan_msg_check(const Tpw__V1__Descriptor *d, uint64_t item_len,
		       const struct tpw_limits *lim, char *why, size_t wl)
{
	struct seg_sum sum = { 0 };
	uint64_t total = 0;

	if (d->pipe_id || d->msg_id || d->eager || d->ring_only)
		return tpu_why(-EINVAL, why, wl, "a channel message with pipe fields");
	if (d->n_payloads > lim->segments_max || d->n_tensors > lim->segments_max - d->n_payloads)
		return tpu_why(-E2BIG, why, wl, "a channel message of %zu payloads and %zu tensors "
			       "(at most %u in all)", d->n_payloads, d->n_tensors,
			       lim->segments_max);
	if (check_metadata(d->metadata.len, &sum, lim, why, wl) < 0)
		return -EMSGSIZE;
	for (size_t i = 0; i < d->n_payloads; i++) {
		if (check_metadata(d->payloads[i]->metadata.len, &sum, lim, why, wl) < 0)
			return -EMSGSIZE;
		if (!tpu_add_u64(total, d->payloads[i]->length, &total))
			return tpu_why(-EINVAL, why, wl, "channel message lengths overflow");
	}
	for (size_t i = 0; i < d->n_tensors; i++) {
		const Tpw__V1__TensorDesc *t = d->tensors[i];

		if (check_metadata(t->metadata.len, &sum, lim, why, wl) < 0)
			return -EMSGSIZE;
		if (!tpu_add_u64(total, t->length, &total))
			return tpu_why(-EINVAL, why, wl, "channel message lengths overflow");
		if (!device_valid(t->device, false) || !device_valid(t->target, true))
			return tpu_why(-EINVAL, why, wl, "channel message tensor %zu: bad device",
				       i);
	}
	if (total != item_len)
		return tpu_why(-EINVAL, why, wl, "a channel message of %llu payload and tensor "
			       "bytes in an item of %llu", (unsigned long long)total,
			       (unsigned long long)item_len);
	return 0;
}

/* A channel operation: a known op, a valid name where one is named, items (WRITE) within the
 * segment limit whose lengths add up to the frame's data tail exactly, no empty item. */
static int check_chan_op(const Tpw__V1__ChanOp *c, const struct tpw_hdr *hdr,
			 const struct tpw_limits *lim, bool tpip, char *why, size_t wl)
{
	uint64_t total = 0;
	int r;

	if (c->op <= TPW__V1__CHAN_OP_KIND__CHAN_OP_UNSPECIFIED ||
	    c->op > TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		return tpu_why(-EBADMSG, why, wl, "unknown channel op %d", (int)c->op);
	if ((c->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN &&
	     !object_name_valid(c->name, tpip)) ||
	    (c->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK && !object_name_valid(c->name, tpip)))
		return tpu_why(-EBADMSG, why, wl, "invalid channel name");
	if ((unsigned)c->access > TPW__V1__ACCESS__ACCESS_ANYONE)
		return tpu_why(-EBADMSG, why, wl, "unknown access mode %d", (int)c->access);
	r = check_remote(c->remote, c->remote_peers, c->n_remote_peers, why, wl);
	if (r < 0)
		return r;
	if ((c->n_segments || (c->take_held && !c->xfer_id && !c->msg) || c->lend || c->map_ok ||
	     c->n_mapped || c->map_done || c->pack || c->pack_copied || c->pack_mapped) && !tpip)
		return tpu_why(-EBADMSG, why, wl, "channel item segments, held items or mapped reads "
			       "over a peer link");
	if (c->lend && (c->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE || !c->n_segments))
		return tpu_why(-EBADMSG, why, wl, "lend on a channel op that is no write by segment");
	if ((c->n_streamed || c->xfer_id || c->room || c->pack_peer) && tpip)
		return tpu_why(-EBADMSG, why, wl, "streamed channel items from a client");
	if (c->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_READ && (c->xfer_id || c->room))
		return tpu_why(-EBADMSG, why, wl, "a channel transfer on an op that is no read");
	if (c->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ && (!c->xfer_id != !c->room ||
							      c->room > CHAN_ITEM_MAX))
		return tpu_why(-EBADMSG, why, wl, "a channel read's transfer without room, or "
			       "room without a transfer");
	if (c->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ)
		return check_chan_read(c, lim, tpip, why, wl);
	if (c->max_items || c->take_held || c->inline_only || c->msg || c->msg_drop || c->map_ok ||
	    c->n_mapped || c->map_done || c->map_fail || c->pack || c->pack_copied ||
	    c->pack_mapped || c->pack_peer)
		return tpu_why(-EBADMSG, why, wl, "read fields on a channel op that is no read");
	if (c->n_msgs && c->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE)
		return tpu_why(-EBADMSG, why, wl, "channel messages on an op that is no write");
	if (c->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE)
		return c->n_lengths || c->n_segments ? tpu_why(-EBADMSG, why, wl, "items on a "
							       "channel op that takes none") : 0;
	if (c->n_lengths == 0 || c->n_lengths > lim->segments_max)
		return tpu_why(-E2BIG, why, wl, "channel write of %zu items (1..%u)", c->n_lengths,
			       lim->segments_max);
	if (c->n_segments)
		return check_chan_segments(c, hdr, why, wl);
	if (c->n_streamed && c->n_streamed != c->n_lengths)
		return tpu_why(-EBADMSG, why, wl, "%zu streamed flags for %zu channel items",
			       c->n_streamed, c->n_lengths);
	for (size_t i = 0; i < c->n_lengths; i++) {
		bool streamed = c->n_streamed && c->streamed[i];

		if ((c->lengths[i] == 0 && !c->n_msgs) ||
		    c->lengths[i] > (streamed ? CHAN_ITEM_MAX : hdr->data_len))
			return tpu_why(-EBADMSG, why, wl, "channel item %zu of %llu bytes", i,
				       (unsigned long long)c->lengths[i]);
		total += streamed ? 0 : c->lengths[i];
	}
	if (total != hdr->data_len)
		return tpu_why(-EBADMSG, why, wl, "channel items of %llu bytes in a tail of %u",
			       (unsigned long long)total, hdr->data_len);
	return 0;
}

/* A work queue's message fields (issue 25 part wqmsg): a descriptor (checked against the item
 * by the daemon) and where the payload lies on SUBMIT and REPLY; a message take, read or drop on
 * TAKE and ANSWER, a read's destinations as a channel message read's. Segments name a client's
 * own memory: never from a peer. */
static int check_wq_msg(const Tpw__V1__WqOp *q, const struct tpw_hdr *hdr,
			const struct tpw_limits *lim, bool data, bool tpip, char *why, size_t wl)
{
	bool get = q->op == TPW__V1__WQ_OP_KIND__WQ_OP_TAKE ||
		   q->op == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	const Tpw__V1__Segment *g = q->segment;

	if ((q->msg_desc || g) && !data)
		return tpu_why(-EBADMSG, why, wl, "a work queue message on an op that sends none");
	if ((q->stream_len || q->xfer_id || q->room) && tpip)
		return tpu_why(-EBADMSG, why, wl, "a work queue transfer from a client");
	if (q->stream_len && (!q->msg_desc || g || hdr->data_len || q->stream_len > CHAN_ITEM_MAX))
		return tpu_why(-EBADMSG, why, wl, "a work queue message streamed that is no "
			       "message's, or with bytes inline, or above an item's limit");
	if ((q->xfer_id || q->room) && (!q->msg_read || !q->xfer_id || !q->room ||
					q->room > CHAN_ITEM_MAX))
		return tpu_why(-EBADMSG, why, wl, "a work queue transfer on an op that reads no "
			       "message, or without its room");
	if (g && (!q->msg_desc || !tpip || hdr->data_len || g->length == 0 ||
		  g->length > CHAN_ITEM_MAX || !chan_ref_ok(g)))
		return tpu_why(-EBADMSG, why, wl, "a work queue payload by reference that is no "
			       "message's, or not one of the client's shared buffers or memory");
	if ((q->msg || q->msg_read || q->n_segments) && !get)
		return tpu_why(-EBADMSG, why, wl, "a work queue message take on an op that takes "
			       "none");
	if (q->msg_drop && q->op != TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER)
		return tpu_why(-EBADMSG, why, wl, "a work queue message dropped that is no answer");
	if ((q->msg + q->msg_read + q->msg_drop > 1) || (q->n_segments && !q->msg_read) ||
	    ((q->msg_read || q->msg_drop) && !q->question_id))
		return tpu_why(-EBADMSG, why, wl, "a work queue message take, read or drop mixed, "
			       "or without its question");
	if (q->n_segments && (!tpip || q->n_segments > lim->segments_max))
		return tpu_why(-EBADMSG, why, wl, "%zu work queue read destinations (at most %u, "
			       "local clients only)", q->n_segments, lim->segments_max);
	for (size_t i = 0; i < q->n_segments; i++) {
		g = q->segments[i];
		if (g->length == 0 || g->length > CHAN_ITEM_MAX || !chan_ref_ok(g))
			return tpu_why(-EBADMSG, why, wl, "a work queue read's destination is "
				       "neither a shared buffer nor the reader's memory, or empty");
	}
	return 0;
}

/* A work-queue operation (docs/queues.md): a known op, a valid name where one is named, a data
 * tail (the payload, not empty unless a message's) on SUBMIT and REPLY only. */
static int check_wq_op(const Tpw__V1__WqOp *q, const struct tpw_hdr *hdr,
		       const struct tpw_limits *lim, bool tpip, char *why, size_t wl)
{
	bool data = q->op == TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT ||
		    q->op == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;

	if (q->op <= TPW__V1__WQ_OP_KIND__WQ_OP_UNSPECIFIED ||
	    q->op > TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE)
		return tpu_why(-EBADMSG, why, wl, "unknown work queue op %d", (int)q->op);
	if (q->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN && !object_name_valid(q->name, tpip))
		return tpu_why(-EBADMSG, why, wl, "invalid work queue name");
	if ((unsigned)q->access > TPW__V1__ACCESS__ACCESS_ANYONE)
		return tpu_why(-EBADMSG, why, wl, "unknown access mode %d", (int)q->access);
	if (check_remote(q->remote, q->remote_peers, q->n_remote_peers, why, wl) < 0)
		return -EBADMSG;
	if (data && hdr->data_len == 0 && !q->msg_desc)
		return tpu_why(-EBADMSG, why, wl, "a work queue payload of 0 bytes");
	return check_wq_msg(q, hdr, lim, data, tpip, why, wl);
}

/* A work queue answer's message fields: a descriptor only with an item held (no payload, its
 * length within an item's), bytes copied into a read's segments (to a local client only) with
 * no payload. */
static bool wq_reply_msg_ok(const Tpw__V1__WqReply *r, bool local)
{
	if (r->xfer_id) /* a streamed submit or reply admitted (peer minor 11): nothing else */
		return !local && !r->length && !r->msg_held && !r->msg_copied && !r->msg_desc &&
		       !r->msg_len && !r->remote_refs && r->status == TPW__V1__STATUS__STATUS_OK;
	if (r->remote_refs && !local)
		return false;
	if (r->msg_held)
		return !r->length && !r->msg_copied && r->msg_len <= CHAN_ITEM_MAX;
	if (r->msg_desc)
		return false;
	if (r->msg_copied && !local) /* sent over the data connections: its bytes */
		return !r->length && r->msg_len && r->msg_len <= CHAN_ITEM_MAX;
	return !r->msg_len && (!r->msg_copied || !r->length);
}

/* Items handed out by mapping (@r->map_key set): none empty, each inside the buffer's
 * map_size, the first at map_off. */
static bool map_items_ok(const Tpw__V1__ChanReply *r)
{
	if (r->n_map_offs && r->map_offs[0] != r->map_off)
		return false;
	for (size_t i = 0; i < r->n_lengths; i++)
		if (!r->lengths[i] || !tpu_range_ok(r->n_map_offs ? r->map_offs[i] : r->map_off,
						    r->lengths[i], r->map_size))
			return false;
	return true;
}

/* A channel answer from the daemon: its items add up to the data tail exactly (a batch read:
 * up to segments_max items, none empty), or one item copied into the read's destination (no
 * tail), or an item held (no length, no tail). */
static int check_chan_reply(const Tpw__V1__ChanReply *r, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim)
{
	uint64_t total = 0;

	if (r->n_released > TPW_CHAN_RELEASED_MAX || (r->lent && r->n_lengths))
		return -EBADMSG;
	if (!r->req_id && r->n_released) /* a notice: buffers given back, nothing else */
		return !r->n_retired && !r->n_lengths && !r->lent && !r->map_key &&
		       !r->n_map_offs && !r->map_fd &&
		       !r->map_off && !r->map_size && !r->copied && !r->held_len &&
		       !r->msg_held && !r->msg_taken && !r->msg_desc && hdr->data_len == 0 ?
		       0 : -EBADMSG;
	if (r->n_retired) /* a notice: keys of mapped buffers gone, nothing else */
		return r->n_retired <= TPW_CHAN_RETIRED_MAX && !r->req_id && !r->n_lengths &&
		       !r->n_released && !r->lent && !r->map_key && !r->n_map_offs &&
		       !r->map_fd && !r->map_off &&
		       !r->map_size && !r->copied && !r->held_len && !r->msg_held &&
		       !r->msg_taken && !r->msg_desc && hdr->data_len == 0 ? 0 : -EBADMSG;
	if (r->map_key || r->map_fd) /* items in a buffer to map, inside it */
		return r->map_key && r->n_lengths >= 1 &&
		       r->n_lengths <= TPU_MAX(lim->segments_max, 1u) &&
		       r->n_map_offs == (r->n_lengths > 1 ? r->n_lengths : 0) &&
		       map_items_ok(r) && !r->copied &&
		       !r->held_len && !r->msg_held && !r->msg_taken && !r->msg_desc &&
		       hdr->data_len == 0 ? 0 : -EBADMSG;
	if (r->n_map_offs)
		return -EBADMSG;
	if (r->map_off || r->map_size)
		return -EBADMSG;
	if (r->msg_held) /* a message read: the item held, its descriptor here */
		return !r->n_lengths && !r->copied && !r->msg_taken && hdr->data_len == 0 ?
		       0 : -EBADMSG;
	if (r->msg_desc)
		return -EBADMSG;
	if (r->msg_taken && (r->n_lengths > 1 || r->held_len))
		return -EBADMSG;
	if (r->held_len)
		return !r->n_lengths && !r->copied && hdr->data_len == 0 ? 0 : -EBADMSG;
	if (r->copied) { /* one item, or a packed read's (ChanOp.pack_copied), none empty */
		if (!r->n_lengths || r->n_lengths > TPU_MAX(lim->segments_max, 1u) ||
		    (r->n_lengths > 1 && r->msg_taken) || hdr->data_len)
			return -EBADMSG;
		for (size_t i = 0; r->n_lengths > 1 && i < r->n_lengths; i++)
			if (!r->lengths[i])
				return -EBADMSG;
		return 0;
	}
	if (r->n_lengths > TPU_MAX(lim->segments_max, 1u))
		return -EBADMSG;
	for (size_t i = 0; i < r->n_lengths; i++) {
		if (r->n_lengths > 1 && r->lengths[i] == 0)
			return -EBADMSG;
		if (r->lengths[i] > hdr->data_len)
			return -EBADMSG;
		total += r->lengths[i];
	}
	return total == hdr->data_len ? 0 : -EBADMSG;
}

int tpw_client_msg_validate(const Tpw__V1__ClientMsg *m, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t wl)
{
	bool want_fd = m->body_case == TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER ||
		       m->body_case == TPW__V1__CLIENT_MSG__BODY_RING_SETUP ||
		       m->body_case == TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF;
	bool may_have_data = m->body_case == TPW__V1__CLIENT_MSG__BODY_WRITE ||
			     m->body_case == TPW__V1__CLIENT_MSG__BODY_BROADCAST ||
			     (m->body_case == TPW__V1__CLIENT_MSG__BODY_CHAN_OP &&
			      m->chan_op->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE) ||
			     (m->body_case == TPW__V1__CLIENT_MSG__BODY_WQ_OP &&
			      (m->wq_op->op == TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT ||
			       m->wq_op->op == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY));

	if (hdr->nfds != (want_fd ? 1 : 0))
		return tpu_why(-EBADMSG, why, wl, "%u fds attached, expected %u", hdr->nfds,
			       want_fd ? 1 : 0);
	if (hdr->data_len && !may_have_data)
		return tpu_why(-EBADMSG, why, wl, "data tail on a message that takes none");

	switch (m->body_case) {
	case TPW__V1__CLIENT_MSG__BODY_HELLO:
		if (m->hello->role != TPW__V1__ROLE__ROLE_CLIENT &&
		    m->hello->role != TPW__V1__ROLE__ROLE_CONTROL)
			return tpu_why(-EBADMSG, why, wl, "unknown role %d", (int)m->hello->role);
		return check_string(m->hello->name, TPW_NAME_MAX, "name", why, wl);
	case TPW__V1__CLIENT_MSG__BODY_RING_SETUP:
		if (!tpu_ring_size_ok(m->ring_setup->ring_bytes))
			return tpu_why(-EBADMSG, why, wl, "ring of %u bytes (power of two, %u..%u)",
				       m->ring_setup->ring_bytes, TPU_RING_MIN, TPU_RING_MAX);
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_LISTEN:
		if (!tpw_name_valid(m->listen->name))
			return tpu_why(-EBADMSG, why, wl, "invalid listener name");
		if ((unsigned)m->listen->access > TPW__V1__ACCESS__ACCESS_ANYONE)
			return tpu_why(-EBADMSG, why, wl, "unknown access mode %d",
				       (int)m->listen->access);
		return check_remote_access(m->listen, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_CUDA_RELEASE:
		if (m->cuda_release->mem_handle.len != TPW_CUDA_HANDLE_BYTES)
			return tpu_why(-EBADMSG, why, wl, "CUDA memory handle of %zu bytes",
				       m->cuda_release->mem_handle.len);
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF:
		if (m->cuda_dmabuf->mem_handle.len != TPW_CUDA_HANDLE_BYTES)
			return tpu_why(-EBADMSG, why, wl, "CUDA memory handle of %zu bytes",
				       m->cuda_dmabuf->mem_handle.len);
		if (m->cuda_dmabuf->size == 0)
			return tpu_why(-EBADMSG, why, wl, "dma-buf of size 0");
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE:
	case TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE:
	case TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE:
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_SESSION_END:
		return check_string(m->session_end->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__CLIENT_MSG__BODY_CONNECT:
		if (m->connect->pipe_id == 0 || m->connect->pipe_id >= PIPE_ID_CLIENT_MAX)
			return tpu_why(-EBADMSG, why, wl, "pipe id out of the client's range");
		if (!m->connect->address || !*m->connect->address)
			return tpu_why(-EBADMSG, why, wl, "empty address");
		if (m->connect->expect_remote == TPW__V1__REMOTE_ACCESS__REMOTE_NONE)
			return tpu_why(-EBADMSG, why, wl, "connect expecting remote access NONE");
		if (check_remote(m->connect->expect_remote, m->connect->expect_peers,
				 m->connect->n_expect_peers, why, wl) < 0)
			return -EBADMSG;
		return check_string(m->connect->address, ADDRESS_MAX, "address", why, wl);
	case TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER:
		if (m->buffer_register->size == 0)
			return tpu_why(-EBADMSG, why, wl, "buffer of size 0");
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_WRITE:
		return check_write(m->write, hdr, lim, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_READ:
		return check_read(m->read, hdr, lim, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_BROADCAST:
		if (!m->broadcast->write)
			return tpu_why(-EBADMSG, why, wl, "broadcast without a message");
		if (m->broadcast->n_targets == 0 || m->broadcast->n_targets > TPW_BCAST_TARGETS_MAX)
			return tpu_why(-E2BIG, why, wl, "broadcast to %zu pipes (1..%u)",
				       m->broadcast->n_targets, TPW_BCAST_TARGETS_MAX);
		return check_write(m->broadcast->write, hdr, lim, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_CANCEL:
		if (m->cancel->kind != TPW__V1__CANCEL_KIND__CANCEL_WRITE &&
		    m->cancel->kind != TPW__V1__CANCEL_KIND__CANCEL_READ)
			return tpu_why(-EBADMSG, why, wl, "unknown cancel kind %d",
				       (int)m->cancel->kind);
		if (m->cancel->pipe_id == 0 || m->cancel->id == 0)
			return tpu_why(-EBADMSG, why, wl, "cancel of pipe %llu id %llu",
				       (unsigned long long)m->cancel->pipe_id,
				       (unsigned long long)m->cancel->id);
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_FLOW_RESUME:
		if (m->flow_resume->pipe_id == 0)
			return tpu_why(-EBADMSG, why, wl, "flow resume of pipe 0");
		return 0;
	case TPW__V1__CLIENT_MSG__BODY_RING_DONE:
		if (m->ring_done->pipe_id == 0 || m->ring_done->id == 0)
			return tpu_why(-EBADMSG, why, wl, "ring done of pipe %llu id %llu",
				       (unsigned long long)m->ring_done->pipe_id,
				       (unsigned long long)m->ring_done->id);
		return check_string(m->ring_done->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN:
		return check_group_join(m->group_join, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_GROUP_READY:
	case TPW__V1__CLIENT_MSG__BODY_GROUP_LEAVE:
		return 0; /* group ids are checked against the session's groups */
	case TPW__V1__CLIENT_MSG__BODY_CHAN_OP:
		return check_chan_op(m->chan_op, hdr, lim, true, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_WQ_OP:
		return check_wq_op(m->wq_op, hdr, lim, true, why, wl);
	case TPW__V1__CLIENT_MSG__BODY_CTL:
		if (m->ctl->what <= TPW__V1__CTL_WHAT__CTL_UNSPECIFIED ||
		    m->ctl->what > TPW__V1__CTL_WHAT__CTL_QUEUES)
			return tpu_why(-EBADMSG, why, wl, "unknown control request %d",
				       (int)m->ctl->what);
		return 0;
	default:
		return tpu_why(-EBADMSG, why, wl, "unknown message type %d", (int)m->body_case);
	}
}

static int check_descriptor(const Tpw__V1__Descriptor *d, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t wl)
{
	uint64_t total = 0;

	if (d->n_payloads > lim->segments_max || d->n_tensors > lim->segments_max - d->n_payloads)
		return tpu_why(-E2BIG, why, wl, "descriptor with too many segments");
	for (size_t i = 0; i < d->n_payloads; i++)
		if (!tpu_add_u64(total, d->payloads[i]->length, &total))
			return tpu_why(-EBADMSG, why, wl, "descriptor length overflow");
	for (size_t i = 0; i < d->n_tensors; i++) {
		if (!tpu_add_u64(total, d->tensors[i]->length, &total))
			return tpu_why(-EBADMSG, why, wl, "descriptor length overflow");
		if (!device_valid(d->tensors[i]->device, false) ||
		    !device_valid(d->tensors[i]->target, true))
			return tpu_why(-EBADMSG, why, wl, "descriptor tensor %zu: bad device", i);
	}
	if (d->eager ? total != hdr->data_len : hdr->data_len != 0)
		return tpu_why(-EBADMSG, why, wl, "descriptor data tail of %u bytes, expected %llu",
			       hdr->data_len, (unsigned long long)(d->eager ? total : 0));
	return 0;
}

/* Whether @h (NUL-terminated) is a host a tpip:// address may name. */
static bool tpip_host_valid(const char *h, bool bracketed)
{
	char buf[TPW_TPIP_HOST_MAX + 1];
	unsigned char a[16];
	bool numeric = true;

	if (bracketed) {
		size_t n = strcspn(h, "%");
		if (n >= sizeof(buf) || (h[n] == '%' && !h[n + 1]))
			return false;
		memcpy(buf, h, n);
		buf[n] = '\0';
		return inet_pton(AF_INET6, buf, a) == 1;
	}
	for (const char *p = h; *p; p++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '-' || c == '_'))
			return false;
		if (c != '.' && (c < '0' || c > '9'))
			numeric = false;
	}
	return !numeric || inet_pton(AF_INET, h, a) == 1;
}

#define TPIP_FAIL(...)                                          \
	do {                                                    \
		if (why)                                        \
			snprintf(why, why_len, __VA_ARGS__);    \
		return -EINVAL;                                 \
	} while (0)

int tpw_tpip_parse(const char *a, uint16_t def_port, char *host, uint16_t *ret_port,
		   const char **ret_name, char *why, size_t why_len)
{
	const char *h, *slash, *hend, *pstart = NULL;
	unsigned long pv = def_port;
	bool bracketed = false;

	if (strncmp(a, "tpip://", 7) != 0)
		TPIP_FAIL("does not start with tpip://");
	h = a + 7;
	if (*h == '[') {
		hend = strchr(h, ']');
		if (!hend)
			TPIP_FAIL("'[' without ']'");
		h++;
		bracketed = true;
		if (hend[1] == ':')
			pstart = hend + 2;
		else if (hend[1] != '/')
			TPIP_FAIL("']' not followed by ':PORT' or '/NAME'");
	} else {
		hend = h + strcspn(h, ":/");
		if (*hend == ':')
			pstart = hend + 1;
	}
	slash = strchr(pstart ? pstart : hend, '/');
	if (!slash)
		TPIP_FAIL("no '/NAME' after the host");
	if (hend == h)
		TPIP_FAIL("no host");
	if ((size_t)(hend - h) > TPW_TPIP_HOST_MAX)
		TPIP_FAIL("host longer than %u bytes", TPW_TPIP_HOST_MAX);
	if (pstart) {
		char *end;
		errno = 0;
		pv = pstart[0] >= '0' && pstart[0] <= '9' ? strtoul(pstart, &end, 10) : 0;
		if (pstart[0] < '0' || pstart[0] > '9' || end != slash || errno || pv == 0 ||
		    pv > 65535)
			TPIP_FAIL("port '%.*s' is not a number from 1 to 65535",
				  (int)TPU_MIN((size_t)(slash - pstart), 16), pstart);
	}
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = '\0';
	if (!tpip_host_valid(host, bracketed))
		TPIP_FAIL(bracketed ? "'%.64s' is not an IPv6 address"
				    : "'%.64s' is not a host name or IPv4 address", host);
	if (!tpw_name_valid(slash + 1))
		TPIP_FAIL("'%.64s' is not a listener name (1 to 255 bytes of [A-Za-z0-9._@:+-])",
			  slash + 1);
	*ret_port = (uint16_t)pv;
	*ret_name = slash + 1;
	return 0;
}

/* A group over several hosts: the member hosts, host addresses and token (issue 24). */
static int check_group_hosts(const Tpw__V1__GroupJoined *j, char *why, size_t wl)
{
	if ((j->n_member_hosts && j->n_member_hosts != j->size) ||
	    (j->n_host_addrs && j->n_host_addrs != j->hosts) ||
	    (j->token.len && j->token.len != TPW_GROUP_TOKEN_BYTES))
		return tpu_why(-EBADMSG, why, wl, "group hosts out of range");
	for (size_t i = 0; i < j->n_member_hosts; i++)
		if (j->member_hosts[i] >= j->hosts)
			return tpu_why(-EBADMSG, why, wl, "member %zu on host %u of %u", i,
				       j->member_hosts[i], j->hosts);
	for (size_t i = 0; i < j->n_host_addrs; i++)
		if (check_string(j->host_addrs[i], TPW_GROUP_ADDR_MAX, "host address", why, wl) < 0)
			return -EBADMSG;
	return 0;
}

int tpw_daemon_msg_validate(const Tpw__V1__DaemonMsg *m, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t wl)
{
	if (hdr->nfds != 0)
		return tpu_why(-EBADMSG, why, wl, "unexpected fds from daemon");
	if (hdr->data_len && m->body_case != TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR &&
	    m->body_case != TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY &&
	    m->body_case != TPW__V1__DAEMON_MSG__BODY_WQ_REPLY)
		return tpu_why(-EBADMSG, why, wl, "data tail on a message that takes none");
	switch (m->body_case) {
	case TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR:
		return check_descriptor(m->descriptor, hdr, lim, why, wl);
	case TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY:
	case TPW__V1__DAEMON_MSG__BODY_REPLY:
	case TPW__V1__DAEMON_MSG__BODY_ACCEPTED:
	case TPW__V1__DAEMON_MSG__BODY_WRITE_DONE:
	case TPW__V1__DAEMON_MSG__BODY_READ_DONE:
	case TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED:
	case TPW__V1__DAEMON_MSG__BODY_CTL_REPLY:
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_SESSION_END:
		return check_string(m->session_end->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT:
		/* Room for at least one message, never more inline bytes than frames could carry. */
		if (m->flow_credit->messages == 0 ||
		    m->flow_credit->bytes > (uint64_t)m->flow_credit->messages * TPW_FRAME_MAX_HARD)
			return tpu_why(-EBADMSG, why, wl, "flow credit of %u messages, %llu bytes",
				       m->flow_credit->messages,
				       (unsigned long long)m->flow_credit->bytes);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_FLOW_RESUME:
		if (m->flow_resume->pipe_id == 0)
			return tpu_why(-EBADMSG, why, wl, "flow resume of pipe 0");
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY:
		if (check_chan_reply(m->chan_reply, hdr, lim) < 0)
			return tpu_why(-EBADMSG, why, wl, "channel answer's items do not match its "
				       "data tail");
		return check_string(m->chan_reply->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__DAEMON_MSG__BODY_WQ_REPLY:
		if (m->wq_reply->length != hdr->data_len || !wq_reply_msg_ok(m->wq_reply, true))
			return tpu_why(-EBADMSG, why, wl, "work queue answer's payload does not match "
				       "its data tail");
		return check_string(m->wq_reply->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__DAEMON_MSG__BODY_RING_XFER:
		return tpw_pring_xfer_check(m->ring_xfer, lim, why, wl);
	case TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED:
		if (check_string(m->group_joined->message, TPW_MESSAGE_MAX, "message", why, wl) < 0)
			return -EBADMSG;
		if (check_group_hosts(m->group_joined, why, wl) < 0)
			return -EBADMSG;
		return check_string(m->group_joined->arena_path, TPW_NAME_MAX, "arena path", why,
				    wl);
	default:
		return tpu_why(-EBADMSG, why, wl, "unknown message type %d", (int)m->body_case);
	}
}

static int check_bytes(const ProtobufCBinaryData *b, size_t want, const char *what, char *why,
		       size_t wl)
{
	if (b->len != want)
		return tpu_why(-EBADMSG, why, wl, "%s of %zu bytes, expected %zu", what, b->len,
			       want);
	return 0;
}

static int check_peer_hello(const Tpw__V1__PeerHello *h, char *why, size_t wl)
{
	int r = check_string(h->host, TPW_NAME_MAX, "host", why, wl);

	if (r < 0)
		return r;
	if (h->boot_id.len != 16 && h->boot_id.len != 0)
		return tpu_why(-EBADMSG, why, wl, "boot id of %zu bytes", h->boot_id.len);
	if (h->n_backends > 64)
		return tpu_why(-E2BIG, why, wl, "%zu backends", h->n_backends);
	for (size_t i = 0; i < h->n_backends; i++)
		if ((r = check_string(h->backends[i], 64, "backend", why, wl)) < 0)
			return r;
	if (h->data_conns > 16)
		return tpu_why(-EBADMSG, why, wl, "%u data connections", h->data_conns);
	/* Below it the daemon could send the peer no frame, not even a pong, and would log each
	 * one it holds back. */
	if (h->frame_max && h->frame_max < TPW_FRAME_MAX_MIN)
		return tpu_why(-EBADMSG, why, wl, "frame max of %u bytes (at least %u)",
			       h->frame_max, TPW_FRAME_MAX_MIN);
	if (h->nonce.len && (r = check_bytes(&h->nonce, 32, "nonce", why, wl)) < 0)
		return r;
	if (h->mac.len && (r = check_bytes(&h->mac, 32, "mac", why, wl)) < 0)
		return r;
	return check_string(h->message, TPW_MESSAGE_MAX, "message", why, wl);
}

/* cuda_gdr set-up: a bounded number of ports and queue-pair records of the layer's size. */
static int check_peer_rdma(const Tpw__V1__PeerRdma *r, char *why, size_t wl)
{
	if (r->ports > TPW_RDMA_PORTS_MAX)
		return tpu_why(-EBADMSG, why, wl, "%u RDMA ports", r->ports);
	if (r->n_qps > TPW_RDMA_PORTS_MAX * TPW_RDMA_PORTS_MAX)
		return tpu_why(-E2BIG, why, wl, "%zu queue-pair records", r->n_qps);
	for (size_t i = 0; i < r->n_qps; i++)
		if (r->qps[i].len != TPW_RDMA_QP_RECORD_BYTES)
			return tpu_why(-EBADMSG, why, wl, "queue-pair record of %zu bytes",
				       r->qps[i].len);
	if (r->n_rails && r->n_rails != r->ports)
		return tpu_why(-EBADMSG, why, wl, "%zu rails for %u ports", r->n_rails, r->ports);
	for (size_t i = 0; i < r->n_rails; i++)
		if (r->rails[i].len != TPW_RDMA_RAIL_BYTES)
			return tpu_why(-EBADMSG, why, wl, "rail of %zu bytes", r->rails[i].len);
	return check_string(r->error, TPW_MESSAGE_MAX, "error", why, wl);
}

/* Cross-host group joins (issue 24): names and sizes as for a client's GroupJoin. */
static int check_peer_group_join(const Tpw__V1__PeerGroupJoin *j, char *why, size_t wl)
{
	if (!j->name || !*j->name || strlen(j->name) > TPW_GROUP_NAME_MAX)
		return tpu_why(-EBADMSG, why, wl, "group name of 1..%u bytes", TPW_GROUP_NAME_MAX);
	if (j->size < 1 || j->size > TPW_GROUP_SIZE_MAX || j->rank < -1 ||
	    (j->rank >= 0 && (uint32_t)j->rank >= j->size))
		return tpu_why(-EBADMSG, why, wl, "rank %d of %u members", (int)j->rank, j->size);
	return check_remote(j->remote, j->remote_peers, j->n_remote_peers, why, wl);
}

/* A peer's answer to a batch read: at most segments_max byte items, inline, none empty, their
 * lengths adding up to the data tail exactly (that they are no more than the read asked for is
 * the forwarding daemon's check, chan/chanx.c). */
static int check_chan_batch(const Tpw__V1__ChanReply *cr, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t wl)
{
	uint64_t total = 0;

	if (cr->n_lengths > lim->segments_max || cr->remote_refs || cr->msg_desc ||
	    cr->msg_held || cr->msg_taken || cr->copied || cr->held_len || cr->xfer_id ||
	    cr->map_key || cr->map_off || cr->map_size || cr->map_fd || cr->n_map_offs ||
	    cr->n_retired)
		return tpu_why(-EBADMSG, why, wl, "peer channel answer of %zu items that is no "
			       "batch of inline items", cr->n_lengths);
	for (size_t i = 0; i < cr->n_lengths; i++) {
		if (cr->lengths[i] == 0 || cr->lengths[i] > hdr->data_len)
			return tpu_why(-EBADMSG, why, wl, "peer channel answer with an empty or "
				       "oversized item");
		total += cr->lengths[i]; /* each at most data_len (< 2^32): no wrap */
	}
	if (total != hdr->data_len)
		return tpu_why(-EBADMSG, why, wl, "peer channel answer's items do not match its "
			       "data tail");
	return check_string(cr->message, TPW_MESSAGE_MAX, "message", why, wl);
}

/*
 * A coordinator's answer: the membership in range and adding up as the coordinator computes it
 * (groupcoord.c): hosts numbered by their lowest rank (each host's first member brings the
 * next index, so every host has members), the member's own host where the list puts its rank,
 * its local size the members of that host, its local rank its place among them.
 */
static int check_peer_group_joined(const Tpw__V1__PeerGroupJoined *j, char *why, size_t wl)
{
	uint32_t next = 0, here = 0, below = 0;

	if (j->status != TPW__V1__STATUS__STATUS_OK)
		return check_string(j->message, TPW_MESSAGE_MAX, "message", why, wl);
	if (j->size < 1 || j->size > TPW_GROUP_SIZE_MAX || j->rank >= j->size ||
	    j->local_size < 1 || j->local_size > j->size || j->local_rank >= j->local_size ||
	    j->hosts < 1 || j->hosts > j->size || j->host_index >= j->hosts ||
	    j->n_members != j->size)
		return tpu_why(-EBADMSG, why, wl, "group membership out of range");
	for (size_t i = 0; i < j->n_members; i++) {
		uint32_t h = j->members[i]->host_index;

		if (j->members[i]->rank != i || h >= j->hosts || h > next)
			return tpu_why(-EBADMSG, why, wl, "member %zu out of range", i);
		if (check_string(j->members[i]->host, TPW_MESSAGE_MAX, "host", why, wl) < 0 ||
		    check_string(j->members[i]->peer, TPW_NAME_MAX, "peer", why, wl) < 0)
			return -EBADMSG;
		next += h == next;
		here += h == j->host_index;
		below += h == j->host_index && i < j->rank;
	}
	if (next != j->hosts || j->members[j->rank]->host_index != j->host_index ||
	    here != j->local_size || below != j->local_rank)
		return tpu_why(-EBADMSG, why, wl, "group membership does not add up: rank %u on "
			       "host %u of %u, local rank %u of %u", j->rank, j->host_index,
			       j->hosts, j->local_rank, j->local_size);
	if ((j->n_host_addrs && j->n_host_addrs != j->hosts) ||
	    (j->token.len && j->token.len != TPW_GROUP_TOKEN_BYTES))
		return tpu_why(-EBADMSG, why, wl, "group host addresses or token out of range");
	for (size_t i = 0; i < j->n_host_addrs; i++)
		if (check_string(j->host_addrs[i], TPW_GROUP_ADDR_MAX, "host address", why, wl) < 0)
			return -EBADMSG;
	return check_string(j->message, TPW_MESSAGE_MAX, "message", why, wl);
}

/* May @m carry a data tail? Descriptors, and channel and queue ops and answers with items. */
static bool peer_msg_has_data(const Tpw__V1__PeerMsg *m)
{
	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_DESCRIPTOR:
	case TPW__V1__PEER_MSG__BODY_CHAN_REPLY:
	case TPW__V1__PEER_MSG__BODY_WQ_REPLY:
		return true;
	case TPW__V1__PEER_MSG__BODY_CHAN_OP:
		return m->chan_op->op && m->chan_op->op->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	case TPW__V1__PEER_MSG__BODY_WQ_OP:
		return m->wq_op->op && (m->wq_op->op->op == TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT ||
					m->wq_op->op->op == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY);
	default:
		return false;
	}
}

/* Channel and work-queue ops and answers across hosts (issue 25 part xhost): the op or answer
 * present and valid as from a client, except that an OPEN or UNLINK names a plain name (never
 * an address; the hosting daemon decides on creation and unlink, chan.c) and no client-only
 * field is set; answers' items match the data tail. */
static int check_peer_xobj(const Tpw__V1__PeerMsg *m, const struct tpw_hdr *hdr,
			   const struct tpw_limits *lim, char *why, size_t wl)
{
	const Tpw__V1__ChanReply *cr;
	const Tpw__V1__WqReply *wr;
	int r;

	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_CHAN_OP:
		if (!m->chan_op->op)
			return tpu_why(-EBADMSG, why, wl, "peer channel op without op");
		return check_chan_op(m->chan_op->op, hdr, lim, false, why, wl);
	case TPW__V1__PEER_MSG__BODY_WQ_OP:
		if (!m->wq_op->op)
			return tpu_why(-EBADMSG, why, wl, "peer work queue op without op");
		r = check_wq_op(m->wq_op->op, hdr, lim, false, why, wl);
		if (r == 0 && m->wq_op->op->n_remote_peers &&
		    (m->wq_op->op->op != TPW__V1__WQ_OP_KIND__WQ_OP_OPEN || !m->wq_op->op->create))
			r = tpu_why(-EBADMSG, why, wl, "remote peers on a peer work queue op other "
				    "than a creation");
		return r;
	case TPW__V1__PEER_MSG__BODY_CHAN_REPLY:
		cr = m->chan_reply->reply;
		if (cr && cr->n_lengths > 1) /* a batch read's answer (peer minor >= 10) */
			return check_chan_batch(cr, hdr, lim, why, wl);
		if (!cr || cr->n_lengths > 1 || cr->remote_refs || (cr->msg_desc && !cr->msg_held) ||
		    cr->map_key || cr->map_off || cr->map_size || cr->map_fd || cr->n_map_offs ||
		    cr->n_retired || (cr->msg_held && (cr->n_lengths || cr->copied || cr->msg_taken)) ||
		    (cr->copied && (cr->n_lengths != 1 || cr->lengths[0] == 0 ||
				    cr->lengths[0] > CHAN_ITEM_MAX || hdr->data_len)) ||
		    (cr->held_len && (cr->n_lengths || cr->copied || hdr->data_len ||
				      cr->held_len > CHAN_ITEM_MAX)) ||
		    (cr->xfer_id && (cr->n_lengths || cr->copied || cr->held_len)) ||
		    (!cr->copied && (cr->n_lengths ? cr->lengths[0] : 0) != hdr->data_len))
			return tpu_why(-EBADMSG, why, wl, "peer channel answer's item does not "
				       "match its data tail");
		return check_string(cr->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_WQ_REPLY:
		wr = m->wq_reply->reply;
		if (!wr || wr->length != hdr->data_len || !wq_reply_msg_ok(wr, false))
			return tpu_why(-EBADMSG, why, wl, "peer work queue answer's payload does "
				       "not match its data tail");
		return check_string(wr->message, TPW_MESSAGE_MAX, "message", why, wl);
	default:
		return tpu_why(-EBADMSG, why, wl, "not a channel or queue message");
	}
}

int tpw_peer_msg_validate(const Tpw__V1__PeerMsg *m, const struct tpw_hdr *hdr,
			  const struct tpw_limits *lim, char *why, size_t wl)
{
	if (hdr->nfds != 0)
		return tpu_why(-EBADMSG, why, wl, "fds on a peer connection");
	if (hdr->data_len && !peer_msg_has_data(m))
		return tpu_why(-EBADMSG, why, wl, "data tail on a message that takes none");
	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_CHAN_OP:
	case TPW__V1__PEER_MSG__BODY_CHAN_REPLY:
	case TPW__V1__PEER_MSG__BODY_WQ_OP:
	case TPW__V1__PEER_MSG__BODY_WQ_REPLY:
		return check_peer_xobj(m, hdr, lim, why, wl);
	case TPW__V1__PEER_MSG__BODY_HELLO:
		return check_peer_hello(m->hello, why, wl);
	case TPW__V1__PEER_MSG__BODY_AUTH:
		return check_bytes(&m->auth->mac, 32, "mac", why, wl);
	case TPW__V1__PEER_MSG__BODY_READY:
		return check_string(m->ready->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_DATA_HELLO:
		if (m->data_hello->mac.len)
			return check_bytes(&m->data_hello->mac, 32, "mac", why, wl);
		return 0;
	case TPW__V1__PEER_MSG__BODY_CONNECT:
		if (!tpw_name_valid(m->connect->name))
			return tpu_why(-EBADMSG, why, wl, "invalid listener name");
		if (m->connect->wait_ms > TPW_PEER_WAIT_MS_MAX)
			return tpu_why(-EBADMSG, why, wl, "connect wait of %u ms (at most %u)",
				       m->connect->wait_ms, TPW_PEER_WAIT_MS_MAX);
		return check_string(m->connect->remote_name, TPW_NAME_MAX, "remote name", why, wl);
	case TPW__V1__PEER_MSG__BODY_CONNECT_REPLY:
		return check_string(m->connect_reply->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_DESCRIPTOR:
		if (!m->descriptor->descriptor)
			return tpu_why(-EBADMSG, why, wl, "peer descriptor without descriptor");
		if (m->descriptor->descriptor->metadata.len > lim->metadata_max)
			return tpu_why(-EMSGSIZE, why, wl, "descriptor metadata too large");
		return check_descriptor(m->descriptor->descriptor, hdr, lim, why, wl);
	case TPW__V1__PEER_MSG__BODY_BCAST:
		if (!m->bcast->descriptor)
			return tpu_why(-EBADMSG, why, wl, "peer broadcast without descriptor");
		if (m->bcast->descriptor->eager || hdr->data_len)
			return tpu_why(-EBADMSG, why, wl, "eager peer broadcast");
		if (m->bcast->n_targets == 0 || m->bcast->n_targets > TPW_BCAST_TARGETS_MAX)
			return tpu_why(-E2BIG, why, wl, "peer broadcast to %zu pipes (1..%u)",
				       m->bcast->n_targets, TPW_BCAST_TARGETS_MAX);
		if (m->bcast->descriptor->metadata.len > lim->metadata_max)
			return tpu_why(-EMSGSIZE, why, wl, "descriptor metadata too large");
		return check_descriptor(m->bcast->descriptor, hdr, lim, why, wl);
	case TPW__V1__PEER_MSG__BODY_XFER_END:
		return check_string(m->xfer_end->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_CHAN_XFER_END:
		return check_string(m->chan_xfer_end->message, TPW_MESSAGE_MAX, "message", why,
				    wl);
	case TPW__V1__PEER_MSG__BODY_CONSUMED:
		return check_string(m->consumed->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_PIPE_CLOSE:
		return check_string(m->pipe_close->message, TPW_MESSAGE_MAX, "message", why, wl);
	case TPW__V1__PEER_MSG__BODY_READ_REQ:
		if (m->read_req->n_rdma > lim->segments_max)
			return tpu_why(-E2BIG, why, wl, "RDMA offer of %zu regions",
				       m->read_req->n_rdma);
		return 0;
	case TPW__V1__PEER_MSG__BODY_RDMA:
		return check_peer_rdma(m->rdma, why, wl);
	case TPW__V1__PEER_MSG__BODY_PING:
		return 0;
	case TPW__V1__PEER_MSG__BODY_GROUP_JOIN:
		return check_peer_group_join(m->group_join, why, wl);
	case TPW__V1__PEER_MSG__BODY_GROUP_JOINED:
		return check_peer_group_joined(m->group_joined, why, wl);
	case TPW__V1__PEER_MSG__BODY_GROUP_GONE:
		return check_string(m->group_gone->message, TPW_MESSAGE_MAX, "message", why, wl);
	default:
		return tpu_why(-EBADMSG, why, wl, "unknown peer message type %d",
			       (int)m->body_case);
	}
}

static const struct {
	Tpw__V1__Status status;
	int err;
	const char *name;
} status_map[] = {
	{ TPW__V1__STATUS__STATUS_OK, 0, "ok" },
	{ TPW__V1__STATUS__STATUS_INVALID, EINVAL, "invalid" },
	{ TPW__V1__STATUS__STATUS_NOT_FOUND, ENOENT, "not-found" },
	{ TPW__V1__STATUS__STATUS_EXISTS, EADDRINUSE, "exists" },
	{ TPW__V1__STATUS__STATUS_PERMISSION, EACCES, "permission" },
	{ TPW__V1__STATUS__STATUS_LIMIT, ENOBUFS, "limit" },
	{ TPW__V1__STATUS__STATUS_TOO_BIG, EMSGSIZE, "too-big" },
	{ TPW__V1__STATUS__STATUS_CLOSED, EPIPE, "closed" },
	{ TPW__V1__STATUS__STATUS_PEER_DIED, ECONNRESET, "peer-died" },
	{ TPW__V1__STATUS__STATUS_CANCELED, ECANCELED, "canceled" },
	{ TPW__V1__STATUS__STATUS_RANGE, ERANGE, "range" },
	{ TPW__V1__STATUS__STATUS_IO, EIO, "io" },
	{ TPW__V1__STATUS__STATUS_UNSUPPORTED, EOPNOTSUPP, "unsupported" },
	{ TPW__V1__STATUS__STATUS_VERSION, EPROTONOSUPPORT, "version" },
	{ TPW__V1__STATUS__STATUS_FAULT, EFAULT, "fault" },
	{ TPW__V1__STATUS__STATUS_TIMEOUT, ETIMEDOUT, "timeout" },
	{ TPW__V1__STATUS__STATUS_SHUTDOWN, ESHUTDOWN, "shutdown" },
	{ TPW__V1__STATUS__STATUS_BUSY, EBUSY, "busy" },
	{ TPW__V1__STATUS__STATUS_REFUSED, ECONNREFUSED, "refused" },
	{ TPW__V1__STATUS__STATUS_UNREACHABLE, EHOSTUNREACH, "unreachable" },
	{ TPW__V1__STATUS__STATUS_ADMIN_CLOSED, ECONNABORTED, "admin-closed" },
};

int tpw_status_to_errno(Tpw__V1__Status s)
{
	for (size_t i = 0; i < sizeof(status_map) / sizeof(status_map[0]); i++)
		if (status_map[i].status == s)
			return -status_map[i].err;
	return -EIO;
}

Tpw__V1__Status tpw_status_from_errno(int err)
{
	if (err < 0)
		err = -err;
	for (size_t i = 0; i < sizeof(status_map) / sizeof(status_map[0]); i++)
		if (status_map[i].err == err)
			return status_map[i].status;
	if (err == ESRCH || err == EPERM)
		return TPW__V1__STATUS__STATUS_FAULT;
	if (err == E2BIG)
		return TPW__V1__STATUS__STATUS_LIMIT;
	if (err == EBADMSG)
		return TPW__V1__STATUS__STATUS_INVALID;
	return TPW__V1__STATUS__STATUS_IO;
}

const char *tpw_status_name(Tpw__V1__Status s)
{
	for (size_t i = 0; i < sizeof(status_map) / sizeof(status_map[0]); i++)
		if (status_map[i].status == s)
			return status_map[i].name;
	return "unknown";
}
