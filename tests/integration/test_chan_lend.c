/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: private channel items lent, not copied (issue 25 part private;
 * docs/channels.md "Private items: staging buffers lent"). The library lends the staging buffer
 * of a write's private items to the channel and takes it back only when the daemon says its
 * items have left: items of every size around the thresholds (16 KiB, 256 KiB) written from one
 * private buffer the writer overwrites at once, more of them than the library lends at a time,
 * arrive byte-exact and in order, twice over (the buffers given back are reused); items of a
 * writer that dies without releasing anything stay readable, byte-exact, and once read leave
 * the channel's whole capacity free again (a lent buffer's charge goes with its last item);
 * a reader that dies while the daemon holds a lent item for it loses the item to nobody; two
 * threads writing through one handle at once (its lent buffers shared between them) get every
 * item through byte-exact, each thread's in its order.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define MIB (1u << 20)

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

static struct tp_context *ctx_new(void)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(&tpt_fixture_daemon, 0, "chanlend", &ctx) < 0)
		return NULL;
	return ctx;
}

/* Item @i's length: around the inline and staging thresholds, and larger. */
static size_t lend_len(unsigned i)
{
	static const size_t lens[] = { TPW_CHAN_SHM_ITEM, TPW_CHAN_SHM_ITEM + 1, 64u << 10,
				       TPW_CHAN_INLINE_ITEM, TPW_CHAN_INLINE_ITEM + 1, MIB,
				       MIB + 3, 3 * MIB + 1 };

	return lens[i % TPU_ARRAY_SIZE(lens)];
}

/* Reads @n items of @ch, in order from @first, each byte-exact (pattern of seed @round, i). */
static void read_check(struct tp_chan *ch, unsigned round, unsigned first, unsigned n,
		       uint8_t *buf, size_t room)
{
	size_t len, bad = 0;

	for (unsigned i = first; i < first + n; i++) {
		ck_assert_int_ge(tp_chan_read_into(ch, buf, room, &len, T_MS), 0);
		ck_assert_uint_eq(len, lend_len(i));
		if (!tpt_verify(buf, len, tpt_seed(round, i, 0), &bad))
			ck_abort_msg("round %u item %u (%zu bytes): byte %zu differs", round, i, len,
				     bad);
	}
}

/* 80 items (about 56 MiB: more than the library lends at once), batches of 4 written from one
 * private buffer per item slot that the writer overwrites for the next batch at once; nobody
 * reads until all are written; then all are read, in order. Twice: the second round's writes
 * get the first round's buffers back. */
START_TEST(test_lent_items_stay_exact_while_the_writer_reuses_its_memory)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = 64 * MIB };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch;
	uint8_t *src[4], *dst = malloc(4 * MIB);
	struct iovec iov[4];

	ck_assert_ptr_nonnull(ctx);
	ck_assert_ptr_nonnull(dst);
	for (unsigned k = 0; k < 4; k++)
		ck_assert_ptr_nonnull(src[k] = malloc(4 * MIB));
	ck_assert_int_eq(tp_chan_open(ctx, "lend.reuse", &o, &ch), 0);
	for (unsigned round = 0; round < 2; round++) {
		for (unsigned i = 0; i < 80; i += 4) {
			for (unsigned k = 0; k < 4; k++) {
				iov[k] = (struct iovec){ .iov_base = src[k],
							 .iov_len = lend_len(i + k) };
				tpt_fill(src[k], iov[k].iov_len, tpt_seed(round, i + k, 0));
			}
			ck_assert_msg(tp_chan_write(ch, iov, 4, 0) == 0, "round %u write %u: %s",
				      round, i, tp_last_error());
		}
		for (unsigned k = 0; k < 4; k++) /* the writer's memory is its own again */
			memset(src[k], 0xee, 4 * MIB);
		read_check(ch, round, 0, 80, dst, 4 * MIB);
	}
	for (unsigned k = 0; k < 4; k++)
		free(src[k]);
	free(dst);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
}
END_TEST

struct dead_writer {
	unsigned n;
};

