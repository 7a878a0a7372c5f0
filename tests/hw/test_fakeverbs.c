/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Self test of the fakeverbs stand-in (tests/hw/fakeverbs.c) through the real verbs layer
 * (backends/verbs, tables from tpv_ops_load()): two processes, a sender and a receiver, each list
 * the fake port, open a context and queue pairs, trade their connection info over a socketpair and
 * connect; the receiver registers a dma-buf-backed destination and hands (addr, rkey) over; the
 * sender writes 3 MiB + 17 bytes, cut into 1 MiB pieces, and waits on the completion fd; the
 * receiver checks every byte and the guard bytes around them; where a CUDA driver loads (fakecuda
 * under --setup fakecuda) the same goes for a region of device memory registered through
 * cuMemGetHandleForAddressRange() as the daemon will (and ibv_reg_mr on it refused unless
 * FAKEVERBS_PEER_MEMORY=1 stands for nvidia-peermem). Then the failures: a wrong rkey (-EACCES), a
 * write flushed from the failed queue pair (-ECANCELED), a write to a peer queue pair left in RESET
 * and one to a peer that exited (-ETIMEDOUT). Skips (exit 77) unless $TPIPD_VERBS_LIBRARY names the
 * stand-in. It tests the stand-in, not RDMA hardware.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tpconfig.h"
#include "tpu.h"
#include "tpv.h"
#if HAVE_CUDA
#include "tpcuda.h"
#endif

#define LEN (3u * 1024 * 1024 + 17)
#define PIECE (1u << 20)
#define PAGE 4096u
#define GUARD 0xee
#define N_QP 3 /* 0: the good write then failures, 1: peer exits, 2: peer never connects */
#define DEADLINE_MS 10000

static const char *role = "sender";

static _printf_(2, 3) _Noreturn void fail(int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL (%s, line %d): ", role, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			fail(__LINE__, __VA_ARGS__);                                               \
	} while (0)

enum msg_kind { MSG_INFO = 1, MSG_REGION, MSG_CHECK, MSG_RESULT, MSG_BYE };

struct msg {
	uint32_t kind;
	uint32_t ok;
	uint8_t info[N_QP][TPV_QP_INFO_BYTES];
	uint64_t addr, len, dev_addr; /* dev_addr 0: no device memory region */
	uint32_t rkey, dev_rkey;
};

static void msg_send(int sock, const struct msg *m)
{
	CHECK(send(sock, m, sizeof(*m), MSG_NOSIGNAL) == (ssize_t)sizeof(*m), "send: %m");
}

static struct msg msg_recv(int sock, enum msg_kind kind)
{
	struct msg m;
	ssize_t n = recv(sock, &m, sizeof(m), 0);

	CHECK(n == (ssize_t)sizeof(m), "recv: %s", n < 0 ? strerror(errno) : "the peer is gone");
	CHECK(m.kind == kind, "message %u, wanted %u", m.kind, kind);
	return m;
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + (i >> 13));
}

struct side {
	const struct tpv_ops *ops;
	struct tpv_ctx *ctx;
	struct tpv_qp *qp[N_QP];
};

/* The fake port as the layer sees it, with a 1 MiB message limit so writes are cut. */
static struct tpv_nic side_nic(const struct tpv_ops *ops)
{
	_cleanup_free_ struct tpv_nic *nics = NULL;
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	struct tpv_nic nic;
	char why[256];
	size_t n = 0;

