/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_devmem: a session's CUDA memory references. A CudaRef from a Write or Read becomes a
 * TPB_LOC_CUDA memory reference on the daemon-wide mapping of its IPC handle, held by the
 * session (at most TPD_DEVMEM_HOLDS, least recently used dropped) until the client releases it
 * (CudaRelease) or leaves. Opening the handles is left to the copy threads.
 */
#ifndef TPD_DEVMEM_H
#define TPD_DEVMEM_H

#include "tpb.h"
#include "tpw.pb-c.h"

struct tpd_session;

/*
 * tpd_devmem_resolve() - the memory reference for @c (@length bytes) from session @s.
 * @ret: written on success; holds new references to its mapping and event: drop them with
 * tpd_devmem_put().
 * Return: 0; -EOPNOTSUPP without CUDA (reason in @why); -EINVAL; -ENOMEM.
 */
int tpd_devmem_resolve(struct tpd_session *s, const Tpw__V1__CudaRef *c, struct tpb_mem *ret,
		       char *why, size_t why_len);

/* Drops the references of a memory reference from tpd_devmem_resolve() (others: no-op). */
void tpd_devmem_put(struct tpb_mem *m);

/* Handles CudaDmabuf from @s: the dma-buf @fd (taken, also on failure) is held for @s's RDMA
 * registrations of that allocation, or refused (Reply when m->req_id is set; logged). */
void tpd_devmem_dmabuf(struct tpd_session *s, const Tpw__V1__CudaDmabuf *m, int fd);

/* Handles CudaRelease from @s (its dma-buf of that allocation goes too). */
void tpd_devmem_release(struct tpd_session *s, const Tpw__V1__CudaRelease *m);

/* Drops everything @s holds (the session ends). */
void tpd_devmem_session_end(struct tpd_session *s);

#endif
