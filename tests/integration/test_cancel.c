/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: giving up on one operation (tp_cancel(), the _ex start calls, the _timeout
 * blocking calls) and on a daemon that stopped answering (reply_timeout_ms). One process holds
 * both ends (a writer context and a reader context on the case's daemon). A copy "in progress"
 * is held still deterministically: the writer's payload lies in a userfaultfd-registered
 * mapping, so the daemon's cross-memory read of it blocks in a page fault until the test fills
 * the pages. Each case checks that every callback runs exactly once, that a cancelled write or
 * read ends with -ECANCELED and a stopped copy with its real result, and that the pipe carries
 * the next message intact afterwards. The hostile cases drive the wire directly; a proxy that
 * rewrites the HelloReply to protocol 1.4 stands for a daemon older than Cancel. The daemon's
 * cross-memory attach helper gives up after 2 s, so a held copy is released well before.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 20000
#define BIG (1u << 20) /* rendezvous: far above the 64 KiB eager limit */

/* ---- callbacks counted -------------------------------------------------------------------- */

struct seen {
	pthread_mutex_t m;
	pthread_cond_t c;
	int count;
	int status;
	char msg[512];
	struct tp_descriptor *desc;
	struct tp_pipe *pipe;
};

static void seen_init(struct seen *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->c, NULL);
}

static void seen_note(struct seen *s, int status, const char *errmsg)
{
	pthread_mutex_lock(&s->m);
	s->count++;
	s->status = status;
	snprintf(s->msg, sizeof(s->msg), "%s", errmsg ? errmsg : "");
	pthread_cond_broadcast(&s->c);
	pthread_mutex_unlock(&s->m);
}

static void on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	seen_note(arg, status, errmsg);
}

static void on_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
		    struct tp_descriptor *d)
{
	((struct seen *)arg)->desc = d;
	seen_note(arg, status, errmsg);
}

static void on_accept(void *arg, struct tp_listener *l, int status, const char *errmsg,
		      struct tp_pipe *p)
{
	((struct seen *)arg)->pipe = p;
	seen_note(arg, status, errmsg);
}

/* Waits for the first callback; returns its status (the count is checked by the caller). */
static int seen_wait(struct seen *s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += T_MS / 1000;
	pthread_mutex_lock(&s->m);
	while (!s->count)
		if (pthread_cond_timedwait(&s->c, &s->m, &ts))
			break;
	pthread_mutex_unlock(&s->m);
	ck_assert_msg(s->count == 1, "callback ran %d times", s->count);
	return s->status;
}

/* ---- both ends in this process ------------------------------------------------------------ */

struct ends {
	struct tp_context *wctx, *rctx;
	struct tp_listener *l;
	struct tp_pipe *w, *r;
};

static void ends_open(struct ends *e, const char *name)
{
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "writer", &e->wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &e->rctx), 0);
	ck_assert_int_eq(tp_listen(e->rctx, name, NULL, &e->l), 0);
	ck_assert_int_eq(tp_connect(e->wctx, name, &e->w), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e->l, T_MS, &e->r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e->w, T_MS), 0);
}

static void ends_close(struct ends *e)
{
	tp_pipe_close(e->w);
	tp_pipe_close(e->r);
	tp_listener_close(e->l);
	tp_context_free(e->wctx);
	tp_context_free(e->rctx);
}

static struct tp_message one_payload(struct tp_payload *pl, void *data, size_t len)
{
	*pl = (struct tp_payload){ .data = data, .length = len };
	return (struct tp_message){ .payloads = pl, .n_payloads = 1 };
}

static struct tp_allocation one_slot(struct tp_slot *s, void *data)
{
	*s = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = data };
	return (struct tp_allocation){ .payloads = s, .n_payloads = 1 };
}

/* Reads the next message (one payload of @len bytes) and checks its contents are @seed's. */
static void read_expect(struct ends *e, size_t len, uint64_t seed)
{
	struct tp_descriptor *d;
	struct tp_allocation a;
	struct tp_slot s;
	void *buf = malloc(len);

	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e->r, T_MS, &d), 0);
	ck_assert_uint_eq(d->payloads[0].length, len);
	a = one_slot(&s, buf);
	ck_assert_int_eq(tp_pipe_read_sync_timeout(e->r, d, &a, T_MS), 0);
	ck_assert(tpt_verify(buf, len, seed, NULL));
	free(buf);
}

/* Writes one payload of @len bytes filled from @seed, reads it back and checks both ends. */
static void xfer_expect(struct ends *e, size_t len, uint64_t seed)
{
	struct tp_payload pl;
	struct seen w;
	void *buf = malloc(len);
	struct tp_message m = one_payload(&pl, buf, len);

	seen_init(&w);
	tpt_fill(buf, len, seed);
	ck_assert_int_eq(tp_pipe_write(e->w, &m, on_done, &w), 0);
	read_expect(e, len, seed);
	ck_assert_int_eq(seen_wait(&w), 0);
	free(buf);
}

/* The daemon (at debug level) has handled a Cancel: it logged @what. */
static void cancel_seen(const char *what)
{
	ck_assert_msg(tpt_daemon_wait_log(&tpt_fixture_daemon, what, T_MS, NULL, 0) == 0,
		      "the daemon never logged '%s'", what);
}

