/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite 'ring': shared-memory control rings between libtpclient contexts and tpipd.
 * A default client talks through a ring (tp_context_transport(), `tpipctl sessions/pipes
 * --json`), a client with TP_CONTEXT_NO_RING or a daemon with --ring-max 0 or a smaller ring-max
 * (also after a reload) stays on the socket, every pairing moves messages both ways, and bad
 * ring options or environment values are refused. The smallest ring (4 KiB) carries frames far
 * larger than itself, shared-buffer fds and 8 writer threads on one context, every byte checked
 * and in order; no-spin clients, a never-spinning daemon and idle gaps longer than any spin
 * window lose no wake-up, nor does a callback due while a blocking call polls the ring in the io
 * thread's place, nor one of a stream of asynchronous reads between blocking calls (the io
 * thread lingering, sleeping or never spinning); a writer killed while blocked on a full ring leaves the daemon whole.
 * Regression cases: a busy ring (kept moving by a raw client) does not starve socket clients,
 * and a shared buffer right after tp_context_new() keeps its connection. Raw ring clients that
 * break the protocol are in test_ring_raw.c. Timing is only ever checked against generous upper
 * bounds.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ring_common.h"

#define GAP_MS 300 /* an idle gap much longer than any spin window */

enum { CODE_RING = 1, CODE_UNIX = 2 };

/* ---- clients -------------------------------------------------------------------------------- */

static int8_t transport_code(const struct tp_context *ctx)
{
	const char *t = tp_context_transport(ctx);

	return strcmp(t, "ring") == 0 ? CODE_RING : strcmp(t, "unix") == 0 ? CODE_UNIX : -1;
}

static int msg_write(struct tp_context *ctx, struct tp_pipe *p, const struct tpt_msg_spec *s,
		     enum tpt_mem mem)
{
	struct tpt_msg *m = malloc(sizeof(*m));
	int r;

	TPT_REQUIRE(m, -ENOMEM, "malloc");
	r = tpt_msg_build(ctx, s, mem, m);
	if (r == 0) {
		r = tp_pipe_write_sync(p, &m->m);
		if (r)
			tpt_log("msg %u/%u: write: %d %s", s->pipe, s->index, r, tp_last_error());
	}
	tpt_msg_free(ctx, m);
	free(m);
	return r;
}

/* ---- ping-pong between an echo listener and a pinger ------------------------------------- */

struct pp {
	struct ring_cl echo, ping;
	unsigned n;	 /* round trips */
	unsigned gap_at; /* before this round trip (0: none), the pinger idles GAP_MS */
	bool gated;	 /* the pinger opens its context only after `gate` */
};

static struct pp pp;

static void pp_spec(unsigned i, unsigned dir, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 60 + dir;
	s->index = i;
	s->n_payloads = 1;
	s->lens[0] = 1000 + i;
	s->meta_len = 16;
	if (i % 4 == 3) {
		s->n_tensors = 1;
		s->lens[1] = (100u << 10) + i;
	}
}

static int pp_echo(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	int r = ring_ctx_open(&pp.echo, "pp-echo", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "pp", NULL, &l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "echo: listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "echo: accept: %d %s", r, tp_last_error());
	tpt_sync_post(&ring_st_a, transport_code(ctx));
	TPT_REQUIRE(tpt_sync_wait(&ring_release, T_MS) == 0, 1, "echo: no release");
	for (unsigned i = 0; i < pp.n; i++) {
		pp_spec(i, 0, &s);
		r = tpt_msg_read_check(ctx, p, &s, i % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "echo: ping %u: %d", i, r);
		pp_spec(i, 1, &s);
		r = msg_write(ctx, p, &s, i % 3 ? TPT_MEM_PRIVATE : TPT_MEM_SHM);
		TPT_REQUIRE(r == 0, 1, "echo: pong %u: %d", i, r);
	}
	tpt_sync_wait(&ring_done, T_MS); /* the pinger is through: close after it */
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int pp_ping(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	uint64_t t0, gap_rtt = 0;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "ping: listener not ready");
	TPT_REQUIRE(!pp.gated || tpt_sync_wait(&ring_gate, T_MS) == 0, 1, "ping: gate");
	TPT_REQUIRE(ring_ctx_open(&pp.ping, "pp-ping", &ctx) == 0, 1, "ping: context");
	r = tp_connect(ctx, "pp", &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "ping: connect: %d %s", r, tp_last_error());
	tpt_sync_post(&ring_st_b, transport_code(ctx));
	TPT_REQUIRE(tpt_sync_wait(&ring_release, T_MS) == 0, 1, "ping: no release");
	for (unsigned i = 0; i < pp.n; i++) {
		if (pp.gap_at && i == pp.gap_at)
			usleep(GAP_MS * 1000); /* the idle gap under test, not a synchronisation */
		t0 = tpt_now_ms();
		pp_spec(i, 0, &s);
		r = msg_write(ctx, p, &s, i % 2 ? TPT_MEM_PRIVATE : TPT_MEM_SLAB);
		TPT_REQUIRE(r == 0, 1, "ping %u: %d", i, r);
		pp_spec(i, 1, &s);
		r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_MIXED, T_MS);
		TPT_REQUIRE(r == 0, 1, "pong %u: %d", i, r);
		if (pp.gap_at && i == pp.gap_at)
			gap_rtt = tpt_now_ms() - t0;
	}
	tpt_sync_post(&ring_done, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	if (pp.gap_at)
		tpt_log("round trip after a %d ms idle gap: %llu ms", GAP_MS,
			(unsigned long long)gap_rtt);
	TPT_REQUIRE(gap_rtt < SLOW_MS, 1, "the round trip after the gap took %llu ms",
		    (unsigned long long)gap_rtt);
	return 0;
}

struct pp_run {
	pid_t echo, ping;
};

static struct pp_run pp_fork(void)
{
	struct pp_run run = { tpt_fork(pp_echo, NULL), tpt_fork(pp_ping, NULL) };

	ck_assert_int_gt(run.echo, 0);
	ck_assert_int_gt(run.ping, 0);
	return run;
}

/* Waits until both ends are connected and checks the transports they report (CODE_*). */
static void pp_check(int want_echo, int want_ping)
{
	ck_assert_int_eq(tpt_sync_wait(&ring_st_a, T_MS), want_echo);
	ck_assert_int_eq(tpt_sync_wait(&ring_st_b, T_MS), want_ping);
}

/* Starts both ends and checks the transports they report. */
static struct pp_run pp_start(int want_echo, int want_ping)
{
	struct pp_run run = pp_fork();

	pp_check(want_echo, want_ping);
	return run;
}

/* Lets both ends ping-pong and waits for them. */
static void pp_finish(const struct pp_run *run)
{
	tpt_sync_post(&ring_release, 0);
	tpt_sync_post(&ring_release, 0);
	ck_assert(tpt_wait_ok(run->ping, 2 * T_MS, "pinger"));
	ck_assert(tpt_wait_ok(run->echo, 2 * T_MS, "echo"));
}

/* ---- tpipctl -------------------------------------------------------------------------------- */

static struct json_object *ctl_json(const char *what)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", ring_dmn.socket, "--json", what, NULL };
	struct tpt_cmd_result res;
	struct json_object *o;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl %s: %s",
		      what, res.err);
	o = json_tokener_parse(res.out);
	ck_assert_msg(o != NULL, "not JSON:\n%s", res.out);
	tpt_cmd_result_free(&res);
	return o;
}

