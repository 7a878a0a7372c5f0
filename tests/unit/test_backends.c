/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/: the registry's probe results and channel selection by capability,
 * and real copies by the shm and cma channels within this process (no hardware needed).
 */
#include <check.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tpb.h"

/* This process, pinned (one per forked test process). */
static struct tpb_proc *self_proc(void)
{
	static struct tpb_proc *p;
	static pid_t owner;

	if (!p || owner != getpid()) {
		int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(tpb_proc_new(fd, -EBADF, getpid(), geteuid(), getegid(), 0, &p), 0);
		owner = getpid();
	}
	return p;
}

static struct tpb_mem local(void *p)
{
	return (struct tpb_mem){ .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)p };
}

static struct tpb_mem proc(void *p)
{
	return (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = self_proc(),
				 .addr = (uint64_t)(uintptr_t)p };
}

START_TEST(test_select_prefers_shm_for_local_memory)
{
	struct tpb_config cfg = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_select_uses_cma_for_process_memory)
{
	struct tpb_config cfg = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_PROCESS)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_PROCESS)), "cma");
}
END_TEST

START_TEST(test_cma_disabled_is_not_viable_with_reason)
{
	struct tpb_config cfg = { .cma_disabled = true };
	const struct tpb_channel_info *ch;
	size_t n;
	int idx;

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL), -EOPNOTSUPP);
	ch = tpb_registry_list(&n);
	idx = tpb_index("cma");
	ck_assert_int_ge(idx, 0);
	ck_assert(!ch[idx].viable);
	ck_assert_str_eq(ch[idx].why, "disabled by configuration");
	/* shm still serves local memory */
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

/* rdma_disabled turns off both RDMA channels, with a reason, and nothing else. */
START_TEST(test_rdma_disabled_turns_off_rdma_and_cuda_gdr)
{
	struct tpb_config cfg = { .rdma_disabled = true };
	static const char *const off[] = { "rdma", "cuda_gdr" };
	const struct tpb_channel_info *ch;
	size_t n;

	tpb_registry_init(&cfg);
	ch = tpb_registry_list(&n);
	for (size_t i = 0; i < 2; i++) {
		int idx = tpb_index(off[i]);

		ck_assert_int_ge(idx, 0);
		ck_assert(!ch[idx].viable);
		ck_assert_str_eq(ch[idx].why, "disabled by configuration");
	}
	for (size_t i = 0; i < n; i++)
		if (strcmp(ch[i].ops->name, "rdma") != 0 && strcmp(ch[i].ops->name, "cuda_gdr") != 0)
			ck_assert_str_ne(ch[i].why, "disabled by configuration");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_basic_has_no_copy_op)
{
	struct tpb_config cfg = { 0 };
	struct tpb_xfer x = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_copy(tpb_index("basic"), &x, NULL), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_copy(99, &x, NULL), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_index("nope"), -ENOENT);
}
END_TEST

START_TEST(test_priority_reorders_but_cma_never_takes_local_pairs)
{
	struct tpb_config cfg = { .priority = "cma,shm" };
	const struct tpb_channel_info *ch;
	size_t n;

	ck_assert_int_eq(tpb_registry_init(&cfg), 0);
	ch = tpb_registry_list(&n);
	ck_assert_str_eq(ch[0].ops->name, "cma");
	ck_assert_str_eq(ch[1].ops->name, "shm");
	ck_assert_str_eq(ch[2].ops->name, "cuda_ipc");
	ck_assert_str_eq(ch[3].ops->name, "basic");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_priority_with_unknown_channel_keeps_builtin_order)
{
	struct tpb_config cfg = { .priority = "cma,gpu" };
	const struct tpb_channel_info *ch;
	char bad[16];
	size_t n;

	ck_assert_int_eq(tpb_priority_check("shm, cma", bad, sizeof(bad)), 0);
	ck_assert_int_eq(tpb_priority_check("cma,gpu", bad, sizeof(bad)), -EINVAL);
	ck_assert_str_eq(bad, "gpu");
	ck_assert_int_eq(tpb_registry_init(&cfg), -EINVAL);
	ch = tpb_registry_list(&n);
	ck_assert_str_eq(ch[0].ops->name, "shm");
	ck_assert_str_eq(ch[1].ops->name, "cma");
}
END_TEST

START_TEST(test_shm_disabled_leaves_no_channel_for_local_pairs)
{
	struct tpb_config cfg = { .shm_disabled = true };

	ck_assert_int_eq(tpb_registry_init(&cfg), 0);
	ck_assert_int_eq(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL), -EOPNOTSUPP);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_PROCESS)), "cma");
}
END_TEST

static void check_copy(const char *chan, bool src_proc, bool dst_proc, size_t len)
{
	struct tpb_config cfg = { 0 };
	char *a = malloc(len + 1), *b = calloc(1, len + 1);
	struct tpb_scratch s = { .bounce = malloc(4096), .bounce_len = 4096 };
	struct tpb_xfer x;

	tpb_registry_init(&cfg);
	for (size_t i = 0; i < len; i++)
		a[i] = (char)(i * 7 + 3);
	x.src = src_proc ? proc(a) : local(a);
	x.dst = dst_proc ? proc(b) : local(b);
	x.len = len;
	ck_assert_int_eq(tpb_copy(tpb_index(chan), &x, &s), 0);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	free(a);
	free(b);
	free(s.bounce);
}

START_TEST(test_shm_copies)
{
	check_copy("shm", false, false, 100000);
}
END_TEST

START_TEST(test_cma_reads_writes_and_bounces)
{
	check_copy("cma", true, false, 100000);
	check_copy("cma", false, true, 100000);
	check_copy("cma", true, true, 100000); /* through a 4 KiB bounce buffer, many rounds */
}
END_TEST

START_TEST(test_cma_unmapped_address_fails_cleanly)
{
	struct tpb_config cfg = { 0 };
	char buf[64];
	struct tpb_xfer x = { .src = { .loc = TPB_LOC_PROCESS, .proc = self_proc(), .addr = 8 },
			      .dst = local(buf), .len = sizeof(buf) };

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_copy(tpb_index("cma"), &x, NULL), -EFAULT);
}
END_TEST

