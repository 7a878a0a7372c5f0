/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: tpipctl against a live daemon holding one listener and one open pipe
 * between two client processes. `status`, `sessions`, `pipes` and `listeners` each succeed as a
 * table (which names the client pids) and with --json (which parses with json-c and has the
 * expected counts, pids and names); an unreachable daemon gives exit status 2.
 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define LISTENER "ctl-test"

static struct tpt_sync to_a, to_b, to_parent, release;
static pid_t listener_pid, connector_pid;

static int ctl_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "ctl-listener", &ctx);

	if (r == 0)
		r = tp_listen(ctx, LISTENER, NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, T_MS);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int ctl_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "ctl-connector", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, LISTENER, &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, T_MS);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
	ck_assert_int_eq(tpt_sync_init(&release), 0);
	listener_pid = tpt_fork(ctl_listener, NULL);
	connector_pid = tpt_fork(ctl_connector, NULL);
	ck_assert_int_gt(listener_pid, 0);
	ck_assert_int_gt(connector_pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
}

static void teardown(void)
{
	tpt_sync_post(&release, 0);
	tpt_sync_post(&release, 0);
	ck_assert(tpt_wait_ok(listener_pid, T_MS, "listener"));
	ck_assert(tpt_wait_ok(connector_pid, T_MS, "connector"));
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_sync_done(&to_parent);
	tpt_sync_done(&release);
	tpt_fixture_stop();
}

/* Runs tpipctl --socket S [--json] @cmd; checks exit status @want; returns owned stdout. */
static char *ctl(const char *cmd, bool json, int want)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[6] = { bin, "--socket", tpt_fixture_daemon.socket, cmd, NULL, NULL };
	struct tpt_cmd_result res;
	char *out;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	if (json) {
		argv[3] = "--json";
		argv[4] = cmd;
	}
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != want)
		fprintf(stderr, "tpipctl %s%s: stdout:\n%s\nstderr:\n%s\n", json ? "--json " : "",
			cmd, res.out, res.err);
	ck_assert_msg(WIFEXITED(res.status), "tpipctl %s did not exit", cmd);
	ck_assert_int_eq(WEXITSTATUS(res.status), want);
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

/* True if @text contains @n as a whole number. */
static bool has_number(const char *text, long n)
{
	char want[32];
	size_t len = (size_t)snprintf(want, sizeof(want), "%ld", n);

	for (const char *p = strstr(text, want); p; p = strstr(p + 1, want)) {
		bool left = p == text || p[-1] < '0' || p[-1] > '9';
		bool right = p[len] < '0' || p[len] > '9';
		if (left && right)
			return true;
	}
	return false;
}

static struct json_object *parse(const char *text)
{
	struct json_object *o = json_tokener_parse(text);

	ck_assert_msg(o != NULL, "not JSON:\n%s", text);
	return o;
}

static int64_t get_int(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no '%s' in %s", key,
		      json_object_to_json_string(o));
	return json_object_get_int64(v);
}

static const char *get_str(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no '%s' in %s", key,
		      json_object_to_json_string(o));
	return json_object_get_string(v);
}

static struct json_object *get_array(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v) &&
			      json_object_is_type(v, json_type_array),
		      "no array '%s' in %s", key, json_object_to_json_string(o));
	return v;
}

START_TEST(test_tpipctl_status_shows_counts)
{
	char *table = ctl("status", false, 0);
	char *text = ctl("status", true, 0);
	struct json_object *o = parse(text);

	ck_assert_msg(has_number(table, tpt_fixture_daemon.pid), "status table lacks the pid:\n%s",
		      table);
	ck_assert_int_eq(get_int(o, "pid"), tpt_fixture_daemon.pid);
	ck_assert_int_eq(get_int(o, "pipes"), 1);
	ck_assert_int_eq(get_int(o, "listeners"), 1);
	/* the two clients, and maybe tpipctl's own control session */
	ck_assert_int_ge(get_int(o, "sessions"), 2);
	ck_assert_int_le(get_int(o, "sessions"), 3);
	ck_assert_str_eq(get_str(o, "socket_path"), tpt_fixture_daemon.socket);
	json_object_put(o);
	free(text);
	free(table);
}
END_TEST

