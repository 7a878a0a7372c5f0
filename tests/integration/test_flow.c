/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: flow control (issue 22, "holds writes instead of failing them"). A writer
 * that gets ahead of its reader keeps its writes pending instead of failing them: libtpclient
 * holds what lies beyond the pipe's write window (--pipe-queue-max messages, --pipe-queue-bytes
 * inline bytes) and sends it as the daemon returns room (FlowCredit), while the daemon's queue
 * never holds more than its limits (read with `tpipctl --json status`). Covered: 1 GiB as 64 KiB
 * messages to a late reader, the same across hosts with blocking writes, many small messages on
 * a pipe still waiting for its listener, the pipe's error and a local close reaching held writes,
 * and a raw client that ignores the window meeting the hard limits (at them: queued; one over:
 * -ENOBUFS, its room returned with FlowCredit). The daemon-wide budget (--pipe-queue-bytes-max):
 * four pipes over it wait for it (all written, bounded), and clients that ignore the wait (minor
 * 4, or minor 5 ignoring resend) meet it as a hard limit.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include "frame.h"
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(20000)
#define LONG_MS TPT_SCALED_MS(240000)

static struct tpt_daemon dm, dm2;
static struct tpt_sync ready, filled, go, done;

static void start(const char *const *args)
{
	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&filled), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
}

static void stop(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
}

/* ---- completions of many writes --------------------------------------------------------- */

struct flow_done {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned count, ok, order_errors;
	int first_err, last_err;
	unsigned n_err;
};

static struct flow_done fd_;

static void flow_done_init(struct flow_done *d)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
}

