/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite, issue 28 item 4: CUDA memory is registered for RDMA from the dma-buf its owning
 * client exported of its whole allocation and handed to its daemon (CudaDmabuf, the fd by
 * SCM_RIGHTS), not from a range the daemon imported by CUDA IPC, whose export the driver does not
 * document (fakecuda refuses it, as it refuses ranges that are not whole pages, and fakeverbs
 * takes only fakecuda's exports as dma-bufs). Between two daemons on loopback (the peer fixture):
 * tensors in page-aligned allocations cross by cuda_gdr with no peer memory, every region counted
 * as registered from its client's dma-buf on both daemons; a client that cannot export (a device
 * without dma-buf, an allocation of odd size) still gets its tensor across, registered by
 * address where peer memory allows it; a raw client's bad fds (a regular file, a pipe, a memfd,
 * a dma-buf smaller than claimed, a size of odd pages) are refused with STATUS_INVALID and only
 * that message fails; a frame without its fd closes the session; and the dma-bufs a session can
 * make the daemon hold are bounded by cuda-dmabufs-max (just below and just above: held, fds
 * open in the daemon, evicted), released by CudaRelease and at the session's end; a dma-buf a
 * session hands over under another client's IPC handle is never used for that client's memory.
 * Needs a CUDA device and an RDMA port (or the stand-ins of `--setup fakecuda`); skips (77)
 * otherwise. On real hardware the fallback case, which needs the stand-ins' knobs, is left out.
 */
#include <check.h>
#include <dirent.h>
#include <json-c/json.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "hwtest.h"
#include "ipeer.h"
#include "tpt_wire.h"
#include "tpv.h"

#define MIB (1u << 20)
#define PAGE 4096u

