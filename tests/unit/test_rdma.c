/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/rdma (rdma and cuda_gdr): the context the daemon gives a
 * configuration, its event fd and progress call, and, where an RDMA port is viable (the
 * fakeverbs stand-in: the hw suite runs this binary again with $TPIPD_VERBS_LIBRARY), two
 * contexts of this process wired back to back as two daemons: link set-up, an offer, RDMA
 * writes from one shared buffer into another, the registration cache, and a cancel. Everything
 * is driven by polling the event fds, as the daemon's loop does. Without a port the cases that
 * need one return at once (their reason is the registry's).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "buffer.h"
#include "rdma/rdma.h"
#include "tpb.h"
#include "tpu.h"

#define DEADLINE_MS 10000
#define BUF_BYTES (4u << 20)

/* One side ("daemon") of the back-to-back pair: its context, its link, what its peer sent. */
struct side {
	struct tpb_rdma *g;
	struct tpb_rdma_link *l;
	struct side *peer;
	struct tpb_rdma_setup inbox[4]; /* set-up steps the peer sent, not delivered yet */
	uint8_t *qps[4], *rails[4];
	struct tpb_rdma_record *recs[4], *rail_recs[4];
	char errors[4][200];
	size_t n_inbox;
};

static int side_send(void *link, const struct tpb_rdma_setup *m)
{
	struct side *to = ((struct side *)link)->peer;
	size_t k = to->n_inbox++;

	ck_assert_uint_lt(k, TPU_ARRAY_SIZE(to->inbox));
	to->inbox[k] = *m;
	to->qps[k] = calloc(m->n_qps ? m->n_qps : 1, TPB_RDMA_QP_RECORD_BYTES);
	to->recs[k] = calloc(m->n_qps ? m->n_qps : 1, sizeof(*to->recs[k]));
	for (size_t i = 0; i < m->n_qps; i++) {
		ck_assert_uint_eq(m->qps[i].len, TPB_RDMA_QP_RECORD_BYTES);
		memcpy(to->qps[k] + i * TPB_RDMA_QP_RECORD_BYTES, m->qps[i].data, m->qps[i].len);
		to->recs[k][i] = (struct tpb_rdma_record){
			to->qps[k] + i * TPB_RDMA_QP_RECORD_BYTES, TPB_RDMA_QP_RECORD_BYTES };
	}
	to->inbox[k].qps = to->recs[k];
	to->rails[k] = calloc(m->n_rails ? m->n_rails : 1, TPB_RDMA_RAIL_BYTES);
	to->rail_recs[k] = calloc(m->n_rails ? m->n_rails : 1, sizeof(*to->rail_recs[k]));
	for (size_t i = 0; i < m->n_rails; i++) {
		ck_assert_uint_eq(m->rails[i].len, TPB_RDMA_RAIL_BYTES);
		memcpy(to->rails[k] + i * TPB_RDMA_RAIL_BYTES, m->rails[i].data, m->rails[i].len);
		to->rail_recs[k][i] = (struct tpb_rdma_record){
			to->rails[k] + i * TPB_RDMA_RAIL_BYTES, TPB_RDMA_RAIL_BYTES };
	}
	to->inbox[k].rails = to->rail_recs[k];
	snprintf(to->errors[k], sizeof(to->errors[k]), "%s", m->error ? m->error : "");
	to->inbox[k].error = to->errors[k];
	return 0;
}

static const char *side_name(const void *link)
{
	return "loopback";
}

static const struct tpb_rdma_link_ops link_ops = { .send = side_send, .name = side_name };

static struct tpb_rdma_config config(bool disabled, uint64_t cache)
{
	return (struct tpb_rdma_config){ .disabled = disabled, .cache_bytes = cache,
					 .ports_max = 32, .link_ops = &link_ops };
}

/* Hands each side the set-up steps its peer sent (in order; a step may send another). */
static void deliver(struct side *s)
{
	for (size_t k = 0; k < s->n_inbox; k++) {
		tpb_rdma_link_on_msg(s->l, &s->inbox[k]);
		free(s->qps[k]);
		free(s->recs[k]);
		free(s->rails[k]);
		free(s->rail_recs[k]);
	}
	s->n_inbox = 0;
}

/* Polls both event fds and runs progress until *@flag, or fails at the deadline. */
static void run_until(struct side *a, struct side *b, const bool *flag)
{
	uint64_t end = tpu_now_ns() + DEADLINE_MS * 1000000ull;

	while (!*flag) {
		struct pollfd pfd[2] = { { .fd = tpb_rdma_event_fd(a->g), .events = POLLIN },
					 { .fd = tpb_rdma_event_fd(b->g), .events = POLLIN } };
		uint64_t now = tpu_now_ns();

		ck_assert_msg(now < end, "nothing completed within %d ms", DEADLINE_MS);
		ck_assert_int_ge(poll(pfd, 2, (int)((end - now) / 1000000u) + 1), 0);
		ck_assert_int_eq(tpb_rdma_progress(a->g), 0);
		ck_assert_int_eq(tpb_rdma_progress(b->g), 0);
	}
}

/* True where the registry found an RDMA port (the stand-in's, under the hw suite). */
static bool rdma_here(void)
{
	struct tpb_config cfg = { 0 };
	char why[128];

	tpb_registry_init(&cfg);
	return tpb_rdma_viable(why, sizeof(why)) == 1;
}

START_TEST(test_rdma_turned_off_offers_nothing_and_progress_is_idle)
{
	struct tpb_rdma_config cfg = config(true, 0);
	struct tpb_rdma_cache_stats st;
	struct tpb_rdma *g;
	struct side s = { 0 };
	int fd;

	tpb_registry_init(&(struct tpb_config){ 0 });
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &g), 0);
	ck_assert_uint_eq(tpb_rdma_offers(g), 0);
	ck_assert_ptr_null(tpb_rdma_link_new(g, &s, TPB_RDMA_HOST | TPB_RDMA_CUDA));
	fd = tpb_rdma_event_fd(g);
	if (fd != -EOPNOTSUPP) { /* built with RDMA: an fd that stays quiet */
		struct pollfd pfd = { .fd = fd, .events = POLLIN };

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(poll(&pfd, 1, 0), 0);
		ck_assert_int_eq(tpb_rdma_progress(g), 0);
	}
	tpb_rdma_cache_stats(g, &st);
	ck_assert_uint_eq(st.regions + st.bytes + st.hits + st.misses + st.evictions, 0);
	tpb_rdma_forget_cuda(g);
	tpb_rdma_forget_buffer(NULL, NULL);
	tpb_rdma_ctx_free(g);
	tpb_rdma_ctx_free(NULL);
}
END_TEST

