/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: channel items as messages (docs/channels.md, "Items as messages"). A
 * message's metadata, payloads and tensors come back whole for every kind of writer and reader
 * memory (private, shared buffers, carved from one buffer, mixed) and sizes that ride inline,
 * by reference and staged; empty payloads and messages without tensors or bytes; a batch of
 * messages stays contiguous against another writer; the oldest waiting reader gets the first
 * message; close then drain with message items (a held item keeps the channel from draining);
 * a released handle gives its held item back; a freed descriptor drops its item; byte items
 * read as messages of one payload and message items refuse the byte reads and stay first; the
 * message limits (payloads and tensors, metadata) just below and just above; a reader whose
 * staging buffer the daemon refuses takes its message by CMA instead.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

static struct tp_context *ctx_new(const struct tpt_daemon *d, uint32_t flags)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(d, flags, "chanmsg", &ctx) < 0)
		return NULL;
	return ctx;
}

static int chan_open(struct tp_context *ctx, const char *name, unsigned flags,
		     struct tp_chan **ret)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };

	return tp_chan_open(ctx, name, &o, ret);
}

/* `tpipctl channels --json` on @d: field @key of channel @name (-1 if absent). */
static long ctl_field(const struct tpt_daemon *d, const char *name, const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, "--json", "channels", NULL };
	struct tpt_cmd_result res;
	struct json_object *root, *arr, *v;
	long out = -1;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	root = json_tokener_parse(res.out);
	ck_assert_ptr_nonnull(root);
	ck_assert(json_object_object_get_ex(root, "channels", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *c = json_object_array_get_idx(arr, i), *n;

		if (json_object_object_get_ex(c, "name", &n) &&
		    strcmp(json_object_get_string(n), name) == 0 &&
		    json_object_object_get_ex(c, key, &v))
			out = json_object_get_int64(v);
	}
	json_object_put(root);
	tpt_cmd_result_free(&res);
	return out;
}

static void wait_readers(const char *name, long want)
{
	uint64_t end = tpt_now_ms() + T_MS;

	while (ctl_field(&tpt_fixture_daemon, name, "readers_waiting") != want)
		ck_assert_msg(tpt_now_ms() < end, "never %ld readers on %s", want, name);
}

/*
 * Creates persistent channel @name and frees the context that made it, so that the children
 * forked next inherit no context: a child forked while one of the test's io threads holds a
 * message it is dispatching inherits that message with no thread left to free it, which
 * valgrind_reads reports as a leak of the child. The caller unlinks it.
 */
static void make_persistent(const char *name)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_chan *ch;

	ck_assert_int_eq(chan_open(ctx, name, TP_CHAN_CREATE | TP_CHAN_PERSISTENT, &ch), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}

