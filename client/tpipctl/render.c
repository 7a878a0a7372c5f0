/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Rendering of CtlReply messages for tpipctl: aligned human tables (through table.c) or JSON
 * built with json-c. Field names in JSON follow the wire schema (proto/tpw.proto) so scripts can
 * rely on them; human output uses readable sizes and durations. No I/O other than @out.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include "ctl.h"

static const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

static const char *role_name(Tpw__V1__Role r)
{
	switch (r) {
	case TPW__V1__ROLE__ROLE_CLIENT: return "client";
	case TPW__V1__ROLE__ROLE_CONTROL: return "control";
	default: return "unspecified";
	}
}

static const char *access_name(Tpw__V1__Access a)
{
	switch (a) {
	case TPW__V1__ACCESS__ACCESS_GROUP: return "group";
	case TPW__V1__ACCESS__ACCESS_ANYONE: return "anyone";
	default: return "owner";
	}
}

/* Who on other hosts may open pipes to a listener. */
static const char *remote_name(Tpw__V1__RemoteAccess a)
{
	switch (a) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER: return "any-peer";
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS: return "peers";
	default: return "none";
	}
}

/* ---- JSON --------------------------------------------------------------------------------- */

void ctl_json_u64(struct json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_uint64(v));
}

struct json_object *ctl_json_new_str(const char *s)
{
	char *c = strdup(str_or_empty(s));
	struct json_object *j;

	if (!c)
		return NULL;
	tpu_text_clean(c, 0);
	j = json_object_new_string(c);
	free(c);
	return j;
}

void ctl_json_str(struct json_object *o, const char *key, const char *s)
{
	json_object_object_add(o, key, ctl_json_new_str(s));
}

void ctl_json_bool(struct json_object *o, const char *key, bool v)
{
	json_object_object_add(o, key, json_object_new_boolean(v));
}

int ctl_json_emit(struct json_object *o, FILE *out)
{
	const int flags = JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
			  JSON_C_TO_STRING_NOSLASHESCAPE;
	const char *s = o ? json_object_to_json_string_ext(o, flags) : NULL;
	int r = s ? 0 : -ENOMEM;

	/* json-c escapes C0 in strings (the raw ones left are the layout's line breaks): DEL, C1
	 * (U+009B is CSI to some terminals) and the characters that reorder a line, which occur
	 * only inside strings, reach the terminal as \u escapes instead, the names staying exact. */
	while (s && *s) {
		uint32_t cp;
		size_t n = tpu_text_control_at(s, &cp);

		if (n && cp >= 0x20)
			fprintf(out, "\\u%04x", (unsigned)cp);
		else
			fputc(*s, out);
		s += n ? n : 1;
	}
	if (!r)
		fputc('\n', out);
	json_object_put(o);
	return r;
}

int ctl_json_emit_list(const char *key, struct json_object *arr, FILE *out)
{
	struct json_object *o = json_object_new_object();

	if (!o) {
		json_object_put(arr);
		return -ENOMEM;
	}
	json_object_object_add(o, key, arr);
	return ctl_json_emit(o, out);
}

/* ---- status ------------------------------------------------------------------------------- */

