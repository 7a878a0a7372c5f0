/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The mpt channel's endpoint entries and its receive end (the sender's word on how its send
 * ended, PeerXferEnd), the op table's recv_expect: callers use the tpb_*() wrappers; the entries
 * are here for cuda_basic's row, which rides the same context. The op table itself
 * (tpb_mpt_ops) is reached through the registry and the wrappers.
 */
#ifndef TPB_MPT_H
#define TPB_MPT_H

#include <stdint.h>
#include "tpb.h"

/*
 * tpb_mpt_recv_expect() - the sender ended receive @op (started on mpt endpoint @ep) after
 * @bytes with @status (0 or -errno; @why: its message, or NULL): the receive completes once
 * @bytes have arrived, with @status (a status of 0 with fewer bytes than the receive's total:
 * -EIO). A status of 0 with every byte is a no-op; so is a receive that has ended already.
 * Borrows @ep, @op and @why for the call.
 * Return: 0, -EOPNOTSUPP (@ep is not an mpt endpoint), -ENOENT (@op is not a receive pending
 * on @ep).
 */
int tpb_mpt_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			const char *why);

/* tpb_mpt_recv_progress(), tpb_mpt_recv_stalled(): tpb_recv_progress() and tpb_recv_stalled()
 * for mpt and cuda_basic endpoints (a receive's own bytes; its stall fails it, and a connection
 * held in one of its chunks). Return: as those. */
int tpb_mpt_recv_progress(struct tpb_ep *ep, struct tpb_op *op, uint64_t *ret_bytes);
int tpb_mpt_recv_stalled(struct tpb_ep *ep, struct tpb_op *op, const char *why);

/*
 * The endpoint entries of the table (tpb_mpt_ops; cuda_basic's row names them too): callers use
 * the tpb_*() wrappers, whose contracts these follow. ep_open needs @peer->stripe (-EOPNOTSUPP
 * without); start is a send (every destination remote) or a receive (every source remote).
 */
int tpb_mpt_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret);
void tpb_mpt_ep_close(struct tpb_ep *ep);
int tpb_mpt_start(struct tpb_ep *ep, struct tpb_op *op);
int tpb_mpt_cancel(struct tpb_ep *ep, struct tpb_op *op);

/*
 * tpb_mpt_cuda_basic_ctx() - cuda_basic's head of the mpt context @mpt: tpb_ep_open() on it
 * gives an endpoint over a link's stripe that runs as cuda_basic (its completions come from
 * tpb_progress() on @mpt, which makes and frees it). Borrows @mpt.
 * Return: borrowed, valid until tpb_ctx_free(@mpt); NULL if @mpt (may be NULL) is not mpt's.
 */
struct tpb_ctx *tpb_mpt_cuda_basic_ctx(struct tpb_ctx *mpt);

#endif
