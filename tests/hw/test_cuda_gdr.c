/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: cuda_gdr, CUDA tensors between two daemons that treat each other as remote hosts
 * (the peer fixture: --peer-force-cross-host on loopback), moved by RDMA writes between the
 * daemons. CUDA -> CUDA at 1 B, 4 KiB, 1 MiB + 7 inside larger allocations on both sides, and
 * 64 MiB; shared buffer -> CUDA and CUDA -> shared buffer; all arrive intact and both daemons
 * count them under cuda_gdr in `tpipctl stats` and each registration's method (dma-buf or
 * device address) in `tpipctl status`, and `tpipctl pipes` on the reader's daemon shows
 * cuda_gdr(cuda>cuda) for an open pipe. Private memory cannot be registered: such a
 * tensor still arrives, staged over the data connections (cuda_basic). A write the RDMA device
 * fails reaches both clients as an error; both daemons stay up, turn RDMA off on that link
 * (`tpipctl peers` says why) and move the next message over the data connections. Slow IPC
 * opens (an event's on both daemons, the reader's memory on its daemon, the writer's on its
 * daemon) hold up no other session, and a writer's registration that fails once its mapping
 * opened sends the message over the data connections. On the stand-ins peer memory is on, for
 * the allocations that are not whole pages (they have no dma-buf; test_cuda_dmabuf runs
 * without peer memory).
 * Needs a CUDA device and an active RDMA port (or the stand-ins of `--setup fakecuda`); skips
 * (77) with the reason otherwise.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "hwtest.h"
#include "ipeer.h"
#include "tpv.h"

#define MIB (1u << 20)

/* @d's one link says RDMA is ready, has RDMA-written at least @sent bytes and received at least
 * @received. */
static void expect_link_rdma(const struct tpt_daemon *d, uint64_t sent, uint64_t received)
{
	struct tpt_link l;

	ck_assert_int_eq(tpt_peer_links(d, &l), 1);
	ck_assert_msg(strncmp(l.rdma, "ready", 5) == 0, "link rdma: '%s'", l.rdma);
	ck_assert_uint_ge(l.rdma_bytes_sent, sent);
	ck_assert_uint_ge(l.rdma_bytes_received, received);
}

/* Runs @cases from a client of daemon A to a listener @name on daemon B. */
static bool cross(const char *name, const struct hwt_case *cases, size_t n, unsigned seed)
{
	char addr[128];
	struct hwt_xfer x = { .d = &tpt_peer_b, .name = name, .cases = cases, .n_cases = n,
			      .seed = seed, .writer_d = &tpt_peer_a,
			      .address = tpt_peer_address(&tpt_peer_b, name, addr, sizeof(addr)) };

	return hwt_xfer_run(&x);
}

static void expect_gdr_bytes(uint64_t before_a, uint64_t before_b, uint64_t want)
{
	uint64_t a = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr") - before_a;
	uint64_t b = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr") - before_b;

	ck_assert_msg(a == want && b == want,
		      "cuda_gdr moved %llu bytes on the sender's daemon and %llu on the reader's, "
		      "want %llu on both", (unsigned long long)a, (unsigned long long)b,
		      (unsigned long long)want);
}

/* @key of `tpipctl --json status` of @d. */
static uint64_t status_u64(const struct tpt_daemon *d, const char *key)
{
	uint64_t v;

	tpt_status_u64s(d, &key, 1, &v);
	return v;
}

/* CUDA regions @d registered: from their client's dma-buf, the daemon's own, or by address. */
static uint64_t reg_methods(const struct tpt_daemon *d)
{
	return status_u64(d, "rdma_reg_client_dmabuf") + status_u64(d, "rdma_reg_dmabuf") +
	       status_u64(d, "rdma_reg_addr");
}

/* Once the clients have gone, @d keeps no registration and no mapping of their CUDA memory
 * (the registration cache must not hold an allocation its client left), having registered
 * @misses segments since @misses0. */
