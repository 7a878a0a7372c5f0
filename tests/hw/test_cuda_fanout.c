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
 * descriptor fails only its own deliveries. On one host, three readers into CPU memory: A reads
 * each tensor from the device once into its staging (the stand-in counts device-to-host copies,
 * $FAKECUDA_DTOH_LOG), once per reader over its staging limit; a local reader killed fails only
 * its deliveries. The same with a payload in the writer's private memory beside each tensor
 * (staged at the broadcast): still one device read per tensor, within one staging limit for
 * both, and a failed device read fails every reader waiting on it. Needs a CUDA device (or the
 * fakecuda stand-in); skips (77) with the reason otherwise.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include "hwtest.h"
#include "ipeer.h"

#define MIB ((size_t)1 << 20)
#define NAME "hw-fanout"
/* readers at most; by default 0, 1 on daemon A, 2, 3 on daemon B, odd ones into CUDA memory */
#define READERS 4
#define REMOTE 2

static const size_t sizes[] = { MIB + 3, 4096 + 1, 8 * MIB + 5 };
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))
#define SEED 2500

static struct tpt_sync ready;
static int victim = -1; /* reader killed after its first descriptor, -1: none */
static unsigned n_readers = READERS, n_remote = REMOTE; /* the last n_remote are on B */
static bool cuda_odd = true; /* odd readers read into CUDA memory, else all into CPU memory */
/* What becomes of message 0: delivered to all (but a victim); failed for every reader (its
 * staging read meets a forced device fault); or never read (every reader is killed while the
 * staging read waits for the writer's stream: the only message then). */
static enum { FIRST_OK, FIRST_FAILS, FIRST_ONLY_READERS_KILLED } first = FIRST_OK;
static long slow_ms = 100; /* the work queued on the writer's stream before its bytes */
/* Each message also carries a payload of this many bytes in the writer's private memory, which
 * the daemon reads by CMA (0: none): a message with both private bytes and a CUDA tensor. */
static size_t payload_len;
#define PAYLOAD (MIB + 7)
#define PSEED 2600

static bool is_remote(unsigned who)
{
	return who >= n_readers - n_remote;
}

/* Checks the payload of message @k (@payload_len bytes, if any) read into @pl. */
static int payload_check(unsigned who, unsigned k, const uint8_t *pl, uint8_t *want)
{
	if (!payload_len)
		return 0;
	tpt_fill(want, payload_len, PSEED + k);
	TPT_REQUIRE(hwt_same(pl, want, payload_len, "private payload into CPU memory"), 1,
		    "reader %u: payload of message %u differs", who, k);
	return 0;
}

/* Reads one message into @who's memory (CPU, or CUDA for odd readers; its payload, if any,
 * into @pl) and checks it. */
static int reader_one(unsigned who, const struct hwt_cuda *cu, struct tp_pipe *p,
		      struct tp_descriptor *d, uint8_t *host, uint8_t *pl, uint8_t *want)
{
	CUdeviceptr dev = 0;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = host };
	struct tp_slot pslot = { .device = { TP_DEVICE_CPU, 0 }, .data = pl };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1, .payloads = &pslot,
				   .n_payloads = payload_len ? 1 : 0 };
	unsigned k;
	size_t len;
	int r;

	TPT_REQUIRE(d->metadata_len == 1 && d->n_tensors == 1 &&
		    d->n_payloads == a.n_payloads, 1, "shape");
	TPT_REQUIRE(!payload_len || d->payloads[0].length == payload_len, 1, "payload length");
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
	if (first == FIRST_FAILS && k == 0) {
		const char *e = tp_last_error();

		if (cu)
			cu->api->cuMemFree(dev);
		TPT_REQUIRE(r < 0 && strstr(e, "reading the broadcast's source failed"), 1,
			    "reader %u: read %u: %d %s, not the staging read's failure", who, k, r,
			    e);
		printf("reader %u: message 0 failed with its staging read: %s\n", who, e);
		return 0;
	}
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
	if (payload_check(who, k, pl, want))
		return 1;
	printf("reader %u (%s, %s): message %u of %zu bytes intact (and %zu private)\n", who,
	       is_remote(who) ? "remote" : "local", cu ? "cuda" : "cpu", k, len, payload_len);
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
	uint8_t *pl = malloc(PAYLOAD + 64);
	int r = tpt_sync_wait(&ready, HWT_T_MS), n = 0;

	TPT_REQUIRE(r == 0 && host && want && pl, 1, "server not ready: %d", r);
	if (cuda_odd && who % 2)
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
		if (reader_one(who, cu.api ? &cu : NULL, p, d, host, pl, want))
			return 1;
	}
	TPT_REQUIRE(n == (int)N_SIZES, 1, "reader %u: %d messages", who, n);
	tp_pipe_close(p);
	tp_context_free(ctx);
	hwt_cuda_close(&cu);
	free(host);
	free(want);
	free(pl);
	return 0;
}

