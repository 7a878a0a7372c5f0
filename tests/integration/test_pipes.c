/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: pipe behaviour between client processes. 1000 pipelined asynchronous
 * writes arrive in order with their contents and complete in order; 16 pipes between two
 * processes carry concurrent traffic; both ends of one pipe write at once; closing one end lets
 * the other read what was written before and then see -EPIPE, and makes later writes fail with
 * -EPIPE; closing with a rendezvous write pending cancels it. Each case has its own daemon.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "itest.h"

#define T_MS 30000

/* Channels between the two children of a case; created before they fork. */
static struct tpt_sync to_a, to_b;

static void syncs_setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
}

static void syncs_teardown(void)
{
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_fixture_stop();
}

/* Child side: context + listener @name + accepted pipe. Posts to_b 0 once listening. */
static int open_acceptor(const char *name, struct tp_context **ctx, struct tp_listener **l,
			 struct tp_pipe **p)
{
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "acceptor", ctx);

	if (r == 0)
		r = tp_listen(*ctx, name, NULL, l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, r, "listen: %d %s", r, tp_last_error());
	if (p) {
		r = tp_listener_accept_sync(*l, T_MS, p);
		TPT_REQUIRE(r == 0, r, "accept: %d %s", r, tp_last_error());
	}
	return 0;
}

/* Child side: wait for the listener, then context + connected pipe to @name. */
static int open_connector(const char *name, struct tp_context **ctx, struct tp_pipe **p)
{
	int r = tpt_sync_wait(&to_b, T_MS);

	TPT_REQUIRE(r == 0, r < 0 ? r : -EIO, "listener not ready: %d", r);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "connector", ctx);
	TPT_REQUIRE(r == 0, r, "context: %d %s", r, tp_last_error());
	r = tp_connect(*ctx, name, p);
	if (r == 0)
		r = tp_pipe_wait_connected(*p, T_MS);
	TPT_REQUIRE(r == 0, r, "connect %s: %d %s", name, r, tp_last_error());
	return 0;
}

/* ---- 1000 pipelined writes ------------------------------------------------------------------ */

#define N_PIPELINED 1000

static void pipelined_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 9;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->meta_len = 8;
	s->lens[0] = (index * 37) % 2000;
	s->lens[1] = index % 10 == 0 ? 200000 + index : (index * 101) % 5000;
}