/* Writes @arg's items (batches of 2) and exits without releasing its handle or its context. */
static int dying_writer(void *arg)
{
	const struct dead_writer *dw = arg;
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch;
	uint8_t *src[2];
	struct iovec iov[2];

	TPT_REQUIRE(ctx && tp_chan_open(ctx, "lend.dead", &o, &ch) == 0, 1, "open");
	for (unsigned k = 0; k < 2; k++)
		TPT_REQUIRE(src[k] = malloc(4 * MIB), 1, "memory");
	for (unsigned i = 0; i < dw->n; i += 2) {
		for (unsigned k = 0; k < 2; k++) {
			iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = lend_len(i + k) };
			tpt_fill(src[k], iov[k].iov_len, tpt_seed(7, i + k, 0));
		}
		TPT_REQUIRE(tp_chan_write(ch, iov, 2, T_MS) == 0, 1, "write %u: %s", i,
			    tp_last_error());
	}
	_exit(0); /* no release: the session ends with the process */
}

/* A writer process writes 16 items and dies; its items stay, byte-exact. Once read, the
 * channel (16 MiB) takes one 16 MiB item at once: no charge of a lent buffer outlived it. */
START_TEST(test_lent_items_outlive_their_writer)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = 16 * MIB };
	struct dead_writer dw = { .n = 16 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *buf = malloc(16 * MIB);
	struct iovec iov = { .iov_base = buf, .iov_len = 16 * MIB };
	size_t len;
	pid_t pid;

	ck_assert_ptr_nonnull(buf);
	ctx = ctx_new();
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(tp_chan_open(ctx, "lend.dead", &o, &ch), 0);
	pid = tpt_fork(dying_writer, &dw);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "dying writer"));
	for (unsigned i = 0; i < dw.n; i++) {
		size_t bad = 0;

		ck_assert_int_ge(tp_chan_read_into(ch, buf, 16 * MIB, &len, T_MS), 0);
		ck_assert_uint_eq(len, lend_len(i));
		ck_assert_msg(tpt_verify(buf, len, tpt_seed(7, i, 0), &bad),
			      "item %u: byte %zu differs", i, bad);
	}
	memset(buf, 0x3c, 16 * MIB);
	ck_assert_msg(tp_chan_write(ch, &iov, 1, 0) == 0, "the whole capacity: %s",
		      tp_last_error());
	ck_assert_int_ge(tp_chan_read_into(ch, buf, 16 * MIB, &len, T_MS), 0);
	ck_assert_uint_eq(len, 16 * MIB);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
	free(buf);
}
END_TEST

/* A raw reader: a READ without a destination, answered with the length of the item the daemon
 * now holds for it (ChanReply.held_len); then it exits. */
static int holding_reader(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw r;
	uint64_t id;

	(void)arg;
	TPT_REQUIRE(tpt_raw_connect(&r, tpt_fixture_daemon.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "lend.held";
	op.req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send open");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "open answer");
	id = dm->chan_reply->chan_id;
	TPT_REQUIRE(dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK, 1, "open refused");
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.req_id = 2;
	op.timeout_ms = T_MS;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send read");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "read answer");
	TPT_REQUIRE(dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK &&
		    dm->chan_reply->held_len == MIB, 1, "not held: status %d, held %llu",
		    dm->chan_reply->status, (unsigned long long)dm->chan_reply->held_len);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	_exit(0); /* dies holding the item */
}

/* A reader that dies while the daemon holds a lent item for it: the item goes back to the
 * head, the next reader gets it byte-exact, then the one behind it. */
START_TEST(test_reader_dying_with_a_lent_item_loses_nothing)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(tp_chan_open(ctx, "lend.held", &o, &ch), 0);
	tpt_chan_items_survive(ch, 9, holding_reader, "holding reader");
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
}
END_TEST

struct twin {
	struct tp_chan *ch;
	unsigned t;
	int err;
};

#define TWIN_BATCHES 40

/* Writes TWIN_BATCHES batches of 2 items of 1 MiB (pattern of seed t, index) through one
 * handle, its buffers overwritten for each batch; a batch refused because the other thread's
 * write waits for room (nothing written) goes again. */
static void *twin_writer(void *arg)
{
	struct twin *tw = arg;
	uint8_t *src[2] = { malloc(MIB), malloc(MIB) };
	struct iovec iov[2];

	for (unsigned i = 0; src[0] && src[1] && !tw->err && i < 2 * TWIN_BATCHES; i += 2) {
		for (unsigned k = 0; k < 2; k++) {
			tpt_fill(src[k], MIB, tpt_seed(10 + tw->t, i + k, 0));
			iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = MIB };
		}
		do /* one write of a handle waits for room at a time: the other is refused */
			tw->err = tp_chan_write(tw->ch, iov, 2, T_MS);
		while (tw->err == -ENOBUFS);
	}
	if (!src[0] || !src[1])
		tw->err = -ENOMEM;
	free(src[0]);
	free(src[1]);
	return NULL;
}

