/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The static, ordered list of channels, their probe results, and selection by capability.
 * Order is priority: the first viable channel that can handle a (source, destination) pair wins.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "tpb.h"

static struct tpb_channel_info channels[] = {
	{ .ops = &tpb_shm_ops }, /* local <-> local only: before cma, which also accepts it */
	{ .ops = &tpb_cma_ops },
	{ .ops = &tpb_basic_ops },
};

#define N_CHANNELS (sizeof(channels) / sizeof(channels[0]))

void tpb_registry_init(const struct tpb_config *cfg)
{
	for (size_t i = 0; i < N_CHANNELS; i++) {
		channels[i].why[0] = '\0';
		channels[i].viable = channels[i].ops->probe(cfg, channels[i].why,
							    sizeof(channels[i].why)) > 0;
	}
}

const struct tpb_channel_info *tpb_registry_list(size_t *ret_n)
{
	*ret_n = N_CHANNELS;
	return channels;
}

static uint32_t caps_for(enum tpb_loc src, enum tpb_loc dst)
{
	return (src == TPB_LOC_LOCAL ? TPB_CAP_SRC_LOCAL : TPB_CAP_SRC_PROCESS) |
	       (dst == TPB_LOC_LOCAL ? TPB_CAP_DST_LOCAL : TPB_CAP_DST_PROCESS);
}

int tpb_select(enum tpb_loc src, enum tpb_loc dst)
{
	uint32_t need = caps_for(src, dst);

	for (size_t i = 0; i < N_CHANNELS; i++)
		if (channels[i].viable && channels[i].ops->copy &&
		    (channels[i].ops->caps & need) == need)
			return (int)i;
	return -EOPNOTSUPP;
}

int tpb_index(const char *name)
{
	for (size_t i = 0; i < N_CHANNELS; i++)
		if (strcmp(channels[i].ops->name, name) == 0)
			return (int)i;
	return -ENOENT;
}

int tpb_copy(int idx, const struct tpb_xfer *x, struct tpb_scratch *s)
{
	if (idx < 0 || (size_t)idx >= N_CHANNELS || !channels[idx].ops->copy)
		return -EOPNOTSUPP;
	return channels[idx].ops->copy(x, s);
}

const char *tpb_name(int idx)
{
	if (idx < 0 || (size_t)idx >= N_CHANNELS)
		return "?";
	return channels[idx].ops->name;
}
