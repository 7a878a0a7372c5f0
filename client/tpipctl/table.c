/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Aligned text tables and human-readable number formatting for tpipctl's default output. Cells
 * are collected first, then printed with each column as wide as its widest cell. Knows nothing
 * about the wire protocol.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ctl.h"

void ctl_table_init(struct ctl_table *t, const struct ctl_col *cols, size_t ncols)
{
	*t = (struct ctl_table){ .cols = cols, .ncols = ncols };
}

int ctl_print_clean(FILE *out, const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -ENOMEM;
	tpu_text_clean(s, TPU_TEXT_CONTROLS);
	n = fputs(s, out);
	free(s);
	return n < 0 ? -EIO : 0;
}

static bool table_grow(struct ctl_table *t)
{
	size_t cap = t->cap ? t->cap * 2 : 64;
	char **cells;

	if (t->ncells < t->cap)
		return true;
	cells = realloc(t->cells, cap * sizeof(*cells));
	if (!cells)
		return false;
	t->cells = cells;
	t->cap = cap;
	return true;
}

void ctl_table_cellf(struct ctl_table *t, const char *fmt, ...)
{
	char *s = NULL;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0 || !table_grow(t)) {
		if (n >= 0)
			free(s);
		t->oom = true;
		return;
	}
	tpu_text_clean(s, TPU_TEXT_CONTROLS);
	t->cells[t->ncells++] = s;
}

static const char *cell_text(const struct ctl_table *t, size_t i)
{
	return t->cells[i][0] ? t->cells[i] : "-";
}

static void table_widths(const struct ctl_table *t, int *w)
{
	for (size_t c = 0; c < t->ncols; c++)
		w[c] = t->no_header ? 0 : (int)strlen(t->cols[c].name);
	for (size_t i = 0; i < t->ncells; i++) {
		int len = (int)strlen(cell_text(t, i));
		if (len > w[i % t->ncols])
			w[i % t->ncols] = len;
	}
}

/* Prints one row of @t->ncols strings; the last column is not padded on the right. */
static void table_row(const struct ctl_table *t, const int *w, const char *const *cells, FILE *out)
{
	for (size_t c = 0; c < t->ncols; c++) {
		bool last = c + 1 == t->ncols;
		const char *sep = last ? "\n" : "  ";

		if (t->cols[c].right)
			fprintf(out, "%*s%s", w[c], cells[c], sep);
		else if (last)
			fprintf(out, "%s%s", cells[c], sep);
		else
			fprintf(out, "%-*s%s", w[c], cells[c], sep);
	}
}

int ctl_table_print(const struct ctl_table *t, FILE *out)
{
	_cleanup_free_ int *w = calloc(t->ncols, sizeof(*w));
	_cleanup_free_ const char **row = calloc(t->ncols, sizeof(*row));

	if (!w || !row || t->oom)
		return -ENOMEM;
	table_widths(t, w);
	for (size_t c = 0; c < t->ncols; c++)
		row[c] = t->cols[c].name;
	if (!t->no_header)
		table_row(t, w, row, out);
	for (size_t i = 0; i + t->ncols <= t->ncells; i += t->ncols) {
		for (size_t c = 0; c < t->ncols; c++)
			row[c] = cell_text(t, i + c);
		table_row(t, w, row, out);
	}
	return 0;
}

void ctl_table_done(struct ctl_table *t)
{
	for (size_t i = 0; i < t->ncells; i++)
		free(t->cells[i]);
	free(t->cells);
	*t = (struct ctl_table){ 0 };
}

const char *ctl_fmt_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	size_t u = 0;

	if (n < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)n);
		return buf;
	}
	v /= 1024.0;
	while (v >= 1024.0 && u + 1 < TPU_ARRAY_SIZE(units)) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

const char *ctl_fmt_duration(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000;
	unsigned long long d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60, sec = s % 60;

	if (d)
		snprintf(buf, len, "%llud %02lluh %02llum %02llus", d, h, m, sec);
	else if (h)
		snprintf(buf, len, "%lluh %02llum %02llus", h, m, sec);
	else if (m)
		snprintf(buf, len, "%llum %02llus", m, sec);
	else
		snprintf(buf, len, "%llu.%03llus", sec, (unsigned long long)(ms % 1000));
	return buf;
}
