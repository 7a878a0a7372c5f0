/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/mpt/stripe.c over real TCP connections on 127.0.0.1: two stripes A and B
 * in one process share one event_base, wired by 1 or 4 connected socket pairs; a third stripe may
 * face a raw socket the test writes chunks to by hand. Covers sizes around the chunk size,
 * segment layouts, both directions at once, CMA sources and destinations (the test's own pid),
 * cancellation on both sides, protocol violations, peer close and free with pending transfers.
 * Also prints an informational throughput figure (no assertion). Nothing here sleeps: the loop
 * runs until a condition or a deadline, and deadlines only bound what must eventually happen.
 * Cases about ordering or about a transfer being stopped midway do not race the stripe's threads:
 * their sender faces a socket that the test reads (a raw peer, or the gate between A and B that
 * passes chunks one by one when told to), with small kernel buffers, so a sender that nobody
 * reads is held back after a few hundred KiB whatever the load, and orderings are read off the
 * wire instead of off the clock.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stripe.h"
#include "tpt.h"

/* This process, pinned (one per forked test process). */
static struct tpb_proc *self_proc(void)
{
	static struct tpb_proc *p;
	static pid_t owner;

	if (!p || owner != getpid()) {
		int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(tpb_proc_new(fd, -EBADF, getpid(), geteuid(), getegid(), 0, &p), 0);
		owner = getpid();
	}
	return p;
}

#define CHUNK (1u << 20)
#define SMALL_CHUNK (64u << 10)
#define DEADLINE_MS 20000
#define GATES_MAX 4
#define SMALL_BUF (64 << 10) /* SO_SNDBUF/SO_RCVBUF of sockets the test reads itself */

static pthread_t loop_thread;
static int done_seq; /* completions so far, to tell their order */

struct res {
	int calls;
	int seq; /* done_seq of the (last) call */
	int status;
	uint64_t bytes;
	uint64_t ns;
	bool on_loop;
	bool exact;
	char why[160];
};

struct side {
	struct tpb_stripe *st;
	struct event *ev; /* the stripe's event fd on the fixture's loop (the daemon's part) */
	int errors;
	int err;
	char why[200];
};

/* One direction of a gate connection, copied by a thread once the gate is open. */
struct relay {
	int from, to;
	pthread_t thread;
};

struct fx {
	struct event_base *base;
	struct event *tick;
	struct side a, b, c; /* a <-> b over TCP; c faces raw sockets */
	int raw, raw2;
	/* fx_gated(): A's connection i ends at ga[i], B's at gb[i]; the test moves the bytes. */
	unsigned gates;
	int ga[GATES_MAX], gb[GATES_MAX];
	struct relay relays[2 * GATES_MAX];
	bool open;
	uint32_t send_size; /* of every side (0: the default) */
};

/* One transfer with up to 8 segments. */
struct xf {
	struct tpb_stripe_xfer x;
	struct tpb_stripe_seg segs[8];
	struct res res;
};

static void on_done(struct tpb_stripe_xfer *x)
{
	struct res *r = x->arg;

	r->calls++;
	r->seq = ++done_seq;
	r->status = x->status;
	r->bytes = x->bytes;
	r->ns = x->ns;
	r->exact = x->exact;
	r->on_loop = pthread_equal(pthread_self(), loop_thread);
	snprintf(r->why, sizeof(r->why), "%s", x->why);
}

static void on_error(struct tpb_stripe *st, int err, const char *why, void *arg)
{
	struct side *s = arg;

	ck_assert_ptr_eq(st, s->st);
	ck_assert(pthread_equal(pthread_self(), loop_thread));
	s->errors++;
	s->err = err;
	snprintf(s->why, sizeof(s->why), "%s", why);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
}

static uint64_t now_ms(void)
{
	return tpu_now_ns() / 1000000;
}

/* Runs the loop until *@a > 0 and *@b > 0 (@b may be NULL). Return: whether they are. */
static bool run_until(struct fx *f, const int *a, const int *b, int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;

	while (*a <= 0 || (b && *b <= 0)) {
		if (now_ms() > end)
			return false;
		event_base_loop(f->base, EVLOOP_ONCE);
	}
	return true;
}

/* Runs the loop for about @ms (to show that nothing more happens). */
static void run_for(struct fx *f, int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;

	while (now_ms() < end)
		event_base_loop(f->base, EVLOOP_ONCE);
}

/* Caps the kernel buffers of @fd (before listen or connect, so that the window follows). */
static void small_buffers(int fd)
{
	int v = SMALL_BUF;

	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)), 0);
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)), 0);
}

/* A connected pair on 127.0.0.1; with @small, both ends have small buffers and a blocking read
 * on @ret_b gives up after DEADLINE_MS (a bug then fails the case instead of hanging it). */
static void tcp_pair(int *ret_a, int *ret_b, bool small)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct timeval tv = { DEADLINE_MS / 1000, 0 };
	socklen_t sl = sizeof(sa);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), a, b;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(l, 0);
	if (small)
		small_buffers(l); /* inherited by the accepted socket */
	ck_assert_int_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(l, 1), 0);
	ck_assert_int_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(a, 0);
	if (small)
		small_buffers(a);
	ck_assert_int_eq(connect(a, (struct sockaddr *)&sa, sl), 0);
	b = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	ck_assert_int_ge(b, 0);
	close(l);
	if (small)
		ck_assert_int_eq(setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	*ret_a = a;
	*ret_b = b;
}

static void on_stripe_event(evutil_socket_t fd, short what, void *arg)
{
	struct side *s = arg;

	tpb_stripe_progress(s->st);
}

static void side_new(struct fx *f, struct side *s, const char *name, uint32_t chunk)
{
	struct tpb_stripe_config cfg = { .chunk = chunk, .send_size = f->send_size, .name = name,
					 .on_error = on_error, .arg = s };

	ck_assert_int_eq(tpb_stripe_new(&cfg, &s->st), 0);
	s->ev = event_new(f->base, tpb_stripe_event_fd(s->st), EV_READ | EV_PERSIST,
			  on_stripe_event, s);
	ck_assert_ptr_nonnull(s->ev);
	ck_assert_int_eq(event_add(s->ev, NULL), 0);
}

/* Frees @s's stripe (its event first); also from inside one of its callbacks. */
static void side_free(struct side *s)
{
	struct tpb_stripe *st = s->st;

	s->st = NULL;
	if (s->ev)
		event_free(s->ev);
	s->ev = NULL;
	tpb_stripe_free(st);
}

/* A and B joined by @conns TCP connections, writing at most @send_size bytes at a time. */
static void fx_setup_sized(struct fx *f, unsigned conns, uint32_t chunk, uint32_t send_size)
{
	struct timeval tv = { 0, 20000 };

	memset(f, 0, sizeof(*f));
	f->send_size = send_size;
	f->raw = f->raw2 = -1;
	done_seq = 0;
	loop_thread = pthread_self();
	f->base = event_base_new();
	f->tick = event_new(f->base, -1, EV_PERSIST, on_tick, NULL);
	ck_assert_int_eq(event_add(f->tick, &tv), 0);
	side_new(f, &f->a, "A", chunk);
	side_new(f, &f->b, "B", chunk);
	for (unsigned i = 0; i < conns; i++) {
		int a, b;

		tcp_pair(&a, &b, false);
		ck_assert_int_eq(tpb_stripe_add_conn(f->a.st, a), 0);
		ck_assert_int_eq(tpb_stripe_add_conn(f->b.st, b), 0);
	}
	ck_assert_uint_eq(tpb_stripe_conns(f->a.st), conns);
	ck_assert_uint_eq(tpb_stripe_conns(f->b.st), conns);
}

/* A and B joined by @conns TCP connections. */
static void fx_setup(struct fx *f, unsigned conns, uint32_t chunk)
{
	fx_setup_sized(f, conns, chunk, 0);
}

/* Stripe C with one connection whose far end is the raw socket f->raw (small buffers). */
static void fx_raw(struct fx *f, uint32_t chunk)
{
	int c;

	side_new(f, &f->c, "C", chunk);
	tcp_pair(&c, &f->raw, true);
	ck_assert_int_eq(tpb_stripe_add_conn(f->c.st, c), 0);
}

