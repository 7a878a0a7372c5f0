/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: names, owners and who may see or reach them, played
 * by a victim (uid 4242), an attacker (uid 65534) and root against two daemons on this machine
 * that treat each other as remote hosts and share a pre-shared peer key. A remote daemon's
 * word is never a local uid: a process on the other host, as root or as the listener's own uid,
 * cannot open an owner-only listener, while one that allows peers is reached (by any peer, or by
 * the link's identity) and both ends learn the other's uid marked as a claim. A squatter that
 * registered a name first receives nothing from a victim connecting with TP_CONNECT_EXPECT_UID,
 * on this host or across, even writes issued before the connect was answered; "@UID:" names are
 * the uid's own. A peer cannot tell a listener that refuses it from a missing one, and the far
 * daemon logs the real reason. tpipctl shows uid 65534 none of uid 4242's sessions, command and
 * context names, listener names or counts, while root sees them. Needs root (it skips otherwise).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"

#define T_MS TPT_SCALED_MS(30000)
#define NOBODY 65534
#define VICTIM 4242
#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

static struct tpt_daemon ka, kb;
static char key_dir[64], key_path[128];
static struct tpt_sync ready, done;

/* ---- fixture: two keyed daemons ----------------------------------------------------------- */

static void write_key(const char *path)
{
	char text[64];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	for (unsigned i = 0; i < 24; i++)
		snprintf(text + 2 * i, 3, "%02x", (unsigned)(tpt_seed(21, i, 8) & 0xff));
	text[48] = '\n';
	ck_assert_int_eq(write(fd, text, 49), 49);
	close(fd);
}

static bool is_root(void)
{
	if (geteuid() == 0)
		return true;
	printf("skipped: needs root to run clients as uids %d and %d\n", VICTIM, NOBODY);
	return false;
}

static void setup(void)
{
	const char *const *t = tpt_peer_args();
	const char *args[8] = { t[0], t[1], t[2], t[3], "--peer-key-file", key_path, NULL };

	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
	if (!is_root())
		return;
	snprintf(key_dir, sizeof(key_dir), "/tmp/tpt-names.XXXXXX");
	ck_assert(mkdtemp(key_dir));
	snprintf(key_path, sizeof(key_path), "%s/key", key_dir);
	write_key(key_path);
	ck_assert_int_eq(tpt_daemon_pair_start(&ka, args, &kb, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&ka), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&kb), 0);
}

static void teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&done);
	if (geteuid() != 0)
		return;
	ck_assert_int_eq(tpt_daemon_stop(&ka), 0);
	ck_assert_int_eq(tpt_daemon_stop(&kb), 0);
	unlink(key_path);
	rmdir(key_dir);
}

/* ---- helpers (children) --------------------------------------------------------------------- */

/* A context on @d as @uid (0: stay root) named @name. */
static int ctx_as(const struct tpt_daemon *d, uid_t uid, const char *name, struct tp_context **ret)
{
	int r = uid ? tpt_become_user(uid) : 0;

	if (r == 0)
		r = tpt_ctx_new(d, 0, name, ret);
	TPT_REQUIRE(r == 0, r, "context as uid %u: %d %s", (unsigned)uid, r, tp_last_error());
	return 0;
}

static void small_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 21;
	s->index = index;
	s->n_payloads = 1;
	s->lens[0] = 100;
	s->n_tensors = 1;
	s->lens[1] = 1u << 20; /* rendezvous: waits for the reader's allocation */
}

/*
 * Connects to @addr (with @opts), writes one message at once, before the connect is answered,
 * and waits for the connect; then closes the pipe, which ends the write.
 * Return: the connect's result (@why gets its message), or 1 if a write on a refused connect
 * succeeded.
 */
static int connect_and_write(struct tp_context *ctx, const char *addr,
			     const struct tp_connect_options *opts, char *why, size_t wl)
{
	struct tpt_done done_w;
	struct tpt_done_arg arg = { &done_w, 0 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	struct tp_pipe *p;
	int r, w;

	tpt_done_init(&done_w);
	r = tp_connect_ex(ctx, addr, opts, &p);
	TPT_REQUIRE(r == 0, r, "tp_connect_ex %s: %d %s", addr, r, tp_last_error());
	small_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, -ENOMEM, "build");
	w = tp_pipe_write(p, &m.m, tpt_done_cb, &arg);
	r = tp_pipe_wait_connected(p, T_MS);
	snprintf(why, wl, "%s", r < 0 ? tp_last_error() : "");
	tp_pipe_close(p);
	if (w == 0) {
		TPT_REQUIRE(tpt_done_wait(&done_w, 1, T_MS) == 0, 1, "write never completed");
		w = done_w.last_status;
	}
	tpt_msg_free(ctx, &m);
	TPT_REQUIRE(r == 0 || w < 0, 1, "a write on a refused connect (%d) succeeded", r);
	return r;
}

