/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: lent private items read by mapping (issue 25 part map; docs/channels.md
 * "Private items read by mapping", docs/security.md). A reader maps its writer's buffer: it
 * must never be able to write it, nor see in it anything but items of that channel.
 *  - The reader's mapping cannot be made writable (mprotect), and the file behind it, opened
 *    again read-write (/proc/self/map_files, as root), can be neither mapped writable nor
 *    written (F_SEAL_FUTURE_WRITE).
 *  - The daemon hands a reader no buffer its writer did not seal so: a raw writer lends an
 *    item in a chan_map buffer sealed against shrinking only, and a raw reader that asks for
 *    items by mapping gets it the old way (held); sealed F_SEAL_FUTURE_WRITE, by mapping.
 *  - Bytes of a pipe transfer of the same context (staged through the context's pool, CMA off)
 *    and items of another channel written through the same context never appear in the
 *    buffers a reader of channel C maps, whatever the order: the pipe's first, then C's
 *    items, the other channel's, the pipe's again, C's again; past its items a mapped buffer
 *    holds zeros (a fresh memfd).
 *  - Only readers of the writer's own uid map: a reader keeps what it maps (the fd, the pages)
 *    and would see the buffer's later items, read by others, and what is left of earlier
 *    ones. A reader of uid 65534 on a channel open to anyone gets the items of uid 0's writer
 *    byte-exact, copied, with none of its buffers mapped; a reader of uid 0 then maps.
 *  - Another client cannot make a reader drop its mapping (notices of retired buffers, protocol
 *    minor 12): releasing every buffer id, acknowledging items it never took.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define MIB (1u << 20)

static struct tpt_daemon d;

static void setup(void)
{
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}

static struct tp_context *ctx_new(uint32_t flags, const char *name)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(&d, flags, name, &ctx) < 0)
		return NULL;
	return ctx;
}

struct rmap {
	uintptr_t start, end;
};

/* The read-only shared mappings of channel buffers in this process (a reader's), at most
 * @max. Return: how many. */
static unsigned reader_maps(struct rmap *v, unsigned max)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], perms[8];
	unsigned n = 0;
	unsigned long a, b;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:tpclient-chan") &&
		    sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && !strcmp(perms, "r--s") &&
		    n < max)
			v[n++] = (struct rmap){ a, b };
	fclose(f);
	return n;
}

/* Items of 768 KiB: staged in buffers of 1 MiB, whose last quarter no item overwrites. */
#define ITEM (768u << 10)

/* Writes @n items of pattern @seed through @w; if @r, reads them back byte-exact. */
static void chan_round(struct tp_chan *w, struct tp_chan *r, unsigned seed, unsigned n)
{
	uint8_t *src = malloc(ITEM), *dst = malloc(ITEM);
	struct iovec iov = { .iov_base = src, .iov_len = ITEM };
	size_t len, bad = 0;

	ck_assert(src && dst);
	for (unsigned i = 0; i < n; i++) {
		tpt_fill(src, ITEM, tpt_seed(seed, i, 0));
		ck_assert_msg(tp_chan_write(w, &iov, 1, T_MS) == 0, "%s", tp_last_error());
	}
	for (unsigned i = 0; r && i < n; i++) {
		ck_assert_int_ge(tp_chan_read_into(r, dst, ITEM, &len, T_MS), 0);
		ck_assert_msg(len == ITEM && tpt_verify(dst, ITEM, tpt_seed(seed, i, 0), &bad),
			      "seed %u item %u: byte %zu", seed, i, bad);
	}
	free(src);
	free(dst);
}

