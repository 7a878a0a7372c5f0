/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: lent private items read by mapping (issue 25 part map; docs/channels.md
 * "Private items read by mapping"). A reader's library maps the writer's lent buffer read-only
 * and copies the item out of it itself; the daemon copies none of its bytes. Items around the
 * thresholds (16 KiB - 1, 16 KiB, 256 KiB, 1 MiB, 16 MiB + 3) arrive byte-exact, read into the
 * caller's memory and into allocations of the library, and the reader process holds a
 * read-only mapping of a writer's channel buffer ("memfd:tpclient-chan", r--s in
 * /proc/self/maps) afterwards, `tpipctl channels --json` counting the items read so; four
 * reader processes share 64 items, each exactly once and byte-exact; items of a writer
 * process that has exited stay readable that way; a reader that dies after the daemon handed
 * it an item by mapping, before it said it copied it out, loses the item to nobody; a reader
 * handle keeps at most CHAN_MAP_MAX (8) writers' buffers mapped (8 writers: 8 mappings; 9:
 * still 8, every item byte-exact); with --buffers-max 4 a writer lends 4 buffers of its own
 * (items read by mapping) and a 5th item goes by CMA, copied in (read byte-exact, not mapped).
 * A writer that stops writing gets its lent buffers back as soon as their items are read (a
 * notice, protocol minor 13): it holds none a bounded time later, the reader no mapping of
 * them, and the owner's chan-bytes-per-uid is free again; a raw writer of minor 13 gets one
 * notice for three buffers given up at once, one of minor 12 none. A writer ahead of its
 * reader by all it may lend waits for a lent buffer back instead of having its next item
 * copied in; one nobody reads waits once (a debug line), and never with a timeout of 0.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define KIB (1u << 10)
#define MIB (1u << 20)
#define MAP_MAX 8 /* client/lib/chan_int.h CHAN_MAP_MAX */

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

static struct tp_context *ctx_new(const char *name)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(&tpt_fixture_daemon, 0, name, &ctx) < 0)
		return NULL;
	return ctx;
}

/* Read-only shared mappings of channel buffers in this process (a reader's; a writer's own
 * are read-write). */
static unsigned reader_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], perms[8];
	unsigned n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:tpclient-chan") &&
		    sscanf(line, "%*s %7s", perms) == 1 && strcmp(perms, "r--s") == 0)
			n++;
	fclose(f);
	return n;
}

/* Read-write shared mappings of channel buffers in this process: a writer's own buffers, lent
 * or kept free. */
static unsigned writer_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], perms[8];
	unsigned n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:tpclient-chan") &&
		    sscanf(line, "%*s %7s", perms) == 1 && strcmp(perms, "rw-s") == 0)
			n++;
	fclose(f);
	return n;
}

/* Waits up to @ms for @count() to be at most @max. Return: its last value. */
static unsigned maps_wait_at_most(unsigned (*count)(void), unsigned max, int ms)
{
	unsigned n = count();

	for (int t = 0; n > max && t < ms * (int)tpt_time_scale(); t += 20) {
		usleep(20000);
		n = count();
	}
	return n;
}

/* `tpipctl channels --json`: items_mapped of channel @name (-1 if unknown). */
static long items_mapped(const char *name)
{
	return tpt_ctl_channel_field(&tpt_fixture_daemon, name, "items_mapped");
}

static const size_t sizes[] = { 16 * KIB - 1, 16 * KIB, 256 * KIB, MIB, 16 * MIB + 3 };

/* Each size twice: one item read into the caller's memory, one by tp_chan_read(). */
/* Releases reader @r and writer @w (each must succeed), then their contexts. */
static void pair_free(struct tp_chan *r, struct tp_chan *w, struct tp_context *cr,
		      struct tp_context *cw)
{
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cr);
	tp_context_free(cw);
}

START_TEST(test_items_read_by_mapping_arrive_byte_exact)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.w"), *cr = ctx_new("map.r");
	size_t room = 17 * MIB, len, bad = 0;
	uint8_t *src[2] = { malloc(room), malloc(room) }, *dst = malloc(room);
	struct tp_chan *w, *r;
	struct iovec iov[2];
	void *item;

	ck_assert(cw && cr && src[0] && src[1] && dst);
	ck_assert_int_eq(tp_chan_open(cw, "map.exact", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.exact", &o, &r), 0);
	for (unsigned s = 0; s < TPU_ARRAY_SIZE(sizes); s++) {
		for (unsigned k = 0; k < 2; k++) { /* one a write: each buffer of its own, lent */
			tpt_fill(src[k], sizes[s], tpt_seed(1, s, k));
			iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = sizes[s] };
			ck_assert_msg(tp_chan_write(w, &iov[k], 1, T_MS) == 0, "%zu: %s", sizes[s],
				      tp_last_error());
		}
		memset(src[0], 0xaa, sizes[s]); /* the writer's memory is its own again */
		ck_assert_int_ge(tp_chan_read_into(r, dst, room, &len, T_MS), 0);
		ck_assert_uint_eq(len, sizes[s]);
		ck_assert_msg(tpt_verify(dst, len, tpt_seed(1, s, 0), &bad), "%zu into: byte %zu",
			      sizes[s], bad);
		ck_assert_int_ge(tp_chan_read(r, &item, &len, T_MS), 0);
		ck_assert_uint_eq(len, sizes[s]);
		ck_assert_msg(tpt_verify(item, len, tpt_seed(1, s, 1), &bad), "%zu read: byte %zu",
			      sizes[s], bad);
		free(item);
		if (sizes[s] > 16 * KIB) /* staged, lent, and read by mapping */
			ck_assert_msg(reader_maps() >= 1, "item of %zu bytes: no buffer mapped",
				      sizes[s]);
	}
	/* Both items of 1 MiB and of 16 MiB + 3, and the one of 256 KiB read into the caller's
	 * memory (tp_chan_read() takes one of 256 KiB inline). */
	ck_assert_int_eq(items_mapped("map.exact"), 5);
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cr);
	tp_context_free(cw);
	ck_assert_uint_eq(reader_maps(), 0); /* the handle's mappings went with it */
	free(src[0]);
	free(src[1]);
	free(dst);
}
END_TEST

/*
 * A writer whose readers are far behind (what it has lent reaches a quarter of the cache) copies
 * its items of 1 MiB and more in with non-temporal stores: items of odd lengths from odd
 * addresses, several batches nobody reads yet, all read back byte-exact and in order.
 */
