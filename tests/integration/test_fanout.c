/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: the daemon's fan-out of pipe-set broadcasts (Broadcast, docs/fanout.md).
 * A server broadcasts to readers in other processes; every reader checks each message's bytes
 * and that its pipe's messages come in the order the server wrote them (ordinary writes and
 * broadcasts mixed). The daemon's counters (`tpipctl --json status`) prove that private memory
 * is read once whatever the number of readers, and the limits (bcast-pipes-max,
 * bcast-stage-bytes-per-uid) are tried just below and just above; a daemon that takes no
 * Broadcast gets the library's fan-out, and a reader killed during a staged broadcast fails only
 * its own pipe. Each case has its own daemon.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NAME "fanout"
#define MAXR 8
#define BIG ((size_t)16 << 20)

/* STEP_BCAST_GONE: private memory unmapped before the broadcast: the daemon's one read of it
 * fails, and so does every delivery. */
enum step_kind { STEP_BCAST_SHM, STEP_BCAST_PRIV, STEP_WRITE_EACH, STEP_BCAST_GONE };

/* One step of the server's script; step i's message carries i in its metadata. */
struct step {
	enum step_kind kind;
	size_t len;
	enum tp_fanout want;   /* for broadcasts: how it must fan out */
	unsigned pipes;	       /* broadcast to a set of this many (0: every reader) */
};

/* The case's script, set before the forks. */
static struct {
	struct step steps[8];
	unsigned n_steps;
	unsigned readers;
	unsigned remote;     /* of the readers, the last this many connect from a second daemon */
	enum tp_fanout mode; /* tp_set_set_fanout() */
	int victim;	     /* reader killed after its first descriptor, -1: none */
	/* expected daemon counters after the script (UINT64_MAX: not checked) */
	uint64_t staged_bytes, unstaged, requests;
	uint64_t b_staged_bytes; /* the far daemon's (sc.remote), 0: not checked */
	uint64_t b_unstaged;	 /* the far daemon's broadcasts over its staging limit */
	const char *b_stage_limit; /* the far daemon's --bcast-stage-bytes-per-uid, NULL: default */
	uint64_t link_bytes_max; /* bytes the server's daemon may send its peers, 0: not checked */
} sc;

static struct tpt_daemon dmn, dmn_b; /* dmn_b: the remote readers' daemon (sc.remote) */
static bool with_b;
static struct tpt_sync ready;

static void fanout_setup(void)
{
	memset(&sc, 0, sizeof(sc));
	sc.victim = -1;
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
}

static void fanout_teardown(void)
{
	tpt_sync_done(&ready);
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
	if (with_b)
		ck_assert_int_eq(tpt_daemon_stop(&dmn_b), 0);
	with_b = false;
}

static uint8_t byte_of(unsigned step, size_t i)
{
	return (uint8_t)(step * 131 + i * 13 + (i >> 12));
}

/* ---- readers -------------------------------------------------------------------------------- */

/* Reads messages until the pipe ends; each must be a later step than the one before, with the
 * right bytes. Exit status: 0, or 1 on a mismatch. */