/* ---- a copy held in a page fault ---------------------------------------------------------- */

struct held {
	int uffd;
	uint8_t *mem;
	size_t len;
};

/* Maps @len bytes whose first touch, by anyone, waits for held_release(). */
static void held_new(struct held *h, size_t len)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };

	h->len = len;
	h->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(h->mem != MAP_FAILED);
	h->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	ck_assert_msg(h->uffd >= 0, "userfaultfd: %s", strerror(errno));
	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_API, &api), 0);
	reg.range.start = (uintptr_t)h->mem;
	reg.range.len = len;
	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_REGISTER, &reg), 0);
}

/* Waits until the daemon's copy touches the memory (it is then copying, and stays so). */
static void held_wait_touched(struct held *h)
{
	struct pollfd pfd = { .fd = h->uffd, .events = POLLIN };

	ck_assert_msg(poll(&pfd, 1, T_MS) == 1, "the daemon never touched the held memory");
}

/* Fills the whole mapping with @seed's bytes: the copy goes on. */
static void held_release(struct held *h, uint64_t seed)
{
	uint8_t *src = mmap(NULL, h->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			    0);
	struct uffdio_copy cp = { .dst = (uintptr_t)h->mem, .src = (uintptr_t)src, .len = h->len };

	tpt_fill(src, h->len, seed);
	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_COPY, &cp), 0);
	munmap(src, h->len);
}

static void held_free(struct held *h)
{
	close(h->uffd);
	munmap(h->mem, h->len);
}

/* ---- cases -------------------------------------------------------------------------------- */

/* A write the daemon holds, not yet asked for: cancelled; the reader, which already holds its
 * descriptor, gets -ECANCELED reading it; the buffer is reused for the next message. */
/*
 * A copy held in a page fault must be released within the daemon's fixed bound on one
 * cross-memory access (2 s, backends/cma/proc.c), which a daemon under valgrind cannot keep:
 * the cases that hold one say so and pass there. Return: true when the case must not run.
 */
static bool held_copy_too_slow(const char *name)
{
	if (tpt_time_scale() == 1)
		return false;
	printf("skip %s: a copy held in a page fault outlives the daemon's 2 s cross-memory "
	       "bound at time scale %u (valgrind)\n", name, tpt_time_scale());
	return true;
}

START_TEST(test_cancel_write_queued_then_reader_sees_ecanceled)
{
	struct ends e;
	struct tp_descriptor *d;
	struct tp_allocation a;
	struct tp_payload pl;
	struct tp_slot s;
	struct seen w;
	uint8_t *buf = malloc(BIG), *dst = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	uint64_t id = 0;

	ends_open(&e, "cw");
	seen_init(&w);
	tpt_fill(buf, BIG, 1);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_uint_gt(id, 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d), 0); /* the reader has it */
	ck_assert_int_eq(tp_cancel(e.wctx, id), 0);
	ck_assert_int_eq(seen_wait(&w), -ECANCELED);
	ck_assert_int_eq(tp_cancel(e.wctx, id), -ENOENT); /* finished */
	tpt_fill(buf, BIG, 2); /* free again: reused for the next message */
	a = one_slot(&s, dst);
	ck_assert_int_eq(tp_pipe_read_sync_timeout(e.r, d, &a, T_MS), -ECANCELED);
	ck_assert_msg(strstr(tp_last_error(), "writer cancelled"), "%s", tp_last_error());
	seen_init(&w);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	read_expect(&e, BIG, 2); /* the pipe carries the next message, in order */
	ck_assert_int_eq(seen_wait(&w), 0);
	ends_close(&e);
	free(buf);
	free(dst);
}
END_TEST

/* Cancelled before the reader took its descriptor: it can also drop it unread. */
START_TEST(test_cancel_write_queued_then_discarded)
{
	struct ends e;
	struct tp_descriptor *d;
	struct tp_payload pl;
	struct seen w;
	uint8_t *buf = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	uint64_t id = 0;

	ends_open(&e, "cd");
	seen_init(&w);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, id), 0);
	ck_assert_int_eq(seen_wait(&w), -ECANCELED);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d), 0);
	tp_descriptor_free(d);
	xfer_expect(&e, 3000, 5); /* eager */
	xfer_expect(&e, BIG, 6);
	ends_close(&e);
	free(buf);
}
END_TEST

/*
 * Message 1's copy is held in a page fault; the read of message 2 waits behind it: cancelling
 * it drops message 2 (its write fails, "the reader cancelled"), while cancelling the read and
 * the write of message 1, which are being copied, changes nothing: they complete with 0.
 */
