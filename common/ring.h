/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpu_ring: the shared-memory control transport between a client and the daemon. One memfd,
 * created and sealed by the client, holds a header page and two single-producer single-consumer
 * byte rings, client -> daemon (c2d) and daemon -> client (d2c). Each ring carries the same
 * frame stream the Unix socket would carry; a frame larger than the free space simply goes in
 * pieces, as on a socket. Positions are free-running 64-bit byte counts.
 *
 * Trust. Either side may write anything into the shared page at any time. Each endpoint keeps
 * its own position privately and only ever reads the other side's position, which it checks
 * (a consumer never sees more than the ring size readable, a producer never sees a consumer
 * ahead of it); a violation is -EPROTO and ends the session. Bytes are copied out exactly once,
 * so a frame cannot change after it was validated.
 *
 * Sleeping. A consumer that found nothing for a while sets its `sleeping` flag, re-checks, and
 * blocks on its doorbell (the Unix socket, polled for readability). A producer that publishes
 * and finds the flag set clears it and rings the doorbell once. A producer that finds the ring
 * full sets `waiting`; the consumer that frees space clears it and wakes the producer (a futex
 * on `space_seq`, or the doorbell). All of it is plain C11 atomics on the mapping.
 *
 * tpu_spin: bounded adaptive spinning for all the waits above (see tpu_spin_wait()).
 */
#ifndef TPU_RING_H
#define TPU_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define TPU_RING_MAGIC 0x31474e4952707474ull /* "ttpRING1" little-endian */
#define TPU_RING_VERSION 1u
#define TPU_RING_HDR 4096u	    /* header page; the c2d data follows, then d2c */
#define TPU_RING_MIN (4u << 10)	    /* smallest data area per direction */
#define TPU_RING_MAX (64u << 20)    /* largest data area per direction */
#define TPU_RING_DEFAULT (512u << 10)

/* One direction's shared control block. Producer and consumer fields on separate lines. */
struct tpu_ring_ctl {
	_Alignas(64) uint64_t head; /* producer: bytes published */
	uint32_t waiting;	    /* producer: waits for space; consumer clears it and wakes */
	uint32_t space_seq;	    /* consumer: bumped (futex word) when it wakes a producer */
	_Alignas(64) uint64_t tail; /* consumer: bytes consumed */
	uint32_t sleeping;	    /* consumer: blocks on the doorbell; producer clears it */
	_Alignas(64) uint8_t end[0];
};

struct tpu_ring_shm {
	uint64_t magic;
	uint32_t version;
	uint32_t size; /* data bytes per direction (power of two) */
	_Alignas(64) struct tpu_ring_ctl c2d;
	struct tpu_ring_ctl d2c;
};

/* One endpoint of one direction, private to its process. */
struct tpu_ring {
	struct tpu_ring_ctl *ctl;
	uint8_t *data;
	uint64_t size; /* power of two */
	uint64_t pos;  /* our position: head when producing, tail when consuming */
	bool producer;
};

/* Total memfd size for rings of @size data bytes per direction. */
static inline size_t tpu_ring_map_size(uint32_t size)
{
	return TPU_RING_HDR + 2 * (size_t)size;
}

/* True if @size is a valid data size (power of two in [TPU_RING_MIN, TPU_RING_MAX]). */
bool tpu_ring_size_ok(uint64_t size);

/*
 * tpu_ring_create() - make a sealed memfd for rings of @size bytes per direction and map it.
 * @ret_fd: returns owned fd (CLOEXEC, sealed against shrinking, growing and resealing).
 * @ret_map: returns owned mapping of tpu_ring_map_size(@size) bytes, unmap with munmap().
 * Return: 0 or -errno.
 */
int tpu_ring_create(uint32_t size, int *ret_fd, void **ret_map);

/*
 * tpu_ring_attach() - map the client's ring memfd @fd (borrowed) of @size bytes per direction,
 * after checking that it is sealed against shrinking and exactly as large as announced.
 * @ret_map: returns owned mapping, unmap with munmap(map, tpu_ring_map_size(size)).
 * Return: 0, -EINVAL (bad size), -EPERM (not sealed), -EBADF (not a memfd of that size),
 * -EACCES (sealed against writing), other -errno from mmap().
 */
int tpu_ring_attach(int fd, uint32_t size, void **ret_map);

/*
 * tpu_ring_init() - the two endpoints of one side. @client: true for the client (produces c2d,
 * consumes d2c). The positions start at 0; @map must be fresh (all zero but the header).
 * @map: borrowed; the endpoints point into it.
 */
void tpu_ring_init(void *map, uint32_t size, bool client, struct tpu_ring *ret_tx,
		   struct tpu_ring *ret_rx);

/* Writes the header of a fresh mapping (client side, before sending it). */
void tpu_ring_format(void *map, uint32_t size);

/* ---- producer ------------------------------------------------------------------------------ */

/*
 * tpu_ring_put() - copy as much of @iov[0..@n) (skipping its first @skip bytes) as fits, and
 * publish it. Return: bytes written (0 when full), or -EPROTO if the consumer's position is
 * impossible.
 */
ssize_t tpu_ring_put(struct tpu_ring *r, const struct iovec *iov, size_t n, size_t skip);

/* After a put: true if the consumer sleeps and must be woken (the flag is cleared). */
bool tpu_ring_consumer_asleep(struct tpu_ring *r);

/* Free bytes now (0 when full); -EPROTO if the consumer's position is impossible. */
ssize_t tpu_ring_space(struct tpu_ring *r);