static void expect_nothing_kept(const struct tpt_daemon *d, uint64_t misses0, uint64_t misses)
{
	/* the daemon sees the clients leave on its own time */
	for (int i = 0; i < TPT_SCALED_MS(10000) / 20 && status_u64(d, "cuda_mappings"); i++)
		usleep(20000);
	ck_assert_uint_eq(status_u64(d, "rdma_cache_regions"), 0);
	ck_assert_uint_eq(status_u64(d, "rdma_cache_bytes"), 0);
	ck_assert_uint_eq(status_u64(d, "cuda_mappings"), 0);
	ck_assert_uint_eq(status_u64(d, "rdma_cache_misses") - misses0, misses);
}

/*
 * The lifetime contract across hosts: each client frees its memory as soon as its WriteDone or
 * ReadDone arrives (after tp_cuda_release()), so a daemon still mapping it then would close a
 * stale mapping later, which the strict stand-in answers with a sticky error, and the context
 * reset that follows unmaps every transfer in flight on the device (an RDMA write from or into
 * it then fails with EFAULT). Neither daemon may have met one.
 */
static void expect_no_stale_close(const struct tpt_daemon *d)
{
	int n = tpt_daemon_log_count(d, "primary context reset after a sticky error");

	ck_assert_msg(n == 0, "%s: %d context resets: a mapping outlived its transfer", d->socket,
		      n);
}

START_TEST(test_cuda_gdr_cuda_to_cuda_across_daemons)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side legacy = { .mem = HWT_CUDA, .device = 0 };
	struct hwt_side inside = { .mem = HWT_CUDA, .device = 0, .stream = true,
				   .pad_before = MIB + 123, .pad_after = MIB - 5 };
	struct hwt_case cases[] = {
		{ .len = 1, .w = gpu, .r = gpu },
		{ .len = 4096, .w = legacy, .r = gpu },
		{ .len = MIB + 7, .w = inside, .r = inside },
		{ .len = 64 * MIB, .w = gpu, .r = legacy },
	};
	uint64_t a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	uint64_t b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");
	uint64_t ma = status_u64(&tpt_peer_a, "rdma_cache_misses");
	uint64_t mb = status_u64(&tpt_peer_b, "rdma_cache_misses");
	uint64_t ra = reg_methods(&tpt_peer_a), rb = reg_methods(&tpt_peer_b);

	ck_assert(cross("gdr-dd", cases, 4, 70));
	/* each region's registration method is counted (tpipctl status) */
	ck_assert_uint_eq(reg_methods(&tpt_peer_a) - ra, 4);
	ck_assert_uint_eq(reg_methods(&tpt_peer_b) - rb, 4);
	expect_gdr_bytes(a0, b0, 1 + 4096 + MIB + 7 + 64 * MIB);
	expect_nothing_kept(&tpt_peer_a, ma, 4);
	expect_nothing_kept(&tpt_peer_b, mb, 4);
	expect_no_stale_close(&tpt_peer_a);
	expect_no_stale_close(&tpt_peer_b);
	expect_link_rdma(&tpt_peer_a, 1 + 4096 + MIB + 7 + 64 * MIB, 0);
	expect_link_rdma(&tpt_peer_b, 0, 1 + 4096 + MIB + 7 + 64 * MIB);
	ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));
}
END_TEST

/*
 * The rdma-cache budget caps pinned host memory only: with a 1 MiB budget, a 4 MiB CUDA
 * allocation is never evicted for it (under the default lifetime contract its registration goes
 * with the transfer, as its mapping does).
 */
START_TEST(test_cuda_gdr_budget_leaves_gpu_memory)
{
	const char *const *t = tpt_peer_args();
	const char *args[8] = { t[0], t[1], t[2], t[3], "--rdma-cache", "1M" };
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_case cases[] = { { .len = 4 * MIB, .w = gpu, .r = gpu } };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, args), 0);
	ck_assert(cross("gdr-budget", cases, 1, 71));
	expect_gdr_bytes(0, 0, 4 * MIB);
	expect_nothing_kept(&tpt_peer_a, 0, 1);
	expect_nothing_kept(&tpt_peer_b, 0, 1);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "rdma_cache_evictions"), 0);
	ck_assert_uint_eq(status_u64(&tpt_peer_b, "rdma_cache_evictions"), 0);
}
END_TEST