static void CUDA_CB slow_fn(void *arg)
{
	struct timespec ts = { slow_ms / 1000, slow_ms % 1000 * 1000000L };

	(void)arg;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/*
 * Broadcasts message @k from device memory whose bytes are still queued on the writer's stream
 * (behind @slow_ms of other work) when the broadcast starts: every delivery must wait for them.
 * With @payload_len, a payload in @pl (private memory) goes with it. Every delivery but the
 * victim's must succeed (none of message 0 where @first says so).
 */
static int server_one(const struct hwt_cuda *cu, struct tp_pipe_set *s, unsigned k,
		      uint8_t *host, uint8_t *pl)
{
	uint8_t md = (uint8_t)k;
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = sizes[k] };
	struct tp_payload p = { .data = pl, .length = payload_len };
	struct tp_message m = { .metadata = &md, .metadata_len = 1, .tensors = &t,
				.n_tensors = 1, .payloads = &p, .n_payloads = payload_len ? 1 : 0 };
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
	tpt_fill(pl, payload_len, PSEED + k);
	r = tp_set_broadcast(s, &m, HWT_T_MS, st, n_readers);
	HWT_CU(cu, cuStreamSynchronize(stream), 1); /* @host is read until here */
	cu->api->cuStreamDestroy(stream);
	cu->api->cuMemFree(dev);
	if (k == 0 && first != FIRST_OK) {
		TPT_REQUIRE(r == 0, 1, "message 0: %d of %u delivered", r, n_readers);
		for (unsigned i = 0; i < n_readers; i++)
			TPT_REQUIRE(st[i] < 0, 1, "message 0, pipe %u: %d", i, st[i]);
		return 0;
	}
	TPT_REQUIRE(r == (int)n_readers - (victim >= 0), 1, "message %u: %d of %u delivered: %s",
		    k, r, n_readers, tp_last_error());
	for (unsigned i = 0, failed = 0; i < n_readers; i++) {
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
	uint8_t *host = malloc(8 * MIB + 64), *pl = malloc(PAYLOAD); /* private: not a buffer */
	int r;

	(void)arg;
	TPT_REQUIRE(host && pl && hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	r = tpt_ctx_new(&tpt_peer_a, 0, "fan-server", &ctx);
	if (r == 0)
		r = tp_listen(ctx, NAME, &lo, &l);
	for (unsigned i = 0; i < n_readers; i++)
		tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_set_new(ctx, n_readers, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, n_readers, HWT_T_MS);
	TPT_REQUIRE(r == 0, 1, "pipes: %d %s", r, tp_last_error());
	for (unsigned k = 0; k < (first == FIRST_ONLY_READERS_KILLED ? 1 : N_SIZES); k++)
		if (server_one(&cu, s, k, host, pl))
			return 1;
	tp_set_free(s); /* the readers see their pipes end */
	tp_listener_close(l);
	tp_context_free(ctx);
	hwt_cuda_close(&cu);
	free(host);
	free(pl);
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
enum far {
	FAR_STAGED,
	FAR_EACH,
	FAR_VICTIM, /* a reader dies: B's counters not checked */
	FAR_NONE,   /* no reader on B */
};

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
	for (unsigned i = 0; i < n_readers; i++)
		pids[i] = tpt_fork(reader, (void *)(uintptr_t)i);
	ok = tpt_wait_ok(tpt_fork(server, NULL), 2 * HWT_T_MS, "server");
	for (unsigned i = 0; i < n_readers; i++) {
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
	if (far == FAR_NONE) {
		ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));
		return;
	}
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

/* ---- on one host: three readers into CPU memory ---------------------------------------------- */

/* Device-to-host copies the daemons make, counted by the stand-in ($FAKECUDA_DTOH_LOG). */
struct dtoh {
	bool counted; /* the stand-in driver counts them; a real one does not */
	char dir[32];
	char path[64];
};

/*
 * Restarts the daemons with the stand-in counting their device-to-host copies into a fresh file,
 * A with @extra_a (NULL-terminated, at most 4, or NULL), and sets up 3 readers on A into CPU
 * memory.
 */
static void local_begin(struct dtoh *c, const char *const *extra_a)
{
	const char *lib = getenv("TPIPD_CUDA_LIBRARY");
	const char *const *t = tpt_peer_args();
	const char *args[10] = { t[0], t[1], t[2], t[3] };

	for (size_t i = 0; extra_a && extra_a[i] && i < 4; i++)
		args[4 + i] = extra_a[i];
	c->counted = lib && strstr(lib, "fakecuda");
	snprintf(c->dir, sizeof(c->dir), "/tmp/tpt-dtoh-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(c->dir));
	snprintf(c->path, sizeof(c->path), "%s/dtoh", c->dir);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	setenv("FAKECUDA_DTOH_LOG", c->path, 1); /* the daemons', not the clients' */
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, t), 0);
	unsetenv("FAKECUDA_DTOH_LOG");
	n_readers = 3;
	n_remote = 0;
	cuda_odd = false;
}

/* Bytes the daemons copied from device to host memory (the file's lines summed); removes it. */
static uint64_t local_dtoh_bytes(struct dtoh *c)
{
	FILE *f = fopen(c->path, "r");
	unsigned long long n;
	uint64_t sum = 0;

	while (f && fscanf(f, "%llu", &n) == 1)
		sum += n;
	if (f)
		fclose(f);
	unlink(c->path);
	rmdir(c->dir);
	return sum;
}

/*
 * Checks what daemon A did for the broadcasts: @reads_of[k] device reads of message k (the
 * stand-in's count), bcast_staged_bytes and bcast_unstaged as expected, and @resets context
 * resets (one more: a mapping of the writer's memory used after its broadcast was done).
 */
static void local_check(struct dtoh *c, const unsigned *reads_of, uint64_t staged,
			uint64_t unstaged, int resets_want)
{
	static const char *const keys[] = { "bcast_staged_bytes", "bcast_unstaged" };
	uint64_t want = 0, got = local_dtoh_bytes(c), a[2];
	int resets = tpt_daemon_log_count(&tpt_peer_a, "context reset after a sticky error");

	for (unsigned k = 0; k < N_SIZES; k++)
		want += reads_of[k] * sizes[k];
	tpt_status_u64s(&tpt_peer_a, keys, 2, a);
	printf("A: %llu bytes read from device memory (%s), %llu staged, %llu over the limit\n",
	       (unsigned long long)got, c->counted ? "counted by the stand-in" : "not counted: "
	       "a real driver", (unsigned long long)a[0], (unsigned long long)a[1]);
	if (c->counted)
		ck_assert_uint_eq(got, want);
	ck_assert_uint_eq(a[0], staged);
	ck_assert_uint_eq(a[1], unstaged);
	ck_assert_msg(resets == resets_want, "%d context resets, not %d: a mapping outlived its "
		      "transfer", resets, resets_want);
}

/* Three readers on the writer's host, into CPU memory: each tensor is read from the device
 * once, into the daemon's staging, and delivered from there, byte-exact (before: once per
 * reader). */
START_TEST(test_cuda_fanout_local_cpu_readers_read_the_device_once)
{
	static const unsigned once[N_SIZES] = { 1, 1, 1 };
	struct dtoh c;

	local_begin(&c, NULL);
	run(FAR_NONE);
	local_check(&c, once, sizes[0] + sizes[1] + sizes[2], 0, 0);
}
END_TEST

/* A's staging limit fits the staging of the first tensor exactly (1 MiB + 64) and of the
 * second, not of the third (8 MiB + 5): that one is read from the device by each reader, as
 * before, and still arrives intact. */
START_TEST(test_cuda_fanout_over_the_staging_limit_each_reader_reads_the_device)
{
	static const char *const extra[] = { "--bcast-stage-bytes-per-uid", "1048640", NULL };
	static const unsigned reads[N_SIZES] = { 1, 1, 3 };
	struct dtoh c;

	local_begin(&c, extra);
	run(FAR_NONE);
	local_check(&c, reads, sizes[0] + sizes[1], 1, 0);
}
END_TEST

/* A local reader killed after its first descriptor, while the others read from the staging:
 * only its deliveries fail, the others' bytes are exact, each tensor is still read from the
 * device once, and the writer's memory is not used after its broadcast (no context reset). */
START_TEST(test_cuda_fanout_local_reader_killed_fails_only_its_delivery)
{
	static const unsigned once[N_SIZES] = { 1, 1, 1 };
	struct dtoh c;

	local_begin(&c, NULL);
	victim = 1;
	run(FAR_NONE);
	local_check(&c, once, sizes[0] + sizes[1] + sizes[2], 0, 0);
}
END_TEST

/*
 * Message 0's one read of the device fails (a device fault the stand-in forces on A's first copy
 * from the writer's memory, $FAKECUDA_FAULT_DIR) while the three readers wait for it (the
 * writer's bytes are behind 2 s of work on its stream): each of their reads fails with
 * its reason, and so does each of the writer's deliveries; A resets its context once, and the
 * next messages are staged and delivered as usual (@staged bytes in all), with the staging all
 * freed at the end. Each message carries @payload bytes of private memory too (0: none).
 */
static void failed_staging_read(size_t payload, uint64_t staged)
{
	static const char *const keys[] = { "bcast_stage_held" };
	static const unsigned reads[N_SIZES] = { 0, 1, 1 };
	char dir[32] = "/tmp/tpt-fault-XXXXXX", path[64];
	const char *lib = getenv("TPIPD_CUDA_LIBRARY");
	uint64_t held = 0;
	struct dtoh c;
	int fd;

	if (!lib || !strstr(lib, "fakecuda")) {
		printf("not run: a device fault is forced in the stand-in driver only\n");
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/sticky-0", dir);
	ck_assert_int_ge(fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600), 0);
	close(fd);
	setenv("FAKECUDA_FAULT_DIR", dir, 1); /* the daemons' */
	local_begin(&c, NULL);
	unsetenv("FAKECUDA_FAULT_DIR");
	first = FIRST_FAILS;
	slow_ms = 2000;
	payload_len = payload;
	run(FAR_NONE);
	local_check(&c, reads, staged, 0, 1);
	ck_assert_int_ne(access(path, F_OK), 0); /* the fault was met */
	rmdir(dir);
	tpt_status_u64s(&tpt_peer_a, keys, 1, &held);
	ck_assert_uint_eq(held, 0);
}

START_TEST(test_cuda_fanout_failed_staging_read_fails_every_delivery_waiting_on_it)
{
	failed_staging_read(0, sizes[1] + sizes[2]);
}
END_TEST

/*
 * Every reader is killed while the staging read of message 0 waits for the writer's stream
 * (3 s of work before its bytes): the writer's deliveries all fail without waiting for that
 * work, the staging read is abandoned (the device is not read for message 0) and the writer's
 * memory, freed once its broadcast is done, is never used after: a second round of the three
 * messages to three new readers finds A's context sound (no reset) and reads each once.
 */
START_TEST(test_cuda_fanout_staging_read_abandoned_when_every_local_reader_died)
{
	static const char *const keys[] = { "bcast_stage_held" };
	static const unsigned once[N_SIZES] = { 1, 1, 1 };
	pid_t pids[3], server_pid;
	uint64_t held = 0;
	struct dtoh c;
	bool ok;

	local_begin(&c, NULL);
	first = FIRST_ONLY_READERS_KILLED;
	slow_ms = 3000;
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	for (unsigned i = 0; i < n_readers; i++)
		pids[i] = tpt_fork(reader, (void *)(uintptr_t)i);
	server_pid = tpt_fork(server, NULL);
	for (int t = 0; t < HWT_T_MS / 10 && held == 0; t++) {
		struct timespec ts = { 0, 10 * 1000000L };

		tpt_status_u64s(&tpt_peer_a, keys, 1, &held);
		if (held == 0)
			nanosleep(&ts, NULL);
	}
	ck_assert_msg(held > 0, "A never staged message 0");
	for (unsigned i = 0; i < n_readers; i++) {
		int status = 0;

		kill(pids[i], SIGKILL);
		ck_assert_int_eq(tpt_wait(pids[i], HWT_T_MS, &status), 0);
		ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	ok = tpt_wait_ok(server_pid, 2 * HWT_T_MS, "server");
	tpt_sync_done(&ready);
	if (!ok)
		tpt_daemon_dump_log(&tpt_peer_a);
	ck_assert(ok);
	first = FIRST_OK;
	slow_ms = 100;
	run(FAR_NONE);
	local_check(&c, once, sizes[0] + sizes[1] + sizes[2], 0, 0);
}
END_TEST

/* ---- a message with private bytes and a CUDA tensor ------------------------------------------ */

/*
 * Three readers on the writer's host, into CPU memory, of messages with a payload in the writer's
 * private memory (1 MiB + 7, read by CMA) and a CUDA tensor: A reads the payload once into its
 * staging at the broadcast and the tensor once from the device at the first read, and every
 * reader gets both parts byte-exact (before: the payload staged, the tensor read from the device
 * by each reader).
 */
START_TEST(test_cuda_fanout_private_and_cuda_reads_the_device_once)
{
	static const unsigned once[N_SIZES] = { 1, 1, 1 };
	struct dtoh c;

	local_begin(&c, NULL);
	payload_len = PAYLOAD;
	run(FAR_NONE);
	local_check(&c, once, N_SIZES * PAYLOAD + sizes[0] + sizes[1] + sizes[2], 0, 0);
}
END_TEST

/* The same with A's staging limit fitting message 0's payload and tensor exactly (1 MiB + 64
 * each, both held at once) and message 1's: message 2's payload is staged, its tensor (8 MiB + 5)
 * is over the limit beside it and read from the device by each reader, and still arrives
 * intact. */
START_TEST(test_cuda_fanout_private_and_cuda_over_the_limit_reads_per_reader)
{
	static const char *const extra[] = { "--bcast-stage-bytes-per-uid", "2097280", NULL };
	static const unsigned reads[N_SIZES] = { 1, 1, 3 };
	struct dtoh c;

	local_begin(&c, extra);
	payload_len = PAYLOAD;
	run(FAR_NONE);
	local_check(&c, reads, N_SIZES * PAYLOAD + sizes[0] + sizes[1], 1, 0);
}
END_TEST

/* Message 0's device read fails while its private payload is staged: every reader waiting on it
 * fails with its reason, and the payload's staging is freed with the rest. */
START_TEST(test_cuda_fanout_private_and_cuda_failed_read_fails_each_waiting_reader)
{
	failed_staging_read(PAYLOAD, N_SIZES * PAYLOAD + sizes[1] + sizes[2]);
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
	tcase_add_test(tc, test_cuda_fanout_local_cpu_readers_read_the_device_once);
	tcase_add_test(tc, test_cuda_fanout_over_the_staging_limit_each_reader_reads_the_device);
	tcase_add_test(tc, test_cuda_fanout_local_reader_killed_fails_only_its_delivery);
	tcase_add_test(tc, test_cuda_fanout_failed_staging_read_fails_every_delivery_waiting_on_it);
	tcase_add_test(tc, test_cuda_fanout_staging_read_abandoned_when_every_local_reader_died);
	tcase_add_test(tc, test_cuda_fanout_private_and_cuda_reads_the_device_once);
	tcase_add_test(tc, test_cuda_fanout_private_and_cuda_over_the_limit_reads_per_reader);
	tcase_add_test(tc, test_cuda_fanout_private_and_cuda_failed_read_fails_each_waiting_reader);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_fanout_suite(), 1);
}
