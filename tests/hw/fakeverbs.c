/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fakeverbs: a stand-in verbs provider, loaded by tpv_ops_load() when $TPIPD_VERBS_LIBRARY names it
 * (`meson test --setup fakecuda` does), so that the cuda_gdr wiring can run end to end on a machine
 * without RDMA hardware: two processes on this host act as two hosts. It exports `const struct
 * tpv_ops tpv_ops_table` and is not linked to libibverbs (it uses its types only). It is ONE device
 * "fakeverbs0" with FAKEVERBS_PORTS active ports (default 1, at most 15; MTU 4096, largest message
 * 1 GiB). Every process that opens it gets a host number (1..254, unique among the live processes,
 * kept for the life of the process, in /dev/shm/tpfakeverbs.hosts) and port p of host h sits on
 * rail (p - 1) % FAKEVERBS_RAILS (default 1: every port reaches every other). On Ethernet (the
 * default) port p's GID table is: 0 RoCE v1 fe80::5450:RR00:HH00:PP (link-local), 1 the same as
 * RoCE v2, 2 RoCE v2 ::ffff:10.R.H.P (IPv4-mapped), 3 empty; with FAKEVERBS_LINK=ib the port is
 * InfiniBand: LID H << 4 | P, GID 0 fec0::R:5450:46HH:00PP (subnet prefix per rail), and the
 * address vector may go without a GRH. A peer is found by the host and port in the GID (or LID) its
 * QP was connected to at RTR; a write to a port on another rail, or between GID kinds that do not
 * route (link-local to IPv4-mapped), times out as a real fabric drops it. Every process publishes
 * its memory regions and queue pairs in a shared table, /dev/shm/tpfakeverbs.<pid> (created on the
 * first open device, unlinked when the last one closes and at exit); an "RDMA write" is posted from
 * the caller's thread and done there and then: local key and range checked, the peer's queue pair
 * checked (exists, in RTR or RTS, connected back to this one, PSNs agree, remote write allowed),
 * its rkey, range and access checked, then the bytes copied with process_vm_writev(). Completions
 * (with the errors and flushes hardware gives) go to an in-memory CQ and wake its completion
 * channel, an eventfd. Posting before RTS is EINVAL; a failed write puts the QP in ERROR, which
 * flushes every later work request. The objects it returns have no libibverbs insides: use them
 * only through this table. ibv_reg_dmabuf_mr takes only fds that fakecuda's
 * cuMemGetHandleForAddressRange() exported (fv_dmabuf_size(), also the table's dmabuf_size: a
 * regular file, a pipe or a memfd of anything else is no dma-buf); the IOVA must be where the
 * dma-buf's bytes are mapped in this process (fakecuda's device memory is), and the fd's file
 * position is taken as the start of the dma-buf in its file (as fakecuda's
 * cuMemGetHandleForAddressRange() leaves it). A failed write's vendor_err says why: 0xf1 no peer table, 0xf2 peer QP missing or not connected to
 * us, 0xf3 PSN mismatch, 0xf4 peer QP lacks remote write, 0xf5 bad rkey, 0xf6 out of the region,
 * 0xf7 injected, 0xf8 bad lkey, 0x100 + errno a failed process_vm_writev, 0xf9 unreachable (another
 * rail, or GID kinds that do not route), 0xfa the fabric is down, 0xfb a traffic class or service
 * level the fabric drops, 0xfc an ACK timeout shorter than the fabric's round trip. Knobs:
 * FAKEVERBS_NO_DEVICE=1 (no device), FAKEVERBS_FAIL_WRITES=N (the N-th RDMA write work request of
 * the process, and every later one, completes with IBV_WC_REM_ACCESS_ERR), FAKEVERBS_PORTS,
 * FAKEVERBS_RAILS and FAKEVERBS_LINK (above), FAKEVERBS_MAX_CQE (the max_cqe ibv_query_device
 * reports, default 65536: a larger CQ is refused, and a CQ that overflows fails its next poll with
 * EOVERFLOW), FAKEVERBS_MAX_CQ (CQs per process, default 256), FAKEVERBS_FABRIC_DOWN=PATH (while
 * PATH exists every write times out: IBV_WC_RETRY_EXC_ERR, vendor 0xfa, and its QP goes to ERROR),
 * FAKEVERBS_TC=N and FAKEVERBS_SL=N (writes from a QP whose GRH traffic class, or service level, is
 * not N time out: the only lossless class), FAKEVERBS_FABRIC_TIMEOUT=N (writes from a QP whose
 * local ACK timeout is below N time out), FAKEVERBS_PEER_MEMORY=1 (ibv_reg_mr may register
 * fakecuda's device memory, as with the nvidia-peermem module loaded; without it that fails with
 * EFAULT, and only ibv_reg_dmabuf_mr reaches device memory), FAKEVERBS_WRITE_LAG=1 (a write into
 * device memory completes at once but its bytes are spooled in /dev/shm/tpfakeverbs.<pid>.lag of
 * the target process and land only when that process flushes: fakeverbs_flush(), which fakecuda
 * calls from cuFlushGPUDirectRDMAWrites() and cuMemcpyDtoH(): a reader told "done" without a flush
 * sees stale bytes), FAKEVERBS_FAIL_PD=N (the N-th ibv_alloc_pd of the process fails with
 * ENOMEM: opening that port's context fails), FAKEVERBS_DMABUF_ERRNO=N (every ibv_reg_dmabuf_mr fails with errno N, as a
 * driver refusing the dma-buf), FAKEVERBS_DELAY="ibv_reg_mr:MS,ibv_reg_dmabuf_mr:MS" (those calls
 * take MS milliseconds; $FAKEVERBS_DELAY_DIR/pending-CALL exists meanwhile). Not emulated: sends, reads, atomics, receive queues, timing, async events. It
 * proves the plumbing and the completion logic, and says nothing about real RDMA hardware.
 */
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "tpv.h"

#define FV_DEV_NAME "fakeverbs0"
#define FV_SHM_DIR "/dev/shm"
#define FV_SHM_PREFIX "tpfakeverbs."
#define FV_HOSTS FV_SHM_DIR "/tpfakeverbs.hosts" /* int32 pid per host number */
#define FV_PORTS_MAX 15
#define FV_GIDS 4 /* table length; index 3 is empty */
#define FV_HOSTS_MAX 254
#define FV_MAGIC 0x56465054u /* bytes 'T','P','F','V' */
#define FV_MRS 4096	     /* memory regions per process; a key's low 12 bits index them */
#define FV_KEY_INDEX (FV_MRS - 1)
#define FV_QPS 1024
#define FV_MAX_MSG (1u << 30)
#define FV_MAX_QP_WR 16384
#define FV_MAX_SGE 4
#define FV_MAX_CQE 65536
#define FV_MAX_RD_ATOM 16
#define FV_QPN_MASK 0xffffffu
#define FV_ACCESS_KNOWN                                                                            \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |               \
	 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)

enum fv_vendor_err {
	FV_VE_NO_PEER = 0xf1,
	FV_VE_PEER_QP = 0xf2,
	FV_VE_PSN = 0xf3,
	FV_VE_QP_ACCESS = 0xf4,
	FV_VE_RKEY = 0xf5,
	FV_VE_RANGE = 0xf6,
	FV_VE_INJECTED = 0xf7,
	FV_VE_LKEY = 0xf8,
	FV_VE_UNREACHABLE = 0xf9,
	FV_VE_FABRIC_DOWN = 0xfa,
	FV_VE_CLASS = 0xfb,
	FV_VE_TIMEOUT = 0xfc,
	FV_VE_ERRNO = 0x100,
};

/* ---- the shared table other processes read ------------------------------------------------ */

/* Each slot starts with a sequence number, odd while its owner rewrites it. */
struct shm_mr {
	uint32_t seq;
	uint32_t valid;
	uint32_t rkey;
	uint32_t access;
	uint32_t pd;
	uint32_t device; /* fakecuda's device memory: writes may lag (FAKEVERBS_WRITE_LAG) */
	uint64_t addr;
	uint64_t len;
};