/* A second connection of C, facing f->raw2. */
static void fx_raw2(struct fx *f)
{
	int c;

	tcp_pair(&c, &f->raw2, true);
	ck_assert_int_eq(tpb_stripe_add_conn(f->c.st, c), 0);
}

/* A and B joined by @conns connections that pass through the test, the gate: A's connection i
 * ends at f->ga[i] (small buffers, so that A's senders stop while the gate is shut), B's at
 * f->gb[i]. Nothing moves until gate_pass() or gate_open(). */
static void fx_gated(struct fx *f, unsigned conns, uint32_t chunk)
{
	fx_setup(f, 0, chunk);
	ck_assert_uint_le(conns, GATES_MAX);
	for (unsigned i = 0; i < conns; i++) {
		int a, b;

		tcp_pair(&a, &f->ga[i], true);
		tcp_pair(&f->gb[i], &b, false);
		ck_assert_int_eq(tpb_stripe_add_conn(f->a.st, a), 0);
		ck_assert_int_eq(tpb_stripe_add_conn(f->b.st, b), 0);
		f->gates++;
	}
}

/* Reads exactly @len bytes from @fd into @buf. */
static void read_exact(int fd, void *buf, size_t len)
{
	ck_assert_int_eq(recv(fd, buf, len, MSG_WAITALL), (ssize_t)len);
}

/* Reads one chunk header from @fd; returns its transfer id, its header in @hdr, its length in
 * @ret_len. */
static uint64_t read_chunk_hdr(int fd, uint8_t *hdr, uint32_t *ret_len)
{
	uint64_t id = 0;

	read_exact(fd, hdr, TPB_STRIPE_HDR);
	for (int k = 7; k >= 0; k--)
		id = id << 8 | hdr[8 + k];
	*ret_len = (uint32_t)hdr[24] | (uint32_t)hdr[25] << 8 | (uint32_t)hdr[26] << 16 |
		   (uint32_t)hdr[27] << 24;
	return id;
}

/* Moves @len bytes from @from to @to, or drops them when @to < 0. */
static void copy_bytes(int from, int to, uint64_t len)
{
	static char buf[1 << 16];

	while (len) {
		size_t n = TPU_MIN(len, sizeof(buf));

		read_exact(from, buf, n);
		if (to >= 0)
			ck_assert_int_eq(send(to, buf, n, MSG_NOSIGNAL), (ssize_t)n);
		len -= n;
	}
}

/* Lets one chunk through connection @i of the gate (A to B): returns its transfer id, its
 * length in @ret_len. Waits for A to send it. */
static uint64_t gate_pass(struct fx *f, unsigned i, uint32_t *ret_len)
{
	uint8_t hdr[TPB_STRIPE_HDR];
	uint64_t id = read_chunk_hdr(f->ga[i], hdr, ret_len);

	ck_assert_int_eq(send(f->gb[i], hdr, sizeof(hdr), MSG_NOSIGNAL), (ssize_t)sizeof(hdr));
	copy_bytes(f->ga[i], f->gb[i], *ret_len);
	return id;
}

/* Copies one direction of a gate connection until either end closes. */
static void *relay_main(void *arg)
{
	struct relay *r = arg;
	char buf[1 << 16];

	for (;;) {
		ssize_t n = recv(r->from, buf, sizeof(buf), 0);

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue; /* EAGAIN: the read timeout of a gate socket, nothing else */
		if (n <= 0 || send(r->to, buf, (size_t)n, MSG_NOSIGNAL) != n)
			break; /* blocking send: all or an error */
	}
	shutdown(r->to, SHUT_WR);
	return NULL;
}

/* Opens the gate: from now on threads copy both directions of every gate connection. */
static void gate_open(struct fx *f)
{
	for (unsigned i = 0; i < 2 * f->gates; i++) {
		struct relay *r = &f->relays[i];

		r->from = i % 2 ? f->gb[i / 2] : f->ga[i / 2];
		r->to = i % 2 ? f->ga[i / 2] : f->gb[i / 2];
		ck_assert_int_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
	}
	f->open = true;
}

static void fx_teardown(struct fx *f)
{
	side_free(&f->a);
	side_free(&f->b);
	side_free(&f->c);
	/* A and B closed their ends: every relay reads end of stream or fails its write. */
	for (unsigned i = 0; f->open && i < 2 * f->gates; i++)
		pthread_join(f->relays[i].thread, NULL);
	for (unsigned i = 0; i < f->gates; i++) {
		close(f->ga[i]);
		close(f->gb[i]);
	}
	if (f->raw >= 0)
		close(f->raw);
	if (f->raw2 >= 0)
		close(f->raw2);
	event_free(f->tick);
	event_base_free(f->base);
}

static void xf_init(struct xf *t, uint64_t id)
{
	memset(t, 0, sizeof(*t));
	t->x.xfer_id = id;
	t->x.segs = t->segs;
	t->x.done = on_done;
	t->x.arg = &t->res;
}

static void xf_seg(struct xf *t, enum tpb_loc loc, void *p, uint64_t len)
{
	struct tpb_stripe_seg *s = &t->segs[t->x.n_segs++];

	s->mem = (struct tpb_mem){ .loc = loc, .proc = loc == TPB_LOC_PROCESS ? self_proc() : NULL,
				   .addr = (uint64_t)(uintptr_t)p };
	s->len = len;
}

static void *pattern(size_t len, uint64_t seed)
{
	void *p = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(p);
	tpt_fill(p, len, seed);
	return p;
}

static void *zeroed(size_t len)
{
	void *p = calloc(1, len ? len : 1);

	ck_assert_ptr_nonnull(p);
	return p;
}

static void check_pattern(const void *p, size_t len, uint64_t seed)
{
	size_t off = 0;

	ck_assert_msg(tpt_verify(p, len, seed, &off), "byte %zu of %zu differs", off, len);
}

static void check_ok(const struct res *r, uint64_t bytes)
{
	ck_assert_msg(r->status == 0, "status %d (%s)", r->status, r->why);
	ck_assert_int_eq(r->calls, 1);
	ck_assert(r->on_loop);
	ck_assert_uint_eq(r->bytes, bytes);
}

/* Receives on @to, then sends from @from, one segment of @len each way; waits for both. */
static void move_one(struct fx *f, struct side *from, struct side *to, uint64_t id,
		     enum tpb_loc src_loc, enum tpb_loc dst_loc, size_t len)
{
	void *src = pattern(len, id), *dst = zeroed(len);
	struct xf s, r;

	xf_init(&s, id);
	xf_init(&r, id);
	xf_seg(&s, src_loc, src, len);
	xf_seg(&r, dst_loc, dst, len);
	ck_assert_int_eq(tpb_stripe_recv(to->st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(from->st, &s.x), 0);
	ck_assert_int_eq(s.res.calls + r.res.calls, 0); /* never inside a call */
	ck_assert(run_until(f, &s.res.calls, &r.res.calls, DEADLINE_MS));
	check_ok(&s.res, len);
	check_ok(&r.res, len);
	ck_assert(len == 0 || (s.res.ns > 0 && r.res.ns > 0));
	check_pattern(dst, len, id);
	free(src);
	free(dst);
}

/* ---- data arrives intact ------------------------------------------------------------------ */

static const size_t sizes[] = { 0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 64u << 20 };
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

START_TEST(test_stripe_every_size_arrives_intact)
{
	unsigned conns = _i < (int)N_SIZES ? 1 : 4;
	size_t len = sizes[_i % N_SIZES];
	struct fx f;

	fx_setup(&f, conns, 0);
	move_one(&f, &f.a, &f.b, 1 + (uint64_t)_i, TPB_LOC_LOCAL, TPB_LOC_LOCAL, len);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	ck_assert_uint_eq(tpb_stripe_bytes_sent(f.a.st), len);
	ck_assert_uint_eq(tpb_stripe_bytes_received(f.b.st), len);
	fx_teardown(&f);
}
END_TEST

START_TEST(test_stripe_segments_with_empty_ones_arrive_intact)
{
	static const size_t lens[] = { 0, 100000, 0, 1, (3u << 20) + 3, 0, SMALL_CHUNK };
	enum { N = sizeof(lens) / sizeof(lens[0]) };
	void *src[N], *dst[N];
	struct xf s, r;
	uint64_t total = 0;
	struct fx f;

	fx_setup(&f, _i ? 4 : 1, SMALL_CHUNK);
	xf_init(&s, 77);
	xf_init(&r, 77);
	for (int i = 0; i < N; i++) {
		src[i] = pattern(lens[i], 100 + (uint64_t)i);
		dst[i] = zeroed(lens[i]);
		xf_seg(&s, TPB_LOC_LOCAL, src[i], lens[i]);
		xf_seg(&r, TPB_LOC_LOCAL, dst[i], lens[i]);
		total += lens[i];
	}
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, &r.res.calls, DEADLINE_MS));
	check_ok(&s.res, total);
	check_ok(&r.res, total);
	for (int i = 0; i < N; i++) {
		check_pattern(dst[i], lens[i], 100 + (uint64_t)i);
		free(src[i]);
		free(dst[i]);
	}
	fx_teardown(&f);
}
END_TEST

