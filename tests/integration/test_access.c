/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: listeners and who may reach them. A second listen on a taken name fails
 * with -EADDRINUSE (from another process and from the same one) and succeeds once the name is
 * free; connecting to a name nobody listens on fails the pipe with -ENOENT instead of hanging;
 * an owner-only listener refuses a process of another uid with -EACCES while TP_ACCESS_ANYONE
 * and TP_ACCESS_GROUP (for members) admit it; both ends see the right remote names and the
 * other end's uid, and a connect expecting another owner is refused with -EACCES. The
 * other-uid cases need root (the connecting child drops to uid 65534 before creating its
 * context) and print why they skip otherwise.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NOBODY 65534
#define TEST_GID 4242

static struct tpt_sync to_a, to_b;

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_fixture_stop();
}

/* ---- names ------------------------------------------------------------------------------ */

static int holder(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "holder", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "taken", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "no word from the other process");
	tp_listener_close(l);
	tpt_sync_post(&to_b, 0);
	tpt_sync_wait(&to_a, T_MS);
	tp_context_free(ctx);
	return 0;
}

/* Listens on @name until it succeeds or the deadline passes (the old owner's close is async). */
static int listen_eventually(struct tp_context *ctx, const char *name, struct tp_listener **l)
{
	uint64_t deadline = tpt_now_ms() + T_MS;
	int r;

	for (unsigned round = 0;; round++) {
		r = tp_listen(ctx, name, NULL, l);
		if (r != -EADDRINUSE || tpt_now_ms() >= deadline)
			return r;
		tpt_backoff(round);
	}
}

static int contender(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l = NULL, *l2 = NULL;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "holder not listening");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "contender", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_listen(ctx, "taken", NULL, &l);
	TPT_REQUIRE(r == -EADDRINUSE, 1, "listen on a name another process holds: %d", r);
	r = tp_listen(ctx, "mine", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen on a free name: %d %s", r, tp_last_error());
	r = tp_listen(ctx, "mine", NULL, &l2);
	TPT_REQUIRE(r == -EADDRINUSE, 1, "second listen in the same process: %d", r);
	tpt_sync_post(&to_a, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "holder did not close");
	r = listen_eventually(ctx, "taken", &l2);
	TPT_REQUIRE(r == 0, 1, "listen on a released name: %d %s", r, tp_last_error());
	tpt_sync_post(&to_a, 0);
	tp_listener_close(l);
	tp_listener_close(l2);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_access_listen_on_taken_name_fails_with_eaddrinuse)
{
	ck_assert(tpt_run_pair(holder, contender, NULL, 2 * T_MS));
}
END_TEST

static int bad_names(void *arg)
{
	static const char *bad[] = { "", "has space", "a/b", "tab\t" };
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = tp_listen(ctx, bad[i], NULL, &l);
		TPT_REQUIRE(r == -EINVAL, 1, "listen('%s'): %d (want -EINVAL)", bad[i], r);
	}
	/* the session survives: a good name still works */
	r = tp_listen(ctx, "good.name-1", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen(good): %d %s", r, tp_last_error());
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_access_listen_rejects_malformed_names)
{
	pid_t pid = tpt_fork(bad_names, NULL);

	ck_assert(tpt_wait_ok(pid, T_MS, "client"));
}
END_TEST

static int missing(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	uint8_t byte = 1;
	struct tp_payload pl = { .data = &byte, .length = 1 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	uint64_t t0;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	tpt_done_init(&done);
	r = tp_connect(ctx, "nobody-listens-here", &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect returns at once: %d", r);
	t0 = tpt_now_ms();
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ENOENT, 1, "wait_connected: %d after %llu ms (want -ENOENT)", r,
		    (unsigned long long)(tpt_now_ms() - t0));
	r = tp_pipe_write(p, &m, tpt_done_cb, &da);
	if (r == 0) {
		TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1, "write on a failed pipe hangs");
		r = done.last_status;
	}
	TPT_REQUIRE(r == -ENOENT, 1, "write on a failed connect: %d (want -ENOENT)", r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_access_connect_to_missing_name_fails_with_enoent)
{
	pid_t pid = tpt_fork(missing, NULL);

	ck_assert(tpt_wait_ok(pid, 2 * T_MS, "client"));
}
END_TEST

/* ---- other uids ----------------------------------------------------------------------------- */

struct access_case {
	const char *name;  /* listener to reach */
	int want;	   /* expected connect result */
	bool with_group;   /* the connector is a member of TEST_GID */
};

static void access_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 30;
	s->index = index;
	s->n_tensors = 1;
	s->lens[0] = 1u << 20; /* rendezvous: the daemon reaches into the other uid's memory */
}

