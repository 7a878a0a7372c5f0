/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of libtpcommon (common/tpu.h, common/log.h): range and overflow helpers at their
 * edges, size parsing, the control socket path rules (explicit, $TPIPD_SOCKET, root,
 * $XDG_RUNTIME_DIR), fd helpers, the intrusive list macros, the stderr logger (one line per
 * message, whatever a name in it holds) and tpu_text_clean(). Each test runs
 * in its own forked process (CK_FORK), so tests may change the environment, the effective uid
 * and fd 2 freely. The hash map has its own suite (test_hmap.c).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include "log.h"
#include "tpu.h"

/* ---- arithmetic ---------------------------------------------------------------------------- */

START_TEST(test_common_range_ok_edges)
{
	ck_assert(tpu_range_ok(0, 0, 0));
	ck_assert(!tpu_range_ok(0, 1, 0));
	ck_assert(tpu_range_ok(4096, 0, 4096));
	ck_assert(!tpu_range_ok(4097, 0, 4096));
	ck_assert(tpu_range_ok(0, 4096, 4096));
	ck_assert(!tpu_range_ok(0, 4097, 4096));
	ck_assert(tpu_range_ok(4000, 96, 4096));
	ck_assert(!tpu_range_ok(4000, 97, 4096));
	ck_assert(!tpu_range_ok(4000, 200, 4096));
	ck_assert(tpu_range_ok(UINT64_MAX, 0, UINT64_MAX));
	ck_assert(tpu_range_ok(0, UINT64_MAX, UINT64_MAX));
	ck_assert(!tpu_range_ok(UINT64_MAX, 1, UINT64_MAX));
	ck_assert(!tpu_range_ok(1, UINT64_MAX, UINT64_MAX));
	ck_assert(!tpu_range_ok(UINT64_MAX - 10, 200, 4096)); /* would wrap to 189 */
	ck_assert(!tpu_range_ok(10, UINT64_MAX - 5, 4096));
}
END_TEST

START_TEST(test_common_add_and_mul_detect_overflow)
{
	uint64_t r = 123;

	ck_assert(tpu_add_u64(UINT64_MAX - 1, 1, &r));
	ck_assert_uint_eq(r, UINT64_MAX);
	ck_assert(!tpu_add_u64(UINT64_MAX, 1, &r));
	ck_assert(!tpu_add_u64(1ull << 63, 1ull << 63, &r));
	ck_assert(tpu_mul_u64(1ull << 31, 1ull << 32, &r));
	ck_assert_uint_eq(r, 1ull << 63);
	ck_assert(!tpu_mul_u64(1ull << 32, 1ull << 32, &r));
	ck_assert(tpu_mul_u64(UINT64_MAX, 1, &r));
	ck_assert(tpu_mul_u64(UINT64_MAX, 0, &r));
	ck_assert_uint_eq(r, 0);
}
END_TEST

/* ---- size parsing -------------------------------------------------------------------------- */

START_TEST(test_common_parse_size_suffixes)
{
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{ "0", 0 }, { "1", 1 }, { "4096", 4096 }, { "4K", 4096 }, { "4k", 4096 },
		{ "1M", 1 << 20 }, { "3m", 3 << 20 }, { "2G", 2ull << 30 }, { "1T", 1ull << 40 },
		{ "1KiB", 1024 }, { "1MiB", 1 << 20 }, { "64MB", 64 << 20 }, { "0K", 0 },
		{ "18446744073709551615", UINT64_MAX }, { "16777215T", 16777215ull << 40 },
	};

	for (size_t i = 0; i < TPU_ARRAY_SIZE(ok); i++) {
		uint64_t v = 1234567;
		int r = tpu_parse_size(ok[i].s, &v);
		ck_assert_msg(r == 0, "'%s': %d", ok[i].s, r);
		ck_assert_msg(v == ok[i].v, "'%s' -> %llu", ok[i].s, (unsigned long long)v);
	}
}
END_TEST