struct shm_qp {
	uint32_t seq;
	uint32_t valid;
	uint32_t qpn;
	uint32_t state; /* enum ibv_qp_state */
	uint32_t access;
	uint32_t pd;
	uint32_t dest_qpn;
	int32_t dest_pid;
	uint32_t rq_psn;
	uint32_t port;
};

struct shm_table {
	uint32_t magic;
	int32_t pid;
	uint32_t alive; /* cleared before the file is unlinked */
	uint32_t host;	/* this process's host number */
	struct shm_qp qp[FV_QPS];
	struct shm_mr mr[FV_MRS];
};

static void slot_publish(void *slot, const void *val, size_t n)
{
	uint32_t *seq = slot, s = __atomic_load_n(seq, __ATOMIC_RELAXED);

	__atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy((char *)slot + sizeof(*seq), (const char *)val + sizeof(*seq), n - sizeof(*seq));
	__atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
}

/* A consistent copy of a slot another process may be rewriting. Return: false if none. */
static bool slot_read(const void *slot, void *out, size_t n)
{
	const uint32_t *seq = slot;

	for (int tries = 0; tries < 10000; tries++) {
		uint32_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE), s2;

		if (s1 & 1)
			continue;
		memcpy(out, slot, n);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
		if (s1 == s2)
			return true;
	}
	return false;
}

/* ---- objects ----------------------------------------------------------------------------- */

struct fv_pd {
	struct ibv_pd ibv;
	int users; /* queue pairs and memory regions */
};

struct fv_chan {
	struct ibv_comp_channel ibv;
	struct fv_cq **ev; /* CQs whose events were not taken yet, oldest first */
	size_t n_ev, cap_ev;
	bool signaled;	   /* the eventfd counter is non-zero: iff n_ev > 0 */
	int users;	   /* CQs */
};

struct fv_wce {
	struct ibv_wc wc;
	uint32_t retire; /* send queue slots this completion frees once polled */
};

struct fv_cq {
	struct ibv_cq ibv;
	struct fv_wce *ring;
	int cap, head, n;
	bool armed, overflow;
	unsigned int delivered, acked;
	int users; /* queue pairs */
};

struct fv_qp {
	struct ibv_qp ibv;
	int slot;
	bool sig_all;
	uint32_t max_send_wr, max_send_sge;
	uint32_t outstanding; /* posted, not yet retired by a polled completion */
	uint32_t unretired;   /* posted since the last completion was generated */
	uint32_t access, dest_qpn, rq_psn, sq_psn;
	uint8_t port;	  /* ours, from INIT */
	uint8_t dest_port; /* the peer's, from the address vector at RTR */
	bool reachable;	   /* same rail, and GID kinds that route */
	uint8_t tc, sl;	   /* from the address vector at RTR */
	uint8_t timeout;   /* local ACK timeout, from RTS */
	pid_t peer;
	struct shm_table *peer_tab; /* the peer's table, mapped on the first write */
};

struct fv_mr {
	struct ibv_mr ibv;
	int slot;
};

static struct ibv_device fv_dev = {
	.node_type = IBV_NODE_CA,
	.transport_type = IBV_TRANSPORT_IB,
	.name = FV_DEV_NAME,
	.dev_name = "uverbs-fake0",
	.dev_path = "/dev/null",
	.ibdev_path = "/nonexistent/fakeverbs0",
};

static pthread_mutex_t fv_lock = PTHREAD_MUTEX_INITIALIZER;

/* Per-process state; a forked child starts over (verbs objects do not survive fork). */
static struct {
	pid_t pid;
	int opens;
	struct shm_table *tab;
	char path[64];
	uint32_t key_gen, next_qpn, next_pd, host;
	uint32_t pd_allocs; /* ibv_alloc_pd calls, for FAKEVERBS_FAIL_PD */
	int cqs;
	unsigned long writes;
	struct fv_mr *mrs[FV_MRS];
	struct fv_qp *qps[FV_QPS];
	bool atexit_set;
} fv;

static void fv_own(void)
{
	if (fv.pid == getpid())
		return;
	memset(fv.mrs, 0, sizeof(fv.mrs));
	memset(fv.qps, 0, sizeof(fv.qps));
	if (fv.tab)
		munmap(fv.tab, sizeof(*fv.tab));
	fv.tab = NULL;
	fv.opens = 0;
	fv.writes = 0;
	fv.pd_allocs = 0;
	fv.cqs = 0;
	fv.host = 0;
	fv.pid = getpid();
	fv.next_qpn = ((uint32_t)fv.pid << 8) & FV_QPN_MASK;
}

static unsigned long env_ulong(const char *name)
{
	const char *e = getenv(name);

	return e && *e ? strtoul(e, NULL, 0) : 0;
}

/* @name as a number in [@lo, @hi], or @def when unset or out of range. */
static unsigned long env_in(const char *name, unsigned long lo, unsigned long hi,
			    unsigned long def)
{
	unsigned long v = env_ulong(name);

	return v >= lo && v <= hi ? v : def;
}

/*
 * Sleeps as long as $FAKEVERBS_DELAY ("ibv_reg_mr:3000,ibv_reg_dmabuf_mr:3000", milliseconds)
 * says for @call, as a registration pinning much memory can take; meanwhile the file
 * $FAKEVERBS_DELAY_DIR/pending-@call exists, so that a test sees it is still pending.
 */
static void fv_delay(const char *call)
{
	const char *e = getenv("FAKEVERBS_DELAY"), *dir = getenv("FAKEVERBS_DELAY_DIR");
	size_t n = strlen(call);
	char path[512] = "";
	long ms = 0;
	int fd;

	for (const char *p = e; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, call, n) == 0 && p[n] == ':')
			ms = strtol(p + n + 1, NULL, 10);
	if (ms <= 0)
		return;
	if (dir && *dir) {
		snprintf(path, sizeof(path), "%s/pending-%s", dir, call);
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
	}
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	if (path[0])
		unlink(path);
}

static unsigned int fv_ports(void)
{
	return (unsigned int)env_in("FAKEVERBS_PORTS", 1, FV_PORTS_MAX, 1);
}

/* The rail of port @port (1-based) of any host. */
static unsigned int fv_rail(unsigned int port)
{
	return (port - 1) % (unsigned int)env_in("FAKEVERBS_RAILS", 1, FV_PORTS_MAX, 1);
}

static bool fv_ib(void)
{
	const char *e = getenv("FAKEVERBS_LINK");

	return e && !strcmp(e, "ib");
}

static void *fv_new(size_t size)
{
	void *p = calloc(1, size);

	if (!p)
		errno = ENOMEM;
	return p;
}

static void *fv_fail(int e)
{
	errno = e;
	return NULL;
}

/* ---- the process's table file ------------------------------------------------------------- */

/* Unlinks the tables of processes that died without cleaning up (killed). */
static void tables_sweep(void)
{
	DIR *d = opendir(FV_SHM_DIR);
	struct dirent *de;
	int pid;

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (sscanf(de->d_name, FV_SHM_PREFIX "%d", &pid) != 1 || pid <= 0)
			continue;
		if (kill(pid, 0) < 0 && errno == ESRCH)
			unlinkat(dirfd(d), de->d_name, 0);
	}
	closedir(d);
}

static void table_unlink(void)
{
	char lag[64];

	if (!fv.tab || fv.pid != getpid())
		return;
	__atomic_store_n(&fv.tab->alive, 0, __ATOMIC_RELEASE);
	unlink(fv.path);
	snprintf(lag, sizeof(lag), FV_SHM_DIR "/" FV_SHM_PREFIX "%d.lag", (int)fv.pid);
	unlink(lag);
}

static void fv_atexit(void)
{
	table_unlink();
}

/*
 * This process's host number: taken once, for the life of the process, in the registry FV_HOSTS
 * (one pid per number, under flock), from a slot that is free or whose process is gone.
 * Return: 1..FV_HOSTS_MAX, or 0 if none is free.
 */
