/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Data connections of a peer link: sender and receiver threads per connection, chunked
 * transfers striped over them, completions back to the loop. See stripe.h.
 *
 * Locking: one mutex per stripe guards the transfer lists, the send queues and every
 * transfer's counters. Threads hold it only to pick work and account for it, never across a
 * socket call or a CMA copy.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "log.h"
#include "stripe.h"

#define CHUNK_DEFAULT (1u << 20)
#define CHUNK_MAX (16u << 20)

struct chunk {
	struct tpu_list node;
	struct tpd_stripe_xfer *x;
	uint32_t seg;
	uint32_t len;
	uint64_t off;
};

struct conn {
	struct tpd_stripe *st;
	unsigned index;
	int fd;
	pthread_t tx, rx;
	bool tx_started, rx_started;
	bool failed;
	struct tpu_list q; /* chunks to send */
	uint64_t queued;   /* their bytes */
};

struct tpd_stripe {
	struct event_base *base;
	struct event *ev;
	int efd;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct conn conns[TPD_STRIPE_CONNS_MAX];
	unsigned n_conns;
	bool stopping;
	struct tpu_list recvs; /* registered receives */
	struct tpu_list done;  /* completed, not yet delivered */
	uint32_t chunk;
	char name[48];
	tpd_stripe_error_fn on_error;
	void *arg;
	bool err_set, err_reported;
	int err;
	char why[200];
	uint64_t sent, received; /* under lock */
	unsigned rr;
};

/* ---- completion (lock held) ---------------------------------------------------------------- */

static void wake_loop(struct tpd_stripe *st)
{
	uint64_t one = 1;
	ssize_t r = write(st->efd, &one, sizeof(one));

	(void)r; /* the counter cannot overflow in practice; a failed write means it is set */
}

static void xfer_complete_locked(struct tpd_stripe *st, struct tpd_stripe_xfer *x, int status,
				 const char *why)
{
	if (x->queued_done)
		return;
	x->queued_done = true;
	if (status < 0 && x->status == 0) {
		x->status = status;
		snprintf(x->why, sizeof(x->why), "%s", why ? why : strerror(-status));
	}
	x->ns = tpu_now_ns() - x->start_ns;
	if (tpu_list_linked(&x->node))
		tpu_list_remove(&x->node);
	tpu_list_insert_tail(&st->done, &x->node);
	wake_loop(st);
}

static void set_status(struct tpd_stripe_xfer *x, int status, const char *why)
{
	if (x->status == 0 && status < 0) {
		x->status = status;
		snprintf(x->why, sizeof(x->why), "%s", why);
	}
}

/* A receive is complete when what is expected arrived and no thread writes its memory. */
static void recv_check_locked(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	if (x->queued_done || x->busy)
		return;
	if (x->canceled) {
		xfer_complete_locked(st, x, -ECANCELED, "receive canceled");
		return;
	}
	if (x->bytes >= x->expect) {
		if (x->expect_status < 0)
			set_status(x, x->expect_status, x->expect_why);
		xfer_complete_locked(st, x, x->status, x->why);
	}
}

/* One chunk of send @x is finished (sent, dropped or failed). */
static void chunk_finish_locked(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	if (--x->chunks_left > 0)
		return;
	if (x->canceled)
		set_status(x, -ECANCELED, "send canceled");
	xfer_complete_locked(st, x, x->status, x->why);
}

static void drop_queue_locked(struct tpd_stripe *st, struct conn *c, int status, const char *why)
{
	while (!tpu_list_empty(&c->q)) {
		struct chunk *k = tpu_list_first(&c->q, struct chunk, node);
		tpu_list_remove(&k->node);
		c->queued -= k->len;
		set_status(k->x, status, why);
		chunk_finish_locked(st, k->x);
		free(k);
	}
}

