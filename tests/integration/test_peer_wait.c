/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: tp_connect_options.wait_ms over tpip://. Two daemons on this machine treat
 * each other as remote hosts (see test_peers.c); B, the listener's daemon, runs at debug level
 * with --pipes-max 2. A client of A connects to tpip://B/NAME before anyone listens there, writes
 * at once, and the write is delivered once a listener comes (PeerConnect.wait_ms keeps the
 * connect pending on B). Nobody coming: -ETIMEDOUT naming the listener, not before wait_ms; 0
 * is -ENOENT at once. A listener that does not take pipes from other hosts is, to the waiting
 * peer, no listener at all (the wait runs out); an expected owner that does not match is
 * -EACCES once the listener comes. B keeps at most pipes-max waiting connects per link (the
 * one over is -ENOBUFS naming --pipes-max), and a pipe closed while waiting frees its place
 * there; with --peer-connect-waits-max 2 (and --pipes-max 16) B keeps two in all and the third
 * is -ENOBUFS naming that option. The link dying fails the waiting client within the peer
 * timeout, and B forgets what
 * was waiting on a link that went away. A wait on the daemon's own tpip:// address waits there
 * as for a local name. A far daemon of peer protocol 2.0 (a fake one, over --peer-insecure) is
 * sent no wait: the connect fails at once with -ENOENT, as documented.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "frame.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(60000)
#define SHORT_WAIT_MS 300
/* How much later than the deadline it documents the daemon may report a failure. */
#define SLACK_MS TPT_SCALED_MS(2000)
#define B_PIPES_MAX 2

static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

static struct tpt_sync to_conn, to_lis;
static const char *b_args[16];

static const char *const *peer_b_args(void)
{
	static char pipes_max[16];
	const char *const *base = tpt_peer_args();
	size_t n = 0;

	while (base[n]) {
		b_args[n] = base[n];
		n++;
	}
	snprintf(pipes_max, sizeof(pipes_max), "%d", B_PIPES_MAX);
	b_args[n++] = "--log-level";
	b_args[n++] = "debug";
	b_args[n++] = "--pipes-max";
	b_args[n++] = pipes_max;
	b_args[n] = NULL;
	return b_args;
}

static void setup(void)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, tpt_peer_args(), &tpt_peer_b,
					       peer_b_args()), 0);
	ck_assert_int_eq(tpt_sync_init(&to_conn), 0);
	ck_assert_int_eq(tpt_sync_init(&to_lis), 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_conn);
	tpt_sync_done(&to_lis);
	tpt_peer_fixture_stop();
}

static int connect_waiting(struct tp_context *ctx, const char *name, unsigned wait_ms,
			   unsigned flags, uid_t expect_uid, struct tp_pipe **ret)
{
	struct tp_connect_options o = { .size = sizeof(o), .wait_ms = wait_ms, .flags = flags,
					.expect_uid = expect_uid };
	char addr[128];

	return tp_connect_ex(ctx, tpt_peer_address(&tpt_peer_b, name, addr, sizeof(addr)), &o,
			     ret);
}

/* B's log says that a connect to @name waits there. */
static void b_sees_wait(const char *name)
{
	char needle[128];

	snprintf(needle, sizeof(needle), "connect to '%s' waits up to", name);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_peer_b, needle, T_MS, NULL, 0), 0);
}

static void late_spec(unsigned index, struct tpt_msg_spec *s)
{
	*s = (struct tpt_msg_spec){ .pipe = 71, .index = index, .n_payloads = 1, .n_tensors = 1 };
	s->lens[0] = 100;
	s->lens[1] = 1u << 20; /* rendezvous */
}

/* On A: connects to B's 'late' before anyone listens there and writes at once. */
static int early_connector(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "early", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "late", T_MS, 0, 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d %s", r, tp_last_error());
	late_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	tpt_done_init(&done);
	r = tp_pipe_write(p, &m.m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write while the connect waits: %d %s", r, tp_last_error());
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect once the listener came: %d %s", r, tp_last_error());
	TPT_REQUIRE(strcmp(tp_pipe_remote_name(p), "late") == 0, 1, "connected to '%s'",
		    tp_pipe_remote_name(p));
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0 && done.last_status == 0, 1,
		    "held write: %d", done.last_status);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	tp_pipe_close(p);
	tpt_msg_free(ctx, &m);
	tp_context_free(ctx);
	return 0;
}

