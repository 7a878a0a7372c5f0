/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipe sets: a server's fan-in and fan-out over the pipes it accepted (torch-ipc's recvAny and
 * broadcast). The set keeps a few descriptor requests posted on each of its pipes, collects what
 * arrives, and hands it out round-robin among the pipes that have something, reporting a pipe's
 * end once and dropping it from the set. Broadcast stages private memory once into one shared
 * buffer and writes the message to every pipe from there, waiting for each delivery with its own
 * result. Where the daemon takes Broadcast (Limits.bcast_pipes_max), one frame names every
 * pipe and the daemon fans out itself, reading the writer's memory once (write.c files each
 * pipe's write: tpc_pipes_broadcast()); otherwise, and for what the daemon's fan-out does not
 * take (staging without CMA, pipes with writes held; CUDA tensors with a daemon older than
 * minor 11), the set writes each pipe.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"

/* Descriptor requests kept posted per pipe: a pipe that was just served still has its next
 * message ready, so the round-robin, not the round trip of a new request, decides the order. */
#define SET_AHEAD 4

struct set_slot {
	struct tp_pipe_set *set;
	struct tp_pipe *pipe;
	struct tp_descriptor *q[SET_AHEAD]; /* arrived, not handed out, in pipe order */
	unsigned qhead, qlen;
	unsigned posted; /* descriptor requests pending */
	int status;	 /* < 0: ended with this error */
	bool detached;	 /* left the set: callbacks only count down, the last frees it */
};

struct tp_pipe_set {
	struct tp_context *ctx;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct set_slot **slots;
	unsigned n, max, next; /* next: where the round-robin scan starts */
	unsigned pending;      /* descriptor requests not yet completed */
	int last_status;
	void *stage; /* broadcast staging buffer, kept for the next broadcast */
	size_t stage_len;
	enum tp_fanout fanout;	    /* tp_set_set_fanout() */
	enum tp_fanout last_fanout; /* what the last broadcast used */
};

static int deadline_left(const struct timespec *start, int timeout_ms)
{
	struct timespec now;
	long ms;

	if (timeout_ms < 0)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
	return ms >= timeout_ms ? 0 : (int)(timeout_ms - ms);
}

/* Waits on the set's condition for at most @ms (< 0: forever); lock held. */
static void set_cond_wait(struct tp_pipe_set *s, int ms)
{
	struct timespec ts;

	if (ms < 0) {
		pthread_cond_wait(&s->cond, &s->lock);
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&s->cond, &s->lock, &ts);
}

static void slot_on_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
			 struct tp_descriptor *d)
{
	struct set_slot *sl = arg;
	struct tp_pipe_set *s = sl->set;

