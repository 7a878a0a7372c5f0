/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client-side helpers of the integration suites. See itest.h.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <signal.h>
#include <json-c/json.h>

#include "itest.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

struct tpt_daemon tpt_fixture_daemon;
struct tpt_daemon tpt_peer_a, tpt_peer_b;

unsigned tpt_time_scale(void)
{
	static unsigned scale;
	const char *e;
	char *end;
	long v;

	if (!scale) {
		e = getenv("TPT_TIME_SCALE");
		v = e && *e ? strtol(e, &end, 10) : 1;
		scale = e && *e && (*end || v < 1 || v > 100) ? 1 : (unsigned)v;
	}
	return scale;
}

const char *const *tpt_peer_args(void)
{
	static char timeout[16], connect_timeout[16];
	static const char *args[] = { "--peer-timeout", timeout, "--peer-connect-timeout",
				      connect_timeout, NULL };

	snprintf(timeout, sizeof(timeout), "%d", TPT_PEER_TIMEOUT_MS);
	snprintf(connect_timeout, sizeof(connect_timeout), "%d", TPT_PEER_CONNECT_TIMEOUT_MS);
	return args;
}

const char *tpt_mem_name(enum tpt_mem m)
{
	switch (m) {
	case TPT_MEM_PRIVATE: return "private";
	case TPT_MEM_SHM: return "shm";
	case TPT_MEM_SLAB: return "slab";
	case TPT_MEM_MIXED: return "mixed";
	}
	return "?";
}

int tpt_ctx_new(const struct tpt_daemon *d, uint32_t flags, const char *name,
		struct tp_context **ret)
{
	struct tp_context_options o = {
		.size = sizeof(o),
		.socket_path = d->socket,
		.name = name,
		.flags = flags,
	};

	return tp_context_new(&o, ret);
}

void tpt_meta_fill(uint8_t *buf, size_t len, const struct tpt_msg_spec *s, char what, size_t i)
{
	unsigned tag = 0x10000u + ((unsigned)what << 8) + (unsigned)i;

	tpt_fill(buf, len, tpt_seed(s->pipe, s->index, tag));
}

/* ---- segment memory ------------------------------------------------------------------------- */

struct segs {
	void *ptr[TPT_SEGS_MAX];
	void *bufs[TPT_SEGS_MAX + 1];
	bool shm[TPT_SEGS_MAX + 1];
};

static enum tpt_mem seg_kind(enum tpt_mem mem, size_t k)
{
	if (mem == TPT_MEM_MIXED)
		return k % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE;
	return mem;
}

static int segs_alloc(struct tp_context *ctx, size_t n, const size_t *lens, enum tpt_mem mem,
		      struct segs *g)
{
	size_t slab_size = 64, off = 7;
	uint8_t *slab = NULL;
	int r;

	memset(g, 0, sizeof(*g));
	for (size_t k = 0; mem == TPT_MEM_SLAB && k < n; k++)
		slab_size += lens[k] + 13;
	if (mem == TPT_MEM_SLAB) {
		r = tp_buffer_alloc(ctx, slab_size, (void **)&slab);
		TPT_REQUIRE(r == 0, r, "tp_buffer_alloc(%zu): %d %s", slab_size, r,
			    tp_last_error());
		g->bufs[n] = slab;
		g->shm[n] = true;
	}
	for (size_t k = 0; k < n; k++) {
		if (lens[k] == 0)
			continue;
		switch (seg_kind(mem, k)) {
		case TPT_MEM_SLAB:
			g->ptr[k] = slab + off;
			off += lens[k] + 13;
			break;
		case TPT_MEM_SHM:
			r = tp_buffer_alloc(ctx, lens[k], &g->ptr[k]);
			TPT_REQUIRE(r == 0, r, "tp_buffer_alloc(%zu): %d %s", lens[k], r,
				    tp_last_error());
			g->bufs[k] = g->ptr[k];
			g->shm[k] = true;
			break;
		default:
			g->ptr[k] = malloc(lens[k]);
			TPT_REQUIRE(g->ptr[k], -ENOMEM, "malloc(%zu)", lens[k]);
			g->bufs[k] = g->ptr[k];
			break;
		}
	}
	return 0;
}

