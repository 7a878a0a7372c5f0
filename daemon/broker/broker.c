/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The broker's own state, one per daemon: the list of pipes (and their count and next id), the
 * pipe ends owed FlowCredit at the end of the loop pass, the ends waiting for the daemon-wide
 * budget, the far daemons' connects waiting for a listener, the cross-host transfers running,
 * and the totals of messages and bytes moved. What the rest of the daemon (core/, ctl/) may know
 * of it goes through the functions here; pipes, messages and transfers themselves are the other
 * files' of broker/.
 */
#include <errno.h>
#include <stdlib.h>
#include "local.h"
#include "pipe_int.h"

/* What the local part calls up to: the client messages about pipes, ends that leave. */
static const struct tpd_local_pipe_ops local_pipe_ops = {
	.connect = tpd_pipe_connect,
	.write = tpd_pipe_write,
	.read = tpd_pipe_read,
	.cancel = tpd_cancel_handle,
	.flow_resumed = tpd_budget_resumed,
	.end_close = tpd_pipe_end_close,
	.end_detach = tpd_pipe_end_detach,
	.listener_added = tpd_xpipe_listener_added,
	.broadcast = tpd_bcast_handle,
	.ring_done = tpd_pring_on_done,
};

void tpd_broker_serve_local(struct tpd_local *l)
{
	tpd_local_set_pipe_ops(l, &local_pipe_ops);
}

int tpd_broker_new(struct tpd_broker **ret)
{
	struct tpd_broker *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->next_pipe_id = 1;
	tpu_list_init(&b->pipes);
	tpu_list_init(&b->xwaits);
	tpu_list_init(&b->flow_dirty);
	tpu_list_init(&b->budget_wait);
	tpu_list_init(&b->bcast_uids);
	*ret = b;
	return 0;
}

void tpd_broker_free(struct tpd_broker *b)
{
	free(b);
}

void tpd_broker_pipe_add(struct tpd_broker *b, struct tpd_pipe *p)
{
	tpu_list_insert_tail(&b->pipes, &p->node);
	b->n_pipes++;
}

void tpd_broker_pipe_remove(struct tpd_broker *b, struct tpd_pipe *p)
{
	tpu_list_remove(&p->node);
	b->n_pipes--;
}

unsigned tpd_broker_pipe_count(const struct tpd_broker *b)
{
	return b->n_pipes;
}

struct tpd_pipe *tpd_broker_pipe_next(const struct tpd_broker *b, const struct tpd_pipe *p)
{
	const struct tpu_list *n = p ? p->node.next : b->pipes.next;

	return n == &b->pipes ? NULL : tpu_container_of(n, struct tpd_pipe, node);
}

uint64_t tpd_broker_messages_moved(const struct tpd_broker *b)
{
	return b->messages_moved;
}

uint64_t tpd_broker_bytes_moved(const struct tpd_broker *b)
{
	return b->bytes_moved;
}

bool tpd_broker_busy(const struct tpd_broker *b)
{
	return b->xh_running != 0;
}
