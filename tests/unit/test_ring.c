/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of tpu_ring and tpu_spin (common/ring.c): the byte rings wrap around byte for byte,
 * carry a message larger than themselves between two threads, honour iovecs and skip, refuse
 * impossible positions written by a hostile peer (-EPROTO) without touching memory outside
 * their data area, and attach only to a sealed memfd of the announced size. Under threads, the
 * sleeping flag + doorbell handshake loses no wake-up over 200k messages, and a producer
 * blocked on a full ring is woken through the futex. tpu_spin halves its budget after long
 * sleeps (down to max/16) and restores it when a partner answers while or just after spinning.
 * Nothing asserts speed: waits have generous deadlines that only catch a lost wake-up.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "ring.h"
#include "tpu.h"

#define SMALL TPU_RING_MIN
#define LOST_MS 10000 /* a wait this long means a lost wake-up, never a slow machine */

/* Both sides' endpoints on one mapping, as the client and the daemon see it. */
struct pair {
	int fd;
	void *map;
	uint32_t size;
	struct tpu_ring c_tx, c_rx; /* client: produces c2d, consumes d2c */
	struct tpu_ring d_tx, d_rx; /* daemon: produces d2c, consumes c2d */
};

static void pair_new(struct pair *p, uint32_t size)
{
	memset(p, 0, sizeof(*p));
	ck_assert_int_eq(tpu_ring_create(size, &p->fd, &p->map), 0);
	p->size = size;
	tpu_ring_init(p->map, size, true, &p->c_tx, &p->c_rx);
	tpu_ring_init(p->map, size, false, &p->d_tx, &p->d_rx);
}

static void pair_free(struct pair *p)
{
	munmap(p->map, tpu_ring_map_size(p->size));
	close(p->fd);
}

static struct tpu_ring_shm *shm_of(struct pair *p)
{
	return p->map;
}

/* The byte at stream position @pos. */
static uint8_t pat(uint64_t pos)
{
	return (uint8_t)((pos * 0x9e3779b97f4a7c15ull) >> 56);
}

static void pat_fill(uint8_t *buf, size_t len, uint64_t pos)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pat(pos + i);
}

/* Offset of the first byte differing from the pattern, or @len. */
static size_t pat_check(const uint8_t *buf, size_t len, uint64_t pos)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pat(pos + i))
			return i;
	return len;
}

/* xorshift64: deterministic pseudo-random sequence. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static ssize_t put1(struct tpu_ring *r, const void *buf, size_t len)
{
	struct iovec iov = { (void *)buf, len };

	return tpu_ring_put(r, &iov, 1, 0);
}

/* ---- sizes, creation, views ------------------------------------------------------------------ */

START_TEST(test_ring_size_ok_accepts_powers_of_two_in_range)
{
	ck_assert(tpu_ring_size_ok(TPU_RING_MIN));
	ck_assert(tpu_ring_size_ok(TPU_RING_DEFAULT));
	ck_assert(tpu_ring_size_ok(TPU_RING_MAX));
	ck_assert(!tpu_ring_size_ok(0));
	ck_assert(!tpu_ring_size_ok(TPU_RING_MIN / 2));
	ck_assert(!tpu_ring_size_ok(TPU_RING_MIN - 1));
	ck_assert(!tpu_ring_size_ok(TPU_RING_MIN + 1));
	ck_assert(!tpu_ring_size_ok(3 * TPU_RING_MIN));
	ck_assert(!tpu_ring_size_ok((uint64_t)TPU_RING_MAX * 2));
	ck_assert(!tpu_ring_size_ok(TPU_RING_MAX + 1ull));
	ck_assert(!tpu_ring_size_ok(UINT64_MAX));
	ck_assert(!tpu_ring_size_ok(1ull << 63));
}
END_TEST

START_TEST(test_ring_create_seals_and_formats)
{
	struct pair p;
	struct tpu_ring_shm *h;
	int fd = -1, seals;
	void *map = NULL;

	pair_new(&p, SMALL);
	h = shm_of(&p);
	ck_assert_uint_eq(h->magic, TPU_RING_MAGIC);
	ck_assert_uint_eq(h->version, TPU_RING_VERSION);
	ck_assert_uint_eq(h->size, SMALL);
	seals = fcntl(p.fd, F_GET_SEALS);
	ck_assert_int_ge(seals, 0);
	ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	ck_assert_int_ne(fcntl(p.fd, F_GETFD) & FD_CLOEXEC, 0);
	ck_assert_int_eq(lseek(p.fd, 0, SEEK_END), (off_t)tpu_ring_map_size(SMALL));
	ck_assert_int_lt(ftruncate(p.fd, 4096), 0);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_lt(ftruncate(p.fd, (off_t)tpu_ring_map_size(SMALL) * 2), 0);
	/* every position and flag starts at zero */
	ck_assert_uint_eq(h->c2d.head | h->c2d.tail | h->d2c.head | h->d2c.tail, 0);
	ck_assert_uint_eq(h->c2d.sleeping | h->c2d.waiting | h->d2c.sleeping | h->d2c.waiting, 0);
	pair_free(&p);

	ck_assert_int_eq(tpu_ring_create(SMALL - 1, &fd, &map), -EINVAL);
	ck_assert_int_eq(tpu_ring_create(3 * SMALL, &fd, &map), -EINVAL);
	ck_assert_int_eq(tpu_ring_create(TPU_RING_MAX * 2u, &fd, &map), -EINVAL);
	ck_assert_int_eq(fd, -1); /* untouched on failure */
	ck_assert_ptr_null(map);
}
END_TEST

START_TEST(test_ring_init_views_share_the_mapping)
{
	struct pair p;
	struct tpu_ring_shm *h;
	uint8_t *base;

	pair_new(&p, SMALL);
	h = shm_of(&p);
	base = p.map;
	ck_assert_ptr_eq(p.c_tx.ctl, &h->c2d);
	ck_assert_ptr_eq(p.d_rx.ctl, &h->c2d);
	ck_assert_ptr_eq(p.d_tx.ctl, &h->d2c);
	ck_assert_ptr_eq(p.c_rx.ctl, &h->d2c);
	ck_assert_ptr_eq(p.c_tx.data, base + TPU_RING_HDR);
	ck_assert_ptr_eq(p.d_rx.data, base + TPU_RING_HDR);
	ck_assert_ptr_eq(p.d_tx.data, base + TPU_RING_HDR + SMALL);
	ck_assert_ptr_eq(p.c_rx.data, base + TPU_RING_HDR + SMALL);
	ck_assert(p.c_tx.producer && p.d_tx.producer);
	ck_assert(!p.c_rx.producer && !p.d_rx.producer);
	ck_assert_uint_eq(p.c_tx.size, SMALL);
	/* the producer and consumer fields live on separate cache lines */
	ck_assert_uint_ge((uintptr_t)&h->c2d.tail - (uintptr_t)&h->c2d.head, 64);
	ck_assert_uint_eq(tpu_ring_map_size(SMALL), TPU_RING_HDR + 2u * SMALL);
	pair_free(&p);
}
END_TEST

/* ---- data path ------------------------------------------------------------------------------- */