/* Connection @c failed: remember why (reported once, on the loop), stop its threads. */
static void conn_fail(struct conn *c, int err, const char *fmt, ...) _printf_(3, 4);

static void conn_fail(struct conn *c, int err, const char *fmt, ...)
{
	struct tpd_stripe *st = c->st;
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&st->lock);
	if (!c->failed && !st->stopping) {
		c->failed = true;
		if (!st->err_set) {
			st->err_set = true;
			st->err = err;
			snprintf(st->why, sizeof(st->why), "connection %u: %s", c->index, why);
			wake_loop(st);
		}
	}
	c->failed = true;
	drop_queue_locked(st, c, -ECONNRESET, "peer link closed");
	pthread_cond_broadcast(&st->cond);
	pthread_mutex_unlock(&st->lock);
	shutdown(c->fd, SHUT_RDWR);
}

/* ---- I/O helpers --------------------------------------------------------------------------- */

static int send_all(int fd, struct iovec *iov, int n)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };

	while (mh.msg_iovlen) {
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		while (w > 0 && mh.msg_iovlen) {
			if ((size_t)w >= mh.msg_iov->iov_len) {
				w -= (ssize_t)mh.msg_iov->iov_len;
				mh.msg_iov++;
				mh.msg_iovlen--;
			} else {
				mh.msg_iov->iov_base = (char *)mh.msg_iov->iov_base + w;
				mh.msg_iov->iov_len -= (size_t)w;
				w = 0;
			}
		}
	}
	return 0;
}

/* Return: 0, -ECONNRESET on EOF, or -errno. */
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
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
	return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* ---- sender -------------------------------------------------------------------------------- */

/* Sends chunk @k. Return: 0; > 0 (positive errno) if its source could not be read (nothing
 * sent); < 0 on a socket error. */
static int send_chunk(struct conn *c, struct chunk *k, void *bounce)
{
	const struct tpd_stripe_seg *s = &k->x->segs[k->seg];
	uint8_t hdr[TPD_STRIPE_HDR];
	struct iovec iov[2];

	put_u32(hdr, TPD_STRIPE_MAGIC);
	put_u32(hdr + 4, k->seg);
	put_u64(hdr + 8, k->x->xfer_id);
	put_u64(hdr + 16, k->off);
	put_u32(hdr + 24, k->len);
	put_u32(hdr + 28, 0);
	iov[0] = (struct iovec){ hdr, sizeof(hdr) };
	if (s->mem.loc == TPB_LOC_PROCESS) {
		struct iovec l = { bounce, k->len };
		struct iovec r = { (void *)(uintptr_t)(s->mem.addr + k->off), k->len };
		ssize_t n = process_vm_readv(s->mem.pid, &l, 1, &r, 1, 0);
		if (n < 0)
			return errno;
		if ((size_t)n != k->len)
			return EFAULT;
		iov[1] = (struct iovec){ bounce, k->len };
	} else {
		iov[1] = (struct iovec){ (void *)(uintptr_t)(s->mem.addr + k->off), k->len };
	}
	return send_all(c->fd, iov, 2);
}

