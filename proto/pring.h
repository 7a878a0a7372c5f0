/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipe rings (issue 27): the layout of the shared-memory staging ring through which two clients
 * of one host move a private->private message themselves, the checks of the RingXfer that hands
 * one out, and the futex helpers both sides and the daemon use on its words. The copy loops live
 * in the client library (client/lib/pring.c), the ring's life in the daemon's broker
 * (daemon/broker/pring.c). Every word of the header is written by a process the reader of it
 * does not trust: each side bounds and checks what it reads, never sizes anything by it.
 */
#ifndef TPW_PRING_H
#define TPW_PRING_H

#include <stddef.h>
#include <stdint.h>
#include "validate.h"
#include "tpw.pb-c.h"

#define TPW_PRING_MAGIC 0x474e5250u /* "PRNG" */
#define TPW_PRING_VERSION 1u
#define TPW_PRING_HDR_BYTES 4096u
#define TPW_PRING_CHUNK_MIN 4096u
#define TPW_PRING_CHUNK_MAX (4u << 20)
#define TPW_PRING_NCHUNKS_MIN 2u
#define TPW_PRING_NCHUNKS_MAX 256u

/*
 * The first TPW_PRING_HDR_BYTES of the ring's memfd; chunk slot i follows at
 * TPW_PRING_HDR_BYTES + i * chunk_bytes. @head counts the chunks the writer published, @tail
 * those the reader took (both mod 2^32, futex words); @rd_wait / @wr_wait: the reader / writer
 * sleeps on head / tail (the other side wakes it); @dead: not 0 once the transfer failed (the
 * daemon or either side sets it and wakes all three words). @magic.. @nchunks are informational:
 * each side uses the values of its RingXfer.
 */
struct tpw_pring_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t chunk_bytes;
	uint32_t nchunks;
	uint8_t pad0[48];
	uint32_t head;
	uint32_t rd_wait;
	uint8_t pad1[56];
	uint32_t tail;
	uint32_t wr_wait;
	uint8_t pad2[56];
	uint32_t dead;
	uint8_t pad3[60];
};

/*
 * tpw_pring_xfer_check() - bounds of a RingXfer: ids not 0 (an offer: id 0, the writer's, its
 * fd following, no segments), as many addresses as lengths, at
 * most @lim->segments_max of them, each length > 0, their sum within @lim->message_bytes_max,
 * chunk size and count within TPW_PRING_* bounds. Borrows @x and @lim.
 * Return: 0, or -EBADMSG with the reason in @why.
 */
int tpw_pring_xfer_check(const Tpw__V1__RingXfer *x, const struct tpw_limits *lim, char *why,
			 size_t wl);

/* Bytes of a ring's memfd of @nchunks chunks of @chunk_bytes (both within bounds). */
/* The geometry of the rings this daemon makes (the libraries take each RingXfer's own, checked):
 * 8 chunks of 128 KiB, docs/benchmarks.md "The pipe ring's geometry". */
#define TPW_PRING_CHUNK (128u << 10)
#define TPW_PRING_NCHUNKS 8u

static inline size_t tpw_pring_file_bytes(uint32_t chunk_bytes, uint32_t nchunks)
{
	return TPW_PRING_HDR_BYTES + (size_t)chunk_bytes * nchunks;
}

/* Wakes every waiter on futex word @word of a shared mapping. Borrows @word. */
void tpw_pring_wake(uint32_t *word);
/* Waits on futex word @word of a shared mapping while it holds @val, at most @ms ms (it may
 * return early). Borrows @word. */
void tpw_pring_wait(uint32_t *word, uint32_t val, int ms);
/* Marks the ring of @h dead and wakes both sides. Borrows @h. */
void tpw_pring_kill(struct tpw_pring_hdr *h);

#endif
