/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: error texts say what happened. tp_last_error() holds a daemon message
 * longer than 256 bytes whole; tp_strerror(-ECONNREFUSED) is true for a daemon socket and a
 * peer port alike while tp_last_error() names which; a session closed by tpipctl close-session
 * reads as closed by an administrator (-ECONNABORTED) to its client and to the other end of its
 * pipes; a clean tp_context_free() is logged as a clean close, not as a dead peer; limit
 * errors name the option that sets the limit; TPIPD_LOG sends the library's log to stderr, and
 * the library is silent without it; the daemon says, at debug level and in `tpipctl pipes -v`,
 * which channel serves a pipe and why the channels before it could not (cma with pipe rings
 * off, the pipe ring by default).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NAME_MAX_BYTES 255 /* listener names, libtpclient(3) */

static struct tpt_sync to_parent, to_child;

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
	ck_assert_int_eq(tpt_sync_init(&to_child), 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_parent);
	tpt_sync_done(&to_child);
	tpt_fixture_stop();
}

/* Runs tpipctl --socket S ARGS... and returns its stdout (owned); fails the test on an error. */
static char *ctl(const char *a1, const char *a2, const char *a3)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", tpt_fixture_daemon.socket, a1, a2, a3, NULL };
	struct tpt_cmd_result res;
	char *out;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0,
		      "tpipctl %s %s: %s", a1, a2 ? a2 : "", res.err);
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

/* The id of the session named @name in `tpipctl --json sessions`. */
static unsigned long long session_id(const char *name)
{
	char *out = ctl("--json", "sessions", NULL);
	json_object *root = json_tokener_parse(out), *arr, *o, *v;
	unsigned long long id = 0;

	ck_assert_msg(root && json_object_object_get_ex(root, "sessions", &arr), "%s", out);
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		o = json_object_array_get_idx(arr, i);
		if (json_object_object_get_ex(o, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0 &&
		    json_object_object_get_ex(o, "id", &v))
			id = (unsigned long long)json_object_get_int64(v);
	}
	json_object_put(root);
	ck_assert_msg(id, "no session named %s: %s", name, out);
	free(out);
	return id;
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

/* Two contexts joined by a pipe; the parent closes the "victim" session as an administrator. */
static int admin_closed(void *arg)
{
	struct tp_context *v, *sv;
	struct tp_listener *l;
	struct tp_pipe *pv, *ps;
	struct tp_descriptor *d = NULL;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "victim", &v);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "survivor", &sv);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_listen(sv, "admin-close", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_connect(v, "admin-close", &pv);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &ps);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	r = tp_pipe_wait_connected(pv, T_MS);
	TPT_REQUIRE(r == 0, 1, "connected: %d", r);
	tpt_sync_post(&to_parent, 0);
	/* The victim learns why its session ended. */
	r = tp_pipe_read_descriptor_sync(pv, T_MS, &d);
	tpt_log("victim: %d (%s): %s", r, tp_strerror(r), tp_last_error());
	TPT_REQUIRE(r == -ECONNABORTED, 1, "victim: %d (%s), want -ECONNABORTED", r,
		    tp_strerror(r));
	TPT_REQUIRE(strstr(tp_strerror(r), "administrator"), 1, "tp_strerror: %s",
		    tp_strerror(r));
	TPT_REQUIRE(strstr(tp_last_error(), "closed by an administrator"), 1, "victim: '%s'",
		    tp_last_error());
	/* So does the other end of its pipe. */
	r = tp_pipe_read_descriptor_sync(ps, T_MS, &d);
	tpt_log("survivor: %d (%s): %s", r, tp_strerror(r), tp_last_error());
	TPT_REQUIRE(r == -ECONNABORTED, 1, "survivor: %d (%s), want -ECONNABORTED", r,
		    tp_strerror(r));
	TPT_REQUIRE(strstr(tp_last_error(), "closed by an administrator"), 1, "survivor: '%s'",
		    tp_last_error());
	tp_pipe_close(pv);
	tp_pipe_close(ps);
	tp_listener_close(l);
	tp_context_free(v);
	tp_context_free(sv);
	return 0;
}

START_TEST(test_errors_admin_close_says_so)
{
	pid_t pid = tpt_fork(admin_closed, NULL);
	char id[32];

	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	snprintf(id, sizeof(id), "%llu", session_id("victim"));
	free(ctl("close-session", id, NULL));
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
}
END_TEST