/* ---- negotiation: which channel serves each (source, destination, same host or not) ---- */

static const char *sel(enum tpb_loc a, enum tpb_loc b)
{
	int i = tpb_select(a, b);
	return i < 0 ? "none" : tpb_name(i);
}

/* The channel between hosts for this side's @mine against the other host's memory of kind
 * @theirs, sending (@mine is the source) or receiving. */
static const char *sel_cross(enum tpb_loc mine, enum tpb_loc theirs, bool sending, char *why,
			     size_t wl)
{
	struct tpb_mem m = { .loc = mine }, o = { .loc = TPB_LOC_REMOTE, .remote = theirs };
	int i = sending ? tpb_select_pair(&m, &o, why, wl) : tpb_select_pair(&o, &m, why, wl);

	return i < 0 ? "none" : tpb_name(i);
}

START_TEST(test_negotiation_table)
{
	static const char *const order[] = { NULL, "cuda_ipc,cma,shm" };
	char why[256];
	bool cuda = tpb_cuda_viable(why, sizeof(why));
	const char *cu = cuda ? "cuda_ipc" : "none";

	if (!cuda)
		printf("backends: CUDA not viable here (%s): CUDA pairs must find no channel\n", why);
	for (size_t k = 0; k < 2; k++) {
		struct tpb_config cfg = { .priority = order[k] };
		size_t n_ch;
		bool gdr, rdma;

		ck_assert_int_eq(tpb_registry_init(&cfg), 0);
		gdr = tpb_registry_list(&n_ch)[tpb_index("cuda_gdr")].viable;
		rdma = tpb_registry_list(&n_ch)[tpb_index("rdma")].viable;
		/* CPU pairs: never a CUDA channel, whatever the priority. */
		ck_assert_str_eq(sel(TPB_LOC_LOCAL, TPB_LOC_LOCAL), "shm");
		ck_assert_str_eq(sel(TPB_LOC_LOCAL, TPB_LOC_PROCESS), "cma");
		ck_assert_str_eq(sel(TPB_LOC_PROCESS, TPB_LOC_LOCAL), "cma");
		ck_assert_str_eq(sel(TPB_LOC_PROCESS, TPB_LOC_PROCESS), "cma");
		/* Any pair with CUDA memory: cuda_ipc, or nothing without a driver. */
		ck_assert_str_eq(sel(TPB_LOC_CUDA, TPB_LOC_CUDA), cu);
		ck_assert_str_eq(sel(TPB_LOC_LOCAL, TPB_LOC_CUDA), cu);
		ck_assert_str_eq(sel(TPB_LOC_CUDA, TPB_LOC_LOCAL), cu);
		ck_assert_str_eq(sel(TPB_LOC_PROCESS, TPB_LOC_CUDA), cu);
		ck_assert_str_eq(sel(TPB_LOC_CUDA, TPB_LOC_PROCESS), cu);
		/* Between hosts: mpt for CPU memory either way, but rdma between shared buffers
		 * with an RDMA port (a real one, or the stand-in of the fakeverbs test setup); for
		 * CUDA cuda_gdr with an RDMA port, else cuda_basic. */
		for (int send = 0; send < 2; send++) {
			const char *cu_x = !cuda ? "none" : gdr ? "cuda_gdr" : "cuda_basic";

			ck_assert_str_eq(sel_cross(TPB_LOC_LOCAL, TPB_LOC_LOCAL, send, why,
						   sizeof(why)), rdma ? "rdma" : "mpt");
			ck_assert_str_eq(sel_cross(TPB_LOC_LOCAL, TPB_LOC_PROCESS, send, why,
						   sizeof(why)), "mpt");
			ck_assert_str_eq(sel_cross(TPB_LOC_PROCESS, TPB_LOC_LOCAL, send, why,
						   sizeof(why)), "mpt");
			ck_assert_str_eq(sel_cross(TPB_LOC_CUDA, TPB_LOC_LOCAL, send, why,
						   sizeof(why)), cu_x);
			ck_assert_str_eq(sel_cross(TPB_LOC_CUDA, TPB_LOC_CUDA, send, why,
						   sizeof(why)), cu_x);
			ck_assert_str_eq(sel_cross(TPB_LOC_LOCAL, TPB_LOC_CUDA, send, why,
						   sizeof(why)), cu_x);
			/* Private memory cannot be registered: never RDMA, with CUDA or not. */
			ck_assert_str_eq(sel_cross(TPB_LOC_PROCESS, TPB_LOC_CUDA, send, why,
						   sizeof(why)), cuda ? "cuda_basic" : "none");
			if (!cuda)
				ck_assert_ptr_nonnull(strstr(why, "CUDA"));
		}
	}
}
END_TEST

/*
 * [backends] priority decides between hosts too: mpt named first beats rdma, rdma named first
 * (or the built-in order) beats mpt, for shared buffers on both sides. rdma is viable only with
 * an RDMA port or the stand-in (the fakeverbs setup, and the hw suite's backends-fakeverbs);
 * without one, mpt is the only CPU channel between hosts whatever the priority says.
 */
