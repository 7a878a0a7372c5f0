/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: pipe rings (issue 27; tpipd --pipe-ring yes). Private->private messages at
 * or over --pipe-ring-min move through a staging ring the two clients map, the bytes never
 * through the daemon. Shown here: messages of 0 B to 16 MiB + 3 (one and two segments), several
 * in flight on three pipes at once, read back byte-exact, with exactly the messages of at least
 * pipe-ring-min bytes counted as moved by a ring (`tpipctl --json status`); a 256 MiB message;
 * the daemon-wide and per-uid ring byte limits at exactly one ring's bytes and one byte under it
 * (a pipe without a ring falls back to cma, byte-exact); a writer SIGKILLed in the middle of a
 * ring transfer fails its reader's read and nothing else (the reader's other pipe still moves a
 * ring message) and its ring is freed; a reader SIGKILLed in the middle of one fails the write
 * and nothing else; every ring is freed once the pipes close; forty pairs of
 * fresh processes in a row each get their ring and finish (no doorbell lost to the fd's read);
 * clients on the plain socket (no control ring, like a library before pipe rings) keep cma, and
 * `tpipctl -v pipes` says why; clients without CMA use the ring too once their first large
 * message brought the offer (a 256 MiB message, a reader into shared buffers), and stage as
 * before over the ring limits (at one ring's bytes and one byte under).
 */
#include <check.h>
#include <json-c/json.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"

#define T_MS TPT_SCALED_MS(60000)
#define LISTENER "pring"
#define RING_BYTES 1052672u /* 4096 + 8 x 128 KiB: one ring, as the daemon makes them */
#define VICTIM_UID 4242
#define NPIPES 3
#define INFLIGHT 4

static struct tpt_daemon dmn;

/* Starts the daemon with pipe rings on, pipe-ring-min 64K, plus @extra (NULL-terminated). */
static void daemon_up(const char *const *extra)
{
	const char *args[16] = { "--pipe-ring", "yes", "--pipe-ring-min", "128K" };
	size_t n = 4;

	for (size_t i = 0; extra && extra[i] && n < 15; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	ck_assert_int_eq(tpt_daemon_start(&dmn, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dmn), 0);
}

static void daemon_down(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
}

/* A field of `tpipctl --json status`, or -1. */
static long long status_field(const char *field)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", dmn.socket, "--json", "status", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *v;
	long long n = -1;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return -1;
	o = json_tokener_parse(res.out);
	if (o && json_object_object_get_ex(o, field, &v))
		n = json_object_get_int64(v);
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return n;
}

/* Waits until status field @field is @want. Return: its last value. */
static long long status_wait(const char *field, long long want)
{
	uint64_t end = tpt_now_ms() + (uint64_t)T_MS;
	long long v;

	for (unsigned i = 0; (v = status_field(field)) != want && tpt_now_ms() < end; i++)
		tpt_backoff(i);
	return v;
}

struct ends {
	struct tp_context *cr, *cw;
	struct tp_listener *l;
	struct tp_pipe *pr[NPIPES], *pw[NPIPES];
};

/* Both contexts, a listener and @npipes pipes, on whatever transport the library takes. */
static int ends_open_any(struct ends *e, unsigned npipes)
{
	int r = tpt_ctx_new(&dmn, 0, "pr-reader", &e->cr);

	TPT_REQUIRE(r == 0, 1, "reader context: %d", r);
	r = tpt_ctx_new(&dmn, 0, "pr-writer", &e->cw);
	TPT_REQUIRE(r == 0, 1, "writer context: %d", r);
	TPT_REQUIRE(tp_context_cma_ok(e->cr) && tp_context_cma_ok(e->cw), 1, "no CMA");
	r = tp_listen(e->cr, LISTENER, NULL, &e->l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (unsigned i = 0; i < npipes; i++) {
		r = tp_connect(e->cw, LISTENER, &e->pw[i]);
		TPT_REQUIRE(r == 0, 1, "connect: %d", r);
		r = tp_listener_accept_sync(e->l, T_MS, &e->pr[i]);
		TPT_REQUIRE(r == 0, 1, "accept: %d", r);
		r = tp_pipe_wait_connected(e->pw[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "connected: %d", r);
	}
	return 0;
}

/* ends_open_any() on control rings (pipe rings need them). */
static int ends_open(struct ends *e, unsigned npipes)
{
	TPT_REQUIRE(ends_open_any(e, npipes) == 0, 1, "ends");
	TPT_REQUIRE(strcmp(tp_context_transport(e->cw), "ring") == 0 &&
			    strcmp(tp_context_transport(e->cr), "ring") == 0, 1, "no control ring");
	return 0;
}

static void ends_close(struct ends *e, unsigned npipes)
{
	for (unsigned i = 0; i < npipes; i++) {
		tp_pipe_close(e->pw[i]);
		tp_pipe_close(e->pr[i]);
	}
	tp_listener_close(e->l);
	tp_context_free(e->cw);
	tp_context_free(e->cr);
}

/* Eager up to 64 KiB; rendezvous under and at pipe-ring-min (128 KiB) and over it. */
#define RING_MIN (128u << 10)
static const size_t sizes[] = { 0,	    1,		 4096,		  (64u << 10) + 1,
				RING_MIN - 1, RING_MIN, RING_MIN + 1, (1u << 20) + 1,
				(16u << 20) + 3 };
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Message @index of pipe @pipe: one tensor, or a payload and a tensor splitting the size. */
static void spec_of(unsigned pipe, unsigned index, struct tpt_msg_spec *ret)
{
	size_t len = sizes[(index + 2 * pipe) % N_SIZES];

	*ret = (struct tpt_msg_spec){ .pipe = pipe, .index = index, .meta_len = 8 };
	if (index % 2) {
		ret->n_payloads = 1;
		ret->lens[0] = len / 3;
		ret->lens[1] = len - len / 3;
	} else {
		ret->lens[0] = len;
	}
	ret->n_tensors = 1;
}

static size_t spec_bytes(const struct tpt_msg_spec *s)
{
	return s->lens[0] + (s->n_payloads ? s->lens[1] : 0);
}

/*
 * Writes @rounds x INFLIGHT messages on each of @npipes pipes, all in flight at once per round,
 * reads them back byte-exact (private memory on both sides); counts in *@ret_ring the messages
 * of at least pipe-ring-min. Return: 0 or 1.
 */
static int pipes_run(struct ends *e, unsigned npipes, unsigned rounds, unsigned *ret_ring)
{
	struct tpt_msg msgs[NPIPES][INFLIGHT];
	struct tpt_done_arg args[NPIPES][INFLIGHT];
	struct tpt_done done[NPIPES];
	struct tpt_msg_spec spec;
	int r;

	for (unsigned p = 0; p < npipes; p++)
		tpt_done_init(&done[p]);
	for (unsigned round = 0; round < rounds; round++) {
		for (unsigned k = 0; k < INFLIGHT; k++) {
			for (unsigned p = 0; p < npipes; p++) {
				unsigned idx = round * INFLIGHT + k;

				spec_of(p, idx, &spec);
				*ret_ring += spec_bytes(&spec) >= RING_MIN;
				r = tpt_msg_build(e->cw, &spec, TPT_MEM_PRIVATE, &msgs[p][k]);
				TPT_REQUIRE(r == 0, 1, "build: %d", r);
				args[p][k] = (struct tpt_done_arg){ &done[p], idx };
				r = tp_pipe_write(e->pw[p], &msgs[p][k].m, tpt_done_cb, &args[p][k]);
				TPT_REQUIRE(r == 0, 1, "write: %s", tp_last_error());
			}
		}
		for (unsigned k = 0; k < INFLIGHT; k++) {
			for (unsigned p = 0; p < npipes; p++) {
				spec_of(p, round * INFLIGHT + k, &spec);
				r = tpt_msg_read_check(e->cr, e->pr[p], &spec, TPT_MEM_PRIVATE, T_MS);
				TPT_REQUIRE(r == 0, 1, "read %u/%u: %d", p, k, r);
			}
		}
		for (unsigned p = 0; p < npipes; p++) {
			r = tpt_done_wait(&done[p], (round + 1) * INFLIGHT, T_MS);
			TPT_REQUIRE(r == 0, 1, "write completions: %d", r);
			TPT_REQUIRE(done[p].order_errors == 0 && done[p].last_status == 0, 1,
				    "write status %d", done[p].last_status);
			for (unsigned k = 0; k < INFLIGHT; k++)
				tpt_msg_free(e->cw, &msgs[p][k]);
		}
	}
	return 0;
}

/* ---- byte-exact, many in flight ------------------------------------------------------------- */

static unsigned expect_ring;

static int child_many(void *arg)
{
	struct ends e = { 0 };

	(void)arg;
	TPT_REQUIRE(ends_open(&e, NPIPES) == 0, 1, "ends");
	TPT_REQUIRE(pipes_run(&e, NPIPES, 3, &expect_ring) == 0, 1, "run");
	TPT_REQUIRE(status_field("pipe_ring_msgs") == (long long)expect_ring, 1,
		    "%lld ring messages, expected %u", status_field("pipe_ring_msgs"), expect_ring);
	TPT_REQUIRE(status_field("pipe_rings") == NPIPES, 1, "%lld rings",
		    status_field("pipe_rings"));
	ends_close(&e, NPIPES);
	return 0;
}

START_TEST(test_ring_moves_messages_byte_exact)
{
	daemon_up(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(child_many, NULL), T_MS, "many"));
	ck_assert_int_eq(status_wait("pipe_rings", 0), 0);
	ck_assert_int_eq(status_wait("pipe_ring_bytes", 0), 0);
	daemon_down();
}
END_TEST

static int child_big(void *arg)
{
	struct ends e = { 0 };
	struct tpt_msg m;
	struct tpt_msg_spec spec = { .pipe = 7, .n_tensors = 1, .lens = { 256u << 20 } };
	int r;

	(void)arg;
	TPT_REQUIRE(ends_open(&e, 1) == 0, 1, "ends");
	r = tpt_msg_build(e.cw, &spec, TPT_MEM_PRIVATE, &m);
	TPT_REQUIRE(r == 0, 1, "build: %d", r);
	struct tpt_done done;
	struct tpt_done_arg a = { &done, 0 };

	tpt_done_init(&done);
	r = tp_pipe_write(e.pw[0], &m.m, tpt_done_cb, &a);
	TPT_REQUIRE(r == 0, 1, "write: %s", tp_last_error());
	r = tpt_msg_read_check(e.cr, e.pr[0], &spec, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "read: %d", r);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0 && done.last_status == 0, 1, "write");
	TPT_REQUIRE(status_field("pipe_ring_msgs") == 1, 1, "not through the ring");
	tpt_msg_free(e.cw, &m);
	ends_close(&e, 1);
	return 0;
}

/* As test_transfer's: a tensor, then a payload with metadata, each of 256 MiB. */
static void big_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 1;
	s->index = index;
	if (index == 0) {
		s->n_tensors = 1;
	} else {
		s->n_payloads = 1;
		s->meta_len = 8;
		s->seg_meta_len = 16;
	}
	s->lens[0] = 256u << 20;
}

START_TEST(test_ring_moves_256m)
{
	struct tpt_xfer x = {
		.d = &dmn, .name = "xfer", .n_msgs = 2, .spec = big_spec,
		.writer_mem = TPT_MEM_PRIVATE, .reader_mem = TPT_MEM_PRIVATE, .timeout_ms = T_MS,
	};

	daemon_up(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(child_big, NULL), T_MS, "big"));
	ck_assert(tpt_xfer_run(&x));
	ck_assert_int_eq(status_field("pipe_ring_msgs"), 3);
	daemon_down();
}
END_TEST