static int exit_code(pid_t pid)
{
	int st;

	ck_assert_int_eq(tpt_wait(pid, T_MS, &st), 0);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* A spec: @np payloads and @nt tensors of the lengths in @lens, metadata everywhere. */
static struct tpt_msg_spec spec(unsigned index, size_t np, size_t nt, const size_t *lens)
{
	struct tpt_msg_spec s = { .pipe = 25, .index = index, .n_payloads = np, .n_tensors = nt,
				  .meta_len = 13, .seg_meta_len = 5, .tensor_target = nt > 0 };

	memcpy(s.lens, lens, (np + nt) * sizeof(*lens));
	return s;
}

static void write_spec(struct tp_context *ctx, struct tp_chan *ch, const struct tpt_msg_spec *s,
		       enum tpt_mem mem)
{
	struct tpt_msg m;

	ck_assert_int_eq(tpt_msg_build(ctx, s, mem, &m), 0);
	ck_assert_msg(tp_chan_write_msgs(ch, &m.m, 1, T_MS) == 0, "write: %s", tp_last_error());
	tpt_msg_free(ctx, &m);
}

/* ---- contents ------------------------------------------------------------------------------ */

/* Sizes that ride inline (small), by reference or staged (above 16 KiB and 256 KiB), and
 * above the inline limit (2 MiB), in several parts and in one. */
static const size_t lens_multi[] = { 100, 40000, 0, 300000, 2 << 20 };
static const size_t lens_small[] = { 10, 20, 30 };
static const size_t lens_one[] = { 1 << 20 };

START_TEST(test_round_trip_every_slot_kind)
{
	static const enum tpt_mem kinds[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM, TPT_MEM_SLAB,
					      TPT_MEM_MIXED };
	struct tp_context *w = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_context *rd = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_context *nocma = ctx_new(&tpt_fixture_daemon, TP_CONTEXT_NO_CMA);
	struct tp_chan *wc, *rc, *nc;
	unsigned idx = 0;

	ck_assert(w && rd && nocma);
	ck_assert_int_eq(chan_open(w, "rt", TP_CHAN_CREATE, &wc), 0);
	ck_assert_int_eq(chan_open(rd, "rt", 0, &rc), 0);
	ck_assert_int_eq(chan_open(nocma, "rt", 0, &nc), 0);
	for (size_t wk = 0; wk < 4; wk++) {
		for (size_t rk = 0; rk < 4; rk++) {
			struct tpt_msg_spec s[3] = { spec(idx, 3, 2, lens_multi),
						     spec(idx + 1, 2, 1, lens_small),
						     spec(idx + 2, 0, 1, lens_one) };

			for (int k = 0; k < 3; k++)
				write_spec(w, wc, &s[k], kinds[wk]);
			for (int k = 0; k < 3; k++) {
				struct tp_context *c = k == 2 ? nocma : rd;

				ck_assert_msg(tpt_chan_msg_read_check(c, k == 2 ? nc : rc, &s[k],
								      kinds[rk], T_MS, NULL) == 0,
					      "write %s, read %s, message %d",
					      tpt_mem_name(kinds[wk]), tpt_mem_name(kinds[rk]), k);
			}
			idx += 3;
		}
	}
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "rt", "items"), 0);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "rt", "bytes"), 0);
	tp_chan_release(nc);
	tp_chan_release(rc);
	tp_chan_release(wc);
	tp_context_free(nocma);
	tp_context_free(rd);
	tp_context_free(w);
}
END_TEST

START_TEST(test_empty_payloads_and_no_tensors)
{
	static const size_t lens_empty[] = { 0, 0, 0 };
	static const size_t lens_gap[] = { 0, 70000, 0 };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tpt_msg_spec s[4] = { spec(0, 0, 0, lens_empty), spec(1, 3, 0, lens_empty),
				     spec(2, 3, 0, lens_gap), spec(3, 1, 2, lens_empty) };
	struct tp_message bare = { 0 };
	struct tp_descriptor *d;
	struct tp_chan *ch;

	ck_assert_int_eq(chan_open(ctx, "empty", TP_CHAN_CREATE, &ch), 0);
	for (int k = 0; k < 4; k++)
		write_spec(ctx, ch, &s[k], TPT_MEM_PRIVATE);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &bare, 1, 0), 0); /* nothing at all */
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "empty", "items"), 5);
	for (int k = 0; k < 4; k++)
		ck_assert_int_eq(tpt_chan_msg_read_check(ctx, ch, &s[k], TPT_MEM_SHM, T_MS, NULL),
				 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert(d->n_payloads == 0 && d->n_tensors == 0 && d->metadata_len == 0);
	ck_assert_int_eq(tp_chan_read_msg(ch, d, &(struct tp_allocation){ 0 }), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* ---- mixing -------------------------------------------------------------------------------- */

START_TEST(test_byte_and_message_items_mix)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tpt_msg_spec s = spec(0, 2, 1, lens_small);
	struct iovec bytes[2] = { { "abc", 3 }, { "defg", 4 } };
	struct tp_chan_item items[4];
	struct tp_descriptor *d;
	struct tp_chan *ch;
	char buf[16];
	size_t n, len;
	void *item;

	ck_assert_int_eq(chan_open(ctx, "mix", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(tp_chan_write(ch, bytes, 2, 0), 0);
	write_spec(ctx, ch, &s, TPT_MEM_SHM);
	ck_assert_int_eq(tp_chan_write(ch, bytes, 1, 0), 0);
	/* A byte item read as a message: one payload, no metadata. */
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert(d->n_payloads == 1 && d->n_tensors == 0 && d->metadata_len == 0 &&
		  d->payloads[0].length == 3 && d->payloads[0].metadata_len == 0);
	ck_assert_int_eq(tp_chan_read_msg(ch, d, &(struct tp_allocation){
		.payloads = (struct tp_slot[]){ { .data = buf } }, .n_payloads = 1 }), 0);
	ck_assert(memcmp(buf, "abc", 3) == 0);
	/* A batch read stops before a message item; the byte reads refuse it, it stays first. */
	ck_assert_int_eq(tp_chan_read_many(ch, items, 4, &n, 0), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert(items[0].len == 4 && memcmp(items[0].data, "defg", 4) == 0);
	free(items[0].data);
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), -EOPNOTSUPP);
	ck_assert_int_eq(tp_chan_read_into(ch, buf, sizeof(buf), &len, 0), -EOPNOTSUPP);
	ck_assert_int_eq(tp_chan_read_many(ch, items, 4, &n, 0), -EOPNOTSUPP);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "mix", "items"), 2);
	ck_assert_int_eq(tpt_chan_msg_read_check(ctx, ch, &s, TPT_MEM_PRIVATE, 0, NULL), 0);
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), 0);
	ck_assert(len == 3 && memcmp(item, "abc", 3) == 0);
	free(item);
	/* A held message item refuses a byte read of its handle too, and stays held. */
	write_spec(ctx, ch, &s, TPT_MEM_PRIVATE);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), -EOPNOTSUPP);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), -EAGAIN);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "mix", "bytes"), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* ---- close, release, drop ------------------------------------------------------------------ */