START_TEST(test_priority_decides_between_hosts)
{
	static const struct {
		const char *priority, *with_rdma;
	} cases[] = {
		{ NULL, "rdma" },	  { "mpt", "mpt" },	  { "rdma", "rdma" },
		{ "mpt,rdma", "mpt" }, { "rdma,mpt", "rdma" }, { "shm,cma", "rdma" },
	};
	struct tpb_mem a = { .loc = TPB_LOC_LOCAL },
		       b = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL };
	char why[512];
	size_t n;

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct tpb_config cfg = { .priority = cases[k].priority };
		bool rdma;
		int i;

		ck_assert_int_eq(tpb_registry_init(&cfg), 0);
		rdma = tpb_registry_list(&n)[tpb_index("rdma")].viable;
		if (k == 0 && !rdma)
			printf("backends: rdma not viable here (%s): mpt whatever the priority\n",
			       tpb_registry_list(&n)[tpb_index("rdma")].why);
		/* Both directions: this side sending, and this side receiving. */
		i = tpb_select_pair(&a, &b, why, sizeof(why));
		ck_assert_str_eq(tpb_name(i), rdma ? cases[k].with_rdma : "mpt");
		ck_assert_msg(strstr(why, "between hosts"), "%s", why);
		i = tpb_select_pair(&b, &a, why, sizeof(why));
		ck_assert_str_eq(tpb_name(i), rdma ? cases[k].with_rdma : "mpt");
		if (strcmp(tpb_name(i), "mpt") == 0 && rdma)
			ck_assert_msg(!strstr(why, "passed over"), "mpt named first: %s", why);
		if (strcmp(cases[k].with_rdma, "rdma") == 0 && !rdma)
			ck_assert_msg(strstr(why, "passed over: rdma: "), "%s", why);
		/* Same-host pairs never take a between-hosts channel, and the other way round. */
		ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
	}
	/* Both sides on other hosts: not this daemon's transfer. */
	ck_assert_int_eq(tpb_select_pair(&b, &b, NULL, 0), -EINVAL);
}
END_TEST

/* PeerHello's list: viable channels that work between hosts or ride the link, in priority
 * order; a filter can leave one out. */
static bool no_mpt(const char *name, void *arg)
{
	++*(int *)arg;
	return strcmp(name, "mpt") != 0;
}

START_TEST(test_peer_offers_follow_the_registry)
{
	const char *v[16];
	size_t n;
	int calls = 0;
	bool rdma;

	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ .priority = "mpt" }), 0);
	rdma = tpb_registry_list(&n)[tpb_index("rdma")].viable;
	n = tpb_peer_offers(NULL, NULL, v, 16);
	ck_assert_uint_ge(n, 2);
	ck_assert_str_eq(v[0], "mpt");
	ck_assert_str_eq(v[1], "basic");
	for (size_t i = 2; i < n; i++) {
		ck_assert_int_eq(tpb_registry_list(&(size_t){ 0 })[tpb_index(v[i])].viable, true);
		ck_assert(strcmp(v[i], "shm") && strcmp(v[i], "cma") && strcmp(v[i], "cuda_ipc"));
	}
	ck_assert_uint_eq(n, 2 + rdma + (size_t)tpb_registry_list(&(size_t){ 0 })[
			     tpb_index("cuda_gdr")].viable + (size_t)tpb_registry_list(
			     &(size_t){ 0 })[tpb_index("cuda_basic")].viable);
	ck_assert_uint_eq(tpb_peer_offers(NULL, NULL, v, 1), 1);
	n = tpb_peer_offers(no_mpt, &calls, v, 16);
	ck_assert_int_ge(calls, 2);
	ck_assert_str_eq(v[0], "basic");
	for (size_t i = 0; i < n; i++)
		ck_assert_str_ne(v[i], "mpt");
}
END_TEST

/*
 * rdma and cuda_gdr share one RDMA probe per registry round: asking again within the round
 * gives the answer of the start, without probing (the stand-in's FAKEVERBS_NO_DEVICE, read at
 * every device listing, changes nothing until the next tpb_registry_init()). Without the
 * stand-in rdma is not viable either way.
 */
START_TEST(test_rdma_probed_once_per_round)
{
	const struct tpb_channel_info *ch;
	char why[128];
	size_t n;
	int viable;

	unsetenv("FAKEVERBS_NO_DEVICE");
	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	ch = tpb_registry_list(&n);
	viable = ch[tpb_index("rdma")].viable;
	ck_assert_int_eq(tpb_rdma_viable(why, sizeof(why)), viable);
	ck_assert_str_eq(why, ch[tpb_index("rdma")].why);
	if (ch[tpb_index("cuda_ipc")].viable)
		ck_assert_str_eq(ch[tpb_index("cuda_gdr")].why, ch[tpb_index("rdma")].why);
	setenv("FAKEVERBS_NO_DEVICE", "1", 1);
	ck_assert_int_eq(tpb_rdma_viable(why, sizeof(why)), viable); /* same round: no probe */
	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	ck_assert_int_eq(tpb_rdma_viable(why, sizeof(why)), 0); /* a new round probes again */
	ck_assert(!tpb_registry_list(&n)[tpb_index("rdma")].viable);
	ck_assert(!tpb_registry_list(&n)[tpb_index("cuda_gdr")].viable);
	unsetenv("FAKEVERBS_NO_DEVICE");
}
END_TEST

/* ---- the op table: dispatch wrappers and a same-host channel's life cycle ---- */

struct done_rec {
	int calls;
	int status;
	uint64_t bytes;
	char why[160];
	struct tpb_ep *close_in_done; /* closed from inside the callback, then NULL */
};

static void op_done(struct tpb_op *op)
{
	struct done_rec *d = op->arg;

	d->calls++;
	d->status = op->status;
	d->bytes = op->bytes;
	snprintf(d->why, sizeof(d->why), "%s", op->why);
	if (d->close_in_done) {
		tpb_ep_close(d->close_in_done);
		d->close_in_done = NULL;
	}
}

static bool fd_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

