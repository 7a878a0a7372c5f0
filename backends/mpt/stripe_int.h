/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the two halves of a stripe share: the stripe, its connections and a sender's claim, and
 * the calls between the queue and completion side (stripe.c) and the connection threads
 * (stripe_io.c). Nothing outside those two files includes it; the rest of the daemon sees
 * stripe.h. The locking rules are stripe.c's: every "lock" below is the stripe's mutex.
 */
#ifndef TPB_STRIPE_INT_H
#define TPB_STRIPE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "../base/cq.h"
#include "hmap.h"
#include "stripe.h"

/* One chunk a sender claimed. */
struct claim {
	struct tpb_work_chunk w; /* from the stripe's engine */
	struct tpb_stripe_xfer *x;
	struct tpb_mem mem; /* of its segment */
	uint32_t seg;
	uint32_t len;
	uint64_t off;
	int src_err; /* the source could not be read: nothing was sent */
	char src_why[120]; /* why, when the channel said more than the errno */
};

/* Encrypted records waiting for the socket (stripe_io.c's send_queued()). */
struct tpb_stripe_txq {
	uint8_t *buf;
	size_t len, cap;
	bool failed; /* an append found no memory */
};

struct conn {
	struct tpb_stripe *st;
	unsigned index;
	int fd;
	struct ssl_st *ssl;	  /* TLS on this connection (tensor bytes encrypted), or NULL */
	pthread_mutex_t ssl_lock; /* one thread at a time in @ssl (stripe_io.c) */
	bool txq_bio;		  /* @ssl writes its records into @txq (no kTLS send) */
	struct tpb_stripe_txq txq;	 /* ssl_lock */
	struct tpb_stripe_txq txq_spare; /* the sender's */
	pthread_t tx, rx;
	bool failed; /* lock */
	bool idle;   /* lock: its sender waits for work */
	bool handed; /* lock: @handoff is its next chunk */
	struct tpb_stripe_xfer *rx_x; /* lock: the receive its receiver writes a chunk of, or NULL */
	bool rx_local; /* atomic: its receiver is in a copy into process memory (CMA, CUDA) */
	struct claim handoff;
	pthread_cond_t wake; /* its sender waits here, for a chunk handed to it or to stop */
};

struct tpb_stripe {
	pthread_mutex_t lock;
	struct conn conns[TPB_STRIPE_CONNS_MAX];
	unsigned n_conns;      /* loop thread */
	unsigned hand_next;    /* loop thread: the connection send_hand_out() tries first */
	unsigned n_live;       /* added and not failed: lock, read atomically */
	bool stopping;	       /* lock */
	struct tpb_work *work; /* sends with chunks left to claim (called with the lock held) */
	struct tpu_hmap recvs; /* xfer_id -> registered receive not yet complete */
	struct tpb_cq cq;      /* complete, not yet delivered (pushed with the lock held) */
	bool *alive; /* loop thread: cleared when a done callback frees the stripe */
	uint32_t chunk;
	uint32_t send_size; /* bytes per socket write, header included */
	char name[48];
	tpb_stripe_error_fn on_error;
	void *arg;
	bool failed, err_reported; /* lock */
	int err;
	char why[200];
	uint64_t sent, received; /* atomic */
	unsigned local; /* atomic: threads in a copy from or into process memory right now */
};

/* ---- stripe.c, for the connection threads (lock held for all of them) ---- */

/* Records the first error of @x (a status >= 0 or a second error changes nothing). */
void tpb_stripe_set_status(struct tpb_stripe_xfer *x, int status, const char *fmt, ...)
	_printf_(3, 4);

/* Completes receive @x once what is expected arrived (or it ended) and no thread writes it. */
void tpb_stripe_recv_check(struct tpb_stripe *st, struct tpb_stripe_xfer *x);

/* Connection @c failed: the first failure of the stripe is reported once, on the loop; @c stops
 * (its sender exits, its receiver wakes up). */
void tpb_stripe_conn_fail(struct conn *c, int err, const char *fmt, ...) _printf_(3, 4);

/* Claims the next chunk of the queued sends into @k. Return: 0, or -EAGAIN with none. */
int tpb_stripe_claim(struct tpb_stripe *st, struct claim *k);

/* Chunk @k of a send ended: sent (@status 0), or not (@status < 0, @why says why). */
void tpb_stripe_send_account(struct tpb_stripe *st, const struct claim *k, int status,
			     const char *why);

/* ---- stripe_io.c ---- */

/* The sender and receiver threads of connection @arg (a struct conn). */
void *tpb_stripe_io_tx_main(void *arg);
void *tpb_stripe_io_rx_main(void *arg);

#endif
