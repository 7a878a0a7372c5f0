/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * shm channel: a copy between two ranges the daemon has mapped (clients' shared buffers, inline
 * data the daemon holds). Bounds were checked by the daemon before the transfer was built; this
 * file only copies.
 */
#include <string.h>
#include "../tpb.h"
#include "../base/work.h"
#include "tpu.h"

static int shm_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return 1;
}

static int shm_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	void *dst = (void *)(uintptr_t)x->dst.addr;
	const void *src = (const void *)(uintptr_t)x->src.addr;

	/* A whole chunk is part of a copy of 1 MiB or more (the copy threads cut copies into
	 * chunks): non-temporal stores, which do not first read every destination line from
	 * memory (16 and 64 MiB pipes: 1.7x to 2x; docs/benchmarks.md, "Large shared-memory
	 * copies of the daemon stream"). Below, plain memcpy(): the reader may find it cached. */
	if (x->len >= TPB_WORK_CHUNK)
		tpu_copy_stream(dst, src, x->len);
	else if (x->len)
		memcpy(dst, src, x->len);
	return 0;
}

const struct tpb_channel_ops tpb_shm_ops = {
	.name = "shm",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_DST_LOCAL,
	.probe = shm_probe,
	.copy = shm_copy,
	TPB_SYNC_OPS, /* its kernel on the daemon's copy threads */
};