static uint32_t host_claim(void)
{
	int32_t pids[FV_HOSTS_MAX + 1] = { 0 };
	uint32_t h, pick = 0;
	int fd;

	if (fv.host)
		return fv.host;
	fd = open(FV_HOSTS, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return 0;
	while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
		;
	if (pread(fd, pids, sizeof(pids), 0) < 0)
		memset(pids, 0, sizeof(pids));
	for (h = 1; h <= FV_HOSTS_MAX && !pick; h++) {
		if (pids[h] == fv.pid || pids[h] <= 0 ||
		    (kill(pids[h], 0) < 0 && errno == ESRCH))
			pick = h;
	}
	if (pick) {
		pids[pick] = fv.pid;
		if (pwrite(fd, &pids[pick], sizeof(pids[pick]), pick * sizeof(pids[0])) !=
		    sizeof(pids[pick]))
			pick = 0;
	}
	close(fd); /* drops the lock */
	fv.host = pick;
	return pick;
}

/* The pid of the process whose host number is @host, or 0. */
static pid_t host_pid(uint32_t host)
{
	int32_t pid = 0;
	int fd;

	if (host == fv.host)
		return fv.pid;
	if (!host || host > FV_HOSTS_MAX)
		return 0;
	fd = open(FV_HOSTS, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	if (pread(fd, &pid, sizeof(pid), host * sizeof(pid)) != sizeof(pid))
		pid = 0;
	close(fd);
	return pid > 0 ? pid : 0;
}

static int table_create(void)
{
	struct shm_table *t;
	int fd;

	tables_sweep();
	if (!host_claim())
		return EMFILE;
	snprintf(fv.path, sizeof(fv.path), FV_SHM_DIR "/" FV_SHM_PREFIX "%d", (int)fv.pid);
	fd = open(fv.path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0 || ftruncate(fd, sizeof(*t)) < 0) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		unlink(fv.path);
		return e;
	}
	t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (t == MAP_FAILED) {
		unlink(fv.path);
		return ENOMEM;
	}
	t->magic = FV_MAGIC;
	t->pid = fv.pid;
	t->host = fv.host;
	__atomic_store_n(&t->alive, 1, __ATOMIC_RELEASE);
	fv.tab = t;
	if (!fv.atexit_set)
		fv.atexit_set = atexit(fv_atexit) == 0;
	return 0;
}

static int table_ref(void)
{
	int e;

	fv_own();
	if (fv.opens++)
		return 0;
	e = table_create();
	if (e)
		fv.opens--;
	return e;
}

static void table_unref(void)
{
	if (fv.pid != getpid() || !fv.opens || --fv.opens)
		return;
	table_unlink();
	munmap(fv.tab, sizeof(*fv.tab));
	fv.tab = NULL;
}

/* Maps @pid's table read-only. Return: it, or NULL if that process has none (or is gone). */
static struct shm_table *table_map_peer(pid_t pid)
{
	struct shm_table *t;
	char path[64];
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), FV_SHM_DIR "/" FV_SHM_PREFIX "%d", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(*t)) {
		close(fd);
		return NULL;
	}
	t = mmap(NULL, sizeof(*t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (t == MAP_FAILED)
		return NULL;
	if (t->magic != FV_MAGIC || t->pid != pid) {
		munmap(t, sizeof(*t));
		return NULL;
	}
	return t;
}

/* ---- device, port, GID -------------------------------------------------------------------- */

/* What a fake GID or LID names: a host's port, and the kind of address it is. */
enum fv_gid_kind { FV_GID_NONE = 0, FV_GID_LINK_LOCAL, FV_GID_IPV4, FV_GID_IB };

struct fv_addr {
	enum fv_gid_kind kind;
	uint32_t host;
	unsigned int port, rail;
};

/* GID @index of this process's port @port (see the top). Return: its type, or -1 if empty. */
static int gid_make(uint8_t gid[16], unsigned int port, uint32_t index)
{
	unsigned int rail = fv_rail(port);

	memset(gid, 0, 16);
	if (fv_ib()) {
		if (index != 0)
			return -1;
		gid[0] = 0xfe;
		gid[1] = 0xc0;
		gid[7] = (uint8_t)rail;
		memcpy(gid + 8, "TPF", 3);
		gid[11] = (uint8_t)fv.host;
		gid[15] = (uint8_t)port;
		return IBV_GID_TYPE_IB;
	}
	if (index > 2)
		return -1;
	if (index == 2) {
		gid[10] = gid[11] = 0xff;
		gid[12] = 10;
		gid[13] = (uint8_t)rail;
		gid[14] = (uint8_t)fv.host;
		gid[15] = (uint8_t)port;
		return IBV_GID_TYPE_ROCE_V2;
	}
	gid[0] = 0xfe;
	gid[1] = 0x80;
	memcpy(gid + 8, "TP", 2);
	gid[10] = (uint8_t)rail;
	gid[12] = (uint8_t)fv.host;
	gid[15] = (uint8_t)port;
	return index == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
}

/* What the fake GID @gid names (kind FV_GID_NONE if it is not one). */
static struct fv_addr gid_parse(const uint8_t gid[16])
{
	static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };
	struct fv_addr a = { FV_GID_NONE, 0, 0, 0 };

	if (!memcmp(gid, v4, sizeof(v4)) && gid[12] == 10)
		a = (struct fv_addr){ FV_GID_IPV4, gid[14], gid[15], gid[13] };
	else if (gid[0] == 0xfe && gid[1] == 0x80 && !memcmp(gid + 8, "TP", 2))
		a = (struct fv_addr){ FV_GID_LINK_LOCAL, gid[12], gid[15], gid[10] };
	else if (gid[0] == 0xfe && gid[1] == 0xc0 && !memcmp(gid + 8, "TPF", 3))
		a = (struct fv_addr){ FV_GID_IB, gid[11], gid[15], gid[7] };
	if (!a.host || !a.port || a.port > FV_PORTS_MAX)
		a.kind = FV_GID_NONE;
	return a;
}

/* What the LID @lid names (IB; kind FV_GID_NONE if it is not a fake one). */
static struct fv_addr lid_parse(uint16_t lid)
{
	struct fv_addr a = { FV_GID_IB, lid >> 4, lid & 0xfu, 0 };

	if (!a.host || a.host > FV_HOSTS_MAX || !a.port)
		a.kind = FV_GID_NONE;
	a.rail = a.kind ? fv_rail(a.port) : 0;
	return a;
}

static struct ibv_device **fv_get_device_list(int *num)
{
	bool none = env_ulong("FAKEVERBS_NO_DEVICE") != 0;
	struct ibv_device **list = fv_new(2 * sizeof(*list));

	if (!list)
		return NULL;
	list[0] = none ? NULL : &fv_dev;
	if (num)
		*num = none ? 0 : 1;
	return list;
}

static void fv_free_device_list(struct ibv_device **list)
{
	free(list);
}

static struct ibv_context *fv_open_device(struct ibv_device *dev)
{
	struct ibv_context *c;
	int e;

	if (dev != &fv_dev)
		return fv_fail(ENODEV);
	c = fv_new(sizeof(*c));
	if (!c)
		return NULL;
	pthread_mutex_lock(&fv_lock);
	e = table_ref();
	pthread_mutex_unlock(&fv_lock);
	if (e) {
		free(c);
		return fv_fail(e);
	}
	c->device = dev;
	c->cmd_fd = -1;
	c->async_fd = -1;
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	return c;
}

static int fv_close_device(struct ibv_context *c)
{
	pthread_mutex_lock(&fv_lock);
	table_unref();
	pthread_mutex_unlock(&fv_lock);
	pthread_mutex_destroy(&c->mutex);
	free(c);
	return 0;
}

static int fv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "fakeverbs");
	a->node_guid = htobe64(0x5450465600000000ull | (uint32_t)getpid());
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 4096;
	a->vendor_id = 0xffffff;
	a->hw_ver = 1;
	a->max_qp = FV_QPS;
	a->max_qp_wr = FV_MAX_QP_WR;
	a->max_sge = FV_MAX_SGE;
	a->max_cq = (int)env_in("FAKEVERBS_MAX_CQ", 1, 256, 256);
	a->max_cqe = (int)env_in("FAKEVERBS_MAX_CQE", 1, FV_MAX_CQE, FV_MAX_CQE);
	a->max_mr = FV_MRS;
	a->max_pd = 256;
	a->max_qp_rd_atom = FV_MAX_RD_ATOM;
	a->max_qp_init_rd_atom = FV_MAX_RD_ATOM;
	a->max_pkeys = 1;
	a->phys_port_cnt = (uint8_t)fv_ports();
	return 0;
}