/* One random put of up to @max bytes, split over three iovecs. Return: bytes published. */
static size_t wrap_put(struct pair *p, uint64_t *seed, uint8_t *src, size_t max)
{
	size_t len = 1 + rnd(seed) % max, a = rnd(seed) % (len + 1);
	size_t b = a + rnd(seed) % (len - a + 1);
	struct iovec iov[3] = { { src, a }, { src + a, b - a }, { src + b, len - b } };
	ssize_t room = tpu_ring_space(&p->c_tx), k;

	pat_fill(src, len, p->c_tx.pos);
	k = tpu_ring_put(&p->c_tx, iov, 3, 0);
	ck_assert_int_ge(k, 0);
	ck_assert_int_eq(k, TPU_MIN((ssize_t)len, room));
	return (size_t)k;
}

START_TEST(test_ring_wraps_byte_for_byte)
{
	const size_t max = 3 * SMALL / 2;
	uint8_t *src = malloc(max), *dst = malloc(max);
	uint64_t seed = 0x1234567, moved = 0;
	struct pair p;

	pair_new(&p, SMALL);
	while (moved < 64ull * SMALL) {
		uint64_t at = p.d_rx.pos;
		ssize_t k;

		if (rnd(&seed) % 2) {
			wrap_put(&p, &seed, src, max);
		} else {
			k = tpu_ring_get(&p.d_rx, dst, 1 + rnd(&seed) % max);
			ck_assert_int_ge(k, 0);
			ck_assert_uint_eq(pat_check(dst, (size_t)k, at), (size_t)k);
			moved += (uint64_t)k;
		}
		ck_assert_int_eq(tpu_ring_avail(&p.d_rx), (ssize_t)(p.c_tx.pos - p.d_rx.pos));
		ck_assert_int_eq(tpu_ring_avail(&p.d_rx) + tpu_ring_space(&p.c_tx), SMALL);
		ck_assert_uint_eq(shm_of(&p)->c2d.head, p.c_tx.pos);
		ck_assert_uint_eq(shm_of(&p)->c2d.tail, p.d_rx.pos);
	}
	/* drain: what is left is still in order */
	while (tpu_ring_avail(&p.d_rx) > 0) {
		uint64_t at = p.d_rx.pos;
		ssize_t k = tpu_ring_get(&p.d_rx, dst, 100);
		ck_assert_uint_eq(pat_check(dst, (size_t)k, at), (size_t)k);
	}
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, dst, max), 0);
	ck_assert_uint_gt(p.c_tx.pos, 60ull * SMALL); /* wrapped many times */
	pair_free(&p);
	free(src);
	free(dst);
}
END_TEST

/* One direction streamed between a producer and a consumer thread. */
struct stream {
	struct tpu_ring *tx, *rx;
	uint8_t *src, *dst;
	size_t len;
	uint64_t seed;
	unsigned futex_waits;
	int err;
};

static void *stream_producer(void *arg)
{
	struct stream *s = arg;
	size_t cut[3] = { 1, 4093, s->len / 3 }, done = 0;
	struct iovec iov[5];

	/* five pieces of odd sizes, one of them empty */
	iov[0] = (struct iovec){ s->src, cut[0] };
	iov[1] = (struct iovec){ s->src + cut[0], 0 };
	iov[2] = (struct iovec){ s->src + cut[0], cut[1] - cut[0] };
	iov[3] = (struct iovec){ s->src + cut[1], cut[2] - cut[1] };
	iov[4] = (struct iovec){ s->src + cut[2], s->len - cut[2] };
	while (done < s->len) {
		ssize_t k = tpu_ring_put(s->tx, iov, 5, done);
		uint32_t seq;

		if (k < 0) {
			s->err = (int)k;
			return NULL;
		}
		done += (size_t)k;
		if (k == 0 && !tpu_ring_wait_space_prepare(s->tx, &seq)) {
			s->futex_waits++;
			tpu_ring_futex_wait(s->tx, seq, 100);
		}
	}
	return NULL;
}

static void *stream_consumer(void *arg)
{
	struct stream *s = arg;
	size_t got = 0;

	while (got < s->len) {
		size_t want = TPU_MIN(1 + rnd(&s->seed) % (2 * SMALL), s->len - got);
		ssize_t k = tpu_ring_get(s->rx, s->dst + got, want);

		if (k < 0) {
			s->err = (int)k;
			return NULL;
		}
		got += (size_t)k;
		tpu_ring_producer_waiting(s->rx);
		if (k == 0)
			tpu_spin_pause();
	}
	return NULL;
}

START_TEST(test_ring_streams_message_larger_than_ring)
{
	const size_t len = (4u << 20) + 3;
	struct stream s[2] = {
		{ .len = len, .seed = 11 },
		{ .len = len, .seed = 12 },
	};
	pthread_t t[4];
	struct pair p;

	pair_new(&p, SMALL);
	s[0].tx = &p.c_tx;
	s[0].rx = &p.d_rx;
	s[1].tx = &p.d_tx;
	s[1].rx = &p.c_rx;
	for (int i = 0; i < 2; i++) {
		s[i].src = malloc(len);
		s[i].dst = malloc(len);
		ck_assert(s[i].src && s[i].dst);
		pat_fill(s[i].src, len, (uint64_t)i << 40);
		memset(s[i].dst, 0, len);
	}
	/* both directions at once: they must not disturb each other */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(pthread_create(&t[2 * i], NULL, stream_producer, &s[i]), 0);
		ck_assert_int_eq(pthread_create(&t[2 * i + 1], NULL, stream_consumer, &s[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(s[i].err, 0);
		ck_assert_uint_eq(pat_check(s[i].dst, len, (uint64_t)i << 40), len);
		free(s[i].src);
		free(s[i].dst);
	}
	ck_assert_uint_eq(p.c_tx.pos, len);
	ck_assert_uint_eq(p.d_tx.pos, len);
	printf("streamed 2 x %zu bytes through %u-byte rings, %u + %u futex waits\n", len, SMALL,
	       s[0].futex_waits, s[1].futex_waits);
	pair_free(&p);
}
END_TEST

START_TEST(test_ring_put_iov_with_skip)
{
	char a[] = "0123", b[] = "abcdefg", c[] = "XYZ";
	struct iovec iov[4] = { { a, 4 }, { NULL, 0 }, { b, 7 }, { c, 3 } };
	const char *all = "0123abcdefgXYZ";
	char out[32];
	struct pair p;

	pair_new(&p, SMALL);
	for (size_t skip = 0; skip <= 14; skip++) {
		ssize_t k = tpu_ring_put(&p.c_tx, iov, 4, skip);

		ck_assert_int_eq(k, (ssize_t)(14 - skip));
		memset(out, 0, sizeof(out));
		ck_assert_int_eq(tpu_ring_get(&p.d_rx, out, sizeof(out)), k);
		ck_assert_msg(memcmp(out, all + skip, (size_t)k) == 0, "skip %zu: got '%s'", skip,
			      out);
	}
	/* a skip beyond the end publishes nothing */
	ck_assert_int_eq(tpu_ring_put(&p.c_tx, iov, 4, 100), 0);
	ck_assert_int_eq(tpu_ring_put(&p.c_tx, iov, 0, 0), 0);
	ck_assert_int_eq(tpu_ring_avail(&p.d_rx), 0);
	ck_assert_uint_eq(shm_of(&p)->c2d.head, p.c_tx.pos);
	pair_free(&p);
}
END_TEST

START_TEST(test_ring_look_span_release_in_place_across_the_wrap)
{
	uint8_t *src = malloc(SMALL), buf[64];
	const uint8_t *at;
	uint64_t pos = 0;
	struct pair p;

	pair_new(&p, SMALL);
	pat_fill(src, SMALL, 0);
	/* move both positions to 100 bytes before the end of the data area */
	for (size_t left = SMALL - 100; left;) {
		size_t n = TPU_MIN(left, (size_t)SMALL / 2);

		ck_assert_int_eq(put1(&p.c_tx, src, n), (ssize_t)n);
		ck_assert_int_eq(tpu_ring_get(&p.d_rx, src, n), (ssize_t)n);
		left -= n;
		pos += n;
	}
	pat_fill(src, SMALL, pos);
	ck_assert_int_eq(put1(&p.c_tx, src, 300), 300);
	/* a look copies across the wrap and releases nothing */
	tpu_ring_look(&p.d_rx, 60, buf, sizeof(buf));
	ck_assert_uint_eq(pat_check(buf, sizeof(buf), pos + 60), sizeof(buf));
	ck_assert_int_eq(tpu_ring_avail(&p.d_rx), 300);
	ck_assert_int_eq(tpu_ring_space(&p.c_tx), SMALL - 300);
	/* a span is where the bytes lie, and none for bytes that wrap */
	at = tpu_ring_span(&p.d_rx, 10, 90);
	ck_assert_ptr_nonnull(at);
	ck_assert_uint_eq(pat_check(at, 90, pos + 10), 90);
	ck_assert_ptr_null(tpu_ring_span(&p.d_rx, 10, 91));
	at = tpu_ring_span(&p.d_rx, 100, 200);
	ck_assert_ptr_nonnull(at);
	ck_assert_uint_eq(pat_check(at, 200, pos + 100), 200);
	/* a release gives the room back and moves the consumer on without copying */
	tpu_ring_release(&p.d_rx, 120);
	ck_assert_int_eq(tpu_ring_avail(&p.d_rx), 180);
	ck_assert_int_eq(tpu_ring_space(&p.c_tx), SMALL - 180);
	ck_assert_uint_eq(shm_of(&p)->c2d.tail, pos + 120);
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, buf, 16), 16);
	ck_assert_uint_eq(pat_check(buf, 16, pos + 120), 16);
	pair_free(&p);
	free(src);
}
END_TEST

