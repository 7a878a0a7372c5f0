/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: pipe rings (issue 27, tpipd --pipe-ring yes). The ring header a victim shares
 * with the other end of its pipe is that end's to write too. An attacker (uid 65534) speaking
 * the raw protocol opens a pipe to a victim (uid 4242, the library), takes the ring the daemon
 * hands it for a 1 MiB private->private message and writes an impossible index into the header:
 * (a) as the writer, a head far ahead of what the ring holds; (b) as the reader of a 2 MiB
 * message (longer than the ring), a tail ahead of what the victim wrote, as soon as it has the
 * ring and again once the victim's writer has filled it and waits. The victim's side of that message fails with an error within the
 * deadline (no hang, no crash, nothing read out of bounds), the attacker's own side fails too,
 * and the victim's other pipe (from a friendly context of its own uid) still moves a 1 MiB
 * message through a ring, byte-exact; the daemon stays up and stops cleanly. (c) The attacker
 * names memory by ring_addr (the no-CMA writer's path) where the daemon offered no ring: as a
 * writer its Write is refused (STATUS_INVALID) and a CMA write after it reaches the victim
 * intact; as a reader of the victim's CMA message its Read is refused, and the victim's other
 * pipe still works. (d) The daemon hands a ring two messages at once; the attacker, reading
 * both, answers the second first: the ring fails with both (the victim's writes fail, none
 * hangs) and its other pipe still works. (e) A head out of bounds for a 256 KiB message, which
 * the victim's io thread takes out itself: the same failure. (f) A writer that puts nothing in
 * and answers RingDone OK: the victim's io thread hands the message on (its other pipe moves a
 * message meanwhile), the read stays pending (the writer's word completes nothing) and fails
 * once the attacker leaves. Needs root (to take the other uids); prints why it skips otherwise.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "frame.h"
#include "pring.h"
#include "pring_raw.h"

#define T_MS TPT_PRING_MS
#define NOBODY 65534
#define VICTIM 4242
#define LEN (1u << 20)
/* Longer than the ring (8 chunks of 128 KiB): its writer waits for the reader's tail once the
 * ring is full, and so reads a corrupt tail whenever it was written. A message the ring holds
 * whole is written without a look at the tail after the first: a tail corrupted after that
 * first look is seen by nobody but its reader (which only hurts itself, holding the write). */
#define LONG (2u * LEN)
#define QUARTER (256u << 10) /* 4 chunks: two messages fill the ring */
#define SMALL 60000u /* under pipe-ring-min (64K), by rendezvous from private memory */
#define NAME "pring-victim"

static struct tpt_daemon dmn;
static struct tpt_sync listening, attacked;
static size_t msg_len = LEN; /* of the message of run_case(), set before its forks */
/* The attacker corrupts the index only once the writer has filled the ring (head: start +
 * nchunks), not as soon as it has the ring (set before the forks) */
static bool corrupt_when_full;

/* ---- the attacker: raw protocol, control ring, pipe ring by hand ---------------------------- */

/* Takes the ring of this message and writes an impossible index into the other side's word. */
static int raw_corrupt(struct tpt_pring_raw *a, bool reader)
{
	Tpw__V1__DaemonMsg *x = NULL;
	struct tpw_pring_hdr *h;
	int fd = tpt_pring_raw_take_fd(a);

	TPT_REQUIRE(fd >= 0, 1, "ring fd: %d", fd);
	TPT_REQUIRE(tpt_raw_ring_expect(&a->r, &a->g, TPW__V1__DAEMON_MSG__BODY_RING_XFER, T_MS,
					&x) == 0, 1, "RingXfer");
	TPT_REQUIRE(x->ring_xfer->fd_follows && x->ring_xfer->reader == reader, 1, "RingXfer");
	h = mmap(NULL, TPW_PRING_HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	TPT_REQUIRE(h != MAP_FAILED, 1, "map the ring");
	if (reader && corrupt_when_full) {
		uint64_t end = tpt_now_ms() + T_MS;

		while (__atomic_load_n(&h->head, __ATOMIC_ACQUIRE) - x->ring_xfer->start <
			       x->ring_xfer->nchunks && tpt_now_ms() < end)
			usleep(1000);
		TPT_REQUIRE(__atomic_load_n(&h->head, __ATOMIC_ACQUIRE) - x->ring_xfer->start >=
				    x->ring_xfer->nchunks, 1, "the writer never filled the ring");
	}
	if (reader)
		__atomic_store_n(&h->tail, x->ring_xfer->start + 5000u, __ATOMIC_SEQ_CST);
	else
		__atomic_store_n(&h->head, x->ring_xfer->start + 1000u, __ATOMIC_SEQ_CST);
	tpw_pring_wake(&h->head);
	tpw_pring_wake(&h->tail);
	tpw_daemon_msg_free(x);
	return 0;
}

static uint8_t attacker_buf[LONG];

/* (a): writes 1 MiB of its private memory, then corrupts head. */
static int attacker_writer(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT, *pls[1] = { &pl };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__DaemonMsg *d = NULL;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	memset(attacker_buf, 0x66, LEN);
	seg.length = msg_len;
	seg.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	seg.cma_addr = (uint64_t)(uintptr_t)attacker_buf;
	pl.data = &seg;
	w.pipe_id = 1;
	w.write_id = 1;
	w.n_payloads = 1;
	w.payloads = pls;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "write");
	TPT_REQUIRE(raw_corrupt(&a, false) == 0, 1, "corrupt");
	/* Its own write fails too: the daemon has the victim's RingDone error. */
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS,
					&d) == 0, 1, "WriteDone");
	TPT_REQUIRE(d->write_done->status != TPW__V1__STATUS__STATUS_OK, 1, "write succeeded");
	tpw_daemon_msg_free(d);
	tpt_sync_post(&attacked, 0);
	return 0;
}

