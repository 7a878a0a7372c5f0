/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: the daemon's fan-out of a CUDA tensor (tp_set_broadcast(), docs/fanout.md). A
 * server on daemon A broadcasts tensors in device memory (1 MiB + 3, 4 KiB + 1, 8 MiB + 5) to
 * two readers on A and two behind daemon B (the peer fixture: another host on loopback); every
 * reader checks each message byte for byte, in CPU memory or in CUDA memory (the writer's bytes
 * still queued on its stream when it broadcasts: each delivery waits for them). The broadcast is
 * the daemon's (tp_set_last_fanout()), the link from A to B carries each tensor once, not once
 * per remote reader (`tpipctl --json peers`, data and RDMA bytes), and B stages each once
 * (`bcast_staged_bytes`). Over B's staging limit each remote target is read on its own, as a
 * daemon that cannot stage does, and still arrives intact. A reader killed after its first
 * descriptor fails only its own deliveries. Needs a CUDA device (or the fakecuda stand-in);
 * skips (77) with the reason otherwise.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include "hwtest.h"
#include "ipeer.h"

#define MIB ((size_t)1 << 20)
#define NAME "hw-fanout"
#define READERS 4 /* 0, 1 on daemon A; 2, 3 on daemon B; odd ones read into CUDA memory */
#define REMOTE 2

static const size_t sizes[] = { MIB + 3, 4096 + 1, 8 * MIB + 5 };
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))
#define SEED 2500

static struct tpt_sync ready;
static int victim = -1; /* reader killed after its first descriptor, -1: none */

static bool is_remote(unsigned who)
{
	return who >= READERS - REMOTE;
}

/* Reads one message into @who's memory (CPU, or CUDA for odd readers) and checks it. */
static int reader_one(unsigned who, const struct hwt_cuda *cu, struct tp_pipe *p,
		      struct tp_descriptor *d, uint8_t *host, uint8_t *want)
{
	CUdeviceptr dev = 0;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = host };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	unsigned k;
	size_t len;
	int r;

	TPT_REQUIRE(d->metadata_len == 1 && d->n_tensors == 1 && d->n_payloads == 0, 1, "shape");
	k = *(const uint8_t *)d->metadata;
	len = d->tensors[0].length;
	TPT_REQUIRE(k < N_SIZES && len == sizes[k], 1, "reader %u: message %u of %zu bytes", who,
		    k, len);
	TPT_REQUIRE(d->tensors[0].device.type == TP_DEVICE_CUDA, 1, "reader %u: writer's device",
		    who);
	if (cu) {
		HWT_CU(cu, cuMemAlloc(&dev, len), 1);
		slot.device = (struct tp_device){ TP_DEVICE_CUDA, 0 };
		slot.data = hwt_ptr(dev);
	}
	r = tp_pipe_read_sync(p, d, &a);
	TPT_REQUIRE(r == 0, 1, "reader %u: read %u: %d %s", who, k, r, tp_last_error());
	tpt_fill(want, len, SEED + k);
	if (cu) {
		r = hwt_dev_expect(cu, dev, want, len, "broadcast into CUDA memory");
		cu->api->cuMemFree(dev);
		TPT_REQUIRE(r == 0, 1, "reader %u: message %u differs", who, k);
	} else {
		TPT_REQUIRE(hwt_same(host, want, len, "broadcast into CPU memory"), 1,
			    "reader %u: message %u differs", who, k);
	}
	printf("reader %u (%s, %s): message %u of %zu bytes intact\n", who,
	       is_remote(who) ? "remote" : "local", cu ? "cuda" : "cpu", k, len);
	return 0;
}

