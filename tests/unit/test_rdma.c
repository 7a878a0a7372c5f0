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
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	uint8_t *qps[4];
	struct tpb_rdma_record *recs[4];
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

/* Two contexts of this process, linked back to back and ready. */
static void pair_up(struct side *a, struct side *b, uint64_t cache)
{
	struct tpb_rdma_config cfg = config(false, cache);

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

static void pair_down(struct side *a, struct side *b)
{
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