START_TEST(test_cancel_read_waiting_and_copying)
{
	struct ends e;
	struct held h;
	struct tp_descriptor *d1, *d2;
	struct tp_allocation a1, a2;
	struct tp_payload p1, p2;
	struct tp_slot s1, s2;
	struct seen w1, w2, r1, r2;
	uint8_t *b2 = malloc(BIG), *dst1 = malloc(BIG), *dst2 = malloc(BIG);
	struct tp_message m1, m2;
	uint64_t wid1, wid2, rid1, rid2;
	int r;

	if (held_copy_too_slow("test_cancel_read_waiting_and_copying")) {
		free(b2);
		free(dst1);
		free(dst2);
		return;
	}

	ends_open(&e, "cr");
	held_new(&h, BIG);
	seen_init(&w1);
	seen_init(&w2);
	seen_init(&r1);
	seen_init(&r2);
	m1 = one_payload(&p1, h.mem, BIG);
	m2 = one_payload(&p2, b2, BIG);
	tpt_fill(b2, BIG, 12);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m1, on_done, &w1, &wid1), 0);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m2, on_done, &w2, &wid2), 0);
	ck_assert_uint_gt(wid2, wid1);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d1), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d2), 0);
	a1 = one_slot(&s1, dst1);
	a2 = one_slot(&s2, dst2);
	ck_assert_int_eq(tp_pipe_read_ex(e.r, d1, &a1, on_done, &r1, &rid1), 0);
	held_wait_touched(&h); /* message 1 is being copied */
	ck_assert_int_eq(tp_pipe_read_ex(e.r, d2, &a2, on_done, &r2, &rid2), 0);
	ck_assert_int_eq(tp_cancel(e.rctx, rid2), 0);
	r = tp_cancel(e.rctx, rid2); /* -ENOENT once the daemon's ReadDone has arrived */
	ck_assert_msg(r == -EALREADY || r == -ENOENT, "second tp_cancel: %d", r);
	cancel_seen("read of message 2 cancelled");
	ck_assert_int_eq(tp_cancel(e.rctx, rid1), 0); /* copying: cannot be stopped */
	ck_assert_int_eq(tp_cancel(e.rctx, rid1), -EALREADY); /* held: no answer yet */
	ck_assert_int_eq(tp_cancel(e.wctx, wid1), 0);
	/* Callbacks keep their pipe's order: nothing completes before message 1. */
	ck_assert_int_eq(r1.count + w1.count + r2.count + w2.count, 0);
	held_release(&h, 11);
	ck_assert_int_eq(seen_wait(&r1), 0);
	ck_assert_int_eq(seen_wait(&w1), 0);
	ck_assert(tpt_verify(dst1, BIG, 11, NULL));
	ck_assert_int_eq(seen_wait(&r2), -ECANCELED);
	ck_assert_int_eq(seen_wait(&w2), -ECANCELED);
	ck_assert_msg(strstr(w2.msg, "reader cancelled"), "%s", w2.msg);
	xfer_expect(&e, BIG, 13); /* message 2 is gone: the next one is message 3 */
	ck_assert_int_eq(r2.count + w2.count + r1.count + w1.count, 4);
	ends_close(&e);
	held_free(&h);
	free(b2);
	free(dst1);
	free(dst2);
}
END_TEST

struct timed_read {
	struct tp_pipe *p;
	struct tp_descriptor *d;
	struct tp_allocation *a;
	int timeout_ms;
	int result;
	long ms;
};

static void *timed_read_main(void *arg)
{
	struct timed_read *t = arg;
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	t->result = tp_pipe_read_sync_timeout(t->p, t->d, t->a, t->timeout_ms);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	t->ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	return NULL;
}

/*
 * A read that cannot start in time (its copy waits behind message 1's, held):
 * tp_pipe_read_sync_timeout() cancels it and returns -ETIMEDOUT once it ended, which is after
 * message 1's read (callbacks keep their order); a write nobody reads:
 * tp_pipe_write_sync_timeout() returns -ETIMEDOUT with its buffer free.
 */
START_TEST(test_sync_timeouts_cancel_and_return_when_free)
{
	struct ends e;
	struct held h;
	struct tp_descriptor *d1, *d2;
	struct tp_allocation a1, a2;
	struct tp_payload p1, p2;
	struct tp_slot s1, s2;
	struct seen w1, w2, r1;
	uint8_t *b2 = malloc(BIG), *dst1 = malloc(BIG), *dst2 = malloc(BIG);
	struct tp_message m1, m2;
	struct timed_read tr;
	pthread_t th;

	if (held_copy_too_slow("test_sync_timeouts_cancel_and_return_when_free")) {
		free(b2);
		free(dst1);
		free(dst2);
		return;
	}

	ends_open(&e, "st");
	held_new(&h, BIG);
	seen_init(&w1);
	seen_init(&w2);
	seen_init(&r1);
	m1 = one_payload(&p1, h.mem, BIG);
	m2 = one_payload(&p2, b2, BIG);
	ck_assert_int_eq(tp_pipe_write(e.w, &m1, on_done, &w1), 0);
	ck_assert_int_eq(tp_pipe_write(e.w, &m2, on_done, &w2), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d1), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d2), 0);
	a1 = one_slot(&s1, dst1);
	a2 = one_slot(&s2, dst2);
	ck_assert_int_eq(tp_pipe_read(e.r, d1, &a1, on_done, &r1), 0);
	held_wait_touched(&h);
	tr = (struct timed_read){ e.r, d2, &a2, 100, 1, 0 };
	ck_assert_int_eq(pthread_create(&th, NULL, timed_read_main, &tr), 0);
	cancel_seen("read of message 2 cancelled");
	held_release(&h, 21);
	pthread_join(th, NULL);
	ck_assert_int_eq(tr.result, -ETIMEDOUT);
	ck_assert_msg(tr.ms >= 100 && tr.ms < T_MS, "returned after %ld ms", tr.ms);
	ck_assert_int_eq(seen_wait(&r1), 0);
	ck_assert_int_eq(seen_wait(&w1), 0);
	ck_assert_int_eq(seen_wait(&w2), -ECANCELED);
	ck_assert(tpt_verify(dst1, BIG, 21, NULL));

	/* Nobody reads: the write times out, is cancelled, and its buffer is free on return. */
	tpt_fill(b2, BIG, 22);
	ck_assert_int_eq(tp_pipe_write_sync_timeout(e.w, &m2, 50), -ETIMEDOUT);
	ck_assert_msg(strstr(tp_last_error(), "50 ms"), "%s", tp_last_error());
	memset(b2, 0, BIG);
	/* A small message completes at once, well within its timeout. */
	tpt_fill(b2, 100, 23);
	p2.length = 100;
	ck_assert_int_eq(tp_pipe_write_sync_timeout(e.w, &m2, 50), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d2), 0);
	a2 = one_slot(&s2, dst2);
	ck_assert_int_eq(tp_pipe_read_sync_timeout(e.r, d2, &a2, T_MS), -ECANCELED);
	read_expect(&e, 100, 23);
	ends_close(&e);
	held_free(&h);
	free(b2);
	free(dst1);
	free(dst2);
}
END_TEST