/* ---- limits --------------------------------------------------------------------------------- */

struct limit_case {
	bool as_victim;	    /* run the clients as uid VICTIM_UID */
	long long rings;    /* rings expected with two pipes */
};

static int child_limit(void *arg)
{
	const struct limit_case *c = arg;
	struct ends e = { 0 };
	unsigned ring = 0;

	if (c->as_victim) {
		TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(VICTIM_UID, VICTIM_UID,
				VICTIM_UID) == 0 && setresuid(VICTIM_UID, VICTIM_UID,
				VICTIM_UID) == 0, 1, "drop to %d", VICTIM_UID);
		/* dumpable again after the change of ids, so that CMA (and the probe) work */
		TPT_REQUIRE(prctl(PR_SET_DUMPABLE, 1) == 0, 1, "dumpable");
	}
	TPT_REQUIRE(ends_open(&e, 2) == 0, 1, "ends");
	TPT_REQUIRE(pipes_run(&e, 2, 1, &ring) == 0, 1, "run (byte-exact with or without rings)");
	TPT_REQUIRE(status_field("pipe_rings") == c->rings, 1, "%lld rings, expected %lld",
		    status_field("pipe_rings"), c->rings);
	TPT_REQUIRE(c->rings > 0 || status_field("pipe_ring_msgs") == 0, 1, "ring used");
	ends_close(&e, 2);
	return 0;
}

