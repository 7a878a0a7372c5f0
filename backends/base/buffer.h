/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_buffer: a client's shared buffer (a sealed memfd) mapped into the daemon. Buffers are
 * refcounted: the session's table holds one reference, and every transfer that reads or writes
 * the mapping holds one, so a client that dies or releases a buffer mid-copy never leaves a copy
 * thread with a dangling mapping. Ranges are resolved here, with overflow-checked bounds.
 */
#ifndef TPD_BUFFER_H
#define TPD_BUFFER_H

#include <stdatomic.h>
#include <stdint.h>

struct tpd_buffer {
	atomic_uint refs;
	uint64_t id;
	uint64_t gen;
	uint64_t size;
	void *map;
};

/*
 * tpd_buffer_new() - check and map a client's memfd.
 * @fd: borrows @fd (the caller closes it; the mapping does not need it).
 * @ret: returns owned buffer (one reference), drop with tpd_buffer_unref().
 * Return: 0; -EPERM if @fd is not sealed against shrinking (a shrink would fault the daemon);
 * -EINVAL if it is not a regular file or smaller than @size; -errno from mmap.
 */
int tpd_buffer_new(int fd, uint64_t id, uint64_t gen, uint64_t size, struct tpd_buffer **ret);

struct tpd_buffer *tpd_buffer_ref(struct tpd_buffer *b);
/* Drops a reference; unmaps and frees at zero. Thread safe. Accepts NULL. */
void tpd_buffer_unref(struct tpd_buffer *b);

/*
 * tpd_buffer_resolve() - pointer to [@offset, @offset + @len) in @b.
 * Return: 0 and *@ret, or -ERANGE if the range is not inside the buffer.
 */
int tpd_buffer_resolve(const struct tpd_buffer *b, uint64_t offset, uint64_t len, void **ret);

#endif
