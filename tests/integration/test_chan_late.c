/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: a channel call whose caller gives up before the daemon answers loses
 * nothing (docs/channels.md, "A caller that gives up"). The client gives up deterministically:
 * its context has a short reply timeout and the daemon is stopped (SIGSTOP) for the whole wait,
 * then continued. A read's late item is returned by the handle's next read, or written back to
 * the channel when the handle is released first; a write that the caller gave up on reports
 * -EINPROGRESS, not a failure, and its batch is in the channel once the daemon runs. A read
 * that waits while the given-up read is still waiting in the daemon returns the item that read
 * gets (the oldest waiting reader's) as soon as it comes, and itself brings the next item
 * for the read after. Each read case runs for byte reads (tp_chan_read(), and packed batch
 * reads, tp_chan_read_many_into(), whose late batch the next reads return as their buffers
 * fit) and message reads (tp_chan_read_descriptor(), whose item the daemon holds for the
 * handle). A message take
 * (tp_chan_read_msg()) given up keeps the item it is answered with for the next read, or for
 * the release to write back.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000
#define LATE_REPLY_MS TPT_SCALED_MS(500) /* the giving-up context's reply timeout */
#define ITEM "late item"
#define META "late meta"

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

/* A context on the fixture daemon with reply timeout @reply_ms (0: the default). Retries a
 * Hello that a busy machine answers later than a short timeout allows. */
static struct tp_context *ctx_new(uint32_t reply_ms)
{
	struct tp_context_options o = {
		.size = sizeof(o),
		.socket_path = tpt_fixture_daemon.socket,
		.name = "chan_late",
		.reply_timeout_ms = reply_ms,
	};
	struct tp_context *ctx = NULL;
	int r;

	for (int i = 0; i < 20; i++) {
		r = tp_context_new(&o, &ctx);
		if (r != -ETIMEDOUT)
			break;
	}
	ck_assert_msg(r == 0, "context: %d %s", r, tp_last_error());
	return ctx;
}

static struct tp_chan *chan_open(struct tp_context *ctx, unsigned flags)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };
	struct tp_chan *ch = NULL;
	int r;

	for (int i = 0; i < 20; i++) {
		r = tp_chan_open(ctx, "late", &o, &ch);
		if (r != -ETIMEDOUT)
			break;
	}
	ck_assert_msg(r == 0, "open: %d %s", r, tp_last_error());
	return ch;
}

/* Writes ITEM to channel "late" (kept open by the caller) from a new context; @msg: as a
 * message (META, one payload ITEM). Return: 0 or -errno. */
static int write_one(bool msg)
{
	struct iovec iov = { .iov_base = (void *)ITEM, .iov_len = sizeof(ITEM) };
	struct tp_payload p = { .data = ITEM, .length = sizeof(ITEM) };
	struct tp_message m = { .metadata = META, .metadata_len = sizeof(META), .payloads = &p,
				.n_payloads = 1 };
	struct tp_context *ctx = NULL;
	struct tp_chan *ch = NULL;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "writer", &ctx);

	if (r == 0)
		r = tp_chan_open(ctx, "late", NULL, &ch);
	if (r == 0)
		r = msg ? tp_chan_write_msgs(ch, &m, 1, 0) : tp_chan_write(ch, &iov, 1, 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return r;
}

/* Another process writes ITEM (@msg: as a message) and exits. */
static void write_from_child_as(bool msg)
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(write_one(msg) == 0 ? 0 : 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer failed");
}

/* `tpipctl channels --json`: readers_waiting of channel "late" (-1 if unknown). */
static long readers_waiting(void)
{
	return tpt_ctl_channel_field(&tpt_fixture_daemon, "late", "readers_waiting");
}

/* The daemon's state letter in /proc/PID/stat. */
static char daemon_state(void)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)tpt_fixture_daemon.pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	return p[2];
}

/* Stops the daemon and returns once the kernel shows it stopped. */
static void daemon_stop(void)
{
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGSTOP), 0);
	while (daemon_state() != 'T')
		sched_yield();
}

