/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * basic channel: small messages whose bytes travel inside the control transport's frames (the
 * writer's data tail, then the reader's eager descriptor). There is nothing to copy on a thread,
 * so it has no copy op; it is listed so that negotiation and tpipctl can name it.
 */
#include "../tpb.h"

static int basic_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return 1;
}

const struct tpb_channel_ops tpb_basic_ops = {
	.name = "basic",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_SAME_HOST | TPB_CAP_INLINE,
	.probe = basic_probe,
	.copy = NULL,
};
