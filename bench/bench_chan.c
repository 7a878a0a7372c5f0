/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_chan: items per second and GB/s through a named channel (docs/channels.md) from one
 * writer process to 1 or 4 reader processes, for 4 KiB, 64 KiB, 1 MiB and 16 MiB items, and the
 * same through ZeroMQ PUSH/PULL over ipc:// in the same run when built with libzmq (Debian:
 * libzmq3-dev; otherwise its rows say "skipped"). Channel rows run twice: "chan-priv" with the
 * writer's items and the readers' allocations in private memory (items above 16 KiB go through
 * the library's staging buffers, or by CMA without them), "chan-shm" with both in shared buffers
 * (tp_buffer_alloc(): the daemon copies items above 16 KiB with memcpy). Readers take the items
 * that ride inline (up to 256 KiB, from shared buffers too) with tp_chan_read_many_into() (64 per
 * call at most, packed into one reused buffer of up to 1 MiB; BENCH_CHAN_MANY_MALLOC=1:
 * tp_chan_read_many(), an allocation per item, as before; BENCH_CHAN_SHM_BATCH=16384: shared-
 * buffer items above 16 KiB one tp_chan_read_into() each, as before), and larger items too,
 * into a packed buffer of BENCH_CHAN_PACK bytes (default 4 MiB, or one item): the daemon
 * copies several shared-buffer items there in one answer, and hands out several private ones
 * of one writer's buffer by mapping (BENCH_CHAN_SHM_BATCH=262144, BENCH_CHAN_PRIV_BATCH=262144:
 * one tp_chan_read_into() each into one reused allocation, as before); the writer
 * writes batches
 * (bench_batch(): up to 64 small items within the daemon's 1 MiB inline limit, 4 MiB of larger
 * ones). With a daemon or library before protocol minor 7 (or
 * BENCH_CHAN_OLD=1) the readers use tp_chan_read() and items above the inline limit are
 * reported as n/a, as this program did before.
 *
 * Usage: TPIPD_SOCKET=... bench_chan [SECONDS_PER_ROW (default 1)]. Numbers, never pass/fail.
 * A short warm-up run through a channel comes first, not reported.
 * BENCH_CHAN_SIZE=N runs the rows of one item size only, BENCH_CHAN_READERS=N (1 or 4) those of one
 * number of readers; BENCH_CHAN_MANY=N (1..64) sets the
 * items per batch read (1: tp_chan_read_into() for every item). BENCH_CHAN_ROWS=LIST
 * runs only the rows named in LIST (any of "priv", "shm", "zmq"; e.g. "priv,zmq" to profile).
 * ZeroMQ rows: readers forked before the writer's context exists (a context does not survive
 * fork()), timed once all are connected, queues bounded to 64 MiB of items a pipe (HWM); a row
 * whose step (a connect, an item taken, the readers' end) takes over 10 s gives up, printing
 * "failed" and a line with the reason, instead of waiting for ever.
 * BENCH_CHAN_WLAT=1 prints instead, per item size, the median time of a write of 4 private items
 * into a channel with room (no reader waiting; each batch read back untimed): the writer's cost.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpclient.h"
#ifdef HAVE_ZMQ
#include <zmq.h>
#endif

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool old_api; /* BENCH_CHAN_OLD=1: one tp_chan_read() per item, as before minor 7 */
static size_t shm_batch_max = SIZE_MAX; /* BENCH_CHAN_SHM_BATCH: largest shared-buffer item
					  * read in batches (16384: one tp_chan_read_into() each
					  * above) */
static size_t priv_batch_max = SIZE_MAX; /* BENCH_CHAN_PRIV_BATCH: the same for private items
					   * (262144: one tp_chan_read_into() each above) */
static size_t large_pack = 4u << 20; /* BENCH_CHAN_PACK: the packed buffer of a reader of items
				      * above 256 KiB (several in one answer: copied there by the
				      * daemon, or read by mapping) */
static size_t read_max = 64; /* BENCH_CHAN_MANY: items per batch read (1: read_into) */
/* BENCH_CHAN_MANY_MALLOC=1: batches with tp_chan_read_many() (an allocation per item), not
 * tp_chan_read_many_into() */
static bool many_malloc;

/* Does BENCH_CHAN_ROWS (unset: every row) name rows of kind @what? */
static bool rows_want(const char *what)
{
	const char *l = getenv("BENCH_CHAN_ROWS");

	return !l || strstr(l, what);
}

/* Memory of @size bytes: shared (tp_buffer_alloc()) or private. NULL on failure. */
static void *mem_alloc(struct tp_context *ctx, size_t size, bool shm)
{
	void *p = NULL;

	if (shm)
		return tp_buffer_alloc(ctx, size, &p) == 0 ? p : NULL;
	return malloc(size);
}

static void mem_free(struct tp_context *ctx, void *p, bool shm)
{
	if (shm)
		tp_buffer_free(ctx, p);
	else
		free(p);
}

/* Whether items of @size are read in batches (they ride inline). */
static bool read_batched(size_t size, bool shm)
{
	return !old_api && size <= (shm ? shm_batch_max : priv_batch_max) && read_max > 1;
}

/* The reader's buffer for items of @size: one item, or for batches read into one buffer
 * (tp_chan_read_many_into()) read_max of them packed, within the daemon's 1 MiB inline limit. */
static size_t read_buf_size(size_t size, bool shm)
{
	size_t packed = read_max * ((size + 63) / 64 * 64);

	if (!read_batched(size, shm) || many_malloc)
		return size;
	if (size > 262144)
		return packed < large_pack ? packed : (size > large_pack ? size : large_pack);
	return packed < (1u << 20) ? packed : (size > (1u << 20) ? size : 1u << 20);
}

/* Reads until the channel is drained. Return: 0, or 1 on a failure. */
static int chan_read_all(struct tp_chan *ch, size_t size, void *buf, size_t buf_size, bool shm)
{
	struct tp_chan_item it[64];
	size_t n, len;
	void *item;
	int r;

	for (;;) {
		if (old_api) {
			r = tp_chan_read(ch, &item, &len, -1);
			if (r >= 0)
				free(item);
		} else if (read_batched(size, shm) && !many_malloc) {
			r = tp_chan_read_many_into(ch, buf, buf_size, it, read_max, &n, -1);
		} else if (read_batched(size, shm)) {
			r = tp_chan_read_many(ch, it, read_max, &n, -1);
			for (size_t k = 0; r >= 0 && k < n; k++)
				free(it[k].data);
		} else {
			r = tp_chan_read_into(ch, buf, size, &len, -1);
		}
		if (r < 0)
			return r == -EPIPE ? 0 : 1;
	}
}

static int chan_reader(const char *name, size_t size, bool shm)
{
	struct tp_context *ctx;
	struct tp_chan *ch;
	void *buf;
	int r;

	if (tp_context_new(NULL, &ctx) < 0 || tp_chan_open(ctx, name, NULL, &ch) < 0)
		return 1;
	buf = mem_alloc(ctx, read_buf_size(size, shm), shm);
	r = buf ? chan_read_all(ch, size, buf, read_buf_size(size, shm), shm) : 1;
	if (buf)
		mem_free(ctx, buf, shm);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return r;
}

/* Items per write: up to 64 of 4 KiB or 16 of 64 KiB (the daemon's 1 MiB inline limit), 4 of
 * 1 MiB, 1 of 16 MiB (before minor 7: 16 up to 64 KiB, else 1, as this program did). */
static unsigned bench_batch(size_t size)
{
	if (old_api)
		return size <= 65536 ? 16 : 1;
	if (size <= 65536)
		return (1u << 20) / size < 64 ? (unsigned)((1u << 20) / size) : 64;
	return size < (4u << 20) ? (unsigned)((4u << 20) / size) : 1;
}

/* One row through a channel: @n items of @size to @readers readers, from and into shared
 * buffers (@shm) or private memory. Return: seconds, < 0 on failure. */
static double run_chan(size_t size, unsigned n, unsigned readers, bool shm)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE | TP_CHAN_EXCL,
				     .owner_uid = -1, .capacity_items = 256 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	struct iovec iov[64];
	unsigned batch = bench_batch(size);
	pid_t pids[4];
	char *buf;
	double t0, t;
	int ok = 1, st;

	if (tp_context_new(NULL, &ctx) < 0)
		return -1;
	if (tp_chan_open(ctx, "bench.chan", &o, &ch) < 0) {
		tp_context_free(ctx);
		return -1;
	}
	buf = mem_alloc(ctx, size, shm);
	if (!buf) {
		tp_chan_release(ch);
		tp_context_free(ctx);
		return -1;
	}
	memset(buf, 0x5a, size);
	for (unsigned i = 0; i < batch; i++) {
		iov[i].iov_base = buf;
		iov[i].iov_len = size;
	}
	for (unsigned i = 0; i < readers; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(chan_reader("bench.chan", size, shm));
	}
	t0 = now_s();
	for (unsigned i = 0; i < n && ok; i += batch)
		ok = tp_chan_write(ch, iov, batch, -1) == 0;
	tp_chan_close(ch);
	for (unsigned i = 0; i < readers; i++)
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			ok = 0;
	t = now_s() - t0;
	mem_free(ctx, buf, shm);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return ok ? t : -1;
}