START_TEST(test_rdma_channel_is_cuda_gdr_with_cuda_memory_on_either_side)
{
	struct tpb_rdma_region host = { .length = 1 }, dev = { .length = 1, .cuda = true };
	struct tpb_rdma_offer of_host = { .n = 1, .regions = &host };
	struct tpb_rdma_offer of_dev = { .n = 1, .regions = &dev };

	ck_assert_str_eq(tpb_rdma_channel(false, NULL, false), "rdma");
	ck_assert_str_eq(tpb_rdma_channel(false, &of_host, false), "rdma");
	ck_assert_str_eq(tpb_rdma_channel(true, &of_host, false), "cuda_gdr");
	ck_assert_str_eq(tpb_rdma_channel(false, &of_dev, false), "cuda_gdr");
	ck_assert_str_eq(tpb_rdma_channel(false, NULL, true), "cuda_gdr");
}
END_TEST

static bool recv_ready;
static int recv_err;

static void on_ready(void *arg, int err, const char *why)
{
	recv_ready = true;
	recv_err = err;
}

static bool send_done;

static void on_done(struct tpb_rdma_xfer *x)
{
	send_done = true;
}

static void pair_up_cfg(struct side *a, struct side *b, const struct tpb_rdma_config *c);

/* Two contexts of this process, linked back to back and ready. */
static void pair_up(struct side *a, struct side *b, uint64_t cache)
{
	struct tpb_rdma_config cfg = config(false, cache);

	pair_up_cfg(a, b, &cfg);
}

/* pair_up() with the configuration @c. */
static void pair_up_cfg(struct side *a, struct side *b, const struct tpb_rdma_config *c)
{
	struct tpb_rdma_config cfg = *c;

	a->peer = b;
	b->peer = a;
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &a->g), 0);
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &b->g), 0);
	ck_assert_uint_ne(tpb_rdma_offers(a->g) & TPB_RDMA_HOST, 0);
	a->l = tpb_rdma_link_new(a->g, a, TPB_RDMA_HOST);
	b->l = tpb_rdma_link_new(b->g, b, TPB_RDMA_HOST);
	ck_assert_ptr_nonnull(a->l);
	ck_assert_ptr_nonnull(b->l);
	while (a->n_inbox || b->n_inbox) { /* ports, then queue-pair records */
		deliver(a);
		deliver(b);
	}
	ck_assert_msg(tpb_rdma_link_ready(a->l), "a: %s", tpb_rdma_link_state(a->l));
	ck_assert_msg(tpb_rdma_link_ready(b->l), "b: %s", tpb_rdma_link_state(b->l));
	ck_assert_ptr_nonnull(strstr(tpb_rdma_link_state(a->l), "ready"));
}

/* Drops the set-up steps @s was sent and never handed over. */
static void inbox_drop(struct side *s)
{
	for (size_t k = 0; k < s->n_inbox; k++) {
		free(s->qps[k]);
		free(s->recs[k]);
		free(s->rails[k]);
		free(s->rail_recs[k]);
	}
	s->n_inbox = 0;
}

static void pair_down(struct side *a, struct side *b)
{
	inbox_drop(a);
	inbox_drop(b);
	tpb_rdma_link_free(a->l);
	tpb_rdma_link_free(b->l);
	tpb_rdma_ctx_free(a->g);
	tpb_rdma_ctx_free(b->g);
}

/* One transfer of @len bytes at @off from @src into @dst (same offset); its status. */
static int transfer(struct side *a, struct side *b, struct tpb_buffer *src, struct tpb_buffer *dst,
		    uint64_t off, uint64_t len, bool cancel)
{
	struct tpb_rdma_seg rs = { .mem = { .loc = TPB_LOC_LOCAL,
					    .addr = (uint64_t)(uintptr_t)(dst->map + off) },
				   .len = len, .buf = dst };
	struct tpb_rdma_seg ss = { .mem = { .loc = TPB_LOC_LOCAL,
					    .addr = (uint64_t)(uintptr_t)(src->map + off) },
				   .len = len, .buf = src };
	struct tpb_rdma_xfer x = { .segs = &ss, .n_segs = 1, .done = on_done };
	struct tpb_rdma_recv *rv;
	struct tpb_rdma_offer of;
	char why[160] = "";

	recv_ready = send_done = false;
	ck_assert_int_eq(tpb_rdma_recv_new(b->l, &rs, 1, false, on_ready, NULL, &rv, why,
					   sizeof(why)), 0);
	ck_assert(!recv_ready); /* never inside the call */
	run_until(a, b, &recv_ready);
	ck_assert_int_eq(recv_err, 0);
	tpb_rdma_recv_offer(rv, &of);
	ck_assert_uint_eq(of.n, 1);
	ck_assert_uint_eq(of.regions[0].length, len);
	ck_assert_int_eq(tpb_rdma_send(a->l, &x, &of, why, sizeof(why)), 0);
	ck_assert(!send_done);
	if (cancel)
		tpb_rdma_send_cancel(a->l, &x);
	run_until(a, b, &send_done);
	tpb_rdma_recv_free(rv);
	if (x.status == 0) {
		ck_assert_uint_eq(x.bytes, len);
		ck_assert_uint_eq(x.total, len);
	} else {
		ck_assert_uint_eq(x.bytes, 0);
	}
	return x.status;
}

static struct tpb_buffer *buffer(uint8_t fill)
{
	struct tpb_buffer *b = calloc(1, sizeof(*b));

	atomic_init(&b->refs, 1); /* the session's */
	b->size = BUF_BYTES;
	b->map = malloc(BUF_BYTES);
	memset(b->map, fill, BUF_BYTES);
	return b;
}