static int fv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	if (port < 1 || port > fv_ports())
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = FV_GIDS;
	a->max_msg_sz = FV_MAX_MSG;
	a->pkey_tbl_len = 1;
	a->active_width = 2;  /* 4x */
	a->active_speed = 32; /* 25 Gb/s per lane */
	a->phys_state = 5;    /* LinkUp */
	a->link_layer = fv_ib() ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
	a->lid = fv_ib() ? (uint16_t)(fv.host << 4 | port) : 0;
	a->sm_lid = fv_ib() ? 1 : 0;
	return 0;
}

static int fv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
			   struct ibv_gid_entry *e)
{
	int type;

	if (port < 1 || port > fv_ports() || index >= FV_GIDS)
		return EINVAL;
	memset(e, 0, sizeof(*e));
	type = gid_make(e->gid.raw, port, index);
	if (type < 0)
		return ENODATA;
	e->gid_index = index;
	e->port_num = port;
	e->gid_type = (uint32_t)type;
	return 0;
}

/* ---- protection domains, completion channels and queues ---------------------------------- */

static struct ibv_pd *fv_alloc_pd(struct ibv_context *c)
{
	unsigned long fail = env_ulong("FAKEVERBS_FAIL_PD");
	struct fv_pd *pd;
	uint32_t nth;

	pthread_mutex_lock(&fv_lock);
	nth = ++fv.pd_allocs;
	pthread_mutex_unlock(&fv_lock);
	if (fail && nth == fail)
		return fv_fail(ENOMEM);
	pd = fv_new(sizeof(*pd));
	if (!pd)
		return NULL;
	pd->ibv.context = c;
	pthread_mutex_lock(&fv_lock);
	pd->ibv.handle = ++fv.next_pd;
	pthread_mutex_unlock(&fv_lock);
	return &pd->ibv;
}

static int fv_dealloc_pd(struct ibv_pd *ibv)
{
	struct fv_pd *pd = (struct fv_pd *)ibv;

	if (pd->users)
		return EBUSY;
	free(pd);
	return 0;
}

static struct ibv_comp_channel *fv_create_comp_channel(struct ibv_context *c)
{
	struct fv_chan *ch = fv_new(sizeof(*ch));

	if (!ch)
		return NULL;
	ch->ibv.context = c;
	ch->ibv.fd = eventfd(0, EFD_CLOEXEC);
	if (ch->ibv.fd < 0) {
		int e = errno;

		free(ch);
		return fv_fail(e);
	}
	return &ch->ibv;
}

static int fv_destroy_comp_channel(struct ibv_comp_channel *ibv)
{
	struct fv_chan *ch = (struct fv_chan *)ibv;

	if (ch->users)
		return EBUSY;
	close(ch->ibv.fd);
	free(ch->ev);
	free(ch);
	return 0;
}

/* Queues an event for @cq on @ch and makes the fd readable. Locked. */
static void chan_fire(struct fv_chan *ch, struct fv_cq *cq)
{
	if (ch->n_ev == ch->cap_ev) {
		size_t cap = ch->cap_ev ? ch->cap_ev * 2 : 8;
		struct fv_cq **ev = reallocarray(ch->ev, cap, sizeof(*ev));

		if (!ev)
			return; /* the event is lost, as on a CQ overrun */
		ch->ev = ev;
		ch->cap_ev = cap;
	}
	ch->ev[ch->n_ev++] = cq;
	if (!ch->signaled && eventfd_write(ch->ibv.fd, 1) == 0)
		ch->signaled = true;
}

/* Drops up to @max of @cq's events, oldest first, and clears the fd if none is left. Locked. */
static void chan_remove(struct fv_chan *ch, const struct fv_cq *cq, size_t max)
{
	size_t i, k = 0;
	eventfd_t v;

	for (i = 0; i < ch->n_ev; i++) {
		if (ch->ev[i] == cq && max) {
			max--;
			continue;
		}
		ch->ev[k++] = ch->ev[i];
	}
	ch->n_ev = k;
	if (!k && ch->signaled) {
		eventfd_read(ch->ibv.fd, &v); /* non-zero: does not block */
		ch->signaled = false;
	}
}

static struct ibv_cq *fv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
				   struct ibv_comp_channel *channel, int comp_vector)
{
	struct fv_cq *cq;

	if (cqe < 1 || cqe > (int)env_in("FAKEVERBS_MAX_CQE", 1, FV_MAX_CQE, FV_MAX_CQE) ||
	    comp_vector != 0)
		return fv_fail(EINVAL);
	if (fv.cqs >= (int)env_in("FAKEVERBS_MAX_CQ", 1, 256, 256))
		return fv_fail(ENOMEM);
	cq = fv_new(sizeof(*cq));
	if (!cq)
		return NULL;
	cq->ring = fv_new((size_t)cqe * sizeof(*cq->ring));
	if (!cq->ring) {
		free(cq);
		return NULL;
	}
	cq->cap = cqe;
	cq->ibv.context = c;
	cq->ibv.channel = channel;
	cq->ibv.cq_context = cq_context;
	cq->ibv.cqe = cqe;
	pthread_mutex_init(&cq->ibv.mutex, NULL);
	pthread_cond_init(&cq->ibv.cond, NULL);
	if (channel)
		((struct fv_chan *)channel)->users++;
	fv.cqs++;
	return &cq->ibv;
}

static int fv_destroy_cq(struct ibv_cq *ibv)
{
	struct fv_cq *cq = (struct fv_cq *)ibv;

	pthread_mutex_lock(&fv_lock);
	if (cq->users || cq->delivered != cq->acked) { /* libibverbs would hang on unacked events */
		pthread_mutex_unlock(&fv_lock);
		return EBUSY;
	}
	if (ibv->channel) {
		chan_remove((struct fv_chan *)ibv->channel, cq, SIZE_MAX);
		((struct fv_chan *)ibv->channel)->users--;
	}
	fv.cqs--;
	pthread_mutex_unlock(&fv_lock);
	pthread_mutex_destroy(&ibv->mutex);
	pthread_cond_destroy(&ibv->cond);
	free(cq->ring);
	free(cq);
	return 0;
}

static int fv_req_notify_cq(struct ibv_cq *ibv, int solicited_only)
{
	pthread_mutex_lock(&fv_lock);
	((struct fv_cq *)ibv)->armed = true;
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

static int fv_get_cq_event(struct ibv_comp_channel *ibv, struct ibv_cq **ret_cq,
			   void **ret_ctx)
{
	struct fv_chan *ch = (struct fv_chan *)ibv;
	struct pollfd pfd = { .fd = ibv->fd, .events = POLLIN };
	struct fv_cq *cq;

	for (;;) {
		pthread_mutex_lock(&fv_lock);
		if (ch->n_ev) {
			cq = ch->ev[0];
			chan_remove(ch, cq, 1);
			cq->delivered++;
			pthread_mutex_unlock(&fv_lock);
			*ret_cq = &cq->ibv;
			*ret_ctx = cq->ibv.cq_context;
			return 0;
		}
		pthread_mutex_unlock(&fv_lock);
		if (fcntl(ibv->fd, F_GETFL) & O_NONBLOCK) {
			errno = EAGAIN;
			return -1;
		}
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR) /* blocking channel: wait */
			return -1;
	}
}

static void fv_ack_cq_events(struct ibv_cq *ibv, unsigned int n)
{
	pthread_mutex_lock(&fv_lock);
	((struct fv_cq *)ibv)->acked += n;
	pthread_mutex_unlock(&fv_lock);
}

/* Adds a completion; wakes the channel if the CQ was armed. Locked. */
static void cq_push(struct fv_cq *cq, const struct ibv_wc *wc, uint32_t retire)
{
	if (cq->n == cq->cap) {
		cq->overflow = true;
		return;
	}
	cq->ring[(cq->head + cq->n) % cq->cap] = (struct fv_wce){ .wc = *wc, .retire = retire };
	cq->n++;
	if (cq->armed && cq->ibv.channel) {
		cq->armed = false;
		chan_fire((struct fv_chan *)cq->ibv.channel, cq);
	}
}

