/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: items lent, not copied (issue 25 part private; docs/channels.md "Private items:
 * staging buffers lent"), against a client speaking the raw protocol as an unprivileged user (uid
 * 65534) with chan-bytes-per-uid of 1 MiB + 256 KiB. A lent buffer keeps the daemon's mapping of
 * the writer's memory alive after the writer unregisters it or dies, so the daemon charges the
 * lender's uid the whole buffer (besides its items, which their writer pays for) while any of
 * its items is in the channel, named or unlinked: a lend that would take the lender past
 * chan-bytes-per-uid is copied instead, charged its bytes only (the limit then just at: a byte
 * more is refused), and the charge goes once the last item has left (its buffer id comes back
 * in a later write's answer to a client of minor 12); a channel unlinked with a lent item keeps
 * it charged. A lend names only the writer's own buffers (a guessed id is not found), only on a
 * write by segment (on a read it closes the session: a protocol violation); the items stay
 * byte-exact after the writer unregistered the buffer. A buffer uid 65534 lends to uid 4242's
 * channel, and the item in it, are uid 65534's charge, not the owner's: the owner keeps its
 * whole limit, the lender its limit less the buffer and the item.
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

struct answer {
	int status;
	bool lent;
	size_t n_released;
	uint64_t released0;
	size_t len; /* an inline item's */
	uint8_t first, last;
};

/* Sends ChanOp @op (req_id 1) and waits for its answer. Return: 0 or -errno. */
static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, struct answer *a, uint64_t *ret_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint8_t *tail = NULL;
	uint32_t tail_len = 0;
	int ret;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	ret = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_recv(r, T_MS, &dm, &tail, &tail_len);
	if (ret < 0)
		return ret;
	if (dm->body_case != TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY) {
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		free(tail);
		return -EPROTO;
	}
	*a = (struct answer){ .status = dm->chan_reply->status, .lent = dm->chan_reply->lent,
			      .n_released = dm->chan_reply->n_released };
	if (a->n_released)
		a->released0 = dm->chan_reply->released[0];
	if (dm->chan_reply->n_lengths == 1 && tail_len && dm->chan_reply->lengths[0] == tail_len) {
		a->len = dm->chan_reply->lengths[0];
		a->first = tail[0];
		a->last = tail[a->len - 1];
	}
	if (ret_id)
		*ret_id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	free(tail);
	return 0;
}

/* Registers a memfd of BUF bytes as buffer @id/1, mapped at *@ret. Return: 0 or 1 (logged). */
static int raw_buffer(struct tpt_raw *r, uint64_t id, uint8_t **ret)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__DaemonMsg *dm;
	int fd = memfd_create("lender", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, BUF) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "memfd");
	*ret = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	TPT_REQUIRE(*ret != MAP_FAILED, 1, "mmap");
	b.req_id = 9;
	b.buf_id = id;
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

/* Releases buffer @id (its memory stays mapped here; no answer: the next op is served after
 * it). Return: 0 or 1 (logged). */
static int raw_unregister(struct tpt_raw *r, uint64_t id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRelease u = TPW__V1__BUFFER_RELEASE__INIT;

	u.buf_id = id;
	u.gen = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE;
	m.buffer_release = &u;
	TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send BufferRelease");
	return 0;
}

/* A lent WRITE of one ITEM at @off of buffer @buf_id on handle @id. */
static int lend_write(struct tpt_raw *r, uint64_t id, uint64_t buf_id, uint64_t off,
		      struct answer *a)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	uint64_t len = ITEM;

	ref.buf_id = buf_id;
	ref.gen = 1;
	ref.offset = off;
	g.length = ITEM;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = id;
	op.n_lengths = 1;
	op.lengths = &len;
	op.n_segments = 1;
	op.segments = &gp;
	op.lend = true;
	return raw_chan(r, &op, a, NULL);
}

/* A WRITE of one inline item of @len bytes (at most 1 MiB), timeout 0. */
static int inline_write(struct tpt_raw *r, uint64_t id, uint64_t len, struct answer *a)
{
	static uint8_t bytes[1u << 20];
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	int ret;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = id;
	op.n_lengths = 1;
	op.lengths = &len;
	op.req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	ret = tpt_raw_send(r, &m, bytes, (uint32_t)len, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm);
	if (ret < 0)
		return ret;
	*a = (struct answer){ .status = dm->chan_reply->status, .lent = dm->chan_reply->lent };
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return 0;
}

/* A WRITE of one inline byte, timeout 0. */
static int byte_write(struct tpt_raw *r, uint64_t id, struct answer *a)
{
	return inline_write(r, id, 1, a);
}

/* A READ of one item, inline (ITEM is below the inline item limit), timeout 0. */
static int item_read(struct tpt_raw *r, uint64_t id, struct answer *a)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	return raw_chan(r, &op, a, NULL);
}

#define OK TPW__V1__STATUS__STATUS_OK