/* @key of `tpipctl --json status` of @d. */
static uint64_t status_u64(const struct tpt_daemon *d, const char *key)
{
	uint64_t v;

	tpt_status_u64s(d, &key, 1, &v);
	return v;
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

/* The registration counters of one daemon (tpipctl status), and of its one peer link
 * (tpipctl peers: segments by method, link_*). */
struct regs {
	uint64_t client, daemon, addr, gdr_bytes;
	uint64_t link_client, link_daemon, link_addr;
};

/* What a test wants the daemon's counters to move by (the link's by the same). */
struct want {
	uint64_t client, daemon, addr, gdr_bytes;
};

static const char *const reg_keys[] = { "rdma_reg_client_dmabuf", "rdma_reg_dmabuf",
					"rdma_reg_addr" };

/* @ret: the reg_keys of @d's one peer link in `tpipctl --json peers` (zeros before the
 * link is made). */
static void link_regs(const struct tpt_daemon *d, uint64_t ret[3])
{
	char *out = hwt_ctl(d, "peers", true);
	struct json_object *root = out ? json_tokener_parse(out) : NULL, *arr, *o, *v;

	ck_assert_msg(root && json_object_object_get_ex(root, "peers", &arr) &&
			      json_object_array_length(arr) <= 1,
		      "tpipctl --json peers: more than one link: %s", out ? out : "(no answer)");
	memset(ret, 0, 3 * sizeof(*ret));
	o = json_object_array_length(arr) ? json_object_array_get_idx(arr, 0) : NULL;
	for (int i = 0; o && i < 3; i++) {
		ck_assert_msg(json_object_object_get_ex(o, reg_keys[i], &v), "no %s: %s",
			      reg_keys[i], out);
		ret[i] = (uint64_t)json_object_get_int64(v);
	}
	json_object_put(root);
	free(out);
}

static struct regs regs_of(const struct tpt_daemon *d)
{
	uint64_t v[3], l[3];

	tpt_status_u64s(d, reg_keys, 3, v);
	link_regs(d, l);
	return (struct regs){ v[0], v[1], v[2], tpt_channel_bytes(d, "cuda_gdr"), l[0], l[1],
			      l[2] };
}

/* @d's counters moved by exactly @want since @was (client, daemon, addr, bytes). */
static void expect_regs(const char *who, const struct tpt_daemon *d, struct regs was,
			struct want want)
{
	struct regs now = regs_of(d);

	/* each segment here is a new allocation: the link counts what the daemon registered */
	ck_assert_msg(now.link_client - was.link_client == want.client &&
			      now.link_daemon - was.link_daemon == want.daemon &&
			      now.link_addr - was.link_addr == want.addr,
		      "daemon %s's link counts %llu segments registered from client dma-bufs, %llu "
		      "from its own, %llu by address; want %llu, %llu, %llu", who,
		      (unsigned long long)(now.link_client - was.link_client),
		      (unsigned long long)(now.link_daemon - was.link_daemon),
		      (unsigned long long)(now.link_addr - was.link_addr),
		      (unsigned long long)want.client, (unsigned long long)want.daemon,
		      (unsigned long long)want.addr);
	ck_assert_msg(now.client - was.client == want.client &&
			      now.daemon - was.daemon == want.daemon &&
			      now.addr - was.addr == want.addr &&
			      now.gdr_bytes - was.gdr_bytes == want.gdr_bytes,
		      "daemon %s registered %llu regions from client dma-bufs, %llu from its own, "
		      "%llu by address and moved %llu bytes by cuda_gdr; "
		      "want %llu, %llu, %llu, %llu",
		      who, (unsigned long long)(now.client - was.client),
		      (unsigned long long)(now.daemon - was.daemon),
		      (unsigned long long)(now.addr - was.addr),
		      (unsigned long long)(now.gdr_bytes - was.gdr_bytes),
		      (unsigned long long)want.client, (unsigned long long)want.daemon,
		      (unsigned long long)want.addr, (unsigned long long)want.gdr_bytes);
}

/* Once its clients left, @d holds no dma-buf of theirs, no registration, no mapping. */
static void expect_nothing_held(const struct tpt_daemon *d)
{
	for (int i = 0; i < TPT_SCALED_MS(10000) / 20 &&
			(status_u64(d, "cuda_dmabufs") || status_u64(d, "cuda_mappings"));
	     i++)
		usleep(20000); /* the daemon sees the clients leave on its own time */
	ck_assert_uint_eq(status_u64(d, "cuda_dmabufs"), 0);
	ck_assert_uint_eq(status_u64(d, "rdma_cache_regions"), 0);
	ck_assert_uint_eq(status_u64(d, "cuda_mappings"), 0);
}

/*
 * `tpipctl peers` on @d (fresh daemons: one link) shows @want in its RDMA_REG column, and @d
 * logged the first use of each method on that link once.
 */
static void expect_link_methods(const struct tpt_daemon *d, const char *want)
{
	static const struct {
		const char *col, *line;
	} says[] = {
		{ "client-dmabuf:", "RDMA registers CUDA memory from the dma-buf its client exported" },
		{ "export:", "RDMA registers CUDA memory from a dma-buf the daemon exported" },
		{ "address:", "RDMA registers CUDA memory by its device address" },
	};
	char *out = hwt_ctl(d, "peers", false);

	ck_assert_msg(out && strstr(out, "RDMA_REG") && strstr(out, want),
		      "tpipctl peers does not show %s: %s", want, out ? out : "(no answer)");
	printf("%s", out);
	free(out);
	for (size_t i = 0; i < sizeof(says) / sizeof(says[0]); i++)
		ck_assert_int_eq(tpt_daemon_log_count(d, says[i].line),
				 strstr(want, says[i].col) ? 1 : 0);
}

/* Restarts both fixture daemons with @env=@val in their environment (NULL: as the fixture). */
static void restart_pair(const char *env, const char *val, const char *const *extra)
{
	const char *const *t = tpt_peer_args();
	const char *args[10] = { t[0], t[1], t[2], t[3] };

	for (size_t i = 0; extra && extra[i] && i < 4; i++)
		args[4 + i] = extra[i];
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	if (env)
		setenv(env, val, 1);
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, args), 0);
	if (env)
		unsetenv(env);
}

