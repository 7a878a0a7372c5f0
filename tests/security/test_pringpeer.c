/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: the library's pipe ring threads against a hostile pipe peer (tpipd --pipe-ring
 * yes). An attacker (uid 65534) speaking the raw protocol opens a pipe to a victim (uid 4242, the
 * library) and takes the ring the daemon hands both for a private->private message. Its index
 * (head as the writer, tail as the reader) is its own to write, and it keeps switching it
 * between two values the bounds allow, with 1 to 4 threads: the victim's copy must never wait
 * for it forever. The victim's io thread (a 256 KiB message, copied there) and its ring thread
 * (1 MiB) both fail the message as a protocol violation (EIO, "moved backwards") within the
 * deadline, and the victim's other pipe moves a 1 MiB message within 1 s meanwhile. A single
 * step backwards after the victim took two chunks fails the message the same way. A writer that
 * fails its side and keeps the ring's dead word at 0 holds neither the victim's read callback
 * (the daemon failed the read) nor the callbacks behind it. And each
 * ring costs the victim a thread and a mapping: with TPIPD_PIPE_RINGS_MAX=2 it maps rings for
 * the attacker's first two pipes only, declines the next ones, whose messages still arrive (by
 * cma). Needs root (to take the other uids); prints why it skips otherwise.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "itest.h"
#include "pring.h"
#include "pring_raw.h"

#define T_MS TPT_PRING_MS
#define NOBODY 65534
#define VICTIM 4242
#define LEN (1u << 20)
#define QUARTER (256u << 10) /* at most PRING_INLINE_MAX: the victim's io thread copies it */
#define NAME "pringpeer-victim"
#define TOGGLERS_MAX 4
#define MSGS_MAX 3
_Static_assert(LEN >= (size_t)TPW_PRING_CHUNK * TPW_PRING_NCHUNKS, "a LEN message fills the ring");
/* A message the writer cannot put in whole before the reader takes some: twice the ring. */
#define BIG (2 * (size_t)TPW_PRING_CHUNK * TPW_PRING_NCHUNKS)

static struct tpt_daemon dmn;
static struct tpt_sync listening, released;

/* The case, set before its forks. */
static struct {
	bool victim_reads; /* the attacker writes */
	size_t len;
	unsigned threads; /* toggling the attacker's index; 0: one step back instead */
	unsigned msgs;	  /* the victim writes, at once, the last one attacked */
	/* the writer fails its side (RingDone) and its threads keep the dead word at 0 */
	bool dead_reset;
} kase;

static uint8_t attacker_buf[TPU_MAX((size_t)LEN, BIG)];

/* The length of the victim's write @i: all but the last of several are LEN, which fill the
 * ring (the ring's own thread writes them, then idles), so that the last, copied by the io
 * thread, has to wait for the reader whatever the ring's geometry. */
static size_t msg_len(unsigned i)
{
	return !kase.victim_reads && i + 1 < kase.msgs ? LEN : kase.len;
}

/* Where the victim's write @i starts in its buffer. */
static size_t msg_off(unsigned i)
{
	size_t off = 0;

	for (unsigned k = 0; k < i; k++)
		off += msg_len(k);
	return off;
}

/* ---- the attacker: its index toggled by threads ---------------------------------------------- */

struct toggler {
	uint32_t *word;
	uint32_t a, b;
	bool stop; /* atomic */
};

static void *toggle_main(void *arg)
{
	struct toggler *t = arg;

	for (unsigned n = 0; !__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE); n++) {
		__atomic_store_n(t->word, t->a, __ATOMIC_SEQ_CST);
		__atomic_store_n(t->word, t->b, __ATOMIC_SEQ_CST);
		if ((n & 1023) == 0)
			tpw_pring_wake(t->word);
	}
	return NULL;
}

/* Takes the ring fd and the RingXfers of @n messages (the attacker's side, @reader) and maps
 * the header. Return: the header, or NULL (logged); *@start: the last message's first chunk. */
