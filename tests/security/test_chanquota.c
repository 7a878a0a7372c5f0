/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: the per-uid limits of channels and work queues (docs/channels.md,
 * docs/queues.md) count every object a uid's handles keep alive, not only the named ones. An
 * unprivileged local user (uid 65534) fills a persistent channel, unlinks it keeping its handle
 * and creates more: chan-bytes-per-uid and chans-per-uid still count the unlinked channel (at
 * the limit passes, above it -ENOBUFS), `tpipctl channels` shows only the named channel of that
 * name, and releasing the handle gives the bytes and the slot back. Likewise a work queue whose
 * owner released it while a worker keeps it (a taken question) still counts in wqs-per-uid
 * until the worker lets go.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NOBODY 65534
#define BYTES_PER_UID 8192u
#define SMALL 100u /* the second channel's item: with the first one's, the limit exactly */

static struct tpt_daemon d;
static int to_parent[2], to_child[2]; /* the attacker holds the unlinked channel meanwhile */

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -errno;
	return 0;
}

static int write_n(struct tp_chan *ch, size_t len)
{
	static uint8_t buf[BYTES_PER_UID];
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	memset(buf, 0x5a, len);
	return tp_chan_write(ch, &iov, 1, 0);
}

static int chan_attacker(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_chan *unlinked, *named, *third, *fourth;
	struct tp_context *ctx;
	char c = 0;
	int r;

	(void)arg;
	close(to_parent[0]); /* the parent's ends: either side sees the other's exit */
	close(to_child[1]);
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "quota", &ctx) == 0, 1, "context: %s", tp_last_error());
	/* A persistent channel filled to just below the limit, unlinked, its handle kept. */
	o.flags = TP_CHAN_CREATE | TP_CHAN_PERSISTENT;
	TPT_REQUIRE(tp_chan_open(ctx, "p1", &o, &unlinked) == 0, 1, "p1: %s", tp_last_error());
	TPT_REQUIRE(write_n(unlinked, BYTES_PER_UID - SMALL) == 0, 1, "fill: %s", tp_last_error());
	TPT_REQUIRE(tp_chan_unlink(ctx, "p1", -1) == 0, 1, "unlink: %s", tp_last_error());
	/* The name again: a new channel, the old one's bytes still charged. */
	TPT_REQUIRE(tp_chan_open(ctx, "p1", &o, &named) == 0, 1, "p1 again: %s", tp_last_error());
	TPT_REQUIRE(write_n(named, SMALL) == 0, 1, "at the byte limit: %s", tp_last_error());
	r = write_n(named, 1);
	TPT_REQUIRE(r == -ENOBUFS, 1, "one byte above the limit: %d %s", r, tp_last_error());
	/* Channels: the unlinked one counts; the third is at the limit, a fourth above. */
	o.flags = TP_CHAN_CREATE;
	TPT_REQUIRE(tp_chan_open(ctx, "p3", &o, &third) == 0, 1, "p3: %s", tp_last_error());
	r = tp_chan_open(ctx, "p4", &o, &fourth);
	TPT_REQUIRE(r == -ENOBUFS, 1, "a channel above chans-per-uid: %d %s", r, tp_last_error());
	/* The parent looks at `tpipctl channels` meanwhile. */
	TPT_REQUIRE(write(to_parent[1], &c, 1) == 1 && read(to_child[0], &c, 1) == 1, 1, "sync");
	/* Released: the unlinked channel is freed, its slot and bytes come back. */
	TPT_REQUIRE(tp_chan_release(unlinked) == 0, 1, "release: %s", tp_last_error());
	TPT_REQUIRE(tp_chan_open(ctx, "p4", &o, &fourth) == 0, 1, "p4: %s", tp_last_error());
	TPT_REQUIRE(write_n(fourth, BYTES_PER_UID - SMALL) == 0, 1, "bytes back: %s",
		    tp_last_error());
	r = write_n(fourth, 1);
	TPT_REQUIRE(r == -ENOBUFS, 1, "above the limit again: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_chan_unlink(ctx, "p1", -1) == 0, 1, "unlink: %s", tp_last_error());
	tp_chan_release(fourth);
	tp_chan_release(third);
	tp_chan_release(named);
	tp_context_free(ctx);
	return 0;
}