struct json_object *ctl_json_status(const Tpw__V1__CtlStatus *s)
{
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_str(o, "version", s->version);
	ctl_json_u64(o, "pid", s->pid);
	ctl_json_u64(o, "uptime_ms", s->uptime_ms);
	ctl_json_str(o, "socket_path", s->socket_path);
	ctl_json_u64(o, "sessions", s->sessions);
	ctl_json_u64(o, "pipes", s->pipes);
	ctl_json_u64(o, "listeners", s->listeners);
	ctl_json_u64(o, "bytes_moved", s->bytes_moved);
	ctl_json_u64(o, "messages_moved", s->messages_moved);
	ctl_json_bool(o, "cma_available", s->cma_available);
	ctl_json_str(o, "peer_listen", s->peer_listen);
	ctl_json_u64(o, "peers", s->peers);
	ctl_json_str(o, "host_id", s->host_id);
	ctl_json_str(o, "peer_auth", s->peer_auth);
	ctl_json_u64(o, "cuda_mappings", s->cuda_mappings);
	ctl_json_u64(o, "cuda_mappings_open", s->cuda_mappings_open);
	ctl_json_u64(o, "cuda_pinned_buffers", s->cuda_pinned_buffers);
	ctl_json_u64(o, "cuda_pinned_bytes", s->cuda_pinned_bytes);
	ctl_json_u64(o, "rdma_cache_regions", s->rdma_cache_regions);
	ctl_json_u64(o, "rdma_cache_bytes", s->rdma_cache_bytes);
	ctl_json_u64(o, "rdma_cache_hits", s->rdma_cache_hits);
	ctl_json_u64(o, "rdma_cache_misses", s->rdma_cache_misses);
	ctl_json_u64(o, "rdma_cache_evictions", s->rdma_cache_evictions);
	ctl_json_u64(o, "rdma_reg_dmabuf", s->rdma_reg_dmabuf);
	ctl_json_u64(o, "rdma_reg_addr", s->rdma_reg_addr);
	ctl_json_u64(o, "rdma_reg_client_dmabuf", s->rdma_reg_client_dmabuf);
	ctl_json_u64(o, "cuda_dmabufs", s->cuda_dmabufs);
	ctl_json_u64(o, "cuda_dmabufs_refused", s->cuda_dmabufs_refused);
	ctl_json_u64(o, "cuda_dmabufs_evicted", s->cuda_dmabufs_evicted);
	ctl_json_u64(o, "staging_buffers", s->staging_buffers);
	ctl_json_u64(o, "staging_bytes", s->staging_bytes);
	ctl_json_u64(o, "pipe_rings", s->pipe_rings);
	ctl_json_u64(o, "pipe_ring_bytes", s->pipe_ring_bytes);
	ctl_json_u64(o, "pipe_ring_msgs", s->pipe_ring_msgs);
	ctl_json_u64(o, "client_input_bytes", s->client_input_bytes);
	ctl_json_u64(o, "client_queued_bytes", s->client_queued_bytes);
	ctl_json_u64(o, "sessions_refused", s->sessions_refused);
	ctl_json_u64(o, "remote_refused", s->remote_refused);
	ctl_json_u64(o, "pipe_queued_messages", s->pipe_queued_messages);
	ctl_json_u64(o, "pipe_queued_bytes", s->pipe_queued_bytes);
	ctl_json_u64(o, "pipe_held_bytes", s->pipe_held_bytes);
	ctl_json_u64(o, "pipe_held_bytes_peak", s->pipe_held_bytes_peak);
	ctl_json_u64(o, "budget_waits", s->budget_waits);
	ctl_json_u64(o, "bcast_requests", s->bcast_requests);
	ctl_json_u64(o, "bcast_targets", s->bcast_targets);
	ctl_json_u64(o, "bcast_staged_bytes", s->bcast_staged_bytes);
	ctl_json_u64(o, "bcast_unstaged", s->bcast_unstaged);
	ctl_json_u64(o, "bcast_stage_held", s->bcast_stage_held);
	ctl_json_u64(o, "sessions_max", s->sessions_max);
	ctl_json_u64(o, "sessions_per_uid", s->sessions_per_uid);
	ctl_json_u64(o, "sessions_reserved", s->sessions_reserved);
	ctl_json_u64(o, "kept_fds", s->kept_fds);
	ctl_json_u64(o, "kept_fds_max", s->kept_fds_max);
	ctl_json_u64(o, "kept_fds_per_uid", s->kept_fds_per_uid);
	ctl_json_u64(o, "kept_fds_refused", s->kept_fds_refused);
	ctl_json_u64(o, "parked_fds_refused", s->parked_fds_refused);
	return o;
}