static struct tp_listener *by_name(struct tp_listener **l, const char *name)
{
	for (int i = 0; i < 3; i++)
		if (strcmp(tp_listener_name(l[i]), name) == 0)
			return l[i];
	return NULL;
}

/* Accepts one pipe for each admitted case and reads its message. */
static int access_accept_all(struct tp_context *ctx, struct tp_listener **l,
			     const struct access_case *c)
{
	struct tpt_msg_spec s;
	struct tp_pipe *p;
	int r;

	for (unsigned i = 0; c[i].name; i++) {
		if (c[i].want != 0)
			continue;
		r = tp_listener_accept_sync(by_name(l, c[i].name), T_MS, &p);
		TPT_REQUIRE(r == 0, 1, "accept on '%s': %d %s", c[i].name, r, tp_last_error());
		access_spec(i, &s);
		r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
		tp_pipe_close(p);
		TPT_REQUIRE(r == 0, 1, "message from uid %d: %d", NOBODY, r);
	}
	return 0;
}

/* Listens on "owner" (default), "anyone" and "group" (TEST_GID), as root. */
static int access_listener(void *arg)
{
	const struct access_case *cases = arg;
	struct tp_listen_options any = { .size = sizeof(any), .access = TP_ACCESS_ANYONE };
	struct tp_listen_options grp = { .size = sizeof(grp), .access = TP_ACCESS_GROUP,
					 .gid = TEST_GID };
	struct tp_context *ctx;
	struct tp_listener *l[3];
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "root-listener", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "owner", NULL, &l[0]);
	if (r == 0)
		r = tp_listen(ctx, "anyone", &any, &l[1]);
	if (r == 0)
		r = tp_listen(ctx, "group", &grp, &l[2]);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	r = access_accept_all(ctx, l, cases);
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "connector did not finish");
	for (int i = 0; i < 3; i++)
		tp_listener_close(l[i]);
	tp_context_free(ctx);
	return r;
}

/* Becomes uid/gid NOBODY (with TEST_GID as supplementary group if @with_group). */
static int become_nobody(bool with_group)
{
	gid_t g = TEST_GID;

	TPT_REQUIRE(setgroups(with_group ? 1 : 0, &g) == 0, -errno, "setgroups");
	TPT_REQUIRE(setgid(NOBODY) == 0, -errno, "setgid");
	TPT_REQUIRE(setuid(NOBODY) == 0, -errno, "setuid");
	prctl(PR_SET_DUMPABLE, 1); /* like any process of that user */
	return 0;
}

/* Connects to @c's listener; when admitted, sends the case's message. */
static int access_try(struct tp_context *ctx, const struct access_case *c, unsigned i)
{
	struct tpt_msg_spec s;
	struct tpt_msg m;
	struct tp_pipe *p;
	int r = tp_connect(ctx, c->name, &p);

	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	if (r == 0 && c->want == 0) {
		access_spec(i, &s);
		r = tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m);
		if (r == 0)
			r = tp_pipe_write_sync(p, &m.m);
		if (r != 0)
			tpt_log("write as uid %d: %d %s", NOBODY, r, tp_last_error());
		tpt_msg_free(ctx, &m);
	}
	tp_pipe_close(p);
	return r;
}

static int access_connector(void *arg)
{
	const struct access_case *c = arg;
	struct tp_context *ctx;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	TPT_REQUIRE(become_nobody(c[0].with_group) == 0, 1, "cannot become uid %d", NOBODY);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "nobody", &ctx);
	TPT_REQUIRE(r == 0, 1, "context as uid %d: %d %s", NOBODY, r, tp_last_error());
	for (unsigned i = 0; c[i].name; i++) {
		r = access_try(ctx, &c[i], i);
		TPT_REQUIRE(r == c[i].want, 1, "connect to '%s' as uid %d%s: %d (want %d)",
			    c[i].name, NOBODY, c[i].with_group ? " in the group" : "", r,
			    c[i].want);
	}
	tpt_sync_post(&to_a, 0);
	tp_context_free(ctx);
	return 0;
}

