/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/base/work.c, the thread engine the copy threads and the stripe's
 * senders share: chunks are claimed in order and cut at segment boundaries by one rule, the
 * first error wins, a canceled job completes once after its chunks in flight return, and
 * freeing the engine completes queued jobs with -ECANCELED. The test thread plays the workers
 * (claim, finish) and the loop (progress), so every step is deterministic.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "work.h"

#define MIB (1u << 20)
#define FLOOR TPB_WORK_CHUNK_MIN

struct tjob {
	struct tpb_work_job work;
	const uint64_t *lens;
	int calls;
	int status;
	uint64_t bytes;
	char why[160];
};

static uint64_t tjob_len(const struct tpb_work_job *w, size_t seg)
{
	return tpu_container_of(w, struct tjob, work)->lens[seg];
}

static void tjob_done(struct tpb_work_job *w)
{
	struct tjob *j = tpu_container_of(w, struct tjob, work);

	j->calls++;
	j->status = w->status;
	j->bytes = w->bytes;
	snprintf(j->why, sizeof(j->why), "%s", w->why);
}

static void tjob_init(struct tjob *j, const uint64_t *lens, size_t n)
{
	memset(j, 0, sizeof(*j));
	j->lens = lens;
	j->work.n_segs = n;
	j->work.seg_len = tjob_len;
	j->work.done = tjob_done;
}

static struct tpb_work *work_new(uint32_t chunk, unsigned workers, bool rows)
{
	struct tpb_work_config cfg = { .chunk = chunk, .workers = workers, .rows = rows };
	struct tpb_work *w = NULL;

	ck_assert_int_eq(tpb_work_new(&cfg, &w), 0);
	return w;
}

/* Claims without waiting; asserts a chunk was there. */
static struct tpb_work_chunk claim(struct tpb_work *w)
{
	struct tpb_work_chunk k;

	ck_assert_int_eq(tpb_work_try_claim(w, &k), 0);
	return k;
}

static bool fd_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

START_TEST(test_work_chunk_rule_spreads_small_jobs_and_caps_large_ones)
{
	/* One worker, or a job of a row of full chunks or more: the configured chunk. */
	ck_assert_uint_eq(tpb_work_chunk_size(64u << 20, 4, MIB, FLOOR), 1u << 20);
	ck_assert_uint_eq(tpb_work_chunk_size(4u << 20, 4, MIB, FLOOR), 1u << 20);
	ck_assert_uint_eq(tpb_work_chunk_size(8u << 20, 1, MIB, FLOOR), 1u << 20);
	/* Just below a row: one piece per worker, rounded up to 64 KiB. */
	ck_assert_uint_eq(tpb_work_chunk_size((4u << 20) - 1, 4, MIB, FLOOR), 1u << 20);
	ck_assert_uint_eq(tpb_work_chunk_size(2u << 20, 4, MIB, FLOOR), 512u << 10);
	ck_assert_uint_eq(tpb_work_chunk_size((2u << 20) + 1, 4, MIB, FLOOR), 576u << 10);
	/* Never below TPB_WORK_CHUNK_MIN, unless the chunk itself is smaller. */
	ck_assert_uint_eq(tpb_work_chunk_size(1, 4, MIB, FLOOR), TPB_WORK_CHUNK_MIN);
	ck_assert_uint_eq(tpb_work_chunk_size(1u << 20, 8, MIB, FLOOR), TPB_WORK_CHUNK_MIN);
	ck_assert_uint_eq(tpb_work_chunk_size(1u << 20, 8, 4096, FLOOR), 4096);
	ck_assert_uint_eq(tpb_work_chunk_size(0, 0, MIB, FLOOR), TPB_WORK_CHUNK_MIN);
	/* A floor of a chunk (the copy threads'): never cut below a chunk. */
	ck_assert_uint_eq(tpb_work_chunk_size(1u << 20, 2, 1u << 20, 1u << 20), 1u << 20);
	ck_assert_uint_eq(tpb_work_chunk_size(3u << 20, 4, 1u << 20, 1u << 20), 1u << 20);
	ck_assert_uint_eq(tpb_work_chunk_size(100, 4, 1u << 20, 1u << 20), 1u << 20);
}
END_TEST

