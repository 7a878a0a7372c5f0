/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: channel items by reference and batch reads (issue 25 part chanfast;
 * docs/channels.md "Items at any size") against an unprivileged local user (uid 65534)
 * speaking the raw protocol of minor 7 on a channel it may use ("anyone"). A segment can only
 * name the attacker's own memory: guessed shared-buffer ids (the victim's among them) are not
 * found, a range just past the end of its own buffer is refused while one ending at it is
 * written, an address is refused to a session without CMA, a read's destination in a buffer it
 * does not own or past its own is refused before any item is taken, a held item it never got
 * is not found; each refusal fails that request only (the session stays, the victim's item
 * stays first, byte-exact); a batch read above segments_max closes the attacker's session
 * only. Packed batch reads (ChanOp.pack) whose room lies (past the attacker's buffer, by CMA
 * it has not, below the first item) are refused or take only what fits, on an open session,
 * and the victim reads the rest in order. A packed read of another host's channel leaves the
 * peer link up and takes its items packed.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define NOBODY 65534
#define BUF (1u << 20)
#define ITEM (128u << 10)

static struct tpt_daemon d;

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -errno;
	return 0;
}

/* Sends ChanOp @op (req_id 1) and returns the answer's status, or -errno. */
static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, uint64_t *ret_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	int st, ret;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	ret = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm);
	if (ret < 0)
		return ret;
	st = dm->chan_reply->status;
	if (ret_id)
		*ret_id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

/* Registers a memfd of BUF bytes as the session's buffer 1/1. Return: 0 or 1 (logged). */
static int raw_buffer(struct tpt_raw *r)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("attacker", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, BUF) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "memfd");
	b.req_id = 9;
	b.buf_id = 1;
	b.gen = 1;
	b.size = BUF;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, &fd, 1, 1) == 0, 1, "send BufferRegister");
	close(fd);
	TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm) == 0, 1,
		    "register answer");
	st = dm->reply->status;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "register refused: %d", st);
	return 0;
}

/* A WRITE of one ITEM-byte item at @g on handle @id. Return: the answer's status. */
static int write_seg(struct tpt_raw *r, uint64_t id, Tpw__V1__Segment *g)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	uint64_t len = g->length;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = id;
	op.n_lengths = 1;
	op.lengths = &len;
	op.n_segments = 1;
	op.segments = &g;
	return raw_chan(r, &op, NULL);
}

/* A READ into @g (NULL: none) on handle @id. Return: the answer's status. */
static int read_seg(struct tpt_raw *r, uint64_t id, Tpw__V1__Segment *g, bool take_held)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.n_segments = g ? 1 : 0;
	op.segments = &g;
	op.take_held = take_held;
	return raw_chan(r, &op, NULL);
}

/* A packed READ (ChanOp.pack) of up to @max items into @g on handle @id: the answer's status,
 * its items' count, its tail's bytes (checked to be the items' sum), each item's first word
 * in @ret_idx (up to 16) and held_len. Return: the status, or -errno. */
static int read_packed(struct tpt_raw *r, uint64_t id, Tpw__V1__Segment *g, uint32_t max,
		       size_t *ret_n, uint32_t *ret_tail, uint32_t *ret_idx, uint64_t *ret_held)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;
	uint8_t *tail = NULL;
	uint64_t sum = 0;
	int st;

	op.req_id = 2;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.pack = true;
	op.max_items = max;
	op.n_segments = 1;
	op.segments = &g;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	st = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	while (st == 0) {
		st = tpt_raw_recv(r, T_MS, &dm, &tail, ret_tail);
		if (st < 0 || dm->body_case == TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY)
			break;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		free(tail);
		dm = NULL;
		tail = NULL;
	}
	if (st < 0)
		return st;
	*ret_n = dm->chan_reply->n_lengths;
	*ret_held = dm->chan_reply->held_len;
	for (size_t i = 0, off = 0; i < *ret_n; off += dm->chan_reply->lengths[i++]) {
		sum += dm->chan_reply->lengths[i];
		if (i < 16 && sum <= *ret_tail && dm->chan_reply->lengths[i] >= 4)
			memcpy(&ret_idx[i], tail + off, 4);
	}
	st = sum == (dm->chan_reply->copied ? 0 : *ret_tail) ? (int)dm->chan_reply->status : -EPROTO;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	free(tail);
	return st;
}

