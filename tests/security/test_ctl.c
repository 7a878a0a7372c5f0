/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: what one user can put in front of the people who read the daemon's log and
 * run tpipctl. A process of uid 65534 chooses its command name, its context name and a group
 * name, with newlines, a syslog priority prefix, terminal escape sequences, a C1 control (U+009B,
 * CSI) and bytes that are not UTF-8 in them. The daemon's log keeps one line per message (no
 * line of the client's making, at a priority of its choosing) and no escape byte; root's
 * `tpipctl groups` and `tpipctl sessions` tables carry no control character, and their JSON is
 * UTF-8 that parses and gives the names back (a byte that is not UTF-8 as '?'). And what a
 * user may not reach through tpipctl: uid 65534 sees none of uid 4242's session, channel, queue
 * or their names and uid in any view, table or JSON, and its close-session of the victim's
 * session and its drain are refused (exit status 3, logged with its kernel uid) and change
 * nothing, while root sees the victim's objects. Needs root (to run the clients as other
 * users); skipped otherwise.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS TPT_SCALED_MS(20000)
#define NOBODY 65534

/* A context name and a group name that each try to start a log line of their own (the group
 * name also with U+0085, NEL, a line break to some readers). */
#define CTX_FORGE "h\n<0>tpipd: forged by a context name"
#define GROUP_FORGE "g\xc2\x85\n<0>tpipd: forged by a group name"
/* Names for an admin's terminal: OSC title + BEL, clear screen, CSI as C1 (U+009B), not UTF-8,
 * right-to-left override (U+202E). */
#define GROUP_ESC "g\x1b]2;owned\x07\x1b[2J\xc2\x9b" "31m"
#define CTX_ESC "n\xc2\x9b" "2J\xff\x1b[31m\xe2\x80\xae" "x"
#define COMM_ESC "c\x1b[2J\xff"

static struct tpt_daemon d;
static struct tpt_sync ready, done;

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

	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
	if (geteuid() != 0)
		return;
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
}

static void teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&done);
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

/* Runs tpipctl as root, [--json] @cmd; returns owned stdout, NULL (printed) on failure. */
static char *ctl(const char *cmd, bool json)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d.socket, json ? "--json" : cmd,
			       json ? cmd : NULL, NULL };
	struct tpt_cmd_result res;
	char *out;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return NULL;
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0) {
		fprintf(stderr, "tpipctl %s: %s\n", cmd, res.err);
		tpt_cmd_result_free(&res);
		return NULL;
	}
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

/* The first byte of @s a terminal could take for a control, or a byte that is not UTF-8
 * (checked for C0, DEL, C1, U+202E and the lone 0xff this file sends); NULL. */
static const char *control_in(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if ((*p < 0x20 && *p != '\n') || *p == 0x7f || *p == 0xff)
			return (const char *)p;
		if ((p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0) ||
		    (p[0] == 0xe2 && p[1] == 0x80 && p[2] == 0xae))
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

/* ---- tpipctl, as root ----------------------------------------------------------------------- */

/* As NOBODY: joins GROUP_ESC of 2 alone and waits in it until killed. */
static int group_waiter(void *arg)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 2,
				      .join_timeout_ms = 3 * T_MS };
	struct tp_context *ctx;
	struct tp_group *g;

	(void)arg;
	if (ctx_as_nobody("waiter", NULL, &ctx) < 0)
		return 1;
	tpt_sync_post(&ready, 0);
	tp_group_join(ctx, GROUP_ESC, &o, &g); /* until killed */
	return 1;
}

/* The "name" of the one object in array @key of JSON @out whose "uid" is NOBODY; owned. */
static char *json_name_of_nobody(const char *out, const char *key)
{
	struct json_object *o = json_tokener_parse(out), *arr, *v;
	char *name = NULL;

	ck_assert_msg(o, "not JSON: %s", out);
	ck_assert(json_object_object_get_ex(o, key, &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *e = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(e, "uid", &v) && json_object_get_int64(v) == NOBODY &&
		    json_object_object_get_ex(e, "name", &v))
			name = strdup(json_object_get_string(v));
	}
	json_object_put(o);
	return name;
}