static int lender(void *arg)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct answer a;
	struct tpt_raw r;
	uint8_t *mem;
	uint64_t id = 0, id2 = 0;

	(void)arg;
	TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0 &&
		    setresuid(NOBODY, NOBODY, NOBODY) == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	/* minor 12: buffers come back in a write's answer, not in a notice (minor 13) */
	TPT_REQUIRE(tpt_raw_hello_minor(&r, TPW__V1__ROLE__ROLE_CLIENT,
					TPW_MINOR_CHAN_RELEASED - 1, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(raw_buffer(&r, 1, &mem) == 0, 1, "buffer");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "lend";
	op.create = true;
	TPT_REQUIRE(raw_chan(&r, &op, &a, &id) == 0 && a.status == OK, 1, "open: %d", a.status);
	memset(mem, 0xa1, ITEM);
	memset(mem + ITEM, 0xb2, ITEM);

	/* A guessed buffer: not found, nothing written. */
	TPT_REQUIRE(lend_write(&r, id, 2, 0, &a) == 0 &&
		    a.status == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "guessed id: %d", a.status);
	/* A: the item and the whole buffer (1 MiB + 128 KiB) charged: within the limit, lent. */
	TPT_REQUIRE(lend_write(&r, id, 1, 0, &a) == 0 && a.status == OK && a.lent, 1,
		    "A: status %d lent %d", a.status, a.lent);
	/* B: 1 MiB more would pass the limit: copied, charged 128 KiB: just at the limit. */
	TPT_REQUIRE(lend_write(&r, id, 1, ITEM, &a) == 0 && a.status == OK && !a.lent, 1,
		    "B: status %d lent %d", a.status, a.lent);
	/* One byte more is above it. */
	TPT_REQUIRE(byte_write(&r, id, &a) == 0 && a.status == TPW__V1__STATUS__STATUS_LIMIT, 1,
		    "a byte above the limit: %d", a.status);
	/* The writer's memory after the lend: A's bytes are the buffer's, B's were copied. */
	TPT_REQUIRE(raw_unregister(&r, 1) == 0, 1, "unregister");
	memset(mem + ITEM, 0, ITEM);
	TPT_REQUIRE(item_read(&r, id, &a) == 0 && a.status == OK && a.len == ITEM &&
		    a.first == 0xa1 && a.last == 0xa1, 1, "A: %d, %zu bytes, %x..%x", a.status,
		    a.len, a.first, a.last);
	TPT_REQUIRE(item_read(&r, id, &a) == 0 && a.status == OK && a.len == ITEM &&
		    a.first == 0xb2 && a.last == 0xb2, 1, "B: %d, %zu bytes, %x..%x", a.status,
		    a.len, a.first, a.last);
	/* Both gone: the whole limit is free again, and the next write's answer gives buffer 1
	 * back. */
	TPT_REQUIRE(raw_buffer(&r, 3, &mem) == 0, 1, "buffer 3");
	TPT_REQUIRE(lend_write(&r, id, 3, 0, &a) == 0 && a.status == OK && a.lent &&
		    a.n_released == 1 && a.released0 == 1, 1, "C: status %d lent %d, %zu back",
		    a.status, a.lent, a.n_released);
	/* The channel unlinked with C in it: C's buffer stays charged (1 MiB + 128 KiB), so a lend
	 * to another channel is copied. */
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK;
	op.name = "lend";
	TPT_REQUIRE(raw_chan(&r, &op, &a, NULL) == 0 && a.status == OK, 1, "unlink: %d", a.status);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "lend2";
	op.create = true;
	TPT_REQUIRE(raw_chan(&r, &op, &a, &id2) == 0 && a.status == OK, 1, "open 2: %d", a.status);
	TPT_REQUIRE(lend_write(&r, id2, 3, ITEM, &a) == 0 && a.status == OK && !a.lent, 1,
		    "E: status %d lent %d", a.status, a.lent);
	/* A lend on a read is a protocol violation: the session closes. */
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.lend = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "the session stayed open");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_lent_buffers_are_charged_whole_and_own_only)
{
	static const char *const args[] = { "--chan-bytes-per-uid", "1310720", NULL };

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert(tpt_wait_ok(tpt_fork(lender, NULL), 4 * T_MS, "lender"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- a writer of another uid lends to the owner's channel ---------------------------------- */

#define VICTIM 4242
#define LIMIT 1310720u /* chan-bytes-per-uid: BUF + 2 ITEM */
#define LIMIT_STATUS TPW__V1__STATUS__STATUS_LIMIT

static struct tpt_sync v_ready, a_done, v_done;

/* Opens (creates) channel @name of @owner (or the caller's, -1) with @access. Return: 0 or 1. */
static int open_chan(struct tpt_raw *r, const char *name, long owner, Tpw__V1__Access access,
		     uint64_t *ret_id)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct answer a;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	op.create = owner < 0;
	op.owner_set = owner >= 0;
	op.owner_uid = owner >= 0 ? (uint32_t)owner : 0;
	op.access = access;
	TPT_REQUIRE(raw_chan(r, &op, &a, ret_id) == 0 && a.status == OK, 1, "open '%s': %d",
		    name, a.status);
	return 0;
}

/* uid 4242: a channel anyone may write, then (once uid 65534 lent it a 1 MiB buffer holding an
 * item of 128 KiB) its own bytes up to its whole limit: neither is its charge. */
static int victim(void *arg)
{
	struct tpt_raw r;
	struct answer a, b, c;
	uint64_t jobs, mine;

	(void)arg;
	TPT_REQUIRE(tpt_become(VICTIM) == 0, 1, "cannot become %d", VICTIM);
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	if (open_chan(&r, "jobs", -1, TPW__V1__ACCESS__ACCESS_ANYONE, &jobs) ||
	    open_chan(&r, "mine", -1, TPW__V1__ACCESS__ACCESS_OWNER, &mine))
		return 1;
	tpt_sync_post(&v_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&a_done, 4 * T_MS) == 0, 1, "no word from the lender");
	/* charged: these two, LIMIT in all (the lender's item is the lender's) */
	TPT_REQUIRE(inline_write(&r, mine, 512u << 10, &a) == 0 &&
		    inline_write(&r, mine, LIMIT - (512u << 10), &b) == 0 &&
		    byte_write(&r, mine, &c) == 0, 1, "writes");
	tpt_sync_post(&v_done, 0); /* the lender's item may go */
	TPT_REQUIRE(a.status == OK, 1, "512 KiB with another uid's 1 MiB buffer lent to its "
		    "channel: %d", a.status);
	TPT_REQUIRE(b.status == OK, 1, "up to the limit: %d", b.status);
	TPT_REQUIRE(c.status == LIMIT_STATUS, 1, "a byte above the limit: %d", c.status);
	tpt_raw_close(&r);
	return 0;
}

/* uid 65534: lends a buffer of BUF with one ITEM to uid 4242's channel; the buffer and the item
 * are charged to it: its own channel takes LIMIT - BUF - ITEM bytes more, not a byte above. */
static int foreign_lender(void *arg)
{
	struct tpt_raw r;
	struct answer a;
	uint64_t jobs, own;
	uint8_t *mem;

	(void)arg;
	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&v_ready, 4 * T_MS) == 0, 1, "no word from the victim");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(raw_buffer(&r, 1, &mem) == 0, 1, "buffer");
	if (open_chan(&r, "jobs", VICTIM, TPW__V1__ACCESS__ACCESS_UNSPECIFIED, &jobs) ||
	    open_chan(&r, "own", -1, TPW__V1__ACCESS__ACCESS_OWNER, &own))
		return 1;
	TPT_REQUIRE(lend_write(&r, jobs, 1, 0, &a) == 0, 1, "lend");
	tpt_sync_post(&a_done, 0);
	TPT_REQUIRE(a.status == OK && a.lent, 1, "lend to uid %d's channel: status %d lent %d",
		    VICTIM, a.status, a.lent);
	TPT_REQUIRE(inline_write(&r, own, LIMIT - BUF - ITEM, &a) == 0 && a.status == OK, 1,
		    "its own bytes up to its limit less the buffer and item: %d", a.status);
	TPT_REQUIRE(byte_write(&r, own, &a) == 0 && a.status == LIMIT_STATUS, 1,
		    "a byte above its limit with its buffer lent: %d", a.status);
	TPT_REQUIRE(tpt_sync_wait(&v_done, 4 * T_MS) == 0, 1, "no word from the victim");
	tpt_raw_close(&r);
	return 0;
}