static void limit_run(const char *key, unsigned bytes, bool as_victim, long long rings)
{
	char v[32];
	const char *extra[] = { key, v, NULL };
	struct limit_case c = { as_victim, rings };

	snprintf(v, sizeof(v), "%u", bytes);
	daemon_up(extra);
	ck_assert(tpt_wait_ok(tpt_fork(child_limit, &c), T_MS, key));
	daemon_down();
}

START_TEST(test_ring_bytes_max_at_one_ring)
{
	limit_run("--pipe-ring-bytes-max", RING_BYTES, false, 1);
}
END_TEST

START_TEST(test_ring_bytes_max_under_one_ring)
{
	limit_run("--pipe-ring-bytes-max", RING_BYTES - 1, false, 0);
}
END_TEST

START_TEST(test_ring_bytes_per_uid_at_one_ring)
{
	limit_run("--pipe-ring-bytes-per-uid", RING_BYTES, true, 1);
}
END_TEST

START_TEST(test_ring_bytes_per_uid_under_one_ring)
{
	limit_run("--pipe-ring-bytes-per-uid", RING_BYTES - 1, true, 0);
}
END_TEST

/* ---- a writer killed in the middle of a ring transfer ---------------------------------------- */

#define KILL_BYTES (256u << 20)

static struct tpt_sync killed_ready;