/* tp_done_fn; @arg is the write's index cast to a pointer. */
static void flow_done_cb(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct flow_done *d = &fd_;

	pthread_mutex_lock(&d->lock);
	if ((uintptr_t)arg != d->count)
		d->order_errors++;
	d->count++;
	if (status == 0) {
		d->ok++;
	} else {
		if (!d->n_err++)
			d->first_err = status;
		d->last_err = status;
	}
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

/* Waits until @n callbacks ran. Return: 0 or -ETIMEDOUT. */
static int flow_done_wait(struct flow_done *d, unsigned n, int timeout_ms)
{
	uint64_t end = tpt_now_ms() + (uint64_t)timeout_ms;
	int r = 0;

	pthread_mutex_lock(&d->lock);
	while (d->count < n && r == 0) {
		struct timespec ts;
		uint64_t now = tpt_now_ms();

		if (now >= end) {
			r = -ETIMEDOUT;
			break;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&d->cond, &d->lock, &ts);
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

static unsigned flow_done_count(struct flow_done *d)
{
	unsigned n;

	pthread_mutex_lock(&d->lock);
	n = d->count;
	pthread_mutex_unlock(&d->lock);
	return n;
}

/* ---- one writer, one late reader ------------------------------------------------------------ */

struct flow_case {
	const struct tpt_daemon *rd, *wd; /* the reader's and the writer's daemon */
	const char *name;
	unsigned n;	 /* messages */
	size_t len;	 /* bytes each (one payload) */
	unsigned fill;	 /* completions filling the window (then the writer posts @filled) */
	bool sync;	 /* blocking writes (on a thread): the window fills, the next blocks */
	bool early;	 /* write before the listener exists (connect with wait_ms) */
};

static const struct flow_case *fc;

static int late_reader(void *arg)
{
	struct tpt_end e = { .d = fc->rd, .ctx_name = "late-reader", .where = fc->name,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .n_payloads = 1, .lens = { fc->len } };
	int r;

	/* Early: the writer is already writing to a name nobody listens on yet. */
	if (fc->early)
		TPT_REQUIRE(tpt_sync_wait(&go, LONG_MS) == 0, 1, "no go");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	if (!fc->early)
		TPT_REQUIRE(tpt_sync_wait(&go, LONG_MS) == 0, 1, "no go");
	for (unsigned i = 0; i < fc->n; i++) {
		s.index = i;
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u of %u: %d", i, fc->n, r);
	}
	TPT_REQUIRE(tpt_sync_wait(&done, LONG_MS) == 0, 1, "writer did not finish");
	tpt_end_close(&e);
	return 0;
}

struct sync_writer {
	struct tp_pipe *p;
	struct tp_message *m;
	int err;
	unsigned at;
};

static void *sync_writer_thread(void *arg)
{
	struct sync_writer *w = arg;

	for (w->at = 0; w->at < fc->n; w->at++) {
		w->err = tp_pipe_write_sync(w->p, &w->m[w->at]);
		flow_done_cb((void *)(uintptr_t)w->at, w->p, w->err, NULL);
		if (w->err)
			break;
	}
	return NULL;
}

static int connect_early(struct tpt_end *e, char *addr)
{
	struct tp_connect_options o = { .size = sizeof(o), .wait_ms = (unsigned)T_MS };
	int r = tpt_ctx_new(e->d, 0, e->ctx_name, &e->ctx);

	if (r == 0)
		r = tp_connect_ex(e->ctx, addr, &o, &e->p);
	return r;
}

static int early_writer_fill_wait(void)
{
	/* The reader reads once the window is full: completions stop at @fill meanwhile. On a
	 * pipe still connecting nothing completes before the reader listens. */
	if (fc->early)
		return 0;
	TPT_REQUIRE(flow_done_wait(&fd_, fc->fill, T_MS) == 0, 1, "%u of %u completions",
		    flow_done_count(&fd_), fc->fill);
	return 0;
}

static int late_writer(void *arg)
{
	struct tpt_end e = { .d = fc->wd, .ctx_name = "early-writer", .ready = &ready,
			     .timeout_ms = T_MS };
	char addr[200];
	uint8_t *data = malloc(fc->n * fc->len);
	struct tp_payload *pl = calloc(fc->n, sizeof(*pl));
	struct tp_message *m = calloc(fc->n, sizeof(*m));
	struct sync_writer sw = { 0 };
	pthread_t th;

	TPT_REQUIRE(data && pl && m, 1, "out of memory");
	flow_done_init(&fd_);
	for (unsigned i = 0; i < fc->n; i++) {
		pl[i] = (struct tp_payload){ .data = data + i * fc->len, .length = fc->len };
		tpt_fill(pl[i].data, fc->len, tpt_seed(0, i, 0));
		m[i] = (struct tp_message){ .payloads = &pl[i], .n_payloads = 1 };
	}
	e.where = fc->wd == fc->rd ? fc->name : tpt_peer_address(fc->rd, fc->name, addr,
								     sizeof(addr));
	if (fc->early)
		TPT_REQUIRE(connect_early(&e, (char *)e.where) == 0, 1, "connect");
	else
		TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	if (fc->sync) {
		sw = (struct sync_writer){ .p = e.p, .m = m };
		TPT_REQUIRE(pthread_create(&th, NULL, sync_writer_thread, &sw) == 0, 1, "thread");
	} else {
		for (unsigned i = 0; i < fc->n; i++) {
			int r = tp_pipe_write(e.p, &m[i], flow_done_cb, (void *)(uintptr_t)i);
			TPT_REQUIRE(r == 0, 1, "write %u of %u returned %d: %s", i, fc->n, r,
				    tp_last_error());
		}
	}
	if (early_writer_fill_wait())
		return 1;
	TPT_REQUIRE(tpt_sync_post(&filled, 0) == 0, 1, "post");
	TPT_REQUIRE(flow_done_wait(&fd_, fc->n, LONG_MS) == 0, 1, "%u of %u writes completed",
		    flow_done_count(&fd_), fc->n);
	if (fc->sync)
		pthread_join(th, NULL);
	TPT_REQUIRE(fd_.ok == fc->n && fd_.order_errors == 0, 1,
		    "%u of %u writes succeeded (first error %d), %u out of order", fd_.ok, fc->n,
		    fd_.first_err, fd_.order_errors);
	TPT_REQUIRE(tpt_sync_post(&done, 0) == 0, 1, "post");
	tpt_end_close(&e);
	free(m);
	free(pl);
	free(data);
	return 0;
}

/* The largest values of `tpipctl --json status` pipe_queued_{bytes,messages} of @d seen. */
struct queue_peak {
	uint64_t bytes, msgs;
};

static void peak_sample(const struct tpt_daemon *d, struct queue_peak *pk)
{
	const char *keys[] = { "pipe_queued_bytes", "pipe_queued_messages" };
	uint64_t v[2];

	tpt_status_u64s(d, keys, 2, v);
	pk->bytes = v[0] > pk->bytes ? v[0] : pk->bytes;
	pk->msgs = v[1] > pk->msgs ? v[1] : pk->msgs;
}

/*
 * Runs @c: writer and reader children; once the writer has filled its window the parent checks
 * that the reader's daemon holds exactly the window (and the writer's, across hosts), lets the
 * reader go, and samples both daemons' queues until both children are done.
 */
static void flow_run(const struct flow_case *c, uint64_t max_bytes, uint64_t max_msgs)
{
	struct queue_peak pk = { 0 }, pk2 = { 0 };
	pid_t rd, wr;
	int st_r = -1, st_w = -1;

	fc = c;
	rd = tpt_fork(late_reader, NULL);
	wr = tpt_fork(late_writer, NULL);
	ck_assert_msg(tpt_sync_wait(&filled, LONG_MS) == 0, "the writer did not fill its window");
	for (unsigned round = 0; !c->early && pk.msgs < c->fill && round < 400; round++) {
		peak_sample(c->rd, &pk); /* across hosts the last descriptors may be on their way */
		if (pk.msgs < c->fill)
			tpt_backoff(round);
	}
	ck_assert_msg(c->early || pk.msgs == c->fill, "reader's daemon queues %llu messages, "
		      "want %u", (unsigned long long)pk.msgs, c->fill);
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	while (waitpid(wr, &st_w, WNOHANG) == 0) {
		peak_sample(c->rd, &pk);
		if (c->wd != c->rd)
			peak_sample(c->wd, &pk2);
	}
	st_w = WIFEXITED(st_w) ? WEXITSTATUS(st_w) : 128;
	ck_assert_int_eq(tpt_wait(rd, LONG_MS, &st_r), 0);
	st_r = WIFEXITED(st_r) ? WEXITSTATUS(st_r) : 128;
	ck_assert_msg(st_w == 0 && st_r == 0, "writer %d, reader %d", st_w, st_r);
	tpt_log("peak queue: %llu bytes, %llu messages (limits %llu, %llu)",
		(unsigned long long)pk.bytes, (unsigned long long)pk.msgs,
		(unsigned long long)max_bytes, (unsigned long long)max_msgs);
	ck_assert_msg(pk.bytes <= max_bytes && pk.msgs <= max_msgs,
		      "the reader's daemon queued %llu bytes, %llu messages",
		      (unsigned long long)pk.bytes, (unsigned long long)pk.msgs);
	ck_assert_msg(pk2.bytes <= max_bytes && pk2.msgs <= max_msgs,
		      "the writer's daemon queued %llu bytes, %llu messages",
		      (unsigned long long)pk2.bytes, (unsigned long long)pk2.msgs);
}

/* The case: 1 GiB as 64 KiB messages (inline, eager) to a reader that starts late.
 * Default limits: 64 MiB per pipe, so 1,024 messages fill the window. */
START_TEST(test_flow_gib_to_a_late_reader_is_all_written_and_bounded)
{
	static const struct flow_case c = { .rd = &dm, .wd = &dm, .name = "gib", .n = 16384,
					    .len = 64u << 10, .fill = 1024 };

	start(NULL);
	flow_run(&c, 64ull << 20, 4096);
	stop();
}
END_TEST

/* Many small messages, written before the listener exists (the pipe is still connecting),
 * with a window of 64 messages. */
START_TEST(test_flow_small_messages_on_a_connecting_pipe_wait_for_room)
{
	static const struct flow_case c = { .rd = &dm, .wd = &dm, .name = "small", .n = 20000,
					    .len = 100, .fill = 64, .early = true };
	const char *args[] = { "--pipe-queue-max", "64", NULL };

	start(args);
	flow_run(&c, 64 * 100, 64);
	stop();
}
END_TEST

/* Across hosts, with blocking writes: 64 MiB as 64 KiB messages through a window of 8 MiB on
 * both daemons; the writer's blocking call waits while the window is full. */
START_TEST(test_flow_cross_host_blocking_writes_wait_for_room)
{
	static const struct flow_case c = { .rd = &dm2, .wd = &dm, .name = "xgib", .n = 1024,
					    .len = 64u << 10, .fill = 128, .sync = true };
	const char *args[] = { "--pipe-queue-bytes", "8M", NULL };

	ck_assert_int_eq(tpt_daemon_pair_start(&dm, args, &dm2, args), 0);
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&filled), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
	flow_run(&c, 8ull << 20, 4096);
	ck_assert_int_eq(tpt_daemon_stop(&dm2), 0);
	stop();
}
END_TEST

static void pair_start(const char *const *writer_args, const char *const *reader_args)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&dm, writer_args, &dm2, reader_args), 0);
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&filled), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
}

/*
 * Across hosts the window is the smaller of both daemons' limits: the reader's daemon has
 * --pipe-queue-bytes 64K, the writer's the default 64 MiB. 200 eager messages of 4 KiB to a
 * late reader: the writer's daemon keeps 16 (64 KiB) at the reader's and turns the rest back
 * until the reader consumes; every message arrives (the reader's daemon dropped those over its
 * limit before, and the reader waited for them for ever), none is refused.
 */