START_TEST(test_stripe_both_directions_at_once)
{
	enum { LEN = 24 << 20 };
	void *src_a = pattern(LEN, 5), *src_b = pattern(LEN, 6);
	void *dst_a = zeroed(LEN), *dst_b = zeroed(LEN);
	struct xf sa, rb, sb, ra;
	struct fx f;

	fx_setup(&f, _i ? 4 : 1, 0);
	xf_init(&sa, 5);
	xf_init(&rb, 5);
	xf_init(&sb, 6);
	xf_init(&ra, 6);
	xf_seg(&sa, TPB_LOC_LOCAL, src_a, LEN);
	xf_seg(&rb, TPB_LOC_LOCAL, dst_b, LEN);
	xf_seg(&sb, TPB_LOC_LOCAL, src_b, LEN);
	xf_seg(&ra, TPB_LOC_LOCAL, dst_a, LEN);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &rb.x), 0);
	ck_assert_int_eq(tpb_stripe_recv(f.a.st, &ra.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &sa.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.b.st, &sb.x), 0);
	ck_assert(run_until(&f, &sa.res.calls, &rb.res.calls, DEADLINE_MS));
	ck_assert(run_until(&f, &sb.res.calls, &ra.res.calls, DEADLINE_MS));
	check_ok(&sa.res, LEN);
	check_ok(&rb.res, LEN);
	check_ok(&sb.res, LEN);
	check_ok(&ra.res, LEN);
	check_pattern(dst_b, LEN, 5);
	check_pattern(dst_a, LEN, 6);
	fx_teardown(&f);
	free(src_a);
	free(src_b);
	free(dst_a);
	free(dst_b);
}
END_TEST

START_TEST(test_stripe_process_source_and_destination)
{
	static const enum tpb_loc locs[][2] = {
		{ TPB_LOC_PROCESS, TPB_LOC_LOCAL },
		{ TPB_LOC_LOCAL, TPB_LOC_PROCESS },
		{ TPB_LOC_PROCESS, TPB_LOC_PROCESS },
	};
	struct fx f;

	fx_setup(&f, 4, SMALL_CHUNK);
	for (unsigned i = 0; i < 3; i++) {
		move_one(&f, &f.a, &f.b, 10 + i, locs[i][0], locs[i][1], 3 * SMALL_CHUNK + 7);
		move_one(&f, &f.a, &f.b, 20 + i, locs[i][0], locs[i][1], 1);
	}
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
}
END_TEST

/* Chunks written to the socket in many small pieces (the smallest send size) arrive whole,
 * from mapped and from process memory, with the header only in front of each chunk. */
START_TEST(test_stripe_small_socket_writes_arrive_intact)
{
	static const enum tpb_loc locs[][2] = {
		{ TPB_LOC_LOCAL, TPB_LOC_LOCAL },
		{ TPB_LOC_PROCESS, TPB_LOC_PROCESS },
	};
	struct fx f;

	fx_setup_sized(&f, _i ? 4 : 1, SMALL_CHUNK, TPB_STRIPE_SEND_SIZE_MIN);
	for (unsigned i = 0; i < 2; i++) {
		move_one(&f, &f.a, &f.b, 30 + i, locs[i][0], locs[i][1], 3 * SMALL_CHUNK + 7);
		move_one(&f, &f.a, &f.b, 40 + i, locs[i][0], locs[i][1],
			 TPB_STRIPE_SEND_SIZE_MIN - TPB_STRIPE_HDR);
		move_one(&f, &f.a, &f.b, 50 + i, locs[i][0], locs[i][1],
			 TPB_STRIPE_SEND_SIZE_MIN - TPB_STRIPE_HDR + 1);
	}
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
}
END_TEST