static int pipelined_writer(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg *msgs = calloc(N_PIPELINED, sizeof(*msgs));
	struct tpt_msg_spec s;
	int r = open_connector("pipelined", &ctx, &p);

	TPT_REQUIRE(r == 0 && msgs, 1, "setup");
	for (unsigned i = 0; i < N_PIPELINED; i++) {
		memset(&s, 0, sizeof(s));
		pipelined_spec(i, &s);
		r = tpt_msg_build(ctx, &s, i % 4 ? TPT_MEM_PRIVATE : TPT_MEM_MIXED, &msgs[i]);
		TPT_REQUIRE(r == 0, 1, "build %u", i);
	}
	TPT_REQUIRE(tpt_write_all_in_order(p, msgs, N_PIPELINED, T_MS) == 0, 1, "writes");
	tpt_sync_post(&to_a, 0);
	tpt_sync_wait(&to_b, T_MS); /* the reader is through */
	for (unsigned i = 0; i < N_PIPELINED; i++)
		tpt_msg_free(ctx, &msgs[i]);
	free(msgs);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int pipelined_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	int r = open_acceptor("pipelined", &ctx, &l, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < N_PIPELINED; i++) {
		memset(&s, 0, sizeof(s));
		pipelined_spec(i, &s);
		r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_sync_post(&to_b, 0);
	r = tpt_sync_wait(&to_a, T_MS);
	TPT_REQUIRE(r == 0, 1, "writer did not see every completion");
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_pipes_pipelined_writes_arrive_and_complete_in_order)
{
	ck_assert(tpt_run_pair(pipelined_reader, pipelined_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- 16 pipes at once ----------------------------------------------------------------------- */

#define N_PIPES 16
#define N_PER_PIPE 20

static void multi_spec(unsigned pipe, unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 100 + pipe;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->seg_meta_len = 4;
	s->lens[0] = (pipe * 131 + index * 17) % 3000;
	s->lens[1] = (index % 4 == 3) ? (1u << 20) + pipe : (index * 4099) % 70000;
}

struct pipe_job {
	struct tp_context *ctx;
	struct tp_pipe *p;
	unsigned pipe;
	bool write; /* else read */
	enum tpt_mem mem;
	int result;
};

static void *pipe_job_run(void *arg)
{
	struct pipe_job *j = arg;
	struct tpt_msg_spec s;
	struct tpt_msg *m = malloc(sizeof(*m));

	j->result = m ? 0 : -ENOMEM;
	for (unsigned i = 0; j->result == 0 && i < N_PER_PIPE; i++) {
		multi_spec(j->pipe, i, &s);
		if (!j->write) {
			j->result = tpt_msg_read_check(j->ctx, j->p, &s, j->mem, T_MS);
			continue;
		}
		j->result = tpt_msg_build(j->ctx, &s, j->mem, m);
		if (j->result == 0)
			j->result = tp_pipe_write_sync(j->p, &m->m);
		tpt_msg_free(j->ctx, m);
	}
	if (j->result)
		tpt_log("pipe %u %s: %d %s", j->pipe, j->write ? "write" : "read", j->result,
			tp_last_error());
	free(m);
	return NULL;
}

/* Runs @n jobs on their own threads. Return: 0 if every job succeeded. */
static int run_jobs(struct pipe_job *jobs, unsigned n)
{
	pthread_t th[2 * N_PIPES];
	int bad = 0;

	for (unsigned i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, pipe_job_run, &jobs[i]) != 0)
			return -EAGAIN;
	for (unsigned i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		bad += jobs[i].result != 0;
	}
	return bad;
}

static int multi_writer(void *arg)
{
	struct pipe_job jobs[N_PIPES];
	struct tp_context *ctx;
	struct tp_pipe *p[N_PIPES];
	int r = open_connector("multi", &ctx, &p[0]);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 1; i < N_PIPES; i++) {
		r = tp_connect(ctx, "multi", &p[i]);
		if (r == 0)
			r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "pipe %u: %d %s", i, r, tp_last_error());
	}
	for (unsigned i = 0; i < N_PIPES; i++)
		jobs[i] = (struct pipe_job){ ctx, p[i], i, true,
					     i % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE, 0 };
	r = run_jobs(jobs, N_PIPES);
	tpt_sync_wait(&to_b, T_MS);
	for (unsigned i = 0; i < N_PIPES; i++)
		tp_pipe_close(p[i]);
	tp_context_free(ctx);
	return r ? 1 : 0;
}

static int multi_reader(void *arg)
{
	struct pipe_job jobs[N_PIPES];
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p[N_PIPES];
	int r = open_acceptor("multi", &ctx, &l, NULL);

	TPT_REQUIRE(r == 0, 1, "setup");
	/* Connections are accepted in the order the connector made them. */
	for (unsigned i = 0; i < N_PIPES; i++) {
		r = tp_listener_accept_sync(l, T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "accept %u: %d %s", i, r, tp_last_error());
	}
	for (unsigned i = 0; i < N_PIPES; i++)
		jobs[i] = (struct pipe_job){ ctx, p[i], i, false,
					     i % 3 ? TPT_MEM_PRIVATE : TPT_MEM_SHM, 0 };
	r = run_jobs(jobs, N_PIPES);
	tpt_sync_post(&to_b, 0);
	for (unsigned i = 0; i < N_PIPES; i++)
		tp_pipe_close(p[i]);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r ? 1 : 0;
}

START_TEST(test_pipes_sixteen_pipes_carry_concurrent_traffic)
{
	ck_assert(tpt_run_pair(multi_reader, multi_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- both ends write at once --------------------------------------------------------------- */

/* Each end writes N_PER_PIPE messages (pipe tag 0 from the acceptor, 1 from the connector)
 * on one thread while reading the other end's on another. */
static int duplex(struct tp_context *ctx, struct tp_pipe *p, unsigned mine, enum tpt_mem mem)
{
	struct pipe_job jobs[2] = {
		{ ctx, p, mine, true, mem, 0 },
		{ ctx, p, 1 - mine, false, mem == TPT_MEM_SHM ? TPT_MEM_PRIVATE : TPT_MEM_SHM, 0 },
	};

	return run_jobs(jobs, 2);
}

static int duplex_a(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = open_acceptor("duplex", &ctx, &l, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	r = duplex(ctx, p, 0, TPT_MEM_SHM);
	tpt_sync_post(&to_a, 0);
	tpt_sync_wait(&to_b, T_MS);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r ? 1 : 0;
}

static int duplex_b(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = open_connector("duplex", &ctx, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	r = duplex(ctx, p, 1, TPT_MEM_PRIVATE);
	tpt_sync_post(&to_b, 0);
	tpt_sync_wait(&to_a, T_MS);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r ? 1 : 0;
}

START_TEST(test_pipes_both_ends_write_at_once)
{
	ck_assert(tpt_run_pair(duplex_a, duplex_b, NULL, 2 * T_MS));
}
END_TEST

/* ---- closing ----------------------------------------------------------------------------- */

static int small_msg(struct tp_context *ctx, unsigned index, struct tpt_msg *m,
		     struct tpt_msg_spec *s, size_t len)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 20;
	s->index = index;
	s->n_payloads = 1;
	s->meta_len = 3;
	s->lens[0] = len;
	return tpt_msg_build(ctx, s, TPT_MEM_PRIVATE, m);
}

/* Acceptor closes at once; the connector then sees -EPIPE on read and on write. */
static int closer_a(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = open_acceptor("closer", &ctx, &l, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	tp_pipe_close(p);
	tpt_sync_post(&to_b, 0);
	r = tpt_sync_wait(&to_a, T_MS);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r == 0 ? 0 : 1;
}

static int closer_b(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r = open_connector("closer", &ctx, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "acceptor did not close");
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == -EPIPE, 1, "read_descriptor after remote close: %d (want -EPIPE)", r);
	TPT_REQUIRE(small_msg(ctx, 0, &m, &s, 10) == 0, 1, "build");
	r = tp_pipe_write_sync(p, &m.m);
	TPT_REQUIRE(r == -EPIPE, 1, "write after remote close: %d (want -EPIPE)", r);
	tpt_msg_free(ctx, &m);
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_pipes_write_after_remote_close_fails_with_epipe)
{
	ck_assert(tpt_run_pair(closer_a, closer_b, NULL, 2 * T_MS));
}
END_TEST

/* Connector writes three messages and closes; the acceptor reads all three, then -EPIPE. */
static int drain_writer(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r = open_connector("drain", &ctx, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < 3; i++) {
		TPT_REQUIRE(small_msg(ctx, i, &m, &s, 100 * i) == 0, 1, "build");
		r = tp_pipe_write_sync(p, &m.m);
		tpt_msg_free(ctx, &m);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	tp_pipe_close(p);
	tpt_sync_post(&to_a, 0);
	tpt_sync_wait(&to_b, T_MS);
	tp_context_free(ctx);
	return 0;
}

static int drain_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r = open_acceptor("drain", &ctx, &l, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "writer did not close");
	for (unsigned i = 0; i < 3; i++) {
		small_msg(ctx, i, &m, &s, 100 * i);
		tpt_msg_free(ctx, &m);
		r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u written before close: %d", i, r);
	}
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == -EPIPE, 1, "read after the last message: %d (want -EPIPE)", r);
	tpt_sync_post(&to_b, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_pipes_reader_gets_messages_written_before_close)
{
	ck_assert(tpt_run_pair(drain_reader, drain_writer, NULL, 2 * T_MS));
}
END_TEST

/* A rendezvous write pending at close completes with -ECANCELED; the reader gets -EPIPE. */
static int cancel_writer(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	void *buf = NULL;
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = 4u << 20 };
	struct tp_message msg = { .tensors = &t, .n_tensors = 1 };
	int r = open_connector("cancel", &ctx, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	tpt_done_init(&done);
	r = tp_buffer_alloc(ctx, t.length, &buf);
	TPT_REQUIRE(r == 0, 1, "buffer: %d", r);
	t.data = buf;
	r = tp_pipe_write(p, &msg, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "reader did not see the descriptor");
	tp_pipe_close(p);
	r = tpt_done_wait(&done, 1, T_MS);
	TPT_REQUIRE(r == 0, 1, "pending write never completed after close");
	TPT_REQUIRE(done.last_status == -ECANCELED, 1, "pending write: %d (want -ECANCELED)",
		    done.last_status);
	tpt_sync_post(&to_b, 0);
	tpt_sync_wait(&to_a, T_MS);
	tp_buffer_free(ctx, buf);
	tp_context_free(ctx);
	return 0;
}

static int cancel_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r = open_acceptor("cancel", &ctx, &l, &p);

	TPT_REQUIRE(r == 0, 1, "setup");
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	tpt_sync_post(&to_a, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "writer did not close");
	slot.data = malloc(4u << 20);
	r = tp_pipe_read_sync(p, d, &a);
	TPT_REQUIRE(r == -EPIPE, 1, "read of a closed writer's rendezvous message: %d", r);
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == -EPIPE, 1, "next descriptor: %d (want -EPIPE)", r);
	tpt_sync_post(&to_a, 0);
	free(slot.data);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_pipes_close_cancels_pending_rendezvous_write)
{
	ck_assert(tpt_run_pair(cancel_reader, cancel_writer, NULL, 2 * T_MS));
}
END_TEST

/*
 * Close while the daemon is copying a 256 MiB private tensor. The writer scribbles over its
 * buffer as soon as its write completes (canceled), the reader zeroes its buffer as soon as its
 * read completes. Completion must mean the daemon no longer touches that memory: a reader told
 * "success" holds intact bytes, and nothing is written into its buffer after completion.
 */
#define TORN_LEN (256u << 20)
#define TORN_SEED 77

/* Waits (deadline T_MS) until the daemon's copy has written the start of @buf. */
static bool wait_first_bytes(const void *buf)
{
	const volatile uint64_t *first = buf;
	uint64_t deadline = tpt_now_ms() + T_MS;
	uint64_t want;

	tpt_fill(&want, sizeof(want), TORN_SEED);
	while (*first != want)
		if (tpt_now_ms() > deadline)
			return false;
	return true;
}

static bool all_zero(const uint8_t *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i])
			return false;
	return true;
}

/* One side of a large-copy case: its context, pipe and the operation's completion. */
struct big_side {
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tpt_done done;
	struct tpt_done_arg da;
	struct tp_tensor t;   /* writer */
	struct tp_message msg;
	struct tp_descriptor *d; /* reader */
	struct tp_slot slot;
	struct tp_allocation a;
};

/* Connects to @name and starts writing one TORN_LEN private tensor with a known pattern. */
static int big_write_start(const char *name, struct big_side *w)
{
	int r = open_connector(name, &w->ctx, &w->p);

	TPT_REQUIRE(r == 0, 1, "setup");
	tpt_done_init(&w->done);
	w->da = (struct tpt_done_arg){ &w->done, 0 };
	w->t = (struct tp_tensor){ .device = { TP_DEVICE_CPU, 0 }, .length = TORN_LEN };
	w->msg = (struct tp_message){ .tensors = &w->t, .n_tensors = 1 };
	w->t.data = malloc(TORN_LEN);
	TPT_REQUIRE(w->t.data, 1, "malloc");
	tpt_fill(w->t.data, TORN_LEN, TORN_SEED);
	r = tp_pipe_write(w->p, &w->msg, tpt_done_cb, &w->da);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	return 0;
}

/*
 * Accepts on @name and starts reading the tensor into zeroed private memory; returns once the
 * daemon is demonstrably copying (the first bytes landed).
 */
static int big_read_start(const char *name, struct big_side *rd)
{
	int r = open_acceptor(name, &rd->ctx, &rd->l, &rd->p);

	TPT_REQUIRE(r == 0, 1, "setup");
	tpt_done_init(&rd->done);
	rd->da = (struct tpt_done_arg){ &rd->done, 0 };
	r = tp_pipe_read_descriptor_sync(rd->p, T_MS, &rd->d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	rd->slot = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = malloc(TORN_LEN) };
	rd->a = (struct tp_allocation){ .tensors = &rd->slot, .n_tensors = 1 };
	TPT_REQUIRE(rd->slot.data, 1, "malloc");
	memset(rd->slot.data, 0, TORN_LEN); /* pre-fault: the copy, not page faults, takes time */
	r = tp_pipe_read(rd->p, rd->d, &rd->a, tpt_done_cb, &rd->da);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	TPT_REQUIRE(wait_first_bytes(rd->slot.data), 1, "the copy never started");
	return 0;
}

static int torn_writer(void *arg)
{
	static struct big_side w;

	if (big_write_start("torn", &w))
		return 1;
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "reader did not see the copy start");
	tp_pipe_close(w.p);
	TPT_REQUIRE(tpt_done_wait(&w.done, 1, T_MS) == 0, 1,
		    "pending write never completed after close");
	TPT_REQUIRE(w.done.last_status == -ECANCELED || w.done.last_status == 0, 1,
		    "write: %d (want -ECANCELED or 0)", w.done.last_status);
	memset(w.t.data, 0xee, TORN_LEN); /* the user may reuse the memory now */
	tpt_sync_post(&to_b, 0);
	tpt_sync_wait(&to_a, T_MS);
	free(w.t.data);
	tp_context_free(w.ctx);
	return 0;
}

