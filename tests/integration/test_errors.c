/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: error texts say what happened. tp_last_error() holds a daemon message
 * longer than 256 bytes whole; tp_strerror(-ECONNREFUSED) is true for a daemon socket and a
 * peer port alike while tp_last_error() names which; a session closed by tpipctl close-session
 * reads as closed by an administrator (-ECONNABORTED) to its client and to the other end of its
 * pipes; a clean tp_context_free() is logged as a clean close, not as a dead peer; limit
 * errors name the option that sets the limit.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NAME_MAX_BYTES 255 /* listener names, libtpclient(3) */

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

/* A connect to an unknown name of 255 bytes: the daemon's message, quoting it, comes whole. */
static int long_message(void *arg)
{
	char name[NAME_MAX_BYTES + 1], *at;
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "long-message", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	memset(name, 'n', NAME_MAX_BYTES);
	name[NAME_MAX_BYTES] = '\0';
	r = tp_connect(ctx, name, &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect: %d (%s)", r, tp_last_error());
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ENOENT, 1, "connect: %d, want -ENOENT", r);
	tpt_log("%zu bytes: %s", strlen(tp_last_error()), tp_last_error());
	TPT_REQUIRE(strlen(tp_last_error()) > 256, 1, "message of %zu bytes",
		    strlen(tp_last_error()));
	at = strstr(tp_last_error(), name);
	TPT_REQUIRE(at && at[NAME_MAX_BYTES] == '\'', 1, "the name is cut: %s", tp_last_error());
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_errors_last_error_holds_a_long_daemon_message)
{
	pid_t pid = tpt_fork(long_message, NULL);

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
}
END_TEST

/* tp_strerror(-ECONNREFUSED) is generic; tp_last_error() names the daemon socket refused. */
START_TEST(test_errors_refused_socket_is_named)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct tp_context_options o = { .size = sizeof(o) };
	struct tp_context *ctx = NULL;
	const char *s = tp_strerror(-ECONNREFUSED);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), r;

	ck_assert_msg(!strstr(s, "daemon") && !strstr(s, "socket"),
		      "tp_strerror(-ECONNREFUSED) names one case only: '%s'", s);
	ck_assert_msg(strstr(s, "refused"), "tp_strerror(-ECONNREFUSED): '%s'", s);
	/* Bound, never listening: connect() is refused. */
	ck_assert_int_ge(fd, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/refused.sock", tpt_fixture_daemon.dir);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	o.socket_path = sun.sun_path;
	r = tp_context_new(&o, &ctx);
	ck_assert_int_eq(r, -ECONNREFUSED);
	ck_assert_msg(strstr(tp_last_error(), sun.sun_path) && strstr(tp_last_error(), "tpipd"),
		      "tp_last_error() does not name the daemon socket: '%s'", tp_last_error());
	close(fd);
}
END_TEST

static Suite *errors_suite(void)
{
	Suite *s = suite_create("errors");
	TCase *t = tcase_create("texts");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, test_errors_last_error_holds_a_long_daemon_message);
	tcase_add_test(t, test_errors_refused_socket_is_named);
	tcase_set_timeout(t, 60);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return tpt_run_suite(errors_suite());
}
