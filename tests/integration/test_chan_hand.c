/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: items handed off (docs/channels.md "Items handed off"). A write from the
 * writer's shared buffer to a channel with readers already waiting goes with one copy straight
 * into their allocations, `tpipctl channels --json` counting it (items_handed_off): byte-exact
 * at 16 KiB + 1 and 16 MiB + 3 (16 KiB rides inline: not handed off); a batch of 6 to four
 * readers waiting in a known order goes item i to reader i, the last two into the channel, in
 * order; a reader released or killed during the copy loses nothing (items_handed_back: the
 * item is read afterwards, byte-exact, and the write succeeded); a writer gone during the copy
 * leaves its reader the whole item; a close during the copy delivers the item handed off and
 * keeps the rest of its batch readable; the channel's capacity_bytes and the owner's
 * chan-bytes-per-uid just at and just above an item handed off; a session reading into the
 * range it writes from is not handed off (the copy would run over its own source).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define KIB (1u << 10)
#define MIB (1u << 20)
#define BIG (48u * MIB) /* copied for milliseconds: frames sent after it land during the copy */

static struct tpt_daemon d;

static void start(const char *const *args)
{
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
}

static void stop(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}

static long field(const char *name, const char *what)
{
	return tpt_ctl_channel_field(&d, name, what);
}

/* Polls until channel @name has @n readers waiting. */
static void wait_readers(const char *name, long n)
{
	for (int i = 0; i < 3000 && field(name, "readers_waiting") != n; i++)
		usleep(10000);
	ck_assert_int_eq(field(name, "readers_waiting"), n);
}

static struct tp_chan *chan_open(struct tp_context *ctx, const char *name, uint64_t cap_bytes)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = cap_bytes };
	struct tp_chan *ch = NULL;

	ck_assert_int_eq(tp_chan_open(ctx, name, &o, &ch), 0);
	return ch;
}

/* A reader process: one tp_chan_read_into() of channel arg->name into a shared buffer, the
 * item checked against seed arg->seed and length arg->len. */
struct rd_arg {
	const char *name;
	size_t len;
	uint64_t seed;
	bool closed; /* TP_CHAN_CLOSED expected */
};

static int reader(void *arg)
{
	const struct rd_arg *a = arg;
	struct tp_context *ctx;
	struct tp_chan *ch;
	size_t len = 0, bad = 0;
	void *buf;
	int r;

	TPT_REQUIRE(tpt_ctx_new(&d, 0, "reader", &ctx) == 0, 1, "context");
	TPT_REQUIRE(tp_chan_open(ctx, a->name, NULL, &ch) == 0, 1, "open");
	TPT_REQUIRE(tp_buffer_alloc(ctx, a->len + 4096, &buf) == 0, 1, "buffer");
	memset(buf, 0xee, a->len + 4096);
	r = tp_chan_read_into(ch, buf, a->len + 4096, &len, T_MS);
	TPT_REQUIRE(r >= 0, 1, "read: %d", r);
	TPT_REQUIRE(!!(r & TP_CHAN_CLOSED) == a->closed, 1, "closed flag %d", r);
	TPT_REQUIRE(len == a->len, 1, "length %zu, not %zu", len, a->len);
	TPT_REQUIRE(tpt_verify(buf, len, a->seed, &bad), 1, "byte %zu differs", bad);
	tp_buffer_free(ctx, buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* Writes @n items of @len bytes, seeds tpt_seed(7, i, 0), from one shared buffer of @ctx. */
static int write_items(struct tp_context *ctx, struct tp_chan *ch, size_t n, size_t len)
{
	struct iovec iov[8];
	uint8_t *buf;
	int r;

	ck_assert_uint_le(n, 8);
	ck_assert_int_eq(tp_buffer_alloc(ctx, n * len, (void **)&buf), 0);
	for (size_t i = 0; i < n; i++) {
		tpt_fill(buf + i * len, len, tpt_seed(7, (unsigned)i, 0));
		iov[i] = (struct iovec){ buf + i * len, len };
	}
	r = tp_chan_write(ch, iov, n, T_MS);
	memset(buf, 0, n * len); /* the write returned: the memory is the writer's again */
	tp_buffer_free(ctx, buf);
	return r;
}

/* One reader waiting, one item of @len written: read byte-exact; handed off or not. */
static void one_item(struct tp_context *ctx, struct tp_chan *ch, size_t len, bool handed)
{
	struct rd_arg a = { .name = "hand.one", .len = len, .seed = tpt_seed(7, 0, 0) };
	long before = field("hand.one", "items_handed_off");
	pid_t pid = tpt_fork(reader, &a);

	ck_assert_int_gt(pid, 0);
	wait_readers("hand.one", 1);
	ck_assert_int_eq(write_items(ctx, ch, 1, len), 0);
	ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(T_MS), "reader"));
	ck_assert_int_eq(field("hand.one", "items_handed_off"), before + handed);
}