static void segs_free(struct tp_context *ctx, void **bufs, bool *shm, size_t n)
{
	for (size_t k = 0; k <= n; k++) {
		if (!bufs[k])
			continue;
		if (shm[k])
			tp_buffer_free(ctx, bufs[k]);
		else
			free(bufs[k]);
		bufs[k] = NULL;
	}
}

/* ---- building a message ---------------------------------------------------------------------- */

static void msg_fill_meta(struct tpt_msg *m, const struct tpt_msg_spec *s)
{
	uint8_t *p = m->meta;

	if (s->meta_len) {
		tpt_meta_fill(p, s->meta_len, s, 'm', 0);
		m->m.metadata = p;
		m->m.metadata_len = s->meta_len;
		p += s->meta_len;
	}
	for (size_t k = 0; s->seg_meta_len && k < s->n_payloads; k++) {
		tpt_meta_fill(p, s->seg_meta_len, s, 'p', k);
		m->payloads[k].metadata = p;
		m->payloads[k].metadata_len = s->seg_meta_len;
		p += s->seg_meta_len;
	}
	for (size_t k = 0; s->seg_meta_len && k < s->n_tensors; k++) {
		tpt_meta_fill(p, s->seg_meta_len, s, 't', k);
		m->tensors[k].metadata = p;
		m->tensors[k].metadata_len = s->seg_meta_len;
		p += s->seg_meta_len;
	}
}

int tpt_msg_build(struct tp_context *ctx, const struct tpt_msg_spec *s, enum tpt_mem mem,
		  struct tpt_msg *ret)
{
	size_t n = s->n_payloads + s->n_tensors;
	struct segs g;
	int r;

	memset(ret, 0, sizeof(*ret));
	TPT_REQUIRE(n <= TPT_SEGS_MAX, -E2BIG, "%zu segments", n);
	r = segs_alloc(ctx, n, s->lens, mem, &g);
	memcpy(ret->bufs, g.bufs, sizeof(g.bufs));
	memcpy(ret->shm, g.shm, sizeof(g.shm));
	if (r < 0) {
		tpt_msg_free(ctx, ret);
		return r;
	}
	ret->meta = malloc(s->meta_len + n * s->seg_meta_len + 1);
	TPT_REQUIRE(ret->meta, -ENOMEM, "metadata");
	for (size_t k = 0; k < n; k++)
		if (s->lens[k])
			tpt_fill(g.ptr[k], s->lens[k], tpt_seed(s->pipe, s->index, (unsigned)k));
	for (size_t k = 0; k < s->n_payloads; k++)
		ret->payloads[k] = (struct tp_payload){ .data = g.ptr[k], .length = s->lens[k] };
	for (size_t k = 0; k < s->n_tensors; k++) {
		struct tp_tensor *t = &ret->tensors[k];
		*t = (struct tp_tensor){ .device = { TP_DEVICE_CPU, 0 },
					 .data = g.ptr[s->n_payloads + k],
					 .length = s->lens[s->n_payloads + k] };
		if (s->tensor_target) {
			t->has_target = true;
			t->target = (struct tp_device){ TP_DEVICE_CUDA, 1 };
		}
	}
	ret->m.payloads = s->n_payloads ? ret->payloads : NULL;
	ret->m.n_payloads = s->n_payloads;
	ret->m.tensors = s->n_tensors ? ret->tensors : NULL;
	ret->m.n_tensors = s->n_tensors;
	msg_fill_meta(ret, s);
	return 0;
}

void tpt_msg_free(struct tp_context *ctx, struct tpt_msg *m)
{
	segs_free(ctx, m->bufs, m->shm, TPT_SEGS_MAX);
	free(m->meta);
	m->meta = NULL;
}

/* ---- reading and checking -------------------------------------------------------------------- */

static bool meta_ok(const void *got, size_t got_len, size_t want_len,
		    const struct tpt_msg_spec *s, char what, size_t i)
{
	uint8_t *want;
	bool ok;

	if (got_len != want_len) {
		tpt_log("msg %u/%u: %c%zu metadata of %zu bytes, want %zu", s->pipe, s->index, what,
			i, got_len, want_len);
		return false;
	}
	if (want_len == 0)
		return true;
	want = malloc(want_len);
	if (!want)
		return false;
	tpt_meta_fill(want, want_len, s, what, i);
	ok = got && memcmp(got, want, want_len) == 0;
	if (!ok)
		tpt_log("msg %u/%u: %c%zu metadata differs", s->pipe, s->index, what, i);
	free(want);
	return ok;
}