	CHECK(tpv_probe(ops, why, sizeof(why)) == 1, "tpv_probe: %s", why);
	CHECK(!strcmp(why, "fakeverbs0 port 1 (Ethernet)"), "probe says \"%s\"", why);
	CHECK(tpv_nics_list(ops, TPV_SYSFS_ROOT, &nics, &n, why, sizeof(why)) == 0 && n == 1,
	      "tpv_nics_list: %zu ports (%s)", n, why);
	nic = nics[0];
	CHECK(!strcmp(nic.dev, "fakeverbs0") && nic.port == 1 && nic.link == TPV_LINK_ETH &&
		      nic.mtu == IBV_MTU_4096 && nic.max_msg_sz == 1u << 30 && nic.gid_index == 2,
	      "unexpected port %s/%u link %d mtu %d max %u gid %d", nic.dev, nic.port, nic.link,
	      nic.mtu, nic.max_msg_sz, nic.gid_index);
	/* the RoCE v2 IPv4-mapped GID (10.rail.host.port) wins over the link-local ones */
	CHECK(!memcmp(nic.gid, v4mapped, sizeof(v4mapped)) && nic.gid[12] == 10 &&
		      nic.gid[13] == 0 && nic.gid[14] && nic.gid[15] == 1,
	      "GID is not 10.0.<host>.1, IPv4-mapped");
	nic.max_msg_sz = PIECE;
	return nic;
}

/* Opens everything, trades info with the peer, connects the first @n_connect queue pairs. */
static void side_open(struct side *s, int sock, int n_connect)
{
	struct msg m = { .kind = MSG_INFO }, peer;
	struct tpv_nic nic;
	char why[256];
	int i;

	s->ops = tpv_ops_load(why, sizeof(why));
	CHECK(s->ops, "tpv_ops_load: %s", why);
	nic = side_nic(s->ops);
	CHECK(tpv_ctx_open(s->ops, &nic, 512, &s->ctx, why, sizeof(why)) == 0, "ctx: %s", why);
	for (i = 0; i < N_QP; i++) {
		CHECK(tpv_qp_new(s->ctx, NULL, &s->qp[i], why, sizeof(why)) == 0, "qp: %s", why);
		tpv_qp_info_encode(tpv_qp_local(s->qp[i]), m.info[i]);
	}
	msg_send(sock, &m);
	peer = msg_recv(sock, MSG_INFO);
	for (i = 0; i < n_connect; i++) {
		struct tpv_qp_info info;

		CHECK(tpv_qp_info_decode(peer.info[i], TPV_QP_INFO_BYTES, &info) == 0, "decode");
		CHECK(tpv_qp_connect(s->qp[i], &info, why, sizeof(why)) == 0, "connect %d: %s", i,
		      why);
	}
}

static void side_close(struct side *s)
{
	for (int i = 0; i < N_QP; i++)
		tpv_qp_free(s->qp[i]);
	tpv_ctx_close(s->ctx);
}

/* ---- the receiver (child) ----------------------------------------------------------------- */

/* Does @buf hold the pattern at @at and guard bytes everywhere else? */
static bool dst_ok(const uint8_t *buf, size_t size, size_t at)
{
	for (size_t i = 0; i < size; i++)
		if (buf[i] != (i >= at && i - at < LEN ? pattern(i - at) : GUARD))
			return false;
	return true;
}

#if HAVE_CUDA
#define DEV_SIZE (4 * PAGE + LEN)
#define DEV_AT (PAGE + 100) /* the region, 100 bytes into the dma-buf's range */

static const struct tpcuda_api *cu;
static CUdeviceptr dev_base;

/* ibv_reg_mr on device memory works only with peer memory (nvidia-peermem): refused without
 * it, with the reason, and taken with FAKEVERBS_PEER_MEMORY=1. */
static void dev_peer_memory(struct side *s)
{
	struct tpv_mr_args a = { .addr = (void *)(uintptr_t)dev_base, .len = PAGE,
				 .dmabuf_fd = -1, .device_mem = true };
	struct tpv_mr *mr = NULL;
	char why[256] = "";

	CHECK(tpv_mr_reg(s->ctx, &a, &mr, why, sizeof(why)) == -EFAULT && strstr(why,
			"nvidia-peermem"), "ibv_reg_mr on device memory without peer memory: %s",
	      why);
	setenv("FAKEVERBS_PEER_MEMORY", "1", 1);
	CHECK(tpv_mr_reg(s->ctx, &a, &mr, why, sizeof(why)) == 0 && mr->method == TPV_MR_HOST,
	      "ibv_reg_mr on device memory with peer memory: %s", why);
	unsetenv("FAKEVERBS_PEER_MEMORY");
	CHECK(tpv_mr_dereg(s->ctx, mr) == 0, "tpv_mr_dereg");
	printf("ok: ibv_reg_mr reaches device memory only with peer memory\n");
}

