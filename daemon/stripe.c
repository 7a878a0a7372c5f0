/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Data connections of a peer link: a sender and a receiver thread per connection, transfers cut
 * into chunks striped over them, completions back to the loop. See stripe.h. Sends wait in one
 * shared queue. A new send gives one chunk to each idle sender at once; senders that finish a
 * chunk claim the next one from the queue, which serves its sends in turns of one row (one chunk
 * per live connection). So every connection works on a large tensor, a faster connection simply
 * takes more chunks (no chunk waits in the queue of a slow or failed connection), a transfer of a
 * row or less goes out over several connections at once, and a small transfer waits for at most
 * one row of each send queued before it. Receivers read each chunk's header, find the transfer by
 * id and read the payload straight into its destination. Logging is left to the peer link
 * (on_error and the transfers' @why say what happened).
 *
 * Locking: one mutex per stripe guards the send queue, the receive table, the done queue, the
 * connections' failed flags and the private fields and results of every active transfer.
 * Threads hold it only to claim work and account for it, never across a socket call or a CMA
 * copy. While a thread moves a transfer's bytes the transfer is busy and cannot complete.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "hmap.h"
#include "log.h"
#include "stripe.h"

#define CHUNK_DEFAULT (1u << 20)
#define SEND_SIZE_DEFAULT (60u << 10)
#define SEND_CHUNK_MIN (256u << 10) /* smallest piece a tensor is cut into to use every connection */

/* One chunk a sender claimed. */
struct claim {
	struct tpd_stripe_xfer *x;
	struct tpb_mem mem; /* of its segment */
	uint32_t seg;
	uint32_t len;
	uint64_t off;
	int src_err; /* the source could not be read: nothing was sent */
	char src_why[120]; /* why, when the channel said more than the errno */
};

struct conn {
	struct tpd_stripe *st;
	unsigned index;
	int fd;
	pthread_t tx, rx;
	bool failed; /* lock */
	bool idle;   /* lock: its sender waits for work */
	bool handed; /* lock: @handoff is its next chunk */
	struct claim handoff;
	pthread_cond_t wake; /* its sender waits here, for a chunk handed to it or to stop */
};

struct tpd_stripe {
	pthread_mutex_t lock;
	struct conn conns[TPD_STRIPE_CONNS_MAX];
	unsigned n_conns;      /* loop thread */
	unsigned hand_next;    /* loop thread: the connection send_hand_out() tries first */
	unsigned n_live;       /* added and not failed: lock, read atomically */
	bool stopping;	       /* lock */
	struct tpu_list sendq; /* sends with chunks left to claim */
	struct tpu_hmap recvs; /* xfer_id -> registered receive not yet complete */
	struct tpu_list done;  /* complete, not yet delivered */
	int efd;
	struct event *ev;
	bool *alive; /* loop thread: cleared when a done callback frees the stripe */
	uint32_t chunk;
	uint32_t send_size; /* bytes per socket write, header included */
	char name[48];
	tpd_stripe_error_fn on_error;
	void *arg;
	bool failed, err_reported; /* lock */
	int err;
	char why[200];
	uint64_t sent, received; /* atomic */
};

/* ---- completion (lock held) ---------------------------------------------------------------- */

static void wake_loop(struct tpd_stripe *st)
{
	static const uint64_t one = 1;

	if (write(st->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		tpu_log_err("%s: eventfd write failed: %m", st->name);
}

static void set_status(struct tpd_stripe_xfer *x, int status, const char *fmt, ...) _printf_(3, 4);

/* Records the first error of @x. */
static void set_status(struct tpd_stripe_xfer *x, int status, const char *fmt, ...)
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
static void xfer_complete(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	x->queued_done = true;
	x->ns = tpu_now_ns() - x->start_ns;
	if (x->is_recv && x->total)
		tpu_hmap_del(&st->recvs, x->xfer_id);
	if (tpu_list_linked(&x->node))
		tpu_list_remove(&x->node);
	tpu_list_insert_tail(&st->done, &x->node);
	wake_loop(st);
}

/* A send is complete when nothing is left to claim (or it stopped) and no thread reads it. */
static void send_check(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	bool stopped = x->canceled || x->status < 0;

	if (stopped && tpu_list_linked(&x->node))
		tpu_list_remove(&x->node); /* claim no more of its chunks */
	if (x->queued_done || x->busy || (!stopped && x->next_seg < x->n_segs))
		return;
	if (x->canceled)
		set_status(x, -ECANCELED, "send canceled");
	xfer_complete(st, x);
}

/* A receive is complete when what is expected arrived (or it ended) and no thread writes it. */
static void recv_check(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	if (x->queued_done || x->busy)
		return;
	if (x->canceled) {
		set_status(x, -ECANCELED, "receive canceled");
	} else if (!x->broken) {
		if (x->bytes < x->expect)
			return;
		if (x->expect_status < 0)
			set_status(x, x->expect_status, "%s", x->expect_why);
	}
	xfer_complete(st, x);
}

/* Ends every queued send and registered receive with @err. A transfer a thread is busy on is
 * marked (status, broken) and completed by that thread when it lets go. */
static void fail_all(struct tpd_stripe *st, int err, const char *why)
{
	struct tpd_stripe_xfer *x;
	uint64_t key;
	void *val;

	while ((x = tpu_list_first(&st->sendq, struct tpd_stripe_xfer, node))) {
		set_status(x, err, "%s", why);
		send_check(st, x);
	}
	for (size_t i = 0; tpu_hmap_next(&st->recvs, &i, &key, &val);) {
		x = val;
		set_status(x, err, "%s", why);
		x->broken = true;
		if (!x->busy) {
			recv_check(st, x); /* removes it from the table: start over */
			i = 0;
		}
	}
}

/* Takes @c out of service: its sender exits, its receiver wakes up. */
static void conn_stop(struct conn *c)
{
	struct tpd_stripe *st = c->st;

	if (c->failed)
		return;
	c->failed = true;
	__atomic_store_n(&st->n_live, st->n_live - 1, __ATOMIC_RELAXED);
	if (st->n_live == 0 && !st->stopping)
		fail_all(st, -ECONNRESET, "peer link failed: no data connection left");
	pthread_cond_signal(&c->wake);
	shutdown(c->fd, SHUT_RDWR);
}

/* Connection @c failed: remember the first failure (reported once, on the loop), stop it. */
static void conn_fail(struct conn *c, int err, const char *fmt, ...) _printf_(3, 4);

static void conn_fail(struct conn *c, int err, const char *fmt, ...)
{
	struct tpd_stripe *st = c->st;
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
		wake_loop(st);
	}
	conn_stop(c);
}

/* ---- wire helpers -------------------------------------------------------------------------- */

/* Writes all of @iov (which it modifies). Return: 0 or -errno. */
static int send_all(int fd, struct iovec *iov, size_t n)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n };

	while (mh.msg_iovlen) {
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		while (mh.msg_iovlen && (size_t)w >= mh.msg_iov->iov_len) {
			w -= (ssize_t)mh.msg_iov->iov_len;
			mh.msg_iov++;
			mh.msg_iovlen--;
		}
		if (mh.msg_iovlen) {
			mh.msg_iov->iov_base = (char *)mh.msg_iov->iov_base + w;
			mh.msg_iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* Return: 0, -ECONNRESET at end of stream, or -errno. */
static int recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t r = recv(fd, p, len, MSG_WAITALL);
		if (r == 0)
			return -ECONNRESET;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	put_u32(p, (uint32_t)v);
	put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
	return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* The thread's bounce buffer of @len bytes, allocated on first use. Return: it or NULL. */
static void *bounce_get(struct tpb_scratch *sc, size_t len)
{
	if (!sc->bounce && (sc->bounce = malloc(len)))
		sc->bounce_len = len;
	return sc->bounce;
}

/* Ends a thread's scratch: its CUDA state and its bounce buffer. */
static void scratch_end(struct tpb_scratch *sc)
{
	tpb_scratch_done(sc);
	free(sc->bounce);
}

/* ---- sender -------------------------------------------------------------------------------- */

/* Moves the cursor of @x past finished and empty segments. */
static void send_settle(struct tpd_stripe_xfer *x)
{
	while (x->next_seg < x->n_segs && x->next_off >= x->segs[x->next_seg].len) {
		x->next_seg++;
		x->next_off = 0;
	}
}

/* Lock held, send queue not empty: claims the next chunk of the send at the head of the queue.
 * After a row (one chunk per live connection) that send goes to the tail, so that concurrent
 * sends share the connections row by row: a small message does not wait behind a large tensor,
 * and messages of a row or less still go out one after the other, not interleaved. */
static void send_claim(struct tpd_stripe *st, struct claim *k)
{
	struct tpd_stripe_xfer *x = tpu_list_first(&st->sendq, struct tpd_stripe_xfer, node);
	const struct tpd_stripe_seg *s = &x->segs[x->next_seg];

	*k = (struct claim){ .x = x, .mem = s->mem, .seg = (uint32_t)x->next_seg,
			     .off = x->next_off };
	k->len = (uint32_t)TPU_MIN((uint64_t)x->chunk, s->len - x->next_off);
	x->next_off += k->len;
	send_settle(x);
	x->busy++;
	if (x->next_seg >= x->n_segs) {
		tpu_list_remove(&x->node); /* all claimed */
	} else if (++x->turn >= st->n_live) {
		x->turn = 0;
		tpu_list_remove(&x->node);
		tpu_list_insert_tail(&st->sendq, &x->node);
	}
}

/*
 * Marks the calling stripe thread as bulk work (SCHED_BATCH): it keeps its share of the CPU but
 * does not preempt others when it wakes, so on busy CPUs the event loops and the clients, which
 * run the control round trip of every message, get the CPU first. Needs no privilege; a kernel
 * that refuses leaves the thread as it was.
 */
static void thread_bulk(void)
{
	struct sched_param sp = { .sched_priority = 0 };

	(void)sched_setscheduler(0, SCHED_BATCH, &sp);
}

/*
 * Sends chunk @k: its header, then its bytes in socket writes of at most @st->send_size bytes.
 * Memory not mapped here is first staged whole into the thread's bounce buffer, so a chunk is
 * either sent whole or (its source unreadable) not at all. The writes are kept small because
 * on Linux TCP a write of 64 KiB or more moves bytes at about half the rate of writes just
 * below that size, over loopback and veth alike: the sender blocks and is woken far more often
 * (bench/run_xhost.sh and docs/benchmarks.md have the figures). Return: 0 (also when its source
 * could not be read: @k->src_err), or -errno of the socket.
 */
static int send_chunk(struct conn *c, struct claim *k, struct tpb_scratch *sc)
{
	uint8_t hdr[TPD_STRIPE_HDR];
	struct iovec iov[2];
	char *p = (char *)(uintptr_t)(k->mem.addr + k->off);
	uint32_t n;
	int r;

	if (k->mem.loc != TPB_LOC_LOCAL) {
		if (!(p = bounce_get(sc, c->st->chunk))) {
			k->src_err = -ENOMEM;
			return 0;
		}
		k->src_why[0] = '\0';
		k->src_err = tpb_stage(&k->mem, k->off, p, k->len, false, sc, k->src_why,
				       sizeof(k->src_why));
		if (k->src_err < 0)
			return 0;
	}
	put_u32(hdr, TPD_STRIPE_MAGIC);
	put_u32(hdr + 4, k->seg);
	put_u64(hdr + 8, k->x->xfer_id);
	put_u64(hdr + 16, k->off);
	put_u32(hdr + 24, k->len);
	put_u32(hdr + 28, 0);
	iov[0] = (struct iovec){ hdr, sizeof(hdr) };
	for (uint32_t done = 0; done < k->len; done += n) {
		n = TPU_MIN(k->len - done, c->st->send_size - (done ? 0 : (uint32_t)sizeof(hdr)));
		iov[1] = (struct iovec){ p + done, n };
		r = done ? send_all(c->fd, iov + 1, 1) : send_all(c->fd, iov, 2);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Lock held: chunk @k was sent (@r == 0) or not. */
static void send_account(struct conn *c, struct claim *k, int r)
{
	struct tpd_stripe_xfer *x = k->x;

	x->busy--;
	if (r < 0)
		set_status(x, -ECONNRESET, "peer link failed: connection %u: send: %s", c->index,
			   strerror(-r));
	else if (k->src_err < 0)
		set_status(x, k->src_err, "cannot read the source: %s",
			   k->src_why[0] ? k->src_why : strerror(-k->src_err));
	else
		x->bytes += k->len;
	if (r == 0 && k->src_err == 0)
		__atomic_fetch_add(&c->st->sent, k->len, __ATOMIC_RELAXED);
	send_check(c->st, x);
	if (r < 0)
		conn_fail(c, r, "send failed: %s", strerror(-r));
}

static void *tx_main(void *arg)
{
	struct conn *c = arg;
	struct tpd_stripe *st = c->st;
	struct tpb_scratch sc = { 0 }; /* bounce for process and CUDA sources, on first use */
	struct claim k;
	int r;

	thread_bulk();
	pthread_mutex_lock(&st->lock);
	for (;;) {
		c->idle = true;
		while (!st->stopping && !c->failed && !c->handed && tpu_list_empty(&st->sendq))
			pthread_cond_wait(&c->wake, &st->lock);
		c->idle = false;
		if (c->handed) { /* sent even when stopping: the send fails, the claim is settled */
			k = c->handoff;
			c->handed = false;
		} else if (st->stopping || c->failed) {
			break;
		} else {
			send_claim(st, &k);
		}
		pthread_mutex_unlock(&st->lock);
		r = send_chunk(c, &k, &sc);
		pthread_mutex_lock(&st->lock);
		send_account(c, &k, r);
	}
	pthread_mutex_unlock(&st->lock);
	scratch_end(&sc);
	return NULL;
}

/* ---- receiver ------------------------------------------------------------------------------ */

struct chunk_hdr {
	uint32_t magic, seg, len, flags;
	uint64_t id, off;
};

/* Receives @len bytes into @m + @off, or drops them when @m is NULL. A failed CMA write is
 * stored in @ret_werr and the rest drained. Return: 0 or -errno of the socket. */
static int recv_payload(int fd, const struct tpb_mem *m, uint64_t off, uint32_t len,
			struct tpb_scratch *sc, uint32_t blen, int *ret_werr, char *why,
			size_t why_len)
{
	void *b;
	int r;

	if (m && m->loc == TPB_LOC_LOCAL)
		return recv_all(fd, (void *)(uintptr_t)(m->addr + off), len);
	if (!(b = bounce_get(sc, blen)))
		return -ENOMEM;
	for (uint32_t done = 0, n; done < len; done += n) {
		n = TPU_MIN(len - done, blen);
		r = recv_all(fd, b, n);
		if (r < 0)
			return r;
		if (m && *ret_werr == 0)
			*ret_werr = tpb_stage(m, off + done, b, n, true, sc, why, why_len);
	}
	return 0;
}

/* Lock held: checks the header; registers the chunk's receive as busy in @ret (NULL: drop).
 * Return: 0, or -EPROTO after failing the connection. */
static int rx_lookup(struct conn *c, const struct chunk_hdr *h, struct tpd_stripe_xfer **ret)
{
	struct tpd_stripe_xfer *x;

	*ret = NULL;
	if (h->magic != TPD_STRIPE_MAGIC)
		conn_fail(c, -EPROTO, "bad chunk magic 0x%08x", h->magic);
	else if (h->flags != 0)
		conn_fail(c, -EPROTO, "unknown chunk flags 0x%x", h->flags);
	else if (h->len == 0 || h->len > TPD_STRIPE_CHUNK_MAX)
		conn_fail(c, -EPROTO, "chunk of %u bytes (limit %u)", h->len, TPD_STRIPE_CHUNK_MAX);
	else if ((x = tpu_hmap_get(&c->st->recvs, h->id)) && !x->canceled && !x->broken &&
		 (h->seg >= x->n_segs || !tpu_range_ok(h->off, h->len, x->segs[h->seg].len)))
		conn_fail(c, -EPROTO,
			  "chunk of %u bytes at offset %llu of segment %u is outside transfer %llu",
			  h->len, (unsigned long long)h->off, h->seg, (unsigned long long)h->id);
	else {
		if (x && !x->canceled && !x->broken) {
			x->busy++;
			*ret = x;
		}
		return 0;
	}
	return -EPROTO;
}

/* Lock held: the payload of @h for @x (may be NULL) arrived (@r == 0) or not. */
static void rx_account(struct conn *c, struct tpd_stripe_xfer *x, const struct chunk_hdr *h,
		       int r, int werr, const char *why)
{
	if (r == 0)
		__atomic_fetch_add(&c->st->received, h->len, __ATOMIC_RELAXED);
	if (x) {
		x->busy--;
		if (r < 0) {
			set_status(x, -ECONNRESET, "peer link failed: connection %u: %s", c->index,
				   strerror(-r));
			x->broken = true;
		} else {
			x->bytes += h->len;
			if (werr < 0)
				set_status(x, werr, "cannot write the destination: %s",
					   why && *why ? why : strerror(-werr));
		}
		recv_check(c->st, x);
	}
	if (r < 0)
		conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" : "receive failed: %s",
			  strerror(-r));
}

/* Receives one chunk whose header is @raw. Return: 0, or -errno once the connection failed. */
static int rx_chunk(struct conn *c, const uint8_t *raw, struct tpb_scratch *sc)
{
	struct tpd_stripe *st = c->st;
	struct chunk_hdr h = { get_u32(raw), get_u32(raw + 4), get_u32(raw + 24),
			       get_u32(raw + 28), get_u64(raw + 8), get_u64(raw + 16) };
	struct tpd_stripe_xfer *x;
	struct tpb_mem m;
	bool write;
	int r, werr = 0;
	char why[120] = "";

	pthread_mutex_lock(&st->lock);
	r = rx_lookup(c, &h, &x);
	write = x && x->status == 0; /* else its bytes are drained */
	if (write)
		m = x->segs[h.seg].mem;
	pthread_mutex_unlock(&st->lock);
	if (r < 0)
		return r;
	r = recv_payload(c->fd, write ? &m : NULL, h.off, h.len, sc, st->chunk, &werr, why,
			 sizeof(why));
	pthread_mutex_lock(&st->lock);
	rx_account(c, x, &h, r, werr, why);
	pthread_mutex_unlock(&st->lock);
	return r;
}

static void *rx_main(void *arg)
{
	struct conn *c = arg;
	struct tpd_stripe *st = c->st;
	struct tpb_scratch sc = { 0 }; /* bounce for process, CUDA and dropped chunks */
	uint8_t hdr[TPD_STRIPE_HDR];
	int r;

	thread_bulk();
	for (;;) {
		r = recv_all(c->fd, hdr, sizeof(hdr));
		if (r < 0) {
			pthread_mutex_lock(&st->lock);
			conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" :
				  "receive failed: %s", strerror(-r));
			pthread_mutex_unlock(&st->lock);
			break;
		}
		if (rx_chunk(c, hdr, &sc) < 0)
			break;
	}
	scratch_end(&sc);
	return NULL;
}

/* ---- loop side ----------------------------------------------------------------------------- */

/* Runs the done callbacks of completed transfers, then reports a failure once. Any callback
 * may free the stripe. */
static void deliver(struct tpd_stripe *st)
{
	struct tpd_stripe_xfer *x;
	bool alive = true, report = false;

	st->alive = &alive;
	for (;;) {
		pthread_mutex_lock(&st->lock);
		x = tpu_list_first(&st->done, struct tpd_stripe_xfer, node);
		if (x)
			tpu_list_remove(&x->node);
		else if (st->failed && !st->err_reported)
			report = st->err_reported = true;
		pthread_mutex_unlock(&st->lock);
		if (!x)
			break;
		x->done(x);
		if (!alive)
			return;
	}
	st->alive = NULL;
	if (report && st->on_error)
		st->on_error(st, st->err, st->why, st->arg);
}

static void stripe_on_event(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_stripe *st = arg;
	uint64_t v;

	if (read(st->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		tpu_log_err("%s: eventfd read failed: %m", st->name);
	deliver(st);
}

int tpd_stripe_new(struct event_base *base, const struct tpd_stripe_config *cfg,
		   struct tpd_stripe **ret)
{
	struct tpd_stripe *st;

	if (cfg->chunk > TPD_STRIPE_CHUNK_MAX ||
	    (cfg->send_size && cfg->send_size < TPD_STRIPE_SEND_SIZE_MIN))
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->chunk = cfg->chunk ? cfg->chunk : CHUNK_DEFAULT;
	st->send_size = cfg->send_size ? cfg->send_size : SEND_SIZE_DEFAULT;
	snprintf(st->name, sizeof(st->name), "%s", cfg->name ? cfg->name : "stripe");
	st->on_error = cfg->on_error;
	st->arg = cfg->arg;
	tpu_list_init(&st->sendq);
	tpu_list_init(&st->done);
	tpu_hmap_init(&st->recvs);
	pthread_mutex_init(&st->lock, NULL);
	st->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (st->efd >= 0)
		st->ev = event_new(base, st->efd, EV_READ | EV_PERSIST, stripe_on_event, st);
	if (!st->ev || event_add(st->ev, NULL) < 0) {
		int r = st->efd < 0 ? -errno : -ENOMEM;
		tpd_stripe_free(st);
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

static int conn_setup_fd(int fd)
{
	int one = 1, fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		return -errno;
	/* Fails on sockets that are not TCP (tests use socket pairs): nothing to tune then. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

/* Starts the two threads of @c, counted live already. Return: 0 or -errno (@c stopped). */
static int conn_start(struct conn *c)
{
	struct tpd_stripe *st = c->st;
	bool tx_started;
	char name[16];
	int r;

	snprintf(name, sizeof(name), "tpd-tx%u", c->index);
	r = start_thread(&c->tx, tx_main, c, name);
	tx_started = r == 0;
	if (r == 0) {
		snprintf(name, sizeof(name), "tpd-rx%u", c->index);
		r = start_thread(&c->rx, rx_main, c, name);
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

int tpd_stripe_add_conn(struct tpd_stripe *st, int fd)
{
	struct conn *c = &st->conns[st->n_conns];
	int r;

	if (st->n_conns >= TPD_STRIPE_CONNS_MAX)
		r = -E2BIG;
	else if (st->stopping)
		r = -ENOTCONN;
	else
		r = conn_setup_fd(fd);
	if (r < 0) {
		tpu_close(fd);
		return r;
	}
	pthread_mutex_lock(&st->lock); /* senders read every slot's flags */
	*c = (struct conn){ .st = st, .index = st->n_conns, .fd = fd };
	pthread_cond_init(&c->wake, NULL);
	__atomic_store_n(&st->n_live, st->n_live + 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&st->lock);
	r = conn_start(c);
	if (r < 0) {
		pthread_cond_destroy(&c->wake);
		tpu_close(fd);
		return r;
	}
	st->n_conns++; /* tpd_stripe_free() joins its threads and closes @fd */
	return 0;
}

unsigned tpd_stripe_conns(const struct tpd_stripe *st)
{
	return __atomic_load_n(&st->n_live, __ATOMIC_RELAXED);
}

/* Lock held: resets the results and private fields of @x. Return: 0 or -EINVAL. */
static int xfer_start(struct tpd_stripe_xfer *x, bool recv)
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
	x->next_seg = 0;
	x->next_off = 0;
	x->turn = 0;
	x->expect_status = x->busy = 0;
	x->canceled = x->queued_done = x->broken = false;
	x->is_recv = recv;
	x->expect_why[0] = '\0';
	tpu_list_init(&x->node);
	return 0;
}

/*
 * Lock held, send queue not empty: gives a chunk to each idle sender, in turn from the one after
 * the last that got one, and wakes just those. Senders that are busy claim the rest when they are
 * done, so no sender sleeps while chunks wait. Left to claim for themselves after one wake-up for
 * all, the first sender to run would often take several chunks of a row (its socket buffer takes
 * them at once) before the others are scheduled, and a transfer would wait for one connection.
 */
static void send_hand_out(struct tpd_stripe *st)
{
	for (unsigned i = 0; i < st->n_conns && !tpu_list_empty(&st->sendq); i++) {
		struct conn *c = &st->conns[(st->hand_next + i) % st->n_conns];

		if (c->idle && !c->failed && !c->handed) {
			send_claim(st, &c->handoff);
			c->handed = true;
			st->hand_next = c->index + 1;
			pthread_cond_signal(&c->wake);
		}
	}
}

/*
 * Chunk size for @x: a tensor smaller than a row of full chunks is cut into one piece per live
 * connection (at least SEND_CHUNK_MIN, a multiple of 64 KiB), so that it too moves over every
 * connection at once; larger ones use the configured chunk. Lock held.
 */
static uint32_t send_chunk_size(const struct tpd_stripe *st, const struct tpd_stripe_xfer *x)
{
	uint64_t total = 0, per;

	for (size_t i = 0; i < x->n_segs; i++)
		total += x->segs[i].len;
	per = (total + st->n_live - 1) / st->n_live;
	per = (per + (64u << 10) - 1) & ~(uint64_t)((64u << 10) - 1);
	return (uint32_t)TPU_MAX(TPU_MIN(per, (uint64_t)st->chunk),
				 TPU_MIN((uint64_t)SEND_CHUNK_MIN, (uint64_t)st->chunk));
}

int tpd_stripe_send(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	int r = -ENOTCONN;

	pthread_mutex_lock(&st->lock);
	if (!st->stopping && st->n_live)
		r = xfer_start(x, false);
	if (r == 0) {
		x->chunk = send_chunk_size(st, x);
		send_settle(x);
		if (x->next_seg == x->n_segs) {
			xfer_complete(st, x); /* nothing to send */
		} else {
			tpu_list_insert_tail(&st->sendq, &x->node);
			send_hand_out(st);
		}
	}
	pthread_mutex_unlock(&st->lock);
	return r;
}

void tpd_stripe_send_cancel(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !x->canceled) {
		x->canceled = true;
		send_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

int tpd_stripe_recv(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
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

void tpd_stripe_recv_expect(struct tpd_stripe *st, struct tpd_stripe_xfer *x, uint64_t bytes,
			    int status, const char *why)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && (status < 0 || bytes < x->total)) {
		x->expect = TPU_MIN(bytes, x->total);
		x->expect_status = status < 0 ? status : -EIO;
		snprintf(x->expect_why, sizeof(x->expect_why), "%s",
			 why && *why ? why : "the sender stopped early");
		recv_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

void tpd_stripe_recv_cancel(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !x->canceled) {
		x->canceled = true;
		recv_check(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

uint64_t tpd_stripe_bytes_sent(const struct tpd_stripe *st)
{
	return __atomic_load_n(&st->sent, __ATOMIC_RELAXED);
}

uint64_t tpd_stripe_bytes_received(const struct tpd_stripe *st)
{
	return __atomic_load_n(&st->received, __ATOMIC_RELAXED);
}

void tpd_stripe_free(struct tpd_stripe *st)
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
		tpu_close(st->conns[i].fd);
		pthread_cond_destroy(&st->conns[i].wake);
	}
	/* No thread is left, none is busy: end what is still queued or registered. */
	pthread_mutex_lock(&st->lock);
	fail_all(st, -ECONNRESET, "peer link closed");
	st->err_reported = true; /* the owner is freeing us: no error callback */
	pthread_mutex_unlock(&st->lock);
	if (st->ev)
		deliver(st); /* callbacks see st->stopping: new sends and receives get -ENOTCONN */
	if (st->ev)
		event_free(st->ev);
	tpu_close(st->efd);
	tpu_hmap_done(&st->recvs);
	pthread_mutex_destroy(&st->lock);
	free(st);
}