static int status_text(const Tpw__V1__CtlStatus *s, FILE *out)
{
	static const struct ctl_col cols[] = { { "FIELD", false }, { "VALUE", false } };
	struct ctl_table t;
	char b1[32], b2[32];
	int r;

	ctl_table_init(&t, cols, TPU_ARRAY_SIZE(cols));
	ctl_table_cellf(&t, "version:");
	ctl_table_cellf(&t, "%s", str_or_empty(s->version));
	ctl_table_cellf(&t, "pid:");
	ctl_table_cellf(&t, "%" PRIu32, s->pid);
	ctl_table_cellf(&t, "uptime:");
	ctl_table_cellf(&t, "%s", ctl_fmt_duration(s->uptime_ms, b1, sizeof(b1)));
	ctl_table_cellf(&t, "socket:");
	ctl_table_cellf(&t, "%s", str_or_empty(s->socket_path));
	ctl_table_cellf(&t, "sessions:");
	ctl_table_cellf(&t, "%" PRIu32, s->sessions);
	ctl_table_cellf(&t, "pipes:");
	ctl_table_cellf(&t, "%" PRIu32, s->pipes);
	ctl_table_cellf(&t, "listeners:");
	ctl_table_cellf(&t, "%" PRIu32, s->listeners);
	ctl_table_cellf(&t, "bytes moved:");
	ctl_table_cellf(&t, "%s (%" PRIu64 ")", ctl_fmt_bytes(s->bytes_moved, b2, sizeof(b2)),
			s->bytes_moved);
	ctl_table_cellf(&t, "messages moved:");
	ctl_table_cellf(&t, "%" PRIu64, s->messages_moved);
	ctl_table_cellf(&t, "cma:");
	ctl_table_cellf(&t, "%s", s->cma_available ? "available" : "not available");
	ctl_table_cellf(&t, "peer listener:");
	ctl_table_cellf(&t, "%s", s->peer_listen && *s->peer_listen ? s->peer_listen : "off");
	ctl_table_cellf(&t, "peer auth:");
	ctl_table_cellf(&t, "%s", str_or_empty(s->peer_auth));
	ctl_table_cellf(&t, "peers:");
	ctl_table_cellf(&t, "%" PRIu32, s->peers);
	ctl_table_cellf(&t, "host id:");
	ctl_table_cellf(&t, "%s", str_or_empty(s->host_id));
	ctl_table_cellf(&t, "cuda mappings:");
	ctl_table_cellf(&t, "%" PRIu32 " (%" PRIu32 " open)", s->cuda_mappings,
			s->cuda_mappings_open);
	ctl_table_cellf(&t, "cuda pinned buffers:");
	ctl_table_cellf(&t, "%" PRIu64 " (%s)", s->cuda_pinned_buffers,
			ctl_fmt_bytes(s->cuda_pinned_bytes, b1, sizeof(b1)));
	ctl_table_cellf(&t, "rdma registrations:");
	ctl_table_cellf(&t,
			"%" PRIu64 " cached (%s), %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
			" evicted",
			s->rdma_cache_regions, ctl_fmt_bytes(s->rdma_cache_bytes, b1, sizeof(b1)),
			s->rdma_cache_hits, s->rdma_cache_misses, s->rdma_cache_evictions);
	ctl_table_cellf(&t, "gpu registrations:");
	ctl_table_cellf(&t, "%" PRIu64 " by client dma-buf, %" PRIu64 " by dma-buf, %" PRIu64
			" by address", s->rdma_reg_client_dmabuf, s->rdma_reg_dmabuf,
			s->rdma_reg_addr);
	ctl_table_cellf(&t, "client dma-bufs:");
	ctl_table_cellf(&t, "%" PRIu64 " held, %" PRIu64 " refused, %" PRIu64 " evicted",
			s->cuda_dmabufs, s->cuda_dmabufs_refused, s->cuda_dmabufs_evicted);
	ctl_table_cellf(&t, "staging buffers:");
	ctl_table_cellf(&t, "%" PRIu64 " (%s) registered by clients' libraries", s->staging_buffers,
			ctl_fmt_bytes(s->staging_bytes, b1, sizeof(b1)));
	ctl_table_cellf(&t, "pipe rings:");
	ctl_table_cellf(&t, "%" PRIu64 " (%s), %" PRIu64 " messages moved through one",
			s->pipe_rings, ctl_fmt_bytes(s->pipe_ring_bytes, b1, sizeof(b1)),
			s->pipe_ring_msgs);
	ctl_table_cellf(&t, "session limits:");
	ctl_table_cellf(&t, "%" PRIu32 " (%" PRIu32 " kept for admins), %" PRIu32 " per uid, %" PRIu64
			" refused", s->sessions_max, s->sessions_reserved, s->sessions_per_uid,
			s->sessions_refused);
	ctl_table_cellf(&t, "kept client fds:");
	ctl_table_cellf(&t, "%" PRIu64 " of %" PRIu32 " (%" PRIu32 " per uid), %" PRIu64
			" refused (%" PRIu64 " parked)", s->kept_fds, s->kept_fds_max,
			s->kept_fds_per_uid, s->kept_fds_refused, s->parked_fds_refused);
	ctl_table_cellf(&t, "held for clients:");
	ctl_table_cellf(&t, "%s in partial frames, %s queued to clients",
			ctl_fmt_bytes(s->client_input_bytes, b1, sizeof(b1)),
			ctl_fmt_bytes(s->client_queued_bytes, b2, sizeof(b2)));
	ctl_table_cellf(&t, "pipe queues:");
	ctl_table_cellf(&t, "%" PRIu64 " unread messages (%s inline, %s held), %" PRIu64
			" remote messages refused", s->pipe_queued_messages,
			ctl_fmt_bytes(s->pipe_queued_bytes, b1, sizeof(b1)),
			ctl_fmt_bytes(s->pipe_held_bytes, b2, sizeof(b2)), s->remote_refused);
	ctl_table_cellf(&t, "broadcasts:");
	ctl_table_cellf(&t, "%" PRIu64 " to %" PRIu64 " pipes, %s read once (%s held now), %" PRIu64
			" over the staging limit", s->bcast_requests, s->bcast_targets,
			ctl_fmt_bytes(s->bcast_staged_bytes, b1, sizeof(b1)),
			ctl_fmt_bytes(s->bcast_stage_held, b2, sizeof(b2)), s->bcast_unstaged);
	t.no_header = true; /* key: value lines */
	r = ctl_table_print(&t, out);
	ctl_table_done(&t);
	return r;
}