/*
 * Device memory registered as the daemon will: a dma-buf for the page-aligned range holding the
 * region, and the region's offset inside that range. Return: the region, or NULL without CUDA.
 */
static struct tpv_mr *dev_region(struct side *s)
{
	size_t range = (100 + LEN + PAGE - 1) / PAGE * PAGE;
	struct tpv_mr *mr;
	CUcontext c;
	char why[256];
	int fd = -1;

	cu = tpcuda_api(why, sizeof(why));
	if (!cu || !cu->cuMemGetHandleForAddressRange) {
		printf("note: device memory not tried: %s\n", cu ? "no dma-buf entry point" : why);
		return NULL;
	}
	CHECK(!cu->cuDevicePrimaryCtxRetain(&c, 0) && !cu->cuCtxSetCurrent(c), "CUDA context");
	CHECK(!cu->cuMemAlloc(&dev_base, DEV_SIZE), "cuMemAlloc");
	CHECK(!cu->cuMemsetD8Async(dev_base, GUARD, DEV_SIZE, NULL), "cuMemsetD8Async");
	CHECK(!cu->cuStreamSynchronize(NULL), "cuStreamSynchronize");
	CHECK(cu->cuMemGetHandleForAddressRange(&fd, dev_base + 100, PAGE,
						CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
		      CUDA_ERROR_INVALID_VALUE, "a range not page aligned got a handle");
	CHECK(cu->cuMemGetHandleForAddressRange(&fd, dev_base + PAGE, DEV_SIZE,
						CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
		      CUDA_ERROR_INVALID_VALUE, "a range past the allocation's end got a handle");
	CHECK(cu->cuMemGetHandleForAddressRange(&fd, dev_base + PAGE, range,
						CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == 0,
	      "cuMemGetHandleForAddressRange");
	{
		uint64_t size = 0;

		CHECK(tpv_dmabuf_size(s->ops, fd, &size) == 0 && size >= range,
		      "fakecuda's export is no dma-buf of %zu bytes for fakeverbs (%llu)", range,
		      (unsigned long long)size);
	}
	CHECK(tpv_mr_reg(s->ctx, &(struct tpv_mr_args){ .addr = (void *)(uintptr_t)(dev_base +
										      DEV_AT),
							.len = LEN, .dmabuf_fd = fd,
							.dmabuf_offset = 100, .device_mem = true },
			 &mr, why, sizeof(why)) == 0,
	      "tpv_mr_reg(device): %s", why);
	CHECK(mr->method == TPV_MR_DMABUF, "device memory registered as %s",
	      tpv_mr_method_name(mr->method));
	close(fd);
	dev_peer_memory(s);
	return mr;
}

static bool dev_ok(void)
{
	_cleanup_free_ uint8_t *buf = malloc(DEV_SIZE);

	CHECK(buf && !cu->cuMemcpyDtoH(buf, dev_base, DEV_SIZE), "cuMemcpyDtoH");
	return dst_ok(buf, DEV_SIZE, DEV_AT);
}

static void dev_free(struct side *s, struct tpv_mr *mr)
{
	CHECK(tpv_mr_dereg(s->ctx, mr) == 0, "dereg");
	CHECK(!cu->cuMemFree(dev_base), "cuMemFree");
}
#else
static struct tpv_mr *dev_region(struct side *s)
{
	printf("note: device memory not tried: built without CUDA\n");
	return NULL;
}

static bool dev_ok(void)
{
	return true;
}

static void dev_free(struct side *s, struct tpv_mr *mr)
{
}
#endif

/*
 * A dma-buf the device refuses, for any reason, falls back to ibv_reg_mr: an offset that does
 * not match the address (the fake checks the mapping), and a driver error other than "not
 * supported" (FAKEVERBS_DMABUF_ERRNO). Both used to fail the registration.
 */
static void check_dmabuf_fallback(struct side *s, uint8_t *map, int fd)
{
	static const int errs[] = { EINVAL, EIO, ENOMEM, EOPNOTSUPP };
	struct tpv_mr_args a = { .addr = map + PAGE, .len = LEN, .dmabuf_fd = fd,
				 .dmabuf_offset = 0 };
	struct tpv_mr *mr = NULL;
	char why[256] = "";
	int r;

	r = tpv_mr_reg(s->ctx, &a, &mr, why, sizeof(why));
	CHECK(r == 0 && mr->method == TPV_MR_HOST,
	      "a mismatched dma-buf offset: %d, %s (%s)", r, mr ? tpv_mr_method_name(mr->method) :
	      "-", why);
	CHECK(tpv_mr_dereg(s->ctx, mr) == 0, "dereg");
	a.dmabuf_offset = PAGE;
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		char e[16];

		snprintf(e, sizeof(e), "%d", errs[i]);
		setenv("FAKEVERBS_DMABUF_ERRNO", e, 1);
		mr = NULL;
		r = tpv_mr_reg(s->ctx, &a, &mr, why, sizeof(why));
		CHECK(r == 0 && mr->method == TPV_MR_HOST, "ibv_reg_dmabuf_mr failing with %d: %d "
		      "(%s)", errs[i], r, why);
		CHECK(tpv_mr_dereg(s->ctx, mr) == 0, "dereg");
	}
	unsetenv("FAKEVERBS_DMABUF_ERRNO");
	printf("ok: any ibv_reg_dmabuf_mr error falls back to ibv_reg_mr\n");
}

/* tpv_dmabuf_size() through the stand-in: a memfd, a pipe and a regular file are no dma-bufs. */
static void check_not_dmabufs(struct side *s, int memfd)
{
	char path[] = "/tmp/tpfv-file-XXXXXX";
	int p[2], f = mkstemp(path);
	uint64_t size = 0;

	CHECK(f >= 0 && pipe(p) == 0, "mkstemp, pipe: %m");
	unlink(path);
	CHECK(write(f, "x", 1) == 1, "write: %m");
	CHECK(tpv_dmabuf_size(s->ops, memfd, &size) == -ENOTTY, "a memfd taken as a dma-buf");
	CHECK(tpv_dmabuf_size(s->ops, p[0], &size) == -ENOTTY, "a pipe taken as a dma-buf");
	CHECK(tpv_dmabuf_size(s->ops, f, &size) == -ENOTTY, "a file taken as a dma-buf");
	CHECK(tpv_dmabuf_size(s->ops, -1, &size) == -EBADF, "no fd taken as a dma-buf");
	/* the kernel's own test (no provider op) refuses them too */
	CHECK(tpv_dmabuf_size(NULL, memfd, &size) == -ENOTTY, "kernel: a memfd is a dma-buf");
	CHECK(tpv_dmabuf_size(NULL, p[0], &size) == -ENOTTY, "kernel: a pipe is a dma-buf");
	close(p[0]);
	close(p[1]);
	close(f);
	printf("ok: memfds, pipes and files are no dma-bufs\n");
}

static int receiver(int sock)
{
	size_t size = 2 * PAGE + LEN;
	struct tpv_mr *mr, *dev;
	struct side s = { 0 };
	char why[256];
	uint8_t *map;
	int fd;

	role = "receiver";
	side_open(&s, sock, 2); /* queue pair 2 stays in RESET */
	fd = memfd_create("fakeverbs-dst", MFD_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "memfd: %m");
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(map != MAP_FAILED, "mmap: %m");
	memset(map, GUARD, size);
	CHECK(tpv_mr_reg(s.ctx,
			 &(struct tpv_mr_args){ .addr = map + PAGE, .len = LEN, .dmabuf_fd = fd,
						.dmabuf_offset = PAGE },
			 &mr, why, sizeof(why)) == 0,
	      "tpv_mr_reg: %s", why);
	/* a memfd of host memory is no dma-buf: the stand-in, as the kernel, refuses it and the
	 * layer falls back to ibv_reg_mr */
	CHECK(mr->method == TPV_MR_HOST, "a memfd registered as %s (only fakecuda's exports are "
	      "dma-bufs)", tpv_mr_method_name(mr->method));
	check_not_dmabufs(&s, fd);
	check_dmabuf_fallback(&s, map, fd);
	close(fd);
	dev = dev_region(&s);
	msg_send(sock, &(struct msg){ .kind = MSG_REGION, .addr = mr->addr, .len = mr->len,
				      .rkey = mr->rkey, .dev_addr = dev ? dev->addr : 0,
				      .dev_rkey = dev ? dev->rkey : 0 });
	msg_recv(sock, MSG_CHECK);
	msg_send(sock, &(struct msg){ .kind = MSG_RESULT,
				      .ok = dst_ok(map, size, PAGE) && (!dev || dev_ok()) });
	msg_recv(sock, MSG_BYE);
	CHECK(tpv_mr_dereg(s.ctx, mr) == 0, "dereg");
	if (dev)
		dev_free(&s, dev);
	side_close(&s);
	return 0;
}

/* ---- the sender (parent) ------------------------------------------------------------------ */

struct done {
	int n;
	uint64_t cookie;
	int status;
	char why[160];
};

static void on_done(void *arg, uint64_t cookie, int status, const char *why)
{
	struct done *d = arg;

	d->n++;
	d->cookie = cookie;
	d->status = status;
	snprintf(d->why, sizeof(d->why), "%s", why ? why : "");
}

/* Posts @w on @qp and waits on the completion fd for its one callback. Return: its status. */
static int write_wait(struct side *s, struct tpv_qp *qp, const struct tpv_write *w)
{
	uint64_t deadline = tpu_now_ns() + DEADLINE_MS * 1000000ull;
	struct pollfd pfd = { .fd = tpv_cq_fd(s->ctx), .events = POLLIN };
	struct done d = { 0 };
	char why[256];
	int r;

	r = tpv_qp_write(qp, w, why, sizeof(why));
	CHECK(r == 0, "tpv_qp_write(cookie %llu): %d %s", (unsigned long long)w->cookie, r, why);
	while (!d.n) {
		uint64_t now = tpu_now_ns();

		CHECK(now < deadline, "no completion for cookie %llu",
		      (unsigned long long)w->cookie);
		r = poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1));
		CHECK(r >= 0, "poll: %m");
		if (r)
			CHECK(tpv_cq_drain(s->ctx, on_done, &d) >= 0, "tpv_cq_drain failed");
	}
	CHECK(d.n == 1 && d.cookie == w->cookie, "%d callbacks, cookie %llu", d.n,
	      (unsigned long long)d.cookie);
	CHECK(tpv_cq_drain(s->ctx, on_done, &d) == 0 && d.n == 1, "a second completion");
	if (d.status)
		fprintf(stderr, "  cookie %llu: %s\n", (unsigned long long)w->cookie, d.why);
	return d.status;
}