/* A channel that implements none of the asynchronous ops: every wrapper says -EOPNOTSUPP. */
START_TEST(test_op_wrappers_turn_missing_ops_into_eopnotsupp)
{
	static const struct tpb_channel_ops bare = { .name = "bare" };
	struct tpb_ctx ctx = { .ops = &bare };
	struct tpb_ep ep = { .ctx = &ctx }, *ret_ep = NULL;
	struct tpb_ctx *ret = NULL;
	struct tpb_op op = { .done = op_done };
	struct tpb_mem m = { .loc = TPB_LOC_LOCAL };
	char offer[8];
	size_t len = sizeof(offer);

	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	ck_assert_int_eq(tpb_ep_open(&ctx, NULL, &ret_ep), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_prepare(&ep, &op, offer, &len), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_start(&ep, &op), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_cancel(&ep, &op), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_forget(&ctx, &m, 1), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_event_fd(&ctx), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_progress(&ctx), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_recv_expect(&ep, &op, 1, 0, NULL), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_query(&ep, &(struct tpb_ep_info){ 0 }), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_msg(&ep, offer), -EOPNOTSUPP);
	ck_assert_uint_eq(tpb_offer_max(&ep, 4), 0);
	tpb_ep_close(&ep); /* no op: nothing happens */
	tpb_ctx_free(&ctx);
	tpb_ctx_free(NULL);
	tpb_ep_close(NULL);
	ck_assert_ptr_null(ret_ep);
	/* Registry channels without a context of their own (basic; between hosts, cuda_basic:
	 * its endpoints ride mpt's context, tests/unit/test_mpt.c), an index out of range, and a
	 * same-host channel turned off. */
	ck_assert_int_eq(tpb_ctx_new(tpb_index("basic"), NULL, NULL, &ret), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ctx_new(tpb_index("cuda_basic"), NULL, NULL, &ret), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ctx_new(-1, NULL, NULL, &ret), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ctx_new(64, NULL, NULL, &ret), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ .shm_disabled = true }), 0);
	ck_assert_int_eq(tpb_ctx_new(tpb_index("shm"), NULL, NULL, &ret), -ENODEV);
	ck_assert_ptr_null(ret);
}
END_TEST

static unsigned bound_starts;

static int bound_start(struct tpb_ep *ep, struct tpb_op *op)
{
	bound_starts++;
	return 0;
}

static size_t bound_offer_max(size_t n_xfers)
{
	return 8 + 4 * n_xfers;
}

/*
 * tpb_start() holds an offer to the channel's bound (offer_max for the op's xfers): one byte
 * over is -EPROTO with a reason and never reaches the channel; the bound itself does, and the
 * op learns the endpoint's registry index. A channel with no offer_max takes no offer at all.
 */
START_TEST(test_start_refuses_an_offer_over_the_channels_bound)
{
	static const struct tpb_channel_ops bounded = { .name = "bounded", .start = bound_start,
							.offer_max = bound_offer_max };
	static const struct tpb_channel_ops plain = { .name = "plain", .start = bound_start };
	struct tpb_ctx ctx = { .ops = &bounded, .idx = 5 }, pctx = { .ops = &plain, .idx = 6 };
	struct tpb_ep ep = { .ctx = &ctx }, pep = { .ctx = &pctx };
	struct tpb_xfer x[2] = { { .len = 1 }, { .len = 1 } };
	uint8_t offer[32] = { 0 };
	struct tpb_op op = { .xfers = x, .n_xfers = 2, .offer = offer, .done = op_done,
			     .channel = -1 };

	ck_assert_uint_eq(tpb_offer_max(&ep, 2), 16);
	op.offer_len = 17;
	ck_assert_int_eq(tpb_start(&ep, &op), -EPROTO);
	ck_assert_ptr_nonnull(strstr(op.why, "17 bytes"));
	ck_assert_uint_eq(bound_starts, 0);
	ck_assert_int_eq(op.channel, -1);
	op.offer_len = 16;
	ck_assert_int_eq(tpb_start(&ep, &op), 0);
	ck_assert_uint_eq(bound_starts, 1);
	ck_assert_int_eq(op.channel, 5);
	/* No offer_max: no offer, however short; no offer at all is fine. */
	op.offer_len = 1;
	ck_assert_int_eq(tpb_start(&pep, &op), -EPROTO);
	ck_assert_uint_eq(bound_starts, 1);
	op.offer = NULL;
	op.offer_len = 0;
	ck_assert_int_eq(tpb_start(&pep, &op), 0);
	ck_assert_uint_eq(bound_starts, 2);
	ck_assert_int_eq(op.channel, 6);
}
END_TEST

/*
 * shm through the table: context, endpoint to this host (a remote peer is refused), start
 * (no callback inside the call; the event fd turns readable; progress runs it once, with the
 * bytes), cancel (of a finished op: -ENOENT; of one not yet delivered: -ECANCELED), the
 * channel's needless ops (-EOPNOTSUPP), closing an endpoint from a callback and with an op
 * owed, and a context freed with a completion owed (it runs inside tpb_ctx_free()).
 */
START_TEST(test_shm_life_cycle_through_the_op_table)
{
	static const char *const offers[] = { "shm" };
	struct tpb_peer remote = { .name = "hostB", .offers = offers, .n_offers = 1 };
	char src[3][100], dst[3][100], offer[8];
	struct tpb_xfer x[3];
	struct tpb_ctx *ctx;
	struct tpb_ep *ep, *ep2;
	struct done_rec d = { 0 }, d2 = { 0 };
	struct tpb_op op = { .xfers = x, .n_xfers = 3, .done = op_done, .arg = &d };
	struct tpb_op op2 = { .xfers = x, .n_xfers = 1, .done = op_done, .arg = &d2 };
	size_t len = sizeof(offer);
	int fd;

	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	for (int i = 0; i < 3; i++) {
		memset(src[i], 'a' + i, sizeof(src[i]));
		memset(dst[i], 0, sizeof(dst[i]));
		x[i] = (struct tpb_xfer){ .src = local(src[i]), .dst = local(dst[i]),
					  .len = 50 + (uint64_t)i };
	}
	ck_assert_int_eq(tpb_ctx_new(tpb_index("shm"), NULL, NULL, &ctx), 0);
	ck_assert_str_eq(tpb_name(ctx->idx), "shm");
	fd = tpb_event_fd(ctx);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(tpb_ep_open(ctx, &remote, &ep), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_ep_open(ctx, NULL, &ep), 0);
	ck_assert_int_eq(tpb_prepare(ep, &op, offer, &len), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_forget(ctx, &x[0].src, 1), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_start(ep, &(struct tpb_op){ .xfers = x, .n_xfers = 1 }), -EINVAL);
	ck_assert(!fd_readable(fd));
	ck_assert_int_eq(tpb_progress(ctx), 0);

	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(d.calls, 0); /* never from inside start */
	ck_assert(fd_readable(fd));
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 1);
	ck_assert_int_eq(d.status, 0);
	ck_assert_uint_eq(d.bytes, 50 + 51 + 52);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(memcmp(dst[i], src[i], 50 + (size_t)i), 0);
		ck_assert_int_eq(dst[i][50 + i], 0);
	}
	ck_assert(!fd_readable(fd));
	ck_assert_int_eq(tpb_progress(ctx), 0);
	ck_assert_int_eq(d.calls, 1); /* exactly once */
	ck_assert_int_eq(tpb_cancel(ep, &op), -ENOENT);

	/* Canceled before its completion was delivered: -ECANCELED, once. */
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_cancel(ep, &op), 0);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 2);
	ck_assert_int_eq(d.status, -ECANCELED);
	ck_assert_uint_eq(d.bytes, 0);

	/* An endpoint closed from its own op's callback goes once the callback returned. */
	d.close_in_done = ep;
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 3);
	ck_assert_int_eq(d.status, 0);

	/* Closing an endpoint cancels what it has started; the context, freed with that
	 * completion owed, runs it first. */
	ck_assert_int_eq(tpb_ep_open(ctx, NULL, &ep2), 0);
	ck_assert_int_eq(tpb_start(ep2, &op2), 0);
	tpb_ep_close(ep2);
	ck_assert_int_eq(d2.calls, 0);
	tpb_ctx_free(ctx);
	ck_assert_int_eq(d2.calls, 1);
	ck_assert_int_eq(d2.status, -ECANCELED);
}
END_TEST