#ifdef HAVE_ZMQ
/* How long a ZeroMQ row waits for any one step (a reader's connect, an item taken, the end of
 * the readers) before it gives up with a reason: a row is numbers, never a hang. */
#define ZMQ_STEP_MS 10000
/* Messages each PUSH pipe and PULL queue may hold: at most 64 MiB of items (at least 4), not
 * ZeroMQ's default 1000 messages, which for 16 MiB items let the writer queue many GiB ahead of
 * slow readers until the machine swapped. */
#define ZMQ_QUEUE_BYTES (64u << 20)

static char zmq_why[160]; /* why the last ZeroMQ row gave up */

static int zmq_hwm(size_t size)
{
	size_t n = ZMQ_QUEUE_BYTES / size;

	return n < 4 ? 4 : n > 1000 ? 1000 : (int)n;
}

/* A reader process (forked before the writer made its ZeroMQ context: a context does not
 * survive fork()): takes messages until an empty one. Exit status: 0 done; 1 no socket or
 * connect; 2 no message for ZMQ_STEP_MS. */
static int zmq_reader(const char *addr, size_t size)
{
	void *zc = zmq_ctx_new(), *s = zc ? zmq_socket(zc, ZMQ_PULL) : NULL;
	int hwm = zmq_hwm(size), tmo = ZMQ_STEP_MS, ivl = 10, linger = 0, r = -1;
	zmq_msg_t m;

	if (!s || zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof(tmo)) < 0 ||
	    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl)) < 0 ||
	    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)) < 0 || zmq_connect(s, addr) < 0)
		return 1;
	for (;;) {
		zmq_msg_init(&m);
		r = zmq_msg_recv(&m, s, 0);
		zmq_msg_close(&m);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
	}
	zmq_close(s);
	zmq_ctx_term(zc);
	return r == 0 ? 0 : 2;
}