START_TEST(test_ring_put_is_partial_when_space_is_short)
{
	uint8_t *src = malloc(2 * SMALL), *dst = malloc(2 * SMALL);
	struct iovec iov[2] = { { src, 100 }, { src + 100, 2 * SMALL - 100 } };
	struct pair p;
	size_t done;
	ssize_t k;

	pair_new(&p, SMALL);
	pat_fill(src, 2 * SMALL, 0);
	ck_assert_int_eq(put1(&p.c_tx, src, 10), 10);
	ck_assert_int_eq(tpu_ring_space(&p.c_tx), SMALL - 10);
	/* @skip 10: the stream goes on where the first put stopped */
	k = tpu_ring_put(&p.c_tx, iov, 2, 10);
	ck_assert_int_eq(k, SMALL - 10);
	done = 10 + (size_t)k;
	ck_assert_int_eq(tpu_ring_space(&p.c_tx), 0);
	ck_assert_int_eq(tpu_ring_put(&p.c_tx, iov, 2, done), 0); /* full */
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, dst, 1000), 1000);
	k = tpu_ring_put(&p.c_tx, iov, 2, done);
	ck_assert_int_eq(k, 1000);
	done += (size_t)k;
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, dst + 1000, 2 * SMALL), SMALL);
	ck_assert_uint_eq(pat_check(dst, done, 0), done);
	pair_free(&p);
	free(src);
	free(dst);
}
END_TEST

START_TEST(test_ring_peek_hints_readable_bytes)
{
	struct pair p;
	uint8_t buf[64] = { 0 };

	pair_new(&p, SMALL);
	ck_assert_uint_eq(tpu_ring_peek(&p.d_rx), 0);
	ck_assert_int_eq(put1(&p.c_tx, buf, 40), 40);
	ck_assert_uint_eq(tpu_ring_peek(&p.d_rx), 40);
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, buf, 15), 15);
	ck_assert_uint_eq(tpu_ring_peek(&p.d_rx), 25);
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, buf, sizeof(buf)), 25);
	ck_assert_uint_eq(tpu_ring_peek(&p.d_rx), 0);
	/* only a hint: an impossible head shows as "something", and get refuses it */
	shm_of(&p)->c2d.head = p.d_rx.pos - 1;
	ck_assert_uint_ne(tpu_ring_peek(&p.d_rx), 0);
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, buf, sizeof(buf)), -EPROTO);
	pair_free(&p);
}
END_TEST

/* ---- hostile positions ---------------------------------------------------------------------- */

/*
 * A mapping laid out like a ring memfd, with a PROT_NONE page right after the d2c data and a
 * canary in the unused part of the header page: a ring that reads or writes outside its data
 * area faults or changes a canary.
 */
struct guarded {
	uint8_t *base;
	size_t len;
	struct tpu_ring c_tx, c_rx, d_tx, d_rx;
};

static void guarded_new(struct guarded *g)
{
	size_t map = tpu_ring_map_size(SMALL);

	g->len = map + 4096;
	g->base = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(g->base, MAP_FAILED);
	ck_assert_int_eq(mprotect(g->base + map, 4096, PROT_NONE), 0);
	memset(g->base + sizeof(struct tpu_ring_shm), 0xa5,
	       TPU_RING_HDR - sizeof(struct tpu_ring_shm));
	tpu_ring_format(g->base, SMALL);
	tpu_ring_init(g->base, SMALL, true, &g->c_tx, &g->c_rx);
	tpu_ring_init(g->base, SMALL, false, &g->d_tx, &g->d_rx);
}

static void guarded_check_canary(const struct guarded *g)
{
	for (size_t i = sizeof(struct tpu_ring_shm); i < TPU_RING_HDR; i++)
		ck_assert_msg(g->base[i] == 0xa5, "header byte %zu changed", i);
}

START_TEST(test_ring_consumer_rejects_head_behind_its_position)
{
	struct guarded g;
	uint8_t buf[SMALL], src[SMALL];

	guarded_new(&g);
	memset(src, 7, sizeof(src));
	ck_assert_int_eq(put1(&g.c_tx, src, 3000), 3000);
	ck_assert_int_eq(tpu_ring_get(&g.d_rx, buf, 2000), 2000);
	memset(buf, 0x5a, sizeof(buf));
	g.d_rx.ctl->head = g.d_rx.pos - 1; /* the client "takes back" published bytes */
	ck_assert_int_eq(tpu_ring_avail(&g.d_rx), -EPROTO);
	ck_assert_int_eq(tpu_ring_get(&g.d_rx, buf, sizeof(buf)), -EPROTO);
	ck_assert_uint_eq(g.d_rx.pos, 2000);	      /* our position did not move */
	ck_assert_uint_eq(g.d_rx.ctl->tail, 2000); /* nor did the published one */
	for (size_t i = 0; i < sizeof(buf); i++)
		ck_assert_uint_eq(buf[i], 0x5a);
	g.d_rx.ctl->head = 0;
	ck_assert_int_eq(tpu_ring_get(&g.d_rx, buf, sizeof(buf)), -EPROTO);
	g.d_rx.ctl->head = g.d_rx.pos; /* exactly at our position: empty, fine */
	ck_assert_int_eq(tpu_ring_avail(&g.d_rx), 0);
	ck_assert_int_eq(tpu_ring_get(&g.d_rx, buf, sizeof(buf)), 0);
	guarded_check_canary(&g);
	munmap(g.base, g.len);
}
END_TEST