/* An engine that holds what it is given (test_small_local_copies_run_inside_start()). */
struct held_engine {
	struct tpb_op *ops[4];
	unsigned n;
};

static int held_submit(void *arg, int channel, struct tpb_op *op)
{
	struct held_engine *e = arg;

	(void)channel;
	e->ops[e->n++] = op;
	return 0;
}

/*
 * With an engine: an op of at most 64 KiB between the daemon's own mappings (shared buffers) is
 * copied inside start(), sparing the two hand-offs to a copy thread and back, and still
 * completes from progress only; one of 64 KiB + 1, or with process memory (CMA, which a client
 * can make slow), goes to the engine.
 */
START_TEST(test_small_local_copies_run_inside_start)
{
	enum { BIG = (64 << 10) + 1 };
	static char src[BIG], dst[BIG], other[16];
	struct held_engine he = { 0 };
	struct tpb_engine eng = { .submit = held_submit, .arg = &he };
	struct tpb_xfer x[2];
	struct tpb_ctx *ctx;
	struct tpb_ep *ep;
	struct done_rec d = { 0 };
	struct tpb_op op = { .xfers = x, .n_xfers = 2, .done = op_done, .arg = &d };

	memset(src, 'q', sizeof(src));
	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	ck_assert_int_eq(tpb_ctx_new(tpb_index("shm"), NULL, &eng, &ctx), 0);
	ck_assert_int_eq(tpb_ep_open(ctx, NULL, &ep), 0);
	/* 64 KiB in all, in two transfers: copied before start() returns, delivered later */
	x[0] = (struct tpb_xfer){ .src = local(src), .dst = local(dst), .len = (64 << 10) - 16 };
	x[1] = (struct tpb_xfer){ .src = local(src), .dst = local(other), .len = 16 };
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_uint_eq(he.n, 0);
	ck_assert_int_eq(d.calls, 0);
	ck_assert(dst[(64 << 10) - 17] == 'q' && other[15] == 'q');
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 1);
	ck_assert_int_eq(d.status, 0);
	ck_assert_uint_eq(d.bytes, 64 << 10);
	/* one byte more: the engine's */
	x[1].len = 17;
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_uint_eq(he.n, 1);
	tpb_sync_engine_done(he.ops[0], 0, (64 << 10) + 1, NULL);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 2);
	/* process memory, however small: the engine's */
	op.n_xfers = 1;
	x[0] = (struct tpb_xfer){ .src = proc(src), .dst = local(dst), .len = 8 };
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_uint_eq(he.n, 2);
	tpb_sync_engine_done(he.ops[1], 0, 8, NULL);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 3);
	tpb_ep_close(ep);
	tpb_ctx_free(ctx);
}
END_TEST

/* cma through the table: this process's memory read and written; an unmapped address fails
 * the op (not the call) with -EFAULT. */
START_TEST(test_cma_through_the_op_table)
{
	char a[64], b[64];
	struct tpb_xfer x[2];
	struct tpb_ctx *ctx;
	struct tpb_ep *ep;
	struct done_rec d = { 0 };
	struct tpb_op op = { .xfers = x, .n_xfers = 2, .done = op_done, .arg = &d };

	ck_assert_int_eq(tpb_registry_init(&(struct tpb_config){ 0 }), 0);
	if (!tpb_registry_list(&(size_t){ 0 })[tpb_index("cma")].viable) {
		printf("backends: cma not viable here: %s\n",
		       tpb_registry_list(&(size_t){ 0 })[tpb_index("cma")].why);
		return;
	}
	memset(a, 7, sizeof(a));
	memset(b, 0, sizeof(b));
	x[0] = (struct tpb_xfer){ .src = proc(a), .dst = local(b), .len = 32 };
	x[1] = (struct tpb_xfer){ .src = local(a), .dst = proc(b + 32), .len = 32 };
	ck_assert_int_eq(tpb_ctx_new(tpb_index("cma"), NULL, NULL, &ctx), 0);
	ck_assert_int_eq(tpb_ep_open(ctx, NULL, &ep), 0);
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.status, 0);
	ck_assert_uint_eq(d.bytes, 64);
	ck_assert_int_eq(memcmp(a, b, sizeof(a)), 0);
	x[1].dst.addr = 8; /* unmapped */
	ck_assert_int_eq(tpb_start(ep, &op), 0);
	ck_assert_int_eq(tpb_progress(ctx), 1);
	ck_assert_int_eq(d.calls, 2);
	ck_assert_int_eq(d.status, -EFAULT);
	ck_assert_uint_eq(d.bytes, 0);
	tpb_ep_close(ep);
	tpb_ctx_free(ctx);
}
END_TEST

static void handle_of(uint8_t *h, int seed)
{
	for (int i = 0; i < TPB_CUDA_HANDLE_BYTES; i++)
		h[i] = (uint8_t)(seed * 31 + i);
}