/* (b): reads the victim's 1 MiB message into its private memory, then corrupts tail. */
static int attacker_reader(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT, *segs[1] = { &seg };
	Tpw__V1__DaemonMsg *d = NULL;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR, T_MS,
					&d) == 0, 1, "descriptor");
	seg.length = msg_len;
	seg.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	seg.cma_addr = (uint64_t)(uintptr_t)attacker_buf;
	rd.pipe_id = 1;
	rd.msg_id = d->descriptor->msg_id;
	rd.n_payloads = 1;
	rd.payloads = segs;
	tpw_daemon_msg_free(d);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "read");
	TPT_REQUIRE(raw_corrupt(&a, true) == 0, 1, "corrupt");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_READ_DONE, T_MS,
					&d) == 0, 1, "ReadDone");
	TPT_REQUIRE(d->read_done->status != TPW__V1__STATUS__STATUS_OK, 1, "read succeeded");
	tpw_daemon_msg_free(d);
	tpt_sync_post(&attacked, 0);
	return 0;
}

/* ---- the victim: the library, and a friendly pipe of its own -------------------------------- */

static int victim(void *arg)
{
	bool victim_reads = *(bool *)arg;
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tp_context *cv;
	struct tp_listener *l;
	struct tp_pipe *p;
	uint8_t *buf = malloc(LONG);
	int r;

	TPT_REQUIRE(buf && tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept the attacker");
	if (victim_reads) {
		struct tp_descriptor *d;
		struct tp_slot s = { .data = buf };
		struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };

		TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &d) == 0, 1, "descriptor");
		r = tp_pipe_read_sync_timeout(p, d, &a, T_MS);
	} else {
		struct tp_payload pl = { .data = buf, .length = LEN };
		struct tp_message m = { .payloads = &pl, .n_payloads = 1 };

		memset(buf, 0x77, LONG);
		pl.length = msg_len;
		r = tp_pipe_write_sync_timeout(p, &m, T_MS);
	}
	tpt_log("victim's %s through the corrupt ring: %d (%s)", victim_reads ? "read" : "write",
		r, r < 0 ? tp_last_error() : "");
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT, 1, "the corrupt ring did not fail the transfer");
	TPT_REQUIRE(tpt_sync_wait(&attacked, T_MS) == 0, 1, "attacker done");
	TPT_REQUIRE(tpt_pring_friendly_message(&dmn, cv, l, NAME, T_MS) == 0, 1, "the other pipe");
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(cv);
	free(buf);
	return 0;
}