static int reader(void *arg)
{
	unsigned who = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	uint8_t *buf = malloc(BIG + 1);
	int last = -1, r = tpt_sync_wait(&ready, T_MS);

	TPT_REQUIRE(r == 0 && buf, 1, "listener not ready: %d", r);
	if (who + sc.remote >= sc.readers) {
		char addr[128];

		r = tpt_ctx_new(&dmn_b, 0, "remote-reader", &ctx);
		if (r == 0)
			r = tp_connect(ctx, tpt_peer_address(&dmn, NAME, addr, sizeof(addr)), &p);
	} else {
		r = tpt_ctx_new(&dmn, 0, "reader", &ctx);
		if (r == 0)
			r = tp_connect(ctx, NAME, &p);
	}
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect: %d %s", r, tp_last_error());
	for (;;) {
		struct tp_descriptor *d = NULL;
		struct tp_slot slot = { .data = buf };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
		unsigned step;
		size_t len;

		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		if (r == -EPIPE)
			break;
		TPT_REQUIRE(r == 0, 1, "reader %u: descriptor: %d %s", who, r, tp_last_error());
		if ((int)who == sc.victim)
			raise(SIGKILL);
		TPT_REQUIRE(d->metadata_len == 1 && d->n_payloads == 1, 1, "shape");
		step = *(const uint8_t *)d->metadata;
		len = d->payloads[0].length;
		TPT_REQUIRE((int)step > last && step < sc.n_steps && len == sc.steps[step].len, 1,
			    "reader %u: step %u (len %zu) after %d", who, step, len, last);
		r = tp_pipe_read_sync(p, d, &a);
		if (sc.steps[step].kind == STEP_BCAST_GONE) {
			TPT_REQUIRE(r < 0, 1, "reader %u: read of unmapped memory: %d", who, r);
			last = (int)step;
			continue;
		}
		TPT_REQUIRE(r == 0, 1, "reader %u: read: %d %s", who, r, tp_last_error());
		for (size_t k = 0; k < len; k++)
			TPT_REQUIRE(buf[k] == byte_of(step, k), 1, "reader %u step %u byte %zu",
				    who, step, k);
		last = (int)step;
	}
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* ---- the server ------------------------------------------------------------------------------ */

/* `tpipctl --json WHAT` of daemon @d: member @key of the object, or (@key NULL) the sum of
 * bytes_sent over the peers array; UINT64_MAX if none. */
static uint64_t ctl_u64(const struct tpt_daemon *d, const char *what, const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, "--json", what, NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *v;
	uint64_t val = UINT64_MAX;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return UINT64_MAX;
	o = json_tokener_parse(res.out);
	if (o && key && json_object_object_get_ex(o, key, &v))
		val = (uint64_t)json_object_get_int64(v);
	if (o && !key && json_object_object_get_ex(o, "peers", &v)) {
		val = 0;
		for (size_t i = 0; i < json_object_array_length(v); i++) {
			struct json_object *b;

			if (json_object_object_get_ex(json_object_array_get_idx(v, i), "bytes_sent",
						      &b))
				val += (uint64_t)json_object_get_int64(b);
		}
	}
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return val;
}

static uint64_t status_u64(const char *key)
{
	return ctl_u64(&dmn, "status", key);
}

struct wcount {
	pthread_mutex_t lock;
	unsigned left;
	int err;
};

static void write_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct wcount *w = arg;

	(void)p;
	(void)errmsg;
	pthread_mutex_lock(&w->lock);
	w->left--;
	if (status < 0)
		w->err = status;
	pthread_mutex_unlock(&w->lock);
}

/* The step's message (memory of @shm or @priv filled with its bytes). */
static void step_msg(unsigned i, void *shm, uint8_t *priv, struct tp_payload *pl,
		     struct tp_message *m, uint8_t *md)
{
	const struct step *st = &sc.steps[i];
	uint8_t *mem = st->kind == STEP_BCAST_SHM ? (uint8_t *)shm + i * BIG : priv + i * BIG;

	if (st->kind == STEP_BCAST_GONE) {
		mem = mmap(NULL, st->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			   0);
		if (mem != MAP_FAILED)
			munmap(mem, st->len); /* the address stays, the memory is gone */
	}
	for (size_t k = 0; st->kind != STEP_BCAST_GONE && k < st->len; k++)
		mem[k] = byte_of(i, k);
	*md = (uint8_t)i;
	*pl = (struct tp_payload){ .data = mem, .length = st->len };
	*m = (struct tp_message){ .metadata = md, .metadata_len = 1, .payloads = pl,
				  .n_payloads = 1 };
}

/* Broadcast step @i on @s: every delivery done (but the victim's), fanned out as wanted. */
static int step_bcast(struct tp_pipe_set *s, unsigned i, const struct tp_message *m)
{
	int st[MAXR], r;
	bool gone = sc.steps[i].kind == STEP_BCAST_GONE;
	unsigned n = tp_set_size(s), want = gone ? 0 : n - (sc.victim >= 0);

	r = tp_set_broadcast(s, m, T_MS, st, n);
	TPT_REQUIRE(r == (int)want, 1, "step %u: %d of %u delivered: %s", i, r, n,
		    tp_last_error());
	for (unsigned k = 0; k < n; k++)
		TPT_REQUIRE(gone ? st[k] < 0 : st[k] == 0 || (sc.victim >= 0 && st[k] < 0), 1,
			    "pipe %u: %d", k, st[k]);
	TPT_REQUIRE(tp_set_last_fanout(s) == sc.steps[i].want, 1, "step %u: fan-out %d, want %d",
		    i, (int)tp_set_last_fanout(s), (int)sc.steps[i].want);
	return 0;
}

