/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: finding the daemon and its listeners without configuration. A process
 * that is not root tries $XDG_RUNTIME_DIR/tpipd.sock and, when that is missing or
 * $XDG_RUNTIME_DIR is unset, the system socket ($TPIPD_TEST_SYSTEM_SOCKET stands in for
 * /run/tpipd/tpipd.sock here); a socket asked for (option or $TPIPD_SOCKET) is never fallen
 * back from; when nothing answers, the error names every path tried and why. tpipctl looks for
 * the daemon the same way (falling back from a missing per-user socket). A connect with wait_ms
 * to a name nobody listens on yet waits for the listener (writes issued meanwhile are
 * delivered), fails with -ETIMEDOUT naming it when nobody comes (not before wait_ms; 0 is
 * -ENOENT at once), is bounded by the pipe limit (at it: kept, one over: -ENOBUFS), ends with
 * its context or its pipe's close (a write held meanwhile completes with -ECANCELED), and
 * passes the listener's access check when it registers (-EACCES for an owner-only listener of
 * another uid). The user cases need root to drop to uid 65534 and print why they skip
 * otherwise.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NOBODY 65534

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
}

static void teardown(void)
{
	tpt_fixture_stop();
}

/* ---- socket discovery --------------------------------------------------------------------- */

/* What a discovery child sets before it opens a context with no socket path. */
struct find_case {
	const char *xdg;	/* $XDG_RUNTIME_DIR, NULL: unset */
	const char *system;	/* $TPIPD_TEST_SYSTEM_SOCKET */
	const char *env_socket; /* $TPIPD_SOCKET, NULL: unset */
	int want;		/* tp_context_new()'s result */
	const char *want_msg;	/* tp_last_error() on failure, NULL: not checked */
	bool tpipctl;		/* run `tpipctl status` instead: exit 0 iff want is 0, and
				 * want_msg (if any) in its stderr */
};

static int become_nobody(void)
{
	TPT_REQUIRE(setgroups(0, NULL) == 0, -errno, "setgroups");
	TPT_REQUIRE(setgid(NOBODY) == 0, -errno, "setgid");
	TPT_REQUIRE(setuid(NOBODY) == 0, -errno, "setuid");
	prctl(PR_SET_DUMPABLE, 1);
	return 0;
}

static void setenv_or_unset(const char *name, const char *value)
{
	if (value)
		setenv(name, value, 1);
	else
		unsetenv(name);
}

/* Runs `tpipctl status` and checks its exit status (and error text) against @c. */
static int find_tpipctl(const struct find_case *c)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "status", NULL };
	struct tpt_cmd_result res;
	bool ok;

	TPT_REQUIRE(bin, 1, "TPIPCTL_BIN is not set");
	TPT_REQUIRE(tpt_run(argv, T_MS, &res) == 0, 1, "cannot run tpipctl");
	ok = WIFEXITED(res.status) && (WEXITSTATUS(res.status) == 0) == (c->want == 0) &&
	     (!c->want_msg || strstr(res.err, c->want_msg));
	if (!ok)
		tpt_log("tpipctl status: wait status %d, stderr '%s'", res.status, res.err);
	tpt_cmd_result_free(&res);
	return ok ? 0 : 1;
}

static int find_child(void *arg)
{
	const struct find_case *c = arg;
	struct tp_context *ctx = NULL;
	int r;

	TPT_REQUIRE(become_nobody() == 0, 1, "cannot become uid %d", NOBODY);
	setenv_or_unset("XDG_RUNTIME_DIR", c->xdg);
	setenv_or_unset("TPIPD_TEST_SYSTEM_SOCKET", c->system);
	setenv_or_unset("TPIPD_SOCKET", c->env_socket);
	if (c->tpipctl)
		return find_tpipctl(c);
	r = tp_context_new(NULL, &ctx);
	TPT_REQUIRE(r == c->want, 1, "context: %d, want %d (%s)", r, c->want,
		    r ? tp_last_error() : "");
	if (c->want_msg)
		TPT_REQUIRE(strcmp(tp_last_error(), c->want_msg) == 0, 1, "error '%s', want '%s'",
			    tp_last_error(), c->want_msg);
	if (ctx)
		tp_context_free(ctx);
	return 0;
}

static bool find_run(const struct find_case *c)
{
	return tpt_wait_ok(tpt_fork(find_child, (void *)c), T_MS, "discovery child");
}