/*
 * A buffer uid 65534 lends to a channel of uid 4242 (one it may write), and the item in it, are
 * charged to uid 65534, not to the channel's owner: the buffer was the owner's, so a writer of
 * another uid lending a large buffer with one small item took the owner's whole
 * chan-bytes-per-uid, far past the channel's capacity, for as long as the item stayed unread
 * (and for good once the owner had unlinked the channel and let go of it: nobody of its uid
 * could read it any more).
 */
START_TEST(test_another_uids_lent_buffer_is_the_lenders_charge)
{
	static const char *const args[] = { "--chan-bytes-per-uid", "1310720", NULL };
	pid_t v, l;

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	ck_assert_int_eq(tpt_sync_init(&v_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&a_done), 0);
	ck_assert_int_eq(tpt_sync_init(&v_done), 0);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	v = tpt_fork(victim, NULL);
	l = tpt_fork(foreign_lender, NULL);
	ck_assert(tpt_wait_ok(v, 4 * T_MS, "victim"));
	ck_assert(tpt_wait_ok(l, 4 * T_MS, "lender"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *chanlend_suite(void)
{
	Suite *s = suite_create("sec_chanlend");
	TCase *tc = tcase_create("chanlend");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_lent_buffers_are_charged_whole_and_own_only);
	tcase_add_test(tc, test_another_uids_lent_buffer_is_the_lenders_charge);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanlend_suite());
}