static struct fv_qp *qp_by_num(uint32_t qpn)
{
	for (int i = 0; i < FV_QPS; i++)
		if (fv.qps[i] && fv.qps[i]->ibv.qp_num == qpn)
			return fv.qps[i];
	return NULL;
}

static int fv_poll_cq(struct ibv_cq *ibv, int num, struct ibv_wc *wc)
{
	struct fv_cq *cq = (struct fv_cq *)ibv;
	int i;

	pthread_mutex_lock(&fv_lock);
	if (cq->overflow) {
		pthread_mutex_unlock(&fv_lock);
		errno = EOVERFLOW;
		return -1;
	}
	for (i = 0; i < num && cq->n; i++) {
		struct fv_wce *e = &cq->ring[cq->head];
		struct fv_qp *qp = qp_by_num(e->wc.qp_num);

		wc[i] = e->wc;
		if (qp && qp->outstanding >= e->retire) /* else destroyed (or reset) since */
			qp->outstanding -= e->retire;
		else if (qp)
			qp->outstanding = 0;
		cq->head = (cq->head + 1) % cq->cap;
		cq->n--;
	}
	pthread_mutex_unlock(&fv_lock);
	return i;
}

/* ---- queue pairs -------------------------------------------------------------------------- */

/* Publishes @qp's connection state for its peers. Locked. */
static void qp_publish(const struct fv_qp *qp, bool valid)
{
	struct shm_qp v = { .valid = valid, .qpn = qp->ibv.qp_num, .state = qp->ibv.state,
			    .access = qp->access, .pd = qp->ibv.pd->handle,
			    .dest_qpn = qp->dest_qpn, .dest_pid = qp->peer, .rq_psn = qp->rq_psn,
			    .port = qp->port };

	if (fv.tab)
		slot_publish(&fv.tab->qp[qp->slot], &v, sizeof(v));
}

static uint32_t qpn_alloc(void)
{
	for (;;) {
		uint32_t n = fv.next_qpn++ & FV_QPN_MASK;

		if (n > 1 && !qp_by_num(n))
			return n;
	}
}

static int qp_check_init(const struct ibv_qp_init_attr *a)
{
	if (a->qp_type != IBV_QPT_RC || a->srq)
		return EOPNOTSUPP;
	if (!a->send_cq || !a->recv_cq || !a->cap.max_send_wr ||
	    a->cap.max_send_wr > FV_MAX_QP_WR || a->cap.max_recv_wr > FV_MAX_QP_WR ||
	    a->cap.max_send_sge > FV_MAX_SGE || a->cap.max_recv_sge > FV_MAX_SGE ||
	    a->cap.max_inline_data)
		return EINVAL;
	return 0;
}

static struct ibv_qp *fv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct fv_qp *qp;
	int e = qp_check_init(a), slot;

	if (e)
		return fv_fail(e);
	qp = fv_new(sizeof(*qp));
	if (!qp)
		return NULL;
	pthread_mutex_lock(&fv_lock);
	for (slot = 0; slot < FV_QPS && fv.qps[slot]; slot++)
		;
	if (slot == FV_QPS || !fv.tab) {
		pthread_mutex_unlock(&fv_lock);
		free(qp);
		return fv_fail(ENOMEM);
	}
	qp->slot = slot;
	qp->sig_all = a->sq_sig_all;
	qp->max_send_wr = a->cap.max_send_wr;
	qp->max_send_sge = a->cap.max_send_sge;
	qp->ibv = (struct ibv_qp){ .context = pd->context, .qp_context = a->qp_context, .pd = pd,
				   .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				   .qp_num = qpn_alloc(), .state = IBV_QPS_RESET,
				   .qp_type = IBV_QPT_RC };
	pthread_mutex_init(&qp->ibv.mutex, NULL);
	pthread_cond_init(&qp->ibv.cond, NULL);
	fv.qps[slot] = qp;
	((struct fv_pd *)pd)->users++;
	((struct fv_cq *)a->send_cq)->users++;
	((struct fv_cq *)a->recv_cq)->users++;
	qp_publish(qp, true);
	pthread_mutex_unlock(&fv_lock);
	return &qp->ibv;
}

static int fv_destroy_qp(struct ibv_qp *ibv)
{
	struct fv_qp *qp = (struct fv_qp *)ibv;

	pthread_mutex_lock(&fv_lock);
	qp_publish(qp, false);
	fv.qps[qp->slot] = NULL;
	((struct fv_pd *)ibv->pd)->users--;
	((struct fv_cq *)ibv->send_cq)->users--;
	((struct fv_cq *)ibv->recv_cq)->users--;
	pthread_mutex_unlock(&fv_lock);
	if (qp->peer_tab)
		munmap(qp->peer_tab, sizeof(*qp->peer_tab));
	pthread_mutex_destroy(&ibv->mutex);
	pthread_cond_destroy(&ibv->cond);
	free(qp);
	return 0;
}

/* The RC transitions the fake knows, with the masks the kernel requires and allows. */
static const struct {
	enum ibv_qp_state from, to;
	int req, opt;
} transitions[] = {
	{ IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0 },
	{ IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS },
	{ IBV_QPS_INIT, IBV_QPS_RTR,
	  IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	  IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX },
	{ IBV_QPS_RTR, IBV_QPS_RTS,
	  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		  IBV_QP_MAX_QP_RD_ATOMIC,
	  IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE },
	{ IBV_QPS_RTS, IBV_QPS_RTS, 0,
	  IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE },
};

/* Where the address vector @ah of a queue pair on port @port leads. Return: 0 or EINVAL. */
static int qp_check_av(const struct ibv_ah_attr *ah, unsigned int port, struct fv_addr *ret)
{
	struct fv_addr src, dst;
	uint8_t sgid[16];

	if (ah->port_num != port)
		return EINVAL;
	if (fv_ib() && !ah->is_global) { /* InfiniBand inside a subnet: by LID */
		*ret = lid_parse(ah->dlid);
		return ret->kind ? 0 : EINVAL;
	}
	/* RoCE needs a GRH (with one of this port's GIDs); InfiniBand may have one too */
	if (!ah->is_global || gid_make(sgid, port, ah->grh.sgid_index) < 0)
		return EINVAL;
	src = gid_parse(sgid);
	dst = gid_parse(ah->grh.dgid.raw);
	if (!dst.kind || (fv_ib() && ah->dlid != (dst.host << 4 | dst.port)))
		return EINVAL;
	*ret = dst;
	if (src.kind != dst.kind) /* e.g. a link-local source to an IPv4 address: no route */
		ret->rail = UINT32_MAX;
	return 0;
}

/* Checks the attributes in @mask that the fake looks at. Return: 0 or EINVAL. */
static int qp_check_attr(unsigned int port, const struct ibv_qp_attr *a, int mask)
{
	if (mask & IBV_QP_PORT && (a->port_num < 1 || a->port_num > fv_ports()))
		return EINVAL;
	if (mask & IBV_QP_PKEY_INDEX && a->pkey_index != 0)
		return EINVAL;
	if (mask & IBV_QP_ACCESS_FLAGS && a->qp_access_flags & ~FV_ACCESS_KNOWN)
		return EINVAL;
	if (mask & IBV_QP_PATH_MTU && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
		return EINVAL;
	if (mask & IBV_QP_DEST_QPN && a->dest_qp_num > FV_QPN_MASK)
		return EINVAL;
	if ((mask & IBV_QP_RQ_PSN && a->rq_psn > FV_QPN_MASK) ||
	    (mask & IBV_QP_SQ_PSN && a->sq_psn > FV_QPN_MASK))
		return EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC && a->max_dest_rd_atomic > FV_MAX_RD_ATOM) ||
	    (mask & IBV_QP_MAX_QP_RD_ATOMIC && a->max_rd_atomic > FV_MAX_RD_ATOM))
		return EINVAL;
	if ((mask & IBV_QP_TIMEOUT && a->timeout > 31) ||
	    (mask & IBV_QP_AV && a->ah_attr.sl > 15))
		return EINVAL;
	if ((mask & IBV_QP_RETRY_CNT && a->retry_cnt > 7) ||
	    (mask & IBV_QP_RNR_RETRY && a->rnr_retry > 7))
		return EINVAL;
	if (mask & IBV_QP_AV) {
		struct fv_addr dst;

		return qp_check_av(&a->ah_attr, port, &dst);
	}
	return 0;
}

