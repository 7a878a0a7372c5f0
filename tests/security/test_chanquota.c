/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: the per-uid limits of channels and work queues (docs/channels.md,
 * docs/queues.md) count every object a uid's handles keep alive, not only the named ones. An
 * unprivileged local user (uid 65534) fills a persistent channel, unlinks it keeping its handle
 * and creates more: chan-bytes-per-uid and chans-per-uid still count the unlinked channel (at
 * the limit passes, above it -ENOBUFS), `tpipctl channels` shows only the named channel of that
 * name, and releasing the handle gives the bytes and the slot back.
 *
 * A work queue whose owner (uid 65534) went while a worker of another uid (65533) keeps it, a
 * question taken, takes a slot of neither uid's wqs-per-uid: the owner's uid creates two queues
 * (the limit) and is refused a third, and so is the worker's; the worker's reply gets -EPIPE.
 * (It used to stay charged to the owner's uid while the other uid's worker held it, so that one
 * user held another's quota.)
 *
 * Writes waiting for room in a full channel count their inline bytes in their writer's (here
 * the owner's) chan-bytes-per-uid: the waits that fit it wait, the next is refused at once (-ENOBUFS), and
 * an admitted one is not counted twice (they held daemon memory no limit bounded).
 *
 * Calls waiting in the daemon count per uid (waits-per-uid): at the limit they wait, one more
 * call is refused at once, another uid's still waits.
 *
 * /metrics counts what those objects hold: the unlinked channel and its bytes in
 * tpipd_channel_bytes (with tpipd_channels_unlinked), the ownerless queue in
 * tpipd_work_queues_ownerless (the page used to count named channels only, and no queue).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
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
#define WORKER 65533 /* a second unprivileged uid */
#define BYTES_PER_UID 8192u
#define SMALL 100u /* the second channel's item: with the first one's, the limit exactly */

static struct tpt_daemon d;
static int to_parent[2], to_child[2]; /* the attacker holds the unlinked channel meanwhile */
static char metrics_arg[32];
static int metrics_port;

/* "--metrics-listen" on a loopback port free a moment ago (into metrics_arg, metrics_port). */
static const char *metrics_listen(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	metrics_port = ntohs(sin.sin_port);
	close(fd);
	snprintf(metrics_arg, sizeof(metrics_arg), "127.0.0.1:%d", metrics_port);
	return metrics_arg;
}

/*
 * tpt_daemon_start() with @args, which name metrics_arg: a port free a moment ago may be taken
 * by the time the daemon binds it (another test, a listener of the daemon's own on port 0), so
 * up to 5 ports are tried. Return: 0 or the last start's -errno.
 */
static int daemon_start_metrics(const char *const *args)
{
	int r = -EADDRINUSE;

	for (int i = 0; i < 5 && r < 0; i++) {
		if (i)
			metrics_listen(); /* another port, into the metrics_arg @args names */
		r = tpt_daemon_start(&d, args);
	}
	return r;
}

/* The value of the unlabelled series @name on the daemon's /metrics page (-1 if absent). */
static long metric(const char *name)
{
	static char page[1 << 16];
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(metrics_port),
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t got = 0;
	char want[128], *p;
	ssize_t n;
	long v = -1;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
	while (got < sizeof(page) - 1 && (n = read(fd, page + got, sizeof(page) - 1 - got)) > 0)
		got += (size_t)n;
	close(fd);
	page[got] = 0;
	snprintf(want, sizeof(want), "\n%s ", name);
	p = strstr(page, want);
	if (p)
		v = strtol(p + strlen(want), NULL, 10);
	return v;
}

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
	const char *const args[] = { "--chans-per-uid", "3", "--chan-bytes-per-uid", "8192",
				     "--metrics-listen", metrics_listen(), NULL };
	pid_t pid;
	int rows;
	char c = 0;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(daemon_start_metrics(args), 0);
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
		/* /metrics counts the unlinked channel and its bytes too */
		ck_assert_int_eq(metric("tpipd_channels"), 2);
		ck_assert_int_eq(metric("tpipd_channels_unlinked"), 1);
		ck_assert_int_eq(metric("tpipd_channel_items"), 2);
		ck_assert_int_eq(metric("tpipd_channel_bytes"), BYTES_PER_UID);
		ck_assert_int_eq(write(to_child[1], &c, 1), 1);
	}
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	close(to_parent[0]);
	close(to_child[1]);
}
END_TEST

