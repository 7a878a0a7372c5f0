/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A session's CUDA memory references (see devmem.h): CudaRef -> mapping. By default a mapping
 * lives as long as the transfers that use it (the copy thread closes it at the end of the
 * last one, before the writer learns that its write is done), so a client may free its memory
 * once its write completes; with cuda-cache-mappings the session also holds it (bounded by
 * cuda-mappings-max) until CudaRelease or the session's end. A dma-buf the client exported
 * of its allocation (CudaDmabuf) is held for the session by backends/rdma/dmabuf.c, bounded by
 * cuda-dmabufs-max, until CudaRelease of that allocation or the session's end.
 */
#include <errno.h>
#include <stdio.h>
#include "core.h"
#include "rdma/rdma.h"
#include "devmem.h"
#include "frame.h"
#include "log.h"
#include "session.h"

/* The mapping of @handle for @s: held by the session where caching is on, else a bare
 * reference that the caller's transfer drops. Return: as tpb_cuda_hold(); *@ret borrowed. */
static int session_map(struct tpd_session *s, const uint8_t *handle, bool event,
		       const char *bus_id, uint64_t size, struct tpb_cuda_map **ret, char *why,
		       size_t why_len);

static int session_holds(struct tpd_session *s)
{
	if (!s->cuda && !(s->cuda = tpb_cuda_holds_new(tpd_daemon_cfg(s->d)->cuda_holds_max)))
		return -ENOMEM;
	return 0;
}

int tpd_devmem_resolve(struct tpd_session *s, const Tpw__V1__CudaRef *c, struct tpb_mem *ret,
		       char *why, size_t why_len)
{
	bool cache = tpd_daemon_cfg(s->d)->cuda_cache;
	struct tpb_cuda_map *mem = NULL, *ev = NULL;
	char no[128];
	int r;

	if (!tpb_cuda_viable(no, sizeof(no))) {
		snprintf(why, why_len, "tpipd cannot use CUDA memory here: %s", no);
		return -EOPNOTSUPP;
	}
	r = session_map(s, c->mem_handle.data, false, c->pci_bus_id, c->alloc_size, &mem, why,
			why_len);
	if (r < 0)
		return r;
	if (cache)
		mem = tpb_cuda_map_ref(mem); /* before the next hold may drop it */
	if (c->gpu_uuid.len == TPB_CUDA_UUID_BYTES)
		r = tpb_cuda_map_claim_uuid(mem, c->gpu_uuid.data, why, why_len);
	if (r == 0 && c->event_handle.len == TPW_CUDA_HANDLE_BYTES) {
		r = session_map(s, c->event_handle.data, true, c->pci_bus_id, 0, &ev, why, why_len);
		if (r == 0 && cache)
			ev = tpb_cuda_map_ref(ev);
		if (r == 0 && c->gpu_uuid.len == TPB_CUDA_UUID_BYTES)
			r = tpb_cuda_map_claim_uuid(ev, c->gpu_uuid.data, why, why_len);
	}
	if (r < 0) {
		tpb_cuda_map_unref(mem);
		tpb_cuda_map_unref(ev);
		return r;
	}
	*ret = (struct tpb_mem){ .loc = TPB_LOC_CUDA, .proc = s->proc, .addr = c->offset,
				 .cuda = mem, .event = ev };
	return 0;
}

static int session_map(struct tpd_session *s, const uint8_t *handle, bool event,
		       const char *bus_id, uint64_t size, struct tpb_cuda_map **ret, char *why,
		       size_t why_len)
{
	int r;

	if (!tpd_daemon_cfg(s->d)->cuda_cache)
		return tpb_cuda_map_get(handle, event, bus_id, size, ret, why, why_len);
	r = session_holds(s);
	return r < 0 ? r : tpb_cuda_hold(s->cuda, handle, event, bus_id, size, ret, why, why_len);
}

void tpd_devmem_put(struct tpb_mem *m)
{
	if (m->loc != TPB_LOC_CUDA)
		return;
	tpb_cuda_map_unref(m->cuda);
	tpb_cuda_map_unref(m->event);
	m->cuda = m->event = NULL;
}

void tpd_devmem_dmabuf(struct tpd_session *s, const Tpw__V1__CudaDmabuf *m, int fd)
{
	struct tpd_quota *q = tpd_daemon_quota(s->d);
	char why[192] = "";
	int r;

	/* the fd is kept: charged to the uid's and the daemon's kept fds (quota.h) */
	r = tpd_quota_charge_fd(q, tpd_daemon_cfg(s->d), s->acct, why, sizeof(why));
	if (r < 0)
		close(fd);
	else
		r = tpb_rdma_dmabuf_add(tpd_daemon_rdma(s->d), s->proc, m->mem_handle.data,
					m->size, fd,
					(atomic_uint *[2]){ &s->acct->kept_fds, &q->kept_fds },
					tpd_daemon_cfg(s->d)->cuda_dmabufs_max, why, sizeof(why));
	/* no RDMA here is the host's state, not the client's doing: said at debug level only */
	if (r < 0)
		tpd_session_log(s, r == -EOPNOTSUPP ? TPU_LOG_DEBUG : TPU_LOG_INFO,
				"dma-buf of a CUDA allocation (%llu bytes) refused, registering it "
				"another way: %s", (unsigned long long)m->size, why);
	if (m->req_id)
		tpd_session_reply(s, m->req_id, r, r < 0 ? why : NULL, 0, NULL);
}

void tpd_devmem_release(struct tpd_session *s, const Tpw__V1__CudaRelease *m)
{
	tpb_rdma_dmabuf_drop(tpd_daemon_rdma(s->d), s->proc, m->mem_handle.data);
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
	tpb_rdma_dmabuf_drop_owner(tpd_daemon_rdma(s->d), s->proc);
	tpb_rdma_forget_cuda(tpd_daemon_rdma(s->d));
}
