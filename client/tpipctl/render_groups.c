/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl groups: collective groups as a line per group (name, uid, state, plan, arena, the
 * first failure) followed by its members' table (rank, pid, session, state, collectives, bytes,
 * seconds busy and waiting, and for a host's leader the bytes to and from the other hosts'
 * leaders and the seconds that took: torch-ipc's netStats per member), or with --json one array
 * "groups" of objects with a "members" array. Members on other hosts are remote principals:
 * the identity their daemon authenticated with, its host (name, number in the group, address:
 * hosts may state the same name), and the uid it claims, shown as a
 * claim and never as a uid of this host (nor is a coordinated group's uid where only peers
 * claim it). Other requests' renderers are render.c's.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>

#include "ctl.h"

static const char *s_or(const char *s)
{
	return s && *s ? s : "-";
}

static const char *remote_name(Tpw__V1__RemoteAccess a)
{
	switch (a) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER: return "any-peer";
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS: return "peers";
	default: return "none";
	}
}

static struct json_object *member_json(const Tpw__V1__CtlGroupMember *m)
{
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_u64(o, "rank", m->rank);
	ctl_json_u64(o, "pid", m->pid);
	ctl_json_bool(o, "remote", m->remote);
	if (m->remote) { /* a remote principal: no session, no uid of this host */
		json_object_object_add(o, "session", NULL);
		ctl_json_str(o, "peer", m->peer);
		ctl_json_str(o, "host", m->host);
		ctl_json_u64(o, "host_index", m->host_index);
		ctl_json_str(o, "host_addr", m->host_addr);
		ctl_json_u64(o, "claimed_uid", m->claimed_uid);
	} else {
		ctl_json_u64(o, "session", m->session_id);
	}
	ctl_json_str(o, "state", m->state);
	ctl_json_u64(o, "calls", m->calls);
	ctl_json_u64(o, "bytes", m->bytes);
	ctl_json_u64(o, "busy_us", m->busy_us);
	ctl_json_u64(o, "wait_us", m->wait_us);
	ctl_json_u64(o, "xbytes_out", m->xbytes_out);
	ctl_json_u64(o, "xbytes_in", m->xbytes_in);
	ctl_json_u64(o, "xbusy_us", m->xbusy_us);
	return o;
}

static struct json_object *group_json(const Tpw__V1__CtlGroup *g)
{
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();

	if (!o || !arr) {
		json_object_put(o);
		json_object_put(arr);
		return NULL;
	}
	ctl_json_u64(o, "id", g->id);
	ctl_json_str(o, "name", g->name);
	if (g->uid_claimed) { /* only what peer daemons claim: never a user of this host */
		json_object_object_add(o, "uid", NULL);
		ctl_json_u64(o, "claimed_uid", g->uid);
	} else {
		ctl_json_u64(o, "uid", g->uid);
	}
	ctl_json_bool(o, "coordinated", g->coordinated);
	ctl_json_str(o, "remote", remote_name(g->remote));
	{
		struct json_object *peers = json_object_new_array();

		for (size_t i = 0; peers && i < g->n_remote_peers; i++)
			json_object_array_add(peers, ctl_json_new_str(g->remote_peers[i]));
		json_object_object_add(o, "remote_peers", peers);
	}
	ctl_json_u64(o, "size", g->size);
	ctl_json_u64(o, "joined", g->joined);
	ctl_json_str(o, "state", g->state);
	ctl_json_str(o, "plan", g->plan);
	ctl_json_u64(o, "hosts", g->hosts);
	ctl_json_u64(o, "arena_bytes", g->arena_bytes);
	ctl_json_u64(o, "chunk_bytes", g->chunk_bytes);
	ctl_json_str(o, "failure", g->failure);
	ctl_json_u64(o, "age_ms", g->age_ms);
	for (size_t i = 0; i < g->n_members; i++)
		json_object_array_add(arr, member_json(g->members[i]));
	json_object_object_add(o, "members", arr);
	return o;
}

static const struct ctl_col member_cols[] = {
	{ "RANK", true },  { "PID", true },   { "SESSION", true }, { "STATE", false },
	{ "CALLS", true }, { "BYTES", true }, { "BUSY_S", true },  { "WAIT_S", true },
	{ "X_OUT", true }, { "X_IN", true },  { "X_S", true },	   { "PRINCIPAL", false },
};

/* "remote access: peers psk, cert:gn02" into @b. */
static const char *remote_text(const Tpw__V1__CtlGroup *g, char *b, size_t len)
{
	size_t k = (size_t)snprintf(b, len, "%s", remote_name(g->remote));

	for (size_t i = 0; i < g->n_remote_peers && k < len; i++)
		k += (size_t)snprintf(b + k, len - k, "%s%s", i ? ", " : " ", g->remote_peers[i]);
	return b;
}