START_TEST(test_ctl_group_name_reaches_root_tpipctl_without_controls)
{
	char *out = NULL, *name = NULL;
	uint64_t end;
	pid_t w;

	if (!is_root())
		return;
	w = tpt_fork(group_waiter, NULL);
	ck_assert_int_gt(w, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	end = tpt_now_ms() + (uint64_t)T_MS;
	for (unsigned i = 0; !name && tpt_now_ms() < end; i++) {
		free(out);
		out = ctl("groups", true);
		ck_assert(out);
		name = json_name_of_nobody(out, "groups");
		if (!name)
			tpt_backoff(i);
	}
	ck_assert_msg(name, "no group of uid %d: %s", NOBODY, out);
	/* JSON escapes what it must: the name comes back exactly (it is UTF-8) */
	ck_assert_str_eq(name, GROUP_ESC);
	ck_assert_msg(!strstr(out, "\x1b") && !strstr(out, "\x07"), "raw controls: %s", out);
	free(name);
	free(out);
	out = ctl("groups", false);
	ck_assert(out);
	ck_assert_msg(!control_in(out), "tpipctl groups prints a control: %s", out);
	ck_assert_msg(strstr(out, "'g?]2;owned??[2J?31m'"), "%s", out);
	free(out);
	kill(w, SIGKILL);
	tpt_wait(w, T_MS, NULL);
}
END_TEST

/* As NOBODY, command COMM_ESC: a context named CTX_ESC, kept until told. */
static int session_holder(void *arg)
{
	struct tp_context *ctx;

	(void)arg;
	if (ctx_as_nobody(COMM_ESC, CTX_ESC, &ctx) < 0) {
		tpt_sync_post(&ready, -1);
		return 1;
	}
	tpt_sync_post(&ready, 0);
	tpt_sync_wait(&done, T_MS);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ctl_session_names_reach_root_tpipctl_without_controls)
{
	char *out, *name;
	pid_t h;

	if (!is_root())
		return;
	h = tpt_fork(session_holder, NULL);
	ck_assert_int_gt(h, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	out = ctl("sessions", false);
	ck_assert(out);
	ck_assert_msg(strstr(out, "c?[2J?"), "no command of uid %d: %s", NOBODY, out);
	ck_assert_msg(!control_in(out), "tpipctl sessions prints a control: %s", out);
	ck_assert_msg(strstr(out, "n?2J??[31m?x"), "%s", out);
	free(out);
	/* JSON: UTF-8 throughout; the C1 control and the bidi override are kept as characters of
	 * the name but written as \u escapes (json-c escapes C0 only), the byte that is not UTF-8
	 * is '?' */
	out = ctl("sessions", true);
	ck_assert(out);
	ck_assert_msg(!strchr(out, '\xff') && !strstr(out, "\x1b"), "%s", out);
	ck_assert_msg(!strstr(out, "\xc2\x9b") && !strstr(out, "\xe2\x80\xae") &&
		      strstr(out, "\\u009b") && strstr(out, "\\u202e"),
		      "tpipctl --json prints a C1 control or a bidi override raw: %s", out);
	name = json_name_of_nobody(out, "sessions");
	ck_assert_msg(name, "no session of uid %d: %s", NOBODY, out);
	ck_assert_str_eq(name, "n\xc2\x9b" "2J?\x1b[31m\xe2\x80\xae" "x");
	free(name);
	free(out);
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(h, T_MS, "uid 65534's client"));
}
END_TEST

/* ---- another user's objects and the admin requests ----------------------------------------- */

#define VICTIM 4242
#define SECRET "victim-secret"

/* As VICTIM: a session, a channel anyone may open and a work queue, kept until told. */
static int victim(void *arg)
{
	struct tp_chan_options co = { .size = sizeof(co), .flags = TP_CHAN_CREATE,
				      .access = TP_ACCESS_ANYONE, .owner_uid = -1 };
	struct tp_wq_options wo = { .size = sizeof(wo), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = NULL;
	struct tp_chan *ch = NULL;
	struct tp_wq *q = NULL;
	int r = tpt_become(VICTIM);

	if (r == 0)
		r = tpt_ctx_new(&d, 0, SECRET "-context", &ctx);
	if (r == 0)
		r = tp_chan_open(ctx, SECRET "-chan", &co, &ch);
	if (r == 0)
		r = tp_wq_open(ctx, SECRET "-queue", &wo, &q);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "set-up: %d %s", r, tp_last_error());
	tpt_sync_wait(&done, T_MS);
	tp_wq_release(q);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* Runs tpipctl @a1 [@a2] as NOBODY; *@ret_status: its exit status. Return: 0 or 1 (printed). */
static int nobody_ctl(const char *a1, const char *a2, int *ret_status)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d.socket, a1, a2, NULL };
	struct tpt_cmd_result res;

	TPT_REQUIRE(bin && tpt_run(argv, T_MS, &res) == 0, 1, "tpipctl %s", a1);
	*ret_status = WIFEXITED(res.status) ? WEXITSTATUS(res.status) : -1;
	TPT_REQUIRE(!strstr(res.out, SECRET) && !strstr(res.err, SECRET) &&
		    !strstr(res.out, "\"uid\": 4242") && !strstr(res.out, "\"uid\":4242"), 1,
		    "tpipctl %s %s as nobody shows the victim: %s", a1, a2 ? a2 : "", res.out);
	tpt_cmd_result_free(&res);
	return 0;
}

