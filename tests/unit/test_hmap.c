/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of tpu_hmap (common/hmap.c): put/get/del contracts, key 0 and duplicate keys,
 * growth, iteration, and a long random sequence of inserts and deletes checked against a plain
 * array so that backward-shift deletion (including probe runs that wrap around the table) never
 * loses an entry.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include "hmap.h"

START_TEST(test_hmap_put_get_del)
{
	struct tpu_hmap m;
	int a, b;

	tpu_hmap_init(&m);
	ck_assert_ptr_null(tpu_hmap_get(&m, 1));
	ck_assert_ptr_null(tpu_hmap_del(&m, 1));
	ck_assert_int_eq(tpu_hmap_put(&m, 1, &a), 0);
	ck_assert_int_eq(tpu_hmap_put(&m, UINT64_MAX, &b), 0);
	ck_assert_ptr_eq(tpu_hmap_get(&m, 1), &a);
	ck_assert_ptr_eq(tpu_hmap_get(&m, UINT64_MAX), &b);
	ck_assert_ptr_null(tpu_hmap_get(&m, 2));
	ck_assert_uint_eq(m.len, 2);
	ck_assert_ptr_eq(tpu_hmap_del(&m, 1), &a);
	ck_assert_ptr_null(tpu_hmap_get(&m, 1));
	ck_assert_ptr_null(tpu_hmap_del(&m, 1));
	ck_assert_uint_eq(m.len, 1);
	tpu_hmap_done(&m);
	ck_assert_uint_eq(m.cap, 0);
	tpu_hmap_done(&m); /* twice is fine */
}
END_TEST

START_TEST(test_hmap_rejects_zero_and_duplicate_keys)
{
	struct tpu_hmap m;
	int a, b;

	tpu_hmap_init(&m);
	ck_assert_int_eq(tpu_hmap_put(&m, 0, &a), -EINVAL);
	ck_assert_int_eq(tpu_hmap_put(&m, 5, &a), 0);
	ck_assert_int_eq(tpu_hmap_put(&m, 5, &b), -EEXIST);
	ck_assert_ptr_eq(tpu_hmap_get(&m, 5), &a);
	ck_assert_ptr_null(tpu_hmap_get(&m, 0));
	ck_assert_ptr_null(tpu_hmap_del(&m, 0));
	ck_assert_uint_eq(m.len, 1);
	tpu_hmap_done(&m);
}
END_TEST

START_TEST(test_hmap_grows_and_iterates_every_entry)
{
	enum { N = 10000 };
	struct tpu_hmap m;
	static unsigned char seen[N + 1];
	uint64_t k;
	void *v;
	size_t count = 0;

	tpu_hmap_init(&m);
	for (uint64_t i = 1; i <= N; i++)
		ck_assert_int_eq(tpu_hmap_put(&m, i << 20, (void *)(uintptr_t)i), 0);
	ck_assert_uint_eq(m.len, N);
	ck_assert_uint_ge(m.cap * 3, m.len * 4); /* load factor stays <= 3/4 */
	for (size_t it = 0; tpu_hmap_next(&m, &it, &k, &v);) {
		ck_assert_uint_eq(k, (uint64_t)(uintptr_t)v << 20);
		ck_assert_int_eq(seen[(uintptr_t)v], 0);
		seen[(uintptr_t)v] = 1;
		count++;
	}
	ck_assert_uint_eq(count, N);
	tpu_hmap_done(&m);
}
END_TEST

/* xorshift64: deterministic pseudo-random sequence. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

START_TEST(test_hmap_random_ops_match_model)
{
	enum { KEYS = 64, OPS = 200000 };
	void *model[KEYS + 1] = { 0 };
	struct tpu_hmap m;
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	size_t live = 0;

	tpu_hmap_init(&m);
	for (int op = 0; op < OPS; op++) {
		uint64_t k = rnd(&seed) % KEYS + 1;
		void *val = (void *)(uintptr_t)(op + 1);

		if (rnd(&seed) & 1) {
			int r = tpu_hmap_put(&m, k, val);
			ck_assert_int_eq(r, model[k] ? -EEXIST : 0);
			if (!model[k]) {
				model[k] = val;
				live++;
			}
		} else {
			ck_assert_ptr_eq(tpu_hmap_del(&m, k), model[k]);
			if (model[k])
				live--;
			model[k] = NULL;
		}
		ck_assert_uint_eq(m.len, live);
		if (op % 97 == 0)
			for (uint64_t q = 1; q <= KEYS; q++)
				ck_assert_ptr_eq(tpu_hmap_get(&m, q), model[q]);
	}
	tpu_hmap_done(&m);
}
END_TEST

static Suite *hmap_suite(void)
{
	Suite *s = suite_create("hmap");
	TCase *tc = tcase_create("hmap");

	tcase_add_test(tc, test_hmap_put_get_del);
	tcase_add_test(tc, test_hmap_rejects_zero_and_duplicate_keys);
	tcase_add_test(tc, test_hmap_grows_and_iterates_every_entry);
	tcase_add_test(tc, test_hmap_random_ops_match_model);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(hmap_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