START_TEST(test_cuda_channels_listed_with_reason)
{
	static const char *const names[] = { "cuda_ipc", "cuda_basic", "cuda_gdr" };
	struct tpb_config cfg = { 0 };
	const struct tpb_channel_info *ch;
	size_t n;

	tpb_registry_init(&cfg);
	ch = tpb_registry_list(&n);
	for (size_t i = 0; i < 3; i++) {
		int idx = tpb_index(names[i]);
		ck_assert_int_ge(idx, 0);
		if (!ch[idx].viable) {
			ck_assert_str_ne(ch[idx].why, "");
			printf("backends: %s not viable: %s\n", names[i], ch[idx].why);
		}
	}
	/* cuda_gdr needs CUDA and an RDMA port: viable, it names the port it found. */
	if (ch[tpb_index("cuda_gdr")].viable)
		ck_assert_ptr_nonnull(strstr(ch[tpb_index("cuda_gdr")].why, "port"));
	if (!ch[tpb_index("cuda_ipc")].viable)
		ck_assert(!ch[tpb_index("cuda_gdr")].viable);
	/* The cross-host channels run in the stripe threads, not as copies. */
	ck_assert_int_eq(tpb_copy(tpb_index("cuda_basic"), &(struct tpb_xfer){ 0 }, NULL),
			 -EOPNOTSUPP);
	ck_assert_int_eq(tpb_copy(tpb_index("cuda_gdr"), &(struct tpb_xfer){ 0 }, NULL),
			 -EOPNOTSUPP);
}
END_TEST

START_TEST(test_cuda_copy_without_driver_fails_cleanly)
{
	uint8_t h[TPB_CUDA_HANDLE_BYTES];
	struct tpb_scratch s = { 0 };
	struct tpb_cuda_map *m;
	struct tpb_xfer x = { 0 };
	char buf[64], why[160];
	unsigned alive, open;

	if (tpb_cuda_viable(why, sizeof(why))) {
		printf("backends: a CUDA device is present; the hw suite covers copies\n");
		return;
	}
	tpb_registry_init(&(struct tpb_config){ 0 });
	handle_of(h, 9);
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:3b:00.0", 64, &m, why, 160), 0);
	x.src = local(buf);
	x.dst = (struct tpb_mem){ .loc = TPB_LOC_CUDA, .cuda = m };
	x.len = sizeof(buf);
	ck_assert_int_lt(tpb_copy(tpb_index("cuda_ipc"), &x, &s), 0);
	ck_assert_int_lt(tpb_cuda_basic_stage(&x.dst, 0, buf, sizeof(buf), true, &s, why,
					      sizeof(why)),
			 0);
	tpb_cuda_scratch_done(&s);
	tpb_cuda_map_unref(m);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 0);
}
END_TEST

/* ---- CUDA handle cache: pure bookkeeping, no driver call until a copy opens a mapping ---- */

START_TEST(test_cuda_map_is_shared_daemon_wide)
{
	uint8_t h[TPB_CUDA_HANDLE_BYTES];
	struct tpb_cuda_map *a, *b, *e;
	unsigned alive, open;
	char why[160];

	handle_of(h, 1);
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:3b:00.0", 1 << 20, &a, why, 160), 0);
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:3b:00.0", 1 << 20, &b, why, 160), 0);
	ck_assert_ptr_eq(a, b);
	/* The same bytes as an event handle are another object. */
	ck_assert_int_eq(tpb_cuda_map_get(h, true, "0000:3b:00.0", 0, &e, why, 160), 0);
	ck_assert_ptr_ne(a, e);
	/* A known handle claimed for another device or size is refused. */
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:5e:00.0", 1 << 20, &b, why, 160),
			 -EINVAL);
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:3b:00.0", 4096, &b, why, 160), -EINVAL);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 2);
	ck_assert_uint_eq(open, 0);
	tpb_cuda_map_unref(a);
	tpb_cuda_map_unref(a);
	tpb_cuda_map_unref(e);
	tpb_cuda_map_unref(NULL);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 0);
}
END_TEST

/* A mapping's device UUID: the first claim sets it, the same again is fine, another refused. */
START_TEST(test_cuda_map_keeps_the_first_device_uuid)
{
	uint8_t h[TPB_CUDA_HANDLE_BYTES], u1[TPB_CUDA_UUID_BYTES], u2[TPB_CUDA_UUID_BYTES];
	struct tpb_cuda_map *m;
	char why[160];

	handle_of(h, 7);
	memset(u1, 1, sizeof(u1));
	memset(u2, 1, sizeof(u2));
	u2[15] = 2;
	ck_assert_int_eq(tpb_cuda_map_get(h, false, "0000:3b:00.0", 4096, &m, why, 160), 0);
	ck_assert_int_eq(tpb_cuda_map_claim_uuid(m, u1, why, 160), 0);
	ck_assert_int_eq(tpb_cuda_map_claim_uuid(m, u1, why, 160), 0);
	ck_assert_int_eq(tpb_cuda_map_claim_uuid(m, u2, why, 160), -EINVAL);
	ck_assert_msg(strstr(why, "0000:3b:00.0"), "%s", why);
	tpb_cuda_map_unref(m);
}
END_TEST

