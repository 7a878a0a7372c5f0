/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * stderr logger with syslog priority prefixes. Lines are written with a single write(2) so
 * that lines from worker threads do not interleave, and a message never holds a control
 * character or a byte that is not UTF-8 (tpu_text_clean()).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "log.h"

static enum tpu_log_level log_level = TPU_LOG_INFO;
static tpu_log_sink_fn log_sink;
static bool log_timestamps;

void tpu_log_set_timestamps(bool on)
{
	if (on)
		tzset(); /* once, before threads log: localtime_r() may not */
	log_timestamps = on;
}

void tpu_log_set_sink(tpu_log_sink_fn fn)
{
	log_sink = fn;
}

void tpu_log_set_level(enum tpu_log_level level)
{
	log_level = level;
}

enum tpu_log_level tpu_log_get_level(void)
{
	return log_level;
}

int tpu_log_parse_level(const char *s, enum tpu_log_level *ret)
{
	static const struct {
		const char *name;
		enum tpu_log_level level;
	} names[] = {
		{ "err", TPU_LOG_ERR },	      { "error", TPU_LOG_ERR },	 { "warning", TPU_LOG_WARNING },
		{ "warn", TPU_LOG_WARNING },  { "notice", TPU_LOG_NOTICE }, { "info", TPU_LOG_INFO },
		{ "debug", TPU_LOG_DEBUG },
	};
	for (size_t i = 0; i < TPU_ARRAY_SIZE(names); i++) {
		if (strcasecmp(s, names[i].name) == 0) {
			*ret = names[i].level;
			return 0;
		}
	}
	return -EINVAL;
}

/* "2026-11-26T12:11:31.123+0000 " (local time) into @buf, or "" if the clock fails. */
static void timestamp(char *buf, size_t size)
{
	struct timespec ts;
	struct tm tm;
	char zone[8];
	size_t n;

	buf[0] = '\0';
	if (clock_gettime(CLOCK_REALTIME, &ts) < 0 || !localtime_r(&ts.tv_sec, &tm))
		return;
	n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
	if (n == 0 || strftime(zone, sizeof(zone), "%z", &tm) == 0)
		zone[0] = '\0';
	snprintf(buf + n, size - n, ".%03ld%s ", ts.tv_nsec / 1000000L, zone);
}

static void stderr_sink(enum tpu_log_level level, const char *msg)
{
	char line[1024], stamp[48] = "";
	int n;

	if (log_timestamps)
		timestamp(stamp, sizeof(stamp));
	n = snprintf(line, sizeof(line), "<%d>%s%s\n", (int)level, stamp, msg);

	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		/* the newline replaces the first byte cut: that of a whole UTF-8 character, so that
		 * the line stays UTF-8 */
		while (n > 1 && ((unsigned char)line[n - 1] & 0xc0) == 0x80)
			n--;
		line[n - 1] = '\n';
	}
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}

/*
 * A message is one line of text. Names that clients and peers chose reach it through "%s": a
 * newline there would start a line of the writer's own, with a "<N>" priority of its choosing,
 * an escape would drive the terminal of whoever reads the log, and a byte that is not UTF-8 (or
 * a C1 control) makes journalctl show the whole entry as blob data. Those print as '?'
 * (tpu_text_clean()); the message's own text never holds them.
 */
void tpu_logv_kv(enum tpu_log_level level, const char *const *fields, const char *fmt,
		 va_list ap)
{
	static const char *const none[] = { NULL };
	char msg[1024];
	int saved = errno;

	if (level > log_level)
		return;
	errno = saved; /* for %m */
	vsnprintf(msg, sizeof(msg), fmt, ap);
	tpu_text_clean(msg, TPU_TEXT_CONTROLS);
	if (log_sink)
		log_sink(level, fields ? fields : none, msg);
	else
		stderr_sink(level, msg);
	errno = saved;
}

void tpu_log_kv(enum tpu_log_level level, const char *const *fields, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tpu_logv_kv(level, fields, fmt, ap);
	va_end(ap);
}

void tpu_logv(enum tpu_log_level level, const char *fmt, va_list ap)
{
	tpu_logv_kv(level, NULL, fmt, ap);
}

void tpu_log(enum tpu_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tpu_logv_kv(level, NULL, fmt, ap);
	va_end(ap);
}