#define SKIP_UNLESS_ROOT()                                                                         \
	do {                                                                                       \
		if (geteuid() != 0) {                                                              \
			printf("SKIP: needs root to act as another user\n");                       \
			return;                                                                    \
		}                                                                                  \
	} while (0)

/* A private directory with no socket in it, standing in for an empty $XDG_RUNTIME_DIR. */
static void empty_dir(char *buf, size_t len)
{
	snprintf(buf, len, "%s/empty-XXXXXX", tpt_fixture_daemon.dir);
	ck_assert_ptr_nonnull(mkdtemp(buf));
	ck_assert_int_eq(chmod(buf, 0755), 0);
}

START_TEST(test_user_without_own_socket_finds_the_system_one)
{
	char xdg[200];
	struct find_case c = { .system = tpt_fixture_daemon.socket };

	SKIP_UNLESS_ROOT();
	empty_dir(xdg, sizeof(xdg));
	c.xdg = xdg;
	ck_assert(find_run(&c));
	c.tpipctl = true; /* tpipctl looks the same way */
	ck_assert(find_run(&c));
}
END_TEST

START_TEST(test_user_without_xdg_runtime_dir_finds_the_system_socket)
{
	struct find_case c = { .system = tpt_fixture_daemon.socket };

	SKIP_UNLESS_ROOT();
	ck_assert(find_run(&c));
}
END_TEST

START_TEST(test_user_socket_is_preferred_to_the_system_one)
{
	char missing[200];
	struct find_case c = { .xdg = tpt_fixture_daemon.dir, .system = missing };

	SKIP_UNLESS_ROOT();
	snprintf(missing, sizeof(missing), "%s/no-system.sock", tpt_fixture_daemon.dir);
	ck_assert(find_run(&c));
}
END_TEST

START_TEST(test_no_socket_error_names_every_path_tried)
{
	char xdg[200], sys[200], want[600];
	struct find_case c = { .want = -ENOENT, .want_msg = want };

	SKIP_UNLESS_ROOT();
	empty_dir(xdg, sizeof(xdg));
	snprintf(sys, sizeof(sys), "%s/no-system.sock", tpt_fixture_daemon.dir);
	c.xdg = xdg;
	c.system = sys;
	snprintf(want, sizeof(want),
		 "no daemon socket: tried %s/tpipd.sock (no such file), %s (no such file); "
		 "start tpipd or set TPIPD_SOCKET", xdg, sys);
	ck_assert(find_run(&c));
	/* without $XDG_RUNTIME_DIR only the system socket is tried, and the error says why */
	c.xdg = NULL;
	snprintf(want, sizeof(want),
		 "no daemon socket: tried ($XDG_RUNTIME_DIR is not set) %s (no such file); "
		 "start tpipd or set TPIPD_SOCKET", sys);
	ck_assert(find_run(&c));
	/* tpipctl names the paths it tried too */
	c.tpipctl = true;
	c.xdg = xdg;
	snprintf(want, sizeof(want), "no daemon socket: tried %s/tpipd.sock (no such file), %s "
		 "(no such file)", xdg, sys);
	ck_assert(find_run(&c));
}
END_TEST

START_TEST(test_tpipd_socket_is_not_fallen_back_from)
{
	char xdg[200], missing[200];
	struct find_case c = { .system = tpt_fixture_daemon.socket, .env_socket = missing,
			       .want = -ENOENT };

	SKIP_UNLESS_ROOT();
	empty_dir(xdg, sizeof(xdg));
	c.xdg = xdg;
	snprintf(missing, sizeof(missing), "%s/asked-for.sock", tpt_fixture_daemon.dir);
	ck_assert(find_run(&c));
}
END_TEST

/* ---- connects that wait for their listener ------------------------------------------------ */

static struct tpt_sync to_conn, to_lis;

static void wait_setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_conn), 0);
	ck_assert_int_eq(tpt_sync_init(&to_lis), 0);
}

static void wait_teardown(void)
{
	tpt_sync_done(&to_conn);
	tpt_sync_done(&to_lis);
	tpt_fixture_stop();
}

static void late_spec(unsigned index, struct tpt_msg_spec *s)
{
	*s = (struct tpt_msg_spec){ .pipe = 70, .index = index, .n_payloads = 1, .n_tensors = 1 };
	s->lens[0] = 100;
	s->lens[1] = 1u << 20; /* rendezvous */
}

static int connect_waiting(struct tp_context *ctx, const char *name, unsigned wait_ms,
			   struct tp_pipe **ret)
{
	struct tp_connect_options o = { .size = sizeof(o), .wait_ms = wait_ms };