static struct json_object *jget(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no '%s' in %s", key,
		      json_object_to_json_string(o));
	return v;
}

/* `tpipctl sessions` shows the session of @pid with @transport and @ring_bytes. */
static void check_session(pid_t pid, const char *transport, int64_t ring_bytes)
{
	struct json_object *o = ctl_json("sessions"), *arr = jget(o, "sessions");
	int found = 0;

	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *s = json_object_array_get_idx(arr, i);

		if (json_object_get_int64(jget(s, "pid")) != pid)
			continue;
		found++;
		ck_assert_str_eq(json_object_get_string(jget(s, "transport")), transport);
		ck_assert_int_eq(json_object_get_int64(jget(s, "ring_bytes")), ring_bytes);
	}
	ck_assert_msg(found == 1, "%d sessions of pid %d", found, (int)pid);
	json_object_put(o);
}

/* `tpipctl pipes` shows the pipe of listener @name with @transport. */
static void check_pipe(const char *name, const char *transport)
{
	struct json_object *o = ctl_json("pipes"), *arr = jget(o, "pipes");
	int found = 0;

	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *p = json_object_array_get_idx(arr, i);

		if (strcmp(json_object_get_string(jget(p, "listener")), name) != 0)
			continue;
		found++;
		ck_assert_str_eq(json_object_get_string(jget(p, "transport")), transport);
	}
	ck_assert_msg(found == 1, "%d pipes of listener '%s'", found, name);
	json_object_put(o);
}

/* ---- transports ------------------------------------------------------------------------------ */

static const struct pairing {
	struct ring_cl echo, ping;
	int code_echo, code_ping;
	int64_t rb_echo, rb_ping;
	const char *pipe;
} pairings[] = {
	{ { 0 }, { 0 }, CODE_RING, CODE_RING, TPU_RING_DEFAULT, TPU_RING_DEFAULT, "ring" },
	{ { 0 }, { .flags = TP_CONTEXT_NO_RING }, CODE_RING, CODE_UNIX, TPU_RING_DEFAULT, 0,
	  "ring,unix" },
	{ { .flags = TP_CONTEXT_NO_RING }, { .ring_bytes = RING_MIN }, CODE_UNIX, CODE_RING, 0,
	  RING_MIN, "ring,unix" },
	{ { .flags = TP_CONTEXT_NO_RING }, { .flags = TP_CONTEXT_NO_RING }, CODE_UNIX, CODE_UNIX,
	  0, 0, "unix" },
};

START_TEST(test_ring_transport_reported_for_each_pairing)
{
	const struct pairing *c = &pairings[_i];
	struct pp_run run;

	ring_up(NULL);
	pp = (struct pp){ .echo = c->echo, .ping = c->ping, .n = 24 };
	run = pp_start(c->code_echo, c->code_ping);
	check_session(run.echo, c->code_echo == CODE_RING ? "ring" : "unix", c->rb_echo);
	check_session(run.ping, c->code_ping == CODE_RING ? "ring" : "unix", c->rb_ping);
	check_pipe("pp", c->pipe);
	pp_finish(&run);
	ring_down();
}
END_TEST

START_TEST(test_ring_max_zero_keeps_clients_on_the_socket)
{
	static const char *const args[] = { "--ring-max", "0", NULL };
	struct pp_run run;

	ring_up(args);
	pp = (struct pp){ .n = 24 };
	run = pp_start(CODE_UNIX, CODE_UNIX);
	check_session(run.echo, "unix", 0);
	check_session(run.ping, "unix", 0);
	check_pipe("pp", "unix");
	ring_wait_log("control ring refused");
	ring_wait_log("ring-max = 0");
	pp_finish(&run);
	ring_down();
}
END_TEST

START_TEST(test_ring_max_taken_at_the_limit_refused_above)
{
	static const char *const args[] = { "--ring-max", "64K", NULL };
	struct pp_run run;

	ring_up(args);
	pp = (struct pp){ .echo = { .ring_bytes = 64u << 10 }, .ping = { .ring_bytes = 128u << 10 },
			  .n = 24 };
	run = pp_start(CODE_RING, CODE_UNIX);
	check_session(run.echo, "ring", 64u << 10);
	check_session(run.ping, "unix", 0);
	check_pipe("pp", "ring,unix");
	ring_wait_log("ring larger than the daemon's ring-max");
	pp_finish(&run);
	ring_down();
}
END_TEST

/* Appends @text to the daemon's config file and reloads it (SIGHUP). */
static void reload_with(const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/tpipd.conf", ring_dmn.dir);
	f = fopen(path, "ae");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	ck_assert_int_eq(kill(ring_dmn.pid, SIGHUP), 0);
	ring_wait_log("reloaded");
}