START_TEST(test_handoff_is_byte_exact_and_counted)
{
	struct tp_context *ctx;
	struct tp_chan *ch;

	start(NULL);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "writer", &ctx), 0);
	ch = chan_open(ctx, "hand.one", 0);
	ck_assert_int_eq(field("hand.one", "items_handed_off"), 0);
	one_item(ctx, ch, 16 * KIB, false); /* rides inline */
	one_item(ctx, ch, 16 * KIB + 1, true);
	one_item(ctx, ch, MIB, true);
	one_item(ctx, ch, 16 * MIB + 3, true);
	ck_assert_int_eq(field("hand.one", "items_read"), 4);
	ck_assert_int_eq(field("hand.one", "items"), 0);
	ck_assert_int_eq(field("hand.one", "bytes"), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	stop();
}
END_TEST

START_TEST(test_batch_goes_to_the_oldest_readers_in_order)
{
	struct rd_arg a[4];
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *dst;
	size_t len, bad;
	pid_t pid[4];

	start(NULL);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "writer", &ctx), 0);
	ch = chan_open(ctx, "hand.fair", 0);
	for (unsigned i = 0; i < 4; i++) { /* reader i waits i-th */
		a[i] = (struct rd_arg){ .name = "hand.fair", .len = MIB + 3,
					.seed = tpt_seed(7, i, 0) };
		pid[i] = tpt_fork(reader, &a[i]);
		ck_assert_int_gt(pid[i], 0);
		wait_readers("hand.fair", i + 1);
	}
	/* Six items; reader i checks item i's bytes. */
	ck_assert_int_eq(write_items(ctx, ch, 6, MIB + 3), 0);
	for (unsigned i = 0; i < 4; i++)
		ck_assert(tpt_wait_ok(pid[i], TPT_SCALED_MS(T_MS), "reader"));
	ck_assert_int_eq(field("hand.fair", "items_handed_off"), 4);
	ck_assert_int_eq(field("hand.fair", "items"), 2);
	ck_assert_ptr_nonnull(dst = malloc(MIB + 3));
	for (unsigned i = 4; i < 6; i++) {
		ck_assert_int_ge(tp_chan_read_into(ch, dst, MIB + 3, &len, T_MS), 0);
		ck_assert_uint_eq(len, MIB + 3);
		ck_assert_msg(tpt_verify(dst, len, tpt_seed(7, i, 0), &bad), "item %u byte %zu", i,
			      bad);
	}
	free(dst);
	tp_chan_release(ch);
	tp_context_free(ctx);
	stop();
}
END_TEST

/* ---- raw sessions: frames sent back to back land while the daemon copies ------------------ */

struct raw {
	struct tpt_raw r;
	uint8_t *mem; /* the registered buffer (id 1, gen 1), mapped here too */
	size_t size;
	uint64_t next_req;
};

