/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: batch reads packed into one caller buffer, tp_chan_read_many_into()
 * (docs/channels.md "Batch reads"). Items land back to back, each at a multiple of 64 bytes
 * from the buffer, byte-exact; a buffer that fits exactly k items takes k and the rest stay in
 * the channel, first and in order, for another handle; a buffer smaller than the first item
 * gets -EMSGSIZE with its length and the item stays; items of 1 byte, primes, 256 KiB (inline)
 * and 256 KiB + 1 (alone, into the buffer, private or shared); a closed and a drained channel;
 * an empty one with timeout 0; a message item refused and left first; reads interleaved with
 * tp_chan_read_many() and tp_chan_read_into() on one handle; four reader processes that take
 * each of 3000 items exactly once.
 */
#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "itest.h"
#include "tpu.h"

#define T_MS 30000
#define KIB 1024u
#define BIG (256u * KIB) /* the largest item that rides inline */

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

	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "packed", &ctx), 0);
	return ctx;
}

static struct tp_chan *chan_open(struct tp_context *ctx, const char *name)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_chan *ch = NULL;

	ck_assert_msg(tp_chan_open(ctx, name, &o, &ch) == 0, "open: %s", tp_last_error());
	return ch;
}

/* Item @i of @len bytes: its index first, then bytes derived from (i, offset). */
static void item_fill(uint8_t *p, uint32_t i, size_t len)
{
	uint32_t x = 2654435761u * (i + 1);

	for (size_t k = 0; k < len; k++) {
		x = x * 1103515245u + 12345u;
		p[k] = (uint8_t)(x >> 16);
	}
	memcpy(p, &i, len < sizeof(i) ? len : sizeof(i));
}