/* Checks @mask for @from -> @to. Return: 0, or EINVAL (no such transition, wrong mask). */
static int qp_check_mask(enum ibv_qp_state from, enum ibv_qp_state to, int mask)
{
	int rest = mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);

	if (to == IBV_QPS_RESET || to == IBV_QPS_ERR)
		return rest ? EINVAL : 0;
	for (size_t i = 0; i < sizeof(transitions) / sizeof(transitions[0]); i++) {
		if (transitions[i].from != from || transitions[i].to != to)
			continue;
		if ((rest & transitions[i].req) != transitions[i].req)
			return EINVAL;
		return rest & ~(transitions[i].req | transitions[i].opt) ? EINVAL : 0;
	}
	return EINVAL;
}

static void qp_apply(struct fv_qp *qp, const struct ibv_qp_attr *a, int mask)
{
	if (mask & IBV_QP_ACCESS_FLAGS)
		qp->access = a->qp_access_flags;
	if (mask & IBV_QP_DEST_QPN)
		qp->dest_qpn = a->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		qp->rq_psn = a->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->sq_psn = a->sq_psn;
	if (mask & IBV_QP_PORT)
		qp->port = a->port_num;
	if (mask & IBV_QP_AV) {
		struct fv_addr dst = { 0 };

		qp_check_av(&a->ah_attr, qp->port, &dst); /* checked: cannot fail */
		qp->peer = host_pid(dst.host);
		qp->dest_port = (uint8_t)dst.port;
		qp->reachable = dst.rail == fv_rail(qp->port);
		qp->tc = a->ah_attr.is_global ? a->ah_attr.grh.traffic_class : 0;
		qp->sl = a->ah_attr.sl;
	}
	if (mask & IBV_QP_TIMEOUT)
		qp->timeout = a->timeout;
	if (a->qp_state == IBV_QPS_RESET) {
		qp->access = qp->dest_qpn = qp->rq_psn = qp->sq_psn = 0;
		qp->peer = 0;
		qp->port = qp->dest_port = 0;
		qp->reachable = false;
		qp->outstanding = qp->unretired = 0;
	}
	qp->ibv.state = a->qp_state;
}

static int fv_modify_qp(struct ibv_qp *ibv, struct ibv_qp_attr *a, int mask)
{
	struct fv_qp *qp = (struct fv_qp *)ibv;
	int e;

	if (!(mask & IBV_QP_STATE))
		return EOPNOTSUPP; /* changing attributes in place: the layer never does */
	pthread_mutex_lock(&fv_lock);
	e = mask & IBV_QP_CUR_STATE && a->cur_qp_state != ibv->state ? EINVAL : 0;
	if (!e)
		e = qp_check_mask(ibv->state, a->qp_state, mask);
	if (!e)
		e = qp_check_attr(mask & IBV_QP_PORT ? a->port_num : qp->port, a, mask);
	if (!e) {
		qp_apply(qp, a, mask);
		qp_publish(qp, true);
	}
	pthread_mutex_unlock(&fv_lock);
	return e;
}

/* ---- memory regions ----------------------------------------------------------------------- */

/*
 * Is [@start, @start + @len) mapped here (writable if @write)? With @st, it must be @st's file
 * at file offset @file_off onwards. Return: true, or true when /proc/self/maps cannot be read.
 */
static bool maps_cover(uint64_t start, uint64_t len, bool write, const struct stat *st,
		       uint64_t file_off)
{
	uint64_t at = start, end = start + len;
	FILE *f = fopen("/proc/self/maps", "re");
	char *line = NULL;
	size_t cap = 0;

	if (!f)
		return true;
	while (at < end && getline(&line, &cap, f) > 0) {
		unsigned long long lo, hi, off, ino;
		unsigned int maj, min;
		char perms[5];

		if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu", &lo, &hi, perms, &off, &maj,
			   &min, &ino) != 7 || hi <= at)
			continue;
		if (lo > at || perms[0] != 'r' || (write && perms[1] != 'w'))
			break;
		if (st && (ino != st->st_ino || maj != major(st->st_dev) ||
			   min != minor(st->st_dev) || off + (at - lo) != file_off + (at - start)))
			break;
		at = hi;
	}
	free(line);
	fclose(f);
	return at >= end;
}

/* Does [@start, @start + @len) touch fakecuda's device memory (its memfd "fakecuda")? */
static bool maps_device(uint64_t start, uint64_t len)
{
	FILE *f = fopen("/proc/self/maps", "re");
	uint64_t end = start + len;
	char *line = NULL;
	size_t cap = 0;
	bool dev = false;

	if (!f)
		return false;
	while (!dev && getline(&line, &cap, f) > 0) {
		unsigned long long lo, hi;
		int at = 0;

		if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %n", &lo, &hi, &at) < 2 || !at ||
		    hi <= start || lo >= end)
			continue;
		dev = !strncmp(line + at, "/memfd:fakecuda ", 16) ||
		      !strcmp(line + at, "/memfd:fakecuda\n");
	}
	free(line);
	fclose(f);
	return dev;
}

static struct ibv_mr *mr_add(struct ibv_pd *pd, uint64_t addr, size_t len, int access,
			     bool device)
{
	struct fv_mr *mr;
	int slot;

	mr = fv_new(sizeof(*mr));
	if (!mr)
		return NULL;
	pthread_mutex_lock(&fv_lock);
	for (slot = 0; slot < FV_MRS && fv.mrs[slot]; slot++)
		;
	if (slot == FV_MRS || !fv.tab) {
		pthread_mutex_unlock(&fv_lock);
		free(mr);
		return fv_fail(ENOMEM);
	}
	fv.key_gen = (fv.key_gen + 1) & 0xfffff;
	mr->slot = slot;
	mr->ibv = (struct ibv_mr){ .context = pd->context, .pd = pd, .addr = (void *)addr,
				   .length = len, .handle = (uint32_t)slot,
				   .lkey = (fv.key_gen ? fv.key_gen : 1) << 12 | (uint32_t)slot };
	mr->ibv.rkey = mr->ibv.lkey;
	fv.mrs[slot] = mr;
	((struct fv_pd *)pd)->users++;
	slot_publish(&fv.tab->mr[slot],
		     &(struct shm_mr){ .valid = 1, .rkey = mr->ibv.rkey, .access = (uint32_t)access,
				       .pd = pd->handle, .device = device, .addr = addr,
				       .len = len },
		     sizeof(struct shm_mr));
	pthread_mutex_unlock(&fv_lock);
	return &mr->ibv;
}

static int access_check(int access)
{
	if (access & ~FV_ACCESS_KNOWN)
		return EINVAL;
	if (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

static struct ibv_mr *fv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	uint64_t a = (uint64_t)(uintptr_t)addr, end;
	int e = access_check(access);

	fv_delay("ibv_reg_mr");
	if (e || !len || __builtin_add_overflow(a, len, &end))
		return fv_fail(EINVAL);
	if (!maps_cover(a, len, access & IBV_ACCESS_LOCAL_WRITE, NULL, 0))
		return fv_fail(EFAULT); /* the kernel could not pin it */
	if (!env_ulong("FAKEVERBS_PEER_MEMORY") && maps_device(a, len))
		return fv_fail(EFAULT); /* GPU memory without nvidia-peermem: get_user_pages fails */
	return mr_add(pd, a, len, access, maps_device(a, len));
}

/*
 * What this provider takes as a dma-buf: only what fakecuda's cuMemGetHandleForAddressRange()
 * returns, a device allocation's memfd ("fakecuda") opened again read-only, whose "dma-buf"
 * starts at the fd's file position (fakecuda opens device memory and IPC handles read-write).
 * Regular files, pipes, sockets and other memfds are none, as for the kernel. Its size: from
 * that position to the allocation's end. Return: 0, or a positive errno.
 */
static int fv_dmabuf_size(int fd, uint64_t *ret_size)
{
	char path[64], target[96];
	struct stat st;
	ssize_t n;
	off_t pos;
	int fl;

	if (fd < 0 || fstat(fd, &st) < 0 || (fl = fcntl(fd, F_GETFL)) < 0)
		return EBADF;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n < 0)
		return EBADF;
	target[n] = '\0';
	if (!S_ISREG(st.st_mode) || (fl & O_ACCMODE) != O_RDONLY ||
	    (strcmp(target, "/memfd:fakecuda") && strcmp(target, "/memfd:fakecuda (deleted)")))
		return ENOTTY;
	pos = lseek(fd, 0, SEEK_CUR);
	if (pos < 0 || pos >= st.st_size)
		return ENOTTY; /* an emptied allocation (freed by its exporter) */
	*ret_size = (uint64_t)(st.st_size - pos);
	return 0;
}