START_TEST(test_cuda_holds_bound_lru_and_release)
{
	struct tpb_cuda_holds *h = tpb_cuda_holds_new(2);
	uint8_t ha[64], hb[64], hc[64];
	struct tpb_cuda_map *a, *b, *c, *a2, *keep;
	unsigned alive, open;
	char why[160];

	handle_of(ha, 1);
	handle_of(hb, 2);
	handle_of(hc, 3);
	ck_assert_int_eq(tpb_cuda_hold(h, ha, false, "0:1:0.0", 100, &a, why, 160), 0);
	keep = tpb_cuda_map_ref(a); /* a copy still running on A */
	ck_assert_int_eq(tpb_cuda_hold(h, hb, false, "0:1:0.0", 100, &b, why, 160), 0);
	ck_assert_int_eq(tpb_cuda_hold(h, ha, false, "0:1:0.0", 100, &a2, why, 160), 0);
	ck_assert_ptr_eq(a, a2); /* found: no new mapping, A is now the most recent */
	ck_assert_int_eq(tpb_cuda_hold(h, hc, false, "0:1:0.0", 100, &c, why, 160), 0);
	ck_assert_uint_eq(tpb_cuda_holds_count(h), 2); /* B, least recently used, dropped */
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 2);
	ck_assert_int_eq(tpb_cuda_unhold(h, hb), 0);
	ck_assert_int_eq(tpb_cuda_unhold(h, ha), 1);
	ck_assert_int_eq(tpb_cuda_unhold(h, ha), 0);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 2); /* A lives on for its copy */
	tpb_cuda_holds_free(h);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 1);
	tpb_cuda_map_unref(keep);
	tpb_cuda_map_count(&alive, &open);
	ck_assert_uint_eq(alive, 0);
	ck_assert_uint_eq(open, 0);
	tpb_cuda_holds_free(NULL);
}
END_TEST

START_TEST(test_stage_moves_local_and_process_memory)
{
	char src[3000], dst[3000], host[1000], why[160] = "";
	struct tpb_scratch s = { 0 };
	struct tpb_mem m;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (char)(i * 13 + 1);
	memset(dst, 0, sizeof(dst));
	m = local(src);
	ck_assert_int_eq(tpb_cuda_basic_stage(&m, 1000, host, 1000, false, &s, why, sizeof(why)),
			 0);
	m = proc(dst);
	ck_assert_int_eq(tpb_cuda_basic_stage(&m, 2000, host, 1000, true, &s, why, sizeof(why)), 0);
	ck_assert_int_eq(memcmp(dst + 2000, src + 1000, 1000), 0);
	m = proc((void *)8); /* unmapped */
	ck_assert_int_eq(tpb_cuda_basic_stage(&m, 0, host, 100, false, &s, why, sizeof(why)),
			 -EFAULT);
	tpb_cuda_scratch_done(&s);
}
END_TEST

/* ---- CMA as the client: per-thread credentials, the pinned process ----------------------- */

struct other_thread {
	pthread_barrier_t go, done;
	uid_t r, e, su;
};

static void *other_main(void *arg)
{
	struct other_thread *o = arg;

	pthread_barrier_wait(&o->go);
	ck_assert_int_eq(getresuid(&o->r, &o->e, &o->su), 0);
	pthread_barrier_wait(&o->done);
	return NULL;
}

static uint32_t effective_caps(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];

	ck_assert_int_eq(syscall(SYS_capget, &h, d), 0);
	return d[0].effective | d[1].effective;
}

START_TEST(test_cma_as_switches_this_thread_only_and_back)
{
	struct other_thread o;
	struct tpb_cma_as as;
	uid_t r, e, su;
	gid_t gr, ge, gs;
	pthread_t t;

	if (geteuid() != 0) {
		printf("backends: not root, cannot test switching to uid 4242\n");
		return;
	}
	ck_assert_int_eq(tpb_cma_as_probe(), 1);
	ck_assert(tpb_cma_as_allowed(4242));
	pthread_barrier_init(&o.go, NULL, 2);
	pthread_barrier_init(&o.done, NULL, 2);
	ck_assert_int_eq(pthread_create(&t, NULL, other_main, &o), 0);
	ck_assert_int_eq(tpb_cma_as_enter(4242, 4343, &as), 0);
	ck_assert_int_eq(getresuid(&r, &e, &su), 0);
	ck_assert_int_eq(getresgid(&gr, &ge, &gs), 0);
	ck_assert_uint_eq(r, 4242);
	ck_assert_uint_eq(e, 4242);
	ck_assert_uint_eq(su, 0);
	ck_assert_uint_eq(gr, 4343);
	ck_assert_uint_eq(ge, 4343);
	ck_assert_uint_eq(effective_caps(), 0);
	pthread_barrier_wait(&o.go); /* the other thread looks while this one is 4242 */
	pthread_barrier_wait(&o.done);
	ck_assert_uint_eq(o.r, 0);
	ck_assert_uint_eq(o.e, 0);
	ck_assert_uint_eq(o.su, 0);
	tpb_cma_as_leave(&as);
	ck_assert_int_eq(getresuid(&r, &e, &su), 0);
	ck_assert_int_eq(getresgid(&gr, &ge, &gs), 0);
	ck_assert_uint_eq(r | e | su | gr | ge | gs, 0);
	ck_assert_uint_ne(effective_caps(), 0);
	pthread_join(t, NULL);
}
END_TEST

