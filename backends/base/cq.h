/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_cq: the completion queue the backends' worker threads hand finished work back through,
 * so that no backend touches the daemon's event loop. Workers push a node (any thread); the
 * queue's eventfd turns readable; the owner of the loop polls that fd and, on its thread, acks
 * it and pops the nodes one at a time to run their completions. One queue per engine (the copy
 * threads' tpb_work, a peer link's stripe, a same-host channel context); it knows nothing about
 * what the nodes are, and does not run the completions itself (its owner does, so that a
 * completion may free the owner).
 */
#ifndef TPB_CQ_H
#define TPB_CQ_H

#include <pthread.h>
#include "tpu.h"

struct tpb_cq {
	pthread_mutex_t lock; /* guards @ready */
	struct tpu_list ready;
	int efd;
};

/*
 * tpb_cq_init() - an empty queue with its eventfd (CLOEXEC, non-blocking) in @cq (the caller's
 * storage). On failure @cq->efd is -EBADF, which tpb_cq_done() accepts.
 * Return: 0 or -errno from eventfd().
 */
int tpb_cq_init(struct tpb_cq *cq);

/*
 * tpb_cq_done() - close @cq's eventfd. Nodes still queued are the caller's again (pop them
 * first). Borrows @cq. Accepts a queue whose tpb_cq_init() failed.
 */
void tpb_cq_done(struct tpb_cq *cq);

/*
 * tpb_cq_push() - queue @node (not linked anywhere) and make the eventfd readable. Any thread.
 * Ownership: keeps @node until tpb_cq_pop() returns it.
 */
void tpb_cq_push(struct tpb_cq *cq, struct tpu_list *node);

/* tpb_cq_wake() - make the eventfd readable with nothing queued (the owner has other news, e.g.
 * a failure to report). Any thread. Borrows @cq. */
void tpb_cq_wake(struct tpb_cq *cq);

/* The fd that is readable while the queue has news. Return: the fd, borrowed (valid until
 * tpb_cq_done(); never close it). */
int tpb_cq_event_fd(const struct tpb_cq *cq);

/* tpb_cq_ack() - consume the eventfd's count (the owner then pops everything it finds; a push
 * after this makes the fd readable again). Loop thread. Borrows @cq. */
void tpb_cq_ack(struct tpb_cq *cq);

/*
 * tpb_cq_pop() - the oldest queued node, unlinked, or NULL. Loop thread.
 * Return: the node pushed, the caller's again.
 */
struct tpu_list *tpb_cq_pop(struct tpb_cq *cq);

#endif