START_TEST(test_items_of_a_writer_far_ahead_arrive_byte_exact)
{
	static const size_t tail[] = { 0, 1, 3, 63, 64, 4095, 4097, 65537 };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("ahead.w"), *cr = ctx_new("ahead.r");
	size_t room = 2 * MIB, len, bad = 0;
	uint8_t *src = malloc(2 * room + 64), *dst = malloc(room);
	struct tp_chan *w, *r;
	struct iovec iov[2];

	ck_assert(cw && cr && src && dst);
	ck_assert_int_eq(tp_chan_open(cw, "map.ahead", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.ahead", &o, &r), 0);
	for (unsigned b = 0; b < TPU_ARRAY_SIZE(tail) / 2; b++) { /* 4 batches of 2 items */
		for (unsigned k = 0; k < 2; k++) {
			uint8_t *at = src + k * (room + 32) + 1 + b; /* odd addresses */
			size_t n = MIB + tail[2 * b + k];

			tpt_fill(at, n, tpt_seed(7, b, k));
			iov[k] = (struct iovec){ .iov_base = at, .iov_len = n };
		}
		ck_assert_msg(tp_chan_write(w, iov, 2, T_MS) == 0, "batch %u: %s", b,
			      tp_last_error());
	}
	memset(src, 0xaa, 2 * room + 64); /* the writer's memory is its own again */
	for (unsigned i = 0; i < TPU_ARRAY_SIZE(tail); i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, room, &len, T_MS), 0);
		ck_assert_uint_eq(len, MIB + tail[i]);
		ck_assert_msg(tpt_verify(dst, len, tpt_seed(7, i / 2, i % 2), &bad),
			      "item %u (%zu bytes): byte %zu", i, len, bad);
	}
	ck_assert_int_eq(items_mapped("map.ahead"), (long)TPU_ARRAY_SIZE(tail));
	pair_free(r, w, cr, cw);
	free(src);
	free(dst);
}
END_TEST

#define N_SHARED 64

struct shared_seen {
	unsigned seen[N_SHARED];
	unsigned mapped; /* reader processes that mapped a buffer */
	unsigned bad;
};

/* Reads "map.four" until it is drained; each item is one of N_SHARED patterns, marked seen. */
static int four_reader(void *arg)
{
	struct shared_seen *sh = arg;
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_context *ctx = ctx_new("map.reader");
	uint8_t *dst = malloc(MIB);
	struct tp_chan *ch;
	size_t len;
	int r;

	TPT_REQUIRE(ctx && dst && tp_chan_open(ctx, "map.four", &o, &ch) == 0, 1, "open");
	while ((r = tp_chan_read_into(ch, dst, MIB, &len, T_MS)) >= 0) {
		unsigned i;

		for (i = 0; i < N_SHARED; i++)
			if (len == MIB && tpt_verify(dst, len, tpt_seed(2, i, 0), NULL))
				break;
		if (i == N_SHARED)
			__atomic_add_fetch(&sh->bad, 1, __ATOMIC_SEQ_CST);
		else
			__atomic_add_fetch(&sh->seen[i], 1, __ATOMIC_SEQ_CST);
	}
	TPT_REQUIRE(r == -EPIPE, 1, "read: %d %s", r, tp_last_error());
	if (reader_maps())
		__atomic_add_fetch(&sh->mapped, 1, __ATOMIC_SEQ_CST);
	tp_chan_release(ch);
	tp_context_free(ctx);
	_exit(0);
}

START_TEST(test_four_reader_processes_map_and_share_the_items)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct shared_seen *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct tp_context *ctx = ctx_new("map.writer");
	uint8_t *src[4];
	struct iovec iov[4];
	struct tp_chan *ch;
	pid_t pid[4];

	ck_assert(sh != MAP_FAILED && ctx);
	memset(sh, 0, sizeof(*sh));
	ck_assert_int_eq(tp_chan_open(ctx, "map.four", &o, &ch), 0);
	for (unsigned k = 0; k < 4; k++) {
		ck_assert_ptr_nonnull(src[k] = malloc(MIB));
		pid[k] = tpt_fork(four_reader, sh);
		ck_assert_int_gt(pid[k], 0);
	}
	for (unsigned i = 0; i < N_SHARED; i += 4) {
		for (unsigned k = 0; k < 4; k++) {
			tpt_fill(src[k], MIB, tpt_seed(2, i + k, 0));
			iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = MIB };
		}
		ck_assert_msg(tp_chan_write(ch, iov, 4, T_MS) == 0, "write %u: %s", i,
			      tp_last_error());
	}
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned k = 0; k < 4; k++)
		ck_assert(tpt_wait_ok(pid[k], T_MS, "reader"));
	ck_assert_uint_eq(sh->bad, 0);
	for (unsigned i = 0; i < N_SHARED; i++)
		ck_assert_msg(sh->seen[i] == 1, "item %u seen %u times", i, sh->seen[i]);
	ck_assert_uint_ge(sh->mapped, 1);
	for (unsigned k = 0; k < 4; k++)
		free(src[k]);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
	munmap(sh, sizeof(*sh));
}
END_TEST

static size_t gone_len(unsigned i)
{
	return i % 2 ? 16 * MIB + 3 : MIB + 3;
}

/* Writes 6 items (1 MiB + 3 and 16 MiB + 3) and exits without releasing anything. */
static int gone_writer(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_context *ctx = ctx_new("map.gone");
	uint8_t *src = malloc(17 * MIB);
	struct tp_chan *ch;

	(void)arg;
	TPT_REQUIRE(ctx && src && tp_chan_open(ctx, "map.gone", &o, &ch) == 0, 1, "open");
	for (unsigned i = 0; i < 6; i++) {
		struct iovec iov = { .iov_base = src, .iov_len = gone_len(i) };

		tpt_fill(src, iov.iov_len, tpt_seed(3, i, 0));
		TPT_REQUIRE(tp_chan_write(ch, &iov, 1, T_MS) == 0, 1, "write %u: %s", i,
			    tp_last_error());
	}
	_exit(0);
}

START_TEST(test_items_of_a_writer_that_exited_are_read_by_mapping)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new("map.gone.r");
	uint8_t *dst = malloc(17 * MIB);
	struct tp_chan *ch;
	size_t len, bad = 0;
	pid_t pid;

	ck_assert(ctx && dst);
	ck_assert_int_eq(tp_chan_open(ctx, "map.gone", &o, &ch), 0);
	pid = tpt_fork(gone_writer, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "writer"));
	for (unsigned i = 0; i < 6; i++) {
		ck_assert_int_ge(tp_chan_read_into(ch, dst, 17 * MIB, &len, T_MS), 0);
		ck_assert_uint_eq(len, gone_len(i));
		ck_assert_msg(tpt_verify(dst, len, tpt_seed(3, i, 0), &bad), "item %u: byte %zu",
			      i, bad);
	}
	ck_assert_int_ge(items_mapped("map.gone"), 1);
	/* The writer is gone and no item lies in its buffers any more: the daemon retires them
	 * and this long-lived reader unmaps every one, without another read. */
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_ge(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.gone", "maps_retired"),
			 1);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.gone", "maps_held"), 0);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
	free(dst);
}
END_TEST

/* A writer releases its handle while 4 of its items (1 MiB + 3 each, in its lent buffers) are
 * still in the channel: the reader reads the first two by mapping; the buffers of the other
 * two stay mapped and readable, byte-exact, until they are taken; then every mapping of that
 * writer's buffers is dropped. */