/* The packed reads of a raw client of uid 65534 with rooms that lie: larger than its buffer
 * (shared: refused; by CMA, which its session has not: refused), 1 byte below the first item
 * (-EMSGSIZE, its length, the item stays), exactly three items packed (three), its whole
 * buffer and at most 2 (two), a large item into its own buffer (copied, within it). Each
 * answer comes back on an open session; the victim then reads the rest, in order. */
static int packed_attacker(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint32_t idx[16], tail = 0;
	uint64_t id, held = 0;
	struct tpt_raw r;
	size_t n = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(raw_buffer(&r) == 0, 1, "buffer");
	op.req_id = 1;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "open";
	op.owner_set = true;
	op.owner_uid = 0;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send open");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "open answer");
	id = dm->chan_reply->chan_id;
	TPT_REQUIRE(dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK &&
		    dm->chan_reply->pack_reads, 1, "open: %d, packed reads %d",
		    dm->chan_reply->status, dm->chan_reply->pack_reads);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	ref.buf_id = 1;
	ref.gen = 1;
	g.length = 1ull << 40; /* a room of 1 TiB in a buffer of 1 MiB */
	st = read_packed(&r, id, &g, 64, &n, &tail, idx, &held);
	TPT_REQUIRE(st > TPW__V1__STATUS__STATUS_OK && n == 0 && tail == 0, 1, "a room past its buffer: %d, %zu items",
		    st, n);
	g.length = BUF - 4096;
	ref.offset = 4097; /* ends one byte past its buffer */
	st = read_packed(&r, id, &g, 64, &n, &tail, idx, &held);
	TPT_REQUIRE(st > TPW__V1__STATUS__STATUS_OK && n == 0, 1, "a room 1 byte past its buffer: %d, %zu items", st, n);
	ref.offset = 0;
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR; /* no CMA for this session */
	g.cma_addr = 4096;
	st = read_packed(&r, id, &g, 64, &n, &tail, idx, &held);
	TPT_REQUIRE(st > TPW__V1__STATUS__STATUS_OK && n == 0, 1, "a CMA room without CMA: %d, %zu items", st, n);
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref; /* a oneof: the address overwrote it */
	g.length = 4095; /* below the first item */
	st = read_packed(&r, id, &g, 64, &n, &tail, idx, &held);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TOO_BIG && n == 0 && held == 4096, 1,
		    "a room below the first item: %d, %zu items, held_len %llu", st, n,
		    (unsigned long long)held);
	g.length = 3 * 4096; /* three packed, exactly */
	st = read_packed(&r, id, &g, 64, &n, &tail, idx, &held);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && n == 3 && tail == 3 * 4096 && idx[0] == 0 && idx[2] == 2, 1,
		    "three packed: %d, %zu items, %u bytes", st, n, tail);
	g.length = BUF;
	st = read_packed(&r, id, &g, 2, &n, &tail, idx, &held);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && n == 2 && tail == 2 * 4096 && idx[0] == 3 && idx[1] == 4, 1,
		    "two of max_items 2: %d, %zu items", st, n);
	tpt_raw_close(&r);
	return 0;
}