START_TEST(test_common_parse_size_rejects_garbage)
{
	static const char *bad[] = {
		"", "-1", "+1", "abc", "12x", "1 K", "K", "1KB2", "1Ki", "1kb", "1.5M", "0x10",
		"1KK", "1iB",
	};

	ck_assert_int_eq(tpu_parse_size(NULL, &(uint64_t){ 0 }), -EINVAL);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(bad); i++) {
		uint64_t v = 77;
		int r = tpu_parse_size(bad[i], &v);
		ck_assert_msg(r == -EINVAL, "'%s' gave %d (%llu)", bad[i], r,
			      (unsigned long long)v);
		ck_assert_uint_eq(v, 77);
	}
}
END_TEST

START_TEST(test_common_parse_size_rejects_negative_after_space)
{
	uint64_t v = 77;

	/* strtoull accepts " -1" and returns 2^64-1; a size parser must not. */
	ck_assert_int_lt(tpu_parse_size(" -1", &v), 0);
	ck_assert_int_lt(tpu_parse_size("\t-5M", &v), 0);
	ck_assert_uint_eq(v, 77);
}
END_TEST

START_TEST(test_common_parse_size_rejects_overflow)
{
	uint64_t v = 77;

	ck_assert_int_eq(tpu_parse_size("18446744073709551616", &v), -ERANGE);
	ck_assert_int_eq(tpu_parse_size("99999999999999999999999", &v), -ERANGE);
	ck_assert_int_eq(tpu_parse_size("16777216T", &v), -ERANGE); /* 2^64 */
	ck_assert_int_eq(tpu_parse_size("17179869184G", &v), -ERANGE);
	ck_assert_int_eq(tpu_parse_size("18014398509481984K", &v), -ERANGE);
	ck_assert_uint_eq(v, 77);
}
END_TEST

/* ---- socket path ---------------------------------------------------------------------------- */

static void clear_env(void)
{
	unsetenv("TPIPD_SOCKET");
	unsetenv("XDG_RUNTIME_DIR");
}

