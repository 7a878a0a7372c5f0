/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared-memory byte rings and bounded adaptive spinning. See ring.h for the layout, the trust
 * rules and the sleep/wake protocol; this file only implements them.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ring.h"
#include "tpu.h"

_Static_assert(sizeof(struct tpu_ring_shm) <= TPU_RING_HDR, "ring header exceeds its page");

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

bool tpu_ring_size_ok(uint64_t size)
{
	return size >= TPU_RING_MIN && size <= TPU_RING_MAX && (size & (size - 1)) == 0;
}

void tpu_ring_format(void *map, uint32_t size)
{
	struct tpu_ring_shm *h = map;

	h->magic = TPU_RING_MAGIC;
	h->version = TPU_RING_VERSION;
	h->size = size;
}

int tpu_ring_create(uint32_t size, int *ret_fd, void **ret_map)
{
	_cleanup_close_ int fd = -EBADF;
	size_t len = tpu_ring_map_size(size);
	void *map;

	if (!tpu_ring_size_ok(size))
		return -EINVAL;
	fd = memfd_create("tpipd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0)
		return -errno;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return -errno;
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	tpu_ring_format(map, size);
	*ret_fd = TAKE_FD(fd);
	*ret_map = map;
	return 0;
}

int tpu_ring_attach(int fd, uint32_t size, void **ret_map)
{
	size_t len = tpu_ring_map_size(size);
	struct stat st;
	int seals;
	void *map;

	if (!tpu_ring_size_ok(size))
		return -EINVAL;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return -EBADF;
	if (!(seals & F_SEAL_SHRINK))
		return -EPERM;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len)
		return -EBADF;
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (map == MAP_FAILED)
		return errno == EPERM ? -EACCES : -errno; /* EPERM: sealed against writing */
	*ret_map = map;
	return 0;
}

void tpu_ring_init(void *map, uint32_t size, bool client, struct tpu_ring *ret_tx,
		   struct tpu_ring *ret_rx)
{
	struct tpu_ring_shm *h = map;
	uint8_t *c2d = (uint8_t *)map + TPU_RING_HDR, *d2c = c2d + size;

	*ret_tx = (struct tpu_ring){ .ctl = client ? &h->c2d : &h->d2c, .data = client ? c2d : d2c,
				     .size = size, .producer = true };
	*ret_rx = (struct tpu_ring){ .ctl = client ? &h->d2c : &h->c2d, .data = client ? d2c : c2d,
				     .size = size };
}

/* ---- producer ------------------------------------------------------------------------------ */

ssize_t tpu_ring_space(struct tpu_ring *r)
{
	uint64_t tail = LOAD_ACQ(&r->ctl->tail);

	if (tail > r->pos || r->pos - tail > r->size)
		return -EPROTO;
	return (ssize_t)(r->size - (r->pos - tail));
}

/* Copies @len bytes from @src to ring position @pos (wrapping). */
static void ring_copy_in(struct tpu_ring *r, uint64_t pos, const uint8_t *src, size_t len)
{
	size_t off = (size_t)(pos & (r->size - 1)), first = TPU_MIN(len, (size_t)r->size - off);

	memcpy(r->data + off, src, first);
	if (len > first)
		memcpy(r->data, src + first, len - first);
}

ssize_t tpu_ring_put(struct tpu_ring *r, const struct iovec *iov, size_t n, size_t skip)
{
	ssize_t space = tpu_ring_space(r);
	uint64_t pos = r->pos;
	size_t left;

	if (space <= 0)
		return space;
	left = (size_t)space;
	for (size_t i = 0; i < n && left; i++) {
		size_t len = iov[i].iov_len, k;

		if (skip >= len) {
			skip -= len;
			continue;
		}
		k = TPU_MIN(len - skip, left);
		ring_copy_in(r, pos, (const uint8_t *)iov[i].iov_base + skip, k);
		skip = 0;
		pos += k;
		left -= k;
	}
	if (pos != r->pos) {
		STORE_REL(&r->ctl->head, pos);
	}
	space = (ssize_t)(pos - r->pos);
	r->pos = pos;
	return space;
}

