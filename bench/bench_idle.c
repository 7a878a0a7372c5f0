/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_idle: the CPU that tpipd uses while nothing happens. The parent forks a listener and a
 * connector before any process creates a context; the connector opens one pipe to the listener
 * and the two exchange one 8 B message each way, so every path (accept, write, descriptor, read,
 * completion) is warm. Then both clients go idle the way a real application waits for work: each
 * has a descriptor request pending on the pipe (and the listener an accept pending), and its main
 * thread blocks in read() on a control socket. The parent samples the daemon's utime + stime from
 * /proc/PID/stat (clock ticks) before and after an idle window (-T seconds), together with its
 * threads' run time (/proc/PID/task/TID/schedstat, nanoseconds) and context switches. The
 * clients sample their own /proc/self figures at the start and end of the window and send them
 * back on the control socket. Reported: daemon CPU in percent of one core over the window, and
 * the clients' sum as the baseline; figures only, never a verdict.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define IDLE_TIMEOUT_MS 10000

struct idle_opts {
	double window_s;
	pid_t daemon_pid;
	const char *socket_path;
};

/* CPU used by one process (all its threads) so far. */
struct idle_cpu {
	int64_t ticks;	  /* utime + stime, in clock ticks */
	int64_t run_ns;	  /* sum of the threads' schedstat run time; -1 if unavailable */
	int64_t switches; /* sum of the threads' voluntary + involuntary context switches */
};

/* What a forked client needs to know. */
struct idle_client {
	const struct idle_opts *o;
	pid_t parent;
	char listener[64];
	int ctl_fd;	  /* the child's end of its control socketpair */
	int close_fds[3]; /* the parent's ends of the control sockets, closed in the child */
};

/* ---- /proc sampling -------------------------------------------------------------------------- */

/* utime + stime of process @pid (0: this process) from /proc/PID/stat. */
static int read_stat_ticks(pid_t pid, int64_t *ret)
{
	char path[64], buf[1024];
	unsigned long long ut, st;
	const char *p;
	FILE *f;
	size_t n;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/stat");
	f = fopen(path, "re");
	if (!f)
		return -errno;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
	 * utime and stime are fields 14 and 15, i.e. the 12th and 13th after the ')'. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &ut, &st) != 2)
		return -EBADMSG;
	*ret = (int64_t)(ut + st);
	return 0;
}

/* Adds one thread's run time (schedstat) and context switches (status) to @c. */
static void add_task(const char *dir, struct idle_cpu *c)
{
	char path[448], line[256];
	unsigned long long ns;
	long long v;
	FILE *f;

	snprintf(path, sizeof(path), "%s/schedstat", dir);
	f = fopen(path, "re");
	if (!f || fscanf(f, "%llu", &ns) != 1)
		c->run_ns = -1;
	else if (c->run_ns >= 0)
		c->run_ns += (int64_t)ns;
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "%s/status", dir);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "voluntary_ctxt_switches: %lld", &v) == 1 ||
		    sscanf(line, "nonvoluntary_ctxt_switches: %lld", &v) == 1)
			c->switches += v;
	fclose(f);
}

/*
 * Samples process @pid (0: this process). Threads that exited between two samples take their
 * schedstat time and switches with them (their ticks stay in /proc/PID/stat); an idle process
 * starts and ends no threads.
 */
static int read_cpu(pid_t pid, struct idle_cpu *ret)
{
	char dir[64], task[400]; /* dir + '/' + a d_name of at most 255 */
	struct dirent *de;
	DIR *d;
	int r;

	*ret = (struct idle_cpu){ 0 };
	r = read_stat_ticks(pid, &ret->ticks);
	if (r < 0)
		return r;
	if (pid)
		snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	else
		snprintf(dir, sizeof(dir), "/proc/self/task");
	d = opendir(dir);
	if (!d) {
		ret->run_ns = -1;
		return 0;
	}
	while ((de = readdir(d)))
		if (de->d_name[0] != '.') {
			snprintf(task, sizeof(task), "%s/%s", dir, de->d_name);
			add_task(task, ret);
		}
	closedir(d);
	return 0;
}

static void cpu_delta(const struct idle_cpu *a, const struct idle_cpu *b, struct idle_cpu *ret)
{
	ret->ticks = b->ticks - a->ticks;
	ret->run_ns = a->run_ns >= 0 && b->run_ns >= 0 ? b->run_ns - a->run_ns : -1;
	ret->switches = b->switches - a->switches;
}

