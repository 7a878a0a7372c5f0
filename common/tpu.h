/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libtpcommon: the small helpers every layer of tpipd shares: cleanup macros, fd ownership
 * helpers, an intrusive list, overflow-checked arithmetic, monotonic time and the socket path
 * rules. Nothing here knows about the wire, the daemon or the client library.
 */
#ifndef TPU_H
#define TPU_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define TPU_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define TPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TPU_MAX(a, b) ((a) > (b) ? (a) : (b))
#define tpu_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

/* Move ownership out of a cleanup variable. */
#define TAKE_PTR(p)                                                                                \
	({                                                                                         \
		__typeof__(p) _tp = (p);                                                           \
		(p) = NULL;                                                                        \
		_tp;                                                                               \
	})
#define TAKE_FD(fd)                                                                                \
	({                                                                                         \
		int _tf = (fd);                                                                    \
		(fd) = -EBADF;                                                                     \
		_tf;                                                                               \
	})

static inline void tpu_freep(void *p)
{
	free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(tpu_freep)

/* Closes @fd if it is valid, preserving errno; returns -EBADF for assignment. */
static inline int tpu_close(int fd)
{
	if (fd >= 0) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
	return -EBADF;
}

static inline void tpu_closep(int *fd)
{
	*fd = tpu_close(*fd);
}
#define _cleanup_close_ _cleanup_(tpu_closep)

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool tpu_add_u64(uint64_t a, uint64_t b, uint64_t *ret)
{
	return !__builtin_add_overflow(a, b, ret);
}
static inline bool tpu_mul_u64(uint64_t a, uint64_t b, uint64_t *ret)
{
	return !__builtin_mul_overflow(a, b, ret);
}

/* True if [off, off + len) lies inside [0, size). Zero-length ranges at off <= size are inside. */
static inline bool tpu_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
	uint64_t end;
	return tpu_add_u64(off, len, &end) && end <= size;
}

/* Intrusive doubly-linked circular list. */
struct tpu_list {
	struct tpu_list *next, *prev;
};

#define TPU_LIST_INIT(name) { &(name), &(name) }

static inline void tpu_list_init(struct tpu_list *l)
{
	l->next = l->prev = l;
}
static inline bool tpu_list_empty(const struct tpu_list *l)
{
	return l->next == l;
}
static inline void tpu_list_insert_tail(struct tpu_list *head, struct tpu_list *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}
static inline void tpu_list_insert_head(struct tpu_list *head, struct tpu_list *n)
{
	tpu_list_insert_tail(head->next, n);
}
static inline void tpu_list_remove(struct tpu_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = n;
}
static inline bool tpu_list_linked(const struct tpu_list *n)
{
	return n->next != n;
}
/* Moves every entry of @from to the end of @to, in order; @from is left empty. */
static inline void tpu_list_splice_tail(struct tpu_list *to, struct tpu_list *from)
{
	if (tpu_list_empty(from))
		return;
	from->next->prev = to->prev;
	to->prev->next = from->next;
	from->prev->next = to;
	to->prev = from->prev;
	tpu_list_init(from);
}
/* Moves every entry of @from to the front of @to, in order; @from is left empty. */
static inline void tpu_list_splice_head(struct tpu_list *to, struct tpu_list *from)
{
	tpu_list_splice_tail(to->next, from);
}
#define tpu_list_first(head, type, member)                                                         \
	(tpu_list_empty(head) ? NULL : tpu_container_of((head)->next, type, member))
#define tpu_list_for_each(pos, head, member)                                                       \
	for (pos = tpu_container_of((head)->next, __typeof__(*pos), member); &pos->member != (head);  \
	     pos = tpu_container_of(pos->member.next, __typeof__(*pos), member))
#define tpu_list_for_each_safe(pos, tmp, head, member)                                             \
	for (pos = tpu_container_of((head)->next, __typeof__(*pos), member),                       \
	    tmp = tpu_container_of(pos->member.next, __typeof__(*pos), member);                    \
	     &pos->member != (head);                                                               \
	     pos = tmp, tmp = tpu_container_of(tmp->member.next, __typeof__(*pos), member))

/* Monotonic clock in nanoseconds. */
uint64_t tpu_now_ns(void);

/*
 * tpu_copy_stream() - copies @n bytes from @src to @dst with non-temporal stores where the CPU
 * has them (x86-64), prefetching the source 2 KiB ahead, then a store fence: for a destination
 * that no cache will hold by the time it is read (a copy of a quarter of the cache or more,
 * another core reading it later), whose lines plain stores would first read from memory.
 * Ranges must not overlap. Below 256 bytes, memcpy().
 */
void tpu_copy_stream(void *dst, const void *src, size_t n);

/* Sets O_NONBLOCK on @fd. Return: 0 or -errno. */
int tpu_fd_nonblock(int fd);

/* Number of open fds of this process (counts /proc/self/fd). Return: count or -errno. */
int tpu_fd_count(void);