bool tpu_ring_consumer_asleep(struct tpu_ring *r)
{
	FENCE();
	if (!__atomic_load_n(&r->ctl->sleeping, __ATOMIC_RELAXED))
		return false;
	return __atomic_exchange_n(&r->ctl->sleeping, 0, __ATOMIC_SEQ_CST) != 0;
}

bool tpu_ring_wait_space_prepare(struct tpu_ring *r, uint32_t *ret_seq)
{
	*ret_seq = __atomic_load_n(&r->ctl->space_seq, __ATOMIC_SEQ_CST);
	__atomic_store_n(&r->ctl->waiting, 1, __ATOMIC_SEQ_CST);
	FENCE();
	if (tpu_ring_space(r) != 0) {
		__atomic_store_n(&r->ctl->waiting, 0, __ATOMIC_SEQ_CST);
		return true;
	}
	return false;
}

void tpu_ring_futex_wait(struct tpu_ring *r, uint32_t seq, int timeout_ms)
{
	struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };

	syscall(SYS_futex, &r->ctl->space_seq, FUTEX_WAIT, seq, &ts, NULL, 0);
}

/* ---- consumer ------------------------------------------------------------------------------ */

ssize_t tpu_ring_avail(const struct tpu_ring *r)
{
	uint64_t head = LOAD_ACQ(&r->ctl->head);

	if (head < r->pos || head - r->pos > r->size)
		return -EPROTO;
	return (ssize_t)(head - r->pos);
}

ssize_t tpu_ring_get(struct tpu_ring *r, void *buf, size_t len)
{
	ssize_t avail = tpu_ring_avail(r);
	size_t off, first;

	if (avail <= 0)
		return avail;
	len = TPU_MIN(len, (size_t)avail);
	off = (size_t)(r->pos & (r->size - 1));
	first = TPU_MIN(len, (size_t)r->size - off);
	memcpy(buf, r->data + off, first);
	if (len > first)
		memcpy((uint8_t *)buf + first, r->data, len - first);
	__atomic_store_n(&r->pos, r->pos + len, __ATOMIC_RELAXED); /* tpu_ring_peek() reads it */
	STORE_REL(&r->ctl->tail, r->pos);
	return (ssize_t)len;
}

void tpu_ring_look(const struct tpu_ring *r, size_t off, void *buf, size_t len)
{
	size_t at = (size_t)((r->pos + off) & (r->size - 1));
	size_t first = TPU_MIN(len, (size_t)r->size - at);

	memcpy(buf, r->data + at, first);
	if (len > first)
		memcpy((uint8_t *)buf + first, r->data, len - first);
}

const uint8_t *tpu_ring_span(const struct tpu_ring *r, size_t off, size_t len)
{
	size_t at = (size_t)((r->pos + off) & (r->size - 1));

	return len <= (size_t)r->size - at ? r->data + at : NULL;
}

void tpu_ring_release(struct tpu_ring *r, size_t len)
{
	__atomic_store_n(&r->pos, r->pos + len, __ATOMIC_RELAXED); /* tpu_ring_peek() reads it */
	STORE_REL(&r->ctl->tail, r->pos);
}