static int server_run(struct tp_context *ctx, struct tp_listener *l, struct tp_pipe_set *s,
		      void *shm, uint8_t *priv)
{
	static uint8_t md[8];
	struct tp_payload pl[8];
	struct tp_message m[8];
	struct wcount w = { .lock = PTHREAD_MUTEX_INITIALIZER };

	(void)ctx;
	for (unsigned i = 0; i < sc.n_steps; i++) {
		unsigned pipes = sc.steps[i].pipes ? sc.steps[i].pipes : sc.readers;
		int r = tp_set_wait_pipes(s, l, pipes, T_MS);

		TPT_REQUIRE(r == 0, 1, "wait for %u: %d %s", pipes, r, tp_last_error());
		step_msg(i, shm, priv, &pl[i], &m[i], &md[i]);
		if (sc.steps[i].kind != STEP_WRITE_EACH) {
			if (step_bcast(s, i, &m[i]))
				return 1;
			continue;
		}
		/* not waited for: the next step's broadcast queues behind them */
		for (unsigned k = 0; k < tp_set_size(s); k++) {
			pthread_mutex_lock(&w.lock);
			w.left++;
			pthread_mutex_unlock(&w.lock);
			r = tp_pipe_write(tp_set_pipe(s, k), &m[i], write_on_done, &w);
			TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
		}
	}
	for (unsigned round = 0, t0 = (unsigned)tpt_now_ms();; round++) {
		unsigned left;

		pthread_mutex_lock(&w.lock);
		left = w.left;
		pthread_mutex_unlock(&w.lock);
		if (left == 0)
			break;
		TPT_REQUIRE((unsigned)tpt_now_ms() - t0 < T_MS, 1, "%u writes not done", left);
		tpt_backoff(round);
	}
	TPT_REQUIRE(w.err == 0, 1, "a write failed: %d", w.err);
	return 0;
}

static int server(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	void *shm = NULL;
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	uint8_t *priv = calloc(sc.n_steps, BIG);
	int r;

	(void)arg;
	r = tpt_ctx_new(&dmn, 0, "server", &ctx);
	if (r == 0)
		r = tp_listen(ctx, NAME, sc.remote ? &lo : NULL, &l);
	for (unsigned i = 0; i < sc.readers; i++)
		tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0 && priv, 1, "listen: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(ctx, sc.n_steps * BIG, &shm);
	TPT_REQUIRE(r == 0, 1, "buffer: %d", r);
	TPT_REQUIRE(tp_set_new(ctx, MAXR, &s) == 0, 1, "set: %s", tp_last_error());
	TPT_REQUIRE(tp_set_set_fanout(s, sc.mode) == 0, 1, "mode");
	r = server_run(ctx, l, s, shm, priv);
	if (r == 0 && sc.requests != UINT64_MAX) {
		uint64_t v = status_u64("bcast_requests");
		TPT_REQUIRE(v == sc.requests, 1, "bcast_requests %llu, want %llu",
			    (unsigned long long)v, (unsigned long long)sc.requests);
	}
	if (r == 0 && sc.staged_bytes != UINT64_MAX) {
		uint64_t v = status_u64("bcast_staged_bytes");
		TPT_REQUIRE(v == sc.staged_bytes, 1, "bcast_staged_bytes %llu, want %llu",
			    (unsigned long long)v, (unsigned long long)sc.staged_bytes);
	}
	if (r == 0 && sc.unstaged != UINT64_MAX) {
		uint64_t v = status_u64("bcast_unstaged");
		TPT_REQUIRE(v == sc.unstaged, 1, "bcast_unstaged %llu, want %llu",
			    (unsigned long long)v, (unsigned long long)sc.unstaged);
	}
	if (r == 0 && sc.b_staged_bytes) {
		uint64_t v = ctl_u64(&dmn_b, "status", "bcast_staged_bytes");
		TPT_REQUIRE(v == sc.b_staged_bytes, 1, "far bcast_staged_bytes %llu, want %llu",
			    (unsigned long long)v, (unsigned long long)sc.b_staged_bytes);
	}
	if (r == 0 && sc.b_stage_limit) {
		uint64_t v = ctl_u64(&dmn_b, "status", "bcast_unstaged");
		TPT_REQUIRE(v == sc.b_unstaged, 1, "far bcast_unstaged %llu, want %llu",
			    (unsigned long long)v, (unsigned long long)sc.b_unstaged);
	}
	if (r == 0 && sc.link_bytes_max) {
		uint64_t v = ctl_u64(&dmn, "peers", NULL);
		TPT_REQUIRE(v <= sc.link_bytes_max, 1, "%llu bytes over the link, at most %llu",
			    (unsigned long long)v, (unsigned long long)sc.link_bytes_max);
	}
	tp_set_free(s); /* closes the pipes: the readers see their end */
	tp_buffer_free(ctx, shm);
	free(priv);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r;
}