START_TEST(test_ring_consumer_rejects_head_more_than_size_ahead)
{
	struct guarded g;
	uint8_t buf[SMALL + 64];

	guarded_new(&g);
	g.d_rx.pos = g.c_rx.pos = 5 * SMALL + 123; /* somewhere after some wraps */
	g.d_rx.ctl->tail = g.d_rx.pos;
	g.c_rx.ctl->tail = g.c_rx.pos;
	for (int dir = 0; dir < 2; dir++) {
		struct tpu_ring *rx = dir ? &g.c_rx : &g.d_rx; /* d2c data ends at the guard */
		uint64_t pos = rx->pos;

		rx->ctl->head = pos + SMALL + 1;
		ck_assert_int_eq(tpu_ring_avail(rx), -EPROTO);
		ck_assert_int_eq(tpu_ring_get(rx, buf, sizeof(buf)), -EPROTO);
		rx->ctl->head = UINT64_MAX;
		ck_assert_int_eq(tpu_ring_get(rx, buf, sizeof(buf)), -EPROTO);
		rx->ctl->head = pos + (1ull << 63);
		ck_assert_int_eq(tpu_ring_get(rx, buf, sizeof(buf)), -EPROTO);
		ck_assert_uint_eq(rx->pos, pos);
		/* exactly one ring ahead is a full ring: readable, and only inside the area */
		rx->ctl->head = pos + SMALL;
		ck_assert_int_eq(tpu_ring_avail(rx), SMALL);
		ck_assert_int_eq(tpu_ring_get(rx, buf, sizeof(buf)), SMALL);
		ck_assert_uint_eq(rx->pos, pos + SMALL);
	}
	guarded_check_canary(&g);
	munmap(g.base, g.len);
}
END_TEST

/* Fills both data areas with @v. */
static void guarded_fill(struct guarded *g, uint8_t v)
{
	memset(g->base + TPU_RING_HDR, v, 2 * SMALL);
}

static void guarded_check_data(const struct guarded *g, uint8_t v)
{
	for (size_t i = 0; i < 2 * SMALL; i++)
		ck_assert_msg(g->base[TPU_RING_HDR + i] == v, "data byte %zu changed", i);
}

START_TEST(test_ring_producer_rejects_tail_ahead_of_head)
{
	struct guarded g;
	uint8_t src[SMALL];

	guarded_new(&g);
	memset(src, 1, sizeof(src));
	ck_assert_int_eq(put1(&g.d_tx, src, 100), 100);
	guarded_fill(&g, 0x3c);
	g.d_tx.ctl->tail = g.d_tx.pos + 1; /* the client "consumed" bytes never published */
	ck_assert_int_eq(tpu_ring_space(&g.d_tx), -EPROTO);
	ck_assert_int_eq(put1(&g.d_tx, src, sizeof(src)), -EPROTO);
	g.d_tx.ctl->tail = UINT64_MAX;
	ck_assert_int_eq(put1(&g.d_tx, src, 1), -EPROTO);
	ck_assert_uint_eq(g.d_tx.pos, 100);	      /* nothing was published */
	ck_assert_uint_eq(g.d_tx.ctl->head, 100);
	guarded_check_data(&g, 0x3c);
	g.d_tx.ctl->tail = 100; /* caught up exactly: empty ring */
	ck_assert_int_eq(tpu_ring_space(&g.d_tx), SMALL);
	guarded_check_canary(&g);
	munmap(g.base, g.len);
}
END_TEST

START_TEST(test_ring_producer_rejects_tail_more_than_size_behind)
{
	struct guarded g;
	uint8_t src[SMALL + 64];
	struct iovec iov = { src, sizeof(src) };

	guarded_new(&g);
	memset(src, 2, sizeof(src));
	for (int dir = 0; dir < 2; dir++) {
		struct tpu_ring *tx = dir ? &g.d_tx : &g.c_tx;
		uint64_t pos = 7 * SMALL + 11;

		tx->pos = pos;
		tx->ctl->head = pos;
		guarded_fill(&g, 0xc3);
		tx->ctl->tail = pos - SMALL - 1;
		ck_assert_int_eq(tpu_ring_space(tx), -EPROTO);
		ck_assert_int_eq(tpu_ring_put(tx, &iov, 1, 0), -EPROTO);
		tx->ctl->tail = 0;
		ck_assert_int_eq(tpu_ring_put(tx, &iov, 1, 0), -EPROTO);
		ck_assert_uint_eq(tx->pos, pos);
		guarded_check_data(&g, 0xc3);
		/* exactly one ring behind: full, nothing written */
		tx->ctl->tail = pos - SMALL;
		ck_assert_int_eq(tpu_ring_space(tx), 0);
		ck_assert_int_eq(tpu_ring_put(tx, &iov, 1, 0), 0);
		guarded_check_data(&g, 0xc3);
		/* one byte freed: one byte written, at the right place */
		tx->ctl->tail = pos - SMALL + 1;
		ck_assert_int_eq(tpu_ring_put(tx, &iov, 1, 0), 1);
		ck_assert_uint_eq(tx->ctl->head, pos + 1);
	}
	guarded_check_canary(&g);
	munmap(g.base, g.len);
}
END_TEST

/* Random positions on both sides: every call returns -EPROTO or a count within the ring. */
START_TEST(test_ring_random_positions_stay_in_bounds)
{
	static uint8_t src[2 * SMALL], dst[2 * SMALL];
	struct iovec iov = { src, sizeof(src) };
	uint64_t seed = 0xfeedbeef;
	struct guarded g;

	guarded_new(&g);
	for (int i = 0; i < 200000; i++) {
		struct tpu_ring *tx = i % 2 ? &g.d_tx : &g.c_tx, *rx = i % 2 ? &g.c_rx : &g.d_rx;
		uint64_t pos = rnd(&seed), near = pos + (rnd(&seed) % (4 * SMALL)) - 2 * SMALL;
		uint64_t other = rnd(&seed) % 3 == 0 ? rnd(&seed) : near;
		ssize_t k;

		rx->pos = pos;
		rx->ctl->head = other;
		k = tpu_ring_get(rx, dst, 1 + rnd(&seed) % sizeof(dst));
		if (other < pos || other - pos > SMALL)
			ck_assert_int_eq(k, -EPROTO);
		else
			ck_assert(k >= 0 && (uint64_t)k <= other - pos);
		tx->pos = pos;
		tx->ctl->head = pos;
		tx->ctl->tail = other;
		k = tpu_ring_put(tx, &iov, 1, rnd(&seed) % sizeof(src));
		if (other > pos || pos - other > SMALL)
			ck_assert_int_eq(k, -EPROTO);
		else
			ck_assert(k >= 0 && (uint64_t)k <= SMALL - (pos - other));
	}
	guarded_check_canary(&g);
	munmap(g.base, g.len);
}
END_TEST

/* ---- attaching ------------------------------------------------------------------------------- */