/* Replaces the first @name in @s by "NAME" (for comparing refusals of different names). */
static void mask(char *s, size_t len, const char *name)
{
	char *at = strstr(s, name), tail[512];

	if (!at)
		return;
	snprintf(tail, sizeof(tail), "%s", at + strlen(name));
	snprintf(at, len - (size_t)(at - s), "NAME%s", tail);
}

/* ---- helpers (test process) ---------------------------------------------------------------- */

/* Runs tpipctl --json @cmd on @d as root; returns the parsed reply's member @cmd (or status). */
static struct json_object *ctl_json(const struct tpt_daemon *d, const char *cmd)
{
	char *out = tpt_ctl(d, cmd, true);
	struct json_object *o = json_tokener_parse(out);

	ck_assert_msg(o, "tpipctl --json %s: not JSON: %s", cmd, out);
	free(out);
	return o;
}

/* Pipes listener @name of @d accepted, per `tpipctl --json listeners` as root; -1 if absent. */
static int64_t accepted_by(const struct tpt_daemon *d, const char *name)
{
	struct json_object *o = ctl_json(d, "listeners"), *arr, *l, *v;
	int64_t n = -1;

	ck_assert(json_object_object_get_ex(o, "listeners", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		l = json_object_array_get_idx(arr, i);
		if (json_object_object_get_ex(l, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0 &&
		    json_object_object_get_ex(l, "accepted", &v))
			n = json_object_get_int64(v);
	}
	json_object_put(o);
	return n;
}

/* @d has no pipe to listener @name (root's view of `tpipctl --json pipes`). */
static bool no_pipe_to(const struct tpt_daemon *d, const char *name)
{
	struct json_object *o = ctl_json(d, "pipes"), *arr, *v;
	size_t n = 0;

	ck_assert(json_object_object_get_ex(o, "pipes", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++)
		if (json_object_object_get_ex(json_object_array_get_idx(arr, i), "listener", &v) &&
		    strcmp(json_object_get_string(v), name) == 0)
			n++;
	if (n)
		fprintf(stderr, "pipes to '%s': %s\n", name, json_object_to_json_string(arr));
	json_object_put(o);
	return n == 0;
}

/* ---- a remote daemon's word is not a local uid ---------------------------------------------- */

/* Listens on kb as VICTIM on "owned" (owner only, default remote access), until told. */
static int owner_listens(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = ctx_as(&kb, VICTIM, "owner", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "owned", NULL, &l);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "no word from the test");
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* On ka as uid (intptr_t)@arg: tpip://kb/owned is refused as if it did not exist. */
static int claimant_connects(void *arg)
{
	uid_t uid = (uid_t)(intptr_t)arg;
	struct tp_context *ctx;
	char addr[200], why[512];
	int r = ctx_as(&ka, uid, uid ? "claims-owner" : "claims-root", &ctx);

	if (r)
		return 1;
	tpt_peer_address(&kb, "owned", addr, sizeof(addr));
	r = connect_and_write(ctx, addr, NULL, why, sizeof(why));
	tp_context_free(ctx);
	TPT_REQUIRE(r == -ENOENT, 1, "uid %u on another host reached an owner-only listener: %d %s",
		    (unsigned)uid, r, why);
	TPT_REQUIRE(strstr(why, "accepts pipes from other hosts"), 1, "unclear error: %s", why);
	return 0;
}

START_TEST(test_names_remote_uid_claims_open_no_owner_only_listener)
{
	pid_t owner;

	if (!is_root())
		return;
	owner = tpt_fork(owner_listens, NULL);
	ck_assert_int_gt(owner, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	/* Root on host A claims uid 0; a process of uid 4242 on A claims the owner's uid. */
	ck_assert(tpt_wait_ok(tpt_fork(claimant_connects, (void *)(intptr_t)0), T_MS, "root"));
	ck_assert(tpt_wait_ok(tpt_fork(claimant_connects, (void *)(intptr_t)VICTIM), T_MS,
			      "uid 4242"));
	ck_assert_int_eq(accepted_by(&kb, "owned"), 0);
	ck_assert(no_pipe_to(&kb, "owned"));
	ck_assert(tpt_daemon_log_has(&kb, "connect to 'owned' refused: listener does not accept "
				     "pipes from other hosts"));
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(owner, T_MS, "owner"));
}
END_TEST

/* ---- a peer flooding refused connects does not flood the log ------------------------------- */

#define FLOOD_CONNECTS 25
#define REFUSALS_LOGGED 20 /* per 10 s, daemon/broker/xaccept.c */

/* On ka as NOBODY: FLOOD_CONNECTS connects to a name kb does not have, each refused. */
static int flooder(void *arg)
{
	struct tp_context *ctx;
	char addr[200], why[512];
	int r = ctx_as(&ka, NOBODY, "flooder", &ctx);

	if (r)
		return 1;
	tpt_peer_address(&kb, "flood", addr, sizeof(addr));
	for (int i = 0; i < FLOOD_CONNECTS; i++) {
		r = connect_and_write(ctx, addr, NULL, why, sizeof(why));
		TPT_REQUIRE(r == -ENOENT, 1, "connect %d to a missing listener: %d %s", i, r, why);
	}
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_names_refused_remote_connects_are_logged_at_a_bounded_rate)
{
	if (!is_root())
		return;
	ck_assert(tpt_wait_ok(tpt_fork(flooder, NULL), T_MS, "flooder"));
	/* Each of the first 20 in the window is logged once; the 21st to 25th are not. */
	ck_assert_int_eq(tpt_daemon_log_count(&kb, "connect to 'flood' refused"), REFUSALS_LOGGED);
	ck_assert(tpt_daemon_alive(&kb));
}
END_TEST

/* ---- a listener that allows peers is reached, each end learns the other's claim ------------- */

/* On kb as VICTIM: "any" (every peer) and "psk" (links authenticated as "psk"); accepts one pipe
 * on each and reads its message, checking the connector's uid is marked as a claim. */
static int remote_listener(void *arg)
{
	const char *const psk[] = { "psk" };
	struct tp_listen_options any = { .size = sizeof(any), .remote = TP_REMOTE_ANY_PEER };
	struct tp_listen_options named = { .size = sizeof(named), .remote = TP_REMOTE_PEERS,
					   .remote_peers = psk, .n_remote_peers = 1 };
	struct tp_context *ctx;
	struct tp_listener *l[2] = { NULL, NULL };
	struct tpt_msg_spec s;
	struct tp_pipe *p;
	uid_t uid = 0;
	int r = ctx_as(&kb, VICTIM, "remote-listener", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "any", &any, &l[0]);
	if (r == 0)
		r = tp_listen(ctx, "psk", &named, &l[1]);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	for (int i = 0; i < 2; i++) {
		r = tp_listener_accept_sync(l[i], T_MS, &p);
		TPT_REQUIRE(r == 0, 1, "accept %d: %d %s", i, r, tp_last_error());
		r = tp_pipe_remote_uid(p, &uid);
		TPT_REQUIRE(r == TP_UID_CLAIMED && uid == NOBODY, 1,
			    "accepted pipe's remote uid: %d, uid %u", r, (unsigned)uid);
		small_spec(0, &s);
		r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %d: %d", i, r);
		tp_pipe_close(p);
	}
	tp_listener_close(l[0]);
	tp_listener_close(l[1]);
	tp_context_free(ctx);
	return 0;
}

/* On ka as NOBODY: reaches "any" and "psk" on kb, learning the owner's uid as a claim. */
static int remote_connector(void *arg)
{
	static const char *const names[] = { "any", "psk" };
	struct tp_context *ctx;
	char addr[200], why[512];
	uid_t uid = 0;
	int r = ctx_as(&ka, NOBODY, "remote-connector", &ctx);

	if (r)
		return 1;
	for (int i = 0; i < 2; i++) {
		struct tpt_msg_spec s;
		struct tpt_msg m;
		struct tp_pipe *p;

		tpt_peer_address(&kb, names[i], addr, sizeof(addr));
		r = tp_connect(ctx, addr, &p);
		TPT_REQUIRE(r == 0, 1, "connect: %d", r);
		r = tp_pipe_wait_connected(p, T_MS);
		snprintf(why, sizeof(why), "%s", r ? tp_last_error() : "");
		TPT_REQUIRE(r == 0, 1, "connect to %s: %d %s", addr, r, why);
		r = tp_pipe_remote_uid(p, &uid);
		TPT_REQUIRE(r == TP_UID_CLAIMED && uid == VICTIM, 1,
			    "connected pipe's remote uid: %d, uid %u", r, (unsigned)uid);
		small_spec(0, &s);
		TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
		r = tp_pipe_write_sync(p, &m.m);
		tpt_msg_free(ctx, &m);
		TPT_REQUIRE(r == 0, 1, "write to %s: %d %s", addr, r, tp_last_error());
		tp_pipe_close(p);
	}
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_names_listener_open_to_peers_is_reached_with_claimed_uids)
{
	pid_t lis;

	if (!is_root())
		return;
	lis = tpt_fork(remote_listener, NULL);
	ck_assert_int_gt(lis, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert(tpt_wait_ok(tpt_fork(remote_connector, NULL), T_MS, "connector"));
	ck_assert(tpt_wait_ok(lis, T_MS, "listener"));
}
END_TEST

/* ---- probing: a refusing listener reads as a missing one ------------------------------------ */

/* On kb as VICTIM: "probe-none" (no remote access) and "probe-peer" (another identity only). */
static int probe_target(void *arg)
{
	const char *const other[] = { "not-this-link" };
	struct tp_listen_options named = { .size = sizeof(named), .remote = TP_REMOTE_PEERS,
					   .remote_peers = other, .n_remote_peers = 1 };
	struct tp_context *ctx;
	struct tp_listener *l[2];
	int r = ctx_as(&kb, VICTIM, "probe-target", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "probe-none", NULL, &l[0]);
	if (r == 0)
		r = tp_listen(ctx, "probe-peer", &named, &l[1]);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "no word from the test");
	tp_listener_close(l[0]);
	tp_listener_close(l[1]);
	tp_context_free(ctx);
	return 0;
}

/* On ka as NOBODY: the three names fail alike. */
static int prober(void *arg)
{
	static const char *const names[] = { "probe-miss", "probe-none", "probe-peer" };
	struct tp_context *ctx;
	char addr[200], why[3][512];
	int r[3];

	if (ctx_as(&ka, NOBODY, "prober", &ctx))
		return 1;
	for (int i = 0; i < 3; i++) {
		tpt_peer_address(&kb, names[i], addr, sizeof(addr));
		r[i] = connect_and_write(ctx, addr, NULL, why[i], sizeof(why[i]));
		mask(why[i], sizeof(why[i]), names[i]);
	}
	tp_context_free(ctx);
	for (int i = 1; i < 3; i++)
		TPT_REQUIRE(r[i] == r[0] && strcmp(why[i], why[0]) == 0, 1,
			    "'%s' answers %d '%s', a missing name %d '%s'", names[i], r[i], why[i],
			    r[0], why[0]);
	TPT_REQUIRE(r[0] == -ENOENT, 1, "missing name: %d %s", r[0], why[0]);
	return 0;
}

START_TEST(test_names_peer_cannot_tell_refusing_listener_from_missing)
{
	pid_t target;

	if (!is_root())
		return;
	target = tpt_fork(probe_target, NULL);
	ck_assert_int_gt(target, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert(tpt_wait_ok(tpt_fork(prober, NULL), T_MS, "prober"));
	/* The far daemon knows, and says so once per refusal in its log. */
	ck_assert(tpt_daemon_log_has(&kb, "connect to 'probe-peer' refused: listener does not "
				     "accept pipes from this peer's identity"));
	ck_assert_int_eq(accepted_by(&kb, "probe-none"), 0);
	ck_assert_int_eq(accepted_by(&kb, "probe-peer"), 0);
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(target, T_MS, "target"));
}
END_TEST

/* ---- squatting ------------------------------------------------------------------------------ */

/* As NOBODY: takes "trainer" first, open to every local user and every peer, on ka and kb. */
static int squatter(void *arg)
{
	struct tp_listen_options open = { .size = sizeof(open), .access = TP_ACCESS_ANYONE,
					  .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ca = NULL, *cb = NULL;
	struct tp_listener *la, *lb;
	int r = ctx_as(&ka, NOBODY, "squatter", &ca);

	if (r == 0)
		r = tpt_ctx_new(&kb, 0, "squatter", &cb);
	if (r == 0)
		r = tp_listen(ca, "trainer", &open, &la);
	if (r == 0)
		r = tp_listen(cb, "trainer", &open, &lb);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "no word from the test");
	tp_listener_close(la);
	tp_listener_close(lb);
	tp_context_free(ca);
	tp_context_free(cb);
	return 0;
}

/* As VICTIM on ka: "trainer" here and on kb, expecting its own uid, is refused; its own
 * "@4242:trainer" is reached and says who owns it; nobody else may register such a name. */
static int victim(void *arg)
{
	struct tp_connect_options mine = { .size = sizeof(mine), .flags = TP_CONNECT_EXPECT_UID,
					   .expect_uid = VICTIM };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	char addr[200], why[512];
	uid_t uid = 0;
	int r = ctx_as(&ka, VICTIM, "victim", &ctx);

	if (r)
		return 1;
	r = connect_and_write(ctx, "trainer", &mine, why, sizeof(why));
	TPT_REQUIRE(r == -EACCES && strstr(why, "owned by uid 65534"), 1,
		    "local squatter: %d %s", r, why);
	tpt_peer_address(&kb, "trainer", addr, sizeof(addr));
	r = connect_and_write(ctx, addr, &mine, why, sizeof(why));
	TPT_REQUIRE(r == -EACCES && strstr(why, "owned by uid 65534"), 1,
		    "remote squatter: %d %s", r, why);
	/* The name space of one's own uid, and the owner check passing. */
	r = tp_listen(ctx, "@4242:trainer", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen on @4242:trainer: %d %s", r, tp_last_error());
	r = tp_connect_ex(ctx, "@4242:trainer", &mine, &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect to own listener: %d %s", r, tp_last_error());
	r = tp_pipe_remote_uid(p, &uid);
	TPT_REQUIRE(r == 0 && uid == VICTIM, 1, "own listener's owner: %d uid %u", r,
		    (unsigned)uid);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* As NOBODY on ka: "@4242:..." names are refused alike, taken or not. */
static int reserved_squatter(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = ctx_as(&ka, NOBODY, "reserved-squatter", &ctx);

	if (r)
		return 1;
	r = tp_listen(ctx, "@4242:elsewhere", NULL, &l);
	TPT_REQUIRE(r == -EACCES, 1, "nobody registered @4242:elsewhere: %d", r);
	r = tp_listen(ctx, "@65534:mine", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "nobody's own @65534: name: %d %s", r, tp_last_error());
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_names_squatter_gets_nothing_from_a_connector_expecting_its_owner)
{
	pid_t sq;

	if (!is_root())
		return;
	sq = tpt_fork(squatter, NULL);
	ck_assert_int_gt(sq, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert(tpt_wait_ok(tpt_fork(victim, NULL), T_MS, "victim"));
	ck_assert(tpt_wait_ok(tpt_fork(reserved_squatter, NULL), T_MS, "reserved squatter"));
	/* The squatter's listeners never heard of a connect: no Accepted, no pipe, no byte. */
	ck_assert_int_eq(accepted_by(&ka, "trainer"), 0);
	ck_assert_int_eq(accepted_by(&kb, "trainer"), 0);
	ck_assert(no_pipe_to(&ka, "trainer"));
	ck_assert(no_pipe_to(&kb, "trainer"));
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(sq, T_MS, "squatter"));
}
END_TEST

/* ---- visibility ----------------------------------------------------------------------------- */

#define SECRET_LISTENER "victim-secret-listener"
#define SECRET_CTX "victim-secret-context"

/* As VICTIM on ka: a context, a listener and a pipe to itself, kept until told. */
static int visible_victim(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p = NULL, *a = NULL;
	int r = ctx_as(&ka, VICTIM, SECRET_CTX, &ctx);

	if (r == 0)
		r = tp_listen(ctx, SECRET_LISTENER, NULL, &l);
	if (r == 0)
		r = tp_connect(ctx, SECRET_LISTENER, &p);
	if (r == 0)
		r = tp_listener_accept_sync(l, T_MS, &a);
	tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "set-up: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&done, T_MS) == 0, 1, "no word from the test");
	tp_pipe_close(a);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* Fails if @out mentions the victim (its names, its command, its uid as a member). */
static int leaks(const char *what, const char *out)
{
	static const char *const secrets[] = { SECRET_LISTENER, SECRET_CTX, "test_sec_names",
					       "\"uid\":4242", "\"uid\": 4242" };

	for (size_t i = 0; i < ARRAY_N(secrets); i++)
		TPT_REQUIRE(!strstr(out, secrets[i]), 1, "tpipctl %s as uid %d shows %s: %s", what,
			    NOBODY, secrets[i], out);
	return 0;
}

/* As NOBODY: every view of ka holds only nobody's own tpipctl session. */
static int nosy(void *arg)
{
	static const char *const cmds[] = { "sessions", "listeners", "pipes", "status", "stats" };
	const char *bin = getenv("TPIPCTL_BIN");
	struct tpt_cmd_result res;
	int r = tpt_become_user(NOBODY);

	if (r)
		return 1;
	for (int json = 0; json < 2; json++) {
		for (size_t i = 0; i < ARRAY_N(cmds); i++) {
			const char *argv[] = { bin,
					       "--socket",
					       ka.socket,
					       json ? "--json" : cmds[i],
					       json ? cmds[i] : NULL,
					       NULL };
			struct json_object *o, *v;

			r = tpt_run(argv, T_MS, &res);
			TPT_REQUIRE(r == 0 && WIFEXITED(res.status) && !WEXITSTATUS(res.status), 1,
				    "tpipctl %s as nobody: %d %s", cmds[i], r, r ? "" : res.err);
			r = leaks(cmds[i], res.out) || leaks(cmds[i], res.err);
			if (r == 0 && json && strcmp(cmds[i], "status") == 0) {
				o = json_tokener_parse(res.out);
				r = !o || !json_object_object_get_ex(o, "sessions", &v) ||
				    json_object_get_int64(v) != 1 ||
				    !json_object_object_get_ex(o, "listeners", &v) ||
				    json_object_get_int64(v) != 0 ||
				    !json_object_object_get_ex(o, "pipes", &v) ||
				    json_object_get_int64(v) != 0;
				json_object_put(o);
				if (r)
					tpt_log("status counts others' objects: %s", res.out);
			}
			if (r == 0 && !json && strcmp(cmds[i], "sessions") == 0 &&
			    !strstr(res.err, "only uid 65534's objects are shown")) {
				tpt_log("no note that the view is filtered: '%s'", res.err);
				r = 1;
			}
			tpt_cmd_result_free(&res);
			if (r)
				return 1;
		}
	}
	return 0;
}

START_TEST(test_names_tpipctl_shows_a_user_only_its_own_objects)
{
	pid_t v;
	char *out;

	if (!is_root())
		return;
	v = tpt_fork(visible_victim, NULL);
	ck_assert_int_gt(v, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert(tpt_wait_ok(tpt_fork(nosy, NULL), T_MS, "uid 65534's tpipctl"));
	/* Root (an admin) sees everything. */
	out = tpt_ctl(&ka, "sessions", true);
	ck_assert_msg(strstr(out, SECRET_CTX) && strstr(out, "test_sec_names"), "%s", out);
	free(out);
	out = tpt_ctl(&ka, "listeners", false);
	ck_assert_msg(strstr(out, SECRET_LISTENER), "%s", out);
	free(out);
	out = tpt_ctl(&ka, "pipes", true);
	ck_assert_msg(strstr(out, SECRET_CTX) && strstr(out, SECRET_LISTENER), "%s", out);
	free(out);
	tpt_sync_post(&done, 0);
	ck_assert(tpt_wait_ok(v, T_MS, "victim"));
}
END_TEST

static Suite *names_suite(void)
{
	Suite *s = suite_create("names");
	TCase *tc = tcase_create("names");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_names_remote_uid_claims_open_no_owner_only_listener);
	tcase_add_test(tc, test_names_listener_open_to_peers_is_reached_with_claimed_uids);
	tcase_add_test(tc, test_names_peer_cannot_tell_refusing_listener_from_missing);
	tcase_add_test(tc, test_names_squatter_gets_nothing_from_a_connector_expecting_its_owner);
	tcase_add_test(tc, test_names_tpipctl_shows_a_user_only_its_own_objects);
	tcase_add_test(tc, test_names_refused_remote_connects_are_logged_at_a_bounded_rate);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(names_suite());
}