static bool desc_ok(const struct tp_descriptor *d, const struct tpt_msg_spec *s)
{
	bool ok = meta_ok(d->metadata, d->metadata_len, s->meta_len, s, 'm', 0);

	if (d->n_payloads != s->n_payloads || d->n_tensors != s->n_tensors) {
		tpt_log("msg %u/%u: %zu payloads + %zu tensors, want %zu + %zu", s->pipe, s->index,
			d->n_payloads, d->n_tensors, s->n_payloads, s->n_tensors);
		return false;
	}
	for (size_t k = 0; ok && k < s->n_payloads; k++) {
		ok = meta_ok(d->payloads[k].metadata, d->payloads[k].metadata_len, s->seg_meta_len,
			     s, 'p', k);
		if (d->payloads[k].length != s->lens[k]) {
			tpt_log("msg %u/%u: payload %zu is %zu bytes, want %zu", s->pipe, s->index,
				k, d->payloads[k].length, s->lens[k]);
			ok = false;
		}
	}
	for (size_t k = 0; ok && k < s->n_tensors; k++) {
		const struct tp_tensor_desc *t = &d->tensors[k];
		ok = meta_ok(t->metadata, t->metadata_len, s->seg_meta_len, s, 't', k);
		if (t->length != s->lens[s->n_payloads + k] || t->device.type != TP_DEVICE_CPU ||
		    t->has_target != s->tensor_target ||
		    (s->tensor_target &&
		     (t->target.type != TP_DEVICE_CUDA || t->target.index != 1))) {
			tpt_log("msg %u/%u: tensor %zu: %zu bytes (want %zu), device %d, target %d "
				"%d:%d", s->pipe, s->index, k, t->length,
				s->lens[s->n_payloads + k], t->device.type, t->has_target,
				t->target.type, t->target.index);
			ok = false;
		}
	}
	return ok;
}

static bool data_ok(const struct segs *g, const struct tpt_msg_spec *s)
{
	size_t n = s->n_payloads + s->n_tensors, bad;

	for (size_t k = 0; k < n; k++) {
		if (s->lens[k] &&
		    !tpt_verify(g->ptr[k], s->lens[k], tpt_seed(s->pipe, s->index, (unsigned)k),
				&bad)) {
			tpt_log("msg %u/%u: segment %zu (%zu bytes) differs at byte %zu", s->pipe,
				s->index, k, s->lens[k], bad);
			return false;
		}
	}
	return true;
}

/* Reads message @s, described by @d, into a fresh allocation of @mem (a pipe's or a channel's,
 * @read on @src; @drop frees @d unread) and checks its bytes. Return: 0, 1 (wrong) or -errno. */
static int read_into_alloc(struct tp_context *ctx, const struct tpt_msg_spec *s, enum tpt_mem mem,
			   struct tp_descriptor *d, void *src,
			   int (*read)(void *src, struct tp_descriptor *d,
				       const struct tp_allocation *a),
			   void (*drop)(struct tp_descriptor *d))
{
	struct tp_slot slots[TPT_SEGS_MAX];
	struct tp_allocation a;
	size_t n = s->n_payloads + s->n_tensors;
	struct segs g;
	int r;

	if (!desc_ok(d, s)) {
		drop(d);
		return 1;
	}
	r = segs_alloc(ctx, n, s->lens, mem, &g);
	if (r < 0) {
		drop(d);
		segs_free(ctx, g.bufs, g.shm, n);
		return r;
	}
	for (size_t k = 0; k < n; k++)
		slots[k] = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = g.ptr[k] };
	a = (struct tp_allocation){ .payloads = slots, .n_payloads = s->n_payloads,
				    .tensors = slots + s->n_payloads, .n_tensors = s->n_tensors };
	r = read(src, d, &a);
	if (r != 0)
		tpt_log("msg %u/%u: read: %d %s", s->pipe, s->index, r, tp_last_error());
	else if (!data_ok(&g, s))
		r = 1;
	segs_free(ctx, g.bufs, g.shm, n);
	return r;
}

