/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: finding the daemon and its listeners without configuration. A process
 * that is not root tries $XDG_RUNTIME_DIR/tpipd.sock and, when that is missing or
 * $XDG_RUNTIME_DIR is unset, the system socket ($TPIPD_TEST_SYSTEM_SOCKET stands in for
 * /run/tpipd/tpipd.sock here); a socket asked for (option or $TPIPD_SOCKET) is never fallen
 * back from; when nothing answers, the error names every path tried and why. tpipctl looks for
 * the daemon the same way (falling back from a missing per-user socket). The user cases
 * need root to drop to uid 65534 and print why they skip otherwise.
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

static Suite *discovery_suite(void)
{
	Suite *s = suite_create("discovery");
	TCase *tc = tcase_create("socket");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_user_without_own_socket_finds_the_system_one);
	tcase_add_test(tc, test_user_without_xdg_runtime_dir_finds_the_system_socket);
	tcase_add_test(tc, test_user_socket_is_preferred_to_the_system_one);
	tcase_add_test(tc, test_no_socket_error_names_every_path_tried);
	tcase_add_test(tc, test_tpipd_socket_is_not_fallen_back_from);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(discovery_suite());
}