/*
 * Starts the case's daemon (@args), forks @victim_fn(@varg) and @attacker_fn as the victim's and
 * the attacker's uids, and waits for both to pass; @second is the case's other sync (with
 * listening). Skipped with a printed reason when not root (it must act as other uids).
 */
static void run_pair(const char *const *args, tpt_child_fn victim_fn, void *varg,
		     tpt_child_fn attacker_fn, struct tpt_sync *second)
{
	pid_t v, a;

	if (geteuid() != 0) {
		printf("pring: not root, cannot act as uids %d and %d: skipped\n", NOBODY, VICTIM);
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dmn), 0);
	ck_assert_int_eq(tpt_sync_init(&listening), 0);
	ck_assert_int_eq(tpt_sync_init(second), 0);
	v = tpt_fork(victim_fn, varg);
	a = tpt_fork(attacker_fn, NULL);
	ck_assert(tpt_wait_ok(a, 3 * T_MS, "attacker"));
	ck_assert(tpt_wait_ok(v, 3 * T_MS, "victim"));
	tpt_sync_done(&listening);
	tpt_sync_done(second);
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
}

static void run_case(bool victim_reads, size_t len, bool when_full)
{
	static const char *const args[] = { "--pipe-ring", "yes", NULL };

	msg_len = len;
	corrupt_when_full = when_full;
	run_pair(args, victim, &victim_reads, victim_reads ? attacker_writer : attacker_reader,
		 &attacked);
}

START_TEST(test_writer_corrupting_head_fails_only_its_message)
{
	run_case(true, LEN, false);
}
END_TEST

/* A message small enough for the victim's io thread to copy it out itself: the
 * same index check there, the same failure. */
START_TEST(test_writer_corrupting_head_of_a_small_message_fails_only_it)
{
	run_case(true, QUARTER, false);
}
END_TEST

START_TEST(test_reader_corrupting_tail_fails_only_its_message)
{
	run_case(false, LONG, false);
}
END_TEST

/* The same tail written once the victim's writer has filled the ring and waits for the reader
 * (what a slow daemon, e.g. under valgrind, made of the case above when its message fitted the
 * ring: the writer had put it all in before the attacker wrote, and never looked again). */
START_TEST(test_reader_corrupting_tail_of_a_full_ring_fails_only_its_message)
{
	run_case(false, LONG, true);
}
END_TEST

/* ---- ring addresses where the daemon offered no ring ---------------------------------------- */

/* Names its own memory by ring_addr, with no ring offered (it has CMA): the Write is refused,
 * its session and pipe live on, and a CMA write after it arrives. */
static int attacker_ring_addr_writer(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__DaemonMsg *d = NULL;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	memset(attacker_buf, 0x66, LEN);
	TPT_REQUIRE(tpt_pring_raw_write(&a, 1, attacker_buf, LEN, true) == 0, 1, "ring_addr write");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS,
					&d) == 0, 1, "WriteDone (the session was closed)");
	TPT_REQUIRE(d->write_done->write_id == 1 &&
			    d->write_done->status == TPW__V1__STATUS__STATUS_INVALID, 1,
		    "ring_addr write without an offer: status %d", d->write_done->status);
	tpw_daemon_msg_free(d);
	/* under pipe-ring-min: copied by cma, no ring for this raw client to serve */
	TPT_REQUIRE(tpt_pring_raw_write(&a, 2, attacker_buf, SMALL, false) == 0, 1, "cma write");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS,
					&d) == 0 && d->write_done->write_id == 2 &&
			    d->write_done->status == TPW__V1__STATUS__STATUS_OK, 1, "cma write");
	tpw_daemon_msg_free(d);
	tpt_sync_post(&attacked, 0);
	return 0;
}