static struct tpt_sync from_owner, from_worker, from_parent;

static int drop_to(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
	    setresuid(uid, uid, uid) < 0)
		return -errno;
	return 0;
}

/* Queues @a and @b of the caller at wqs-per-uid 2 just fit; a third @c is refused. */
static int fill_own_quota(struct tp_context *ctx, const char *a, const char *b, const char *c)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_wq *qa, *qb, *qc;
	int r;

	TPT_REQUIRE(tp_wq_open(ctx, a, &o, &qa) == 0, 1, "%s: %s", a, tp_last_error());
	TPT_REQUIRE(tp_wq_open(ctx, b, &o, &qb) == 0, 1, "%s at the limit: %s", b,
		    tp_last_error());
	r = tp_wq_open(ctx, c, &o, &qc);
	TPT_REQUIRE(r == -ENOBUFS, 1, "%s above wqs-per-uid: %d %s", c, r, tp_last_error());
	tp_wq_release(qb);
	tp_wq_release(qa);
	return 0;
}

/* uid NOBODY: owns "w1" (any uid may work for it), submits one question, and once another
 * uid's worker took it, goes; then its own two queues fit, a third not. */
static int wq_owner(void *arg)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .access = TP_ACCESS_ANYONE };
	struct tp_context *ctx;
	struct tp_wq *owner;
	uint64_t id;

	(void)arg;
	TPT_REQUIRE(drop_to(NOBODY) == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "owner", &ctx) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_open(ctx, "w1", &o, &owner) == 0, 1, "w1: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_submit(owner, "q", 1, &id) == 0, 1, "submit: %s", tp_last_error());
	TPT_REQUIRE(tpt_sync_post(&from_owner, 1) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&from_worker, T_MS) == 1, 1, "the worker did not take");
	/* The owner goes: the worker of another uid keeps the queue, not this uid's slot. */
	TPT_REQUIRE(tp_wq_release(owner) == 0, 1, "release: %s", tp_last_error());
	if (fill_own_quota(ctx, "w2", "w3", "w4"))
		return 1;
	TPT_REQUIRE(tpt_sync_post(&from_owner, 2) == 0, 1, "post");
	tp_context_free(ctx);
	return 0;
}

/* uid WORKER: takes the question of NOBODY's "w1" and keeps it past its owner's end; the
 * ownerless queue is charged to it neither: its own two queues fit, a third not. */