static struct tpw_pring_hdr *raw_ring(struct tpt_pring_raw *a, bool reader, unsigned n,
				      uint32_t *start, uint32_t *nchunks)
{
	Tpw__V1__DaemonMsg *x = NULL;
	struct tpw_pring_hdr *h;
	int fd = tpt_pring_raw_take_fd(a);

	TPT_REQUIRE(fd >= 0, NULL, "ring fd: %d", fd);
	for (unsigned i = 0; i < n; i++) {
		TPT_REQUIRE(tpt_raw_ring_expect(&a->r, &a->g, TPW__V1__DAEMON_MSG__BODY_RING_XFER,
						T_MS, &x) == 0, NULL, "RingXfer %u", i);
		TPT_REQUIRE(x->ring_xfer->fd_follows == (i == 0) && x->ring_xfer->reader == reader,
			    NULL, "RingXfer %u", i);
		*start = x->ring_xfer->start;
		*nchunks = x->ring_xfer->nchunks;
		tpw_daemon_msg_free(x);
	}
	h = mmap(NULL, TPW_PRING_HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	TPT_REQUIRE(h != MAP_FAILED, NULL, "map the ring");
	return h;
}

/* Waits until the victim's index @word is @v. Return: 0, or 1 (logged). */
static int await_index(const uint32_t *word, uint32_t v)
{
	uint64_t end = tpt_now_ms() + (uint64_t)T_MS;

	while (__atomic_load_n(word, __ATOMIC_ACQUIRE) != v)
		TPT_REQUIRE(tpt_now_ms() < end, 1, "the victim's index never reached %u", v);
	return 0;
}

/* Once the victim's index @victim is at @pre, moves its own @word to @from; once the victim's
 * is at @seen, moves it back to @from - 1. Return: 0, or 1 (logged). */
static int step_back(uint32_t *word, const uint32_t *victim, uint32_t pre, uint32_t from,
		     uint32_t seen)
{
	TPT_REQUIRE(await_index(victim, pre) == 0, 1, "before");
	__atomic_store_n(word, from, __ATOMIC_SEQ_CST);
	tpw_pring_wake(word);
	TPT_REQUIRE(await_index(victim, seen) == 0, 1, "after");
	__atomic_store_n(word, from - 1, __ATOMIC_SEQ_CST);
	tpw_pring_wake(word);
	return 0;
}

/* Fails its side of message 1 (as its writer): the daemon fails the ring with it. */
static int ring_done_failed(struct tpt_pring_raw *a)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__RingDone done = TPW__V1__RING_DONE__INIT;

	done.pipe_id = 1;
	done.id = 1;
	done.status = TPW__V1__STATUS__STATUS_IO;
	done.message = "given up by the attacker";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_DONE;
	m.ring_done = &done;
	return tpt_pring_raw_send(a, &m);
}

/*
 * Writes (the victim reads) a kase.len message through the ring, or reads (the victim writes)
 * kase.msgs of them, then, with kase.threads threads, switches its index between two values the
 * bounds allow: as the writer, the message's chunk 0 and chunk 1 values of head; as the reader,
 * tail a whole ring behind the last message and one chunk more (the victim, which filled the
 * ring with the messages before, waits for it at once). With kase.threads 0 it moves its index
 * back once instead, after the victim took two chunks. With kase.dead_reset it puts nothing in,
 * fails its side, and its threads keep the ring's dead word, which the daemon sets, at 0. It
 * keeps at it until the victim is done.
 */
