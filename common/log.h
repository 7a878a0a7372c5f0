/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Daemon-side logging: one line per event, written to stderr with a "<N>" syslog priority
 * prefix that the journal understands. Control characters and bytes that are not UTF-8 in a
 * formatted message (a client's name with a newline or an escape in it) are written as '?'
 * (tpu_text_clean()), so a message stays one line of text.
 * The client library never uses this (it reports errors through return codes and an opt-in
 * handler).
 */
#ifndef TPU_LOG_H
#define TPU_LOG_H

#include <stdarg.h>
#include "tpu.h"

enum tpu_log_level {
	TPU_LOG_ERR = 3,
	TPU_LOG_WARNING = 4,
	TPU_LOG_NOTICE = 5,
	TPU_LOG_INFO = 6,
	TPU_LOG_DEBUG = 7,
};

/* Messages above @level are dropped. Default: TPU_LOG_INFO. */
void tpu_log_set_level(enum tpu_log_level level);
enum tpu_log_level tpu_log_get_level(void);
/* Parses "err", "warning", "notice", "info", "debug". Return: 0 or -EINVAL. */
int tpu_log_parse_level(const char *s, enum tpu_log_level *ret);

void tpu_log(enum tpu_log_level level, const char *fmt, ...) _printf_(2, 3);
void tpu_logv(enum tpu_log_level level, const char *fmt, va_list ap) _printf_(2, 0);

/*
 * tpu_log_kv() - log with structured fields.
 * @fields: NULL-terminated "KEY=value" strings (borrowed), e.g. "TPIPD_SESSION=12"; the stderr
 * sink drops them, a journal sink stores them as fields of the entry.
 */
void tpu_log_kv(enum tpu_log_level level, const char *const *fields, const char *fmt, ...)
	_printf_(3, 4);
void tpu_logv_kv(enum tpu_log_level level, const char *const *fields, const char *fmt,
		 va_list ap) _printf_(3, 0);

/* Where lines go: @level, NULL-terminated @fields, the formatted @msg. */
typedef void (*tpu_log_sink_fn)(enum tpu_log_level level, const char *const *fields,
				const char *msg);
/* Replaces the stderr sink (NULL restores it). */
void tpu_log_set_sink(tpu_log_sink_fn fn);

/*
 * tpu_log_set_timestamps() - whether lines on stderr carry the local time after their "<N>"
 * priority prefix: "<6>2026-11-26T12:11:31.123+0000 text". The daemon turns it on when stderr is
 * not the journal (which stamps lines itself). Default: off.
 */
void tpu_log_set_timestamps(bool on);

#define tpu_log_err(...) tpu_log(TPU_LOG_ERR, __VA_ARGS__)
#define tpu_log_warn(...) tpu_log(TPU_LOG_WARNING, __VA_ARGS__)
#define tpu_log_notice(...) tpu_log(TPU_LOG_NOTICE, __VA_ARGS__)
#define tpu_log_info(...) tpu_log(TPU_LOG_INFO, __VA_ARGS__)
#define tpu_log_debug(...) tpu_log(TPU_LOG_DEBUG, __VA_ARGS__)

#endif