START_TEST(test_reader_mappings_cannot_be_made_writable)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new(0, "ro.w"), *cr = ctx_new(0, "ro.r");
	struct tp_chan *w, *r;
	struct rmap v[16];
	unsigned n;

	ck_assert(cw && cr);
	ck_assert_int_eq(tp_chan_open(cw, "map.ro", &o, &w), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.ro", &o, &r), 0);
	chan_round(w, r, 1, 3);
	n = reader_maps(v, 16);
	ck_assert_uint_ge(n, 1);
	for (unsigned i = 0; i < n; i++) {
		char path[80];
		int fd;
		void *p;

		ck_assert_int_eq(mprotect((void *)v[i].start, v[i].end - v[i].start,
					  PROT_READ | PROT_WRITE), -1);
		ck_assert_int_eq(errno, EACCES);
		snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx",
			 (unsigned long)v[i].start, (unsigned long)v[i].end);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0) { /* needs CAP_SYS_ADMIN */
			printf("map_files not open (%s): the seal is not checked from here\n",
			       strerror(errno));
			continue;
		}
		p = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		ck_assert_msg(p == MAP_FAILED, "a reader mapped its writer's buffer writable");
		ck_assert_int_eq(pwrite(fd, "x", 1, 0), -1);
		ck_assert_int_eq(errno, EPERM);
		close(fd);
	}
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cr);
	tp_context_free(cw);
}
END_TEST

/* Sends ChanOp @op (req_id 1) on @r and waits for its answer. Return: owned, or NULL. */
static Tpw__V1__DaemonMsg *raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	if (tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) < 0 ||
	    tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) < 0)
		return NULL;
	return dm;
}

static uint64_t raw_open(struct tpt_raw *r, bool create)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint64_t id;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "map.raw";
	op.create = create;
	dm = raw_chan(r, &op);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return id;
}

/* A raw writer registers buffer @buf_id (2 MiB, a channel buffer whose fd the daemon keeps),
 * sealed against shrinking and, if @seal, against writes, and lends one item of 1 MiB in it;
 * a raw reader asking for items by mapping (claiming every key mapped, so that no fd is
 * needed) is answered by mapping (true) or the old way (false). */
static bool lent_item_mapped(struct tpt_raw *w, uint64_t wid, struct tpt_raw *rd, uint64_t rid,
			     uint64_t buf_id, bool seal)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	Tpw__V1__DaemonMsg *dm;
	uint64_t len = MIB, keys[16];
	int fd = memfd_create("tpclient-chan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	bool mapped;

	ck_assert(fd >= 0 && ftruncate(fd, 2 * MIB) == 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	b.req_id = 9;
	b.buf_id = buf_id;
	b.gen = 1;
	b.size = 2 * MIB;
	b.staging = true;
	b.chan_map = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	ck_assert_int_eq(tpt_raw_send(w, &m, NULL, 0, &fd, 1, 1), 0);
	ck_assert_int_eq(tpt_raw_expect(w, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm), 0);
	ck_assert_int_eq(dm->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	if (seal)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
	close(fd);
	ref.buf_id = buf_id;
	ref.gen = 1;
	g.length = MIB;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = wid;
	op.n_lengths = 1;
	op.lengths = &len;
	op.n_segments = 1;
	op.segments = &gp;
	op.lend = true;
	dm = raw_chan(w, &op);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	ck_assert(dm->chan_reply->lent);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	for (unsigned i = 0; i < 16; i++)
		keys[i] = i + 1;
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = rid;
	op.map_ok = true;
	op.n_mapped = 16;
	op.mapped = keys;
	dm = raw_chan(rd, &op);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	mapped = dm->chan_reply->map_key != 0;
	ck_assert(mapped || dm->chan_reply->held_len == MIB);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	if (mapped) { /* copied out: the item leaves (not answered) */
		op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
		op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
		op.chan_id = rid;
		op.map_done = true;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
		m.chan_op = &op;
		ck_assert_int_eq(tpt_raw_send(rd, &m, NULL, 0, NULL, 0, 0), 0);
	}
	return mapped;
}

START_TEST(test_an_unsealed_buffer_is_never_handed_to_a_reader)
{
	struct tpt_raw w, rd;
	uint64_t wid, rid;

	ck_assert_int_eq(tpt_raw_connect(&w, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&w, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&rd, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
					     T_MS), 0); /* keys claimed, no fd taken */
	wid = raw_open(&w, true);
	rid = raw_open(&rd, false);
	ck_assert_msg(!lent_item_mapped(&w, wid, &rd, rid, 1, false),
		      "a buffer its writer can still write through any fd was handed to a reader");
	tpt_raw_close(&rd);
	tpt_raw_close(&w);
}
END_TEST

START_TEST(test_a_sealed_buffer_is_handed_to_a_reader)
{
	struct tpt_raw w, rd;
	uint64_t wid, rid;

	ck_assert_int_eq(tpt_raw_connect(&w, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&w, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&rd, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
					     T_MS), 0); /* keys claimed, no fd taken */
	wid = raw_open(&w, true);
	rid = raw_open(&rd, false);
	ck_assert(lent_item_mapped(&w, wid, &rd, rid, 1, true));
	tpt_raw_close(&rd);
	tpt_raw_close(&w);
}
END_TEST

static const char pipe_secret[] = "PIPE-SECRET-4242";
static const char chan_secret[] = "CHAN-D-SECRET-42";

static void fill_secret(uint8_t *p, size_t len, const char *s)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)s[i % 16];
}