static struct ibv_mr *fv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
				       uint64_t iova, int fd, int access)
{
	uint64_t end, size = 0;
	struct stat st;
	off_t pos;
	int e = access_check(access);

	fv_delay("ibv_reg_dmabuf_mr");
	if (e || !len || __builtin_add_overflow(iova, len, &end))
		return fv_fail(EINVAL);
	if (env_ulong("FAKEVERBS_DMABUF_ERRNO"))
		return fv_fail((int)env_ulong("FAKEVERBS_DMABUF_ERRNO"));
	if (fstat(fd, &st) < 0)
		return fv_fail(EBADF);
	if (fv_dmabuf_size(fd, &size))
		return fv_fail(EINVAL); /* not a dma-buf: only fakecuda's exports are */
	pos = lseek(fd, 0, SEEK_CUR); /* where the dma-buf starts in its file (see top) */
	if (offset > size || len > size - offset)
		return fv_fail(EINVAL); /* past the end of the dma-buf */
	if (!maps_cover(iova, len, access & IBV_ACCESS_LOCAL_WRITE, &st, (uint64_t)pos + offset))
		return fv_fail(EINVAL); /* the fake needs the IOVA to be where those bytes are */
	return mr_add(pd, iova, len, access, true);
}

static int fv_dereg_mr(struct ibv_mr *ibv)
{
	struct fv_mr *mr = (struct fv_mr *)ibv;

	pthread_mutex_lock(&fv_lock);
	if (fv.tab)
		slot_publish(&fv.tab->mr[mr->slot], &(struct shm_mr){ .valid = 0 },
			     sizeof(struct shm_mr));
	fv.mrs[mr->slot] = NULL;
	((struct fv_pd *)ibv->pd)->users--;
	pthread_mutex_unlock(&fv_lock);
	free(mr);
	return 0;
}

/* ---- RDMA writes -------------------------------------------------------------------------- */

static bool range_in(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
	return addr >= base && addr - base <= size && len <= size - (addr - base);
}

/* Is @sge inside a region of this process registered on @qp's PD? */
static bool sge_ok(const struct fv_qp *qp, const struct ibv_sge *sge)
{
	const struct fv_mr *mr = fv.mrs[sge->lkey & FV_KEY_INDEX];

	return mr && mr->ibv.lkey == sge->lkey && mr->ibv.pd == qp->ibv.pd &&
	       range_in(sge->addr, sge->length, (uint64_t)(uintptr_t)mr->ibv.addr,
			mr->ibv.length);
}

/* Does the peer's queue pair accept our packets? Return: IBV_WC_SUCCESS or the error. */
static enum ibv_wc_status peer_check(struct fv_qp *qp, struct shm_qp *ret, uint32_t *vendor)
{
	if (qp->peer_tab && !__atomic_load_n(&qp->peer_tab->alive, __ATOMIC_ACQUIRE)) {
		munmap(qp->peer_tab, sizeof(*qp->peer_tab));
		qp->peer_tab = NULL;
	}
	if (!qp->peer_tab)
		qp->peer_tab = table_map_peer(qp->peer);
	if (!qp->peer_tab || !__atomic_load_n(&qp->peer_tab->alive, __ATOMIC_ACQUIRE)) {
		*vendor = FV_VE_NO_PEER;
		return IBV_WC_RETRY_EXC_ERR; /* nobody answers */
	}
	for (int i = 0; i < FV_QPS; i++) {
		if (!slot_read(&qp->peer_tab->qp[i], ret, sizeof(*ret)) || !ret->valid ||
		    ret->qpn != qp->dest_qpn)
			continue;
		*vendor = FV_VE_PEER_QP;
		if ((ret->state != IBV_QPS_RTR && ret->state != IBV_QPS_RTS) ||
		    ret->dest_qpn != qp->ibv.qp_num || ret->dest_pid != fv.pid ||
		    ret->port != qp->dest_port)
			return IBV_WC_RETRY_EXC_ERR; /* packets dropped */
		*vendor = FV_VE_PSN;
		if (ret->rq_psn != qp->sq_psn)
			return IBV_WC_RETRY_EXC_ERR;
		*vendor = FV_VE_QP_ACCESS;
		if (!(ret->access & IBV_ACCESS_REMOTE_WRITE))
			return IBV_WC_REM_ACCESS_ERR;
		*vendor = 0;
		return IBV_WC_SUCCESS;
	}
	*vendor = FV_VE_PEER_QP;
	return IBV_WC_RETRY_EXC_ERR;
}

/* Is [@addr, @addr + @len) writable through @rkey in the peer's table, from @pqp's PD? */
static enum ibv_wc_status rkey_check(const struct fv_qp *qp, const struct shm_qp *pqp,
				     uint32_t rkey, uint64_t addr, uint64_t len, uint32_t *vendor,
				     bool *device)
{
	struct shm_mr m;

	*vendor = FV_VE_RKEY;
	if (!slot_read(&qp->peer_tab->mr[rkey & FV_KEY_INDEX], &m, sizeof(m)) || !m.valid ||
	    m.rkey != rkey || m.pd != pqp->pd || !(m.access & IBV_ACCESS_REMOTE_WRITE))
		return IBV_WC_REM_ACCESS_ERR;
	*vendor = FV_VE_RANGE;
	if (!range_in(addr, len, m.addr, m.len))
		return IBV_WC_REM_ACCESS_ERR;
	*vendor = 0;
	*device = m.device;
	return IBV_WC_SUCCESS;
}

/* ---- writes into device memory that land late (FAKEVERBS_WRITE_LAG) ------------------------ */

struct lag_rec {
	uint64_t addr, len; /* then @len bytes */
};

static void lag_path(char *path, size_t len, pid_t pid)
{
	snprintf(path, len, FV_SHM_DIR "/" FV_SHM_PREFIX "%d.lag", (int)pid);
}

/* Appends @wr's bytes for [@raddr, ...) of process @pid to its spool. Return: 0 or errno. */
static int lag_write(pid_t pid, const struct ibv_send_wr *wr, uint64_t raddr, uint64_t total)
{
	struct lag_rec h = { raddr, total };
	char path[64];
	int fd, e = 0;

	lag_path(path, sizeof(path), pid);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return errno;
	while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
		;
	if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
		e = EIO;
	for (int i = 0; !e && i < wr->num_sge; i++) {
		const struct ibv_sge *s = &wr->sg_list[i];

		if (write(fd, (const void *)(uintptr_t)s->addr, s->length) != (ssize_t)s->length)
			e = EIO;
	}
	close(fd);
	return e;
}

/*
 * fakeverbs_flush() - lands every write spooled for this process (fakecuda calls it from
 * cuFlushGPUDirectRDMAWrites() and synchronous device reads), in the order they were written;
 * a write into memory no longer mapped is dropped. Return: the writes landed.
 */