/* ring-max is read at each RingSetup: a reload applies it to clients that come later. */
START_TEST(test_ring_reload_applies_ring_max_to_later_clients)
{
	struct pp_run run;

	ring_up(NULL);
	pp = (struct pp){ .n = 12, .gated = true };
	run = pp_fork();
	ring_wait_log("listening on 'pp'"); /* the echo's context is up, on its ring */
	reload_with("[daemon]\nring-max = 0\n");
	tpt_sync_post(&ring_gate, 0);
	pp_check(CODE_RING, CODE_UNIX);
	check_session(run.echo, "ring", TPU_RING_DEFAULT);
	check_session(run.ping, "unix", 0);
	check_pipe("pp", "ring,unix");
	ring_wait_log("ring-max = 0");
	pp_finish(&run);
	ring_down();
}
END_TEST

/* tp_context_new() with @c and $TPIPD_RING_BYTES / $TPIPD_SPIN_US set to @ring / @spin. */
static int ctx_try(const struct ring_cl *c, const char *ring, const char *spin,
		   struct tp_context **ret)
{
	struct tp_context_options o = { .size = sizeof(o), .socket_path = ring_dmn.socket,
					.flags = c->flags, .ring_bytes = c->ring_bytes,
					.spin_us = c->spin_us };

	setenv("TPIPD_RING_BYTES", ring ? ring : "", 1);
	setenv("TPIPD_SPIN_US", spin ? spin : "", 1);
	*ret = NULL;
	return tp_context_new(&o, ret);
}

/* Expects tp_context_new() to give @want_r and, on success, @want_transport. */
static int ctx_expect(const struct ring_cl *c, const char *ring, const char *spin, int want_r,
		      int want_transport)
{
	struct tp_context *ctx;
	int r = ctx_try(c, ring, spin, &ctx), got = r == 0 ? transport_code(ctx) : 0;

	tp_context_free(ctx);
	TPT_REQUIRE(r == want_r && (r || got == want_transport), 1,
		    "ring_bytes %u spin_us %u flags %u env '%s' '%s': %d, transport %d (want %d, "
		    "%d)", c->ring_bytes, c->spin_us, c->flags, ring ? ring : "", spin ? spin : "",
		    r, got, want_r, want_transport);
	return 0;
}

static int context_options(void *arg)
{
	static const uint32_t bad[] = { 2048, RING_MIN + 1, 3 * RING_MIN, TPU_RING_MAX * 2u };
	const struct ring_cl no_ring_odd = { .flags = TP_CONTEXT_NO_RING, .ring_bytes = 5000 };
	int fails = 0;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(bad); i++)
		fails += ctx_expect(&(struct ring_cl){ .ring_bytes = bad[i] }, NULL, NULL, -EINVAL,
				    0);
	fails += ctx_expect(&(struct ring_cl){ .ring_bytes = RING_MIN }, NULL, NULL, 0, CODE_RING);
	fails += ctx_expect(&no_ring_odd, NULL, NULL, 0, CODE_UNIX); /* size unused: fine */
	/* the environment fills what the options leave at 0 */
	fails += ctx_expect(&(struct ring_cl){ 0 }, "0", NULL, 0, CODE_UNIX);
	fails += ctx_expect(&(struct ring_cl){ 0 }, "8K", NULL, 0, CODE_RING);
	fails += ctx_expect(&(struct ring_cl){ 0 }, "junk", NULL, -EINVAL, 0);
	fails += ctx_expect(&(struct ring_cl){ 0 }, "5000", NULL, -EINVAL, 0);
	fails += ctx_expect(&(struct ring_cl){ .ring_bytes = RING_MIN }, "junk", NULL, 0,
			    CODE_RING);
	fails += ctx_expect(&(struct ring_cl){ 0 }, NULL, "0", 0, CODE_RING);
	fails += ctx_expect(&(struct ring_cl){ 0 }, NULL, "junk", -EINVAL, 0);
	/* spin_us: at most 100 ms */
	fails += ctx_expect(&(struct ring_cl){ .spin_us = 100000 }, NULL, NULL, 0, CODE_RING);
	fails += ctx_expect(&(struct ring_cl){ .spin_us = 100001 }, NULL, NULL, -EINVAL, 0);
	return fails ? 1 : 0;
}

START_TEST(test_ring_context_options_and_environment)
{
	ring_up(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(context_options, NULL), T_MS, "client"));
	ring_down();
}
END_TEST

/* ---- data through small rings ---------------------------------------------------------------- */

#define BIG_N 24

static void big_spec(unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 70;
	s->index = i;
	if (i % 2 == 0) { /* eager: the frame is 15 times the ring */
		s->n_payloads = 1;
		s->lens[0] = (60u << 10) + i;
		s->meta_len = 100;
	} else { /* a shared buffer: its fd goes ahead of the frame */
		s->n_tensors = 1;
		s->lens[0] = (1u << 20) + i;
		s->seg_meta_len = 7;
	}
}

static const struct ring_cl small_ring = { .ring_bytes = RING_MIN };

/*
 * The other load of the same pair: eager messages of 2 to 4 KiB through rings of 32 KiB (an
 * eager_max of 4 KiB), so that their frames begin at every position of both rings: whole data
 * tails in one piece are handled where they lie in the ring (by the daemon and by the reader's
 * library), the others are copied out first, and every byte must arrive either way.
 */
#define TAIL_N 240
static bool big_tails;
static const struct ring_cl tail_ring = { .ring_bytes = 32u << 10 };

static void tail_spec(unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 71;
	s->index = i;
	s->n_payloads = 1;
	s->lens[0] = 2048 + (i * 397u) % 2049;
	s->meta_len = i % 7;
}

static unsigned big_n(void)
{
	return big_tails ? TAIL_N : BIG_N;
}

static void big_or_tail_spec(unsigned i, struct tpt_msg_spec *s)
{
	if (big_tails)
		tail_spec(i, s);
	else
		big_spec(i, s);
}

static enum tpt_mem big_mem(unsigned i, bool writer)
{
	if (big_tails)
		return writer || i % 2 ? TPT_MEM_PRIVATE : TPT_MEM_SHM;
	if (writer)
		return i % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE;
	return i % 4 < 2 ? TPT_MEM_PRIVATE : TPT_MEM_SHM;
}

