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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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

/* Sends ChanOp @op (req_id 1) on @r and waits for its answer (notices, req_id 0, dropped: a
 * writer of minor 13 is told of its lent buffers given back). Return: owned, or NULL. */
static Tpw__V1__DaemonMsg *raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	if (tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) < 0)
		return NULL;
	while (tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0) {
		if (dm->chan_reply->req_id)
			return dm;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	}
	return NULL;
}

/* Opens (@create: creates) channel @name on @r. Return: its handle id, 0 on failure. */
static uint64_t raw_open_name(struct tpt_raw *r, const char *name, bool create)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint64_t id;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	op.create = create;
	dm = raw_chan(r, &op);
	TPT_REQUIRE(dm, 0, "no answer to opening %s", name);
	id = dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK ? dm->chan_reply->chan_id : 0;
	TPT_REQUIRE(id, 0, "opening %s: status %d", name, dm->chan_reply->status);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return id;
}

static uint64_t raw_open(struct tpt_raw *r, bool create)
{
	uint64_t id = raw_open_name(r, "map.raw", create);

	ck_assert_uint_ne(id, 0);
	return id;
}

/* A raw client registers buffer @buf_id of @size bytes as a channel buffer whose fd the daemon
 * keeps (chan_map), sealed against shrinking and, if @seal, against writes.
 * Return: the memfd (the caller closes it) once the daemon said OK, or -1. */
static int raw_register_map(struct tpt_raw *w, uint64_t buf_id, uint64_t size, bool seal)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("tpclient-chan", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, (off_t)size) == 0, -1, "memfd");
	TPT_REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, -1, "seal");
	b.req_id = 9;
	b.buf_id = buf_id;
	b.gen = 1;
	b.size = size;
	b.staging = true;
	b.chan_map = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	TPT_REQUIRE(tpt_raw_send(w, &m, NULL, 0, &fd, 1, 1) == 0, -1, "send");
	TPT_REQUIRE(tpt_raw_expect(w, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm) == 0, -1,
		    "no reply to registering buffer %llu", (unsigned long long)buf_id);
	st = dm->reply->status;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, -1, "buffer %llu: status %d",
		    (unsigned long long)buf_id, st);
	if (seal)
		TPT_REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0, -1, "seal");
	return fd;
}

/* A raw writer registers buffer @buf_id (2 MiB, a channel buffer whose fd the daemon keeps),
 * sealed against shrinking and, if @seal, against writes, and lends one item of 1 MiB in it;
 * a raw reader asking for items by mapping (claiming keys @key0 to @key0 + 15 mapped, so that
 * no fd is needed: the daemon numbers kept buffers from 1) is answered by mapping (1) or the
 * old way (0, the item held for it). Return: that, or -1 if something else happened. */
static int lent_item_keys(struct tpt_raw *w, uint64_t wid, struct tpt_raw *rd, uint64_t rid,
			  uint64_t buf_id, bool seal, uint64_t key0)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	Tpw__V1__DaemonMsg *dm;
	uint64_t len = MIB, keys[16];
	int fd = raw_register_map(w, buf_id, 2 * MIB, seal), mapped;
	bool ok;

	if (fd < 0)
		return -1;
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
	TPT_REQUIRE(dm, -1, "no answer to the write");
	ok = dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK && dm->chan_reply->lent;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(ok, -1, "the item was not lent");
	for (unsigned i = 0; i < 16; i++)
		keys[i] = key0 + i;
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = rid;
	op.map_ok = true;
	op.n_mapped = 16;
	op.mapped = keys;
	dm = raw_chan(rd, &op);
	TPT_REQUIRE(dm, -1, "no answer to the read");
	ok = dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK;
	mapped = dm->chan_reply->map_key != 0;
	ok = ok && (mapped || dm->chan_reply->held_len == MIB);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(ok, -1, "the read got neither a mapping nor the item held");
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = rid;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	if (mapped) { /* copied out: the item leaves (not answered) */
		op.map_done = true;
		TPT_REQUIRE(tpt_raw_send(rd, &m, NULL, 0, NULL, 0, 0) == 0, -1, "map_done");
	}
	return mapped;
}

static int lent_item(struct tpt_raw *w, uint64_t wid, struct tpt_raw *rd, uint64_t rid,
		     uint64_t buf_id, bool seal)
{
	return lent_item_keys(w, wid, rd, rid, buf_id, seal, 1);
}

