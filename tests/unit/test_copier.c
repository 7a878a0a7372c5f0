/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/base/copier.c: jobs run on worker threads and complete on the loop
 * thread, exactly once, with errors reported per job; queued jobs are canceled when the copier
 * stops.
 */
#include <check.h>
#include <errno.h>
#include <event2/event.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "copier.h"

/* This process, pinned (one per forked test process). */
static struct tpb_proc *self_proc(void)
{
	static struct tpb_proc *p;
	static pid_t owner;

	if (!p || owner != getpid()) {
		int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(tpb_proc_new(fd, -EBADF, getpid(), geteuid(), getegid(), 0, &p), 0);
		owner = getpid();
	}
	return p;
}

struct result {
	int calls;
	int status;
	pthread_t thread;
	struct event_base *base;
	unsigned *remaining;
};

static void on_done(struct tpb_copy_job *job)
{
	struct result *r = job->arg;

	r->calls++;
	r->status = job->status;
	r->thread = pthread_self();
	if (r->remaining && --*r->remaining == 0)
		event_base_loopbreak(r->base);
	tpb_copier_job_free(job);
}

static struct tpb_copy_job *shm_job(void *dst, const void *src, size_t len, struct result *r)
{
	struct tpb_copy_job *job = tpb_copier_job_new(1, 0);

	job->xfers[0] = (struct tpb_xfer){
		.src = { .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)src },
		.dst = { .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)dst },
		.len = len,
	};
	job->channels[0] = tpb_index("shm");
	job->n = 1;
	job->done = on_done;
	job->arg = r;
	return job;
}

/* The daemon's part (core/daemon.c): the copier's event fd on the loop runs its completions. */
static struct event *copier_ev; /* one copier per test (each runs in its own process) */

static void on_copier_event(evutil_socket_t fd, short what, void *arg)
{
	tpb_copier_progress(arg);
}

static int copier_new_on(struct event_base *base, unsigned threads, struct tpb_copier **ret)
{
	int r = tpb_copier_new(threads, ret);

	if (r < 0)
		return r;
	copier_ev = event_new(base, tpb_copier_event_fd(*ret), EV_READ | EV_PERSIST,
			      on_copier_event, *ret);
	ck_assert_ptr_nonnull(copier_ev);
	ck_assert_int_eq(event_add(copier_ev, NULL), 0);
	return 0;
}

static void copier_free(struct tpb_copier *c)
{
	event_free(copier_ev);
	copier_ev = NULL;
	tpb_copier_free(c);
}

static void run_until(struct event_base *base, unsigned *remaining)
{
	struct timeval limit = { 10, 0 };

	event_base_loopexit(base, &limit);
	if (*remaining)
		event_base_dispatch(base);
}

/* ---- the copier as the engine of a same-host channel's context (tpb.h op table) ---- */

struct op_rec {
	int calls, status;
	uint64_t bytes;
	pthread_t thread;
	struct event_base *base;
};

static void op_on_done(struct tpb_op *op)
{
	struct op_rec *r = op->arg;

	r->calls++;
	r->status = op->status;
	r->bytes = op->bytes;
	r->thread = pthread_self();
	event_base_loopbreak(r->base);
}

static void on_ctx_event(evutil_socket_t fd, short what, void *arg)
{
	tpb_progress(arg);
}

/*
 * shm's kernel on the copy threads: tpb_start() hands the op to the copier, the copier's job
 * completes on the loop, the context's event fd turns readable, and tpb_progress() on the loop
 * runs the op's callback once, on the loop thread, with the bytes copied. An op canceled right
 * after it started completes with -ECANCELED once its kernel has finished.
 */
START_TEST(test_copier_runs_a_channel_context_kernel)
{
	enum { LEN = 8 << 20 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	struct tpb_engine engine;
	struct tpb_ctx *ctx;
	struct tpb_ep *ep;
	struct event *ev;
	char *src = malloc(LEN), *dst = calloc(1, LEN);
	struct tpb_xfer x[2];
	struct op_rec r = { .base = base };
	struct tpb_op op = { .xfers = x, .n_xfers = 2, .done = op_on_done, .arg = &r };

	tpb_registry_init(&(struct tpb_config){ 0 });
	for (size_t i = 0; i < LEN; i++)
		src[i] = (char)(i % 253);
	x[0] = (struct tpb_xfer){ .src = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)src },
				  .dst = { .loc = TPB_LOC_LOCAL, .addr = (uintptr_t)dst },
				  .len = LEN / 2 };
	x[1] = x[0];
	x[1].src.addr += LEN / 2;
	x[1].dst.addr += LEN / 2;
	ck_assert_int_eq(copier_new_on(base, 2, &c), 0);
	tpb_copier_engine(c, &engine);
	ck_assert_int_eq(tpb_ctx_new(tpb_index("shm"), NULL, &engine, &ctx), 0);
	ck_assert_int_eq(tpb_ep_open(ctx, NULL, &ep), 0);
	ev = event_new(base, tpb_event_fd(ctx), EV_READ | EV_PERSIST, on_ctx_event, ctx);
	ck_assert_int_eq(event_add(ev, NULL), 0);

	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(r.calls, 0);
	event_base_loopexit(base, &(struct timeval){ 10, 0 });
	event_base_dispatch(base);
	ck_assert_int_eq(r.calls, 1);
	ck_assert_int_eq(r.status, 0);
	ck_assert_uint_eq(r.bytes, LEN);
	ck_assert(pthread_equal(r.thread, pthread_self()));
	ck_assert_int_eq(memcmp(src, dst, LEN), 0);

	memset(dst, 0, LEN);
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_cancel(ep, &op), 0);
	event_base_loopexit(base, &(struct timeval){ 10, 0 });
	event_base_dispatch(base);
	ck_assert_int_eq(r.calls, 2);
	ck_assert_int_eq(r.status, -ECANCELED);
	ck_assert_uint_eq(tpb_copier_busy(c), 0); /* the kernel had let go of the memory */

	/* An op with nothing to copy still completes later, from progress. */
	op.n_xfers = 0;
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(r.calls, 2);
	event_base_loopexit(base, &(struct timeval){ 10, 0 });
	event_base_dispatch(base);
	ck_assert_int_eq(r.calls, 3);
	ck_assert_int_eq(r.status, 0);

	tpb_ep_close(ep);
	event_free(ev);
	tpb_ctx_free(ctx);
	copier_free(c);
	event_base_free(base);
	free(src);
	free(dst);
}
END_TEST