static void raw_open(struct raw *s, size_t size)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("hand", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	s->mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(s->mem != MAP_FAILED);
	s->size = size;
	s->next_req = 100;
	ck_assert_int_eq(tpt_raw_connect(&s->r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&s->r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	b.req_id = 9;
	b.buf_id = 1;
	b.gen = 1;
	b.size = size;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	ck_assert_int_eq(tpt_raw_send(&s->r, &m, NULL, 0, &fd, 1, 1), 0);
	close(fd);
	ck_assert_int_eq(tpt_raw_expect(&s->r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm), 0);
	ck_assert_int_eq(dm->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
}

static void raw_close(struct raw *s)
{
	tpt_raw_close(&s->r);
	munmap(s->mem, s->size);
}

/* Sends @op (req_id set here); returns the req_id. */
static uint64_t raw_send(struct raw *s, Tpw__V1__ChanOp *op)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	op->req_id = s->next_req++;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	ck_assert_int_eq(tpt_raw_send(&s->r, &m, NULL, 0, NULL, 0, 0), 0);
	return op->req_id;
}

/* The answer to @req_id (others must not come first); its status; *@ret_closed its flag. */
static int raw_answer(struct raw *s, uint64_t req_id, bool *ret_closed)
{
	Tpw__V1__DaemonMsg *dm;
	int st;

	ck_assert_int_eq(tpt_raw_expect(&s->r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm), 0);
	ck_assert_uint_eq(dm->chan_reply->req_id, req_id);
	st = dm->chan_reply->status;
	if (ret_closed)
		*ret_closed = dm->chan_reply->closed;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

static uint64_t raw_chan_open(struct raw *s, const char *name)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint64_t id;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	op.owner_set = true;
	op.owner_uid = geteuid();
	op.create = true;
	raw_send(s, &op);
	ck_assert_int_eq(tpt_raw_expect(&s->r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm), 0);
	ck_assert_int_eq(dm->chan_reply->status, TPW__V1__STATUS__STATUS_OK);
	id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return id;
}

/* A WRITE of @n items of @len bytes at @off, @off + @len, ... of @s's buffer, or a READ into
 * [@off, @off + @len) (waiting without deadline), or CLOSE or RELEASE of handle @id. */
static uint64_t raw_io(struct raw *s, Tpw__V1__ChanOpKind kind, uint64_t id, uint64_t off,
		       uint64_t len, size_t n)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref[4];
	Tpw__V1__Segment g[4], *gp[4];
	uint64_t lens[4];

	op.op = kind;
	op.chan_id = id;
	op.timeout_ms = kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ ? UINT32_MAX : 0;
	for (size_t i = 0; i < n; i++) {
		ref[i] = (Tpw__V1__ShmRef)TPW__V1__SHM_REF__INIT;
		ref[i].buf_id = 1;
		ref[i].gen = 1;
		ref[i].offset = off + i * len;
		g[i] = (Tpw__V1__Segment)TPW__V1__SEGMENT__INIT;
		g[i].length = len;
		g[i].loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g[i].shm = &ref[i];
		gp[i] = &g[i];
		lens[i] = len;
	}
	op.n_segments = n;
	op.segments = gp;
	if (kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE) {
		op.n_lengths = n;
		op.lengths = lens;
	}
	return raw_send(s, &op);
}

#define WRITE TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE
#define READ TPW__V1__CHAN_OP_KIND__CHAN_OP_READ
#define CLOSE TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE
#define RELEASE TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE
#define OK TPW__V1__STATUS__STATUS_OK

/* Reads the next item of @name with a library context into private memory: @len bytes of
 * @seed; returns the read's flags. */
static int lib_read_check(const char *name, size_t len, uint64_t seed)
{
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *dst = malloc(len + 1);
	size_t got = 0, bad = 0;
	int r;

	ck_assert_ptr_nonnull(dst);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "check", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, name, NULL, &ch), 0);
	r = tp_chan_read_into(ch, dst, len + 1, &got, T_MS);
	ck_assert_int_ge(r, 0);
	ck_assert_uint_eq(got, len);
	ck_assert_msg(tpt_verify(dst, len, seed, &bad), "byte %zu differs", bad);
	tp_chan_release(ch);
	tp_context_free(ctx);
	free(dst);
	return r;
}

