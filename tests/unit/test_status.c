/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the wire status codes (proto/validate.c): every Status maps to the errno that
 * docs/protocol.md names and back, from either sign of errno; unknown statuses and unmapped
 * errnos fall back as documented; status names are distinct; the default limits are the
 * protocol's.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include "validate.h"

static const struct {
	Tpw__V1__Status s;
	int err;
} status_table[] = {
	{ TPW__V1__STATUS__STATUS_OK, 0 },
	{ TPW__V1__STATUS__STATUS_INVALID, EINVAL },
	{ TPW__V1__STATUS__STATUS_NOT_FOUND, ENOENT },
	{ TPW__V1__STATUS__STATUS_EXISTS, EADDRINUSE },
	{ TPW__V1__STATUS__STATUS_PERMISSION, EACCES },
	{ TPW__V1__STATUS__STATUS_LIMIT, ENOBUFS },
	{ TPW__V1__STATUS__STATUS_TOO_BIG, EMSGSIZE },
	{ TPW__V1__STATUS__STATUS_CLOSED, EPIPE },
	{ TPW__V1__STATUS__STATUS_PEER_DIED, ECONNRESET },
	{ TPW__V1__STATUS__STATUS_CANCELED, ECANCELED },
	{ TPW__V1__STATUS__STATUS_RANGE, ERANGE },
	{ TPW__V1__STATUS__STATUS_IO, EIO },
	{ TPW__V1__STATUS__STATUS_UNSUPPORTED, EOPNOTSUPP },
	{ TPW__V1__STATUS__STATUS_VERSION, EPROTONOSUPPORT },
	{ TPW__V1__STATUS__STATUS_FAULT, EFAULT },
	{ TPW__V1__STATUS__STATUS_TIMEOUT, ETIMEDOUT },
	{ TPW__V1__STATUS__STATUS_SHUTDOWN, ESHUTDOWN },
	{ TPW__V1__STATUS__STATUS_BUSY, EBUSY },
	{ TPW__V1__STATUS__STATUS_REFUSED, ECONNREFUSED },
	{ TPW__V1__STATUS__STATUS_UNREACHABLE, EHOSTUNREACH },
	{ TPW__V1__STATUS__STATUS_ADMIN_CLOSED, ECONNABORTED },
};

START_TEST(test_status_maps_to_errno_and_back)
{
	for (size_t i = 0; i < sizeof(status_table) / sizeof(status_table[0]); i++) {
		Tpw__V1__Status s = status_table[i].s;
		int e = status_table[i].err;

		ck_assert_int_eq(tpw_status_to_errno(s), -e);
		ck_assert_int_eq(tpw_status_from_errno(-e), s);
		ck_assert_int_eq(tpw_status_from_errno(e), s);
		ck_assert_str_ne(tpw_status_name(s), "unknown");
		for (size_t j = 0; j < i; j++)
			ck_assert_str_ne(tpw_status_name(s), tpw_status_name(status_table[j].s));
	}
}
END_TEST

START_TEST(test_status_unknown_maps_to_eio)
{
	ck_assert_int_eq(tpw_status_to_errno(TPW__V1__STATUS__STATUS_UNSPECIFIED), -EIO);
	ck_assert_int_eq(tpw_status_to_errno(TPW__V1__STATUS__STATUS_UNREACHABLE + 1), -EIO);
	ck_assert_int_eq(tpw_status_to_errno(TPW__V1__STATUS__STATUS_ADMIN_CLOSED + 1), -EIO);
	ck_assert_int_eq(tpw_status_to_errno(-3), -EIO);
	ck_assert_str_eq(tpw_status_name(TPW__V1__STATUS__STATUS_UNREACHABLE + 1), "unknown");
	ck_assert_int_eq(tpw_status_from_errno(ENOSYS), TPW__V1__STATUS__STATUS_IO);
	ck_assert_int_eq(tpw_status_from_errno(-ESRCH), TPW__V1__STATUS__STATUS_FAULT);
	ck_assert_int_eq(tpw_status_from_errno(-EPERM), TPW__V1__STATUS__STATUS_FAULT);
	ck_assert_int_eq(tpw_status_from_errno(-E2BIG), TPW__V1__STATUS__STATUS_LIMIT);
	ck_assert_int_eq(tpw_status_from_errno(-EBADMSG), TPW__V1__STATUS__STATUS_INVALID);
}
END_TEST

START_TEST(test_status_default_limits_match_protocol)
{
	struct tpw_limits l;

	tpw_limits_default(&l);
	ck_assert_uint_eq(l.frame_max, 4u << 20);
	ck_assert_uint_le(l.frame_max, TPW_FRAME_MAX_HARD);
	ck_assert_uint_le(l.inline_max, l.frame_max);
	ck_assert_uint_eq(l.segments_max, 1024);
	ck_assert_uint_eq(l.metadata_max, 1u << 20);
	ck_assert_uint_eq(l.message_bytes_max, 16ull << 30);
}
END_TEST

static Suite *status_suite(void)
{
	Suite *s = suite_create("status");
	TCase *tc = tcase_create("status");

	tcase_add_test(tc, test_status_maps_to_errno_and_back);
	tcase_add_test(tc, test_status_unknown_maps_to_eio);
	tcase_add_test(tc, test_status_default_limits_match_protocol);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(status_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