START_TEST(test_mappings_of_a_released_writer_are_dropped_once_its_items_are_read)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.rel.w"), *cr = ctx_new("map.rel.r");
	uint8_t *src = malloc(MIB + 3), *dst = malloc(MIB + 3);
	struct iovec iov = { .iov_base = src, .iov_len = MIB + 3 };
	struct tp_chan *w, *r;
	size_t len, bad = 0;

	ck_assert(cw && cr && src && dst);
	ck_assert_int_eq(tp_chan_open(cr, "map.rel", &o, &r), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cw, "map.rel", &o, &w), 0);
	for (unsigned i = 0; i < 4; i++) {
		tpt_fill(src, MIB + 3, tpt_seed(9, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%u: %s", i, tp_last_error());
	}
	for (unsigned i = 0; i < 2; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, MIB + 3, &len, T_MS), 0);
		ck_assert_msg(len == MIB + 3 && tpt_verify(dst, len, tpt_seed(9, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
	}
	ck_assert_uint_ge(reader_maps(), 1);
	ck_assert_int_eq(tp_chan_release(w), 0); /* unregisters its buffers */
	tp_context_free(cw);
	usleep(200000); /* the notices of buffers without items, if any, come meanwhile */
	for (unsigned i = 2; i < 4; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, MIB + 3, &len, T_MS), 0);
		ck_assert_msg(len == MIB + 3 && tpt_verify(dst, len, tpt_seed(9, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
	}
	ck_assert_int_eq(items_mapped("map.rel"), 4);
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.rel", "maps_held"), 0);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cr);
	free(src);
	free(dst);
}
END_TEST

/* A burst: a writer handle lends 8 buffers (1 MiB items, one a write), all read; the
 * daemon's notice (or, had the write come first, its next write's answer) brings them back to
 * it (kept free for the next batches), and that write lends one of them again, or a new one.
 * Left unused for CHAN_OWN_IDLE_MS (1 s), the others are released: the writer keeps only the
 * buffer still lent, and the reader, told they are gone, keeps no mapping of the released
 * ones (at most that of the one lent again, which its item needs). */
START_TEST(test_a_writers_idle_buffers_are_released)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.idle.w"), *cr = ctx_new("map.idle.r");
	uint8_t *src = malloc(MIB), *dst = malloc(MIB);
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	struct tp_chan *w, *r;
	size_t len, bad = 0;

	ck_assert(cw && cr && src && dst);
	ck_assert_int_eq(tp_chan_open(cr, "map.idle", &o, &r), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cw, "map.idle", &o, &w), 0);
	for (unsigned i = 0; i < 9; i++) {
		tpt_fill(src, MIB, tpt_seed(10, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%u: %s", i, tp_last_error());
		if (i == 7) {
			for (unsigned j = 0; j < 8; j++) {
				ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0);
				ck_assert_msg(len == MIB &&
					      tpt_verify(dst, MIB, tpt_seed(10, j, 0), &bad),
					      "item %u: byte %zu", j, bad);
			}
		}
	}
	ck_assert_uint_ge(writer_maps(), 8); /* the burst's, back with the handle, and one lent */
	ck_assert_uint_ge(reader_maps(), 8);
	ck_assert_uint_le(maps_wait_at_most(writer_maps, 1, 10000), 1);
	ck_assert_uint_le(maps_wait_at_most(reader_maps, 1, 10000), 1);
	ck_assert_int_ge(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.idle", "maps_retired"),
			 7);
	ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0); /* the lent one */
	ck_assert_msg(len == MIB && tpt_verify(dst, MIB, tpt_seed(10, 8, 0), &bad), "byte %zu",
		      bad);
	ck_assert_int_eq(tp_chan_release(w), 0);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cw);
	tp_context_free(cr);
	free(src);
	free(dst);
}
END_TEST

/* An older library (protocol minor 11, a raw reader listing the keys it claims to have mapped)
 * takes an item by mapping and acknowledges it; its writer then releases everything: the
 * daemon sends it no notice (it would not know one). */
START_TEST(test_an_older_reader_gets_no_notice)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.old.w");
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	uint8_t *src = malloc(MIB);
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	Tpw__V1__DaemonMsg *dm;
	struct tp_chan *w;
	struct tpt_raw raw;
	uint64_t keys[16], id;
	int e;

	ck_assert(cw && src);
	for (unsigned i = 0; i < 16; i++)
		keys[i] = i + 1; /* every key the fresh daemon can have given */
	ck_assert_int_eq(tp_chan_open(cw, "map.old", &o, &w), 0);
	tpt_fill(src, MIB, tpt_seed(11, 0, 0));
	ck_assert_int_eq(tp_chan_write(w, &iov, 1, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(&raw, TPW__V1__ROLE__ROLE_CLIENT,
					     TPW_MINOR_CHAN_RETIRE - 1, T_MS), 0);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "map.old";
	op.req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	ck_assert_int_eq(tpt_raw_send(&raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm), 0);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.chan_id = id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.req_id = 2;
	op.timeout_ms = T_MS;
	op.map_ok = true;
	op.n_mapped = 16;
	op.mapped = keys;
	ck_assert_int_eq(tpt_raw_send(&raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm), 0);
	ck_assert_msg(dm->chan_reply->map_key && !dm->chan_reply->map_fd,
		      "not handed out by mapping");
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.map_done = true;
	ck_assert_int_eq(tpt_raw_send(&raw, &m, NULL, 0, NULL, 0, 0), 0);
	usleep(100000);
	ck_assert_int_eq(items_mapped("map.old"), 1);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cw);
	e = tpt_raw_recv(&raw, 1000, &dm, NULL, NULL);
	if (e == 0) {
		ck_assert_msg(dm->body_case != TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY ||
			      !dm->chan_reply->n_retired, "a notice to a library of minor 11");
		tpw_daemon_msg_free(dm);
	}
	ck_assert_int_eq(e, -ETIMEDOUT);
	tpt_raw_close(&raw);
	free(src);
}
END_TEST

static Tpw__V1__DaemonMsg *raw_call(struct tpt_raw *r, Tpw__V1__ChanOp *op, uint64_t req,
				    const void *tail, uint32_t tail_len);

/* A raw reader (protocol minor 9): a READ that takes a lent item by mapping and claims to have
 * mapped every buffer key the fresh daemon can have given (so that it is answered without an
 * fd, which a client off control rings could not take); it gets the item's place and exits
 * without saying it copied it out. */