START_TEST(test_reader_released_during_handoff_loses_nothing)
{
	struct raw s;
	uint64_t rid, wid, rq, wq;

	start(NULL);
	raw_open(&s, 2 * (size_t)BIG);
	rid = raw_chan_open(&s, "hand.rel");
	wid = raw_chan_open(&s, "hand.rel");
	tpt_fill(s.mem + BIG, BIG, tpt_seed(3, 0, 0));
	rq = raw_io(&s, READ, rid, 0, BIG, 1);
	wait_readers("hand.rel", 1);
	wq = raw_io(&s, WRITE, wid, BIG, BIG, 1);
	raw_io(&s, RELEASE, rid, 0, 0, 0); /* the reader goes while the daemon copies */
	(void)rq; /* never answered: its handle went */
	for (;;) { /* the release's answer, then the write's */
		Tpw__V1__DaemonMsg *dm;
		uint64_t q;
		int st;

		ck_assert_int_eq(tpt_raw_expect(&s.r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS,
						&dm), 0);
		q = dm->chan_reply->req_id;
		st = dm->chan_reply->status;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		ck_assert_uint_ne(q, rq);
		if (q == wq) {
			ck_assert_int_eq(st, OK);
			break;
		}
	}
	memset(s.mem + BIG, 0, BIG); /* the write was answered: the item is the channel's */
	ck_assert_int_eq(field("hand.rel", "items_handed_back"), 1);
	ck_assert_int_eq(field("hand.rel", "items_handed_off"), 0);
	ck_assert_int_eq(field("hand.rel", "items"), 1);
	lib_read_check("hand.rel", BIG, tpt_seed(3, 0, 0));
	raw_close(&s);
	stop();
}
END_TEST

static int raw_reader_child(void *arg)
{
	struct raw s;

	(void)arg;
	raw_open(&s, BIG);
	raw_io(&s, READ, raw_chan_open(&s, "hand.kill"), 0, BIG, 1);
	pause(); /* killed during the copy */
	return 1;
}

START_TEST(test_reader_killed_during_handoff_loses_nothing)
{
	struct raw w;
	uint64_t wid;
	long back = 0;
	int st;

	start(NULL);
	raw_open(&w, BIG);
	wid = raw_chan_open(&w, "hand.kill");
	/* A kill that lands after the copy ended is a delivery, not a loss: try until one lands
	 * during it (a 48 MiB copy takes milliseconds, the kill microseconds). */
	for (unsigned round = 0; round < 5 && back == 0; round++) {
		pid_t pid = tpt_fork(raw_reader_child, NULL);
		uint64_t wq;

		ck_assert_int_gt(pid, 0);
		wait_readers("hand.kill", 1);
		tpt_fill(w.mem, BIG, tpt_seed(4, round, 0));
		wq = raw_io(&w, WRITE, wid, 0, BIG, 1);
		kill(pid, SIGKILL);
		ck_assert_int_eq(raw_answer(&w, wq, NULL), OK);
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		back = field("hand.kill", "items_handed_back");
		/* in the channel, whole (handed back; or the reader went before the write came) */
		if (back || field("hand.kill", "items") == 1)
			lib_read_check("hand.kill", BIG, tpt_seed(4, round, 0));
		ck_assert_int_eq(field("hand.kill", "items"), 0);
	}
	ck_assert_int_eq(back, 1);
	ck_assert_int_eq(field("hand.kill", "items"), 0);
	raw_close(&w);
	stop();
}
END_TEST

START_TEST(test_writer_gone_during_handoff_leaves_the_whole_item)
{
	struct rd_arg a = { .name = "hand.wgone", .len = BIG, .seed = tpt_seed(5, 0, 0) };
	struct tp_context *ctx;
	struct tp_chan *keep;
	struct raw w;
	uint64_t wid;
	pid_t pid;

	start(NULL);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "keeper", &ctx), 0);
	keep = chan_open(ctx, "hand.wgone", 0); /* the channel outlives writer and reader */
	raw_open(&w, BIG);
	wid = raw_chan_open(&w, "hand.wgone");
	pid = tpt_fork(reader, &a);
	ck_assert_int_gt(pid, 0);
	wait_readers("hand.wgone", 1);
	tpt_fill(w.mem, BIG, tpt_seed(5, 0, 0));
	raw_io(&w, WRITE, wid, 0, BIG, 1);
	tpt_raw_close(&w.r); /* the writer's session ends while the daemon copies */
	ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(T_MS), "reader"));
	ck_assert_int_eq(field("hand.wgone", "items_handed_off"), 1);
	ck_assert_int_eq(field("hand.wgone", "items"), 0);
	tp_chan_release(keep);
	tp_context_free(ctx);
	munmap(w.mem, w.size);
	stop();
}
END_TEST