/* Reads every message until the pipe ends, each in order and intact. */
static int reader(void *arg)
{
	unsigned who = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	struct hwt_cuda cu = { 0 };
	uint8_t *host = malloc(8 * MIB + 64), *want = malloc(8 * MIB + 64);
	int r = tpt_sync_wait(&ready, HWT_T_MS), n = 0;

	TPT_REQUIRE(r == 0 && host && want, 1, "server not ready: %d", r);
	if (who % 2)
		TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	if (is_remote(who)) {
		char addr[128];

		r = tpt_ctx_new(&tpt_peer_b, 0, "fan-remote", &ctx);
		if (r == 0)
			r = tp_connect(ctx, tpt_peer_address(&tpt_peer_a, NAME, addr, sizeof(addr)),
				       &p);
	} else {
		r = tpt_ctx_new(&tpt_peer_a, 0, "fan-local", &ctx);
		if (r == 0)
			r = tp_connect(ctx, NAME, &p);
	}
	if (r == 0)
		r = tp_pipe_wait_connected(p, HWT_T_MS);
	TPT_REQUIRE(r == 0, 1, "reader %u: connect: %d %s", who, r, tp_last_error());
	for (;; n++) {
		struct tp_descriptor *d = NULL;

		r = tp_pipe_read_descriptor_sync(p, HWT_T_MS, &d);
		if (r == -EPIPE)
			break;
		TPT_REQUIRE(r == 0, 1, "reader %u: descriptor: %d %s", who, r, tp_last_error());
		if ((int)who == victim)
			raise(SIGKILL);
		TPT_REQUIRE(*(const uint8_t *)d->metadata == n, 1, "reader %u: out of order", who);
		if (reader_one(who, cu.api ? &cu : NULL, p, d, host, want))
			return 1;
	}
	TPT_REQUIRE(n == (int)N_SIZES, 1, "reader %u: %d messages", who, n);
	tp_pipe_close(p);
	tp_context_free(ctx);
	hwt_cuda_close(&cu);
	free(host);
	free(want);
	return 0;
}

static void CUDA_CB slow_fn(void *arg)
{
	struct timespec ts = { 0, 100 * 1000000L };

	(void)arg;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/*
 * Broadcasts message @k from device memory whose bytes are still queued on the writer's stream
 * (behind 100 ms of other work) when the broadcast starts: every delivery must wait for them.
 * Every delivery but the victim's must succeed.
 */
static int server_one(const struct hwt_cuda *cu, struct tp_pipe_set *s, unsigned k,
		      uint8_t *host)
{
	uint8_t md = (uint8_t)k;
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = sizes[k] };
	struct tp_message m = { .metadata = &md, .metadata_len = 1, .tensors = &t,
				.n_tensors = 1 };
	int st[READERS], r;
	CUdeviceptr dev;
	CUstream stream;

	HWT_CU(cu, cuMemAlloc(&dev, sizes[k]), 1);
	TPT_REQUIRE(hwt_dev_set(cu, dev, 0, sizes[k]) == 0, 1, "memset");
	HWT_CU(cu, cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), 1);
	tpt_fill(host, sizes[k], SEED + k);
	HWT_CU(cu, cuLaunchHostFunc(stream, slow_fn, NULL), 1);
	TPT_REQUIRE(hwt_dev_put(cu, dev, host, sizes[k], stream) == 0, 1, "fill");
	t.data = hwt_ptr(dev);
	t.cuda_stream = stream;
	r = tp_set_broadcast(s, &m, HWT_T_MS, st, READERS);
	HWT_CU(cu, cuStreamSynchronize(stream), 1); /* @host is read until here */
	cu->api->cuStreamDestroy(stream);
	cu->api->cuMemFree(dev);
	TPT_REQUIRE(r == READERS - (victim >= 0), 1, "message %u: %d of %d delivered: %s", k, r,
		    READERS, tp_last_error());
	for (unsigned i = 0, failed = 0; i < READERS; i++) {
		failed += st[i] < 0;
		TPT_REQUIRE(st[i] <= 0 && failed <= (victim >= 0), 1, "message %u, pipe %u: %d", k,
			    i, st[i]);
	}
	TPT_REQUIRE(tp_set_last_fanout(s) == TP_FANOUT_DAEMON, 1,
		    "message %u: the library's fan-out (%d), not the daemon's", k,
		    (int)tp_set_last_fanout(s));
	return 0;
}

static int server(void *arg)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	struct hwt_cuda cu = { 0 };
	uint8_t *host = malloc(8 * MIB + 64);
	int r;

	(void)arg;
	TPT_REQUIRE(host && hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	r = tpt_ctx_new(&tpt_peer_a, 0, "fan-server", &ctx);
	if (r == 0)
		r = tp_listen(ctx, NAME, &lo, &l);
	for (unsigned i = 0; i < READERS; i++)
		tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_set_new(ctx, READERS, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, READERS, HWT_T_MS);
	TPT_REQUIRE(r == 0, 1, "pipes: %d %s", r, tp_last_error());
	for (unsigned k = 0; k < N_SIZES; k++)
		if (server_one(&cu, s, k, host))
			return 1;
	tp_set_free(s); /* the readers see their pipes end */
	tp_listener_close(l);
	tp_context_free(ctx);
	hwt_cuda_close(&cu);
	free(host);
	return 0;
}