START_TEST(test_flow_cross_host_window_is_the_smaller_daemons)
{
	static const struct flow_case c = { .rd = &dm2, .wd = &dm, .name = "xsmall", .n = 200,
					    .len = 4096, .fill = 16 };
	const char *rargs[] = { "--pipe-queue-bytes", "64K", NULL };
	const char *keys[] = { "remote_refused" };
	uint64_t refused = 1;

	pair_start(NULL, rargs);
	flow_run(&c, 64u << 10, 16);
	tpt_status_u64s(&dm2, keys, 1, &refused);
	ck_assert_uint_eq(refused, 0);
	ck_assert_int_eq(tpt_daemon_stop(&dm2), 0);
	stop();
}
END_TEST

#define DROP_N 10
#define DROP_LEN (16u << 10) /* eager */

static int drop_reader(void *arg)
{
	struct tpt_end e = { .d = &dm2, .ctx_name = "drop-reader", .where = "dropped",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .pipe = 9, .n_payloads = 1, .lens = { DROP_LEN } };
	unsigned n;
	int r = 0;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&go, LONG_MS) == 0, 1, "no go");
	for (n = 0; n < DROP_N && r == 0; n++) {
		s.index = n;
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	}
	/* What the reader's daemon queued arrives intact; then the pipe's error, not a hang. */
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT && n > 1 && n < DROP_N, 1, "read %u: %d", n, r);
	tpt_end_close(&e);
	return 0;
}

static int drop_writer(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "drop-writer", .ready = &ready,
			     .timeout_ms = T_MS };
	static struct tpt_msg m[DROP_N + 1];
	static struct tpt_done_arg da[DROP_N];
	static struct tpt_done dd;
	struct tp_descriptor *d = NULL;
	char addr[200];
	int r;

	e.where = tpt_peer_address(&dm2, "dropped", addr, sizeof(addr));
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	tpt_done_init(&dd);
	for (unsigned i = 0; i <= DROP_N; i++) {
		struct tpt_msg_spec s = { .pipe = 9, .index = i, .n_payloads = 1,
					  .lens = { DROP_LEN } };
		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m[i]) == 0, 1, "build");
	}
	for (unsigned i = 0; i < DROP_N; i++) {
		da[i] = (struct tpt_done_arg){ &dd, i };
		TPT_REQUIRE(tp_pipe_write(e.p, &m[i].m, tpt_done_cb, &da[i]) == 0, 1, "write %u",
			    i);
	}
	TPT_REQUIRE(tpt_done_wait(&dd, DROP_N, T_MS) == 0, 1, "%u completions", dd.count);
	/* Some completed before the far daemon dropped their messages: the pipe must fail (the
	 * writer's own read on it ends with that error instead of waiting), and a later write
	 * fails too. */
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT && strstr(tp_last_error(), "dropped message"), 1,
		    "the pipe after messages were dropped: %d %s", r, r ? tp_last_error() : "");
	r = tp_pipe_write_sync(e.p, &m[DROP_N].m);
	TPT_REQUIRE(r < 0, 1, "a write on the failed pipe: %d", r);
	TPT_REQUIRE(tpt_sync_post(&filled, 0) == 0, 1, "post");
	for (unsigned i = 0; i <= DROP_N; i++)
		tpt_msg_free(e.ctx, &m[i]);
	tpt_end_close(&e);
	return 0;
}

/*
 * The reader's daemon drops eager messages over its daemon-wide budget (--pipe-queue-bytes-max
 * 64K there) whose writes completed on the writer's host: the pipe fails with the reason on both
 * ends (a later write fails naming the dropped message; the reader reads what was queued, then
 * the error) instead of the messages vanishing while the pipe carries on.
 */
START_TEST(test_flow_cross_host_eager_message_dropped_far_fails_the_pipe)
{
	const char *rargs[] = { "--pipe-queue-bytes-max", "64K", NULL };
	pid_t rd, wr;

	pair_start(NULL, rargs);
	rd = tpt_fork(drop_reader, NULL);
	wr = tpt_fork(drop_writer, NULL);
	ck_assert_int_eq(tpt_sync_wait(&filled, LONG_MS), 0);
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert(tpt_wait_ok(wr, LONG_MS, "writer"));
	ck_assert(tpt_wait_ok(rd, LONG_MS, "reader"));
	ck_assert(tpt_daemon_log_has(&dm, "dropped message"));
	ck_assert_int_eq(tpt_daemon_stop(&dm2), 0);
	stop();
}
END_TEST

/* ---- held writes and the pipe's end ------------------------------------------------------- */

#define HELD_N 20
#define HELD_WIN 4

/* Accepts, never reads; with @arg, dies once told (the pipe fails with "peer died"). */
static int idle_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "idle-reader", .where = "idle",
			     .ready = &ready, .timeout_ms = T_MS };

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "no go");
	if (arg)
		_exit(0); /* no close: the daemon sees the process vanish */
	tpt_end_close(&e);
	return 0;
}

/* Writes HELD_N small messages through a window of HELD_WIN; HELD_WIN complete at once, the
 * rest are held. Then the reader dies (@arg) or the writer closes the pipe: every held write
 * completes with the pipe's error (-ECANCELED for the close), in order. */
static int held_writer(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "held-writer", .where = "idle",
			     .ready = &ready, .timeout_ms = T_MS };
	static char data[HELD_N][64];
	struct tp_payload pl[HELD_N];
	struct tp_message m[HELD_N];

	flow_done_init(&fd_);
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	for (unsigned i = 0; i < HELD_N; i++) {
		pl[i] = (struct tp_payload){ .data = data[i], .length = sizeof(data[i]) };
		m[i] = (struct tp_message){ .payloads = &pl[i], .n_payloads = 1 };
		TPT_REQUIRE(tp_pipe_write(e.p, &m[i], flow_done_cb, (void *)(uintptr_t)i) == 0, 1,
			    "write %u: %s", i, tp_last_error());
	}
	TPT_REQUIRE(flow_done_wait(&fd_, HELD_WIN, T_MS) == 0, 1, "window");
	TPT_REQUIRE(flow_done_count(&fd_) == HELD_WIN, 1, "%u completions, window %u",
		    flow_done_count(&fd_), HELD_WIN);
	if (arg)
		tpt_sync_post(&go, 0);
	else
		tp_pipe_close(e.p), e.p = NULL;
	TPT_REQUIRE(flow_done_wait(&fd_, HELD_N, T_MS) == 0, 1, "%u of %u completed",
		    flow_done_count(&fd_), HELD_N);
	TPT_REQUIRE(fd_.ok == HELD_WIN && fd_.n_err == HELD_N - HELD_WIN && !fd_.order_errors, 1,
		    "%u ok, %u failed, %u out of order", fd_.ok, fd_.n_err, fd_.order_errors);
	TPT_REQUIRE(fd_.first_err == fd_.last_err, 1, "errors %d .. %d", fd_.first_err,
		    fd_.last_err);
	if (arg)
		TPT_REQUIRE(fd_.first_err == -ECONNRESET, 1, "held writes failed with %d (%s), "
			    "want the pipe's error -ECONNRESET", fd_.first_err,
			    tp_strerror(fd_.first_err));
	else
		TPT_REQUIRE(fd_.first_err == -ECANCELED, 1, "held writes failed with %d, want "
			    "-ECANCELED", fd_.first_err);
	if (!arg)
		tpt_sync_post(&go, 0);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_flow_held_writes_fail_with_the_pipe_when_the_reader_dies)
{
	const char *args[] = { "--pipe-queue-max", "4", NULL };

	start(args);
	ck_assert(tpt_run_pair(idle_reader, held_writer, (void *)1, 2 * T_MS));
	stop();
}
END_TEST