START_TEST(test_rdma_back_to_back_writes_cache_and_cancel)
{
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src, *dst;
	struct tpb_rdma_cache_stats st;

	if (!rdma_here())
		return; /* no RDMA port: the hw suite runs this again on the stand-in */
	src = buffer(0xab);
	dst = buffer(0);
	pair_up(&a, &b, 64u << 20);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 4096, 1u << 20, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4095], 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096], 0xab);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096 + (1u << 20) - 1], 0xab);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096 + (1u << 20)], 0);
	/* The regions stayed registered: the next transfer in the same 2 MiB step finds them. */
	tpb_rdma_cache_stats(b.g, &st);
	ck_assert_uint_eq(st.regions, 1);
	ck_assert_uint_eq(dst->refs, 2); /* the session's and the cache's */
	ck_assert_int_eq(transfer(&a, &b, src, dst, 8192, 4096, false), 0);
	tpb_rdma_cache_stats(b.g, &st);
	ck_assert_uint_ge(st.hits, 1);
	/* Canceled before the first write was posted: nothing is written. */
	memset(src->map, 0xcd, BUF_BYTES);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, true), -ECANCELED);
	ck_assert_uint_eq(((uint8_t *)dst->map)[0], 0);
	/* The client lets go of its buffers: the cache drops its references (by buffer, and by
	 * memory through the op table's forget). */
	tpb_rdma_forget_buffer(b.g, dst);
	ck_assert_int_eq(tpb_forget(tpb_rdma_ctx(a.g), &(struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					   .addr = (uint64_t)(uintptr_t)src->map + 8192 }, 1), 0);
	ck_assert_uint_eq(dst->refs, 1);
	ck_assert_uint_eq(src->refs, 1);
	tpb_rdma_cache_stats(b.g, &st);
	ck_assert_uint_eq(st.regions, 0);
	pair_down(&a, &b);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_rdma_link_free_completes_running_sends_with_econnreset)
{
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src;
	struct tpb_rdma_seg ss;
	struct tpb_rdma_region reg = { .length = 4096 };
	struct tpb_rdma_offer of = { .port = 0, .n = 1, .regions = &reg };
	struct tpb_rdma_xfer x = { .segs = &ss, .n_segs = 1, .done = on_done };
	char why[160];

	if (!rdma_here())
		return;
	src = buffer(1);
	ss = (struct tpb_rdma_seg){ .mem = { .loc = TPB_LOC_LOCAL,
					     .addr = (uint64_t)(uintptr_t)src->map },
				    .len = 4096, .buf = src };
	pair_up(&a, &b, 0);
	send_done = false;
	ck_assert_int_eq(tpb_rdma_send(a.l, &x, &of, why, sizeof(why)), 0);
	tpb_rdma_link_free(a.l);
	a.l = NULL;
	ck_assert(send_done);
	ck_assert_int_eq(x.status, -ECONNRESET);
	ck_assert_uint_eq(src->refs, 1); /* rdma-cache 0: nothing kept */
	pair_down(&a, &b);
	free(src->map);
	free(src);
}
END_TEST

static bool op_finished;

static void on_op_done(struct tpb_op *op)
{
	op_finished = true;
}

/* A send through the link's endpoint in the op table: start, completion from progress only,
 * cancel, and the offers start refuses. */
START_TEST(test_rdma_send_through_the_op_table)
{
	struct side a = { 0 }, b = { 0 }, nobody = { 0 };
	struct tpb_buffer *src, *dst;
	struct tpb_rdma_seg rs;
	struct tpb_rdma_recv *rv;
	struct tpb_rdma_offer of;
	struct tpb_ep *ep = NULL;
	struct tpb_xfer x;
	struct tpb_op op;
	uint8_t offer[TPB_RDMA_OFFER_HDR + TPB_RDMA_OFFER_REGION];
	char why[160];

	if (!rdma_here())
		return;
	src = buffer(0x5a);
	dst = buffer(0);
	pair_up(&a, &b, 0);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), NULL, &ep), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), &(struct tpb_peer){ .link = &nobody }, &ep),
			 -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), &(struct tpb_peer){ .link = &a }, &ep), 0);
	ck_assert_ptr_eq(ep, tpb_rdma_link_ep(a.l));
	rs = (struct tpb_rdma_seg){ .mem = { .loc = TPB_LOC_LOCAL,
					     .addr = (uint64_t)(uintptr_t)dst->map },
				    .len = 65537, .buf = dst };
	recv_ready = false;
	ck_assert_int_eq(tpb_rdma_recv_new(b.l, &rs, 1, false, on_ready, NULL, &rv, why,
					   sizeof(why)), 0);
	run_until(&a, &b, &recv_ready);
	tpb_rdma_recv_offer(rv, &of);
	ck_assert_uint_eq(tpb_rdma_offer_size(of.n), sizeof(offer));
	ck_assert_int_eq(tpb_rdma_offer_encode(&of, offer, sizeof(offer) - 1), -ENOBUFS);
	ck_assert_int_eq(tpb_rdma_offer_encode(&of, offer, sizeof(offer)), (int)sizeof(offer));
	x = (struct tpb_xfer){ .src = { .loc = TPB_LOC_LOCAL, .buf = src,
					.addr = (uint64_t)(uintptr_t)src->map },
			       .dst = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
			       .len = 65537 };
	/* An offer cut short is refused at once, with no callback. */
	op = (struct tpb_op){ .xfers = &x, .n_xfers = 1, .offer = offer,
			      .offer_len = sizeof(offer) - 1, .done = on_op_done };
	ck_assert_int_eq(tpb_start(ep, &op), -EPROTO);
	ck_assert_str_ne(op.why, "");
	/* The whole offer: completes from progress, never inside start. */
	op.offer_len = sizeof(offer);
	op_finished = false;
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert(!op_finished);
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(op.status, 0);
	ck_assert_uint_eq(op.bytes, 65537);
	ck_assert_uint_eq(((uint8_t *)dst->map)[65536], 0x5a);
	ck_assert_uint_eq(((uint8_t *)dst->map)[65537], 0);
	ck_assert_int_eq(tpb_cancel(ep, &op), -ENOENT); /* done already */
	/* Canceled before its first write: -ECANCELED, nothing written. */
	memset(src->map, 0x77, BUF_BYTES);
	op_finished = false;
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_cancel(ep, &op), 0);
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(op.status, -ECANCELED);
	ck_assert_uint_eq(op.bytes, 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[0], 0x5a);
	tpb_ep_close(ep); /* the link's: nothing happens */
	tpb_rdma_recv_free(rv);
	pair_down(&a, &b);
	ck_assert_uint_eq(src->refs, 1);
	ck_assert_uint_eq(dst->refs, 1);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

static void on_op_count(struct tpb_op *op)
{
	(*(unsigned *)op->arg)++;
	op_finished = true;
}

/* A receive through the link's endpoint in the op table: prepare registers the destination
 * and completes later, from progress, with the offer in the caller's buffer; the writer starts
 * with those bytes; release deregisters, and drops a completion still owed. */