static bool lent_item_mapped(struct tpt_raw *w, uint64_t wid, struct tpt_raw *rd, uint64_t rid,
			     uint64_t buf_id, bool seal)
{
	int r = lent_item(w, wid, rd, rid, buf_id, seal);

	ck_assert_int_ge(r, 0);
	return r == 1;
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

/* ---- fds the daemon keeps for readers: bounded per uid and daemon-wide ---------------------- */

#define NOBODY 65534
#define VICTIM 4242
#define KEPT 16	     /* --kept-fds-per-uid */
#define OVER 300     /* chan_map registrations past it */
#define SESSIONS 4   /* the attacker's writers, each a session */

/* Open fds of the daemon (/proc/PID/fd), or -1. */
static long daemon_fds(void)
{
	char path[64];
	struct dirent *e;
	long n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)d.pid);
	dir = opendir(path);
	if (!dir)
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Registers @n chan_map buffers of 64 KiB, ids from @first, round robin over @w[SESSIONS].
 * Return: 0 or 1. */
static int register_many(struct tpt_raw *w, uint64_t first, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int fd = raw_register_map(&w[i % SESSIONS], first + i, 64u << 10, true);
		TPT_REQUIRE(fd >= 0, 1, "registration %u", i);
		close(fd);
	}
	return 0;
}

struct kept_sync {
	struct tpt_sync done; /* child -> parent: all registered, channels checked */
	struct tpt_sync go;   /* parent -> child: measured, let go */
};

/* uid nobody: KEPT - 1 chan_map buffers from several sessions, then one lent item at the limit
 * (read by mapping) and one above it (held: copied), OVER more registrations that all succeed,
 * and a channel through libtpclient that still moves its items byte-exact. Holds everything
 * until the parent has counted the daemon's fds. */
static int kept_attacker(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct kept_sync *ks = arg;
	struct tpt_raw w[SESSIONS], rd;
	struct tp_context *cw = NULL, *cr = NULL;
	struct tp_chan *lw = NULL, *lr = NULL;
	uint64_t wid, rid;

	if (tpt_become_user(NOBODY))
		return 1;
	for (int i = 0; i < SESSIONS; i++) {
		TPT_REQUIRE(tpt_raw_connect(&w[i], d.socket) == 0, 1, "connect");
		TPT_REQUIRE(tpt_raw_hello(&w[i], TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	}
	TPT_REQUIRE(tpt_raw_connect(&rd, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
						T_MS) == 0, 1, "hello"); /* keys claimed, no fd taken */
	wid = raw_open_name(&w[1], "kept.a", true);
	rid = raw_open_name(&rd, "kept.a", false);
	TPT_REQUIRE(wid && rid, 1, "channel");
	if (register_many(w, 100, KEPT - 1))
		return 1;
	TPT_REQUIRE(lent_item(&w[1], wid, &rd, rid, 1, true) == 1, 1,
		    "the %d-th kept fd of the uid (at kept-fds-per-uid) was not mapped", KEPT);
	/* (the reader claims the key it would get, KEPT + 1: no fd needed, so only the limit
	 * can keep it from being mapped) */
	TPT_REQUIRE(lent_item_keys(&w[1], wid, &rd, rid, 2, true, KEPT + 1) == 0, 1,
		    "a buffer above kept-fds-per-uid was handed to a reader by mapping");
	if (register_many(w, 1000, OVER))
		return 1;
	/* a well-behaved channel of the same uid: its buffers registered without fds, copied */
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "kept.w", &cw) == 0, 1, "context");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "kept.r", &cr) == 0, 1, "context");
	TPT_REQUIRE(tp_chan_open(cw, "kept.lib", &o, &lw) == 0, 1, "%s", tp_last_error());
	o.flags = 0;
	TPT_REQUIRE(tp_chan_open(cr, "kept.lib", &o, &lr) == 0, 1, "%s", tp_last_error());
	chan_round(lw, lr, 7, 3);
	TPT_REQUIRE(tpt_sync_post(&ks->done, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&ks->go, T_MS * 2) == 0, 1, "no word from the parent");
	tp_chan_release(lr);
	tp_chan_release(lw);
	tp_context_free(cr);
	tp_context_free(cw);
	tpt_raw_close(&rd);
	for (int i = 0; i < SESSIONS; i++)
		tpt_raw_close(&w[i]);
	return 0;
}