static int attacker(void *arg)
{
	struct tpt_pring_raw a;
	Tpw__V1__DaemonMsg *d = NULL;
	struct toggler t = { 0 };
	pthread_t th[TOGGLERS_MAX];
	struct tpw_pring_hdr *h;
	uint32_t start = 0, nchunks = 0;
	uint64_t ids[MSGS_MAX];
	unsigned n = 0;
	int rc = 0;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_pring_raw_attach(&a, dmn.socket, NAME) == 0, 1, "attach");
	memset(attacker_buf, 0x66, LEN);
	if (kase.victim_reads) {
		TPT_REQUIRE(tpt_pring_raw_write(&a, 1, attacker_buf, kase.len, false) == 0, 1,
			    "write");
	}
	/* every descriptor before the first Read: the ring's fd, which the daemon sends on the
	 * socket ahead of the RingXfer, must not be read past while waiting for one */
	for (unsigned i = 0; !kase.victim_reads && i < kase.msgs; i++) {
		TPT_REQUIRE(tpt_raw_ring_expect(&a.r, &a.g, TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR,
						T_MS, &d) == 0, 1, "descriptor");
		ids[i] = d->descriptor->msg_id;
		tpw_daemon_msg_free(d);
	}
	for (unsigned i = 0; !kase.victim_reads && i < kase.msgs; i++)
		TPT_REQUIRE(tpt_pring_raw_read(&a, ids[i], attacker_buf, msg_len(i)) == 0, 1,
			    "read");
	h = raw_ring(&a, !kase.victim_reads, kase.victim_reads ? 1 : kase.msgs, &start, &nchunks);
	TPT_REQUIRE(h, 1, "ring");
	t.word = kase.victim_reads ? &h->head : &h->tail;
	t.a = kase.victim_reads ? start : start - nchunks;
	t.b = t.a + 1;
	if (kase.dead_reset) {
		t.word = &h->dead;
		t.a = t.b = 0;
	}
	/* one step back: as the writer, once the victim took two chunks; as the reader, once the
	 * victim filled the ring, took two chunks out and filled it again */
	if (kase.threads == 0)
		rc = kase.victim_reads ? step_back(&h->head, &h->tail, start, start + 2, start + 2)
				       : step_back(&h->tail, &h->head, start + nchunks, start + 2,
						   start + nchunks + 2);
	for (; n < kase.threads; n++)
		TPT_REQUIRE(pthread_create(&th[n], NULL, toggle_main, &t) == 0, 1, "thread");
	if (kase.dead_reset)
		TPT_REQUIRE(ring_done_failed(&a) == 0, 1, "RingDone");
	else if (kase.threads)
		tpt_log("attacker: %s switched by %u threads between %u and %u (start %u)",
			kase.victim_reads ? "head" : "tail", kase.threads, t.a, t.b, start);
	if (tpt_sync_wait(&released, 3 * T_MS) < 0)
		rc = 1;
	__atomic_store_n(&t.stop, true, __ATOMIC_RELEASE);
	while (n)
		pthread_join(th[--n], NULL);
	return rc; /* its session ends with it */
}

/* ---- the victim ------------------------------------------------------------------------------ */

struct result {
	pthread_mutex_t lock;
	bool done;
	int status;
	char errmsg[256];
};

static void on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct result *r = arg;

	(void)p;
	pthread_mutex_lock(&r->lock);
	r->status = status;
	snprintf(r->errmsg, sizeof(r->errmsg), "%s", errmsg ? errmsg : "");
	__atomic_store_n(&r->done, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&r->lock);
}

/* Starts the victim's side of the attacked messages on @p (its memory @buf): a read, or
 * kase.msgs writes. Return: 0 or 1. */
static int victim_start(struct tp_pipe *p, uint8_t *buf, struct result *res)
{
	static struct tp_slot s;
	static struct tp_allocation al = { .payloads = &s, .n_payloads = 1 };
	static struct tp_payload pl[MSGS_MAX];
	static struct tp_message m[MSGS_MAX];
	struct tp_descriptor *d;

	if (kase.victim_reads) {
		s.data = buf;
		TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &d) == 0, 1, "descriptor");
		TPT_REQUIRE(tp_pipe_read(p, d, &al, on_done, &res[0]) == 0, 1, "read");
		return 0;
	}
	for (unsigned i = 0; i < kase.msgs; i++) {
		pl[i] = (struct tp_payload){ .data = buf + msg_off(i), .length = msg_len(i) };
		m[i] = (struct tp_message){ .payloads = &pl[i], .n_payloads = 1 };
		TPT_REQUIRE(tp_pipe_write(p, &m[i], on_done, &res[i]) == 0, 1, "write %u", i);
	}
	return 0;
}