/*
 * Tensors in page-aligned CUDA allocations (one alone, one inside a larger allocation, a large
 * one) cross by cuda_gdr on a host without peer memory: each region on each daemon is registered
 * from the dma-buf its client exported (before: the daemon exported the range it imported,
 * which the strict stand-in refuses, and ibv_reg_mr without peer memory failed, so nothing went
 * by RDMA). Once the clients leave, the daemons hold none of their dma-bufs.
 */
START_TEST(test_dmabuf_client_exported_regions_cross_by_rdma)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side legacy = { .mem = HWT_CUDA, .device = 0 };
	struct hwt_side inside = { .mem = HWT_CUDA, .device = 0, .stream = true,
				   .pad_before = PAGE, .pad_after = 2 * PAGE };
	struct hwt_case cases[] = {
		{ .len = PAGE, .w = gpu, .r = gpu },
		{ .len = MIB, .w = inside, .r = legacy },
		{ .len = 16 * MIB, .w = legacy, .r = inside },
	};
	uint64_t bytes = PAGE + MIB + 16 * MIB;
	struct regs a = regs_of(&tpt_peer_a), b = regs_of(&tpt_peer_b);

	ck_assert(cross("dmabuf-dd", cases, 3, 81));
	expect_regs("A", &tpt_peer_a, a, (struct want){ 3, 0, 0, bytes });
	expect_regs("B", &tpt_peer_b, b, (struct want){ 3, 0, 0, bytes });
	expect_link_methods(&tpt_peer_a, "client-dmabuf:3");
	expect_link_methods(&tpt_peer_b, "client-dmabuf:3");
	expect_nothing_held(&tpt_peer_a);
	expect_nothing_held(&tpt_peer_b);
}
END_TEST

/*
 * A client that cannot export (its device has no dma-buf: FAKECUDA_NO_DMABUF in the clients'
 * environment; an allocation that is not whole pages) hands nothing over and its tensor still
 * crosses by cuda_gdr, registered by address (peer memory on, FAKEVERBS_PEER_MEMORY); with peer
 * memory on, a client that can export is still registered from its dma-buf. Each daemon's
 * link shows how its segments were registered (tpipctl peers) and says so once per method.
 */
START_TEST(test_dmabuf_fallback_when_the_client_cannot_export)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side odd = { .mem = HWT_CUDA, .device = 0, .stream = true, .pad_after = 7 };
	struct hwt_case aligned[] = { { .len = MIB, .w = gpu, .r = gpu } };
	struct hwt_case odd_case[] = { { .len = MIB, .w = odd, .r = odd } };
	struct regs a, b;

	restart_pair("FAKEVERBS_PEER_MEMORY", "1", NULL);

	setenv("FAKECUDA_NO_DMABUF", "1", 1); /* the clients', forked from here */
	a = regs_of(&tpt_peer_a);
	b = regs_of(&tpt_peer_b);
	ck_assert(cross("dmabuf-none", aligned, 1, 82));
	unsetenv("FAKECUDA_NO_DMABUF");
	expect_regs("A", &tpt_peer_a, a, (struct want){ 0, 0, 1, MIB });
	expect_regs("B", &tpt_peer_b, b, (struct want){ 0, 0, 1, MIB });
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs_refused"), 0);

	a = regs_of(&tpt_peer_a);
	b = regs_of(&tpt_peer_b);
	ck_assert(cross("dmabuf-odd", odd_case, 1, 83));
	expect_regs("A", &tpt_peer_a, a, (struct want){ 0, 0, 1, MIB });
	expect_regs("B", &tpt_peer_b, b, (struct want){ 0, 0, 1, MIB });

	a = regs_of(&tpt_peer_a);
	b = regs_of(&tpt_peer_b);
	ck_assert(cross("dmabuf-pm", aligned, 1, 84));
	expect_regs("A", &tpt_peer_a, a, (struct want){ 1, 0, 0, MIB });
	expect_regs("B", &tpt_peer_b, b, (struct want){ 1, 0, 0, MIB });
	expect_link_methods(&tpt_peer_a, "client-dmabuf:1,address:2");
	expect_link_methods(&tpt_peer_b, "client-dmabuf:1,address:2");
	expect_nothing_held(&tpt_peer_a);
	expect_nothing_held(&tpt_peer_b);
}
END_TEST

