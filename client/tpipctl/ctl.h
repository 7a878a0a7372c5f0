/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl internals: one blocking control connection to tpipd (connect, Hello, CtlRequest with a
 * deadline) and the renderers that turn a CtlReply into human tables or JSON. tpipctl speaks the
 * wire protocol directly through proto/frame.h and does not link libtpclient; it only ever sends
 * Hello and CtlRequest (role ROLE_CONTROL).
 */
#ifndef TPIPCTL_CTL_H
#define TPIPCTL_CTL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "frame.h"
#include "tpu.h"

/* Largest socket path we keep (sockaddr_un.sun_path is 108 bytes on Linux). */
#define CTL_PATH_MAX 108
#define CTL_WHY_MAX 512

/* Why a connection step failed; decides tpipctl's exit status. */
enum ctl_fail {
	CTL_FAIL_NONE = 0,
	CTL_FAIL_REACH,	 /* could not connect, or the connection broke or timed out */
	CTL_FAIL_DAEMON, /* the daemon answered with an error or an unexpected frame */
};

struct ctl_conn {
	int fd;
	uint64_t seq;		/* last frame sequence number sent */
	uint64_t deadline_ns;	/* tpu_now_ns() value after which I/O gives up */
	char path[CTL_PATH_MAX];
	bool eof;		/* the daemon closed the connection */
	bool verbose;		/* requests ask for details (CtlRequest.verbose) */
	enum ctl_fail fail;	/* set with why[] when a call fails */
	char why[CTL_WHY_MAX];
};

/*
 * ctl_conn_open() - resolve the socket path, connect and exchange Hello / HelloReply.
 * @c: the connection to fill; close it with ctl_conn_close() whatever this returns.
 * @socket_path: --socket value or NULL (borrowed).
 * @timeout_ms: deadline for the whole exchange, counted from now.
 * Return: 0, or -errno with @c->fail and @c->why describing the failure.
 */
int ctl_conn_open(struct ctl_conn *c, const char *socket_path, int timeout_ms);

/*
 * ctl_conn_request() - send CtlRequest{@what, @target_id} and wait for the matching CtlReply.
 * @target_id: the session to act on for CTL_CLOSE_SESSION, else 0.
 * @ret: returns owned message whose body is a CtlReply with STATUS_OK, free with
 * tpw_daemon_msg_free(); written only on success.
 * Return: 0, or -errno with @c->fail and @c->why set.
 */
int ctl_conn_request(struct ctl_conn *c, Tpw__V1__CtlWhat what, uint64_t target_id,
		     Tpw__V1__DaemonMsg **ret);

/* Starts a new deadline of @timeout_ms from now for the next request (watch reuses @c). */
void ctl_conn_set_timeout(struct ctl_conn *c, int timeout_ms);

/* Closes the socket; safe on a connection that never opened. */
void ctl_conn_close(struct ctl_conn *c);

/* How to print a reply: the command's argument travels along for confirmations. */
struct ctl_view {
	bool json;	    /* JSON instead of a table */
	bool verbose;	    /* pipes: each pipe's channels and why they were chosen */
	uint64_t target_id; /* close-session: the session asked for */
};

/*
 * ctl_render_status() / _sessions() / _pipes() / _listeners() / _peers() / _backends() /
 * _stats() / _close_session() / _drain() - print one reply to @out, as a human table or, with
 * @v->json, as pretty-printed JSON built with json-c. Borrows @r, @v and @out.
 * Return: 0, -ENOMEM.
 */