/* The status of @res, once its callback ran (at most 5 s from now). */
static int victim_result(struct result *res)
{
	uint64_t end = tpt_now_ms() + (uint64_t)TPT_SCALED_MS(5000);
	int r;

	while (!__atomic_load_n(&res->done, __ATOMIC_ACQUIRE) && tpt_now_ms() < end)
		usleep(1000);
	pthread_mutex_lock(&res->lock);
	r = res->done ? res->status : -ETIMEDOUT;
	pthread_mutex_unlock(&res->lock);
	return r;
}

/* The victim under attack: its other pipe moves a message within 1 s, and the attacked one
 * fails as a protocol violation (with it the messages before it on the ring). Return: 0 or 1
 * (logged). */
static int victim_check(struct tp_context *cv, struct tp_listener *l, struct tp_pipe *p,
			uint8_t *buf, struct result *res)
{
	unsigned last = kase.victim_reads ? 0 : kase.msgs - 1;
	uint64_t t0;
	int r;

	TPT_REQUIRE(victim_start(p, buf, res) == 0, 1, "the attacked message");
	t0 = tpt_now_ms();
	r = tpt_pring_friendly_message(&dmn, cv, l, NAME, TPT_SCALED_MS(1000));
	tpt_log("victim: the other pipe moved its message in %llu ms",
		(unsigned long long)(tpt_now_ms() - t0));
	TPT_REQUIRE(r == 0 && tpt_now_ms() - t0 <= (uint64_t)TPT_SCALED_MS(1000), 1,
		    "the other pipe, under attack, within 1 s");
	for (unsigned i = 0; i < last; i++)
		TPT_REQUIRE((r = victim_result(&res[i])) < 0 && r != -ETIMEDOUT, 1,
			    "write %u before the attacked one: %d", i, r);
	r = victim_result(&res[last]);
	tpt_log("victim's %s on the attacked ring: %d (%s)", kase.victim_reads ? "read" : "write",
		r, res[last].errmsg);
	TPT_REQUIRE(r == -EIO && strstr(res[last].errmsg, kase.dead_reset ? "given up by the "
						 "attacker" : "moved backwards"), 1,
		    "the attacked message did not fail as it should");
	return 0;
}

static int victim(void *arg)
{
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct result res[MSGS_MAX];
	struct tp_context *cv;
	struct tp_listener *l;
	struct tp_pipe *p;
	uint8_t *buf = malloc(TPU_MAX(MSGS_MAX * (size_t)LEN, BIG));
	int rc;

	(void)arg;
	TPT_REQUIRE(buf && tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	memset(buf, 0x77, TPU_MAX(MSGS_MAX * (size_t)LEN, BIG));
	for (unsigned i = 0; i < MSGS_MAX; i++)
		res[i] = (struct result){ .lock = PTHREAD_MUTEX_INITIALIZER, .done = i >= kase.msgs };
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept the attacker");
	rc = victim_check(cv, l, p, buf, res);
	tpt_sync_post(&released, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(cv);
	/* every callback ran: the library no longer touches @buf */
	for (unsigned i = 0; i < MSGS_MAX; i++)
		TPT_REQUIRE(__atomic_load_n(&res[i].done, __ATOMIC_ACQUIRE), 1, "callback %u", i);
	free(buf);
	return rc;
}

/* Runs the case: a daemon with pipe rings, the victim and the attacker forked as their uids.
 * Skipped with a printed reason when not root (it must act as other uids). */
static void run_case_dead(bool victim_reads, size_t len, unsigned threads, unsigned msgs,
			  bool dead_reset)
{
	static const char *const args[] = { "--pipe-ring", "yes", NULL };
	pid_t v, a;

	if (geteuid() != 0) {
		printf("pringpeer: not root, cannot act as uids %d and %d: skipped\n", NOBODY,
		       VICTIM);
		return;
	}
	kase.victim_reads = victim_reads;
	kase.len = len;
	kase.threads = threads;
	kase.msgs = msgs;
	kase.dead_reset = dead_reset;
	ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dmn), 0);
	ck_assert_int_eq(tpt_sync_init(&listening), 0);
	ck_assert_int_eq(tpt_sync_init(&released), 0);
	v = tpt_fork(victim, NULL);
	a = tpt_fork(attacker, NULL);
	ck_assert(tpt_wait_ok(v, 3 * T_MS, "victim"));
	ck_assert(tpt_wait_ok(a, 3 * T_MS, "attacker"));
	tpt_sync_done(&listening);
	tpt_sync_done(&released);
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
}

