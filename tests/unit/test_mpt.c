/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/mpt/mpt.c, the mpt channel's op table: two stripes A and B in one
 * process, joined by socket pairs, driven through the tpb_*() wrappers with no event loop (the
 * test polls the stripes' and the context's event fds, as the daemon's loop does). A send and a
 * receive named by the same xfer_id complete exactly once each, later, from tpb_progress();
 * cancel, the sender's word (tpb_mpt_recv_expect()), a closed endpoint and a freed stripe each
 * end an op once; bad calls are refused without a callback.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "mpt.h"
#include "stripe.h"

#define DEADLINE_MS 20000

struct rec {
	int calls, status;
	uint64_t bytes;
	bool on_caller;
	char why[160];
};

static pthread_t caller;

static void op_done(struct tpb_op *op)
{
	struct rec *r = op->arg;

	r->calls++;
	r->status = op->status;
	r->bytes = op->bytes;
	r->on_caller = pthread_equal(pthread_self(), caller);
	memcpy(r->why, op->why, sizeof(r->why));
}

struct fx {
	struct tpb_stripe *a, *b;
	struct tpb_peer pa, pb; /* A's view of B, B's of A */
	struct tpb_ctx *ctx;	/* one per daemon: both sides share it here */
	struct tpb_ep *ea, *eb;
};

static void fx_setup(struct fx *f, unsigned conns)
{
	struct tpb_stripe_config cfg = { .chunk = 64 << 10 };

	memset(f, 0, sizeof(*f));
	caller = pthread_self();
	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	ck_assert_int_eq(tpb_stripe_new(&cfg, &f->a), 0);
	ck_assert_int_eq(tpb_stripe_new(&cfg, &f->b), 0);
	for (unsigned i = 0; i < conns; i++) {
		int sp[2];

		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
		ck_assert_int_eq(tpb_stripe_add_conn(f->a, sp[0]), 0);
		ck_assert_int_eq(tpb_stripe_add_conn(f->b, sp[1]), 0);
	}
	f->pa = (struct tpb_peer){ .name = "B", .stripe = f->a };
	f->pb = (struct tpb_peer){ .name = "A", .stripe = f->b };
	ck_assert_int_eq(tpb_ctx_new(tpb_index("mpt"), NULL, NULL, &f->ctx), 0);
	ck_assert_int_ge(tpb_event_fd(f->ctx), 0);
	ck_assert_int_eq(tpb_ep_open(f->ctx, &f->pa, &f->ea), 0);
	ck_assert_int_eq(tpb_ep_open(f->ctx, &f->pb, &f->eb), 0);
}

/* One round of the loop: waits up to @ms for any fd, then runs what is ready. */
static void pump(struct fx *f, int ms)
{
	struct pollfd p[3] = {
		{ .fd = f->a ? tpb_stripe_event_fd(f->a) : -1, .events = POLLIN },
		{ .fd = f->b ? tpb_stripe_event_fd(f->b) : -1, .events = POLLIN },
		{ .fd = tpb_event_fd(f->ctx), .events = POLLIN },
	};

	if (poll(p, 3, ms) <= 0)
		return;
	if (p[0].revents)
		tpb_stripe_progress(f->a);
	if (p[1].revents)
		tpb_stripe_progress(f->b);
	if (p[2].revents)
		tpb_progress(f->ctx);
}

/* Pumps until *@a > 0 and *@b > 0 (@b may be NULL). Return: whether they are. */
static bool run_until(struct fx *f, const int *a, const int *b)
{
	for (int i = 0; i < DEADLINE_MS / 10 && (*a <= 0 || (b && *b <= 0)); i++)
		pump(f, 10);
	return *a > 0 && (!b || *b > 0);
}

static void fx_teardown(struct fx *f)
{
	tpb_ep_close(f->ea);
	tpb_ep_close(f->eb);
	tpb_stripe_free(f->a);
	tpb_stripe_free(f->b);
	tpb_ctx_free(f->ctx);
}

static struct tpb_xfer out(const void *p, uint64_t len)
{
	return (struct tpb_xfer){ .src = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)p },
				  .dst = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
				  .len = len };
}

static struct tpb_xfer in(void *p, uint64_t len)
{
	return (struct tpb_xfer){ .src = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL },
				  .dst = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)p },
				  .len = len };
}