static void *tx_main(void *arg)
{
	struct conn *c = arg;
	struct tpd_stripe *st = c->st;
	void *bounce = malloc(st->chunk);

	pthread_mutex_lock(&st->lock);
	for (;;) {
		struct chunk *k;
		int r;

		while (tpu_list_empty(&c->q) && !st->stopping && !c->failed)
			pthread_cond_wait(&st->cond, &st->lock);
		if (st->stopping || c->failed)
			break;
		k = tpu_list_first(&c->q, struct chunk, node);
		tpu_list_remove(&k->node);
		c->queued -= k->len;
		if (k->x->canceled || k->x->status < 0 || !bounce) {
			if (!bounce)
				set_status(k->x, -ENOMEM, "out of memory");
			chunk_finish_locked(st, k->x);
			free(k);
			continue;
		}
		pthread_mutex_unlock(&st->lock);
		r = send_chunk(c, k, bounce);
		pthread_mutex_lock(&st->lock);
		if (r == 0) {
			k->x->bytes += k->len;
			__atomic_fetch_add(&st->sent, k->len, __ATOMIC_RELAXED);
		} else if (r > 0) {
			char why[120];
			snprintf(why, sizeof(why), "cannot read the source: %s", strerror(r));
			set_status(k->x, r == ESRCH ? -ESRCH : -r, why);
		} else {
			set_status(k->x, -ECONNRESET, "peer link failed");
		}
		chunk_finish_locked(st, k->x);
		free(k);
		if (r < 0) {
			pthread_mutex_unlock(&st->lock);
			conn_fail(c, r, "send: %s", strerror(-r));
			pthread_mutex_lock(&st->lock);
		}
	}
	pthread_mutex_unlock(&st->lock);
	free(bounce);
	return NULL;
}

/* ---- receiver ------------------------------------------------------------------------------ */

static struct tpd_stripe_xfer *find_recv_locked(struct tpd_stripe *st, uint64_t id)
{
	struct tpd_stripe_xfer *x;

	tpu_list_for_each(x, &st->recvs, node)
		if (x->xfer_id == id)
			return x;
	return NULL;
}

/* Receives @len bytes into segment memory @m + @off (or drops them if @m is NULL).
 * Return: 0, > 0 (positive errno) if the CMA write failed (bytes drained), < 0 socket error. */
static int recv_into(struct conn *c, const struct tpb_mem *m, uint64_t off, uint32_t len,
		     void *bounce, size_t blen)
{
	int werr = 0, r;

	if (m && m->loc == TPB_LOC_LOCAL)
		return recv_all(c->fd, (void *)(uintptr_t)(m->addr + off), len);
	for (uint32_t done = 0; done < len;) {
		uint32_t n = (uint32_t)TPU_MIN((size_t)(len - done), blen);
		r = recv_all(c->fd, bounce, n);
		if (r < 0)
			return r;
		if (m && !werr) {
			struct iovec l = { bounce, n };
			struct iovec rv = { (void *)(uintptr_t)(m->addr + off + done), n };
			ssize_t w = process_vm_writev(m->pid, &l, 1, &rv, 1, 0);
			if (w < 0)
				werr = errno;
			else if ((size_t)w != n)
				werr = EFAULT;
		}
		done += n;
	}
	return werr;
}

/* Handles one chunk whose header is @hdr. Return: 0, or < 0 to stop (connection failed). */
static int rx_chunk(struct conn *c, const uint8_t *hdr, void *bounce)
{
	struct tpd_stripe *st = c->st;
	uint32_t seg = get_u32(hdr + 4), len = get_u32(hdr + 24);
	uint64_t id = get_u64(hdr + 8), off = get_u64(hdr + 16), end;
	struct tpd_stripe_xfer *x;
	struct tpb_mem m;
	bool have = false, write = false;
	int r;

	if (get_u32(hdr) != TPD_STRIPE_MAGIC || get_u32(hdr + 28) != 0 || len == 0 ||
	    len > CHUNK_MAX) {
		conn_fail(c, -EPROTO, "bad chunk header (magic %08x, len %u)", get_u32(hdr), len);
		return -EPROTO;
	}
	pthread_mutex_lock(&st->lock);
	x = find_recv_locked(st, id);
	if (x && !x->canceled && !x->queued_done) {
		if (seg >= x->n_segs || __builtin_add_overflow(off, (uint64_t)len, &end) ||
		    end > x->segs[seg].len) {
			pthread_mutex_unlock(&st->lock);
			conn_fail(c, -EPROTO, "chunk %u+%u of segment %u outside transfer %llu",
				  (unsigned)off, len, seg, (unsigned long long)id);
			return -EPROTO;
		}
		m = x->segs[seg].mem;
		x->busy++;
		have = true;
		write = x->status == 0;
	}
	pthread_mutex_unlock(&st->lock);
	r = recv_into(c, write ? &m : NULL, off, len, bounce, st->chunk);
	pthread_mutex_lock(&st->lock);
	__atomic_fetch_add(&st->received, len, __ATOMIC_RELAXED);
	if (have) {
		x->busy--;
		x->bytes += len;
		if (r > 0) {
			char why[120];
			snprintf(why, sizeof(why), "cannot write the destination: %s", strerror(r));
			set_status(x, r == ESRCH ? -ESRCH : -r, why);
		} else if (r < 0) {
			set_status(x, -ECONNRESET, "peer link failed");
		}
		recv_check_locked(st, x);
	}
	pthread_mutex_unlock(&st->lock);
	if (r < 0) {
		conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" : "recv: %s",
			  strerror(-r));
		return r;
	}
	return 0;
}