bool tpu_ring_producer_waiting(struct tpu_ring *r)
{
	FENCE();
	if (!__atomic_load_n(&r->ctl->waiting, __ATOMIC_RELAXED))
		return false;
	if (!__atomic_exchange_n(&r->ctl->waiting, 0, __ATOMIC_SEQ_CST))
		return false;
	__atomic_add_fetch(&r->ctl->space_seq, 1, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &r->ctl->space_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	return true;
}

bool tpu_ring_sleep_prepare(struct tpu_ring *r)
{
	__atomic_store_n(&r->ctl->sleeping, 1, __ATOMIC_SEQ_CST);
	FENCE();
	if (tpu_ring_avail(r) != 0) {
		__atomic_store_n(&r->ctl->sleeping, 0, __ATOMIC_RELAXED);
		return true;
	}
	return false;
}

void tpu_ring_sleep_cancel(struct tpu_ring *r)
{
	if (__atomic_load_n(&r->ctl->sleeping, __ATOMIC_RELAXED))
		__atomic_store_n(&r->ctl->sleeping, 0, __ATOMIC_RELAXED);
}

/* ---- bounded adaptive spinning ------------------------------------------------------------- */

void tpu_spin_init(struct tpu_spin *s, uint64_t max_ns)
{
	s->max_ns = max_ns;
	s->cur_ns = max_ns;
}

/* The process's contention state (every spinner of the process shares it): no spinning before
 * quiet_until (CLOCK_MONOTONIC ns), and the next quiet period's length. */
static uint64_t quiet_until_ns;
static uint64_t quiet_ns = TPU_SPIN_QUIET_MIN_NS;
static bool detect = true;

void tpu_spin_detect_contention(bool on)
{
	__atomic_store_n(&detect, on, __ATOMIC_RELAXED);
	__atomic_store_n(&quiet_until_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&quiet_ns, TPU_SPIN_QUIET_MIN_NS, __ATOMIC_RELAXED);
}

bool tpu_spin_quiet(uint64_t now)
{
	return now < __atomic_load_n(&quiet_until_ns, __ATOMIC_RELAXED);
}

void tpu_spin_contended(uint64_t now)
{
	uint64_t q = __atomic_load_n(&quiet_ns, __ATOMIC_RELAXED);

	if (!__atomic_load_n(&detect, __ATOMIC_RELAXED) || tpu_spin_quiet(now))
		return; /* one period at a time, however many spinners saw it */
	__atomic_store_n(&quiet_until_ns, now + q, __ATOMIC_RELAXED);
	__atomic_store_n(&quiet_ns, TPU_MIN(2 * q, TPU_SPIN_QUIET_MAX_NS), __ATOMIC_RELAXED);
}

void tpu_spin_uncontended(void)
{
	if (__atomic_load_n(&quiet_ns, __ATOMIC_RELAXED) != TPU_SPIN_QUIET_MIN_NS)
		__atomic_store_n(&quiet_ns, TPU_SPIN_QUIET_MIN_NS, __ATOMIC_RELAXED);
}

bool tpu_spin_pause(void)
{
	uint64_t t0 = tpu_now_ns();

	/* Hands this CPU to a runnable thread that shares it (on a small machine, often the
	 * very partner we wait for); busy pauses measured slower here. */
	sched_yield();
	return tpu_now_ns() - t0 > TPU_SPIN_YIELD_LONG_NS;
}

bool tpu_spin_wait(struct tpu_spin *s, bool (*ready)(void *arg), void *arg)
{
	uint64_t start, now;
	bool long_yield;

	if (ready(arg))
		return true;
	if (!s->cur_ns)
		return false;
	start = tpu_now_ns();
	if (tpu_spin_quiet(start))
		return false;
	do {
		long_yield = tpu_spin_pause();
		if (ready(arg)) {
			s->cur_ns = s->max_ns;
			if (!long_yield)
				tpu_spin_uncontended();
			return true;
		}
		now = tpu_now_ns();
		if (long_yield && __atomic_load_n(&detect, __ATOMIC_RELAXED)) {
			tpu_spin_contended(now); /* other threads hold the CPUs: sleep, woken ahead */
			return false;
		}
	} while (now - start < s->cur_ns);
	return false;
}

void tpu_spin_slept(struct tpu_spin *s, uint64_t waited_ns)
{
	if (waited_ns <= 2 * s->max_ns)
		s->cur_ns = s->max_ns; /* just missed: the partner answers at this pace */
	else if (s->cur_ns > s->max_ns / 16)
		s->cur_ns /= 2;
}