/* Three segments A -> B over four connections; each op completes once, from progress. */
START_TEST(test_mpt_send_and_receive_complete_once_from_progress)
{
	enum { LEN = 3 << 20 };
	uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
	struct tpb_xfer sx[3], rx[3];
	struct rec rs = { 0 }, rr = { 0 };
	struct tpb_op s = { .xfers = sx, .n_xfers = 3, .xfer_id = 7, .done = op_done, .arg = &rs };
	struct tpb_op r = { .xfers = rx, .n_xfers = 3, .xfer_id = 7, .done = op_done, .arg = &rr };
	uint64_t cut[4] = { 0, 1000, 1000, LEN }; /* an empty segment in the middle */
	struct fx f;

	for (size_t i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 7 + 3);
	for (int i = 0; i < 3; i++) {
		sx[i] = out(src + cut[i], cut[i + 1] - cut[i]);
		rx[i] = in(dst + cut[i], cut[i + 1] - cut[i]);
	}
	fx_setup(&f, 4);
	ck_assert_int_eq(tpb_start(f.eb, &r), 0);
	ck_assert_int_eq(tpb_start(f.ea, &s), 0);
	ck_assert_int_eq(rs.calls + rr.calls, 0); /* never inside start */
	ck_assert(run_until(&f, &rs.calls, &rr.calls));
	for (int i = 0; i < 20; i++)
		pump(&f, 1);
	ck_assert_int_eq(rs.calls, 1);
	ck_assert_int_eq(rr.calls, 1);
	ck_assert_int_eq(rs.status, 0);
	ck_assert_int_eq(rr.status, 0);
	ck_assert_uint_eq(rs.bytes, LEN);
	ck_assert_uint_eq(rr.bytes, LEN);
	ck_assert(rs.on_caller && rr.on_caller);
	ck_assert_int_eq(memcmp(src, dst, LEN), 0);
	ck_assert_int_eq(tpb_cancel(f.eb, &r), -ENOENT); /* delivered: nothing to cancel */
	fx_teardown(&f);
	free(src);
	free(dst);
}
END_TEST

/* A canceled receive completes once with -ECANCELED; the sender's word ends another. */
START_TEST(test_mpt_cancel_and_the_senders_word_end_a_receive)
{
	uint8_t dst[4096];
	struct tpb_xfer rx = in(dst, sizeof(dst));
	struct rec r1 = { 0 }, r2 = { 0 }, r3 = { 0 };
	struct tpb_op a = { .xfers = &rx, .n_xfers = 1, .xfer_id = 1, .done = op_done, .arg = &r1 };
	struct tpb_op b = { .xfers = &rx, .n_xfers = 1, .xfer_id = 2, .done = op_done, .arg = &r2 };
	struct tpb_op c = { .xfers = &rx, .n_xfers = 1, .xfer_id = 3, .done = op_done, .arg = &r3 };
	struct fx f;

	fx_setup(&f, 2);
	ck_assert_int_eq(tpb_start(f.eb, &a), 0);
	ck_assert_int_eq(tpb_start(f.eb, &b), 0);
	ck_assert_int_eq(tpb_cancel(f.eb, &a), 0);
	ck_assert_int_eq(tpb_mpt_recv_expect(f.eb, &b, 0, -EIO, "source unreadable"), 0);
	ck_assert_int_eq(r1.calls + r2.calls, 0);
	ck_assert(run_until(&f, &r1.calls, &r2.calls));
	ck_assert_int_eq(r1.status, -ECANCELED);
	ck_assert_int_eq(r2.status, -EIO);
	ck_assert_str_eq(r2.why, "source unreadable");
	ck_assert_int_eq(tpb_cancel(f.eb, &a), -ENOENT);
	ck_assert_int_eq(tpb_mpt_recv_expect(f.eb, &b, 0, 0, NULL), -ENOENT);
	ck_assert_int_eq(tpb_recv_expect(f.eb, &b, 0, 0, NULL), -ENOENT); /* the table's op */
	for (int i = 0; i < 20; i++)
		pump(&f, 1);
	ck_assert_int_eq(r1.calls, 1);
	ck_assert_int_eq(r2.calls, 1);
	/* The same word through the op table's wrapper (what the daemon calls). */
	ck_assert_int_eq(tpb_start(f.eb, &c), 0);
	ck_assert_int_eq(tpb_recv_expect(f.eb, &c, 0, -EPIPE, "writer gone"), 0);
	ck_assert(run_until(&f, &r3.calls, NULL));
	ck_assert_int_eq(r3.status, -EPIPE);
	ck_assert_str_eq(r3.why, "writer gone");
	fx_teardown(&f);
}
END_TEST

