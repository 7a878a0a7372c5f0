/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for daemon/peer/peerauth.c: the pre-shared key file rules (mode, owner, symlinks, file
 * type, length limits and trimming), HMAC-SHA256 against RFC 4231 and its domain separation by
 * key, label and index, constant-time MAC comparison, nonces, instance ids and the boot id.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "peerauth.h"

static char dir[256];
static char path[512];

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(dir, sizeof(dir), "%s/tpt-peerauth-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/peer.key", dir);
}

static void teardown(void)
{
	char p[600];

	snprintf(p, sizeof(p), "%s/link", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/sub", dir);
	rmdir(p);
	unlink(path);
	rmdir(dir);
}

/* Writes @len bytes of @data to the key path with @mode. */
static void write_key(const void *data, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

static void write_key_str(const char *s, mode_t mode)
{
	write_key(s, strlen(s), mode);
}

/* A key of @n 'k' bytes plus a newline. */
static void write_key_of_len(size_t n)
{
	char *buf = malloc(n + 1);

	ck_assert_ptr_nonnull(buf);
	memset(buf, 'k', n);
	buf[n] = '\n';
	write_key(buf, n + 1, 0600);
	free(buf);
}

/* Loads the key path and expects failure @err; the result must stay untouched. */
static void expect_refused(int err, char *why, size_t why_len)
{
	struct tpd_peer_key k = { .bytes = (uint8_t *)"untouched", .len = 9 };

	ck_assert_int_eq(tpd_peerauth_key_load(path, &k, why, why_len), err);
	ck_assert_str_eq((const char *)k.bytes, "untouched");
	ck_assert_uint_eq(k.len, 9);
	ck_assert_uint_gt(strlen(why), 0);
}

START_TEST(test_key_load_accepts_0600_and_trims_newline)
{
	struct tpd_peer_key k = { 0 };
	char why[256] = "";

	write_key_str("0123456789abcdefXYZ \t\r\n\n", 0600);
	ck_assert_int_eq(tpd_peerauth_key_load(path, &k, why, sizeof(why)), 0);
	ck_assert_uint_eq(k.len, 19);
	ck_assert(memcmp(k.bytes, "0123456789abcdefXYZ", 19) == 0);
	tpd_peerauth_key_done(&k);
	ck_assert_ptr_null(k.bytes);
	ck_assert_uint_eq(k.len, 0);
}
END_TEST

START_TEST(test_key_load_accepts_0400_and_keeps_inner_space)
{
	struct tpd_peer_key k = { 0 };
	char why[256] = "";

	write_key_str("pass phrase with spaces\n", 0400);
	ck_assert_int_eq(tpd_peerauth_key_load(path, &k, why, sizeof(why)), 0);
	ck_assert_uint_eq(k.len, 23);
	ck_assert(memcmp(k.bytes, "pass phrase with spaces", 23) == 0);
	tpd_peerauth_key_done(&k);
}
END_TEST

START_TEST(test_key_load_refuses_group_or_other_access)
{
	static const mode_t modes[] = { 0644, 0640, 0604, 0610, 0601, 0660 };
	char why[256];

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		char want[32];

		write_key_str("0123456789abcdef0123\n", modes[i]);
		why[0] = '\0';
		expect_refused(-EPERM, why, sizeof(why));
		snprintf(want, sizeof(want), "(mode %04o)", (unsigned)modes[i]);
		ck_assert_msg(strstr(why, want), "why: %s", why);
		ck_assert_msg(strstr(why, "chmod 600"), "why: %s", why);
		ck_assert_msg(strstr(why, path), "why: %s", why);
	}
}
END_TEST

START_TEST(test_key_load_refuses_foreign_owner)
{
	char why[256] = "";

	if (geteuid() != 0)
		return; /* cannot give a file away without root */
	write_key_str("0123456789abcdef0123\n", 0600);
	ck_assert_int_eq(chown(path, 4242, 4242), 0);
	expect_refused(-EPERM, why, sizeof(why));
	ck_assert_msg(strstr(why, "4242"), "why: %s", why);
}
END_TEST

START_TEST(test_key_load_refuses_symlink)
{
	char link[sizeof(path)], why[256] = "";

	write_key_str("0123456789abcdef0123\n", 0600);
	snprintf(link, sizeof(link), "%s/link", dir);
	ck_assert_int_eq(symlink(path, link), 0);
	snprintf(path, sizeof(path), "%s", link);
	expect_refused(-ELOOP, why, sizeof(why));
	ck_assert_msg(strstr(why, "symbolic link"), "why: %s", why);
	snprintf(path, sizeof(path), "%s/peer.key", dir);
}
END_TEST

START_TEST(test_key_load_refuses_too_short)
{
	char why[512] = "";

	write_key_of_len(TPD_PEERAUTH_KEY_MIN - 1);
	expect_refused(-EINVAL, why, sizeof(why));
	ck_assert_msg(strstr(why, "too short"), "why: %s", why);
	ck_assert_msg(strstr(why, "at least 16 bytes"), "why: %s", why);
	ck_assert_msg(strstr(why, "head -c 32 /dev/urandom | base64 >"), "why: %s", why);
}
END_TEST

START_TEST(test_key_load_length_limits)
{
	struct tpd_peer_key k = { 0 };
	char why[512] = "";

	write_key_of_len(TPD_PEERAUTH_KEY_MIN);
	ck_assert_int_eq(tpd_peerauth_key_load(path, &k, why, sizeof(why)), 0);
	ck_assert_uint_eq(k.len, TPD_PEERAUTH_KEY_MIN);
	tpd_peerauth_key_done(&k);

	write_key_of_len(TPD_PEERAUTH_KEY_MAX);
	ck_assert_int_eq(tpd_peerauth_key_load(path, &k, why, sizeof(why)), 0);
	ck_assert_uint_eq(k.len, TPD_PEERAUTH_KEY_MAX);
	tpd_peerauth_key_done(&k);

	write_key_of_len(TPD_PEERAUTH_KEY_MAX + 1);
	expect_refused(-EINVAL, why, sizeof(why));
	ck_assert_msg(strstr(why, "too long"), "why: %s", why);

	write_key_of_len(1 << 20);
	expect_refused(-EINVAL, why, sizeof(why));
}
END_TEST

START_TEST(test_key_load_refuses_empty)
{
	char why[512] = "";

	write_key("", 0, 0600);
	expect_refused(-EINVAL, why, sizeof(why));
	ck_assert_msg(strstr(why, "empty"), "why: %s", why);

	why[0] = '\0';
	write_key_str(" \n\n\t\n", 0600);
	expect_refused(-EINVAL, why, sizeof(why));
	ck_assert_msg(strstr(why, "empty"), "why: %s", why);
}
END_TEST

START_TEST(test_key_load_refuses_directory)
{
	char why[256] = "";

	snprintf(path, sizeof(path), "%s/sub", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	expect_refused(-EINVAL, why, sizeof(why));
	ck_assert_msg(strstr(why, "not a regular file"), "why: %s", why);
	snprintf(path, sizeof(path), "%s/peer.key", dir);
}
END_TEST

START_TEST(test_key_load_refuses_missing)
{
	char why[256] = "";

	expect_refused(-ENOENT, why, sizeof(why));
	ck_assert_msg(strstr(why, path), "why: %s", why);
}
END_TEST

START_TEST(test_key_done_accepts_empty_key)
{
	struct tpd_peer_key k = { 0 };

	tpd_peerauth_key_done(&k);
	tpd_peerauth_key_done(&k);
	tpd_peerauth_key_done(NULL);
}
END_TEST

static const struct tpd_peer_key jefe = { .bytes = (uint8_t *)"Jefe", .len = 4 };
static const char jefe_data[] = "what do ya want for nothing?";
/* RFC 4231 test case 2, HMAC-SHA-256. */
static const uint8_t rfc4231_tc2[32] = {
	0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
	0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
	0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43,
};

START_TEST(test_mac_matches_rfc4231_case2)
{
	uint8_t out[32];

	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "", (const uint8_t *)jefe_data,
					  strlen(jefe_data), NULL, 0, -1, out),
			 0);
	ck_assert_mem_eq(out, rfc4231_tc2, 32);
}
END_TEST