/* Bytes daemon A sent to B over the data connections and by RDMA. */
static uint64_t link_bytes(void)
{
	struct tpt_link l;

	ck_assert_int_eq(tpt_peer_links(&tpt_peer_a, &l), 1);
	return l.bytes_sent + l.rdma_bytes_sent;
}

/* How B is expected to fan the broadcasts out. */
enum far { FAR_STAGED, FAR_EACH, FAR_VICTIM /* a reader dies: B's counters not checked */ };

/* Runs the server and the readers on a fresh pair of daemons. */
static void run(enum far far)
{
	static const char *const keys[] = { "bcast_staged_bytes", "bcast_unstaged" };
	uint64_t total = 0, staged = 0, before, sent, b[2];
	pid_t pids[READERS];
	bool ok;

	for (unsigned k = 0; k < N_SIZES; k++) {
		total += sizes[k];
		staged += (sizes[k] + 63) & ~(uint64_t)63; /* B aligns its staging */
	}
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	before = 0; /* a fresh pair: no link yet */
	for (unsigned i = 0; i < READERS; i++)
		pids[i] = tpt_fork(reader, (void *)(uintptr_t)i);
	ok = tpt_wait_ok(tpt_fork(server, NULL), 2 * HWT_T_MS, "server");
	for (unsigned i = 0; i < READERS; i++) {
		int status = 0;

		if ((int)i != victim) {
			ok = tpt_wait_ok(pids[i], 2 * HWT_T_MS, "reader") && ok;
			continue;
		}
		ck_assert_int_eq(tpt_wait(pids[i], HWT_T_MS, &status), 0);
		ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	tpt_sync_done(&ready);
	if (!ok) {
		tpt_daemon_dump_log(&tpt_peer_a);
		tpt_daemon_dump_log(&tpt_peer_b);
	}
	ck_assert(ok);
	sent = link_bytes() - before;
	tpt_status_u64s(&tpt_peer_b, keys, 2, b);
	printf("link A->B: %llu bytes for %llu broadcast; B staged %llu, unstaged %llu\n",
	       (unsigned long long)sent, (unsigned long long)total, (unsigned long long)b[0],
	       (unsigned long long)b[1]);
	if (far != FAR_EACH) /* once per broadcast (and framing), not once per remote reader */
		ck_assert_uint_le(sent, total + 2 * MIB);
	if (far == FAR_STAGED) {
		ck_assert_uint_ge(sent, total);
		ck_assert_uint_eq(b[0], staged);
		ck_assert_uint_eq(b[1], 0);
	} else if (far == FAR_EACH) {
		ck_assert_uint_ge(sent, 2 * total);
		ck_assert_uint_eq(b[0], 0);
		ck_assert_uint_eq(b[1], N_SIZES);
	}
	ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));
}

START_TEST(test_cuda_fanout_crosses_the_peer_link_once)
{
	run(FAR_STAGED);
}
END_TEST

/* B with a staging limit below every tensor: each remote target is read over the link on its
 * own (what a far daemon that cannot stage does), into CPU and CUDA memory, intact. */
START_TEST(test_cuda_fanout_far_daemon_without_staging_reads_each_target)
{
	const char *const *t = tpt_peer_args();
	const char *bargs[8] = { t[0], t[1], t[2], t[3], "--bcast-stage-bytes-per-uid", "4096" };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, t, &tpt_peer_b, bargs), 0);
	run(FAR_EACH);
}
END_TEST

/* A remote reader killed after its first descriptor: only its deliveries fail. */
START_TEST(test_cuda_fanout_reader_killed_fails_only_its_delivery)
{
	victim = READERS - 1;
	run(FAR_VICTIM);
}
END_TEST

static Suite *cuda_fanout_suite(void)
{
	Suite *s = suite_create("cuda_fanout");
	TCase *tc = tcase_create("cuda_fanout");

	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_add_test(tc, test_cuda_fanout_crosses_the_peer_link_once);
	tcase_add_test(tc, test_cuda_fanout_far_daemon_without_staging_reads_each_target);
	tcase_add_test(tc, test_cuda_fanout_reader_killed_fails_only_its_delivery);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_fanout_suite(), 1);
}