/* Runs listener (root) and connector (uid NOBODY) for @cases; false if a case failed. */
static bool run_access(const struct access_case *cases)
{
	pid_t pa = tpt_fork(access_listener, (void *)cases);
	pid_t pb = tpt_fork(access_connector, (void *)cases);
	bool ok;

	ok = tpt_wait_ok(pb, 2 * T_MS, "connector");
	return tpt_wait_ok(pa, 2 * T_MS, "listener") && ok;
}

static bool skip_unless_root(void)
{
	if (geteuid() == 0) {
		ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
		return false;
	}
	printf("skipped: needs root to run a client as another uid\n");
	return true;
}

START_TEST(test_access_owner_only_listener_refuses_other_uid)
{
	static const struct access_case cases[] = {
		{ "owner", -EACCES, false },
		{ "anyone", 0, false }, /* the same session carries on */
		{ NULL, 0, false },
	};

	if (!skip_unless_root())
		ck_assert(run_access(cases));
}
END_TEST

START_TEST(test_access_anyone_listener_admits_other_uid)
{
	static const struct access_case cases[] = { { "anyone", 0, false }, { NULL, 0, false } };

	if (!skip_unless_root())
		ck_assert(run_access(cases));
}
END_TEST

START_TEST(test_access_group_listener_admits_members_only)
{
	static const struct access_case member[] = { { "group", 0, true }, { NULL, 0, false } };
	static const struct access_case stranger[] = { { "group", -EACCES, false },
							      { NULL, 0, false } };

	if (skip_unless_root())
		return;
	ck_assert(run_access(member));
	ck_assert(run_access(stranger));
}
END_TEST

/* ---- remote names ---------------------------------------------------------------------------- */

static int names_a(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	uid_t uid = (uid_t)-1;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "alice", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "bob-calls-here", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	TPT_REQUIRE(strcmp(tp_context_name(ctx), "alice") == 0, 1, "context name '%s'",
		    tp_context_name(ctx));
	TPT_REQUIRE(strcmp(tp_listener_name(l), "bob-calls-here") == 0, 1, "listener name '%s'",
		    tp_listener_name(l));
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(strcmp(tp_pipe_remote_name(p), "bob") == 0, 1,
		    "accepted pipe's remote name '%s' (want the connector's context name 'bob')",
		    tp_pipe_remote_name(p));
	r = tp_pipe_remote_uid(p, &uid);
	TPT_REQUIRE(r == 0 && uid == geteuid(), 1, "accepted pipe's remote uid: %d, %u", r,
		    (unsigned)uid);
	tpt_sync_wait(&to_a, T_MS);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int names_b(void *arg)
{
	struct tp_connect_options other = { .size = sizeof(other), .flags = TP_CONNECT_EXPECT_UID,
					    .expect_uid = geteuid() + 1 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	uid_t uid = (uid_t)-1;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "bob", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	/* Expecting another owner: refused before the listener hears of it. */
	r = tp_connect_ex(ctx, "bob-calls-here", &other, &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -EACCES && strstr(tp_last_error(), "not the expected uid"), 1,
		    "connect expecting uid %u: %d %s", (unsigned)other.expect_uid, r,
		    tp_last_error());
	tp_pipe_close(p);
	r = tp_connect(ctx, "bob-calls-here", &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_remote_uid(p, &uid);
	TPT_REQUIRE(r == 0 && uid == geteuid(), 1, "listener owner's uid: %d, %u", r,
		    (unsigned)uid);
	TPT_REQUIRE(strcmp(tp_pipe_remote_name(p), "bob-calls-here") == 0, 1,
		    "connected pipe's remote name '%s' (want the listener name)",
		    tp_pipe_remote_name(p));
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_access_pipes_know_their_remote_names)
{
	ck_assert(tpt_run_pair(names_a, names_b, NULL, 2 * T_MS));
}
END_TEST

static Suite *access_suite(void)
{
	Suite *s = suite_create("access");
	TCase *tc = tcase_create("access");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_access_listen_on_taken_name_fails_with_eaddrinuse);
	tcase_add_test(tc, test_access_listen_rejects_malformed_names);
	tcase_add_test(tc, test_access_connect_to_missing_name_fails_with_enoent);
	tcase_add_test(tc, test_access_owner_only_listener_refuses_other_uid);
	tcase_add_test(tc, test_access_anyone_listener_admits_other_uid);
	tcase_add_test(tc, test_access_group_listener_admits_members_only);
	tcase_add_test(tc, test_access_pipes_know_their_remote_names);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(access_suite());
}