	(void)p;
	(void)errmsg;
	pthread_mutex_lock(&s->lock);
	s->pending--;
	sl->posted--;
	if (sl->detached) {
		tp_descriptor_free(d);
		if (sl->posted == 0)
			free(sl);
	} else if (status == 0) {
		sl->q[(sl->qhead + sl->qlen++) % SET_AHEAD] = d;
	} else if (sl->status == 0) {
		sl->status = status;
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Posts descriptor requests on @sl up to SET_AHEAD; lock not held (the library takes its own). */
static void slot_post(struct tp_pipe_set *s, struct set_slot *sl)
{
	for (;;) {
		int r;

		pthread_mutex_lock(&s->lock);
		if (sl->status < 0 || sl->posted + sl->qlen >= SET_AHEAD) {
			pthread_mutex_unlock(&s->lock);
			return;
		}
		sl->posted++;
		s->pending++;
		pthread_mutex_unlock(&s->lock);
		r = tp_pipe_read_descriptor(sl->pipe, slot_on_desc, sl);
		if (r < 0) {
			pthread_mutex_lock(&s->lock);
			s->pending--;
			sl->posted--;
			if (sl->status == 0)
				sl->status = r;
			pthread_cond_broadcast(&s->cond);
			pthread_mutex_unlock(&s->lock);
			return;
		}
	}
}

TP_EXPORT int tp_set_new(struct tp_context *ctx, unsigned max_pipes, struct tp_pipe_set **ret)
{
	struct tp_pipe_set *s;
	pthread_condattr_t ca;

	if (!ctx || !ret)
		return tpc_error(-EINVAL, "missing context or result pointer");
	if (max_pipes == 0 || max_pipes > TP_SET_MAX_PIPES)
		return tpc_error(-EINVAL, "a set holds 1 to %u pipes, not %u", TP_SET_MAX_PIPES,
				 max_pipes);
	s = calloc(1, sizeof(*s));
	if (s)
		s->slots = calloc(max_pipes, sizeof(*s->slots));
	if (!s || !s->slots) {
		free(s);
		return tpc_error(-ENOMEM, "out of memory for a pipe set");
	}
	s->ctx = ctx;
	s->max = max_pipes;
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &ca);
	pthread_condattr_destroy(&ca);
	*ret = s;
	return 0;
}

TP_EXPORT void tp_set_free(struct tp_pipe_set *s)
{
	if (!s)
		return;
	for (unsigned i = 0; i < s->n; i++) {
		struct set_slot *sl = s->slots[i];
		struct tp_pipe *p = sl->pipe;
		bool posted;

		/* a posted slot is freed by its last callback, which may run as soon as we unlock */
		pthread_mutex_lock(&s->lock);
		for (; sl->qlen > 0; sl->qlen--, sl->qhead = (sl->qhead + 1) % SET_AHEAD)
			tp_descriptor_free(sl->q[sl->qhead]);
		posted = sl->posted > 0;
		sl->detached = true;
		pthread_mutex_unlock(&s->lock);
		if (!posted)
			free(sl);
		tp_pipe_close(p);
	}
	pthread_mutex_lock(&s->lock);
	while (s->pending > 0)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	if (s->stage)
		tp_buffer_free(s->ctx, s->stage);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s->slots);
	free(s);
}

TP_EXPORT int tp_set_add(struct tp_pipe_set *s, struct tp_pipe *p)
{
	struct set_slot *sl;

	if (!s || !p)
		return tpc_error(-EINVAL, "missing set or pipe");
	if (tpc_context_on_io_thread(s->ctx))
		return tpc_error(-EDEADLK, "tp_set_add() called from a callback");
	if (p->ctx != s->ctx)
		return tpc_error(-EXDEV, "pipe belongs to another context than the set");
	for (unsigned i = 0; i < s->n; i++)
		if (s->slots[i]->pipe == p)
			return tpc_error(-EEXIST, "pipe is already in the set");
	if (s->n >= s->max)
		return tpc_error(-E2BIG, "set is full (%u pipes)", s->max);
	sl = calloc(1, sizeof(*sl));
	if (!sl)
		return tpc_error(-ENOMEM, "out of memory for a pipe set");
	sl->set = s;
	sl->pipe = p;
	pthread_mutex_lock(&s->lock);
	s->slots[s->n++] = sl;
	pthread_mutex_unlock(&s->lock);
	slot_post(s, sl);
	return 0;
}

TP_EXPORT unsigned tp_set_size(const struct tp_pipe_set *s)
{
	return s ? s->n : 0;
}

TP_EXPORT struct tp_pipe *tp_set_pipe(const struct tp_pipe_set *s, unsigned i)
{
	return s && i < s->n ? s->slots[i]->pipe : NULL;
}

TP_EXPORT int tp_set_last_status(const struct tp_pipe_set *s)
{
	return s ? s->last_status : 0;
}