/* @len bytes from CPU memory @cpu to CUDA and back; cuda_gdr must count @rdma_each per message. */
static void cpu_and_cuda(const char *name, enum hwt_mem cpu, size_t len, unsigned seed,
			 uint64_t rdma_each)
{
	struct hwt_side host = { .mem = cpu };
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = seed % 2 };
	struct hwt_case cases[] = {
		{ .len = len, .w = host, .r = gpu },
		{ .len = len, .w = gpu, .r = host },
	};
	uint64_t a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	uint64_t b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");

	ck_assert(cross(name, cases, 2, seed));
	expect_gdr_bytes(a0, b0, 2 * rdma_each);
	/* over the data connections too (private memory), the mappings go before completion */
	expect_no_stale_close(&tpt_peer_a);
	expect_no_stale_close(&tpt_peer_b);
}

START_TEST(test_cuda_gdr_shared_buffers_and_cuda)
{
	cpu_and_cuda("gdr-shm", HWT_CPU_SHM, 3 * MIB + 1, 71, 3 * MIB + 1);
}
END_TEST

/* Private memory is not registrable: the tensor goes over the data connections instead. */
START_TEST(test_cuda_gdr_private_memory_is_staged)
{
	cpu_and_cuda("gdr-priv", HWT_CPU_PRIVATE, 2 * MIB + 3, 72, 0);
}
END_TEST

/*
 * One 1 MiB CUDA tensor from a client of A to one of B. @arg: expect failure (the device fails
 * the writes: both ends must see an error naming cuda_gdr), or success (then, with the pipe
 * still open, `tpipctl pipes` on B must name @expect_channel for the cuda>cuda pair).
 */
static struct tpt_sync f_ready, f_done;
static const char *expect_channel = "cuda_gdr(cuda>cuda)";

static int fault_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "gdr-fault-w",
			     .where = tpt_peer_address(&tpt_peer_b, "gdr-fault", addr, sizeof(addr)),
			     .ready = &f_ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = MIB };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	HWT_CU(&cu, cuMemAlloc(&p, MIB), 1);
	TPT_REQUIRE(hwt_dev_set(&cu, p, 0x5a, MIB) == 0, 1, "memset");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	if (arg) {
		TPT_REQUIRE(r < 0, 1, "the write succeeded though the device failed it");
		printf("writer: %d %s\n", r, tp_last_error());
	} else {
		TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	}
	tpt_sync_wait(&f_done, HWT_T_MS);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