static int child_doomed_writer(void *arg)
{
	struct tp_context *c;
	struct tp_pipe *p;
	struct tp_payload pl = { 0 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	uint8_t *buf = malloc(KILL_BYTES);
	int r;

	(void)arg;
	TPT_REQUIRE(buf, 1, "malloc");
	memset(buf, 0xa5, KILL_BYTES);
	pl.data = buf;
	pl.length = KILL_BYTES;
	r = tpt_ctx_new(&dmn, 0, "pr-doomed", &c);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tpt_sync_wait(&killed_ready, T_MS);
	TPT_REQUIRE(r == 0, 1, "listener: %d", r);
	r = tp_connect(c, LISTENER, &p);
	TPT_REQUIRE(r == 0, 1, "connect: %d", r);
	r = tp_pipe_write_sync(p, &m);
	tpt_log("the doomed writer's write ended (%d): it should have been killed first", r);
	return 1;
}

START_TEST(test_killed_writer_fails_only_its_pipe)
{
	struct ends e = { 0 };
	struct tp_descriptor *d;
	struct tp_pipe *pk;
	struct tp_slot slot;
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg arg = { &done, 0 };
	volatile uint8_t *dst;
	unsigned ring = 0;
	long long msgs;
	pid_t w;
	int st;

	daemon_up(NULL);
	ck_assert_int_eq(tpt_sync_init(&killed_ready), 0);
	w = tpt_fork(child_doomed_writer, NULL);
	ck_assert_int_gt(w, 0);
	ck_assert_int_eq(ends_open(&e, 1), 0);
	ck_assert_int_eq(tpt_sync_post(&killed_ready, 0), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &pk), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pk, T_MS, &d), 0);
	ck_assert_uint_eq(d->payloads[0].length, KILL_BYTES);
	dst = mmap(NULL, KILL_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(dst != MAP_FAILED);
	memset((void *)dst, 0, KILL_BYTES);
	slot = (struct tp_slot){ .data = (void *)dst };
	tpt_done_init(&done);
	ck_assert_int_eq(tp_pipe_read(pk, d, &a, tpt_done_cb, &arg), 0);
	/* The first chunk landed, the last not yet: the ring transfer is under way. */
	while (dst[0] != 0xa5)
		;
	ck_assert_int_eq(kill(w, SIGKILL), 0);
	ck_assert_int_eq(dst[KILL_BYTES - 1], 0);
	ck_assert_int_eq(tpt_wait(w, T_MS, &st), 0);
	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(tpt_done_wait(&done, 1, T_MS), 0);
	ck_assert_int_lt(done.last_status, 0);
	/* Only that pipe: the reader's other pipe moves ring messages as before. */
	msgs = status_field("pipe_ring_msgs");
	ck_assert_int_eq(pipes_run(&e, 1, 3, &ring), 0);
	ck_assert_uint_gt(ring, 0);
	ck_assert_int_eq(status_field("pipe_ring_msgs"), msgs + ring);
	tp_pipe_close(pk);
	ck_assert_int_eq(status_wait("pipe_rings", 1), 1);
	ends_close(&e, 1);
	ck_assert_int_eq(status_wait("pipe_rings", 0), 0);
	tpt_sync_done(&killed_ready);
	daemon_down();
}
END_TEST

