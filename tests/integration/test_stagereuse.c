/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: staging of private memory when CMA is off (tpipd --no-cma, both contexts
 * TP_CONTEXT_NO_CMA). One child process holds a reader and a writer context joined by two
 * pipes and keeps several writes in flight on both pipes at once, with sizes that go up and
 * down (0, 1, 4 KiB, 1 MiB + 1, 16 MiB, then smaller again); every message is read back
 * byte-exact. The staging buffers the library maps (memfd "tpclient" in /proc/self/maps, none
 * allocated by the test) are reused: across the ~100 messages the number of distinct ones ever
 * seen stays bounded, and `tpipctl sessions` shows each context holding few registered buffers.
 * Once traffic stops, the idle free list is released: both sessions drop to 0 buffers. Sizes
 * that fall through more size classes than the free list holds (16 MiB down to 64 KiB + 1, one
 * at a time, three times over) are all served by the first, largest buffer of each side.
 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include "itest.h"

#define T_MS TPT_SCALED_MS(60000)
#define LISTENER "stagereuse"
#define INFLIGHT 4 /* writes in flight per pipe */
#define ROUNDS 13  /* 13 * 4 * 2 = 104 messages */
/* In flight on both pipes (writer and reader side) plus the library's free list (8). */
#define BUFS_BOUND (2 * 2 * INFLIGHT + 8)
#define SEEN_MAX 256

static struct tpt_daemon daemon_nocma;

static const size_t sizes[] = { 0, 1, 4096, (1u << 20) + 1, 16u << 20, (1u << 20) + 1, 4096, 1 };

static void spec_of(unsigned pipe, unsigned index, struct tpt_msg_spec *ret)
{
	*ret = (struct tpt_msg_spec){ .pipe = pipe, .index = index, .n_tensors = 1,
				      .meta_len = 16 };
	ret->lens[0] = sizes[(index + pipe) % (sizeof(sizes) / sizeof(sizes[0]))];
}

/* Adds the inodes of the staging memfds mapped now to @seen; returns how many are mapped. */
static int maps_scan(unsigned long *seen, unsigned *n_seen)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int mapped = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long ino;
		unsigned i;

		if (!strstr(line, "/memfd:tpclient") ||
		    sscanf(line, "%*s %*s %*s %*s %lu", &ino) != 1)
			continue;
		mapped++;
		for (i = 0; i < *n_seen && seen[i] != ino; i++)
			;
		if (i == *n_seen && *n_seen < SEEN_MAX)
			seen[(*n_seen)++] = ino;
	}
	fclose(f);
	return mapped;
}

/* Registered buffers of the session named @name (tpipctl --json sessions), or -1. */
static int session_buffers(const char *name)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", daemon_nocma.socket, "--json", "sessions", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *arr, *v;
	int n = -1;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return -1;
	o = json_tokener_parse(res.out);
	if (o && json_object_object_get_ex(o, "sessions", &arr)) {
		for (size_t i = 0; i < json_object_array_length(arr); i++) {
			struct json_object *s = json_object_array_get_idx(arr, i);

			if (json_object_object_get_ex(s, "name", &v) &&
			    strcmp(json_object_get_string(v), name) == 0 &&
			    json_object_object_get_ex(s, "buffers", &v))
				n = json_object_get_int(v);
		}
	}
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return n;
}

struct ends {
	struct tp_context *cr, *cw;
	struct tp_listener *l;
	struct tp_pipe *pr[2], *pw[2];
};

