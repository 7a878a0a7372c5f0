/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The process a CMA copy may touch, and the credentials it is touched with. A client is pinned
 * at attach by a pidfd (SO_PEERPIDFD, or pidfd_open() of the SO_PEERCRED pid on kernels before
 * 6.5) and its /proc directory, opened while the pidfd said alive and checked to show the
 * socket's uid. process_vm_readv/writev still take a pid number, so every access is made as the
 * client: a short-lived child task that shares the daemon's memory (clone(CLONE_VM), so the
 * local side of the copy is the daemon's own buffer) takes the client's real and effective uid
 * and gid, drops its effective capabilities and makes the syscall, and the kernel's ptrace
 * check (PTRACE_MODE_ATTACH_REALCREDS: the target's uids and gids all equal ours, the target
 * dumpable, Yama) decides inside it. A recycled pid owned by another user, a client that exec'd
 * a setuid binary or made itself non-dumpable is refused (EPERM) atomically, which no check
 * before the copy could guarantee. The pidfd is checked before each access and after each read
 * as well, so a pid recycled within the same user is not read either.
 *
 * Why a child and not the copy thread itself: a task running as uid U may be signalled by U
 * (the kernel compares the sender's uids with the target task's real and saved uid), and a
 * SIGKILL or SIGSTOP sent to any thread stops the whole daemon. Measured: with the switch done
 * on the copy threads, a client's user could signal them in over half of its tries while its
 * memory was copied. The child is its own process with every signal blocked; a signal that
 * kills it fails that transfer only, one that stops it is met by a kill after AS_TIMEOUT_MS.
 * The price is a clone() per access (tens of microseconds), paid once per copy of up to 4 MiB.
 * The child shares the daemon's memory, so that memory is kept non-dumpable (the child sets it):
 * else the client's user could ptrace the child and so the daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../tpb.h"
#include "tpu.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
/* 16-bit id syscalls on some 32-bit ABIs: take the 32-bit ones there. */
#ifdef SYS_setresuid32
#define SYS_SETRESUID SYS_setresuid32
#define SYS_SETRESGID SYS_setresgid32
#define SYS_GETRESUID SYS_getresuid32
#define SYS_GETRESGID SYS_getresgid32
#else
#define SYS_SETRESUID SYS_setresuid
#define SYS_SETRESGID SYS_setresgid
#define SYS_GETRESUID SYS_getresuid
#define SYS_GETRESGID SYS_getresgid
#endif

struct tpb_proc {
	atomic_uint refs;
	pid_t pid;
	int pidfd;
	int procfd; /* /proc/<pid>, bound to this very process, or -EBADF */
	uid_t uid;
	gid_t gid;
	uint64_t label;
	atomic_bool cma_off;
};

/* ---- the pinned process -------------------------------------------------------------------- */

int tpb_proc_new(int pidfd, int procfd, pid_t pid, uid_t uid, gid_t gid, uint64_t label,
		 struct tpb_proc **ret)
{
	struct tpb_proc *p = calloc(1, sizeof(*p));

	if (!p) {
		tpu_close(pidfd);
		tpu_close(procfd);
		return -ENOMEM;
	}
	atomic_init(&p->refs, 1);
	atomic_init(&p->cma_off, false);
	p->pidfd = pidfd;
	p->procfd = procfd;
	p->pid = pid;
	p->uid = uid;
	p->gid = gid;
	p->label = label;
	*ret = p;
	return 0;
}

struct tpb_proc *tpb_proc_ref(struct tpb_proc *p)
{
	if (p)
		atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
	return p;
}