/* Pipes left open, a listener, a message unread: tp_context_free() is still a clean close. */
static int clean_close(void *arg)
{
	struct tp_context *a, *b;
	struct tp_listener *l;
	struct tp_pipe *pa, *pb;
	uint8_t byte = 7;
	struct tp_message m = { .n_payloads = 1, .payloads = &(struct tp_payload){ .data = &byte, .length = 1 } };
	int r = tpt_ctx_new(&tpt_fixture_daemon, (uint32_t)(uintptr_t)arg, "clean-a", &a);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tpt_ctx_new(&tpt_fixture_daemon, (uint32_t)(uintptr_t)arg, "clean-b", &b);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_listen(a, "clean-close", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_connect(b, "clean-close", &pb);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &pa);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	r = tp_pipe_wait_connected(pb, T_MS);
	TPT_REQUIRE(r == 0, 1, "connected: %d", r);
	r = tp_pipe_write_sync(pb, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d", r);
	tp_pipe_close(pb);
	tp_context_free(b);
	tp_context_free(a); /* its pipe, listener and the unread message still open */
	return 0;
}

/* Lines of the fixture daemon's log about sessions of process @pid that contain @needle. */
static int log_count(pid_t pid, const char *needle)
{
	FILE *f = fopen(tpt_fixture_daemon.log, "r");
	char line[2048], who[32];
	int n = 0;

	ck_assert_ptr_nonnull(f);
	snprintf(who, sizeof(who), "(pid %d,", (int)pid);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, who) && strstr(line, needle);
	fclose(f);
	return n;
}

/* _i: 0 on the control ring, 1 on the socket. */
START_TEST(test_errors_clean_close_is_logged_clean)
{
	pid_t pid = tpt_fork(clean_close, (void *)(uintptr_t)(_i ? TP_CONTEXT_NO_RING : 0));

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
	/* Both sessions end; the log is polled (the daemon writes it after the client exits). */
	for (int t = 0; log_count(pid, ", closing") < 2 && t < T_MS; t += 10)
		usleep(10000);
	ck_assert_int_eq(log_count(pid, "client closed its context, closing"), 2);
	ck_assert_int_eq(log_count(pid, "client disconnected"), 0);
	ck_assert_int_eq(log_count(pid, "peer-died"), 0);
	ck_assert_int_eq(log_count(pid, "send failed"), 0);
}
END_TEST

/* ---- TPIPD_LOG -------------------------------------------------------------------------- */