/* ---- clients --------------------------------------------------------------------------------- */

/* Dies with the parent, so that an interrupted run leaves no client behind. */
static void die_with_parent(pid_t parent)
{
	signal(SIGPIPE, SIG_IGN); /* a parent that gave up closes the control socket: EPIPE */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
}

static void client_close_fds(struct idle_client *c)
{
	for (size_t i = 0; i < sizeof(c->close_fds) / sizeof(c->close_fds[0]); i++)
		if (c->close_fds[i] >= 0)
			close(c->close_fds[i]);
}

/* A pending descriptor request: completes with -ECANCELED or -EPIPE at the end. */
static void on_idle_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
			 struct tp_descriptor *d)
{
	if (d) {
		fprintf(stderr, "bench_idle: unexpected message during the idle window\n");
		tp_descriptor_free(d);
	}
}

/* A pending accept: completes with -ECANCELED when the listener closes. */
static void on_idle_accept(void *arg, struct tp_listener *l, int status, const char *errmsg,
			   struct tp_pipe *pipe)
{
	if (pipe) {
		fprintf(stderr, "bench_idle: unexpected pipe during the idle window\n");
		tp_pipe_close(pipe);
	}
}

static int send_meta8(struct tp_pipe *p, uint64_t v)
{
	struct tp_message m = { .metadata = &v, .metadata_len = sizeof(v) };
	int r = tp_pipe_write_sync(p, &m);

	if (r < 0)
		fprintf(stderr, "bench_idle: write: %s (%s)\n", tp_strerror(r), tp_last_error());
	return r;
}

static int recv_meta8(struct tp_pipe *p)
{
	struct tp_allocation a = { 0 };
	struct tp_descriptor *d;
	int r;

	r = tp_pipe_read_descriptor_sync(p, IDLE_TIMEOUT_MS, &d);
	if (r == 0 && d->metadata_len != sizeof(uint64_t)) {
		tp_descriptor_free(d);
		r = -EBADMSG;
	} else if (r == 0) {
		r = tp_pipe_read_sync(p, d, &a);
	}
	if (r < 0)
		fprintf(stderr, "bench_idle: read: %s (%s)\n", tp_strerror(r), tp_last_error());
	return r;
}

/*
 * The idle window as a client sees it: sample, block on the control socket until the parent
 * says stop (a byte, or EOF), sample again, send the difference back.
 */
static int client_idle(struct idle_client *c, int ready_fd)
{
	struct idle_cpu a, b, d;
	char stop;
	ssize_t k;
	int r;

	r = read_cpu(0, &a);
	bench_ready_send(ready_fd, r);
	if (r < 0)
		return r;
	do
		k = read(c->ctl_fd, &stop, 1);
	while (k < 0 && errno == EINTR);
	r = read_cpu(0, &b);
	if (r < 0)
		return r;
	cpu_delta(&a, &b, &d);
	return bench_write_full(c->ctl_fd, &d, sizeof(d));
}

static int listener_main(void *arg, int ready_fd)
{
	struct idle_client *c = arg;
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *p = NULL;
	int r;

	die_with_parent(c->parent);
	client_close_fds(c);
	r = bench_context_open(c->o->socket_path, 0, &ctx);
	if (r == 0) {
		r = tp_listen(ctx, c->listener, &remote_any, &l);
		if (r < 0)
			fprintf(stderr, "bench_idle: tp_listen %s: %s (%s)\n", c->listener,
				tp_strerror(r), tp_last_error());
	}
	bench_ready_send(ready_fd, r); /* registered: the parent may start the connector */
	if (r == 0) {
		r = tp_listener_accept_sync(l, IDLE_TIMEOUT_MS, &p);
		if (r < 0)
			fprintf(stderr, "bench_idle: accept: %s (%s)\n", tp_strerror(r),
				tp_last_error());
	}
	if (r == 0)
		r = recv_meta8(p);
	if (r == 0)
		r = send_meta8(p, 2);
	if (r == 0)
		r = tp_pipe_read_descriptor(p, on_idle_desc, NULL);
	if (r == 0)
		r = tp_listener_accept(l, on_idle_accept, NULL);
	if (r == 0)
		r = client_idle(c, ready_fd);
	else
		bench_ready_send(ready_fd, r);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r;
}