/*
 * tpu_ring_wait_space_prepare() - announce that the producer waits for space.
 * @ret_seq: returns the futex value to wait on (see tpu_ring_futex_wait()).
 * Return: true if space appeared meanwhile (do not wait; the flag is withdrawn).
 */
bool tpu_ring_wait_space_prepare(struct tpu_ring *r, uint32_t *ret_seq);

/* Waits (futex) until space_seq differs from @seq or @timeout_ms passes. */
void tpu_ring_futex_wait(struct tpu_ring *r, uint32_t seq, int timeout_ms);

/* ---- consumer ------------------------------------------------------------------------------ */

/* Whether bytes are readable, from any thread (a hint; only the consumer may read them). */
static inline uint64_t tpu_ring_peek(const struct tpu_ring *r)
{
	return __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE) -
	       __atomic_load_n(&r->pos, __ATOMIC_RELAXED);
}

/* Readable bytes now (0 when empty); -EPROTO if the producer's position is impossible. */
ssize_t tpu_ring_avail(const struct tpu_ring *r);

/*
 * tpu_ring_get() - copy up to @len readable bytes to @buf and release their space.
 * Return: bytes copied (0 when empty), or -EPROTO.
 */
ssize_t tpu_ring_get(struct tpu_ring *r, void *buf, size_t len);

/*
 * tpu_ring_look() - copy @len readable bytes starting @off bytes past the consumer's position
 * to @buf, without releasing them. The caller checked (tpu_ring_avail()) that @off + @len bytes
 * are readable.
 */
void tpu_ring_look(const struct tpu_ring *r, size_t off, void *buf, size_t len);

/*
 * tpu_ring_span() - where @len readable bytes starting @off bytes past the consumer's position
 * lie in the mapping, if in one piece. The caller checked that they are readable.
 * Return: borrowed pointer into the mapping, valid until tpu_ring_release() of those bytes, or
 * NULL if they wrap around the end of the data area.
 */
const uint8_t *tpu_ring_span(const struct tpu_ring *r, size_t off, size_t len);

/* Releases @len readable bytes (the caller checked they are readable) without copying them. */
void tpu_ring_release(struct tpu_ring *r, size_t len);

/*
 * After a get: true if the producer waits for space (the flag is cleared and space_seq bumped;
 * a futex waiter is woken here, a producer that sleeps elsewhere must be woken by the caller).
 */
bool tpu_ring_producer_waiting(struct tpu_ring *r);

/*
 * tpu_ring_sleep_prepare() - set the consumer's sleeping flag before blocking on the doorbell.
 * Return: true if data arrived meanwhile (the flag is withdrawn: do not sleep).
 */
bool tpu_ring_sleep_prepare(struct tpu_ring *r);

/* Withdraws the sleeping flag (the consumer is awake and polls). */
void tpu_ring_sleep_cancel(struct tpu_ring *r);

/* ---- bounded adaptive spinning ------------------------------------------------------------- */

/*
 * A waiter spins (polling, yielding the CPU between polls) for at most its current budget, then
 * sleeps. The budget starts at max_ns; a wait that had to sleep and lasted much longer than
 * max_ns halves it (down to max_ns / 16), and a wait satisfied by spinning, or one that ended
 * soon after the budget ran out, restores it. So a ping-pong partner is caught while spinning,
 * and a waiter whose events come rarely stops burning CPU for them. max_ns 0 never spins.
 */
struct tpu_spin {
	uint64_t max_ns;
	uint64_t cur_ns;
};

void tpu_spin_init(struct tpu_spin *s, uint64_t max_ns);

/*
 * tpu_spin_wait() - spin until @ready(@arg) is true or the budget is spent.
 * Return: true if @ready became true while spinning.
 */
bool tpu_spin_wait(struct tpu_spin *s, bool (*ready)(void *arg), void *arg);

/* Tells @s how long a wait that had to sleep took in all (from its start). */
void tpu_spin_slept(struct tpu_spin *s, uint64_t waited_ns);

/*
 * Contention. Yielding helps while the threads that run are our own (the partner we wait for
 * gets the CPU). When more threads than CPUs want to run (busy neighbours: data loaders, a
 * build), a yield hands the CPU to one of them for its whole time slice, and every hop of a
 * message costs milliseconds, while a thread that sleeps is woken ahead of them. So a yield
 * that kept its thread off the CPU longer than TPU_SPIN_YIELD_LONG_NS, with the wait not
 * over, makes the whole process stop spinning for a quiet period (TPU_SPIN_QUIET_MIN_NS,
 * doubled at each new sighting up to TPU_SPIN_QUIET_MAX_NS, back to the minimum once a spin
 * succeeds with short yields); waits meanwhile sleep at once.
 */
#define TPU_SPIN_YIELD_LONG_NS (1000 * 1000ull)
#define TPU_SPIN_QUIET_MIN_NS (10 * 1000 * 1000ull)
#define TPU_SPIN_QUIET_MAX_NS (640 * 1000 * 1000ull)

/* Turns the detection on (the default) or off, and ends any quiet period (unit tests). */
void tpu_spin_detect_contention(bool on);

/* True while the process is in a quiet period (@now: tpu_now_ns()): do not spin. */
bool tpu_spin_quiet(uint64_t now);

/* A long yield was seen at @now with the wait not over: start a quiet period. */
void tpu_spin_contended(uint64_t now);

/* A spin succeeded with short yields: the next quiet period is the shortest again. */
void tpu_spin_uncontended(void);

/* One polite pause between polls (gives the CPU to another runnable thread). Return: true if
 * it kept this thread off the CPU longer than TPU_SPIN_YIELD_LONG_NS. */
bool tpu_spin_pause(void);

#endif