START_TEST(test_close_during_handoff_delivers_and_keeps_the_batch)
{
	struct raw s;
	uint64_t rid, wid, rq, wq, cq;
	bool closed = false;
	size_t bad = 0;

	start(NULL);
	raw_open(&s, 3 * (size_t)BIG / 2);
	rid = raw_chan_open(&s, "hand.close");
	wid = raw_chan_open(&s, "hand.close");
	tpt_fill(s.mem + BIG / 2, BIG / 2, tpt_seed(6, 0, 0));
	tpt_fill(s.mem + BIG, BIG / 2, tpt_seed(6, 1, 0));
	rq = raw_io(&s, READ, rid, 0, BIG / 2, 1);
	wait_readers("hand.close", 1);
	wq = raw_io(&s, WRITE, wid, BIG / 2, BIG / 2, 2); /* item 0 handed off, item 1 copied in */
	cq = raw_io(&s, CLOSE, wid, 0, 0, 0);
	ck_assert_int_eq(raw_answer(&s, cq, NULL), OK);
	ck_assert_int_eq(raw_answer(&s, rq, &closed), OK);
	ck_assert(closed);
	ck_assert_msg(tpt_verify(s.mem, BIG / 2, tpt_seed(6, 0, 0), &bad), "byte %zu", bad);
	ck_assert_int_eq(raw_answer(&s, wq, NULL), OK);
	ck_assert_int_eq(field("hand.close", "items_handed_off"), 1);
	ck_assert_int_eq(lib_read_check("hand.close", BIG / 2, tpt_seed(6, 1, 0)) & TP_CHAN_CLOSED,
			 TP_CHAN_CLOSED);
	ck_assert_int_eq(raw_answer(&s, raw_io(&s, READ, rid, 0, BIG / 2, 1), NULL),
			 TPW__V1__STATUS__STATUS_CLOSED); /* drained */
	raw_close(&s);
	stop();
}
END_TEST

START_TEST(test_close_then_reader_released_during_handoff)
{
	struct raw s;
	uint64_t rid, wid, wq;

	start(NULL);
	raw_open(&s, 2 * (size_t)BIG);
	rid = raw_chan_open(&s, "hand.cr");
	wid = raw_chan_open(&s, "hand.cr");
	tpt_fill(s.mem + BIG, BIG, tpt_seed(8, 0, 0));
	raw_io(&s, READ, rid, 0, BIG, 1);
	wait_readers("hand.cr", 1);
	wq = raw_io(&s, WRITE, wid, BIG, BIG, 1);
	raw_io(&s, CLOSE, wid, 0, 0, 0);
	raw_io(&s, RELEASE, rid, 0, 0, 0);
	for (;;) {
		Tpw__V1__DaemonMsg *dm;
		uint64_t q;
		int st;

		ck_assert_int_eq(tpt_raw_expect(&s.r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS,
						&dm), 0);
		q = dm->chan_reply->req_id;
		st = dm->chan_reply->status;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		if (q == wq) {
			ck_assert_int_eq(st, OK); /* admitted before the close: written */
			break;
		}
	}
	ck_assert_int_eq(field("hand.cr", "items_handed_back"), 1);
	ck_assert_int_eq(lib_read_check("hand.cr", BIG, tpt_seed(8, 0, 0)) & TP_CHAN_CLOSED,
			 TP_CHAN_CLOSED);
	raw_close(&s);
	stop();
}
END_TEST

/* Limits: an item handed off is charged as one in the channel; just at a limit it goes, just
 * above it the write fails as before and the reader goes on waiting. */