/* Does any buffer a reader of this process mapped hold @s? */
static bool maps_hold(const char *s)
{
	struct rmap v[16];
	unsigned n = reader_maps(v, 16);

	for (unsigned i = 0; i < n; i++)
		if (memmem((void *)v[i].start, v[i].end - v[i].start, s, 16))
			return true;
	return false;
}

/* Pipe messages staged in buffers of the channel items' size (1 MiB), past their end. */
#define PIPE_LEN (MIB - 4096)

/* Are the bytes past the item (ITEM) in every 1 MiB buffer a reader of this process mapped
 * zeros, as a fresh memfd's? (One item a buffer, at its start.) */
static bool maps_tails_zero(void)
{
	struct rmap v[16];
	unsigned n = reader_maps(v, 16);

	for (unsigned i = 0; i < n; i++) {
		const uint8_t *p = (const uint8_t *)v[i].start;

		if (v[i].end - v[i].start != MIB)
			continue;
		for (size_t k = ITEM; k < MIB; k++)
			if (p[k])
				return false;
	}
	return true;
}

/* Four pipe messages of PIPE_LEN bytes of @pipe_secret from @p to @q (private memory, CMA off:
 * through the context's staging pool). */
static void pipe_secrets(struct tp_pipe *p, struct tp_pipe *q)
{
	uint8_t *src = malloc(PIPE_LEN), *dst = malloc(PIPE_LEN);
	struct tp_payload pl = { .data = src, .length = PIPE_LEN };
	struct tp_message msg = { .payloads = &pl, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg da[4];
	struct tp_descriptor *desc;
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU }, .data = dst };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };

	ck_assert(src && dst);
	fill_secret(src, PIPE_LEN, pipe_secret);
	tpt_done_init(&done);
	for (unsigned i = 0; i < 4; i++) {
		da[i] = (struct tpt_done_arg){ .done = &done, .index = i };
		ck_assert_int_eq(tp_pipe_write(p, &msg, tpt_done_cb, &da[i]), 0);
		ck_assert_int_eq(tp_pipe_read_descriptor_sync(q, T_MS, &desc), 0);
		ck_assert_int_eq(tp_pipe_read_sync(q, desc, &al), 0);
		ck_assert(memcmp(src, dst, PIPE_LEN) == 0);
	}
	ck_assert_int_eq(tpt_done_wait(&done, 4, T_MS), 0);
	free(src);
	free(dst);
}