/* One member's row. A member of another host, or one listed by the coordinator's side, has no
 * session here and no counters in an arena of this host: "-". */
static void member_row(struct ctl_table *t, const Tpw__V1__CtlGroup *g,
		       const Tpw__V1__CtlGroupMember *m)
{
	bool none = m->remote || g->coordinated;
	char mb[32];

	ctl_table_cellf(t, "%" PRIu32, m->rank);
	ctl_table_cellf(t, "%" PRIu32, m->pid);
	if (none) {
		ctl_table_cellf(t, "-");
		ctl_table_cellf(t, "%s", s_or(m->state));
		for (int i = 0; i < 7; i++)
			ctl_table_cellf(t, "-");
	} else {
		ctl_table_cellf(t, "%" PRIu64, m->session_id);
		ctl_table_cellf(t, "%s", s_or(m->state));
		ctl_table_cellf(t, "%" PRIu64, m->calls);
		ctl_table_cellf(t, "%s", ctl_fmt_bytes(m->bytes, mb, sizeof(mb)));
		ctl_table_cellf(t, "%.3f", (double)m->busy_us / 1e6);
		ctl_table_cellf(t, "%.3f", (double)m->wait_us / 1e6);
		ctl_table_cellf(t, "%s", ctl_fmt_bytes(m->xbytes_out, mb, sizeof(mb)));
		ctl_table_cellf(t, "%s", ctl_fmt_bytes(m->xbytes_in, mb, sizeof(mb)));
		ctl_table_cellf(t, "%.3f", (double)m->xbusy_us / 1e6);
	}
	/* names from other hosts: cleaned by the table; two hosts may state one name and one
	 * identity (a pre-shared key): their number in the group and address tell them apart */
	if (m->remote && m->host_addr && *m->host_addr)
		ctl_table_cellf(t, "peer %s on %s (host %" PRIu32 " at %s), uid %" PRIu32 " claimed",
				s_or(m->peer), s_or(m->host), m->host_index, m->host_addr,
				m->claimed_uid);
	else if (m->remote)
		ctl_table_cellf(t, "peer %s on %s (host %" PRIu32 "), uid %" PRIu32 " claimed",
				s_or(m->peer), s_or(m->host), m->host_index, m->claimed_uid);
	else
		ctl_table_cellf(t, "local");
}

static int group_text(const Tpw__V1__CtlGroup *g, FILE *out)
{
	struct ctl_table t;
	char b[32], where[96];
	int r;

	if (g->coordinated)
		snprintf(where, sizeof(where), "coordinated here");
	else
		snprintf(where, sizeof(where), "%" PRIu32 " host(s), arena %s", g->hosts,
			 ctl_fmt_bytes(g->arena_bytes, b, sizeof(b)));
	/* the name is the group's user's choice, the plan names other hosts: cleaned */
	r = ctl_print_clean(out, "group %" PRIu64 " '%s' uid %" PRIu32 "%s: %" PRIu32 " of %"
			    PRIu32 " members, %s, %s%s%s", g->id, s_or(g->name), g->uid,
			    g->uid_claimed ? " (claimed by peer daemons)" : "", g->joined, g->size,
			    s_or(g->state), where, g->failure && *g->failure ? ", failed: " : "",
			    g->failure && *g->failure ? g->failure : "");
	fputs("\n", out);
	if (r == 0)
		r = ctl_print_clean(out, "  plan: %s", s_or(g->plan));
	fputs("\n", out);
	if (r == 0 && (g->coordinated || g->hosts > 1)) {
		char rb[2048];

		r = ctl_print_clean(out, "  remote access: %s", remote_text(g, rb, sizeof(rb)));
		fputs("\n", out);
	}
	if (r < 0)
		return r;
	ctl_table_init(&t, member_cols, TPU_ARRAY_SIZE(member_cols));
	for (size_t i = 0; i < g->n_members; i++)
		member_row(&t, g, g->members[i]);
	r = ctl_table_print(&t, out);
	ctl_table_done(&t);
	return r;
}

int ctl_render_groups(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	int ret = 0;

	if (v->json) {
		struct json_object *arr = json_object_new_array();

		if (!arr)
			return -ENOMEM;
		for (size_t i = 0; i < r->n_groups; i++)
			json_object_array_add(arr, group_json(r->groups[i]));
		return ctl_json_emit_list("groups", arr, out);
	}
	if (r->n_groups == 0)
		fprintf(out, "no groups\n");
	for (size_t i = 0; i < r->n_groups && ret == 0; i++) {
		if (i)
			fputc('\n', out);
		ret = group_text(r->groups[i], out);
	}
	return ret;
}
