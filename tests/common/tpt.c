/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Test harness: daemon lifecycle, child processes, deadlines, sync pipes, byte patterns and
 * command capture. See tpt.h.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "tpt.h"

#define PEER_OFF "[peer]\nlisten = off\n"

uint64_t tpt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

long tpt_cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	/* after "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
	 * cmajflt utime stime */
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)(ut + st);
}

void tpt_backoff(unsigned round)
{
	unsigned ms = round < 5 ? 1u << round : 20;
	struct timespec ts = { 0, (long)ms * 1000000L };

	nanosleep(&ts, NULL);
}

void tpt_log(const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	int n, m;

	n = snprintf(line, sizeof(line), "[%d] ", (int)getpid());
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m < (int)(sizeof(line) - n - 2) ? m : (int)(sizeof(line) - n - 2);
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}

/* ---- child processes --------------------------------------------------------------------- */

/* In a fresh child: die with the parent. Returns false if the parent is already gone. */
static bool child_tie_to_parent(pid_t parent)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		return false;
	return getppid() == parent;
}

int tpt_become(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		return -errno;
	return 0;
}

int tpt_become_user(uid_t uid)
{
	int r = tpt_become(uid);

	if (r == 0 && prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
		r = -errno;
	if (r < 0)
		fprintf(stderr, "tpt_become_user(%u): %s\n", (unsigned)uid, strerror(-r));
	return r;
}

pid_t tpt_fork(tpt_child_fn fn, void *arg)
{
	pid_t parent = getpid(), pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int r = 127;
		if (child_tie_to_parent(parent))
			r = fn(arg);
		fflush(NULL);
		_exit(r & 0xff);
	}
	return pid;
}

static int pidfd_open_compat(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	errno = ENOSYS;
	return -1;
#endif
}

/* Waits until @pid can be reaped or @timeout_ms passes. Return: 0 or -ETIMEDOUT. */
static int wait_exit(pid_t pid, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	int pfd = pidfd_open_compat(pid);
	siginfo_t si;

	if (pfd >= 0) {
		struct pollfd p = { .fd = pfd, .events = POLLIN };
		int r;
		do {
			int left = (int)(deadline > tpt_now_ms() ? deadline - tpt_now_ms() : 0);
			r = poll(&p, 1, left);
		} while (r < 0 && errno == EINTR);
		close(pfd);
		return r > 0 ? 0 : -ETIMEDOUT;
	}
	for (unsigned round = 0;; round++) {
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0)
			return -errno;
		if (si.si_pid == pid)
			return 0;
		if (tpt_now_ms() >= deadline)
			return -ETIMEDOUT;
		tpt_backoff(round);
	}
}

int tpt_wait(pid_t pid, int timeout_ms, int *ret_status)
{
	int status = 0, r = wait_exit(pid, timeout_ms);

	if (r == -ETIMEDOUT)
		kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return -errno;
	}
	if (ret_status)
		*ret_status = status;
	return r;
}