START_TEST(test_common_socket_path_explicit_wins)
{
	char buf[128];

	clear_env();
	setenv("TPIPD_SOCKET", "/env/sock", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/1", 1);
	ck_assert_int_eq(tpu_socket_path("/explicit/sock", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/explicit/sock");
}
END_TEST

START_TEST(test_common_socket_path_env_used_when_no_explicit)
{
	char buf[128];

	clear_env();
	setenv("TPIPD_SOCKET", "/env/sock", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/1", 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/env/sock");
	ck_assert_int_eq(tpu_socket_path("", buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/env/sock");
}
END_TEST

START_TEST(test_common_socket_path_root_uses_run)
{
	char buf[128];

	if (geteuid() != 0) {
		printf("skipped: not running as root\n");
		return;
	}
	clear_env();
	setenv("XDG_RUNTIME_DIR", "/run/user/0", 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/tpipd/tpipd.sock");
	setenv("TPIPD_SOCKET", "", 1); /* empty counts as unset */
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/tpipd/tpipd.sock");
}
END_TEST

/* Runs the rest of the test as an unprivileged user (this process only: CK_FORK). */
static void drop_root(void)
{
	if (geteuid() == 0)
		ck_assert_int_eq(seteuid(65534), 0);
}

/* Checked teardown: back to the real uid, so exit-time tools (LeakSanitizer) can run. */
static void restore_euid(void)
{
	if (geteuid() != getuid() && seteuid(getuid()) < 0)
		abort();
}

START_TEST(test_common_socket_path_user_uses_xdg_runtime_dir)
{
	char buf[128];

	drop_root();
	clear_env();
	setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/user/1000/tpipd.sock");
}
END_TEST

START_TEST(test_common_socket_path_user_without_xdg_fails)
{
	char buf[128] = "untouched";

	drop_root();
	clear_env();
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), -ENOENT);
	setenv("XDG_RUNTIME_DIR", "", 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), -ENOENT);
	setenv("TPIPD_SOCKET", "/env/sock", 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/env/sock");
}
END_TEST

START_TEST(test_common_socket_path_length_limit)
{
	struct sockaddr_un sun;
	char path[sizeof(sun.sun_path) + 2];
	char buf[256];
	const size_t max = sizeof(sun.sun_path) - 1; /* room for the NUL */

	clear_env();
	memset(path, 'p', sizeof(path));
	path[0] = '/';
	path[max] = '\0';
	ck_assert_int_eq(tpu_socket_path(path, buf, sizeof(buf)), 0);
	ck_assert_uint_eq(strlen(buf), max);
	path[max] = 'p';
	path[max + 1] = '\0';
	ck_assert_int_eq(tpu_socket_path(path, buf, sizeof(buf)), -ENAMETOOLONG);
	/* a caller buffer too small for the path */
	ck_assert_int_eq(tpu_socket_path("/tmp/x.sock", buf, 8), -ENAMETOOLONG);
	ck_assert_int_eq(tpu_socket_path("/tmp/x.sock", buf, 12), 0);
	/* $XDG_RUNTIME_DIR long enough that "/tpipd.sock" no longer fits */
	drop_root();
	path[max - 5] = '\0';
	setenv("XDG_RUNTIME_DIR", path, 1);
	ck_assert_int_eq(tpu_socket_path(NULL, buf, sizeof(buf)), -ENAMETOOLONG);
}
END_TEST

/* ---- fds ------------------------------------------------------------------------------------ */

START_TEST(test_common_fd_count_follows_open_and_close)
{
	int base = tpu_fd_count(), p[2];

	ck_assert_int_gt(base, 0);
	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(tpu_fd_count(), base + 2);
	ck_assert_int_eq(tpu_close(p[0]), -EBADF);
	ck_assert_int_eq(tpu_fd_count(), base + 1);
	{
		_cleanup_close_ int fd = p[1];
		(void)fd;
	}
	ck_assert_int_eq(tpu_fd_count(), base);
}
END_TEST

START_TEST(test_common_close_preserves_errno_and_take_fd_moves)
{
	int p[2], fd, moved;

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	errno = EXDEV;
	ck_assert_int_eq(tpu_close(p[0]), -EBADF);
	ck_assert_int_eq(errno, EXDEV);
	ck_assert_int_eq(tpu_close(-EBADF), -EBADF);
	ck_assert_int_eq(errno, EXDEV);
	fd = p[1];
	moved = TAKE_FD(fd);
	ck_assert_int_eq(fd, -EBADF);
	ck_assert_int_eq(moved, p[1]);
	ck_assert_int_eq(fcntl(moved, F_GETFD) >= 0, 1);
	tpu_close(moved);
}
END_TEST

START_TEST(test_common_fd_nonblock_sets_flag)
{
	int p[2];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(fcntl(p[0], F_GETFL) & O_NONBLOCK, 0);
	ck_assert_int_eq(tpu_fd_nonblock(p[0]), 0);
	ck_assert_int_ne(fcntl(p[0], F_GETFL) & O_NONBLOCK, 0);
	ck_assert_int_eq(tpu_fd_nonblock(p[0]), 0);
	ck_assert_int_eq(tpu_fd_nonblock(9999), -EBADF);
}
END_TEST

START_TEST(test_common_now_is_monotonic)
{
	uint64_t a = tpu_now_ns(), b = tpu_now_ns();

	ck_assert_uint_gt(a, 0);
	ck_assert_uint_ge(b, a);
}
END_TEST

/* ---- lists ---------------------------------------------------------------------------------- */

struct item {
	int v;
	struct tpu_list link;
};

START_TEST(test_common_list_keeps_insertion_order)
{
	struct tpu_list head = TPU_LIST_INIT(head);
	struct item it[5], *pos;
	int want = 0;

	ck_assert(tpu_list_empty(&head));
	ck_assert_ptr_null(tpu_list_first(&head, struct item, link));
	for (int i = 0; i < 5; i++) {
		it[i].v = i;
		tpu_list_init(&it[i].link);
		ck_assert(!tpu_list_linked(&it[i].link));
		tpu_list_insert_tail(&head, &it[i].link);
		ck_assert(tpu_list_linked(&it[i].link));
	}
	tpu_list_for_each(pos, &head, link)
		ck_assert_int_eq(pos->v, want++);
	ck_assert_int_eq(want, 5);
	ck_assert_ptr_eq(tpu_list_first(&head, struct item, link), &it[0]);
	tpu_list_remove(&it[0].link);
	tpu_list_remove(&it[2].link);
	ck_assert(!tpu_list_linked(&it[2].link));
	ck_assert_ptr_eq(tpu_list_first(&head, struct item, link), &it[1]);
	want = 0;
	tpu_list_for_each(pos, &head, link) {
		static const int rest[] = { 1, 3, 4 };
		ck_assert_int_eq(pos->v, rest[want++]);
	}
	ck_assert_int_eq(want, 3);
}
END_TEST

/* Splicing moves every entry, in order, to either end, and leaves the source empty; an empty
 * source changes nothing. */
START_TEST(test_common_list_splice_moves_all_in_order)
{
	struct tpu_list a = TPU_LIST_INIT(a), b = TPU_LIST_INIT(b);
	static const int want[] = { 3, 4, 0, 1, 2, 5 };
	struct item it[6], *pos;
	int n = 0;

	for (int i = 0; i < 6; i++) {
		it[i].v = i;
		tpu_list_insert_tail(i < 3 || i == 5 ? &a : &b, &it[i].link);
	}
	tpu_list_remove(&it[5].link);
	tpu_list_splice_head(&a, &b); /* a: 3 4 0 1 2 */
	ck_assert(tpu_list_empty(&b));
	tpu_list_insert_tail(&b, &it[5].link);
	tpu_list_splice_tail(&a, &b); /* a: 3 4 0 1 2 5 */
	ck_assert(tpu_list_empty(&b));
	tpu_list_splice_tail(&a, &b);
	tpu_list_splice_head(&a, &b);
	tpu_list_for_each(pos, &a, link)
		ck_assert_int_eq(pos->v, want[n++]);
	ck_assert_int_eq(n, 6);
	tpu_list_splice_tail(&b, &a); /* into an empty list */
	ck_assert(tpu_list_empty(&a));
	n = 0;
	tpu_list_for_each(pos, &b, link)
		ck_assert_int_eq(pos->v, want[n++]);
	ck_assert_int_eq(n, 6);
	ck_assert_ptr_eq(b.prev, &it[5].link);
}
END_TEST

START_TEST(test_common_list_safe_walk_allows_removal)
{
	struct tpu_list head;
	struct item it[4], *pos, *tmp;
	int seen = 0;

	tpu_list_init(&head);
	for (int i = 0; i < 4; i++) {
		it[i].v = i;
		tpu_list_insert_tail(&head, &it[i].link);
	}
	tpu_list_for_each_safe(pos, tmp, &head, link) {
		ck_assert_int_eq(pos->v, seen++);
		tpu_list_remove(&pos->link);
	}
	ck_assert_int_eq(seen, 4);
	ck_assert(tpu_list_empty(&head));
	tpu_list_for_each(pos, &head, link)
		ck_abort_msg("empty list visited");
}
END_TEST

/* ---- logging -------------------------------------------------------------------------------- */

/* Points fd 2 at a fresh pipe; returns its read end. */
static int capture_stderr(void)
{
	int p[2];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
	ck_assert_int_eq(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
	close(p[1]);
	return p[0];
}

START_TEST(test_common_log_prefixes_priority_and_filters)
{
	int fd = capture_stderr();
	char buf[256];
	ssize_t n;

	tpu_log_set_level(TPU_LOG_NOTICE);
	ck_assert_int_eq(tpu_log_get_level(), TPU_LOG_NOTICE);
	tpu_log_info("dropped %d", 1);
	tpu_log_warn("session %d: kept", 12);
	n = read(fd, buf, sizeof(buf) - 1);
	ck_assert_int_gt(n, 0);
	buf[n] = '\0';
	ck_assert_str_eq(buf, "<4>session 12: kept\n");
}
END_TEST

START_TEST(test_common_log_timestamps_after_the_priority)
{
	int fd = capture_stderr();
	char buf[256];
	regex_t re;
	ssize_t n;

	tpu_log_set_level(TPU_LOG_INFO);
	tpu_log_set_timestamps(true);
	tpu_log_warn("session %d: kept", 12);
	tpu_log_set_timestamps(false);
	tpu_log_warn("no stamp");
	n = read(fd, buf, sizeof(buf) - 1);
	ck_assert_int_gt(n, 0);
	buf[n] = '\0';
	ck_assert_int_eq(regcomp(&re, "^<4>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\."
				      "[0-9]{3}[+-][0-9]{4} session 12: kept\n<4>no stamp\n$",
				 REG_EXTENDED | REG_NOSUB), 0);
	ck_assert_msg(regexec(&re, buf, 0, NULL, 0) == 0, "log lines: '%s'", buf);
	regfree(&re);
}
END_TEST

START_TEST(test_common_log_truncates_long_lines)
{
	int fd = capture_stderr();
	char big[4096], buf[8192];
	ssize_t n;

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	tpu_log_set_level(TPU_LOG_DEBUG);
	tpu_log_err("%s", big);
	n = read(fd, buf, sizeof(buf));
	ck_assert_int_gt(n, 4);
	ck_assert_int_le(n, 1024);
	ck_assert_int_eq(buf[n - 1], '\n');
	ck_assert_mem_eq(buf, "<3>xx", 5);
}
END_TEST

/* A line cut at its limit ends before a UTF-8 character that does not fit whole, for every
 * place of the cut within a 2-, 3- and 4-byte character. */
START_TEST(test_common_log_truncates_at_a_character)
{
	static const char *const ch[] = { "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x99\x82" };
	int fd = capture_stderr();
	char big[2048], buf[2048];
	ssize_t n;

	tpu_log_set_level(TPU_LOG_DEBUG);
	for (size_t c = 0; c < 3; c++)
		for (size_t shift = 0; shift < 4; shift++) {
			size_t k = 1000 + shift, l = strlen(ch[c]), i;

			memset(big, 'x', k);
			for (i = k; i + l < sizeof(big) - 1; i += l)
				memcpy(big + i, ch[c], l);
			big[i] = '\0';
			tpu_log_err("%s", big);
			n = read(fd, buf, sizeof(buf) - 1);
			ck_assert_int_gt(n, 4);
			ck_assert_int_eq(buf[n - 1], '\n');
			buf[n - 1] = '\0';
			/* what is left after the x's is whole characters */
			ck_assert_uint_eq((strlen(buf) - 3 - k) % l, 0);
		}
}
END_TEST

START_TEST(test_common_text_clean_keeps_utf8_and_drops_controls)
{
	static const struct {
		const char *in, *controls, *utf8;
	} cases[] = {
		{ "plain name-1.2", "plain name-1.2", "plain name-1.2" },
		{ "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82", "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82",
		  "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82" },
		{ "a\nb\r\tc\x1b[2J\x7f", "a?b??c?[2J?", "a\nb\r\tc\x1b[2J\x7f" },
		/* C1: CSI and NEL; U+00A0 is no control */
		{ "\xc2\x9b" "31m\xc2\x85\xc2\xa0", "?31m?\xc2\xa0", "\xc2\x9b" "31m\xc2\x85\xc2\xa0" },
		/* bidi and line separators; U+2027 and U+202F are neither */
		{ "\xe2\x80\xae\xe2\x80\x8f\xe2\x80\xa8\xe2\x81\xa6\xd8\x9c\xe2\x80\xa7\xe2\x80\xaf",
		  "?????\xe2\x80\xa7\xe2\x80\xaf",
		  "\xe2\x80\xae\xe2\x80\x8f\xe2\x80\xa8\xe2\x81\xa6\xd8\x9c\xe2\x80\xa7\xe2\x80\xaf" },
		/* not UTF-8: lone bytes, overlong forms of ESC and CSI, a surrogate, past U+10FFFF,
		 * a sequence cut by the end */
		{ "\xff\x80\xc0\x9b\xe0\x80\x9b", "??????\x3f", "??????\x3f" },
		{ "\xed\xa0\x80|\xf4\x90\x80\x80|\xe2\x80", "???|????|??", "???|????|??" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char a[64], b[64];

		snprintf(a, sizeof(a), "%s", cases[i].in);
		snprintf(b, sizeof(b), "%s", cases[i].in);
		tpu_text_clean(a, TPU_TEXT_CONTROLS);
		tpu_text_clean(b, 0);
		ck_assert_msg(strcmp(a, cases[i].controls) == 0, "case %zu: '%s'", i, a);
		ck_assert_msg(strcmp(b, cases[i].utf8) == 0, "case %zu: '%s'", i, b);
	}
}
END_TEST

START_TEST(test_common_log_message_stays_one_line)
{
	int fd = capture_stderr();
	char buf[1024];
	ssize_t n;

	tpu_log_set_level(TPU_LOG_DEBUG);
	tpu_log_info("group '%s' joined", "g\n<0>forged\x1b[2J\xff");
	n = read(fd, buf, sizeof(buf) - 1);
	ck_assert_int_gt(n, 0);
	buf[n] = '\0';
	ck_assert_str_eq(buf, "<6>group 'g?<0>forged?[2J?' joined\n");
}
END_TEST

START_TEST(test_common_log_level_names)
{
	enum tpu_log_level l = TPU_LOG_INFO;

	ck_assert_int_eq(tpu_log_parse_level("err", &l), 0);
	ck_assert_int_eq(l, TPU_LOG_ERR);
	ck_assert_int_eq(tpu_log_parse_level("warning", &l), 0);
	ck_assert_int_eq(l, TPU_LOG_WARNING);
	ck_assert_int_eq(tpu_log_parse_level("notice", &l), 0);
	ck_assert_int_eq(l, TPU_LOG_NOTICE);
	ck_assert_int_eq(tpu_log_parse_level("info", &l), 0);
	ck_assert_int_eq(l, TPU_LOG_INFO);
	ck_assert_int_eq(tpu_log_parse_level("debug", &l), 0);
	ck_assert_int_eq(l, TPU_LOG_DEBUG);
	ck_assert_int_eq(tpu_log_parse_level("verbose", &l), -EINVAL);
	ck_assert_int_eq(tpu_log_parse_level("", &l), -EINVAL);
	ck_assert_int_eq(l, TPU_LOG_DEBUG);
}
END_TEST

/* strdup() as tpu_strv_dup() sees it: fails at its @strdup_fail_at'th call from now (1 the next;
 * 0 never), so that every partial failure can be reached. */
static unsigned strdup_fail_at;

char *strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p;

	if (strdup_fail_at && --strdup_fail_at == 0)
		return NULL;
	p = malloc(n);
	return p ? memcpy(p, s, n) : NULL;
}

/* Bytes the process has allocated (glibc's count, blocks in its per-thread cache included;
 * constant where a sanitizer's allocator replaces it, whose leak checker then tells instead). */
static size_t heap_in_use(void)
{
	return mallinfo2().uordblks;
}

/* A list of strings copied: each string its own copy, in order; none for an empty list; the
 * count and each length just at their bounds taken and just above refused, as is a NULL
 * string; a copy failing at any string frees what it had copied and leaves *ret alone. */
START_TEST(test_common_strv_dup_bounds_and_frees_on_failure)
{
	char long_name[9] = "abcdefgh";
	char *src[4] = { "psk", "cert:gn02", long_name, "x" }, **v = NULL, **keep = (char **)&v;
	size_t before;

	ck_assert_int_eq(tpu_strv_dup(src, 4, 4, 9, &v), 0); /* just at both bounds */
	for (size_t i = 0; i < 4; i++) {
		ck_assert_str_eq(v[i], src[i]);
		ck_assert_ptr_ne(v[i], src[i]);
	}
	tpu_strv_free(v, 4);
	ck_assert_int_eq(tpu_strv_dup(src, 0, 4, 9, &v), 0);
	ck_assert_ptr_null(v);
	tpu_strv_free(NULL, 0);

	v = keep;
	ck_assert_int_eq(tpu_strv_dup(src, 4, 3, 9, &v), -E2BIG); /* one above the count */
	ck_assert_int_eq(tpu_strv_dup(src, 4, 4, 7, &v), -ENAMETOOLONG); /* 8 > 7 bytes */
	src[3] = NULL;
	ck_assert_int_eq(tpu_strv_dup(src, 4, 4, 9, &v), -EINVAL);
	src[3] = "x";
	ck_assert_ptr_eq(v, keep);

	for (unsigned at = 1; at <= 4; at++) {
		/* 16 times, measured on the last: freed blocks go to malloc's per-thread cache
		 * (still counted in use, and calloc() takes none from it) until it holds 7 of a
		 * size; a leak grows the count on every call, a clean failure then not */
		int r[16];
		size_t after;

		for (int k = 0; k < 16; k++) {
			before = heap_in_use();
			strdup_fail_at = at;
			r[k] = tpu_strv_dup(src, 4, 4, 9, &v);
			strdup_fail_at = 0;
		}
		after = heap_in_use();
		for (int k = 0; k < 16; k++)
			ck_assert_int_eq(r[k], -ENOMEM);
		ck_assert_ptr_eq(v, keep);
		ck_assert_uint_eq(after, before);
	}
}
END_TEST

/* The ranges a receive holds: merged where they touch, sorted, overlaps refused, a bound on
 * their count, and the prefix test. */
START_TEST(test_common_ranges_merge_refuse_overlaps_and_bound)
{
	struct tpu_ranges rs = { 0 };

	ck_assert(tpu_ranges_is_prefix(&rs, 0));
	ck_assert(!tpu_ranges_is_prefix(&rs, 1));
	ck_assert_int_eq(tpu_ranges_add(&rs, 5, 5, 8), -EINVAL);
	ck_assert_int_eq(tpu_ranges_add(&rs, 6, 5, 8), -EINVAL);
	ck_assert_int_eq(tpu_ranges_add(&rs, 100, 200, 8), 0);
	ck_assert_int_eq(tpu_ranges_add(&rs, 300, 400, 8), 0);
	ck_assert_uint_eq(rs.n, 2);
	/* every overlap, by one byte or more, and nothing changes */
	ck_assert_int_eq(tpu_ranges_add(&rs, 100, 200, 8), -EEXIST);
	ck_assert_int_eq(tpu_ranges_add(&rs, 199, 201, 8), -EEXIST);
	ck_assert_int_eq(tpu_ranges_add(&rs, 50, 101, 8), -EEXIST);
	ck_assert_int_eq(tpu_ranges_add(&rs, 150, 160, 8), -EEXIST);
	ck_assert_int_eq(tpu_ranges_add(&rs, 0, 1000, 8), -EEXIST);
	ck_assert_int_eq(tpu_ranges_add(&rs, 250, 301, 8), -EEXIST);
	ck_assert_uint_eq(rs.n, 2);
	/* a bound on separate ranges, not on merges */
	ck_assert_int_eq(tpu_ranges_add(&rs, 500, 510, 2), -E2BIG);
	ck_assert_int_eq(tpu_ranges_add(&rs, 200, 250, 2), 0); /* touches the first */
	ck_assert_int_eq(tpu_ranges_add(&rs, 260, 300, 2), 0); /* touches the second */
	ck_assert_uint_eq(rs.n, 2);
	ck_assert_int_eq(tpu_ranges_add(&rs, 250, 260, 2), 0); /* joins both */
	ck_assert_uint_eq(rs.n, 1);
	ck_assert(!tpu_ranges_is_prefix(&rs, 400));
	ck_assert_int_eq(tpu_ranges_add(&rs, 0, 100, 1), 0);
	ck_assert(tpu_ranges_is_prefix(&rs, 400));
	ck_assert(!tpu_ranges_is_prefix(&rs, 399));
	/* many, out of order: every other unit, then the gaps */
	tpu_ranges_done(&rs);
	ck_assert_uint_eq(rs.n, 0);
	for (uint64_t k = 0; k < 1000; k++)
		ck_assert_int_eq(tpu_ranges_add(&rs, (999 - k) * 2, (999 - k) * 2 + 1, 1000), 0);
	ck_assert_uint_eq(rs.n, 1000);
	ck_assert_int_eq(tpu_ranges_add(&rs, 3000, 3001, 1000), -E2BIG);
	for (uint64_t k = 0; k < 999; k++)
		ck_assert_int_eq(tpu_ranges_add(&rs, k * 2 + 1, k * 2 + 2, 1000), 0);
	ck_assert(tpu_ranges_is_prefix(&rs, 1999));
	tpu_ranges_done(&rs);
}
END_TEST

static Suite *common_suite(void)
{
	Suite *s = suite_create("common");
	TCase *a = tcase_create("arith");
	TCase *p = tcase_create("path");
	TCase *f = tcase_create("fd");
	TCase *l = tcase_create("list");
	TCase *g = tcase_create("log");

	tcase_add_test(a, test_common_range_ok_edges);
	tcase_add_test(a, test_common_add_and_mul_detect_overflow);
	tcase_add_test(a, test_common_parse_size_suffixes);
	tcase_add_test(a, test_common_parse_size_rejects_garbage);
	tcase_add_test(a, test_common_parse_size_rejects_negative_after_space);
	tcase_add_test(a, test_common_parse_size_rejects_overflow);
	suite_add_tcase(s, a);

	tcase_add_checked_fixture(p, NULL, restore_euid);
	tcase_add_test(p, test_common_socket_path_explicit_wins);
	tcase_add_test(p, test_common_socket_path_env_used_when_no_explicit);
	tcase_add_test(p, test_common_socket_path_root_uses_run);
	tcase_add_test(p, test_common_socket_path_user_uses_xdg_runtime_dir);
	tcase_add_test(p, test_common_socket_path_user_without_xdg_fails);
	tcase_add_test(p, test_common_socket_path_length_limit);
	suite_add_tcase(s, p);

	tcase_add_test(f, test_common_fd_count_follows_open_and_close);
	tcase_add_test(f, test_common_close_preserves_errno_and_take_fd_moves);
	tcase_add_test(f, test_common_fd_nonblock_sets_flag);
	tcase_add_test(f, test_common_now_is_monotonic);
	suite_add_tcase(s, f);

	tcase_add_test(l, test_common_list_keeps_insertion_order);
	tcase_add_test(l, test_common_list_splice_moves_all_in_order);
	tcase_add_test(l, test_common_list_safe_walk_allows_removal);
	suite_add_tcase(s, l);

	tcase_add_test(g, test_common_log_prefixes_priority_and_filters);
	tcase_add_test(g, test_common_log_timestamps_after_the_priority);
	tcase_add_test(g, test_common_log_truncates_long_lines);
	tcase_add_test(g, test_common_log_truncates_at_a_character);
	tcase_add_test(g, test_common_log_level_names);
	tcase_add_test(g, test_common_log_message_stays_one_line);
	tcase_add_test(g, test_common_text_clean_keeps_utf8_and_drops_controls);
	tcase_add_test(g, test_common_ranges_merge_refuse_overlaps_and_bound);
	tcase_add_test(g, test_common_strv_dup_bounds_and_frees_on_failure);
	suite_add_tcase(s, g);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(common_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
