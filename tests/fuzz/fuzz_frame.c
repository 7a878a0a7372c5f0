/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the wire: one input is one frame (24-byte header, protobuf message,
 * data tail). It goes through header parse, bounded unpack and validation as the daemon would
 * see it (ClientMsg) and as the library would (DaemonMsg). On top of "no crash, no leak", it
 * checks that whatever validation accepts is safe to use: inline segments lie inside the data
 * tail and an eager descriptor's lengths add up to its tail. Built with -fsanitize=fuzzer only
 * by clang; replay_frame.c runs the same function over the committed corpus in every build.
 */
#include <stdbool.h>
#include <stdlib.h>
#include "fuzz_frame.h"
#include "validate.h"

/* Touches every byte of [off, off + len) in the tail; aborts if validation let it escape. */
static unsigned touch(const uint8_t *tail, uint32_t tail_len, uint64_t off, uint64_t len)
{
	unsigned sum = 0;

	if (off > tail_len || len > tail_len - off)
		abort();
	for (uint64_t i = 0; i < len; i++)
		sum += tail[off + i];
	return sum;
}

static void use_write(const Tpw__V1__Write *w, const uint8_t *tail, uint32_t tail_len)
{
	volatile unsigned sink = 0;

	for (size_t i = 0; i < w->n_payloads + w->n_tensors; i++) {
		const Tpw__V1__Segment *s = i < w->n_payloads ? w->payloads[i]->data :
								w->tensors[i - w->n_payloads]->data;
		if (s->loc_case == TPW__V1__SEGMENT__LOC_INLINE_OFF)
			sink += touch(tail, tail_len, s->inline_off, s->length);
	}
	(void)sink;
}

static void use_descriptor(const Tpw__V1__Descriptor *d, uint32_t tail_len)
{
	uint64_t total = 0;

	if (!d->eager)
		return;
	for (size_t i = 0; i < d->n_payloads; i++)
		total += d->payloads[i]->length;
	for (size_t i = 0; i < d->n_tensors; i++)
		total += d->tensors[i]->length;
	if (total != tail_len)
		abort();
}

/* Channel items carried in a data tail, a write's or an answer's: validation let them through
 * only if the ones not sent by other means (@streamed, a flag per item, may be NULL) add up to
 * the tail exactly, each within it. */
static void use_chan_items(const uint64_t *lengths, size_t n, const protobuf_c_boolean *streamed,
			   size_t n_streamed, uint32_t tail_len)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		if (i < n_streamed && streamed[i])
			continue;
		if (lengths[i] > tail_len)
			abort();
		total += lengths[i];
	}
	if (total != tail_len)
		abort();
}

/* A channel op: only a write carries a tail, its inline items (each an inline segment where
 * the write names segments) and nothing else. */
static void use_chan_op(const Tpw__V1__ChanOp *o, uint32_t tail_len)
{
	uint64_t inl = 0;

	if (o->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE) {
		if (tail_len)
			abort();
		return;
	}
	if (!o->n_segments) {
		use_chan_items(o->lengths, o->n_lengths, o->streamed, o->n_streamed, tail_len);
		return;
	}
	for (size_t i = 0; i < o->n_segments; i++) {
		const Tpw__V1__Segment *g = o->segments[i];

		if (g->loc_case != TPW__V1__SEGMENT__LOC_INLINE_OFF)
			continue;
		if (g->inline_off != inl || g->length > tail_len - inl)
			abort();
		inl += g->length;
	}
	if (inl != tail_len)
		abort();
}

/* An answer with items in its tail, or none: one copied, held, mapped or taken carries none. */
static void use_chan_reply(const Tpw__V1__ChanReply *r, uint32_t tail_len)
{
	if (!r->copied && !r->held_len && !r->msg_held && !r->map_key)
		use_chan_items(r->lengths, r->n_lengths, NULL, 0, tail_len);
	else if (tail_len)
		abort();
}

/* A channel write's message descriptors (checked by the daemon's handler, not by frame
 * validation): one the check accepts adds up to its item exactly. */
static void use_chan_msgs(const Tpw__V1__ChanOp *o, const struct tpw_limits *lim)
{
	char why[256];

	if (o->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE || o->n_msgs != o->n_lengths)
		return;
	for (size_t i = 0; i < o->n_msgs; i++) {
		const Tpw__V1__Descriptor *d = o->msgs[i];
		uint64_t total = 0;

		if (tpw_chan_msg_check(d, o->lengths[i], lim, why, sizeof(why)) < 0)
			continue;
		if (d->n_payloads + d->n_tensors > lim->segments_max)
			abort();
		for (size_t k = 0; k < d->n_payloads; k++)
			total += d->payloads[k]->length;
		for (size_t k = 0; k < d->n_tensors; k++)
			total += d->tensors[k]->length;
		if (total != o->lengths[i])
			abort();
	}
}

