/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared buffer mapping and bounds checks. See buffer.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include "buffer.h"
#include "tpu.h"

int tpb_buffer_new(int fd, uint64_t id, uint64_t gen, uint64_t size, struct tpb_buffer **ret)
{
	struct tpb_buffer *b;
	struct statfs sf;
	struct stat st;
	int seals;
	void *map;

	/* The seal first: a size read before it could be shrunk away behind our back, and the
	 * daemon's copies would then fault (SIGBUS) on pages the file no longer has. */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) ? -EINVAL : -EPERM;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < size || size > SIZE_MAX)
		return -EINVAL;
	/* hugetlbfs memory (MFD_HUGETLB) faults with SIGBUS where the owner punched a hole and the
	 * pool has no page left: only shmem memfds, which refill a hole with zeros. */
	if (fstatfs(fd, &sf) < 0)
		return -errno;
	if (sf.f_type == HUGETLBFS_MAGIC)
		return -EPERM;
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	b = calloc(1, sizeof(*b));
	if (!b) {
		munmap(map, size);
		return -ENOMEM;
	}
	atomic_init(&b->refs, 1);
	b->id = id;
	b->gen = gen;
	b->size = size;
	b->map = map;
	*ret = b;
	return 0;
}

int tpb_buffer_keep_fd(struct tpb_buffer *b, int fd, atomic_uint *charge[2])
{
	static atomic_uint_fast64_t next_key;
	int dup = fcntl(fd, F_DUPFD_CLOEXEC, 3);

	if (dup < 0)
		return -errno;
	b->map_fd = dup;
	b->map_fd_charge[0] = charge[0];
	b->map_fd_charge[1] = charge[1];
	b->map_key = atomic_fetch_add(&next_key, 1) + 1;
	return 0;
}

bool tpb_buffer_reader_ok(struct tpb_buffer *b)
{
	int seals;

	if (!b->map_key)
		return false;
	if (b->map_sealed)
		return true;
	seals = fcntl(b->map_fd, F_GET_SEALS);
	b->map_sealed = seals >= 0 && (seals & F_SEAL_SHRINK) &&
			(seals & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE));
	return b->map_sealed;
}

int tpb_buffer_reader_fd(struct tpb_buffer *b)
{
	char path[40];
	int fd;

	if (!b->map_key)
		return -ENOENT;
	if (!tpb_buffer_reader_ok(b))
		return -EPERM;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", b->map_fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

struct tpb_buffer *tpb_buffer_ref(struct tpb_buffer *b)
{
	atomic_fetch_add(&b->refs, 1);
	return b;
}

void tpb_buffer_unref(struct tpb_buffer *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	if (b->map_key) {
		close(b->map_fd);
		for (int i = 0; i < 2; i++)
			if (b->map_fd_charge[i])
				atomic_fetch_sub(b->map_fd_charge[i], 1);
	}
	b->map_key = 0;
	if (atomic_load(&b->pin) == TPB_PIN_DONE) {
		b->unpin(b);
		return;
	}
	munmap(b->map, b->size);
	free(b);
}

bool tpb_buffer_only_ref(const struct tpb_buffer *b)
{
	return atomic_load(&((struct tpb_buffer *)b)->refs) == 1;
}

int tpb_buffer_resolve(const struct tpb_buffer *b, uint64_t offset, uint64_t len, void **ret)
{
	if (!tpu_range_ok(offset, len, b->size))
		return -ERANGE;
	*ret = (char *)b->map + offset;
	return 0;
}