START_TEST(test_flow_close_cancels_held_writes)
{
	const char *args[] = { "--pipe-queue-max", "4", NULL };

	start(args);
	ck_assert(tpt_run_pair(idle_reader, held_writer, NULL, 2 * T_MS));
	stop();
}
END_TEST

/* ---- cancelling a write the library holds ---------------------------------------------------- */

#define CH_N 7
#define CH_CANCELED 5 /* beyond the window of 4, behind another held write */
#define CH_BIG 4      /* not inline: pending until the reader has its bytes */

static size_t ch_len(unsigned i)
{
	return i == CH_BIG ? 1u << 20 : 64;
}

/* Reads every message of cancel_held_writer but the cancelled one, in order, intact. */
static int cancel_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "cancel-reader", .where = "cheld",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .n_payloads = 1, .lens = { 64 } };

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "no go");
	for (unsigned i = 0; i < CH_N; i++) {
		if (i == CH_CANCELED)
			continue;
		s.index = i;
		s.lens[0] = ch_len(i);
		TPT_REQUIRE(tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS) == 0, 1,
			    "message %u", i);
	}
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "writer did not finish");
	tpt_end_close(&e);
	return 0;
}

/* Writes CH_N - 1 messages through a window of 4 and cancels one the library holds behind
 * another held one: it completes with -ECANCELED in its place, never reaches the daemon, and
 * the writes around it go on (the last one, written afterwards, follows message 4). Before
 * that, a timed blocking write over the full window gives up at its timeout. */
static int cancel_held_writer(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "cancel-writer", .where = "cheld",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg m[CH_N], extra;
	struct tpt_msg_spec xs = { .index = 99, .n_payloads = 1, .lens = { 64 } };
	uint64_t ops[CH_N];
	int r;

	flow_done_init(&fd_);
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	for (unsigned i = 0; i < CH_N; i++) {
		struct tpt_msg_spec s = { .index = i, .n_payloads = 1, .lens = { ch_len(i) } };

		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m[i]) == 0, 1, "build");
	}
	for (unsigned i = 0; i < CH_N - 1; i++) {
		TPT_REQUIRE(tp_pipe_write_ex(e.p, &m[i].m, flow_done_cb, (void *)(uintptr_t)i,
					     &ops[i]) == 0, 1, "write %u: %s", i, tp_last_error());
		if (i != 3)
			continue;
		TPT_REQUIRE(flow_done_wait(&fd_, 4, T_MS) == 0, 1, "window");
		/* The window is full and nothing is pending: a timed write gives up at its timeout
		 * (the library held it; it never reaches the reader). */
		TPT_REQUIRE(tpt_msg_build(e.ctx, &xs, TPT_MEM_PRIVATE, &extra) == 0, 1, "build");
		r = tp_pipe_write_sync_timeout(e.p, &extra.m, 50);
		TPT_REQUIRE(r == -ETIMEDOUT, 1, "timed write over a full window: %d, want "
			    "-ETIMEDOUT", r);
	}
	TPT_REQUIRE(flow_done_count(&fd_) == 4, 1, "%u completions, window 4",
		    flow_done_count(&fd_));
	r = tp_cancel(e.ctx, ops[CH_CANCELED]);
	TPT_REQUIRE(r == 0, 1, "cancel of a held write: %d (%s)", r, tp_last_error());
	r = tp_cancel(e.ctx, ops[CH_CANCELED]);
	TPT_REQUIRE(r == -ENOENT, 1, "second cancel: %d, want -ENOENT", r);
	/* It completes in its place, after message 4, once the reader makes room: message 4 goes
	 * then and stays pending until read, so the pump reaches the cancelled one meanwhile. */
	tpt_sync_post(&go, 0);
	TPT_REQUIRE(flow_done_wait(&fd_, CH_N - 1, T_MS) == 0, 1, "%u of %u completed",
		    flow_done_count(&fd_), CH_N - 1);
	TPT_REQUIRE(fd_.ok == CH_N - 2 && fd_.n_err == 1 && fd_.first_err == -ECANCELED &&
		    !fd_.order_errors, 1, "%u ok, %u failed (%d), %u out of order", fd_.ok,
		    fd_.n_err, fd_.first_err, fd_.order_errors);
	/* The last message follows message 4 directly: the cancelled one never went. */
	TPT_REQUIRE(tp_pipe_write_ex(e.p, &m[CH_N - 1].m, flow_done_cb,
				     (void *)(uintptr_t)(CH_N - 1), &ops[CH_N - 1]) == 0, 1,
		    "last write: %s", tp_last_error());
	TPT_REQUIRE(flow_done_wait(&fd_, CH_N, T_MS) == 0, 1, "last write did not complete");
	tpt_sync_post(&done, 0);
	tpt_msg_free(e.ctx, &extra);
	for (unsigned i = 0; i < CH_N; i++)
		tpt_msg_free(e.ctx, &m[i]);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_flow_cancel_of_a_held_write_never_reaches_the_reader)
{
	const char *args[] = { "--pipe-queue-max", "4", NULL };

	start(args);
	ck_assert(tpt_run_pair(cancel_reader, cancel_held_writer, NULL, 2 * T_MS));
	stop();
}
END_TEST

/* ---- a message larger than the window ---------------------------------------------------- */

static const size_t big_lens[3] = { 500, 2000, 500 }; /* inline; the window is 1000 bytes */

/* Reads messages 0 and 2 of big_writer (the middle one is refused). */
static int big_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "big-reader", .where = "big",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .n_payloads = 1 };

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	for (unsigned i = 0; i < 3; i += 2) {
		s.index = i;
		s.lens[0] = big_lens[i];
		TPT_REQUIRE(tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS) == 0, 1,
			    "message %u", i);
	}
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "writer did not finish");
	tpt_end_close(&e);
	return 0;
}

