/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the benchmark programs: a monotonic clock, order statistics, size parsing
 * and formatting, full reads and writes on raw fds, TCP sockets and network namespaces (for the
 * raw baselines across daemons), a counter that callbacks signal and the main thread waits on, a
 * fork helper with a readiness pipe, and the result table printer (aligned text for people,
 * tab-separated rows for bench/run.sh). Benchmarks print figures; nothing here
 * decides pass or fail. Uses only the public libtpclient API, like any client would; C and C++
 * (tp_baseline) both include it.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tpclient.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic clock in nanoseconds. */
uint64_t bench_now_ns(void);

struct bench_stats {
	double min, median, p90, p99, max, mean;
};

/* Sorts @v (n > 0 values) in place and fills @ret with nearest-rank percentiles. */
void bench_stats_compute(double *v, size_t n, struct bench_stats *ret);

/* Parses "4096", "64K", "1M", "2G" (powers of 1024). Return: 0 or -EINVAL. */
int bench_parse_size(const char *s, size_t *ret);

/* Whether the comma list @list (e.g. "shm,cma") has the item @key. */
bool bench_list_has(const char *list, const char *key);

/* Writes "4 KiB", "64 MiB", "72 B" into @buf. Returns @buf. */
const char *bench_fmt_size(size_t n, char *buf, size_t len);

/* read()/write() exactly @n bytes on a blocking fd. Return: 0, -EPIPE on EOF, or -errno. */
int bench_read_full(int fd, void *buf, size_t n);
int bench_write_full(int fd, const void *buf, size_t n);

/*
 * A counter shared between library callbacks and the main thread. Callbacks call
 * bench_counter_add() (with a status); the main thread waits for a condition on the value.
 */
struct bench_counter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	long value;
	int err; /* first negative status seen */
};

void bench_counter_init(struct bench_counter *c);
void bench_counter_done(struct bench_counter *c);
/* Adds @delta and records @status if it is the first error. Thread safe. */
void bench_counter_add(struct bench_counter *c, long delta, int status);
/* Waits until value <= @limit or an error was recorded. Return: 0 or the recorded error. */
int bench_counter_wait_le(struct bench_counter *c, long limit);

/* tp_done_fn that treats @arg as a struct bench_counter and subtracts one (pending count). */
void bench_on_done_dec(void *arg, struct tp_pipe *p, int status, const char *errmsg);

/*
 * bench_context_open() - tp_context_new() with @socket_path (NULL: library rules) and @flags.
 * Prints a one-line reason to stderr on failure.
 * @ret: returns owned context, free with tp_context_free().
 * Return: 0 or -errno.
 */
int bench_context_open(const char *socket_path, uint32_t flags, struct tp_context **ret);

/*
 * bench_spawn() - fork a child that runs @fn(@arg, ready_fd) and _exit()s with its result
 * (0 -> 0, < 0 -> 1). The child reports readiness (a listener registered) by calling
 * bench_ready_send(ready_fd, status); the parent waits for it with bench_ready_wait().
 * stdout is flushed before the fork so no output is duplicated.
 * @ret_pid: the child's pid, @ret_fd: the parent's end of the readiness pipe (owned).
 * Return: 0 or -errno.
 */
int bench_spawn(int (*fn)(void *arg, int ready_fd), void *arg, pid_t *ret_pid, int *ret_fd);
void bench_ready_send(int ready_fd, int status);
/* Waits up to @timeout_ms for the child's readiness. Return: the child's status or -errno. */
int bench_ready_wait(int fd, int timeout_ms);
/* Waits for @pid. Return: 0 if it exited 0, -ECHILD otherwise (a line goes to stderr). */
int bench_reap(pid_t pid, const char *what);

/*
 * bench_netns_enter() - move the calling thread (call it before creating any other) into the
 * network namespace @name: a name under /run/netns (as made by `ip netns add`) or a path.
 * Return: 0 or -errno (a line goes to stderr).
 */
int bench_netns_enter(const char *name);

/*
 * bench_tcp_listen() - a TCP listening socket on numeric address @host (IPv4, or IPv6 without
 * brackets) and port 0, i.e. a free port.
 * @ret_fd: returns the owned socket, @ret_port: the port it got.
 * Return: 0 or -errno.
 */
int bench_tcp_listen(const char *host, int *ret_fd, int *ret_port);
/* Accepts one connection on @lfd with TCP_NODELAY. @ret_fd: owned. Return: 0 or -errno. */
int bench_tcp_accept(int lfd, int *ret_fd);
/* Connects to @host:@port with TCP_NODELAY. @ret_fd: owned. Return: 0 or -errno. */
int bench_tcp_connect(const char *host, int port, int *ret_fd);

/* Result table. In TSV mode each row is "case\tsize\tresult\tbaseline\tratio". */
extern bool bench_tsv;
void bench_table_header(const char *title);
void bench_row(const char *name, const char *size, const char *result, const char *baseline,
	       const char *ratio);

#ifdef __cplusplus
}
#endif

#endif