/* With stderr sent to @arg's file: a failed connect, a pipe that connects, the context freed. */
static int log_client(void *arg)
{
	const char *path = arg;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p, *q, *bad;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), r;

	TPT_REQUIRE(fd >= 0 && dup2(fd, STDERR_FILENO) == STDERR_FILENO, 1, "stderr");
	close(fd);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "log-client", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "no-such-listener", &bad);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	TPT_REQUIRE(tp_pipe_wait_connected(bad, T_MS) == -ENOENT, 1, "not -ENOENT");
	tp_pipe_close(bad);
	r = tp_listen(ctx, "log-listener", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_connect(ctx, "log-listener", &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &q);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(tp_pipe_wait_connected(p, T_MS) == 0, 1, "connected");
	tp_pipe_close(p);
	tp_pipe_close(q);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* Runs log_client with TPIPD_LOG=@level (NULL: unset); returns what it wrote to stderr. */
static char *log_run(const char *level)
{
	char path[160], *buf = calloc(1, 65536);
	FILE *f;
	pid_t pid;

	snprintf(path, sizeof(path), "%s/client-%s.err", tpt_fixture_daemon.dir,
		 level ? level : "unset");
	if (level)
		setenv("TPIPD_LOG", level, 1);
	else
		unsetenv("TPIPD_LOG");
	pid = tpt_fork(log_client, path);
	unsetenv("TPIPD_LOG");
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(buf);
	(void)!fread(buf, 1, 65535, f);
	fclose(f);
	tpt_log("TPIPD_LOG=%s:\n%s", level ? level : "(unset)", buf);
	return buf;
}

START_TEST(test_errors_tpipd_log_sends_the_library_log_to_stderr)
{
	char *out = log_run("debug");

	ck_assert_msg(strncmp(out, "tpclient[", 9) == 0, "no 'tpclient[pid]: ' prefix");
	ck_assert_msg(strstr(out, "]: log-client: debug: pipe ") &&
		      strstr(out, "connected to 'log-listener'"), "no debug line for the pipe");
	ck_assert_msg(strstr(out, ": info: pipe ") && strstr(out, "no listener named"),
		      "no info line for the failed connect");
	free(out);
	/* info: the failed connect, not the debug lines */
	out = log_run("info");
	ck_assert_msg(strstr(out, "no listener named"), "info lost at TPIPD_LOG=info");
	ck_assert_msg(!strstr(out, ": debug: "), "debug lines at TPIPD_LOG=info");
	free(out);
	/* warn: nothing here is a warning */
	out = log_run("warn");
	ck_assert_str_eq(out, "");
	free(out);
}
END_TEST

START_TEST(test_errors_library_is_silent_without_tpipd_log)
{
	char *out = log_run(NULL);

	ck_assert_str_eq(out, "");
	free(out);
}
END_TEST

/* ---- channel choice ------------------------------------------------------------------------ */

/* A pipe moves one 1 MiB payload from private memory to private memory (process>process), and
 * one small eager message; it stays open until the parent has looked. */
static int channel_pair(void *arg)
{
	struct tp_context *a, *b;
	struct tp_listener *l;
	struct tp_pipe *pa, *pb;
	struct tp_descriptor *d = NULL;
	size_t len = 1u << 20;
	uint8_t *src = calloc(1, len), *dst = calloc(1, len), small = 1;
	struct tp_payload pl = { .data = src, .length = len };
	struct tp_payload ps = { .data = &small, .length = 1 };
	struct tp_message big = { .payloads = &pl, .n_payloads = 1 };
	struct tp_message eager = { .payloads = &ps, .n_payloads = 1 };
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
	struct tp_allocation alloc = { .payloads = &slot, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg da[2] = { { .done = &done, .index = 0 }, { .done = &done, .index = 1 } };
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "chan-a", &a);

	TPT_REQUIRE(r == 0 && src && dst, 1, "context: %d", r);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "chan-b", &b);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_listen(a, "channels", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_connect(b, "channels", &pb);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &pa);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	tpt_done_init(&done);
	for (int i = 0; i < 2; i++) {
		/* A rendezvous write completes once read: write, then read. */
		r = tp_pipe_write(pb, i ? &eager : &big, tpt_done_cb, &da[i]);
		TPT_REQUIRE(r == 0, 1, "write %d: %d %s", i, r, tp_last_error());
		r = tp_pipe_read_descriptor_sync(pa, T_MS, &d);
		TPT_REQUIRE(r == 0, 1, "descriptor %d: %d", i, r);
		slot.data = i ? (void *)&small : (void *)dst;
		r = tp_pipe_read_sync(pa, d, &alloc);
		TPT_REQUIRE(r == 0, 1, "read %d: %d %s", i, r, tp_last_error());
		r = tpt_done_wait(&done, (unsigned)i + 1, T_MS);
		TPT_REQUIRE(r == 0 && done.last_status == 0, 1, "write %d done: %d", i,
			    done.last_status);
	}
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&to_child, T_MS);
	tp_pipe_close(pa);
	tp_pipe_close(pb);
	tp_listener_close(l);
	tp_context_free(a);
	tp_context_free(b);
	free(src);
	free(dst);
	return 0;
}

/* --json pipes: "channels" is an array of names, as a backend's "caps" is: here @big (the 1 MiB
 * message: "cma", or "ring" with pipe rings on) and basic (the eager one), each its own string;
 * @other ("ring", or "cma") is not among them. */
static void expect_channels_array(const char *out, const char *big, const char *other)
{
	struct json_object *o = json_tokener_parse(out), *arr, *p, *ch;
	bool cma = false, basic = false, wrong = false;

	ck_assert_msg(o && json_object_object_get_ex(o, "pipes", &arr) &&
			      json_object_array_length(arr) == 1,
		      "pipes --json: %s", out);
	p = json_object_array_get_idx(arr, 0);
	ck_assert_msg(json_object_object_get_ex(p, "channels", &ch) &&
			      json_object_is_type(ch, json_type_array),
		      "channels is not an array: %s", out);
	for (size_t i = 0; i < json_object_array_length(ch); i++) {
		const char *n = json_object_get_string(json_object_array_get_idx(ch, i));

		ck_assert_msg(n && !strchr(n, ','), "channel name \"%s\": %s", n ? n : "", out);
		cma |= strcmp(n, big) == 0;
		wrong |= strcmp(n, other) == 0;
		basic |= strcmp(n, "basic") == 0;
	}
	ck_assert_msg(cma && basic, "channels lack %s or basic: %s", big, out);
	ck_assert_msg(!wrong, "channels name %s: %s", other, out);
	json_object_put(o);
}

