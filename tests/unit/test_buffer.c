/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/base/buffer.c: which fds are accepted as shared buffers (sealed memfds of
 * sufficient size only) and the bounds checks that stand between a client's offsets and the
 * daemon's mappings.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "buffer.h"

static int make_memfd(size_t size, unsigned seals)
{
	int fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	if (seals)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

START_TEST(test_buffer_accepts_sealed_memfd)
{
	int fd = make_memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW);
	struct tpb_buffer *b = NULL;
	void *p;

	ck_assert_int_eq(tpb_buffer_new(fd, 7, 3, 8192, &b), 0);
	close(fd);
	ck_assert_uint_eq(b->id, 7);
	ck_assert_uint_eq(b->gen, 3);
	ck_assert_int_eq(tpb_buffer_resolve(b, 0, 8192, &p), 0);
	memset(p, 0xab, 8192); /* the mapping is writable and whole */
	tpb_buffer_unref(b);
}
END_TEST

START_TEST(test_buffer_rejects_unsealed_memfd)
{
	int fd = make_memfd(4096, 0);
	struct tpb_buffer *b = NULL;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), -EPERM);
	ck_assert_ptr_null(b);
	close(fd);
}
END_TEST

START_TEST(test_buffer_rejects_grow_only_seal)
{
	int fd = make_memfd(4096, F_SEAL_GROW);
	struct tpb_buffer *b = NULL;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), -EPERM);
	close(fd);
}
END_TEST

START_TEST(test_buffer_rejects_size_above_file)
{
	int fd = make_memfd(4096, F_SEAL_SHRINK);
	struct tpb_buffer *b = NULL;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4097, &b), -EINVAL);
	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), 0);
	tpb_buffer_unref(b);
	close(fd);
}
END_TEST

START_TEST(test_buffer_rejects_non_regular_fd)
{
	int p[2];
	struct tpb_buffer *b = NULL;

	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(tpb_buffer_new(p[0], 1, 1, 1, &b), -EINVAL);
	close(p[0]);
	close(p[1]);
}
END_TEST

START_TEST(test_buffer_resolve_edges)
{
	int fd = make_memfd(4096, F_SEAL_SHRINK);
	struct tpb_buffer *b = NULL;
	void *p;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), 0);
	close(fd);
	ck_assert_int_eq(tpb_buffer_resolve(b, 4095, 1, &p), 0);
	ck_assert_ptr_eq(p, (char *)b->map + 4095);
	ck_assert_int_eq(tpb_buffer_resolve(b, 4096, 0, &p), 0);
	ck_assert_int_eq(tpb_buffer_resolve(b, 4096, 1, &p), -ERANGE);
	ck_assert_int_eq(tpb_buffer_resolve(b, 4000, 200, &p), -ERANGE);
	ck_assert_int_eq(tpb_buffer_resolve(b, 0, 4097, &p), -ERANGE);
	ck_assert_int_eq(tpb_buffer_resolve(b, UINT64_MAX - 10, 20, &p), -ERANGE);
	ck_assert_int_eq(tpb_buffer_resolve(b, 1, UINT64_MAX, &p), -ERANGE);
	tpb_buffer_unref(b);
}
END_TEST

START_TEST(test_buffer_mapping_outlives_owner_reference)
{
	int fd = make_memfd(4096, F_SEAL_SHRINK);
	struct tpb_buffer *b = NULL;
	void *p;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), 0);
	close(fd);
	tpb_buffer_ref(b);   /* a transfer's reference */
	tpb_buffer_unref(b); /* the session releases it */
	ck_assert_int_eq(tpb_buffer_resolve(b, 0, 4096, &p), 0);
	memset(p, 1, 4096); /* still mapped */
	tpb_buffer_unref(b);
}
END_TEST

/* A channel buffer handed to readers (issue 25 part map): only once sealed against writes
 * through any fd but the mappings already made (F_SEAL_FUTURE_WRITE), and then as an fd opened
 * read-only: no shared writable mapping of it, no mprotect() to writable, no write(), not even
 * through the file opened again read-write; what the owner's mapping writes, a reader sees. */