/* Waits until @n readers are connected to the socket @mon monitors (ZMQ_EVENT_ACCEPTED; two
 * frames an event: the event number and value, then the endpoint). Return: 0 or -1. */
static int zmq_wait_connected(void *mon, unsigned n)
{
	unsigned got = 0;

	while (got < n) {
		zmq_msg_t m;
		uint16_t ev = 0;
		int r, more;

		zmq_msg_init(&m);
		r = zmq_msg_recv(&m, mon, 0); /* ZMQ_RCVTIMEO: ZMQ_STEP_MS */
		if (r < 0) {
			zmq_msg_close(&m);
			if (errno == EINTR)
				continue;
			return -1;
		}
		more = zmq_msg_more(&m);
		if (r >= (int)sizeof(ev))
			memcpy(&ev, zmq_msg_data(&m), sizeof(ev));
		zmq_msg_close(&m);
		if (more) {
			zmq_msg_init(&m);
			zmq_msg_recv(&m, mon, 0);
			zmq_msg_close(&m);
		}
		got += ev == ZMQ_EVENT_ACCEPTED;
	}
	return 0;
}

/* Ends the readers: an empty message each (whichever reader takes one ends), until all have
 * exited or ZMQ_STEP_MS passed; then the ones left are killed. Return: 0, or -1 (@zmq_why). */
static int zmq_end_readers(void *s, pid_t *pids, unsigned readers)
{
	double end = now_s() + ZMQ_STEP_MS / 1e3;
	unsigned done = 0, bad = 0;
	int st;

	while (done < readers && now_s() < end) {
		if (zmq_send(s, "", 0, ZMQ_DONTWAIT) < 0)
			usleep(1000); /* every queue full (HWM): the readers are behind */
		for (unsigned i = 0; i < readers; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i])
				continue;
			if (!WIFEXITED(st) || WEXITSTATUS(st))
				bad = WIFEXITED(st) ? (unsigned)WEXITSTATUS(st) : 128u + (unsigned)WTERMSIG(st);
			pids[i] = 0;
			done++;
		}
	}
	for (unsigned i = 0; i < readers; i++) {
		if (pids[i] <= 0)
			continue;
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, 0);
		pids[i] = 0;
	}
	if (done < readers)
		snprintf(zmq_why, sizeof(zmq_why), "%u of %u readers still running after %u ms of "
			 "end messages (killed)", readers - done, readers, ZMQ_STEP_MS);
	else if (bad)
		snprintf(zmq_why, sizeof(zmq_why), "a reader exited with status %u%s", bad,
			 bad == 2 ? " (no message for its step limit)" :
			 bad == 1 ? " (no connect)" : "");
	return done < readers || bad ? -1 : 0;
}