/* Closing an endpoint cancels its receive, which still completes once, later; freeing a stripe
 * ends the ops on it with -ECONNRESET, delivered from progress. */
START_TEST(test_mpt_closed_endpoint_and_freed_stripe_end_their_ops_once)
{
	uint8_t dst[4096];
	struct tpb_xfer rx = in(dst, sizeof(dst));
	struct rec r1 = { 0 }, r2 = { 0 };
	struct tpb_op a = { .xfers = &rx, .n_xfers = 1, .xfer_id = 1, .done = op_done, .arg = &r1 };
	struct tpb_op b = { .xfers = &rx, .n_xfers = 1, .xfer_id = 2, .done = op_done, .arg = &r2 };
	struct fx f;

	fx_setup(&f, 1);
	ck_assert_int_eq(tpb_start(f.eb, &a), 0);
	ck_assert_int_eq(tpb_start(f.ea, &b), 0);
	tpb_ep_close(f.eb);
	f.eb = NULL;
	ck_assert(run_until(&f, &r1.calls, NULL));
	ck_assert_int_eq(r1.status, -ECANCELED);
	tpb_stripe_free(f.a); /* b was waiting there */
	f.a = NULL;
	ck_assert_int_eq(r2.calls, 0); /* queued, delivered by progress */
	ck_assert(run_until(&f, &r2.calls, NULL));
	ck_assert_int_eq(r2.status, -ECONNRESET);
	ck_assert_int_eq(r1.calls + r2.calls, 2);
	fx_teardown(&f);
}
END_TEST

struct nest {
	struct rec rec;
	struct fx *f;
};

/* Closes B's endpoint and runs the context's progress again, from inside a done callback. */
static void close_and_nest(struct tpb_op *op)
{
	struct nest *n = op->arg;

	op->arg = &n->rec;
	op_done(op);
	tpb_ep_close(n->f->eb);
	n->f->eb = NULL;
	tpb_progress(n->f->ctx); /* delivers the other op: the endpoint must outlive both */
}

/* An endpoint closed from one op's callback, whose other op completes in a nested progress,
 * goes only once the outer callback has returned. */
START_TEST(test_mpt_endpoint_closed_inside_a_callback_outlives_nested_progress)
{
	uint8_t dst[64];
	struct tpb_xfer rx = in(dst, sizeof(dst));
	struct nest n1 = { 0 };
	struct rec r2 = { 0 };
	struct tpb_op a = { .xfers = &rx, .n_xfers = 1, .xfer_id = 1, .done = close_and_nest,
			    .arg = &n1 };
	struct tpb_op b = { .xfers = &rx, .n_xfers = 1, .xfer_id = 2, .done = op_done, .arg = &r2 };
	struct fx f;

	fx_setup(&f, 1);
	n1.f = &f;
	ck_assert_int_eq(tpb_start(f.eb, &a), 0);
	ck_assert_int_eq(tpb_start(f.eb, &b), 0);
	ck_assert_int_eq(tpb_cancel(f.eb, &a), 0);
	ck_assert_int_eq(tpb_cancel(f.eb, &b), 0);
	ck_assert(run_until(&f, &n1.rec.calls, &r2.calls));
	ck_assert_int_eq(n1.rec.status, -ECANCELED);
	ck_assert_int_eq(r2.status, -ECANCELED);
	for (int i = 0; i < 20; i++)
		pump(&f, 1);
	ck_assert_int_eq(n1.rec.calls + r2.calls, 2);
	fx_teardown(&f);
}
END_TEST