/* Answers the victim's message (not ring-only) with a ring_addr: the Read is refused. */
static int attacker_ring_addr_reader(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT, *segs[1] = { &seg };
	Tpw__V1__DaemonMsg *d = NULL;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR, T_MS,
					&d) == 0 && !d->descriptor->ring_only, 1, "descriptor");
	seg.length = LEN;
	seg.loc_case = TPW__V1__SEGMENT__LOC_RING_ADDR;
	seg.ring_addr = (uint64_t)(uintptr_t)attacker_buf;
	rd.pipe_id = 1;
	rd.msg_id = d->descriptor->msg_id;
	rd.n_payloads = 1;
	rd.payloads = segs;
	tpw_daemon_msg_free(d);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "read");
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_READ_DONE, T_MS,
					&d) == 0, 1, "ReadDone (the session was closed)");
	TPT_REQUIRE(d->read_done->status == TPW__V1__STATUS__STATUS_INVALID, 1,
		    "ring_addr read of a message that is not ring-only: status %d",
		    d->read_done->status);
	tpw_daemon_msg_free(d);
	tpt_sync_post(&attacked, 0);
	return 0;
}

/* The victim of the two above: reads the attacker's CMA write intact, or sees its own write
 * fail (its reader refused); either way its other pipe still moves a ring message. */
static int victim_ring_addr(void *arg)
{
	bool victim_reads = *(bool *)arg;
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tp_context *cv;
	struct tp_listener *l;
	struct tp_pipe *p;
	uint8_t *buf = calloc(1, LEN);
	int r;

	TPT_REQUIRE(buf && tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept the attacker");
	if (victim_reads) {
		struct tp_descriptor *d;
		struct tp_slot s = { .data = buf };
		struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };

		TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &d) == 0, 1, "descriptor");
		r = tp_pipe_read_sync_timeout(p, d, &a, T_MS);
		TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
		for (size_t i = 0; i < SMALL; i++)
			TPT_REQUIRE(buf[i] == 0x66, 1, "byte %zu: %#x", i, buf[i]);
	} else {
		struct tp_payload pl = { .data = buf, .length = LEN };
		struct tp_message m = { .payloads = &pl, .n_payloads = 1 };

		r = tp_pipe_write_sync_timeout(p, &m, T_MS);
		TPT_REQUIRE(r < 0 && r != -ETIMEDOUT, 1, "write: %d", r);
	}
	TPT_REQUIRE(tpt_sync_wait(&attacked, T_MS) == 0, 1, "attacker done");
	TPT_REQUIRE(tpt_pring_friendly_message(&dmn, cv, l, NAME, T_MS) == 0, 1, "the other pipe");
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(cv);
	free(buf);
	return 0;
}

static void run_ring_addr_case(bool victim_reads)
{
	run_pair(NULL, victim_ring_addr, &victim_reads,
		 victim_reads ? attacker_ring_addr_writer : attacker_ring_addr_reader, &attacked);
}

START_TEST(test_ring_addr_write_without_offer_is_refused)
{
	run_ring_addr_case(true);
}
END_TEST

START_TEST(test_ring_addr_read_of_a_cma_message_is_refused)
{
	run_ring_addr_case(false);
}
END_TEST

/* ---- answers out of order on a ring carrying two messages ----------------------------------- */

/* Asks for both of the victim's messages (of QUARTER bytes: both fit in the ring at once),
 * takes their two RingXfers (the daemon hands out the second once the victim has put the first
 * in, while it is still on the ring) and answers the second first: the ring fails, with both
 * messages, instead of the first waiting forever. */