static int torn_reader(void *arg)
{
	static struct big_side rd;

	if (big_read_start("torn", &rd))
		return 1;
	tpt_sync_post(&to_a, 0);
	TPT_REQUIRE(tpt_done_wait(&rd.done, 1, T_MS) == 0, 1, "read never completed");
	TPT_REQUIRE(rd.done.last_status == 0 || rd.done.last_status == -EPIPE, 1,
		    "read: %d (want 0 or -EPIPE)", rd.done.last_status);
	if (rd.done.last_status == 0)
		TPT_REQUIRE(tpt_verify(rd.slot.data, TORN_LEN, TORN_SEED, NULL), 1,
			    "read reported success but the bytes were overwritten mid-copy");
	/* Completed means the daemon is done with this memory, whatever the status. */
	memset(rd.slot.data, 0, TORN_LEN);
	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "writer did not finish");
	TPT_REQUIRE(all_zero(rd.slot.data, TORN_LEN), 1,
		    "the daemon wrote into the buffer after the read completed");
	tpt_sync_post(&to_a, 0);
	free(rd.slot.data);
	tp_pipe_close(rd.p);
	tp_listener_close(rd.l);
	tp_context_free(rd.ctx);
	return 0;
}

START_TEST(test_pipes_close_during_copy_never_delivers_torn_data)
{
	ck_assert(tpt_run_pair(torn_reader, torn_writer, NULL, 2 * T_MS));
}
END_TEST