/*
 * Without any event loop: a finished job waits until its owner calls tpb_copier_progress(), the
 * copier's event fd turns readable when it does, and progress runs its callback exactly once,
 * on the calling thread; a second progress finds nothing.
 */
START_TEST(test_copier_completes_only_from_progress_when_its_fd_turns_readable)
{
	enum { LEN = 1 << 20 };
	struct tpb_copier *c = NULL;
	struct result res = { 0 };
	char *src = malloc(LEN), *dst = calloc(1, LEN);
	struct pollfd pfd;

	tpb_registry_init(&(struct tpb_config){ 0 });
	memset(src, 0x5a, LEN);
	ck_assert_int_eq(tpb_copier_new(2, &c), 0);
	pfd = (struct pollfd){ .fd = tpb_copier_event_fd(c), .events = POLLIN };
	ck_assert_int_ge(pfd.fd, 0);
	ck_assert_int_eq(tpb_copier_progress(c), 0);
	tpb_copier_submit(c, shm_job(dst, src, LEN, &res));
	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert_int_eq(res.calls, 0); /* finished, not delivered */
	ck_assert_uint_eq(tpb_copier_busy(c), 1);
	ck_assert_int_eq(tpb_copier_progress(c), 1);
	ck_assert_int_eq(res.calls, 1);
	ck_assert_int_eq(res.status, 0);
	ck_assert(pthread_equal(res.thread, pthread_self()));
	ck_assert_uint_eq(tpb_copier_busy(c), 0);
	ck_assert_int_eq(memcmp(src, dst, LEN), 0);
	ck_assert_int_eq(poll(&pfd, 1, 0), 0); /* acknowledged */
	ck_assert_int_eq(tpb_copier_progress(c), 0);
	ck_assert_int_eq(res.calls, 1);
	tpb_copier_free(c);
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_copier_runs_jobs_and_completes_on_loop_thread)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	enum { N = 8, LEN = 1 << 20 };
	struct result res[N] = { 0 };
	char *src = malloc(LEN), *dst[N];
	unsigned remaining = N;

	tpb_registry_init(&cfg);
	for (size_t i = 0; i < LEN; i++)
		src[i] = (char)(i % 251);
	ck_assert_int_eq(copier_new_on(base, 3, &c), 0);
	for (int i = 0; i < N; i++) {
		dst[i] = calloc(1, LEN);
		res[i].base = base;
		res[i].remaining = &remaining;
		tpb_copier_submit(c, shm_job(dst[i], src, LEN, &res[i]));
	}
	run_until(base, &remaining);
	ck_assert_uint_eq(remaining, 0);
	ck_assert_uint_eq(tpb_copier_busy(c), 0);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(res[i].calls, 1);
		ck_assert_int_eq(res[i].status, 0);
		ck_assert(pthread_equal(res[i].thread, pthread_self()));
		ck_assert_int_eq(memcmp(dst[i], src, LEN), 0);
		free(dst[i]);
	}
	copier_free(c);
	event_base_free(base);
	free(src);
}
END_TEST

START_TEST(test_copier_reports_copy_errors)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	struct result res = { .base = NULL };
	unsigned remaining = 1;
	char buf[16];
	struct tpb_copy_job *job;

	tpb_registry_init(&cfg);
	res.base = base;
	res.remaining = &remaining;
	ck_assert_int_eq(copier_new_on(base, 1, &c), 0);
	job = shm_job(buf, buf, sizeof(buf), &res);
	job->xfers[0].src = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = self_proc(), .addr = 8 };
	job->channels[0] = tpb_index("cma");
	tpb_copier_submit(c, job);
	run_until(base, &remaining);
	ck_assert_int_eq(res.calls, 1);
	ck_assert_int_eq(res.status, -EFAULT);
	copier_free(c);
	event_base_free(base);
}
END_TEST