/* ---- a reader killed in the middle of a ring transfer --------------------------------------- */

static struct tpt_sync reading;

/* Reads a KILL_BYTES message and, once its first chunk landed, says so and waits to be killed. */
static int child_doomed_reader(void *arg)
{
	struct tp_context *c;
	struct tp_pipe *p;
	struct tp_descriptor *d;
	struct tp_slot slot;
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	volatile uint8_t *dst = mmap(NULL, KILL_BYTES, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int r;

	(void)arg;
	TPT_REQUIRE(dst != MAP_FAILED, 1, "map");
	memset((void *)dst, 0, KILL_BYTES);
	slot = (struct tp_slot){ .data = (void *)dst };
	r = tpt_ctx_new(&dmn, 0, "pr-doomed", &c);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&killed_ready, T_MS) == 0, 1, "listener");
	TPT_REQUIRE(tp_connect(c, LISTENER, &p) == 0, 1, "connect");
	TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &d) == 0, 1, "descriptor");
	tpt_done_init(&done);
	TPT_REQUIRE(tp_pipe_read(p, d, &a, tpt_done_cb, &da) == 0, 1, "read");
	while (dst[0] != 0xa5)
		;
	tpt_sync_post(&reading, 0);
	tpt_done_wait(&done, 1, 10 * T_MS);
	tpt_log("the doomed reader's read ended (%d): it should have been killed first",
		done.last_status);
	return 1;
}

