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
	tcase_add_test(tc, test_buffer_mapping_outlives_owner_reference);
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