static int pipe_read(void *src, struct tp_descriptor *d, const struct tp_allocation *a)
{
	return tp_pipe_read_sync(src, d, a);
}

static int chan_read(void *src, struct tp_descriptor *d, const struct tp_allocation *a)
{
	return tp_chan_read_msg(src, d, a);
}

static void chan_drop(struct tp_descriptor *d)
{
	tp_chan_descriptor_free(d);
}

int tpt_msg_read_check(struct tp_context *ctx, struct tp_pipe *p, const struct tpt_msg_spec *s,
		       enum tpt_mem mem, int timeout_ms)
{
	struct tp_descriptor *d = NULL;
	int r = tp_pipe_read_descriptor_sync(p, timeout_ms, &d);

	TPT_REQUIRE(r == 0, r, "msg %u/%u: read_descriptor: %d %s", s->pipe, s->index, r,
		    tp_last_error());
	return read_into_alloc(ctx, s, mem, d, p, pipe_read, tp_descriptor_free);
}

int tpt_chan_msg_read_check(struct tp_context *ctx, struct tp_chan *ch,
			    const struct tpt_msg_spec *s, enum tpt_mem mem, int timeout_ms,
			    bool *ret_closed)
{
	struct tp_descriptor *d = NULL;
	int r = tp_chan_read_descriptor(ch, &d, timeout_ms);

	TPT_REQUIRE(r == 0 || r == TP_CHAN_CLOSED, r < 0 ? r : -EPROTO, "msg %u/%u: "
		    "read_descriptor: %d %s", s->pipe, s->index, r, tp_last_error());
	if (ret_closed)
		*ret_closed = r == TP_CHAN_CLOSED;
	return read_into_alloc(ctx, s, mem, d, ch, chan_read, chan_drop);
}

static int wq_read(void *src, struct tp_descriptor *d, const struct tp_allocation *a)
{
	return tp_wq_read_msg(src, d, a);
}

static void wq_drop(struct tp_descriptor *d)
{
	tp_wq_descriptor_free(d);
}

int tpt_wq_msg_read_check(struct tp_context *ctx, struct tp_wq *q, struct tp_descriptor *d,
			  const struct tpt_msg_spec *s, enum tpt_mem mem)
{
	return read_into_alloc(ctx, s, mem, d, q, wq_read, wq_drop);
}

struct wq_taker {
	const struct tpt_daemon *d;
	const char *name;
	tpt_wq_take_fn take;
	int fd; /* the taken id is written here, then the child waits to be killed */
};

static int wq_taker(void *arg)
{
	struct wq_taker *a = arg;
	struct tp_context *ctx = NULL;
	struct tp_wq *q;
	uint64_t id;

	TPT_REQUIRE(tpt_ctx_new(a->d, 0, "taker", &ctx) == 0, 1, "context");
	TPT_REQUIRE(tp_wq_open(ctx, a->name, NULL, &q) == 0, 1, "open: %s", tp_last_error());
	TPT_REQUIRE(a->take(q, &id) == 0, 1, "take: %s", tp_last_error());
	TPT_REQUIRE(write(a->fd, &id, sizeof(id)) == sizeof(id), 1, "write");
	for (;;)
		pause();
	return 0;
}

uint64_t tpt_wq_take_and_die(const struct tpt_daemon *d, const char *name, tpt_wq_take_fn take)
{
	struct wq_taker a = { .d = d, .name = name, .take = take };
	int fds[2], status;
	uint64_t id = 0;
	pid_t pid;

	ck_assert_int_eq(pipe(fds), 0);
	a.fd = fds[1];
	pid = tpt_fork(wq_taker, &a);
	close(fds[1]);
	ck_assert_int_eq(read(fds[0], &id, sizeof(id)), sizeof(id));
	close(fds[0]);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return id;
}

/* ---- pipe ends ------------------------------------------------------------------------------ */

