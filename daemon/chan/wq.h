/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_wq: the daemon's registry of work queues (daemon/chan/wq.c; docs/queues.md). A queue is
 * named within its creator's uid with an access mode like a channel's; the creator's handle is
 * its owner (submits questions, receives answers), other handles are workers (take questions,
 * reply to the ids they took). This part answers WqOp messages, requeues (or, at-most-once,
 * answers with an error) the questions of a worker whose session ends, closes and frees a queue
 * whose owner goes, and bounds queues per uid and questions, question bytes and answer bytes per
 * queue. Byte payloads ride in frames' data tails; questions and answers as messages are
 * channel items (wqmsg.c, wq_int.h). Channels are in chan.h.
 */
#ifndef TPD_WQ_H
#define TPD_WQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_wqs;
struct tpd_local;
struct tpd_peer;

/*
 * tpd_wq_new() - the part's state for @d (borrowed; must outlive it): no queue.
 * @ret: returns owned state, free with tpd_wq_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_wq_new(struct tpd_daemon *d, struct tpd_wqs **ret);

/* Frees every queue, its questions and answers, and @w. Accepts NULL. Call after the sessions
 * are gone. */
void tpd_wq_free(struct tpd_wqs *w);

/* Registers this part's ops on @l (borrowed), so that sessions hand work queue ops and their
 * end to it. Called once, before the first session attaches. */
void tpd_wq_serve_local(struct tpd_local *l);

/*
 * tpd_wq_ctl() - describe the queues for tpipctl queues: every one, or with @own_only only
 * those of uid @viewer.
 * @ret, @n: returns an owned array of owned messages, free with tpd_wq_ctl_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_wq_ctl(struct tpd_wqs *w, bool own_only, uid_t viewer, Tpw__V1__CtlQueue ***ret,
	       size_t *n);
void tpd_wq_ctl_free(Tpw__V1__CtlQueue **v, size_t n);

/*
 * tpd_wq_peer_op() - PeerWqOp @po (validated) from the far daemon of link @pr: OPEN of an
 * existing queue whose remote access admits @pr (a worker's handle, never a creation), or an op
 * on a handle @pr opened; answered over @pr (PeerWqReply). @tail (@tail_len bytes): a payload.
 * Borrows everything for the call. Takes, answer reads and drains that would wait are refused
 * with -ENOBUFS once the handles of @pr hold chan-peer-ops-max of them.
 */
void tpd_wq_peer_op(struct tpd_wqs *w, struct tpd_peer *pr, const Tpw__V1__PeerWqOp *po,
		    const uint8_t *tail, size_t tail_len);

/* Drops every handle link @pr opened here (the link failed): a worker's taken questions are
 * queued again as for a dead worker, an owner's queue closes as for a dead owner. Borrows both. */
void tpd_wq_peer_gone(struct tpd_wqs *w, struct tpd_peer *pr);

/* What the queues of a daemon hold, for the metrics page: every queue alive (with or without
 * its owner), and answers dropped since the start because their owner went first. */
struct tpd_wq_counts {
	uint32_t queues, ownerless;
	uint64_t questions; /* queued and taken */
	uint64_t answers;
	uint64_t bytes;	    /* question and answer bytes */
	uint64_t answers_dropped;
};

/* tpd_wq_counts() - fills @ret (written whole) from @w (borrowed). */
void tpd_wq_counts(const struct tpd_wqs *w, struct tpd_wq_counts *ret);

/* A new handle id of @w, unique among its handles (chanx.c's handles of remote queues take
 * theirs here too). */
uint64_t tpd_wq_new_id(struct tpd_wqs *w);

#endif
