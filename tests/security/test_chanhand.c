/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: items handed off (docs/channels.md "Items handed off") between a victim
 * (root, through the library) and an unprivileged local user (uid 65534) speaking the raw
 * protocol on a channel it may use ("anyone"). A hostile writer whose item is handed off
 * reaches only the item's bytes of the victim's allocation: the bytes past it stay as the
 * victim left them. A hostile reader that watches its own buffer and dies as soon as the
 * daemon starts copying into it costs the victim's write nothing: the write succeeds and the
 * item is either the dead reader's (delivered) or the victim's next read, byte-exact; the
 * daemon stays up. A hostile session reading into the range it writes from is not handed off
 * (tests/integration/test_chan_hand.c, test_no_handoff_over_its_own_source).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define NOBODY 65534
#define MIB (1u << 20)
#define BIG (48u * MIB)
#define ITEM (MIB + 5)

static struct tpt_daemon d;

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -errno;
	return 0;
}

/* The attacker's session: a buffer of @size (id 1/1) mapped here too, and channel "open" of
 * root. Return: 0 or 1 (logged). */
static int attacker_setup(struct tpt_raw *r, size_t size, uint8_t **ret_mem, uint64_t *ret_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("attacker", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(fd >= 0 && ftruncate(fd, (off_t)size) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "memfd");
	*ret_mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	TPT_REQUIRE(*ret_mem != MAP_FAILED, 1, "mmap");
	TPT_REQUIRE(tpt_raw_connect(r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	b.req_id = 9;
	b.buf_id = 1;
	b.gen = 1;
	b.size = size;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, &fd, 1, 1) == 0, 1, "send BufferRegister");
	close(fd);
	TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm) == 0, 1, "reg");
	st = dm->reply->status;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "register refused: %d", st);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.req_id = 1;
	op.name = "open";
	op.owner_set = true;
	op.owner_uid = 0;
	m = (Tpw__V1__ClientMsg)TPW__V1__CLIENT_MSG__INIT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send open");
	TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "open answer");
	st = dm->chan_reply->status;
	*ret_id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "open: %d", st);
	return 0;
}

/* A READ into (or WRITE from) [0, @len) of the attacker's buffer on handle @id, req_id 2. */
static int attacker_io(struct tpt_raw *r, uint64_t id, bool write, uint64_t len)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;

	ref.buf_id = 1;
	ref.gen = 1;
	g.length = len;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	op.op = write ? TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE : TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.req_id = 2;
	op.chan_id = id;
	op.timeout_ms = write ? 0 : UINT32_MAX;
	op.n_segments = 1;
	op.segments = &gp;
	if (write) {
		op.n_lengths = 1;
		op.lengths = &g.length;
	}
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	return tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
}

/* Writes one ITEM-byte item of its own pattern when told (the victim waits first). */
static int hostile_writer(void *arg)
{
	struct tpt_sync *go = arg;
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw r;
	uint8_t *mem;
	uint64_t id;
	int st;

	TPT_REQUIRE(attacker_setup(&r, 2 * MIB, &mem, &id) == 0, 1, "setup");
	tpt_fill(mem, ITEM, tpt_seed(11, 0, 0));
	TPT_REQUIRE(tpt_sync_wait(go, T_MS) == 0, 1, "go");
	TPT_REQUIRE(attacker_io(&r, id, true, ITEM) == 0, 1, "send write");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "write answer");
	st = dm->chan_reply->status;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "write: %d", st);
	tpt_raw_close(&r);
	return 0;
}

/* Waits with a READ into its buffer and exits as soon as a byte of it changes: the daemon
 * is copying the victim's item into it. */
static int hostile_reader(void *arg)
{
	struct tpt_raw r;
	uint8_t *mem;
	uint64_t id;
	struct timespec t0, t;

	(void)arg;
	TPT_REQUIRE(attacker_setup(&r, BIG, &mem, &id) == 0, 1, "setup");
	TPT_REQUIRE(attacker_io(&r, id, false, BIG) == 0, 1, "send read");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		volatile uint8_t *p = mem;

		if (p[0] | p[4096] | p[65536])
			_exit(0); /* mid-copy (or just after): gone */
		clock_gettime(CLOCK_MONOTONIC, &t);
		TPT_REQUIRE(t.tv_sec - t0.tv_sec < 60, 1, "no copy came");
	}
}

