/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The threads of a stripe's data connections (see stripe.c for the queue they serve and
 * stripe.h for the chunk format). A sender claims a chunk, reads it from the writer's memory
 * (straight from a mapping, or by CMA or CUDA into its bounce buffer) and writes header and
 * bytes to its socket; a receiver reads a header, finds the transfer by id and reads the bytes
 * straight into its destination (or through its bounce buffer into a process or CUDA memory).
 * Both block in their socket calls and take the stripe's lock only to claim and account.
 * Completion and failure reporting are stripe.c's.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include "stripe_int.h"

/* ---- wire helpers -------------------------------------------------------------------------- */

/* Writes all of @iov (which it modifies). Return: 0 or -errno. */
static int sock_send_all(int fd, struct iovec *iov, size_t n)
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
static int sock_recv_all(int fd, void *buf, size_t len)
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

/*
 * TLS on a data connection. One SSL object serves the connection's sender and receiver threads,
 * and OpenSSL allows one thread in it at a time: the socket is non-blocking, each SSL_read_ex or
 * SSL_write_ex runs under the connection's ssl_lock, and a thread that must wait for the socket
 * lets go of the lock and waits in poll(). conn_stop()'s shutdown() wakes it.
 */
static int tls_wait(struct conn *c, short events, int timeout_ms)
{
	struct pollfd p = { .fd = c->fd, .events = events };

	if (poll(&p, 1, timeout_ms) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

/* One SSL_read_ex (@write false) or SSL_write_ex of @len bytes at @buf under the lock.
 * Return: bytes moved (> 0), 0 to retry after waiting, or -errno. */
static ssize_t tls_io(struct conn *c, bool write, void *buf, size_t len)
{
	size_t n = 0;
	int r, e, err;

	pthread_mutex_lock(&c->ssl_lock);
	ERR_clear_error();
	errno = 0;
	r = write ? SSL_write_ex(c->ssl, buf, len, &n) : SSL_read_ex(c->ssl, buf, len, &n);
	e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, r);
	err = errno;
	ERR_clear_error();
	pthread_mutex_unlock(&c->ssl_lock);
	switch (e) {
	case SSL_ERROR_NONE:
		return (ssize_t)n;
	case SSL_ERROR_WANT_READ:
		/* A writer never needs to read in TLS 1.3 without renegotiation: if OpenSSL asks,
		 * the receiver will read, so only nap instead of racing it for the bytes. */
		r = tls_wait(c, POLLIN, write ? 10 : -1);
		return r < 0 ? r : 0;
	case SSL_ERROR_WANT_WRITE:
		r = tls_wait(c, POLLOUT, -1);
		return r < 0 ? r : 0;
	case SSL_ERROR_ZERO_RETURN:
		return -ECONNRESET;
	case SSL_ERROR_SYSCALL:
		return err ? -err : -ECONNRESET;
	default:
		return -EPROTO; /* a record that fails authentication, a TLS alert */
	}
}

/*
 * Sends @iov's records through the connection's record queue (stripe.c's tx BIO): under the lock
 * SSL_write_ex encrypts all of it into c->txq, which never blocks; the queue is swapped out and
 * written to the socket without the lock, in as few system calls as the socket allows, instead
 * of one per 16 KiB record. Only this thread writes the socket; bytes the receiver's SSL_read may
 * add meanwhile (an alert) wait in the queue for the next send. Return: 0 or -errno.
 */
static int send_queued(struct conn *c, struct iovec *iov, size_t n)
{
	struct tpb_stripe_txq out;
	int r = 0;

	pthread_mutex_lock(&c->ssl_lock);
	for (size_t i = 0; i < n && r == 0; i++) {
		const char *p = iov[i].iov_base;
		size_t left = iov[i].iov_len, w;
		/* Partial writes are on (a record at a time): loop until all is queued. */
		while (left && r == 0) {
			w = 0;
			ERR_clear_error();
			if (SSL_write_ex(c->ssl, p, left, &w) != 1 || !w)
				r = c->txq.failed ? -ENOMEM : -EPROTO;
			p += w;
			left -= w;
		}
		ERR_clear_error();
	}
	out = c->txq;
	c->txq = c->txq_spare;
	c->txq.len = 0;
	pthread_mutex_unlock(&c->ssl_lock);
	for (size_t done = 0; r == 0 && done < out.len;) {
		ssize_t k = send(c->fd, out.buf + done, out.len - done, MSG_NOSIGNAL);
		if (k > 0)
			done += (size_t)k;
		else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			r = tls_wait(c, POLLOUT, -1);
		else if (k < 0 && errno != EINTR)
			r = -errno;
	}
	out.len = 0;
	c->txq_spare = out; /* only this thread touches the spare */
	return r;
}

static int send_all(struct conn *c, struct iovec *iov, size_t n)
{
	if (!c->ssl)
		return sock_send_all(c->fd, iov, n);
	if (c->txq_bio)
		return send_queued(c, iov, n);
	for (size_t i = 0; i < n; i++) {
		char *p = iov[i].iov_base;
		size_t left = iov[i].iov_len;
		while (left) {
			ssize_t w = tls_io(c, true, p, left);
			if (w < 0)
				return (int)w;
			p += w;
			left -= (size_t)w;
		}
	}
	return 0;
}

static int recv_all(struct conn *c, void *buf, size_t len)
{
	char *p = buf;

	if (!c->ssl)
		return sock_recv_all(c->fd, buf, len);
	while (len) {
		ssize_t r = tls_io(c, false, p, len);
		if (r < 0)
			return (int)r;
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
	tpb_cuda_scratch_done(sc);
	free(sc->bounce);
}

/* ---- sender -------------------------------------------------------------------------------- */

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
	uint8_t hdr[TPB_STRIPE_HDR];
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
		__atomic_fetch_add(&c->st->local, 1, __ATOMIC_RELAXED);
		k->src_err = tpb_cuda_basic_stage(&k->mem, k->off, p, k->len, false, sc, k->src_why,
						  sizeof(k->src_why));
		__atomic_fetch_sub(&c->st->local, 1, __ATOMIC_RELAXED);
		if (k->src_err < 0)
			return 0;
	}
	put_u32(hdr, TPB_STRIPE_MAGIC);
	put_u32(hdr + 4, k->seg);
	put_u64(hdr + 8, k->x->xfer_id);
	put_u64(hdr + 16, k->off);
	put_u32(hdr + 24, k->len);
	put_u32(hdr + 28, 0);
	iov[0] = (struct iovec){ hdr, sizeof(hdr) };
	for (uint32_t done = 0; done < k->len; done += n) {
		n = TPU_MIN(k->len - done, c->st->send_size - (done ? 0 : (uint32_t)sizeof(hdr)));
		iov[1] = (struct iovec){ p + done, n };
		r = done ? send_all(c, iov + 1, 1) : send_all(c, iov, 2);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Lock held: chunk @k was sent (@r == 0) or not. */
static void send_account(struct conn *c, struct claim *k, int r)
{
	char why[160] = "";
	int status = 0;

	if (r < 0) {
		status = -ECONNRESET;
		snprintf(why, sizeof(why), "peer link failed: connection %u: send: %s", c->index,
			 strerror(-r));
	} else if (k->src_err < 0) {
		status = k->src_err;
		snprintf(why, sizeof(why), "cannot read the source: %s",
			 k->src_why[0] ? k->src_why : strerror(-k->src_err));
	} else {
		__atomic_fetch_add(&c->st->sent, k->len, __ATOMIC_RELAXED);
	}
	tpb_stripe_send_account(c->st, k, status, why);
	if (r < 0)
		tpb_stripe_conn_fail(c, r, "send failed: %s", strerror(-r));
}

void *tpb_stripe_io_tx_main(void *arg)
{
	struct conn *c = arg;
	struct tpb_stripe *st = c->st;
	struct tpb_scratch sc = { 0 }; /* bounce for process and CUDA sources, on first use */
	struct claim k;
	int r;

	thread_bulk();
	pthread_mutex_lock(&st->lock);
	for (;;) {
		c->idle = true;
		for (;;) {
			if (c->handed) { /* sent even when stopping: the send fails, the claim is settled */
				k = c->handoff;
				c->handed = false;
				break;
			}
			if (st->stopping || c->failed)
				goto out;
			if (tpb_stripe_claim(st, &k) == 0)
				break;
			pthread_cond_wait(&c->wake, &st->lock);
		}
		c->idle = false;
		pthread_mutex_unlock(&st->lock);
		r = send_chunk(c, &k, &sc);
		pthread_mutex_lock(&st->lock);
		send_account(c, &k, r);
	}
out:
	c->idle = false;
	pthread_mutex_unlock(&st->lock);
	scratch_end(&sc);
	return NULL;
}

/* ---- receiver ------------------------------------------------------------------------------ */

struct chunk_hdr {
	uint32_t magic, seg, len, flags;
	uint64_t id, off;
};

#define RX_STEP (256u << 10) /* a chunk's bytes read into a mapping, at most this many a call */

/* Receives @len bytes into @m + @off, or drops them when @m is NULL, adding to *@prog (when not
 * NULL) as they come. A failed CMA write is stored in @ret_werr and the rest drained. Return: 0
 * or -errno of the socket. */
static int recv_payload(struct conn *c, const struct tpb_mem *m, uint64_t off, uint32_t len,
			struct tpb_scratch *sc, uint32_t blen, uint64_t *prog, int *ret_werr,
			char *why, size_t why_len)
{
	void *b;
	int r;

	if (m && m->loc == TPB_LOC_LOCAL) {
		for (uint32_t done = 0, n; done < len; done += n) {
			n = TPU_MIN(len - done, RX_STEP);
			r = recv_all(c, (void *)(uintptr_t)(m->addr + off + done), n);
			if (r < 0)
				return r;
			if (prog)
				__atomic_fetch_add(prog, n, __ATOMIC_RELAXED);
		}
		return 0;
	}
	if (!(b = bounce_get(sc, blen)))
		return -ENOMEM;
	for (uint32_t done = 0, n; done < len; done += n) {
		n = TPU_MIN(len - done, blen);
		r = recv_all(c, b, n);
		if (r < 0)
			return r;
		if (prog)
			__atomic_fetch_add(prog, n, __ATOMIC_RELAXED);
		if (m && *ret_werr == 0) {
			/* A process's memory may take as long as it likes (a file mapping behind a
			 * slow server): not the peer's stall. */
			__atomic_store_n(&c->rx_local, true, __ATOMIC_RELAXED);
			__atomic_fetch_add(&c->st->local, 1, __ATOMIC_RELAXED);
			*ret_werr = tpb_cuda_basic_stage(m, off + done, b, n, true, sc, why,
							 why_len);
			__atomic_fetch_sub(&c->st->local, 1, __ATOMIC_RELAXED);
			__atomic_store_n(&c->rx_local, false, __ATOMIC_RELAXED);
		}
	}
	return 0;
}

/* Lock held: takes the bytes of chunk @h (inside @x's segments) for @x, once. Return: 0, -EEXIST
 * (a byte of it was taken before), -E2BIG (too many pieces) or -ENOMEM. */
static int rx_take(struct tpb_stripe_xfer *x, const struct chunk_hdr *h)
{
	uint64_t at = h->off;

	for (uint32_t i = 0; i < h->seg; i++)
		at += x->segs[i].len; /* no overflow: the segments' total fits (xfer_start()) */
	return tpu_ranges_add(&x->got, at, at + h->len, TPB_STRIPE_PIECES_MAX);
}

/* Lock held: checks the header; registers the chunk's receive as busy in @ret (NULL: drop).
 * Return: 0, or -EPROTO after failing the connection. */
static int rx_lookup(struct conn *c, const struct chunk_hdr *h, struct tpb_stripe_xfer **ret)
{
	struct tpb_stripe_xfer *x;
	int r;

	*ret = NULL;
	if (h->magic != TPB_STRIPE_MAGIC)
		tpb_stripe_conn_fail(c, -EPROTO, "bad chunk magic 0x%08x", h->magic);
	else if (h->flags != 0)
		tpb_stripe_conn_fail(c, -EPROTO, "unknown chunk flags 0x%x", h->flags);
	else if (h->len == 0 || h->len > TPB_STRIPE_CHUNK_MAX)
		tpb_stripe_conn_fail(c, -EPROTO, "chunk of %u bytes (limit %u)", h->len, TPB_STRIPE_CHUNK_MAX);
	else if ((x = tpu_hmap_get(&c->st->recvs, h->id)) && !x->canceled && !x->broken &&
		 (h->seg >= x->n_segs || !tpu_range_ok(h->off, h->len, x->segs[h->seg].len)))
		tpb_stripe_conn_fail(c, -EPROTO,
			  "chunk of %u bytes at offset %llu of segment %u is outside transfer %llu",
			  h->len, (unsigned long long)h->off, h->seg, (unsigned long long)h->id);
	else if (x && !x->canceled && !x->broken && (r = rx_take(x, h)) < 0)
		tpb_stripe_conn_fail(c, r == -ENOMEM ? -ENOMEM : -EPROTO,
			  "chunk of %u bytes at offset %llu of segment %u of transfer %llu: %s",
			  h->len, (unsigned long long)h->off, h->seg, (unsigned long long)h->id,
			  r == -EEXIST ? "overlaps bytes already received" :
			  r == -E2BIG ? "leaves the transfer in more pieces than the limit" :
			  "no memory");
	else {
		if (x && !x->canceled && !x->broken) {
			x->busy++;
			c->rx_x = x;
			*ret = x;
		}
		return 0;
	}
	return -EPROTO;
}

/* Lock held: the payload of @h for @x (may be NULL) arrived (@r == 0) or not. */
static void rx_account(struct conn *c, struct tpb_stripe_xfer *x, const struct chunk_hdr *h,
		       int r, int werr, const char *why)
{
	if (r == 0)
		__atomic_fetch_add(&c->st->received, h->len, __ATOMIC_RELAXED);
	c->rx_x = NULL;
	if (x) {
		x->busy--;
		if (r < 0) {
			tpb_stripe_set_status(x, -ECONNRESET, "peer link failed: connection %u: %s", c->index,
				   strerror(-r));
			x->broken = true;
		} else {
			x->bytes += h->len;
			if (werr < 0)
				tpb_stripe_set_status(x, werr, "cannot write the destination: %s",
					   why && *why ? why : strerror(-werr));
		}
		tpb_stripe_recv_check(c->st, x);
	}
	if (r < 0)
		tpb_stripe_conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" : "receive failed: %s",
			  strerror(-r));
}

/* Receives one chunk whose header is @raw. Return: 0, or -errno once the connection failed. */
static int rx_chunk(struct conn *c, const uint8_t *raw, struct tpb_scratch *sc)
{
	struct tpb_stripe *st = c->st;
	struct chunk_hdr h = { get_u32(raw), get_u32(raw + 4), get_u32(raw + 24),
			       get_u32(raw + 28), get_u64(raw + 8), get_u64(raw + 16) };
	struct tpb_stripe_xfer *x;
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
	r = recv_payload(c, write ? &m : NULL, h.off, h.len, sc, st->chunk,
			 x ? &x->progress : NULL, &werr, why, sizeof(why));
	pthread_mutex_lock(&st->lock);
	rx_account(c, x, &h, r, werr, why);
	pthread_mutex_unlock(&st->lock);
	return r;
}

void *tpb_stripe_io_rx_main(void *arg)
{
	struct conn *c = arg;
	struct tpb_stripe *st = c->st;
	struct tpb_scratch sc = { 0 }; /* bounce for process, CUDA and dropped chunks */
	uint8_t hdr[TPB_STRIPE_HDR];
	int r;

	thread_bulk();
	for (;;) {
		r = recv_all(c, hdr, sizeof(hdr));
		if (r < 0) {
			pthread_mutex_lock(&st->lock);
			tpb_stripe_conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" :
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