static void run_case(bool victim_reads, size_t len, unsigned threads, unsigned msgs)
{
	run_case_dead(victim_reads, len, threads, msgs, false);
}

/* The victim's io thread copies the message out: it used to spin there while head moved. */
START_TEST(test_writer_toggling_head_fails_the_io_thread_copy)
{
	run_case(true, QUARTER, 1, 1);
}
END_TEST

START_TEST(test_writer_toggling_head_with_4_threads_fails_the_io_thread_copy)
{
	run_case(true, QUARTER, 4, 1);
}
END_TEST

START_TEST(test_writer_toggling_head_fails_the_ring_thread_copy)
{
	run_case(true, LEN, 2, 1);
}
END_TEST

/* A message that fills the ring, then one of 256 KiB: that one waits on the io thread for the
 * reader. */
START_TEST(test_reader_toggling_tail_fails_the_io_thread_copy)
{
	run_case(false, QUARTER, 1, 2);
}
END_TEST

START_TEST(test_reader_toggling_tail_with_4_threads_fails_the_io_thread_copy)
{
	run_case(false, QUARTER, 4, 2);
}
END_TEST

START_TEST(test_reader_toggling_tail_fails_the_ring_thread_copy)
{
	run_case(false, BIG, 3, 1);
}
END_TEST

START_TEST(test_head_moving_back_once_fails_the_message)
{
	run_case(true, LEN, 0, 1);
}
END_TEST

START_TEST(test_tail_moving_back_once_fails_the_message)
{
	run_case(false, BIG, 0, 1);
}
END_TEST

/* The victim reads a message whose writer fails it and keeps the dead word at 0 with 2
 * threads: the daemon's failure of the read ends the victim's ring thread there (it used to wait
 * for the dead word, its read's callback with it, and every callback of the context behind
 * that). */
START_TEST(test_writer_resetting_the_dead_word_holds_no_callback)
{
	run_case_dead(true, LEN, 2, 1, true);
}
END_TEST

/* ---- the library's limit of rings ------------------------------------------------------------ */

#define CAP_PIPES 4
#define CAP_MSGS 2

static unsigned cap;	  /* the victim's TPIPD_PIPE_RINGS_MAX (< CAP_PIPES), set before the forks */
static unsigned declines; /* the victim's log lines that declined a ring (atomic) */

static void on_log(void *arg, int level, const char *line)
{
	char want[64];

	(void)arg;
	(void)level;
	snprintf(want, sizeof(want), "holds its limit of %u pipe rings", cap);
	if (strstr(line, want))
		__atomic_add_fetch(&declines, 1, __ATOMIC_SEQ_CST);
}

/* Pipe rings this process maps now (the daemon's memfds, by name). */
static unsigned rings_mapped(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	unsigned n = 0;

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:tpipd-pipe-ring") != NULL;
	if (f)
		fclose(f);
	return n;
}