/* Descriptor requests and accepts: cancelled in the library; what arrives later is not lost. */
START_TEST(test_cancel_descriptor_request_and_accept)
{
	struct ends e;
	struct tp_context *c3;
	struct tp_pipe *p3, *acc;
	struct seen ds, as;
	uint64_t did = 0, aid = 0;

	ends_open(&e, "cq");
	seen_init(&ds);
	seen_init(&as);
	ck_assert_int_eq(tp_pipe_read_descriptor_ex(e.r, on_desc, &ds, &did), 0);
	ck_assert_int_eq(tp_cancel(e.rctx, did), 0);
	ck_assert_int_eq(seen_wait(&ds), -ECANCELED);
	ck_assert_ptr_null(ds.desc);
	ck_assert_int_eq(tp_cancel(e.rctx, did), -ENOENT);
	ck_assert_int_eq(tp_cancel(e.rctx, 0), -ENOENT);
	ck_assert_int_eq(tp_cancel(e.rctx, did + 1000000), -ENOENT); /* never issued */
	ck_assert_int_eq(tp_cancel(NULL, did), -EINVAL);
	xfer_expect(&e, 200, 31);

	ck_assert_int_eq(tp_listener_accept_ex(e.l, on_accept, &as, &aid), 0);
	ck_assert_uint_gt(aid, did); /* ids are never reused in a context */
	ck_assert_int_eq(tp_cancel(e.rctx, aid), 0);
	ck_assert_int_eq(seen_wait(&as), -ECANCELED);
	ck_assert_ptr_null(as.pipe);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "third", &c3), 0);
	ck_assert_int_eq(tp_connect(c3, "cq", &p3), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &acc), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(p3, T_MS), 0);
	tp_pipe_close(p3);
	tp_pipe_close(acc);
	tp_context_free(c3);
	ends_close(&e);
}
END_TEST

/* Ids are per context: another context's tp_cancel() of the same number does nothing. */
START_TEST(test_cancel_ids_are_per_context)
{
	struct ends e;
	struct tp_payload pl;
	struct seen w;
	uint8_t *buf = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	uint64_t id = 0;

	ends_open(&e, "cc");
	seen_init(&w);
	tpt_fill(buf, BIG, 41);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_int_eq(tp_cancel(e.rctx, id), -ENOENT);
	read_expect(&e, BIG, 41);
	ck_assert_int_eq(seen_wait(&w), 0);
	ends_close(&e);
	free(buf);
}
END_TEST

static int cb_sync_result = 1;

static void on_done_try_sync(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct tp_payload pl;
	char b[8] = "x";
	struct tp_message m = one_payload(&pl, b, sizeof(b));

	cb_sync_result = tp_pipe_write_sync_timeout(p, &m, 10);
	if (cb_sync_result == -EDEADLK)
		cb_sync_result = tp_pipe_read_sync_timeout(p, NULL, NULL, 10);
	seen_note(arg, status, errmsg);
}

START_TEST(test_sync_timeout_calls_refuse_callbacks)
{
	struct ends e;
	struct seen w;
	char b[8] = "y";
	struct tp_payload pl;
	struct tp_message m = one_payload(&pl, b, sizeof(b));

	ends_open(&e, "cb");
	seen_init(&w);
	ck_assert_int_eq(tp_pipe_write(e.w, &m, on_done_try_sync, &w), 0);
	ck_assert_int_eq(seen_wait(&w), 0);
	ck_assert_int_eq(cb_sync_result, -EDEADLK);
	ends_close(&e);
}
END_TEST

/* A write the daemon holds while the connect waits for its listener (wait_ms): dropped; the
 * reader, once the listener exists, sees only the next message. */
START_TEST(test_cancel_write_held_while_connect_waits)
{
	struct tp_connect_options co = { .size = sizeof(co), .wait_ms = T_MS };
	struct ends e = { 0 };
	struct tp_payload pl;
	struct seen w;
	uint8_t *buf = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	uint64_t id = 0;

	seen_init(&w);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "writer", &e.wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &e.rctx), 0);
	ck_assert_int_eq(tp_connect_ex(e.wctx, "later", &co, &e.w), 0);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, id), 0);
	ck_assert_int_eq(seen_wait(&w), -ECANCELED);
	ck_assert_int_eq(tp_listen(e.rctx, "later", NULL, &e.l), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &e.r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e.w, T_MS), 0);
	xfer_expect(&e, BIG / 2, 61); /* the first message the reader sees */
	ends_close(&e);
	free(buf);
}
END_TEST

