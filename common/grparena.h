/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The layout of a group's arena: one shared-memory file per group that the daemon creates and
 * maps, and that every member maps, through which the members of one host run their
 * collectives (client/lib/coll.c). The daemon only ever writes the failure fields and the
 * futex word (tpu_grparena_fail()); it never reads anything else a member wrote there. What a
 * collective puts in the slots is the client library's (docs/collectives.md, "Arena").
 */
#ifndef TPU_GRPARENA_H
#define TPU_GRPARENA_H

#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TPU_GRPARENA_MAGIC 0x52475054u /* "TPGR" */
#define TPU_GRPARENA_VERSION 2u /* 2: sleepers (a library of 1 sleeps without counting) */
#define TPU_GRPARENA_HDR 4096u	       /* the header page */
#define TPU_GRPARENA_CALL 64u	       /* one call descriptor (a cache line) */
#define TPU_GRPARENA_FAILED 0x80000000u /* in word: the group failed (fail_* say why) */
#define TPU_GRPARENA_GEN 0x7fffffffu	/* in word: the barrier's generation */
/* An all-reduce whose N slots hold at most this many bytes in all takes one barrier: every member
 * folds every slot (client/lib/coll.c, direct_call(); tpipctl groups says so) */
#define TPU_GRPARENA_DIRECT_MAX (64u * 1024u)

/* Why a group failed (fail_why). */
enum tpu_grparena_why {
	TPU_GRPARENA_OK = 0,
	TPU_GRPARENA_DIED = 1,	  /* the member's session ended without leaving */
	TPU_GRPARENA_LEFT = 2,	  /* the member left (tp_group_leave()) */
	TPU_GRPARENA_ABORTED = 3, /* the member aborted the group (tp_group_abort()) */
	TPU_GRPARENA_TIMEOUT = 4, /* the member gave up waiting (op timeout) */
	TPU_GRPARENA_SHUTDOWN = 5, /* the daemon stopped */
	TPU_GRPARENA_LOST = 6,	   /* the member lost its daemon connection */
	TPU_GRPARENA_HOST = 7,	   /* the peer link to the member's host (or coordinator) failed */
	TPU_GRPARENA_XLINK = 8	   /* the member, its host's leader, lost a pipe to another's */
};

struct tpu_grparena_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t size;	      /* members */
	uint32_t pad0;
	uint64_t chunk_bytes; /* bytes of one data slot */
	uint64_t arena_bytes; /* the whole file */
	uint8_t pad1[32];
	/* Cache line 1: the barrier. */
	uint32_t word;	/* futex: TPU_GRPARENA_FAILED | generation */
	uint32_t count; /* members arrived at the current barrier */
	/* Members about to sleep on word, or sleeping (counted before they look at word one last
	 * time): the last to arrive at a barrier wakes them only when there are some, sparing a
	 * system call a barrier where everyone spins. One that dies asleep leaves it raised: the
	 * others then wake every time, as version 1 did. */
	uint32_t sleepers;
	uint8_t pad2[52];
	/* Cache line 2: the first failure (written once, before FAILED is set in word). */
	uint32_t fail_rank;
	uint32_t fail_pid;
	uint32_t fail_why; /* enum tpu_grparena_why */
	uint32_t pad3;
	/* A member of a group over several hosts that left after its call number fail_after
	 * (LEFT only; 0: none): the others' calls up to that number still complete. */
	uint64_t fail_after;
	uint8_t pad4[40];
};

/* A member's counters, written by that member after each collective (tpipctl groups reads
 * them: informational, as the member says). */
struct tpu_grparena_stats {
	uint64_t calls;	  /* collectives finished (failed ones included) */
	uint64_t bytes;	  /* bytes of its input they covered */
	uint64_t busy_ns; /* time inside collectives */
	uint64_t wait_ns; /* of that, time waiting for the others */
	/* a host's leader across hosts: bytes to and from the other hosts' leaders, and the time
	 * spent on that exchange */
	uint64_t xbytes_out, xbytes_in, xbusy_ns;
	uint8_t pad[8];
};

/* Offsets: the header page, 2 x size call descriptors (by sequence parity), size members'
 * stats, then the data: 2 banks x size slots of chunk_bytes, then 2 result slots. */
static inline uint64_t tpu_grparena_calls_off(void)
{
	return TPU_GRPARENA_HDR;
}

static inline uint64_t tpu_grparena_stats_off(uint32_t size)
{
	return TPU_GRPARENA_HDR + 2ull * size * TPU_GRPARENA_CALL;
}

static inline uint64_t tpu_grparena_data_off(uint32_t size)
{
	uint64_t c = 3ull * size * TPU_GRPARENA_CALL;

	return TPU_GRPARENA_HDR + ((c + 4095) & ~4095ull);
}

/* Bytes of the arena of @size members with @chunk-byte slots. */
static inline uint64_t tpu_grparena_bytes(uint32_t size, uint64_t chunk)
{
	return tpu_grparena_data_off(size) + (2ull * size + 2) * chunk;
}

static inline long tpu_grparena_wake(uint32_t *word)
{
	return syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/*
 * tpu_grparena_fail() - record that @rank (@pid) broke the group for @why, unless a failure was
 * recorded first, and wake every waiter. Borrows @h (mapped shared). Return: true if this call
 * recorded it.
 */
static inline int tpu_grparena_fail(struct tpu_grparena_hdr *h, uint32_t rank, uint32_t pid,
				    uint32_t why)
{
	uint32_t old = 0;
	int first = __atomic_compare_exchange_n(&h->fail_why, &old, why, 0, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST);

	/* A departure that spares the calls in progress gives way to any other failure. */
	if (!first && old == TPU_GRPARENA_LEFT && __atomic_load_n(&h->fail_after,
								  __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&h->fail_after, 0, __ATOMIC_SEQ_CST);
		first = __atomic_compare_exchange_n(&h->fail_why, &old, why, 0, __ATOMIC_SEQ_CST,
						    __ATOMIC_SEQ_CST);
	}
	if (first) {
		__atomic_store_n(&h->fail_rank, rank, __ATOMIC_RELAXED);
		__atomic_store_n(&h->fail_pid, pid, __ATOMIC_RELAXED);
	}
	__atomic_fetch_or(&h->word, TPU_GRPARENA_FAILED, __ATOMIC_SEQ_CST);
	tpu_grparena_wake(&h->word);
	return first;
}

/*
 * tpu_grparena_leave_after() - record that @rank (@pid) left a group over several hosts after
 * its cross-host call @after (> 0): the members' calls up to that number still complete, later
 * ones fail (the members compare it; a waiter on such a failure sleeps in slices, since a
 * later failure replaces it without a new generation). Unless a failure was recorded first.
 * Borrows @h. Return: true if this call recorded it.
 */
static inline int tpu_grparena_leave_after(struct tpu_grparena_hdr *h, uint32_t rank,
					   uint32_t pid, uint64_t after)
{
	uint32_t zero = 0;
	int first = __atomic_compare_exchange_n(&h->fail_why, &zero, TPU_GRPARENA_LEFT, 0,
						__ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);

	if (first) {
		__atomic_store_n(&h->fail_after, after, __ATOMIC_SEQ_CST);
		__atomic_store_n(&h->fail_rank, rank, __ATOMIC_RELAXED);
		__atomic_store_n(&h->fail_pid, pid, __ATOMIC_RELAXED);
	}
	__atomic_fetch_or(&h->word, TPU_GRPARENA_FAILED, __ATOMIC_SEQ_CST);
	tpu_grparena_wake(&h->word);
	return first;
}

#endif