START_TEST(test_tpipctl_sessions_lists_both_clients)
{
	char *table = ctl("sessions", false, 0);
	char *text = ctl("sessions", true, 0);
	struct json_object *o = parse(text), *arr = get_array(o, "sessions");
	int clients = 0, seen_l = 0, seen_c = 0;

	ck_assert_msg(has_number(table, listener_pid) && has_number(table, connector_pid),
		      "sessions table lacks the client pids %d, %d:\n%s", listener_pid,
		      connector_pid, table);
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *s = json_object_array_get_idx(arr, i);
		pid_t pid = (pid_t)get_int(s, "pid");

		if (strcmp(get_str(s, "role"), "client") != 0)
			continue;
		clients++;
		if (pid == listener_pid) {
			seen_l++;
			ck_assert_str_eq(get_str(s, "name"), "ctl-listener");
			ck_assert_int_eq(get_int(s, "listeners"), 1);
			ck_assert_int_eq(get_int(s, "pipes"), 1);
		} else if (pid == connector_pid) {
			seen_c++;
			ck_assert_str_eq(get_str(s, "name"), "ctl-connector");
			ck_assert_int_eq(get_int(s, "pipes"), 1);
		}
		ck_assert_int_eq(get_int(s, "uid"), (int64_t)getuid());
	}
	ck_assert_int_eq(clients, 2);
	ck_assert_int_eq(seen_l, 1);
	ck_assert_int_eq(seen_c, 1);
	json_object_put(o);
	free(text);
	free(table);
}
END_TEST

START_TEST(test_tpipctl_pipes_lists_the_open_pipe)
{
	char *table = ctl("pipes", false, 0);
	char *text = ctl("pipes", true, 0);
	struct json_object *o = parse(text), *arr = get_array(o, "pipes"), *p, *end;

	ck_assert_msg(has_number(table, listener_pid) && has_number(table, connector_pid),
		      "pipes table lacks the pids %d, %d:\n%s", listener_pid, connector_pid,
		      table);
	ck_assert_msg(strstr(table, LISTENER), "pipes table lacks the listener name:\n%s", table);
	ck_assert_int_eq(json_object_array_length(arr), 1);
	p = json_object_array_get_idx(arr, 0);
	ck_assert_str_eq(get_str(p, "listener"), LISTENER);
	ck_assert_str_eq(get_str(p, "state"), "open");
	/* No message moved yet: no channel, an empty array (never a string). */
	ck_assert(json_object_object_get_ex(p, "channels", &end));
	ck_assert(json_object_is_type(end, json_type_array));
	ck_assert_int_eq(json_object_array_length(end), 0);
	ck_assert(json_object_object_get_ex(p, "connector", &end));
	ck_assert_int_eq(get_int(end, "pid"), connector_pid);
	ck_assert(json_object_object_get_ex(p, "acceptor", &end));
	ck_assert_int_eq(get_int(end, "pid"), listener_pid);
	json_object_put(o);
	free(text);
	free(table);
}
END_TEST

START_TEST(test_tpipctl_listeners_lists_the_listener)
{
	char *table = ctl("listeners", false, 0);
	char *text = ctl("listeners", true, 0);
	struct json_object *o = parse(text), *arr = get_array(o, "listeners"), *l;

	ck_assert_msg(has_number(table, listener_pid) && strstr(table, LISTENER),
		      "listeners table lacks pid %d or the name:\n%s", listener_pid, table);
	ck_assert_int_eq(json_object_array_length(arr), 1);
	l = json_object_array_get_idx(arr, 0);
	ck_assert_str_eq(get_str(l, "name"), LISTENER);
	ck_assert_int_eq(get_int(l, "pid"), listener_pid);
	ck_assert_str_eq(get_str(l, "access"), "owner");
	ck_assert_int_eq(get_int(l, "accepted"), 1);
	json_object_put(o);
	free(text);
	free(table);
}
END_TEST

START_TEST(test_tpipctl_unreachable_daemon_exits_2)
{
	const char *bin = getenv("TPIPCTL_BIN");
	char path[160];
	const char *argv[] = { bin, "--socket", path, "status", NULL };
	struct tpt_cmd_result res;

	snprintf(path, sizeof(path), "%s/absent.sock", tpt_fixture_daemon.dir);
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert(WIFEXITED(res.status));
	ck_assert_int_eq(WEXITSTATUS(res.status), 2);
	ck_assert_msg(res.err[0] != '\0', "no message on stderr");
	tpt_cmd_result_free(&res);
}
END_TEST

static Suite *tpipctl_suite(void)
{
	Suite *s = suite_create("tpipctl");
	TCase *tc = tcase_create("tpipctl");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_tpipctl_status_shows_counts);
	tcase_add_test(tc, test_tpipctl_sessions_lists_both_clients);
	tcase_add_test(tc, test_tpipctl_pipes_lists_the_open_pipe);
	tcase_add_test(tc, test_tpipctl_listeners_lists_the_listener);
	tcase_add_test(tc, test_tpipctl_unreachable_daemon_exits_2);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(tpipctl_suite());
}