/* Chunks come in order, cut at each segment's end; 0-length segments yield nothing and a
 * 1-byte segment one chunk of 1 byte. */
START_TEST(test_work_claims_in_order_and_cuts_at_segment_boundaries)
{
	static const uint64_t lens[] = { 0, 1, 3000, 0, 0, 2500, 1, 0 };
	struct tpb_work *w = work_new(1024, 1, false);
	struct tpb_work_chunk k;
	struct { size_t seg; uint64_t off, len; } want[] = {
		{ 1, 0, 1 },	{ 2, 0, 1024 }, { 2, 1024, 1024 }, { 2, 2048, 952 },
		{ 5, 0, 1024 }, { 5, 1024, 1024 }, { 5, 2048, 452 }, { 6, 0, 1 },
	};
	struct tjob j;

	tjob_init(&j, lens, TPU_ARRAY_SIZE(lens));
	tpb_work_submit(w, &j.work);
	ck_assert_uint_eq(tpb_work_busy(w), 1);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(want); i++) {
		k = claim(w);
		ck_assert_ptr_eq(k.job, &j.work);
		ck_assert_uint_eq(k.seg, want[i].seg);
		ck_assert_uint_eq(k.off, want[i].off);
		ck_assert_uint_eq(k.len, want[i].len);
		tpb_work_finish(w, &k, 0, NULL);
		ck_assert_int_eq(j.calls, 0); /* never inside a call */
	}
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -EAGAIN);
	ck_assert(fd_readable(tpb_work_event_fd(w)));
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(j.calls, 1);
	ck_assert_int_eq(j.status, 0);
	ck_assert_uint_eq(j.bytes, 1 + 3000 + 2500 + 1);
	ck_assert_uint_eq(tpb_work_busy(w), 0);
	ck_assert(!fd_readable(tpb_work_event_fd(w)));
	ck_assert_int_eq(tpb_work_progress(w), 0);
	tpb_work_free(w, "stop");
	ck_assert_int_eq(j.calls, 1);
}
END_TEST

/* A job whose chunk_min is a segment or more is claimed one whole segment at a time (a GPU copy);
 * a chunk_min below the rule's chunk changes nothing. */
START_TEST(test_work_chunk_min_keeps_segments_whole)
{
	static const uint64_t lens[] = { 3000, 0, 5000, 1 };
	struct tpb_work *w = work_new(1024, 2, false);
	struct { size_t seg; uint64_t len; } want[] = { { 0, 3000 }, { 2, 5000 }, { 3, 1 } };
	struct tpb_work_chunk k;
	struct tjob j;

	tjob_init(&j, lens, TPU_ARRAY_SIZE(lens));
	j.work.chunk_min = UINT64_MAX;
	tpb_work_submit(w, &j.work);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(want); i++) {
		k = claim(w);
		ck_assert_uint_eq(k.seg, want[i].seg);
		ck_assert_uint_eq(k.off, 0);
		ck_assert_uint_eq(k.len, want[i].len);
		tpb_work_finish(w, &k, 0, NULL);
	}
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -EAGAIN);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_uint_eq(j.bytes, 8001);

	tjob_init(&j, lens, 1);
	j.work.chunk_min = 512;
	tpb_work_submit(w, &j.work);
	k = claim(w);
	ck_assert_uint_eq(k.len, 1024);
	tpb_work_finish(w, &k, 0, NULL);
	while (tpb_work_try_claim(w, &k) == 0)
		tpb_work_finish(w, &k, 0, NULL);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	tpb_work_free(w, "stop");
}
END_TEST

/* A job of nothing but empty segments (or none) completes from progress, not in submit. */
START_TEST(test_work_empty_job_completes_from_progress)
{
	static const uint64_t lens[] = { 0, 0 };
	struct tpb_work *w = work_new(0, 2, false);
	struct tpb_work_chunk k;
	struct tjob a, b;

	tjob_init(&a, lens, 2);
	tjob_init(&b, lens, 0);
	tpb_work_submit(w, &a.work);
	tpb_work_submit(w, &b.work);
	ck_assert_int_eq(a.calls + b.calls, 0);
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -EAGAIN);
	ck_assert_int_eq(tpb_work_progress(w), 2);
	ck_assert_int_eq(a.calls, 1);
	ck_assert_int_eq(b.calls, 1);
	ck_assert_int_eq(a.status, 0);
	ck_assert_uint_eq(a.bytes, 0);
	tpb_work_free(w, "stop");
}
END_TEST