/* Whether @p (@len bytes) is item @i of @len bytes. */
static bool item_is(const uint8_t *p, uint32_t i, size_t len)
{
	uint8_t *want = malloc(len ? len : 1);
	bool ok;

	ck_assert_ptr_nonnull(want);
	item_fill(want, i, len);
	ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

/* Writes items @first.. of @lens (@n) to @ch in one batch, from private memory. */
static void write_items(struct tp_chan *ch, uint32_t first, const size_t *lens, size_t n)
{
	struct iovec iov[64] = { { 0 } };

	ck_assert_uint_le(n, 64);
	for (size_t k = 0; k < n; k++) {
		iov[k].iov_len = lens[k];
		ck_assert_ptr_nonnull(iov[k].iov_base = malloc(lens[k]));
		item_fill(iov[k].iov_base, first + (uint32_t)k, lens[k]);
	}
	ck_assert_msg(tp_chan_write(ch, iov, n, T_MS) == 0, "write: %s", tp_last_error());
	for (size_t k = 0; k < n; k++)
		free(iov[k].iov_base);
}

/* As write_items(), from one shared buffer of @ctx (items by reference, copied in by the daemon,
 * never lent nor read by mapping). */
static void write_items_shm(struct tp_context *ctx, struct tp_chan *ch, uint32_t first,
			    const size_t *lens, size_t n)
{
	struct iovec iov[64] = { { 0 } };
	size_t total = 0;
	uint8_t *b = NULL;

	ck_assert_uint_le(n, 64);
	for (size_t k = 0; k < n; k++)
		total += lens[k];
	ck_assert_int_eq(tp_buffer_alloc(ctx, total, (void **)&b), 0);
	total = 0;
	for (size_t k = 0; k < n; k++) {
		iov[k] = (struct iovec){ .iov_base = b + total, .iov_len = lens[k] };
		item_fill(iov[k].iov_base, first + (uint32_t)k, lens[k]);
		total += lens[k];
	}
	ck_assert_msg(tp_chan_write(ch, iov, n, T_MS) == 0, "write: %s", tp_last_error());
	tp_buffer_free(ctx, b);
}

/* The offset of the item after one at @off of @len bytes: the next multiple of 64. */
static size_t next_off(size_t off, size_t len)
{
	return (off + len + 63) / 64 * 64;
}

/* Checks @items (@n) of a read into @buf: items @first.. of @lens, packed from @buf. */
static void check_packed(const uint8_t *buf, const struct tp_chan_item *items, size_t n,
			 uint32_t first, const size_t *lens)
{
	size_t off = 0;

	for (size_t k = 0; k < n; k++) {
		ck_assert_ptr_eq(items[k].data, buf + off);
		ck_assert_uint_eq((uintptr_t)items[k].data % TP_CHAN_PACK_ALIGN, 0);
		ck_assert_uint_eq(items[k].len, lens[k]);
		ck_assert_msg(item_is(items[k].data, first + (uint32_t)k, lens[k]),
			      "item %u of %zu bytes is wrong", first + (unsigned)k, lens[k]);
		off = next_off(off, lens[k]);
	}
}

/* Items of 1 byte, primes and 256 KiB come in one answer, each at the next multiple of 64
 * bytes (the buffer 64-aligned), byte-exact; a 256 KiB + 1 item comes alone, at the start. */
START_TEST(test_packed_layout_and_alignment)
{
	static const size_t lens[] = { 1, 2, 3, 61, 64, 65, 127, 4093, 65521, BIG, 7 };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.layout");
	size_t big = BIG + 1, n = 0, size = 2 * BIG;
	struct tp_chan_item items[64];
	uint8_t *buf = NULL;
	int r;

	ck_assert_int_eq(posix_memalign((void **)&buf, 64, size), 0);
	ck_assert_int_eq(tp_chan_write(ch, &(struct iovec){ .iov_base = buf, .iov_len = 0 }, 1, 0),
			 -EINVAL); /* (a channel takes no empty byte item) */
	write_items(ch, 0, lens, TPU_ARRAY_SIZE(lens));
	write_items(ch, 100, &big, 1);
	r = tp_chan_read_many_into(ch, buf, size, items, 64, &n, T_MS);
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(n, TPU_ARRAY_SIZE(lens));
	check_packed(buf, items, n, 0, lens);
	memset(buf, 0, size);
	r = tp_chan_read_many_into(ch, buf, size, items, 64, &n, T_MS);
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(n, 1);
	check_packed(buf, items, n, 100, &big);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, size, items, 64, &n, 0), -EAGAIN);
	free(buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A buffer that fits exactly 3 items of 1000 bytes packed (3048 bytes) takes 3; one byte less
 * takes 2; @max takes fewer still; the rest stay in the channel in order, and another handle
 * (of another context) reads them. */
START_TEST(test_exact_fit_takes_k_rest_stay)
{
	size_t lens[10], n = 0;
	struct tp_context *ctx = ctx_new(), *other = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.fit"), *ch2 = chan_open(other, "packed.fit");
	struct tp_chan_item items[16];
	uint8_t *buf = NULL;
	void *item;
	size_t len;

	for (size_t k = 0; k < 10; k++)
		lens[k] = 1000;
	ck_assert_int_eq(posix_memalign((void **)&buf, 64, 4096), 0);
	write_items(ch, 0, lens, 10);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 2 * 1024 + 1000, items, 16, &n, 0), 0);
	ck_assert_uint_eq(n, 3);
	check_packed(buf, items, n, 0, lens);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 2 * 1024 + 999, items, 16, &n, 0), 0);
	ck_assert_uint_eq(n, 2);
	check_packed(buf, items, n, 3, lens);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 4096, items, 1, &n, 0), 0);
	ck_assert_uint_eq(n, 1);
	check_packed(buf, items, n, 5, lens);
	for (uint32_t i = 6; i < 10; i++) { /* the rest, in order, through another handle */
		ck_assert_int_eq(tp_chan_read(ch2, &item, &len, 0), 0);
		ck_assert_uint_eq(len, 1000);
		ck_assert(item_is(item, i, len));
		free(item);
	}
	ck_assert_int_eq(tp_chan_read(ch2, &item, &len, 0), -EAGAIN);
	free(buf);
	tp_chan_release(ch);
	tp_chan_release(ch2);
	tp_context_free(ctx);
	tp_context_free(other);
}
END_TEST

