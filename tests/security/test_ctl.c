/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: what one user can put in front of the people who read the daemon's log. A
 * process of uid 65534 chooses its command name, its context name and a group name, with
 * newlines, a syslog priority prefix and terminal escape sequences in them. The daemon's log
 * keeps one line per message (no line of the client's making, at a priority of its choosing)
 * and no escape byte. Needs root (to run the client as another user); skipped otherwise.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS TPT_SCALED_MS(20000)
#define NOBODY 65534

/* A context name and a group name that each try to start a log line of their own. */
#define CTX_FORGE "h\n<0>tpipd: forged by a context name"
#define GROUP_FORGE "g\n<0>tpipd: forged by a group name"
#define COMM_ESC "c\x1b[2J"

static struct tpt_daemon d;

static bool is_root(void)
{
	if (geteuid() == 0)
		return true;
	printf("skipped: needs root to run clients as uid %d\n", NOBODY);
	return false;
}

static void setup(void)
{
	static const char *const args[] = { "--log-level", "debug", NULL };

	if (geteuid() != 0)
		return;
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
}

static void teardown(void)
{
	if (geteuid() == 0)
		ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}

/* As NOBODY, command name @comm: a context named @name. */
static int ctx_as_nobody(const char *comm, const char *name, struct tp_context **ret)
{
	int r = tpt_become(NOBODY);

	TPT_REQUIRE(r == 0, r, "become %d: %d", NOBODY, r);
	TPT_REQUIRE(prctl(PR_SET_NAME, comm) == 0, -errno, "PR_SET_NAME");
	r = tpt_ctx_new(&d, 0, name, ret);
	TPT_REQUIRE(r == 0, r, "context: %d %s", r, tp_last_error());
	return 0;
}

/* The first byte of @s a terminal could take for a control, or a byte that is not UTF-8
 * (checked only for the C1 form U+0080..U+009F and the lone 0xff this file sends); NULL. */
static const char *control_in(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if ((*p < 0x20 && *p != '\n') || *p == 0x7f || *p == 0xff)
			return (const char *)p;
		if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0)
			return (const char *)p;
	}
	return NULL;
}

/* ---- the log -------------------------------------------------------------------------------- */

static int forger(void *arg)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;
	int r;

	(void)arg;
	if (ctx_as_nobody(COMM_ESC, CTX_FORGE, &ctx) < 0)
		return 1;
	r = tp_group_join(ctx, GROUP_FORGE, &o, &g);
	TPT_REQUIRE(r == 0, 1, "group join: %d %s", r, tp_last_error());
	tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}

/* Every line of the log: the daemon's "<N>" prefix, and not one a client wrote; no escape. */
static void check_log_lines(void)
{
	FILE *f = fopen(d.log, "r");
	char line[2048];
	unsigned n = 0;

	ck_assert_msg(f, "%s: %s", d.log, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		n++;
		ck_assert_msg(line[0] == '<' && line[1] >= '0' && line[1] <= '7' && line[2] == '>',
			      "log line %u not the daemon's: %s", n, line);
		ck_assert_msg(strncmp(line + 3, "tpipd: forged", 13) != 0,
			      "log line %u written by a client: %s", n, line);
		ck_assert_msg(!control_in(line), "log line %u holds a control byte: %s", n, line);
	}
	fclose(f);
	ck_assert_uint_gt(n, 0);
}

START_TEST(test_ctl_client_names_cannot_forge_log_lines)
{
	if (!is_root())
		return;
	ck_assert(tpt_wait_ok(tpt_fork(forger, NULL), T_MS, "uid 65534's client"));
	/* the daemon logged both names (the context's at debug level), each inside its line */
	ck_assert_int_eq(tpt_daemon_wait_log(&d, "members joined", T_MS, NULL, 0), 0);
	ck_assert(tpt_daemon_log_has(&d, "forged by a group name"));
	ck_assert(tpt_daemon_log_has(&d, "forged by a context name"));
	check_log_lines();
}
END_TEST

static Suite *ctl_suite(void)
{
	Suite *s = suite_create("ctl");
	TCase *tc = tcase_create("ctl");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_ctl_client_names_cannot_forge_log_lines);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(ctl_suite());
}