static struct tpt_msg_spec cap_spec(unsigned pipe, unsigned index)
{
	return (struct tpt_msg_spec){ .pipe = pipe, .index = index, .n_tensors = 1,
				      .lens = { LEN + pipe } };
}

/* Moves message @k of pipe @i (of @ctx, @p) of private memory: writes it (@write) or reads and
 * checks it. Return: 0, or 1 (logged). */
static int cap_move(struct tp_context *ctx, struct tp_pipe *p, unsigned i, unsigned k, bool write)
{
	struct tpt_msg_spec spec = cap_spec(i, k);
	struct tpt_msg msg;
	int r;

	if (!write) {
		r = tpt_msg_read_check(ctx, p, &spec, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u of pipe %u: %d %s", k, i, r,
			    r < 0 ? tp_last_error() : "");
		return 0;
	}
	TPT_REQUIRE(tpt_msg_build(ctx, &spec, TPT_MEM_PRIVATE, &msg) == 0, 1, "build");
	r = tp_pipe_write_sync_timeout(p, &msg.m, T_MS);
	TPT_REQUIRE(r == 0, 1, "write %u of pipe %u: %s", k, i, tp_last_error());
	tpt_msg_free(ctx, &msg);
	return 0;
}

/* Opens CAP_PIPES pipes to the victim, one after the other, and moves CAP_MSGS messages of
 * private memory on each (each a ring's, were the victim to take one): writes them when the
 * victim reads, else reads them. */
static int cap_other(void *arg)
{
	struct tp_context *co;
	struct tp_pipe *p[CAP_PIPES];

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_sync_wait(&listening, T_MS) == 0, 1, "victim listening");
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "other", &co) == 0, 1, "context");
	for (unsigned i = 0; i < CAP_PIPES; i++) {
		TPT_REQUIRE(tp_connect(co, NAME, &p[i]) == 0, 1, "connect %u", i);
		for (unsigned k = 0; k < CAP_MSGS; k++)
			TPT_REQUIRE(cap_move(co, p[i], i, k, kase.victim_reads) == 0, 1, "move");
	}
	TPT_REQUIRE(tpt_sync_wait(&released, 3 * T_MS) == 0, 1, "victim done");
	for (unsigned i = 0; i < CAP_PIPES; i++)
		tp_pipe_close(p[i]);
	tp_context_free(co);
	return 0;
}

/* With TPIPD_PIPE_RINGS_MAX=cap, accepts the other's pipes and reads or writes their messages:
 * the
 * first cap pipes take a ring each, the next ones are declined once each and move by cma,
 * byte-exact, and the victim never maps more than cap rings (with 0 it takes none and
 * declines none: its Hello offered to take none). */
static int cap_victim_check(struct tp_context *cv, struct tp_listener *l)
{
	struct tp_pipe *p[CAP_PIPES];
	unsigned i;

	for (i = 0; i < CAP_PIPES; i++) {
		TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p[i]) == 0, 1, "accept %u", i);
		for (unsigned k = 0; k < CAP_MSGS; k++)
			TPT_REQUIRE(cap_move(cv, p[i], i, k, !kase.victim_reads) == 0, 1, "move");
		tpt_log("victim: %u pipes, %u rings mapped, %u declined", i + 1, rings_mapped(),
			__atomic_load_n(&declines, __ATOMIC_SEQ_CST));
		TPT_REQUIRE(rings_mapped() == TPU_MIN(i + 1, cap), 1, "rings mapped");
		TPT_REQUIRE(__atomic_load_n(&declines, __ATOMIC_SEQ_CST) ==
				    (i < cap || !cap ? 0 : i + 1 - cap), 1, "rings declined");
	}
	while (i)
		tp_pipe_close(p[--i]);
	return 0;
}