static int fault_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "gdr-fault-r", .where = "gdr-fault",
			     .ready = &f_ready, .timeout_ms = HWT_T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	HWT_CU(&cu, cuMemAlloc(&p, MIB), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_descriptor_sync(e.p, HWT_T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	r = tp_pipe_read_sync(e.p, d, &a);
	if (arg) {
		TPT_REQUIRE(r < 0, 1, "the read succeeded though the device failed the write");
		TPT_REQUIRE(strstr(tp_last_error(), "cuda_gdr") != NULL, 1, "reader's error: %s",
			    tp_last_error());
		printf("reader: %d %s\n", r, tp_last_error());
	} else {
		char *pipes;

		TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
		TPT_REQUIRE(hwt_dev_expect_byte(&cu, p, 0x5a, MIB, "tensor") == 0, 1, "bytes");
		pipes = hwt_ctl(&tpt_peer_b, "pipes", false);
		TPT_REQUIRE(pipes && strstr(pipes, expect_channel), 1,
			    "tpipctl pipes on the reader's daemon:\n%s", pipes ? pipes : "failed");
		printf("%s", pipes);
		free(pipes);
	}
	tpt_sync_post(&f_done, 0);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

static bool one_tensor(bool fail, const char *channel)
{
	bool ok;

	expect_channel = channel;
	ck_assert_int_eq(tpt_sync_init(&f_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&f_done), 0);
	ok = tpt_run_pair(fault_reader, fault_writer, fail ? &f_done : NULL, 2 * HWT_T_MS);
	tpt_sync_done(&f_ready);
	tpt_sync_done(&f_done);
	return ok;
}

START_TEST(test_cuda_gdr_pipes_show_the_channel)
{
	uint64_t a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	uint64_t b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");

	ck_assert(one_tensor(false, "cuda_gdr(cuda>cuda)"));
	expect_gdr_bytes(a0, b0, MIB);
}
END_TEST

/*
 * The RDMA device fails the sender's writes (the stand-in's FAKEVERBS_FAIL_WRITES): both clients
 * see the error and the daemons stay up; RDMA is then off on that link (both daemons say why)
 * and the next tensor crosses over the data connections; a new link (daemon A restarted, writes
 * working again) moves its tensor by RDMA.
 */
START_TEST(test_cuda_gdr_device_error_reaches_both_clients)
{
	uint64_t a0, b0;

	/* Only daemon A (the sender) fails its writes. */
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	setenv("FAKEVERBS_FAIL_WRITES", "1", 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0);
	unsetenv("FAKEVERBS_FAIL_WRITES");
	ck_assert(one_tensor(true, NULL));
	ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));

	ck_assert(one_tensor(false, "cuda_basic(cuda>cuda)"));
	for (int k = 0; k < 2; k++) {
		struct tpt_link l;

		ck_assert_int_eq(tpt_peer_links(k ? &tpt_peer_b : &tpt_peer_a, &l), 1);
		printf("daemon %c: rdma '%s'\n", k ? 'B' : 'A', l.rdma);
		ck_assert_msg(strncmp(l.rdma, "off: ", 5) == 0 && strstr(l.rdma, "RDMA write failed"),
			      "daemon %c: rdma '%s'", k ? 'B' : 'A', l.rdma);
	}

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0);
	a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");
	ck_assert(one_tensor(false, "cuda_gdr(cuda>cuda)"));
	expect_gdr_bytes(a0, b0, MIB);
}
END_TEST

/* ---- a slow IPC event open blocks no other session (stand-ins only) ---------------------- */

#define SLOW_MS TPT_SCALED_MS(3000)
static char slow_dir[] = "/tmp/tpipd-gdr-slow-XXXXXX";

static void slow_start(void)
{
	char delay[64];

	ck_assert_ptr_nonnull(mkdtemp(slow_dir));
	snprintf(delay, sizeof(delay), "cuIpcOpenEventHandle:%d", SLOW_MS);
	setenv("FAKECUDA_FAULT_DIR", slow_dir, 1);
	setenv("FAKECUDA_DELAY", delay, 1); /* for the daemons; clients open no IPC event */
	tpt_peer_fixture_start();
	unsetenv("FAKECUDA_DELAY");
}

static void slow_stop(void)
{
	char path[128];

	tpt_peer_fixture_stop();
	snprintf(path, sizeof(path), "%s/pending-cuIpcOpenEventHandle", slow_dir);
	unlink(path);
	rmdir(slow_dir);
}

static bool slow_pending(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/pending-cuIpcOpenEventHandle", slow_dir);
	return access(path, F_OK) == 0;
}

static int slow_gpu_pair(void *arg)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_case c = { .len = MIB, .w = gpu, .r = gpu };

	return cross("gdr-slow", &c, 1, 91) ? 0 : 1;
}

static void slow_cpu_spec(unsigned index, struct tpt_msg_spec *ret)
{
	*ret = (struct tpt_msg_spec){ .index = index, .n_payloads = 1, .lens = { 100 } };
}

/* Each daemon polls the client's CUDA event before its RDMA writes or its offer: opening the
 * event's IPC handle takes SLOW_MS here, and meanwhile both daemons serve other clients. */