/* A memfd of @len bytes with @seals added (0: none; -1: sealing not allowed). */
static int memfd_of(size_t len, int seals)
{
	int fd = memfd_create("tpt-ring", MFD_CLOEXEC | (seals < 0 ? 0 : MFD_ALLOW_SEALING));

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	if (seals > 0)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

START_TEST(test_ring_attach_maps_a_created_ring)
{
	struct tpu_ring d_tx, d_rx;
	struct pair p;
	void *map = NULL;
	char buf[8] = "";

	pair_new(&p, SMALL);
	ck_assert_int_eq(tpu_ring_attach(p.fd, SMALL, &map), 0);
	ck_assert_ptr_nonnull(map);
	ck_assert_ptr_ne(map, p.map);
	tpu_ring_init(map, SMALL, false, &d_tx, &d_rx);
	ck_assert_int_eq(put1(&p.c_tx, "hello", 5), 5);
	ck_assert_int_eq(tpu_ring_get(&d_rx, buf, sizeof(buf)), 5);
	ck_assert_str_eq(buf, "hello");
	ck_assert_int_eq(put1(&d_tx, "back", 4), 4);
	memset(buf, 0, sizeof(buf));
	ck_assert_int_eq(tpu_ring_get(&p.c_rx, buf, sizeof(buf)), 4);
	ck_assert_str_eq(buf, "back");
	munmap(map, tpu_ring_map_size(SMALL));
	pair_free(&p);
}
END_TEST

START_TEST(test_ring_attach_refuses_unsealed_memfd)
{
	size_t len = tpu_ring_map_size(SMALL);
	int fds[3] = { memfd_of(len, 0), memfd_of(len, -1), memfd_of(len, F_SEAL_GROW) };
	void *map = NULL;

	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(tpu_ring_attach(fds[i], SMALL, &map), -EPERM);
		ck_assert_ptr_null(map);
		close(fds[i]);
	}
}
END_TEST

START_TEST(test_ring_attach_refuses_wrong_size)
{
	size_t len = tpu_ring_map_size(SMALL);
	int fds[4] = { memfd_of(len - 1, F_SEAL_SHRINK), memfd_of(len + 1, F_SEAL_SHRINK),
		       memfd_of(tpu_ring_map_size(2 * SMALL), F_SEAL_SHRINK),
		       memfd_of(0, F_SEAL_SHRINK) };
	void *map = NULL;

	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(tpu_ring_attach(fds[i], SMALL, &map), -EBADF);
		ck_assert_ptr_null(map);
		close(fds[i]);
	}
	/* and the right size with the right seal is taken */
	fds[0] = memfd_of(len, F_SEAL_SHRINK);
	ck_assert_int_eq(tpu_ring_attach(fds[0], SMALL, &map), 0);
	munmap(map, len);
	close(fds[0]);
}
END_TEST

START_TEST(test_ring_attach_refuses_non_memfd)
{
	int pfd[2], null = open("/dev/null", O_RDWR | O_CLOEXEC), ev = eventfd(0, EFD_CLOEXEC);
	void *map = NULL;

	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	ck_assert_int_ge(null, 0);
	ck_assert_int_eq(tpu_ring_attach(pfd[0], SMALL, &map), -EBADF);
	ck_assert_int_eq(tpu_ring_attach(pfd[1], SMALL, &map), -EBADF);
	ck_assert_int_eq(tpu_ring_attach(null, SMALL, &map), -EBADF);
	ck_assert_int_eq(tpu_ring_attach(ev, SMALL, &map), -EBADF);
	ck_assert_int_eq(tpu_ring_attach(-1, SMALL, &map), -EBADF);
	ck_assert_ptr_null(map);
	close(pfd[0]);
	close(pfd[1]);
	close(null);
	close(ev);
}
END_TEST

START_TEST(test_ring_attach_refuses_bad_size)
{
	static const uint32_t bad[] = { 0, 1, SMALL - 1, SMALL / 2, SMALL + 1, 3 * SMALL / 2,
					TPU_RING_MAX * 2u, UINT32_MAX };
	struct pair p;
	void *map = NULL;

	pair_new(&p, SMALL);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(bad); i++)
		ck_assert_int_eq(tpu_ring_attach(p.fd, bad[i], &map), -EINVAL);
	ck_assert_ptr_null(map);
	pair_free(&p);
}
END_TEST

/* ---- sleeping and waking --------------------------------------------------------------------- */

START_TEST(test_ring_sleep_flag_handshake)
{
	struct pair p;
	uint8_t b = 1;

	pair_new(&p, SMALL);
	/* nothing readable: the flag stays set, and one producer sees it once */
	ck_assert(!tpu_ring_sleep_prepare(&p.d_rx));
	ck_assert_uint_eq(shm_of(&p)->c2d.sleeping, 1);
	ck_assert(!tpu_ring_consumer_asleep(&p.d_tx)); /* the other direction is awake */
	ck_assert_int_eq(put1(&p.c_tx, &b, 1), 1);
	ck_assert(tpu_ring_consumer_asleep(&p.c_tx));
	ck_assert_uint_eq(shm_of(&p)->c2d.sleeping, 0);
	ck_assert(!tpu_ring_consumer_asleep(&p.c_tx)); /* one doorbell per sleep */
	/* data arrived before the flag went up: do not sleep, flag withdrawn */
	ck_assert(tpu_ring_sleep_prepare(&p.d_rx));
	ck_assert_uint_eq(shm_of(&p)->c2d.sleeping, 0);
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, &b, 1), 1);
	/* cancel withdraws a set flag */
	ck_assert(!tpu_ring_sleep_prepare(&p.d_rx));
	tpu_ring_sleep_cancel(&p.d_rx);
	ck_assert(!tpu_ring_consumer_asleep(&p.c_tx));
	tpu_ring_sleep_cancel(&p.d_rx); /* twice is fine */
	pair_free(&p);
}
END_TEST

/* The doorbell protocol under threads: one producer, one consumer that sleeps on an eventfd. */
struct bell {
	struct pair p;
	int efd;
	uint64_t n_msgs, spin_ns;
	uint64_t doorbells, prepares, sleeps, futex_waits;
	uint64_t lost_wakeups, lost_space, bad_bytes, received;
	bool stop; /* atomic: the consumer gave up */
};

#define BELL_MSG 24

static void bell_msg(uint64_t i, uint8_t *m)
{
	uint64_t w[3] = { i, ~i, i * 0x9e3779b97f4a7c15ull };

	memcpy(m, w, BELL_MSG);
}

/* Publishes all of @m, waiting on the futex while the ring is full. */
static void bell_put(struct bell *b, const uint8_t *m)
{
	struct iovec iov = { (void *)m, BELL_MSG };
	size_t done = 0;

	while (done < BELL_MSG && !__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE)) {
		ssize_t k = tpu_ring_put(&b->p.c_tx, &iov, 1, done);
		uint32_t seq;

		ck_assert_int_ge(k, 0);
		done += (size_t)k;
		if (k > 0 && tpu_ring_consumer_asleep(&b->p.c_tx)) {
			uint64_t one = 1;
			ck_assert_int_eq(write(b->efd, &one, sizeof(one)), sizeof(one));
			b->doorbells++;
		}
		if (k == 0 && !tpu_ring_wait_space_prepare(&b->p.c_tx, &seq)) {
			uint64_t t0 = now_ms();
			b->futex_waits++;
			tpu_ring_futex_wait(&b->p.c_tx, seq, LOST_MS);
			if (now_ms() - t0 >= LOST_MS / 2)
				b->lost_space++;
		}
	}
}

static void *bell_producer(void *arg)
{
	struct bell *b = arg;
	uint8_t m[BELL_MSG];

	for (uint64_t i = 0; i < b->n_msgs && !__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE); i++) {
		bell_msg(i, m);
		bell_put(b, m);
	}
	return NULL;
}