START_TEST(test_stripe_unknown_transfer_is_drained)
{
	enum { LEN = 5 * SMALL_CHUNK + 1 };
	void *src = pattern(LEN, 1);
	uint64_t end;
	struct xf s;
	struct fx f;

	fx_setup(&f, 2, SMALL_CHUNK);
	xf_init(&s, 999); /* B never registered it */
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	check_ok(&s.res, LEN);
	move_one(&f, &f.a, &f.b, 1000, TPB_LOC_LOCAL, TPB_LOC_LOCAL, LEN); /* still in step */
	/* Chunks of 999 on other connections may still be on their way. */
	for (end = now_ms() + DEADLINE_MS;
	     tpb_stripe_bytes_received(f.b.st) < 2 * LEN && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	ck_assert_uint_eq(tpb_stripe_bytes_received(f.b.st), 2 * LEN);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
	free(src);
}
END_TEST

/*
 * The stripe touches no event loop: a completion waits until its owner calls
 * tpb_stripe_progress(), the event fd turning readable when it does; a failed connection is
 * reported once, also from progress, after the transfers it ended.
 */
START_TEST(test_stripe_completes_and_reports_only_from_progress)
{
	struct tpb_stripe_config cfg = { .name = "P", .on_error = on_error };
	struct side s = { 0 };
	struct pollfd pfd;
	uint8_t dst[16];
	struct xf e, r;
	int sp[2];

	loop_thread = pthread_self();
	cfg.arg = &s;
	ck_assert_int_eq(tpb_stripe_new(&cfg, &s.st), 0);
	pfd = (struct pollfd){ .fd = tpb_stripe_event_fd(s.st), .events = POLLIN };
	ck_assert_int_ge(pfd.fd, 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	ck_assert_int_eq(tpb_stripe_add_conn(s.st, sp[0]), 0);
	xf_init(&e, 5); /* nothing to receive: complete at once, delivered later */
	ck_assert_int_eq(tpb_stripe_recv(s.st, &e.x), 0);
	ck_assert_int_eq(poll(&pfd, 1, DEADLINE_MS), 1);
	ck_assert_int_eq(e.res.calls, 0);
	ck_assert_int_eq(tpb_stripe_progress(s.st), 1);
	ck_assert_int_eq(e.res.calls, 1);
	ck_assert_int_eq(e.res.status, 0);
	ck_assert(e.res.on_loop);
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	ck_assert_int_eq(tpb_stripe_progress(s.st), 0);

	xf_init(&r, 6);
	xf_seg(&r, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_recv(s.st, &r.x), 0);
	close(sp[1]); /* the only connection fails: the receive ends, then the error */
	ck_assert_int_eq(poll(&pfd, 1, DEADLINE_MS), 1);
	for (uint64_t end = now_ms() + DEADLINE_MS; !s.errors && now_ms() < end;)
		if (poll(&pfd, 1, 10) == 1)
			tpb_stripe_progress(s.st);
	ck_assert_int_eq(r.res.calls, 1);
	ck_assert_int_eq(r.res.status, -ECONNRESET);
	ck_assert_int_eq(s.errors, 1);
	ck_assert_msg(strstr(s.why, "closed by the peer"), "why: %s", s.why);
	tpb_stripe_free(s.st);
	ck_assert_int_eq(e.res.calls + r.res.calls, 2);
}
END_TEST

START_TEST(test_stripe_empty_transfers_complete_later_on_the_loop)
{
	struct xf s, r;
	struct fx f;

	fx_setup(&f, 1, 0);
	xf_init(&s, 3);
	xf_init(&r, 3);
	xf_seg(&s, TPB_LOC_LOCAL, NULL, 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(s.res.calls + r.res.calls, 0);
	ck_assert(run_until(&f, &s.res.calls, &r.res.calls, DEADLINE_MS));
	check_ok(&s.res, 0);
	check_ok(&r.res, 0);
	fx_teardown(&f);
}
END_TEST

/* ---- source and destination errors -------------------------------------------------------- */

START_TEST(test_stripe_unreadable_source_stops_the_send)
{
	enum { LEN = 3 * SMALL_CHUNK };
	void *src = pattern(LEN, 8), *dst = zeroed(LEN), *dst2 = zeroed(LEN);
	struct xf s, r;
	struct fx f;

	fx_setup(&f, 1, SMALL_CHUNK); /* one connection: chunks go out in order */
	xf_init(&s, 8);
	xf_init(&r, 8);
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&s, TPB_LOC_PROCESS, (void *)8, LEN); /* not mapped */
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&r, TPB_LOC_LOCAL, dst, LEN);
	xf_seg(&r, TPB_LOC_LOCAL, dst2, LEN);
	xf_seg(&r, TPB_LOC_LOCAL, dst2, LEN);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(s.res.status, -EFAULT);
	ck_assert_uint_eq(s.res.bytes, LEN);
	ck_assert_int_eq(r.res.calls, 0);
	tpb_stripe_recv_expect(f.b.st, &r.x, s.res.bytes, s.res.status, "source unreadable");
	ck_assert(run_until(&f, &r.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(r.res.status, -EFAULT);
	ck_assert_str_eq(r.res.why, "source unreadable");
	ck_assert_uint_eq(r.res.bytes, LEN);
	check_pattern(dst, LEN, 8);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
	free(src);
	free(dst);
	free(dst2);
}
END_TEST

START_TEST(test_stripe_source_of_a_dead_process_fails_with_esrch)
{
	struct xf s, r;
	char buf[16] = "x", dst[16];
	struct fx f;
	struct tpb_proc *dead;
	int pidfd;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(0);
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	ck_assert_int_ge(pidfd, 0);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	ck_assert_int_eq(tpb_proc_new(pidfd, -EBADF, pid, geteuid(), getegid(), 0, &dead), 0);
	fx_setup(&f, 1, 0);
	xf_init(&s, 9);
	xf_init(&r, 9);
	xf_seg(&s, TPB_LOC_PROCESS, buf, sizeof(buf));
	s.segs[0].mem.proc = dead;
	xf_seg(&r, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(s.res.status, -ESRCH);
	ck_assert_uint_eq(s.res.bytes, 0);
	tpb_stripe_recv_expect(f.b.st, &r.x, 0, -ESRCH, "writer died");
	ck_assert(run_until(&f, &r.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(r.res.status, -ESRCH);
	fx_teardown(&f);
	tpb_proc_unref(dead);
}
END_TEST

START_TEST(test_stripe_unwritable_destination_fails_after_draining)
{
	enum { LEN = 4 * SMALL_CHUNK + 3 };
	void *src = pattern(LEN, 4);
	struct xf s, r;
	struct fx f;

	fx_setup(&f, 4, SMALL_CHUNK);
	xf_init(&s, 4);
	xf_init(&r, 4);
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&r, TPB_LOC_PROCESS, (void *)8, LEN); /* not mapped */
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, &r.res.calls, DEADLINE_MS));
	check_ok(&s.res, LEN);
	ck_assert_int_eq(r.res.status, -EFAULT);
	ck_assert_uint_eq(r.res.bytes, LEN); /* everything was drained */
	move_one(&f, &f.a, &f.b, 40, TPB_LOC_LOCAL, TPB_LOC_LOCAL, LEN);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
	free(src);
}
END_TEST

/* ---- cancellation ------------------------------------------------------------------------- */

START_TEST(test_stripe_send_cancel_mid_transfer)
{
	enum { LEN = 64 << 20 };
	void *src = pattern(LEN, 11), *dst = zeroed(LEN);
	struct xf s, r;
	struct fx f;

	fx_gated(&f, 4, SMALL_CHUNK); /* shut: A's senders stop once their buffers are full */
	xf_init(&s, 11);
	xf_init(&r, 11);
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&r, TPB_LOC_LOCAL, dst, LEN);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	for (uint64_t end = now_ms() + DEADLINE_MS;
	     tpb_stripe_bytes_sent(f.a.st) < SMALL_CHUNK && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE); /* until a first chunk went out */
	ck_assert_uint_ge(tpb_stripe_bytes_sent(f.a.st), SMALL_CHUNK);
	tpb_stripe_send_cancel(f.a.st, &s.x);
	tpb_stripe_send_cancel(f.a.st, &s.x); /* twice is harmless */
	gate_open(&f); /* the chunks being written when it was canceled can finish */
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(s.res.status, -ECANCELED);
	ck_assert_uint_ge(s.res.bytes, SMALL_CHUNK);
	ck_assert_uint_lt(s.res.bytes, LEN); /* a few buffers' worth */
	ck_assert_uint_eq(s.res.bytes % SMALL_CHUNK, 0); /* whole chunks only */
	ck_assert_int_eq(r.res.calls, 0);
	tpb_stripe_recv_expect(f.b.st, &r.x, s.res.bytes, -ECANCELED, "writer canceled");
	ck_assert(run_until(&f, &r.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(r.res.status, -ECANCELED);
	ck_assert_uint_eq(r.res.bytes, s.res.bytes);
	run_for(&f, 50);
	ck_assert_int_eq(s.res.calls + r.res.calls, 2);
	move_one(&f, &f.a, &f.b, 12, TPB_LOC_LOCAL, TPB_LOC_LOCAL, 3 * SMALL_CHUNK);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
	free(src);
	free(dst);
}
END_TEST

/* Reads what is readable on @fd without blocking. Return: bytes read. */
static uint64_t drain_raw(int fd)
{
	static char buf[1 << 16];
	uint64_t n = 0;
	ssize_t r;

	while ((r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		n += (uint64_t)r;
	return n;
}

START_TEST(test_stripe_send_cancel_never_sends_half_a_chunk)
{
	enum { LEN = 64 << 20 };
	void *src = zeroed(LEN);
	uint64_t got = 0, end;
	struct xf s;
	struct fx f;

	fx_setup(&f, 0, 0);
	fx_raw(&f, SMALL_CHUNK);
	xf_init(&s, 13);
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &s.x), 0);
	/* Nobody reads the raw end: the sender blocks once the socket buffers are full. */
	tpb_stripe_send_cancel(f.c.st, &s.x);
	end = now_ms() + DEADLINE_MS;
	while (!s.res.calls && now_ms() < end) {
		got += drain_raw(f.raw);
		event_base_loop(f.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	}
	ck_assert_int_eq(s.res.calls, 1);
	ck_assert_int_eq(s.res.status, -ECANCELED);
	ck_assert_uint_lt(s.res.bytes, LEN);
	side_free(&f.c); /* what is still queued goes out, then end of stream */
	f.c.st = NULL;
	for (ssize_t n; (n = recv(f.raw, src, LEN, 0)) > 0;)
		got += (uint64_t)n;
	ck_assert_uint_eq(got, s.res.bytes + s.res.bytes / SMALL_CHUNK * TPB_STRIPE_HDR);
	fx_teardown(&f);
	free(src);
}
END_TEST

/*
 * One connection, to a raw peer with small buffers. Before @small is queued the sender may have
 * taken any number of @big's chunks (how many depends on scheduling), but no more than it had
 * written plus the one it was writing (or was handed): bytes_sent, read after the queueing,
 * bounds them. After that the sends take turns of one row (one chunk per connection: one here),
 * so at most one more chunk of @big goes out before @small. The test reads the wire and checks
 * that bound; with a first-come queue, @small would wait for all of @big, which the peer has not
 * read.
 */
START_TEST(test_stripe_small_send_does_not_wait_behind_a_large_one)
{
	enum { LEN = 64 << 20 };
	void *src = zeroed(LEN);
	uint64_t limit, before = 0, big_bytes = 0, id;
	uint8_t hdr[TPB_STRIPE_HDR];
	struct xf big, small;
	uint32_t len;
	struct fx f;

	fx_setup(&f, 0, 0);
	fx_raw(&f, SMALL_CHUNK); /* one connection, nobody reads it yet */
	xf_init(&big, 14);
	xf_seg(&big, TPB_LOC_LOCAL, src, LEN);
	xf_init(&small, 15);
	xf_seg(&small, TPB_LOC_LOCAL, src, 1);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &big.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &small.x), 0);
	limit = tpb_stripe_bytes_sent(f.c.st) / SMALL_CHUNK + 2;
	ck_assert_uint_lt(limit, LEN / SMALL_CHUNK / 4); /* the buffers hold far less than LEN */
	while ((id = read_chunk_hdr(f.raw, hdr, &len)) == 14) {
		copy_bytes(f.raw, -1, len);
		big_bytes += len;
		before++;
	}
	ck_assert_uint_eq(id, 15);
	ck_assert_uint_eq(len, 1);
	ck_assert_msg(before <= limit, "%llu chunks of the large send went first (at most %llu)",
		      (unsigned long long)before, (unsigned long long)limit);
	copy_bytes(f.raw, -1, len);
	while (big_bytes < LEN) {
		ck_assert_uint_eq(read_chunk_hdr(f.raw, hdr, &len), 14);
		copy_bytes(f.raw, -1, len);
		big_bytes += len;
	}
	ck_assert(run_until(&f, &small.res.calls, &big.res.calls, DEADLINE_MS));
	check_ok(&small.res, 1);
	check_ok(&big.res, LEN);
	ck_assert_int_lt(small.res.seq, big.res.seq); /* one sender thread: small was done first */
	fx_teardown(&f);
	free(src);
}
END_TEST

START_TEST(test_stripe_recv_cancel_drops_later_chunks)
{
	enum { LEN = 16 << 20 };
	void *src = pattern(LEN, 21), *d1 = zeroed(LEN), *d2 = zeroed(LEN);
	uint64_t passed = 0, passed21 = 0, id;
	struct xf s1, s2, r1, r2;
	uint32_t len;
	size_t i;
	struct fx f;

	fx_gated(&f, 4, SMALL_CHUNK);
	xf_init(&s1, 21);
	xf_init(&r1, 21);
	xf_init(&s2, 22);
	xf_init(&r2, 22);
	xf_seg(&s1, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&s2, TPB_LOC_LOCAL, src, LEN);
	xf_seg(&r1, TPB_LOC_LOCAL, d1, LEN);
	xf_seg(&r2, TPB_LOC_LOCAL, d2, LEN);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r1.x), 0);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r2.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s1.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s2.x), 0);
	/* Part of r1 lands: chunks of connection 0 pass until one of them belonged to it. The
	 * other senders stop on full buffers and the sends take turns, so one soon does. */
	while (!passed21) {
		id = gate_pass(&f, 0, &len);
		ck_assert(id == 21 || id == 22);
		passed += len;
		passed21 += id == 21 ? len : 0;
	}
	for (uint64_t end = now_ms() + DEADLINE_MS;
	     tpb_stripe_bytes_received(f.b.st) < passed && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	ck_assert_uint_eq(tpb_stripe_bytes_received(f.b.st), passed);
	tpb_stripe_recv_cancel(f.b.st, &r1.x);
	ck_assert_int_eq(r1.res.calls, 0);
	ck_assert(run_until(&f, &r1.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(r1.res.status, -ECANCELED);
	ck_assert_uint_eq(r1.res.bytes, passed21); /* what had landed, and nothing since */
	memset(d1, 0xee, LEN); /* nothing may write here after done */
	gate_open(&f);
	ck_assert(run_until(&f, &s1.res.calls, &s2.res.calls, DEADLINE_MS));
	ck_assert(run_until(&f, &r2.res.calls, NULL, DEADLINE_MS));
	check_ok(&s1.res, LEN);
	check_ok(&s2.res, LEN);
	check_ok(&r2.res, LEN);
	check_pattern(d2, LEN, 21);
	/* Every chunk of s1 reached B and was dropped there. */
	for (uint64_t end = now_ms() + DEADLINE_MS;
	     tpb_stripe_bytes_received(f.b.st) < 2 * (uint64_t)LEN && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	ck_assert_uint_eq(tpb_stripe_bytes_received(f.b.st), 2 * (uint64_t)LEN);
	for (i = 0; i < LEN && ((uint8_t *)d1)[i] == 0xee;)
		i++;
	ck_assert_msg(i == LEN, "byte %zu written after the cancel", i);
	ck_assert_int_eq(r1.res.calls, 1);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
	free(src);
	free(d1);
	free(d2);
}
END_TEST

/* ---- protocol violations and failures ----------------------------------------------------- */

static void put_hdr(uint8_t *h, uint32_t magic, uint32_t seg, uint64_t id, uint64_t off,
		    uint32_t len, uint32_t flags)
{
	uint64_t v[6] = { magic, seg, id, off, len, flags };
	static const int at[6] = { 0, 4, 8, 16, 24, 28 }, size[6] = { 4, 4, 8, 8, 4, 4 };

	for (int i = 0; i < 6; i++)
		for (int k = 0; k < size[i]; k++)
			h[at[i] + k] = (uint8_t)(v[i] >> (8 * k));
}

/* A fixture whose connection 0 the test writes raw chunks into, and receive 7 registered on it
 * into @dst of @len bytes. */
static void raw_recv(struct fx *f, struct xf *r, void *dst, size_t len)
{
	fx_setup(f, 0, 0);
	fx_raw(f, 0);
	xf_init(r, 7);
	xf_seg(r, TPB_LOC_LOCAL, dst, len);
	ck_assert_int_eq(tpb_stripe_recv(f->c.st, &r->x), 0);
}

struct bad {
	uint32_t magic, seg, len, flags;
	uint64_t off;
	const char *why;
};

static const struct bad bads[] = {
	{ 0x31435055u, 0, 10, 0, 0, "magic" },
	{ TPB_STRIPE_MAGIC, 0, 10, 1, 0, "flags" },
	{ TPB_STRIPE_MAGIC, 0, 0, 0, 0, "0 bytes" },
	{ TPB_STRIPE_MAGIC, 0, TPB_STRIPE_CHUNK_MAX + 1, 0, 0, "limit" },
	{ TPB_STRIPE_MAGIC, 0, 200, 0, 900, "outside" },
	{ TPB_STRIPE_MAGIC, 1, 10, 0, 0, "outside" },
	{ TPB_STRIPE_MAGIC, 0, 100, 0, UINT64_MAX - 10, "outside" },
};

START_TEST(test_stripe_bad_chunk_fails_only_that_stripe)
{
	const struct bad *b = &bads[_i];
	uint8_t hdr[TPB_STRIPE_HDR + 256] = { 0 }, dst[1000];
	struct xf r;
	struct fx f;

	fx_setup(&f, 2, 0);
	fx_raw(&f, 0);
	xf_init(&r, 7);
	xf_seg(&r, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_recv(f.c.st, &r.x), 0);
	put_hdr(hdr, b->magic, b->seg, 7, b->off, b->len, b->flags);
	ck_assert_int_eq(send(f.raw, hdr, sizeof(hdr), MSG_NOSIGNAL), sizeof(hdr));
	ck_assert(run_until(&f, &f.c.errors, &r.res.calls, DEADLINE_MS));
	ck_assert_int_eq(f.c.err, -EPROTO);
	ck_assert_msg(strstr(f.c.why, "connection 0") && strstr(f.c.why, b->why), "why: %s",
		      f.c.why);
	ck_assert_int_eq(r.res.status, -ECONNRESET); /* no connection left */
	ck_assert_uint_eq(tpb_stripe_conns(f.c.st), 0);
	move_one(&f, &f.a, &f.b, 30, TPB_LOC_LOCAL, TPB_LOC_LOCAL, 2 * CHUNK + 1);
	run_for(&f, 30);
	ck_assert_int_eq(f.c.errors, 1);
	ck_assert_int_eq(r.res.calls, 1);
	ck_assert_int_eq(f.a.errors + f.b.errors, 0);
	fx_teardown(&f);
}
END_TEST

/* Sends a raw chunk of @len bytes of @fill for transfer @id at @off of segment 0. */
static void raw_chunk(struct fx *f, uint64_t id, uint64_t off, uint32_t len, uint8_t fill)
{
	uint8_t hdr[TPB_STRIPE_HDR], body[256];

	ck_assert_uint_le(len, sizeof(body));
	memset(body, fill, len);
	put_hdr(hdr, TPB_STRIPE_MAGIC, 0, id, off, len, 0);
	ck_assert_int_eq(send(f->raw, hdr, sizeof(hdr), MSG_NOSIGNAL), sizeof(hdr));
	ck_assert_int_eq(send(f->raw, body, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Two chunks of one transfer that share a byte: the second must fail the connection, however
 * they overlap (the bytes counted alone would complete the transfer with a hole in it). */
static const struct {
	uint64_t off1;
	uint32_t len1;
	uint64_t off2;
	uint32_t len2;
} overlaps[] = {
	{ 0, 100, 0, 100 },   /* the same chunk twice */
	{ 0, 100, 99, 2 },    /* one byte at the end */
	{ 100, 100, 50, 51 }, /* one byte at the start */
	{ 100, 100, 120, 10 }, /* inside */
	{ 100, 100, 50, 200 }, /* around */
};

START_TEST(test_stripe_overlapping_chunk_fails_the_stripe)
{
	uint8_t dst[300];
	struct xf r;
	struct fx f;

	raw_recv(&f, &r, dst, sizeof(dst));
	raw_chunk(&f, 7, overlaps[_i].off1, overlaps[_i].len1, 1);
	raw_chunk(&f, 7, overlaps[_i].off2, overlaps[_i].len2, 2);
	ck_assert(run_until(&f, &f.c.errors, &r.res.calls, DEADLINE_MS));
	ck_assert_int_eq(f.c.err, -EPROTO);
	ck_assert_msg(strstr(f.c.why, "overlaps bytes already received"), "why: %s", f.c.why);
	ck_assert_int_ne(r.res.status, 0);
	fx_teardown(&f);
}
END_TEST

/* Chunks that only touch are fine, in any order; the transfer is whole. */
START_TEST(test_stripe_touching_chunks_in_any_order_complete)
{
	uint8_t dst[300];
	struct xf r;
	struct fx f;

	raw_recv(&f, &r, dst, 300);
	raw_chunk(&f, 7, 200, 100, 3);
	raw_chunk(&f, 7, 0, 100, 1);
	raw_chunk(&f, 7, 100, 100, 2);
	ck_assert(run_until(&f, &r.res.calls, NULL, DEADLINE_MS));
	check_ok(&r.res, 300);
	ck_assert(r.res.exact);
	for (int i = 0; i < 300; i++)
		ck_assert_int_eq(dst[i], 1 + i / 100);
	ck_assert_int_eq(f.c.errors, 0);
	fx_teardown(&f);
}
END_TEST

/* A sender that ends a transfer early: exact says whether what came is the prefix it ended at
 * (the right count of bytes elsewhere in the transfer is not). */
START_TEST(test_stripe_early_end_says_whether_the_prefix_came)
{
	uint8_t dst[300];
	struct xf r;
	struct fx f;

	raw_recv(&f, &r, dst, 300);
	raw_chunk(&f, 7, _i ? 0 : 200, 100, 1);
	for (uint64_t end = now_ms() + DEADLINE_MS; tpb_stripe_recv_progress(&r.x) < 100 &&
						      now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	tpb_stripe_recv_expect(f.c.st, &r.x, 100, -ENODATA, "ends here");
	ck_assert(run_until(&f, &r.res.calls, NULL, DEADLINE_MS));
	ck_assert_int_eq(r.res.status, -ENODATA);
	ck_assert_uint_eq(r.res.bytes, 100);
	ck_assert_int_eq(r.res.exact, _i == 1);
	ck_assert_int_eq(f.c.errors, 0);
	fx_teardown(&f);
}
END_TEST

/* A transfer may lie in TPB_STRIPE_PIECES_MAX separate pieces, not one more: a peer cannot make
 * the receiver keep a range per byte. */
START_TEST(test_stripe_pieces_are_bounded)
{
	uint32_t n = TPB_STRIPE_PIECES_MAX + (uint32_t)_i;
	uint8_t *dst = zeroed(2 * (size_t)n), *buf = malloc((size_t)n * (TPB_STRIPE_HDR + 1));
	size_t at = 0;
	struct xf r;
	struct fx f;

	ck_assert_ptr_nonnull(buf);
	raw_recv(&f, &r, dst, 2 * (size_t)n);
	for (uint32_t k = 0; k < n; k++) { /* every other byte */
		put_hdr(buf + at, TPB_STRIPE_MAGIC, 0, 7, 2 * (uint64_t)k, 1, 0);
		buf[at + TPB_STRIPE_HDR] = 9;
		at += TPB_STRIPE_HDR + 1;
	}
	for (size_t sent = 0; sent < at;) {
		ssize_t w = send(f.raw, buf + sent, at - sent, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w > 0)
			sent += (size_t)w;
		else
			event_base_loop(f.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	}
	if (_i) {
		ck_assert(run_until(&f, &f.c.errors, NULL, DEADLINE_MS));
		ck_assert_msg(strstr(f.c.why, "pieces"), "why: %s", f.c.why);
	} else {
		for (uint64_t end = now_ms() + DEADLINE_MS;
		     tpb_stripe_recv_progress(&r.x) < n && now_ms() < end;)
			event_base_loop(f.base, EVLOOP_ONCE);
		ck_assert_uint_eq(tpb_stripe_recv_progress(&r.x), n);
		ck_assert_int_eq(f.c.errors, 0);
		ck_assert_int_eq(r.res.calls, 0);
	}
	fx_teardown(&f);
	free(buf);
	free(dst);
}
END_TEST

/* A peer that stops in the middle of a chunk holds the receiver's thread in the transfer's
 * memory: tpb_stripe_recv_stalled() fails that connection and ends the transfer at once. */
START_TEST(test_stripe_stalled_in_a_chunk_ends_the_transfer)
{
	uint8_t hdr[TPB_STRIPE_HDR], body[10] = { 0 }, dst[100];
	struct xf r;
	struct fx f;

	raw_recv(&f, &r, dst, sizeof(dst));
	put_hdr(hdr, TPB_STRIPE_MAGIC, 0, 7, 0, 100, 0);
	ck_assert_int_eq(send(f.raw, hdr, sizeof(hdr), MSG_NOSIGNAL), sizeof(hdr));
	ck_assert_int_eq(send(f.raw, body, sizeof(body), MSG_NOSIGNAL), sizeof(body));
	run_for(&f, 100); /* the receiver now waits for the other 90 bytes */
	ck_assert_int_eq(r.res.calls, 0);
	tpb_stripe_recv_stalled(f.c.st, &r.x, "no byte for a while");
	ck_assert(run_until(&f, &r.res.calls, &f.c.errors, DEADLINE_MS));
	ck_assert_int_eq(r.res.status, -ETIMEDOUT);
	ck_assert_msg(strstr(r.res.why, "no byte for a while"), "why: %s", r.res.why);
	ck_assert_msg(strstr(f.c.why, "stalled in a chunk of transfer 7"), "why: %s", f.c.why);
	fx_teardown(&f);
}
END_TEST

START_TEST(test_stripe_chunk_header_is_the_documented_wire_format)
{
	uint8_t hdr[TPB_STRIPE_HDR], exp[TPB_STRIPE_HDR], body[5];
	char src[5 + 7] = "hello world";
	struct xf s;
	struct fx f;

	fx_setup(&f, 0, 0);
	fx_raw(&f, 0);
	xf_init(&s, 0x1122334455667788ull);
	xf_seg(&s, TPB_LOC_LOCAL, src, 0);
	xf_seg(&s, TPB_LOC_LOCAL, src, 5);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	check_ok(&s.res, 5);
	ck_assert_int_eq(recv(f.raw, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
	ck_assert_int_eq(recv(f.raw, body, sizeof(body), MSG_WAITALL), sizeof(body));
	put_hdr(exp, 0x31435054u, 1, 0x1122334455667788ull, 0, 5, 0);
	ck_assert_mem_eq(hdr, exp, sizeof(hdr));
	ck_assert_mem_eq(body, "hello", 5);
	ck_assert_mem_eq(hdr, "TPC1", 4);
	fx_teardown(&f);
}
END_TEST

/* On the wire a chunk written in pieces is still one header and its bytes. */
START_TEST(test_stripe_small_socket_writes_keep_the_wire_format)
{
	enum { LEN = 10000 };
	uint8_t hdr[TPB_STRIPE_HDR], exp[TPB_STRIPE_HDR];
	char *src = pattern(LEN, 9), *body = zeroed(LEN + 1);
	struct xf s;
	struct fx f;

	fx_setup_sized(&f, 0, 0, TPB_STRIPE_SEND_SIZE_MIN);
	fx_raw(&f, 0);
	xf_init(&s, 0x99);
	xf_seg(&s, TPB_LOC_LOCAL, src, LEN);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, NULL, DEADLINE_MS));
	check_ok(&s.res, LEN);
	ck_assert_int_eq(recv(f.raw, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
	put_hdr(exp, TPB_STRIPE_MAGIC, 0, 0x99, 0, LEN, 0);
	ck_assert_mem_eq(hdr, exp, sizeof(hdr));
	ck_assert_int_eq(recv(f.raw, body, LEN, MSG_WAITALL), LEN);
	check_pattern(body, LEN, 9);
	ck_assert_int_eq(recv(f.raw, body, 1, MSG_DONTWAIT), -1); /* nothing after it */
	ck_assert_int_eq(errno, EAGAIN);
	fx_teardown(&f);
	free(src);
	free(body);
}
END_TEST

START_TEST(test_stripe_peer_close_reports_error_once)
{
	uint8_t dst[1000], hdr[TPB_STRIPE_HDR + 100] = { 0 }, got[TPB_STRIPE_HDR + 5];
	struct xf r, e, s;
	struct fx f;

	fx_setup(&f, 0, 0);
	fx_raw(&f, 0);
	fx_raw2(&f);
	xf_init(&r, 50);
	xf_seg(&r, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_recv(f.c.st, &r.x), 0);
	/* A chunk of 500 bytes cut after 100 by the peer closing connection 0. */
	put_hdr(hdr, TPB_STRIPE_MAGIC, 0, 50, 0, 500, 0);
	ck_assert_int_eq(send(f.raw, hdr, sizeof(hdr), MSG_NOSIGNAL), sizeof(hdr));
	close(f.raw);
	f.raw = -1;
	ck_assert(run_until(&f, &f.c.errors, &r.res.calls, DEADLINE_MS));
	ck_assert_msg(strstr(f.c.why, "connection 0: closed by the peer"), "why: %s", f.c.why);
	ck_assert_int_eq(r.res.status, -ECONNRESET); /* although connection 1 lives */
	ck_assert_msg(strstr(r.res.why, "connection 0"), "why: %s", r.res.why);
	ck_assert_uint_eq(tpb_stripe_conns(f.c.st), 1);
	/* Connection 1 still carries transfers; the error is not reported again. */
	xf_init(&e, 52);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &e.x), 0);
	xf_init(&s, 53);
	xf_seg(&s, TPB_LOC_LOCAL, "hello", 5);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &s.x), 0);
	ck_assert(run_until(&f, &e.res.calls, &s.res.calls, DEADLINE_MS));
	check_ok(&s.res, 5);
	ck_assert_int_eq(recv(f.raw2, got, sizeof(got), MSG_WAITALL), sizeof(got));
	ck_assert_mem_eq(got + TPB_STRIPE_HDR, "hello", 5);
	close(f.raw2);
	f.raw2 = -1;
	for (uint64_t end = now_ms() + DEADLINE_MS; tpb_stripe_conns(f.c.st) && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	run_for(&f, 30);
	ck_assert_uint_eq(tpb_stripe_conns(f.c.st), 0);
	ck_assert_int_eq(f.c.errors, 1);
	ck_assert_int_eq(r.res.calls + e.res.calls + s.res.calls, 3);
	fx_teardown(&f);
}
END_TEST

START_TEST(test_stripe_freed_peer_fails_every_connection)
{
	uint8_t dst[100];
	struct xf r, s;
	struct fx f;

	fx_setup(&f, 4, 0);
	xf_init(&r, 60);
	xf_seg(&r, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	/* The whole side A goes away: B hears it on all four connections, reports once. */
	side_free(&f.a);
	f.a.st = NULL;
	ck_assert(run_until(&f, &f.b.errors, &r.res.calls, DEADLINE_MS));
	ck_assert_msg(strstr(f.b.why, "closed by the peer"), "why: %s", f.b.why);
	ck_assert_int_eq(r.res.status, -ECONNRESET);
	for (uint64_t end = now_ms() + DEADLINE_MS; tpb_stripe_conns(f.b.st) && now_ms() < end;)
		event_base_loop(f.base, EVLOOP_ONCE);
	run_for(&f, 30);
	ck_assert_int_eq(f.b.errors, 1);
	ck_assert_int_eq(r.res.calls, 1);
	ck_assert_uint_eq(tpb_stripe_conns(f.b.st), 0);
	xf_init(&s, 61);
	xf_seg(&s, TPB_LOC_LOCAL, dst, sizeof(dst));
	ck_assert_int_eq(tpb_stripe_send(f.b.st, &s.x), -ENOTCONN);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &s.x), -ENOTCONN);
	fx_teardown(&f);
}
END_TEST

/* ---- free ---------------------------------------------------------------------------------- */

START_TEST(test_stripe_free_completes_pending_transfers_once)
{
	enum { LEN = 64 << 20 };
	void *src = zeroed(LEN), *dst = zeroed(LEN);
	struct xf big, empty, r1, r2, stuck;
	struct fx f;

	fx_setup(&f, 4, SMALL_CHUNK);
	fx_raw(&f, SMALL_CHUNK); /* nobody reads it: a send to it cannot finish */
	xf_init(&stuck, 64);
	xf_seg(&stuck, TPB_LOC_LOCAL, src, LEN);
	ck_assert_int_eq(tpb_stripe_send(f.c.st, &stuck.x), 0);
	xf_init(&big, 60);
	xf_seg(&big, TPB_LOC_LOCAL, src, LEN);
	xf_init(&empty, 61);
	xf_init(&r1, 62); /* never sent */
	xf_seg(&r1, TPB_LOC_LOCAL, dst, LEN);
	xf_init(&r2, 63); /* empty: done queued, not yet delivered */
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r1.x), 0);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r2.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &big.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &empty.x), 0);
	side_free(&f.b);
	f.b.st = NULL;
	ck_assert_int_eq(r1.res.calls, 1);
	ck_assert_int_eq(r1.res.status, -ECONNRESET);
	ck_assert_str_eq(r1.res.why, "peer link closed");
	ck_assert_int_eq(r2.res.calls, 1);
	ck_assert_int_eq(r2.res.status, 0);
	ck_assert_int_eq(big.res.calls + empty.res.calls, 0); /* A's loop side did not run */
	side_free(&f.a);
	f.a.st = NULL;
	ck_assert_int_eq(big.res.calls, 1);
	ck_assert_msg(big.res.status == -ECONNRESET || big.res.status == 0, "status %d",
		      big.res.status); /* 0 only if all of it went out before B closed */
	ck_assert_int_eq(empty.res.calls, 1);
	ck_assert_int_eq(empty.res.status, 0);
	ck_assert_int_eq(stuck.res.calls, 0);
	side_free(&f.c);
	f.c.st = NULL;
	ck_assert_int_eq(stuck.res.calls, 1);
	ck_assert_int_eq(stuck.res.status, -ECONNRESET);
	ck_assert_uint_lt(stuck.res.bytes, LEN);
	ck_assert(r1.res.on_loop && big.res.on_loop && stuck.res.on_loop);
	run_for(&f, 30);
	ck_assert_int_eq(big.res.calls + empty.res.calls + r1.res.calls + r2.res.calls, 4);
	ck_assert_int_eq(stuck.res.calls, 1);
	/* no error callback from a freed stripe */
	ck_assert_int_eq(f.a.errors + f.b.errors + f.c.errors, 0);
	fx_teardown(&f);
	free(src);
	free(dst);
}
END_TEST

struct free_in_done {
	struct tpb_stripe_xfer x;
	struct side *side;
	int calls;
};

static void free_on_done(struct tpb_stripe_xfer *x)
{
	struct free_in_done *d = tpu_container_of(x, struct free_in_done, x);

	d->calls++;
	side_free(d->side); /* the other callback runs inside this free (then frees nothing) */
}

START_TEST(test_stripe_free_inside_a_done_callback)
{
	struct free_in_done d[2] = { 0 };
	struct fx f;

	fx_setup(&f, 2, 0);
	for (int i = 0; i < 2; i++) {
		d[i].side = &f.a;
		d[i].x.done = free_on_done;
		ck_assert_int_eq(tpb_stripe_send(f.a.st, &d[i].x), 0);
	}
	ck_assert(run_until(&f, &d[0].calls, &d[1].calls, DEADLINE_MS));
	ck_assert_ptr_null(f.a.st);
	run_for(&f, 30);
	ck_assert_int_eq(d[0].calls + d[1].calls, 2);
	fx_teardown(&f);
}
END_TEST

/* ---- limits and arguments ------------------------------------------------------------------ */

START_TEST(test_stripe_rejects_bad_calls)
{
	struct tpb_stripe_config cfg = { .chunk = TPB_STRIPE_CHUNK_MAX + 1 };
	struct tpb_stripe *st = NULL;
	char buf[4];
	struct xf t, u;
	struct fx f;
	int sp[2];

	fx_setup(&f, 0, 0);
	ck_assert_int_eq(tpb_stripe_new(&cfg, &st), -EINVAL);
	cfg = (struct tpb_stripe_config){ .send_size = TPB_STRIPE_SEND_SIZE_MIN - 1 };
	ck_assert_int_eq(tpb_stripe_new(&cfg, &st), -EINVAL);
	xf_init(&t, 1);
	xf_seg(&t, TPB_LOC_LOCAL, buf, sizeof(buf));
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &t.x), -ENOTCONN);
	ck_assert_int_eq(tpb_stripe_recv(f.a.st, &t.x), -ENOTCONN);
	for (int i = 0; i < TPB_STRIPE_CONNS_MAX; i++) {
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
		ck_assert_int_eq(tpb_stripe_add_conn(f.a.st, sp[0]), 0);
		close(sp[1]); /* the connection fails at once; it still counts */
	}
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	ck_assert_int_eq(tpb_stripe_add_conn(f.a.st, sp[0]), -E2BIG);
	ck_assert_int_eq(fcntl(sp[0], F_GETFD), -1); /* taken: closed */
	close(sp[1]);
	ck_assert(run_until(&f, &f.a.errors, NULL, DEADLINE_MS));
	fx_teardown(&f);
	fx_setup(&f, 1, 0);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &t.x), 0);
	xf_init(&u, 1);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &u.x), -EEXIST);
	xf_init(&u, 0);
	xf_seg(&u, TPB_LOC_LOCAL, buf, 1);
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &u.x), -EINVAL);
	fx_teardown(&f);
	ck_assert_int_eq(t.res.calls, 1);
	ck_assert_int_eq(t.res.status, -ECONNRESET);
	ck_assert_int_eq(u.res.calls, 0);
}
END_TEST