/* ---- a raw client handing over dma-bufs ------------------------------------------------- */

#define RAW_ALLOCS 4

/* What the raw child and the test process say to each other. */
static struct tpt_sync to_test, to_child;

/* The raw child's CUDA allocations: their IPC handles and dma-bufs. */
struct raw_mem {
	struct hwt_cuda cu;
	CUdeviceptr p[RAW_ALLOCS];
	CUipcMemHandle h[RAW_ALLOCS];
	int fd[RAW_ALLOCS];
};

static int raw_mem_open(struct raw_mem *m, size_t size)
{
	if (hwt_cuda_open(0, &m->cu) < 0)
		return -1;
	for (int i = 0; i < RAW_ALLOCS; i++) {
		HWT_CU(&m->cu, cuMemAlloc(&m->p[i], size), -1);
		HWT_CU(&m->cu, cuIpcGetMemHandle(&m->h[i], m->p[i]), -1);
		HWT_CU(&m->cu, cuMemGetHandleForAddressRange(&m->fd[i], m->p[i], size,
							     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
							     0), -1);
	}
	return 0;
}

static void raw_mem_close(struct raw_mem *m)
{
	for (int i = 0; i < RAW_ALLOCS; i++) {
		if (m->fd[i] >= 0)
			close(m->fd[i]);
		m->cu.api->cuMemFree(m->p[i]);
	}
	hwt_cuda_close(&m->cu);
}

/*
 * Sends CudaDmabuf{@req, handle @h, @size} with @fd (none if < 0, the header announcing
 * @hdr_nfds) and, for @req != 0, waits for its Reply. Return: the Reply's status, or -errno.
 */
static int raw_dmabuf(struct tpt_raw *r, uint64_t req, const CUipcMemHandle *h, uint64_t size,
		      int fd, uint16_t hdr_nfds)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CudaDmabuf db = TPW__V1__CUDA_DMABUF__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;
	int st;

	db.req_id = req;
	db.mem_handle = (ProtobufCBinaryData){ sizeof(*h), (uint8_t *)h };
	db.size = size;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF;
	m.cuda_dmabuf = &db;
	st = tpt_raw_send(r, &m, NULL, 0, &fd, fd >= 0 ? 1 : 0, hdr_nfds);
	if (st < 0 || !req)
		return st;
	st = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, HWT_T_MS, &dm);
	if (st < 0)
		return st;
	st = dm->reply->req_id == req ? (int)dm->reply->status : -EPROTO;
	if (dm->reply->status != TPW__V1__STATUS__STATUS_OK)
		printf("raw: request %llu: %s\n", (unsigned long long)req, dm->reply->message);
	tpw_daemon_msg_free(dm);
	return st;
}

static void raw_release(struct tpt_raw *r, const CUipcMemHandle *h)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CudaRelease rel = TPW__V1__CUDA_RELEASE__INIT;

	rel.mem_handle = (ProtobufCBinaryData){ sizeof(*h), (uint8_t *)h };
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_RELEASE;
	m.cuda_release = &rel;
	tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
}

/* Tells the test process that step @step is done and waits for its go. */
static int raw_step(int step)
{
	if (tpt_sync_post(&to_test, (int8_t)step) < 0)
		return -1;
	return tpt_sync_wait(&to_child, HWT_T_MS) == 0 ? 0 : -1;
}