static void *rx_main(void *arg)
{
	struct conn *c = arg;
	struct tpd_stripe *st = c->st;
	void *bounce = malloc(st->chunk);
	uint8_t hdr[TPD_STRIPE_HDR];

	if (!bounce) {
		conn_fail(c, -ENOMEM, "out of memory");
		return NULL;
	}
	for (;;) {
		int r = recv_all(c->fd, hdr, sizeof(hdr));
		if (r < 0) {
			conn_fail(c, r, r == -ECONNRESET ? "closed by the peer" : "recv: %s",
				  strerror(-r));
			break;
		}
		if (rx_chunk(c, hdr, bounce) < 0)
			break;
	}
	free(bounce);
	return NULL;
}

/* ---- loop side ----------------------------------------------------------------------------- */

static void deliver(struct tpd_stripe *st)
{
	struct tpu_list list;
	bool report = false;

	tpu_list_init(&list);
	pthread_mutex_lock(&st->lock);
	while (!tpu_list_empty(&st->done)) {
		struct tpd_stripe_xfer *x = tpu_list_first(&st->done, struct tpd_stripe_xfer, node);
		tpu_list_remove(&x->node);
		tpu_list_insert_tail(&list, &x->node);
	}
	if (st->err_set && !st->err_reported) {
		st->err_reported = true;
		report = true;
	}
	pthread_mutex_unlock(&st->lock);
	while (!tpu_list_empty(&list)) {
		struct tpd_stripe_xfer *x = tpu_list_first(&list, struct tpd_stripe_xfer, node);
		tpu_list_remove(&x->node);
		tpu_list_init(&x->node);
		x->done(x);
	}
	if (report && st->on_error)
		st->on_error(st, st->err, st->why, st->arg);
}

