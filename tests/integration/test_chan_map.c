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
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* A burst: a writer handle lends 8 buffers (1 MiB items, one a write), all read; its next
 * write brings them back to it (kept free for the next batches). Left unused for
 * CHAN_OWN_IDLE_MS (1 s), they are released: the writer keeps only the buffer still lent,
 * and the reader, told they are gone, keeps no mapping of the released ones. */
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
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_ge(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.idle", "maps_retired"),
			 8);
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

START_TEST(test_reader_dying_before_its_acknowledgement_loses_nothing)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new("map.dying");
	struct tp_chan *ch;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(tp_chan_open(ctx, "map.dying", &o, &ch), 0);
	tpt_chan_items_survive(ch, 4, dying_mapper, "dying mapper");
	ck_assert_int_eq(tp_chan_release(ch), 0);
	tp_context_free(ctx);
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

/* The daemon remembers at most CHAN_SENT_MAX (32) keys of buffers whose fd it sent one reader
 * handle: 32 writer handles, one item each, read by one reader: 32 held (just at); a 33rd:
 * still 32 (just above; the oldest forgotten), every item byte-exact; the writers' release
 * retires all that are remembered and leaves the reader no mapping. */
START_TEST(test_a_reader_handle_is_remembered_32_buffers)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new("map.sent.w"), *cr = ctx_new("map.sent.r");
	uint8_t *src = malloc(MIB), *dst = malloc(MIB);
	struct iovec iov = { .iov_base = src, .iov_len = MIB };
	struct tp_chan *w[33], *r;
	size_t len, bad = 0;

	ck_assert(cw && cr && src && dst);
	ck_assert_int_eq(tp_chan_open(cr, "map.sent", &o, &r), 0);
	o.flags = 0;
	for (unsigned i = 0; i < 33; i++) {
		ck_assert_int_eq(tp_chan_open(cw, "map.sent", &o, &w[i]), 0);
		tpt_fill(src, MIB, tpt_seed(12, i, 0));
		ck_assert_msg(tp_chan_write(w[i], &iov, 1, T_MS) == 0, "%u: %s", i,
			      tp_last_error());
		ck_assert_int_ge(tp_chan_read_into(r, dst, MIB, &len, T_MS), 0);
		ck_assert_msg(len == MIB && tpt_verify(dst, MIB, tpt_seed(12, i, 0), &bad),
			      "item %u: byte %zu", i, bad);
		if (i == 31) /* just at */
			ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent",
							       "maps_held"), 32);
	}
	ck_assert_int_eq(items_mapped("map.sent"), 33);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_held"), 32);
	for (unsigned i = 0; i < 33; i++)
		ck_assert_int_eq(tp_chan_release(w[i]), 0);
	ck_assert_uint_eq(maps_wait_at_most(reader_maps, 0, 10000), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_held"), 0);
	ck_assert_int_eq(tpt_ctl_channel_field(&tpt_fixture_daemon, "map.sent", "maps_retired"),
			 32);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cw);
	tp_context_free(cr);
	free(src);
	free(dst);
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
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cr);
	tp_context_free(cw);
	free(src);
	free(dst);
}
END_TEST

static Suite *chan_map_suite(void)
{
	Suite *s = suite_create("chan_map");
	TCase *tc = tcase_create("map");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_items_read_by_mapping_arrive_byte_exact);
	tcase_add_test(tc, test_four_reader_processes_map_and_share_the_items);
	tcase_add_test(tc, test_items_of_a_writer_that_exited_are_read_by_mapping);
	tcase_add_test(tc, test_mappings_of_a_released_writer_are_dropped_once_its_items_are_read);
	tcase_add_test(tc, test_a_writers_idle_buffers_are_released);
	tcase_add_test(tc, test_an_older_reader_gets_no_notice);
	tcase_add_test(tc, test_reader_dying_before_its_acknowledgement_loses_nothing);
	tcase_add_test(tc, test_a_reader_handle_is_remembered_32_buffers);
	tcase_add_test(tc, test_a_reader_maps_eight_writers_buffers);
	tcase_add_test(tc, test_a_reader_maps_no_more_than_eight_writers_buffers);
	tcase_add_test(tc, test_buffers_max_bounds_the_buffers_a_writer_lends);
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