#define RAW_OK TPW__V1__STATUS__STATUS_OK
#define RAW_INVALID TPW__V1__STATUS__STATUS_INVALID
#define RAW_CHECK(cond, ...)                                                                       \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("raw, line %d: ", __LINE__);                                        \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* Bad fds, each refused alone; then a good one; then a frame without its fd. */
static int raw_bad_fds(void *arg)
{
	char path[] = "/tmp/tpt-dmabuf-XXXXXX";
	int p[2], f = mkstemp(path), memfd = memfd_create("tpt-host", MFD_CLOEXEC);
	struct tpt_raw r = { .fd = -1 };
	struct raw_mem m = { 0 };
	int st;

	(void)arg;
	RAW_CHECK(f >= 0 && memfd >= 0 && pipe(p) == 0, "fds: %m");
	unlink(path);
	RAW_CHECK(ftruncate(f, 4 * PAGE) == 0 && ftruncate(memfd, 4 * PAGE) == 0, "%m");
	RAW_CHECK(raw_mem_open(&m, 2 * PAGE) == 0, "CUDA");
	RAW_CHECK(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, "connect");
	RAW_CHECK(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, HWT_T_MS) == 0, "hello");
	st = raw_dmabuf(&r, 1, &m.h[0], 2 * PAGE, f, 1);
	RAW_CHECK(st == RAW_INVALID, "a regular file: %d", st);
	st = raw_dmabuf(&r, 2, &m.h[0], 2 * PAGE, p[0], 1);
	RAW_CHECK(st == RAW_INVALID, "a pipe: %d", st);
	st = raw_dmabuf(&r, 3, &m.h[0], 2 * PAGE, memfd, 1);
	RAW_CHECK(st == RAW_INVALID, "a memfd: %d", st);
	st = raw_dmabuf(&r, 4, &m.h[0], 3 * PAGE, m.fd[0], 1);
	RAW_CHECK(st == RAW_INVALID, "a dma-buf of 2 pages said to hold 3: %d", st);
	st = raw_dmabuf(&r, 5, &m.h[0], PAGE + 1, m.fd[0], 1);
	RAW_CHECK(st == RAW_INVALID, "a size of odd pages: %d", st);
	st = raw_dmabuf(&r, 6, &m.h[0], 2 * PAGE, m.fd[0], 1);
	RAW_CHECK(st == RAW_OK, "the allocation's own dma-buf: %d", st);
	st = raw_dmabuf(&r, 7, &m.h[1], PAGE, m.fd[1], 1);
	RAW_CHECK(st == RAW_OK, "a dma-buf larger than claimed: %d", st);
	RAW_CHECK(raw_step(1) == 0, "step 1");
	/* no fd where one is due: a malformed frame, the session closes */
	raw_dmabuf(&r, 8, &m.h[2], 2 * PAGE, -1, 0);
	RAW_CHECK(tpt_raw_wait_closed(&r, HWT_T_MS) == 0, "the session stayed open");
	tpt_raw_close(&r);
	close(p[0]);
	close(p[1]);
	close(f);
	close(memfd);
	raw_mem_close(&m);
	return 0;
}

/* Fds of @pid that are fakecuda's device memory or dma-bufs. */
static unsigned daemon_dmabuf_fds(pid_t pid)
{
	char dir[64], path[320], target[128];
	unsigned n = 0;
	struct dirent *e;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		ssize_t k;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		k = readlink(path, target, sizeof(target) - 1);
		if (k <= 0)
			continue;
		target[k] = '\0';
		n += !strncmp(target, "/memfd:fakecuda", 15) || !strncmp(target, "/dmabuf:", 8) ||
		     !strcmp(target, "anon_inode:dmabuf");
	}
	closedir(d);
	return n;
}

/* Waits for the raw child's step @step. */
static void wait_step(int step)
{
	ck_assert_int_eq(tpt_sync_wait(&to_test, HWT_T_MS), step);
}