/* On B: listens on @arg (taking pipes from other hosts), accepts one, reads late_spec 0. */
static int late_listener(void *arg)
{
	const char *name = arg;
	struct tpt_msg_spec s;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_b, 0, name, &ctx);

	if (r == 0)
		r = tp_listen(ctx, name, &remote_any, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(strcmp(tp_pipe_remote_name(p), "early") == 0, 1, "accepted '%s'",
		    tp_pipe_remote_name(p));
	late_spec(0, &s);
	r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "the write held while waiting: %d", r);
	tpt_sync_post(&to_conn, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_connect_before_the_listener_works)
{
	pid_t c = tpt_fork(early_connector, NULL), l;

	b_sees_wait("late");
	l = tpt_fork(late_listener, "late");
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
}
END_TEST

/* On A: a wait for @arg with nobody coming (or only a listener that refuses other hosts) is
 * -ETIMEDOUT naming the listener, not before SHORT_WAIT_MS; without a wait, -ENOENT. */
static int lonely_connector(void *arg)
{
	const char *name = arg;
	struct tp_context *ctx;
	struct tp_pipe *p;
	char want[160];
	uint64_t t0, ms;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "lonely", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from B's side");
	snprintf(want, sizeof(want), "no listener named '%s' on ", name);
	t0 = tpt_now_ms();
	r = connect_waiting(ctx, name, SHORT_WAIT_MS, 0, 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	ms = tpt_now_ms() - t0;
	tpt_log("waiting connect to '%s': %d after %llu ms: %s", name, r, (unsigned long long)ms,
		tp_last_error());
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "connect with nobody listening: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), want) && strstr(tp_last_error(), "appeared within 300 "
								 "ms"),
		    1, "error '%s'", tp_last_error());
	/* the daemon's timer may fire a clock tick early (libevent may time coarsely) */
	TPT_REQUIRE(ms + 5 >= SHORT_WAIT_MS, 1, "gave up after %llu ms", (unsigned long long)ms);
	TPT_REQUIRE(ms < SHORT_WAIT_MS + (uint64_t)SLACK_MS, 1, "gave up after %llu ms",
		    (unsigned long long)ms);
	tp_pipe_close(p);
	r = connect_waiting(ctx, name, 0, 0, 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ENOENT, 1, "connect without waiting: %d", r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_times_out_naming_the_listener)
{
	pid_t c = tpt_fork(lonely_connector, "nobody-here");

	tpt_sync_post(&to_conn, 0);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
}
END_TEST

/* On B: holds listener 'private' (default options: no pipes from other hosts) until told. */
static int private_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = tpt_ctx_new(&tpt_peer_b, 0, "private", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "private", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	tpt_sync_post(&to_conn, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_lis, T_MS) == 0, 1, "no word from the test");
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* A listener that does not admit the link is no listener to the peer: the wait runs out (it
 * neither connects nor fails at once, which would tell that the name exists). */
START_TEST(test_peer_wait_ignores_a_listener_that_refuses_other_hosts)
{
	pid_t l = tpt_fork(private_listener, NULL);
	pid_t c = tpt_fork(lonely_connector, "private");

	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	tpt_sync_post(&to_lis, 0);
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
}
END_TEST

/* On A: a wait for 'owned' expecting owner uid 4242; the listener (root's) comes: -EACCES. */
static int expecting_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "expecting", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "owned", T_MS, TP_CONNECT_EXPECT_UID, 4242, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	tpt_log("waiting connect expecting uid 4242: %d: %s", r, tp_last_error());
	TPT_REQUIRE(r == -EACCES, 1, "connect to a listener of another owner: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), "not the expected uid 4242"), 1, "error '%s'",
		    tp_last_error());
	tpt_sync_post(&to_lis, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* On B: listener 'owned' (open to other hosts) until the connector has its answer. */
static int owned_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = tpt_ctx_new(&tpt_peer_b, 0, "owned", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "owned", &remote_any, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_lis, T_MS) == 0, 1, "no word from the connector");
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_checks_the_expected_owner_when_the_listener_comes)
{
	pid_t c = tpt_fork(expecting_connector, NULL), l;

	b_sees_wait("owned");
	l = tpt_fork(owned_listener, NULL);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
	ck_assert_int_eq(tpt_daemon_log_count(&tpt_peer_b, "connect to 'owned' refused"), 1);
}
END_TEST

/*
 * On A: B_PIPES_MAX waits for 'crowded' are kept on B, one more is -ENOBUFS naming the limit;
 * closing a waiting pipe frees its place (B logs the cancel, a new wait is kept); then the
 * listener comes and every kept wait connects.
 */