static int attacker(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT;
	struct tpt_raw r;
	uint64_t id = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(raw_buffer(&r) == 0, 1, "buffer");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "open";
	op.owner_set = true;
	op.owner_uid = 0;
	st = raw_chan(&r, &op, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "open: %d", st);
	g.length = ITEM;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	for (uint64_t b = 0; b < 16; b++) /* guessed buffer ids: the victim's too */
		for (uint64_t gen = 0; gen < 4; gen++) {
			if (b == 1 && gen == 1)
				continue;
			ref.buf_id = b;
			ref.gen = gen;
			st = write_seg(&r, id, &g);
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1,
				    "write from buffer %llu/%llu: %d", (unsigned long long)b,
				    (unsigned long long)gen, st);
			st = read_seg(&r, id, &g, false);
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1,
				    "read into buffer %llu/%llu: %d", (unsigned long long)b,
				    (unsigned long long)gen, st);
		}
	ref.buf_id = 1;
	ref.gen = 1;
	ref.offset = BUF - ITEM + 1; /* just past the end of its own buffer */
	st = write_seg(&r, id, &g);
	TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a write past its buffer went");
	st = read_seg(&r, id, &g, false);
	TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a read past its buffer went");
	ref.offset = UINT64_MAX - ITEM + 2; /* offset + length wraps */
	st = write_seg(&r, id, &g);
	TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a wrapping range went");
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR; /* no CMA for a session without the probe */
	g.cma_addr = 4096;
	st = write_seg(&r, id, &g);
	TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a CMA write went without CMA");
	st = read_seg(&r, id, &g, false);
	TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a CMA read went without CMA");
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref; /* a oneof: the address overwrote it */
	ref.offset = 0;
	st = read_seg(&r, id, &g, true);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "a held item nobody held: %d", st);
	ref.offset = BUF - ITEM; /* ends at its buffer's end: its own bytes, written */
	st = write_seg(&r, id, &g);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "a write inside its buffer: %d", st);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT; /* a batch read above segments_max */
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.max_items = TPW_DEFAULT_SEGMENTS_MAX + 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "the session stayed open");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_attacker_segments_touch_only_its_own_memory)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *secret;
	void *item;
	size_t len;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_buffer_alloc(ctx, BUF, (void **)&secret), 0);
	memset(secret, 0x5e, BUF);
	ck_assert_int_eq(tp_chan_open(ctx, "open", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write(ch, &(struct iovec){ secret, ITEM }, 1, 0), 0);
	memset(secret, 0, BUF); /* the item is the daemon's copy */
	ck_assert(tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), 0); /* the victim's item, first */
	ck_assert_uint_eq(len, ITEM);
	for (size_t i = 0; i < ITEM; i++)
		ck_assert_uint_eq(((uint8_t *)item)[i], 0x5e);
	free(item);
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), 0); /* the attacker's own zeros */
	ck_assert_uint_eq(len, ITEM);
	for (size_t i = 0; i < ITEM; i++)
		ck_assert_uint_eq(((uint8_t *)item)[i], 0);
	free(item);
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), -EAGAIN);
	tp_buffer_free(ctx, secret);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* A client's packed reads with rooms that lie touch nothing but its own buffer and take only
 * what fits: the victim reads every other item, in order, byte-exact (packed_attacker()). */