START_TEST(test_rdma_receive_through_the_op_table)
{
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src, *dst;
	struct tpb_ep *aep, *bep;
	struct tpb_xfer rx, sx;
	struct tpb_op rop, rop2, sop;
	struct tpb_rdma_region *regions = NULL;
	struct tpb_rdma_offer of;
	uint8_t offer[TPB_RDMA_OFFER_HDR + TPB_RDMA_OFFER_REGION], offer2[sizeof(offer)];
	size_t len = sizeof(offer) - 1;
	unsigned done = 0, done2 = 0;
	char why[160];

	if (!rdma_here())
		return;
	src = buffer(0x3c);
	dst = buffer(0);
	pair_up(&a, &b, 0);
	aep = tpb_rdma_link_ep(a.l);
	bep = tpb_rdma_link_ep(b.l);
	rx = (struct tpb_xfer){ .src = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
				.dst = { .loc = TPB_LOC_LOCAL, .buf = dst,
					 .addr = (uint64_t)(uintptr_t)dst->map + 4096 },
				.len = 8193 };
	rop = (struct tpb_op){ .xfers = &rx, .n_xfers = 1, .arg = &done };
	/* No done callback, then a buffer one byte short: refused, nothing registered. */
	ck_assert_int_eq(tpb_prepare(bep, &rop, offer, &len), -EINVAL);
	rop.done = on_op_count;
	ck_assert_int_eq(tpb_prepare(bep, &rop, offer, &len), -ENOBUFS);
	ck_assert_ptr_null(rop.prep);
	ck_assert_uint_eq(dst->refs, 1);
	/* Just big enough: the offer comes later, from progress, never inside the call. */
	len = sizeof(offer);
	op_finished = false;
	ck_assert_int_eq(tpb_prepare(bep, &rop, offer, &len), -EINPROGRESS);
	ck_assert_uint_eq(done, 0);
	ck_assert_ptr_nonnull(rop.prep); /* the registration, until tpb_release() */
	run_until(&a, &b, &op_finished);
	ck_assert_uint_eq(done, 1);
	ck_assert_int_eq(rop.status, 0);
	ck_assert_ptr_eq(rop.offer, offer);
	ck_assert_uint_eq(rop.offer_len, sizeof(offer));
	ck_assert_int_eq(tpb_rdma_offer_decode(offer, sizeof(offer) - 1, &regions, &of, why,
					       sizeof(why)), -EPROTO);
	ck_assert_int_eq(tpb_rdma_offer_decode(NULL, 0, &regions, &of, why, sizeof(why)),
			 -EOPNOTSUPP);
	ck_assert_int_eq(tpb_rdma_offer_decode(offer, sizeof(offer), &regions, &of, why,
					       sizeof(why)), 0);
	ck_assert_uint_eq(of.n, 1);
	ck_assert_uint_eq(of.regions[0].length, 8193);
	ck_assert(!of.regions[0].cuda);
	free(regions);
	/* The writer starts with the offer's bytes: they land in the prepared destination. */
	sx = (struct tpb_xfer){ .src = { .loc = TPB_LOC_LOCAL, .buf = src,
					 .addr = (uint64_t)(uintptr_t)src->map },
				.dst = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
				.len = 8193 };
	sop = (struct tpb_op){ .xfers = &sx, .n_xfers = 1, .offer = rop.offer,
			       .offer_len = rop.offer_len, .done = on_op_done };
	op_finished = false;
	ck_assert_int_eq(tpb_start(aep, &sop), 0);
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(sop.status, 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4095], 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096], 0x3c);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096 + 8192], 0x3c);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4096 + 8193], 0);
	/* Release deregisters; again, it does nothing. */
	/* rdma's receive is an op of its own now: @rop was prepared, never started as one. */
	ck_assert_int_eq(tpb_recv_expect(bep, &rop, 8193, 0, NULL), -ENOENT);
	tpb_release(&rop);
	ck_assert_ptr_null(rop.prep);
	ck_assert_uint_eq(dst->refs, 1);
	tpb_release(&rop);
	/* Released before its offer was ready: its completion never runs. */
	rop2 = rop;
	rop2.arg = &done2;
	ck_assert_int_eq(tpb_prepare(bep, &rop2, offer2, &len), -EINPROGRESS);
	tpb_release(&rop2);
	ck_assert_uint_eq(dst->refs, 1);
	done = 0;
	op_finished = false;
	ck_assert_int_eq(tpb_prepare(bep, &rop, offer, &len), -EINPROGRESS);
	run_until(&a, &b, &op_finished);
	ck_assert_uint_eq(done2, 0);
	tpb_release(&rop);
	pair_down(&a, &b);
	ck_assert_uint_eq(src->refs, 1);
	ck_assert_uint_eq(dst->refs, 1);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

/* Steps for an endpoint-made link: the same back-to-back delivery, through tpb_ep_msg(). */
static void deliver_ep(struct side *s, struct tpb_ep *ep)
{
	for (size_t k = 0; k < s->n_inbox; k++) {
		ck_assert_int_eq(tpb_ep_msg(ep, &s->inbox[k]), 0);
		free(s->qps[k]);
		free(s->recs[k]);
		free(s->rails[k]);
		free(s->rail_recs[k]);
	}
	s->n_inbox = 0;
}

static const struct tpb_rdma_link_ops other_ops = { .send = side_send, .name = side_name };

/*
 * The link made through the table: tpb_ep_open() with the link's callbacks and the peer's
 * offers sets it up (tpb_ep_msg() takes the steps, tpb_ep_query() says how far), a second open
 * finds it, and the last close frees it. A receive started on the endpoint waits for the
 * sender's word: every byte completes it from progress (never inside the call) and counts them
 * received; any other count is -EPROTO; a cancel is -ECANCELED; the link's end -ECONNRESET.
 */
