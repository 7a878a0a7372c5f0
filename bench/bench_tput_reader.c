/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The reader half of bench_throughput, run in the forked child: it reads every data message into
 * the next slot of a ring (slots of the kind's memory, reallocated when the size changes between
 * phases), keeps a read per slot in flight, sends the writer a credit every window/2 reads so
 * eager messages cannot pile up in the daemon, and a done message once it has read the message
 * flagged last. It measures nothing itself; the writer times the phase.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_tput.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

/* Allocates @size bytes of the kind's memory and touches every page. */
int bench_tput_buf_get(struct tp_context *ctx, bool shm, size_t size, void **ret)
{
	void *p = NULL;
	int r;

	if (shm) {
		r = tp_buffer_alloc(ctx, size, &p);
		if (r < 0) {
			fprintf(stderr, "bench_throughput: tp_buffer_alloc(%zu): %s (%s)\n", size,
				tp_strerror(r), tp_last_error());
			return r;
		}
	} else if (posix_memalign(&p, 4096, size) != 0) {
		return -ENOMEM;
	}
	memset(p, 0xa5, size);
	*ret = p;
	return 0;
}

int bench_tput_slots(int k, size_t size)
{
	uint64_t fit = size ? SLOTS_BYTES_MAX / size : (uint64_t)k;

	return fit < 1 ? 1 : fit < (uint64_t)k ? (int)fit : k;
}

void bench_tput_buf_put(struct tp_context *ctx, bool shm, void *p)
{
	if (shm)
		tp_buffer_free(ctx, p);
	else
		free(p);
}

struct rstate;

struct rslot {
	struct rstate *rs;
	void *data;
	bool busy;
	bool last;
	uint64_t phase;
};

struct rstate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct rslot slots[SLOTS_MAX];
	int n_slots;
	int n_used; /* slots of this phase's size (bench_tput_slots()) */
	size_t size;
	uint64_t phase;
	long completed; /* reads done in this phase */
	long credit_every;
	long ctl_pending; /* credit/done writes not completed */
	int err;
	struct tp_context *ctx;
	struct tp_pipe *p;
	bool shm;
};

static void r_on_ctl_write(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct rstate *rs = arg;

	pthread_mutex_lock(&rs->mu);
	rs->ctl_pending--;
	if (status < 0 && rs->err == 0) {
		fprintf(stderr, "bench_throughput: reader: credit write: %s (%s)\n",
			tp_strerror(status), errmsg ? errmsg : "");
		rs->err = status;
	}
	pthread_cond_broadcast(&rs->cv);
	pthread_mutex_unlock(&rs->mu);
}

static void r_send_ctl(struct rstate *rs, enum tag_type type, uint64_t phase, long n)
{
	struct tag t = { .magic = TAG_MAGIC, .type = type, .phase = phase, .seq = (uint64_t)n };
	struct tp_message m = { .metadata = &t, .metadata_len = sizeof(t) };
	int r;

	pthread_mutex_lock(&rs->mu);
	rs->ctl_pending++;
	pthread_mutex_unlock(&rs->mu);
	r = tp_pipe_write(rs->p, &m, r_on_ctl_write, rs);
	if (r < 0)
		r_on_ctl_write(rs, rs->p, r, tp_last_error());
}

static void r_on_read(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct rslot *s = arg;
	struct rstate *rs = s->rs;
	bool last = s->last, credit;
	uint64_t phase = s->phase;
	long n;

	pthread_mutex_lock(&rs->mu);
	s->busy = false;
	n = ++rs->completed;
	if (status < 0 && rs->err == 0) {
		fprintf(stderr, "bench_throughput: reader: read: %s (%s)\n", tp_strerror(status),
			errmsg ? errmsg : "");
		rs->err = status;
	}
	credit = !last && n % rs->credit_every == 0;
	pthread_cond_broadcast(&rs->cv);
	pthread_mutex_unlock(&rs->mu);
	if (status < 0)
		return;
	if (last)
		r_send_ctl(rs, TAG_DONE, phase, n);
	else if (credit)
		r_send_ctl(rs, TAG_CREDIT, phase, n);
}

/* Waits until no read is pending (and, if @ctl, no credit write). Return: 0 or the error. */
static int r_wait_idle(struct rstate *rs, bool ctl)
{
	int r;

	pthread_mutex_lock(&rs->mu);
	for (;;) {
		bool busy = ctl && rs->ctl_pending > 0;

		for (int i = 0; i < rs->n_slots; i++)
			busy |= rs->slots[i].busy;
		if (!busy || rs->err)
			break;
		pthread_cond_wait(&rs->cv, &rs->mu);
	}
	r = rs->err;
	pthread_mutex_unlock(&rs->mu);
	return r;
}

static void r_free_slots(struct rstate *rs)
{
	for (int i = 0; i < rs->n_slots; i++) {
		bench_tput_buf_put(rs->ctx, rs->shm, rs->slots[i].data); /* NULL past n_used */
		rs->slots[i].data = NULL;
	}
	rs->size = 0;
}