void tpb_proc_unref(struct tpb_proc *p)
{
	if (!p || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
		return;
	tpu_close(p->pidfd);
	tpu_close(p->procfd);
	free(p);
}

pid_t tpb_proc_pid(const struct tpb_proc *p)
{
	return p ? p->pid : 0;
}

/* A pidfd becomes readable once its process has exited. */
static bool pidfd_alive(int pidfd)
{
	struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
	int n;

	do
		n = poll(&pfd, 1, 0);
	while (n < 0 && errno == EINTR);
	return n == 0;
}

bool tpb_proc_alive(const struct tpb_proc *p)
{
	return p && p->pidfd >= 0 && pidfd_alive(p->pidfd);
}

bool tpb_proc_cma_off(const struct tpb_proc *p)
{
	return !p || atomic_load_explicit(&p->cma_off, memory_order_relaxed);
}

int tpb_proc_openat(const struct tpb_proc *p, const char *name)
{
	int fd;

	if (!p || p->procfd < 0)
		return -EBADF;
	fd = openat(p->procfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	return fd < 0 ? -errno : fd;
}

/* Effective uid from the "Uid:" line of the status file under @procfd. Return: 0 or -errno. */
static int status_euid(int procfd, uid_t *ret)
{
	char buf[4096];
	unsigned long ruid, euid;
	ssize_t n;
	int fd = openat(procfd, "status", O_RDONLY | O_CLOEXEC);
	const char *u;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n < 0)
		n = -errno;
	tpu_close(fd);
	if (n < 0)
		return (int)n;
	buf[n] = '\0';
	u = strstr(buf, "\nUid:");
	if (!u || sscanf(u + 5, "%lu %lu", &ruid, &euid) != 2)
		return -EBADMSG;
	*ret = (uid_t)euid;
	return 0;
}

int tpb_proc_pin(int sock, pid_t pid, uid_t uid, gid_t gid, uint64_t label,
		 struct tpb_proc **ret, char *why, size_t why_len)
{
	_cleanup_close_ int pidfd = -EBADF, procfd = -EBADF;
	socklen_t len = sizeof(pidfd);
	char path[32];
	uid_t seen;
	int r;

	if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0) {
		pidfd = -EBADF;
		if (errno != ENOPROTOOPT && errno != EINVAL) {
			r = -errno;
			snprintf(why, why_len, "SO_PEERPIDFD: %s", strerror(-r));
			return r;
		}
		/* Before Linux 6.5: the pid may be reused before this, hence the uid check below
		 * (and the kernel's own check at every access). */
		pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
		if (pidfd < 0) {
			r = -errno;
			snprintf(why, why_len, "pidfd_open(%d): %s", (int)pid, strerror(-r));
			return r;
		}
	}
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	procfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (procfd < 0) {
		r = -errno;
		snprintf(why, why_len, "%s: %s", path, strerror(-r));
		return r;
	}
	/* Alive after the open: the directory is that of the pinned process, not of a successor
	 * that took its number. */
	if (!pidfd_alive(pidfd)) {
		snprintf(why, why_len, "process %d exited during attach", (int)pid);
		return -ESRCH;
	}
	r = status_euid(procfd, &seen);
	if (r < 0) {
		snprintf(why, why_len, "%s/status: %s", path, strerror(-r));
		return r;
	}
	if (seen != uid) {
		snprintf(why, why_len, "process %d runs as uid %u, its socket says %u", (int)pid,
			 (unsigned)seen, (unsigned)uid);
		return -EPERM;
	}
	return tpb_proc_new(TAKE_FD(pidfd), TAKE_FD(procfd), pid, uid, gid, label, ret);
}

/* ---- acting as the client on this thread --------------------------------------------------- */

static int as_mode = -1; /* 1 can switch, 0 same uid only; set once by tpb_cma_as_probe() */

static int caps_get(uint32_t sets[6])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	/* Zeroed first: valgrind's capget model marks only the first of the two structs written. */
	struct __user_cap_data_struct d[2] = { { 0 } };

	if (syscall(SYS_capget, &h, d) < 0)
		return -errno;
	for (int i = 0; i < 2; i++) {
		sets[3 * i] = d[i].effective;
		sets[3 * i + 1] = d[i].permitted;
		sets[3 * i + 2] = d[i].inheritable;
	}
	return 0;
}