TP_EXPORT int tp_set_wait_pipes(struct tp_pipe_set *s, struct tp_listener *l, unsigned n,
				int timeout_ms)
{
	struct timespec start;

	if (!s || !l)
		return tpc_error(-EINVAL, "missing set or listener");
	if (n > s->max)
		return tpc_error(-E2BIG, "waiting for %u pipes in a set of at most %u", n, s->max);
	clock_gettime(CLOCK_MONOTONIC, &start);
	while (s->n < n) {
		struct tp_pipe *p = NULL;
		int left = deadline_left(&start, timeout_ms);
		int r;

		if (left == 0)
			return tpc_error(-ETIMEDOUT, "%u of %u pipes arrived in %d ms", s->n, n,
					 timeout_ms);
		r = tp_listener_accept_sync(l, left, &p);
		if (r == -ETIMEDOUT)
			return tpc_error(-ETIMEDOUT, "%u of %u pipes arrived in %d ms", s->n, n,
					 timeout_ms);
		if (r < 0)
			return r;
		r = tp_set_add(s, p);
		if (r < 0) {
			tp_pipe_close(p);
			return r;
		}
	}
	return 0;
}

/* The next slot with a message or an end, round-robin from s->next; lock held. */
static int set_pick(struct tp_pipe_set *s)
{
	for (unsigned k = 0; k < s->n; k++) {
		unsigned i = (s->next + k) % s->n;
		struct set_slot *sl = s->slots[i];

		if (sl->qlen > 0 || (sl->status < 0 && sl->posted == 0))
			return (int)i;
	}
	return -1;
}

/* Hands out slot @i's end and drops it from the set; lock held. */
static void set_take_end(struct tp_pipe_set *s, unsigned i, struct tp_pipe **ret_pipe)
{
	struct set_slot *sl = s->slots[i];

	*ret_pipe = sl->pipe;
	s->last_status = sl->status;
	memmove(&s->slots[i], &s->slots[i + 1], (s->n - i - 1) * sizeof(*s->slots));
	s->n--;
	s->next = s->n ? i % s->n : 0;
	free(sl);
}

TP_EXPORT int tp_set_read_any(struct tp_pipe_set *s, int timeout_ms, struct tp_pipe **ret_pipe,
			      struct tp_descriptor **ret_desc)
{
	struct timespec start;
	struct set_slot *sl;
	int i, status;

	if (!s || !ret_pipe || !ret_desc)
		return tpc_error(-EINVAL, "missing set or result pointer");
	if (tpc_context_on_io_thread(s->ctx))
		return tpc_error(-EDEADLK, "tp_set_read_any() called from a callback");
	clock_gettime(CLOCK_MONOTONIC, &start);
	pthread_mutex_lock(&s->lock);
	for (;;) {
		int left;

		if (s->n == 0) {
			pthread_mutex_unlock(&s->lock);
			return tpc_error(-ENOENT, "the pipe set is empty");
		}
		i = set_pick(s);
		if (i >= 0)
			break;
		left = deadline_left(&start, timeout_ms);
		if (left == 0) {
			pthread_mutex_unlock(&s->lock);
			return tpc_error(-ETIMEDOUT, "no pipe of the set had a message in %d ms",
					 timeout_ms);
		}
		set_cond_wait(s, left);
	}
	sl = s->slots[i];
	if (sl->qlen == 0) {
		status = sl->status;
		set_take_end(s, (unsigned)i, ret_pipe);
		*ret_desc = NULL;
		pthread_mutex_unlock(&s->lock);
		tpc_error(status, "pipe ended (%d)", status);
		return 1;
	}
	*ret_pipe = sl->pipe;
	*ret_desc = sl->q[sl->qhead];
	sl->qhead = (sl->qhead + 1) % SET_AHEAD;
	sl->qlen--;
	s->next = ((unsigned)i + 1) % s->n;
	pthread_mutex_unlock(&s->lock);
	slot_post(s, sl);
	return 0;
}

/* ---- broadcast ----------------------------------------------------------------------------- */

struct bcast {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned left;
	int *status; /* per pipe */
};

struct bcast_one {
	struct bcast *b;
	unsigned i;
};

static void bcast_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct bcast_one *o = arg;
	struct bcast *b = o->b;

	(void)p;
	(void)errmsg;
	pthread_mutex_lock(&b->lock);
	b->status[o->i] = status;
	b->left--;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->lock);
}

