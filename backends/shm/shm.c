/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * shm channel: memcpy between two ranges the daemon has mapped (clients' shared buffers, inline
 * data the daemon holds). Bounds were checked by the daemon before the transfer was built; this
 * file only copies.
 */
#include <string.h>
#include "../tpb.h"

static int shm_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return 1;
}

static int shm_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	if (x->len)
		memcpy((void *)(uintptr_t)x->dst.addr, (const void *)(uintptr_t)x->src.addr, x->len);
	return 0;
}

const struct tpb_channel_ops tpb_shm_ops = {
	.name = "shm",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_DST_LOCAL,
	.probe = shm_probe,
	.copy = shm_copy,
	TPB_SYNC_OPS, /* its kernel on the daemon's copy threads */
};