static int crowd(void *arg)
{
	struct tp_pipe *p[B_PIPES_MAX + 1] = { NULL };
	struct tp_context *ctx;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "crowd", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	/* The link first: connects made while it comes up go out in no particular order. */
	r = connect_waiting(ctx, "crowded", 0, 0, 0, &p[0]);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p[0], T_MS);
	TPT_REQUIRE(r == -ENOENT, 1, "connect without waiting: %d", r);
	tp_pipe_close(p[0]);
	for (unsigned i = 0; i < B_PIPES_MAX; i++) {
		r = connect_waiting(ctx, "crowded", T_MS, 0, 0, &p[i]);
		TPT_REQUIRE(r == 0, 1, "connect %u: %d", i, r);
	}
	r = connect_waiting(ctx, "crowded", T_MS, 0, 0, &p[B_PIPES_MAX]);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p[B_PIPES_MAX], T_MS);
	tpt_log("waiting connect over B's limit: %d: %s", r, tp_last_error());
	TPT_REQUIRE(r == -ENOBUFS, 1, "waiting connect over B's limit: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), "--pipes-max"), 1, "error '%s'", tp_last_error());
	tp_pipe_close(p[B_PIPES_MAX]);
	tp_pipe_close(p[0]); /* cancels its wait on B */
	r = connect_waiting(ctx, "crowded", T_MS, 0, 0, &p[0]);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	tpt_sync_post(&to_lis, 0); /* the test checks B's log, then starts the listener */
	for (unsigned i = 0; i < B_PIPES_MAX; i++) {
		r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "waiting connect %u at the limit: %d %s", i, r,
			    tp_last_error());
	}
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	for (unsigned i = 0; i < B_PIPES_MAX; i++)
		tp_pipe_close(p[i]);
	tp_context_free(ctx);
	return 0;
}

static int crowded_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p[B_PIPES_MAX];
	int r = tpt_ctx_new(&tpt_peer_b, 0, "crowded", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "crowded", &remote_any, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (unsigned i = 0; i < B_PIPES_MAX; i++) {
		r = tp_listener_accept_sync(l, T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "accept %u: %d", i, r);
	}
	tpt_sync_post(&to_conn, 0);
	for (unsigned i = 0; i < B_PIPES_MAX; i++)
		tp_pipe_close(p[i]);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_kept_waits_are_bounded_by_the_pipe_limit)
{
	pid_t c = tpt_fork(crowd, NULL), l;

	ck_assert_int_eq(tpt_sync_wait(&to_lis, T_MS), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_peer_b, "connect to 'crowded' canceled while "
					     "waiting", T_MS, NULL, 0), 0);
	/* B_PIPES_MAX waits, then the one over the limit was refused, one canceled, one more
	 * kept: B_PIPES_MAX + 1 kept in all */
	for (uint64_t end = tpt_now_ms() + T_MS;
	     tpt_daemon_log_count(&tpt_peer_b, "connect to 'crowded' waits up to") <
		     B_PIPES_MAX + 1 && tpt_now_ms() < end;)
		usleep(10000); /* polling B's log, as tpt_daemon_wait_log() does */
	ck_assert_int_eq(tpt_daemon_log_count(&tpt_peer_b, "connect to 'crowded' waits up to"),
			 B_PIPES_MAX + 1);
	l = tpt_fork(crowded_listener, NULL);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
}
END_TEST

/* ---- the daemon-wide bound: --peer-connect-waits-max ---------------------------------------- */

#define B_WAITS_MAX 2

/* B keeps at most B_WAITS_MAX waiting connects in all, far fewer than its --pipes-max per link. */
static void waits_setup(void)
{
	static const char *args[24];
	const char *const *base = tpt_peer_args();
	size_t n = 0;

	while (base[n] && n < 16) {
		args[n] = base[n];
		n++;
	}
	args[n++] = "--log-level";
	args[n++] = "debug";
	args[n++] = "--pipes-max";
	args[n++] = "16";
	args[n++] = "--peer-connect-waits-max";
	args[n++] = "2";
	args[n++] = "--peer-connect-waits-per-peer"; /* all of them for the one peer, A */
	args[n++] = "2";
	args[n] = NULL;
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, tpt_peer_args(), &tpt_peer_b, args),
			 0);
	ck_assert_int_eq(tpt_sync_init(&to_conn), 0);
	ck_assert_int_eq(tpt_sync_init(&to_lis), 0);
}