START_TEST(test_mac_covers_label_a_b_concatenated)
{
	const uint8_t *d = (const uint8_t *)jefe_data;
	uint8_t out[32];

	/* "what do ya" | " want" | " for nothing?" is the same message. */
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "what do ya", d + 10, 5, d + 15, 13, -1, out), 0);
	ck_assert_mem_eq(out, rfc4231_tc2, 32);
}
END_TEST

START_TEST(test_mac_appends_index_as_u32_le)
{
	const uint8_t a[] = "nonce-a", b[] = "nonce-b";
	const uint8_t b_idx[] = { 'n', 'o', 'n', 'c', 'e', '-', 'b', 0x04, 0x03, 0x02, 0x01 };
	uint8_t with_idx[32], spelled[32];

	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-data", a, 7, b, 7, 0x01020304,
					  with_idx),
			 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-data", a, 7, b_idx, sizeof(b_idx),
					  -1, spelled),
			 0);
	ck_assert_mem_eq(with_idx, spelled, 32);
}
END_TEST

START_TEST(test_mac_differs_with_key_label_index)
{
	const struct tpd_peer_key other = { .bytes = (uint8_t *)"Jefe!", .len = 5 };
	const uint8_t a[32] = { 1 }, b[32] = { 2 };
	uint8_t base[32], m[32];

	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-dial", a, 32, b, 32, -1, base), 0);
	ck_assert_int_eq(tpd_peerauth_mac(&other, "tpipd-peer-dial", a, 32, b, 32, -1, m), 0);
	ck_assert(memcmp(base, m, 32) != 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-answer", a, 32, b, 32, -1, m), 0);
	ck_assert(memcmp(base, m, 32) != 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-dial", b, 32, a, 32, -1, m), 0);
	ck_assert(memcmp(base, m, 32) != 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-dial", a, 32, b, 32, 0, m), 0);
	ck_assert(memcmp(base, m, 32) != 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "tpipd-peer-dial", a, 32, b, 32, 1, base), 0);
	ck_assert(memcmp(base, m, 32) != 0);
}
END_TEST

START_TEST(test_mac_rejects_empty_key_and_big_index)
{
	const struct tpd_peer_key empty = { 0 };
	uint8_t out[32];

	ck_assert_int_eq(tpd_peerauth_mac(&empty, "", NULL, 0, NULL, 0, -1, out), -EINVAL);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "", NULL, 0, NULL, 0, (int64_t)UINT32_MAX, out),
			 0);
	ck_assert_int_eq(tpd_peerauth_mac(&jefe, "", NULL, 0, NULL, 0,
					  (int64_t)UINT32_MAX + 1, out),
			 -EINVAL);
}
END_TEST