int ctl_render_status(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	static const Tpw__V1__CtlStatus empty = TPW__V1__CTL_STATUS__INIT;
	const Tpw__V1__CtlStatus *s = r->status_info ? r->status_info : &empty;

	return v->json ? ctl_json_emit(ctl_json_status(s), out) : status_text(s, out);
}

int ctl_render_list(const struct ctl_list *l, const struct ctl_view *v, FILE *out)
{
	struct ctl_table t;
	int ret;

	if (v->json) {
		struct json_object *arr = json_object_new_array();
		if (!arr)
			return -ENOMEM;
		for (size_t i = 0; i < l->n; i++)
			json_object_array_add(arr, l->json(l->items[i]));
		return ctl_json_emit_list(l->key, arr, out);
	}
	ctl_table_init(&t, l->cols, l->n_cols);
	for (size_t i = 0; i < l->n; i++)
		l->row(&t, l->items[i]);
	ret = ctl_table_print(&t, out);
	ctl_table_done(&t);
	return ret;
}

/* ---- sessions ----------------------------------------------------------------------------- */

static struct json_object *session_json(const void *item)
{
	const Tpw__V1__CtlSession *s = item;
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_u64(o, "id", s->id);
	ctl_json_u64(o, "pid", s->pid);
	ctl_json_u64(o, "uid", s->uid);
	ctl_json_u64(o, "gid", s->gid);
	ctl_json_str(o, "command", s->command);
	ctl_json_str(o, "name", s->name);
	ctl_json_str(o, "role", role_name(s->role));
	ctl_json_u64(o, "pipes", s->pipes);
	ctl_json_u64(o, "listeners", s->listeners);
	ctl_json_u64(o, "buffers", s->buffers);
	ctl_json_u64(o, "buffer_bytes", s->buffer_bytes);
	ctl_json_u64(o, "staging_buffers", s->staging_buffers);
	ctl_json_u64(o, "staging_bytes", s->staging_bytes);
	ctl_json_u64(o, "bytes_in", s->bytes_in);
	ctl_json_u64(o, "bytes_out", s->bytes_out);
	ctl_json_bool(o, "cma_ok", s->cma_ok);
	ctl_json_str(o, "transport", s->transport);
	ctl_json_u64(o, "ring_bytes", s->ring_bytes);
	return o;
}

static const struct ctl_col session_cols[] = {
	{ "ID", true },        { "PID", true },     { "UID", true },        { "COMMAND", false },
	{ "NAME", false },     { "ROLE", false },   { "TRANSPORT", false }, { "PIPES", true },
	{ "LISTENERS", true }, { "BUFFERS", true }, { "BUF_BYTES", true },  { "STAGING", true },
	{ "BYTES_IN", true },  { "BYTES_OUT", true },
};

