/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipe rings (issue 27), the library's side: when the daemon hands a private->private message
 * to both ends of a same-host pipe (RingXfer), the writer's library copies the caller's bytes
 * into the ring chunk by chunk while the reader's copies them out into its allocation, each on
 * a thread of its own per ring, so both cores work and the chunks stay in cache (a message of
 * up to PRING_INLINE_MAX for an idle ring on the thread that read its RingXfer, sparing the
 * wake-up of the ring's); each then says RingDone. One ring per pipe direction, mapped from
 * the memfd the daemon sends once (beside the control ring, on the socket), kept until the
 * daemon names another or the pipe closes.
 * Everything the other process writes in the ring header is checked before use: an index out of
 * bounds, or one that moves backwards, fails this message (and its pipe's ring), nothing else;
 * no value of it keeps the io thread past its budget, and a local close stops a ring's thread
 * whatever the other process writes. Not here: choosing the ring (the daemon's broker), the
 * layout (proto/pring.h).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include "internal.h"
#include "pring.h"
#include "reduce.h"

#define PRING_SPIN_NS 50000u /* spin this long for the other side before sleeping */
#define PRING_SLEEP_MS 100   /* futex waits, between checks that the pipe still lives */
/* A message of at most PRING_INLINE_MAX bytes for an idle ring is copied by the thread that
 * read its RingXfer (the io thread), not handed to the ring's thread: no wake-up of that thread
 * (tens of microseconds where the other CPU sleeps). That thread spins at most PRING_INLINE_NS
 * for the other side at each chunk, and waits at no chunk once PRING_INLINE_BUDGET_NS went by
 * since it began the message; then it hands the rest of the message to the ring's thread, so a
 * peer that stalls, lies or keeps moving its index holds it no longer. */
#define PRING_INLINE_MAX (256u << 10)
#define PRING_INLINE_NS 20000u
#define PRING_INLINE_BUDGET_NS 300000u
/* Rings a context holds at most, unless $TPIPD_PIPE_RINGS_MAX says otherwise: each costs a
 * thread and a mapping of the ring in this process, and another user at the other end of a
 * pipe makes the daemon hand them out. */
#define PRING_RINGS_MAX_DEFAULT 64u
#define PRING_RINGS_MAX_LIMIT 4096u

struct tpc_pring {
	struct tpu_list link; /* ctx->prings */
	struct tp_context *ctx;
	uint64_t pipe_id;
	bool reader;
	uint64_t ring_id;
	uint8_t *map;
	size_t map_len;
	uint32_t chunk;
	uint32_t nchunks;
	pthread_cond_t cond; /* with ctx->lock: jobs queued, stop */
	struct tpu_list jobs;
	bool busy;  /* a job of it runs (its thread's, or one the frame's reader runs inline) */
	bool stop;  /* the thread exits once its jobs are done */
	bool abort; /* atomic: give up the job running (the pipe is gone) */
};

struct pring_job {
	struct tpu_list node;
	struct tpc_op *op; /* marked copying until the job ends */
	uint64_t id;
	uint32_t start;
	uint64_t next; /* chunks of it moved so far (by the io thread, before a hand-off) */
	uint32_t seen; /* with @next: the other side's index the io thread saw last */
	size_t n;
	uint64_t *addrs;
	uint64_t *lens;
	/* a reader's message of a quarter of the cache or more: copied out with non-temporal
	 * stores (tpc_copy_far()'s threshold), its destination outgrowing the cache anyway */
	bool far;
};

/* Copies @len bytes between the message's segments at byte @off and @buf (@in: into the
 * ring). */
static void seg_copy(const struct pring_job *j, uint64_t off, uint8_t *buf, size_t len, bool in)
{
	size_t i = 0;

	while (i < j->n && off >= j->lens[i]) {
		off -= j->lens[i];
		i++;
	}
	while (len && i < j->n) {
		uint8_t *mem = (uint8_t *)(uintptr_t)j->addrs[i] + off;
		size_t k = j->lens[i] - off < len ? (size_t)(j->lens[i] - off) : len;

		if (in)
			memcpy(buf, mem, k); /* into the ring: the reader's core reads it next */
		else if (j->far)
			tpc_copy_stream(mem, buf, k);
		else
			memcpy(mem, buf, k);
		buf += k;
		len -= k;
		off = 0;
		i++;
	}
}

static bool ring_gone(const struct tpc_pring *r)
{
	const struct tpw_pring_hdr *h = (const void *)r->map;

	return __atomic_load_n(&h->dead, __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&r->abort, __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&r->ctx->dead, __ATOMIC_ACQUIRE);
}

/*
 * Waits until the other side moved @word away from @seen (spinning a while, then on the futex
 * with the @wait flag set for the other side to wake us). Return: the new value, or @seen when
 * the ring died, the pipe went or the context did (the caller checks ring_gone()).
 */
static uint32_t ring_wait(struct tpc_pring *r, uint32_t *word, uint32_t *wait, uint32_t seen)
{
	uint64_t t0 = tpu_now_ns();
	uint32_t v;

	for (unsigned n = 0;; n++) {
		v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
		if (v != seen || ring_gone(r))
			return v;
		if ((n & 63) == 63 && tpu_now_ns() - t0 > PRING_SPIN_NS)
			break;
		if (n < 256) {
#if defined(__x86_64__) || defined(__i386__)
			__builtin_ia32_pause();
#endif
			continue;
		}
		/* Then yield: the other side may be waiting for this CPU. Unless other threads hold
		 * the CPUs (a long yield, ring.h): then sleep, to be woken ahead of them. */
		if (tpu_spin_quiet(tpu_now_ns()))
			break;
		if (tpu_spin_pause() && __atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
			tpu_spin_contended(tpu_now_ns());
			break;
		}
	}
	for (;;) {
		__atomic_store_n(wait, 1, __ATOMIC_SEQ_CST);
		v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
		if (v != seen || ring_gone(r))
			return v;
		tpw_pring_wait(word, seen, PRING_SLEEP_MS);
	}
}

/* Spins at most @ns for the other side to move @word from *@seen (the new value in *@seen).
 * Return: true when it moved or the ring went (the caller checks ring_gone()). */
static bool ring_spin(struct tpc_pring *r, const uint32_t *word, uint32_t *seen, uint64_t ns)
{
	uint64_t t0 = tpu_now_ns();

	for (unsigned n = 0;; n++) {
		uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);

		if (v != *seen || ring_gone(r)) {
			*seen = v;
			return true;
		}
		if ((n & 63) == 63 && tpu_now_ns() - t0 > ns)
			return false;
#if defined(__x86_64__) || defined(__i386__)
		__builtin_ia32_pause();
#endif
	}
}

/* Publishes @v in @word and wakes the other side if it sleeps on it. */
static void ring_publish(uint32_t *word, uint32_t *wait, uint32_t v)
{
	__atomic_store_n(word, v, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(wait, __ATOMIC_SEQ_CST) && __atomic_exchange_n(wait, 0, __ATOMIC_SEQ_CST))
		tpw_pring_wake(word);
}

static uint64_t job_bytes(const struct pring_job *j)
{
	uint64_t t = 0;

	for (size_t i = 0; i < j->n; i++)
		t += j->lens[i];
	return t;
}

/*
 * Waits on the io thread for the other side to move @word from *@seen: at most PRING_INLINE_NS,
 * and not past @deadline. Return: as ring_spin(); false at once past @deadline.
 */
static bool ring_spin_until(struct tpc_pring *r, const uint32_t *word, uint32_t *seen,
			    uint64_t deadline)
{
	uint64_t now = tpu_now_ns();

	if (now >= deadline)
		return false;
	return ring_spin(r, word, seen, TPU_MIN(deadline - now, (uint64_t)PRING_INLINE_NS));
}

/* Checks the other side's index @seen, read after @was (at chunk @k of @nk): it never moves
 * back (its side only ever adds to it), so a peer cannot make us wait for a value it takes back
 * and offers again forever. Return: 0 or -EPROTO with the reason in @why. */
static int ring_check_forward(uint32_t was, uint32_t seen, uint64_t k, uint64_t nk, char *why,
			      size_t wl)
{
	if ((int32_t)(seen - was) >= 0)
		return 0;
	return tpu_why(-EPROTO, why, wl, "pipe ring index moved backwards by %d (chunk %llu of "
		       "%llu): protocol violation by the other end", (int)(int32_t)(was - seen),
		       (unsigned long long)k, (unsigned long long)nk);
}

/*
 * Moves job @j through @r from its chunk @j->next on: the writer copies in, the reader out.
 * head and tail are the other process's to write as much as ours: every value read is checked
 * against what this message allows, and never moves backwards. @deadline: not 0 on the io
 * thread, which waits for the other side at most PRING_INLINE_NS a chunk and not past
 * @deadline. Return: 0; -EAGAIN when it waited that long (@j->next says where the ring's thread
 * goes on); or -errno with the reason in @why.
 */
static int ring_run(struct tpc_pring *r, struct pring_job *j, uint64_t deadline, char *why,
		    size_t wl)
{
	struct tpw_pring_hdr *h = (void *)r->map;
	uint8_t *data = r->map + TPW_PRING_HDR_BYTES;
	uint64_t total = job_bytes(j), nk = (total + r->chunk - 1) / r->chunk;
	uint32_t *mine = r->reader ? &h->tail : &h->head;
	uint32_t *theirs = r->reader ? &h->head : &h->tail;
	uint32_t *their_wait = r->reader ? &h->wr_wait : &h->rd_wait;
	uint32_t *my_wait = r->reader ? &h->rd_wait : &h->wr_wait;
	uint32_t seen = __atomic_load_n(theirs, __ATOMIC_ACQUIRE), was;

	if (nk > UINT32_MAX / 2 || j->next > nk ||
	    __atomic_load_n(mine, __ATOMIC_ACQUIRE) != j->start + (uint32_t)j->next)
		return tpu_why(-EPROTO, why, wl, "pipe ring out of step at the start");
	if (j->next && ring_check_forward(j->seen, seen, j->next, nk, why, wl) < 0)
		return -EPROTO; /* handed on by the io thread: from where it was */
	for (uint64_t k = j->next; k < nk; k++) {
		uint64_t off = k * r->chunk;
		size_t len = total - off < r->chunk ? (size_t)(total - off) : r->chunk;

		for (;;) {
			/* chunks the other side is at, from this message's start; the daemon hands
			 * out the next messages of the ring before this one ends, so the writer may
			 * already be in a later message and the reader still in an earlier one */
			int64_t ahead = (int32_t)(seen - j->start);

			/* The writer may be at most nchunks ahead of the reader, the reader never
			 * ahead of the writer: for the reader the writer is past this message's
			 * start, for the writer the reader is at most nchunks before it. */
			if (r->reader ? ahead < 0 || ahead - (int64_t)k > r->nchunks
				      : ahead > (int64_t)k || ahead < -(int64_t)r->nchunks)
				return tpu_why(-EPROTO, why, wl, "pipe ring index %d out of bounds "
					       "(chunk %llu of %llu)", (int)ahead,
					       (unsigned long long)k, (unsigned long long)nk);
			if (r->reader ? ahead > (int64_t)k : (int64_t)k - ahead < r->nchunks)
				break;
			was = seen;
			if (deadline && !ring_spin_until(r, theirs, &seen, deadline)) {
				j->next = k;
				j->seen = seen;
				return -EAGAIN;
			}
			if (!deadline)
				seen = ring_wait(r, theirs, my_wait, seen);
			if (ring_gone(r))
				return tpu_why(-ECONNRESET, why, wl, "pipe ring transfer abandoned");
			if (ring_check_forward(was, seen, k, nk, why, wl) < 0)
				return -EPROTO;
		}
		seg_copy(j, off, data + (size_t)((j->start + k) % r->nchunks) * r->chunk, len,
			 !r->reader);
		ring_publish(mine, their_wait, j->start + (uint32_t)k + 1);
	}
	return 0;
}

static void ring_done_send(struct tp_context *ctx, const struct tpc_pring *r,
			   const struct pring_job *j, int err, const char *why)
{
	Tpw__V1__RingDone d = TPW__V1__RING_DONE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	d.pipe_id = r->pipe_id;
	d.id = j->id;
	d.reader = r->reader;
	d.status = tpw_status_from_errno(err);
	d.message = err < 0 ? (char *)why : "";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_DONE;
	m.ring_done = &d;
	pthread_mutex_lock(&ctx->send_lock);
	if (!__atomic_load_n(&ctx->dead, __ATOMIC_ACQUIRE))
		tpc_wire_send(ctx, &m, NULL, 0, -EBADF); /* a failed send is connection loss */
	pthread_mutex_unlock(&ctx->send_lock);
}

/* Lets @j's op complete (its callback waited for the copy); lock held. */
static void job_end_locked(struct tp_context *ctx, struct pring_job *j)
{
	if (j->op) {
		__atomic_store_n(&j->op->pring, NULL, __ATOMIC_RELEASE);
		j->op->copying = false;
		if (!j->op->pending) /* completed meanwhile: its callback may run now */
			tpc_context_wake(ctx);
	}
	free(j);
}

/* The end of job @j of @r with @err (@why): the ring killed on failure, RingDone sent. Lock
 * not held. */
static void job_finish(struct tpc_pring *r, const struct pring_job *j, int err, const char *why)
{
	/* before RingDone: the op's completion, which may follow it at once, finds it ended */
	if (j->op)
		__atomic_store_n(&j->op->pring, NULL, __ATOMIC_RELEASE);
	if (err < 0) /* the other side, or the daemon, learns it through the dead word */
		tpw_pring_kill((void *)r->map);
	ring_done_send(r->ctx, r, j, err, why);
}

static void *ring_main(void *arg)
{
	struct tpc_pring *r = arg;
	struct tp_context *ctx = r->ctx;
	struct pring_job *j;

	pthread_mutex_lock(&ctx->lock);
	for (;;) {
		char why[200] = "";
		int err;

		while (r->busy || (tpu_list_empty(&r->jobs) && !r->stop))
			pthread_cond_wait(&r->cond, &ctx->lock);
		j = tpu_list_first(&r->jobs, struct pring_job, node);
		if (!j)
			break;
		tpu_list_remove(&j->node);
		r->busy = true;
		pthread_mutex_unlock(&ctx->lock);
		err = ring_run(r, j, 0, why, sizeof(why));
		job_finish(r, j, err, why);
		pthread_mutex_lock(&ctx->lock);
		r->busy = false;
		job_end_locked(ctx, j);
	}
	tpu_list_remove(&r->link);
	ctx->n_prings--;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	munmap(r->map, r->map_len);
	pthread_cond_destroy(&r->cond);
	free(r);
	return NULL;
}

/* Stops @r: its thread ends its jobs (@abort: gives them up, at once, whatever the other side
 * writes in the ring) and frees it; lock held. */
static void ring_stop_locked(struct tpc_pring *r, bool abort)
{
	struct tpw_pring_hdr *h = (void *)r->map;

	r->stop = true;
	pthread_cond_signal(&r->cond);
	if (!abort)
		return;
	__atomic_store_n(&r->abort, true, __ATOMIC_RELEASE);
	/* a job asleep on the other side's word looks at the flag now, not at its next check */
	tpw_pring_wake(r->reader ? &h->head : &h->tail);
}

static struct tpc_pring *ring_find_locked(struct tp_context *ctx, uint64_t pipe_id, bool reader)
{
	struct tpc_pring *r;

	tpu_list_for_each(r, &ctx->prings, link)
		if (r->pipe_id == pipe_id && r->reader == reader && !r->stop)
			return r;
	return NULL;
}

/* The fd the daemon sent before its RingXfer (or ChanReply with map_fd, GroupJoined with
 * arena_fd; without a control ring, with the frame's first byte); rx_lock held (the frame's
 * reader). Return: fd or -errno. */
int tpc_pring_take_fd(struct tp_context *ctx)
{
	int fd;

	if (ctx->n_pring_fds == 0 && ctx->ring) { /* sent before the frame: on the socket now */
		tpc_context_drain_bells(ctx);
		/* The doorbells taken may announce frames behind this one, which the io thread
		 * now sleeps through: make it look at the ring again. */
		tpc_context_wake(ctx);
	}
	if (ctx->n_pring_fds == 0)
		return -ENOENT;
	fd = ctx->pring_fds[0];
	memmove(ctx->pring_fds, ctx->pring_fds + 1, --ctx->n_pring_fds * sizeof(int));
	return fd;
}

/* Maps the ring of @x from @fd (taken) into a new ring object with its thread; lock held. */
static int ring_new_locked(struct tp_context *ctx, const Tpw__V1__RingXfer *x, int fd,
			   struct tpc_pring **ret)
{
	size_t len = tpw_pring_file_bytes(x->chunk_bytes, x->nchunks);
	struct tpc_pring *r;
	pthread_attr_t at;
	struct stat st;
	pthread_t t;
	int err;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < len) { /* else SIGBUS */
		close(fd);
		return -EPROTO;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		close(fd);
		return -ENOMEM;
	}
	r->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (r->map == MAP_FAILED) {
		free(r);
		return -ENOMEM;
	}
	r->ctx = ctx;
	r->map_len = len;
	r->pipe_id = x->pipe_id;
	r->reader = x->reader;
	r->ring_id = x->ring_id;
	r->chunk = x->chunk_bytes;
	r->nchunks = x->nchunks;
	tpu_list_init(&r->jobs);
	pthread_cond_init(&r->cond, NULL);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	err = -pthread_create(&t, &at, ring_main, r);
	pthread_attr_destroy(&at);
	if (err < 0) {
		munmap(r->map, len);
		pthread_cond_destroy(&r->cond);
		free(r);
		return err;
	}
	tpu_list_insert_tail(&ctx->prings, &r->link);
	ctx->n_prings++;
	*ret = r;
	return 0;
}

int tpc_pring_env(struct tp_context *ctx)
{
	const char *e = getenv("TPIPD_PIPE_RINGS_MAX");
	char *end;
	unsigned long v;

	ctx->pring_max = PRING_RINGS_MAX_DEFAULT;
	if (!e || !*e)
		return 0;
	errno = 0;
	v = strtoul(e, &end, 10);
	if (errno || *end || *e < '0' || *e > '9' || v > PRING_RINGS_MAX_LIMIT)
		return tpc_error(-EINVAL, "TPIPD_PIPE_RINGS_MAX=%s: not 0..%u", e,
				 PRING_RINGS_MAX_LIMIT);
	ctx->pring_max = (unsigned)v;
	return 0;
}

/* May @ctx take one more ring? Those stopped are on their way out (their thread gives up its
 * copy at once). Return: 0, or -ENOBUFS with the reason in @why. Lock held. */
static int ring_room_locked(struct tp_context *ctx, char *why, size_t wl)
{
	struct tpc_pring *r;
	unsigned n = 0;

	tpu_list_for_each(r, &ctx->prings, link)
		n += !r->stop;
	if (n < ctx->pring_max)
		return 0;
	return tpu_why(-ENOBUFS, why, wl, "this context holds its limit of %u pipe rings "
		       "(TPIPD_PIPE_RINGS_MAX)", ctx->pring_max);
}

/* The pending write (@reader false) or read @id of @p; lock held. */
static struct tpc_op *ring_op_locked(struct tp_pipe *p, uint64_t id, bool reader)
{
	struct tpc_op *op;

	tpu_list_for_each(op, reader ? &p->reads : &p->writes, node)
		if (op->id == id && op->pending && !op->copying)
			return op;
	return NULL;
}

/* A job for @x: its op marked copying, its segments copied; lock held. */
static int ring_job_locked(struct tp_context *ctx, const Tpw__V1__RingXfer *x,
			   struct pring_job **ret)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, x->pipe_id);
	struct pring_job *j = calloc(1, sizeof(*j) + 2 * x->n_lens * sizeof(uint64_t));
	size_t total = 0; /* the reader's message bytes (0 for a writer: never streamed) */

	if (!j)
		return -ENOMEM;
	j->addrs = (uint64_t *)(j + 1);
	j->lens = j->addrs + x->n_lens;
	j->n = x->n_lens;
	memcpy(j->addrs, x->addrs, x->n_lens * sizeof(uint64_t));
	memcpy(j->lens, x->lens, x->n_lens * sizeof(uint64_t));
	for (size_t i = 0; x->reader && i < x->n_lens; i++)
		total += x->lens[i] < SIZE_MAX - total ? (size_t)x->lens[i] : SIZE_MAX - total;
	j->far = total >= tpc_cache_bytes() / 4;
	j->id = x->id;
	j->start = x->start;
	j->op = p ? ring_op_locked(p, x->id, x->reader) : NULL;
	if (j->op)
		j->op->copying = true;
	*ret = j;
	return j->op ? 0 : -ENOENT;
}