static int dying_mapper(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	uint64_t keys[16];
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw r;
	uint64_t id;

	(void)arg;
	for (unsigned i = 0; i < 16; i++)
		keys[i] = i + 1;
	TPT_REQUIRE(tpt_raw_connect(&r, tpt_fixture_daemon.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello_minor(&r, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
					T_MS) == 0, 1, "hello");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "map.dying";
	op.req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send open");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "open answer");
	id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.req_id = 2;
	op.timeout_ms = T_MS;
	op.map_ok = true;
	op.n_mapped = 16;
	op.mapped = keys;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send read");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "read answer");
	TPT_REQUIRE(dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK &&
		    dm->chan_reply->map_key && !dm->chan_reply->map_fd &&
		    dm->chan_reply->n_lengths == 1 && dm->chan_reply->lengths[0] == MIB, 1,
		    "not handed out by mapping: status %d, key %" PRIu64 ", held %" PRIu64,
		    dm->chan_reply->status, dm->chan_reply->map_key, dm->chan_reply->held_len);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	_exit(0); /* dies before its READ with map_done */
}

/* As dying_mapper(), a packed read (ChanOp.pack, pack_mapped) into a shared buffer of 4 MiB it
 * registers: it gets both items of the writer's batch (one lent buffer) in one answer, at
 * their offsets in that buffer, and dies before its READ with map_done. */
static int dying_packed_mapper(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	const Tpw__V1__ChanReply *cr;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("packed", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;
	uint64_t keys[16];
	struct tpt_raw r;
	bool two;

	(void)arg;
	for (unsigned i = 0; i < 16; i++)
		keys[i] = i + 1;
	TPT_REQUIRE(fd >= 0 && ftruncate(fd, 4 * MIB) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "memfd");
	TPT_REQUIRE(tpt_raw_connect(&r, tpt_fixture_daemon.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello_minor(&r, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
					T_MS) == 0, 1, "hello");
	b.req_id = 9;
	b.buf_id = 1;
	b.gen = 1;
	b.size = 4 * MIB;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	st = tpt_raw_send(&r, &m, NULL, 0, &fd, 1, 1);
	close(fd);
	TPT_REQUIRE(st == 0, 1, "send BufferRegister");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm) == 0 &&
		    dm->reply->status == TPW__V1__STATUS__STATUS_OK, 1, "register");
	tpw_daemon_msg_free(dm);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "map.dyingp";
	dm = raw_call(&r, &op, 1, NULL, 0);
	TPT_REQUIRE(dm && dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK, 1, "open");
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = dm->chan_reply->chan_id;
	tpw_daemon_msg_free(dm);
	op.timeout_ms = T_MS;
	op.map_ok = true;
	op.n_mapped = 16;
	op.mapped = keys;
	op.pack = true;
	op.pack_mapped = true;
	op.max_items = 4;
	ref.buf_id = 1;
	ref.gen = 1;
	g.length = 4 * MIB;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	op.n_segments = 1;
	op.segments = &gp;
	dm = raw_call(&r, &op, 2, NULL, 0);
	TPT_REQUIRE(dm, 1, "no answer to the read");
	cr = dm->chan_reply;
	two = cr->status == TPW__V1__STATUS__STATUS_OK && cr->map_key && cr->n_lengths == 2 &&
	      cr->lengths[0] == MIB && cr->lengths[1] == MIB && cr->n_map_offs == 2 &&
	      cr->map_offs[1] == cr->map_offs[0] + MIB;
	TPT_REQUIRE(two, 1, "not both handed out by mapping: status %d, key %" PRIu64 ", %zu items",
		    cr->status, cr->map_key, cr->n_lengths);
	tpw_daemon_msg_free(dm);
	_exit(0); /* dies before its READ with map_done */
}

/* tpt_chan_items_survive() (@seed, @child, @what) over a channel of its own named @name. */
static void items_survive(const char *name, unsigned seed, tpt_child_fn child, const char *what)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new(name);
	struct tp_chan *ch;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(tp_chan_open(ctx, name, &o, &ch), 0);
	tpt_chan_items_survive(ch, seed, child, what);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
}

START_TEST(test_reader_dying_before_its_acknowledgement_loses_nothing)
{
	items_survive("map.dying", 4, dying_mapper, "dying mapper");
}
END_TEST

/* Both items of a batch handed out by mapping in one answer to a packed read whose reader dies
 * before it says it copied them out go back to the channel, in order, byte-exact. */
START_TEST(test_packed_reader_dying_before_its_acknowledgement_loses_nothing)
{
	items_survive("map.dyingp", 5, dying_packed_mapper, "dying packed mapper");
}
END_TEST

/* Four items of 1 MiB written in one batch (one lent buffer) come in one packed read into
 * private memory, by mapping (items_mapped 4), each at its packed place and byte-exact; into a
 * buffer that fits three, three, and the fourth in the next read; @max 2 takes two. */