/* A write alone over the window waits for the earlier one to be consumed, then goes alone and
 * meets the daemon's hard limit; the write behind it goes on. */
static int big_writer(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "big-writer", .where = "big",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg m[3];

	flow_done_init(&fd_);
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	for (unsigned i = 0; i < 3; i++) {
		struct tpt_msg_spec s = { .index = i, .n_payloads = 1, .lens = { big_lens[i] } };

		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m[i]) == 0, 1, "build");
		TPT_REQUIRE(tp_pipe_write(e.p, &m[i].m, flow_done_cb, (void *)(uintptr_t)i) == 0, 1,
			    "write %u: %s", i, tp_last_error());
	}
	TPT_REQUIRE(flow_done_wait(&fd_, 3, T_MS) == 0, 1, "%u of 3 completed",
		    flow_done_count(&fd_));
	TPT_REQUIRE(fd_.ok == 2 && fd_.n_err == 1 && fd_.first_err == -ENOBUFS, 1,
		    "%u ok, %u failed (%d), want the middle one refused", fd_.ok, fd_.n_err,
		    fd_.first_err);
	tpt_sync_post(&done, 0);
	for (unsigned i = 0; i < 3; i++)
		tpt_msg_free(e.ctx, &m[i]);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_flow_write_larger_than_the_window_goes_alone_and_is_refused)
{
	const char *args[] = { "--pipe-queue-bytes", "1000", NULL };

	start(args);
	ck_assert(tpt_run_pair(big_reader, big_writer, NULL, 2 * T_MS));
	stop();
}
END_TEST

/* ---- a raw client ignoring the window: the hard limits -------------------------------------- */

static void raw_connect_pipe(struct tpt_raw *raw, uint64_t pipe_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;

	c.req_id = pipe_id;
	c.pipe_id = pipe_id;
	c.address = "idle";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
}

/*
 * One eager Write of @len inline bytes on @pipe_id. With @ret_resend, says whether a refusal
 * asks for a resend; with @limit_option, a STATUS_LIMIT refusal must name that option.
 * Return: its WriteDone status.
 */
static Tpw__V1__Status raw_write_ex(struct tpt_raw *raw, uint64_t pipe_id, uint64_t write_id,
				    size_t len, bool *ret_resend, const char *limit_option)
{
	static uint8_t tail[4096];
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT, *pls[] = { &pl };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	Tpw__V1__Status st;

	seg.length = len;
	seg.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	pl.data = &seg;
	w.pipe_id = pipe_id;
	w.write_id = write_id;
	w.n_payloads = 1;
	w.payloads = pls;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	ck_assert_int_eq(tpt_raw_send(raw, &m, tail, len, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS, &rep), 0);
	ck_assert_uint_eq(rep->write_done->write_id, write_id);
	st = rep->write_done->status;
	if (ret_resend)
		*ret_resend = rep->write_done->resend;
	if (limit_option && st == TPW__V1__STATUS__STATUS_LIMIT)
		ck_assert_msg(rep->write_done->message &&
			      strstr(rep->write_done->message, limit_option),
			      "refusal: %s", rep->write_done->message);
	tpw_daemon_msg_free(rep);
	return st;
}

static Tpw__V1__Status raw_write(struct tpt_raw *raw, uint64_t pipe_id, uint64_t write_id,
				 size_t len)
{
	return raw_write_ex(raw, pipe_id, write_id, len, NULL, NULL);
}

/* The refused write's room comes back at once: FlowCredit{1 message, @bytes}. */
static void raw_expect_credit(struct tpt_raw *raw, uint64_t pipe_id, uint64_t bytes)
{
	Tpw__V1__DaemonMsg *rep = NULL;

	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT, T_MS, &rep),
			 0);
	ck_assert_uint_eq(rep->flow_credit->pipe_id, pipe_id);
	ck_assert_uint_eq(rep->flow_credit->messages, 1);
	ck_assert_uint_eq(rep->flow_credit->bytes, bytes);
	tpw_daemon_msg_free(rep);
}

/* --pipe-queue-max 4 and --pipe-queue-bytes 4000: on pipe 1, four messages are queued and a
 * fifth is refused; on pipe 2, 4000 inline bytes are queued and one more byte is refused. */
START_TEST(test_flow_client_ignoring_the_window_meets_the_hard_limits)
{
	const char *args[] = { "--pipe-queue-max", "4", "--pipe-queue-bytes", "4000", NULL };
	struct tpt_raw raw;
	pid_t rd;

	start(args);
	rd = tpt_fork(idle_reader, NULL);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, dm.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	raw_connect_pipe(&raw, 1);
	for (unsigned i = 1; i <= 4; i++)
		ck_assert_int_eq(raw_write(&raw, 1, i, 10), TPW__V1__STATUS__STATUS_OK);
	ck_assert_int_eq(raw_write(&raw, 1, 5, 10), TPW__V1__STATUS__STATUS_LIMIT);
	raw_expect_credit(&raw, 1, 10);
	raw_connect_pipe(&raw, 2);
	ck_assert_int_eq(raw_write(&raw, 2, 1, 4000), TPW__V1__STATUS__STATUS_OK);
	ck_assert_int_eq(raw_write(&raw, 2, 2, 1), TPW__V1__STATUS__STATUS_LIMIT);
	raw_expect_credit(&raw, 2, 1);
	ck_assert(tpt_daemon_alive(&dm));
	tpt_raw_close(&raw);
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert(tpt_wait_ok(rd, T_MS, "reader"));
	stop();
}
END_TEST

/* ---- the daemon-wide budget (--pipe-queue-bytes-max) ------------------------------------- */

#define BUD_BYTES (1u << 20)
#define BUD_PIPES 4
#define BUD_N 160	     /* 2.5 MiB per pipe: each alone is over the budget */
#define BUD_LEN (16u << 10) /* eager: inline with the descriptor */

static void bud_name(char *buf, size_t len, unsigned k)
{
	snprintf(buf, len, "budget%u", k);
}

static int budget_reader(void *arg)
{
	unsigned k = (unsigned)(uintptr_t)arg;
	char name[32];
	struct tpt_end e = { .d = &dm, .ctx_name = "budget-reader", .where = name,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .pipe = k, .n_payloads = 1, .lens = { BUD_LEN } };
	int r;

	bud_name(name, sizeof(name), k);
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&go, LONG_MS) == 0, 1, "no go");
	for (unsigned i = 0; i < BUD_N; i++) {
		s.index = i;
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "pipe %u: message %u of %u: %d", k, i, BUD_N, r);
	}
	tpt_end_close(&e);
	return 0;
}

