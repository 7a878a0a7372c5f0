/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The static, ordered list of channels, their probe results, and selection by capability.
 * Order is priority: the first viable channel that can handle a (source, destination) pair wins.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "tpb.h"

/* Built-in priority: the first viable channel that can handle a pair wins. */
static const struct tpb_channel_ops *const builtin[] = {
	&tpb_shm_ops, /* local <-> local: one memcpy */
	&tpb_cma_ops,
	&tpb_cuda_ipc_ops, /* pairs with CUDA memory on one host */
	&tpb_basic_ops,
	/* Between hosts only: never chosen by tpb_select() (no copy op), by tpb_select_cross(). */
	&tpb_mpt_ops,
	&tpb_rdma_ops, /* shared buffers on both sides, where both daemons have an RDMA port */
	&tpb_cuda_gdr_ops,
	&tpb_cuda_basic_ops,
};

#define N_CHANNELS (sizeof(builtin) / sizeof(builtin[0]))

static struct tpb_channel_info channels[N_CHANNELS];

/* Moves the channels named in @priority to the front, in that order. */
static int apply_priority(const char *priority)
{
	char buf[256], *save = NULL;
	size_t front = 0;

	snprintf(buf, sizeof(buf), "%s", priority);
	for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		size_t i;
		for (i = front; i < N_CHANNELS && strcmp(channels[i].ops->name, tok) != 0; i++)
			;
		if (i == N_CHANNELS)
			return -EINVAL;
		struct tpb_channel_info t = channels[i];
		memmove(&channels[front + 1], &channels[front], (i - front) * sizeof(t));
		channels[front++] = t;
	}
	return 0;
}

int tpb_priority_check(const char *priority, char *bad, size_t bad_len)
{
	char buf[256], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", priority);
	for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		size_t i;
		for (i = 0; i < N_CHANNELS && strcmp(builtin[i]->name, tok) != 0; i++)
			;
		if (i == N_CHANNELS) {
			snprintf(bad, bad_len, "%s", tok);
			return -EINVAL;
		}
	}
	return 0;
}

static bool disabled(const struct tpb_config *cfg, const struct tpb_channel_ops *ops)
{
	if (!cfg)
		return false;
	return (cfg->cma_disabled && ops == &tpb_cma_ops) ||
	       (cfg->shm_disabled && ops == &tpb_shm_ops) ||
	       (cfg->rdma_disabled && (ops == &tpb_rdma_ops || ops == &tpb_cuda_gdr_ops));
}

int tpb_registry_init(const struct tpb_config *cfg)
{
	int r = 0;

	for (size_t i = 0; i < N_CHANNELS; i++)
		channels[i] = (struct tpb_channel_info){ .ops = builtin[i] };
	if (cfg && cfg->priority && *cfg->priority && apply_priority(cfg->priority) < 0) {
		for (size_t i = 0; i < N_CHANNELS; i++)
			channels[i] = (struct tpb_channel_info){ .ops = builtin[i] };
		r = -EINVAL;
	}
	for (size_t i = 0; i < N_CHANNELS; i++) {
		if (disabled(cfg, channels[i].ops)) {
			snprintf(channels[i].why, sizeof(channels[i].why), "disabled by configuration");
			continue;
		}
		channels[i].viable = channels[i].ops->probe(cfg, channels[i].why,
							    sizeof(channels[i].why)) > 0;
	}
	return r;
}

const struct tpb_channel_info *tpb_registry_list(size_t *ret_n)
{
	*ret_n = N_CHANNELS;
	return channels;
}

static uint32_t src_cap(enum tpb_loc l)
{
	return l == TPB_LOC_LOCAL ? TPB_CAP_SRC_LOCAL :
	       l == TPB_LOC_CUDA  ? TPB_CAP_SRC_CUDA :
				    TPB_CAP_SRC_PROCESS;
}

static uint32_t dst_cap(enum tpb_loc l)
{
	return l == TPB_LOC_LOCAL ? TPB_CAP_DST_LOCAL :
	       l == TPB_LOC_CUDA  ? TPB_CAP_DST_CUDA :
				    TPB_CAP_DST_PROCESS;
}

/* Whether channel @caps may serve a pair: "needs" flags name a kind one side must have. */
static bool needs_met(uint32_t caps, bool process, bool cuda)
{
	return (process || !(caps & TPB_CAP_NEEDS_PROCESS)) &&
	       (cuda || !(caps & TPB_CAP_NEEDS_CUDA));
}

const char *tpb_loc_name(enum tpb_loc l)
{
	return l == TPB_LOC_LOCAL ? "local" : l == TPB_LOC_CUDA ? "cuda" : "process";
}

int tpb_select_why(enum tpb_loc src, enum tpb_loc dst, char *why, size_t why_len)
{
	uint32_t need = src_cap(src) | dst_cap(dst);
	bool process = src == TPB_LOC_PROCESS || dst == TPB_LOC_PROCESS;
	bool cuda = src == TPB_LOC_CUDA || dst == TPB_LOC_CUDA;
	char skipped[512] = "";
	size_t off = 0;

	for (size_t i = 0; i < N_CHANNELS; i++) {
		const struct tpb_channel_info *c = &channels[i];
		uint32_t caps = c->ops->caps;
		const char *no;

		if (c->viable && c->ops->copy && (caps & need) == need &&
		    needs_met(caps, process, cuda)) {
			if (why)
				snprintf(why, why_len, "first viable for %s>%s memory in priority order%s%s",
					 tpb_loc_name(src), tpb_loc_name(dst),
					 off ? "; passed over: " : "", skipped);
			return (int)i;
		}
		if (!why || off >= sizeof(skipped) - 1)
			continue;
		if (!c->ops->copy)
			continue; /* a between-hosts channel: never a candidate here */
		no = !c->viable		       ? c->why
		     : (caps & need) != need   ? "cannot copy these kinds of memory"
					       : "only for pairs with process or CUDA memory";
		off += (size_t)snprintf(skipped + off, sizeof(skipped) - off, "%s%s: %.80s",
					off ? ", " : "", c->ops->name, no);
	}
	if (why)
		snprintf(why, why_len, "no channel can copy %s>%s memory on this host%s%s",
			 tpb_loc_name(src), tpb_loc_name(dst), off ? ": " : "", skipped);
	return -EOPNOTSUPP;
}

int tpb_select(enum tpb_loc src, enum tpb_loc dst)
{
	return tpb_select_why(src, dst, NULL, 0);
}

int tpb_select_cross(enum tpb_loc mine, bool sending, char *why, size_t why_len)
{
	uint32_t need = TPB_CAP_CROSS_HOST | (sending ? src_cap(mine) : dst_cap(mine));
	bool cuda = mine == TPB_LOC_CUDA;
	const char *first_why = NULL;

	for (size_t i = 0; i < N_CHANNELS; i++) {
		uint32_t caps = channels[i].ops->caps;
		if ((caps & need) != need || !needs_met(caps, true, cuda))
			continue;
		if (channels[i].viable)
			return (int)i;
		if (!first_why)
			first_why = channels[i].why;
	}
	snprintf(why, why_len, "no channel can move %s memory between hosts%s%s",
		 cuda ? "CUDA" : "this", first_why ? ": " : "", first_why ? first_why : "");
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