static int cap_victim(void *arg)
{
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tp_context *cv;
	struct tp_listener *l;
	char v[16];
	int rc;

	(void)arg;
	TPT_REQUIRE(tpt_pring_become(VICTIM) == 0, 1, "drop to the victim");
	setenv("TPIPD_PIPE_RINGS_MAX", "4097", 1);
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == -EINVAL, 1, "a limit over 4096");
	snprintf(v, sizeof(v), "%u", cap);
	setenv("TPIPD_PIPE_RINGS_MAX", v, 1);
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "victim", &cv) == 0, 1, "context");
	tp_context_set_log(cv, on_log, NULL);
	TPT_REQUIRE(tp_listen(cv, NAME, &o, &l) == 0, 1, "listen");
	tpt_sync_post(&listening, 0);
	rc = cap_victim_check(cv, l);
	tpt_sync_post(&released, 0);
	tp_listener_close(l);
	tp_context_free(cv);
	return rc;
}

/* Runs the other uid and the victim (reading, @victim_reads, or writing) with a limit of
 * @limit rings. */
static void run_cap(unsigned limit, bool victim_reads)
{
	static const char *const args[] = { "--pipe-ring", "yes", NULL };
	pid_t v, a;

	if (geteuid() != 0) {
		printf("pringpeer: not root, cannot act as uids %d and %d: skipped\n", NOBODY,
		       VICTIM);
		return;
	}
	cap = limit;
	kase.victim_reads = victim_reads;
	ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dmn), 0);
	ck_assert_int_eq(tpt_sync_init(&listening), 0);
	ck_assert_int_eq(tpt_sync_init(&released), 0);
	v = tpt_fork(cap_victim, NULL);
	a = tpt_fork(cap_other, NULL);
	ck_assert(tpt_wait_ok(v, 3 * T_MS, "victim"));
	ck_assert(tpt_wait_ok(a, 3 * T_MS, "other"));
	tpt_sync_done(&listening);
	tpt_sync_done(&released);
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
}

/* A writer of another uid opens 4 pipes to a victim that takes at most 2 rings: just below the
 * limit every pipe takes one, just above it the victim declines it and the messages still
 * arrive (by cma), the pipe's later messages too. */
START_TEST(test_library_takes_at_most_its_limit_of_rings)
{
	run_cap(2, true);
}
END_TEST

/* The same with the victim writing: its library declines the writer's side of the ring. */
START_TEST(test_writing_library_takes_at_most_its_limit_of_rings)
{
	run_cap(2, false);
}
END_TEST

START_TEST(test_library_with_a_limit_of_0_takes_no_ring)
{
	run_cap(0, true);
}
END_TEST

static Suite *pringpeer_suite(void)
{
	Suite *s = suite_create("sec_pringpeer");
	TCase *tc = tcase_create("toggle");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_writer_toggling_head_fails_the_io_thread_copy);
	tcase_add_test(tc, test_writer_toggling_head_with_4_threads_fails_the_io_thread_copy);
	tcase_add_test(tc, test_writer_toggling_head_fails_the_ring_thread_copy);
	tcase_add_test(tc, test_reader_toggling_tail_fails_the_io_thread_copy);
	tcase_add_test(tc, test_reader_toggling_tail_with_4_threads_fails_the_io_thread_copy);
	tcase_add_test(tc, test_reader_toggling_tail_fails_the_ring_thread_copy);
	tcase_add_test(tc, test_head_moving_back_once_fails_the_message);
	tcase_add_test(tc, test_tail_moving_back_once_fails_the_message);
	tcase_add_test(tc, test_writer_resetting_the_dead_word_holds_no_callback);
	suite_add_tcase(s, tc);
	tc = tcase_create("cap");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_library_takes_at_most_its_limit_of_rings);
	tcase_add_test(tc, test_writing_library_takes_at_most_its_limit_of_rings);
	tcase_add_test(tc, test_library_with_a_limit_of_0_takes_no_ring);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(pringpeer_suite());
}