static int wq_worker(void *arg)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = NOBODY };
	struct tp_context *ctx;
	struct tp_wq *worker;
	uint64_t taken;
	void *data;
	size_t len;
	int r;

	(void)arg;
	TPT_REQUIRE(drop_to(WORKER) == 0, 1, "cannot drop to uid %u", WORKER);
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "worker", &ctx) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&from_owner, T_MS) == 1, 1, "no queue");
	TPT_REQUIRE(tp_wq_open(ctx, "w1", &o, &worker) == 0, 1, "worker: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_take(worker, &taken, &data, &len, T_MS) == 0, 1, "take: %s",
		    tp_last_error());
	free(data);
	TPT_REQUIRE(tpt_sync_post(&from_worker, 1) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&from_owner, T_MS) == 2, 1, "the owner did not finish");
	if (fill_own_quota(ctx, "x1", "x2", "x3"))
		return 1;
	TPT_REQUIRE(tpt_sync_post(&from_worker, 2) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&from_parent, T_MS) == 1, 1, "the parent did not look");
	r = tp_wq_reply(worker, taken, "a", 1);
	TPT_REQUIRE(r == -EPIPE, 1, "a reply to a gone owner: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_wq_release(worker) == 0, 1, "release: %s", tp_last_error());
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ownerless_queue_takes_no_uids_slot)
{
	const char *const args[] = { "--wqs-per-uid", "2", "--metrics-listen", metrics_listen(),
				     NULL };
	pid_t owner, worker;

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	ck_assert_int_eq(tpt_sync_init(&from_owner), 0);
	ck_assert_int_eq(tpt_sync_init(&from_worker), 0);
	ck_assert_int_eq(tpt_sync_init(&from_parent), 0);
	ck_assert_int_eq(daemon_start_metrics(args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	owner = tpt_fork(wq_owner, NULL);
	worker = tpt_fork(wq_worker, NULL);
	ck_assert(tpt_wait_ok(owner, 4 * T_MS, "owner"));
	ck_assert_int_eq(tpt_sync_wait(&from_worker, T_MS), 2);
	/* /metrics counts the ownerless queue the worker keeps (holding no question) */
	ck_assert_int_eq(metric("tpipd_work_queues"), 1);
	ck_assert_int_eq(metric("tpipd_work_queues_ownerless"), 1);
	ck_assert_int_eq(metric("tpipd_work_queue_questions"), 0);
	ck_assert_int_eq(metric("tpipd_work_queue_bytes"), 0);
	ck_assert_int_eq(tpt_sync_post(&from_parent, 1), 0);
	ck_assert(tpt_wait_ok(worker, 4 * T_MS, "worker"));
	ck_assert_int_eq(metric("tpipd_work_queues"), 0);
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	tpt_sync_done(&from_owner);
	tpt_sync_done(&from_worker);
	tpt_sync_done(&from_parent);
}
END_TEST

/* Writes waiting for room hold their inline bytes in the daemon: those count in the owner's
 * chan-bytes-per-uid as admitted items do. The attacker's channel is full (BATCH 1-byte
 * fillers, capacity BATCH items); its uid's budget takes the fillers and WAITERS waiting
 * writes of BATCH inline items of WAIT_ITEM bytes each, exactly; of WRITERS such writes from as
 * many handles, WAITERS wait and the others are refused at once (-ENOBUFS). Once the fillers
 * are read, the oldest waiting write goes in (its own bytes are not counted twice) and the two
 * others time out. Before, every write waited, uncounted: 1024 handles a session times
 * sessions-per-uid, each holding an inline batch of up to inline-max, were memory of the daemon
 * no limit bounded. */
#define WAIT_ITEM (16u << 10) /* the largest private item the library sends inline */
#define BATCH 16u
#define WAITERS 3u
#define WRITERS 8u
#define WAIT_BUDGET (BATCH + WAITERS * BATCH * WAIT_ITEM)
#define WAIT_MS 3000

struct wait_writer {
	struct tp_chan *ch;
	pthread_t thread;
	int r;
};

static uint8_t wait_item[BATCH * WAIT_ITEM];
static unsigned wait_refused;

static void *wait_writer_main(void *arg)
{
	struct wait_writer *w = arg;
	struct iovec iov[BATCH];

	for (unsigned i = 0; i < BATCH; i++)
		iov[i] = (struct iovec){ .iov_base = wait_item + i * WAIT_ITEM,
					 .iov_len = WAIT_ITEM };
	w->r = tp_chan_write(w->ch, iov, BATCH, WAIT_MS);
	if (w->r == -ENOBUFS)
		__atomic_fetch_add(&wait_refused, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static int wait_attacker(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE,
				     .capacity_items = BATCH, .owner_uid = -1 };
	struct wait_writer w[WRITERS];
	unsigned ok = 0, timedout = 0, refused = 0;
	struct tp_context *ctx;
	struct tp_chan *reader;
	struct tp_chan_item got[BATCH];
	struct iovec iov[BATCH];
	uint8_t one = 1;
	size_t n;
	uint64_t end;
	int r;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "waits", &ctx) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tp_chan_open(ctx, "full", &o, &reader) == 0, 1, "open: %s", tp_last_error());
	for (unsigned i = 0; i < BATCH; i++)
		iov[i] = (struct iovec){ .iov_base = &one, .iov_len = 1 };
	TPT_REQUIRE(tp_chan_write(reader, iov, BATCH, 0) == 0, 1, "fillers: %s", tp_last_error());
	o.flags = 0;
	for (unsigned i = 0; i < WRITERS; i++) {
		TPT_REQUIRE(tp_chan_open(ctx, "full", &o, &w[i].ch) == 0, 1, "handle %u: %s", i,
			    tp_last_error());
		TPT_REQUIRE(pthread_create(&w[i].thread, NULL, wait_writer_main, &w[i]) == 0, 1,
			    "thread");
	}
	/* the refusals come at once; the writes that wait are waiting once they have come */
	end = tpt_now_ms() + WAIT_MS / 2;
	while (__atomic_load_n(&wait_refused, __ATOMIC_SEQ_CST) < WRITERS - WAITERS &&
	       tpt_now_ms() < end)
		usleep(1000);
	r = tp_chan_read_many(reader, got, BATCH, &n, 0);
	TPT_REQUIRE(r == 0 && n == BATCH && got[0].len == 1, 1, "read the fillers: %d %s", r,
		    tp_last_error());
	for (unsigned i = 0; i < n; i++)
		free(got[i].data);
	for (unsigned i = 0; i < WRITERS; i++) {
		pthread_join(w[i].thread, NULL);
		ok += w[i].r == 0;
		timedout += w[i].r == -ETIMEDOUT;
		refused += w[i].r == -ENOBUFS;
		tp_chan_release(w[i].ch);
	}
	tpt_log("waiting writes: %u in, %u timed out, %u refused", ok, timedout, refused);
	TPT_REQUIRE(refused == WRITERS - WAITERS, 1, "%u of %u waiting writes refused, expected "
		    "%u (at most %u fit chan-bytes-per-uid)", refused, WRITERS, WRITERS - WAITERS,
		    WAITERS);
	TPT_REQUIRE(ok == 1 && timedout == WAITERS - 1, 1, "after the read: %u in, %u timed "
		    "out", ok, timedout);
	r = tp_chan_read_many(reader, got, BATCH, &n, 0);
	TPT_REQUIRE(r == 0 && n == BATCH && got[0].len == WAIT_ITEM, 1, "read the batch: %d %s",
		    r, tp_last_error());
	for (unsigned i = 0; i < n; i++)
		free(got[i].data);
	tp_chan_release(reader);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_waiting_writes_count_toward_the_owners_bytes)
{
	char budget[32];
	const char *const args[] = { "--chan-bytes-per-uid", budget, NULL };
	pid_t pid;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	snprintf(budget, sizeof(budget), "%u", WAIT_BUDGET);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	pid = tpt_fork(wait_attacker, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* Calls waiting in the daemon (channel reads and writes, work queue takes, answer reads and
 * drains) are counted per uid, waits-per-uid (root exempt): the attacker's two sessions hold
 * WAITS channel reads, exactly the limit; one more, a work queue take or a channel read, is
 * refused at once (-ENOBUFS), while a read of another uid still waits; once the reads time out
 * the uid may wait again. Before, each handle could hold 64 waits, a session 1024 handles and a
 * uid 128 sessions: 8.4 million waits of about 500 bytes of the daemon's memory (and a timer
 * each) for one unprivileged user. */
#define WAITS 8u
#define WAIT_SHORT_MS 200

static struct tpt_sync waits_ready, waits_go;

struct waiter {
	struct tp_chan *ch;
	pthread_t thread;
	int r;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	size_t len;
	void *item;

	w->r = tp_chan_read(w->ch, &item, &len, WAIT_MS);
	if (w->r >= 0)
		free(item);
	return NULL;
}

static int waits_attacker(void *arg)
{
	struct tp_chan_options co = { .size = sizeof(co), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_wq_options qo = { .size = sizeof(qo), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx[2];
	struct tp_chan *ch[2];
	struct waiter w[WAITS];
	struct tp_wq *q;
	uint64_t t0, id;
	size_t len;
	void *data;
	int r;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	for (unsigned i = 0; i < 2; i++) {
		TPT_REQUIRE(tpt_ctx_new(&d, 0, "waits", &ctx[i]) == 0, 1, "context: %s",
			    tp_last_error());
		TPT_REQUIRE(tp_chan_open(ctx[i], "idle", &co, &ch[i]) == 0, 1, "open: %s",
			    tp_last_error());
	}
	TPT_REQUIRE(tp_wq_open(ctx[1], "idleq", &qo, &q) == 0, 1, "queue: %s", tp_last_error());
	for (unsigned i = 0; i < WAITS; i++) { /* half in each session: the limit is the uid's */
		w[i].ch = ch[i % 2];
		TPT_REQUIRE(pthread_create(&w[i].thread, NULL, waiter_main, &w[i]) == 0, 1,
			    "thread");
	}
	TPT_REQUIRE(tpt_sync_post(&waits_ready, 1) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&waits_go, T_MS) == 1, 1, "the parent did not see the waits");
	t0 = tpt_now_ms();
	r = tp_wq_take(q, &id, &data, &len, WAIT_MS);
	TPT_REQUIRE(r == -ENOBUFS && tpt_now_ms() - t0 < WAIT_MS / 2, 1, "a take above "
		    "waits-per-uid: %d after %llu ms (%s)", r,
		    (unsigned long long)(tpt_now_ms() - t0), tp_last_error());
	r = tp_chan_read(ch[0], &data, &len, WAIT_MS);
	TPT_REQUIRE(r == -ENOBUFS, 1, "a read above waits-per-uid: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_post(&waits_ready, 2) == 0, 1, "post");
	for (unsigned i = 0; i < WAITS; i++) {
		pthread_join(w[i].thread, NULL);
		TPT_REQUIRE(w[i].r == -ETIMEDOUT, 1, "waiting read %u: %d", i, w[i].r);
	}
	/* their waits are over: this uid waits again */
	r = tp_wq_take(q, &id, &data, &len, WAIT_SHORT_MS);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "a take after the waits ended: %d %s", r,
		    tp_last_error());
	tp_wq_release(q);
	for (unsigned i = 0; i < 2; i++) {
		tp_chan_release(ch[i]);
		tp_context_free(ctx[i]);
	}
	return 0;
}

/* Another uid, while the attacker holds its limit: its read waits (and times out). */
static int waits_other(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	size_t len;
	void *data;
	int r;

	(void)arg;
	TPT_REQUIRE(drop_to(WORKER) == 0, 1, "cannot drop to uid %u", WORKER);
	TPT_REQUIRE(tpt_ctx_new(&d, 0, "other", &ctx) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tp_chan_open(ctx, "other", &o, &ch) == 0, 1, "open: %s", tp_last_error());
	r = tp_chan_read(ch, &data, &len, WAIT_SHORT_MS);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "another uid's read: %d %s", r, tp_last_error());
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_waiting_calls_are_bounded_per_uid)
{
	char limit[16];
	const char *const args[] = { "--waits-per-uid", limit, NULL };
	uint64_t end;
	pid_t pid, other;
	int rows;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	snprintf(limit, sizeof(limit), "%u", WAITS);
	ck_assert_int_eq(tpt_sync_init(&waits_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&waits_go), 0);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	pid = tpt_fork(waits_attacker, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&waits_ready, T_MS), 1);
	end = tpt_now_ms() + T_MS;
	while (ctl_field("idle", "readers_waiting", &rows) != WAITS && tpt_now_ms() < end)
		usleep(20000);
	ck_assert_int_eq(ctl_field("idle", "readers_waiting", &rows), WAITS);
	ck_assert_int_eq(tpt_sync_post(&waits_go, 1), 0);
	ck_assert_int_eq(tpt_sync_wait(&waits_ready, T_MS), 2);
	other = tpt_fork(waits_other, NULL);
	ck_assert_int_gt(other, 0);
	ck_assert(tpt_wait_ok(other, T_MS, "other uid"));
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	tpt_sync_done(&waits_ready);
	tpt_sync_done(&waits_go);
}
END_TEST

static Suite *chanquota_suite(void)
{
	Suite *s = suite_create("sec_chanquota");
	TCase *tc = tcase_create("chanquota");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_unlinked_channel_alive_counts_toward_its_uids_limits);
	tcase_add_test(tc, test_ownerless_queue_takes_no_uids_slot);
	tcase_add_test(tc, test_waiting_writes_count_toward_the_owners_bytes);
	tcase_add_test(tc, test_waiting_calls_are_bounded_per_uid);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanquota_suite());
}