START_TEST(test_close_then_drain)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_descriptor *d, *d2;
	struct tp_chan *ch, *other;
	struct tpt_msg_spec s[3];
	bool closed;

	ck_assert_int_eq(chan_open(ctx, "cd", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(chan_open(ctx, "cd", 0, &other), 0);
	for (unsigned k = 0; k < 3; k++) {
		s[k] = spec(k, 2, 1, k == 1 ? lens_multi + 2 : lens_small);
		write_spec(ctx, ch, &s[k], TPT_MEM_PRIVATE);
	}
	ck_assert_int_eq(tp_chan_close(ch), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &(struct tp_message){ 0 }, 1, 0), -EPIPE);
	for (unsigned k = 0; k < 2; k++) {
		ck_assert_int_eq(tpt_chan_msg_read_check(ctx, other, &s[k], TPT_MEM_SHM, 0,
							 &closed), 0);
		ck_assert(closed);
	}
	/* The last item held: the channel is closed, empty, and not drained. */
	ck_assert_int_eq(tp_chan_read_descriptor(other, &d, 0), TP_CHAN_CLOSED);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d2, 0), -EAGAIN);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d2, 0), -EPIPE);
	ck_assert_int_eq(tp_chan_read_descriptor(other, &d2, -1), -EPIPE);
	tp_chan_release(other);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_release_gives_held_item_back)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_context *ctx2 = ctx_new(&tpt_fixture_daemon, 0);
	struct tpt_msg_spec s0 = spec(0, 3, 2, lens_multi), s1 = spec(1, 2, 1, lens_small);
	struct tp_chan *ch, *a, *b;
	struct tp_descriptor *d, *d2;

	ck_assert_int_eq(chan_open(ctx, "back", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(chan_open(ctx2, "back", 0, &a), 0);
	ck_assert_int_eq(chan_open(ctx2, "back", 0, &b), 0);
	write_spec(ctx, ch, &s0, TPT_MEM_SHM);
	write_spec(ctx, ch, &s1, TPT_MEM_SHM);
	ck_assert_int_eq(tp_chan_read_descriptor(a, &d, 0), 0);
	ck_assert_uint_eq(d->n_payloads, 3);
	/* A second descriptor read of the handle describes the same held item. */
	ck_assert_int_eq(tp_chan_read_descriptor(a, &d2, 0), 0);
	ck_assert_uint_eq(d2->n_payloads, 3);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "back", "items"), 1);
	ck_assert_int_eq(tp_chan_release(a), 0);
	/* The descriptors outlive their handle: freeing them drops nothing more. */
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	ck_assert_int_eq(tp_chan_descriptor_free(d2), 0);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "back", "items"), 2);
	ck_assert_int_eq(tpt_chan_msg_read_check(ctx2, b, &s0, TPT_MEM_PRIVATE, 0, NULL), 0);
	ck_assert_int_eq(tpt_chan_msg_read_check(ctx2, b, &s1, TPT_MEM_PRIVATE, 0, NULL), 0);
	tp_chan_release(b);
	tp_chan_release(ch);
	tp_context_free(ctx2);
	tp_context_free(ctx);
}
END_TEST

/* ---- several processes ----------------------------------------------------------------------- */