static void daemon_cont(void)
{
	ck_assert_int_eq(kill(tpt_fixture_daemon.pid, SIGCONT), 0);
}

static void check_item(int r, void *item, size_t len)
{
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(len, sizeof(ITEM));
	ck_assert_mem_eq(item, ITEM, sizeof(ITEM));
	free(item);
}

/* Checks that @r (a tp_chan_read_descriptor()'s) gave @d, the message of write_one(true), and
 * reads it. */
static void check_msg(struct tp_chan *ch, int r, struct tp_descriptor *d)
{
	char buf[sizeof(ITEM)] = { 0 };
	struct tp_slot slot = { .data = buf };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };

	ck_assert_msg(r == 0, "read_descriptor: %d %s", r, tp_last_error());
	ck_assert_uint_eq(d->metadata_len, sizeof(META));
	ck_assert_mem_eq(d->metadata, META, sizeof(META));
	ck_assert_uint_eq(d->n_payloads, 1);
	ck_assert_uint_eq(d->payloads[0].length, sizeof(ITEM));
	r = tp_chan_read_msg(ch, d, &a);
	ck_assert_msg(r == 0, "read_msg: %d %s", r, tp_last_error());
	ck_assert_mem_eq(buf, ITEM, sizeof(ITEM));
}

/* What a read of the loop's kind (@kind 1: tp_chan_read_descriptor(), 2: tp_chan_read_into()
 * a buffer of its own, 3: tp_chan_read_many_into() one, else tp_chan_read()) got. */
struct got {
	void *item;
	size_t len;
	struct tp_descriptor *d;
};

static int read_as(struct tp_chan *ch, int kind, int timeout_ms, struct got *g)
{
	void *buf;
	int r;

	if (kind == 1)
		return tp_chan_read_descriptor(ch, &g->d, timeout_ms);
	if (kind != 2 && kind != 3)
		return tp_chan_read(ch, &g->item, &g->len, timeout_ms);
	buf = calloc(1, 64);
	ck_assert_ptr_nonnull(buf);
	if (kind == 3) {
		struct tp_chan_item it[4];
		size_t n = 0;

		r = tp_chan_read_many_into(ch, buf, 64, it, 4, &n, timeout_ms);
		if (r >= 0) {
			ck_assert_uint_eq(n, 1);
			ck_assert_ptr_eq(it[0].data, buf);
			g->len = it[0].len;
		}
	} else {
		r = tp_chan_read_into(ch, buf, 64, &g->len, timeout_ms);
	}
	if (r < 0 && r != TP_CHAN_CLOSED) {
		/* an inline item answered after the call gave up goes to a copy of the library's,
		 * never into this buffer */
		free(buf);
		return r;
	}
	g->item = buf;
	return r;
}

/* Checks that @r, @g are ITEM (as a message: write_one(true)'s), read whole. */
static void check_got(struct tp_chan *ch, int kind, int r, struct got *g)
{
	if (kind == 1)
		check_msg(ch, r, g->d);
	else
		check_item(r, g->item, g->len);
}

/* A try-once read given up while the daemon is stopped (_i 0: a byte read, 1: a message
 * read): the item the daemon hands out once it runs again (for a message read: holds for the
 * handle and describes) is the next read's, and is not handed out twice. */