static bool bell_readable(void *arg)
{
	return tpu_ring_avail(arg) != 0;
}

/* The consumer found the ring empty: spin, then sleep on the doorbell. Return: false if lost. */
static bool bell_wait(struct bell *b, struct tpu_spin *spin)
{
	struct pollfd pfd = { .fd = b->efd, .events = POLLIN };
	uint64_t t0, v;
	int n;

	if (tpu_spin_wait(spin, bell_readable, &b->p.d_rx))
		return true;
	b->prepares++;
	if (tpu_ring_sleep_prepare(&b->p.d_rx))
		return true;
	b->sleeps++;
	t0 = now_ms();
	n = poll(&pfd, 1, LOST_MS);
	if (n == 1)
		ck_assert_int_eq(read(b->efd, &v, sizeof(v)), sizeof(v));
	tpu_ring_sleep_cancel(&b->p.d_rx);
	tpu_spin_slept(spin, (now_ms() - t0) * 1000000);
	return n == 1;
}

static void *bell_consumer(void *arg)
{
	struct bell *b = arg;
	uint8_t buf[512], want[BELL_MSG], m[BELL_MSG];
	uint64_t at = 0; /* stream position */
	struct tpu_spin spin;

	tpu_spin_init(&spin, b->spin_ns);
	while (b->received < b->n_msgs) {
		ssize_t k = tpu_ring_get(&b->p.d_rx, buf, sizeof(buf));

		ck_assert_int_ge(k, 0);
		if (k > 0)
			tpu_ring_producer_waiting(&b->p.d_rx);
		for (ssize_t i = 0; i < k; i++, at++) {
			m[at % BELL_MSG] = buf[i];
			if (at % BELL_MSG != BELL_MSG - 1)
				continue;
			bell_msg(b->received++, want);
			if (memcmp(m, want, BELL_MSG) != 0)
				b->bad_bytes++;
		}
		if (k == 0 && !bell_wait(b, &spin)) {
			b->lost_wakeups++;
			__atomic_store_n(&b->stop, true, __ATOMIC_RELEASE);
			break;
		}
	}
	return NULL;
}

static void bell_run(uint64_t spin_ns, struct bell *b)
{
	pthread_t tp, tc;

	memset(b, 0, sizeof(*b));
	pair_new(&b->p, SMALL);
	b->efd = eventfd(0, EFD_CLOEXEC);
	ck_assert_int_ge(b->efd, 0);
	b->n_msgs = 200000;
	b->spin_ns = spin_ns;
	ck_assert_int_eq(pthread_create(&tc, NULL, bell_consumer, b), 0);
	ck_assert_int_eq(pthread_create(&tp, NULL, bell_producer, b), 0);
	pthread_join(tp, NULL);
	pthread_join(tc, NULL);
	printf("spin %llu ns: %llu messages, %llu doorbells, %llu sleeps (%llu prepared), "
	       "%llu futex waits\n",
	       (unsigned long long)spin_ns, (unsigned long long)b->received,
	       (unsigned long long)b->doorbells, (unsigned long long)b->sleeps,
	       (unsigned long long)b->prepares, (unsigned long long)b->futex_waits);
	ck_assert_uint_eq(b->lost_wakeups, 0);
	ck_assert_uint_eq(b->lost_space, 0);
	ck_assert_uint_eq(b->bad_bytes, 0);
	ck_assert_uint_eq(b->received, b->n_msgs);
	ck_assert_uint_eq(b->p.c_tx.pos, b->n_msgs * BELL_MSG);
	/* a doorbell answers a raised flag, and the consumer raises it once per prepare */
	ck_assert_uint_le(b->doorbells, b->prepares);
	close(b->efd);
	pair_free(&b->p);
}

START_TEST(test_ring_doorbell_wakes_spinning_consumer_rarely)
{
	struct bell b;

	bell_run(1000000, &b); /* 1 ms spin budget */
	ck_assert_msg(b.doorbells * 10 < b.n_msgs, "%llu doorbells for %llu messages",
		      (unsigned long long)b.doorbells, (unsigned long long)b.n_msgs);
}
END_TEST

START_TEST(test_ring_doorbell_without_spinning_loses_nothing)
{
	struct bell b;

	bell_run(0, &b); /* the consumer sleeps each time it finds the ring empty */
}
END_TEST

/* A producer blocked on a full ring, in its own thread. */
struct full {
	struct pair p;
	pid_t tid;
	bool prepared_saw_space;
	uint64_t waited_ms;
	ssize_t after;
};

static void *full_producer(void *arg)
{
	struct full *f = arg;
	uint8_t b = 9;
	uint32_t seq;
	uint64_t t0;

	__atomic_store_n(&f->tid, gettid(), __ATOMIC_SEQ_CST);
	if (tpu_ring_wait_space_prepare(&f->p.c_tx, &seq)) {
		f->prepared_saw_space = true;
		return NULL;
	}
	t0 = now_ms();
	tpu_ring_futex_wait(&f->p.c_tx, seq, LOST_MS);
	f->waited_ms = now_ms() - t0;
	f->after = put1(&f->p.c_tx, &b, 1);
	return NULL;
}