static void sync_start(void)
{
	ck_assert_int_eq(tpt_sync_init(&to_test), 0);
	ck_assert_int_eq(tpt_sync_init(&to_child), 0);
}

static void sync_stop(void)
{
	tpt_sync_done(&to_test);
	tpt_sync_done(&to_child);
}

/*
 * A raw client's CudaDmabuf with a regular file, a pipe, a memfd, a dma-buf smaller than its
 * claim, or a size of odd pages is refused (STATUS_INVALID) and the daemon holds no fd of them;
 * the session goes on and its good dma-bufs are taken. A CudaDmabuf frame without its fd is
 * malformed: that session closes, and the daemon drops what it held for it.
 */
START_TEST(test_dmabuf_bad_fds_are_refused_alone)
{
	uint64_t refused0 = status_u64(&tpt_peer_a, "cuda_dmabufs_refused");
	pid_t child;

	sync_start();
	child = tpt_fork(raw_bad_fds, NULL);
	ck_assert_int_gt(child, 0);
	wait_step(1);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs"), 2);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs_refused") - refused0, 5);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), 2);
	ck_assert_int_eq(tpt_sync_post(&to_child, 0), 0);
	ck_assert(tpt_wait_ok(child, TPT_SCALED_MS(60000), "raw client"));
	expect_nothing_held(&tpt_peer_a);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), 0);
	ck_assert(tpt_daemon_alive(&tpt_peer_a));
	sync_stop();
}
END_TEST

#define LIMIT 3

/* LIMIT dma-bufs, one more, a release, the end of the session. */
static int raw_limit(void *arg)
{
	struct tpt_raw r = { .fd = -1 };
	struct raw_mem m = { 0 };

	(void)arg;
	RAW_CHECK(raw_mem_open(&m, PAGE) == 0, "CUDA");
	RAW_CHECK(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, "connect");
	RAW_CHECK(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, HWT_T_MS) == 0, "hello");
	for (int i = 0; i < LIMIT; i++)
		RAW_CHECK(raw_dmabuf(&r, 10 + i, &m.h[i], PAGE, m.fd[i], 1) == RAW_OK, "%d", i);
	RAW_CHECK(raw_step(1) == 0, "step 1");
	RAW_CHECK(raw_dmabuf(&r, 20, &m.h[LIMIT], PAGE, m.fd[LIMIT], 1) == RAW_OK, "one more");
	RAW_CHECK(raw_step(2) == 0, "step 2");
	raw_release(&r, &m.h[LIMIT]);
	/* the same handle again replaces, never adds */
	RAW_CHECK(raw_dmabuf(&r, 21, &m.h[2], PAGE, m.fd[2], 1) == RAW_OK, "again");
	RAW_CHECK(raw_step(3) == 0, "step 3");
	tpt_raw_close(&r);
	raw_mem_close(&m);
	return 0;
}

/*
 * cuda-dmabufs-max = 3: a session holds 3 (3 fds open in the daemon, nothing evicted); a 4th
 * evicts the least recently handed over (still 3 fds); CudaRelease drops one (2), the same
 * handle handed over again replaces its dma-buf (2); the session's end closes them all.
 */
START_TEST(test_dmabuf_held_per_session_are_bounded)
{
	static const char *const extra[] = { "--cuda-dmabufs-max", "3", NULL };
	pid_t child;

	restart_pair(NULL, NULL, extra);
	sync_start();
	child = tpt_fork(raw_limit, NULL);
	ck_assert_int_gt(child, 0);
	wait_step(1); /* just below the bound: at it */
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs"), LIMIT);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs_evicted"), 0);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), LIMIT);
	ck_assert_int_eq(tpt_sync_post(&to_child, 0), 0);
	wait_step(2); /* just above */
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs"), LIMIT);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs_evicted"), 1);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), LIMIT);
	ck_assert_int_eq(tpt_sync_post(&to_child, 0), 0);
	wait_step(3);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs"), LIMIT - 1);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), LIMIT - 1);
	ck_assert_uint_eq(status_u64(&tpt_peer_a, "cuda_dmabufs_refused"), 0);
	ck_assert_int_eq(tpt_sync_post(&to_child, 0), 0);
	ck_assert(tpt_wait_ok(child, TPT_SCALED_MS(60000), "raw client"));
	expect_nothing_held(&tpt_peer_a);
	ck_assert_uint_eq(daemon_dmabuf_fds(tpt_peer_a.pid), 0);
	sync_stop();
}
END_TEST