static int caps_set(const uint32_t sets[6])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2];

	for (int i = 0; i < 2; i++) {
		d[i].effective = sets[3 * i];
		d[i].permitted = sets[3 * i + 1];
		d[i].inheritable = sets[3 * i + 2];
	}
	return syscall(SYS_capset, &h, d) < 0 ? -errno : 0;
}

static bool cap_has(const uint32_t sets[6], int cap)
{
	return sets[3 * (cap / 32)] & (1u << (cap % 32));
}

int tpb_cma_as_probe(void)
{
	uint32_t sets[6];

	if (as_mode < 0)
		as_mode = caps_get(sets) == 0 && cap_has(sets, CAP_SETUID) &&
			  cap_has(sets, CAP_SETGID);
	return as_mode;
}

bool tpb_cma_as_allowed(uid_t uid)
{
	return tpb_cma_as_probe() == 1 || uid == geteuid();
}

/*
 * Each credential change costs a prepare_creds()/commit_creds() in the kernel (a microsecond or
 * two), so only what differs is changed: ids already equal stay, and capabilities are set only
 * when the kernel has not already cleared them (it empties the effective set when the euid
 * leaves 0, and refills it from the permitted set when the euid comes back).
 */
int tpb_cma_as_enter(uid_t uid, gid_t gid, struct tpb_cma_as *ret)
{
	struct tpb_cma_as as = { 0 };
	uint32_t now[6];
	int r;

	if (syscall(SYS_GETRESUID, &as.ruid, &as.euid, &as.suid) < 0 ||
	    syscall(SYS_GETRESGID, &as.rgid, &as.egid, &as.sgid) < 0)
		return -errno;
	r = caps_get(as.caps);
	if (r < 0)
		return r;
	if (tpb_cma_as_probe() == 1) {
		if ((gid != as.rgid || gid != as.egid) &&
		    syscall(SYS_SETRESGID, gid, gid, as.sgid) < 0)
			return -errno;
		as.gid_switched = gid != as.rgid || gid != as.egid;
		if ((uid != as.ruid || uid != as.euid) &&
		    syscall(SYS_SETRESUID, uid, uid, as.suid) < 0) {
			r = -errno;
			tpb_cma_as_leave(&as);
			return r;
		}
		as.uid_switched = uid != as.ruid || uid != as.euid;
	} else if (uid != as.euid) {
		return -EPERM;
	}
	r = as.uid_switched ? caps_get(now) : 0;
	if (!as.uid_switched)
		memcpy(now, as.caps, sizeof(now));
	if (r == 0 && (now[0] | now[3])) {
		now[0] = now[3] = 0; /* no effective capabilities: no CAP_SYS_PTRACE override */
		r = caps_set(now);
		as.caps_dropped = r == 0;
	}
	if (r < 0) {
		tpb_cma_as_leave(&as);
		return r;
	}
	*ret = as;
	return 0;
}

void tpb_cma_as_leave(const struct tpb_cma_as *as)
{
	uint32_t now[6];

	/* A thread left running as a client would be a kernel or programming error: stop. */
	if (as->uid_switched && syscall(SYS_SETRESUID, as->ruid, as->euid, as->suid) < 0)
		abort();
	if (as->caps_dropped || as->uid_switched) {
		if (caps_get(now) < 0)
			abort();
		if (memcmp(now, as->caps, sizeof(now)) != 0 && caps_set(as->caps) < 0)
			abort();
	}
	if (as->gid_switched && syscall(SYS_SETRESGID, as->rgid, as->egid, as->sgid) < 0)
		abort();
}

/* ---- copies -------------------------------------------------------------------------------- */