/* Starts the case's daemon with @args, runs the server and the readers; true if all pass. */
static bool run_case(const char *const *args)
{
	pid_t pids[MAXR];
	bool ok;

	if (sc.remote) {
		const char *a[16];
		size_t n = 0;

		for (const char *const *x = tpt_peer_args(); *x && n < 8; x++)
			a[n++] = *x;
		for (const char *const *x = args; x && *x && n < 15; x++)
			a[n++] = *x;
		a[n] = NULL;
		const char *bargs[16];
		size_t nb = 0;

		for (const char *const *x = tpt_peer_args(); *x && nb < 8; x++)
			bargs[nb++] = *x;
		if (sc.b_stage_limit) {
			bargs[nb++] = "--bcast-stage-bytes-per-uid";
			bargs[nb++] = sc.b_stage_limit;
		}
		bargs[nb] = NULL;
		ck_assert_int_eq(tpt_daemon_pair_start(&dmn, a, &dmn_b, bargs), 0);
		with_b = true;
	} else {
		ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	}
	for (unsigned i = 0; i < sc.readers; i++)
		pids[i] = tpt_fork(reader, (void *)(uintptr_t)i);
	ok = tpt_wait_ok(tpt_fork(server, NULL), T_MS * 2, "server");
	for (unsigned i = 0; i < sc.readers; i++) {
		int status = 0;

		if ((int)i != sc.victim) {
			ok = tpt_wait_ok(pids[i], T_MS * 2, "reader") && ok;
			continue;
		}
		ck_assert_int_eq(tpt_wait(pids[i], T_MS, &status), 0);
		ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	if (!ok)
		tpt_daemon_dump_log(&dmn);
	if (!ok && with_b)
		tpt_daemon_dump_log(&dmn_b);
	return ok;
}

static void add_step(enum step_kind kind, size_t len, enum tp_fanout want, unsigned pipes)
{
	sc.steps[sc.n_steps++] = (struct step){ kind, len, want, pipes };
}

/* ---- cases ---------------------------------------------------------------------------------- */

START_TEST(test_fanout_daemon_reads_private_memory_once_for_four_readers)
{
	sc.readers = 4;
	add_step(STEP_BCAST_SHM, BIG, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, BIG, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 100, TP_FANOUT_DAEMON, 0); /* eager: inline, once in the frame */
	add_step(STEP_BCAST_PRIV, 3 << 20, TP_FANOUT_DAEMON, 0);
	sc.requests = 4;
	sc.staged_bytes = BIG + (3 << 20); /* each read once, not once per reader */
	sc.unstaged = 0;
	ck_assert(run_case(NULL));
}
END_TEST

START_TEST(test_fanout_keeps_each_pipes_order_with_its_writes)
{
	sc.readers = 4;
	add_step(STEP_WRITE_EACH, 1 << 20, 0, 0);
	add_step(STEP_BCAST_PRIV, 2 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 200, 0, 0);
	add_step(STEP_BCAST_SHM, 1 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 3 << 20, 0, 0);
	add_step(STEP_BCAST_PRIV, 50, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 10, 0, 0);
	sc.requests = 3;
	sc.staged_bytes = 2 << 20;
	sc.unstaged = UINT64_MAX;
	ck_assert(run_case(NULL));
}
END_TEST

/* bcast-pipes-max 4: a set of 4 fans out in the daemon, a set of 5 in the library. */
START_TEST(test_fanout_pipes_max_just_below_and_above)
{
	const char *args[] = { "--bcast-pipes-max", "4", NULL };

	sc.readers = 5;
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_DAEMON, 4);
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_LIBRARY, 5);
	sc.requests = 1;
	sc.staged_bytes = 1 << 20;
	sc.unstaged = 0;
	ck_assert(run_case(args));
}
END_TEST

