/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl channels: the daemon's named channels as a table (name, owner uid, access, state,
 * items and bytes held, capacity, handles, readers waiting, items written and read; who on other
 * hosts may open it and their handles in JSON), or with --json one array "channels". Other
 * requests' renderers are render.c's and render_groups.c's.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>

#include "ctl.h"
#include "tpu.h"

static const char *chan_access(const Tpw__V1__CtlChannel *c)
{
	switch (c->access) {
	case TPW__V1__ACCESS__ACCESS_GROUP: return "group";
	case TPW__V1__ACCESS__ACCESS_ANYONE: return "anyone";
	default: return "owner";
	}
}

/* Who on other hosts may open the channel (issue 25 part xhost). */
static const char *chan_remote(const Tpw__V1__CtlChannel *c)
{
	switch (c->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER: return "any-peer";
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS: return "peers";
	default: return "none";
	}
}

static struct json_object *chan_json(const void *item)
{
	const Tpw__V1__CtlChannel *c = item;
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_str(o, "name", c->name);
	ctl_json_u64(o, "uid", c->uid);
	ctl_json_str(o, "access", chan_access(c));
	ctl_json_u64(o, "gid", c->gid);
	ctl_json_str(o, "state", c->state);
	ctl_json_u64(o, "items", c->items);
	ctl_json_u64(o, "bytes", c->bytes);
	ctl_json_u64(o, "capacity_items", c->capacity_items);
	ctl_json_u64(o, "capacity_bytes", c->capacity_bytes);
	ctl_json_u64(o, "handles", c->handles);
	ctl_json_u64(o, "readers_waiting", c->readers_waiting);
	ctl_json_u64(o, "writers_waiting", c->writers_waiting);
	json_object_object_add(o, "persistent", json_object_new_boolean(c->persistent));
	ctl_json_u64(o, "items_written", c->items_written);
	ctl_json_u64(o, "items_read", c->items_read);
	ctl_json_u64(o, "items_mapped", c->items_mapped);
	ctl_json_u64(o, "maps_held", c->maps_held);
	ctl_json_u64(o, "maps_retired", c->maps_retired);
	ctl_json_u64(o, "items_handed_off", c->items_handed_off);
	ctl_json_u64(o, "items_handed_back", c->items_handed_back);
	ctl_json_str(o, "remote", chan_remote(c));
	ctl_json_u64(o, "remote_handles", c->remote_handles);
	ctl_json_str(o, "created_by", c->created_by);
	json_object_object_add(o, "remote_handle", json_object_new_boolean(c->remote_handle));
	return o;
}

static const struct ctl_col chan_cols[] = {
	{ "NAME", false }, { "UID", true },	 { "ACCESS", false }, { "STATE", false },
	{ "ITEMS", true }, { "BYTES", true },	 { "CAPACITY", true }, { "HANDLES", true },
	{ "WAITING", true }, { "WRITTEN", true }, { "READ", true },
};

static void chan_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlChannel *c = item;

	ctl_table_cellf(t, "%s", c->name ? c->name : "");
	ctl_table_cellf(t, "%" PRIu32, c->uid);
	ctl_table_cellf(t, "%s%s%s%s", chan_access(c), c->persistent ? ",persistent" : "",
			c->remote == TPW__V1__REMOTE_ACCESS__REMOTE_NONE ||
					c->remote == TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED
				? ""
				: ",remote:",
			c->remote == TPW__V1__REMOTE_ACCESS__REMOTE_NONE ||
					c->remote == TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED
				? ""
				: chan_remote(c));
	ctl_table_cellf(t, "%s", c->state ? c->state : "");
	ctl_table_cellf(t, "%" PRIu32, c->items);
	ctl_table_cellf(t, "%" PRIu64, c->bytes);
	ctl_table_cellf(t, "%" PRIu32, c->capacity_items);
	ctl_table_cellf(t, "%" PRIu32, c->handles);
	ctl_table_cellf(t, "%" PRIu32, c->readers_waiting);
	ctl_table_cellf(t, "%" PRIu64, c->items_written);
	ctl_table_cellf(t, "%" PRIu64, c->items_read);
}

int ctl_render_channels(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "channels",
		.items = (void *const *)r->channels,
		.n = r->n_channels,
		.json = chan_json,
		.row = chan_row,
		.cols = chan_cols,
		.n_cols = TPU_ARRAY_SIZE(chan_cols),
	};

	return ctl_render_list(&l, v, out);
}