/* A buffer one byte smaller than the first item (inline: 5000 bytes; large: 256 KiB + 1, in
 * private memory and in a shared buffer): -EMSGSIZE, items[0].len the item's length, and the
 * item stays first: another handle reads it, then the next. */
START_TEST(test_first_too_large_stays_first)
{
	size_t lens[2] = { _i ? BIG + 1 : 5000, 11 }, n = 0, len;
	struct tp_context *ctx = ctx_new(), *other = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.big"), *ch2 = chan_open(other, "packed.big");
	struct tp_chan_item items[4] = { { 0 } };
	bool shared = _i == 2;
	void *buf = NULL, *item;
	int r;

	if (shared)
		ck_assert_int_eq(tp_buffer_alloc(ctx, lens[0] + 64, &buf), 0);
	else
		ck_assert_ptr_nonnull(buf = malloc(lens[0] + 64));
	write_items(ch, 0, lens, 2);
	r = tp_chan_read_many_into(ch, buf, lens[0] - 1, items, 4, &n, 0);
	ck_assert_msg(r == -EMSGSIZE, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(items[0].len, lens[0]);
	ck_assert_int_eq(tp_chan_read(ch2, &item, &len, 0), 0);
	ck_assert_uint_eq(len, lens[0]);
	ck_assert(item_is(item, 0, len));
	free(item);
	/* now the buffer fits it exactly, and the next too (not into the same answer when large) */
	write_items(ch, 2, lens, 1);
	r = tp_chan_read_many_into(ch, buf, lens[0] + 64, items, 4, &n, 0);
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(n, _i ? 1 : 2);
	ck_assert(item_is(items[0].data, 1, 11));
	if (!_i)
		ck_assert(item_is(items[1].data, 2, lens[0]));
	else {
		r = tp_chan_read_many_into(ch, buf, lens[0], items, 4, &n, 0);
		ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
		ck_assert_uint_eq(n, 1);
		ck_assert_ptr_eq(items[0].data, buf);
		ck_assert(item_is(buf, 2, lens[0]));
	}
	if (shared)
		tp_buffer_free(ctx, buf);
	else
		free(buf);
	tp_chan_release(ch);
	tp_chan_release(ch2);
	tp_context_free(ctx);
	tp_context_free(other);
}
END_TEST

/* A closed channel: the last items with TP_CHAN_CLOSED, then -EPIPE; an empty open one with
 * timeout 0: -EAGAIN; a message item: -EOPNOTSUPP, and it stays first. */
START_TEST(test_closed_empty_and_message)
{
	static const size_t lens[] = { 13, 17 };
	struct tp_payload p = { .data = "msg", .length = 3 };
	struct tp_message m = { .payloads = &p, .n_payloads = 1 };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.closed");
	struct tp_descriptor *d = NULL;
	struct tp_chan_item items[4];
	uint8_t buf[256];
	size_t n = 0;

	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 4, &n, 0), -EAGAIN);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 4, &n, 50),
			 -ETIMEDOUT);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 4, &n, 0),
			 -EOPNOTSUPP);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	write_items(ch, 0, lens, 2);
	ck_assert_int_eq(tp_chan_close(ch), 0);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 4, &n, 0),
			 TP_CHAN_CLOSED);
	ck_assert_uint_eq(n, 2);
	ck_assert(item_is(items[1].data, 1, 17));
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 4, &n, 0), -EPIPE);
	ck_assert_int_eq(tp_chan_read_many_into(NULL, buf, sizeof(buf), items, 4, &n, 0), -EINVAL);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 0, items, 4, &n, 0), -EINVAL);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, sizeof(buf), items, 0, &n, 0), -EINVAL);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* On one handle, packed reads between tp_chan_read_many() and tp_chan_read_into() take the
 * items in channel order, each once. */