/* bcast-stage-bytes-per-uid 1M: 1 MiB of private memory is staged, 1 MiB + 1 byte is not (each
 * reader reads the writer's memory), and both arrive whole. */
START_TEST(test_fanout_stage_bytes_per_uid_just_below_and_above)
{
	const char *args[] = { "--bcast-stage-bytes-per-uid", "1M", NULL };

	sc.readers = 3;
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, (1 << 20) + 1, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_DAEMON, 0); /* the first was given back */
	sc.requests = 3;
	sc.staged_bytes = 2 << 20;
	sc.unstaged = 1;
	ck_assert(run_case(args));
}
END_TEST

/* A daemon that takes no Broadcast (as an older one): the set writes each pipe. */
START_TEST(test_fanout_falls_back_to_the_library_without_daemon_fanout)
{
	const char *args[] = { "--bcast-pipes-max", "0", NULL };

	sc.readers = 2;
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_LIBRARY, 0);
	add_step(STEP_BCAST_SHM, 1 << 20, TP_FANOUT_LIBRARY, 0);
	sc.requests = 0;
	sc.staged_bytes = 0;
	sc.unstaged = 0;
	ck_assert(run_case(args));
}
END_TEST

/* TP_FANOUT_DAEMON where the daemon cannot: -EOPNOTSUPP, nothing sent. */
START_TEST(test_fanout_daemon_mode_refused_where_the_daemon_cannot)
{
	const char *args[] = { "--bcast-pipes-max", "0", NULL };
	struct tp_context *a = NULL, *b = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *pb = NULL, *acc = NULL;
	struct tp_pipe_set *s = NULL;
	struct tp_descriptor *d = NULL;
	char one = 1;
	struct tp_payload pl = { .data = &one, .length = 1 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	int st = 1;

	ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&dmn, 0, "a", &a), 0);
	ck_assert_int_eq(tpt_ctx_new(&dmn, 0, "b", &b), 0);
	ck_assert_int_eq(tp_listen(a, NAME, NULL, &l), 0);
	ck_assert_int_eq(tp_connect(b, NAME, &pb), 0);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &acc), 0);
	ck_assert_int_eq(tp_set_new(a, 2, &s), 0);
	ck_assert_int_eq(tp_set_set_fanout(s, (enum tp_fanout)7), -EINVAL);
	ck_assert_int_eq(tp_set_last_fanout(s), TP_FANOUT_AUTO);
	ck_assert_int_eq(tp_set_add(s, acc), 0);
	ck_assert_int_eq(tp_set_set_fanout(s, TP_FANOUT_DAEMON), 0);
	ck_assert_int_eq(tp_set_broadcast(s, &m, T_MS, &st, 1), -EOPNOTSUPP);
	ck_assert_int_eq(st, 1);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pb, 200, &d), -ETIMEDOUT);
	tp_set_free(s);
	tp_pipe_close(pb);
	tp_listener_close(l);
	tp_context_free(b);
	tp_context_free(a);
}
END_TEST

/* A reader killed after its descriptor of a staged (private) broadcast fails only its pipe, and
 * the next broadcast still goes through the daemon for the others. */
START_TEST(test_fanout_reader_killed_in_staged_broadcast_fails_only_its_pipe)
{
	sc.readers = 4;
	sc.victim = 2;
	add_step(STEP_BCAST_PRIV, BIG, TP_FANOUT_DAEMON, 0);
	/* the dead pipe's write is refused alone: the others still fan out in the daemon */
	add_step(STEP_BCAST_SHM, 1 << 20, TP_FANOUT_DAEMON, 0);
	sc.requests = 2;
	sc.staged_bytes = BIG;
	sc.unstaged = 0;
	ck_assert(run_case(NULL));
}
END_TEST

/* Two readers here and two behind a second daemon: one request; the private bytes are read once
 * into staging for the local readers, and once more for the link (PeerBcast), which the far
 * daemon stages for its two readers. */
