/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The raw TCP baseline of bench_throughput across daemons (-x): what N plain TCP connections
 * carry when they do the work a pipe across two daemons does for one tensor per message, with
 * no daemon in between. A receiver forked into the reader's network namespace accepts N
 * connections; each message of SIZE bytes comes from the next of k distinct, pre-faulted source
 * slots (at most 4 GiB of them, as the tpipd reader: bench_tput_slots()), is cut into one slice
 * per connection (as tpipd stripes a tensor over its data connections) and lands in the next of
 * as many distinct destination slots. One thread per
 * connection on each side, no acknowledgement per message: a bound for a daemon, not a rival.
 *
 * It is there next to iperf3 (bench/run_xhost.sh prints both), which sends the same buffer of
 * at most 1 MiB again and again: iperf3's bytes come from and go to the CPU cache, which those
 * of a tensor of 16 MiB or more never do.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_tput.h"

#define RAW_TIMEOUT_MS 30000
#define RAW_READ_MAX (1u << 20) /* as tpipd's receivers, which read one chunk at a time */

struct raw_side {
	const struct opts *o;
	size_t size;
	int fds[RAW_STREAMS_MAX];
	char *mem; /* slots of size bytes */
	int slots; /* bench_tput_slots(): as many as the tpipd reader uses */
	/* sender: the stop protocol (see raw_send_main()) */
	bool stop;
	long reached[RAW_STREAMS_MAX];
	long final;
	pthread_barrier_t bar;
	/* receiver: messages each stream received */
	long got[RAW_STREAMS_MAX];
	int err[RAW_STREAMS_MAX];
};

struct raw_thread {
	struct raw_side *s;
	int i;
};

/* Slice @i of a message: the bytes stream @i carries. */
static void raw_slice(const struct raw_side *s, int i, size_t *off, size_t *len)
{
	size_t base = s->size / (size_t)s->o->streams;

	*off = (size_t)i * base;
	*len = i == s->o->streams - 1 ? s->size - *off : base;
}

/* Where slice @off of message @m lives: its slot is m % k. */
static char *raw_at(const struct raw_side *s, long m, size_t off)
{
	return s->mem + (size_t)(m % s->slots) * s->size + off;
}

static char *raw_mem(const struct raw_side *s)
{
	size_t n = (size_t)s->slots * s->size;
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, 0x5a, n);
	return p;
}

/* ---- receiver (forked, in the reader's namespace) ---------------------------------------- */

/* Receives @len bytes into @dst in reads of at most RAW_READ_MAX bytes. Return: bytes received
 * (short only at the end of the stream) or -errno. */
