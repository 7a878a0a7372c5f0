/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl queues: the daemon's work queues as a table (name, owner uid and pid, access, state,
 * questions queued and taken, answers waiting and given, workers, requeued), or with --json one
 * array "queues". Other requests' renderers are render.c's, render_chan.c's and others'.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>

#include "ctl.h"
#include "tpu.h"

static const char *wq_access(const Tpw__V1__CtlQueue *q)
{
	switch (q->access) {
	case TPW__V1__ACCESS__ACCESS_GROUP: return "group";
	case TPW__V1__ACCESS__ACCESS_ANYONE: return "anyone";
	default: return "owner";
	}
}

/* Who on other hosts may open the queue as a worker (issue 25 part xhost). */
static const char *wq_remote(const Tpw__V1__CtlQueue *q)
{
	switch (q->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER: return "any-peer";
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS: return "peers";
	default: return "none";
	}
}

static struct json_object *wq_json(const void *item)
{
	const Tpw__V1__CtlQueue *q = item;
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	ctl_json_str(o, "name", q->name);
	ctl_json_u64(o, "uid", q->uid);
	ctl_json_u64(o, "owner_pid", q->owner_pid);
	ctl_json_str(o, "access", wq_access(q));
	ctl_json_u64(o, "gid", q->gid);
	ctl_json_str(o, "state", q->state);
	json_object_object_add(o, "at_most_once", json_object_new_boolean(q->at_most_once));
	ctl_json_u64(o, "queued", q->queued);
	ctl_json_u64(o, "taken", q->taken);
	ctl_json_u64(o, "answers", q->answers);
	ctl_json_u64(o, "answered", q->answered);
	ctl_json_u64(o, "workers", q->workers);
	ctl_json_u64(o, "bytes", q->bytes);
	ctl_json_u64(o, "answer_bytes", q->answer_bytes);
	ctl_json_u64(o, "requeued", q->requeued);
	ctl_json_str(o, "remote", wq_remote(q));
	ctl_json_u64(o, "remote_workers", q->remote_workers);
	ctl_json_str(o, "owner_host", q->owner_host);
	ctl_json_str(o, "created_by", q->created_by);
	json_object_object_add(o, "remote_handle", json_object_new_boolean(q->remote_handle));
	return o;
}

static const struct ctl_col wq_cols[] = {
	{ "NAME", false },  { "UID", true },	 { "PID", true },      { "ACCESS", false },
	{ "STATE", false }, { "QUEUED", true },	 { "TAKEN", true },    { "ANSWERS", true },
	{ "ANSWERED", true }, { "WORKERS", true }, { "REQUEUED", true },
};

static void wq_row(struct ctl_table *t, const void *item)
{
	const Tpw__V1__CtlQueue *q = item;

	ctl_table_cellf(t, "%s", q->name ? q->name : "");
	ctl_table_cellf(t, "%" PRIu32, q->uid);
	ctl_table_cellf(t, "%" PRIu32, q->owner_pid);
	ctl_table_cellf(t, "%s%s%s%s", wq_access(q), q->at_most_once ? ",at-most-once" : "",
			q->remote == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER ||
					q->remote == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS
				? ",remote:"
				: "",
			q->remote == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER ||
					q->remote == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS
				? wq_remote(q)
				: "");
	ctl_table_cellf(t, "%s", q->state ? q->state : "");
	ctl_table_cellf(t, "%" PRIu32, q->queued);
	ctl_table_cellf(t, "%" PRIu32, q->taken);
	ctl_table_cellf(t, "%" PRIu32, q->answers);
	ctl_table_cellf(t, "%" PRIu64, q->answered);
	ctl_table_cellf(t, "%" PRIu32, q->workers);
	ctl_table_cellf(t, "%" PRIu64, q->requeued);
}

int ctl_render_queues(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out)
{
	const struct ctl_list l = {
		.key = "queues",
		.items = (void *const *)r->queues,
		.n = r->n_queues,
		.json = wq_json,
		.row = wq_row,
		.cols = wq_cols,
		.n_cols = TPU_ARRAY_SIZE(wq_cols),
	};

	return ctl_render_list(&l, v, out);
}