/* The oldest job is served until all of it is claimed; with rows, jobs take turns of one chunk
 * per worker. */
START_TEST(test_work_claim_order_oldest_first_or_by_rows)
{
	static const uint64_t lens[] = { 4096 };
	struct tpb_work_chunk k[8];
	struct tjob a, b;

	for (int rows = 0; rows < 2; rows++) {
		struct tpb_work *w = work_new(1024, 2, rows);
		struct tpb_work_job *want_rows[] = { &a.work, &a.work, &b.work, &b.work,
						     &a.work, &a.work, &b.work, &b.work };
		struct tpb_work_job *want_fifo[] = { &a.work, &a.work, &a.work, &a.work,
						     &b.work, &b.work, &b.work, &b.work };

		tjob_init(&a, lens, 1);
		tjob_init(&b, lens, 1);
		tpb_work_submit(w, &a.work);
		tpb_work_submit(w, &b.work);
		for (int i = 0; i < 8; i++) {
			k[i] = claim(w);
			ck_assert_ptr_eq(k[i].job, rows ? want_rows[i] : want_fifo[i]);
		}
		for (int i = 0; i < 8; i++)
			tpb_work_finish(w, &k[i], 0, NULL);
		ck_assert_int_eq(tpb_work_progress(w), 2);
		ck_assert_uint_eq(a.bytes, 4096);
		ck_assert_uint_eq(b.bytes, 4096);
		tpb_work_free(w, "stop");
	}
}
END_TEST

/* The first error wins, later ones change nothing; no chunk of the failed job is handed out
 * after it; the job completes once its chunks in flight have returned. */
START_TEST(test_work_first_error_wins_and_waits_for_chunks_in_flight)
{
	static const uint64_t lens[] = { 8192 };
	struct tpb_work *w = work_new(1024, 1, false);
	struct tpb_work_chunk k1, k2, k3, k;
	struct tjob j, next;

	tjob_init(&j, lens, 1);
	tjob_init(&next, lens, 1);
	tpb_work_submit(w, &j.work);
	tpb_work_submit(w, &next.work);
	k1 = claim(w);
	k2 = claim(w);
	k3 = claim(w);
	tpb_work_finish(w, &k2, -EFAULT, "first");
	ck_assert(tpb_work_stopped(w, &j.work));
	k = claim(w); /* the failed job's chunks are skipped */
	ck_assert_ptr_eq(k.job, &next.work);
	tpb_work_finish(w, &k1, -EIO, "second");
	ck_assert_int_eq(tpb_work_progress(w), 0); /* k3 still in flight */
	tpb_work_finish(w, &k3, 0, NULL);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(j.calls, 1);
	ck_assert_int_eq(j.status, -EFAULT);
	ck_assert_str_eq(j.why, "first");
	ck_assert_uint_eq(j.bytes, 1024); /* k3 only */
	tpb_work_finish(w, &k, 0, NULL);
	tpb_work_free(w, "stop");
	ck_assert_int_eq(next.calls, 1);
	ck_assert_int_eq(next.status, -ECANCELED);
	ck_assert_str_eq(next.why, "stop");
	ck_assert_int_eq(j.calls, 1);
}
END_TEST

/* Canceled mid-job: no more chunks are handed out, and the job completes with -ECANCELED once,
 * only after the chunks in flight returned; a second cancel changes nothing. */