static int budget_writer(void *arg)
{
	unsigned k = (unsigned)(uintptr_t)arg;
	char name[32];
	struct tpt_end e = { .d = &dm, .ctx_name = "budget-writer", .where = name,
			     .timeout_ms = T_MS };
	uint8_t *data = malloc((size_t)BUD_N * BUD_LEN);
	struct tp_payload pl[BUD_N];
	struct tp_message m[BUD_N];

	TPT_REQUIRE(data, 1, "out of memory");
	bud_name(name, sizeof(name), k);
	flow_done_init(&fd_);
	for (unsigned i = 0; i < BUD_N; i++) {
		pl[i] = (struct tp_payload){ .data = data + (size_t)i * BUD_LEN,
					     .length = BUD_LEN };
		tpt_fill(pl[i].data, BUD_LEN, tpt_seed(k, i, 0));
		m[i] = (struct tp_message){ .payloads = &pl[i], .n_payloads = 1 };
	}
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	for (unsigned i = 0; i < BUD_N; i++) {
		int r = tp_pipe_write(e.p, &m[i], flow_done_cb, (void *)(uintptr_t)i);
		TPT_REQUIRE(r == 0, 1, "pipe %u: write %u returned %d: %s", k, i, r,
			    tp_last_error());
	}
	TPT_REQUIRE(flow_done_wait(&fd_, BUD_N, LONG_MS) == 0, 1, "pipe %u: %u of %u writes "
		    "completed", k, flow_done_count(&fd_), BUD_N);
	TPT_REQUIRE(fd_.ok == BUD_N && fd_.order_errors == 0, 1,
		    "pipe %u: %u of %u writes succeeded (first error %d), %u out of order", k,
		    fd_.ok, BUD_N, fd_.first_err, fd_.order_errors);
	tpt_end_close(&e);
	free(data);
	return 0;
}

/*
 * --pipe-queue-bytes-max 1M, four pipes each writing 2.5 MiB of eager messages (each within its
 * own 64 MiB window) to readers that start once the budget is spent: every write succeeds, in
 * order, every byte arrives, and the daemon never holds (or sets aside) more than the budget.
 */
START_TEST(test_flow_pipes_over_the_daemon_budget_wait_for_it)
{
	const char *args[] = { "--pipe-queue-bytes-max", "1M", NULL };
	const char *keys[] = { "budget_waits", "pipe_held_bytes", "pipe_held_bytes_peak" };
	pid_t rd[BUD_PIPES], wr[BUD_PIPES];
	uint64_t v[3] = { 0 }, held_max = 0;
	int st;

	start(args);
	for (unsigned k = 0; k < BUD_PIPES; k++)
		rd[k] = tpt_fork(budget_reader, (void *)(uintptr_t)k);
	for (unsigned k = 0; k < BUD_PIPES; k++)
		ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	for (unsigned k = 0; k < BUD_PIPES; k++)
		wr[k] = tpt_fork(budget_writer, (void *)(uintptr_t)k);
	/* The readers start once the budget is spent and writes wait for it. */
	for (unsigned round = 0; v[0] == 0 && round < 400; round++) {
		tpt_status_u64s(&dm, keys, 3, v);
		held_max = v[1] > held_max ? v[1] : held_max;
		if (v[0] == 0)
			tpt_backoff(round);
	}
	ck_assert_msg(v[0] > 0, "no write waited for the budget");
	for (unsigned k = 0; k < BUD_PIPES; k++)
		ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	for (unsigned k = 0; k < BUD_PIPES; k++) {
		while (waitpid(wr[k], &st, WNOHANG) == 0) {
			tpt_status_u64s(&dm, keys, 3, v);
			held_max = v[1] > held_max ? v[1] : held_max;
		}
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %u failed", k);
	}
	for (unsigned k = 0; k < BUD_PIPES; k++)
		ck_assert(tpt_wait_ok(rd[k], LONG_MS, "reader"));
	tpt_status_u64s(&dm, keys, 3, v);
	tpt_log("budget %u: %llu waits, %llu bytes held at most (sampled), peak %llu", BUD_BYTES,
		(unsigned long long)v[0], (unsigned long long)held_max,
		(unsigned long long)v[2]);
	ck_assert_msg(held_max <= BUD_BYTES && v[2] <= BUD_BYTES && v[2] > BUD_BYTES / 2,
		      "held %llu, peak %llu, budget %u", (unsigned long long)held_max,
		      (unsigned long long)v[2], BUD_BYTES);
	stop();
}
END_TEST

#define TB_N 20
#define TB_CANCEL 12
#define TB_LEN (8u << 10) /* eager; 7 fit a budget of 64K */

static int tb_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "tb-reader", .where = "turned",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s = { .pipe = 5, .n_payloads = 1, .lens = { TB_LEN } };
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&done, LONG_MS) == 0, 1, "no go");
	for (unsigned i = 0; i < TB_N; i++) {
		if (i == TB_CANCEL)
			continue; /* cancelled while turned back: never reaches the reader */
		s.index = i;
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_end_close(&e);
	return 0;
}

static int tb_writer(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "tb-writer", .where = "turned",
			     .ready = &ready, .timeout_ms = T_MS };
	static struct tpt_msg m[TB_N];
	static struct tpt_done_arg da[TB_N];
	static struct tpt_done dd;
	uint64_t ids[TB_N];
	int r;

	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	tpt_done_init(&dd);
	for (unsigned i = 0; i < TB_N; i++) {
		struct tpt_msg_spec s = { .pipe = 5, .index = i, .n_payloads = 1,
					  .lens = { TB_LEN } };
		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m[i]) == 0, 1, "build");
		da[i] = (struct tpt_done_arg){ &dd, i };
		r = tp_pipe_write_ex(e.p, &m[i].m, tpt_done_cb, &da[i], &ids[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d", i, r);
	}
	TPT_REQUIRE(tpt_sync_post(&filled, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&go, LONG_MS) == 0, 1, "no go");
	r = tp_cancel(e.ctx, ids[TB_CANCEL]);
	TPT_REQUIRE(r == 0, 1, "tp_cancel: %d %s", r, tp_last_error());
	/* only now may the reader make room: else the write may be taken before the cancel */
	TPT_REQUIRE(tpt_sync_post(&filled, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_done_wait(&dd, TB_N, LONG_MS) == 0, 1, "%u completions", dd.count);
	for (unsigned i = 0; i < TB_N; i++)
		TPT_REQUIRE(dd.status[i] == (i == TB_CANCEL ? -ECANCELED : 0), 1,
			    "write %u: %d", i, dd.status[i]);
	TPT_REQUIRE(dd.order_errors == 0, 1, "completions out of order");
	for (unsigned i = 0; i < TB_N; i++)
		tpt_msg_free(e.ctx, &m[i]);
	tpt_end_close(&e);
	return 0;
}

/*
 * --pipe-queue-bytes-max 64K: of 20 eager writes of 8 KiB, 7 are queued and the rest turned
 * back by the budget; tp_cancel() of one of those (held in the library, or on its way back)
 * completes it with -ECANCELED in order, and the reader gets every other message, in order.
 */
START_TEST(test_flow_cancel_of_a_write_turned_back_by_the_budget)
{
	const char *args[] = { "--pipe-queue-bytes-max", "64K", NULL };
	const char *keys[] = { "budget_waits" };
	uint64_t waits = 0;
	pid_t rd, wr;

	start(args);
	rd = tpt_fork(tb_reader, NULL);
	wr = tpt_fork(tb_writer, NULL);
	ck_assert_int_eq(tpt_sync_wait(&filled, LONG_MS), 0);
	for (unsigned round = 0; waits == 0 && round < 400; round++) {
		tpt_status_u64s(&dm, keys, 1, &waits);
		if (waits == 0)
			tpt_backoff(round);
	}
	ck_assert_uint_gt(waits, 0);
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert_int_eq(tpt_sync_wait(&filled, LONG_MS), 0); /* the writer has cancelled */
	ck_assert_int_eq(tpt_sync_post(&done, 0), 0);
	ck_assert(tpt_wait_ok(wr, LONG_MS, "writer"));
	ck_assert(tpt_wait_ok(rd, LONG_MS, "reader"));
	stop();
}
END_TEST

static void raw_hello_minor(struct tpt_raw *raw, uint32_t minor)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;

	h.major = TPW_PROTO_MAJOR;
	h.minor = minor;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "tpt-raw-budget";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->hello_reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
}