START_TEST(test_two_threads_lend_through_one_handle)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = 16 * MIB };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch, *rd;
	struct twin tw[2];
	pthread_t th[2];
	uint8_t *dst = malloc(MIB);
	unsigned next[2] = { 0, 0 };
	size_t len;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_ptr_nonnull(dst);
	ck_assert_int_eq(tp_chan_open(ctx, "lend.twin", &o, &ch), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(ctx, "lend.twin", &o, &rd), 0);
	for (unsigned t = 0; t < 2; t++) {
		tw[t] = (struct twin){ .ch = ch, .t = t };
		ck_assert_int_eq(pthread_create(&th[t], NULL, twin_writer, &tw[t]), 0);
	}
	for (unsigned n = 0; n < 4 * TWIN_BATCHES; n++) { /* this thread reads them all */
		unsigned t;

		ck_assert_int_ge(tp_chan_read_into(rd, dst, MIB, &len, T_MS), 0);
		ck_assert_uint_eq(len, MIB);
		for (t = 0; t < 2; t++)
			if (next[t] < 2 * TWIN_BATCHES &&
			    tpt_verify(dst, MIB, tpt_seed(10 + t, next[t], 0), NULL))
				break;
		ck_assert_msg(t < 2, "item %u is neither thread's next (%u, %u)", n, next[0],
			      next[1]);
		next[t]++;
	}
	for (unsigned t = 0; t < 2; t++) {
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		ck_assert_msg(tw[t].err == 0, "thread %u: %d", t, tw[t].err);
	}
	ck_assert_int_eq(tp_chan_read_into(rd, dst, MIB, &len, 0), -EAGAIN);
	free(dst);
	ck_assert_int_eq(tp_chan_release(rd), 0);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
}
END_TEST

/* A channel freed with items in it (its last handle released): a lent item, an item copied in
 * from a shared buffer (kept by the daemon as a spare buffer) and an inline one, in turn; each
 * is unlinked before the next is freed (the spare one used to be unlinked from a list whose
 * previous item was already freed). Twenty times, then the daemon still serves, and it exits
 * cleanly at the end. */
START_TEST(test_a_channel_freed_with_lent_and_copied_items)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	uint8_t *priv = malloc(MIB), *shm = NULL;
	struct iovec iov[3];
	struct tp_chan *ch;
	size_t len;

	ck_assert(ctx && priv);
	ck_assert_int_eq(tp_buffer_alloc(ctx, MIB, (void **)&shm), 0);
	memset(priv, 1, MIB);
	memset(shm, 2, MIB);
	iov[0] = (struct iovec){ .iov_base = priv, .iov_len = MIB };
	iov[1] = (struct iovec){ .iov_base = shm, .iov_len = MIB };
	iov[2] = (struct iovec){ .iov_base = priv, .iov_len = 100 };
	for (unsigned i = 0; i < 20; i++) {
		ck_assert_int_eq(tp_chan_open(ctx, "lend.freed", &o, &ch), 0);
		for (unsigned k = 0; k < 3; k++)
			ck_assert_msg(tp_chan_write(ch, &iov[k], 1, T_MS) == 0, "%u.%u: %s", i, k,
				      tp_last_error());
		ck_assert_int_eq(tp_chan_release(ch), 0);
	}
	ck_assert_int_eq(tp_chan_open(ctx, "lend.freed", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write(ch, &iov[1], 1, T_MS), 0);
	ck_assert_int_ge(tp_chan_read_into(ch, priv, MIB, &len, T_MS), 0);
	ck_assert_uint_eq(len, MIB);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(tp_buffer_free(ctx, shm), 0);
	tp_context_free(ctx);
	free(priv);
}
END_TEST

static Suite *chan_lend_suite(void)
{
	Suite *s = suite_create("chan_lend");
	TCase *tc = tcase_create("lend");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_lent_items_stay_exact_while_the_writer_reuses_its_memory);
	tcase_add_test(tc, test_lent_items_outlive_their_writer);
	tcase_add_test(tc, test_reader_dying_with_a_lent_item_loses_nothing);
	tcase_add_test(tc, test_two_threads_lend_through_one_handle);
	tcase_add_test(tc, test_a_channel_freed_with_lent_and_copied_items);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chan_lend_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