static int move(pid_t pid, void *buf, uint64_t addr, uint64_t len, bool write)
{
	while (len) {
		size_t chunk = len > (1ull << 30) ? (1ull << 30) : (size_t)len;
		struct iovec l = { buf, chunk }, r = { (void *)(uintptr_t)addr, chunk };
		ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
				  : process_vm_readv(pid, &l, 1, &r, 1, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EFAULT;
		buf = (char *)buf + n;
		addr += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* An access to @p was refused or found it gone: no more CMA for it. Return: @r. */
static int refused(struct tpb_proc *p, int r, char *why, size_t why_len)
{
	atomic_store_explicit(&p->cma_off, true, memory_order_relaxed);
	if (r == -ESRCH)
		snprintf(why, why_len, "client process %d has exited; no more CMA for it",
			 (int)p->pid);
	else
		snprintf(why, why_len, "process %d refused as uid %u (%s: setuid exec, not "
			 "dumpable or Yama); no more CMA for it", (int)p->pid, (unsigned)p->uid,
			 r == -EPERM ? "EPERM" : strerror(-r));
	return r;
}

/* One access to @p, by a task that already acts as @p's user. Touches no TLS but errno, takes
 * no lock and allocates nothing (it runs in as_child()). Return: 0 or -errno. */
static int access_raw(struct tpb_proc *p, void *buf, uint64_t addr, uint64_t len, bool write)
{
	int r;

	if (!tpb_proc_alive(p))
		return -ESRCH;
	r = move(p->pid, buf, addr, len, write);
	if (r == 0 && !write && !tpb_proc_alive(p)) {
		/* It may have exited before the read and its pid been reused since. */
		memset(buf, 0, len);
		r = -ESRCH;
	}
	return r;
}

/*
 * What one child does: act as @uid/@gid, then read @src (into @buf) and/or write @dst (from
 * @buf), @len bytes from each side's address, in @step pieces (the bounce buffer's size).
 */
struct as_call {
	uid_t uid;
	gid_t gid;
	struct tpb_proc *src, *dst; /* either may be NULL */
	uint64_t src_addr, dst_addr, len;
	void *buf;
	size_t step;
	int r;
	bool entered; /* the credentials were taken: a failure after it is the kernel's answer */
	bool dst_failed; /* the error is @dst's (else @src's) */
};

static int as_child(void *arg)
{
	struct as_call *c = arg;
	struct tpb_cma_as as;
	int r;

	/* The memory we share with the daemon must not become ptrace-able by the client's user
	 * (the kernel does this too when the euid changes, unless fs.suid_dumpable says else). */
	r = prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 ? -errno : 0;
	if (r == 0)
		r = tpb_cma_as_enter(c->uid, c->gid, &as);

	c->entered = r == 0;
	for (uint64_t done = 0; r == 0 && done < c->len;) {
		uint64_t n = TPU_MIN(c->len - done, (uint64_t)c->step);

		if (c->src)
			r = access_raw(c->src, c->buf, c->src_addr + done, n, false);
		if (r == 0 && c->dst) {
			r = access_raw(c->dst, c->buf, c->dst_addr + done, n, true);
			c->dst_failed = r < 0;
		}
		done += n;
	}
	c->r = r;
	return 0; /* exits; its credentials go with it */
}

#define AS_STACK (32u << 10)
#define AS_TIMEOUT_MS 2000

/*
 * Runs @c in a child task that shares our memory, files and fs (clone(CLONE_VM)) but is its
 * own process: the credentials it takes are never this thread's, and a signal its user sends
 * it (which the kernel allows while it runs as that user) reaches only the child, never the
 * daemon. All signals are blocked in it; a child that does not finish within AS_TIMEOUT_MS
 * (stopped, say) is killed. Return: 0 (result in @c->r) or -errno (no child, or killed).
 */
static int run_as(struct as_call *c)
{
	char stack[AS_STACK] __attribute__((aligned(64)));
	struct pollfd pfd = { .events = POLLIN };
	sigset_t all, old;
	siginfo_t info;
	int pidfd = -1, r = 0;
	pid_t pid;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid = clone(as_child, stack + sizeof(stack), CLONE_VM | CLONE_FS | CLONE_FILES |
		    CLONE_PIDFD, c, &pidfd);
	if (pid < 0)
		r = -errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0)
		return r;
	pfd.fd = pidfd;
	while ((r = poll(&pfd, 1, AS_TIMEOUT_MS)) < 0 && errno == EINTR)
		;
	if (r <= 0) {
		syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
		r = -ETIMEDOUT;
	} else {
		r = 0;
	}
	memset(&info, 0, sizeof(info));
	while (waitid(P_PIDFD, (id_t)pidfd, &info, WEXITED | __WALL) < 0 && errno == EINTR)
		;
	close(pidfd);
	if (r == 0 && !(info.si_code == CLD_EXITED && info.si_status == 0))
		r = -ECHILD; /* killed: by the client's user, who may signal it */
	return r;
}

/* Result of @c for @p (a side of it), turning CMA off for @p on EPERM/ESRCH. */
static int as_result(struct tpb_proc *p, const struct as_call *c, int r, char *why,
		     size_t why_len)
{
	if (r < 0) {
		/* Killed or stopped by someone of the client's uid (who may signal it), or no
		 * task to be had: no more CMA for this client either way. */
		atomic_store_explicit(&p->cma_off, true, memory_order_relaxed);
		snprintf(why, why_len, "cross-memory attach helper for process %d %s; no more CMA "
			 "for it", (int)p->pid, r == -ECHILD ? "was killed" : r == -ETIMEDOUT ?
			 "timed out (stopped?)" : strerror(-r));
		return r == -ECHILD ? -EINTR : r;
	}
	r = c->r;
	if (!c->entered && r < 0)
		return refused(p, r == -ESRCH ? -ESRCH : -EPERM, why, why_len);
	if (r == -EPERM || r == -ESRCH)
		return refused(p, r, why, why_len);
	return r;
}

/*
 * CMA to @p was turned off before: -ESRCH if it has exited since (so that a transfer racing with
 * its death reads as a peer that died, whichever copy found it first), else -EPERM.
 */
static int off_result(const struct tpb_proc *p, char *why, size_t why_len)
{
	if (!tpb_proc_alive(p)) {
		snprintf(why, why_len, "client process %d has exited", (int)p->pid);
		return -ESRCH;
	}
	snprintf(why, why_len, "CMA to client process %d was turned off by an earlier refusal",
		 (int)p->pid);
	return -EPERM;
}

int tpb_cma_move(struct tpb_proc *p, void *buf, uint64_t addr, uint64_t len, bool write,
		 char *why, size_t why_len)
{
	struct as_call c = { .buf = buf, .len = len, .step = len ? len : 1 };

	if (!p)
		return -ESRCH;
	if (tpb_proc_cma_off(p))
		return off_result(p, why, why_len);
	c.uid = p->uid;
	c.gid = p->gid;
	if (write) {
		c.dst = p;
		c.dst_addr = addr;
	} else {
		c.src = p;
		c.src_addr = addr;
	}
	return as_result(p, &c, run_as(&c), why, why_len);
}

int tpb_cma_bounce(struct tpb_proc *src, uint64_t src_addr, struct tpb_proc *dst,
		   uint64_t dst_addr, uint64_t len, void *bounce, size_t bounce_len, char *why,
		   size_t why_len)
{
	struct as_call c = { .buf = bounce, .step = bounce_len, .src = src, .dst = dst,
			     .src_addr = src_addr, .dst_addr = dst_addr, .len = len };
	int r;

	if (!src || !dst)
		return -ESRCH;
	if (src->uid != dst->uid || src->gid != dst->gid) { /* each side as its own user */
		r = 0;
		for (uint64_t done = 0; r == 0 && done < len;) {
			uint64_t n = TPU_MIN(len - done, (uint64_t)bounce_len);

			r = tpb_cma_move(src, bounce, src_addr + done, n, false, why, why_len);
			if (r == 0)
				r = tpb_cma_move(dst, bounce, dst_addr + done, n, true, why, why_len);
			done += n;
		}
		return r;
	}
	/* Both ends of one user: one child for every chunk, each access still checked. */
	if (tpb_proc_cma_off(src) || tpb_proc_cma_off(dst))
		return off_result(tpb_proc_cma_off(src) ? src : dst, why, why_len);
	c.uid = src->uid;
	c.gid = src->gid;
	r = run_as(&c);
	return as_result(c.dst_failed ? dst : src, &c, r, why, why_len);
}
