/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_buffer: a client's shared buffer (a sealed memfd) mapped into the daemon. Buffers are
 * refcounted: the session's table holds one reference, and every transfer that reads or writes
 * the mapping holds one, so a client that dies or releases a buffer mid-copy never leaves a copy
 * thread with a dangling mapping. Ranges are resolved here, with overflow-checked bounds.
 */
#ifndef TPB_BUFFER_H
#define TPB_BUFFER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct tpb_buffer {
	atomic_uint refs;
	uint64_t id;
	uint64_t gen;
	uint64_t size;
	void *map;
	/* Page-locking of the mapping for GPU copies (backends/cuda/cudamap.c): TPB_PIN_*. Once
	 * pinned, @unpin (set before the state says so) replaces the last unref's unmap and free:
	 * it unregisters the mapping with the driver off the caller's thread, then unmaps. */
	atomic_int pin;
	int pin_dev;	  /* the CUDA device whose context pinned it */
	unsigned pin_gen; /* that context's generation then (a reset drops the pinning) */
	void (*unpin)(struct tpb_buffer *b);
	bool staging; /* the client's library stages private memory through it (counts only) */
	/* A channel handle's buffer readers may map (BufferRegister.chan_map): @map_key, unique
	 * in the daemon and never 0, and the fd kept (@map_fd, closed with the buffer);
	 * @map_sealed once F_SEAL_FUTURE_WRITE was seen. @map_key 0: none kept. */
	uint64_t map_key;
	int map_fd;
	bool map_sealed;
	/* Of such a buffer, on the daemon's loop thread only (daemon/chan/chanitem.c): lends of it
	 * with items in a channel (@map_lends), whether its session let go of it (@map_dropped),
	 * whether a reader got its fd since it was last retired (@map_shown), and whether readers
	 * were told it is gone (@map_retired: a later offer sends the fd again). */
	uint32_t map_lends;
	bool map_dropped, map_shown, map_retired;
	/* Counters @map_fd is charged to (the daemon's per-uid and daemon-wide counts of kept
	 * fds), each lowered by one when it is closed, by whichever thread drops the last
	 * reference. NULL: not charged. */
	atomic_uint *map_fd_charge[2];
};

enum { TPB_PIN_NONE = 0, TPB_PIN_BUSY, TPB_PIN_DONE, TPB_PIN_REFUSED };

/*
 * tpb_buffer_new() - check and map a client's memfd.
 * @fd: borrows @fd (the caller closes it; the mapping does not need it).
 * @ret: returns owned buffer (one reference), drop with tpb_buffer_unref().
 * Return: 0; -EPERM if @fd is not sealed against shrinking (a shrink would fault the daemon) or
 * is hugetlbfs memory (a punched hole may fault it too); -EINVAL if it is not a regular file or
 * smaller than @size (checked after the seal); -errno from mmap.
 */
int tpb_buffer_new(int fd, uint64_t id, uint64_t gen, uint64_t size, struct tpb_buffer **ret);

/*
 * tpb_buffer_keep_fd() - keeps a duplicate of @fd (the one @b was mapped from) and gives @b a
 * map key, so that readers of a channel may be handed it read-only (tpb_buffer_reader_fd()).
 * @charge: two counters the caller raised for the kept fd (or NULLs); on success @b takes the
 * charge and lowers them when it closes the fd, on failure the caller keeps it.
 * Borrows @fd. Return: 0 or -errno.
 */
int tpb_buffer_keep_fd(struct tpb_buffer *b, int fd, atomic_uint *charge[2]);

/*
 * tpb_buffer_reader_fd() - a new read-only fd of @b's file for a reader to map: opened again
 * through /proc/self/fd with O_RDONLY, only once the file is sealed against shrinking and
 * against writes by anyone but the mappings its owner already has (F_SEAL_FUTURE_WRITE or
 * F_SEAL_WRITE), so that no holder of that fd can map it writable nor write it.
 * Return: owned fd, or -EPERM (not sealed so), -ENOENT (no fd kept), -errno.
 */
int tpb_buffer_reader_fd(struct tpb_buffer *b);

/* Would tpb_buffer_reader_fd() hand @b out? (The seals checked once, then remembered.) */
bool tpb_buffer_reader_ok(struct tpb_buffer *b);

struct tpb_buffer *tpb_buffer_ref(struct tpb_buffer *b);
/* Drops a reference; unmaps and frees at zero (through @b->unpin when pinned). Thread safe.
 * Accepts NULL. */
void tpb_buffer_unref(struct tpb_buffer *b);
/* True if one reference is all @b has (e.g. a cache's, once its client let go). Borrows @b. */
bool tpb_buffer_only_ref(const struct tpb_buffer *b);

/*
 * tpb_buffer_resolve() - pointer to [@offset, @offset + @len) in @b.
 * Return: 0 and *@ret, or -ERANGE if the range is not inside the buffer.
 */
int tpb_buffer_resolve(const struct tpb_buffer *b, uint64_t offset, uint64_t len, void **ret);

#endif