START_TEST(test_work_cancel_mid_job_completes_once_after_chunks_in_flight)
{
	static const uint64_t lens[] = { 4096, 4096 };
	struct tpb_work *w = work_new(1024, 2, false);
	struct tpb_work_chunk k1, k2, k;
	struct tjob j;

	tjob_init(&j, lens, 2);
	tpb_work_submit(w, &j.work);
	k1 = claim(w);
	k2 = claim(w);
	tpb_work_finish(w, &k1, 0, NULL);
	tpb_work_cancel(w, &j.work, "send canceled");
	tpb_work_cancel(w, &j.work, "again");
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -EAGAIN);
	ck_assert_int_eq(tpb_work_progress(w), 0);
	ck_assert_int_eq(j.calls, 0);
	ck_assert_uint_eq(tpb_work_busy(w), 1);
	tpb_work_finish(w, &k2, 0, NULL);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(j.calls, 1);
	ck_assert_int_eq(j.status, -ECANCELED);
	ck_assert_str_eq(j.why, "send canceled");
	tpb_work_cancel(w, &j.work, "after"); /* completed: no-op */
	ck_assert_int_eq(tpb_work_progress(w), 0);
	ck_assert_int_eq(j.calls, 1);
	tpb_work_free(w, "stop");
	ck_assert_int_eq(j.calls, 1);
}
END_TEST

/* The last hook: runs once, when the job's last chunk ends and before the job can complete
 * (progress from inside it delivers nothing); a canceled job runs it when its chunk in flight
 * returns; a job canceled before any chunk ran never runs it. */
static struct tpb_work *hook_engine;
static int hook_calls, hook_progress;

static void tjob_last(struct tpb_work_job *w)
{
	(void)w;
	hook_calls++;
	hook_progress += tpb_work_progress(hook_engine);
}

START_TEST(test_work_last_hook_runs_once_before_completion)
{
	static const uint64_t lens[] = { 2048, 1024 };
	struct tpb_work *w = work_new(1024, 1, false);
	struct tpb_work_chunk k1, k2, k3, k;
	struct tjob j, c, q;

	hook_engine = w;
	hook_calls = hook_progress = 0;
	tjob_init(&j, lens, 2);
	j.work.last = tjob_last;
	tpb_work_submit(w, &j.work);
	k1 = claim(w);
	k2 = claim(w);
	k3 = claim(w);
	tpb_work_finish(w, &k3, 0, NULL); /* the last claimed, not the last to end */
	tpb_work_finish(w, &k1, 0, NULL);
	ck_assert_int_eq(hook_calls, 0);
	tpb_work_finish(w, &k2, 0, NULL);
	ck_assert_int_eq(hook_calls, 1);
	ck_assert_int_eq(hook_progress, 0);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(j.status, 0);
	ck_assert_uint_eq(j.bytes, 3072);

	tjob_init(&c, lens, 2);
	c.work.last = tjob_last;
	tpb_work_submit(w, &c.work);
	k = claim(w);
	tpb_work_cancel(w, &c.work, "canceled");
	ck_assert_int_eq(hook_calls, 1);
	tpb_work_finish(w, &k, 0, NULL);
	ck_assert_int_eq(hook_calls, 2);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(c.status, -ECANCELED);

	tjob_init(&q, lens, 2);
	q.work.last = tjob_last;
	tpb_work_submit(w, &q.work);
	tpb_work_cancel(w, &q.work, NULL);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(hook_calls, 2);
	ck_assert_int_eq(hook_progress, 0);
	tpb_work_free(w, "stop");
}
END_TEST

/* Canceled before any chunk was claimed: completes from the next progress. */
START_TEST(test_work_cancel_queued_job_completes_from_progress)
{
	static const uint64_t lens[] = { 100 };
	struct tpb_work *w = work_new(0, 1, false);
	struct tpb_work_chunk k;
	struct tjob j;

	tjob_init(&j, lens, 1);
	tpb_work_submit(w, &j.work);
	tpb_work_cancel(w, &j.work, NULL);
	ck_assert_int_eq(j.calls, 0);
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -EAGAIN);
	ck_assert_int_eq(tpb_work_progress(w), 1);
	ck_assert_int_eq(j.status, -ECANCELED);
	ck_assert_uint_eq(j.bytes, 0);
	tpb_work_free(w, "stop");
}
END_TEST

/* Freeing the engine delivers finished jobs normally and completes queued ones (also partly
 * claimed ones) with -ECANCELED, each once. */