/* The TRANSPORT cell: "unix", or "ring" with its size per direction ("ring 256K"). */
static void session_transport_cell(struct ctl_table *t, const Tpw__V1__CtlSession *s)
{
	uint32_t n = s->ring_bytes;

	if (!s->transport || strcmp(s->transport, "ring") != 0 || !n)
		ctl_table_cellf(t, "%s", str_or_empty(s->transport));
	else if (n % (1u << 20) == 0)
		ctl_table_cellf(t, "ring %" PRIu32 "M", n >> 20);
	else if (n % (1u << 10) == 0)
		ctl_table_cellf(t, "ring %" PRIu32 "K", n >> 10);
	else
		ctl_table_cellf(t, "ring %" PRIu32, n);
}

static void session_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlSession *s = item;
	char b1[32], b2[32], b3[32], b4[32];

	ctl_table_cellf(t, "%" PRIu64, s->id);
	ctl_table_cellf(t, "%" PRIu32, s->pid);
	ctl_table_cellf(t, "%" PRIu32, s->uid);
	ctl_table_cellf(t, "%s", str_or_empty(s->command));
	ctl_table_cellf(t, "%s", str_or_empty(s->name));
	ctl_table_cellf(t, "%s", role_name(s->role));
	session_transport_cell(t, s);
	ctl_table_cellf(t, "%" PRIu32, s->pipes);
	ctl_table_cellf(t, "%" PRIu32, s->listeners);
	ctl_table_cellf(t, "%" PRIu32, s->buffers);
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(s->buffer_bytes, b1, sizeof(b1)));
	/* Of BUFFERS and BUF_BYTES, the library's staging buffers: "COUNT (BYTES)". */
	ctl_table_cellf(t, "%" PRIu32 " (%s)", s->staging_buffers,
			ctl_fmt_bytes(s->staging_bytes, b4, sizeof(b4)));
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(s->bytes_in, b2, sizeof(b2)));
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(s->bytes_out, b3, sizeof(b3)));
}

int ctl_render_sessions(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "sessions",
		.items = (void *const *)r->sessions,
		.n = r->n_sessions,
		.json = session_json,
		.row = session_row,
		.cols = session_cols,
		.n_cols = TPU_ARRAY_SIZE(session_cols),
	};

	return ctl_render_list(&l, v, out);
}

/* ---- pipes -------------------------------------------------------------------------------- */

static struct json_object *pipe_end_json(const Tpw__V1__CtlPipeEnd *e)
{
	struct json_object *o;

	if (!e)
		return NULL; /* JSON null: that end is gone */
	o = json_object_new_object();
	if (!o)
		return NULL;
	ctl_json_u64(o, "session_id", e->session_id);
	ctl_json_u64(o, "pid", e->pid);
	ctl_json_str(o, "name", e->name);
	ctl_json_u64(o, "uid", e->uid);
	json_object_object_add(o, "uid_claimed", json_object_new_boolean(e->uid_claimed));
	json_object_object_add(o, "hidden", json_object_new_boolean(e->hidden));
	ctl_json_u64(o, "messages_sent", e->messages_sent);
	ctl_json_u64(o, "bytes_sent", e->bytes_sent);
	ctl_json_u64(o, "queued", e->queued);
	return o;
}

/* The daemon's "basic,shm,cuda_ipc(cuda>cuda)" as an array of names, as "caps" is; NULL (JSON
 * null) if out of memory. */
static struct json_object *channels_json(const char *list)
{
	struct json_object *a = json_object_new_array();
	const char *s = list ? list : "";

	while (a && *s) {
		size_t n = strcspn(s, ",");

		if (n)
			json_object_array_add(a, json_object_new_string_len(s, (int)n));
		s += n + (s[n] == ',');
	}
	return a;
}

static struct json_object *pipe_json(const void *item)
{
	const Tpw__V1__CtlPipe *p = item;
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_u64(o, "id", p->id);
	ctl_json_str(o, "listener", p->listener);
	ctl_json_str(o, "state", p->state);
	ctl_json_str(o, "transport", p->transport);
	json_object_object_add(o, "channels", channels_json(p->channels));
	ctl_json_u64(o, "created_ms", p->created_ms);
	if (p->n_channel_reasons) { /* with --verbose */
		struct json_object *why = json_object_new_array();

		for (size_t i = 0; why && i < p->n_channel_reasons; i++)
			json_object_array_add(why, ctl_json_new_str(p->channel_reasons[i]));
		json_object_object_add(o, "channel_reasons", why);
	}
	json_object_object_add(o, "connector", pipe_end_json(p->connector));
	json_object_object_add(o, "acceptor", pipe_end_json(p->acceptor));
	return o;
}