/* ---- a daemon that does not answer -------------------------------------------------------- */

static long elapsed_ms(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (t1.tv_sec - t0->tv_sec) * 1000 + (t1.tv_nsec - t0->tv_nsec) / 1000000;
}

/* A socket that accepts connections (the kernel's backlog) and never answers. */
START_TEST(test_context_new_times_out_on_a_silent_socket)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tp_context_options o = { .size = sizeof(o) };
	struct tp_context *ctx = NULL;
	struct timespec t0;
	char dir[] = "/tmp/tpcancel.XXXXXX";
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	long ms;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/hung.sock", dir);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fd, 4), 0);
	o.socket_path = sa.sun_path;
	o.reply_timeout_ms = 200;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(tp_context_new(&o, &ctx), -ETIMEDOUT);
	ms = elapsed_ms(&t0);
	ck_assert_msg(ms >= 200 && ms < 5000, "gave up after %ld ms", ms);
	ck_assert_msg(strstr(tp_last_error(), "tp_context_new") &&
		      strstr(tp_last_error(), "200 ms"), "%s", tp_last_error());
	unlink(sa.sun_path);
	rmdir(dir);
	close(fd);
}
END_TEST

/* A daemon stopped (SIGSTOP) after the Hello: requests time out, and work once it runs again. */
START_TEST(test_requests_time_out_on_a_stopped_daemon)
{
	struct tp_context_options o = { .size = sizeof(o) };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct timespec t0;
	void *buf;
	long ms;
	int t = TPT_SCALED_MS(300); /* the hello must fit in it under valgrind too */
	char want[32];

	o.socket_path = tpt_fixture_daemon.socket;
	o.reply_timeout_ms = (unsigned)t;
	o.flags = TP_CONTEXT_NO_RING;
	ck_assert_int_eq(tp_context_new(&o, &ctx), 0);
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGSTOP), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(tp_listen(ctx, "hung", NULL, &l), -ETIMEDOUT);
	ms = elapsed_ms(&t0);
	ck_assert_msg(ms >= t && ms < TPT_SCALED_MS(5000), "gave up after %ld ms", ms);
	snprintf(want, sizeof(want), "%d ms", t);
	ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
	ck_assert_int_eq(tp_buffer_alloc(ctx, 4096, &buf), -ETIMEDOUT);
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGCONT), 0);
	ck_assert_int_eq(tp_listen(ctx, "alive", NULL, &l), 0);
	tp_listener_close(l);
	tp_context_free(ctx);
}
END_TEST

static void on_done_count(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct seen *s = arg;

	pthread_mutex_lock(&s->m);
	s->count++;
	if (status < 0)
		s->status = status;
	else
		s->desc = (void *)1; /* one succeeded */
	pthread_cond_broadcast(&s->c);
	pthread_mutex_unlock(&s->m);
}

/*
 * A daemon that stops reading: a write that finds no room on the socket for reply_timeout_ms
 * gives up, the connection is dropped, and every pending write fails (none hangs).
 */
START_TEST(test_send_gives_up_on_a_daemon_that_stops_reading)
{
	struct tp_context_options o = { .size = sizeof(o), .flags = TP_CONTEXT_NO_RING };
	struct ends e = { 0 };
	struct tp_payload pl;
	struct seen w;
	struct timespec t0, ts;
	size_t len = 60000; /* eager: the bytes ride in the frame */
	uint8_t *buf = calloc(1, len);
	struct tp_message m = one_payload(&pl, buf, len);
	unsigned n = 0;
	long ms;

	seen_init(&w);
	o.socket_path = tpt_fixture_daemon.socket;
	o.reply_timeout_ms = 300;
	ck_assert_int_eq(tp_context_new(&o, &e.wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &e.rctx), 0);
	ck_assert_int_eq(tp_listen(e.rctx, "full", NULL, &e.l), 0);
	ck_assert_int_eq(tp_connect(e.wctx, "full", &e.w), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &e.r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e.w, T_MS), 0);
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGSTOP), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (tp_pipe_write(e.w, &m, on_done_count, &w) == 0) /* fills the socket, then fails */
		ck_assert_uint_lt(++n, 100000);
	ms = elapsed_ms(&t0);
	ck_assert_msg(ms >= 300 && ms < T_MS, "gave up after %ld ms", ms);
	ck_assert_uint_gt(n, 1);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += T_MS / 1000;
	pthread_mutex_lock(&w.m);
	while (w.count < (int)n && pthread_cond_timedwait(&w.c, &w.m, &ts) == 0)
		;
	pthread_mutex_unlock(&w.m);
	ck_assert_int_eq(w.count, (int)n);
	ck_assert_ptr_null(w.desc); /* none completed: the daemon never saw them */
	ck_assert_int_lt(w.status, 0);
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGCONT), 0);
	ends_close(&e);
	free(buf);
}
END_TEST