/* With pipe rings off (they are on by default): the registry's choice, cma. */
START_TEST(test_errors_channel_choice_is_logged_and_shown)
{
	static const char *const args[] = { "--log-level", "debug", "--pipe-ring", "no", NULL };
	static const char reason[] = "process>process: cma: first viable for process>process memory "
				     "in priority order; passed over: shm: ";
	char *out;
	pid_t pid;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	pid = tpt_fork(channel_pair, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	/* The daemon's log, at debug level. */
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "channel cma for process>process: "
					     "first viable", T_MS, NULL, 0), 0);
	ck_assert(tpt_daemon_log_has(&tpt_fixture_daemon, "channel basic for eager: small message"));
	/* tpipctl pipes -v: each channel under the table, with its reason. */
	out = ctl("pipes", "-v", NULL);
	tpt_log("tpipctl pipes -v:\n%s", out);
	ck_assert_msg(strstr(out, " channels:\n") && strstr(out, reason) &&
		      strstr(out, "  eager: basic: small message"), "pipes -v: %s", out);
	free(out);
	/* Without -v: the table alone. */
	out = ctl("pipes", NULL, NULL);
	ck_assert_msg(!strstr(out, "first viable"), "pipes without -v: %s", out);
	free(out);
	out = ctl("--json", "pipes", "-v");
	ck_assert_msg(strstr(out, "\"channel_reasons\"") && strstr(out, "passed over: shm: "),
		      "pipes --json -v: %s", out);
	expect_channels_array(out, "cma", "ring");
	free(out);
	tpt_sync_post(&to_child, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
}
END_TEST

/* By default the 1 MiB private->private message goes through the pipe ring, and the daemon says
 * so and why, in its log and in `tpipctl pipes -v`; the pipe's channels are ring and basic. */
START_TEST(test_errors_ring_choice_is_logged_and_shown)
{
	static const char *const args[] = { "--log-level", "debug", NULL };
	static const char reason[] = "cpu>cpu: ring: both ends private memory, 1048576 bytes >= "
				     "pipe-ring-min: the clients copy through a 8 x 128 KiB ring";
	char *out;
	pid_t pid;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	pid = tpt_fork(channel_pair, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&tpt_fixture_daemon, "channel ring for cpu>cpu: both "
					     "ends private memory", T_MS, NULL, 0), 0);
	ck_assert(tpt_daemon_log_has(&tpt_fixture_daemon, "channel basic for eager: small message"));
	out = ctl("pipes", "-v", NULL);
	tpt_log("tpipctl pipes -v:\n%s", out);
	ck_assert_msg(strstr(out, " channels:\n") && strstr(out, reason) &&
		      strstr(out, "  eager: basic: small message"), "pipes -v: %s", out);
	free(out);
	out = ctl("--json", "pipes", "-v");
	ck_assert_msg(strstr(out, "\"channel_reasons\"") && strstr(out, reason),
		      "pipes --json -v: %s", out);
	expect_channels_array(out, "ring", "cma");
	free(out);
	tpt_sync_post(&to_child, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
}
END_TEST

static Suite *errors_suite(void)
{
	Suite *s = suite_create("errors");
	TCase *t = tcase_create("texts");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, test_errors_last_error_holds_a_long_daemon_message);
	tcase_add_test(t, test_errors_refused_socket_is_named);
	tcase_add_test(t, test_errors_admin_close_says_so);
	tcase_add_loop_test(t, test_errors_clean_close_is_logged_clean, 0, 2);
	tcase_add_test(t, test_errors_tpipd_log_sends_the_library_log_to_stderr);
	tcase_add_test(t, test_errors_library_is_silent_without_tpipd_log);
	tcase_add_test(t, test_errors_channel_choice_is_logged_and_shown);
	tcase_add_test(t, test_errors_ring_choice_is_logged_and_shown);
	tcase_set_timeout(t, 60);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return tpt_run_suite(errors_suite());
}