START_TEST(test_cuda_gdr_slow_event_open_blocks_no_other_session)
{
	struct tpt_xfer xa = { .d = &tpt_peer_a, .name = "slow-cpu-a", .n_msgs = 8,
			       .spec = slow_cpu_spec };
	struct tpt_xfer xb = { .d = &tpt_peer_b, .name = "slow-cpu-b", .n_msgs = 8,
			       .spec = slow_cpu_spec };
	struct timespec step = { 0, 5 * 1000000L };
	pid_t gpu;
	char *out;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: a slow driver call needs the fakecuda stand-in\n");
		return;
	}
	gpu = tpt_fork(slow_gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	for (int i = 0; i < TPT_SCALED_MS(30000) / 5 && !slow_pending(); i++)
		nanosleep(&step, NULL); /* a condition with a deadline */
	ck_assert_msg(slow_pending(), "no daemon opened the client's CUDA event");
	ck_assert_msg(tpt_xfer_run(&xa), "daemon A held other sessions up");
	ck_assert_msg(tpt_xfer_run(&xb), "daemon B held other sessions up");
	out = hwt_ctl(&tpt_peer_a, "status", false);
	ck_assert_msg(out, "tpipctl status on A did not answer");
	free(out);
	ck_assert_msg(slow_pending(), "the slow open ended before the other sessions were served: "
				      "it held them up (or SLOW_MS is too short here)");
	ck_assert(tpt_wait_ok(gpu, TPT_SCALED_MS(60000), "GPU pair"));
}
END_TEST

/*
 * Issue 28 item 10 (its receive side): the reader's daemon registers the reader's CUDA memory
 * for RDMA once its mapping is open, and opens it (cuIpcOpenMemHandle, SLOW_MS here, on daemon
 * B only) on the CUDA layer's worker, never on its event loop: meanwhile daemon B serves other
 * sessions and answers tpipctl, and the tensor then crosses by cuda_gdr.
 */
static bool map_pending(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/pending-cuIpcOpenMemHandle", slow_dir);
	return access(path, F_OK) == 0;
}

START_TEST(test_cuda_gdr_slow_map_open_blocks_no_other_session)
{
	struct tpt_xfer xb = { .d = &tpt_peer_b, .name = "slow-map-cpu", .n_msgs = 8,
			       .spec = slow_cpu_spec };
	struct timespec step = { 0, 5 * 1000000L };
	uint64_t b0;
	char delay[64], *out;
	pid_t gpu;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: a slow driver call needs the fakecuda stand-in\n");
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(slow_dir));
	snprintf(delay, sizeof(delay), "cuIpcOpenMemHandle:%d", SLOW_MS);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	setenv("FAKECUDA_FAULT_DIR", slow_dir, 1);
	setenv("FAKECUDA_DELAY", delay, 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, tpt_peer_args()), 0);
	unsetenv("FAKECUDA_DELAY");
	unsetenv("FAKECUDA_FAULT_DIR");
	b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");
	gpu = tpt_fork(slow_gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	for (int i = 0; i < TPT_SCALED_MS(30000) / 5 && !map_pending(); i++)
		nanosleep(&step, NULL); /* a condition with a deadline */
	ck_assert_msg(map_pending(), "daemon B opened no mapping of the reader's memory");
	ck_assert_msg(tpt_xfer_run(&xb), "daemon B held other sessions up");
	out = hwt_ctl(&tpt_peer_b, "status", false);
	ck_assert_msg(out, "tpipctl status on B did not answer");
	free(out);
	ck_assert_msg(map_pending(), "the slow open ended before the other sessions were served: "
				     "it held them up (or SLOW_MS is too short here)");
	ck_assert(tpt_wait_ok(gpu, TPT_SCALED_MS(60000), "GPU pair"));
	ck_assert_uint_eq(tpt_channel_bytes(&tpt_peer_b, "cuda_gdr") - b0, MIB);
	rmdir(slow_dir);
}
END_TEST

/*
 * Restarts daemon A (the writer's) with its IPC memory opens taking @ms (pending marker in
 * slow_dir, made here) and @env ("NAME=VALUE" pairs, NULL-terminated) in its environment.
 */
static void writer_daemon_slow(int ms, const char *const *env)
{
	char delay[64];

	ck_assert_ptr_nonnull(mkdtemp(slow_dir));
	snprintf(delay, sizeof(delay), "cuIpcOpenMemHandle:%d", ms);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	setenv("FAKECUDA_FAULT_DIR", slow_dir, 1);
	setenv("FAKECUDA_DELAY", delay, 1);
	for (size_t i = 0; env && env[i]; i++)
		ck_assert_int_eq(putenv((char *)env[i]), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0);
	unsetenv("FAKECUDA_DELAY");
	unsetenv("FAKECUDA_FAULT_DIR");
}