/* ---- hostile Cancel frames ---------------------------------------------------------------- */

static int raw_cancel(struct tpt_raw *r, uint64_t pipe_id, int kind, uint64_t id)
{
	Tpw__V1__Cancel c = TPW__V1__CANCEL__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	c.pipe_id = pipe_id;
	c.kind = kind;
	c.id = id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	return tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
}

/* The session still answers: a Listen gets its Reply. */
static void raw_alive(struct tpt_raw *r, const char *name)
{
	Tpw__V1__Listen ls = TPW__V1__LISTEN__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;

	ls.req_id = 77;
	ls.name = (char *)name;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &ls;
	ck_assert_int_eq(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &dm), 0);
	ck_assert_int_eq(dm->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(dm);
}

/*
 * Another session names the victim's pipe and write ids (the same numbers in its own name
 * space): nothing happens to the victim's write. Unknown ids are ignored; a malformed Cancel
 * closes the sender's session only.
 */
START_TEST(test_hostile_cancel_cannot_touch_another_session)
{
	struct ends e;
	struct tpt_raw r;
	struct tp_payload pl;
	struct seen w;
	uint8_t *buf = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);

	ends_open(&e, "hv");
	seen_init(&w);
	tpt_fill(buf, BIG, 51);
	ck_assert_int_eq(tp_pipe_write(e.w, &m, on_done, &w), 0);
	ck_assert_int_eq(tpt_raw_connect(&r, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	for (uint64_t pid = 1; pid <= 3; pid++) {
		ck_assert_int_eq(raw_cancel(&r, pid, TPW__V1__CANCEL_KIND__CANCEL_WRITE, 1), 0);
		ck_assert_int_eq(raw_cancel(&r, pid, TPW__V1__CANCEL_KIND__CANCEL_READ, 1), 0);
	}
	ck_assert_int_eq(raw_cancel(&r, (1ull << 63) + 1, TPW__V1__CANCEL_KIND__CANCEL_READ, 1), 0);
	ck_assert_int_eq(raw_cancel(&r, UINT64_MAX, TPW__V1__CANCEL_KIND__CANCEL_WRITE, UINT64_MAX),
			 0);
	raw_alive(&r, "hostile-alive");
	read_expect(&e, BIG, 51); /* the victim's write went through */
	ck_assert_int_eq(seen_wait(&w), 0);

	ck_assert_int_eq(raw_cancel(&r, 1, 0, 1), 0); /* unknown kind */
	ck_assert_int_eq(tpt_raw_wait_closed(&r, T_MS), 0);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_raw_connect(&r, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(raw_cancel(&r, 1, TPW__V1__CANCEL_KIND__CANCEL_WRITE, 0), 0); /* id 0 */
	ck_assert_int_eq(tpt_raw_wait_closed(&r, T_MS), 0);
	tpt_raw_close(&r);
	xfer_expect(&e, BIG, 52); /* the victim's pipe is untouched */
	ends_close(&e);
	free(buf);
}
END_TEST

/* ---- a daemon older than Cancel ---------------------------------------------------------- */

/*
 * A proxy between one client and the case's daemon that rewrites the HelloReply to say
 * protocol 1.4 (no Cancel) and forwards every other byte as it is. For contexts with no ring
 * and no shared buffers (no fds travel).
 */
struct proxy {
	int lfd;
	char path[108];
	pthread_t th;
};

static int proxy_send_all(int fd, const uint8_t *buf, size_t len)
{
	while (len) {
		ssize_t k = send(fd, buf, len, MSG_NOSIGNAL);
		if (k <= 0)
			return -1;
		buf += k;
		len -= (size_t)k;
	}
	return 0;
}

/* Rewrites the first daemon frame (HelloReply) in @buf[0..*len) once it is whole. */
static bool proxy_rewrite_hello(uint8_t *buf, size_t *len, size_t cap)
{
	Tpw__V1__DaemonMsg *dm = NULL;
	struct tpw_hdr h;
	size_t whole, n;
	uint8_t out[8192];

	if (*len < TPW_HDR_SIZE || tpw_hdr_parse(buf, 1u << 20, &h) < 0)
		return false;
	whole = TPW_HDR_SIZE + h.msg_len + h.data_len;
	if (*len < whole || tpw_daemon_msg_unpack(buf + TPW_HDR_SIZE, h.msg_len, &dm) < 0)
		return false;
	if (dm->body_case == TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY)
		dm->hello_reply->minor = TPW_MINOR_CANCEL - 1;
	n = tpw_frame_pack(&dm->base, h.data_len, h.nfds, h.seq, out);
	tpw_daemon_msg_free(dm);
	ck_assert(n + (*len - TPW_HDR_SIZE - h.msg_len) <= cap && n <= sizeof(out));
	memmove(buf + n, buf + TPW_HDR_SIZE + h.msg_len, *len - TPW_HDR_SIZE - h.msg_len);
	memcpy(buf, out, n);
	*len = n + (*len - TPW_HDR_SIZE - h.msg_len);
	return true;
}

static void *proxy_main(void *arg)
{
	struct proxy *px = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int c = accept4(px->lfd, NULL, NULL, SOCK_CLOEXEC);
	int d = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	static uint8_t buf[1 << 16];
	size_t pending = 0;
	bool hello_done = false;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", tpt_fixture_daemon.socket);
	if (c < 0 || connect(d, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return NULL;
	for (;;) {
		struct pollfd pfd[2] = { { c, POLLIN, 0 }, { d, POLLIN, 0 } };
		ssize_t k;

		if (poll(pfd, 2, -1) < 0)
			break;
		if (pfd[0].revents) {
			k = recv(c, buf, sizeof(buf), 0);
			if (k <= 0 || proxy_send_all(d, buf, (size_t)k) < 0)
				break;
		}
		if (pfd[1].revents) {
			k = recv(d, buf + pending, sizeof(buf) - pending, 0);
			if (k <= 0)
				break;
			pending += (size_t)k;
			if (!hello_done && !(hello_done = proxy_rewrite_hello(buf, &pending,
									      sizeof(buf))))
				continue;
			if (proxy_send_all(c, buf, pending) < 0)
				break;
			pending = 0;
		}
	}
	close(c);
	close(d);
	return NULL;
}

static void proxy_start(struct proxy *px)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	snprintf(px->path, sizeof(px->path), "%s/old.sock", tpt_fixture_daemon.dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", px->path);
	px->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(px->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(px->lfd, 1), 0);
	ck_assert_int_eq(pthread_create(&px->th, NULL, proxy_main, px), 0);
}

/* A daemon that cannot cancel: tp_cancel() of a write it holds says -EOPNOTSUPP and changes
 * nothing; what the library holds is cancelled all the same. */
START_TEST(test_cancel_with_an_older_daemon)
{
	struct tp_context_options o = { .size = sizeof(o), .flags = TP_CONTEXT_NO_RING };
	struct ends e = { 0 };
	struct proxy px;
	struct tp_payload pl;
	struct seen w, ds;
	uint8_t *buf = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	uint64_t id = 0, did = 0;

	seen_init(&w);
	seen_init(&ds);
	proxy_start(&px);
	o.socket_path = px.path;
	ck_assert_int_eq(tp_context_new(&o, &e.wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &e.rctx), 0);
	ck_assert_int_eq(tp_listen(e.rctx, "old", NULL, &e.l), 0);
	ck_assert_int_eq(tp_connect(e.wctx, "old", &e.w), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &e.r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e.w, T_MS), 0);
	tpt_fill(buf, BIG, 81);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, id), -EOPNOTSUPP);
	ck_assert_msg(strstr(tp_last_error(), "1.4"), "%s", tp_last_error());
	ck_assert_int_eq(tp_pipe_read_descriptor_ex(e.w, on_desc, &ds, &did), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, did), 0);
	ck_assert_int_eq(seen_wait(&ds), -ECANCELED);
	read_expect(&e, BIG, 81); /* the write went on */
	ck_assert_int_eq(seen_wait(&w), 0);
	ends_close(&e);
	pthread_join(px.th, NULL);
	close(px.lfd);
	free(buf);
}
END_TEST