START_TEST(test_mpt_refuses_bad_calls_without_a_callback)
{
	uint8_t buf[16];
	struct tpb_xfer mixed[2] = { in(buf, 8), out(buf, 8) };
	struct tpb_xfer local = { .src = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)buf },
				  .dst = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)buf },
				  .len = 8 };
	struct rec r = { 0 };
	struct tpb_op op = { .xfers = mixed, .n_xfers = 2, .xfer_id = 3, .done = op_done,
			     .arg = &r };
	struct tpb_peer nolink = { .name = "X" };
	struct tpb_ep *ep = NULL;
	struct fx f;

	fx_setup(&f, 1);
	ck_assert_int_eq(tpb_ep_open(f.ctx, NULL, &ep), -EOPNOTSUPP); /* not this host */
	ck_assert_int_eq(tpb_ep_open(f.ctx, &nolink, &ep), -EOPNOTSUPP);
	ck_assert_ptr_null(ep);
	ck_assert_int_eq(tpb_start(f.ea, &op), -EINVAL);
	op.xfers = &local;
	op.n_xfers = 1;
	ck_assert_int_eq(tpb_start(f.ea, &op), -EINVAL);
	op.xfers = mixed;
	op.n_xfers = 1;
	op.xfer_id = 0; /* a receive needs an id */
	ck_assert_int_eq(tpb_start(f.eb, &op), -EINVAL);
	ck_assert_int_eq(tpb_cancel(f.eb, &op), -ENOENT);
	ck_assert_int_eq(tpb_prepare(f.eb, &op, buf, &(size_t){ sizeof(buf) }), -EOPNOTSUPP);
	for (int i = 0; i < 20; i++)
		pump(&f, 1);
	ck_assert_int_eq(r.calls, 0);
	fx_teardown(&f);
}
END_TEST

/*
 * cuda_basic's row: endpoints on the mpt context's second head, over the same stripes. A send
 * and a receive through them complete from the mpt context's progress, count under cuda_basic,
 * and the receive takes the sender's word; the row has no context of its own.
 */
START_TEST(test_cuda_basic_endpoints_ride_the_mpt_context)
{
	enum { LEN = 200000 };
	uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
	struct tpb_xfer sx = out(src, LEN), rx = in(dst, LEN);
	struct rec rs = { 0 }, rr = { 0 };
	struct tpb_op s = { .xfers = &sx, .n_xfers = 1, .xfer_id = 9, .done = op_done, .arg = &rs };
	struct tpb_op r = { .xfers = &rx, .n_xfers = 1, .xfer_id = 9, .done = op_done, .arg = &rr };
	struct tpb_ctx *cb, *none = NULL;
	struct tpb_ep *ca, *cbe;
	struct fx f;

	for (size_t i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 13 + 1);
	fx_setup(&f, 2);
	cb = tpb_mpt_cuda_basic_ctx(f.ctx);
	ck_assert_ptr_nonnull(cb);
	ck_assert_ptr_null(tpb_mpt_cuda_basic_ctx(NULL));
	ck_assert_ptr_null(tpb_mpt_cuda_basic_ctx(cb)); /* a head of mpt's, not mpt's own */
	ck_assert_int_eq(cb->idx, tpb_index("cuda_basic"));
	ck_assert_int_eq(tpb_ctx_new(tpb_index("cuda_basic"), NULL, NULL, &none), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_open(cb, &f.pa, &ca), 0);
	ck_assert_int_eq(tpb_ep_open(cb, &f.pb, &cbe), 0);
	ck_assert_int_eq(tpb_start(cbe, &r), 0);
	ck_assert_int_eq(tpb_start(ca, &s), 0);
	ck_assert_int_eq(r.channel, tpb_index("cuda_basic"));
	ck_assert_int_eq(tpb_recv_expect(cbe, &r, LEN, 0, NULL), 0); /* every byte: no change */
	ck_assert(run_until(&f, &rs.calls, &rr.calls));
	ck_assert_int_eq(rs.status, 0);
	ck_assert_int_eq(rr.status, 0);
	ck_assert_uint_eq(rr.bytes, LEN);
	ck_assert_int_eq(memcmp(src, dst, LEN), 0);
	ck_assert_int_eq(tpb_recv_expect(cbe, &r, LEN, 0, NULL), -ENOENT); /* delivered */
	tpb_ep_close(ca);
	tpb_ep_close(cbe);
	fx_teardown(&f);
	free(src);
	free(dst);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mpt");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_mpt_send_and_receive_complete_once_from_progress);
	tcase_add_test(tc, test_mpt_cancel_and_the_senders_word_end_a_receive);
	tcase_add_test(tc, test_mpt_closed_endpoint_and_freed_stripe_end_their_ops_once);
	tcase_add_test(tc, test_mpt_endpoint_closed_inside_a_callback_outlives_nested_progress);
	tcase_add_test(tc, test_mpt_refuses_bad_calls_without_a_callback);
	tcase_add_test(tc, test_cuda_basic_endpoints_ride_the_mpt_context);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
