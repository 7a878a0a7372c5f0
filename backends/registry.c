/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The static, ordered list of channels, their probe results, and the one selection function
 * for any (source, destination) pair, same host or between hosts. Order is priority: the
 * channels named in [backends] priority first, in that order, then the built-in order; the first
 * viable channel that can handle a pair wins. Between hosts the built-in order prefers the
 * channels that move bytes without the daemons' CPUs (rdma, cuda_gdr) to the data connections
 * (mpt, cuda_basic); a priority list that names a channel overrides that. Moving bytes is the
 * channels' own business (their op tables), not this file's.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "tpb.h"
#include "tpb_int.h"

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
_Static_assert(N_CHANNELS <= TPB_CHANNELS_MAX, "TPB_CHANNELS_MAX");

/*
 * Built-in preference between hosts, for the channels the priority list does not name: RDMA
 * writes before the data connections. The listing order (builtin[], shown by tpipctl and
 * counted by the metrics) does not change.
 */
static const struct tpb_channel_ops *const cross_builtin[] = {
	&tpb_rdma_ops,
	&tpb_cuda_gdr_ops,
	&tpb_mpt_ops,
	&tpb_cuda_basic_ops,
};

static struct tpb_channel_info channels[N_CHANNELS];
static size_t n_named;		       /* channels[0..n_named) were named by the priority list */
static unsigned cross_order[N_CHANNELS]; /* indices into channels[], between-hosts rank */
static size_t n_cross;
unsigned tpb_probe_round;

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
	n_named = front;
	return 0;
}

/* The between-hosts rank: named cross-host channels first, then cross_builtin[] order. */
static void order_cross(void)
{
	n_cross = 0;
	for (size_t i = 0; i < n_named; i++)
		if (channels[i].ops->caps & TPB_CAP_CROSS_HOST)
			cross_order[n_cross++] = (unsigned)i;
	for (size_t k = 0; k < sizeof(cross_builtin) / sizeof(cross_builtin[0]); k++)
		for (size_t i = n_named; i < N_CHANNELS; i++)
			if (channels[i].ops == cross_builtin[k])
				cross_order[n_cross++] = (unsigned)i;
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

	tpb_probe_round++; /* shared probes (RDMA) run again, once */
	n_named = 0;
	for (size_t i = 0; i < N_CHANNELS; i++)
		channels[i] = (struct tpb_channel_info){ .ops = builtin[i] };
	if (cfg && cfg->priority && *cfg->priority && apply_priority(cfg->priority) < 0) {
		for (size_t i = 0; i < N_CHANNELS; i++)
			channels[i] = (struct tpb_channel_info){ .ops = builtin[i] };
		n_named = 0;
		r = -EINVAL;
	}
	order_cross();
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
	return l == TPB_LOC_LOCAL  ? "local" :
	       l == TPB_LOC_CUDA   ? "cuda" :
	       l == TPB_LOC_REMOTE ? "remote" :
				     "process";
}

/* "local", or "remote local" for memory of that kind on another host. */
static const char *mem_name(const struct tpb_mem *m, char *buf, size_t len)
{
	if (m->loc != TPB_LOC_REMOTE)
		return tpb_loc_name(m->loc);
	snprintf(buf, len, "remote %s", tpb_loc_name(m->remote));
	return buf;
}

/* Why channel @c cannot serve a pair that needs @need. */
static const char *pass_reason(const struct tpb_channel_info *c, uint32_t need)
{
	return !c->viable			? c->why :
	       (c->ops->caps & need) != need	? "cannot copy these kinds of memory" :
						  "only for pairs with process or CUDA memory";
}

int tpb_select_pair(const struct tpb_mem *src, const struct tpb_mem *dst, char *why,
		    size_t why_len)
{
	bool cross = src->loc == TPB_LOC_REMOTE || dst->loc == TPB_LOC_REMOTE;
	enum tpb_loc sk = src->loc == TPB_LOC_REMOTE ? src->remote : src->loc;
	enum tpb_loc dk = dst->loc == TPB_LOC_REMOTE ? dst->remote : dst->loc;
	uint32_t need = src_cap(sk) | dst_cap(dk) | (cross ? TPB_CAP_CROSS_HOST : 0);
	bool process = sk == TPB_LOC_PROCESS || dk == TPB_LOC_PROCESS;
	bool cuda = sk == TPB_LOC_CUDA || dk == TPB_LOC_CUDA;
	size_t n = cross ? n_cross : N_CHANNELS, off = 0;
	char skipped[512] = "", sn[32], dn[32];

	if ((src->loc == TPB_LOC_REMOTE && dst->loc == TPB_LOC_REMOTE) || sk == TPB_LOC_REMOTE ||
	    dk == TPB_LOC_REMOTE)
		return -EINVAL; /* both sides on other hosts, or a remote kind that is no kind */
	for (size_t k = 0; k < n; k++) {
		size_t i = cross ? cross_order[k] : k;
		const struct tpb_channel_info *c = &channels[i];
		uint32_t caps = c->ops->caps;

		/* Same host: a channel with a copy op; between hosts: a cross-host channel. */
		if (cross ? !(caps & TPB_CAP_CROSS_HOST) : !c->ops->copy)
			continue;
		if (c->viable && (caps & need) == need && needs_met(caps, process, cuda)) {
			if (why)
				snprintf(why, why_len, "first viable for %s>%s memory%s in priority "
					 "order%s%s", mem_name(src, sn, sizeof(sn)),
					 mem_name(dst, dn, sizeof(dn)), cross ? " between hosts" : "",
					 off ? "; passed over: " : "", skipped);
			return (int)i;
		}
		if (why && off < sizeof(skipped) - 1)
			off += (size_t)snprintf(skipped + off, sizeof(skipped) - off, "%s%s: %.80s",
						off ? ", " : "", c->ops->name, pass_reason(c, need));
	}
	if (why)
		snprintf(why, why_len, "no channel can copy %s>%s memory %s%s%s",
			 mem_name(src, sn, sizeof(sn)), mem_name(dst, dn, sizeof(dn)),
			 cross ? "between hosts" : "on this host", off ? ": " : "", skipped);
	return -EOPNOTSUPP;
}

int tpb_select_why(enum tpb_loc src, enum tpb_loc dst, char *why, size_t why_len)
{
	struct tpb_mem s = { .loc = src }, d = { .loc = dst };

	return tpb_select_pair(&s, &d, why, why_len);
}

int tpb_select(enum tpb_loc src, enum tpb_loc dst)
{
	return tpb_select_why(src, dst, NULL, 0);
}

size_t tpb_peer_offers(bool (*keep)(const char *name, void *arg), void *arg, const char **ret,
		       size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < N_CHANNELS && n < max; i++) {
		const struct tpb_channel_info *c = &channels[i];

		if (c->viable && (c->ops->caps & (TPB_CAP_CROSS_HOST | TPB_CAP_INLINE)) &&
		    (!keep || keep(c->ops->name, arg)))
			ret[n++] = c->ops->name;
	}
	return n;
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

bool tpb_takes_offer(int idx)
{
	return idx >= 0 && (size_t)idx < N_CHANNELS && channels[idx].ops->prepare;
}

const char *tpb_name(int idx)
{
	if (idx < 0 || (size_t)idx >= N_CHANNELS)
		return "?";
	return channels[idx].ops->name;
}