/* A reader that dies mid-message fails that write, and only it; its ring is freed. */
START_TEST(test_killed_reader_fails_the_write_and_only_its_pipe)
{
	struct ends e = { 0 };
	struct tp_pipe *pk;
	struct tp_payload pl = { 0 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	struct tpt_done done;
	struct tpt_done_arg arg = { &done, 0 };
	uint8_t *buf = malloc(KILL_BYTES);
	unsigned ring = 0;
	pid_t rd;
	int st;

	ck_assert_ptr_nonnull(buf);
	memset(buf, 0xa5, KILL_BYTES);
	pl.data = buf;
	pl.length = KILL_BYTES;
	daemon_up(NULL);
	ck_assert_int_eq(tpt_sync_init(&killed_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&reading), 0);
	rd = tpt_fork(child_doomed_reader, NULL);
	ck_assert_int_gt(rd, 0);
	ck_assert_int_eq(ends_open(&e, 1), 0);
	ck_assert_int_eq(tpt_sync_post(&killed_ready, 0), 0);
	ck_assert_int_eq(tp_listener_accept_sync(e.l, T_MS, &pk), 0);
	tpt_done_init(&done);
	ck_assert_int_eq(tp_pipe_write(pk, &m, tpt_done_cb, &arg), 0);
	ck_assert_int_eq(tpt_sync_wait(&reading, T_MS), 0);
	ck_assert_int_eq(kill(rd, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(rd, T_MS, &st), 0);
	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(tpt_done_wait(&done, 1, T_MS), 0);
	ck_assert_int_lt(done.last_status, 0);
	ck_assert_int_eq(pipes_run(&e, 1, 3, &ring), 0);
	ck_assert_uint_gt(ring, 0);
	tp_pipe_close(pk);
	ends_close(&e, 1);
	ck_assert_int_eq(status_wait("pipe_rings", 0), 0);
	tpt_sync_done(&killed_ready);
	tpt_sync_done(&reading);
	free(buf);
	daemon_down();
}
END_TEST

/* ---- a library on the plain socket keeps cma ------------------------------------------------ */

/* `tpipctl -v pipes` output (the channel notes of every pipe), or NULL. Return: owned. */
static char *pipes_verbose(void)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", dmn.socket, "-v", "pipes", NULL };
	struct tpt_cmd_result res;
	char *out;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return NULL;
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

static int child_socket(void *arg)
{
	struct ends e = { 0 };
	unsigned ring = 0;
	char *notes;
	bool said;

	(void)arg;
	setenv("TPIPD_RING_BYTES", "0", 1); /* no control ring: no fds beside it, no pipe ring */
	TPT_REQUIRE(tpt_ctx_new(&dmn, 0, "pr-reader", &e.cr) == 0, 1, "reader context");
	TPT_REQUIRE(strcmp(tp_context_transport(e.cr), "unix") == 0, 1, "on a control ring");
	tp_context_free(e.cr);
	TPT_REQUIRE(ends_open_any(&e, 1) == 0, 1, "ends");
	TPT_REQUIRE(pipes_run(&e, 1, 3, &ring) == 0, 1, "run");
	TPT_REQUIRE(ring > 0, 1, "no message at pipe-ring-min");
	TPT_REQUIRE(status_field("pipe_ring_msgs") == 0 && status_field("pipe_rings") == 0, 1,
		    "a pipe ring for a socket client");
	notes = pipes_verbose();
	said = notes && strstr(notes, "cma (no ring)") && strstr(notes, "takes no pipe ring");
	if (!said)
		tpt_log("tpipctl -v pipes: %s", notes ? notes : "(none)");
	free(notes);
	TPT_REQUIRE(said, 1, "the fallback is not explained");
	ends_close(&e, 1);
	return 0;
}

START_TEST(test_socket_client_keeps_cma_and_says_why)
{
	daemon_up(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(child_socket, NULL), T_MS, "socket"));
	daemon_down();
}
END_TEST

/*
 * Fresh processes each time, so that each pipe hands out its ring's fd anew: the library that
 * takes the fd also takes doorbells of frames behind it, and must not sleep through those
 * (a writer's WriteDone was lost that way).
 */
static void mid_spec(unsigned index, struct tpt_msg_spec *s)
{
	big_spec(index, s);
	s->lens[0] = 1u << 20;
}

START_TEST(test_ring_handed_out_to_fresh_processes)
{
	struct tpt_xfer x = {
		.d = &dmn, .name = "xfer", .n_msgs = 2, .spec = mid_spec,
		.writer_mem = TPT_MEM_PRIVATE, .reader_mem = TPT_MEM_PRIVATE,
		.timeout_ms = TPT_SCALED_MS(10000),
	};

	daemon_up(NULL);
	for (int i = 0; i < 40; i++)
		ck_assert_msg(tpt_xfer_run(&x), "iteration %d", i);
	ck_assert_int_eq(status_field("pipe_ring_msgs"), 80);
	daemon_down();
}
END_TEST

/* ---- clients without CMA -------------------------------------------------------------------- */

/*
 * A writer without CMA (TP_CONTEXT_NO_CMA, as where ptrace or YAMA refuses it) stages its first
 * large message; that message brings the offer of its pipe direction's ring, and from then on
 * its library names its memory by address and copies it into the ring itself, while the reader
 * copies out into whatever it allocated (private memory without CMA, or a shared buffer): no
 * staging buffer on either side. Over the ring limits there is no offer and every message is
 * staged as before, byte-exact.
 */
struct nocma_case {
	bool reader_cma;	/* the reader keeps CMA */
	enum tpt_mem reader_mem;
	size_t big;		/* the large message */
	long long ring_msgs;	/* expected: 3 with a ring, 0 without */
	const char *note;	/* in `tpipctl -v pipes` */
};

/* Message @i of the no-CMA run: staged (offer), big, two segments, under and at the minimum. */
static void nocma_spec(const struct nocma_case *c, unsigned i, struct tpt_msg_spec *s)
{
	static const size_t lens[] = { 1u << 20, 0, (16u << 20) + 3, (64u << 10) + 1, RING_MIN };

	*s = (struct tpt_msg_spec){ .pipe = 5, .index = i, .meta_len = 8, .n_tensors = 1 };
	s->lens[0] = i == 1 ? c->big : lens[i];
	if (i == 2) {
		s->n_payloads = 1;
		s->lens[1] = s->lens[0] - s->lens[0] / 3;
		s->lens[0] /= 3;
	}
}

static int child_nocma(void *arg)
{
	const struct nocma_case *c = arg;
	struct ends e = { 0 };
	struct tpt_msg_spec spec;
	struct tpt_msg m;
	struct tpt_done done;
	struct tpt_done_arg a[5];
	char *notes;
	bool said;
	int r;

	r = tpt_ctx_new(&dmn, c->reader_cma ? 0 : TP_CONTEXT_NO_CMA, "pr-reader", &e.cr);
	TPT_REQUIRE(r == 0, 1, "reader context: %d", r);
	r = tpt_ctx_new(&dmn, TP_CONTEXT_NO_CMA, "pr-writer", &e.cw);
	TPT_REQUIRE(r == 0, 1, "writer context: %d", r);
	TPT_REQUIRE(!tp_context_cma_ok(e.cw) && tp_context_cma_ok(e.cr) == c->reader_cma, 1,
		    "CMA");
	TPT_REQUIRE(tp_listen(e.cr, LISTENER, NULL, &e.l) == 0, 1, "listen");
	TPT_REQUIRE(tp_connect(e.cw, LISTENER, &e.pw[0]) == 0, 1, "connect");
	TPT_REQUIRE(tp_listener_accept_sync(e.l, T_MS, &e.pr[0]) == 0, 1, "accept");
	TPT_REQUIRE(strcmp(tp_context_transport(e.cw), "ring") == 0 &&
			    strcmp(tp_context_transport(e.cr), "ring") == 0, 1, "no control ring");
	tpt_done_init(&done);
	for (unsigned i = 0; i < 5; i++) {
		nocma_spec(c, i, &spec);
		r = tpt_msg_build(e.cw, &spec, TPT_MEM_PRIVATE, &m);
		TPT_REQUIRE(r == 0, 1, "build %u: %d", i, r);
		a[i] = (struct tpt_done_arg){ &done, i };
		r = tp_pipe_write(e.pw[0], &m.m, tpt_done_cb, &a[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %s", i, tp_last_error());
		r = tpt_msg_read_check(e.cr, e.pr[0], &spec, c->reader_mem, T_MS);
		TPT_REQUIRE(r == 0, 1, "read %u: %d %s", i, r, tp_last_error());
		r = tpt_done_wait(&done, i + 1, T_MS);
		TPT_REQUIRE(r == 0 && done.last_status == 0, 1, "write %u: %d", i,
			    done.last_status);
		tpt_msg_free(e.cw, &m);
		if (i == 0) /* staged, whatever the limits */
			TPT_REQUIRE(status_field("pipe_ring_msgs") == 0, 1, "first by ring");
	}
	TPT_REQUIRE(status_field("pipe_ring_msgs") == c->ring_msgs, 1,
		    "%lld ring messages, expected %lld", status_field("pipe_ring_msgs"),
		    c->ring_msgs);
	notes = pipes_verbose();
	said = notes && strstr(notes, c->note);
	if (!said)
		tpt_log("tpipctl -v pipes: %s", notes ? notes : "(none)");
	free(notes);
	TPT_REQUIRE(said, 1, "the choice is not explained (\"%s\")", c->note);
	ends_close(&e, 1);
	return 0;
}

static void nocma_run(const struct nocma_case *c, const char *const *extra)
{
	daemon_up(extra);
	ck_assert(tpt_wait_ok(tpt_fork(child_nocma, (void *)c), T_MS, "no-cma"));
	ck_assert_int_eq(status_wait("pipe_rings", 0), 0);
	daemon_down();
}

#define NOCMA_NOTE "ring: the writer has no CMA and was offered the ring"

START_TEST(test_ring_serves_writer_and_reader_without_cma)
{
	static const struct nocma_case c = { false, TPT_MEM_PRIVATE, 256u << 20, 3, NOCMA_NOTE };

	nocma_run(&c, NULL);
}
END_TEST

START_TEST(test_ring_serves_writer_without_cma_into_shared_buffers)
{
	static const struct nocma_case c = { true, TPT_MEM_SHM, 32u << 20, 3, NOCMA_NOTE };

	nocma_run(&c, NULL);
}
END_TEST

START_TEST(test_ring_for_no_cma_writer_at_one_ring)
{
	static const struct nocma_case c = { false, TPT_MEM_PRIVATE, 32u << 20, 3, NOCMA_NOTE };
	char v[32];
	const char *extra[] = { "--pipe-ring-bytes-max", v, NULL };

	snprintf(v, sizeof(v), "%u", RING_BYTES);
	nocma_run(&c, extra);
}
END_TEST

START_TEST(test_no_cma_writer_stages_under_one_ring)
{
	static const struct nocma_case c = { false, TPT_MEM_PRIVATE, 32u << 20, 0,
					     "staging (no ring): pipe rings hold 0 bytes" };
	char v[32];
	const char *extra[] = { "--pipe-ring-bytes-max", v, NULL };

	snprintf(v, sizeof(v), "%u", RING_BYTES - 1);
	nocma_run(&c, extra);
}
END_TEST

static Suite *pring_suite(void)
{
	Suite *s = suite_create("pring");
	TCase *tc = tcase_create("pring");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_ring_moves_messages_byte_exact);
	tcase_add_test(tc, test_ring_moves_256m);
	tcase_add_test(tc, test_ring_handed_out_to_fresh_processes);
	tcase_add_test(tc, test_ring_bytes_max_at_one_ring);
	tcase_add_test(tc, test_ring_bytes_max_under_one_ring);
	tcase_add_test(tc, test_ring_bytes_per_uid_at_one_ring);
	tcase_add_test(tc, test_ring_bytes_per_uid_under_one_ring);
	tcase_add_test(tc, test_killed_writer_fails_only_its_pipe);
	tcase_add_test(tc, test_killed_reader_fails_the_write_and_only_its_pipe);
	tcase_add_test(tc, test_socket_client_keeps_cma_and_says_why);
	tcase_add_test(tc, test_ring_serves_writer_and_reader_without_cma);
	tcase_add_test(tc, test_ring_serves_writer_without_cma_into_shared_buffers);
	tcase_add_test(tc, test_ring_for_no_cma_writer_at_one_ring);
	tcase_add_test(tc, test_no_cma_writer_stages_under_one_ring);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(pring_suite());
}