/* ---- across hosts ------------------------------------------------------------------------- */

/* A write the far reader has not asked for: cancelled; the far reader gets -ECANCELED reading
 * it (its daemon's PeerReadReq is answered CANCELED); the pipe carries the next message. */
START_TEST(test_cancel_cross_host_write_queued)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct ends e = { 0 };
	struct tp_descriptor *d;
	struct tp_allocation a;
	struct tp_payload pl;
	struct tp_slot sl;
	struct seen w;
	uint8_t *buf = malloc(BIG), *dst = malloc(BIG);
	struct tp_message m = one_payload(&pl, buf, BIG);
	char addr[128];
	uint64_t id = 0;

	seen_init(&w);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_a, 0, "writer", &e.wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_b, 0, "reader", &e.rctx), 0);
	ck_assert_int_eq(tp_listen(e.rctx, "xc", &lo, &e.l), 0);
	ck_assert_int_eq(tp_connect(e.wctx, tpt_peer_address(&tpt_peer_b, "xc", addr, sizeof(addr)),
				    &e.w), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &e.r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e.w, T_MS), 0);
	tpt_fill(buf, BIG, 71);
	ck_assert_int_eq(tp_pipe_write_ex(e.w, &m, on_done, &w, &id), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, id), 0);
	ck_assert_int_eq(seen_wait(&w), -ECANCELED);
	a = one_slot(&sl, dst);
	ck_assert_int_eq(tp_pipe_read_sync_timeout(e.r, d, &a, T_MS), -ECANCELED);
	ck_assert_msg(strstr(tp_last_error(), "writer cancelled"), "%s", tp_last_error());
	xfer_expect(&e, BIG, 72);
	ends_close(&e);
	free(buf);
	free(dst);
}
END_TEST

/* @ctx's daemon has handled every frame @ctx sent so far (a request was answered). */
static void session_barrier(struct tp_context *ctx)
{
	void *b;

	ck_assert_int_eq(tp_buffer_alloc(ctx, 4096, &b), 0);
	ck_assert_int_eq(tp_buffer_free(ctx, b), 0);
}

#define X_N 10 /* more than the 8 transfers a pipe direction keeps in flight across hosts */

/*
 * Across hosts: message 1's send is held in a page fault on the writer's host, so the receives
 * behind it wait and the last two reads have not asked the writer's daemon for their bytes.
 * Cancelling the last read drops its message (the writer's write fails, "the reader
 * cancelled"); cancelling the write of the one before makes its read fail ("the writer
 * cancelled"); the others arrive.
 */