/* Waits (a condition with a deadline) for a daemon to be inside a slow IPC memory open. */
static bool map_pending_wait(void)
{
	struct timespec step = { 0, 5 * 1000000L };

	for (int i = 0; i < TPT_SCALED_MS(30000) / 5 && !map_pending(); i++)
		nanosleep(&step, NULL);
	return map_pending();
}

/*
 * Issue 28 item 10 (its send side): the writer's daemon registers the writer's CUDA memory for
 * RDMA once its mapping is open, and opens it (cuIpcOpenMemHandle, SLOW_MS here, on daemon A
 * only) on the CUDA layer's worker when the reader's offer arrives, never on its event loop:
 * meanwhile daemon A serves other sessions and answers tpipctl, and the tensor then crosses by
 * cuda_gdr. Fails with the open and registration back in tpb_rdma_send() on the loop.
 */
START_TEST(test_cuda_gdr_slow_writer_map_open_blocks_no_other_session)
{
	struct tpt_xfer xa = { .d = &tpt_peer_a, .name = "slow-wmap-cpu", .n_msgs = 8,
			       .spec = slow_cpu_spec };
	uint64_t a0;
	char *out;
	pid_t gpu;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: a slow driver call needs the fakecuda stand-in\n");
		return;
	}
	writer_daemon_slow(SLOW_MS, NULL);
	a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	gpu = tpt_fork(slow_gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	ck_assert_msg(map_pending_wait(), "daemon A opened no mapping of the writer's memory");
	ck_assert_msg(tpt_xfer_run(&xa), "daemon A held other sessions up");
	out = hwt_ctl(&tpt_peer_a, "status", false);
	ck_assert_msg(out, "tpipctl status on A did not answer");
	free(out);
	ck_assert_msg(map_pending(), "the slow open ended before the other sessions were served: "
				     "it held them up (or SLOW_MS is too short here)");
	ck_assert(tpt_wait_ok(gpu, TPT_SCALED_MS(60000), "GPU pair"));
	ck_assert_uint_eq(tpt_channel_bytes(&tpt_peer_a, "cuda_gdr") - a0, MIB);
	rmdir(slow_dir);
}
END_TEST

/*
 * Issue 28 item 10 (registration): registering a client's CUDA memory for RDMA (the dma-buf
 * export, ibv_reg_dmabuf_mr, ibv_reg_mr: each SLOW_MS here, on daemon @d only) runs on the
 * registration worker, never on the event loop: meanwhile @d serves other sessions and answers
 * tpipctl, and the tensor then crosses by cuda_gdr. Fails with the registration back on the
 * loop (tpb_rdma_reg_make() making the region in place).
 */
static bool reg_pending(void)
{
	char a[128], b[128];

	snprintf(a, sizeof(a), "%s/pending-ibv_reg_mr", slow_dir);
	snprintf(b, sizeof(b), "%s/pending-ibv_reg_dmabuf_mr", slow_dir);
	return access(a, F_OK) == 0 || access(b, F_OK) == 0;
}