__attribute__((visibility("default"))) int fakeverbs_flush(void);
__attribute__((visibility("default"))) int fakeverbs_flush(void)
{
	struct lag_rec h;
	char path[64];
	int fd, n = 0;

	lag_path(path, sizeof(path), getpid());
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
		;
	while (read(fd, &h, sizeof(h)) == (ssize_t)sizeof(h)) {
		char *buf = h.len <= FV_MAX_MSG ? malloc(h.len ? h.len : 1) : NULL;

		if (!buf || read(fd, buf, h.len) != (ssize_t)h.len) {
			free(buf);
			break;
		}
		if (maps_cover(h.addr, h.len, true, NULL, 0)) {
			memcpy((void *)(uintptr_t)h.addr, buf, h.len);
			n++;
		}
		free(buf);
	}
	if (ftruncate(fd, 0) < 0) {
		/* the next flush lands them again: harmless for the tests */
	}
	close(fd);
	return n;
}

/* Copies @wr's gather list to @pid at @raddr. Return: 0 or errno. */
static int copy_out(pid_t pid, const struct ibv_send_wr *wr, uint64_t raddr)
{
	for (int i = 0; i < wr->num_sge; i++) {
		const struct ibv_sge *s = &wr->sg_list[i];
		uint64_t off = 0;

		while (off < s->length) {
			struct iovec l = { (void *)(uintptr_t)(s->addr + off), s->length - off };
			struct iovec r = { (void *)(uintptr_t)(raddr + off), s->length - off };
			ssize_t k = process_vm_writev(pid, &l, 1, &r, 1, 0);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				return k < 0 ? errno : EFAULT;
			off += (uint64_t)k;
		}
		raddr += s->length;
	}
	return 0;
}

/* Performs one RDMA write. Return: its completion status, the reason in @vendor. */
static enum ibv_wc_status rdma_write(struct fv_qp *qp, const struct ibv_send_wr *wr,
				     uint32_t *vendor)
{
	unsigned long fail_at = env_ulong("FAKEVERBS_FAIL_WRITES");
	const char *down = getenv("FAKEVERBS_FABRIC_DOWN");
	bool device = false;
	uint64_t raddr = wr->wr.rdma.remote_addr, total = 0;
	enum ibv_wc_status st;
	struct shm_qp pqp;
	int e;

	*vendor = FV_VE_LKEY;
	for (int i = 0; i < wr->num_sge; i++) {
		if (!sge_ok(qp, &wr->sg_list[i]))
			return IBV_WC_LOC_PROT_ERR;
		total += wr->sg_list[i].length;
	}
	*vendor = 0;
	if (total > FV_MAX_MSG)
		return IBV_WC_LOC_LEN_ERR;
	*vendor = FV_VE_INJECTED;
	if (++fv.writes >= fail_at && fail_at)
		return IBV_WC_REM_ACCESS_ERR;
	*vendor = FV_VE_FABRIC_DOWN;
	if (down && *down && access(down, F_OK) == 0)
		return IBV_WC_RETRY_EXC_ERR; /* every retry timed out */
	*vendor = FV_VE_UNREACHABLE;
	if (!qp->reachable)
		return IBV_WC_RETRY_EXC_ERR; /* another rail: the fabric drops the packets */
	*vendor = FV_VE_CLASS;
	if ((getenv("FAKEVERBS_TC") && qp->tc != env_ulong("FAKEVERBS_TC")) ||
	    (getenv("FAKEVERBS_SL") && qp->sl != env_ulong("FAKEVERBS_SL")))
		return IBV_WC_RETRY_EXC_ERR; /* a lossy class: dropped under load */
	*vendor = FV_VE_TIMEOUT;
	if (qp->timeout < env_ulong("FAKEVERBS_FABRIC_TIMEOUT"))
		return IBV_WC_RETRY_EXC_ERR; /* every ACK came after the timeout */
	st = peer_check(qp, &pqp, vendor);
	if (st != IBV_WC_SUCCESS || !total)
		return st;
	st = rkey_check(qp, &pqp, wr->wr.rdma.rkey, raddr, total, vendor, &device);
	if (st != IBV_WC_SUCCESS)
		return st;
	if (device && env_ulong("FAKEVERBS_WRITE_LAG")) { /* completes now, lands when flushed */
		e = lag_write(qp->peer, wr, raddr, total);
		*vendor = e ? FV_VE_ERRNO + (uint32_t)e : 0;
		return e ? IBV_WC_GENERAL_ERR : IBV_WC_SUCCESS;
	}
	e = copy_out(qp->peer, wr, raddr);
	*vendor = e ? FV_VE_ERRNO + (uint32_t)e : 0;
	if (e == ESRCH)
		return IBV_WC_RETRY_EXC_ERR;
	return e == EFAULT ? IBV_WC_REM_ACCESS_ERR : e ? IBV_WC_GENERAL_ERR : IBV_WC_SUCCESS;
}

/* Executes @wr (or flushes it in ERROR) and generates its completion if it has one. Locked. */
static void send_one(struct fv_qp *qp, const struct ibv_send_wr *wr)
{
	enum ibv_wc_status st = IBV_WC_WR_FLUSH_ERR;
	uint32_t vendor = 0;
	struct ibv_wc wc;

	qp->outstanding++;
	qp->unretired++;
	if (qp->ibv.state != IBV_QPS_ERR)
		st = rdma_write(qp, wr, &vendor);
	if (st != IBV_WC_SUCCESS && qp->ibv.state != IBV_QPS_ERR) {
		qp->ibv.state = IBV_QPS_ERR; /* later work requests are flushed */
		qp_publish(qp, true);
	}
	if (st == IBV_WC_SUCCESS && !qp->sig_all && !(wr->send_flags & IBV_SEND_SIGNALED))
		return;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr->wr_id;
	wc.status = st;
	wc.opcode = IBV_WC_RDMA_WRITE;
	wc.vendor_err = vendor;
	wc.qp_num = qp->ibv.qp_num;
	cq_push((struct fv_cq *)qp->ibv.send_cq, &wc, qp->unretired);
	qp->unretired = 0;
}

/* Can @wr be queued now? Return: 0, EINVAL (unsupported) or ENOMEM (send queue full). */
static int send_check(const struct fv_qp *qp, const struct ibv_send_wr *wr)
{
	if (wr->opcode != IBV_WR_RDMA_WRITE || wr->num_sge < 0 ||
	    (uint32_t)wr->num_sge > qp->max_send_sge || (wr->num_sge && !wr->sg_list) ||
	    wr->send_flags & IBV_SEND_INLINE)
		return EINVAL;
	return qp->outstanding >= qp->max_send_wr ? ENOMEM : 0;
}

static int fv_post_send(struct ibv_qp *ibv, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fv_qp *qp = (struct fv_qp *)ibv;
	int e = 0;

	pthread_mutex_lock(&fv_lock);
	if (ibv->state != IBV_QPS_RTS && ibv->state != IBV_QPS_ERR)
		e = EINVAL;
	for (; !e && wr; wr = wr->next) {
		e = send_check(qp, wr);
		if (!e)
			send_one(qp, wr);
	}
	pthread_mutex_unlock(&fv_lock);
	if (e && bad)
		*bad = wr;
	return e;
}

__attribute__((visibility("default"))) const struct tpv_ops tpv_ops_table = {
	.get_device_list = fv_get_device_list,
	.free_device_list = fv_free_device_list,
	.open_device = fv_open_device,
	.close_device = fv_close_device,
	.query_device = fv_query_device,
	.query_port = fv_query_port,
	.query_gid_ex = fv_query_gid_ex,
	.alloc_pd = fv_alloc_pd,
	.dealloc_pd = fv_dealloc_pd,
	.create_comp_channel = fv_create_comp_channel,
	.destroy_comp_channel = fv_destroy_comp_channel,
	.create_cq = fv_create_cq,
	.destroy_cq = fv_destroy_cq,
	.req_notify_cq = fv_req_notify_cq,
	.get_cq_event = fv_get_cq_event,
	.ack_cq_events = fv_ack_cq_events,
	.poll_cq = fv_poll_cq,
	.create_qp = fv_create_qp,
	.destroy_qp = fv_destroy_qp,
	.modify_qp = fv_modify_qp,
	.reg_mr = fv_reg_mr,
	.reg_dmabuf_mr = fv_reg_dmabuf_mr,
	.dmabuf_size = fv_dmabuf_size,
	.dereg_mr = fv_dereg_mr,
	.post_send = fv_post_send,
};