/*
 * tpu_socket_path() - resolve the daemon's control socket path.
 * @explicit_path: a path given on the command line or to the API, or NULL.
 * @buf, @len: where the path is written (NUL-terminated).
 *
 * Order: @explicit_path, then $TPIPD_SOCKET, then /run/tpipd/tpipd.sock for root, else
 * $XDG_RUNTIME_DIR/tpipd.sock. Daemon and clients resolve the same way.
 * Return: 0, -ENAMETOOLONG if the path does not fit a sockaddr_un, -ENOENT if no rule applies.
 */
int tpu_socket_path(const char *explicit_path, char *buf, size_t len);

/* The system service's control socket (tpipd.service, /run/tpipd from RuntimeDirectory=). */
#define TPU_SYSTEM_SOCKET "/run/tpipd/tpipd.sock"

/* Where a client looks for the daemon: one fixed path, or the per-user socket then the system's. */
struct tpu_socket_list {
	unsigned n;	/* 1 or 2 */
	bool fixed;	/* path[0] was asked for or is root's: never fallen back from */
	char path[2][108];
};

/*
 * tpu_socket_candidates() - the sockets a client tries, in order.
 * @explicit_path: a path given on the command line or to the API, or NULL.
 * @ret: filled on success.
 *
 * @explicit_path, $TPIPD_SOCKET or (for root) the system socket are the only candidate. Any
 * other process tries $XDG_RUNTIME_DIR/tpipd.sock (when the variable is set) and then the
 * system socket, TPU_SYSTEM_SOCKET; $TPIPD_TEST_SYSTEM_SOCKET replaces the latter for tests
 * (it only chooses which socket this process connects to, as $TPIPD_SOCKET does).
 * Return: 0, or -ENAMETOOLONG if a path does not fit a sockaddr_un.
 */
int tpu_socket_candidates(const char *explicit_path, struct tpu_socket_list *ret);

/* Parses a size with optional K/M/G/T suffix (powers of 1024). Return: 0 or -EINVAL/-ERANGE. */
int tpu_parse_size(const char *s, uint64_t *ret);

/* Errno name and text helper for messages; thread safe. */
const char *tpu_strerror(int err, char *buf, size_t len);

/* Formats the reason for a failure into @why (if @why and @why_len). Return: @err. */
int tpu_why(int err, char *why, size_t why_len, const char *fmt, ...) _printf_(4, 5);

/*
 * tpu_strv_dup() - a copy of the @n strings @src (each of at most @max_len bytes, without its
 * NUL), for lists a peer or client sent (names, identities): at most @max_n of them.
 * @ret: an owned array of @n strings (NULL when @n is 0), free with tpu_strv_free(@ret, @n);
 * written only on success.
 * Return: 0; -E2BIG when @n exceeds @max_n; -ENAMETOOLONG when a string exceeds @max_len;
 * -EINVAL when one is NULL; -ENOMEM. On failure nothing is left allocated.
 */
int tpu_strv_dup(char *const *src, size_t n, size_t max_n, size_t max_len, char ***ret);

/* Frees the @n strings of @v and @v itself (NULL entries and a NULL @v are fine). */
void tpu_strv_free(char **v, size_t n);

#define TPU_TEXT_CONTROLS 0x1u /* tpu_text_clean(): also every control a terminal acts on */

/*
 * tpu_text_clean() - make @s, text that may hold a name another process chose, safe to print,
 * in place (it never grows): every byte that is not part of well-formed UTF-8 becomes '?'; with
 * TPU_TEXT_CONTROLS so does each control character a terminal, the journal or a reader acts on:
 * C0 (newline included), DEL, C1 (U+0080..U+009F: U+009B is CSI to some terminals) and the
 * characters that reorder or break a line (U+061C, U+200E, U+200F, U+2028..U+202E,
 * U+2066..U+2069).
 */
void tpu_text_clean(char *s, unsigned flags);

/* tpu_text_control_at() - the length of the control character TPU_TEXT_CONTROLS removes that
 * starts at @s (well-formed UTF-8), with its code point in *@ret_cp; 0 when @s starts none. */
size_t tpu_text_control_at(const char *s, uint32_t *ret_cp);

/*
 * A set of disjoint byte ranges [lo, hi), kept sorted and merged where they touch: what a receive
 * has been sent so far, when senders may deliver pieces in any order and must never deliver one
 * byte twice. Zero-initialised is empty; free with tpu_ranges_done().
 */
struct tpu_range {
	uint64_t lo, hi;
};

struct tpu_ranges {
	struct tpu_range *r;
	size_t n, cap;
};

/*
 * tpu_ranges_add() - add [@lo, @hi) (@lo < @hi) to @rs, which then holds at most @max separate
 * ranges.
 * Return: 0; -EEXIST when it overlaps a byte already in @rs; -E2BIG when @rs would hold more than
 * @max ranges; -EINVAL for an empty range; -ENOMEM. @rs is unchanged on failure.
 */
int tpu_ranges_add(struct tpu_ranges *rs, uint64_t lo, uint64_t hi, size_t max);

/* True when @rs is exactly [0, @end): one range, or none for @end 0. */
bool tpu_ranges_is_prefix(const struct tpu_ranges *rs, uint64_t end);

/* Frees @rs's memory; it is empty after. */
void tpu_ranges_done(struct tpu_ranges *rs);

#endif
