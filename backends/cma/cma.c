/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * cma channel: cross-memory attach. Reads a client's memory with process_vm_readv and writes it
 * with process_vm_writev; process to process goes through the copy thread's bounce buffer, each
 * side accessed with its own client's credentials. The daemon only ever passes the process
 * pinned at attach by the session that named the address (struct tpb_proc), and every access
 * runs as that client, in a child task (proc.c): the kernel's ptrace check decides, and a
 * refusal is -EPERM.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include "../tpb.h"

static int cma_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	uint64_t src = 0x7470697064ull, dst = 0;
	struct iovec l = { &dst, sizeof(dst) }, r = { &src, sizeof(src) };

	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(dst) || dst != src) {
		snprintf(why, why_len, "process_vm_readv refused: %s", strerror(errno));
		return 0;
	}
	tpb_cma_as_probe(); /* decided once, here: may copies take the clients' credentials? */
	return 1;
}

static int cma_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	char spare[160];
	char *why = s ? s->why : spare;
	size_t wl = s ? sizeof(s->why) : sizeof(spare);

	if (x->src.loc == TPB_LOC_LOCAL)
		return tpb_cma_move(x->dst.proc, (void *)(uintptr_t)x->src.addr, x->dst.addr, x->len,
				    true, why, wl);
	if (x->dst.loc == TPB_LOC_LOCAL)
		return tpb_cma_move(x->src.proc, (void *)(uintptr_t)x->dst.addr, x->src.addr, x->len,
				    false, why, wl);
	if (!s || !s->bounce || !s->bounce_len)
		return -ENOBUFS;
	return tpb_cma_bounce(x->src.proc, x->src.addr, x->dst.proc, x->dst.addr, x->len, s->bounce,
			      s->bounce_len, why, wl);
}

const struct tpb_channel_ops tpb_cma_ops = {
	.name = "cma",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_NEEDS_PROCESS,
	.probe = cma_probe,
	.copy = cma_copy,
	TPB_SYNC_OPS, /* its kernel on the daemon's copy threads */
};