int tpt_end_listen(struct tpt_end *e, bool accept)
{
	int r = tpt_ctx_new(e->d, 0, e->ctx_name, &e->ctx);

	if (r == 0)
		r = tp_listen(e->ctx, e->where, &remote_any, &e->l);
	if (e->ready)
		tpt_sync_post(e->ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, r, "%s: listen %s: %d %s", e->ctx_name, e->where, r, tp_last_error());
	if (!accept)
		return 0;
	r = tp_listener_accept_sync(e->l, e->timeout_ms, &e->p);
	TPT_REQUIRE(r == 0, r, "%s: accept: %d %s", e->ctx_name, r, tp_last_error());
	return 0;
}

int tpt_end_connect(struct tpt_end *e)
{
	int r = e->ready ? tpt_sync_wait(e->ready, e->timeout_ms) : 0;

	TPT_REQUIRE(r == 0, r < 0 ? r : -EIO, "%s: listener not ready: %d", e->ctx_name, r);
	r = tpt_ctx_new(e->d, 0, e->ctx_name, &e->ctx);
	TPT_REQUIRE(r == 0, r, "%s: context: %d %s", e->ctx_name, r, tp_last_error());
	r = tp_connect(e->ctx, e->where, &e->p);
	TPT_REQUIRE(r == 0, r, "%s: tp_connect(%s): %d %s", e->ctx_name, e->where, r,
		    tp_last_error());
	r = tp_pipe_wait_connected(e->p, e->timeout_ms);
	TPT_REQUIRE(r == 0, r, "%s: connect %s: %d %s", e->ctx_name, e->where, r, tp_last_error());
	return 0;
}

void tpt_end_close(struct tpt_end *e)
{
	tp_pipe_close(e->p);
	tp_listener_close(e->l);
	tp_context_free(e->ctx);
	e->p = NULL;
	e->l = NULL;
	e->ctx = NULL;
}

/* ---- completions -------------------------------------------------------------------------- */

void tpt_done_init(struct tpt_done *d)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
}

void tpt_done_cb(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct tpt_done_arg *a = arg;
	struct tpt_done *d = a->done;

	(void)p;
	pthread_mutex_lock(&d->lock);
	if (a->index != d->next)
		d->order_errors++;
	d->next = a->index + 1;
	d->status[a->index % 4096] = status;
	d->last_status = status;
	d->count++;
	if ((status != 0) != (errmsg != NULL && *errmsg))
		d->bad_errmsg++;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

int tpt_done_wait(struct tpt_done *d, unsigned count, int timeout_ms)
{
	struct timespec ts;
	int r = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&d->lock);
	while (d->count < count && r == 0)
		r = pthread_cond_timedwait(&d->cond, &d->lock, &ts);
	r = d->count >= count ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&d->lock);
	return r;
}

