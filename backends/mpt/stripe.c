/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Data connections of a peer link: a sender and a receiver thread per connection, transfers cut
 * into chunks striped over them, completions back to the loop. See stripe.h. Sends are jobs of
 * the shared thread engine (base/work.h), which cuts them into chunks, keeps their cursor, first
 * error and chunks in flight, and queues their completion on the stripe's queue; the senders
 * are its workers, one per connection. A new send gives one chunk to each idle sender at once;
 * senders that finish a chunk claim the next one from the engine, which serves its sends in
 * turns of one row (one chunk per live connection). So every connection works on a large
 * tensor, a faster connection simply takes more chunks (no chunk waits in the queue of a slow
 * or failed connection), a transfer of a row or less goes out over several connections at once,
 * and a small transfer waits for at most one row of each send queued before it. Receivers read
 * each chunk's header, find the transfer by id and read the payload straight into its
 * destination. This file holds the hand-out to idle senders, the receives' completion, failure
 * and set-up; the connection threads are stripe_io.c's, and what both share is in
 * stripe_int.h. Logging is left to the peer link (on_error and the transfers' @why say what
 * happened).
 *
 * Locking: one mutex per stripe guards the receive table, the done queue, the connections' flags
 * and the private fields and results of every active receive; every call into the engine is
 * made with it held (the engine's own lock nests inside), so a send's completion is queued
 * under it too.
 * Threads hold it only to claim work and account for it, never across a socket call or a CMA
 * copy. While a thread moves a transfer's bytes the transfer is busy and cannot complete.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/ssl.h>
#include "log.h"
#include "stripe_int.h"

#define SEND_SIZE_DEFAULT (60u << 10)

/* ---- completion (lock held) ---------------------------------------------------------------- */

/* Records the first error of @x. */
void tpb_stripe_set_status(struct tpb_stripe_xfer *x, int status, const char *fmt, ...)
{
	va_list ap;

	if (x->status < 0 || status >= 0)
		return;
	x->status = status;
	va_start(ap, fmt);
	vsnprintf(x->why, sizeof(x->why), fmt, ap);
	va_end(ap);
}

/* Moves @x to the done queue; its callback runs on the loop. */
static void xfer_complete(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	/* No chunk overlaps another (rx_take()): @bytes distinct bytes came, and where they are the
	 * first @bytes of the transfer the owner may use them as the sender's whole prefix. */
	x->exact = tpu_ranges_is_prefix(&x->got, x->bytes);
	tpu_ranges_done(&x->got);
	x->queued_done = true;
	x->ns = tpu_now_ns() - x->start_ns;
	if (x->is_recv && x->total)
		tpu_hmap_del(&st->recvs, x->xfer_id);
	tpb_cq_push(&st->cq, &x->work.node);
}

/* A receive is complete when what is expected arrived (or it ended) and no thread writes it. */
void tpb_stripe_recv_check(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	if (x->queued_done || x->busy)
		return;
	if (x->canceled) {
		tpb_stripe_set_status(x, -ECANCELED, "receive canceled");
	} else if (!x->broken) {
		if (x->bytes < x->expect)
			return;
		if (x->expect_status < 0)
			tpb_stripe_set_status(x, x->expect_status, "%s", x->expect_why);
	}
	xfer_complete(st, x);
}

/* Ends every queued send and registered receive with @err. A transfer a thread is busy on is
 * marked (status, broken) and completed by that thread when it lets go. */
static void fail_all(struct tpb_stripe *st, int err, const char *why)
{
	struct tpb_stripe_xfer *x;
	uint64_t key;
	void *val;

	if (st->work) /* sends with chunks in flight end when they return */
		tpb_work_fail_all(st->work, err, why);
	for (size_t i = 0; tpu_hmap_next(&st->recvs, &i, &key, &val);) {
		x = val;
		tpb_stripe_set_status(x, err, "%s", why);
		x->broken = true;
		if (!x->busy) {
			tpb_stripe_recv_check(st, x); /* removes it from the table: start over */
			i = 0;
		}
	}
}

/* Takes @c out of service: its sender exits, its receiver wakes up. */
static void conn_stop(struct conn *c)
{
	struct tpb_stripe *st = c->st;

	if (c->failed)
		return;
	c->failed = true;
	__atomic_store_n(&st->n_live, st->n_live - 1, __ATOMIC_RELAXED);
	tpb_work_set_workers(st->work, st->n_live); /* a row is one chunk per live connection */
	if (st->n_live == 0 && !st->stopping)
		fail_all(st, -ECONNRESET, "peer link failed: no data connection left");
	pthread_cond_signal(&c->wake);
	shutdown(c->fd, SHUT_RDWR);
}

/* Connection @c failed: remember the first failure (reported once, on the loop), stop it. */
void tpb_stripe_conn_fail(struct conn *c, int err, const char *fmt, ...)
{
	struct tpb_stripe *st = c->st;
	va_list ap;
	int n;

	if (c->failed)
		return;
	if (!st->stopping && !st->failed) {
		st->failed = true;
		st->err = err;
		n = snprintf(st->why, sizeof(st->why), "connection %u: ", c->index);
		va_start(ap, fmt);
		vsnprintf(st->why + n, sizeof(st->why) - (size_t)n, fmt, ap);
		va_end(ap);
		tpb_cq_wake(&st->cq); /* reported by tpb_stripe_progress() */
	}
	conn_stop(c);
}

/* ---- send queue ---------------------------------------------------------------------------- */

/* Lock held: claims the next chunk of the queued sends. The engine serves its jobs in turns of
 * one row (one chunk per live connection): after a row a send goes to the tail, so that
 * concurrent sends share the connections row by row: a small message does not wait behind a
 * large tensor, and messages of a row or less still go out one after the other, not
 * interleaved. Return: 0 or -EAGAIN. */
int tpb_stripe_claim(struct tpb_stripe *st, struct claim *k)
{
	struct tpb_work_chunk w;
	struct tpb_stripe_xfer *x;

	if (tpb_work_try_claim(st->work, &w) < 0)
		return -EAGAIN;
	x = tpu_container_of(w.job, struct tpb_stripe_xfer, work);
	*k = (struct claim){ .w = w, .x = x, .mem = x->segs[w.seg].mem, .seg = (uint32_t)w.seg,
			     .off = w.off, .len = (uint32_t)w.len };
	return 0;
}

/* Lock held: chunk @k of a send ended (the engine completes the send into st->cq). */
void tpb_stripe_send_account(struct tpb_stripe *st, const struct claim *k, int status,
			     const char *why)
{
	tpb_work_finish(st->work, &k->w, status, why);
}

/* ---- loop side ----------------------------------------------------------------------------- */

/* A send's results are its engine job's. */
static void send_results(struct tpb_stripe_xfer *x)
{
	x->status = x->work.status;
	snprintf(x->why, sizeof(x->why), "%s", x->work.status < 0 ? x->work.why : "");
	x->bytes = x->work.bytes;
	x->ns = tpu_now_ns() - x->start_ns;
}

/* Runs the done callbacks of completed transfers, then reports a failure once. Any callback
 * may free the stripe. Completions are queued under the lock (xfer_complete()), so finding the
 * queue empty under it means every transfer a failure ended has been delivered before the
 * failure is reported. Return: how many callbacks ran. */
static int deliver(struct tpb_stripe *st)
{
	struct tpb_stripe_xfer *x;
	struct tpu_list *n;
	bool alive = true, report = false;
	int ran = 0;

	st->alive = &alive;
	for (;;) {
		pthread_mutex_lock(&st->lock);
		n = tpb_cq_pop(&st->cq);
		if (!n && st->failed && !st->err_reported)
			report = st->err_reported = true;
		pthread_mutex_unlock(&st->lock);
		if (!n)
			break;
		x = tpu_container_of(n, struct tpb_stripe_xfer, work.node);
		if (!x->is_recv)
			send_results(x);
		x->done(x);
		ran++;
		if (!alive)
			return ran;
	}
	st->alive = NULL;
	if (report && st->on_error)
		st->on_error(st, st->err, st->why, st->arg);
	return ran;
}

int tpb_stripe_event_fd(const struct tpb_stripe *st)
{
	return tpb_cq_event_fd(&st->cq);
}

int tpb_stripe_progress(struct tpb_stripe *st)
{
	tpb_cq_ack(&st->cq);
	return deliver(st);
}

int tpb_stripe_new(const struct tpb_stripe_config *cfg, struct tpb_stripe **ret)
{
	struct tpb_stripe *st;
	int r;

	if (cfg->chunk > TPB_STRIPE_CHUNK_MAX ||
	    (cfg->send_size && cfg->send_size < TPB_STRIPE_SEND_SIZE_MIN))
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->chunk = cfg->chunk ? cfg->chunk : TPB_WORK_CHUNK;
	st->send_size = cfg->send_size ? cfg->send_size : SEND_SIZE_DEFAULT;
	snprintf(st->name, sizeof(st->name), "%s", cfg->name ? cfg->name : "stripe");
	st->on_error = cfg->on_error;
	st->arg = cfg->arg;
	tpu_hmap_init(&st->recvs);
	pthread_mutex_init(&st->lock, NULL);
	r = tpb_cq_init(&st->cq);
	if (r == 0) {
		struct tpb_work_config wc = { .chunk = st->chunk, .rows = true, .cq = &st->cq };

		r = tpb_work_new(&wc, &st->work);
	}
	if (r < 0) {
		tpb_stripe_free(st);
		return r;
	}
	*ret = st;
	return 0;
}

/* Starts @fn with every signal blocked (signals belong to the loop thread). */
static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg, const char *name)
{
	sigset_t all, old;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r == 0)
		pthread_setname_np(*t, name);
	return r;
}