START_TEST(test_fanout_mixes_local_and_remote_readers)
{
	sc.readers = 4;
	sc.remote = 2;
	add_step(STEP_BCAST_PRIV, BIG, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 1 << 20, 0, 0);
	add_step(STEP_BCAST_SHM, 2 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 100, TP_FANOUT_DAEMON, 0);
	sc.requests = 3;
	sc.staged_bytes = BIG;
	sc.unstaged = 0;
	ck_assert(run_case(NULL));
}
END_TEST

/* The daemon's one read of the private source fails (the memory is gone): every delivery fails
 * with it, in its place in its pipe's order, the staging is given back, and the pipes and the
 * next broadcast go on. */
START_TEST(test_fanout_failed_staging_read_fails_every_delivery_only)
{
	sc.readers = 3;
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_GONE, 2 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 3 << 20, TP_FANOUT_DAEMON, 0);
	sc.requests = 3;
	sc.staged_bytes = 4 << 20; /* the failed read counts nothing */
	sc.unstaged = 0;
	ck_assert(run_case(NULL));
}
END_TEST

/* Three readers behind a second daemon: each broadcast crosses the peer link once (PeerBcast)
 * and the far daemon reads it into its staging once, for its three readers; an ordinary write
 * between them keeps each pipe's order. */
START_TEST(test_fanout_crosses_the_peer_link_once)
{
	sc.readers = 3;
	sc.remote = 3;
	add_step(STEP_BCAST_PRIV, BIG, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 1 << 20, 0, 0);
	add_step(STEP_BCAST_SHM, BIG, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 100, TP_FANOUT_DAEMON, 0); /* eager: a descriptor per pipe */
	sc.requests = 3;
	sc.staged_bytes = 0; /* no reader on this host */
	sc.unstaged = 0;
	sc.b_staged_bytes = 2 * BIG;
	/* 2 x 16 MiB once, 3 x 1 MiB of writes, framing: well below 3 x 2 x 16 MiB */
	sc.link_bytes_max = 2 * BIG + 3 * (1 << 20) + (4 << 20);
	ck_assert(run_case(NULL));
}
END_TEST

/* The far daemon's staging limit (1 MiB for the link): a 1 MiB broadcast is staged there once,
 * a 4 MiB one is not: each of its readers reads its copy over the link on its own, in order
 * with the pipe's other messages. */
START_TEST(test_fanout_far_daemon_over_its_staging_limit_reads_each_target)
{
	sc.readers = 3;
	sc.remote = 3;
	sc.b_stage_limit = "1M";
	add_step(STEP_BCAST_PRIV, 1 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_BCAST_PRIV, 4 << 20, TP_FANOUT_DAEMON, 0);
	add_step(STEP_WRITE_EACH, 1 << 20, 0, 0);
	add_step(STEP_BCAST_SHM, 1 << 20, TP_FANOUT_DAEMON, 0);
	sc.requests = 3;
	sc.staged_bytes = 0;
	sc.unstaged = 0;
	sc.b_staged_bytes = 2 << 20;
	sc.b_unstaged = 1;
	ck_assert(run_case(NULL));
}
END_TEST

static Suite *fanout_suite(void)
{
	Suite *s = suite_create("fanout");
	TCase *tc = tcase_create("daemon");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, fanout_setup, fanout_teardown);
	tcase_add_test(tc, test_fanout_daemon_reads_private_memory_once_for_four_readers);
	tcase_add_test(tc, test_fanout_keeps_each_pipes_order_with_its_writes);
	tcase_add_test(tc, test_fanout_pipes_max_just_below_and_above);
	tcase_add_test(tc, test_fanout_stage_bytes_per_uid_just_below_and_above);
	tcase_add_test(tc, test_fanout_falls_back_to_the_library_without_daemon_fanout);
	tcase_add_test(tc, test_fanout_daemon_mode_refused_where_the_daemon_cannot);
	tcase_add_test(tc, test_fanout_reader_killed_in_staged_broadcast_fails_only_its_pipe);
	tcase_add_test(tc, test_fanout_mixes_local_and_remote_readers);
	tcase_add_test(tc, test_fanout_failed_staging_read_fails_every_delivery_only);
	tcase_add_test(tc, test_fanout_crosses_the_peer_link_once);
	tcase_add_test(tc, test_fanout_far_daemon_over_its_staging_limit_reads_each_target);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(fanout_suite());
}