static void limit_case(const char *name, uint64_t cap, size_t len, int expect, long handed)
{
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *buf;

	ck_assert_int_eq(tpt_ctx_new(&d, 0, "writer", &ctx), 0);
	ch = chan_open(ctx, name, cap);
	ck_assert_int_eq(tp_buffer_alloc(ctx, len, (void **)&buf), 0);
	{
		struct rd_arg a = { .name = name, .len = len, .seed = tpt_seed(7, 0, 0) };
		pid_t pid = tpt_fork(reader, &a);

		ck_assert_int_gt(pid, 0);
		wait_readers(name, 1);
		tpt_fill(buf, len, tpt_seed(7, 0, 0));
		ck_assert_int_eq(tp_chan_write(ch, &(struct iovec){ buf, len }, 1, 0), expect);
		ck_assert_int_eq(field(name, "items_handed_off"), handed);
		if (expect == 0) {
			ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(T_MS), "reader"));
		} else {
			ck_assert_int_eq(field(name, "readers_waiting"), 1);
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
	}
	tp_buffer_free(ctx, buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
}

START_TEST(test_limits_count_an_item_handed_off)
{
	const char *const args[] = { "--chan-bytes-per-uid", "3M", NULL };
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *buf;

	start(args);
	limit_case("hand.cap.at", MIB, MIB, 0, 1);
	limit_case("hand.cap.above", MIB, MIB + 1, -EMSGSIZE, 0);
	/* 2 MiB held in another channel of the uid: 1 MiB more goes, 1 MiB + 1 does not. */
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "filler", &ctx), 0);
	ch = chan_open(ctx, "hand.fill", 0);
	ck_assert_int_eq(tp_buffer_alloc(ctx, 2 * MIB, (void **)&buf), 0);
	ck_assert_int_eq(tp_chan_write(ch, &(struct iovec){ buf, 2 * MIB }, 1, 0), 0);
	limit_case("hand.uid.at", 0, MIB, 0, 1);
	limit_case("hand.uid.above", 0, MIB + 1, -ENOBUFS, 0);
	tp_buffer_free(ctx, buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
	stop();
}
END_TEST

/* A session that reads into the very range it writes from: no hand-off (a copy over its own
 * source); the item goes the normal way and arrives as written. */
START_TEST(test_no_handoff_over_its_own_source)
{
	struct raw s;
	uint64_t rid, wid, rq, wq;
	size_t bad = 0;

	start(NULL);
	raw_open(&s, 3 * MIB);
	rid = raw_chan_open(&s, "hand.self");
	wid = raw_chan_open(&s, "hand.self");
	tpt_fill(s.mem + MIB / 2, 2 * MIB, tpt_seed(9, 0, 0));
	rq = raw_io(&s, READ, rid, 0, 2 * MIB, 1); /* [0, 2M) */
	wait_readers("hand.self", 1);
	wq = raw_io(&s, WRITE, wid, MIB / 2, 2 * MIB, 1); /* [512K, 2.5M) */
	for (unsigned k = 0; k < 2; k++) { /* both answered, in either order */
		Tpw__V1__DaemonMsg *dm;

		ck_assert_int_eq(tpt_raw_expect(&s.r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS,
						&dm), 0);
		ck_assert(dm->chan_reply->req_id == rq || dm->chan_reply->req_id == wq);
		ck_assert_int_eq(dm->chan_reply->status, OK);
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	}
	ck_assert_msg(tpt_verify(s.mem, 2 * MIB, tpt_seed(9, 0, 0), &bad), "byte %zu", bad);
	ck_assert_int_eq(field("hand.self", "items_handed_off"), 0);
	ck_assert(tpt_daemon_alive(&d));
	raw_close(&s);
	stop();
}
END_TEST

static Suite *hand_suite(void)
{
	Suite *s = suite_create("chan_hand");
	TCase *tc = tcase_create("hand");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_handoff_is_byte_exact_and_counted);
	tcase_add_test(tc, test_batch_goes_to_the_oldest_readers_in_order);
	tcase_add_test(tc, test_reader_released_during_handoff_loses_nothing);
	tcase_add_test(tc, test_reader_killed_during_handoff_loses_nothing);
	tcase_add_test(tc, test_writer_gone_during_handoff_leaves_the_whole_item);
	tcase_add_test(tc, test_close_during_handoff_delivers_and_keeps_the_batch);
	tcase_add_test(tc, test_close_then_reader_released_during_handoff);
	tcase_add_test(tc, test_limits_count_an_item_handed_off);
	tcase_add_test(tc, test_no_handoff_over_its_own_source);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(hand_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