static int conn_setup_fd(int fd, bool blocking)
{
	int one = 1, fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK) < 0)
		return -errno;
	/* Fails on sockets that are not TCP (tests use socket pairs): nothing to tune then. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

/* Starts the two threads of @c, counted live already. Return: 0 or -errno (@c stopped). */
static int conn_start(struct conn *c)
{
	struct tpb_stripe *st = c->st;
	bool tx_started;
	char name[16];
	int r;

	snprintf(name, sizeof(name), "tpd-tx%u", c->index);
	r = start_thread(&c->tx, tpb_stripe_io_tx_main, c, name);
	tx_started = r == 0;
	if (r == 0) {
		snprintf(name, sizeof(name), "tpd-rx%u", c->index);
		r = start_thread(&c->rx, tpb_stripe_io_rx_main, c, name);
	}
	if (r < 0) {
		pthread_mutex_lock(&st->lock);
		conn_stop(c);
		pthread_mutex_unlock(&st->lock);
		if (tx_started)
			pthread_join(c->tx, NULL);
	}
	return r;
}

/* ---- the record queue of a TLS data connection (see stripe_io.c's send_queued()) ---- */

static int txq_write(BIO *b, const char *data, size_t len, size_t *written)
{
	struct conn *c = BIO_get_data(b);
	struct tpb_stripe_txq *q = &c->txq; /* ssl_lock held: SSL calls are made under it */

	if (q->len + len > q->cap) {
		size_t cap = TPU_MAX(q->cap * 2, q->len + len + (64u << 10));
		uint8_t *nb = realloc(q->buf, cap);
		if (!nb) {
			q->failed = true;
			return 0;
		}
		q->buf = nb;
		q->cap = cap;
	}
	memcpy(q->buf + q->len, data, len);
	q->len += len;
	*written = len;
	return 1;
}