/* RingXfer.offer: the writing end of pipe @x->pipe_id has a ring for good; its later messages
 * of at least @x->min_bytes name their memory by ring_addr (write.c). Lock held. */
static void ring_offer_locked(struct tp_context *ctx, const Tpw__V1__RingXfer *x)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, x->pipe_id);
	struct tpc_pring *r = ring_find_locked(ctx, x->pipe_id, false);
	int fd = tpc_pring_take_fd(ctx), err;
	char why[160] = "";

	if (r)
		ring_stop_locked(r, true);
	err = fd < 0 ? fd : !p ? -ENOENT : ring_room_locked(ctx, why, sizeof(why));
	if (err == 0)
		err = ring_new_locked(ctx, x, TAKE_FD(fd), &r);
	if (fd >= 0)
		close(fd);
	if (err < 0) { /* the writes stay staged */
		tpc_context_log(ctx, LOG_INFO, "pipe %llu: pipe ring offer not taken: %s",
				(unsigned long long)x->pipe_id, *why ? why : strerror(-err));
		return;
	}
	p->ring_min = x->min_bytes ? x->min_bytes : 1;
}

/* Runs job @j of @r (marked busy) on the io thread, as far as it goes without waiting long
 * for the other side, and hands the rest, if any, to the ring's thread; lock not held. */