static int sender(int sock, pid_t child)
{
	struct side s = { 0 };
	struct tpv_write w;
	struct tpv_mr *mr;
	char why[256], path[64];
	uint8_t *src;
	int status;
	struct msg region;

	side_open(&s, sock, N_QP);
	region = msg_recv(sock, MSG_REGION);
	CHECK(region.len == LEN, "region of %llu bytes", (unsigned long long)region.len);
	src = malloc(LEN);
	CHECK(src, "malloc");
	for (size_t i = 0; i < LEN; i++)
		src[i] = pattern(i);
	CHECK(tpv_mr_reg(s.ctx, &(struct tpv_mr_args){ .addr = src, .len = LEN, .dmabuf_fd = -1 },
			 &mr, why, sizeof(why)) == 0,
	      "tpv_mr_reg: %s", why);
	CHECK(mr->method == TPV_MR_HOST, "source registered as %s", tpv_mr_method_name(mr->method));
	CHECK(tpv_write_pieces(LEN, PIECE) == 4, "pieces");

	w = (struct tpv_write){ .local_addr = mr->addr, .lkey = mr->lkey,
				.remote_addr = region.addr, .rkey = region.rkey, .len = LEN,
				.cookie = 1 };
	CHECK(write_wait(&s, s.qp[0], &w) == 0, "the good write failed");
	if (region.dev_addr) {
		w.remote_addr = region.dev_addr;
		w.rkey = region.dev_rkey;
		w.cookie = 6;
		CHECK(write_wait(&s, s.qp[1], &w) == 0, "the write to device memory failed");
	}
	msg_send(sock, &(struct msg){ .kind = MSG_CHECK });
	CHECK(msg_recv(sock, MSG_RESULT).ok, "the receiver found wrong bytes");
	printf("ok: %u bytes written in 4 pieces to %s and verified by the receiver\n", LEN,
	       region.dev_addr ? "a dma-buf memfd and to fakecuda device memory" :
				 "a dma-buf memfd");

	w.cookie = 2;
	CHECK(write_wait(&s, s.qp[2], &w) == -ETIMEDOUT, "write to a peer QP in RESET");
	printf("ok: a write to a peer queue pair in RESET times out\n");

	w = (struct tpv_write){ .local_addr = mr->addr, .lkey = mr->lkey,
				.remote_addr = region.addr, .rkey = region.rkey ^ (1u << 12),
				.len = PAGE, .cookie = 3 };
	CHECK(write_wait(&s, s.qp[0], &w) == -EACCES, "wrong rkey");
	w.rkey = region.rkey;
	w.len = LEN;
	w.cookie = 4;
	CHECK(write_wait(&s, s.qp[0], &w) == -ECANCELED, "write after the failure");
	printf("ok: a wrong rkey fails with -EACCES, the next write is flushed\n");

	msg_send(sock, &(struct msg){ .kind = MSG_BYE });
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && !WEXITSTATUS(status),
	      "receiver failed (status 0x%x)", status);
	snprintf(path, sizeof(path), "/dev/shm/tpfakeverbs.%d", (int)child);
	CHECK(access(path, F_OK) < 0 && errno == ENOENT, "%s left behind", path);
	w.cookie = 5;
	CHECK(write_wait(&s, s.qp[1], &w) == -ETIMEDOUT, "write to an exited peer");
	printf("ok: a write to a peer that exited times out\n");

	CHECK(tpv_mr_dereg(s.ctx, mr) == 0, "dereg");
	free(src);
	side_close(&s);
	return 0;
}

