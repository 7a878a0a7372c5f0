/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipe rings: RingXfer bounds and the futex helpers on the ring header's words (see pring.h).
 * Nothing here maps or copies; the daemon and the client library do.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "pring.h"
#include "tpu.h"

int tpw_pring_xfer_check(const Tpw__V1__RingXfer *x, const struct tpw_limits *lim, char *why,
			 size_t wl)
{
	uint64_t total = 0;

	if (x->pipe_id == 0 || (x->id == 0) != x->offer || (x->offer && x->reader) ||
	    (x->offer && (!x->fd_follows || x->n_lens)))
		return tpu_why(-EBADMSG, why, wl, "ring %s of pipe %llu id %llu",
			       x->offer ? "offer" : "transfer", (unsigned long long)x->pipe_id,
			       (unsigned long long)x->id);
	if (x->chunk_bytes < TPW_PRING_CHUNK_MIN || x->chunk_bytes > TPW_PRING_CHUNK_MAX ||
	    x->chunk_bytes % 64 || x->nchunks < TPW_PRING_NCHUNKS_MIN ||
	    x->nchunks > TPW_PRING_NCHUNKS_MAX)
		return tpu_why(-EBADMSG, why, wl, "ring of %u chunks of %u bytes", x->nchunks,
			       x->chunk_bytes);
	if (x->n_addrs != x->n_lens || x->n_lens > lim->segments_max)
		return tpu_why(-EBADMSG, why, wl, "ring transfer of %zu addresses, %zu lengths",
			       x->n_addrs, x->n_lens);
	for (size_t i = 0; i < x->n_lens; i++) {
		if (x->lens[i] == 0 || x->lens[i] > lim->message_bytes_max - total)
			return tpu_why(-EBADMSG, why, wl, "ring transfer segment %zu of %llu bytes",
				       i, (unsigned long long)x->lens[i]);
		total += x->lens[i];
	}
	return 0;
}

void tpw_pring_wake(uint32_t *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void tpw_pring_wait(uint32_t *word, uint32_t val, int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	syscall(SYS_futex, word, FUTEX_WAIT, val, &ts, NULL, 0);
}

void tpw_pring_kill(struct tpw_pring_hdr *h)
{
	__atomic_store_n(&h->dead, 1, __ATOMIC_SEQ_CST);
	tpw_pring_wake(&h->dead);
	tpw_pring_wake(&h->head);
	tpw_pring_wake(&h->tail);
}