/* @n items of @size from one PUSH socket to @readers PULL processes over ipc://. Return: the
 * seconds from the first item to the last reader's end, or -1 (the reason in @zmq_why). */
static double run_zmq(size_t size, unsigned n, unsigned readers)
{
	int hwm = zmq_hwm(size), tmo = ZMQ_STEP_MS, linger = 0;
	void *zc = NULL, *s = NULL, *mon = NULL;
	pid_t pids[4] = { 0 };
	char addr[64], maddr[64];
	char *buf = malloc(size);
	double t0, t = -1;

	zmq_why[0] = '\0';
	snprintf(addr, sizeof(addr), "ipc:///tmp/bench_chan_zmq.%d", (int)getpid());
	snprintf(maddr, sizeof(maddr), "inproc://bench_chan_zmq_mon");
	if (!buf) {
		snprintf(zmq_why, sizeof(zmq_why), "out of memory");
		return -1;
	}
	memset(buf, 0x5a, size);
	for (unsigned i = 0; i < readers; i++) { /* before this process has a context */
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(zmq_reader(addr, size));
	}
	zc = zmq_ctx_new();
	s = zc ? zmq_socket(zc, ZMQ_PUSH) : NULL;
	if (!s || zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof(tmo)) < 0 ||
	    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
	    zmq_socket_monitor(s, maddr, ZMQ_EVENT_ACCEPTED) < 0 ||
	    !(mon = zmq_socket(zc, ZMQ_PAIR)) ||
	    zmq_setsockopt(mon, ZMQ_RCVTIMEO, &tmo, sizeof(tmo)) < 0 ||
	    zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
	    zmq_connect(mon, maddr) < 0 || zmq_bind(s, addr) < 0) {
		snprintf(zmq_why, sizeof(zmq_why), "socket set-up: %s", zmq_strerror(errno));
		goto out;
	}
	if (zmq_wait_connected(mon, readers) < 0) {
		snprintf(zmq_why, sizeof(zmq_why), "not every reader connected within %u ms",
			 ZMQ_STEP_MS);
		goto out;
	}
	t0 = now_s();
	for (unsigned i = 0; i < n; i++) {
		if (zmq_send(s, buf, size, 0) < 0) {
			snprintf(zmq_why, sizeof(zmq_why), "item %u of %u: %s%s", i, n,
				 zmq_strerror(errno), errno == EAGAIN ? " (no reader took one within the "
				 "step limit)" : "");
			goto out;
		}
	}
	if (zmq_end_readers(s, pids, readers) == 0)
		t = now_s() - t0;
out:
	for (unsigned i = 0; i < readers; i++) { /* (none left after zmq_end_readers()) */
		if (pids[i] <= 0)
			continue;
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, 0);
	}
	if (mon)
		zmq_close(mon);
	if (s)
		zmq_close(s);
	if (zc)
		zmq_ctx_term(zc);
	unlink(addr + strlen("ipc://")); /* ZeroMQ leaves the socket file behind */
	free(buf);
	return t;
}
#endif

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* BENCH_CHAN_WLAT: median seconds of 40 writes of 4 private items of @size, < 0 on failure. */
static double run_wlat(size_t size)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE | TP_CHAN_EXCL,
				     .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	struct iovec iov[4];
	char *src = malloc(size), *dst = malloc(size);
	double t[40], t0 = -1;
	size_t len;
	int ok = src && dst && tp_context_new(NULL, &ctx) == 0;

	if (ok && tp_chan_open(ctx, "bench.wlat", &o, &ch) < 0) {
		tp_context_free(ctx);
		ok = 0;
	}
	for (unsigned i = 0; ok && i < 4; i++)
		iov[i] = (struct iovec){ .iov_base = src, .iov_len = size };
	if (ok)
		memset(src, 0x5a, size);
	for (unsigned k = 0; ok && k < 40; k++) {
		t0 = now_s();
		ok = tp_chan_write(ch, iov, 4, -1) == 0;
		t[k] = now_s() - t0;
		for (unsigned i = 0; ok && i < 4; i++)
			ok = tp_chan_read_into(ch, dst, size, &len, -1) >= 0;
	}
	if (ok || t0 >= 0) {
		tp_chan_release(ch);
		tp_context_free(ctx);
	}
	free(src);
	free(dst);
	if (!ok)
		return -1;
	qsort(t, 40, sizeof(t[0]), dbl_cmp);
	return t[20];
}