START_TEST(test_rdma_link_and_receive_through_the_op_table)
{
	static const char *const offers[] = { "mpt", "rdma" }, *const none[] = { "mpt" };
	struct tpb_rdma_config cfg = config(false, 0);
	struct side a = { 0 }, b = { 0 };
	struct tpb_peer pa = { .name = "a", .link = &a, .offers = offers, .n_offers = 2,
			       .link_ops = &link_ops };
	struct tpb_peer pb = { .name = "b", .link = &b, .offers = offers, .n_offers = 2,
			       .link_ops = &link_ops };
	struct tpb_peer pn = { .name = "n", .link = &pn, .offers = none, .n_offers = 1,
			       .link_ops = &link_ops };
	struct tpb_ep *aep, *bep, *again, *nep = NULL;
	struct tpb_ep_info info;
	struct tpb_xfer rx = { .src = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
			       .len = 100 };
	struct tpb_op op = { .xfers = &rx, .n_xfers = 1, .done = on_op_count };
	unsigned done = 0;

	if (!rdma_here())
		return;
	cfg.link_ops = NULL; /* the endpoints bring their own */
	a.peer = &b;
	b.peer = &a;
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &a.g), 0);
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &b.g), 0);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), &pn, &nep), -EOPNOTSUPP);
	ck_assert_ptr_null(nep);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), &pb, &aep), 0);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(b.g), &pa, &bep), 0);
	/* The links of a context share their callbacks: another table is refused. */
	pn.link_ops = &other_ops;
	pn.offers = offers;
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(a.g), &pn, &nep), -EINVAL);
	ck_assert_ptr_null(nep);
	ck_assert_int_eq(tpb_ep_query(aep, &info), 0);
	ck_assert(!info.ready);
	ck_assert_str_eq(info.state, "connecting");
	while (a.n_inbox || b.n_inbox) {
		deliver_ep(&a, aep);
		deliver_ep(&b, bep);
	}
	ck_assert_int_eq(tpb_ep_query(bep, &info), 0);
	ck_assert_msg(info.ready, "b: %s", info.state);
	ck_assert_ptr_nonnull(strstr(info.state, "ready"));
	ck_assert_uint_eq(info.received, 0);
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_ctx(b.g), &pa, &again), 0);
	ck_assert_ptr_eq(again, bep);
	tpb_ep_close(again); /* one of two: the link stays */
	/* cuda_gdr's row: the same link, its own endpoint on the context's second head. */
	ck_assert_int_eq(tpb_ep_open(tpb_rdma_gdr_ctx(b.g), &pa, &again), 0);
	ck_assert_ptr_ne(again, bep);
	ck_assert_ptr_eq(again->ctx->ops, &tpb_cuda_gdr_ops);
	ck_assert_int_eq(again->ctx->idx, tpb_index("cuda_gdr"));
	ck_assert_ptr_eq(tpb_rdma_of(again->ctx), b.g);
	ck_assert_int_eq(tpb_ep_query(again, &info), 0);
	ck_assert(info.ready);
	op.arg = &done;
	ck_assert_int_eq(tpb_start(again, &op), 0);
	ck_assert_int_eq(op.channel, tpb_index("cuda_gdr"));
	ck_assert_int_eq(tpb_cancel(bep, &op), 0); /* one link: either endpoint finds it */
	op_finished = false;
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(op.status, -ECANCELED);
	tpb_ep_close(again);
	done = 0;
	ck_assert_int_eq(tpb_ep_query(bep, &info), 0);
	ck_assert(info.ready);
	ck_assert_uint_eq(tpb_offer_max(bep, 3), tpb_rdma_offer_size(3));

	/* Every byte: completes from progress, counted. */
	op.arg = &done;
	ck_assert_int_eq(tpb_recv_expect(bep, &op, 100, 0, NULL), -ENOENT); /* not started */
	ck_assert_int_eq(tpb_start(bep, &op), 0);
	ck_assert_int_eq(op.channel, tpb_index("rdma"));
	ck_assert_int_eq(tpb_recv_expect(bep, &op, 100, 0, NULL), 0);
	ck_assert_uint_eq(done, 0);
	ck_assert_int_eq(tpb_cancel(bep, &op), -ENOENT); /* ended: waits for progress only */
	op_finished = false;
	run_until(&a, &b, &op_finished);
	ck_assert_uint_eq(done, 1);
	ck_assert_int_eq(op.status, 0);
	ck_assert_uint_eq(op.bytes, 100);
	ck_assert_int_eq(tpb_ep_query(bep, &info), 0);
	ck_assert_uint_eq(info.received, 100);
	/* One byte short, and one over: -EPROTO, nothing counted. */
	for (uint64_t n = 99; n <= 101; n += 2) {
		ck_assert_int_eq(tpb_start(bep, &op), 0);
		ck_assert_int_eq(tpb_recv_expect(bep, &op, n, 0, NULL), 0);
		op_finished = false;
		run_until(&a, &b, &op_finished);
		ck_assert_int_eq(op.status, -EPROTO);
		ck_assert_ptr_nonnull(strstr(op.why, "of 100 bytes"));
	}
	/* The sender's failure, with its reason. */
	ck_assert_int_eq(tpb_start(bep, &op), 0);
	ck_assert_int_eq(tpb_recv_expect(bep, &op, 0, -EIO, "disk on fire"), 0);
	op_finished = false;
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(op.status, -EIO);
	ck_assert_str_eq(op.why, "disk on fire");
	ck_assert_int_eq(tpb_ep_query(bep, &info), 0);
	ck_assert_uint_eq(info.received, 100);
	/* Canceled. */
	ck_assert_int_eq(tpb_start(bep, &op), 0);
	ck_assert_int_eq(tpb_cancel(bep, &op), 0);
	ck_assert_int_eq(tpb_recv_expect(bep, &op, 100, 0, NULL), -ENOENT);
	op_finished = false;
	run_until(&a, &b, &op_finished);
	ck_assert_int_eq(op.status, -ECANCELED);
	ck_assert_uint_eq(done, 5);
	/* Still waiting when the link goes: -ECONNRESET, inside the last close. */
	ck_assert_int_eq(tpb_start(bep, &op), 0);
	tpb_ep_close(bep);
	ck_assert_uint_eq(done, 6);
	ck_assert_int_eq(op.status, -ECONNRESET);
	tpb_ep_close(aep);
	tpb_rdma_ctx_free(a.g);
	tpb_rdma_ctx_free(b.g);
}
END_TEST