START_TEST(test_packed_read_lying_room)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tp_chan_item items[16];
	struct tp_context *ctx;
	struct tp_chan *ch;
	struct iovec iov[10];
	uint8_t (*src)[4096] = calloc(10, 4096), *buf = malloc(BUF);
	uint32_t i;
	size_t n;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		free(src);
		free(buf);
		return;
	}
	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "open", &o, &ch), 0);
	for (i = 0; i < 10; i++) {
		memset(src[i], 0x40 + (int)i, 4096);
		memcpy(src[i], &i, sizeof(i));
		iov[i] = (struct iovec){ .iov_base = src[i], .iov_len = 4096 };
	}
	ck_assert_int_eq(tp_chan_write(ch, iov, 10, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(packed_attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, BUF, items, 16, &n, 0), 0);
	ck_assert_uint_eq(n, 5); /* 5..9: the attacker took 0..4 */
	for (size_t k = 0; k < n; k++) {
		ck_assert_uint_eq(items[k].len, 4096);
		ck_assert_ptr_eq(items[k].data, buf + k * 4096);
		ck_assert_mem_eq(items[k].data, src[5 + k], 4096);
	}
	ck_assert_int_eq(tp_chan_read_many_into(ch, buf, BUF, items, 16, &n, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
	free(src);
	free(buf);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* A raw client of daemon a: a packed READ (ChanOp.pack) into its own buffer on its handle of
 * @arg, a channel of daemon b holding items 0, 1, 2 of 4096 bytes: all three in one answer, in
 * order. Return: 0 or 1 (logged). */
static int xpack_client(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT;
	uint32_t idx[16] = { 0 }, tail = 0;
	uint64_t id = 0, held = 0;
	struct tpt_raw r;
	size_t n = 0;
	int st;

	TPT_REQUIRE(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(raw_buffer(&r) == 0, 1, "buffer");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = arg;
	st = raw_chan(&r, &op, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "open %s: %d", (char *)arg, st);
	ref.buf_id = 1;
	ref.gen = 1;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	g.length = 65536;
	st = read_packed(&r, id, &g, 8, &n, &tail, idx, &held);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && n == 3 && tail == 3 * 4096, 1,
		    "packed read across hosts: status %d, %zu items, %u bytes", st, n, tail);
	for (uint32_t i = 0; i < 3; i++)
		TPT_REQUIRE(idx[i] == i, 1, "item %u is %u", i, idx[i]);
	tpt_raw_close(&r);
	return 0;
}

/* A client's packed read of another host's channel: its daemon forwards it as a peer's packed
 * read, never the client's own pack fields, which the hosting daemon would take from a peer as
 * malformed and fail the whole link (every user's handles over it); the items come, three in
 * one answer, and the link carries the next read. */
START_TEST(test_packed_read_across_hosts_keeps_the_link)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE, .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *cb, *ca;
	struct tp_chan *ch, *xch;
	uint8_t src[4][4096];
	struct iovec iov[4];
	char addr[300];
	size_t len;
	void *item;

	tpt_peer_fixture_start();
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_b, 0, "host", &cb), 0);
	ck_assert_int_eq(tp_chan_open(cb, "xp", &o, &ch), 0);
	for (uint32_t i = 0; i < 4; i++) {
		memset(src[i], 0x30 + (int)i, 4096);
		memcpy(src[i], &i, sizeof(i));
		iov[i] = (struct iovec){ .iov_base = src[i], .iov_len = 4096 };
	}
	ck_assert_int_eq(tp_chan_write(ch, iov, 3, 0), 0);
	tpt_peer_address(&tpt_peer_b, "xp", addr, sizeof(addr));
	ck_assert(tpt_wait_ok(tpt_fork(xpack_client, addr), 4 * T_MS, "client of a"));
	ck_assert_int_eq(tp_chan_write(ch, &iov[3], 1, 0), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_a, 0, "reader", &ca), 0);
	ck_assert_int_eq(tp_chan_open(ca, addr, NULL, &xch), 0);
	ck_assert_int_eq(tp_chan_read(xch, &item, &len, T_MS), 0);
	ck_assert_uint_eq(len, 4096);
	ck_assert_mem_eq(item, src[3], 4096);
	free(item);
	ck_assert(!tpt_daemon_log_has(&tpt_peer_b, "malformed"));
	tp_chan_release(xch);
	tp_context_free(ca);
	tp_chan_release(ch);
	tp_context_free(cb);
	tpt_peer_fixture_stop();
}
END_TEST

static Suite *chanfast_suite(void)
{
	Suite *s = suite_create("sec_chanfast");
	TCase *tc = tcase_create("chanfast");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_attacker_segments_touch_only_its_own_memory);
	tcase_add_test(tc, test_packed_read_lying_room);
	tcase_add_test(tc, test_packed_read_across_hosts_keeps_the_link);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanfast_suite());
}