static long txq_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *txq_meth;

static void txq_method_init(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tpd record queue");

	if (m && (!BIO_meth_set_write_ex(m, txq_write) || !BIO_meth_set_ctrl(m, txq_ctrl))) {
		BIO_meth_free(m);
		m = NULL;
	}
	txq_meth = m; /* kept for the life of the process */
}

/* Makes @c's SSL write its records into c->txq. Return: 0 or -ENOMEM. */
static int txq_bio_attach(struct conn *c)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	BIO *b;

	pthread_once(&once, txq_method_init);
	b = txq_meth ? BIO_new(txq_meth) : NULL;
	if (!b)
		return -ENOMEM;
	BIO_set_data(b, c);
	BIO_set_init(b, 1);
	SSL_set0_wbio(c->ssl, b); /* the socket BIO stays the read BIO */
	c->txq_bio = true;
	return 0;
}

int tpb_stripe_add_conn_tls(struct tpb_stripe *st, int fd, SSL *ssl)
{
	struct conn *c = &st->conns[st->n_conns];
	int r;

	if (st->n_conns >= TPB_STRIPE_CONNS_MAX)
		r = -E2BIG;
	else if (st->stopping)
		r = -ENOTCONN;
	else
		r = conn_setup_fd(fd, !ssl);
	if (r < 0) {
		SSL_free(ssl);
		tpu_close(fd);
		return r;
	}
	pthread_mutex_lock(&st->lock); /* senders read every slot's flags */
	*c = (struct conn){ .st = st, .index = st->n_conns, .fd = fd, .ssl = ssl };
	pthread_mutex_unlock(&st->lock);
	if (ssl) {
		/* Every byte from here on is TLS: read records in bulk, not a header and a body per
		 * system call, and (unless the kernel encrypts) queue written records to send them
		 * together. */
		SSL_set_read_ahead(ssl, 1);
		SSL_set_default_read_buffer_len(ssl, 256u << 10);
		if (BIO_get_ktls_send(SSL_get_wbio(ssl)) <= 0 && txq_bio_attach(c) < 0) {
			r = -ENOMEM;
			pthread_mutex_lock(&st->lock);
			c->ssl = NULL;
			pthread_mutex_unlock(&st->lock);
			SSL_free(ssl);
			tpu_close(fd);
			return r;
		}
	}
	pthread_mutex_lock(&st->lock);
	pthread_cond_init(&c->wake, NULL);
	pthread_mutex_init(&c->ssl_lock, NULL);
	__atomic_store_n(&st->n_live, st->n_live + 1, __ATOMIC_RELAXED);
	tpb_work_set_workers(st->work, st->n_live);
	pthread_mutex_unlock(&st->lock);
	r = conn_start(c);
	if (r < 0) {
		pthread_cond_destroy(&c->wake);
		pthread_mutex_destroy(&c->ssl_lock);
		SSL_free(ssl);
		c->ssl = NULL;
		free(c->txq.buf);
		free(c->txq_spare.buf);
		tpu_close(fd);
		return r;
	}
	st->n_conns++; /* tpb_stripe_free() joins its threads, frees @ssl and closes @fd */
	return 0;
}