struct victim_read {
	struct tp_chan *ch;
	uint8_t *dst;
	size_t len;
	int r;
};

static void *victim_read(void *arg)
{
	struct victim_read *v = arg;

	v->r = tp_chan_read_into(v->ch, v->dst, 2 * MIB, &v->len, T_MS);
	return NULL;
}

START_TEST(test_hostile_writer_reaches_only_the_item_bytes)
{
	struct victim_read v;
	pthread_t t;
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tp_context *ctx;
	struct tp_chan *ch;
	struct tpt_sync go;
	uint8_t *dst;
	size_t bad = 0;
	pid_t pid;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "open", &o, &ch), 0);
	ck_assert_int_eq(tp_buffer_alloc(ctx, 2 * MIB, (void **)&dst), 0);
	v = (struct victim_read){ .ch = ch, .dst = dst };
	memset(dst, 0xaa, 2 * MIB);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	pid = tpt_fork(hostile_writer, &go);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, victim_read, &v), 0);
	for (int i = 0; i < 3000 && tpt_ctl_channel_field(&d, "open", "readers_waiting") != 1; i++)
		usleep(10000); /* the victim's read waits first */
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(T_MS), "attacker"));
	ck_assert_int_ge(v.r, 0);
	ck_assert_uint_eq(v.len, ITEM);
	ck_assert_int_eq(tpt_ctl_channel_field(&d, "open", "items_handed_off"), 1);
	ck_assert_msg(tpt_verify(dst, ITEM, tpt_seed(11, 0, 0), &bad), "byte %zu", bad);
	for (size_t i = ITEM; i < 2 * MIB; i++)
		ck_assert_msg(dst[i] == 0xaa, "byte %zu past the item written", i);
	ck_assert(tpt_daemon_alive(&d));
	tpt_sync_done(&go);
	tp_buffer_free(ctx, dst);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_hostile_reader_dying_mid_copy_costs_the_writer_nothing)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .access = TP_ACCESS_ANYONE };
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *src, *dst;
	size_t len = 0, bad = 0;
	long off = 0, back = 0;
	pid_t pid;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "open", &o, &ch), 0);
	ck_assert_int_eq(tp_buffer_alloc(ctx, BIG, (void **)&src), 0);
	ck_assert_ptr_nonnull(dst = malloc(BIG));
	for (unsigned round = 0; round < 3; round++) {
		pid = tpt_fork(hostile_reader, NULL);
		ck_assert_int_gt(pid, 0);
		for (int i = 0; i < 3000 && tpt_ctl_channel_field(&d, "open", "readers_waiting") != 1;
		     i++)
			usleep(10000);
		ck_assert_int_eq(tpt_ctl_channel_field(&d, "open", "readers_waiting"), 1);
		tpt_fill(src, BIG, tpt_seed(12, round, 0));
		ck_assert_int_eq(tp_chan_write(ch, &(struct iovec){ src, BIG }, 1, T_MS), 0);
		memset(src, 0, BIG);
		ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(T_MS), "attacker"));
		off = tpt_ctl_channel_field(&d, "open", "items_handed_off");
		back = tpt_ctl_channel_field(&d, "open", "items_handed_back");
		ck_assert_int_eq(off + back, round + 1); /* every one handed off: delivered or back */
		if (tpt_ctl_channel_field(&d, "open", "items") == 1) { /* back: the victim's */
			ck_assert_int_ge(tp_chan_read_into(ch, dst, BIG, &len, 0), 0);
			ck_assert_uint_eq(len, BIG);
			ck_assert_msg(tpt_verify(dst, BIG, tpt_seed(12, round, 0), &bad), "byte %zu",
				      bad);
		}
		ck_assert_int_eq(tpt_ctl_channel_field(&d, "open", "items"), 0);
	}
	printf("hand-offs delivered to the dying reader %ld, given back %ld\n", off, back);
	ck_assert(tpt_daemon_alive(&d));
	free(dst);
	tp_buffer_free(ctx, src);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *chanhand_suite(void)
{
	Suite *s = suite_create("sec_chanhand");
	TCase *tc = tcase_create("hand");

	tcase_set_timeout(tc, 100);
	tcase_add_test(tc, test_hostile_writer_reaches_only_the_item_bytes);
	tcase_add_test(tc, test_hostile_reader_dying_mid_copy_costs_the_writer_nothing);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chanhand_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