static int connector_main(void *arg, int ready_fd)
{
	struct idle_client *c = arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	int r;

	die_with_parent(c->parent);
	client_close_fds(c);
	r = bench_context_open(c->o->socket_path, 0, &ctx);
	if (r == 0)
		r = tp_connect(ctx, c->listener, &p);
	if (r == 0) {
		r = tp_pipe_wait_connected(p, IDLE_TIMEOUT_MS);
		if (r < 0)
			fprintf(stderr, "bench_idle: connect %s: %s (%s)\n", c->listener,
				tp_strerror(r), tp_last_error());
	}
	if (r == 0)
		r = send_meta8(p, 1);
	if (r == 0)
		r = recv_meta8(p);
	if (r == 0)
		r = tp_pipe_read_descriptor(p, on_idle_desc, NULL);
	if (r == 0)
		r = client_idle(c, ready_fd);
	else
		bench_ready_send(ready_fd, r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r;
}

/* ---- parent ---------------------------------------------------------------------------------- */

struct idle_result {
	double window_s;
	struct idle_cpu daemon;
	struct idle_cpu clients;
};

static int sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s,
			       .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
	int r;

	while ((r = clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts)) == EINTR)
		;
	return -r;
}

/* Reads a client's figures from its control socket, waiting at most IDLE_TIMEOUT_MS. */
static int collect(int fd, struct idle_cpu *sum)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	struct idle_cpu d;
	int r;

	do
		r = poll(&pfd, 1, IDLE_TIMEOUT_MS);
	while (r < 0 && errno == EINTR);
	if (r <= 0)
		return r < 0 ? -errno : -ETIMEDOUT;
	r = bench_read_full(fd, &d, sizeof(d));
	if (r < 0)
		return r;
	sum->ticks += d.ticks;
	sum->run_ns = sum->run_ns >= 0 && d.run_ns >= 0 ? sum->run_ns + d.run_ns : -1;
	sum->switches += d.switches;
	return 0;
}

/* The window itself: both clients are warm and blocked; only the parent samples. */
static int idle_window(const struct idle_opts *o, int ctl[2], struct idle_result *res)
{
	struct idle_cpu a, b;
	uint64_t t0, t1;
	int r, r2;

	r = read_cpu(o->daemon_pid, &a);
	if (r < 0) {
		fprintf(stderr, "bench_idle: cannot read /proc/%d: %s\n", (int)o->daemon_pid,
			strerror(-r));
		return r;
	}
	t0 = bench_now_ns();
	r = sleep_s(o->window_s);
	r2 = read_cpu(o->daemon_pid, &b);
	t1 = bench_now_ns();
	if (r == 0 && r2 < 0) {
		fprintf(stderr, "bench_idle: cannot read /proc/%d (did tpipd exit?): %s\n",
			(int)o->daemon_pid, strerror(-r2));
		r = r2;
	}
	for (int i = 0; i < 2; i++) /* stop */
		(void)bench_write_full(ctl[i], "x", 1);
	res->window_s = (double)(t1 - t0) / 1e9;
	cpu_delta(&a, &b, &res->daemon);
	res->clients = (struct idle_cpu){ 0 };
	for (int i = 0; i < 2 && r == 0; i++) {
		r = collect(ctl[i], &res->clients);
		if (r < 0)
			fprintf(stderr, "bench_idle: no figures from a client: %s\n", strerror(-r));
	}
	return r;
}

/* Forks a client with a control socketpair; the parent keeps one end in @ret_ctl. */
static int spawn_client(struct idle_client *c, int (*fn)(void *arg, int ready_fd), int *ret_ctl,
			int other_ctl, pid_t *ret_pid, int *ret_ready)
{
	int sv[2], r;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	c->ctl_fd = sv[1];
	c->close_fds[0] = sv[0];
	c->close_fds[1] = other_ctl;
	c->close_fds[2] = -1;
	r = bench_spawn(fn, c, ret_pid, ret_ready);
	close(sv[1]);
	if (r < 0) {
		close(sv[0]);
		return r;
	}
	*ret_ctl = sv[0];
	return 0;
}

