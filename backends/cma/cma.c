/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * cma channel: cross-memory attach. Reads a client's memory with process_vm_readv and writes it
 * with process_vm_writev; process to process goes through the copy thread's bounce buffer. The
 * daemon only ever passes the peer-credential pid of the session that named the address; the
 * kernel's ptrace access check (same uid, or CAP_SYS_PTRACE) still applies and is reported as
 * -EPERM. Handles partial transfers.
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
	return 1;
}

int tpb_cma_move(pid_t pid, void *buf, uint64_t addr, uint64_t len, bool write)
{
	while (len) {
		size_t chunk = len > (1ull << 30) ? (1ull << 30) : (size_t)len;
		struct iovec l = { buf, chunk }, r = { (void *)(uintptr_t)addr, chunk };
		ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
				  : process_vm_readv(pid, &l, 1, &r, 1, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EFAULT;
		buf = (char *)buf + n;
		addr += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static int cma_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	uint64_t done = 0;

	if (x->src.loc == TPB_LOC_LOCAL)
		return tpb_cma_move(x->dst.pid, (void *)(uintptr_t)x->src.addr, x->dst.addr, x->len,
				true);
	if (x->dst.loc == TPB_LOC_LOCAL)
		return tpb_cma_move(x->src.pid, (void *)(uintptr_t)x->dst.addr, x->src.addr, x->len,
				false);
	if (!s || !s->bounce || !s->bounce_len)
		return -ENOBUFS;
	while (done < x->len) {
		uint64_t n = x->len - done < s->bounce_len ? x->len - done : s->bounce_len;
		int r = tpb_cma_move(x->src.pid, s->bounce, x->src.addr + done, n, false);
		if (r == 0)
			r = tpb_cma_move(x->dst.pid, s->bounce, x->dst.addr + done, n, true);
		if (r < 0)
			return r;
		done += n;
	}
	return 0;
}

const struct tpb_channel_ops tpb_cma_ops = {
	.name = "cma",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_NEEDS_PROCESS,
	.probe = cma_probe,
	.copy = cma_copy,
};