static void ring_run_inline(struct tpc_pring *r, struct pring_job *j)
{
	struct tp_context *ctx = r->ctx;
	char why[200] = "";
	int err = ring_run(r, j, tpu_now_ns() + PRING_INLINE_BUDGET_NS, why, sizeof(why));

	if (err != -EAGAIN)
		job_finish(r, j, err, why);
	pthread_mutex_lock(&ctx->lock);
	r->busy = false;
	if (err == -EAGAIN)
		tpu_list_insert_head(&r->jobs, &j->node); /* before any queued meanwhile */
	else
		job_end_locked(ctx, j);
	if (!tpu_list_empty(&r->jobs) || r->stop)
		pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&ctx->lock);
}

void tpc_pring_on_xfer(struct tp_context *ctx, const Tpw__V1__RingXfer *x)
{
	Tpw__V1__RingDone d = TPW__V1__RING_DONE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tpc_pring *r;
	struct pring_job *j = NULL;
	int fd = -EBADF, err;
	char why[160] = "";

	pthread_mutex_lock(&ctx->lock);
	if (x->offer) {
		ring_offer_locked(ctx, x);
		pthread_mutex_unlock(&ctx->lock);
		return;
	}
	r = ring_find_locked(ctx, x->pipe_id, x->reader);
	if (x->fd_follows) {
		fd = tpc_pring_take_fd(ctx);
		if (r) /* the daemon gave up the old one */
			ring_stop_locked(r, true);
		r = NULL;
	}
	err = ring_job_locked(ctx, x, &j);
	if (err == 0 && !r && fd < 0)
		err = -EPROTO; /* no fd, or a ring we do not have */
	if (err == 0 && !r) /* declined (STATUS_LIMIT): the daemon moves it another way */
		err = ring_room_locked(ctx, why, sizeof(why));
	if (err == 0 && !r)
		err = ring_new_locked(ctx, x, TAKE_FD(fd), &r);
	else if (fd >= 0)
		close(fd);
	if (err == 0 && (r->chunk != x->chunk_bytes || r->nchunks != x->nchunks))
		err = -EPROTO;
	if (err == 0)
		__atomic_store_n(&j->op->pring, r, __ATOMIC_RELEASE);
	if (err == 0 && !r->busy && tpu_list_empty(&r->jobs) && job_bytes(j) <= PRING_INLINE_MAX) {
		r->busy = true;
		pthread_mutex_unlock(&ctx->lock);
		ring_run_inline(r, j);
		return;
	}
	if (err == 0) {
		tpu_list_insert_tail(&r->jobs, &j->node);
		pthread_cond_signal(&r->cond);
		pthread_mutex_unlock(&ctx->lock);
		return;
	}
	if (j)
		job_end_locked(ctx, j);
	pthread_mutex_unlock(&ctx->lock);
	/* This message fails, or, declined at our limit of rings (STATUS_LIMIT), moves another
	 * way: the daemon learns which from RingDone. The pipe goes on. */
	if (!*why)
		snprintf(why, sizeof(why), "the library could not take the pipe ring: %s",
			 strerror(-err));
	tpc_context_log(ctx, LOG_INFO, "pipe %llu: pipe ring transfer %llu refused: %s",
			(unsigned long long)x->pipe_id, (unsigned long long)x->id, why);
	d.pipe_id = x->pipe_id;
	d.id = x->id;
	d.reader = x->reader;
	d.status = tpw_status_from_errno(err);
	d.message = why;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_DONE;
	m.ring_done = &d;
	pthread_mutex_lock(&ctx->send_lock);
	tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	pthread_mutex_unlock(&ctx->send_lock);
}