/* "C>A" columns count what the connector sent to the acceptor; "A>C" the other way. */
static const struct ctl_col pipe_cols[] = {
	{ "ID", true },	       { "LISTENER", false }, { "STATE", false },    { "TRANSPORT", false },
	{ "CHANNELS", false }, { "CONNECTOR", false }, { "ACCEPTOR", false }, { "C>A_MSGS", true },
	{ "C>A_BYTES", true }, { "A>C_MSGS", true },  { "A>C_BYTES", true }, { "QUEUED", true },
};

static void pipe_end_cell(struct ctl_table *t, const Tpw__V1__CtlPipeEnd *e)
{
	if (e && e->hidden)
		ctl_table_cellf(t, "(another user)");
	else if (e)
		ctl_table_cellf(t, "%s[%" PRIu32 "]", str_or_empty(e->name), e->pid);
	else
		ctl_table_cellf(t, "-");
}

static void pipe_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlPipe *p = item;
	static const Tpw__V1__CtlPipeEnd none = TPW__V1__CTL_PIPE_END__INIT;
	const Tpw__V1__CtlPipeEnd *c = p->connector ? p->connector : &none;
	const Tpw__V1__CtlPipeEnd *a = p->acceptor ? p->acceptor : &none;
	char b1[32], b2[32];

	ctl_table_cellf(t, "%" PRIu64, p->id);
	ctl_table_cellf(t, "%s", str_or_empty(p->listener));
	ctl_table_cellf(t, "%s", str_or_empty(p->state));
	ctl_table_cellf(t, "%s", str_or_empty(p->transport));
	ctl_table_cellf(t, "%s", str_or_empty(p->channels));
	pipe_end_cell(t, p->connector);
	pipe_end_cell(t, p->acceptor);
	ctl_table_cellf(t, "%" PRIu64, c->messages_sent);
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(c->bytes_sent, b1, sizeof(b1)));
	ctl_table_cellf(t, "%" PRIu64, a->messages_sent);
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(a->bytes_sent, b2, sizeof(b2)));
	ctl_table_cellf(t, "%" PRIu32 "/%" PRIu32, c->queued, a->queued);
}

int ctl_render_pipes(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "pipes",
		.items = (void *const *)r->pipes,
		.n = r->n_pipes,
		.json = pipe_json,
		.row = pipe_row,
		.cols = pipe_cols,
		.n_cols = TPU_ARRAY_SIZE(pipe_cols),
	};
	int ret = ctl_render_list(&l, v, out);

	/* -v: under the table, each pipe's channels and why each was chosen. */
	for (size_t i = 0; ret >= 0 && v->verbose && !v->json && i < r->n_pipes; i++) {
		const Tpw__V1__CtlPipe *p = r->pipes[i];

		fprintf(out, "\npipe %" PRIu64 " channels:%s\n", p->id,
			p->n_channel_reasons ? "" : " none used yet");
		for (size_t k = 0; ret >= 0 && k < p->n_channel_reasons; k++) {
			ret = ctl_print_clean(out, "  %s", p->channel_reasons[k]);
			fputc('\n', out);
		}
	}
	return ret;
}

/* ---- listeners ---------------------------------------------------------------------------- */

static struct json_object *listener_json(const void *item)
{
	const Tpw__V1__CtlListener *l = item;
	struct json_object *o = json_object_new_object(), *peers;

	if (!o)
		return NULL;
	ctl_json_u64(o, "id", l->id);
	ctl_json_str(o, "name", l->name);
	ctl_json_u64(o, "session_id", l->session_id);
	ctl_json_u64(o, "pid", l->pid);
	ctl_json_u64(o, "uid", l->uid);
	ctl_json_str(o, "access", access_name(l->access));
	ctl_json_u64(o, "gid", l->gid);
	ctl_json_u64(o, "accepted", l->accepted);
	ctl_json_str(o, "remote", remote_name(l->remote));
	peers = json_object_new_array();
	for (size_t i = 0; peers && i < l->n_remote_peers; i++)
		json_object_array_add(peers, ctl_json_new_str(l->remote_peers[i]));
	json_object_object_add(o, "remote_peers", peers);
	return o;
}