/* Starts a new phase: all earlier reads are done; reallocates slots if the size changed. */
static int r_new_phase(struct rstate *rs, uint64_t phase, size_t size)
{
	int r = r_wait_idle(rs, false);

	if (r < 0)
		return r;
	pthread_mutex_lock(&rs->mu);
	rs->phase = phase;
	rs->completed = 0;
	pthread_mutex_unlock(&rs->mu);
	if (size == rs->size)
		return 0;
	r_free_slots(rs);
	rs->n_used = bench_tput_slots(rs->n_slots, size);
	for (int i = 0; i < rs->n_used; i++) {
		r = bench_tput_buf_get(rs->ctx, rs->shm, size, &rs->slots[i].data);
		if (r < 0)
			return r;
	}
	rs->size = size;
	return 0;
}

/* Takes @d: issues the read of one data message into the next free slot. */
static int r_read_data(struct rstate *rs, struct tp_descriptor *d, const struct tag *t,
		       long *idx)
{
	struct rslot *s;
	struct tp_slot ts = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &ts, .n_tensors = 1 };
	int r = 0;

	if (d->n_tensors != 1 || d->n_payloads != 0) {
		tp_descriptor_free(d);
		return -EBADMSG;
	}
	if (t->phase != rs->phase)
		r = r_new_phase(rs, t->phase, d->tensors[0].length);
	if (r == 0 && d->tensors[0].length != rs->size)
		r = -EBADMSG;
	if (r < 0) {
		tp_descriptor_free(d);
		return r;
	}
	s = &rs->slots[(*idx)++ % rs->n_used];
	pthread_mutex_lock(&rs->mu);
	while (s->busy && !rs->err)
		pthread_cond_wait(&rs->cv, &rs->mu);
	s->busy = true;
	s->last = t->flags & TAG_LAST;
	s->phase = t->phase;
	r = rs->err;
	pthread_mutex_unlock(&rs->mu);
	ts.data = s->data;
	if (r == 0)
		r = tp_pipe_read(rs->p, d, &a, r_on_read, s);
	else
		tp_descriptor_free(d);
	if (r < 0)
		fprintf(stderr, "bench_throughput: reader: tp_pipe_read: %s (%s)\n", tp_strerror(r),
			tp_last_error());
	return r;
}

static int r_loop(struct rstate *rs)
{
	struct tp_allocation none = { 0 };
	struct tp_descriptor *d;
	long idx = 0;
	struct tag t;
	int r;

	for (;;) {
		r = tp_pipe_read_descriptor_sync(rs->p, TP_PHASE_TIMEOUT_MS, &d);
		if (r < 0) {
			fprintf(stderr, "bench_throughput: reader: read_descriptor: %s (%s)\n",
				tp_strerror(r), tp_last_error());
			return r;
		}
		if (d->metadata_len != sizeof(t)) {
			tp_descriptor_free(d);
			return -EBADMSG;
		}
		memcpy(&t, d->metadata, sizeof(t));
		if (t.type == TAG_QUIT)
			return tp_pipe_read_sync(rs->p, d, &none);
		r = r_read_data(rs, d, &t, &idx);
		if (r < 0)
			return r;
	}
}

static int r_accept(struct bench_tput_reader_arg *ra, struct rstate *rs, int ready_fd)
{
	const char *sock = ra->o->reader_socket ? ra->o->reader_socket : ra->o->socket_path;
	struct tp_listener *l = NULL;
	int r;

	r = bench_context_open(sock, ra->k->ctx_flags, &rs->ctx);
	if (r == 0) {
		r = tp_listen(rs->ctx, ra->listener, &remote_any, &l);
		if (r < 0)
			fprintf(stderr, "bench_throughput: tp_listen %s: %s (%s)\n", ra->listener,
				tp_strerror(r), tp_last_error());
	}
	bench_ready_send(ready_fd, r);
	if (r == 0)
		r = tp_listener_accept_sync(l, TP_TIMEOUT_MS, &rs->p);
	if (r < 0)
		fprintf(stderr, "bench_throughput: reader: accept: %s (%s)\n", tp_strerror(r),
			tp_last_error());
	tp_listener_close(l);
	return r;
}

int bench_tput_reader_run(void *arg, int ready_fd)
{
	struct bench_tput_reader_arg *ra = arg;
	struct rstate rs = {
		.n_slots = ra->o->inflight < RATE_INFLIGHT ? RATE_INFLIGHT : ra->o->inflight,
		.credit_every = ra->o->window / 2 > 0 ? ra->o->window / 2 : 1,
		.shm = ra->k->shm,
	};
	int r;

	pthread_mutex_init(&rs.mu, NULL);
	pthread_cond_init(&rs.cv, NULL);
	for (int i = 0; i < SLOTS_MAX; i++)
		rs.slots[i].rs = &rs;
	r = r_accept(ra, &rs, ready_fd);
	if (r == 0)
		r = r_loop(&rs);
	if (rs.p) {
		int w = r_wait_idle(&rs, true);

		r = r < 0 ? r : w;
	}
	tp_pipe_close(rs.p);
	r_free_slots(&rs);
	tp_context_free(rs.ctx);
	pthread_cond_destroy(&rs.cv);
	pthread_mutex_destroy(&rs.mu);
	return r;
}