int tpt_write_all_in_order(struct tp_pipe *p, struct tpt_msg *msgs, unsigned n, int timeout_ms)
{
	static struct tpt_done done;
	struct tpt_done_arg *args = calloc(n, sizeof(*args));
	int r;

	TPT_REQUIRE(n <= sizeof(done.status) / sizeof(done.status[0]), 1, "%u writes: too many", n);
	TPT_REQUIRE(args, 1, "calloc");
	tpt_done_init(&done);
	for (unsigned i = 0; i < n; i++) {
		args[i] = (struct tpt_done_arg){ &done, i };
		r = tp_pipe_write(p, &msgs[i].m, tpt_done_cb, &args[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	r = tpt_done_wait(&done, n, timeout_ms);
	TPT_REQUIRE(r == 0, 1, "only %u of %u writes completed", done.count, n);
	TPT_REQUIRE(done.order_errors == 0, 1, "%u writes completed out of order",
		    done.order_errors);
	for (unsigned i = 0; i < n; i++)
		TPT_REQUIRE(done.status[i] == 0, 1, "write %u: status %d", i, done.status[i]);
	TPT_REQUIRE(done.bad_errmsg == 0, 1, "%u completions with a wrong error message",
		    done.bad_errmsg);
	free(args);
	return 0;
}

/* ---- two-process transfer ------------------------------------------------------------------- */

struct xfer_run {
	const struct tpt_xfer *x;
	struct tpt_sync ready;	/* reader -> writer: listening (0) or failed (< 0) */
	struct tpt_sync writes; /* writer -> reader: every write completed */
	struct tpt_sync reads;	/* reader -> writer: every message read and checked */
	int timeout_ms;
};

static int xfer_read_all(struct tp_context *ctx, struct tp_pipe *p, const struct xfer_run *run)
{
	const struct tpt_xfer *x = run->x;
	struct tpt_msg_spec s;

	for (unsigned i = 0; i < x->n_msgs; i++) {
		int r;
		memset(&s, 0, sizeof(s));
		x->spec(i, &s);
		r = tpt_msg_read_check(ctx, p, &s, x->reader_mem, run->timeout_ms);
		TPT_REQUIRE(r == 0, 1, "reader: message %u of %u: %d", i, x->n_msgs, r);
	}
	return 0;
}

static int xfer_reader(void *arg)
{
	struct xfer_run *run = arg;
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *p = NULL;
	int r = tpt_ctx_new(run->x->d, run->x->reader_flags, "reader", &ctx);

	if (r == 0 && (run->x->reader_flags & TP_CONTEXT_NO_CMA) && tp_context_cma_ok(ctx)) {
		tpt_log("reader: TP_CONTEXT_NO_CMA set but tp_context_cma_ok() is true");
		r = -EINVAL;
	}
	if (r == 0)
		r = tp_listen(ctx, run->x->name, &remote_any, &l);
	tpt_sync_post(&run->ready, (int8_t)(r < 0 ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "reader: context/listen: %d %s", r, tp_last_error());
	r = tp_listener_accept_sync(l, run->timeout_ms, &p);
	TPT_REQUIRE(r == 0, 1, "reader: accept: %d %s", r, tp_last_error());
	r = xfer_read_all(ctx, p, run);
	tpt_sync_post(&run->reads, (int8_t)r);
	if (r == 0 && tpt_sync_wait(&run->writes, run->timeout_ms) != 0) {
		tpt_log("reader: the writer did not finish");
		r = 1;
	}
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r;
}

static int xfer_write_all(struct tp_context *ctx, struct tp_pipe *p, const struct tpt_xfer *x)
{
	struct tpt_msg_spec s;
	struct tpt_msg *m = malloc(sizeof(*m));
	int r = 0;

	TPT_REQUIRE(m, 1, "malloc");
	for (unsigned i = 0; r == 0 && i < x->n_msgs; i++) {
		memset(&s, 0, sizeof(s));
		x->spec(i, &s);
		r = tpt_msg_build(ctx, &s, x->writer_mem, m);
		if (r == 0) {
			r = tp_pipe_write_sync(p, &m->m);
			if (r != 0)
				tpt_log("writer: message %u: %d %s", i, r, tp_last_error());
		}
		tpt_msg_free(ctx, m);
	}
	free(m);
	return r ? 1 : 0;
}

static int xfer_writer(void *arg)
{
	struct xfer_run *run = arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	int r = tpt_sync_wait(&run->ready, run->timeout_ms);

	TPT_REQUIRE(r == 0, 1, "writer: reader not ready: %d", r);
	r = tpt_ctx_new(run->x->writer_d ? run->x->writer_d : run->x->d, run->x->writer_flags,
			"writer", &ctx);
	TPT_REQUIRE(r == 0, 1, "writer: context: %d %s", r, tp_last_error());
	TPT_REQUIRE(!(run->x->writer_flags & TP_CONTEXT_NO_CMA) || !tp_context_cma_ok(ctx), 1,
		    "writer: TP_CONTEXT_NO_CMA set but tp_context_cma_ok() is true");
	r = tp_connect(ctx, run->x->address ? run->x->address : run->x->name, &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, run->timeout_ms);
	if (r != 0) {
		tpt_log("writer: connect: %d %s", r, tp_last_error());
		tp_context_free(ctx);
		return 1;
	}
	r = xfer_write_all(ctx, p, run->x);
	if (r == 0) {
		tpt_sync_post(&run->writes, 0);
		/* Stay open until the reader is through: closing early is tested elsewhere. */
		tpt_sync_wait(&run->reads, run->timeout_ms);
	}
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r;
}

bool tpt_xfer_run(const struct tpt_xfer *x)
{
	struct xfer_run run = { .x = x, .timeout_ms = x->timeout_ms ? x->timeout_ms :
							TPT_SCALED_MS(TPT_CHILD_TIMEOUT_MS) };
	pid_t rd, wr;
	bool ok;

	if (tpt_sync_init(&run.ready) < 0 || tpt_sync_init(&run.writes) < 0 ||
	    tpt_sync_init(&run.reads) < 0)
		return false;
	rd = tpt_fork(xfer_reader, &run);
	wr = tpt_fork(xfer_writer, &run);
	if (rd < 0 || wr < 0)
		return false;
	ok = tpt_wait_ok(wr, run.timeout_ms * 2, "writer");
	ok = tpt_wait_ok(rd, run.timeout_ms * 2, "reader") && ok;
	tpt_sync_done(&run.ready);
	tpt_sync_done(&run.writes);
	tpt_sync_done(&run.reads);
	return ok;
}

/* ---- fixtures and runner ------------------------------------------------------------------- */

void tpt_fixture_start(void)
{
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, NULL), 0);
}

void tpt_fixture_stop(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
}

void tpt_peer_fixture_start(void)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, tpt_peer_args(), &tpt_peer_b,
					       tpt_peer_args()), 0);
}