/* raw_write() on pipe 1, saying whether the refusal asks for a resend; a refusal names the
 * option that sets the limit. */
static Tpw__V1__Status raw_write_budget(struct tpt_raw *raw, uint64_t write_id, size_t len,
					bool *ret_resend)
{
	return raw_write_ex(raw, 1, write_id, len, ret_resend, "--pipe-queue-bytes-max");
}

static uint64_t held_bytes(void)
{
	const char *keys[] = { "pipe_held_bytes" };
	uint64_t v = 0;

	tpt_status_u64s(&dm, keys, 1, &v);
	return v;
}

/*
 * --pipe-queue-bytes-max 64K as a hard limit: a raw client of minor 4 fills it exactly (the last
 * write brings the bytes held to the budget: queued) and the next write, one message above, is
 * refused with STATUS_LIMIT (-ENOBUFS) and no resend; a raw client of minor 5 that ignores the
 * resend protocol gets the same refusal (marked resend) and the daemon holds no more.
 */
START_TEST(test_flow_clients_ignoring_the_budget_meet_it_as_a_hard_limit)
{
	const char *args[] = { "--pipe-queue-bytes-max", "64K", NULL };
	const uint64_t budget = 64u << 10;
	struct tpt_raw raw, raw5;
	uint64_t ovh, rest, id = 1;
	bool resend = true;
	pid_t rd;

	start(args);
	rd = tpt_fork(idle_reader, NULL);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, dm.socket), 0);
	raw_hello_minor(&raw, 4);
	raw_connect_pipe(&raw, 1);
	ck_assert_int_eq(raw_write_budget(&raw, id++, 10, &resend), TPW__V1__STATUS__STATUS_OK);
	ovh = held_bytes() - 10; /* what a message costs beyond its inline bytes */
	ck_assert(ovh > 0 && ovh < 4096);
	for (rest = budget - (ovh + 10); rest - ovh > 4000; rest -= ovh + 4000)
		ck_assert_int_eq(raw_write_budget(&raw, id++, 4000, &resend),
				 TPW__V1__STATUS__STATUS_OK);
	ck_assert_int_eq(raw_write_budget(&raw, id++, rest - ovh, &resend),
			 TPW__V1__STATUS__STATUS_OK);
	ck_assert_uint_eq(held_bytes(), budget);
	ck_assert_int_eq(raw_write_budget(&raw, id++, 0, &resend), TPW__V1__STATUS__STATUS_LIMIT);
	ck_assert(!resend);
	ck_assert_uint_eq(held_bytes(), budget);

	ck_assert_int_eq(tpt_raw_connect(&raw5, dm.socket), 0);
	raw_hello_minor(&raw5, TPW_PROTO_MINOR);
	raw_connect_pipe(&raw5, 1);
	for (unsigned i = 1; i <= 3; i++) {
		ck_assert_int_eq(raw_write_budget(&raw5, i, 10, &resend),
				 TPW__V1__STATUS__STATUS_LIMIT);
		ck_assert(resend);
		raw_expect_credit(&raw5, 1, 10);
	}
	ck_assert_uint_eq(held_bytes(), budget);
	ck_assert(tpt_daemon_alive(&dm));
	tpt_raw_close(&raw5);
	tpt_raw_close(&raw);
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert(tpt_wait_ok(rd, T_MS, "reader"));
	stop();
}
END_TEST

/* ---- a daemon the library must not trust blindly, and an old daemon ------------------------- */

/* A stand-in daemon on a Unix socket: answers Hello (protocol minor @minor, a window of
 * FAKE_WIN messages), Connect, and counts the Writes that come before the client's Listen. */
#define FAKE_WIN 2
#define FAKE_WRITES 10

struct fake {
	char path[108];
	int lfd, fd;
	uint32_t minor;
};

static int fake_recv(struct fake *f, Tpw__V1__ClientMsg **ret)
{
	uint8_t hb[TPW_HDR_SIZE], *body;
	struct tpw_hdr h;
	size_t got = 0, len;

	while (got < sizeof(hb)) {
		ssize_t k = read(f->fd, hb + got, sizeof(hb) - got);
		if (k <= 0)
			return -EIO;
		got += (size_t)k;
	}
	if (tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, &h) < 0)
		return -EBADMSG;
	len = (size_t)h.msg_len + h.data_len;
	body = malloc(len);
	for (got = 0; body && got < len;) {
		ssize_t k = read(f->fd, body + got, len - got);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	if (!body || got < len || tpw_client_msg_unpack(body, h.msg_len, ret) < 0) {
		free(body);
		return -EBADMSG;
	}
	free(body);
	return 0;
}

static void fake_send(struct fake *f, Tpw__V1__DaemonMsg *m)
{
	static uint64_t seq;
	uint8_t buf[4096];
	size_t n = tpw_frame_pack(&m->base, 0, 0, ++seq, buf);

	ck_assert_int_eq(write(f->fd, buf, n), (ssize_t)n);
}