START_TEST(test_packed_read_maps_a_batch_at_once)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.pw"), *cr = ctx_new("map.pr");
	uint8_t *src = malloc(4 * MIB), *dst = malloc(4 * MIB);
	struct tp_chan_item items[8];
	struct tp_chan *w, *r;
	struct iovec iov[4];
	size_t n = 0, bad = 0;
	unsigned seen = 0;
	static const size_t room[3] = { 4 * MIB, 3 * MIB, 4 * MIB };
	static const size_t max[3] = { 8, 8, 2 };

	ck_assert(cw && cr && src && dst);
	ck_assert_int_eq(tp_chan_open(cw, "map.packed", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.packed", &o, &r), 0);
	for (unsigned round = 0; round < 3; round++) {
		for (unsigned k = 0; k < 4; k++) {
			tpt_fill(src + k * MIB, MIB, tpt_seed(7, round, k));
			iov[k] = (struct iovec){ .iov_base = src + k * MIB, .iov_len = MIB };
		}
		ck_assert_int_eq(tp_chan_write(w, iov, 4, T_MS), 0);
		for (unsigned k = 0; k < 4; k += (unsigned)n) {
			ck_assert_int_ge(tp_chan_read_many_into(r, dst, room[round], items,
								max[round], &n, T_MS), 0);
			ck_assert_uint_eq(n, TPU_MIN(TPU_MIN(4 - k, room[round] / MIB), max[round]));
			for (size_t i = 0; i < n; i++) {
				ck_assert_ptr_eq(items[i].data, dst + i * MIB);
				ck_assert_uint_eq(items[i].len, MIB);
				ck_assert_msg(tpt_verify(items[i].data, MIB,
							 tpt_seed(7, round, k + (unsigned)i), &bad),
					      "round %u item %zu: byte %zu", round, k + i, bad);
			}
			seen += (unsigned)n;
		}
	}
	ck_assert_uint_eq(seen, 12);
	ck_assert_int_eq(items_mapped("map.packed"), 12);
	pair_free(r, w, cr, cw);
	free(src);
	free(dst);
}
END_TEST

struct packed_waiter {
	struct tp_chan *ch;
	uint8_t *dst;
	size_t room, max, n;
	int r;
};

/* A read of @arg's handle that waits: packed (max > 1) or one tp_chan_read_into(). */
static void *packed_waiter_run(void *arg)
{
	struct packed_waiter *pw = arg;
	struct tp_chan_item items[8];

	if (pw->max > 1) {
		pw->r = tp_chan_read_many_into(pw->ch, pw->dst, pw->room, items, pw->max, &pw->n,
					       10000);
	} else {
		pw->r = tp_chan_read_into(pw->ch, pw->dst, pw->room, &pw->n, 10000);
		pw->n = pw->r >= 0 ? 1 : 0;
	}
	return NULL;
}

/* Waits until @name has @n reads waiting (tpipctl's readers_waiting). */
static void readers_waiting_at(const char *name, long n)
{
	long w = -1;

	for (int t = 0; t < 10000 * (int)tpt_time_scale() && w != n; t += 10) {
		w = tpt_ctl_channel_field(&tpt_fixture_daemon, name, "readers_waiting");
		if (w != n)
			usleep(10000);
	}
	ck_assert_int_eq(w, n);
}

/* A packed read waiting first and a plain one behind it: when a batch of four comes (one lent
 * buffer), the packed read takes one item only, the plain one the next (each waiting read gets
 * one while another waits); then a packed read with nobody else waiting takes the other two. */
START_TEST(test_packed_read_takes_one_while_another_read_waits)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.aw"), *c1 = ctx_new("map.a1"), *c2 = ctx_new("map.a2");
	uint8_t *src = malloc(4 * MIB), *d1 = malloc(MIB), *d2 = malloc(4 * MIB);
	struct packed_waiter p2 = { .dst = d2, .room = 4 * MIB, .max = 8 };
	struct packed_waiter p1 = { .dst = d1, .room = MIB, .max = 1 };
	struct tp_chan_item items[8];
	struct tp_chan *w;
	struct iovec iov[4];
	pthread_t t1, t2;
	size_t bad = 0, n = 0;

	ck_assert(cw && c1 && c2 && src && d1 && d2);
	ck_assert_int_eq(tp_chan_open(cw, "map.alone", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(c1, "map.alone", &o, &p1.ch), 0);
	ck_assert_int_eq(tp_chan_open(c2, "map.alone", &o, &p2.ch), 0);
	ck_assert_int_eq(pthread_create(&t2, NULL, packed_waiter_run, &p2), 0);
	readers_waiting_at("map.alone", 1);
	ck_assert_int_eq(pthread_create(&t1, NULL, packed_waiter_run, &p1), 0);
	readers_waiting_at("map.alone", 2);
	for (unsigned k = 0; k < 4; k++) {
		tpt_fill(src + k * MIB, MIB, tpt_seed(8, 0, k));
		iov[k] = (struct iovec){ .iov_base = src + k * MIB, .iov_len = MIB };
	}
	ck_assert_int_eq(tp_chan_write(w, iov, 4, T_MS), 0);
	ck_assert_int_eq(pthread_join(t2, NULL), 0);
	ck_assert_int_eq(pthread_join(t1, NULL), 0);
	ck_assert_msg(p2.r >= 0 && p1.r >= 0, "reads: %d %d", p2.r, p1.r);
	ck_assert_uint_eq(p2.n, 1);
	ck_assert(tpt_verify(d2, MIB, tpt_seed(8, 0, 0), &bad));
	ck_assert_uint_eq(p1.n, 1);
	ck_assert(tpt_verify(d1, MIB, tpt_seed(8, 0, 1), &bad));
	ck_assert_int_ge(tp_chan_read_many_into(p2.ch, d2, 4 * MIB, items, 8, &n, T_MS), 0);
	ck_assert_uint_eq(n, 2);
	for (unsigned k = 0; k < 2; k++)
		ck_assert(tpt_verify(items[k].data, MIB, tpt_seed(8, 0, 2 + k), &bad));
	ck_assert_int_eq(tp_chan_release(p1.ch), 0);
	ck_assert_int_eq(tp_chan_release(p2.ch), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(c1);
	tp_context_free(c2);
	tp_context_free(cw);
	free(src);
	free(d1);
	free(d2);
}
END_TEST

/* One try of test_a_writer_ahead_of_its_reader_waits_for_a_lent_buffer on channel @name: a
 * reader waits, the writer writes two items of WAIT_ITEM (each a buffer of its own of 64 MiB,
 * CHAN_LENT_BYTES: the first lent fills the handle's room), both read back byte-exact.
 * Return: items_mapped afterwards (2: the second waited for the first's buffer, 1: it did
 * not and went through the pool, copied in). */
#define WAIT_ITEM (48u * MIB)
static long lend_wait_try(struct tp_context *cw, struct tp_context *cr, const char *name,
			  unsigned k, uint8_t *src[2], uint8_t *dst[2])
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct packed_waiter pw = { .dst = dst[0], .room = WAIT_ITEM, .max = 1 };
	struct tp_chan *w;
	size_t len, bad = 0;
	pthread_t t;

	ck_assert_int_eq(tp_chan_open(cw, name, &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, name, &o, &pw.ch), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, packed_waiter_run, &pw), 0);
	readers_waiting_at(name, 1);
	for (unsigned i = 0; i < 2; i++) {
		struct iovec iov = { .iov_base = src[i], .iov_len = WAIT_ITEM };

		tpt_fill(src[i], WAIT_ITEM, tpt_seed(13, k, i));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%u: %s", i, tp_last_error());
	}
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_msg(pw.r >= 0 && pw.n == 1, "read: %d", pw.r);
	ck_assert(tpt_verify(dst[0], WAIT_ITEM, tpt_seed(13, k, 0), &bad));
	ck_assert_int_ge(tp_chan_read_into(pw.ch, dst[1], WAIT_ITEM, &len, T_MS), 0);
	ck_assert_msg(len == WAIT_ITEM && tpt_verify(dst[1], WAIT_ITEM, tpt_seed(13, k, 1), &bad),
		      "item 1: byte %zu", bad);
	long mapped = items_mapped(name);

	ck_assert_int_eq(tp_chan_release(pw.ch), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	return mapped;
}

/* A writer ahead of its reader by all a handle may lend (CHAN_LENT_BYTES) waits, within its
 * timeout, for a lent buffer to come back instead of having the daemon copy its next item in
 * (chanwrite.c, chan_lend_wait_locked()): a reader waits, the writer writes two items of 48 MiB
 * (a buffer of 64 MiB each, so the first fills the room) while the reader copies the first
 * out; the second is lent too, and both are read by mapping. Before, the second went through
 * the context's pool and the daemon copied it in (items_mapped 1, in every try). The wait is
 * bounded in time (48 ms for 48 MiB), so a try on a machine too busy to copy 48 MiB out in that
 * may miss it: up to 5 tries, each on a channel of its own; under TPT_TIME_SCALE (a daemon
 * under valgrind) the items are still checked, the wait not asserted. */
START_TEST(test_a_writer_ahead_of_its_reader_waits_for_a_lent_buffer)
{
	struct tp_context *cw = ctx_new("map.wait.w"), *cr = ctx_new("map.wait.r");
	uint8_t *src[2] = { malloc(WAIT_ITEM), malloc(WAIT_ITEM) };
	uint8_t *dst[2] = { malloc(WAIT_ITEM), malloc(WAIT_ITEM) };
	long mapped = 0;
	unsigned k;

	ck_assert(cw && cr && src[0] && src[1] && dst[0] && dst[1]);
	for (k = 0; k < 5 && mapped != 2; k++) {
		char name[32];

		snprintf(name, sizeof(name), "map.wait.%u", k);
		mapped = lend_wait_try(cw, cr, name, k, src, dst);
		ck_assert_msg(mapped == 1 || mapped == 2, "try %u: items_mapped %ld", k, mapped);
		if (mapped != 2)
			printf("test_a_writer_ahead_of_its_reader_waits_for_a_lent_buffer: try %u: "
			       "the second item was copied in\n", k);
	}
	if (tpt_time_scale() > 1 && mapped != 2)
		printf("test_a_writer_ahead_of_its_reader_waits_for_a_lent_buffer: not asserted "
		       "under TPT_TIME_SCALE %u: the wait is bounded in time (1 ms a MiB), which "
		       "slowed daemons or clients need not meet\n", tpt_time_scale());
	else
		ck_assert_msg(mapped == 2, "in %u tries the second item never waited for a lent "
			      "buffer", k);
	tp_context_free(cr);
	tp_context_free(cw);
	for (unsigned i = 0; i < 2; i++) {
		free(src[i]);
		free(dst[i]);
	}
}
END_TEST

/* Counts the library's lines saying a wait for a lent buffer ended with none back. */
static void stall_log(void *arg, int level, const char *line)
{
	(void)level;
	if (strstr(line, "no lent buffer came back"))
		__atomic_add_fetch((unsigned *)arg, 1, __ATOMIC_RELAXED);
}

/* The bounds of that wait: a writer nobody reads lends 4 items of 9 MiB (a 16 MiB buffer
 * each: all its room, CHAN_LENT_BYTES); a 5th write with a timeout of 0 does not wait (no
 * line); a 6th with a timeout waits and nothing comes back (one line, a debug one); a 7th does
 * not wait again (still one line; 63 MiB of items, within the channel's 64 MiB); all 7 items
 * are then read back byte-exact, in order, the 4 lent ones by mapping. Before, no write
 * waited (no line). */
#define STALL_ITEM (9u * MIB)
START_TEST(test_a_writer_nobody_reads_waits_for_a_lent_buffer_once)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.stall.w"), *cr = ctx_new("map.stall.r");
	uint8_t *src = malloc(STALL_ITEM), *dst = malloc(STALL_ITEM);
	struct iovec iov = { .iov_base = src, .iov_len = STALL_ITEM };
	unsigned stalls = 0;
	struct tp_chan *w, *r;
	size_t len, bad = 0;

	ck_assert(cw && cr && src && dst);
	tp_context_set_log(cw, stall_log, &stalls);
	ck_assert_int_eq(tp_chan_open(cw, "map.stall", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.stall", &o, &r), 0);
	for (unsigned i = 0; i < 7; i++) {
		tpt_fill(src, STALL_ITEM, tpt_seed(14, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, i == 4 ? 0 : T_MS) == 0, "%u: %s", i,
			      tp_last_error());
		ck_assert_uint_eq(__atomic_load_n(&stalls, __ATOMIC_RELAXED), (i < 5 ? 0u : 1u));
	}
	for (unsigned i = 0; i < 7; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, STALL_ITEM, &len, T_MS), 0);
		ck_assert_msg(len == STALL_ITEM && tpt_verify(dst, len, tpt_seed(14, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
	}
	ck_assert_int_eq(items_mapped("map.stall"), 4);
	pair_free(r, w, cr, cw);
	free(src);
	free(dst);
}
END_TEST

/* @n writer handles (each stages in buffers of its own) write one item each, read in turn by
 * one reader handle: it maps min(@n, 8) buffers, every item byte-exact. */
static void map_bound(unsigned n)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.bw"), *cr = ctx_new("map.br");
	uint8_t *src = malloc(MIB), *dst = malloc(MIB);
	struct tp_chan *w[MAP_MAX + 1], *r;
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	size_t len, bad = 0;

	ck_assert(cw && cr && src && dst && n <= MAP_MAX + 1);
	ck_assert_int_eq(tp_chan_open(cr, "map.bound", &o, &r), 0);
	o.flags = 0;
	for (unsigned round = 0; round < 2; round++) {
		for (unsigned i = 0; i < n; i++) {
			if (!round)
				ck_assert_int_eq(tp_chan_open(cw, "map.bound", &o, &w[i]), 0);
			tpt_fill(src, MIB, tpt_seed(5 + round, i, 0));
			ck_assert_msg(tp_chan_write(w[i], &iov, 1, T_MS) == 0, "%u: %s", i,
				      tp_last_error());
		}
		for (unsigned i = 0; i < n; i++) {
			ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0);
			ck_assert_msg(len == MIB && tpt_verify(dst, MIB, tpt_seed(5 + round, i, 0),
							       &bad),
				      "round %u item %u: byte %zu", round, i, bad);
		}
		ck_assert_uint_eq(reader_maps(), (n < MAP_MAX ? n : MAP_MAX));
	}
	for (unsigned i = 0; i < n; i++)
		ck_assert_int_eq(tp_chan_release(w[i]), 0);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cw);
	tp_context_free(cr);
	free(src);
	free(dst);
}