int tpb_stripe_add_conn(struct tpb_stripe *st, int fd)
{
	return tpb_stripe_add_conn_tls(st, fd, NULL);
}

unsigned tpb_stripe_conns(const struct tpb_stripe *st)
{
	return __atomic_load_n(&st->n_live, __ATOMIC_RELAXED);
}

/* Lock held: resets the results and private fields of @x. Return: 0 or -EINVAL. */
static int xfer_start(struct tpb_stripe_xfer *x, bool recv)
{
	uint64_t total = 0;

	if (x->n_segs > UINT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < x->n_segs; i++)
		if (!tpu_add_u64(total, x->segs[i].len, &total))
			return -EINVAL;
	x->status = 0;
	x->why[0] = '\0';
	x->bytes = x->ns = 0;
	x->total = x->expect = total;
	x->start_ns = tpu_now_ns();
	x->expect_status = x->busy = 0;
	x->canceled = x->queued_done = x->broken = false;
	x->is_recv = recv;
	x->expect_why[0] = '\0';
	x->got = (struct tpu_ranges){ 0 };
	x->exact = false;
	x->progress = 0;
	tpu_list_init(&x->work.node);
	return 0;
}

/*
 * Lock held, send queue not empty: gives a chunk to each idle sender, in turn from the one after
 * the last that got one, and wakes just those. Senders that are busy claim the rest when they are
 * done, so no sender sleeps while chunks wait. Left to claim for themselves after one wake-up for
 * all, the first sender to run would often take several chunks of a row (its socket buffer takes
 * them at once) before the others are scheduled, and a transfer would wait for one connection.
 */
static void send_hand_out(struct tpb_stripe *st)
{
	for (unsigned i = 0; i < st->n_conns; i++) {
		struct conn *c = &st->conns[(st->hand_next + i) % st->n_conns];

		if (c->idle && !c->failed && !c->handed) {
			if (tpb_stripe_claim(st, &c->handoff) < 0)
				return; /* nothing left to hand out */
			c->handed = true;
			st->hand_next = c->index + 1;
			pthread_cond_signal(&c->wake);
		}
	}
}

/* The length of segment @seg of the send whose job is @w (engine lock, under the stripe's). */
static uint64_t send_seg_len(const struct tpb_work_job *w, size_t seg)
{
	return tpu_container_of(w, struct tpb_stripe_xfer, work)->segs[seg].len;
}

int tpb_stripe_send(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	int r = -ENOTCONN;

	pthread_mutex_lock(&st->lock);
	if (!st->stopping && st->n_live)
		r = xfer_start(x, false);
	if (r == 0) {
		/* Cut by the engine's rule: a tensor smaller than a row of full chunks goes out in one
		 * piece per live connection, so that it too moves over every connection at once. */
		x->work.n_segs = x->n_segs;
		x->work.seg_len = send_seg_len;
		x->work.done = NULL; /* delivered by deliver(), from st->cq */
		x->work.chunk_min = 0;
		tpb_work_submit(st->work, &x->work); /* nothing to send: queued done at once */
		send_hand_out(st);
	}
	pthread_mutex_unlock(&st->lock);
	return r;
}

void tpb_stripe_send_cancel(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	tpb_work_cancel(st->work, &x->work, "send canceled");
	pthread_mutex_unlock(&st->lock);
}