START_TEST(test_cancel_cross_host_read_not_started)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct ends e = { 0 };
	struct held h;
	struct tp_descriptor *d[X_N];
	struct tp_allocation a[X_N];
	struct tp_payload pl[X_N];
	struct tp_slot sl[X_N];
	struct tp_message m[X_N];
	struct seen w[X_N], r[X_N];
	uint8_t *src[X_N], *dst[X_N];
	char addr[128];
	uint64_t rid = 0, wid[X_N];

	if (held_copy_too_slow("test_cancel_cross_host_read_not_started"))
		return;

	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_a, 0, "writer", &e.wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_b, 0, "reader", &e.rctx), 0);
	ck_assert_int_eq(tp_listen(e.rctx, "xr", &lo, &e.l), 0);
	ck_assert_int_eq(tp_connect(e.wctx, tpt_peer_address(&tpt_peer_b, "xr", addr, sizeof(addr)),
				    &e.w), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &e.r), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(e.w, T_MS), 0);
	held_new(&h, BIG);
	for (int i = 0; i < X_N; i++) {
		seen_init(&w[i]);
		seen_init(&r[i]);
		src[i] = i ? malloc(BIG) : h.mem;
		dst[i] = malloc(BIG);
		if (i)
			tpt_fill(src[i], BIG, 90 + i);
		m[i] = one_payload(&pl[i], src[i], BIG);
		ck_assert_int_eq(tp_pipe_write_ex(e.w, &m[i], on_done, &w[i], &wid[i]), 0);
	}
	for (int i = 0; i < X_N; i++) {
		ck_assert_int_eq(tp_pipe_read_descriptor_sync(e.r, T_MS, &d[i]), 0);
		a[i] = one_slot(&sl[i], dst[i]);
	}
	ck_assert_int_eq(tp_pipe_read(e.r, d[0], &a[0], on_done, &r[0]), 0);
	held_wait_touched(&h); /* message 1 is being sent */
	for (int i = 1; i < X_N; i++)
		ck_assert_int_eq(tp_pipe_read_ex(e.r, d[i], &a[i], on_done, &r[i], &rid), 0);
	ck_assert_int_eq(tp_cancel(e.rctx, rid), 0);
	ck_assert_int_eq(tp_cancel(e.wctx, wid[X_N - 2]), 0);
	session_barrier(e.rctx);
	session_barrier(e.wctx);
	held_release(&h, 90);
	for (int i = 0; i < X_N - 2; i++) {
		ck_assert_int_eq(seen_wait(&r[i]), 0);
		ck_assert_int_eq(seen_wait(&w[i]), 0);
		ck_assert(tpt_verify(dst[i], BIG, 90 + i, NULL));
	}
	ck_assert_int_eq(seen_wait(&r[X_N - 2]), -ECANCELED);
	ck_assert_msg(strstr(r[X_N - 2].msg, "writer cancelled"), "%s", r[X_N - 2].msg);
	ck_assert_int_eq(seen_wait(&w[X_N - 2]), -ECANCELED);
	ck_assert_int_eq(seen_wait(&r[X_N - 1]), -ECANCELED);
	ck_assert_int_eq(seen_wait(&w[X_N - 1]), -ECANCELED);
	ck_assert_msg(strstr(w[X_N - 1].msg, "reader cancelled"), "%s", w[X_N - 1].msg);
	xfer_expect(&e, BIG, 99);
	ends_close(&e);
	held_free(&h);
	for (int i = 0; i < X_N; i++) {
		if (i)
			free(src[i]);
		free(dst[i]);
	}
}
END_TEST

static void debug_daemon_start(void)
{
	static const char *const args[] = { "--log-level", "debug", NULL };

	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
}

static Suite *cancel_suite(void)
{
	Suite *s = suite_create("cancel");
	TCase *tc = tcase_create("cancel");

	tcase_add_checked_fixture(tc, debug_daemon_start, tpt_fixture_stop);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_cancel_write_queued_then_reader_sees_ecanceled);
	tcase_add_test(tc, test_cancel_write_queued_then_discarded);
	tcase_add_test(tc, test_cancel_read_waiting_and_copying);
	tcase_add_test(tc, test_sync_timeouts_cancel_and_return_when_free);
	tcase_add_test(tc, test_cancel_descriptor_request_and_accept);
	tcase_add_test(tc, test_cancel_ids_are_per_context);
	tcase_add_test(tc, test_sync_timeout_calls_refuse_callbacks);
	tcase_add_test(tc, test_context_new_times_out_on_a_silent_socket);
	tcase_add_test(tc, test_requests_time_out_on_a_stopped_daemon);
	tcase_add_test(tc, test_send_gives_up_on_a_daemon_that_stops_reading);
	tcase_add_test(tc, test_hostile_cancel_cannot_touch_another_session);
	tcase_add_test(tc, test_cancel_write_held_while_connect_waits);
	tcase_add_test(tc, test_cancel_with_an_older_daemon);
	suite_add_tcase(s, tc);
	tc = tcase_create("cross-host");
	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_cancel_cross_host_write_queued);
	tcase_add_test(tc, test_cancel_cross_host_read_not_started);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(cancel_suite());
}