START_TEST(test_rdma_context_through_the_op_table)
{
	struct tpb_rdma_config rc = config(false, 0);
	struct tpb_config bc = { .rdma = &rc };
	struct tpb_ctx *ctx = NULL;
	int idx;

	if (!rdma_here()) { /* not viable: no context, as for any channel */
		ck_assert_int_eq(tpb_ctx_new(tpb_index("rdma"), &bc, NULL, &ctx), -ENODEV);
		return;
	}
	idx = tpb_index("rdma");
	ck_assert_int_eq(tpb_ctx_new(idx, NULL, NULL, &ctx), -EOPNOTSUPP); /* no settings */
	ck_assert_int_eq(tpb_ctx_new(idx, &bc, NULL, &ctx), 0);
	ck_assert_int_eq(ctx->idx, idx);
	ck_assert_ptr_nonnull(tpb_rdma_of(ctx));
	ck_assert_ptr_eq(tpb_rdma_ctx(tpb_rdma_of(ctx)), ctx);
	ck_assert_uint_ne(tpb_rdma_offers(tpb_rdma_of(ctx)) & TPB_RDMA_HOST, 0);
	ck_assert_int_eq(tpb_event_fd(ctx), tpb_rdma_event_fd(tpb_rdma_of(ctx)));
	ck_assert_int_ge(tpb_event_fd(ctx), 0);
	ck_assert_int_eq(tpb_progress(ctx), 0);
	ck_assert_int_eq(tpb_forget(ctx, &(struct tpb_mem){ .loc = TPB_LOC_LOCAL }, 1), 0);
	ck_assert_ptr_null(tpb_rdma_of(NULL));
	tpb_ctx_free(ctx);
}
END_TEST

#define HUB_PEERS 6

/* One context (the hub) linked to HUB_PEERS others, every link set up; false if one did not
 * get ready (its state in @why). */
static bool hub_up(struct side *hub, struct side *spokes, char *why, size_t wl)
{
	struct tpb_rdma_config cfg = config(false, 0);
	bool ok = true;

	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &hub[0].g), 0);
	for (int i = 0; i < HUB_PEERS; i++) {
		hub[i].g = hub[0].g;
		hub[i].peer = &spokes[i];
		spokes[i].peer = &hub[i];
		ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &spokes[i].g), 0);
		hub[i].l = tpb_rdma_link_new(hub[i].g, &hub[i], TPB_RDMA_HOST);
		spokes[i].l = tpb_rdma_link_new(spokes[i].g, &spokes[i], TPB_RDMA_HOST);
		while (hub[i].n_inbox || spokes[i].n_inbox) {
			deliver(&hub[i]);
			deliver(&spokes[i]);
		}
		if (ok && !tpb_rdma_link_ready(hub[i].l)) {
			snprintf(why, wl, "link %d: %s", i, tpb_rdma_link_state(hub[i].l));
			ok = false;
		}
	}
	return ok;
}

static void hub_down(struct side *hub, struct side *spokes)
{
	for (int i = 0; i < HUB_PEERS; i++) {
		inbox_drop(&hub[i]);
		inbox_drop(&spokes[i]);
		tpb_rdma_link_free(hub[i].l);
		tpb_rdma_link_free(spokes[i].l);
		tpb_rdma_ctx_free(spokes[i].g);
	}
	tpb_rdma_ctx_free(hub[0].g);
}

/* The hub's every link carries a transfer (its own bytes, checked at the far end). */
static void hub_transfers(struct side *hub, struct side *spokes)
{
	struct tpb_buffer *src = buffer(0), *dst = buffer(0);

	for (int i = 0; i < HUB_PEERS; i++) {
		memset(src->map, 0x10 + i, 1u << 16);
		ck_assert_int_eq(transfer(&hub[i], &spokes[i], src, dst, 0, 1u << 16, false), 0);
		ck_assert_uint_eq(((uint8_t *)dst->map)[(1u << 16) - 1], 0x10 + i);
	}
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}

/* Issue 28 item 2: with 8 ports, every (local, remote) pair took 8 queue pairs of 128 entries
 * per port and link, and the 5th link found the 4096-entry completion queue full (-ENOSPC).
 * With one rail per port, a link takes one queue pair per port. */
START_TEST(test_rdma_eight_rails_six_peers_all_get_rdma)
{
	struct side hub[HUB_PEERS] = { 0 }, spokes[HUB_PEERS] = { 0 };
	char why[300] = "";

	setenv("FAKEVERBS_PORTS", "8", 1);
	setenv("FAKEVERBS_RAILS", "8", 1);
	if (!rdma_here())
		return;
	ck_assert_msg(hub_up(hub, spokes, why, sizeof(why)), "%s", why);
	ck_assert_str_eq(tpb_rdma_link_state(hub[HUB_PEERS - 1].l),
			 "ready: 8 queue pairs between ports on the same rail (8x8 ports)");
	hub_transfers(hub, spokes);
	hub_down(hub, spokes);
}
END_TEST

/* A device whose completion queues take two queue pairs each (max_cqe 256, 128 a queue pair):
 * the 3rd link's queue pair goes on a new completion queue, and its completions are drained. */
START_TEST(test_rdma_completion_queues_grow_within_max_cqe)
{
	struct side hub[HUB_PEERS] = { 0 }, spokes[HUB_PEERS] = { 0 };
	char why[300] = "";

	setenv("FAKEVERBS_MAX_CQE", "256", 1);
	if (!rdma_here())
		return;
	ck_assert_msg(hub_up(hub, spokes, why, sizeof(why)), "%s", why);
	hub_transfers(hub, spokes);
	hub_down(hub, spokes);
}
END_TEST

/* Two ports on two rails that cannot reach each other: a transfer whose reader registered on
 * port 2 is written from this host's port 2, never across (which times out in the fabric). */
START_TEST(test_rdma_writes_stay_on_their_rail)
{
	struct side a = { 0 }, b = { 0 };
	struct tpb_rdma_seg rs;
	struct tpb_rdma_recv *rv;
	struct tpb_buffer *src, *dst;
	char why[160] = "";

	setenv("FAKEVERBS_PORTS", "2", 1);
	setenv("FAKEVERBS_RAILS", "2", 1);
	if (!rdma_here())
		return;
	src = buffer(0x5a);
	dst = buffer(0);
	pair_up(&a, &b, 0);
	/* one receive on the reader's side only: its round-robin is a port ahead of the writer's */
	rs = (struct tpb_rdma_seg){ .mem = { .loc = TPB_LOC_LOCAL,
					     .addr = (uint64_t)(uintptr_t)dst->map },
				    .len = 4096, .buf = dst };
	ck_assert_int_eq(tpb_rdma_recv_new(b.l, &rs, 1, false, on_ready, NULL, &rv, why,
					   sizeof(why)), 0);
	tpb_rdma_recv_free(rv);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096 * (i + 1), false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4 * 4096 - 1], 0x5a);
	ck_assert_str_eq(tpb_rdma_link_state(a.l),
			 "ready: 2 queue pairs between ports on the same rail (2x2 ports)");
	pair_down(&a, &b);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