static int attacker_out_of_order(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__RingDone done = TPW__V1__RING_DONE__INIT;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT, *segs[1] = { &seg };
	Tpw__V1__DaemonMsg *d = NULL;
	uint64_t ids[2];
	int fd;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	for (int i = 0; i < 2; i++) {
		TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR,
						T_MS, &d) == 0, 1, "descriptor %d", i);
		ids[i] = d->descriptor->msg_id;
		tpw_daemon_msg_free(d);
	}
	seg.length = QUARTER;
	seg.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	seg.cma_addr = (uint64_t)(uintptr_t)attacker_buf;
	rd.pipe_id = 1;
	rd.n_payloads = 1;
	rd.payloads = segs;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	for (int i = 0; i < 2; i++) {
		rd.msg_id = ids[i];
		TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "read %d", i);
	}
	fd = tpt_pring_raw_take_fd(&a);
	TPT_REQUIRE(fd >= 0, 1, "ring fd: %d", fd);
	close(fd);
	for (int i = 0; i < 2; i++) {
		TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_RING_XFER,
						T_MS, &d) == 0 &&
				    d->ring_xfer->reader && d->ring_xfer->id == ids[i], 1,
			    "RingXfer %d of two on the ring at once", i);
		tpw_daemon_msg_free(d);
	}
	done.pipe_id = 1;
	done.id = ids[1];
	done.reader = true;
	done.status = TPW__V1__STATUS__STATUS_OK;
	m = (Tpw__V1__ClientMsg)TPW__V1__CLIENT_MSG__INIT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_DONE;
	m.ring_done = &done;
	TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "RingDone of the second");
	for (int i = 0; i < 2; i++) {
		TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_READ_DONE,
						T_MS, &d) == 0, 1, "ReadDone %d", i);
		TPT_REQUIRE(d->read_done->status != TPW__V1__STATUS__STATUS_OK, 1,
			    "read %d succeeded", i);
		tpw_daemon_msg_free(d);
	}
	tpt_sync_post(&attacked, 0);
	return 0;
}

/* Writes two messages of QUARTER bytes at once to the attacker: both fail within the deadline, and its
 * other pipe still moves a ring message. */
static int victim_two_writes(void *arg)
{
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tp_context *cv;
	struct tp_listener *l;
	struct tp_pipe *p;
	uint8_t *buf = malloc(2 * QUARTER);
	struct tp_payload pl[2] = { { .data = buf, .length = QUARTER },
				    { .data = buf + QUARTER, .length = QUARTER } };
	struct tp_message m[2] = { { .payloads = &pl[0], .n_payloads = 1 },
				   { .payloads = &pl[1], .n_payloads = 1 } };
	struct tpt_done done;
	struct tpt_done_arg da[2] = { { &done, 0 }, { &done, 1 } };

	(void)arg;
	TPT_REQUIRE(buf && tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	memset(buf, 0x77, 2 * QUARTER);
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept the attacker");
	tpt_done_init(&done);
	for (int i = 0; i < 2; i++)
		TPT_REQUIRE(tp_pipe_write(p, &m[i], tpt_done_cb, &da[i]) == 0, 1, "write %d", i);
	TPT_REQUIRE(tpt_done_wait(&done, 2, T_MS) == 0, 1, "the writes never completed");
	tpt_log("victim's writes on the ring answered out of order: %d, %d", done.status[0],
		done.status[1]);
	TPT_REQUIRE(done.status[0] < 0 && done.status[1] < 0, 1, "a write succeeded");
	TPT_REQUIRE(tpt_sync_wait(&attacked, T_MS) == 0, 1, "attacker done");
	TPT_REQUIRE(tpt_pring_friendly_message(&dmn, cv, l, NAME, T_MS) == 0, 1, "the other pipe");
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(cv);
	free(buf);
	return 0;
}

START_TEST(test_ring_answers_out_of_order_fail_the_ring)
{
	run_pair(NULL, victim_two_writes, NULL, attacker_out_of_order, &attacked);
}
END_TEST

/* ---- a writer that stalls and says it is done ----------------------------------------------- */

static struct tpt_sync released;

/* Writes a QUARTER message (small enough for the victim's io thread to take it out itself),
 * takes its ring and RingXfer, puts nothing in and still answers RingDone OK; then waits until
 * the victim has moved a message on its other pipe, and leaves. */
static int attacker_stalling_writer(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__RingDone done = TPW__V1__RING_DONE__INIT;
	Tpw__V1__DaemonMsg *d = NULL;
	int fd;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	TPT_REQUIRE(tpt_pring_raw_write(&a, 1, attacker_buf, QUARTER, false) == 0, 1, "write");
	fd = tpt_pring_raw_take_fd(&a);
	TPT_REQUIRE(fd >= 0, 1, "ring fd: %d", fd);
	close(fd);
	TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_RING_XFER, T_MS,
					&d) == 0 && !d->ring_xfer->reader, 1, "RingXfer");
	tpw_daemon_msg_free(d);
	done.pipe_id = 1;
	done.id = 1;
	done.status = TPW__V1__STATUS__STATUS_OK;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_DONE;
	m.ring_done = &done;
	TPT_REQUIRE(tpt_pring_raw_send(&a, &m) == 0, 1, "RingDone of nothing");
	TPT_REQUIRE(tpt_sync_wait(&released, 2 * T_MS) == 0, 1, "victim's other pipe");
	return 0; /* its session ends with it */
}