/* Is [@data, +@len) private CPU memory (not in a shared buffer of @ctx)? */
static bool bcast_private(struct tp_context *ctx, const void *data, size_t len)
{
	bool priv;

	if (len == 0)
		return false;
	pthread_mutex_lock(&ctx->lock);
	priv = tpc_buffer_lookup_locked(ctx, data, len) == NULL;
	pthread_mutex_unlock(&ctx->lock);
	return priv;
}

#define STAGE_ALIGN 64

/* Adds @len staged bytes (aligned) to *@total; -E2BIG past TP_SET_STAGE_MAX (no overflow: every
 * step is checked against the limit first). */
static int stage_add(size_t *total, size_t len)
{
	if (len > TP_SET_STAGE_MAX || *total + len > TP_SET_STAGE_MAX)
		return tpc_error(-E2BIG, "broadcast of more than %zu private bytes",
				 TP_SET_STAGE_MAX);
	*total += (len + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
	return 0;
}

/* -E2BIG when @msg has more than TP_SET_STAGE_MAX private bytes, whoever would stage them (the
 * set, or the daemon's fan-out: the same bound on what one broadcast reads). */
static int bcast_private_check(struct tp_context *ctx, const struct tp_message *msg)
{
	size_t total = 0;
	int r = 0;

	for (size_t i = 0; r == 0 && i < msg->n_payloads; i++)
		if (bcast_private(ctx, msg->payloads[i].data, msg->payloads[i].length))
			r = stage_add(&total, msg->payloads[i].length);
	for (size_t i = 0; r == 0 && i < msg->n_tensors; i++)
		if (msg->tensors[i].device.type == TP_DEVICE_CPU &&
		    bcast_private(ctx, msg->tensors[i].data, msg->tensors[i].length))
			r = stage_add(&total, msg->tensors[i].length);
	return r;
}

/* The set's staging buffer, grown to at least @len bytes (it is reused: no page faults). */
static int bcast_stage_get(struct tp_pipe_set *s, size_t len, char **ret)
{
	void *b = NULL;
	int r;

	if (s->stage_len < len) {
		r = tp_buffer_alloc(s->ctx, len, &b);
		if (r < 0)
			return r;
		if (s->stage)
			tp_buffer_free(s->ctx, s->stage);
		s->stage = b;
		s->stage_len = len;
	}
	*ret = s->stage;
	return 0;
}

/*
 * Copies @msg into @copy (borrowing its arrays from @pl/@tn), moving private CPU data into the
 * set's staging buffer (kept for the next broadcast; freed with the set).
 */
static int bcast_stage(struct tp_pipe_set *s, const struct tp_message *msg,
		       struct tp_payload *pl, struct tp_tensor *tn, struct tp_message *copy)
{
	struct tp_context *ctx = s->ctx;
	size_t total = 0, off = 0;
	char *stage = NULL;
	int r;

	*copy = *msg;
	copy->payloads = msg->n_payloads ? pl : NULL;
	copy->tensors = msg->n_tensors ? tn : NULL;
	for (size_t i = 0; i < msg->n_payloads; i++) {
		pl[i] = msg->payloads[i];
		if (bcast_private(ctx, pl[i].data, pl[i].length) &&
		    (r = stage_add(&total, pl[i].length)) < 0)
			return r;
	}
	for (size_t i = 0; i < msg->n_tensors; i++) {
		tn[i] = msg->tensors[i];
		if (tn[i].device.type == TP_DEVICE_CPU &&
		    bcast_private(ctx, tn[i].data, tn[i].length) &&
		    (r = stage_add(&total, tn[i].length)) < 0)
			return r;
	}
	if (total == 0)
		return 0;
	r = bcast_stage_get(s, total, &stage);
	if (r < 0)
		return r;
	for (size_t i = 0; i < msg->n_payloads; i++) {
		if (!bcast_private(ctx, pl[i].data, pl[i].length))
			continue;
		memcpy(stage + off, pl[i].data, pl[i].length);
		pl[i].data = stage + off;
		off += (pl[i].length + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
	}
	for (size_t i = 0; i < msg->n_tensors; i++) {
		if (tn[i].device.type != TP_DEVICE_CPU ||
		    !bcast_private(ctx, tn[i].data, tn[i].length))
			continue;
		memcpy(stage + off, tn[i].data, tn[i].length);
		tn[i].data = stage + off;
		off += (tn[i].length + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
	}
	return 0;
}

/* A delivery refused at once (@r < 0: no callback comes). */
static void bcast_refused(struct bcast *b, unsigned i, int r, uint64_t *ops)
{
	pthread_mutex_lock(&b->lock);
	b->status[i] = r;
	b->left--;
	ops[i] = 0;
	pthread_mutex_unlock(&b->lock);
}

/*
 * The daemon's fan-out: one Broadcast for every pipe (tpc_pipes_broadcast()). Return: 0 (the
 * deliveries are filed or refused), -EOPNOTSUPP (nothing filed: write each pipe instead), or
 * -errno (nothing filed).
 */
static int bcast_daemon(struct tp_pipe_set *s, const struct tp_message *m, struct bcast *b,
			struct bcast_one *ones, uint64_t *ops)
{
	_cleanup_free_ struct tp_pipe **pipes = calloc(s->n, sizeof(*pipes));
	_cleanup_free_ void **args = calloc(s->n, sizeof(*args));
	_cleanup_free_ int *st = calloc(s->n, sizeof(*st));
	int r;

	if (!pipes || !args || !st)
		return tpc_error(-ENOMEM, "out of memory for a broadcast");
	for (unsigned i = 0; i < s->n; i++) {
		pipes[i] = s->slots[i]->pipe;
		args[i] = &ones[i];
	}
	r = tpc_pipes_broadcast(pipes, s->n, m, bcast_on_done, args, ops, st);
	for (unsigned i = 0; r == 0 && i < s->n; i++)
		if (st[i] < 0)
			bcast_refused(b, i, st[i], ops);
	return r;
}

/* Starts every delivery as a write of its own (unless @filed: the daemon's fan-out filed them),
 * then waits for all of them; a delivery late past @timeout_ms is cancelled and still waited for
 * (its callback frees its memory). */
static void bcast_run(struct tp_pipe_set *s, const struct tp_message *m, int timeout_ms,
		      struct bcast *b, struct bcast_one *ones, uint64_t *ops, bool filed)
{
	struct timespec start;
	bool cancelled = false;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (unsigned i = 0; !filed && i < s->n; i++) {
		int w = tp_pipe_write_ex(s->slots[i]->pipe, m, bcast_on_done, &ones[i], &ops[i]);

		if (w < 0)
			bcast_refused(b, i, w, ops);
	}
	pthread_mutex_lock(&b->lock);
	while (b->left > 0) {
		int left = cancelled ? -1 : deadline_left(&start, timeout_ms);
		struct timespec ts;

		if (left == 0) {
			cancelled = true;
			pthread_mutex_unlock(&b->lock);
			for (unsigned i = 0; i < s->n; i++)
				if (ops[i])
					tp_cancel(s->ctx, ops[i]);
			pthread_mutex_lock(&b->lock);
			continue;
		}
		if (left < 0) {
			pthread_cond_wait(&b->cond, &b->lock);
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += left / 1000;
		ts.tv_nsec += (long)(left % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&b->cond, &b->lock, &ts);
	}
	pthread_mutex_unlock(&b->lock);
}

/* Files the deliveries of @msg: the daemon's fan-out where it takes them (*@ret_filed), else
 * stages private memory into @copy for the set's own. Return: 0 or -errno (nothing filed). */
static int bcast_start(struct tp_pipe_set *s, const struct tp_message *msg, struct bcast *b,
		       struct bcast_one *ones, uint64_t *ops, struct tp_payload *pl,
		       struct tp_tensor *tn, struct tp_message *copy, bool *ret_filed)
{
	int r = -EOPNOTSUPP;

	*copy = *msg;
	for (unsigned i = 0; i < s->n; i++) {
		ones[i].b = b;
		ones[i].i = i;
	}
	r = bcast_private_check(s->ctx, msg);
	if (r < 0)
		return r;
	r = -EOPNOTSUPP;
	if (s->fanout != TP_FANOUT_LIBRARY)
		r = bcast_daemon(s, msg, b, ones, ops);
	if (r == -EOPNOTSUPP && s->fanout == TP_FANOUT_DAEMON)
		return tpc_error(-EOPNOTSUPP, "the daemon cannot fan this broadcast out (an older "
				 "daemon, also for CUDA tensors below minor %u, bcast-pipes-max, "
				 "staging, or writes held)", TPW_MINOR_BCAST_CUDA);
	*ret_filed = r == 0;
	if (r == 0)
		s->last_fanout = TP_FANOUT_DAEMON;
	if (r != -EOPNOTSUPP)
		return r;
	s->last_fanout = TP_FANOUT_LIBRARY;
	return bcast_stage(s, msg, pl, tn, copy);
}

TP_EXPORT int tp_set_broadcast(struct tp_pipe_set *s, const struct tp_message *msg,
			       int timeout_ms, int *ret_status, size_t n_status)
{
	_cleanup_free_ struct tp_payload *pl = NULL;
	_cleanup_free_ struct tp_tensor *tn = NULL;
	_cleanup_free_ struct bcast_one *ones = NULL;
	_cleanup_free_ uint64_t *ops = NULL;
	_cleanup_free_ int *status = NULL;
	struct tp_message copy;
	pthread_condattr_t ca;
	struct bcast b = { .left = 0 };
	bool filed = false;
	int r, ok = 0;

	if (!s || !msg || (n_status && !ret_status))
		return tpc_error(-EINVAL, "missing set, message or result array");
	if (tpc_context_on_io_thread(s->ctx))
		return tpc_error(-EDEADLK, "tp_set_broadcast() called from a callback");
	if (s->n == 0)
		return tpc_error(-ENOENT, "the pipe set is empty");
	pl = calloc(msg->n_payloads + 1, sizeof(*pl));
	tn = calloc(msg->n_tensors + 1, sizeof(*tn));
	ones = calloc(s->n, sizeof(*ones));
	ops = calloc(s->n, sizeof(*ops));
	status = calloc(s->n, sizeof(*status));
	if (!pl || !tn || !ones || !ops || !status)
		return tpc_error(-ENOMEM, "out of memory for a broadcast");
	pthread_mutex_init(&b.lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b.cond, &ca);
	pthread_condattr_destroy(&ca);
	b.left = s->n;
	b.status = status;
	r = bcast_start(s, msg, &b, ones, ops, pl, tn, &copy, &filed);
	if (r == 0)
		bcast_run(s, &copy, timeout_ms, &b, ones, ops, filed);
	pthread_cond_destroy(&b.cond);
	pthread_mutex_destroy(&b.lock);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < s->n; i++) {
		if (status[i] == 0)
			ok++;
		if (i < n_status)
			ret_status[i] = status[i];
	}
	return ok;
}

TP_EXPORT int tp_set_set_fanout(struct tp_pipe_set *s, enum tp_fanout how)
{
	if (!s)
		return tpc_error(-EINVAL, "missing set");
	if (how != TP_FANOUT_AUTO && how != TP_FANOUT_LIBRARY && how != TP_FANOUT_DAEMON)
		return tpc_error(-EINVAL, "unknown fan-out %d", (int)how);
	s->fanout = how;
	return 0;
}

TP_EXPORT enum tp_fanout tp_set_last_fanout(const struct tp_pipe_set *s)
{
	return s ? s->last_fanout : TP_FANOUT_AUTO;
}