static void row(const char *what, size_t size, unsigned readers, unsigned n, double t)
{
	if (t < 0) {
		printf("%-9s %9zu %7u %10s %10s\n", what, size, readers, "failed", "-");
		return;
	}
	printf("%-9s %9zu %7u %10.0f %10.3f\n", what, size, readers, n / t, n * (double)size / t / 1e9);
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 4096, 65536, 1u << 20, 16u << 20 };
	static const unsigned nreaders[] = { 1, 4 };
	double secs = argc > 1 ? atof(argv[1]) : 1.0;

	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	old_api = getenv("BENCH_CHAN_OLD") && atoi(getenv("BENCH_CHAN_OLD"));
	many_malloc = getenv("BENCH_CHAN_MANY_MALLOC") && atoi(getenv("BENCH_CHAN_MANY_MALLOC"));
	if (getenv("BENCH_CHAN_SHM_BATCH"))
		shm_batch_max = (size_t)atol(getenv("BENCH_CHAN_SHM_BATCH"));
	if (getenv("BENCH_CHAN_PRIV_BATCH"))
		priv_batch_max = (size_t)atol(getenv("BENCH_CHAN_PRIV_BATCH"));
	if (getenv("BENCH_CHAN_PACK"))
		large_pack = (size_t)atol(getenv("BENCH_CHAN_PACK"));
	if (getenv("BENCH_CHAN_MANY"))
		read_max = (size_t)atoi(getenv("BENCH_CHAN_MANY"));
	if (read_max < 1 || read_max > 64)
		read_max = 64;
	/* A warm-up run, not reported: whichever row came first in a process ran about half as fast
	 * as the same row later (the first contexts, forks and page faults of the process). */
	run_chan(4096, 4096, 1, false);
	if (getenv("BENCH_CHAN_WLAT") && atoi(getenv("BENCH_CHAN_WLAT"))) {
		printf("%-9s %9s %12s\n", "WHAT", "ITEM", "WRITE_US");
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			double t = run_wlat(sizes[i]);

			printf("%-9s %9zu %12.0f\n", "chan-wlat", sizes[i], t < 0 ? -1 : t * 1e6);
		}
		return 0;
	}
	printf("%-9s %9s %7s %10s %10s\n", "WHAT", "ITEM", "READERS", "ITEMS/S", "GB/S");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (getenv("BENCH_CHAN_SIZE") && (size_t)atol(getenv("BENCH_CHAN_SIZE")) != sizes[i])
			continue;
		/* about @secs at 2 GB/s or 500k items/s, at least 64 items */
		double want = secs * 2e9 / sizes[i];
		unsigned n = (unsigned)(want > 500000 * secs ? 500000 * secs : want);

		n = n < 64 ? 64 : (n + 63) / 64 * 64; /* a multiple of every batch */
		for (size_t k = 0; k < 2; k++) {
			if (getenv("BENCH_CHAN_READERS") &&
			    (unsigned)atoi(getenv("BENCH_CHAN_READERS")) != nreaders[k])
				continue;
			for (int shm = 0; shm < 2; shm++) {
				const char *what = shm ? "chan-shm" : "chan-priv";

				if (!rows_want(shm ? "shm" : "priv"))
					continue;
				if (old_api && sizes[i] > (1u << 20))
					printf("%-9s %9zu %7u %10s %10s\n", what, sizes[i],
					       nreaders[k], "n/a", "(inline)");
				else
					row(what, sizes[i], nreaders[k], n,
					    run_chan(sizes[i], n, nreaders[k], shm));
			}
			if (!rows_want("zmq"))
				continue;
#ifdef HAVE_ZMQ
			double tz = run_zmq(sizes[i], n, nreaders[k]);

			row("zmq", sizes[i], nreaders[k], n, tz);
			if (tz < 0)
				printf("  zmq row gave up: %s\n", zmq_why);
#else
			printf("%-9s %9zu %7u %10s %10s\n", "zmq", sizes[i], nreaders[k], "skipped",
			       "(no libzmq)");
#endif
		}
	}
	return 0;
}