START_TEST(test_work_free_completes_queued_jobs_canceled)
{
	static const uint64_t lens[] = { 3000 };
	struct tpb_work *w = work_new(1024, 1, false);
	struct tpb_work_chunk k;
	struct tjob done, part, queued;

	tjob_init(&done, lens, 1);
	tjob_init(&part, lens, 1);
	tjob_init(&queued, lens, 1);
	tpb_work_submit(w, &done.work);
	tpb_work_submit(w, &part.work);
	tpb_work_submit(w, &queued.work);
	for (int i = 0; i < 3; i++) {
		k = claim(w);
		tpb_work_finish(w, &k, 0, NULL);
	}
	k = claim(w);
	ck_assert_ptr_eq(k.job, &part.work);
	tpb_work_finish(w, &k, 0, NULL);
	tpb_work_stop(w);
	ck_assert_int_eq(tpb_work_try_claim(w, &k), -ESHUTDOWN);
	ck_assert_int_eq(tpb_work_claim(w, &k), -ESHUTDOWN);
	tpb_work_free(w, "daemon stopping");
	ck_assert_int_eq(done.calls, 1);
	ck_assert_int_eq(done.status, 0);
	ck_assert_uint_eq(done.bytes, 3000);
	ck_assert_int_eq(part.calls, 1);
	ck_assert_int_eq(part.status, -ECANCELED);
	ck_assert_str_eq(part.why, "daemon stopping");
	ck_assert_int_eq(queued.calls, 1);
	ck_assert_int_eq(queued.status, -ECANCELED);
}
END_TEST

/* Threads: workers blocked in tpb_work_claim() wake for a submit and for stop. */
struct worker {
	struct tpb_work *w;
	uint64_t bytes;
};

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct tpb_work_chunk k;

	while (tpb_work_claim(wk->w, &k) == 0) {
		wk->bytes += k.len;
		tpb_work_finish(wk->w, &k, 0, NULL);
	}
	return NULL;
}

START_TEST(test_work_threads_share_one_job_and_stop)
{
	static const uint64_t lens[] = { 64u << 20, 1, 0, 12345 };
	struct tpb_work *w = work_new(0, 3, false);
	struct worker wk[3];
	pthread_t t[3];
	struct tjob j;
	uint64_t sum = 0;

	for (int i = 0; i < 3; i++) {
		wk[i] = (struct worker){ .w = w };
		ck_assert_int_eq(pthread_create(&t[i], NULL, worker_main, &wk[i]), 0);
	}
	tjob_init(&j, lens, TPU_ARRAY_SIZE(lens));
	tpb_work_submit(w, &j.work);
	while (j.calls == 0) {
		struct pollfd p = { .fd = tpb_work_event_fd(w), .events = POLLIN };

		ck_assert_int_eq(poll(&p, 1, 10000), 1);
		tpb_work_progress(w);
	}
	tpb_work_stop(w);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		sum += wk[i].bytes;
	}
	ck_assert_int_eq(j.status, 0);
	ck_assert_uint_eq(j.bytes, (64u << 20) + 1 + 12345);
	ck_assert_uint_eq(sum, j.bytes);
	tpb_work_free(w, "stop");
	ck_assert_int_eq(j.calls, 1);
}
END_TEST

static Suite *work_suite(void)
{
	Suite *s = suite_create("work");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_work_chunk_rule_spreads_small_jobs_and_caps_large_ones);
	tcase_add_test(tc, test_work_claims_in_order_and_cuts_at_segment_boundaries);
	tcase_add_test(tc, test_work_chunk_min_keeps_segments_whole);
	tcase_add_test(tc, test_work_empty_job_completes_from_progress);
	tcase_add_test(tc, test_work_claim_order_oldest_first_or_by_rows);
	tcase_add_test(tc, test_work_first_error_wins_and_waits_for_chunks_in_flight);
	tcase_add_test(tc, test_work_cancel_mid_job_completes_once_after_chunks_in_flight);
	tcase_add_test(tc, test_work_cancel_queued_job_completes_from_progress);
	tcase_add_test(tc, test_work_free_completes_queued_jobs_canceled);
	tcase_add_test(tc, test_work_threads_share_one_job_and_stop);
	tcase_add_test(tc, test_work_last_hook_runs_once_before_completion);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(work_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