START_TEST(test_no_pipe_or_other_channel_bytes_reach_a_reader)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new(TP_CONTEXT_NO_CMA, "sec.w"), *cr = ctx_new(0, "sec.r");
	struct tp_listener *l;
	struct tp_pipe *p, *q;
	struct tp_chan *c, *dch, *r;
	uint8_t *src = malloc(ITEM);
	struct iovec iov = { .iov_base = src, .iov_len = ITEM };

	ck_assert(cw && cr && src);
	ck_assert_int_eq(tp_listen(cw, "map.sec", NULL, &l), 0);
	ck_assert_int_eq(tp_connect(cw, "map.sec", &p), 0);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &q), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(p, T_MS), 0);
	ck_assert_int_eq(tp_chan_open(cw, "map.c", &o, &c), 0);
	ck_assert_int_eq(tp_chan_open(cw, "map.d", &o, &dch), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.c", &o, &r), 0);
	pipe_secrets(p, q); /* the pool's buffers held pipe bytes first */
	for (unsigned round = 0; round < 3; round++) {
		chan_round(c, r, 20 + round, 6); /* C's buffers lent, mapped, given back */
		ck_assert_uint_ge(reader_maps((struct rmap[16]){ 0 }, 16), 1);
		ck_assert_msg(!maps_hold(pipe_secret), "round %u: pipe bytes in a reader's map",
			      round);
		ck_assert_msg(maps_tails_zero(), "round %u: a mapped buffer past its item is not "
			      "zeros", round);
		fill_secret(src, ITEM, chan_secret);
		for (unsigned i = 0; i < 3; i++) /* D's items (never read: its reader would map) */
			ck_assert_int_eq(tp_chan_write(dch, &iov, 1, T_MS), 0);
		ck_assert_msg(!maps_hold(chan_secret), "round %u: channel D's bytes in a reader "
			      "of C's map", round);
		pipe_secrets(p, q);
		ck_assert_msg(!maps_hold(pipe_secret), "round %u: pipe bytes in a reader's map",
			      round);
		chan_round(c, r, 30 + round, 6);
		ck_assert_msg(!maps_hold(pipe_secret), "round %u: pipe bytes in a reader's map "
			      "after C's next items", round);
		ck_assert_msg(!maps_hold(chan_secret), "round %u: channel D's bytes in a reader "
			      "of C's map after C's next items", round);
	}
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(c), 0);
	ck_assert_int_eq(tp_chan_release(dch), 0);
	tp_pipe_close(p);
	tp_pipe_close(q);
	tp_listener_close(l);
	tp_context_free(cr);
	tp_context_free(cw);
	free(src);
}
END_TEST

/* A reader of another uid: it reads the writer's 3 items byte-exact, and maps none of the
 * writer's buffers. */
static struct tpt_sync go;

static int other_uid_reader(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = 0 }; /* root's names */
	uint8_t *dst = malloc(ITEM);
	struct tp_context *ctx = NULL;
	struct rmap v[4];
	struct tp_chan *r;
	size_t len, bad = 0;

	(void)arg;
	TPT_REQUIRE(dst && tpt_become(65534) == 0, 1, "cannot become nobody");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 1, 1, "parent");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "other.r", &ctx) == 0, 1, "context");
	TPT_REQUIRE(tp_chan_open(ctx, "map.uid", &o, &r) == 0, 1, "open: %s", tp_last_error());
	for (unsigned i = 0; i < 3; i++) {
		TPT_REQUIRE(tp_chan_read_into(r, dst, ITEM, &len, T_MS) >= 0, 1, "read: %s",
			    tp_last_error());
		TPT_REQUIRE(len == ITEM && tpt_verify(dst, ITEM, tpt_seed(7, i, 0), &bad), 1,
			    "item %u: byte %zu", i, bad);
	}
	TPT_REQUIRE(reader_maps(v, 4) == 0, 1, "a reader of uid 65534 mapped a buffer of uid 0");
	tp_chan_release(r);
	tp_context_free(ctx);
	free(dst);
	return 0;
}

START_TEST(test_only_the_writers_uid_maps)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tp_context *cw, *cr;
	struct tp_chan *w, *r;
	pid_t pid;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a reader as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	pid = tpt_fork(other_uid_reader, NULL);
	ck_assert_int_gt(pid, 0);
	cw = ctx_new(0, "uid.w");
	cr = ctx_new(0, "uid.r");
	ck_assert(cw && cr);
	ck_assert_int_eq(tp_chan_open(cw, "map.uid", &o, &w), 0);
	chan_round(w, NULL, 7, 3);
	ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "reader of another uid"));
	ck_assert_int_eq(tpt_ctl_channel_field(&d, "map.uid", "items_mapped"), 0);
	/* the writer's own uid still maps */
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cr, "map.uid", &o, &r), 0);
	chan_round(w, r, 8, 3);
	ck_assert_int_eq(tpt_ctl_channel_field(&d, "map.uid", "items_mapped"), 3);
	ck_assert_int_eq(tp_chan_release(r), 0);
	ck_assert_int_eq(tp_chan_release(w), 0);
	tp_context_free(cr);
	tp_context_free(cw);
	tpt_sync_done(&go);
}
END_TEST