/* InfiniBand ports (LIDs, no GRH) on two rails: the links come up and carry writes. */
START_TEST(test_rdma_infiniband_without_grh)
{
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src, *dst;

	setenv("FAKEVERBS_LINK", "ib", 1);
	setenv("FAKEVERBS_PORTS", "2", 1);
	setenv("FAKEVERBS_RAILS", "2", 1);
	if (!rdma_here())
		return;
	src = buffer(0x77);
	dst = buffer(0);
	pair_up(&a, &b, 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 8192, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[8191], 0x77);
	pair_down(&a, &b);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

/* Runs both contexts and hands over their set-up steps until both links are ready, or fails at
 * the deadline. */
static void run_until_ready(struct side *a, struct side *b)
{
	uint64_t end = tpu_now_ns() + DEADLINE_MS * 1000000ull;

	for (;;) {
		struct pollfd pfd[2] = { { .fd = tpb_rdma_event_fd(a->g), .events = POLLIN },
					 { .fd = tpb_rdma_event_fd(b->g), .events = POLLIN } };

		deliver(a);
		deliver(b);
		if (tpb_rdma_link_ready(a->l) && tpb_rdma_link_ready(b->l) && !a->n_inbox &&
		    !b->n_inbox)
			return;
		ck_assert_msg(tpu_now_ns() < end, "not ready again within %d ms: %s", DEADLINE_MS,
			      tpb_rdma_link_state(a->l));
		ck_assert_int_ge(poll(pfd, 2, 5), 0);
		ck_assert_int_eq(tpb_rdma_progress(a->g), 0);
		ck_assert_int_eq(tpb_rdma_progress(b->g), 0);
	}
}

/* Runs both contexts for @ms, handing over set-up steps (to see that nothing happens). */
static void run_for(struct side *a, struct side *b, int ms)
{
	uint64_t end = tpu_now_ns() + (uint64_t)ms * 1000000u;

	while (tpu_now_ns() < end) {
		deliver(a);
		deliver(b);
		(void)poll(NULL, 0, 1);
		ck_assert_int_eq(tpb_rdma_progress(a->g), 0);
		ck_assert_int_eq(tpb_rdma_progress(b->g), 0);
	}
}

/*
 * Issue 28 item 6: a write that times out (the fabric is down) turned RDMA off for the link's
 * life; now the side that saw it rebuilds the queue pairs after rdma-rebuild-ms, and once the
 * fabric is back the link carries writes again. In a row without a write completing, it gives
 * up after rdma-rebuild-max rebuilds.
 */
START_TEST(test_rdma_link_rebuilds_after_the_fabric_recovers)
{
	struct tpb_rdma_config cfg = config(false, 0);
	char down[] = "/tmp/tpfakeverbs-down.XXXXXX";
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src, *dst;
	int fd;

	if (!rdma_here())
		return;
	fd = mkstemp(down);
	ck_assert_int_ge(fd, 0);
	close(fd);
	unlink(down);
	setenv("FAKEVERBS_FABRIC_DOWN", down, 1);
	src = buffer(0x42);
	dst = buffer(0);
	cfg.rebuild_ms = 10;
	cfg.rebuild_max = 1;
	pair_up_cfg(&a, &b, &cfg);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), 0);

	fd = open(down, O_CREAT | O_WRONLY | O_CLOEXEC, 0600); /* the fabric goes down */
	close(fd);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), -ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(tpb_rdma_link_state(a.l), "off: RDMA write failed"));
	unlink(down); /* and comes back */
	run_until_ready(&a, &b);
	memset(src->map, 0x43, 4096);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4095], 0x43);

	/* Down for good: one rebuild (the write before it completed), then it stays off. */
	fd = open(down, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	close(fd);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), -ETIMEDOUT);
	run_until_ready(&a, &b);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), -ETIMEDOUT);
	run_for(&a, &b, 100); /* ten times the wait before a rebuild */
	ck_assert(!tpb_rdma_link_ready(a.l));
	ck_assert_ptr_nonnull(strstr(tpb_rdma_link_state(a.l), "(given up after 1 rebuilds)"));
	unlink(down);
	pair_down(&a, &b);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

/* A receive of 4096 bytes into @dst on @s's link, ready; its offer in @of. */
static struct tpb_rdma_recv *recv_4k(struct side *s, struct side *peer, struct tpb_buffer *dst,
				     struct tpb_rdma_seg *rs, struct tpb_rdma_offer *of)
{
	struct tpb_rdma_recv *rv;
	char why[160] = "";

	*rs = (struct tpb_rdma_seg){ .mem = { .loc = TPB_LOC_LOCAL,
					      .addr = (uint64_t)(uintptr_t)dst->map },
				     .len = 4096, .buf = dst };
	recv_ready = false;
	ck_assert_int_eq(tpb_rdma_recv_new(s->l, rs, 1, false, on_ready, NULL, &rv, why,
					   sizeof(why)), 0);
	run_until(s, peer, &recv_ready);
	tpb_rdma_recv_offer(rv, of);
	return rv;
}

static void on_done_flag(struct tpb_rdma_xfer *x)
{
	*(bool *)x->arg = true;
}

/*
 * B's write fails and B rebuilds while a write of A is still pending (its completion not yet
 * polled): A's send fails with -ECONNRESET when A follows B's announcement, both sides are set
 * up again, and the next transfer goes through.
 */