/* `tpipctl channels --json`: field @key of channel @name (-1 if absent), and how many rows
 * carry @name in *@ret_rows. */
static long ctl_field(const char *name, const char *key, int *ret_rows)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d.socket, "--json", "channels", NULL };
	struct tpt_cmd_result res;
	struct json_object *root, *arr, *v, *n;
	long out = -1;

	*ret_rows = 0;
	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	root = json_tokener_parse(res.out);
	ck_assert_ptr_nonnull(root);
	ck_assert(json_object_object_get_ex(root, "channels", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *c = json_object_array_get_idx(arr, i);

		if (!json_object_object_get_ex(c, "name", &n) ||
		    strcmp(json_object_get_string(n), name) != 0)
			continue;
		++*ret_rows;
		if (json_object_object_get_ex(c, key, &v))
			out = json_object_get_int64(v);
	}
	json_object_put(root);
	tpt_cmd_result_free(&res);
	return out;
}

START_TEST(test_unlinked_channel_alive_counts_toward_its_uids_limits)
{
	static const char *const args[] = { "--chans-per-uid", "3", "--chan-bytes-per-uid",
					    "8192", NULL };
	pid_t pid;
	int rows;
	char c = 0;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	/* After the daemon and its helpers: only the attacker gets the ends it closes. */
	ck_assert_int_eq(pipe2(to_parent, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(to_child, O_CLOEXEC), 0);
	pid = tpt_fork(chan_attacker, NULL);
	ck_assert_int_gt(pid, 0);
	close(to_parent[1]);
	close(to_child[0]);
	if (read(to_parent[0], &c, 1) == 1) {
		/* Only the named p1 (its one small item) is listed, not the unlinked one. */
		ck_assert_int_eq(ctl_field("p1", "bytes", &rows), SMALL);
		ck_assert_int_eq(rows, 1);
		ck_assert_int_eq(ctl_field("p3", "bytes", &rows), 0);
		ck_assert_int_eq(rows, 1);
		ck_assert_int_eq(write(to_child[1], &c, 1), 1);
	}
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	close(to_parent[0]);
	close(to_child[1]);
}
END_TEST

static int wq_attacker(void *arg)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_wq *owner, *worker, *second, *third;
	struct tp_context *ctx;
	uint64_t id, taken;
	void *data;
	size_t len;
	int r;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "quota", &ctx) == 0, 1, "context: %s", tp_last_error());
	o.flags = TP_WQ_CREATE;
	TPT_REQUIRE(tp_wq_open(ctx, "w1", &o, &owner) == 0, 1, "w1: %s", tp_last_error());
	o.flags = 0;
	TPT_REQUIRE(tp_wq_open(ctx, "w1", &o, &worker) == 0, 1, "worker: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_submit(owner, "q", 1, &id) == 0, 1, "submit: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_take(worker, &taken, &data, &len, T_MS) == 0, 1, "take: %s",
		    tp_last_error());
	free(data);
	/* The owner goes: the name is free, the queue lives on with the worker's question. */
	TPT_REQUIRE(tp_wq_release(owner) == 0, 1, "release: %s", tp_last_error());
	o.flags = TP_WQ_CREATE;
	TPT_REQUIRE(tp_wq_open(ctx, "w2", &o, &second) == 0, 1, "at the limit: %s",
		    tp_last_error());
	r = tp_wq_open(ctx, "w3", &o, &third);
	TPT_REQUIRE(r == -ENOBUFS, 1, "a queue above wqs-per-uid: %d %s", r, tp_last_error());
	/* The worker lets go: the queue is freed, its slot comes back. */
	TPT_REQUIRE(tp_wq_release(worker) == 0, 1, "release: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_open(ctx, "w3", &o, &third) == 0, 1, "slot back: %s", tp_last_error());
	tp_wq_release(third);
	tp_wq_release(second);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ownerless_queue_alive_counts_toward_its_uids_limit)
{
	static const char *const args[] = { "--wqs-per-uid", "2", NULL };

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert(tpt_wait_ok(tpt_fork(wq_attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *chanquota_suite(void)
{
	Suite *s = suite_create("sec_chanquota");
	TCase *tc = tcase_create("chanquota");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_unlinked_channel_alive_counts_toward_its_uids_limits);
	tcase_add_test(tc, test_ownerless_queue_alive_counts_toward_its_uids_limit);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanquota_suite());
}