static bool check_client(const struct tpw_hdr *h, const uint8_t *msg, const uint8_t *tail,
			 const struct tpw_limits *lim)
{
	Tpw__V1__ClientMsg *m = NULL;
	char why[256];
	bool ok;

	if (tpw_client_msg_unpack(msg, h->msg_len, &m) < 0)
		return false;
	ok = tpw_client_msg_validate(m, h, lim, why, sizeof(why)) == 0;
	if (ok && m->body_case == TPW__V1__CLIENT_MSG__BODY_WRITE)
		use_write(m->write, tail, h->data_len);
	if (ok && m->body_case == TPW__V1__CLIENT_MSG__BODY_CHAN_OP) {
		use_chan_msgs(m->chan_op, lim);
		use_chan_op(m->chan_op, h->data_len);
	}
	tpw_client_msg_free(m);
	return ok;
}

static bool check_daemon(const struct tpw_hdr *h, const uint8_t *msg,
			 const struct tpw_limits *lim)
{
	Tpw__V1__DaemonMsg *m = NULL;
	char why[256];
	bool ok;

	if (tpw_daemon_msg_unpack(msg, h->msg_len, &m) < 0)
		return false;
	ok = tpw_daemon_msg_validate(m, h, lim, why, sizeof(why)) == 0;
	if (ok && m->body_case == TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR)
		use_descriptor(m->descriptor, h->data_len);
	if (ok && m->body_case == TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY)
		use_chan_reply(m->chan_reply, h->data_len);
	tpw_daemon_msg_free(m);
	return ok;
}

/* A fixed-size field the daemon copies: validation must have left it empty or exact. */
static void exact_or_empty(const ProtobufCBinaryData *b, size_t want)
{
	if (b->len != 0 && b->len != want)
		abort();
}

static void use_peer(const Tpw__V1__PeerMsg *m, uint32_t tail_len)
{
	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_HELLO:
		exact_or_empty(&m->hello->boot_id, 16);
		exact_or_empty(&m->hello->nonce, 32);
		exact_or_empty(&m->hello->mac, 32);
		if (m->hello->data_conns > 16)
			abort();
		break;
	case TPW__V1__PEER_MSG__BODY_AUTH:
		if (m->auth->mac.len != 32)
			abort();
		break;
	case TPW__V1__PEER_MSG__BODY_DATA_HELLO:
		exact_or_empty(&m->data_hello->mac, 32);
		break;
	case TPW__V1__PEER_MSG__BODY_DESCRIPTOR:
		use_descriptor(m->descriptor->descriptor, tail_len);
		break;
	case TPW__V1__PEER_MSG__BODY_RDMA:
		for (size_t i = 0; i < m->rdma->n_qps; i++)
			if (m->rdma->qps[i].len != TPW_RDMA_QP_RECORD_BYTES)
				abort();
		break;
	case TPW__V1__PEER_MSG__BODY_CHAN_OP:
		use_chan_op(m->chan_op->op, tail_len);
		break;
	case TPW__V1__PEER_MSG__BODY_CHAN_REPLY:
		use_chan_reply(m->chan_reply->reply, tail_len);
		break;
	case TPW__V1__PEER_MSG__BODY_WQ_REPLY:
		if (m->wq_reply->reply->length != tail_len)
			abort();
		break;
	case TPW__V1__PEER_MSG__BODY_WQ_OP:
		break; /* a work queue payload: its length checked against the tail */
	default:
		if (tail_len)
			abort(); /* only a descriptor, channel items or a work queue payload */
		break;
	}
}

static bool check_peer(const struct tpw_hdr *h, const uint8_t *msg, const struct tpw_limits *lim)
{
	Tpw__V1__PeerMsg *m = NULL;
	char why[256];
	bool ok;

	if (tpw_peer_msg_unpack(msg, h->msg_len, &m) < 0)
		return false;
	ok = tpw_peer_msg_validate(m, h, lim, why, sizeof(why)) == 0;
	if (ok)
		use_peer(m, h->data_len);
	tpw_peer_msg_free(m);
	return ok;
}

unsigned fuzz_frame_check(const uint8_t *data, size_t size)
{
	struct tpw_limits lim;
	struct tpw_hdr h;
	size_t body;
	unsigned res = 0;

	tpw_limits_default(&lim);
	if (size < TPW_HDR_SIZE || tpw_hdr_parse(data, lim.frame_max, &h) < 0)
		return 0;
	body = size - TPW_HDR_SIZE;
	/* A frame is exactly header + message + tail; shorter input is a cut stream. */
	if (h.msg_len > body || h.data_len != body - h.msg_len)
		return 0;
	if (check_client(&h, data + TPW_HDR_SIZE, data + TPW_HDR_SIZE + h.msg_len, &lim))
		res |= FUZZ_CLIENT_OK;
	if (check_daemon(&h, data + TPW_HDR_SIZE, &lim))
		res |= FUZZ_DAEMON_OK;
	if (check_peer(&h, data + TPW_HDR_SIZE, &lim))
		res |= FUZZ_PEER_OK;
	return res;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_frame_check(data, size);
	return 0;
}