#define BATCHES 40
#define BATCH 4

/* Writes BATCHES batches of BATCH messages, payload (writer, batch, index), metadata "W". */
static int batch_writer(void *arg)
{
	uint32_t id = (uint32_t)(uintptr_t)arg, v[BATCH][3];
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_payload p[BATCH];
	struct tp_message m[BATCH];
	struct tp_chan *ch;

	TPT_REQUIRE(ctx && chan_open(ctx, "batch", 0, &ch) == 0, 1, "open: %s", tp_last_error());
	for (uint32_t b = 0; b < BATCHES; b++) {
		for (uint32_t k = 0; k < BATCH; k++) {
			v[k][0] = id;
			v[k][1] = b;
			v[k][2] = k;
			p[k] = (struct tp_payload){ .data = v[k], .length = sizeof(v[k]) };
			m[k] = (struct tp_message){ .metadata = "W", .metadata_len = 1,
						    .payloads = &p[k], .n_payloads = 1 };
		}
		TPT_REQUIRE(tp_chan_write_msgs(ch, m, BATCH, T_MS) == 0, 1, "write: %s",
			    tp_last_error());
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_batches_atomic_with_another_writer)
{
	struct tp_context *ctx;
	struct tp_descriptor *d;
	struct tp_chan *ch;
	uint32_t v[3];
	pid_t a, b;

	make_persistent("batch");
	a = tpt_fork(batch_writer, (void *)1);
	b = tpt_fork(batch_writer, (void *)2);
	ctx = ctx_new(&tpt_fixture_daemon, 0);
	ck_assert_int_eq(chan_open(ctx, "batch", 0, &ch), 0);
	for (unsigned i = 0; i < 2 * BATCHES * BATCH; i++) {
		ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, T_MS), 0);
		ck_assert(d->n_payloads == 1 && d->payloads[0].length == sizeof(v) &&
			  d->metadata_len == 1);
		ck_assert_int_eq(tp_chan_read_msg(ch, d, &(struct tp_allocation){
			.payloads = (struct tp_slot[]){ { .data = v } }, .n_payloads = 1 }), 0);
		ck_assert_msg(v[2] == i % BATCH, "message %u is index %u of batch %u of writer "
			      "%u: a batch was split", i, v[2], v[1], v[0]);
	}
	ck_assert_int_eq(exit_code(a), 0);
	ck_assert_int_eq(exit_code(b), 0);
	ck_assert_int_eq(tp_chan_unlink(ctx, "batch", -1), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* Waits for one message; exits 10 + its first payload byte. */
static int blocked_reader(void *arg)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	struct tp_descriptor *d;
	struct tp_chan *ch;
	uint8_t v = 0;
	int r;

	TPT_REQUIRE(ctx && chan_open(ctx, arg, 0, &ch) == 0, 1, "open: %s", tp_last_error());
	r = tp_chan_read_descriptor(ch, &d, -1);
	if (r == 0)
		r = tp_chan_read_msg(ch, d, &(struct tp_allocation){
			.payloads = (struct tp_slot[]){ { .data = &v } }, .n_payloads = 1 });
	tp_chan_release(ch);
	tp_context_free(ctx);
	return r == 0 ? 10 + v : 2;
}

START_TEST(test_oldest_waiting_reader_first)
{
	struct tp_context *ctx;
	uint8_t one = 1, two = 2;
	struct tp_payload p = { .length = 1 };
	struct tp_message m = { .payloads = &p, .n_payloads = 1 };
	struct tp_chan *ch;
	pid_t a, b;

	make_persistent("fair");
	a = tpt_fork(blocked_reader, "fair");
	wait_readers("fair", 1);
	b = tpt_fork(blocked_reader, "fair");
	wait_readers("fair", 2);
	ctx = ctx_new(&tpt_fixture_daemon, 0);
	ck_assert_int_eq(chan_open(ctx, "fair", 0, &ch), 0);
	p.data = &one;
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	ck_assert_int_eq(exit_code(a), 11); /* the first reader got the first message */
	wait_readers("fair", 1);
	p.data = &two;
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	ck_assert_int_eq(exit_code(b), 12);
	ck_assert_int_eq(tp_chan_unlink(ctx, "fair", -1), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* ---- limits -------------------------------------------------------------------------------- */

static struct tpt_daemon small_daemon;

static void small_setup(void)
{
	const char *args[] = { "--segments-max", "16", "--metadata-max", "4096", NULL };

	ck_assert_int_eq(tpt_daemon_start(&small_daemon, args), 0);
}

static void small_teardown(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&small_daemon), 0);
}