/* Reads the stalled message (its io thread, which would copy it out, hands it on), moves a
 * message on another pipe meanwhile, sees the stalled read still pending (the writer's OK
 * completes nothing), lets the attacker go and sees the read fail. */
static int victim_stalled_reader(void *arg)
{
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tp_context *cv;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d;
	uint8_t *buf = malloc(QUARTER);
	struct tp_slot sl = { .data = buf };
	struct tp_allocation al = { .payloads = &sl, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };

	(void)arg;
	TPT_REQUIRE(buf && tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept the attacker");
	TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &d) == 0, 1, "descriptor");
	tpt_done_init(&done);
	TPT_REQUIRE(tp_pipe_read(p, d, &al, tpt_done_cb, &da) == 0, 1, "read");
	TPT_REQUIRE(tpt_pring_friendly_message(&dmn, cv, l, NAME, T_MS) == 0, 1,
		    "the other pipe, while the read stalls");
	TPT_REQUIRE(tpt_done_wait(&done, 1, 0) == -ETIMEDOUT, 1,
		    "the stalled read completed (%d) on the writer's word", done.last_status);
	tpt_sync_post(&released, 0);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1, "the stalled read never ended");
	tpt_log("victim's read of the stalled message: %d", done.last_status);
	TPT_REQUIRE(done.last_status < 0, 1, "the stalled read succeeded");
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(cv);
	free(buf);
	return 0;
}

START_TEST(test_stalling_writer_holds_no_io_thread_and_its_ok_completes_nothing)
{
	static const char *const args[] = { "--pipe-ring", "yes", NULL };

	run_pair(args, victim_stalled_reader, NULL, attacker_stalling_writer, &released);
}
END_TEST

static Suite *pring_suite(void)
{
	Suite *s = suite_create("sec_pring");
	TCase *tc = tcase_create("pring");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_writer_corrupting_head_fails_only_its_message);
	tcase_add_test(tc, test_writer_corrupting_head_of_a_small_message_fails_only_it);
	tcase_add_test(tc, test_reader_corrupting_tail_fails_only_its_message);
	tcase_add_test(tc, test_reader_corrupting_tail_of_a_full_ring_fails_only_its_message);
	tcase_add_test(tc, test_ring_addr_write_without_offer_is_refused);
	tcase_add_test(tc, test_ring_addr_read_of_a_cma_message_is_refused);
	tcase_add_test(tc, test_ring_answers_out_of_order_fail_the_ring);
	tcase_add_test(tc, test_stalling_writer_holds_no_io_thread_and_its_ok_completes_nothing);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(pring_suite());
}