bool tpt_wait_ok(pid_t pid, int timeout_ms, const char *what)
{
	int status = 0, r = tpt_wait(pid, timeout_ms, &status);

	if (r < 0) {
		tpt_log("%s (pid %d): %s", what, (int)pid,
			r == -ETIMEDOUT ? "timed out, killed" : strerror(-r));
		return false;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return true;
	if (WIFEXITED(status))
		tpt_log("%s (pid %d) exited with status %d", what, (int)pid, WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		tpt_log("%s (pid %d) killed by signal %d", what, (int)pid, WTERMSIG(status));
	return false;
}

/* ---- sync pipes ------------------------------------------------------------------------- */

int tpt_sync_init(struct tpt_sync *s)
{
	if (pipe2(s->fd, O_CLOEXEC) < 0)
		return -errno;
	return 0;
}

void tpt_sync_done(struct tpt_sync *s)
{
	for (int i = 0; i < 2; i++) {
		if (s->fd[i] >= 0)
			close(s->fd[i]);
		s->fd[i] = -1;
	}
}

int tpt_sync_post(struct tpt_sync *s, int8_t value)
{
	ssize_t n;

	do {
		n = write(s->fd[1], &value, 1);
	} while (n < 0 && errno == EINTR);
	return n == 1 ? 0 : -errno;
}

int tpt_sync_wait(struct tpt_sync *s, int timeout_ms)
{
	struct pollfd p = { .fd = s->fd[0], .events = POLLIN };
	int8_t v;
	int r;

	do {
		r = poll(&p, 1, timeout_ms);
	} while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	r = (int)read(s->fd[0], &v, 1);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -EPIPE;
	return v;
}

int tpt_cpu_beside(pid_t pid, long (*probe)(void *), void *arg, tpt_child_fn hog,
		   struct tpt_sync *ready, struct tpt_sync *done, int ready_ms, const char *what,
		   long *ret_alone, long *ret_beside)
{
	pid_t h;
	bool ok;

	if (tpt_sync_init(ready) < 0 || tpt_sync_init(done) < 0) {
		fprintf(stderr, "[%d] %s: no syncs\n", (int)getpid(), what);
		return -1;
	}
	*ret_alone = probe(arg);
	h = tpt_fork(hog, NULL);
	if (h < 0 || tpt_sync_wait(ready, ready_ms) != 0) {
		fprintf(stderr, "[%d] %s: the load never got ready\n", (int)getpid(), what);
		return -1;
	}
	*ret_beside = probe(arg);
	printf("daemon CPU for %s: %ld ticks alone, %ld beside the load (%ld a second)\n", what,
	       *ret_alone, *ret_beside, sysconf(_SC_CLK_TCK));
	tpt_sync_post(done, 0);
	ok = tpt_wait_ok(h, 4 * ready_ms, "load");
	return ok && *ret_alone >= 0 && *ret_beside >= 0 ? 0 : -1;
}

bool tpt_cpu_beside_ok(long alone, long beside)
{
	return beside <= 2 * alone + sysconf(_SC_CLK_TCK) / 4;
}

/* ---- byte patterns ----------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t tpt_seed(unsigned pipe, unsigned msg, unsigned seg)
{
	return mix64(((uint64_t)pipe << 48) ^ ((uint64_t)msg << 20) ^ seg);
}

static inline uint64_t word_at(uint64_t seed, uint64_t i)
{
	return mix64(seed ^ (i * 0xd6e8feb86659fd93ull));
}

void tpt_fill(void *buf, size_t len, uint64_t seed)
{
	uint8_t *p = buf;
	size_t words = len / 8, i;
	uint64_t w;

	for (i = 0; i < words; i++) {
		w = word_at(seed, i);
		memcpy(p + i * 8, &w, 8);
	}
	if (len % 8) {
		w = word_at(seed, i);
		memcpy(p + i * 8, &w, len % 8);
	}
}

bool tpt_verify(const void *buf, size_t len, uint64_t seed, size_t *ret_off)
{
	const uint8_t *p = buf;
	size_t words = len / 8, i, n;
	uint64_t w;

	for (i = 0; i <= words; i++) {
		n = i < words ? 8 : len % 8;
		if (n == 0)
			break;
		w = word_at(seed, i);
		if (memcmp(p + i * 8, &w, n) != 0) {
			for (size_t k = 0; k < n; k++) {
				if (p[i * 8 + k] != ((uint8_t *)&w)[k]) {
					if (ret_off)
						*ret_off = i * 8 + k;
					return false;
				}
			}
		}
	}
	return true;
}

/* ---- daemon ------------------------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP)
		rmdir(path);
	else
		unlink(path);
	return 0;
}

static void rm_tree(const char *dir)
{
	if (dir[0])
		nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static int try_connect(const char *path)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return -errno;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
	r = connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 ? -errno : 0;
	close(fd);
	return r;
}

/* The daemon child: stderr to the log, a clean environment, no inherited fds, exec. */
static void exec_daemon(const struct tpt_daemon *d, char **argv, pid_t parent)
{
	int log = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (!child_tie_to_parent(parent) || log < 0 || null < 0)
		_exit(127);
	if (dup2(null, STDIN_FILENO) < 0 || dup2(log, STDOUT_FILENO) < 0 ||
	    dup2(log, STDERR_FILENO) < 0)
		_exit(127);
	syscall(SYS_close_range, 3u, ~0u, 0u);
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDNAMES");
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	unsetenv("TPIPD_SOCKET");
	execvp(argv[0], argv); /* a wrapper such as valgrind is found on PATH */
	_exit(127);
}

static int make_paths(struct tpt_daemon *d, char *conf, size_t conf_len)
{
	int fd;

	memset(d, 0, sizeof(*d));
	d->pid = -1;
	d->reaper = -1;
	d->reaper_fd = -1;
	snprintf(d->dir, sizeof(d->dir), "/tmp/tpt.XXXXXX");
	if (!mkdtemp(d->dir)) {
		d->dir[0] = '\0';
		return -errno;
	}
	snprintf(d->socket, sizeof(d->socket), "%s/tpipd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/tpipd.log", d->dir);
	snprintf(conf, conf_len, "%s/tpipd.conf", d->dir);
	fd = open(conf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	/* No peer listener unless a test asks for one (flags win): tests never bind "*:7420". */
	if (write(fd, PEER_OFF, sizeof(PEER_OFF) - 1) != (ssize_t)sizeof(PEER_OFF) - 1) {
		int r = -errno;
		close(fd);
		return r ? r : -EIO;
	}
	close(fd);
	return 0;
}

/* Polls connect() until the socket answers, the daemon exits or the deadline passes. */
static int wait_ready(struct tpt_daemon *d)
{
	uint64_t deadline = tpt_now_ms() + TPT_START_TIMEOUT_MS;
	siginfo_t si;

	for (unsigned round = 0;; round++) {
		if (try_connect(d->socket) == 0)
			return 0;
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, d->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == d->pid) {
			tpt_log("tpipd exited during start-up");
			return -ECHILD;
		}
		if (tpt_now_ms() >= deadline) {
			tpt_log("tpipd did not accept connections within %d ms",
				TPT_START_TIMEOUT_MS);
			return -ETIMEDOUT;
		}
		tpt_backoff(round);
	}
}

/*
 * The reaper: a helper process that outlives a test process killed by a failed assertion
 * (Check's fork mode leaves with _exit(), so neither teardown nor atexit handlers run). It holds
 * the read end of a pipe whose write end only the test process keeps; EOF without the "stopped"
 * byte means the test died: the reaper waits for the daemon (killed by PR_SET_PDEATHSIG), prints
 * its log and removes the temporary directory.
 */
static void reaper_run(struct tpt_daemon *d, int fd)
{
	char c;
	ssize_t n;

	do {
		n = read(fd, &c, 1);
	} while (n < 0 && errno == EINTR);
	if (n == 1)
		_exit(0);
	for (unsigned round = 0; round < 400 && kill(d->pid, 0) == 0; round++)
		tpt_backoff(round);
	signal(SIGPIPE, SIG_IGN); /* stderr may be a pipe whose reader is gone: still clean up */
	tpt_log("test process ended without stopping tpipd %d", (int)d->pid);
	tpt_daemon_dump_log(d);
	rm_tree(d->dir);
	_exit(0);
}

static int reaper_start(struct tpt_daemon *d)
{
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	fflush(NULL);
	d->reaper = fork();
	if (d->reaper < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (d->reaper == 0) {
		close(p[1]);
		setsid(); /* not in the test's process group: survive its signals */
		reaper_run(d, p[0]);
	}
	close(p[0]);
	d->reaper_fd = p[1];
	return 0;
}

static void reaper_stop(struct tpt_daemon *d)
{
	if (d->reaper_fd >= 0) {
		if (write(d->reaper_fd, "k", 1) < 0)
			tpt_log("reaper: %s", strerror(errno));
		close(d->reaper_fd);
	}
	if (d->reaper > 0)
		waitpid(d->reaper, NULL, 0);
	d->reaper_fd = -1;
	d->reaper = -1;
}

/*
 * $TPT_DAEMON_WRAPPER (e.g. "valgrind --error-exitcode=99 --leak-check=full") is split on
 * spaces and put before the daemon's command line. The words point into a static copy.
 */
static size_t add_wrapper(char **argv, size_t max)
{
	static char copy[512];
	const char *w = getenv("TPT_DAEMON_WRAPPER");
	size_t n = 0;

	if (!w || !*w)
		return 0;
	snprintf(copy, sizeof(copy), "%s", w);
	for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok && n < max;
	     tok = strtok_r(NULL, " ", &save))
		argv[n++] = tok;
	return n;
}

int tpt_daemon_start(struct tpt_daemon *d, const char *const *extra_args)
{
	const char *bin = getenv("TPIPD_BIN");
	char conf[128];
	char *argv[64];
	size_t n = 0;
	pid_t parent = getpid();
	int r;

	if (!bin || !*bin) {
		tpt_log("TPIPD_BIN is not set");
		return -ENOENT;
	}
	r = make_paths(d, conf, sizeof(conf));
	if (r < 0) {
		rm_tree(d->dir);
		return r;
	}
	n = add_wrapper(argv, 16);
	argv[n++] = (char *)bin;
	argv[n++] = "--socket";
	argv[n++] = d->socket;
	argv[n++] = "--config";
	argv[n++] = conf;
	for (size_t i = 0; extra_args && extra_args[i] && n < 63; i++)
		argv[n++] = (char *)extra_args[i];
	argv[n] = NULL;

	fflush(NULL);
	d->pid = fork();
	if (d->pid < 0) {
		r = -errno;
		rm_tree(d->dir);
		return r;
	}
	if (d->pid == 0)
		exec_daemon(d, argv, parent);
	r = wait_ready(d);
	if (r < 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		tpt_daemon_dump_log(d);
		rm_tree(d->dir);
		d->pid = -1;
		return r;
	}
	r = reaper_start(d);
	if (r < 0)
		tpt_log("no reaper for tpipd %d: %s", (int)d->pid, strerror(-r));
	return 0;
}

int tpt_daemon_stop(struct tpt_daemon *d)
{
	int status = 0, r;

	if (d->pid <= 0)
		return -ECHILD;
	if (kill(d->pid, SIGTERM) < 0 && errno != ESRCH)
		return -errno;
	r = tpt_wait(d->pid, TPT_STOP_TIMEOUT_MS, &status);
	if (r == 0)
		r = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (r != 0)
		tpt_log("tpipd stop: %s %d", r < 0 ? "error" : "status", r);
	if (r != 0 || getenv("TPT_DAEMON_LOG"))
		tpt_daemon_dump_log(d);
	d->pid = -1;
	rm_tree(d->dir);
	d->dir[0] = '\0';
	reaper_stop(d);
	return r;
}

bool tpt_daemon_alive(const struct tpt_daemon *d)
{
	siginfo_t si;

	if (d->pid <= 0)
		return false;
	memset(&si, 0, sizeof(si));
	if (waitid(P_PID, d->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0)
		return false;
	return si.si_pid != d->pid;
}

int tpt_daemon_fd_count(const struct tpt_daemon *d)
{
	char path[64];
	DIR *dir;
	struct dirent *de;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
	dir = opendir(path);
	if (!dir)
		return -errno;
	while ((de = readdir(dir)))
		if (de->d_name[0] != '.')
			n++;
	closedir(dir);
	return n;
}

long tpt_daemon_rss_kb(const struct tpt_daemon *d)
{
	char path[64], line[256];
	long kb = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

int tpt_daemon_fd_settle(const struct tpt_daemon *d, int quiet_ms, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	uint64_t since = tpt_now_ms();
	int last = tpt_daemon_fd_count(d);

	for (unsigned round = 0; tpt_now_ms() < deadline; round++) {
		int n = tpt_daemon_fd_count(d);
		if (n < 0)
			return n;
		if (n != last) {
			last = n;
			since = tpt_now_ms();
		} else if (tpt_now_ms() - since >= (uint64_t)quiet_ms) {
			return n;
		}
		tpt_backoff(round);
	}
	return -ETIMEDOUT;
}

int tpt_daemon_wait_fds(const struct tpt_daemon *d, int max, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	int n;

	for (unsigned round = 0;; round++) {
		n = tpt_daemon_fd_count(d);
		if (n >= 0 && n <= max)
			return n;
		if (tpt_now_ms() >= deadline)
			break;
		tpt_backoff(round);
	}
	tpt_log("tpipd still has %d fds after %d ms (want <= %d)", n, timeout_ms, max);
	return -ETIMEDOUT;
}

void tpt_daemon_dump_log(const struct tpt_daemon *d)
{
	char buf[4096];
	ssize_t n;
	int fd = open(d->log, O_RDONLY | O_CLOEXEC);
	off_t size;

	if (fd < 0)
		return;
	/* The last 64 KiB is plenty to see why. */
	size = lseek(fd, 0, SEEK_END);
	lseek(fd, size > 65536 ? size - 65536 : 0, SEEK_SET);
	tpt_log("---- tpipd log (%s) ----", d->log);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		if (write(STDERR_FILENO, buf, (size_t)n) < 0)
			break;
	tpt_log("---- end of tpipd log ----");
	close(fd);
}

int tpt_daemon_kill(struct tpt_daemon *d)
{
	if (d->pid <= 0)
		return -ECHILD;
	kill(d->pid, SIGKILL);
	tpt_wait(d->pid, TPT_STOP_TIMEOUT_MS, NULL);
	if (getenv("TPT_DAEMON_LOG"))
		tpt_daemon_dump_log(d);
	d->pid = -1;
	rm_tree(d->dir);
	d->dir[0] = '\0';
	reaper_stop(d);
	return 0;
}

/* Copies the first log line containing @needle into @line (if not NULL). Return: found. */
static bool log_find(const struct tpt_daemon *d, const char *needle, char *line, size_t len)
{
	FILE *f = fopen(d->log, "re");
	char *buf = NULL;
	size_t cap = 0;
	bool found = false;

	if (!f)
		return false;
	while (!found && getline(&buf, &cap, f) > 0) {
		if (!strstr(buf, needle))
			continue;
		found = true;
		buf[strcspn(buf, "\n")] = '\0';
		if (line && len)
			snprintf(line, len, "%s", buf);
	}
	free(buf);
	fclose(f);
	return found;
}

bool tpt_daemon_log_has(const struct tpt_daemon *d, const char *needle)
{
	return log_find(d, needle, NULL, 0);
}

int tpt_daemon_log_count(const struct tpt_daemon *d, const char *needle)
{
	FILE *f = fopen(d->log, "re");
	char line[2048];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

int tpt_loopback_listen(int *ret_port)
{
	struct sockaddr_in in = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(in);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&in, sizeof(in)) < 0 || listen(fd, 8) < 0 ||
	    getsockname(fd, (struct sockaddr *)&in, &sl) < 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	*ret_port = ntohs(in.sin_port);
	return fd;
}

int tpt_daemon_memfd_maps(const struct tpt_daemon *d)
{
	char p[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(p, sizeof(p), "/proc/%d/maps", (int)d->pid);
	f = fopen(p, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "memfd:") != NULL;
	fclose(f);
	return n;
}

int tpt_daemon_wait_log(const struct tpt_daemon *d, const char *needle, int timeout_ms,
			char *ret_line, size_t line_len)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;

	for (unsigned round = 0;; round++) {
		bool alive = tpt_daemon_alive(d);

		/* Checked after the liveness probe: a daemon that logged and then died counts. */
		if (log_find(d, needle, ret_line, line_len))
			return 0;
		if (!alive)
			return -ECHILD;
		if (tpt_now_ms() >= deadline)
			return -ETIMEDOUT;
		tpt_backoff(round);
	}
}

int tpt_daemon_peer_port(const struct tpt_daemon *d, int timeout_ms)
{
	static const char key[] = "peer listener on ";
	char line[512], *addr, *colon;
	long port;
	int r = tpt_daemon_wait_log(d, key, timeout_ms, line, sizeof(line));

	if (r < 0)
		return r;
	/* "<5>peer listener on 127.0.0.1:41234 (no key: ...)" or "... on [::1]:7420 ..." */
	addr = strstr(line, key) + strlen(key);
	addr[strcspn(addr, " ")] = '\0';
	colon = strrchr(addr, ':');
	if (!colon)
		return -EBADMSG;
	port = strtol(colon + 1, NULL, 10);
	return port > 0 && port < 65536 ? (int)port : -EBADMSG;
}

static char peer_key_path[64];
static pid_t peer_key_owner;

static void peer_key_remove(void)
{
	if (getpid() == peer_key_owner)
		unlink(peer_key_path);
}

const char *tpt_peer_key_file(void)
{
	static const char key[] = "tpt-shared-test-key-0123456789abcdef\n";
	int fd;

	if (peer_key_path[0])
		return peer_key_path;
	snprintf(peer_key_path, sizeof(peer_key_path), "/tmp/tpt-peer-key.XXXXXX");
	fd = mkstemp(peer_key_path); /* mode 0600, ours: what the daemon demands of a key file */
	if (fd < 0 || write(fd, key, sizeof(key) - 1) != (ssize_t)(sizeof(key) - 1)) {
		tpt_log("cannot write the test peer key: %s", strerror(errno));
		abort();
	}
	close(fd);
	peer_key_owner = getpid();
	atexit(peer_key_remove);
	return peer_key_path;
}

/* Whether @args already say how the daemon authenticates peers. */
static bool has_peer_auth(const char *const *args)
{
	for (size_t i = 0; args && args[i]; i++)
		if (strcmp(args[i], "--peer-key-file") == 0 || strcmp(args[i], "--peer-insecure") == 0 ||
		    strcmp(args[i], "--peer-cert") == 0)
			return true;
	return false;
}

int tpt_daemon_start_peer(struct tpt_daemon *d, const char *const *extra_args)
{
	const char *argv[64] = { "--peer-listen", "127.0.0.1:0", "--peer-force-cross-host" };
	size_t n = 3;
	int r;

	if (!has_peer_auth(extra_args)) {
		argv[n++] = "--peer-key-file";
		argv[n++] = tpt_peer_key_file();
	}
	for (size_t i = 0; extra_args && extra_args[i] && n < 63; i++)
		argv[n++] = extra_args[i];
	argv[n] = NULL;
	r = tpt_daemon_start(d, argv);
	if (r < 0)
		return r;
	r = tpt_daemon_peer_port(d, TPT_START_TIMEOUT_MS);
	if (r < 0) {
		tpt_log("tpipd %d logged no peer listener port: %s", (int)d->pid, strerror(-r));
		tpt_daemon_dump_log(d);
		tpt_daemon_kill(d);
		return r;
	}
	d->peer_port = r;
	return 0;
}

int tpt_daemon_pair_start(struct tpt_daemon *a, const char *const *extra_a, struct tpt_daemon *b,
			  const char *const *extra_b)
{
	int r = tpt_daemon_start_peer(a, extra_a);

	if (r < 0)
		return r;
	r = tpt_daemon_start_peer(b, extra_b);
	if (r < 0)
		tpt_daemon_kill(a);
	return r;
}

char *tpt_peer_address(const struct tpt_daemon *d, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "tpip://127.0.0.1:%d/%s", d->peer_port, name);
	return buf;
}

int tpt_daemon_open_to_all(const struct tpt_daemon *d)
{
	if (chmod(d->dir, 0755) < 0 || chmod(d->socket, 0666) < 0)
		return -errno;
	return 0;
}

/* ---- commands ---------------------------------------------------------------------------- */

struct capture {
	char *buf;
	size_t len, cap;
};

static int capture_read(int fd, struct capture *c)
{
	ssize_t n;

	if (c->cap - c->len < 4097) {
		size_t ncap = c->cap ? c->cap * 2 : 8192;
		char *nb = realloc(c->buf, ncap);
		if (!nb)
			return -ENOMEM;
		c->buf = nb;
		c->cap = ncap;
	}
	n = read(fd, c->buf + c->len, c->cap - c->len - 1);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN ? 1 : -errno;
	c->len += (size_t)n;
	c->buf[c->len] = '\0';
	return n > 0;
}

static void exec_cmd(const char *const *argv, int out, int err, pid_t parent)
{
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (!child_tie_to_parent(parent) || null < 0 || dup2(null, STDIN_FILENO) < 0 ||
	    dup2(out, STDOUT_FILENO) < 0 || dup2(err, STDERR_FILENO) < 0)
		_exit(127);
	execv(argv[0], (char *const *)argv);
	_exit(127);
}

/* Reads both pipes until EOF on each or the deadline. */
static int capture_all(int out, int err, struct capture *c, uint64_t deadline)
{
	struct pollfd p[2] = { { .fd = out, .events = POLLIN }, { .fd = err, .events = POLLIN } };
	int open_fds = 2;

	while (open_fds > 0) {
		int left = (int)(deadline > tpt_now_ms() ? deadline - tpt_now_ms() : 0), r;
		if (left == 0)
			return -ETIMEDOUT;
		r = poll(p, 2, left);
		if (r < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; r > 0 && i < 2; i++) {
			if (p[i].fd < 0 || !p[i].revents)
				continue;
			r = capture_read(p[i].fd, &c[i]);
			if (r < 0)
				return r;
			if (r == 0) {
				p[i].fd = -1;
				open_fds--;
			}
			r = 1;
		}
	}
	return 0;
}

int tpt_run(const char *const *argv, int timeout_ms, struct tpt_cmd_result *ret)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	struct capture c[2] = { { NULL, 0, 0 }, { NULL, 0, 0 } };
	int po[2], pe[2], r, status = 0;
	pid_t parent = getpid(), pid;

	if (pipe2(po, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(pe, O_CLOEXEC) < 0) {
		r = -errno;
		close(po[0]);
		close(po[1]);
		return r;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0)
		exec_cmd(argv, po[1], pe[1], parent);
	close(po[1]);
	close(pe[1]);
	r = pid < 0 ? -errno : capture_all(po[0], pe[0], c, deadline);
	close(po[0]);
	close(pe[0]);
	if (pid > 0) {
		int left = (int)(deadline > tpt_now_ms() ? deadline - tpt_now_ms() : 0);
		int w = tpt_wait(pid, r < 0 ? 0 : left, &status);
		if (r == 0)
			r = w;
	}
	if (r < 0) {
		free(c[0].buf);
		free(c[1].buf);
		return r;
	}
	ret->status = status;
	ret->out = c[0].buf ? c[0].buf : strdup("");
	ret->out_len = c[0].len;
	ret->err = c[1].buf ? c[1].buf : strdup("");
	return 0;
}

void tpt_cmd_result_free(struct tpt_cmd_result *r)
{
	free(r->out);
	free(r->err);
	r->out = r->err = NULL;
}