START_TEST(test_message_limits)
{
	struct tp_context *ctx = ctx_new(&small_daemon, 0);
	static uint8_t meta[4097], data[17];
	struct tp_payload p[17];
	struct tp_message m = { .payloads = p };
	struct tp_descriptor *d;
	struct tp_chan *ch;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "lim", TP_CHAN_CREATE, &ch), 0);
	for (int k = 0; k < 17; k++)
		p[k] = (struct tp_payload){ .data = &data[k], .length = 1 };
	m.n_payloads = 16; /* the daemon's segments-max */
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	m.n_payloads = 17;
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), -E2BIG);
	m.n_payloads = 1;
	m.metadata = meta;
	m.metadata_len = 4096; /* metadata-max, all of it */
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	p[0].metadata = meta;
	p[0].metadata_len = 1;
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), -EMSGSIZE);
	ck_assert_int_eq(ctl_field(&small_daemon, "lim", "items"), 2);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert_uint_eq(d->n_payloads, 16);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert_uint_eq(d->metadata_len, 4096);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_capacity_counts_message_bytes)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = 256 };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	static uint8_t meta[200];
	struct tp_message m = { .metadata = meta, .metadata_len = 200 };
	struct tp_descriptor *d;
	struct tp_chan *ch;
	long bytes;

	ck_assert_int_eq(tp_chan_open(ctx, "cap", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	bytes = ctl_field(&tpt_fixture_daemon, "cap", "bytes");
	ck_assert_int_gt(bytes, 200); /* the descriptor is charged */
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), -ENOBUFS);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 100), -ETIMEDOUT);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "cap", "bytes"), bytes); /* held */
	ck_assert_int_eq(tp_chan_read_msg(ch, d, &(struct tp_allocation){ 0 }), 0);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "cap", "bytes"), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &m, 1, 0), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A reader of another uid whose staging buffers the daemon refuses (buffer-bytes-per-uid;
 * root, the writer, is exempt): its take goes by CMA instead, nothing lost. */
static struct tpt_daemon quota_daemon;

static int quota_reader(void *arg)
{
	const struct tpt_msg_spec *s = arg;
	struct tp_context *ctx = NULL;
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = 0 };
	struct tp_chan *ch;
	int r;

	TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(4242, 4242, 4242) == 0 &&
		    setresuid(4242, 4242, 4242) == 0 &&
		    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0, 1, /* CMA: ptrace-able again */
		    "cannot become uid 4242");
	TPT_REQUIRE(tpt_ctx_new(&quota_daemon, 0, "quota", &ctx) == 0, 1, "ctx");
	TPT_REQUIRE(tp_chan_open(ctx, "quota", &o, &ch) == 0, 1, "open: %s", tp_last_error());
	r = tpt_chan_msg_read_check(ctx, ch, s, TPT_MEM_PRIVATE, T_MS, NULL);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return r == 0 ? 0 : 1;
}

START_TEST(test_refused_staging_falls_back)
{
	const char *args[] = { "--buffer-bytes-per-uid", "64K", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tpt_msg_spec s = spec(0, 3, 2, lens_multi);
	struct tp_context *ctx;
	struct tp_chan *ch;
	pid_t reader;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a reader as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&quota_daemon, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&quota_daemon), 0);
	/* The reader is forked while the test holds no context (make_persistent()): it waits in
	 * its read for the items written next. */
	o.flags = TP_CHAN_CREATE | TP_CHAN_PERSISTENT;
	ck_assert_int_eq(tpt_ctx_new(&quota_daemon, 0, "mk", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "quota", &o, &ch), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	reader = tpt_fork(quota_reader, &s);
	o.flags = 0;
	ck_assert_int_eq(tpt_ctx_new(&quota_daemon, 0, "w", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "quota", &o, &ch), 0);
	write_spec(ctx, ch, &s, TPT_MEM_PRIVATE);
	ck_assert(tpt_wait_ok(reader, T_MS, "reader"));
	ck_assert_int_eq(tp_chan_unlink(ctx, "quota", -1), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&quota_daemon), 0);
}
END_TEST