/* Another client cannot make a reader drop its mapping of a writer's buffer: notices of
 * retired buffers come only from the daemon on the reader's own session, and only a writer's
 * own session letting go of its buffer (and no item left in it) retires it. An attacker of the
 * same uid releases every buffer id and generation a session can have (ids resolve in its own
 * session), opens the channel and acknowledges items by mapping it never took: the reader keeps
 * its mappings, nothing is retired, the item left is read by mapping byte-exact. Then the
 * writer releases its handle: the reader's mappings go (the path the attacker could not take). */
START_TEST(test_another_client_cannot_retire_a_readers_mapping)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *cw = ctx_new(0, "sec.ret.w"), *cr = ctx_new(0, "sec.ret.r");
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRelease br = TPW__V1__BUFFER_RELEASE__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	uint8_t *dst = malloc(ITEM);
	struct rmap v[16];
	struct tp_chan *w, *r;
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw a;
	unsigned before;
	size_t len, bad = 0;
	uint64_t aid;

	ck_assert(cw && cr && dst);
	ck_assert_int_eq(tp_chan_open(cr, "sec.retire", &o, &r), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_chan_open(cw, "sec.retire", &o, &w), 0);
	chan_round(w, r, 50, 2);
	chan_round(w, NULL, 51, 1); /* one item left, lent */
	before = reader_maps(v, 16);
	ck_assert_uint_ge(before, 1);

	ck_assert_int_eq(tpt_raw_connect(&a, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&a, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE;
	m.buffer_release = &br;
	for (uint64_t id = 0; id <= 64; id++) {
		for (uint64_t gen = 0; gen <= 2; gen++) {
			br.buf_id = id;
			br.gen = gen;
			ck_assert_int_eq(tpt_raw_send(&a, &m, NULL, 0, NULL, 0, 0), 0);
		}
	}
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "sec.retire";
	dm = raw_chan(&a, &op);
	ck_assert_ptr_nonnull(dm);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	aid = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = aid;
	op.map_done = true; /* for an item it never took: nothing */
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	ck_assert_int_eq(tpt_raw_send(&a, &m, NULL, 0, NULL, 0, 0), 0);
	usleep(300000);
	ck_assert_uint_eq(reader_maps(v, 16), before);
	ck_assert_int_eq(tpt_ctl_channel_field(&d, "sec.retire", "maps_retired"), 0);
	ck_assert_int_ge(tp_chan_read_into(r, dst, ITEM, &len, T_MS), 0);
	ck_assert_msg(len == ITEM && tpt_verify(dst, ITEM, tpt_seed(51, 0, 0), &bad), "byte %zu",
		      bad);
	ck_assert_int_eq(tpt_ctl_channel_field(&d, "sec.retire", "items_mapped"), 3);
	tpt_raw_close(&a);

	ck_assert_int_eq(tp_chan_release(w), 0);
	for (int t = 0; reader_maps(v, 16) && t < 500 * (int)tpt_time_scale(); t++)
		usleep(20000);
	ck_assert_uint_eq(reader_maps(v, 16), 0);
	ck_assert_int_ge(tpt_ctl_channel_field(&d, "sec.retire", "maps_retired"), 1);
	ck_assert_int_eq(tp_chan_release(r), 0);
	tp_context_free(cw);
	tp_context_free(cr);
	free(dst);
}
END_TEST

static Suite *chanmap_suite(void)
{
	Suite *s = suite_create("sec_chanmap");
	TCase *tc = tcase_create("map");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 100);
	tcase_add_test(tc, test_reader_mappings_cannot_be_made_writable);
	tcase_add_test(tc, test_an_unsealed_buffer_is_never_handed_to_a_reader);
	tcase_add_test(tc, test_a_sealed_buffer_is_handed_to_a_reader);
	tcase_add_test(tc, test_no_pipe_or_other_channel_bytes_reach_a_reader);
	tcase_add_test(tc, test_only_the_writers_uid_maps);
	tcase_add_test(tc, test_another_client_cannot_retire_a_readers_mapping);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chanmap_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