static void stripe_on_event(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_stripe *st = arg;
	uint64_t v;

	if (read(st->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		tpu_log_warn("%s: eventfd read: %m", st->name);
	deliver(st);
}

int tpd_stripe_new(struct event_base *base, const struct tpd_stripe_config *cfg,
		   struct tpd_stripe **ret)
{
	struct tpd_stripe *st = calloc(1, sizeof(*st));

	if (!st)
		return -ENOMEM;
	st->base = base;
	st->chunk = cfg->chunk ? TPU_MIN(cfg->chunk, CHUNK_MAX) : CHUNK_DEFAULT;
	snprintf(st->name, sizeof(st->name), "%s", cfg->name ? cfg->name : "stripe");
	st->on_error = cfg->on_error;
	st->arg = cfg->arg;
	tpu_list_init(&st->recvs);
	tpu_list_init(&st->done);
	pthread_mutex_init(&st->lock, NULL);
	pthread_cond_init(&st->cond, NULL);
	st->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (st->efd < 0) {
		int r = -errno;
		free(st);
		return r;
	}
	st->ev = event_new(base, st->efd, EV_READ | EV_PERSIST, stripe_on_event, st);
	if (!st->ev || event_add(st->ev, NULL) < 0) {
		tpd_stripe_free(st);
		return -ENOMEM;
	}
	*ret = st;
	return 0;
}

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

int tpd_stripe_add_conn(struct tpd_stripe *st, int fd)
{
	struct conn *c;
	char name[16];
	int one = 1, fl, r;

	if (st->n_conns >= TPD_STRIPE_CONNS_MAX) {
		tpu_close(fd);
		return -E2BIG;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		r = -errno;
		tpu_close(fd);
		return r;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c = &st->conns[st->n_conns];
	memset(c, 0, sizeof(*c));
	c->st = st;
	c->index = st->n_conns;
	c->fd = fd;
	tpu_list_init(&c->q);
	snprintf(name, sizeof(name), "tpd-tx%u", c->index);
	r = start_thread(&c->tx, tx_main, c, name);
	if (r < 0) {
		tpu_close(fd);
		return r;
	}
	c->tx_started = true;
	st->n_conns++; /* from here tpd_stripe_free() joins and closes it */
	snprintf(name, sizeof(name), "tpd-rx%u", c->index);
	r = start_thread(&c->rx, rx_main, c, name);
	if (r < 0) {
		conn_fail(c, r, "cannot start its receiver thread");
		return r;
	}
	c->rx_started = true;
	return 0;
}

unsigned tpd_stripe_conns(const struct tpd_stripe *cst)
{
	struct tpd_stripe *st = (struct tpd_stripe *)cst; /* for the lock */
	unsigned n = 0;

	pthread_mutex_lock(&st->lock);
	for (unsigned i = 0; i < st->n_conns; i++)
		n += !st->conns[i].failed;
	pthread_mutex_unlock(&st->lock);
	return n;
}

/* The live connection with the fewest queued bytes, starting the search round robin. */
static struct conn *pick_conn_locked(struct tpd_stripe *st)
{
	struct conn *best = NULL;

	for (unsigned k = 0; k < st->n_conns; k++) {
		struct conn *c = &st->conns[(st->rr + k) % st->n_conns];
		if (!c->failed && (!best || c->queued < best->queued))
			best = c;
	}
	st->rr++;
	return best;
}

static void xfer_init(struct tpd_stripe_xfer *x)
{
	x->status = 0;
	x->why[0] = '\0';
	x->bytes = 0;
	x->total = 0;
	for (size_t i = 0; i < x->n_segs; i++)
		x->total += x->segs[i].len;
	x->expect = x->total;
	x->expect_status = 0;
	x->busy = 0;
	x->chunks_left = 0;
	x->canceled = false;
	x->queued_done = false;
	x->start_ns = tpu_now_ns();
	tpu_list_init(&x->node);
}

int tpd_stripe_send(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	struct tpu_list mine;
	int n = 0;

	if (!tpd_stripe_conns(st))
		return -ENOTCONN;
	xfer_init(x);
	tpu_list_init(&mine);
	for (size_t i = 0; i < x->n_segs; i++) {
		for (uint64_t off = 0; off < x->segs[i].len; off += st->chunk) {
			struct chunk *k = calloc(1, sizeof(*k));
			if (!k) {
				while (!tpu_list_empty(&mine)) {
					k = tpu_list_first(&mine, struct chunk, node);
					tpu_list_remove(&k->node);
					free(k);
				}
				return -ENOMEM;
			}
			k->x = x;
			k->seg = (uint32_t)i;
			k->off = off;
			k->len = (uint32_t)TPU_MIN((uint64_t)st->chunk, x->segs[i].len - off);
			tpu_list_insert_tail(&mine, &k->node);
			n++;
		}
	}
	pthread_mutex_lock(&st->lock);
	x->chunks_left = n;
	while (!tpu_list_empty(&mine)) {
		struct chunk *k = tpu_list_first(&mine, struct chunk, node);
		struct conn *c = pick_conn_locked(st);
		tpu_list_remove(&k->node);
		if (!c) {
			set_status(x, -ECONNRESET, "peer link closed");
			chunk_finish_locked(st, x);
			free(k);
			continue;
		}
		tpu_list_insert_tail(&c->q, &k->node);
		c->queued += k->len;
	}
	if (n == 0)
		xfer_complete_locked(st, x, 0, NULL);
	pthread_cond_broadcast(&st->cond);
	pthread_mutex_unlock(&st->lock);
	return 0;
}

void tpd_stripe_send_cancel(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !x->canceled) {
		x->canceled = true;
		for (unsigned i = 0; i < st->n_conns; i++) {
			struct conn *c = &st->conns[i];
			struct chunk *k, *tmp;
			tpu_list_for_each_safe(k, tmp, &c->q, node) {
				if (k->x != x)
					continue;
				tpu_list_remove(&k->node);
				c->queued -= k->len;
				chunk_finish_locked(st, x);
				free(k);
			}
		}
	}
	pthread_mutex_unlock(&st->lock);
}

int tpd_stripe_recv(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	int r = 0;

	if (!tpd_stripe_conns(st))
		return -ENOTCONN;
	pthread_mutex_lock(&st->lock);
	if (find_recv_locked(st, x->xfer_id)) {
		r = -EEXIST;
	} else {
		xfer_init(x);
		tpu_list_insert_tail(&st->recvs, &x->node);
		recv_check_locked(st, x); /* an empty transfer is complete at once */
	}
	pthread_mutex_unlock(&st->lock);
	return r;
}

void tpd_stripe_recv_expect(struct tpd_stripe *st, struct tpd_stripe_xfer *x, uint64_t bytes,
			    int status, const char *why)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done && !(status == 0 && bytes >= x->total)) {
		x->expect = TPU_MIN(bytes, x->total);
		x->expect_status = status < 0 ? status : -EIO;
		snprintf(x->expect_why, sizeof(x->expect_why), "%s",
			 why && *why ? why : "the sender stopped early");
		recv_check_locked(st, x);
	}
	pthread_mutex_unlock(&st->lock);
}