static void slow_registration(struct tpt_daemon *d, const char *name)
{
	struct tpt_xfer x = { .d = d, .name = name, .n_msgs = 8, .spec = slow_cpu_spec };
	struct timespec step = { 0, 5 * 1000000L };
	char delay[96], *out;
	uint64_t c0;
	pid_t gpu;

	if (!getenv("TPIPD_VERBS_LIBRARY") || !strstr(getenv("TPIPD_VERBS_LIBRARY"), "fakeverbs")) {
		printf("SKIP: a slow registration needs the fakeverbs stand-in\n");
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(slow_dir));
	snprintf(delay, sizeof(delay), "ibv_reg_mr:%d,ibv_reg_dmabuf_mr:%d", SLOW_MS, SLOW_MS);
	ck_assert_int_eq(tpt_daemon_stop(d), 0);
	setenv("FAKEVERBS_DELAY_DIR", slow_dir, 1);
	setenv("FAKEVERBS_DELAY", delay, 1);
	ck_assert_int_eq(tpt_daemon_start_peer(d, tpt_peer_args()), 0);
	unsetenv("FAKEVERBS_DELAY");
	unsetenv("FAKEVERBS_DELAY_DIR");
	c0 = tpt_channel_bytes(d, "cuda_gdr");
	gpu = tpt_fork(slow_gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	for (int i = 0; i < TPT_SCALED_MS(30000) / 5 && !reg_pending(); i++)
		nanosleep(&step, NULL); /* a condition with a deadline */
	ck_assert_msg(reg_pending(), "the daemon registered no CUDA memory");
	ck_assert_msg(tpt_xfer_run(&x), "the daemon held other sessions up");
	out = hwt_ctl(d, "status", false);
	ck_assert_msg(out, "tpipctl status did not answer");
	free(out);
	ck_assert_msg(reg_pending(), "the slow registration ended before the other sessions were "
				     "served: it held them up (or SLOW_MS is too short here)");
	ck_assert(tpt_wait_ok(gpu, TPT_SCALED_MS(60000), "GPU pair"));
	ck_assert_uint_eq(tpt_channel_bytes(d, "cuda_gdr") - c0, MIB);
	rmdir(slow_dir);
}

/* The writer's daemon (its sources). */
START_TEST(test_cuda_gdr_slow_writer_registration_blocks_no_other_session)
{
	slow_registration(&tpt_peer_a, "slow-wreg-cpu");
}
END_TEST

/* The reader's daemon (its destination, before its offer). */
START_TEST(test_cuda_gdr_slow_reader_registration_blocks_no_other_session)
{
	slow_registration(&tpt_peer_b, "slow-rreg-cpu");
}
END_TEST

/*
 * The send side's registration fails after the transfer was set up for RDMA (daemon A's
 * mapping opened off the loop, then no way to register it: the stand-in refuses every dma-buf
 * and has no peer memory): the message goes over the data connections instead, intact, and
 * counts under mpt, not cuda_gdr; the link keeps RDMA (nothing was written).
 */
START_TEST(test_cuda_gdr_writer_registration_failure_uses_the_stripe)
{
	static const char *const env[] = { "FAKEVERBS_PEER_MEMORY=0", "FAKEVERBS_DMABUF_ERRNO=22",
					   NULL };
	uint64_t a0, m0;
	pid_t gpu;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: a slow driver call needs the fakecuda stand-in\n");
		return;
	}
	writer_daemon_slow(TPT_SCALED_MS(300), env);
	setenv("FAKEVERBS_PEER_MEMORY", "1", 1);
	unsetenv("FAKEVERBS_DMABUF_ERRNO");
	a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	m0 = tpt_channel_bytes(&tpt_peer_a, "mpt");
	gpu = tpt_fork(slow_gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	ck_assert_msg(map_pending_wait(), "daemon A opened no mapping of the writer's memory");
	ck_assert(tpt_wait_ok(gpu, TPT_SCALED_MS(60000), "GPU pair"));
	ck_assert_uint_eq(tpt_channel_bytes(&tpt_peer_a, "cuda_gdr") - a0, 0);
	ck_assert_uint_eq(tpt_channel_bytes(&tpt_peer_a, "mpt") - m0, MIB);
	expect_link_rdma(&tpt_peer_a, 0, 0);
	expect_no_stale_close(&tpt_peer_a); /* the stripe's mappings went before completion */
	expect_no_stale_close(&tpt_peer_b);
	rmdir(slow_dir);
}
END_TEST

/*
 * Issue 28 item 3: RDMA writes into GPU memory can still be in flight when the writer's
 * completion arrives (the stand-in's FAKEVERBS_WRITE_LAG holds their bytes back until the
 * reader's daemon flushes, on a device that does not order them, FAKECUDA_RDMA_ORDERING=0):
 * the reader's daemon flushes before it says ReadDone, so every tensor arrives intact.
 */
START_TEST(test_cuda_gdr_writes_are_flushed_before_read_done)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side legacy = { .mem = HWT_CUDA, .device = 0 };
	struct hwt_case cases[] = {
		{ .len = 1, .w = gpu, .r = gpu },
		{ .len = MIB + 7, .w = legacy, .r = gpu },
		{ .len = 4 * MIB, .w = gpu, .r = legacy },
	};
	uint64_t a0, b0;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0); /* the writer's provider lags */
	setenv("FAKEVERBS_WRITE_LAG", "1", 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0);
	unsetenv("FAKEVERBS_WRITE_LAG");
	a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");
	ck_assert(cross("gdr-lag", cases, 3, 71));
	expect_gdr_bytes(a0, b0, 1 + MIB + 7 + 4 * MIB);

	/* A reader's device without cuFlushGPUDirectRDMAWrites(): a read-back lands them. */
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	setenv("FAKECUDA_NO_RDMA_FLUSH", "1", 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, tpt_peer_args()), 0);
	unsetenv("FAKECUDA_NO_RDMA_FLUSH");
	a0 = tpt_channel_bytes(&tpt_peer_a, "cuda_gdr");
	b0 = tpt_channel_bytes(&tpt_peer_b, "cuda_gdr");
	ck_assert(cross("gdr-lag2", cases, 3, 72));
	expect_gdr_bytes(a0, b0, 1 + MIB + 7 + 4 * MIB);
}
END_TEST