/* On A: B_WAITS_MAX waits for 'crowded' are kept on B (at the bound), one more is -ENOBUFS
 * naming the option; then the listener comes and the kept ones connect. */
static int crowd_daemon_wide(void *arg)
{
	struct tp_pipe *p[B_WAITS_MAX + 1] = { NULL };
	struct tp_context *ctx;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "crowd", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "crowded", 0, 0, 0, &p[0]); /* the link first, as crowd() */
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	TPT_REQUIRE(tp_pipe_wait_connected(p[0], T_MS) == -ENOENT, 1, "connect without waiting");
	tp_pipe_close(p[0]);
	for (unsigned i = 0; i <= B_WAITS_MAX; i++) {
		r = connect_waiting(ctx, "crowded", T_MS, 0, 0, &p[i]);
		TPT_REQUIRE(r == 0, 1, "connect %u: %d", i, r);
	}
	r = tp_pipe_wait_connected(p[B_WAITS_MAX], T_MS);
	tpt_log("waiting connect over B's daemon-wide bound: %d: %s", r, tp_last_error());
	TPT_REQUIRE(r == -ENOBUFS, 1, "waiting connect over B's bound: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), "--peer-connect-waits-max"), 1, "error '%s'",
		    tp_last_error());
	tp_pipe_close(p[B_WAITS_MAX]);
	tpt_sync_post(&to_lis, 0);
	for (unsigned i = 0; i < B_WAITS_MAX; i++) {
		r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "waiting connect %u at the bound: %d %s", i, r,
			    tp_last_error());
	}
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	for (unsigned i = 0; i < B_WAITS_MAX; i++)
		tp_pipe_close(p[i]);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_kept_waits_are_bounded_daemon_wide)
{
	pid_t c = tpt_fork(crowd_daemon_wide, NULL), l;

	ck_assert_int_eq(tpt_sync_wait(&to_lis, T_MS), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&tpt_peer_b, "connect to 'crowded' waits up to"),
			 B_WAITS_MAX);
	l = tpt_fork(crowded_listener, NULL);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
}
END_TEST

/* On A: waits for 'never' (no listener will come) and expects the link's failure, long
 * before the wait runs out. */
static int stranded_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "stranded", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "never", T_MS, 0, 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	tpt_log("waiting connect when B died: %d: %s", r, tp_last_error());
	/* how the link's loss reads depends on where TLS was when B died (EOF, reset, TLS) */
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT, 1, "waiting connect when B died: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), "cannot reach tpipd at"), 1, "error '%s'",
		    tp_last_error());
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* B is killed while a connect waits there: the client on A fails within the peer timeout. */
START_TEST(test_peer_wait_link_dying_fails_the_waiting_connect)
{
	pid_t c = tpt_fork(stranded_connector, NULL);
	uint64_t t0;

	b_sees_wait("never");
	t0 = tpt_now_ms();
	ck_assert_int_eq(tpt_daemon_kill(&tpt_peer_b), 0);
	ck_assert(tpt_wait_ok(c, TPT_PEER_TIMEOUT_MS + SLACK_MS, "connector"));
	printf("the waiting connect failed %llu ms after B died\n",
	       (unsigned long long)(tpt_now_ms() - t0));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a), "daemon A died");
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, peer_b_args()), 0); /* for teardown */
}
END_TEST

/* On A: waits for 'never' until killed. */
static int doomed_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "doomed", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "never", T_MS, 0, 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	tp_context_free(ctx);
	return 0; /* A dies first: any answer */
}

/* A, the dialling daemon, is killed while its client's connect waits on B: B forgets it. */
START_TEST(test_peer_wait_far_daemon_forgets_waits_of_a_dead_link)
{
	pid_t c = tpt_fork(doomed_connector, NULL);

	b_sees_wait("never");
	ck_assert_int_eq(tpt_daemon_kill(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_peer_b, "1 connects waiting for a listener "
					     "dropped with the link", T_MS, NULL, 0), 0);
	ck_assert(tpt_wait_ok(c, T_MS, "connector"));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_b), "daemon B died");
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0); /* teardown */
}
END_TEST

/* On A: a wait on tpip://A/'selfish' (this daemon's own address) connects once 'selfish' listens
 * on A, as a local name does. */