int tpb_stripe_recv(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	int r = -ENOTCONN;

	pthread_mutex_lock(&st->lock);
	if (st->stopping || !st->n_live)
		goto out;
	r = x->xfer_id ? 0 : -EINVAL;
	if (r == 0 && tpu_hmap_get(&st->recvs, x->xfer_id))
		r = -EEXIST;
	if (r == 0)
		r = xfer_start(x, true);
	if (r == 0 && x->total)
		r = tpu_hmap_put(&st->recvs, x->xfer_id, x);
	if (r == 0 && !x->total)
		xfer_complete(st, x); /* nothing to receive */
out:
	pthread_mutex_unlock(&st->lock);
	return r;
}

void tpb_stripe_recv_expect(struct tpb_stripe *st, struct tpb_stripe_xfer *x, uint64_t bytes,
			    int status, const char *why)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && (status < 0 || bytes < x->total)) {
		x->expect = TPU_MIN(bytes, x->total);
		x->expect_status = status < 0 ? status : -EIO;
		snprintf(x->expect_why, sizeof(x->expect_why), "%s",
			 why && *why ? why : "the sender stopped early");
		tpb_stripe_recv_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

bool tpb_stripe_local_busy(const struct tpb_stripe *st)
{
	return __atomic_load_n(&st->local, __ATOMIC_RELAXED) != 0;
}

uint64_t tpb_stripe_recv_progress(const struct tpb_stripe_xfer *x)
{
	return __atomic_load_n(&x->progress, __ATOMIC_RELAXED);
}

void tpb_stripe_recv_stalled(struct tpb_stripe *st, struct tpb_stripe_xfer *x, const char *why)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !x->canceled) {
		tpb_stripe_set_status(x, -ETIMEDOUT, "%s", why && *why ? why : "the sender stalled");
		x->canceled = true;
		/* A receiver in the middle of a copy into a process's memory is not stalled by the
		 * peer: it lets go once that copy ends, and the transfer with it. */
		for (unsigned i = 0; i < st->n_conns; i++)
			if (st->conns[i].rx_x == x &&
			    !__atomic_load_n(&st->conns[i].rx_local, __ATOMIC_RELAXED))
				tpb_stripe_conn_fail(&st->conns[i], -ETIMEDOUT, "stalled in a chunk of "
						     "transfer %llu",
						     (unsigned long long)x->xfer_id);
		tpb_stripe_recv_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

void tpb_stripe_recv_cancel(struct tpb_stripe *st, struct tpb_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !x->canceled) {
		x->canceled = true;
		tpb_stripe_recv_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

uint64_t tpb_stripe_bytes_sent(const struct tpb_stripe *st)
{
	return __atomic_load_n(&st->sent, __ATOMIC_RELAXED);
}

uint64_t tpb_stripe_bytes_received(const struct tpb_stripe *st)
{
	return __atomic_load_n(&st->received, __ATOMIC_RELAXED);
}

void tpb_stripe_free(struct tpb_stripe *st)
{
	if (!st)
		return;
	if (st->alive)
		*st->alive = false; /* a done callback is freeing us: deliver() must stop */
	pthread_mutex_lock(&st->lock);
	st->stopping = true;
	for (unsigned i = 0; i < st->n_conns; i++)
		pthread_cond_signal(&st->conns[i].wake);
	pthread_mutex_unlock(&st->lock);
	for (unsigned i = 0; i < st->n_conns; i++)
		shutdown(st->conns[i].fd, SHUT_RDWR);
	for (unsigned i = 0; i < st->n_conns; i++) {
		pthread_join(st->conns[i].tx, NULL);
		pthread_join(st->conns[i].rx, NULL);
		SSL_free(st->conns[i].ssl);
		free(st->conns[i].txq.buf);
		free(st->conns[i].txq_spare.buf);
		tpu_close(st->conns[i].fd);
		pthread_cond_destroy(&st->conns[i].wake);
		pthread_mutex_destroy(&st->conns[i].ssl_lock);
	}
	/* No thread is left, none is busy: end what is still queued or registered. */
	pthread_mutex_lock(&st->lock);
	fail_all(st, -ECONNRESET, "peer link closed");
	st->err_reported = true; /* the owner is freeing us: no error callback */
	pthread_mutex_unlock(&st->lock);
	if (st->cq.efd >= 0)
		deliver(st); /* callbacks see st->stopping: new sends and receives get -ENOTCONN */
	tpb_work_free(st->work, "peer link closed"); /* nothing left: every send was delivered */
	tpb_cq_done(&st->cq);
	tpu_hmap_done(&st->recvs);
	pthread_mutex_destroy(&st->lock);
	free(st);
}
