/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpt channel: tensors between hosts, cut into chunks striped over the N data connections of a
 * peer link (stripe.c runs the threads). It reads a shared buffer or a client's memory
 * (CMA) on the sending host and writes straight into the reader's allocation on the other. It
 * never serves a same-host pair, so it has no copy op here; it is listed so that tpipctl can
 * name it and the statistics can count it.
 */
#include "../tpb.h"

static int mpt_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return 1; /* TCP is always there */
}

const struct tpb_channel_ops tpb_mpt_ops = {
	.name = "mpt",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_DST_LOCAL |
		TPB_CAP_DST_PROCESS,
	.probe = mpt_probe,
	.copy = NULL,
};