void tpd_stripe_recv_cancel(struct tpd_stripe *st, struct tpd_stripe_xfer *x)
{
	pthread_mutex_lock(&st->lock);
	if (!x->queued_done) {
		x->canceled = true;
		recv_check_locked(st, x);
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
	pthread_mutex_lock(&st->lock);
	st->stopping = true;
	pthread_cond_broadcast(&st->cond);
	pthread_mutex_unlock(&st->lock);
	for (unsigned i = 0; i < st->n_conns; i++)
		shutdown(st->conns[i].fd, SHUT_RDWR);
	for (unsigned i = 0; i < st->n_conns; i++) {
		struct conn *c = &st->conns[i];
		if (c->tx_started)
			pthread_join(c->tx, NULL);
		if (c->rx_started)
			pthread_join(c->rx, NULL);
		tpu_close(c->fd);
	}
	/* No thread is left: fail what is still queued or registered, deliver everything. */
	pthread_mutex_lock(&st->lock);
	for (unsigned i = 0; i < st->n_conns; i++)
		drop_queue_locked(st, &st->conns[i], -ECONNRESET, "peer link closed");
	while (!tpu_list_empty(&st->recvs)) {
		struct tpd_stripe_xfer *x = tpu_list_first(&st->recvs, struct tpd_stripe_xfer, node);
		x->busy = 0;
		xfer_complete_locked(st, x, -ECONNRESET, "peer link closed");
	}
	st->err_reported = true; /* the owner is freeing us: no error callback */
	pthread_mutex_unlock(&st->lock);
	deliver(st);
	if (st->ev)
		event_free(st->ev);
	tpu_close(st->efd);
	pthread_mutex_destroy(&st->lock);
	pthread_cond_destroy(&st->cond);
	free(st);
}