static const struct ctl_col listener_cols[] = {
	{ "ID", true },	  { "NAME", false },  { "SESSION", true },
	{ "PID", true },  { "UID", true },    { "ACCESS", false },
	{ "ACCEPTED", true }, { "REMOTE", false },
};

static void listener_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlListener *l = item;
	ctl_table_cellf(t, "%" PRIu64, l->id);
	ctl_table_cellf(t, "%s", str_or_empty(l->name));
	ctl_table_cellf(t, "%" PRIu64, l->session_id);
	ctl_table_cellf(t, "%" PRIu32, l->pid);
	ctl_table_cellf(t, "%" PRIu32, l->uid);
	if (l->access == TPW__V1__ACCESS__ACCESS_GROUP)
		ctl_table_cellf(t, "group:%" PRIu32, l->gid);
	else
		ctl_table_cellf(t, "%s", access_name(l->access));
	ctl_table_cellf(t, "%" PRIu64, l->accepted);
	if (l->remote == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS)
		ctl_table_cellf(t, "peers:%zu", l->n_remote_peers);
	else
		ctl_table_cellf(t, "%s", remote_name(l->remote));
}

int ctl_render_listeners(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "listeners",
		.items = (void *const *)r->listeners,
		.n = r->n_listeners,
		.json = listener_json,
		.row = listener_row,
		.cols = listener_cols,
		.n_cols = TPU_ARRAY_SIZE(listener_cols),
	};

	return ctl_render_list(&l, v, out);
}

/* ---- peers -------------------------------------------------------------------------------- */

static struct json_object *peer_json(const void *item)
{
	const Tpw__V1__CtlPeer *p = item;
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_u64(o, "id", p->id);
	ctl_json_str(o, "address", p->address);
	ctl_json_str(o, "host", p->host);
	ctl_json_str(o, "state", p->state);
	ctl_json_bool(o, "outgoing", p->outgoing);
	ctl_json_u64(o, "data_conns", p->data_conns);
	ctl_json_u64(o, "rtt_us", p->rtt_us);
	ctl_json_u64(o, "bytes_sent", p->bytes_sent);
	ctl_json_u64(o, "bytes_received", p->bytes_received);
	ctl_json_u64(o, "pipes", p->pipes);
	ctl_json_str(o, "last_error", p->last_error);
	ctl_json_bool(o, "authenticated", p->authenticated);
	ctl_json_str(o, "identity", p->identity);
	ctl_json_str(o, "security", p->security);
	ctl_json_u64(o, "up_ms", p->up_ms);
	ctl_json_str(o, "rdma", p->rdma);
	ctl_json_u64(o, "rdma_bytes_sent", p->rdma_bytes_sent);
	ctl_json_u64(o, "rdma_bytes_received", p->rdma_bytes_received);
	ctl_json_u64(o, "rdma_reg_client_dmabuf", p->rdma_reg_client_dmabuf);
	ctl_json_u64(o, "rdma_reg_dmabuf", p->rdma_reg_dmabuf);
	ctl_json_u64(o, "rdma_reg_addr", p->rdma_reg_addr);
	return o;
}

/* DIR: "out" when this daemon dialled the link, "in" when it accepted it. */
static const struct ctl_col peer_cols[] = {
	{ "ID", true },	       { "ADDRESS", false }, { "HOST", false },	   { "STATE", false },
	{ "DIR", false },      { "CONNS", true },    { "RTT", true },	   { "BYTES_OUT", true },
	{ "BYTES_IN", true },  { "PIPES", true },    { "AUTH", false },	   { "RDMA", false },
	{ "RDMA_REG", false }, { "LAST_ERROR", false },
};

/* How the link's RDMA transfers registered CUDA memory: "-" (never), else the methods used,
 * with their counts of segments, e.g. "client-dmabuf:4,address:1". */