/* ---- another session's dma-buf is never used for a client's memory ---------------------- */

static struct tpt_sync iso_ready, iso_given, iso_done;
static int iso_handle[2]; /* the victim's IPC handle, to the attacker */

/* The victim: a client of A that exports no dma-buf; writes one 1 MiB tensor to B. */
static int iso_victim(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "iso-w",
			     .where = tpt_peer_address(&tpt_peer_b, "iso", addr, sizeof(addr)),
			     .ready = &iso_ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = MIB };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUipcMemHandle h;
	CUdeviceptr p;
	int r;

	(void)arg;
	setenv("FAKECUDA_NO_DMABUF", "1", 1);
	RAW_CHECK(hwt_cuda_open(0, &cu) == 0, "CUDA");
	HWT_CU(&cu, cuMemAlloc(&p, MIB), 1);
	RAW_CHECK(hwt_dev_set(&cu, p, 0x5a, MIB) == 0, "memset");
	HWT_CU(&cu, cuIpcGetMemHandle(&h, p), 1);
	RAW_CHECK(write(iso_handle[1], &h, sizeof(h)) == sizeof(h), "handle: %m");
	RAW_CHECK(tpt_sync_wait(&iso_given, HWT_T_MS) == 0, "the attacker did not hand over");
	RAW_CHECK(tpt_end_connect(&e) == 0, "connect");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	RAW_CHECK(r == 0, "write: %d %s", r, tp_last_error());
	tpt_sync_wait(&iso_done, HWT_T_MS);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

/* The attacker: a raw session on A hands over a dma-buf of its own memory for the victim's
 * handle, and stays until the transfer is over. */
static int iso_attacker(void *arg)
{
	struct tpt_raw r = { .fd = -1 };
	struct raw_mem m = { 0 };
	CUipcMemHandle h;

	(void)arg;
	RAW_CHECK(raw_mem_open(&m, MIB) == 0, "CUDA");
	RAW_CHECK(hwt_dev_set(&m.cu, m.p[0], 0xee, MIB) == 0, "memset");
	RAW_CHECK(read(iso_handle[0], &h, sizeof(h)) == sizeof(h), "handle: %m");
	RAW_CHECK(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, "connect");
	RAW_CHECK(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, HWT_T_MS) == 0, "hello");
	RAW_CHECK(raw_dmabuf(&r, 1, &h, MIB, m.fd[0], 1) == RAW_OK, "hand over");
	RAW_CHECK(tpt_sync_post(&iso_given, 0) == 0, "post");
	tpt_sync_wait(&iso_done, HWT_T_MS);
	tpt_raw_close(&r);
	raw_mem_close(&m);
	return 0;
}

/* The reader on B: the victim's bytes, never the attacker's. */
static int iso_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "iso-r", .where = "iso",
			     .ready = &iso_ready, .timeout_ms = HWT_T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r, ok;

	(void)arg;
	setenv("FAKECUDA_NO_DMABUF", "1", 1);
	RAW_CHECK(hwt_cuda_open(0, &cu) == 0, "CUDA");
	RAW_CHECK(tpt_end_listen(&e, true) == 0, "listen");
	HWT_CU(&cu, cuMemAlloc(&p, MIB), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_descriptor_sync(e.p, HWT_T_MS, &d);
	RAW_CHECK(r == 0, "descriptor: %d %s", r, tp_last_error());
	r = tp_pipe_read_sync(e.p, d, &a);
	RAW_CHECK(r == 0, "read: %d %s", r, tp_last_error());
	ok = hwt_dev_expect_byte(&cu, p, 0x5a, MIB, "the victim's tensor") == 0;
	tpt_sync_post(&iso_done, 0);
	tpt_sync_post(&iso_done, 0);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return ok ? 0 : 1;
}