START_TEST(test_mac_ok_checks_length_and_bytes)
{
	uint8_t got[33];

	memcpy(got, rfc4231_tc2, 32);
	got[32] = 0;
	ck_assert(tpd_peerauth_mac_ok(rfc4231_tc2, got, 32));
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, got, 31));
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, got, 33));
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, got, 0));
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, NULL, 32));
	got[31] ^= 1;
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, got, 32));
	got[31] ^= 1;
	got[0] ^= 0x80;
	ck_assert(!tpd_peerauth_mac_ok(rfc4231_tc2, got, 32));
}
END_TEST

START_TEST(test_nonces_and_instances_differ)
{
	uint8_t n1[32], n2[32];
	uint64_t i1 = 0, i2 = 0;

	ck_assert_int_eq(tpd_peerauth_nonce(n1), 0);
	ck_assert_int_eq(tpd_peerauth_nonce(n2), 0);
	ck_assert(memcmp(n1, n2, 32) != 0);
	ck_assert_int_eq(tpd_peerauth_instance(&i1), 0);
	ck_assert_int_eq(tpd_peerauth_instance(&i2), 0);
	ck_assert_uint_ne(i1, 0);
	ck_assert_uint_ne(i1, i2);
}
END_TEST

START_TEST(test_boot_id_is_16_stable_nonzero_bytes)
{
	static const uint8_t zero[16] = { 0 };
	uint8_t a[17], b[16], want[16];
	char text[64] = "";
	FILE *f;

	memset(a, 0xee, sizeof(a));
	ck_assert_int_eq(tpd_peerauth_boot_id(a), 0);
	ck_assert_uint_eq(a[16], 0xee); /* wrote exactly 16 bytes */
	ck_assert(memcmp(a, zero, 16) != 0);
	ck_assert_int_eq(tpd_peerauth_boot_id(b), 0);
	ck_assert_mem_eq(a, b, 16);

	/* Same bytes as the UUID text, parsed independently here. */
	f = fopen("/proc/sys/kernel/random/boot_id", "re");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(text, sizeof(text), f));
	fclose(f);
	ck_assert_int_eq(sscanf(text,
				"%2hhx%2hhx%2hhx%2hhx-%2hhx%2hhx-%2hhx%2hhx-%2hhx%2hhx-"
				"%2hhx%2hhx%2hhx%2hhx%2hhx%2hhx",
				&want[0], &want[1], &want[2], &want[3], &want[4], &want[5],
				&want[6], &want[7], &want[8], &want[9], &want[10], &want[11],
				&want[12], &want[13], &want[14], &want[15]),
			 16);
	ck_assert_mem_eq(a, want, 16);
}
END_TEST