static Suite *cuda_gdr_suite(bool stand_in)
{
	Suite *s = suite_create("cuda_gdr");
	TCase *tc = tcase_create("cuda_gdr");

	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_add_test(tc, test_cuda_gdr_cuda_to_cuda_across_daemons);
	tcase_add_test(tc, test_cuda_gdr_budget_leaves_gpu_memory);
	tcase_add_test(tc, test_cuda_gdr_shared_buffers_and_cuda);
	tcase_add_test(tc, test_cuda_gdr_private_memory_is_staged);
	tcase_add_test(tc, test_cuda_gdr_pipes_show_the_channel);
	if (stand_in) { /* failures are injected through the stand-in verbs provider */
		tcase_add_test(tc, test_cuda_gdr_device_error_reaches_both_clients);
		tcase_add_test(tc, test_cuda_gdr_writes_are_flushed_before_read_done);
		tcase_add_test(tc, test_cuda_gdr_slow_map_open_blocks_no_other_session);
		tcase_add_test(tc, test_cuda_gdr_slow_writer_map_open_blocks_no_other_session);
		tcase_add_test(tc, test_cuda_gdr_writer_registration_failure_uses_the_stripe);
		tcase_add_test(tc, test_cuda_gdr_slow_writer_registration_blocks_no_other_session);
		tcase_add_test(tc, test_cuda_gdr_slow_reader_registration_blocks_no_other_session);
	}
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	if (stand_in) {
		TCase *slow = tcase_create("cuda_gdr_slow");

		tcase_add_checked_fixture(slow, slow_start, slow_stop);
		tcase_add_test(slow, test_cuda_gdr_slow_event_open_blocks_no_other_session);
		tcase_set_timeout(slow, 300);
		suite_add_tcase(s, slow);
	}
	return s;
}

int main(void)
{
	const char *lib = getenv("TPIPD_VERBS_LIBRARY");
	const struct tpv_ops *ops;
	char why[256] = "";

	ops = tpv_ops_load(why, sizeof(why));
	if (!ops || !tpv_probe(ops, why, sizeof(why))) {
		printf("SKIP: cuda_gdr needs an active RDMA port: %s\n", why);
		return getenv("TPT_HW_REQUIRE") ? 1 : HWT_EXIT_SKIP;
	}
	/* Allocations that are not whole pages have no dma-buf (fakecuda is as strict as the
	 * driver): these cases register them by address, as with nvidia-peermem loaded.
	 * test_cuda_dmabuf runs without it. */
	if (lib && strstr(lib, "fakeverbs"))
		setenv("FAKEVERBS_PEER_MEMORY", "1", 1);
	return hwt_main(cuda_gdr_suite(lib && strstr(lib, "fakeverbs")), 1);
}