void tpc_pring_op_done_locked(struct tp_context *ctx, struct tpc_op *op)
{
	/* Not NULL: its side of the copy has not ended, so the daemon did not complete it on
	 * its RingDone but gave the ring up; the ring lives while its job does, and its thread
	 * ends the job under the lock we hold. */
	struct tpc_pring *r = __atomic_load_n(&op->pring, __ATOMIC_ACQUIRE);

	(void)ctx;
	if (r && !r->stop)
		ring_stop_locked(r, true);
}

void tpc_pring_pipe_gone_locked(struct tp_context *ctx, uint64_t pipe_id)
{
	struct tpc_pring *r;

	tpu_list_for_each(r, &ctx->prings, link)
		if (r->pipe_id == pipe_id)
			ring_stop_locked(r, true);
}

void tpc_pring_free_all(struct tp_context *ctx)
{
	struct tpc_pring *r;

	pthread_mutex_lock(&ctx->lock);
	tpu_list_for_each(r, &ctx->prings, link)
		ring_stop_locked(r, true);
	while (ctx->n_prings)
		pthread_cond_wait(&ctx->cond, &ctx->lock);
	for (unsigned i = 0; i < ctx->n_pring_fds; i++)
		close(ctx->pring_fds[i]);
	ctx->n_pring_fds = 0;
	pthread_mutex_unlock(&ctx->lock);
}