static const char *fmt_reg(const Tpw__V1__CtlPeer *p, char *buf, size_t len)
{
	const struct {
		const char *name;
		uint64_t n;
	} by[] = { { "client-dmabuf", p->rdma_reg_client_dmabuf },
		   { "export", p->rdma_reg_dmabuf },
		   { "address", p->rdma_reg_addr } };
	size_t k = 0;

	snprintf(buf, len, "-");
	for (size_t i = 0; i < TPU_ARRAY_SIZE(by); i++) {
		int w;

		if (!by[i].n || k >= len)
			continue;
		w = snprintf(buf + k, len - k, "%s%s:%" PRIu64, k ? "," : "", by[i].name, by[i].n);
		k += w > 0 ? (size_t)w : 0;
	}
	return buf;
}

/* The cuda_gdr state in a word: "-" (not offered by both), "ready", "off", "connecting". */
static const char *rdma_word(const char *rdma, char *buf, size_t len)
{
	size_t n = rdma ? strcspn(rdma, ":") : 0;

	snprintf(buf, len, "%.*s", (int)n, n ? rdma : "-");
	return buf;
}

/* A keepalive round trip as "-" (none yet), "850 us", "1.25 ms" or "1.50 s". */
static const char *fmt_rtt(uint64_t us, char *buf, size_t len)
{
	if (!us)
		snprintf(buf, len, "-");
	else if (us < 1000)
		snprintf(buf, len, "%" PRIu64 " us", us);
	else if (us < 1000000)
		snprintf(buf, len, "%.2f ms", (double)us / 1e3);
	else
		snprintf(buf, len, "%.2f s", (double)us / 1e6);
	return buf;
}

static void peer_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlPeer *p = item;
	char b1[32], b2[32], rtt[32], rdma[16], reg[96];

	ctl_table_cellf(t, "%" PRIu64, p->id);
	ctl_table_cellf(t, "%s", str_or_empty(p->address));
	ctl_table_cellf(t, "%s", str_or_empty(p->host));
	ctl_table_cellf(t, "%s", str_or_empty(p->state));
	ctl_table_cellf(t, "%s", p->outgoing ? "out" : "in");
	ctl_table_cellf(t, "%" PRIu32, p->data_conns);
	ctl_table_cellf(t, "%s", fmt_rtt(p->rtt_us, rtt, sizeof(rtt)));
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(p->bytes_sent, b1, sizeof(b1)));
	ctl_table_cellf(t, "%s", ctl_fmt_bytes(p->bytes_received, b2, sizeof(b2)));
	ctl_table_cellf(t, "%" PRIu32, p->pipes);
	if (p->authenticated && p->identity && *p->identity)
		ctl_table_cellf(t, "%s", p->identity);
	else
		ctl_table_cellf(t, "%s", p->security && strcmp(p->security, "insecure") == 0
						 ? "INSECURE" : "no");
	ctl_table_cellf(t, "%s", rdma_word(p->rdma, rdma, sizeof(rdma)));
	ctl_table_cellf(t, "%s", fmt_reg(p, reg, sizeof(reg)));
	ctl_table_cellf(t, "%s", str_or_empty(p->last_error));
}

int ctl_render_peers(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "peers",
		.items = (void *const *)r->peers,
		.n = r->n_peers,
		.json = peer_json,
		.row = peer_row,
		.cols = peer_cols,
		.n_cols = TPU_ARRAY_SIZE(peer_cols),
	};

	return ctl_render_list(&l, v, out);
}

/* ---- watch -------------------------------------------------------------------------------- */

static int watch_json(const Tpw__V1__CtlStatus *s, const Tpw__V1__CtlReply *pp, FILE *out)
{
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();

	if (!o || !arr) {
		json_object_put(o);
		json_object_put(arr);
		return -ENOMEM;
	}
	json_object_object_add(o, "status", ctl_json_status(s));
	for (size_t i = 0; i < pp->n_pipes; i++)
		json_object_array_add(arr, pipe_json(pp->pipes[i]));
	json_object_object_add(o, "pipes", arr);
	return ctl_json_emit(o, out);
}

int ctl_render_watch(const Tpw__V1__CtlReply *st, const Tpw__V1__CtlReply *pp,
		     const struct ctl_view *v, FILE *out)
{
	static const Tpw__V1__CtlStatus empty = TPW__V1__CTL_STATUS__INIT;
	const Tpw__V1__CtlStatus *s = st->status_info ? st->status_info : &empty;
	int r;

	if (v->json)
		return watch_json(s, pp, out);
	r = status_text(s, out);
	if (r < 0)
		return r;
	fputc('\n', out);
	return ctl_render_pipes(pp, v, out);
}