START_TEST(test_interleaved_with_read_many_and_into)
{
	size_t lens[40], n = 0, len;
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.mix");
	struct tp_chan_item items[8];
	uint32_t next = 0;
	uint8_t *buf;

	ck_assert_int_eq(posix_memalign((void **)&buf, 64, 64 * KIB), 0);
	for (size_t k = 0; k < 40; k++)
		lens[k] = 100 + 37 * k;
	write_items(ch, 0, lens, 40);
	for (int round = 0; next < 40; round++) {
		switch (round % 3) {
		case 0:
			ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 64 * KIB, items, 3, &n, 0),
					 0);
			check_packed(buf, items, n, next, lens + next);
			break;
		case 1:
			ck_assert_int_eq(tp_chan_read_many(ch, items, 2, &n, 0), 0);
			for (size_t k = 0; k < n; k++) {
				ck_assert(item_is(items[k].data, next + (uint32_t)k, lens[next + k]));
				free(items[k].data);
			}
			break;
		default:
			ck_assert_int_eq(tp_chan_read_into(ch, buf, 64 * KIB, &len, 0), 0);
			ck_assert_uint_eq(len, lens[next]);
			ck_assert(item_is(buf, next, len));
			n = 1;
		}
		ck_assert_uint_ge(n, 1);
		next += (uint32_t)n;
	}
	ck_assert_uint_eq(next, 40);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, 64 * KIB, items, 8, &n, 0), -EAGAIN);
	free(buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

#define N_SPREAD 3000u

static size_t spread_len(uint32_t i)
{
	return 4 + (i * 7919u) % (70 * KIB); /* 4 bytes (its index) to 70 KiB */
}

/* A reader process: packed reads into a 200 KiB buffer until the channel is drained, each item
 * checked and counted in @arg (N_SPREAD counters, shared). */
static int spread_reader(void *arg)
{
	atomic_uint *got = arg;
	struct tp_chan_item items[32];
	struct tp_context *ctx = NULL;
	struct tp_chan *ch = NULL;
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	uint8_t *buf = malloc(200 * KIB);
	uint32_t i;
	size_t n;
	int r;

	TPT_REQUIRE(buf && tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &ctx) == 0, 1, "ctx");
	TPT_REQUIRE(tp_chan_open(ctx, "packed.spread", &o, &ch) == 0, 1, "open");
	for (;;) {
		r = tp_chan_read_many_into(ch, buf, 200 * KIB, items, 32, &n, T_MS);
		if (r == -EPIPE)
			break;
		TPT_REQUIRE(r >= 0, 1, "read: %d %s", r, tp_last_error());
		for (size_t k = 0; k < n; k++) {
			TPT_REQUIRE(items[k].len >= 4, 1, "short item");
			memcpy(&i, items[k].data, sizeof(i));
			TPT_REQUIRE(i < N_SPREAD && items[k].len == spread_len(i) &&
				    item_is(items[k].data, i, items[k].len) &&
				    ((uint8_t *)items[k].data - buf) % 64 == 0, 1, "item %u", i);
			atomic_fetch_add(&got[i], 1);
		}
	}
	free(buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* Four reader processes take 3000 items of 4 bytes to 70 KiB: each exactly once. */
START_TEST(test_four_readers_each_item_once)
{
	atomic_uint *got = mmap(NULL, N_SPREAD * sizeof(*got), PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.spread");
	size_t lens[16];
	pid_t pids[4];

	ck_assert(got != MAP_FAILED);
	for (unsigned k = 0; k < 4; k++)
		pids[k] = tpt_fork(spread_reader, got);
	for (uint32_t i = 0; i < N_SPREAD; i += 15) {
		for (uint32_t k = 0; k < 15; k++)
			lens[k] = spread_len(i + k);
		write_items(ch, i, lens, 15);
	}
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned k = 0; k < 4; k++)
		ck_assert(tpt_wait_ok(pids[k], 4 * T_MS, "reader"));
	for (uint32_t i = 0; i < N_SPREAD; i++)
		ck_assert_msg(got[i] == 1, "item %u read %u times", i, got[i]);
	munmap(got, N_SPREAD * sizeof(*got));
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* Large items into a shared buffer come several in one answer, copied by the daemon straight
 * to their packed places (ChanOp.pack_copied): 3 of 256 KiB + 1, 300 KiB and 1 MiB in a buffer
 * that fits them; a buffer that fits 2 takes 2 and the third stays first for another handle;
 * @max 2 takes 2; an item that rides inline after large ones stays for the next read, which
 * takes it inline with those after it; private memory (through a staging buffer) gets one a
 * read. The items are written from a shared buffer (copied in, never read by mapping). */
START_TEST(test_large_items_copied_packed)
{
	static const size_t lens[] = { BIG + 1, 300 * KIB, 1024 * KIB, 5000, 7 };
	size_t all = next_off(next_off(next_off(0, lens[0]), lens[1]), lens[2]);
	struct tp_context *ctx = ctx_new(), *other = ctx_new();
	struct tp_chan *ch = chan_open(ctx, "packed.copied"), *ch2 = chan_open(other,
									       "packed.copied");
	struct tp_chan_item items[8];
	size_t n = 0, len;
	uint8_t *buf = NULL, *priv = NULL;
	void *item;

	ck_assert_int_eq(tp_buffer_alloc(ctx, all, (void **)&buf), 0);
	write_items_shm(ctx, ch, 0, lens, 5);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, all, items, 8, &n, T_MS), 0);
	ck_assert_uint_eq(n, 3);
	check_packed(buf, items, n, 0, lens);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, all, items, 8, &n, T_MS), 0);
	ck_assert_uint_eq(n, 2); /* the small ones, inline, together */
	check_packed(buf, items, n, 3, lens + 3);
	write_items_shm(ctx, ch, 10, lens, 3);
	memset(buf, 0, all);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, all - 1, items, 8, &n, T_MS), 0);
	ck_assert_uint_eq(n, 2);
	check_packed(buf, items, n, 10, lens);
	ck_assert_int_eq(tp_chan_read(ch2, &item, &len, T_MS), 0); /* the third stayed first */
	ck_assert_uint_eq(len, lens[2]);
	ck_assert(item_is(item, 12, len));
	free(item);
	write_items_shm(ctx, ch, 20, lens, 3);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, all, items, 2, &n, T_MS), 0);
	ck_assert_uint_eq(n, 2);
	check_packed(buf, items, n, 20, lens);
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, all, items, 8, &n, T_MS), 0);
	ck_assert_uint_eq(n, 1);
	check_packed(buf, items, n, 22, lens + 2);
	ck_assert_int_eq(posix_memalign((void **)&priv, 64, all), 0);
	write_items_shm(ctx, ch, 30, lens, 3);
	for (uint32_t i = 0; i < 3; i++) { /* private memory: one a call (staged), in order */
		ck_assert_int_eq(tp_chan_read_many_into(ch, priv, all, items, 8, &n, T_MS), 0);
		ck_assert_uint_eq(n, 1);
		check_packed(priv, items, n, 30 + i, lens + i);
	}
	free(priv);
	tp_buffer_free(ctx, buf);
	tp_chan_release(ch);
	tp_chan_release(ch2);
	tp_context_free(ctx);
	tp_context_free(other);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("chan_packed");
	TCase *tc = tcase_create("chan_packed");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_packed_layout_and_alignment);
	tcase_add_test(tc, test_exact_fit_takes_k_rest_stay);
	tcase_add_loop_test(tc, test_first_too_large_stays_first, 0, 3);
	tcase_add_test(tc, test_closed_empty_and_message);
	tcase_add_test(tc, test_interleaved_with_read_many_and_into);
	tcase_add_test(tc, test_four_readers_each_item_once);
	tcase_add_test(tc, test_large_items_copied_packed);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(suite());
}