START_TEST(test_stripe_threads_are_named)
{
	char cmd[128];
	struct fx f;

	fx_setup(&f, 4, 0);
	snprintf(cmd, sizeof(cmd), "grep -qx tpd-rx3 /proc/%d/task/*/comm", getpid());
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "grep -qx tpd-tx0 /proc/%d/task/*/comm", getpid());
	ck_assert_int_eq(system(cmd), 0);
	fx_teardown(&f);
}
END_TEST

/* ---- throughput (information only) -------------------------------------------------------- */

START_TEST(test_stripe_throughput_info)
{
	static const unsigned conns[] = { 1, 4 };
	size_t len = 256u << 20;
	uint8_t *src, *dst;
	uint64_t t0, ns;
	struct xf s, r;
	struct fx f;

	if (getenv("TPT_STRIPE_NO_PERF"))
		return; /* for slow runs (valgrind) */
	src = malloc(len);
	dst = malloc(len);
	ck_assert(src && dst);
	memset(src, 0x5a, len); /* fault every page in before timing */
	memset(dst, 0, len);
	fx_setup(&f, conns[_i], 0);
	xf_init(&s, 90);
	xf_init(&r, 90);
	xf_seg(&s, TPB_LOC_LOCAL, src, len);
	xf_seg(&r, TPB_LOC_LOCAL, dst, len);
	t0 = tpu_now_ns();
	ck_assert_int_eq(tpb_stripe_recv(f.b.st, &r.x), 0);
	ck_assert_int_eq(tpb_stripe_send(f.a.st, &s.x), 0);
	ck_assert(run_until(&f, &s.res.calls, &r.res.calls, 60000));
	ns = tpu_now_ns() - t0;
	check_ok(&r.res, len);
	ck_assert(dst[0] == 0x5a && dst[len - 1] == 0x5a);
	printf("stripe throughput: %zu MiB A->B over %u connection(s), 127.0.0.1: %.2f GB/s\n",
	       len >> 20, conns[_i], (double)len / (double)ns);
	fflush(stdout);
	fx_teardown(&f);
	free(src);
	free(dst);
}
END_TEST

