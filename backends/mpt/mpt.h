/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The mpt channel's receive end (the sender's word on how its send ended, PeerXferEnd), the op
 * table's recv_expect: callers use tpb_recv_expect(). The op table itself (tpb_mpt_ops) is
 * reached through the registry and the tpb_*() wrappers.
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

#endif