static int self_connector(void *arg)
{
	struct tp_connect_options o = { .size = sizeof(o), .wait_ms = T_MS };
	struct tp_context *ctx;
	struct tp_pipe *p;
	char addr[128];
	int r = tpt_ctx_new(&tpt_peer_a, 0, "self", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect_ex(ctx, tpt_peer_address(&tpt_peer_a, "selfish", addr, sizeof(addr)), &o,
			  &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect to this daemon's own address: %d %s", r, tp_last_error());
	TPT_REQUIRE(strcmp(tp_pipe_remote_name(p), "selfish") == 0, 1, "connected to '%s'",
		    tp_pipe_remote_name(p));
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int self_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "selfish", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "selfish", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	tpt_sync_post(&to_conn, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_on_this_daemons_own_address_waits_here)
{
	pid_t c = tpt_fork(self_connector, NULL), l;

	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_peer_a, "address is this daemon: waiting up to",
					     T_MS, NULL, 0), 0);
	l = tpt_fork(self_listener, NULL);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
}
END_TEST

/* ---- a far daemon older than waiting connects (peer protocol 2.0) ------------------------- */

#define OLD_LINK_ID 77

static void old_setup(void)
{
	const char *const *t = tpt_peer_args();
	const char *a[] = { "--peer-insecure", "--peer-data-conns", "1", t[0], t[1], t[2], t[3],
			    NULL };

	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_conn), 0);
	ck_assert_int_eq(tpt_sync_init(&to_lis), 0);
}

static void old_teardown(void)
{
	tpt_sync_done(&to_conn);
	tpt_sync_done(&to_lis);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
}

/* Receives peer frames on @r until one of @body_case (pings skipped). */
static int old_expect(struct tpt_raw *r, int body_case, Tpw__V1__PeerMsg **ret)
{
	for (;;) {
		int rr = tpt_raw_recv_peer(r, T_MS, ret);
		if (rr < 0 || (*ret)->body_case == (unsigned)body_case)
			return rr;
		TPT_REQUIRE((*ret)->body_case == TPW__V1__PEER_MSG__BODY_PING, -EPROTO,
			    "frame %d from the dialler", (int)(*ret)->body_case);
		tpw_peer_msg_free(*ret);
	}
}

static int old_send_ready(struct tpt_raw *r, bool data_up)
{
	Tpw__V1__PeerReady rd = TPW__V1__PEER_READY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	rd.link_id = OLD_LINK_ID;
	rd.data_up = data_up;
	m.body_case = TPW__V1__PEER_MSG__BODY_READY;
	m.ready = &rd;
	return tpt_raw_send_peer(r, &m);
}

/* Child: the far daemon, answering A's dial in plaintext as a daemon of peer protocol 2.0 would
 * (Hello of minor 0, one data connection, ready), then A's PeerConnect, which must carry no
 * wait: answered NOT_FOUND, as such a daemon answers a missing name. */
static int old_far(void *arg)
{
	static uint8_t boot[16] = { 0x01, 0xd0 };
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerDataHello dh = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerConnectReply rep = TPW__V1__PEER_CONNECT_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	int lfd = *(int *)arg;
	struct tpt_raw c = { .fd = accept(lfd, NULL, NULL) }, dc = { .fd = -1 };

	TPT_REQUIRE(c.fd >= 0, 1, "accept");
	TPT_REQUIRE(old_expect(&c, TPW__V1__PEER_MSG__BODY_HELLO, &in) == 0, 1, "no hello");
	TPT_REQUIRE(in->hello->minor == TPW_PEER_PROTO_MINOR, 1, "dialler says minor %u",
		    in->hello->minor);
	tpw_peer_msg_free(in);
	h.major = TPW_PEER_PROTO_MAJOR;
	h.minor = 0;
	h.host = "old-far";
	h.boot_id.data = boot;
	h.boot_id.len = sizeof(boot);
	h.instance = 0x01dfa7;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	TPT_REQUIRE(tpt_raw_send_peer(&c, &m) == 0 && old_send_ready(&c, false) == 0, 1, "send");
	dc.fd = accept(lfd, NULL, NULL);
	TPT_REQUIRE(dc.fd >= 0, 1, "accept the data connection");
	TPT_REQUIRE(old_expect(&dc, TPW__V1__PEER_MSG__BODY_DATA_HELLO, &in) == 0, 1,
		    "no data hello");
	TPT_REQUIRE(in->data_hello->link_id == OLD_LINK_ID && in->data_hello->index == 0, 1,
		    "data hello for link %llu index %u",
		    (unsigned long long)in->data_hello->link_id, in->data_hello->index);
	tpw_peer_msg_free(in);
	dh.link_id = OLD_LINK_ID;
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &dh;
	TPT_REQUIRE(tpt_raw_send_peer(&dc, &m) == 0 && old_send_ready(&c, true) == 0, 1, "send");
	TPT_REQUIRE(old_expect(&c, TPW__V1__PEER_MSG__BODY_CONNECT, &in) == 0, 1, "no connect");
	TPT_REQUIRE(in->connect->wait_ms == 0, 1, "a daemon of minor 0 was sent wait_ms %u",
		    in->connect->wait_ms);
	rep.pipe_id = in->connect->pipe_id;
	rep.status = TPW__V1__STATUS__STATUS_NOT_FOUND;
	rep.message = "no listener named 'late' on old-far accepts pipes from other hosts";
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
	m.connect_reply = &rep;
	TPT_REQUIRE(tpt_raw_send_peer(&c, &m) == 0, 1, "send the reply");
	tpw_peer_msg_free(in);
	TPT_REQUIRE(tpt_sync_wait(&to_lis, T_MS) == 0, 1, "no word from the connector");
	close(dc.fd);
	close(c.fd);
	return 0;
}