static Suite *peerauth_suite(void)
{
	Suite *s = suite_create("peerauth");
	TCase *key = tcase_create("key");
	TCase *mac = tcase_create("mac");
	TCase *ids = tcase_create("ids");

	tcase_add_checked_fixture(key, setup, teardown);
	tcase_add_test(key, test_key_load_accepts_0600_and_trims_newline);
	tcase_add_test(key, test_key_load_accepts_0400_and_keeps_inner_space);
	tcase_add_test(key, test_key_load_refuses_group_or_other_access);
	tcase_add_test(key, test_key_load_refuses_foreign_owner);
	tcase_add_test(key, test_key_load_refuses_symlink);
	tcase_add_test(key, test_key_load_refuses_too_short);
	tcase_add_test(key, test_key_load_length_limits);
	tcase_add_test(key, test_key_load_refuses_empty);
	tcase_add_test(key, test_key_load_refuses_directory);
	tcase_add_test(key, test_key_load_refuses_missing);
	tcase_add_test(key, test_key_done_accepts_empty_key);
	suite_add_tcase(s, key);

	tcase_add_test(mac, test_mac_matches_rfc4231_case2);
	tcase_add_test(mac, test_mac_covers_label_a_b_concatenated);
	tcase_add_test(mac, test_mac_appends_index_as_u32_le);
	tcase_add_test(mac, test_mac_differs_with_key_label_index);
	tcase_add_test(mac, test_mac_rejects_empty_key_and_big_index);
	tcase_add_test(mac, test_mac_ok_checks_length_and_bytes);
	suite_add_tcase(s, mac);

	tcase_add_test(ids, test_nonces_and_instances_differ);
	tcase_add_test(ids, test_boot_id_is_16_stable_nonzero_bytes);
	suite_add_tcase(s, ids);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(peerauth_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