static int ends_open(struct ends *e)
{
	int r = tpt_ctx_new(&daemon_nocma, TP_CONTEXT_NO_CMA, "sr-reader", &e->cr);

	TPT_REQUIRE(r == 0, 1, "reader context: %d", r);
	r = tpt_ctx_new(&daemon_nocma, TP_CONTEXT_NO_CMA, "sr-writer", &e->cw);
	TPT_REQUIRE(r == 0, 1, "writer context: %d", r);
	TPT_REQUIRE(!tp_context_cma_ok(e->cr) && !tp_context_cma_ok(e->cw), 1, "CMA still on");
	r = tp_listen(e->cr, LISTENER, NULL, &e->l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (int i = 0; i < 2; i++) {
		r = tp_connect(e->cw, LISTENER, &e->pw[i]);
		TPT_REQUIRE(r == 0, 1, "connect: %d", r);
		r = tp_listener_accept_sync(e->l, T_MS, &e->pr[i]);
		TPT_REQUIRE(r == 0, 1, "accept: %d", r);
		r = tp_pipe_wait_connected(e->pw[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "connected: %d", r);
	}
	return 0;
}

/* One round: INFLIGHT writes on each pipe, interleaved, then every read, then every completion. */
static int round_run(struct ends *e, unsigned round, struct tpt_done *done)
{
	struct tpt_msg msgs[2][INFLIGHT];
	struct tpt_done_arg args[2][INFLIGHT];
	struct tpt_msg_spec spec;
	int r, bad = 0;

	for (unsigned k = 0; k < INFLIGHT; k++) {
		for (unsigned p = 0; p < 2; p++) {
			spec_of(p, round * INFLIGHT + k, &spec);
			r = tpt_msg_build(e->cw, &spec, TPT_MEM_PRIVATE, &msgs[p][k]);
			TPT_REQUIRE(r == 0, 1, "build: %d", r);
			args[p][k] = (struct tpt_done_arg){ &done[p], round * INFLIGHT + k };
			r = tp_pipe_write(e->pw[p], &msgs[p][k].m, tpt_done_cb, &args[p][k]);
			TPT_REQUIRE(r == 0, 1, "write %u/%u: %s", p, k, tp_last_error());
		}
	}
	for (unsigned k = 0; k < INFLIGHT; k++) {
		for (unsigned p = 0; p < 2; p++) {
			spec_of(p, round * INFLIGHT + k, &spec);
			r = tpt_msg_read_check(e->cr, e->pr[p], &spec, TPT_MEM_PRIVATE, T_MS);
			if (r != 0)
				tpt_log("read pipe %u message %u: %d", p, spec.index, r);
			bad |= r != 0;
		}
	}
	for (unsigned p = 0; p < 2; p++) {
		r = tpt_done_wait(&done[p], (round + 1) * INFLIGHT, T_MS);
		TPT_REQUIRE(r == 0, 1, "writes on pipe %u did not complete", p);
		TPT_REQUIRE(done[p].last_status == 0 && !done[p].order_errors, 1,
			    "pipe %u: status %d, %u out of order", p, done[p].last_status,
			    done[p].order_errors);
	}
	for (unsigned k = 0; k < INFLIGHT; k++)
		for (unsigned p = 0; p < 2; p++)
			tpt_msg_free(e->cw, &msgs[p][k]);
	return bad;
}

static int sr_child(void *arg)
{
	struct ends e = { 0 };
	struct tpt_done done[2];
	unsigned long seen[SEEN_MAX];
	unsigned n_seen = 0;
	int mapped, bw = 0, br = 0;
	uint64_t until;

	(void)arg;
	tpt_done_init(&done[0]);
	tpt_done_init(&done[1]);
	if (ends_open(&e))
		return 1;
	for (unsigned round = 0; round < ROUNDS; round++) {
		if (round_run(&e, round, done))
			return 1;
		mapped = maps_scan(seen, &n_seen);
		TPT_REQUIRE(mapped >= 0 && mapped <= BUFS_BOUND, 1, "round %u: %d staging maps",
			    round, mapped);
		bw = session_buffers("sr-writer");
		br = session_buffers("sr-reader");
		TPT_REQUIRE(bw >= 0 && bw <= BUFS_BOUND && br >= 0 && br <= BUFS_BOUND, 1,
			    "round %u: the daemon holds %d (writer) and %d (reader) buffers", round,
			    bw, br);
	}
	/* Reuse, not churn: the set of staging buffers ever mapped stays small. */
	TPT_REQUIRE(n_seen <= BUFS_BOUND, 1, "%u distinct staging buffers over %u messages",
		    n_seen, ROUNDS * INFLIGHT * 2);
	tpt_log("%u distinct staging buffers over %u messages; last: writer %d, reader %d",
		n_seen, ROUNDS * INFLIGHT * 2, bw, br);
	/* Idle: the free list goes back to the system and the daemon. */
	until = tpt_now_ms() + (uint64_t)T_MS;
	do {
		mapped = maps_scan(seen, &n_seen);
		bw = session_buffers("sr-writer");
		br = session_buffers("sr-reader");
	} while ((mapped || bw || br) && tpt_now_ms() < until);
	TPT_REQUIRE(!mapped && !bw && !br, 1, "idle: %d maps, daemon holds %d + %d buffers",
		    mapped, bw, br);
	for (int i = 0; i < 2; i++) {
		tp_pipe_close(e.pw[i]);
		tp_pipe_close(e.pr[i]);
	}
	tp_listener_close(e.l);
	tp_context_free(e.cw);
	tp_context_free(e.cr);
	return 0;
}

/* One message at a time on one pipe, sizes falling through five size classes, three times. */
static int sr_falling_child(void *arg)
{
	static const size_t falling[] = { 16u << 20, 4u << 20, 1u << 20, 256u << 10, 64u << 10 };
	struct ends e = { 0 };
	struct tpt_done done[1];
	struct tpt_done_arg a;
	struct tpt_msg m;
	struct tpt_msg_spec spec;
	unsigned long seen[SEEN_MAX];
	unsigned n_seen = 0, n = 0;
	int r;

	(void)arg;
	tpt_done_init(&done[0]);
	if (ends_open(&e))
		return 1;
	for (unsigned rep = 0; rep < 3; rep++) {
		for (unsigned i = 0; i < sizeof(falling) / sizeof(falling[0]); i++, n++) {
			spec = (struct tpt_msg_spec){ .pipe = 0, .index = n, .n_tensors = 1 };
			spec.lens[0] = falling[i] + (i == 4);
			r = tpt_msg_build(e.cw, &spec, TPT_MEM_PRIVATE, &m);
			TPT_REQUIRE(r == 0, 1, "build: %d", r);
			a = (struct tpt_done_arg){ &done[0], n };
			r = tp_pipe_write(e.pw[0], &m.m, tpt_done_cb, &a);
			TPT_REQUIRE(r == 0, 1, "write %u: %s", n, tp_last_error());
			r = tpt_msg_read_check(e.cr, e.pr[0], &spec, TPT_MEM_PRIVATE, T_MS);
			TPT_REQUIRE(r == 0, 1, "read %u: %d", n, r);
			r = tpt_done_wait(&done[0], n + 1, T_MS);
			TPT_REQUIRE(r == 0 && done[0].last_status == 0, 1, "write %u: %d", n,
				    done[0].last_status);
			tpt_msg_free(e.cw, &m);
			TPT_REQUIRE(maps_scan(seen, &n_seen) >= 0, 1, "maps");
		}
	}
	/* One buffer per side, plus slack for one that the first message may outgrow. */
	TPT_REQUIRE(n_seen <= 4, 1, "%u distinct staging buffers over %u messages", n_seen, n);
	tpt_log("falling sizes: %u distinct staging buffers over %u messages", n_seen, n);
	tp_pipe_close(e.pw[0]);
	tp_pipe_close(e.pr[0]);
	tp_pipe_close(e.pw[1]);
	tp_pipe_close(e.pr[1]);
	tp_listener_close(e.l);
	tp_context_free(e.cw);
	tp_context_free(e.cr);
	return 0;
}

START_TEST(test_staging_serves_smaller_messages_from_a_larger_free_buffer)
{
	pid_t pid = tpt_fork(sr_falling_child, NULL);

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, 3 * T_MS, "stagereuse child"));
}
END_TEST

START_TEST(test_staging_reuses_bounded_buffers_and_releases_them_when_idle)
{
	pid_t pid = tpt_fork(sr_child, NULL);

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, 3 * T_MS, "stagereuse child"));
}
END_TEST

static void setup(void)
{
	const char *args[] = { "--no-cma", NULL };

	ck_assert_int_eq(tpt_daemon_start(&daemon_nocma, args), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&daemon_nocma), 0);
}

static Suite *stagereuse_suite(void)
{
	Suite *s = suite_create("stagereuse");
	TCase *tc = tcase_create("staging");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_staging_reuses_bounded_buffers_and_releases_them_when_idle);
	tcase_add_test(tc, test_staging_serves_smaller_messages_from_a_larger_free_buffer);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(stagereuse_suite());
}