/* The 33 writers of test_a_reader_handle_is_remembered_32_buffers(), in a process of their own:
 * one item each from private memory (each handle stages it in a lent buffer of its own), then
 * told, then stopped by the test until it lets them release their handles. */
struct sent_writers {
	struct tpt_sync written;
};

static int sent_writers_run(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct sent_writers *sw = arg;
	struct tp_context *cw = ctx_new("map.sent.w");
	uint8_t *src = malloc(MIB);
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	struct tp_chan *w[33];

	TPT_REQUIRE(cw && src, 1, "context");
	for (unsigned i = 0; i < 33; i++) {
		TPT_REQUIRE(tp_chan_open(cw, "map.sent", &o, &w[i]) == 0, 1, "open %u", i);
		tpt_fill(src, MIB, tpt_seed(12, i, 0));
		TPT_REQUIRE(tp_chan_write(w[i], &iov, 1, T_MS) == 0, 1, "%u: %s", i,
			    tp_last_error());
	}
	tpt_sync_post(&sw->written, 1);
	raise(SIGSTOP); /* until the test has read and checked (SIGCONT) */
	for (unsigned i = 0; i < 33; i++)
		TPT_REQUIRE(tp_chan_release(w[i]) == 0, 1, "release %u", i);
	tp_context_free(cw);
	free(src);
	return 0;
}

/* The daemon remembers at most CHAN_SENT_MAX (32) keys of buffers whose fd it sent one reader
 * handle: 32 writer handles, one item each, read by one reader: 32 held (just at); a 33rd:
 * still 32 (just above; the oldest forgotten), every item byte-exact; the writers' release
 * retires all that are remembered and leaves the reader no mapping. The writers' process is
 * stopped while the items are read and counted: a writer's library releases a buffer of its own
 * that has been idle for 1 s (CHAN_OWN_IDLE_MS), which the daemon then retires, and on a loaded
 * machine the reads took longer than that after the first buffer came back (maps_held 31). */
START_TEST(test_a_reader_handle_is_remembered_32_buffers)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct sent_writers sw;
	struct tp_context *cr;
	uint8_t *dst = malloc(MIB);
	struct tp_chan *r;
	size_t len, bad = 0;
	pid_t pid;
	int st;

	ck_assert_int_eq(tpt_sync_init(&sw.written), 0);
	pid = tpt_fork(sent_writers_run, &sw); /* before this process has a context */
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&sw.written, 4 * T_MS), 1);
	ck_assert_int_eq(waitpid(pid, &st, WUNTRACED), pid);
	ck_assert(WIFSTOPPED(st));
	cr = ctx_new("map.sent.r");
	ck_assert(cr && dst);
	ck_assert_int_eq(tp_chan_open(cr, "map.sent", &o, &r), 0);
	for (unsigned i = 0; i < 33; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0);
		ck_assert_msg(len == MIB && tpt_verify(dst, MIB, tpt_seed(12, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
		if (i == 31) /* just at */
			ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent",
							       "maps_held"), 32);
	}
	ck_assert_int_eq(items_mapped("map.sent"), 33);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_held"), 32);
	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "writers"));
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_held"), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_retired"),
			 32);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cr);
	free(dst);
	tpt_sync_done(&sw.written);
}
END_TEST