/* Failures that need no peer: a library that does not load, no device. */
static void check_loading(const char *lib)
{
	const struct tpv_ops *ops;
	char why[256];

	setenv("TPIPD_VERBS_LIBRARY", "/nonexistent/fakeverbs.so", 1);
	CHECK(!tpv_ops_load(why, sizeof(why)), "loaded a nonexistent library");
	CHECK(strstr(why, "TPIPD_VERBS_LIBRARY=/nonexistent/fakeverbs.so: dlopen: "), "why: %s",
	      why);
	setenv("TPIPD_VERBS_LIBRARY", lib, 1);
	ops = tpv_ops_load(why, sizeof(why));
	CHECK(ops, "tpv_ops_load: %s", why);
	setenv("FAKEVERBS_NO_DEVICE", "1", 1);
	CHECK(tpv_probe(ops, why, sizeof(why)) == 0, "probe without device");
	CHECK(!strcmp(why, "no RDMA device (ibv_get_device_list found none)"), "why: %s", why);
	unsetenv("FAKEVERBS_NO_DEVICE");
	printf("ok: load failures and FAKEVERBS_NO_DEVICE are reported\n");
}

int main(void)
{
	const char *lib = getenv("TPIPD_VERBS_LIBRARY");
	int sv[2], r;
	pid_t child;

	if (!lib || !*lib) {
		printf("SKIP: TPIPD_VERBS_LIBRARY is not set (run with --setup fakecuda)\n");
		return 77;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	check_loading(lib);
	CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %m");
	child = fork();
	CHECK(child >= 0, "fork: %m");
	if (!child) {
		close(sv[0]);
		exit(receiver(sv[1]));
	}
	close(sv[1]);
	r = sender(sv[0], child);
	printf("%s\n", r ? "FAIL" : "PASS");
	return r;
}