/* Serves one client; the count of Writes before its Listen. */
static void *fake_serve(void *arg)
{
	struct fake *f = arg;
	Tpw__V1__DaemonMsg out = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__HelloReply hr = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__Limits lim = TPW__V1__LIMITS__INIT;
	Tpw__V1__Reply rep = TPW__V1__REPLY__INIT;
	Tpw__V1__FlowCredit credit = TPW__V1__FLOW_CREDIT__INIT;
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__ClientMsg *m;
	uintptr_t writes = 0;

	f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	while (f->fd >= 0 && fake_recv(f, &m) == 0) {
		Tpw__V1__ClientMsg__BodyCase c = m->body_case;

		if (c == TPW__V1__CLIENT_MSG__BODY_HELLO) {
			hr.major = TPW_PROTO_MAJOR;
			hr.minor = f->minor;
			hr.status = TPW__V1__STATUS__STATUS_OK;
			hr.session_id = 1;
			lim.pipe_queue_max = FAKE_WIN;
			lim.pipe_queue_bytes = 1u << 20;
			hr.limits = &lim;
			out.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
			out.hello_reply = &hr;
			fake_send(f, &out);
		} else if (c == TPW__V1__CLIENT_MSG__BODY_CONNECT) {
			rep.req_id = m->connect->req_id;
			rep.status = TPW__V1__STATUS__STATUS_OK;
			rep.id = m->connect->pipe_id;
			rep.remote_name = "fake";
			out.body_case = TPW__V1__DAEMON_MSG__BODY_REPLY;
			out.reply = &rep;
			fake_send(f, &out);
		} else if (c == TPW__V1__CLIENT_MSG__BODY_WRITE) {
			if (++writes != FAKE_WIN)
				goto next;
			/* Credit far beyond what was sent: the library must not take it. */
			if (f->minor >= TPW_MINOR_FLOW) {
				credit.pipe_id = m->write->pipe_id;
				credit.messages = 1000;
				credit.bytes = 1000;
				out.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT;
				out.flow_credit = &credit;
				fake_send(f, &out);
			}
			/* Then the first write's completion: once its callback ran, the library
			 * thread has handled the credit (and sent what it let go). */
			wd.pipe_id = m->write->pipe_id;
			wd.write_id = 1;
			wd.status = TPW__V1__STATUS__STATUS_OK;
			out.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
			out.write_done = &wd;
			fake_send(f, &out);
		} else if (c == TPW__V1__CLIENT_MSG__BODY_LISTEN) {
			rep.req_id = m->listen->req_id;
			rep.status = TPW__V1__STATUS__STATUS_OK;
			rep.id = 1;
			out.body_case = TPW__V1__DAEMON_MSG__BODY_REPLY;
			out.reply = &rep;
			fake_send(f, &out);
			tpw_client_msg_free(m);
			break;
		}
next:
		tpw_client_msg_free(m);
	}
	return (void *)writes;
}

/* Return: the Writes a client sent of FAKE_WRITES to a stand-in daemon of protocol @minor
 * announcing a window of FAKE_WIN messages, before the Listen it sends after them. */
static uintptr_t fake_run(uint32_t minor)
{
	struct fake f = { .minor = minor, .fd = -1 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tp_context_options o = { .size = sizeof(o), .flags = TP_CONTEXT_NO_RING };
	static char data[FAKE_WRITES][16];
	struct tp_payload pl[FAKE_WRITES];
	struct tp_message msg[FAKE_WRITES];
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	pthread_t th;
	void *writes;

	flow_done_init(&fd_);
	snprintf(f.path, sizeof(f.path), "/tmp/tpt-fake-%d.sock", (int)getpid());
	unlink(f.path);
	memcpy(sa.sun_path, f.path, strlen(f.path) + 1);
	f.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f.lfd, 0);
	ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f.lfd, 1), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, fake_serve, &f), 0);
	o.socket_path = f.path;
	ck_assert_int_eq(tp_context_new(&o, &ctx), 0);
	ck_assert_int_eq(tp_connect(ctx, "fake", &p), 0);
	ck_assert_int_eq(tp_pipe_wait_connected(p, T_MS), 0);
	for (unsigned i = 0; i < FAKE_WRITES; i++) {
		pl[i] = (struct tp_payload){ .data = data[i], .length = sizeof(data[i]) };
		msg[i] = (struct tp_message){ .payloads = &pl[i], .n_payloads = 1 };
		ck_assert_int_eq(tp_pipe_write(p, &msg[i], flow_done_cb, (void *)(uintptr_t)i), 0);
	}
	ck_assert_int_eq(flow_done_wait(&fd_, 1, T_MS), 0);
	ck_assert_int_eq(tp_listen(ctx, "after", NULL, &l), 0);
	pthread_join(th, &writes);
	close(f.fd);
	close(f.lfd);
	unlink(f.path);
	tp_listener_close(l);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return (uintptr_t)writes;
}

/* An old daemon (minor 4) has no window: every write goes at once, as before. */
START_TEST(test_flow_old_daemon_gets_every_write_at_once)
{
	ck_assert_uint_eq(fake_run(4), FAKE_WRITES);
}
END_TEST

/* A daemon returning credit for 1000 messages after 2: the library counts back only the 2 it
 * sent, so it sends 2 more, not the remaining 8. */
START_TEST(test_flow_library_bounds_the_daemons_credit)
{
	ck_assert_uint_eq(fake_run(TPW_MINOR_FLOW), 2 * FAKE_WIN);
}
END_TEST

static Suite *flow_suite(void)
{
	Suite *s = suite_create("flow");
	TCase *tc = tcase_create("flow");

	tcase_set_timeout(tc, 300 * tpt_time_scale());
	tcase_add_test(tc, test_flow_old_daemon_gets_every_write_at_once);
	tcase_add_test(tc, test_flow_library_bounds_the_daemons_credit);
	tcase_add_test(tc, test_flow_client_ignoring_the_window_meets_the_hard_limits);
	tcase_add_test(tc, test_flow_clients_ignoring_the_budget_meet_it_as_a_hard_limit);
	tcase_add_test(tc, test_flow_pipes_over_the_daemon_budget_wait_for_it);
	tcase_add_test(tc, test_flow_cancel_of_a_write_turned_back_by_the_budget);
	tcase_add_test(tc, test_flow_write_larger_than_the_window_goes_alone_and_is_refused);
	tcase_add_test(tc, test_flow_held_writes_fail_with_the_pipe_when_the_reader_dies);
	tcase_add_test(tc, test_flow_close_cancels_held_writes);
	tcase_add_test(tc, test_flow_cancel_of_a_held_write_never_reaches_the_reader);
	tcase_add_test(tc, test_flow_small_messages_on_a_connecting_pipe_wait_for_room);
	tcase_add_test(tc, test_flow_cross_host_blocking_writes_wait_for_room);
	tcase_add_test(tc, test_flow_cross_host_window_is_the_smaller_daemons);
	tcase_add_test(tc, test_flow_cross_host_eager_message_dropped_far_fails_the_pipe);
	tcase_add_test(tc, test_flow_gib_to_a_late_reader_is_all_written_and_bounded);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(flow_suite());
}