static int big_reader(void *arg)
{
	struct tpt_end e = { 0 };
	struct tpt_msg_spec s;
	int r = ring_ctx_open(big_tails ? &tail_ring : &small_ring, "big-r", &e.ctx);

	if (r == 0)
		r = tp_listen(e.ctx, "big", NULL, &e.l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	TPT_REQUIRE(transport_code(e.ctx) == CODE_RING, 1, "reader: %s",
		    tp_context_transport(e.ctx));
	r = tp_listener_accept_sync(e.l, T_MS, &e.p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	for (unsigned i = 0; i < big_n(); i++) {
		big_or_tail_spec(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, big_mem(i, false), T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_sync_wait(&ring_done, T_MS);
	tpt_end_close(&e);
	return 0;
}

static int big_writer(void *arg)
{
	static struct tpt_done dn;
	static struct tpt_done_arg da[TAIL_N > BIG_N ? TAIL_N : BIG_N];
	unsigned n = big_n();
	struct tpt_msg *m = calloc(n, sizeof(*m));
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	int r;

	TPT_REQUIRE(m && tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "reader not ready");
	TPT_REQUIRE(ring_ctx_open(big_tails ? &tail_ring : &small_ring, "big-w", &ctx) == 0, 1,
		    "context");
	TPT_REQUIRE(transport_code(ctx) == CODE_RING, 1, "writer: %s", tp_context_transport(ctx));
	r = tp_connect(ctx, "big", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	tpt_done_init(&dn);
	for (unsigned i = 0; i < n; i++) {
		big_or_tail_spec(i, &s);
		r = tpt_msg_build(ctx, &s, big_mem(i, true), &m[i]);
		TPT_REQUIRE(r == 0, 1, "build %u: %d", i, r);
	}
	for (unsigned i = 0; i < n; i++) { /* all in flight at once */
		da[i] = (struct tpt_done_arg){ &dn, i };
		r = tp_pipe_write(p, &m[i].m, tpt_done_cb, &da[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	TPT_REQUIRE(tpt_done_wait(&dn, n, 2 * T_MS) == 0, 1, "%u of %u writes completed",
		    dn.count, n);
	for (unsigned i = 0; i < n; i++)
		TPT_REQUIRE(dn.status[i] == 0, 1, "write %u: %d", i, dn.status[i]);
	TPT_REQUIRE(dn.order_errors == 0, 1, "%u writes completed out of order", dn.order_errors);
	tpt_sync_post(&ring_done, 0);
	for (unsigned i = 0; i < n; i++)
		tpt_msg_free(ctx, &m[i]);
	free(m);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ring_smallest_ring_carries_frames_larger_than_itself)
{
	big_tails = false;
	ring_up(NULL);
	ck_assert(tpt_run_pair(big_reader, big_writer, NULL, 3 * T_MS));
	ring_check_nothing_left();
	ring_down();
}
END_TEST

START_TEST(test_ring_eager_tails_at_every_ring_position_arrive_intact)
{
	big_tails = true;
	ring_up(NULL);
	ck_assert(tpt_run_pair(big_reader, big_writer, NULL, 3 * T_MS));
	ring_check_nothing_left();
	ring_down();
}
END_TEST

/* Eight writer threads on one context, over eight pipes or one. */
#define MT_THREADS 8
#define MT_MSGS 30

static bool mt_one_pipe;

static void mt_spec(unsigned t, unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 100 + t;
	s->index = i;
	if (i % 3 == 2) {
		s->n_tensors = 1;
		s->lens[0] = (300u << 10) + i; /* rendezvous */
	} else {
		s->n_payloads = 1;
		s->lens[0] = i % 3 ? (60u << 10) + t : 3000 + i; /* eager */
	}
}

struct mt_thread {
	struct tp_context *ctx;
	struct tp_pipe *p;
	unsigned t;
	unsigned next[MT_THREADS];
	int r;
};

static void *mt_write_thread(void *arg)
{
	struct mt_thread *w = arg;
	struct tpt_msg *m = malloc(sizeof(*m));
	struct tpt_msg_spec s;
	uint32_t tag[2];

	for (unsigned i = 0; m && w->r == 0 && i < MT_MSGS; i++) {
		mt_spec(w->t, i, &s);
		w->r = tpt_msg_build(w->ctx, &s, TPT_MEM_PRIVATE, m);
		tag[0] = w->t;
		tag[1] = i;
		m->m.metadata = tag;
		m->m.metadata_len = sizeof(tag);
		if (w->r == 0 && (w->r = tp_pipe_write_sync(w->p, &m->m)) != 0)
			tpt_log("thread %u: write %u: %d %s", w->t, i, w->r, tp_last_error());
		tpt_msg_free(w->ctx, m);
	}
	free(m);
	return NULL;
}

/* Reads one tagged message and checks its order (per writer thread) and every byte. */
static int mt_read_one(struct tp_context *ctx, struct tp_pipe *p, int want_t, unsigned *next)
{
	struct tp_descriptor *d = NULL;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { 0 };
	struct tpt_msg_spec s;
	uint32_t tag[2] = { MT_THREADS, 0 };
	size_t len, bad;
	int r = tp_pipe_read_descriptor_sync(p, T_MS, &d);

	TPT_REQUIRE(r == 0, r, "read_descriptor: %d %s", r, tp_last_error());
	if (d->metadata_len == sizeof(tag))
		memcpy(tag, d->metadata, sizeof(tag));
	if (tag[0] >= MT_THREADS || (want_t >= 0 && tag[0] != (unsigned)want_t) ||
	    tag[1] != next[tag[0]]) {
		tpt_log("message tag %u/%u out of order or wrong", tag[0], tag[1]);
		tp_descriptor_free(d);
		return 1;
	}
	mt_spec(tag[0], next[tag[0]]++, &s);
	len = s.lens[0];
	if (d->n_payloads != s.n_payloads || d->n_tensors != s.n_tensors ||
	    (s.n_payloads ? d->payloads[0].length : d->tensors[0].length) != len) {
		tpt_log("message %u/%u: wrong shape", tag[0], tag[1]);
		tp_descriptor_free(d);
		return 1;
	}
	slot.data = malloc(len);
	if (s.n_payloads)
		a = (struct tp_allocation){ .payloads = &slot, .n_payloads = 1 };
	else
		a = (struct tp_allocation){ .tensors = &slot, .n_tensors = 1 };
	r = tp_pipe_read_sync(p, d, &a);
	if (r == 0 && !tpt_verify(slot.data, len, tpt_seed(s.pipe, s.index, 0), &bad)) {
		tpt_log("message %u/%u differs at byte %zu", tag[0], tag[1], bad);
		r = 1;
	}
	free(slot.data);
	return r;
}

static void *mt_read_thread(void *arg)
{
	struct mt_thread *w = arg;

	for (unsigned i = 0; w->r == 0 && i < MT_MSGS; i++)
		w->r = mt_read_one(w->ctx, w->p, (int)w->t, w->next);
	return NULL;
}

static int mt_join(pthread_t *t, struct mt_thread *w, unsigned n)
{
	int r = 0;

	for (unsigned i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		r = r ? r : w[i].r;
	}
	return r;
}

static int mt_reader(void *arg)
{
	static struct mt_thread w[MT_THREADS];
	struct tp_listener *l[MT_THREADS];
	unsigned n = mt_one_pipe ? 1 : MT_THREADS;
	struct tp_context *ctx;
	pthread_t t[MT_THREADS];
	char name[16];
	int r = ring_ctx_open(&(struct ring_cl){ 0 }, "mt-r", &ctx);

	for (unsigned i = 0; r == 0 && i < n; i++) {
		snprintf(name, sizeof(name), "mt-%u", i);
		r = tp_listen(ctx, name, NULL, &l[i]);
	}
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (unsigned i = 0; i < n; i++) {
		w[i] = (struct mt_thread){ .ctx = ctx, .t = i };
		r = tp_listener_accept_sync(l[i], T_MS, &w[i].p);
		TPT_REQUIRE(r == 0, 1, "accept %u: %d", i, r);
	}
	if (mt_one_pipe) {
		for (unsigned i = 0; r == 0 && i < MT_THREADS * MT_MSGS; i++)
			r = mt_read_one(ctx, w[0].p, -1, w[0].next);
	} else {
		for (unsigned i = 0; i < n; i++)
			pthread_create(&t[i], NULL, mt_read_thread, &w[i]);
		r = mt_join(t, w, n);
	}
	TPT_REQUIRE(r == 0, 1, "reading: %d", r);
	tpt_sync_wait(&ring_done, T_MS);
	tp_context_free(ctx);
	return 0;
}

static int mt_writer(void *arg)
{
	static struct mt_thread w[MT_THREADS];
	struct tp_context *ctx;
	pthread_t t[MT_THREADS];
	char name[16];
	int r;

	TPT_REQUIRE(tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "reader not ready");
	TPT_REQUIRE(ring_ctx_open(&small_ring, "mt-w", &ctx) == 0, 1, "context");
	TPT_REQUIRE(transport_code(ctx) == CODE_RING, 1, "writer: %s", tp_context_transport(ctx));
	for (unsigned i = 0; i < MT_THREADS; i++) {
		w[i] = (struct mt_thread){ .ctx = ctx, .t = i };
		if (mt_one_pipe && i > 0) {
			w[i].p = w[0].p;
			continue;
		}
		snprintf(name, sizeof(name), "mt-%u", i);
		r = tp_connect(ctx, name, &w[i].p);
		if (r == 0)
			r = tp_pipe_wait_connected(w[i].p, T_MS);
		TPT_REQUIRE(r == 0, 1, "connect %u: %d", i, r);
	}
	for (unsigned i = 0; i < MT_THREADS; i++)
		pthread_create(&t[i], NULL, mt_write_thread, &w[i]);
	r = mt_join(t, w, MT_THREADS);
	tpt_sync_post(&ring_done, 0);
	TPT_REQUIRE(r == 0, 1, "writing: %d", r);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ring_eight_writer_threads_share_one_context)
{
	mt_one_pipe = _i == 1;
	ring_up(NULL);
	ck_assert(tpt_run_pair(mt_reader, mt_writer, NULL, 4 * T_MS));
	ring_check_nothing_left();
	ring_down();
}
END_TEST

/* ---- spinning and sleeping ------------------------------------------------------------------- */

START_TEST(test_ring_wakeups_survive_spin_settings_and_idle_gaps)
{
	static const char *const no_spin[] = { "--spin-us", "0", NULL };
	const struct ring_cl quiet = { .flags = TP_CONTEXT_NO_SPIN };
	struct pp_run run;

	/* 0: clients never spin; 1: the daemon never spins; 2: neither; 3: defaults */
	ring_up(_i == 1 || _i == 2 ? no_spin : NULL);
	pp = (struct pp){ .n = 60, .gap_at = 30 };
	if (_i == 0 || _i == 2)
		pp.echo = pp.ping = quiet;
	run = pp_start(CODE_RING, CODE_RING);
	pp_finish(&run);
	ring_down();
}
END_TEST

/* ---- one poller of the ring: a blocked caller, the io thread asleep ------------------------ */

/*
 * While a thread blocks in a _sync call and polls the ring, the io thread sleeps (context.c,
 * ring_poll_start()). The poller blocks on pipe 2 with an asynchronous descriptor request
 * pending on pipe 1; the sender writes on pipe 1 and writes on pipe 2 only once the poller's
 * callback for pipe 1 ran: a sleeping io thread never woken for that callback would leave the
 * blocked call waiting until its deadline. Then a message after an idle gap longer than any
 * spin: the last poller to stop must have left the doorbell set for the io thread.
 */
static struct tp_descriptor *poll_desc;

static void poll_on_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
			 struct tp_descriptor *d)
{
	poll_desc = d;
	tpt_sync_post(&ring_st_b, (int8_t)(status == 0 ? 1 : -1));
}

static int poll_small_write(struct tp_pipe *p, uint64_t v)
{
	struct tp_message m = { .metadata = &v, .metadata_len = sizeof(v) };

	return tp_pipe_write_sync(p, &m);
}

static int poll_read(struct tp_pipe *p, uint64_t want)
{
	struct tp_allocation none = { 0 };
	struct tp_descriptor *d;
	uint64_t got = 0;
	int r = tp_pipe_read_descriptor_sync(p, SLOW_MS, &d);

	if (r < 0)
		return r;
	if (d->metadata_len == sizeof(got))
		memcpy(&got, d->metadata, sizeof(got));
	r = tp_pipe_read_sync(p, d, &none);
	return r < 0 ? r : got == want ? 0 : -EBADMSG;
}

static int poll_receiver(void *arg)
{
	const struct ring_cl *c = arg;
	struct tp_allocation none = { 0 };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p1, *p2;
	uint64_t t0;
	int r = ring_ctx_open(c, "poll-receiver", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "poll", NULL, &l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	TPT_REQUIRE(transport_code(ctx) == CODE_RING, 1, "not on a ring");
	r = tp_listener_accept_sync(l, T_MS, &p1);
	TPT_REQUIRE(r == 0, 1, "accept 1: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p2);
	TPT_REQUIRE(r == 0, 1, "accept 2: %d", r);
	TPT_REQUIRE(tp_pipe_read_descriptor(p1, poll_on_desc, NULL) == 0, 1, "arm");
	tpt_sync_post(&ring_gate, 0);
	r = poll_read(p2, 2);
	TPT_REQUIRE(r == 0, 1, "pipe 2 while pipe 1's callback was due: %d", r);
	TPT_REQUIRE(poll_desc && tp_pipe_read_sync(p1, poll_desc, &none) == 0, 1, "pipe 1");
	t0 = tpt_now_ms();
	r = poll_read(p1, 3);
	TPT_REQUIRE(r == 0, 1, "after the gap: %d", r);
	tpt_log("the read across a %d ms idle gap took %llu ms", GAP_MS,
		(unsigned long long)(tpt_now_ms() - t0));
	tpt_sync_post(&ring_done, 0);
	tp_pipe_close(p1);
	tp_pipe_close(p2);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int poll_sender(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p1, *p2;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "receiver not ready");
	TPT_REQUIRE(ring_ctx_open(&(struct ring_cl){ 0 }, "poll-sender", &ctx) == 0, 1, "ctx");
	r = tp_connect(ctx, "poll", &p1);
	if (r == 0)
		r = tp_pipe_wait_connected(p1, T_MS);
	if (r == 0)
		r = tp_connect(ctx, "poll", &p2);
	if (r == 0)
		r = tp_pipe_wait_connected(p2, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&ring_gate, T_MS) == 0, 1, "gate");
	TPT_REQUIRE(poll_small_write(p1, 1) == 0, 1, "write 1");
	r = tpt_sync_wait(&ring_st_b, SLOW_MS);
	TPT_REQUIRE(r == 1, 1, "the receiver's callback for pipe 1 did not run: %d", r);
	TPT_REQUIRE(poll_small_write(p2, 2) == 0, 1, "write 2");
	usleep(GAP_MS * 1000); /* the idle gap under test, not a synchronisation */
	TPT_REQUIRE(poll_small_write(p1, 3) == 0, 1, "write 3");
	tpt_sync_wait(&ring_done, T_MS);
	tp_pipe_close(p1);
	tp_pipe_close(p2);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ring_callbacks_run_while_a_blocked_call_polls)
{
	/* 0: the default spin; 1: a 100 ms spin, so the blocked call still polls when pipe 1's
	 * message comes */
	static const struct ring_cl cl[] = { { 0 }, { .spin_us = 100000 } };
	pid_t rcv, snd;

	ring_up(NULL);
	rcv = tpt_fork(poll_receiver, (void *)&cl[_i]);
	snd = tpt_fork(poll_sender, NULL);
	ck_assert(tpt_wait_ok(snd, 2 * T_MS, "sender"));
	ck_assert(tpt_wait_ok(rcv, 2 * T_MS, "receiver"));
	ring_down();
}
END_TEST

/* ---- a stream of asynchronous reads between blocking calls ----------------------------------- */

/*
 * A reader that gets each descriptor in a blocking call and reads it asynchronously: every
 * eager read completes inside tp_pipe_read() and leaves its callback to the io thread, which
 * after such work lingers instead of sleeping while the blocked call polls (context.c,
 * context_ring_linger()). Every callback must run, in order, whether the io thread lingers,
 * sleeps or never spins: during the stream, across idle gaps longer than any linger, and when
 * the reader stops calling the library and only waits for its callbacks (every tenth message:
 * the last poller stops while the io thread may be lingering).
 */
#define STREAM_N 400

static pthread_mutex_t stream_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stream_cv = PTHREAD_COND_INITIALIZER;
static unsigned stream_done;
static bool stream_bad;

static void stream_on_read(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	pthread_mutex_lock(&stream_mu);
	if (status != 0 || (uintptr_t)arg != stream_done)
		stream_bad = true;
	stream_done++;
	pthread_cond_broadcast(&stream_cv);
	pthread_mutex_unlock(&stream_mu);
}

/* Waits without calling the library until @n callbacks ran. Return: 0, -ETIMEDOUT, -EBADMSG. */
static int stream_wait(unsigned n)
{
	struct timespec ts;
	int r = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += T_MS / 1000;
	pthread_mutex_lock(&stream_mu);
	while (stream_done < n && !stream_bad && r == 0)
		r = pthread_cond_timedwait(&stream_cv, &stream_mu, &ts);
	r = stream_bad ? -EBADMSG : stream_done >= n ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&stream_mu);
	return r;
}

static int stream_receiver(void *arg)
{
	const struct ring_cl *c = arg;
	struct tp_allocation none = { 0 };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = ring_ctx_open(c, "stream-receiver", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "stream", NULL, &l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	TPT_REQUIRE(transport_code(ctx) == CODE_RING, 1, "not on a ring");
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	for (unsigned i = 0; i < STREAM_N; i++) {
		struct tp_descriptor *d;
		uint64_t got = UINT64_MAX;

		r = tp_pipe_read_descriptor_sync(p, SLOW_MS, &d);
		TPT_REQUIRE(r == 0, 1, "descriptor %u: %d (%u callbacks ran)", i, r, stream_done);
		if (d->metadata_len == sizeof(got))
			memcpy(&got, d->metadata, sizeof(got));
		TPT_REQUIRE(got == i, 1, "message %u carried %llu", i, (unsigned long long)got);
		r = tp_pipe_read(p, d, &none, stream_on_read, (void *)(uintptr_t)i);
		TPT_REQUIRE(r == 0, 1, "read %u: %d", i, r);
		if (i % 10 == 9) {
			r = stream_wait(i + 1);
			TPT_REQUIRE(r == 0, 1, "callback %u: %d (%u ran)", i, r, stream_done);
		}
	}
	r = stream_wait(STREAM_N);
	TPT_REQUIRE(r == 0, 1, "callbacks: %d (%u ran)", r, stream_done);
	tpt_sync_post(&ring_done, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int stream_sender(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "receiver not ready");
	TPT_REQUIRE(ring_ctx_open(&(struct ring_cl){ 0 }, "stream-sender", &ctx) == 0, 1, "ctx");
	r = tp_connect(ctx, "stream", &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "connect: %d %s", r, tp_last_error());
	for (unsigned i = 0; i < STREAM_N; i++) {
		if (i == 105 || i == 301)
			usleep(GAP_MS * 1000); /* idle gaps under test, not a synchronisation */
		r = poll_small_write(p, i);
		TPT_REQUIRE(r == 0, 1, "write %u: %d", i, r);
	}
	tpt_sync_wait(&ring_done, T_MS);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_ring_async_reads_between_blocking_calls_lose_no_callback)
{
	/* 0: the default spin; 1: a 100 ms spin (the io thread lingers through the stream);
	 * 2: a client that never spins (nor lingers) */
	static const struct ring_cl cl[] = { { 0 }, { .spin_us = 100000 },
					     { .flags = TP_CONTEXT_NO_SPIN } };
	pid_t rcv, snd;

	ring_up(NULL);
	rcv = tpt_fork(stream_receiver, (void *)&cl[_i]);
	snd = tpt_fork(stream_sender, NULL);
	ck_assert(tpt_wait_ok(snd, 2 * T_MS, "sender"));
	ck_assert(tpt_wait_ok(rcv, 2 * T_MS, "receiver"));
	ring_check_nothing_left();
	ring_down();
}
END_TEST

/* ---- a writer killed while blocked on a full ring ------------------------------------------- */

/* A client SIGKILLed while blocked writing a 1 MiB frame into a 4 KiB ring. */
static int blocked_peer(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	int r = ring_ctx_open(&(struct ring_cl){ 0 }, "blocked-peer", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "blocked", NULL, &l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	tpt_sync_post(&ring_st_a, 0);
	r = tp_pipe_read_descriptor_sync(p, 2 * T_MS, &d);
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT, 1, "read_descriptor after the writer died: %d", r);
	tpt_log("the peer of the killed writer got %d (%s)", r, tp_strerror(r));
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int blocked_writer(void *arg)
{
	static const struct ring_cl c = { .ring_bytes = RING_MIN, .eager_max = 1u << 20 };
	static struct tpt_done dn;
	struct tpt_done_arg da = { &dn, 0 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_payload pl = { .length = 1u << 20 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	int r;

	TPT_REQUIRE(tpt_sync_wait(&ring_ready, T_MS) == 0, 1, "peer not ready");
	TPT_REQUIRE(ring_ctx_open(&c, "blocked-writer", &ctx) == 0, 1, "context");
	TPT_REQUIRE(transport_code(ctx) == CODE_RING, 1, "writer: %s", tp_context_transport(ctx));
	r = tp_connect(ctx, "blocked", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	pl.data = malloc(pl.length);
	TPT_REQUIRE(pl.data, 1, "malloc");
	tpt_fill(pl.data, pl.length, 5);
	tpt_done_init(&dn);
	tpt_sync_post(&ring_st_b, 0);
	TPT_REQUIRE(tpt_sync_wait(&ring_release, T_MS) == 0, 1, "no go");
	tpt_sync_post(&ring_st_b, 1);
	r = tp_pipe_write(p, &m, tpt_done_cb, &da); /* blocks: the daemon is stopped */
	tpt_log("the write returned %d while tpipd was stopped", r);
	tpt_sync_wait(&ring_done, T_MS); /* killed while waiting here */
	return 2;
}

/* True once the main thread of @pid sleeps in futex() (the ring's wait for space). */
static bool in_futex(pid_t pid)
{
	char path[64], buf[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/syscall", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return strncmp(buf, "202 ", 4) == 0; /* SYS_futex on x86_64 */
}

START_TEST(test_ring_writer_killed_while_blocked_on_full_ring)
{
	pid_t peer = tpt_fork(blocked_peer, NULL), wr = tpt_fork(blocked_writer, NULL);
	uint64_t deadline;
	int status;

	ck_assert_int_eq(tpt_sync_wait(&ring_st_a, T_MS), 0); /* accepted */
	ck_assert_int_eq(tpt_sync_wait(&ring_st_b, T_MS), 0); /* connected */
	ck_assert_int_eq(kill(ring_dmn.pid, SIGSTOP), 0);
	tpt_sync_post(&ring_release, 0);
	ck_assert_int_eq(tpt_sync_wait(&ring_st_b, T_MS), 1); /* writing */
	deadline = tpt_now_ms() + 10000;
	for (unsigned i = 0; !in_futex(wr); i++) {
		if (tpt_now_ms() > deadline) {
			kill(ring_dmn.pid, SIGCONT);
			ck_abort_msg("the writer never blocked on the full ring");
		}
		tpt_backoff(i);
	}
	ck_assert_int_eq(kill(wr, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(wr, T_MS, &status), 0);
	ck_assert(WIFSIGNALED(status));
	ck_assert_int_eq(kill(ring_dmn.pid, SIGCONT), 0);
	ck_assert(tpt_wait_ok(peer, 2 * T_MS, "peer"));
	ring_check_nothing_left();
	ring_check_daemon_serves("after-blocked-writer");
	ring_check_nothing_left();
}
END_TEST

/* ---- regressions ----------------------------------------------------------------------------- */

/* A raw ring client that keeps the daemon's spin loop busy with one tiny frame per ms. */
struct busy {
	struct tpt_raw raw;
	struct tpt_raw_ring g;
	bool stop; /* atomic */
	unsigned sent;
	int err;
};

static void *busy_main(void *arg)
{
	struct busy *b = arg;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRelease br = TPW__V1__BUFFER_RELEASE__INIT;
	uint64_t deadline = tpt_now_ms() + 2 * T_MS;

	br.buf_id = 999; /* unknown: released silently, no answer */
	br.gen = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE;
	m.buffer_release = &br;
	while (!__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE) && tpt_now_ms() < deadline) {
		b->err = tpt_raw_ring_send(&b->raw, &b->g, &m, NULL, 0, NULL, 0, 0, T_MS);
		if (b->err)
			break;
		b->sent++;
		usleep(1000); /* pacing: 1 ms between frames, far inside the spin window */
	}
	return NULL;
}

/*
 * Regression (daemon/daemon.c, daemon_on_spin): the spin loop re-armed itself with
 * event_active() from inside its own callback, which libevent 2.1 runs again in the same pass
 * over the active queue without returning to epoll. While any ring kept moving (here: one tiny
 * frame per ms, inside a --spin-us window) the daemon never polled its sockets: no connection
 * was accepted, and socket clients, signals, timers and copy completions waited until every
 * ring had been idle for the whole spin budget.
 */
START_TEST(test_ring_busy_ring_does_not_starve_socket_clients)
{
	static const char *const args[] = { "--spin-us", "100000", NULL };
	static struct busy b;
	struct tpt_raw raw;
	pthread_t t;
	uint64_t tail0, t0;
	int r;

	ring_up(args);
	ck_assert_int_eq(ring_raw_open(&b.raw, &b.g, RING_MIN), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, busy_main, &b), 0);
	tail0 = tpt_raw_ring_shm(&b.g)->c2d.tail;
	for (unsigned i = 0; tpt_raw_ring_shm(&b.g)->c2d.tail < tail0 + 200; i++)
		tpt_backoff(i); /* the daemon consumes the busy ring */
	t0 = tpt_now_ms();
	ck_assert_int_eq(tpt_raw_connect(&raw, ring_dmn.socket), 0);
	r = tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, SLOW_MS);
	__atomic_store_n(&b.stop, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	printf("socket Hello while a ring was busy: %d after %llu ms (%u busy frames)\n", r,
	       (unsigned long long)(tpt_now_ms() - t0), b.sent);
	ck_assert_int_eq(b.err, 0);
	ck_assert_msg(r == 0, "no HelloReply on the socket in %d ms while a ring was busy (%d)",
		      SLOW_MS, r);
	tpt_raw_close(&raw);
	ring_raw_close(&b.raw, &b.g);
	ring_down();
}
END_TEST

/*
 * The same window with libtpclient: a shared buffer right after tp_context_new() (its fd byte
 * follows the RingSetup on the socket). Two contexts in three lost their daemon connection.
 */
static int buffer_right_away(void *arg)
{
	unsigned bad = 0, n = 100;

	for (unsigned i = 0; i < n; i++) {
		struct tp_context *ctx;
		void *buf = NULL;
		int r;

		TPT_REQUIRE(ring_ctx_open(&(struct ring_cl){ 0 }, "right-away", &ctx) == 0, 1,
			    "context");
		r = tp_buffer_alloc(ctx, 4096, &buf);
		if (r) {
			if (!bad)
				tpt_log("context %u: buffer: %d %s", i, r, tp_last_error());
			bad++;
		} else {
			tp_buffer_free(ctx, buf);
		}
		tp_context_free(ctx);
	}
	TPT_REQUIRE(bad == 0, 1, "%u of %u contexts lost their daemon connection", bad, n);
	return 0;
}

START_TEST(test_ring_buffer_right_after_context_works)
{
	ring_up(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(buffer_right_away, NULL), 2 * T_MS, "client"));
	ring_check_nothing_left();
	ring_down();
}
END_TEST

static Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *tr = tcase_create("transport");
	TCase *data = tcase_create("data");
	TCase *blocked = tcase_create("blocked");
	TCase *reg = tcase_create("regressions");

	tcase_add_loop_test(tr, test_ring_transport_reported_for_each_pairing, 0,
			    (int)TPU_ARRAY_SIZE(pairings));
	tcase_add_test(tr, test_ring_max_zero_keeps_clients_on_the_socket);
	tcase_add_test(tr, test_ring_max_taken_at_the_limit_refused_above);
	tcase_add_test(tr, test_ring_reload_applies_ring_max_to_later_clients);
	tcase_add_test(tr, test_ring_context_options_and_environment);
	tcase_set_timeout(tr, 120);
	suite_add_tcase(s, tr);

	tcase_add_test(data, test_ring_smallest_ring_carries_frames_larger_than_itself);
	tcase_add_test(data, test_ring_eager_tails_at_every_ring_position_arrive_intact);
	tcase_add_loop_test(data, test_ring_eight_writer_threads_share_one_context, 0, 2);
	tcase_add_loop_test(data, test_ring_wakeups_survive_spin_settings_and_idle_gaps, 0, 4);
	tcase_add_loop_test(data, test_ring_callbacks_run_while_a_blocked_call_polls, 0, 2);
	tcase_add_loop_test(data, test_ring_async_reads_between_blocking_calls_lose_no_callback, 0,
			    3);
	tcase_set_timeout(data, 240);
	suite_add_tcase(s, data);

	tcase_add_checked_fixture(blocked, ring_up_default, ring_down);
	tcase_add_test(blocked, test_ring_writer_killed_while_blocked_on_full_ring);
	tcase_set_timeout(blocked, 120);
	suite_add_tcase(s, blocked);

	tcase_add_test(reg, test_ring_busy_ring_does_not_starve_socket_clients);
	tcase_add_test(reg, test_ring_buffer_right_after_context_works);
	tcase_set_timeout(reg, 120);
	suite_add_tcase(s, reg);
	return s;
}

int main(void)
{
	return tpt_run_suite(ring_suite());
}