START_TEST(test_a_reader_maps_eight_writers_buffers)
{
	map_bound(MAP_MAX);
}
END_TEST

START_TEST(test_a_reader_maps_no_more_than_eight_writers_buffers)
{
	map_bound(MAP_MAX + 1);
}
END_TEST

/* With --buffers-max 4, a writer's handle stages and lends 4 buffers of its own (each 1 MiB
 * item a write, none read yet): the 4 items are read by mapping; a 5th write finds the limit
 * (no buffer of its own, no staging buffer) and goes by CMA, copied in by the daemon: read
 * byte-exact, not by mapping. The daemon keeps one fd per such buffer, within the limit. */
START_TEST(test_buffers_max_bounds_the_buffers_a_writer_lends)
{
	const char *args[] = { "--buffers-max", "4", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = NULL, *cr = NULL;
	uint8_t *src = malloc(MIB), *dst = malloc(MIB);
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	struct tp_chan *w, *r;
	size_t len, bad = 0;

	ck_assert(src && dst);
	tpt_fixture_stop();
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "map.lim.w", &cw), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "map.lim.r", &cr), 0);
	ck_assert_int_eq(tp_chan_open(cw, "map.limit", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.limit", &o, &r), 0);
	for (unsigned i = 0; i < 5; i++) {
		tpt_fill(src, MIB, tpt_seed(8, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%u: %s", i, tp_last_error());
	}
	for (unsigned i = 0; i < 5; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0);
		ck_assert_msg(len == MIB && tpt_verify(dst, MIB, tpt_seed(8, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
		/* just at the limit: mapped; just above: copied */
		ck_assert_int_eq(items_mapped("map.limit"), (i < 4 ? (long)i + 1 : 4));
	}
	pair_free(r, w, cr, cw);
	free(src);
	free(dst);
}
END_TEST

/* A writer lends 4 buffers of its own (a 256 KiB item a write) and stops writing; a reader
 * reads the 4 items by mapping. The daemon gives the buffers back to the idle writer at once
 * (a notice, client minor 13): within a bounded time the writer holds none (each kept free,
 * then released once idle for CHAN_OWN_IDLE_MS), the reader none of its mappings of them
 * (retired), the daemon remembers none sent, and the owner's chan-bytes-per-uid (2 MiB, just
 * what the 4 lent buffers and their items took) is all free again: a batch of 2 MiB copied in
 * fits, one byte more does not. Without the notice the writer kept its 4 lent buffers, and
 * the reader its mappings, until its next write or its release. */
START_TEST(test_an_idle_writers_lent_buffers_are_given_back)
{
	const char *args[] = { "--chan-bytes-per-uid", "2M", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = NULL, *cr = NULL;
	const size_t item = 256 * KIB;
	uint8_t *src = malloc(2 * MIB + 1), *dst = malloc(item);
	struct iovec iov = { .iov_base = src, .iov_len = item }, big[8];
	struct tp_chan *w, *r;
	size_t len, bad = 0;

	ck_assert(src && dst);
	tpt_fixture_stop();
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "map.give.w", &cw), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "map.give.r", &cr), 0);
	ck_assert_int_eq(tp_chan_open(cw, "map.give", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.give", &o, &r), 0);
	for (unsigned i = 0; i < 4; i++) {
		tpt_fill(src, item, tpt_seed(12, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%u: %s", i, tp_last_error());
	}
	ck_assert_uint_eq(writer_maps(), 4); /* all 4 lent */
	for (unsigned i = 0; i < 4; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, item, &len, T_MS), 0);
		ck_assert_msg(len == item && tpt_verify(dst, item, tpt_seed(12, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
	}
	ck_assert_int_eq(items_mapped("map.give"), 4);
	/* no write, no release: the notice alone brings them back */
	ck_assert_uint_eq(maps_wait_at_most(writer_maps, 0, 10000), 0);
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.give", "maps_held"), 0);
	ck_assert_int_ge(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.give", "maps_retired"),
			 4);
	for (unsigned i = 0; i < 8; i++)
		big[i] = (struct iovec){ .iov_base = src + i * item, .iov_len = item };
	big[7].iov_len++;
	ck_assert_int_eq(tp_chan_write(w, big, 8, 0), -ENOBUFS); /* just above */
	big[7].iov_len--;
	ck_assert_msg(tp_chan_write(w, big, 8, 0) == 0, "2 MiB: %s", tp_last_error());
	pair_free(r, w, cr, cw);
	free(src);
	free(dst);
}
END_TEST

#define RAW_ITEM (32u * KIB)

/* Sends ChanOp @op (req_id @req) on @r and waits for its answer (other frames dropped, notices
 * too). Return: owned (tpw_daemon_msg_free()), or NULL. */
static Tpw__V1__DaemonMsg *raw_call(struct tpt_raw *r, Tpw__V1__ChanOp *op, uint64_t req,
				    const void *tail, uint32_t tail_len)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;

	op->req_id = req;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	if (tpt_raw_send(r, &m, tail, tail_len, NULL, 0, 0) < 0)
		return NULL;
	while (tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0) {
		if (dm->chan_reply->req_id == req)
			return dm;
		tpw_daemon_msg_free(dm);
	}
	return NULL;
}

/* @r opens channel @name (@create: creates it). Return: the handle's id, 0 on failure. */
static uint64_t raw_chan_open(struct tpt_raw *r, const char *name, bool create)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint64_t id = 0;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	op.create = create;
	dm = raw_call(r, &op, 1, NULL, 0);
	if (dm && dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK)
		id = dm->chan_reply->chan_id;
	if (dm)
		tpw_daemon_msg_free(dm);
	return id;
}

/* @r registers buffer @buf_id (a memfd of RAW_ITEM bytes) and lends it to handle @wid: one
 * item of RAW_ITEM bytes by reference, ChanOp.lend. Return: 0, or -1 (logged) unless the
 * daemon kept the item there (lent). */
static int raw_lend(struct tpt_raw *r, uint64_t wid, uint64_t buf_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	Tpw__V1__DaemonMsg *dm;
	uint64_t len = RAW_ITEM;
	int fd = memfd_create("lender", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;
	bool lent;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, RAW_ITEM) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, -1, "memfd");
	b.req_id = 9;
	b.buf_id = buf_id;
	b.gen = 1;
	b.size = RAW_ITEM;
	b.staging = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	st = tpt_raw_send(r, &m, NULL, 0, &fd, 1, 1);
	close(fd);
	TPT_REQUIRE(st == 0, -1, "send BufferRegister");
	TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm) == 0, -1,
		    "no answer to registering buffer %llu", (unsigned long long)buf_id);
	st = dm->reply->status;
	tpw_daemon_msg_free(dm);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, -1, "buffer %llu: status %d",
		    (unsigned long long)buf_id, st);
	ref.buf_id = buf_id;
	ref.gen = 1;
	g.length = RAW_ITEM;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = wid;
	op.n_lengths = 1;
	op.lengths = &len;
	op.n_segments = 1;
	op.segments = &gp;
	op.lend = true;
	dm = raw_call(r, &op, 10 + buf_id, NULL, 0);
	TPT_REQUIRE(dm, -1, "no answer to the write");
	lent = dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK && dm->chan_reply->lent &&
	       !dm->chan_reply->n_released;
	tpw_daemon_msg_free(dm);
	TPT_REQUIRE(lent, -1, "buffer %llu: the item was not lent", (unsigned long long)buf_id);
	return 0;
}

/* A raw writer speaking protocol minor @minor (@w, connected by the caller) opens channel
 * @name and lends buffers 1, 2 and 3 (one item each); a raw reader takes the three items
 * inline in one answer, so that the three buffers are given up in one turn of the daemon's
 * loop. Return: the writer's handle id. */
static uint64_t raw_three_lent(struct tpt_raw *w, uint32_t minor, const char *name)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw rd;
	uint64_t wid, rid;

	ck_assert_int_eq(tpt_raw_connect(w, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(w, TPW__V1__ROLE__ROLE_CLIENT, minor, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&rd, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT,
					     TPW_MINOR_CHAN_FAST - 1, T_MS), 0); /* inline */
	wid = raw_chan_open(w, name, true);
	rid = raw_chan_open(&rd, name, false);
	ck_assert(wid && rid);
	for (uint64_t b = 1; b <= 3; b++)
		ck_assert_int_eq(raw_lend(w, wid, b), 0);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = rid;
	op.max_items = 3;
	dm = raw_call(&rd, &op, 2, NULL, 0);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	ck_assert_uint_eq(dm->chan_reply->n_lengths, 3);
	tpw_daemon_msg_free(dm);
	tpt_raw_close(&rd);
	return wid;
}

/* The ids of @dm's released (3 expected, any order): 1, 2 and 3? */
static bool released_123(const Tpw__V1__ChanReply *cr)
{
	unsigned seen = 0;

	for (size_t i = 0; i < cr->n_released; i++)
		if (cr->released[i] >= 1 && cr->released[i] <= 3)
			seen |= 1u << cr->released[i];
	return cr->n_released == 3 && seen == 0xe;
}

/* A byte WRITE on @w's handle @wid. Return: its answer, owned. */
static Tpw__V1__DaemonMsg *raw_byte_write(struct tpt_raw *w, uint64_t wid)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	uint64_t len = 1;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = wid;
	op.n_lengths = 1;
	op.lengths = &len;
	return raw_call(w, &op, 50, "x", 1);
}

/* A writer of protocol minor 13 that lent 3 buffers, all read in one batch, is told at once,
 * unasked: one notice (req_id 0, its handle, the 3 ids, nothing else), not one a buffer; its
 * next write's answer names none of them again. */
START_TEST(test_an_idle_writer_is_told_its_buffers_in_one_notice)
{
	Tpw__V1__DaemonMsg *dm;
	const Tpw__V1__ChanReply *cr;
	struct tpt_raw w;
	uint64_t wid = raw_three_lent(&w, TPW_MINOR_CHAN_RELEASED, "map.notice");
	int e;

	ck_assert_int_eq(tpt_raw_recv(&w, T_MS, &dm, NULL, NULL), 0);
	ck_assert_int_eq(dm->body_case, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY);
	cr = dm->chan_reply;
	ck_assert_msg(cr->req_id == 0 && cr->chan_id == wid && released_123(cr) &&
		      !cr->n_lengths && !cr->lent && !cr->n_retired && !cr->map_key &&
		      cr->status == TPW__V1__STATUS__STATUS_OK,
		      "not a notice of buffers 1-3: req_id %llu, %zu ids",
		      (unsigned long long)cr->req_id, cr->n_released);
	tpw_daemon_msg_free(dm);
	e = tpt_raw_recv(&w, 500, &dm, NULL, NULL);
	if (e == 0)
		tpw_daemon_msg_free(dm);
	ck_assert_int_eq(e, -ETIMEDOUT); /* one notice, not one a buffer */
	dm = raw_byte_write(&w, wid);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	ck_assert_uint_eq(dm->chan_reply->n_released, 0);
	tpw_daemon_msg_free(dm);
	tpt_raw_close(&w);
}
END_TEST

/* A writer of an older library (protocol minor 12) that lent 3 buffers, all read, gets no
 * unasked frame (it would not know one): its buffers come back, as before, in its next write's
 * answer. */
START_TEST(test_an_older_writer_gets_no_notice)
{
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw w;
	uint64_t wid = raw_three_lent(&w, TPW_MINOR_CHAN_RELEASED - 1, "map.old.w");
	int e;

	e = tpt_raw_recv(&w, 1500, &dm, NULL, NULL);
	if (e == 0) {
		ck_assert_msg(0, "an unasked frame (body %d, req_id %llu) to a library of minor 12",
			      dm->body_case, dm->body_case == TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY ?
			      (unsigned long long)dm->chan_reply->req_id : 0ull);
		tpw_daemon_msg_free(dm);
	}
	ck_assert_int_eq(e, -ETIMEDOUT);
	dm = raw_byte_write(&w, wid);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	ck_assert_msg(released_123(dm->chan_reply), "the write's answer gave back %zu ids",
		      dm->chan_reply->n_released);
	tpw_daemon_msg_free(dm);
	tpt_raw_close(&w);
}
END_TEST

static Suite *chan_map_suite(void)
{
	Suite *s = suite_create("chan_map");
	TCase *tc = tcase_create("map");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_items_read_by_mapping_arrive_byte_exact);
	tcase_add_test(tc, test_items_of_a_writer_far_ahead_arrive_byte_exact);
	tcase_add_test(tc, test_four_reader_processes_map_and_share_the_items);
	tcase_add_test(tc, test_items_of_a_writer_that_exited_are_read_by_mapping);
	tcase_add_test(tc, test_mappings_of_a_released_writer_are_dropped_once_its_items_are_read);
	tcase_add_test(tc, test_a_writers_idle_buffers_are_released);
	tcase_add_test(tc, test_an_older_reader_gets_no_notice);
	tcase_add_test(tc, test_reader_dying_before_its_acknowledgement_loses_nothing);
	tcase_add_test(tc, test_packed_reader_dying_before_its_acknowledgement_loses_nothing);
	tcase_add_test(tc, test_packed_read_maps_a_batch_at_once);
	tcase_add_test(tc, test_packed_read_takes_one_while_another_read_waits);
	tcase_add_test(tc, test_a_writer_ahead_of_its_reader_waits_for_a_lent_buffer);
	tcase_add_test(tc, test_a_writer_nobody_reads_waits_for_a_lent_buffer_once);
	tcase_add_test(tc, test_a_reader_handle_is_remembered_32_buffers);
	tcase_add_test(tc, test_a_reader_maps_eight_writers_buffers);
	tcase_add_test(tc, test_a_reader_maps_no_more_than_eight_writers_buffers);
	tcase_add_test(tc, test_buffers_max_bounds_the_buffers_a_writer_lends);
	tcase_add_test(tc, test_an_idle_writers_lent_buffers_are_given_back);
	tcase_add_test(tc, test_an_idle_writer_is_told_its_buffers_in_one_notice);
	tcase_add_test(tc, test_an_older_writer_gets_no_notice);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chan_map_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