static Suite *stripe_suite(void)
{
	Suite *s = suite_create("stripe");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_stripe_every_size_arrives_intact, 0, 2 * N_SIZES);
	tcase_add_loop_test(tc, test_stripe_segments_with_empty_ones_arrive_intact, 0, 2);
	tcase_add_loop_test(tc, test_stripe_both_directions_at_once, 0, 2);
	tcase_add_test(tc, test_stripe_process_source_and_destination);
	tcase_add_loop_test(tc, test_stripe_small_socket_writes_arrive_intact, 0, 2);
	tcase_add_test(tc, test_stripe_unknown_transfer_is_drained);
	tcase_add_test(tc, test_stripe_empty_transfers_complete_later_on_the_loop);
	tcase_add_test(tc, test_stripe_completes_and_reports_only_from_progress);
	tcase_add_test(tc, test_stripe_unreadable_source_stops_the_send);
	tcase_add_test(tc, test_stripe_source_of_a_dead_process_fails_with_esrch);
	tcase_add_test(tc, test_stripe_unwritable_destination_fails_after_draining);
	tcase_add_test(tc, test_stripe_send_cancel_mid_transfer);
	tcase_add_test(tc, test_stripe_send_cancel_never_sends_half_a_chunk);
	tcase_add_test(tc, test_stripe_small_send_does_not_wait_behind_a_large_one);
	tcase_add_test(tc, test_stripe_recv_cancel_drops_later_chunks);
	tcase_add_loop_test(tc, test_stripe_bad_chunk_fails_only_that_stripe, 0,
			    sizeof(bads) / sizeof(bads[0]));
	tcase_add_loop_test(tc, test_stripe_overlapping_chunk_fails_the_stripe, 0,
			    (int)(sizeof(overlaps) / sizeof(overlaps[0])));
	tcase_add_test(tc, test_stripe_touching_chunks_in_any_order_complete);
	tcase_add_loop_test(tc, test_stripe_early_end_says_whether_the_prefix_came, 0, 2);
	tcase_add_loop_test(tc, test_stripe_pieces_are_bounded, 0, 2);
	tcase_add_test(tc, test_stripe_stalled_in_a_chunk_ends_the_transfer);
	tcase_add_test(tc, test_stripe_chunk_header_is_the_documented_wire_format);
	tcase_add_test(tc, test_stripe_small_socket_writes_keep_the_wire_format);
	tcase_add_test(tc, test_stripe_peer_close_reports_error_once);
	tcase_add_test(tc, test_stripe_freed_peer_fails_every_connection);
	tcase_add_test(tc, test_stripe_free_completes_pending_transfers_once);
	tcase_add_test(tc, test_stripe_free_inside_a_done_callback);
	tcase_add_test(tc, test_stripe_rejects_bad_calls);
	tcase_add_test(tc, test_stripe_threads_are_named);
	tcase_add_loop_test(tc, test_stripe_throughput_info, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(stripe_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