/* On A: a wait on the old far daemon's 'late' fails at once with -ENOENT. */
static int old_connector(void *arg)
{
	struct tp_connect_options o = { .size = sizeof(o), .wait_ms = T_MS };
	struct tp_context *ctx;
	struct tp_pipe *p;
	char addr[128];
	uint64_t t0 = tpt_now_ms();
	int r = tpt_ctx_new(&tpt_peer_a, 0, "old", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	snprintf(addr, sizeof(addr), "tpip://127.0.0.1:%d/late", *(int *)arg);
	r = tp_connect_ex(ctx, addr, &o, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	tpt_log("waiting connect to a daemon of peer minor 0: %d after %llu ms: %s", r,
		(unsigned long long)(tpt_now_ms() - t0), tp_last_error());
	TPT_REQUIRE(r == -ENOENT, 1, "connect: %d", r);
	TPT_REQUIRE(tpt_now_ms() - t0 < (uint64_t)SLACK_MS, 1, "not at once");
	TPT_REQUIRE(strstr(tp_last_error(), "no listener named 'late' on old-far"), 1,
		    "error '%s'", tp_last_error());
	tpt_sync_post(&to_lis, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peer_wait_far_daemon_of_minor_0_fails_at_once)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;
	pid_t far, c;

	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&sin, &sl), 0);
	port = ntohs(sin.sin_port);
	far = tpt_fork(old_far, &lfd);
	c = tpt_fork(old_connector, &port);
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
	ck_assert(tpt_wait_ok(far, 2 * T_MS, "old far daemon"));
	close(lfd);
}
END_TEST

static Suite *peer_wait_suite(void)
{
	Suite *s = suite_create("peer_wait");
	TCase *tc = tcase_create("wait"), *old, *waits;

	tcase_set_timeout(tc, 4 * T_MS / 1000);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_peer_wait_connect_before_the_listener_works);
	tcase_add_test(tc, test_peer_wait_times_out_naming_the_listener);
	tcase_add_test(tc, test_peer_wait_ignores_a_listener_that_refuses_other_hosts);
	tcase_add_test(tc, test_peer_wait_checks_the_expected_owner_when_the_listener_comes);
	tcase_add_test(tc, test_peer_wait_kept_waits_are_bounded_by_the_pipe_limit);
	tcase_add_test(tc, test_peer_wait_link_dying_fails_the_waiting_connect);
	tcase_add_test(tc, test_peer_wait_far_daemon_forgets_waits_of_a_dead_link);
	tcase_add_test(tc, test_peer_wait_on_this_daemons_own_address_waits_here);
	suite_add_tcase(s, tc);
	waits = tcase_create("waits");
	tcase_set_timeout(waits, 4 * T_MS / 1000);
	tcase_add_checked_fixture(waits, waits_setup, teardown);
	tcase_add_test(waits, test_peer_wait_kept_waits_are_bounded_daemon_wide);
	suite_add_tcase(s, waits);
	old = tcase_create("old");
	tcase_set_timeout(old, 4 * T_MS / 1000);
	tcase_add_checked_fixture(old, old_setup, old_teardown);
	tcase_add_test(old, test_peer_wait_far_daemon_of_minor_0_fails_at_once);
	suite_add_tcase(s, old);
	return s;
}

int main(void)
{
	return tpt_run_suite(peer_wait_suite());
}