/* Acting as another uid, the kernel refuses a root process's memory; CMA is then off for it. */
START_TEST(test_cma_as_other_uid_is_refused_and_turns_cma_off)
{
	static volatile uint64_t secret = 1;
	uint64_t got = 0, put = 99;
	struct tpb_proc *p;
	char why[256], c = 0;
	int fd, ready[2], go[2], st;
	pid_t pid;

	if (geteuid() != 0) {
		printf("backends: not root, cannot act as uid 4242\n");
		return;
	}
	ck_assert_int_eq(pipe(ready), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) { /* root, holding a secret at &secret */
		secret = 0x5ec2e7;
		if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(secret == 0x5ec2e7 ? 0 : 1);
	}
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(tpb_proc_new(fd, -EBADF, pid, 4242, 4242, 1, &p), 0);
	ck_assert(!tpb_proc_cma_off(p));
	ck_assert_int_eq(tpb_cma_move(p, &got, (uint64_t)(uintptr_t)&secret, sizeof(got), false,
				      why, sizeof(why)), -EPERM);
	ck_assert_uint_eq(got, 0);
	ck_assert_ptr_nonnull(strstr(why, "no more CMA"));
	ck_assert(tpb_proc_cma_off(p));
	ck_assert_int_eq(tpb_cma_move(p, &put, (uint64_t)(uintptr_t)&secret, sizeof(put), true,
				      why, sizeof(why)), -EPERM);
	tpb_proc_unref(p);
	ck_assert_int_eq(write(go[1], &c, 1), 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* its secret is unchanged */
}
END_TEST

/* The same read as root (our own uid) passes: the refusal above is the uid, not the setup. */
START_TEST(test_cma_as_same_uid_reads_another_process)
{
	static volatile uint64_t v = 1;
	uint64_t got = 0;
	struct tpb_proc *p;
	char why[256], c = 0;
	int fd, ready[2], go[2];
	pid_t pid;

	ck_assert_int_eq(pipe(ready), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		v = 0x0123;
		if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		_exit(0);
	}
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(tpb_proc_new(fd, -EBADF, pid, geteuid(), getegid(), 1, &p), 0);
	ck_assert_int_eq(tpb_cma_move(p, &got, (uint64_t)(uintptr_t)&v, sizeof(got), false, why,
				      sizeof(why)), 0);
	ck_assert_uint_eq(got, 0x0123);
	tpb_proc_unref(p);
	ck_assert_int_eq(write(go[1], &c, 1), 1);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
}
END_TEST

/* A pinned process that exited is never accessed again, whoever has its pid now. */
START_TEST(test_cma_to_an_exited_process_fails_with_esrch)
{
	uint64_t v = 7;
	struct tpb_proc *p;
	char why[256];
	int fd;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(0);
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
	ck_assert_int_eq(tpb_proc_new(fd, -EBADF, pid, geteuid(), getegid(), 2, &p), 0);
	ck_assert(!tpb_proc_alive(p));
	ck_assert_int_eq(tpb_cma_move(p, &v, 8, sizeof(v), false, why, sizeof(why)), -ESRCH);
	ck_assert_uint_eq(v, 7);
	ck_assert_ptr_nonnull(strstr(why, "has exited"));
	ck_assert(tpb_proc_cma_off(p));
	/* Later copies (another piece of the same message on another copy thread) must say the
	 * same, not that CMA was turned off: the transfer reads as a peer that died. */
	why[0] = '\0';
	ck_assert_int_eq(tpb_cma_move(p, &v, 8, sizeof(v), true, why, sizeof(why)), -ESRCH);
	ck_assert_ptr_nonnull(strstr(why, "has exited"));
	why[0] = '\0';
	ck_assert_int_eq(tpb_cma_bounce(self_proc(), (uint64_t)(uintptr_t)&v, p, 8, sizeof(v), &v,
					sizeof(v), why, sizeof(why)),
			 -ESRCH);
	ck_assert_ptr_nonnull(strstr(why, "has exited"));
	tpb_proc_unref(p);
}
END_TEST

/* Pinning through a socket: our own process with our uid; a uid that is not ours is refused. */
START_TEST(test_proc_pin_checks_the_uid)
{
	struct tpb_proc *p = NULL;
	char why[160], comm[32];
	ssize_t n;
	int sv[2], fd;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(tpb_proc_pin(sv[0], getpid(), geteuid(), getegid(), 3, &p, why,
				      sizeof(why)), 0);
	ck_assert(tpb_proc_alive(p));
	ck_assert_int_eq(tpb_proc_pid(p), getpid());
	fd = tpb_proc_openat(p, "comm");
	ck_assert_int_ge(fd, 0);
	n = read(fd, comm, sizeof(comm) - 1);
	ck_assert_int_gt(n, 0);
	close(fd);
	tpb_proc_unref(p);
	ck_assert_int_eq(tpb_proc_pin(sv[0], getpid(), geteuid() + 1, getegid(), 3, &p, why,
				      sizeof(why)), -EPERM);
	ck_assert_ptr_nonnull(strstr(why, "its socket says"));
	close(sv[0]);
	close(sv[1]);
}
END_TEST

static Suite *backends_suite(void)
{
	Suite *s = suite_create("backends");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_select_prefers_shm_for_local_memory);
	tcase_add_test(tc, test_cma_as_switches_this_thread_only_and_back);
	tcase_add_test(tc, test_cma_as_other_uid_is_refused_and_turns_cma_off);
	tcase_add_test(tc, test_cma_as_same_uid_reads_another_process);
	tcase_add_test(tc, test_cma_to_an_exited_process_fails_with_esrch);
	tcase_add_test(tc, test_proc_pin_checks_the_uid);
	tcase_add_test(tc, test_select_uses_cma_for_process_memory);
	tcase_add_test(tc, test_cma_disabled_is_not_viable_with_reason);
	tcase_add_test(tc, test_rdma_disabled_turns_off_rdma_and_cuda_gdr);
	tcase_add_test(tc, test_basic_has_no_copy_op);
	tcase_add_test(tc, test_priority_reorders_but_cma_never_takes_local_pairs);
	tcase_add_test(tc, test_priority_with_unknown_channel_keeps_builtin_order);
	tcase_add_test(tc, test_shm_disabled_leaves_no_channel_for_local_pairs);
	tcase_add_test(tc, test_shm_copies);
	tcase_add_test(tc, test_cma_reads_writes_and_bounces);
	tcase_add_test(tc, test_cma_unmapped_address_fails_cleanly);
	tcase_add_test(tc, test_negotiation_table);
	tcase_add_test(tc, test_priority_decides_between_hosts);
	tcase_add_test(tc, test_peer_offers_follow_the_registry);
	tcase_add_test(tc, test_rdma_probed_once_per_round);
	tcase_add_test(tc, test_op_wrappers_turn_missing_ops_into_eopnotsupp);
	tcase_add_test(tc, test_start_refuses_an_offer_over_the_channels_bound);
	tcase_add_test(tc, test_shm_life_cycle_through_the_op_table);
	tcase_add_test(tc, test_cma_through_the_op_table);
	tcase_add_test(tc, test_small_local_copies_run_inside_start);
	tcase_add_test(tc, test_cuda_channels_listed_with_reason);
	tcase_add_test(tc, test_cuda_map_is_shared_daemon_wide);
	tcase_add_test(tc, test_cuda_map_keeps_the_first_device_uuid);
	tcase_add_test(tc, test_cuda_copy_without_driver_fails_cleanly);
	tcase_add_test(tc, test_cuda_holds_bound_lru_and_release);
	tcase_add_test(tc, test_stage_moves_local_and_process_memory);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(backends_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
