/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A session's CUDA memory references (see devmem.h): CudaRef -> mapping held by the session.
 */
#include <errno.h>
#include <stdio.h>
#include "core.h"
#include "rdma/rdma.h"
#include "devmem.h"
#include "frame.h"
#include "log.h"
#include "session.h"

static int session_holds(struct tpd_session *s)
{
	if (!s->cuda && !(s->cuda = tpb_cuda_holds_new(tpd_daemon_cfg(s->d)->cuda_holds_max)))
		return -ENOMEM;
	return 0;
}

int tpd_devmem_resolve(struct tpd_session *s, const Tpw__V1__CudaRef *c, struct tpb_mem *ret,
		       char *why, size_t why_len)
{
	struct tpb_cuda_map *mem = NULL, *ev = NULL;
	int r;

	char no[128];

	if (!tpb_cuda_viable(no, sizeof(no))) {
		snprintf(why, why_len, "tpipd cannot use CUDA memory here: %s", no);
		return -EOPNOTSUPP;
	}
	r = session_holds(s);
	if (r == 0)
		r = tpb_cuda_hold(s->cuda, c->mem_handle.data, false, c->pci_bus_id, c->alloc_size,
				  &mem, why, why_len);
	if (r < 0)
		return r;
	mem = tpb_cuda_map_ref(mem); /* before the next hold may drop it */
	if (c->event_handle.len == TPW_CUDA_HANDLE_BYTES) {
		r = tpb_cuda_hold(s->cuda, c->event_handle.data, true, c->pci_bus_id, 0, &ev, why,
				  why_len);
		if (r < 0) {
			tpb_cuda_map_unref(mem);
			return r;
		}
		ev = tpb_cuda_map_ref(ev);
	}
	*ret = (struct tpb_mem){ .loc = TPB_LOC_CUDA, .proc = s->proc, .addr = c->offset,
				 .cuda = mem, .event = ev };
	return 0;
}

void tpd_devmem_put(struct tpb_mem *m)
{
	if (m->loc != TPB_LOC_CUDA)
		return;
	tpb_cuda_map_unref(m->cuda);
	tpb_cuda_map_unref(m->event);
	m->cuda = m->event = NULL;
}

void tpd_devmem_release(struct tpd_session *s, const Tpw__V1__CudaRelease *m)
{
	if (s->cuda && tpb_cuda_unhold(s->cuda, m->mem_handle.data)) {
		tpu_log_debug("session %llu: CUDA allocation released",
			      (unsigned long long)s->id);
		tpb_rdma_forget_cuda(tpd_daemon_rdma(s->d));
	}
}

void tpd_devmem_session_end(struct tpd_session *s)
{
	tpb_cuda_holds_free(s->cuda);
	s->cuda = NULL;
	tpb_rdma_forget_cuda(tpd_daemon_rdma(s->d));
}