START_TEST(test_buffer_reader_fd_is_read_only)
{
	int fd = make_memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW), rfd, again;
	struct tpb_buffer *b = NULL;
	char path[40];
	uint8_t *own, *ro;

	own = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(own, MAP_FAILED);
	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 8192, &b), 0);
	ck_assert_int_eq(tpb_buffer_reader_fd(b), -ENOENT); /* no fd kept */
	ck_assert(!tpb_buffer_reader_ok(b));
	ck_assert_int_eq(tpb_buffer_keep_fd(b, fd, (atomic_uint *[2]){ NULL, NULL }), 0);
	ck_assert_uint_ne(b->map_key, 0);
	ck_assert_int_eq(tpb_buffer_reader_fd(b), -EPERM); /* writable through any fd yet */
	ck_assert(!tpb_buffer_reader_ok(b));
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL), 0);
	rfd = tpb_buffer_reader_fd(b);
	ck_assert_int_ge(rfd, 0);
	ck_assert_int_eq(fcntl(rfd, F_GETFL) & O_ACCMODE, O_RDONLY);
	ck_assert_ptr_eq(mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0), MAP_FAILED);
	ro = mmap(NULL, 8192, PROT_READ, MAP_SHARED, rfd, 0);
	ck_assert_ptr_ne(ro, MAP_FAILED);
	ck_assert_int_eq(mprotect(ro, 8192, PROT_READ | PROT_WRITE), -1);
	ck_assert_int_eq(errno, EACCES);
	ck_assert_int_eq(write(rfd, "x", 1), -1);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", rfd);
	again = open(path, O_RDWR | O_CLOEXEC); /* the same inode, read-write */
	if (again >= 0) {
		ck_assert_ptr_eq(mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0),
				 MAP_FAILED);
		ck_assert_int_eq(pwrite(again, "x", 1, 0), -1);
		ck_assert_int_eq(errno, EPERM);
		close(again);
	}
	memset(own, 0x5a, 8192); /* the owner's mapping still writes */
	ck_assert_uint_eq(ro[8191], 0x5a);
	munmap(ro, 8192);
	munmap(own, 8192);
	close(rfd);
	close(fd);
	tpb_buffer_unref(b);
}
END_TEST

/* A kept fd charged to two counters lowers both when the last reference closes it, not before. */
START_TEST(test_buffer_kept_fd_charge_released_with_last_reference)
{
	int fd = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
	atomic_uint uid_n = 1, all_n = 5;
	struct tpb_buffer *b = NULL;

	ck_assert_int_eq(tpb_buffer_new(fd, 1, 1, 4096, &b), 0);
	ck_assert_int_eq(tpb_buffer_keep_fd(b, fd, (atomic_uint *[2]){ &uid_n, &all_n }), 0);
	close(fd);
	tpb_buffer_ref(b);
	tpb_buffer_unref(b);
	ck_assert_uint_eq(atomic_load(&uid_n), 1);
	ck_assert_uint_eq(atomic_load(&all_n), 5);
	tpb_buffer_unref(b);
	ck_assert_uint_eq(atomic_load(&uid_n), 0);
	ck_assert_uint_eq(atomic_load(&all_n), 4);
}
END_TEST

static Suite *buffer_suite(void)
{
	Suite *s = suite_create("buffer");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_buffer_accepts_sealed_memfd);
	tcase_add_test(tc, test_buffer_rejects_unsealed_memfd);
	tcase_add_test(tc, test_buffer_rejects_grow_only_seal);
	tcase_add_test(tc, test_buffer_rejects_size_above_file);
	tcase_add_test(tc, test_buffer_rejects_non_regular_fd);
	tcase_add_test(tc, test_buffer_resolve_edges);
	tcase_add_test(tc, test_buffer_kept_fd_charge_released_with_last_reference);
	tcase_add_test(tc, test_buffer_mapping_outlives_owner_reference);
	tcase_add_test(tc, test_buffer_reader_fd_is_read_only);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(buffer_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