/* Another uid, while nobody is at its limit: attaches, registers, and its reader maps. */
static int kept_victim(void *arg)
{
	struct tpt_raw w, rd;
	uint64_t wid, rid;

	(void)arg;
	if (tpt_become_user(VICTIM))
		return 1;
	TPT_REQUIRE(tpt_raw_connect(&w, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&w, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(tpt_raw_connect(&rd, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
						T_MS) == 0, 1, "hello"); /* keys claimed, no fd taken */
	wid = raw_open_name(&w, "kept.v", true);
	rid = raw_open_name(&rd, "kept.v", false);
	TPT_REQUIRE(wid && rid, 1, "channel");
	/* keys 1 to KEPT went to nobody's kept buffers, none to those registered above it */
	TPT_REQUIRE(lent_item_keys(&w, wid, &rd, rid, 1, true, KEPT + 1) == 1, 1,
		    "another uid's buffer was not mapped while uid %d is at its limit", NOBODY);
	tpt_raw_close(&rd);
	tpt_raw_close(&w);
	return 0;
}

START_TEST(test_kept_fds_bounded_per_uid)
{
	const char *args[] = { "--kept-fds-per-uid", "16", NULL };
	struct kept_sync ks;
	long fd0, fd1;
	pid_t pid;
	int lines;

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_sync_init(&ks.done), 0);
	ck_assert_int_eq(tpt_sync_init(&ks.go), 0);
	fd0 = daemon_fds();
	ck_assert_int_gt(fd0, 0);
	pid = tpt_fork(kept_attacker, &ks);
	ck_assert_msg(tpt_sync_wait(&ks.done, T_MS * 4) == 0, "the attacker did not get through");
	/* its sessions (3 fds each: socket, pidfd, /proc dir) and at most KEPT kept fds, not the
	 * KEPT + 1 + OVER + the library's buffers it registered */
	fd1 = daemon_fds();
	ck_assert_msg(fd1 - fd0 <= KEPT + 3 * (SESSIONS + 3) + 16,
		      "the daemon went from %ld to %ld fds for one uid's %d buffers", fd0, fd1,
		      KEPT + 1 + OVER);
	ck_assert(tpt_wait_ok(tpt_fork(kept_victim, NULL), T_MS, "victim"));
	/* one line per refusal at most a few a second, not OVER of them */
	lines = tpt_daemon_log_count(&d, "registered without its fd");
	ck_assert_int_ge(lines, 1);
	ck_assert_int_le(lines, 40);
	ck_assert_int_eq(tpt_sync_post(&ks.go, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS * 2, "attacker"));
	/* the charges go with the fds: back to where it started */
	for (unsigned round = 0; daemon_fds() > fd0; round++) {
		ck_assert_msg(round < 200, "the daemon still holds %ld fds (%ld before)",
			      daemon_fds(), fd0);
		tpt_backoff(round);
	}
	tpt_sync_done(&ks.go);
	tpt_sync_done(&ks.done);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* Root is exempt from kept-fds-per-uid (like every per-uid limit), not from kept-fds-max. */
START_TEST(test_kept_fds_bounded_daemon_wide)
{
	const char *args[] = { "--kept-fds-per-uid", "1", "--kept-fds-max", "4", NULL };
	struct tpt_raw w, rd;
	uint64_t wid, rid;

	if (geteuid() != 0) {
		printf("skipped: needs root, which kept-fds-per-uid exempts\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_raw_connect(&w, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&w, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&rd, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello_minor(&rd, TPW__V1__ROLE__ROLE_CLIENT, TPW_MINOR_CHAN_MAP,
					     T_MS), 0); /* keys claimed, no fd taken */
	wid = raw_open_name(&w, "kept.all", true);
	rid = raw_open_name(&rd, "kept.all", false);
	ck_assert(wid && rid);
	for (uint64_t i = 0; i < 3; i++)
		close(raw_register_map(&w, 100 + i, 4096, true));
	ck_assert_int_eq(lent_item(&w, wid, &rd, rid, 1, true), 1); /* the 4th, at the limit */
	ck_assert_int_eq(lent_item_keys(&w, wid, &rd, rid, 2, true, 5), 0); /* the 5th: copied */
	ck_assert_int_ge(tpt_daemon_log_count(&d, "--kept-fds-max 4"), 1);
	tpt_raw_close(&rd);
	tpt_raw_close(&w);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
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
	tc = tcase_create("kept");
	tcase_set_timeout(tc, 100);
	tcase_add_test(tc, test_kept_fds_bounded_per_uid);
	tcase_add_test(tc, test_kept_fds_bounded_daemon_wide);
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