static int idle_measure(const struct idle_opts *o, struct idle_result *res)
{
	struct idle_client cl = { .o = o, .parent = getpid() }, cc;
	pid_t pid[2] = { -1, -1 };
	int ctl[2] = { -1, -1 }, ready[2] = { -1, -1 };
	struct idle_cpu probe;
	int r;

	r = read_cpu(o->daemon_pid, &probe); /* is it there at all? */
	if (r < 0) {
		fprintf(stderr, "bench_idle: cannot read /proc/%d: %s\n", (int)o->daemon_pid,
			strerror(-r));
		return r;
	}
	snprintf(cl.listener, sizeof(cl.listener), "bench-idle-%d", (int)getpid());
	cc = cl;
	r = spawn_client(&cl, listener_main, &ctl[0], -1, &pid[0], &ready[0]);
	if (r == 0)
		r = bench_ready_wait(ready[0], IDLE_TIMEOUT_MS); /* listening */
	if (r == 0)
		r = spawn_client(&cc, connector_main, &ctl[1], ctl[0], &pid[1], &ready[1]);
	if (r == 0)
		r = bench_ready_wait(ready[1], IDLE_TIMEOUT_MS); /* exchanged, idle */
	if (r == 0)
		r = bench_ready_wait(ready[0], IDLE_TIMEOUT_MS); /* exchanged, idle */
	if (r == 0)
		r = idle_window(o, ctl, res);
	for (int i = 0; i < 2; i++) {
		if (ctl[i] >= 0)
			close(ctl[i]); /* EOF ends a client still waiting */
		if (ready[i] >= 0)
			close(ready[i]);
	}
	for (int i = 0; i < 2; i++)
		if (pid[i] > 0 && bench_reap(pid[i], i ? "connector" : "listener") < 0 && r == 0)
			r = -ECHILD;
	return r;
}

/* ---- driver ---------------------------------------------------------------------------------- */

static double pct_ticks(int64_t ticks, double window_s)
{
	return (double)ticks / (double)sysconf(_SC_CLK_TCK) / window_s * 100.0;
}

static void idle_print(const struct idle_result *res)
{
	char res_s[160], base[160], sched[48];
	const struct idle_cpu *d = &res->daemon, *c = &res->clients;

	sched[0] = 0;
	if (d->run_ns >= 0)
		snprintf(sched, sizeof(sched), "run %.3f %%, ",
			 (double)d->run_ns / 1e9 / res->window_s * 100.0);
	snprintf(res_s, sizeof(res_s), "%.2f %% of a core over %.1f s (%s%.1f switches/s)",
		 pct_ticks(d->ticks, res->window_s), res->window_s, sched,
		 (double)d->switches / res->window_s);
	sched[0] = 0;
	if (c->run_ns >= 0)
		snprintf(sched, sizeof(sched), ", run %.3f %%",
			 (double)c->run_ns / 1e9 / res->window_s * 100.0);
	snprintf(base, sizeof(base), "clients %.2f %%%s", pct_ticks(c->ticks, res->window_s),
		 sched);
	bench_row("idle daemon cpu (2 clients, 1 pipe)", "-", res_s, base, "-");
}

static void usage(void)
{
	printf("usage: bench_idle -p PID [-T SECONDS] [-S SOCKET] [-t]\n"
	       "  -p PID      the daemon's pid (its /proc/PID/stat is sampled)\n"
	       "  -T SECONDS  idle window (default 10)\n"
	       "  -S SOCKET   tpipd socket (default: $TPIPD_SOCKET, then the library's rules)\n"
	       "  -t          tab-separated rows, no header (for bench/run.sh)\n");
}

static int parse_args(int argc, char **argv, struct idle_opts *o)
{
	int opt;

	*o = (struct idle_opts){ .window_s = 10.0 };
	while ((opt = getopt(argc, argv, "p:T:S:th")) != -1) {
		switch (opt) {
		case 'p': o->daemon_pid = (pid_t)strtol(optarg, NULL, 10); break;
		case 'T': o->window_s = strtod(optarg, NULL); break;
		case 'S': o->socket_path = optarg; break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: usage(); return -EINVAL;
		}
	}
	if (o->daemon_pid <= 0 || !(o->window_s > 0 && o->window_s <= 3600) || optind != argc) {
		usage();
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct idle_result res = { 0 };
	struct idle_opts o;
	int r;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	bench_table_header("daemon CPU while idle (baseline: the two idle clients together)");
	r = idle_measure(&o, &res);
	if (r == 0)
		idle_print(&res);
	else
		bench_row("idle daemon cpu (2 clients, 1 pipe)", "-", "error (see stderr)", "-",
			  "-");
	return r ? 1 : 0;
}
