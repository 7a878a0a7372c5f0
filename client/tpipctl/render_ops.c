/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Rendering of the operational CtlReply kinds for tpipctl: backends (channels, their
 * capabilities and probe results), stats (per-channel counters and copy-latency histograms)
 * and the confirmations of the admin requests close-session and drain. Tables go through
 * table.c, JSON through json-c and the helpers in render.c.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <string.h>
#include "ctl.h"

#define CAPS_TEXT_MAX 160

static const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

/* ---- backends ----------------------------------------------------------------------------- */

static struct json_object *backend_json(const void *item)
{
	const Tpw__V1__CtlBackend *b = item;
	struct json_object *o = json_object_new_object(), *caps = json_object_new_array();

	if (!o || !caps) {
		json_object_put(o);
		json_object_put(caps);
		return NULL;
	}
	ctl_json_str(o, "name", b->name);
	ctl_json_str(o, "kind", b->kind);
	ctl_json_u64(o, "priority", b->priority);
	ctl_json_bool(o, "viable", b->viable);
	ctl_json_str(o, "why", b->why);
	for (size_t i = 0; i < b->n_caps; i++)
		json_object_array_add(caps, ctl_json_new_str(b->caps[i]));
	json_object_object_add(o, "caps", caps);
	return o;
}

static const struct ctl_col backend_cols[] = {
	{ "PRIO", true },  { "NAME", false }, { "KIND", false },
	{ "VIABLE", false }, { "CAPS", false }, { "WHY", false },
};

static const char *caps_text(const Tpw__V1__CtlBackend *b, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < b->n_caps && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%s", i ? "," : "",
				 str_or_empty(b->caps[i]));
		if (n < 0)
			break;
		used += (size_t)n;
	}
	return buf;
}

static void backend_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlBackend *b = item;
	char caps[CAPS_TEXT_MAX];

	ctl_table_cellf(t, "%" PRIu32, b->priority);
	ctl_table_cellf(t, "%s", str_or_empty(b->name));
	ctl_table_cellf(t, "%s", str_or_empty(b->kind));
	ctl_table_cellf(t, "%s", b->viable ? "yes" : "no");
	ctl_table_cellf(t, "%s", caps_text(b, caps, sizeof(caps)));
	ctl_table_cellf(t, "%s", str_or_empty(b->why));
}

int ctl_render_backends(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "backends",
		.items = (void *const *)r->backends,
		.n = r->n_backends,
		.json = backend_json,
		.row = backend_row,
		.cols = backend_cols,
		.n_cols = TPU_ARRAY_SIZE(backend_cols),
	};

	return ctl_render_list(&l, v, out);
}

/* ---- stats -------------------------------------------------------------------------------- */

/*
 * Upper bound, in microseconds, of the histogram bucket that holds the @pct-th percentile of
 * copies (bucket i counts copies of [2^i, 2^(i+1)) us). 0 when nothing was recorded.
 */
static uint64_t hist_percentile_us(const uint64_t *h, size_t n, unsigned pct)
{
	uint64_t total = 0, seen = 0, want;

	for (size_t i = 0; i < n; i++)
		total += h[i];
	if (!total)
		return 0;
	want = total / 100 * pct + (total % 100 * pct + 99) / 100;
	for (size_t i = 0; i < n && i < 62; i++) {
		seen += h[i];
		if (seen >= want)
			return 1ull << (i + 1);
	}
	return 1ull << TPU_MIN(n, (size_t)62);
}

static const char *fmt_us_bound(uint64_t us, char *buf, size_t len)
{
	if (!us)
		snprintf(buf, len, "-");
	else if (us < 1000)
		snprintf(buf, len, "<%" PRIu64 " us", us);
	else if (us < 1000000)
		snprintf(buf, len, "<%.1f ms", (double)us / 1e3);
	else
		snprintf(buf, len, "<%.1f s", (double)us / 1e6);
	return buf;
}

static struct json_object *chstats_json(const Tpw__V1__CtlChannelStats *c)
{
	struct json_object *o = json_object_new_object(), *h = json_object_new_array();