/* A batch whose descriptors make its frame larger than the daemon's frame limit (4 MiB by
 * default: five messages of 1 MiB metadata, metadata-max each) is refused by the library
 * (-EMSGSIZE) and the session goes on; three go. */
START_TEST(test_batch_above_frame_limit)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon, 0);
	static uint8_t meta[1u << 20];
	struct tp_message m[5];
	struct tp_descriptor *d;
	struct tp_chan *ch;

	for (int k = 0; k < 5; k++)
		m[k] = (struct tp_message){ .metadata = meta, .metadata_len = sizeof(meta) };
	ck_assert_int_eq(chan_open(ctx, "frame", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, m, 5, 0), -EMSGSIZE);
	ck_assert_int_eq(tp_chan_write_msgs(ch, m, 3, 0), 0);
	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), 0);
		ck_assert_uint_eq(d->metadata_len, sizeof(meta));
		ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	}
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &d, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A read the daemon refuses after the library consumed the descriptor is not -EINVAL, which
 * tells the caller it still holds the descriptor: the reader's staging buffers are refused
 * (--buffer-bytes-max), so its reads go by CMA, and the reader then makes itself
 * non-dumpable. The first such read is refused (-EPERM) and turns CMA off for the session;
 * the next one, still planned with CMA, is refused by the daemon as invalid (-EINVAL there)
 * after tp_chan_read_msg() freed the descriptor. */
START_TEST(test_refused_read_does_not_leave_the_descriptor)
{
	static const char *const args[] = { "--buffer-bytes-max", "64K", NULL };
	const size_t len = 1u << 20;
	uint8_t *src = malloc(len), *dst = malloc(len);
	struct tp_payload pay = { .data = src, .length = len };
	struct tp_message m = { .payloads = &pay, .n_payloads = 1 };
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU }, .data = dst };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	struct tp_descriptor *d;
	struct tp_context *ctx;
	struct tpt_daemon dm;
	struct tp_chan *ch;
	int r;

	ck_assert(src && dst);
	memset(src, 0x3c, len);
	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ctx = ctx_new(&dm, 0);
	ck_assert_ptr_nonnull(ctx);
	if (!tp_context_cma_ok(ctx)) {
		printf("skipped: the daemon offers no CMA here\n");
		goto out;
	}
	ck_assert_int_eq(chan_open(ctx, "refused", TP_CHAN_CREATE, &ch), 0);
	for (unsigned i = 0; i < 2; i++)
		ck_assert_msg(tp_chan_write_msgs(ch, &m, 1, T_MS) == 0, "write: %s",
			      tp_last_error());
	ck_assert_int_eq(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0); /* the forked case's own */
	for (unsigned i = 0; i < 2; i++) {
		ck_assert_int_ge(tp_chan_read_descriptor(ch, &d, T_MS), 0);
		r = tp_chan_read_msg(ch, d, &a);
		ck_assert_msg(r < 0, "read %u: CMA into a non-dumpable process went through", i);
		ck_assert_msg(r != -EINVAL, "read %u: %d (%s) tells the caller to keep the "
			      "descriptor the library freed", i, r, tp_last_error());
	}
	ck_assert_int_eq(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
	tp_chan_release(ch);
out:
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
	free(src);
	free(dst);
}
END_TEST

static Suite *chan_msg_suite(void)
{
	Suite *s = suite_create("chan_msg");
	TCase *tc = tcase_create("chan_msg");
	TCase *lim = tcase_create("limits");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_round_trip_every_slot_kind);
	tcase_add_test(tc, test_empty_payloads_and_no_tensors);
	tcase_add_test(tc, test_byte_and_message_items_mix);
	tcase_add_test(tc, test_close_then_drain);
	tcase_add_test(tc, test_release_gives_held_item_back);
	tcase_add_test(tc, test_batches_atomic_with_another_writer);
	tcase_add_test(tc, test_oldest_waiting_reader_first);
	tcase_add_test(tc, test_capacity_counts_message_bytes);
	tcase_add_test(tc, test_batch_above_frame_limit);
	tcase_add_test(tc, test_refused_read_does_not_leave_the_descriptor);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(lim, small_setup, small_teardown);
	tcase_set_timeout(lim, 60);
	tcase_add_test(lim, test_message_limits);
	tcase_add_test(lim, test_refused_staging_falls_back);
	suite_add_tcase(s, lim);
	return s;
}

int main(void)
{
	return tpt_run_suite(chan_msg_suite());
}