void tpt_peer_fixture_stop(void)
{
	int ra = tpt_daemon_stop(&tpt_peer_a), rb = tpt_daemon_stop(&tpt_peer_b);

	ck_assert_int_eq(ra, 0);
	ck_assert_int_eq(rb, 0);
}

bool tpt_run_pair(tpt_child_fn a, tpt_child_fn b, void *arg, int timeout_ms)
{
	pid_t pa = tpt_fork(a, arg), pb = tpt_fork(b, arg);
	bool ok;

	ck_assert_int_gt(pa, 0);
	ck_assert_int_gt(pb, 0);
	ok = tpt_wait_ok(pa, timeout_ms, "child a");
	return tpt_wait_ok(pb, timeout_ms, "child b") && ok;
}

int tpt_run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

void tpt_chan_items_survive(struct tp_chan *ch, unsigned seed, tpt_child_fn child,
			    const char *what)
{
	const size_t mib = (size_t)1 << 20;
	uint8_t *src[2], *dst = malloc(mib);
	struct iovec iov[2];
	size_t len, bad = 0;
	pid_t pid;

	ck_assert_ptr_nonnull(dst);
	for (unsigned k = 0; k < 2; k++) {
		ck_assert_ptr_nonnull(src[k] = malloc(mib));
		tpt_fill(src[k], mib, tpt_seed(seed, k, 0));
		iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = mib };
	}
	ck_assert_int_eq(tp_chan_write(ch, iov, 2, 30000), 0);
	pid = tpt_fork(child, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, TPT_SCALED_MS(30000), what));
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned k = 0; k < 2; k++) {
		ck_assert_int_ge(tp_chan_read_into(ch, dst, mib, &len, 30000), 0);
		ck_assert_uint_eq(len, mib);
		ck_assert_msg(tpt_verify(dst, mib, tpt_seed(seed, k, 0), &bad),
			      "item %u: byte %zu", k, bad);
	}
	ck_assert_int_eq(tp_chan_read_into(ch, dst, mib, &len, 30000), -EPIPE);
	for (unsigned k = 0; k < 2; k++)
		free(src[k]);
	free(dst);
}

long tpt_ctl_channel_field(const struct tpt_daemon *d, const char *name, const char *field)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, "--json", "channels", NULL };
	struct tpt_cmd_result res;
	struct json_object *root, *arr, *v, *n;
	long out = -1;

	if (!bin || tpt_run(argv, 30000, &res) < 0)
		return -1;
	root = json_tokener_parse(res.out);
	if (root && json_object_object_get_ex(root, "channels", &arr)) {
		for (size_t i = 0; i < json_object_array_length(arr); i++) {
			struct json_object *c = json_object_array_get_idx(arr, i);

			if (json_object_object_get_ex(c, "name", &n) &&
			    strcmp(json_object_get_string(n), name) == 0 &&
			    json_object_object_get_ex(c, field, &v))
				out = json_object_get_int64(v);
		}
	}
	json_object_put(root);
	tpt_cmd_result_free(&res);
	return out;
}