	if (!o || !h) {
		json_object_put(o);
		json_object_put(h);
		return NULL;
	}
	ctl_json_str(o, "name", c->name);
	ctl_json_u64(o, "transfers", c->transfers);
	ctl_json_u64(o, "bytes", c->bytes);
	ctl_json_u64(o, "errors", c->errors);
	for (size_t i = 0; i < c->n_latency_us_log2; i++)
		json_object_array_add(h, json_object_new_uint64(c->latency_us_log2[i]));
	json_object_object_add(o, "latency_us_log2", h);
	return o;
}

static int stats_json(const Tpw__V1__CtlReply *r, FILE *out)
{
	static const Tpw__V1__CtlStatus empty = TPW__V1__CTL_STATUS__INIT;
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();

	if (!o || !arr) {
		json_object_put(o);
		json_object_put(arr);
		return -ENOMEM;
	}
	json_object_object_add(o, "status",
			       ctl_json_status(r->status_info ? r->status_info : &empty));
	for (size_t i = 0; i < r->n_channel_stats; i++)
		json_object_array_add(arr, chstats_json(r->channel_stats[i]));
	json_object_object_add(o, "channels", arr);
	return ctl_json_emit(o, out);
}

static const struct ctl_col stats_cols[] = {
	{ "CHANNEL", false }, { "TRANSFERS", true }, { "BYTES", true }, { "ERRORS", true },
	{ "P50", true },      { "P99", true },	     { "MAX", true },
};

static void stats_row(struct ctl_table *t, const Tpw__V1__CtlChannelStats *c)
{
	const uint64_t *h = c->latency_us_log2;
	size_t n = c->n_latency_us_log2;
	char b[32], p50[24], p99[24], pmax[24];

	ctl_table_cellf(t, "%s", str_or_empty(c->name));
	ctl_table_cellf(t, "%" PRIu64, c->transfers);
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(c->bytes, b, sizeof(b)));
	ctl_table_cellf(t, "%" PRIu64, c->errors);
	ctl_table_cellf(t, "%s", fmt_us_bound(hist_percentile_us(h, n, 50), p50, sizeof(p50)));
	ctl_table_cellf(t, "%s", fmt_us_bound(hist_percentile_us(h, n, 99), p99, sizeof(p99)));
	ctl_table_cellf(t, "%s", fmt_us_bound(hist_percentile_us(h, n, 100), pmax, sizeof(pmax)));
}

static void stats_summary(const Tpw__V1__CtlStatus *s, FILE *out)
{
	char up[32], moved[32];

	fprintf(out, "uptime %s, %" PRIu64 " messages and %s moved\n",
		ctl_fmt_duration(s->uptime_ms, up, sizeof(up)), s->messages_moved,
		ctl_fmt_bytes(s->bytes_moved, moved, sizeof(moved)));
}

int ctl_render_stats(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	struct ctl_table t;
	int ret;

	if (v->json)
		return stats_json(r, out);
	if (r->status_info)
		stats_summary(r->status_info, out);
	ctl_table_init(&t, stats_cols, TPU_ARRAY_SIZE(stats_cols));
	for (size_t i = 0; i < r->n_channel_stats; i++)
		stats_row(&t, r->channel_stats[i]);
	ret = ctl_table_print(&t, out);
	ctl_table_done(&t);
	if (ret == 0)
		fprintf(out, "(copy latency: upper bound of the log2 histogram bucket)\n");
	return ret;
}

/* ---- admin confirmations ------------------------------------------------------------------ */

int ctl_render_close_session(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	struct json_object *o;

	if (!v->json) {
		fprintf(out, "session %" PRIu64 " closed\n", v->target_id);
		return 0;
	}
	o = json_object_new_object();
	if (o)
		ctl_json_u64(o, "closed_session", v->target_id);
	return ctl_json_emit(o, out);
}

int ctl_render_drain(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	struct json_object *o;

	if (!v->json) {
		fprintf(out, "tpipd is draining: it accepts no new clients, lets copies in flight "
			     "finish, then exits\n");
		return 0;
	}
	o = json_object_new_object();
	if (o)
		ctl_json_bool(o, "draining", true);
	return ctl_json_emit(o, out);
}