	return tp_connect_ex(ctx, name, &o, ret);
}

/* Connects to 'late' before anyone listens and writes at once; the write is delivered once the
 * listener came. */
static int early_connector(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "early", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "late", T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d %s", r, tp_last_error());
	late_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	tpt_done_init(&done);
	r = tp_pipe_write(p, &m.m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write while the connect waits: %d %s", r, tp_last_error());
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect once the listener came: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0 && done.last_status == 0, 1,
		    "held write: %d", done.last_status);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	tp_pipe_close(p);
	tpt_msg_free(ctx, &m);
	tp_context_free(ctx);
	return 0;
}

static int late_listener(void *arg)
{
	struct tpt_msg_spec s;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "late", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "late", NULL, &l);
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

START_TEST(test_connect_waits_for_a_listener_registered_later)
{
	char needle[96];
	pid_t c = tpt_fork(early_connector, NULL), l;

	snprintf(needle, sizeof(needle), "waiting up to %d ms for listener 'late'", T_MS);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, needle, T_MS, NULL, 0), 0);
	l = tpt_fork(late_listener, NULL);
	ck_assert(tpt_wait_ok(l, 2 * T_MS, "listener"));
	ck_assert(tpt_wait_ok(c, 2 * T_MS, "connector"));
}
END_TEST

#define SHORT_WAIT_MS 200

/* A wait with nobody coming: -ETIMEDOUT naming the listener, not before wait_ms; 0 is
 * -ENOENT at once. */
static int lonely_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	uint64_t t0;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "lonely", &ctx);
	const char *want = "no listener named 'nobody-here' appeared within 200 ms";

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	t0 = tpt_now_ms();
	r = connect_waiting(ctx, "nobody-here", SHORT_WAIT_MS, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "connect with nobody listening: %d", r);
	TPT_REQUIRE(strstr(tp_last_error(), want), 1, "error '%s'", tp_last_error());
	/* the daemon's timer may fire a clock tick early (libevent may time coarsely) */
	TPT_REQUIRE(tpt_now_ms() - t0 + 5 >= SHORT_WAIT_MS, 1, "gave up after %llu ms",
		    (unsigned long long)(tpt_now_ms() - t0));
	tp_pipe_close(p);
	r = connect_waiting(ctx, "nobody-here", 0, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ENOENT, 1, "connect without waiting: %d", r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_connect_wait_times_out_naming_the_listener)
{
	ck_assert(tpt_wait_ok(tpt_fork(lonely_connector, NULL), 2 * T_MS, "connector"));
}
END_TEST

#define PIPES_MAX 3

/* PIPES_MAX waiting connects are kept (the pipe limit), one more is refused; all kept ones
 * connect when the listener comes. */
static int many_waiters(void *arg)
{
	struct tp_pipe *p[PIPES_MAX + 1] = { NULL };
	struct tp_context *ctx;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "waiters", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	for (unsigned i = 0; i < PIPES_MAX; i++) {
		r = connect_waiting(ctx, "crowded", T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "connect %u: %d", i, r);
	}
	/* the library knows the daemon's limit and refuses at once; else the daemon does */
	r = connect_waiting(ctx, "crowded", T_MS, &p[PIPES_MAX]);
	if (r == 0)
		r = tp_pipe_wait_connected(p[PIPES_MAX], T_MS);
	TPT_REQUIRE(r == -ENOBUFS, 1, "waiting connect over the pipe limit: %d", r);
	tpt_sync_post(&to_lis, 0);
	for (unsigned i = 0; i < PIPES_MAX; i++) {
		r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "waiting connect %u at the limit: %d %s", i, r,
			    tp_last_error());
	}
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the listener");
	for (unsigned i = 0; i <= PIPES_MAX; i++)
		if (p[i])
			tp_pipe_close(p[i]);
	tp_context_free(ctx);
	return 0;
}

static int crowded_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p[PIPES_MAX];
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "crowded", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_lis, T_MS) == 0, 1, "no word from the connector");
	r = tp_listen(ctx, "crowded", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (unsigned i = 0; i < PIPES_MAX; i++) {
		r = tp_listener_accept_sync(l, T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "accept %u: %d", i, r);
	}
	tpt_sync_post(&to_conn, 0);
	for (unsigned i = 0; i < PIPES_MAX; i++)
		tp_pipe_close(p[i]);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_waiting_connects_are_bounded_by_the_pipe_limit)
{
	static const char *const args[] = { "--pipes-max", "3", NULL };

	tpt_fixture_stop(); /* the fixture's daemon, replaced by one with a small pipe limit */
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert(tpt_run_pair(many_waiters, crowded_listener, NULL, 2 * T_MS));
}
END_TEST