/* True once thread @tid sleeps in the kernel (state S in /proc). */
static bool thread_sleeps(pid_t tid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

START_TEST(test_ring_full_producer_is_woken_by_consumer)
{
	static uint8_t src[SMALL], dst[SMALL];
	struct full f = { .after = -1 };
	uint64_t deadline;
	pthread_t t;
	pid_t tid;

	pair_new(&f.p, SMALL);
	ck_assert_int_eq(put1(&f.p.c_tx, src, SMALL), SMALL);
	ck_assert_int_eq(tpu_ring_space(&f.p.c_tx), 0);
	ck_assert(!tpu_ring_producer_waiting(&f.p.d_rx)); /* nobody waits yet */
	ck_assert_int_eq(pthread_create(&t, NULL, full_producer, &f), 0);
	/* wait until the producer announced itself and blocks in the futex */
	deadline = now_ms() + LOST_MS;
	while (!(tid = __atomic_load_n(&f.tid, __ATOMIC_SEQ_CST)) ||
	       !__atomic_load_n(&shm_of(&f.p)->c2d.waiting, __ATOMIC_SEQ_CST) ||
	       !thread_sleeps(tid)) {
		ck_assert_msg(now_ms() < deadline, "the producer never blocked");
		usleep(1000);
	}
	ck_assert_int_eq(tpu_ring_get(&f.p.d_rx, dst, 1), 1);
	ck_assert(tpu_ring_producer_waiting(&f.p.d_rx)); /* it waited: flag cleared, woken */
	ck_assert_uint_eq(shm_of(&f.p)->c2d.waiting, 0);
	ck_assert_uint_eq(shm_of(&f.p)->c2d.space_seq, 1);
	ck_assert(!tpu_ring_producer_waiting(&f.p.d_rx)); /* once */
	pthread_join(t, NULL);
	ck_assert(!f.prepared_saw_space);
	ck_assert_msg(f.waited_ms < LOST_MS / 2, "the producer slept %llu ms: wake-up lost",
		      (unsigned long long)f.waited_ms);
	ck_assert_int_eq(f.after, 1); /* and the freed byte was usable */
	pair_free(&f.p);
}
END_TEST

START_TEST(test_ring_wait_space_prepare_sees_freed_space)
{
	static uint8_t src[SMALL], dst[SMALL];
	struct pair p;
	uint32_t seq = 77;
	uint64_t t0;

	pair_new(&p, SMALL);
	ck_assert_int_eq(put1(&p.c_tx, src, SMALL), SMALL);
	ck_assert(!tpu_ring_wait_space_prepare(&p.c_tx, &seq)); /* full: wait */
	ck_assert_uint_eq(seq, 0);
	ck_assert_uint_eq(shm_of(&p)->c2d.waiting, 1);
	/* the consumer frees space and bumps the futex word before the producer sleeps */
	ck_assert_int_eq(tpu_ring_get(&p.d_rx, dst, 10), 10);
	ck_assert(tpu_ring_producer_waiting(&p.d_rx));
	t0 = now_ms();
	tpu_ring_futex_wait(&p.c_tx, seq, LOST_MS); /* returns at once: the word moved */
	ck_assert_uint_lt(now_ms() - t0, LOST_MS / 2);
	/* space freed before the flag went up: no wait, flag withdrawn */
	ck_assert(tpu_ring_wait_space_prepare(&p.c_tx, &seq));
	ck_assert_uint_eq(seq, 1);
	ck_assert_uint_eq(shm_of(&p)->c2d.waiting, 0);
	ck_assert(!tpu_ring_producer_waiting(&p.d_rx));
	pair_free(&p);
}
END_TEST

/* ---- tpu_spin -------------------------------------------------------------------------------- */

struct ready_after {
	unsigned calls, true_at; /* ready() is true from call number @true_at on (0: never) */
};

static bool ready_after(void *arg)
{
	struct ready_after *r = arg;

	return ++r->calls >= r->true_at && r->true_at;
}

START_TEST(test_ring_spin_halves_after_long_sleeps_down_to_a_sixteenth)
{
	const uint64_t max = 1000000;
	struct tpu_spin s;

	tpu_spin_init(&s, max);
	ck_assert_uint_eq(s.cur_ns, max);
	tpu_spin_slept(&s, 2 * max + 1); /* just above "soon after the budget": halves */
	ck_assert_uint_eq(s.cur_ns, max / 2);
	for (uint64_t want = max / 4; want >= max / 16; want /= 2) {
		tpu_spin_slept(&s, 1000 * max);
		ck_assert_uint_eq(s.cur_ns, want);
	}
	for (int i = 0; i < 10; i++)
		tpu_spin_slept(&s, UINT64_MAX);
	ck_assert_uint_eq(s.cur_ns, max / 16);
	/* budgets that do not divide evenly stop at max / 16 as well */
	tpu_spin_init(&s, 100000 + 7);
	for (int i = 0; i < 20; i++)
		tpu_spin_slept(&s, UINT64_MAX);
	ck_assert_uint_eq(s.cur_ns, (100000 + 7) / 16);
}
END_TEST

START_TEST(test_ring_spin_restored_by_wait_satisfied_while_spinning)
{
	const uint64_t max = 50ull * 1000000; /* generous: the 2nd poll surely comes in time */
	struct ready_after r = { .true_at = 2 };
	struct tpu_spin s;

	tpu_spin_init(&s, max);
	for (int i = 0; i < 8; i++)
		tpu_spin_slept(&s, UINT64_MAX);
	ck_assert_uint_eq(s.cur_ns, max / 16);
	ck_assert(tpu_spin_wait(&s, ready_after, &r));
	ck_assert_uint_eq(r.calls, 2);
	ck_assert_uint_eq(s.cur_ns, max);
}
END_TEST

START_TEST(test_ring_spin_restored_by_wait_ending_just_after_budget)
{
	const uint64_t max = 100000;
	struct tpu_spin s;

	tpu_spin_init(&s, max);
	for (int i = 0; i < 8; i++)
		tpu_spin_slept(&s, UINT64_MAX);
	ck_assert_uint_eq(s.cur_ns, max / 16);
	tpu_spin_slept(&s, max + 1); /* the partner answered just after we gave up */
	ck_assert_uint_eq(s.cur_ns, max);
	tpu_spin_slept(&s, 10 * max);
	ck_assert_uint_eq(s.cur_ns, max / 2);
	tpu_spin_slept(&s, 2 * max); /* the boundary still counts as "just after" */
	ck_assert_uint_eq(s.cur_ns, max);
}
END_TEST

START_TEST(test_ring_spin_gives_up_after_its_budget)
{
	const uint64_t max = 2000000;
	struct ready_after r = { .true_at = 0 };
	struct tpu_spin s;
	struct timespec a, b;
	uint64_t ns;

	tpu_spin_init(&s, max);
	clock_gettime(CLOCK_MONOTONIC, &a);
	ck_assert(!tpu_spin_wait(&s, ready_after, &r));
	clock_gettime(CLOCK_MONOTONIC, &b);
	ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000ull + (uint64_t)b.tv_nsec -
	     (uint64_t)a.tv_nsec;
	ck_assert_uint_ge(ns, max);		     /* it really spun for its budget */
	ck_assert_uint_lt(ns, 5000ull * 1000000); /* and then gave up */
	ck_assert_uint_gt(r.calls, 1);
	ck_assert_uint_eq(s.cur_ns, max); /* a failed spin alone does not change the budget */
	/* ready at the first look: no spinning at all */
	r = (struct ready_after){ .true_at = 1 };
	ck_assert(tpu_spin_wait(&s, ready_after, &r));
	ck_assert_uint_eq(r.calls, 1);
}
END_TEST

START_TEST(test_ring_spin_max_zero_never_spins)
{
	struct ready_after r = { .true_at = 2 };
	struct tpu_spin s;

	tpu_spin_init(&s, 0);
	ck_assert(!tpu_spin_wait(&s, ready_after, &r));
	ck_assert_uint_eq(r.calls, 1); /* one look, no polling */
	tpu_spin_slept(&s, UINT64_MAX);
	tpu_spin_slept(&s, 0);
	ck_assert_uint_eq(s.cur_ns, 0);
	ck_assert(!tpu_spin_wait(&s, ready_after, &(struct ready_after){ .true_at = 0 }));
	ck_assert(tpu_spin_wait(&s, ready_after, &(struct ready_after){ .true_at = 1 }));
	ck_assert_uint_eq(s.cur_ns, 0);
}
END_TEST

static void *hog_main(void *arg)
{
	const bool *stop = arg;

	while (!__atomic_load_n(stop, __ATOMIC_RELAXED))
		;
	return NULL;
}

/*
 * A waiter whose CPU another thread keeps busy (this thread and a busy one on one CPU): its
 * yield hands the CPU to that thread for a whole time slice, so the wait gives up at once
 * instead of spinning through its budget, and the process stops spinning for a quiet period:
 * a wait meanwhile looks once and sleeps. Without the detection it spun its 5 s.
 */
START_TEST(test_ring_spin_stops_while_other_threads_hold_the_cpu)
{
	const uint64_t max = 5000ull * 1000000;
	struct ready_after r = { .true_at = 0 }, r2 = { .true_at = 2 };
	bool stop = false, gave_up, second;
	pthread_attr_t attr;
	pthread_t hog;
	cpu_set_t one;
	struct tpu_spin s;
	uint64_t t0, t1;
	int cpu = sched_getcpu();

	ck_assert_int_ge(cpu, 0);
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	ck_assert_int_eq(pthread_attr_init(&attr), 0);
	ck_assert_int_eq(pthread_attr_setaffinity_np(&attr, sizeof(one), &one), 0);
	tpu_spin_detect_contention(true);
	ck_assert_int_eq(pthread_create(&hog, &attr, hog_main, &stop), 0);
	usleep(20 * 1000); /* the busy thread runs */
	/* A scheduler whose time slices are shorter than the threshold (one CPU in all, say)
	 * gives no long yield to see: then there is nothing to check here. */
	t1 = 0;
	for (int i = 0; i < 1000 && t1 <= TPU_SPIN_YIELD_LONG_NS; i++) {
		t0 = tpu_now_ns();
		sched_yield();
		t1 = TPU_MAX(t1, tpu_now_ns() - t0);
	}
	if (t1 <= TPU_SPIN_YIELD_LONG_NS) {
		printf("spin contention: no yield beside a busy thread took over %llu us (at most "
		       "%llu): time slices too short here, not checked\n",
		       (unsigned long long)TPU_SPIN_YIELD_LONG_NS / 1000,
		       (unsigned long long)t1 / 1000);
		__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
		ck_assert_int_eq(pthread_join(hog, NULL), 0);
		pthread_attr_destroy(&attr);
		tpu_spin_detect_contention(false);
		return;
	}
	tpu_spin_init(&s, max);
	t0 = tpu_now_ns();
	gave_up = !tpu_spin_wait(&s, ready_after, &r);
	t1 = tpu_now_ns();
	/* in the quiet period: one look, no spinning, though ready at the second */
	second = tpu_spin_wait(&s, ready_after, &r2);
	__atomic_store_n(&stop, true, __ATOMIC_RELAXED);
	ck_assert_int_eq(pthread_join(hog, NULL), 0);
	pthread_attr_destroy(&attr);
	ck_assert(gave_up);
	ck_assert_msg(t1 - t0 < max / 2, "it spun %llu ms of its 5000",
		      (unsigned long long)((t1 - t0) / 1000000));
	ck_assert(!second);
	ck_assert_uint_eq(r2.calls, 1);
	tpu_spin_detect_contention(false);
}
END_TEST

/* The contention state's bookkeeping: a sighting starts one quiet period (more sightings in it
 * change nothing), the next one after it lasts twice as long, up to the maximum, and a spin
 * that succeeded with short yields brings the shortest back. */
START_TEST(test_ring_spin_quiet_periods_double_and_reset)
{
	uint64_t now = 1000ull * 1000000000;

	tpu_spin_detect_contention(true);
	ck_assert(!tpu_spin_quiet(now));
	tpu_spin_contended(now);
	ck_assert(tpu_spin_quiet(now + TPU_SPIN_QUIET_MIN_NS - 1));
	ck_assert(!tpu_spin_quiet(now + TPU_SPIN_QUIET_MIN_NS));
	tpu_spin_contended(now + 1); /* inside the period: nothing changes */
	ck_assert(!tpu_spin_quiet(now + TPU_SPIN_QUIET_MIN_NS));
	now += TPU_SPIN_QUIET_MIN_NS;
	tpu_spin_contended(now);
	ck_assert(tpu_spin_quiet(now + 2 * TPU_SPIN_QUIET_MIN_NS - 1));
	ck_assert(!tpu_spin_quiet(now + 2 * TPU_SPIN_QUIET_MIN_NS));
	for (int i = 0; i < 20; i++) {
		now += TPU_SPIN_QUIET_MAX_NS;
		tpu_spin_contended(now);
	}
	ck_assert(tpu_spin_quiet(now + TPU_SPIN_QUIET_MAX_NS - 1));
	ck_assert(!tpu_spin_quiet(now + TPU_SPIN_QUIET_MAX_NS));
	tpu_spin_uncontended();
	now += TPU_SPIN_QUIET_MAX_NS;
	tpu_spin_contended(now);
	ck_assert(!tpu_spin_quiet(now + TPU_SPIN_QUIET_MIN_NS));
	/* off: sightings start nothing */
	tpu_spin_detect_contention(false);
	tpu_spin_contended(now + TPU_SPIN_QUIET_MAX_NS);
	ck_assert(!tpu_spin_quiet(now + TPU_SPIN_QUIET_MAX_NS));
}
END_TEST

/* The spin and thread cases time real waits and count wake-ups: a long yield on a loaded
 * machine must not cut their spins short (the contention cases turn the detection on). */
static void spin_setup(void)
{
	tpu_spin_detect_contention(false);
}

static Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *basic = tcase_create("basic");
	TCase *threads = tcase_create("threads");
	TCase *spin = tcase_create("spin");

	tcase_add_test(basic, test_ring_size_ok_accepts_powers_of_two_in_range);
	tcase_add_test(basic, test_ring_create_seals_and_formats);
	tcase_add_test(basic, test_ring_init_views_share_the_mapping);
	tcase_add_test(basic, test_ring_wraps_byte_for_byte);
	tcase_add_test(basic, test_ring_put_iov_with_skip);
	tcase_add_test(basic, test_ring_put_is_partial_when_space_is_short);
	tcase_add_test(basic, test_ring_look_span_release_in_place_across_the_wrap);
	tcase_add_test(basic, test_ring_peek_hints_readable_bytes);
	tcase_add_test(basic, test_ring_consumer_rejects_head_behind_its_position);
	tcase_add_test(basic, test_ring_consumer_rejects_head_more_than_size_ahead);
	tcase_add_test(basic, test_ring_producer_rejects_tail_ahead_of_head);
	tcase_add_test(basic, test_ring_producer_rejects_tail_more_than_size_behind);
	tcase_add_test(basic, test_ring_random_positions_stay_in_bounds);
	tcase_add_test(basic, test_ring_attach_maps_a_created_ring);
	tcase_add_test(basic, test_ring_attach_refuses_unsealed_memfd);
	tcase_add_test(basic, test_ring_attach_refuses_wrong_size);
	tcase_add_test(basic, test_ring_attach_refuses_non_memfd);
	tcase_add_test(basic, test_ring_attach_refuses_bad_size);
	tcase_add_test(basic, test_ring_sleep_flag_handshake);
	tcase_add_test(basic, test_ring_wait_space_prepare_sees_freed_space);
	tcase_set_timeout(basic, 30);
	suite_add_tcase(s, basic);

	tcase_add_test(threads, test_ring_streams_message_larger_than_ring);
	tcase_add_test(threads, test_ring_doorbell_wakes_spinning_consumer_rarely);
	tcase_add_test(threads, test_ring_doorbell_without_spinning_loses_nothing);
	tcase_add_test(threads, test_ring_full_producer_is_woken_by_consumer);
	tcase_set_timeout(threads, 120);
	suite_add_tcase(s, threads);

	tcase_add_test(spin, test_ring_spin_halves_after_long_sleeps_down_to_a_sixteenth);
	tcase_add_test(spin, test_ring_spin_restored_by_wait_satisfied_while_spinning);
	tcase_add_test(spin, test_ring_spin_restored_by_wait_ending_just_after_budget);
	tcase_add_test(spin, test_ring_spin_gives_up_after_its_budget);
	tcase_add_checked_fixture(threads, spin_setup, NULL);
	tcase_add_checked_fixture(spin, spin_setup, NULL);
	tcase_add_test(spin, test_ring_spin_max_zero_never_spins);
	tcase_add_test(spin, test_ring_spin_quiet_periods_double_and_reset);
	tcase_add_test(spin, test_ring_spin_stops_while_other_threads_hold_the_cpu);
	tcase_set_timeout(spin, 30);
	suite_add_tcase(s, spin);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ring_suite());
	int failed;

	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