START_TEST(test_late_read_next_read)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	int kind = _i == 2 ? 3 : _i;
	bool msg = kind == 1;
	struct got g = { 0 };
	int r;

	write_from_child_as(msg);
	daemon_stop();
	r = read_as(ch, kind, 0, &g);
	daemon_cont();
	ck_assert_msg(r == -ETIMEDOUT, "read while stopped: %d %s", r, tp_last_error());
	r = read_as(ch, kind, TPT_SCALED_MS(5000), &g);
	check_got(ch, kind, r, &g);
	ck_assert_int_eq(read_as(ch, kind, 0, &g), -EAGAIN);
	ck_assert_int_eq(read_as(keep, kind, 0, &g), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

/* The same given-up read, then the handle is released without reading: the item goes back to
 * the channel, once (a byte read's written back by the library; a message read's, held by the
 * daemon, given back by the daemon), and another handle reads it. */
START_TEST(test_late_read_release_gives_back)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	int kind = _i == 2 ? 3 : _i;
	bool msg = kind == 1;
	struct got g = { 0 };
	int r;

	write_from_child_as(msg);
	daemon_stop();
	r = read_as(ch, kind, 0, &g);
	daemon_cont();
	ck_assert_msg(r == -ETIMEDOUT, "read while stopped: %d %s", r, tp_last_error());
	r = tp_chan_release(ch);
	ck_assert_msg(r == 0, "release: %d %s", r, tp_last_error());
	r = read_as(keep, kind, TPT_SCALED_MS(5000), &g);
	check_got(keep, kind, r, &g);
	ck_assert_int_eq(read_as(keep, kind, 0, &g), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

/* A timed read given up while the daemon is stopped still waits in the daemon once it runs;
 * the next read waits behind it. An item written then goes to the given-up read (the oldest
 * reader), and the next read returns it at once rather than waiting for its own (a message
 * read used to wait for an item of its own while the handle held this one). That read, still
 * waiting in the daemon, gets the next item written, which the read after returns; nothing
 * is handed out twice. */
START_TEST(test_late_read_while_next_waits)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	int msg = _i; /* 2, 3: reads into a buffer of the caller's (3: packed) */
	struct got g = { 0 };
	uint64_t t0;
	pid_t pid;
	int r, st;

	daemon_stop();
	r = read_as(ch, msg, TPT_SCALED_MS(5000), &g);
	daemon_cont();
	ck_assert_msg(r == -ETIMEDOUT, "read while stopped: %d %s", r, tp_last_error());
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) { /* writes once both reads of @ch wait in the daemon */
		uint64_t end = tpt_now_ms() + T_MS;

		while (readers_waiting() != 2)
			if (tpt_now_ms() > end)
				_exit(2);
		_exit(write_one(msg == 1) == 0 ? 0 : 1);
	}
	t0 = tpt_now_ms();
	r = read_as(ch, msg, T_MS, &g);
	ck_assert_msg(tpt_now_ms() - t0 < T_MS, "the read waited for its own answer");
	check_got(ch, msg, r, &g);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer child: %d", st);
	write_from_child_as(msg == 1);
	r = read_as(ch, msg, TPT_SCALED_MS(5000), &g);
	check_got(ch, msg, r, &g);
	ck_assert_int_eq(read_as(ch, msg, 0, &g), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(read_as(keep, msg, 0, &g), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

/* A packed batch read (tp_chan_read_many_into()) given up while the daemon is stopped gets
 * three items once it runs: the next packed reads return them, two into a buffer that fits two
 * packed, then the third, each once, and none is left in the channel. */
START_TEST(test_late_packed_batch_next_reads)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	struct tp_chan_item it[4];
	uint8_t buf[256];
	struct got g = { 0 };
	size_t n = 0;
	int r;

	for (int k = 0; k < 3; k++)
		write_from_child_as(false);
	daemon_stop();
	r = tp_chan_read_many_into(ch, buf, sizeof(buf), it, 4, &n, 0);
	daemon_cont();
	ck_assert_msg(r == -ETIMEDOUT, "read while stopped: %d %s", r, tp_last_error());
	memset(buf, 0, sizeof(buf));
	r = tp_chan_read_many_into(ch, buf, 64 + sizeof(ITEM), it, 4, &n, TPT_SCALED_MS(5000));
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(n, 2);
	ck_assert_ptr_eq(it[0].data, buf);
	ck_assert_ptr_eq(it[1].data, buf + 64);
	ck_assert_uint_eq(it[1].len, sizeof(ITEM));
	ck_assert_mem_eq(buf, ITEM, sizeof(ITEM));
	ck_assert_mem_eq(buf + 64, ITEM, sizeof(ITEM));
	r = tp_chan_read_many_into(ch, buf, sizeof(ITEM) - 1, it, 4, &n, 0); /* kept, too small */
	ck_assert_int_eq(r, -EMSGSIZE);
	ck_assert_uint_eq(it[0].len, sizeof(ITEM));
	r = tp_chan_read_many_into(ch, buf + 1, sizeof(ITEM), it, 4, &n, 0);
	ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
	ck_assert_uint_eq(n, 1);
	ck_assert_mem_eq(buf + 1, ITEM, sizeof(ITEM));
	ck_assert_int_eq(read_as(ch, 3, 0, &g), -EAGAIN);
	ck_assert_int_eq(read_as(keep, 0, 0, &g), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

/* A write given up while the daemon is stopped reports -EINPROGRESS (it may happen yet), and
 * happens once the daemon runs: the batch is read from another handle. */
START_TEST(test_late_write_in_progress)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	struct iovec iov = { .iov_base = (void *)ITEM, .iov_len = sizeof(ITEM) };
	void *item = NULL;
	size_t len = 0;
	int r;

	daemon_stop();
	r = tp_chan_write(ch, &iov, 1, 0);
	daemon_cont();
	ck_assert_msg(r == -EINPROGRESS, "write while stopped: %d %s", r, tp_last_error());
	r = tp_chan_read(keep, &item, &len, TPT_SCALED_MS(5000));
	check_item(r, item, len);
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

/* A take (tp_chan_read_msg()) given up while the daemon is stopped: the daemon takes the item
 * out of the channel once it runs and answers with its bytes; they are kept on the handle,
 * and (_i 0) the next tp_chan_read_descriptor() describes the item again and reads it, or
 * (_i 1) the handle's release writes it back to the channel, where another handle reads it,
 * or (_i 2) the same after that descriptor, not read. Before, the item was lost. */
START_TEST(test_late_take_kept)
{
	struct tp_context *keeper = ctx_new(0), *ctx = ctx_new(LATE_REPLY_MS);
	struct tp_chan *keep = chan_open(keeper, TP_CHAN_CREATE), *ch = chan_open(ctx, 0);
	char buf[sizeof(ITEM)] = { 0 };
	struct tp_slot slot = { .data = buf };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	struct tp_descriptor *d = NULL;
	struct tp_chan *rd = _i ? keep : ch;
	int r;

	write_from_child_as(true);
	r = tp_chan_read_descriptor(ch, &d, TPT_SCALED_MS(5000));
	ck_assert_msg(r == 0, "read_descriptor: %d %s", r, tp_last_error());
	daemon_stop();
	r = tp_chan_read_msg(ch, d, &a);
	daemon_cont();
	ck_assert_msg(r == -ETIMEDOUT, "take while stopped: %d %s", r, tp_last_error());
	if (_i == 2) { /* described, not read: the release writes the item back */
		r = tp_chan_read_descriptor(ch, &d, TPT_SCALED_MS(5000));
		ck_assert_msg(r == 0 && d->metadata_len == sizeof(META), "kept: %d %s", r,
			      tp_last_error());
	}
	if (_i) {
		r = tp_chan_release(ch);
		ck_assert_msg(r == 0, "release: %d %s", r, tp_last_error());
	}
	if (_i == 2) /* outlives the handle; freeing it now drops nothing */
		ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	r = tp_chan_read_descriptor(rd, &d, TPT_SCALED_MS(5000));
	check_msg(rd, r, d);
	ck_assert_int_eq(tp_chan_read_descriptor(rd, &d, 0), -EAGAIN);
	if (!_i)
		ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(keep, &d, 0), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(keep), 0);
	tp_context_free(ctx);
	tp_context_free(keeper);
}
END_TEST

static Suite *chan_late_suite(void)
{
	Suite *s = suite_create("chan_late");
	TCase *tc = tcase_create("chan_late");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_late_read_next_read, 0, 3);
	tcase_add_loop_test(tc, test_late_read_release_gives_back, 0, 3);
	tcase_add_loop_test(tc, test_late_read_while_next_waits, 0, 4);
	tcase_add_test(tc, test_late_packed_batch_next_reads);
	tcase_add_test(tc, test_late_write_in_progress);
	tcase_add_loop_test(tc, test_late_take_kept, 0, 3);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chan_late_suite());
}