/*
 * A reader frees its context while the daemon copies 256 MiB into its buffer, then zeroes the
 * buffer: tp_context_free() must not return before the daemon is done with that memory.
 */
static int ctxfree_writer(void *arg)
{
	static struct big_side w;

	if (big_write_start("ctxfree", &w))
		return 1;
	/* The write completes once the copy into the (departed) reader has ended. */
	TPT_REQUIRE(tpt_done_wait(&w.done, 1, T_MS) == 0, 1, "write never completed");
	tpt_sync_post(&to_b, 0);
	tpt_sync_wait(&to_a, T_MS);
	free(w.t.data);
	tp_pipe_close(w.p);
	tp_context_free(w.ctx);
	return 0;
}

static int ctxfree_reader(void *arg)
{
	static struct big_side rd;

	if (big_read_start("ctxfree", &rd))
		return 1;
	tp_context_free(rd.ctx); /* completes the read; the daemon must be done with the memory */
	TPT_REQUIRE(rd.done.count == 1, 1, "read callback ran %u times", rd.done.count);
	memset(rd.slot.data, 0, TORN_LEN);
	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "writer did not finish");
	TPT_REQUIRE(all_zero(rd.slot.data, TORN_LEN), 1,
		    "the daemon wrote into the buffer after tp_context_free() returned");
	tpt_sync_post(&to_a, 0);
	free(rd.slot.data);
	return 0;
}

START_TEST(test_pipes_context_free_waits_for_copies_into_its_memory)
{
	ck_assert(tpt_run_pair(ctxfree_reader, ctxfree_writer, NULL, 2 * T_MS));
}
END_TEST

static Suite *pipes_suite(void)
{
	Suite *s = suite_create("pipes");
	TCase *tc = tcase_create("pipes");

	tcase_add_checked_fixture(tc, syncs_setup, syncs_teardown);
	tcase_add_test(tc, test_pipes_pipelined_writes_arrive_and_complete_in_order);
	tcase_add_test(tc, test_pipes_sixteen_pipes_carry_concurrent_traffic);
	tcase_add_test(tc, test_pipes_both_ends_write_at_once);
	tcase_add_test(tc, test_pipes_write_after_remote_close_fails_with_epipe);
	tcase_add_test(tc, test_pipes_reader_gets_messages_written_before_close);
	tcase_add_test(tc, test_pipes_close_cancels_pending_rendezvous_write);
	tcase_add_test(tc, test_pipes_close_during_copy_never_delivers_torn_data);
	tcase_add_test(tc, test_pipes_context_free_waits_for_copies_into_its_memory);
	tcase_set_timeout(tc, 150);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(pipes_suite());
}