/* Waits for 'abandoned' and ends its context while the connect is pending. */
static int quitter(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "quitter", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "abandoned", T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the parent");
	tp_context_free(ctx);
	return 0;
}

/* Waits for 'abandoned' with a write held, then closes the pipe: the write is canceled. */
static int closer(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "closer", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = connect_waiting(ctx, "abandoned", T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	late_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	tpt_done_init(&done);
	r = tp_pipe_write(p, &m.m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write while the connect waits: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the parent");
	tp_pipe_close(p);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1, "held write never completed");
	TPT_REQUIRE(done.last_status == -ECANCELED, 1, "held write of a closed pipe: %d",
		    done.last_status);
	tpt_msg_free(ctx, &m);
	tpt_sync_post(&to_lis, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_conn, T_MS) == 0, 1, "no word from the parent");
	tp_context_free(ctx);
	return 0;
}

/* Listens on 'abandoned': nobody is left to connect. */
static int abandoned_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "abandoned", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_listen(ctx, "abandoned", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, 300, &p);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "accepted a connect whose context had ended: %d", r);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_waiting_connect_ends_with_its_context)
{
	pid_t q = tpt_fork(quitter, NULL);

	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "for listener 'abandoned'", T_MS,
					     NULL, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&to_conn, 0), 0);
	ck_assert(tpt_wait_ok(q, T_MS, "quitter"));
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "local end left", T_MS, NULL, 0),
			 0);
	ck_assert(tpt_wait_ok(tpt_fork(abandoned_listener, NULL), T_MS, "listener"));
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
}
END_TEST

/* As uid NOBODY, waits for root's owner-only 'private': refused once it registers. */
static int refused_waiter(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r;

	TPT_REQUIRE(become_nobody() == 0, 1, "cannot become uid %d", NOBODY);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "refused", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d %s", r, tp_last_error());
	r = connect_waiting(ctx, "private", T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -EACCES, 1, "waiting connect to an owner-only listener: %d %s", r,
		    tp_last_error());
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_waiting_connect_passes_the_access_check_when_the_listener_comes)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	pid_t w;

	SKIP_UNLESS_ROOT();
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
	w = tpt_fork(refused_waiter, NULL);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "for listener 'private'", T_MS,
					     NULL, 0), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "owner", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "private", NULL, &l), 0);
	ck_assert(tpt_wait_ok(w, T_MS, "waiter"));
	tp_listener_close(l);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_closing_a_waiting_connect_cancels_it)
{
	pid_t c = tpt_fork(closer, NULL);

	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "for listener 'abandoned'", T_MS,
					     NULL, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&to_conn, 0), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_lis, T_MS), 0); /* closed, the context still open */
	ck_assert(tpt_wait_ok(tpt_fork(abandoned_listener, NULL), T_MS, "listener"));
	ck_assert_int_eq(tpt_sync_post(&to_conn, 0), 0);
	ck_assert(tpt_wait_ok(c, T_MS, "closer"));
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
}
END_TEST

static Suite *discovery_suite(void)
{
	Suite *s = suite_create("discovery");
	TCase *tc = tcase_create("socket");
	TCase *w = tcase_create("wait");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_user_without_own_socket_finds_the_system_one);
	tcase_add_test(tc, test_user_without_xdg_runtime_dir_finds_the_system_socket);
	tcase_add_test(tc, test_user_socket_is_preferred_to_the_system_one);
	tcase_add_test(tc, test_no_socket_error_names_every_path_tried);
	tcase_add_test(tc, test_tpipd_socket_is_not_fallen_back_from);
	suite_add_tcase(s, tc);

	tcase_add_checked_fixture(w, wait_setup, wait_teardown);
	tcase_set_timeout(w, 90);
	tcase_add_test(w, test_connect_waits_for_a_listener_registered_later);
	tcase_add_test(w, test_connect_wait_times_out_naming_the_listener);
	tcase_add_test(w, test_waiting_connects_are_bounded_by_the_pipe_limit);
	tcase_add_test(w, test_waiting_connect_ends_with_its_context);
	tcase_add_test(w, test_closing_a_waiting_connect_cancels_it);
	tcase_add_test(w, test_waiting_connect_passes_the_access_check_when_the_listener_comes);
	suite_add_tcase(s, w);
	return s;
}

int main(void)
{
	return tpt_run_suite(discovery_suite());
}
