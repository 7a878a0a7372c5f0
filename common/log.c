/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * stderr logger with syslog priority prefixes. Lines are written with a single write(2) so
 * that lines from worker threads do not interleave.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "log.h"

static enum tpu_log_level log_level = TPU_LOG_INFO;

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

void tpu_logv(enum tpu_log_level level, const char *fmt, va_list ap)
{
	char line[1024];
	int n, m;

	if (level > log_level)
		return;
	n = snprintf(line, sizeof(line), "<%d>", (int)level);
	m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	if (m < 0)
		return;
	n += TPU_MIN((size_t)m, sizeof(line) - n - 2);
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}

void tpu_log(enum tpu_log_level level, const char *fmt, ...)
{
	va_list ap;
	int saved = errno;

	va_start(ap, fmt);
	tpu_logv(level, fmt, ap);
	va_end(ap);
	errno = saved;
}