int ctl_render_status(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_sessions(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_pipes(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_listeners(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_peers(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
/* render_chan.c */
int ctl_render_channels(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
/* render_wq.c */
int ctl_render_queues(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);

/* render_groups.c */
int ctl_render_groups(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_backends(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_stats(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_close_session(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);
int ctl_render_drain(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);

/*
 * ctl_render_watch() - print one watch snapshot: the status reply @st and the pipes reply @pp,
 * as the status table, a blank line and the pipes table, or with @v->json as one object
 * {"status": {...}, "pipes": [...]}. Borrows @st, @pp, @v and @out.
 * Return: 0, -ENOMEM.
 */
int ctl_render_watch(const Tpw__V1__CtlReply *st, const Tpw__V1__CtlReply *pp,
		     const struct ctl_view *v, FILE *out);

/* ---- watch (watch.c) ---------------------------------------------------------------------- */

struct ctl_watch_opts {
	uint64_t interval_ms; /* between the starts of two refreshes */
	uint64_t count;	      /* stop after this many refreshes; 0: until a signal */
	int timeout_ms;	      /* deadline of each refresh's requests */
};

/*
 * ctl_watch() - refresh a status + pipes snapshot on @out every @w->interval_ms over the open
 * connection @c until SIGINT or SIGTERM, @w->count refreshes, or a failure. When @out is a
 * terminal each snapshot replaces the screen (ANSI home + clear); otherwise snapshots follow each
 * other separated by a blank line, without escape codes. Borrows @c, @w, @v and @out.
 * Return: 0 when stopped by a signal or the count; -errno with @c->fail and @c->why set when the
 * daemon went away or answered with an error; -errno with @c->fail == CTL_FAIL_NONE when writing
 * @out failed.
 */
int ctl_watch(struct ctl_conn *c, const struct ctl_watch_opts *w, const struct ctl_view *v,
	      FILE *out);

/* ---- JSON helpers (render.c), shared by the renderers ------------------------------------- */

struct json_object;
void ctl_json_u64(struct json_object *o, const char *key, uint64_t v);
/* Returns owned string object of @s (NULL: "") through tpu_text_clean() without
 * TPU_TEXT_CONTROLS (json-c escapes C0; JSON text must be UTF-8); NULL on ENOMEM. */
struct json_object *ctl_json_new_str(const char *s);
/* Adds member @key: ctl_json_new_str(@s). */
void ctl_json_str(struct json_object *o, const char *key, const char *s);
void ctl_json_bool(struct json_object *o, const char *key, bool v);
/* Prints @o pretty and drops the reference (@o may be NULL: -ENOMEM). Return: 0, -ENOMEM. */
int ctl_json_emit(struct json_object *o, FILE *out);
/* Wraps @arr as {"@key": @arr}, prints it and drops the reference. Return: 0, -ENOMEM. */
int ctl_json_emit_list(const char *key, struct json_object *arr, FILE *out);
/* Returns owned object with the members of @s (NULL on ENOMEM), drop with json_object_put(). */
struct json_object *ctl_json_status(const Tpw__V1__CtlStatus *s);

/* ---- aligned text tables (table.c) -------------------------------------------------------- */

struct ctl_col {
	const char *name;
	bool right; /* right-align (numbers) */
};

struct ctl_table {
	const struct ctl_col *cols;
	size_t ncols;
	char **cells; /* row-major, ncells used of cap */
	size_t ncells;
	size_t cap;
	bool oom;     /* a cell could not be stored; reported by ctl_table_print() */
	bool no_header;
};

/* Starts an empty table with the given columns (borrowed until ctl_table_done()). */
void ctl_table_init(struct ctl_table *t, const struct ctl_col *cols, size_t ncols);

/* A list of reply items rendered as a table (one row each) or as a JSON array under @key. */
struct ctl_list {
	const char *key;
	void *const *items;
	size_t n;
	struct json_object *(*json)(const void *item);
	void (*row)(struct ctl_table *t, const void *item);
	const struct ctl_col *cols;
	size_t n_cols;
};

/* Renders @l per @v to @out. Return: 0 or -errno. */
int ctl_render_list(const struct ctl_list *l, const struct ctl_view *v, FILE *out);

/* Prints @fmt to @out with tpu_text_clean(.., TPU_TEXT_CONTROLS) applied to the whole result:
 * use it for a line holding names, without its newline. Return: 0, -ENOMEM or -EIO. */
int ctl_print_clean(FILE *out, const char *fmt, ...) _printf_(2, 3);

/*
 * ctl_table_cellf() - append the next cell, filling rows left to right. The text goes through
 * tpu_text_clean() with TPU_TEXT_CONTROLS, so names sent by other processes cannot drive the
 * terminal; an empty cell prints as "-".
 */
void ctl_table_cellf(struct ctl_table *t, const char *fmt, ...) _printf_(2, 3);

/* Prints header and rows with aligned columns. Return: 0, -ENOMEM if a cell was lost. */
int ctl_table_print(const struct ctl_table *t, FILE *out);

/* Frees every cell. */
void ctl_table_done(struct ctl_table *t);

/* Formats @n bytes as "512 B", "1.5 KiB", "8.0 MiB" into @buf; returns @buf. */
const char *ctl_fmt_bytes(uint64_t n, char *buf, size_t len);

/* Formats @ms as "3d 04h 05m 06s" (leading zero units dropped) into @buf; returns @buf. */
const char *ctl_fmt_duration(uint64_t ms, char *buf, size_t len);

#endif