static ssize_t raw_read(int fd, char *dst, size_t len)
{
	size_t got = 0;

	while (got < len) {
		size_t want = len - got < RAW_READ_MAX ? len - got : RAW_READ_MAX;
		ssize_t n = recv(fd, dst + got, want, MSG_WAITALL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static void *raw_recv_main(void *arg)
{
	struct raw_thread *t = arg;
	struct raw_side *s = t->s;
	size_t off, len;
	int r = 0;

	raw_slice(s, t->i, &off, &len);
	for (long m = 0;; m++) {
		ssize_t n = raw_read(s->fds[t->i], raw_at(s, m, off), len);

		if (n == 0) {
			s->got[t->i] = m; /* the sender's end, between two messages */
			break;
		}
		if (n != (ssize_t)len) { /* an error, or the end in the middle of a message */
			r = n < 0 ? (int)n : -EPROTO;
			break;
		}
	}
	s->err[t->i] = r;
	return NULL;
}

static int raw_recv_run(void *arg, int ready_fd)
{
	struct raw_side *s = arg;
	struct raw_thread th[RAW_STREAMS_MAX];
	pthread_t tid[RAW_STREAMS_MAX];
	int lfd = -1, port = 0, r = 0, n_started = 0;

	if (s->o->netns)
		r = bench_netns_enter(s->o->netns);
	if (r == 0)
		r = bench_tcp_listen(s->o->tcp_host, &lfd, &port);
	if (r == 0 && !(s->mem = raw_mem(s)))
		r = -ENOMEM;
	if (r < 0)
		fprintf(stderr, "bench_throughput: raw tcp receiver on %s: %s\n", s->o->tcp_host,
			strerror(-r));
	bench_ready_send(ready_fd, r < 0 ? r : port);
	for (int i = 0; i < s->o->streams && r == 0; i++) {
		uint32_t idx = 0;
		int fd = -1;

		r = bench_tcp_accept(lfd, &fd);
		if (r == 0 && (r = bench_read_full(fd, &idx, sizeof(idx))) == 0 &&
		    (idx >= (uint32_t)s->o->streams || s->fds[idx] >= 0))
			r = -EPROTO;
		if (r == 0)
			s->fds[idx] = fd;
		else if (fd >= 0)
			close(fd);
	}
	if (lfd >= 0)
		close(lfd);
	for (int i = 0; i < s->o->streams && r == 0; i++, n_started++) {
		th[i] = (struct raw_thread){ s, i };
		r = -pthread_create(&tid[i], NULL, raw_recv_main, &th[i]);
	}
	for (int i = 0; i < n_started; i++) {
		pthread_join(tid[i], NULL);
		if (r == 0 && (s->err[i] < 0 || s->got[i] != s->got[0]))
			r = s->err[i] < 0 ? s->err[i] : -EPROTO;
	}
	if (r == 0) /* everything arrived: the sender stops its clock */
		r = bench_write_full(s->fds[0], "k", 1);
	if (r < 0)
		fprintf(stderr, "bench_throughput: raw tcp receiver: %s\n", strerror(-r));
	return r;
}

/* ---- sender ------------------------------------------------------------------------------- */

/* Writes @len bytes at @p to @fd in writes of at most o->write_size bytes. Return: 0 or -errno. */
static int raw_write(const struct raw_side *s, int fd, const char *p, size_t len)
{
	size_t step = s->o->write_size ? s->o->write_size : len;
	int r = 0;

	for (size_t done = 0; done < len && r == 0; done += step)
		r = bench_write_full(fd, p + done, len - done < step ? len - done : step);
	return r;
}

/*
 * Stream @t->i sends its slice of message after message until the main thread says stop; each
 * stream then says how far it got, the main thread sets the count all of them send (the
 * furthest, at least o->min_msgs), and they finish there, so every slot arrives whole.
 */
static void *raw_send_main(void *arg)
{
	struct raw_thread *t = arg;
	struct raw_side *s = t->s;
	bool failed = false;
	size_t off, len;
	long m = 0;

	raw_slice(s, t->i, &off, &len);
	/* Until the stop (a failed stream, whose receiver is gone, just waits for it). */
	while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		if (failed) {
			usleep(1000);
			continue;
		}
		if (raw_write(s, s->fds[t->i], raw_at(s, m, off), len) < 0)
			failed = true;
		else
			m++;
	}
	s->reached[t->i] = m;
	pthread_barrier_wait(&s->bar);
	pthread_barrier_wait(&s->bar); /* s->final is set */
	for (; !failed && m < s->final; m++)
		if (raw_write(s, s->fds[t->i], raw_at(s, m, off), len) < 0)
			break;
	shutdown(s->fds[t->i], SHUT_WR);
	return NULL;
}

/* Connects the streams (each says its index first) to the receiver listening on @port. */
static int raw_connect(struct raw_side *s, int port)
{
	for (int i = 0; i < s->o->streams; i++) {
		uint32_t idx = (uint32_t)i;
		int r = bench_tcp_connect(s->o->tcp_host, port, &s->fds[i]);

		if (r == 0)
			r = bench_write_full(s->fds[i], &idx, sizeof(idx));
		if (r < 0) {
			fprintf(stderr, "bench_throughput: raw tcp: connect to %s port %d: %s\n",
				s->o->tcp_host, port, strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Runs the streams for o->min_s; returns the messages sent and the time to the receiver's ack. */
static int raw_send(struct raw_side *s, long *ret_msgs, uint64_t *ret_ns)
{
	struct raw_thread th[RAW_STREAMS_MAX];
	pthread_t tid[RAW_STREAMS_MAX];
	int n = 0, r = 0;
	uint64_t t0, min_ns = (uint64_t)(s->o->min_s * 1e9);
	char ack;

	t0 = bench_now_ns();
	for (; n < s->o->streams; n++) {
		th[n] = (struct raw_thread){ s, n };
		if (pthread_create(&tid[n], NULL, raw_send_main, &th[n]) != 0) {
			r = -EAGAIN;
			min_ns = 0; /* stop the ones that run */
			break;
		}
	}
	/* Threads meet at the barrier only after the stop below, so it can be sized now. */
	if (pthread_barrier_init(&s->bar, NULL, (unsigned)n + 1) != 0)
		abort();
	while (bench_now_ns() - t0 < min_ns) {
		uint64_t left = min_ns - (bench_now_ns() - t0);
		struct timespec ts = { (time_t)(left / 1000000000u), (long)(left % 1000000000u) };

		nanosleep(&ts, NULL);
	}
	__atomic_store_n(&s->stop, true, __ATOMIC_RELEASE);
	pthread_barrier_wait(&s->bar);
	s->final = s->o->min_msgs;
	for (int i = 0; i < n; i++)
		s->final = s->reached[i] > s->final ? s->reached[i] : s->final;
	pthread_barrier_wait(&s->bar);
	for (int i = 0; i < n; i++)
		pthread_join(tid[i], NULL);
	if (r == 0)
		r = bench_read_full(s->fds[0], &ack, 1);
	*ret_ns = bench_now_ns() - t0;
	*ret_msgs = s->final;
	pthread_barrier_destroy(&s->bar);
	return r;
}

double bench_rawtcp_gbps(const struct opts *o, size_t size)
{
	struct raw_side s = { .o = o, .size = size, .slots = bench_tput_slots(o->inflight, size) };
	int ready_fd, port, r;
	uint64_t ns = 0;
	long msgs = 0;
	pid_t pid;

	if (size < (size_t)o->streams) {
		fprintf(stderr, "bench_throughput: raw tcp baseline: %zu bytes is less than a byte "
				"per stream\n", size);
		return 0;
	}
	for (int i = 0; i < RAW_STREAMS_MAX; i++)
		s.fds[i] = -1;
	r = bench_spawn(raw_recv_run, &s, &pid, &ready_fd);
	if (r < 0)
		return 0;
	port = bench_ready_wait(ready_fd, RAW_TIMEOUT_MS);
	close(ready_fd);
	r = port > 0 ? 0 : port < 0 ? port : -EPROTO;
	if (r == 0 && !(s.mem = raw_mem(&s)))
		r = -ENOMEM;
	if (r == 0)
		r = raw_connect(&s, port);
	if (r == 0)
		r = raw_send(&s, &msgs, &ns);
	for (int i = 0; i < RAW_STREAMS_MAX; i++)
		if (s.fds[i] >= 0)
			close(s.fds[i]);
	if (r < 0)
		kill(pid, SIGKILL); /* it may still wait for a connection that never comes */
	if (bench_reap(pid, "raw tcp receiver") < 0 && r == 0)
		r = -EPROTO;
	if (s.mem)
		munmap(s.mem, (size_t)s.slots * size);
	if (r < 0 || !ns) {
		fprintf(stderr, "bench_throughput: raw tcp baseline for %zu bytes: %s\n", size,
			strerror(r < 0 ? -r : EPROTO));
		return 0;
	}
	return (double)msgs * (double)size / (double)ns;
}