/* As NOBODY: no view shows the victim; close-session of the victim's session and drain are
 * refused with exit status 3. */
static int nosy(void *arg)
{
	static const char *const cmds[] = { "sessions", "pipes",  "listeners", "channels",
					    "queues",	"groups", "status",    "stats" };
	const char *victim_id = arg;
	int st;

	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "become");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		if (nobody_ctl(cmds[i], NULL, &st) || nobody_ctl("--json", cmds[i], &st))
			return 1;
		TPT_REQUIRE(st == 0, 1, "tpipctl %s as nobody: exit %d", cmds[i], st);
	}
	if (nobody_ctl("close-session", victim_id, &st))
		return 1;
	TPT_REQUIRE(st == 3, 1, "close-session as nobody: exit %d", st);
	if (nobody_ctl("drain", NULL, &st))
		return 1;
	TPT_REQUIRE(st == 3, 1, "drain as nobody: exit %d", st);
	return 0;
}

/* The id of the session named @name in root's `tpipctl --json sessions`, into @buf. */
static bool session_id_of(const char *name, char *buf, size_t len)
{
	char *out = ctl("sessions", true);
	struct json_object *o = out ? json_tokener_parse(out) : NULL, *arr, *v;
	bool found = false;

	for (size_t i = 0; o && json_object_object_get_ex(o, "sessions", &arr) &&
			   i < json_object_array_length(arr); i++) {
		struct json_object *e = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(e, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0 &&
		    json_object_object_get_ex(e, "id", &v)) {
			snprintf(buf, len, "%" PRId64, json_object_get_int64(v));
			found = true;
		}
	}
	json_object_put(o);
	free(out);
	return found;
}

START_TEST(test_ctl_other_users_see_and_close_nothing_of_a_victim)
{
	char id[32], *out;
	pid_t v;

	if (!is_root())
		return;
	v = tpt_fork(victim, NULL);
	ck_assert_int_gt(v, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert(session_id_of(SECRET "-context", id, sizeof(id)));
	ck_assert(tpt_wait_ok(tpt_fork(nosy, id), T_MS, "uid 65534's tpipctl"));
	/* refused, logged with the caller's kernel uid, and nothing happened */
	ck_assert(tpt_daemon_log_has(&d, "admin request 7 refused for uid 65534"));
	ck_assert(tpt_daemon_log_has(&d, "admin request 8 refused for uid 65534"));
	ck_assert(session_id_of(SECRET "-context", id, sizeof(id)));
	/* root sees them */
	out = ctl("channels", false);
	ck_assert_msg(out && strstr(out, SECRET "-chan"), "%s", out);
	free(out);
	out = ctl("queues", false);
	ck_assert_msg(out && strstr(out, SECRET "-queue"), "%s", out);
	free(out);
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(v, T_MS, "victim"));
}
END_TEST

static Suite *ctl_suite(void)
{
	Suite *s = suite_create("ctl");
	TCase *tc = tcase_create("ctl");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_ctl_client_names_cannot_forge_log_lines);
	tcase_add_test(tc, test_ctl_group_name_reaches_root_tpipctl_without_controls);
	tcase_add_test(tc, test_ctl_session_names_reach_root_tpipctl_without_controls);
	tcase_add_test(tc, test_ctl_other_users_see_and_close_nothing_of_a_victim);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(ctl_suite());
}
