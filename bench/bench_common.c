/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the benchmark programs (see bench_common.h). Only measurement plumbing
 * lives here: no benchmark logic, no thresholds, nothing that judges a figure.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

bool bench_tsv;

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted @v: the smallest value with at least q*n values <= it. */
static double percentile(const double *v, size_t n, double q)
{
	size_t rank = (size_t)(q * (double)n + 0.999999);

	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

void bench_stats_compute(double *v, size_t n, struct bench_stats *ret)
{
	double sum = 0;

	qsort(v, n, sizeof(*v), cmp_double);
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	*ret = (struct bench_stats){
		.min = v[0],
		.median = percentile(v, n, 0.5),
		.p90 = percentile(v, n, 0.9),
		.p99 = percentile(v, n, 0.99),
		.max = v[n - 1],
		.mean = sum / (double)n,
	};
}

int bench_parse_size(const char *s, size_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: break;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	else if (*end == 'B')
		end++;
	if (*end || v == 0 || v > (SIZE_MAX >> shift))
		return -EINVAL;
	*ret = (size_t)v << shift;
	return 0;
}

bool bench_list_has(const char *list, const char *key)
{
	size_t n = strlen(key);

	for (const char *p = list; (p = strstr(p, key)); p += n)
		if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
			return true;
	return false;
}

const char *bench_fmt_size(size_t n, char *buf, size_t len)
{
	if (n >= (1u << 30) && n % (1u << 30) == 0)
		snprintf(buf, len, "%zu GiB", n >> 30);
	else if (n >= (1u << 20) && n % (1u << 20) == 0)
		snprintf(buf, len, "%zu MiB", n >> 20);
	else if (n >= (1u << 10) && n % (1u << 10) == 0)
		snprintf(buf, len, "%zu KiB", n >> 10);
	else
		snprintf(buf, len, "%zu B", n);
	return buf;
}

int bench_read_full(int fd, void *buf, size_t n)
{
	char *p = buf;

	while (n > 0) {
		ssize_t k = read(fd, p, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -EPIPE;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int bench_write_full(int fd, const void *buf, size_t n)
{
	const char *p = buf;

	while (n > 0) {
		ssize_t k = write(fd, p, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

void bench_counter_init(struct bench_counter *c)
{
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->value = 0;
	c->err = 0;
}

void bench_counter_done(struct bench_counter *c)
{
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
}

void bench_counter_add(struct bench_counter *c, long delta, int status)
{
	pthread_mutex_lock(&c->mu);
	c->value += delta;
	if (status < 0 && c->err == 0)
		c->err = status;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

int bench_counter_wait_le(struct bench_counter *c, long limit)
{
	int r;

	pthread_mutex_lock(&c->mu);
	while (c->value > limit && c->err == 0)
		pthread_cond_wait(&c->cv, &c->mu);
	r = c->err;
	pthread_mutex_unlock(&c->mu);
	return r;
}

void bench_on_done_dec(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	if (status < 0)
		fprintf(stderr, "bench: write failed: %s (%s)\n", tp_strerror(status),
			errmsg ? errmsg : "");
	bench_counter_add(arg, -1, status);
}

int bench_context_open(const char *socket_path, uint32_t flags, struct tp_context **ret)
{
	struct tp_context_options o = {
		.size = sizeof(o),
		.socket_path = socket_path,
		.flags = flags,
	};
	int r = tp_context_new(&o, ret);

	if (r < 0)
		fprintf(stderr, "bench: cannot connect to tpipd: %s (%s)\n", tp_strerror(r),
			tp_last_error());
	return r;
}

int bench_spawn(int (*fn)(void *arg, int ready_fd), void *arg, pid_t *ret_pid, int *ret_fd)
{
	int sp[2];
	pid_t pid;

	if (pipe2(sp, O_CLOEXEC) < 0)
		return -errno;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		int r = -errno;

		close(sp[0]);
		close(sp[1]);
		return r;
	}
	if (pid == 0) {
		int r;

		close(sp[0]);
		r = fn(arg, sp[1]);
		close(sp[1]);
		fflush(stderr);
		_exit(r < 0 ? 1 : 0);
	}
	close(sp[1]);
	*ret_pid = pid;
	*ret_fd = sp[0];
	return 0;
}

void bench_ready_send(int ready_fd, int status)
{
	int32_t v = status;

	(void)bench_write_full(ready_fd, &v, sizeof(v));
}

int bench_ready_wait(int fd, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	int32_t v;
	int r;

	do
		r = poll(&pfd, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	r = bench_read_full(fd, &v, sizeof(v));
	return r < 0 ? r : v;
}

int bench_reap(pid_t pid, const char *what)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFSIGNALED(st))
		fprintf(stderr, "bench: %s (pid %d) killed by signal %d\n", what, (int)pid,
			WTERMSIG(st));
	else
		fprintf(stderr, "bench: %s (pid %d) exited with status %d\n", what, (int)pid,
			WEXITSTATUS(st));
	return -ECHILD;
}

int bench_netns_enter(const char *name)
{
	char path[256];
	int fd, r = 0;

	snprintf(path, sizeof(path), "%s%s", strchr(name, '/') ? "" : "/run/netns/", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		r = -errno;
		fprintf(stderr, "bench: network namespace %s: %s\n", path, strerror(-r));
	}
	if (fd >= 0)
		close(fd);
	return r;
}

/* Resolves numeric @host and @port (0: any) into a stream-socket address. */
static int tcp_addr(const char *host, int port, struct addrinfo **ret)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
	char serv[16];
	int r;

	snprintf(serv, sizeof(serv), "%d", port);
	r = getaddrinfo(host, serv, &hints, ret);
	if (r != 0) {
		fprintf(stderr, "bench: address %s: %s\n", host, gai_strerror(r));
		return -EINVAL;
	}
	return 0;
}

static void tcp_nodelay(int fd)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int bench_tcp_listen(const char *host, int *ret_fd, int *ret_port)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct addrinfo *ai;
	int fd, r = tcp_addr(host, 0, &ai);

	if (r < 0)
		return r;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 4) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return r;
	}
	freeaddrinfo(ai);
	*ret_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port :
						     ((struct sockaddr_in *)&ss)->sin_port);
	*ret_fd = fd;
	return 0;
}

int bench_tcp_accept(int lfd, int *ret_fd)
{
	int fd;

	do
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	while (fd < 0 && errno == EINTR);
	if (fd < 0)
		return -errno;
	tcp_nodelay(fd);
	*ret_fd = fd;
	return 0;
}

int bench_tcp_connect(const char *host, int port, int *ret_fd)
{
	struct addrinfo *ai;
	int fd, r = tcp_addr(host, port, &ai);

	if (r < 0)
		return r;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		r = -errno;
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return r;
	}
	freeaddrinfo(ai);
	tcp_nodelay(fd);
	*ret_fd = fd;
	return 0;
}

void bench_table_header(const char *title)
{
	if (bench_tsv)
		return;
	printf("\n== %s ==\n", title);
	printf("%-30s %-8s %-44s %-26s %s\n", "case", "size", "result", "baseline", "ratio");
}

void bench_row(const char *name, const char *size, const char *result, const char *baseline,
	       const char *ratio)
{
	if (bench_tsv)
		printf("%s\t%s\t%s\t%s\t%s\n", name, size, result, baseline, ratio);
	else
		printf("%-30s %-8s %-44s %-26s %s\n", name, size, result, baseline, ratio);
	fflush(stdout);
}