START_TEST(test_copier_free_completes_every_job_once)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	enum { N = 64, LEN = 4 << 20 };
	struct result res[N] = { 0 };
	char *src = calloc(1, LEN), *dst = calloc(1, LEN);

	tpb_registry_init(&cfg);
	ck_assert_int_eq(copier_new_on(base, 1, &c), 0);
	for (int i = 0; i < N; i++)
		tpb_copier_submit(c, shm_job(dst, src, LEN, &res[i]));
	copier_free(c); /* some finished, the rest canceled */
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(res[i].calls, 1);
		ck_assert(res[i].status == 0 || res[i].status == -ECANCELED);
	}
	event_base_free(base);
	free(src);
	free(dst);
}
END_TEST

/* A job of @n chunks of @len bytes each, src -> dst at matching offsets. */
static struct tpb_copy_job *chunked_job(char *dst, const char *src, size_t n, size_t len,
					struct result *r)
{
	struct tpb_copy_job *job = tpb_copier_job_new(n, 0);

	for (size_t i = 0; i < n; i++) {
		job->xfers[i] = (struct tpb_xfer){
			.src = { .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)(src + i * len) },
			.dst = { .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)(dst + i * len) },
			.len = len,
		};
		job->channels[i] = tpb_index("shm");
	}
	job->n = n;
	job->done = on_done;
	job->arg = r;
	return job;
}

START_TEST(test_copier_spreads_one_job_over_workers_and_completes_it_once)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	enum { CHUNKS = 64, LEN = 256 << 10 };
	char *src = malloc(CHUNKS * LEN), *dst = calloc(1, CHUNKS * LEN);
	struct result res = { 0 };
	unsigned remaining = 1;

	tpb_registry_init(&cfg);
	for (size_t i = 0; i < (size_t)CHUNKS * LEN; i++)
		src[i] = (char)(i * 13 + 1);
	res.base = base;
	res.remaining = &remaining;
	ck_assert_int_eq(copier_new_on(base, 3, &c), 0);
	tpb_copier_submit(c, chunked_job(dst, src, CHUNKS, LEN, &res));
	run_until(base, &remaining);
	ck_assert_int_eq(res.calls, 1);
	ck_assert_int_eq(res.status, 0);
	ck_assert_int_eq(memcmp(src, dst, (size_t)CHUNKS * LEN), 0);
	ck_assert_uint_eq(tpb_copier_busy(c), 0);
	copier_free(c);
	event_base_free(base);
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_copier_chunk_error_fails_the_job_once)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	enum { CHUNKS = 32, LEN = 64 << 10 };
	char *src = malloc(CHUNKS * LEN), *dst = calloc(1, CHUNKS * LEN);
	struct result res = { 0 };
	unsigned remaining = 1;
	struct tpb_copy_job *job;

	tpb_registry_init(&cfg);
	res.base = base;
	res.remaining = &remaining;
	ck_assert_int_eq(copier_new_on(base, 2, &c), 0);
	job = chunked_job(dst, src, CHUNKS, LEN, &res);
	job->xfers[7].src = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = self_proc(), .addr = 8 };
	job->channels[7] = tpb_index("cma");
	tpb_copier_submit(c, job);
	run_until(base, &remaining);
	ck_assert_int_eq(res.calls, 1);
	ck_assert_int_eq(res.status, -EFAULT);
	copier_free(c);
	event_base_free(base);
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_copier_empty_job_completes_on_the_loop)
{
	struct tpb_config cfg = { 0 };
	struct event_base *base = event_base_new();
	struct tpb_copier *c = NULL;
	struct result res = { 0 };
	unsigned remaining = 1;
	struct tpb_copy_job *job;

	tpb_registry_init(&cfg);
	res.base = base;
	res.remaining = &remaining;
	ck_assert_int_eq(copier_new_on(base, 1, &c), 0);
	job = tpb_copier_job_new(0, 0);
	job->done = on_done;
	job->arg = &res;
	tpb_copier_submit(c, job);
	ck_assert_int_eq(res.calls, 0); /* never inside submit */
	run_until(base, &remaining);
	ck_assert_int_eq(res.calls, 1);
	ck_assert_int_eq(res.status, 0);
	copier_free(c);
	event_base_free(base);
}
END_TEST

static Suite *copier_suite(void)
{
	Suite *s = suite_create("copier");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_copier_runs_jobs_and_completes_on_loop_thread);
	tcase_add_test(tc, test_copier_completes_only_from_progress_when_its_fd_turns_readable);
	tcase_add_test(tc, test_copier_runs_a_channel_context_kernel);
	tcase_add_test(tc, test_copier_reports_copy_errors);
	tcase_add_test(tc, test_copier_free_completes_every_job_once);
	tcase_add_test(tc, test_copier_spreads_one_job_over_workers_and_completes_it_once);
	tcase_add_test(tc, test_copier_chunk_error_fails_the_job_once);
	tcase_add_test(tc, test_copier_empty_job_completes_on_the_loop);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(copier_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