START_TEST(test_rdma_peer_rebuild_fails_running_sends_and_sets_up_again)
{
	struct tpb_rdma_config cfg = config(false, 0);
	char down[] = "/tmp/tpfakeverbs-down.XXXXXX";
	struct side a = { 0 }, b = { 0 };
	struct tpb_rdma_seg rs_a, rs_b, ss_a, ss_b;
	bool done_a = false, done_b = false;
	struct tpb_rdma_xfer xa = { .segs = &ss_a, .n_segs = 1, .done = on_done_flag,
				    .arg = &done_a };
	struct tpb_rdma_xfer xb = { .segs = &ss_b, .n_segs = 1, .done = on_done_flag,
				    .arg = &done_b };
	struct tpb_rdma_recv *rv_a, *rv_b;
	struct tpb_rdma_offer of_a, of_b;
	struct tpb_buffer *src, *dst_a, *dst_b;
	uint64_t end;
	char why[160] = "";
	int fd;

	if (!rdma_here())
		return;
	fd = mkstemp(down);
	ck_assert_int_ge(fd, 0);
	close(fd);
	unlink(down);
	setenv("FAKEVERBS_FABRIC_DOWN", down, 1);
	src = buffer(0x21);
	dst_a = buffer(0);
	dst_b = buffer(0);
	cfg.rebuild_ms = 10;
	cfg.rebuild_max = 3;
	pair_up_cfg(&a, &b, &cfg);
	rv_a = recv_4k(&a, &b, dst_a, &rs_a, &of_a);
	rv_b = recv_4k(&b, &a, dst_b, &rs_b, &of_b);
	ss_a = ss_b = (struct tpb_rdma_seg){ .mem = { .loc = TPB_LOC_LOCAL,
						      .addr = (uint64_t)(uintptr_t)src->map },
					     .len = 4096, .buf = src };
	ck_assert_int_eq(tpb_rdma_send(a.l, &xa, &of_b, why, sizeof(why)), 0);
	ck_assert_int_eq(tpb_rdma_progress(a.g), 0); /* A posts; its completion waits */
	fd = open(down, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	close(fd);
	ck_assert_int_eq(tpb_rdma_send(b.l, &xb, &of_a, why, sizeof(why)), 0);
	/* only B runs: its write fails, it gives up (to A) and, 10 ms on, announces again */
	end = tpu_now_ns() + DEADLINE_MS * 1000000ull;
	while (a.n_inbox < 2 || !done_b) {
		ck_assert_msg(tpu_now_ns() < end, "B did not rebuild: %s",
			      tpb_rdma_link_state(b.l));
		(void)poll(NULL, 0, 1);
		ck_assert_int_eq(tpb_rdma_progress(b.g), 0);
	}
	ck_assert_int_eq(xb.status, -ETIMEDOUT);
	ck_assert(!done_a);
	unlink(down);
	deliver(&a); /* B gave up, then announced: A follows, failing its running send */
	run_until(&a, &b, &done_a);
	ck_assert_int_eq(xa.status, -ECONNRESET);
	run_until_ready(&a, &b);
	tpb_rdma_recv_free(rv_a);
	tpb_rdma_recv_free(rv_b);
	ck_assert_int_eq(transfer(&a, &b, src, dst_b, 0, 4096, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst_b->map)[4095], 0x21);
	pair_down(&a, &b);
	free(src->map);
	free(dst_a->map);
	free(dst_b->map);
	free(src);
	free(dst_a);
	free(dst_b);
}
END_TEST

/*
 * Issue 28 item 6: traffic class and ACK timeout reach the queue pairs. The stand-in's fabric
 * carries only traffic class 106 and answers later than the default timeout (14) allows: the
 * defaults time out, the configured values go through.
 */
START_TEST(test_rdma_roce_settings_reach_the_queue_pairs)
{
	struct tpb_rdma_config cfg = config(false, 0);
	struct side a = { 0 }, b = { 0 }, c = { 0 }, d = { 0 };
	struct tpb_buffer *src, *dst;

	setenv("FAKEVERBS_TC", "106", 1);
	setenv("FAKEVERBS_SL", "3", 1);
	setenv("FAKEVERBS_FABRIC_TIMEOUT", "18", 1);
	if (!rdma_here())
		return;
	src = buffer(0x61);
	dst = buffer(0);
	pair_up(&a, &b, 0);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), -ETIMEDOUT);
	pair_down(&a, &b);
	cfg.traffic_class = 106;
	cfg.sl = 3;
	cfg.timeout = 18;
	cfg.retry = 3;
	pair_up_cfg(&c, &d, &cfg);
	ck_assert_int_eq(transfer(&c, &d, src, dst, 0, 4096, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4095], 0x61);
	pair_down(&c, &d);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

/*
 * Issue 28 item 7: the GID index is configurable. Entry 1 (RoCE v2, link-local) carries
 * writes; entry 3 is empty on every port, so no port is left and nothing is offered.
 */
START_TEST(test_rdma_gid_index_is_configurable)
{
	struct tpb_rdma_config cfg = config(false, 0);
	struct side a = { 0 }, b = { 0 };
	struct tpb_buffer *src, *dst;
	struct tpb_rdma *g;

	setenv("FAKEVERBS_PORTS", "2", 1);
	if (!rdma_here())
		return;
	src = buffer(0x39);
	dst = buffer(0);
	cfg.gid_index_set = true;
	cfg.gid_index = 1;
	pair_up_cfg(&a, &b, &cfg);
	ck_assert_int_eq(transfer(&a, &b, src, dst, 0, 4096, false), 0);
	ck_assert_uint_eq(((uint8_t *)dst->map)[4095], 0x39);
	pair_down(&a, &b);
	cfg.gid_index = 3;
	ck_assert_int_eq(tpb_rdma_ctx_new(&cfg, &g), 0);
	ck_assert_uint_eq(tpb_rdma_offers(g), 0);
	tpb_rdma_ctx_free(g);
	free(src->map);
	free(dst->map);
	free(src);
	free(dst);
}
END_TEST

static Suite *rdma_suite(void)
{
	Suite *s = suite_create("rdma");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_rdma_turned_off_offers_nothing_and_progress_is_idle);
	tcase_add_test(tc, test_rdma_channel_is_cuda_gdr_with_cuda_memory_on_either_side);
	tcase_add_test(tc, test_rdma_back_to_back_writes_cache_and_cancel);
	tcase_add_test(tc, test_rdma_link_free_completes_running_sends_with_econnreset);
	tcase_add_test(tc, test_rdma_context_through_the_op_table);
	tcase_add_test(tc, test_rdma_send_through_the_op_table);
	tcase_add_test(tc, test_rdma_receive_through_the_op_table);
	tcase_add_test(tc, test_rdma_eight_rails_six_peers_all_get_rdma);
	tcase_add_test(tc, test_rdma_completion_queues_grow_within_max_cqe);
	tcase_add_test(tc, test_rdma_writes_stay_on_their_rail);
	tcase_add_test(tc, test_rdma_infiniband_without_grh);
	tcase_add_test(tc, test_rdma_link_rebuilds_after_the_fabric_recovers);
	tcase_add_test(tc, test_rdma_peer_rebuild_fails_running_sends_and_sets_up_again);
	tcase_add_test(tc, test_rdma_roce_settings_reach_the_queue_pairs);
	tcase_add_test(tc, test_rdma_gid_index_is_configurable);
	tcase_add_test(tc, test_rdma_link_and_receive_through_the_op_table);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(rdma_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