/* Whether @d's log holds @text. */
static bool log_has(const struct tpt_daemon *d, const char *text)
{
	FILE *f = fopen(d->log, "re");
	char line[1024];
	bool found = false;

	ck_assert_ptr_nonnull(f);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, text) != NULL;
	fclose(f);
	return found;
}

/*
 * A session that hands over a dma-buf of its own memory under another client's IPC handle
 * (handles are not secrets) gets it accepted for itself only: the other client's tensor is
 * registered without it (by address here: the victim exports none, peer memory is on) and
 * arrives intact, and daemon A never even tried the attacker's dma-buf for it.
 */
START_TEST(test_dmabuf_of_another_session_is_never_used)
{
	pid_t pids[3];
	struct regs a;

	restart_pair("FAKEVERBS_PEER_MEMORY", "1", NULL);
	ck_assert_int_eq(tpt_sync_init(&iso_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&iso_given), 0);
	ck_assert_int_eq(tpt_sync_init(&iso_done), 0);
	ck_assert_int_eq(pipe(iso_handle), 0);
	a = regs_of(&tpt_peer_a);
	pids[0] = tpt_fork(iso_reader, NULL);
	pids[1] = tpt_fork(iso_victim, NULL);
	pids[2] = tpt_fork(iso_attacker, NULL);
	ck_assert(tpt_wait_ok(pids[0], TPT_SCALED_MS(60000), "reader"));
	ck_assert(tpt_wait_ok(pids[1], TPT_SCALED_MS(60000), "victim"));
	ck_assert(tpt_wait_ok(pids[2], TPT_SCALED_MS(60000), "attacker"));
	expect_regs("A", &tpt_peer_a, a, (struct want){ 0, 0, 1, MIB });
	ck_assert_msg(!log_has(&tpt_peer_a, "dma-buf of its CUDA memory is not usable"),
		      "daemon A tried the attacker's dma-buf for the victim's memory");
	expect_nothing_held(&tpt_peer_a);
	close(iso_handle[0]);
	close(iso_handle[1]);
	tpt_sync_done(&iso_ready);
	tpt_sync_done(&iso_given);
	tpt_sync_done(&iso_done);
}
END_TEST

static Suite *dmabuf_suite(bool stand_in)
{
	Suite *s = suite_create("cuda_dmabuf");
	TCase *tc = tcase_create("cuda_dmabuf");

	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_add_test(tc, test_dmabuf_client_exported_regions_cross_by_rdma);
	if (stand_in) /* a client without dma-buf and peer memory are the stand-ins' knobs */
		tcase_add_test(tc, test_dmabuf_fallback_when_the_client_cannot_export);
	tcase_add_test(tc, test_dmabuf_bad_fds_are_refused_alone);
	tcase_add_test(tc, test_dmabuf_held_per_session_are_bounded);
	if (stand_in)
		tcase_add_test(tc, test_dmabuf_of_another_session_is_never_used);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *lib = getenv("TPIPD_VERBS_LIBRARY");
	const struct tpv_ops *ops;
	char why[256] = "";

	ops = tpv_ops_load(why, sizeof(why));
	if (!ops || !tpv_probe(ops, why, sizeof(why))) {
		printf("SKIP: needs an active RDMA port: %s\n", why);
		return getenv("TPT_HW_REQUIRE") ? 1 : HWT_EXIT_SKIP;
	}
	return hwt_main(dmabuf_suite(lib && strstr(lib, "fakeverbs")), 1);
}
