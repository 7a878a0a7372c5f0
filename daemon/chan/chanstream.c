/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel items over a peer link's data connections (chanstream.h; issue 25 part xhost). A
 * thin owner of one stripe transfer (backends/mpt/stripe.h) at a time: its segments, the
 * references on the memory they name, and the callback its end goes to. The stripe cuts the
 * bytes into chunks of its own size and sends them from (or receives them into) that memory
 * directly: nothing is buffered for the far daemon here. A chunk for a receive nobody posted is
 * drained by the stripe, so a sender starts only once told the receive's id. Not responsible
 * for what the items are (chan.c, chanx.c). Everything runs on the loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <event2/event.h>

#include "chanstream.h"
#include "core.h"
#include "peer.h"
#include "stripe.h"
#include "tpu.h"

struct tpd_chan_stream {
	struct tpu_list node; /* in streams */
	struct tpb_stripe_xfer x;
	struct tpb_stripe *st;
	struct tpd_peer *pr;
	struct tpb_stripe_seg *segs;
	size_t n;
	uint64_t bytes;
	bool recv, shortened;
	bool sending; /* counted by tpd_peer_sending() */
	tpd_chan_copy_done_fn done;
	void *arg;
	struct event *idle; /* tpd_chan_stream_deadline()'s check, or NULL */
	uint64_t seen; /* the transfer's bytes received at the last check */
	uint32_t idle_ms;
};

/* Every transfer running (one daemon per process). */
static struct tpu_list streams = TPU_LIST_INIT(streams);

static void stream_free(struct tpd_chan_stream *cs)
{
	for (size_t i = 0; i < cs->n; i++)
		tpd_chan_copy_put(&cs->segs[i].mem);
	if (cs->idle)
		event_free(cs->idle);
	if (cs->sending)
		tpd_peer_sending(cs->pr, false);
	tpu_list_remove(&cs->node);
	free(cs->segs);
	free(cs);
}

static void stream_on_done(struct tpb_stripe_xfer *x)
{
	struct tpd_chan_stream *cs = x->arg;
	int status = x->status;

	if (cs->shortened && status == -ENODATA && x->bytes == cs->bytes && !x->exact) {
		status = -EPROTO; /* the right count of bytes, not the item's first ones */
		snprintf(x->why, sizeof(x->why), "the peer's %llu bytes are not the item's first",
			 (unsigned long long)x->bytes);
	} else if (cs->shortened && status == -ENODATA && x->bytes == cs->bytes) {
		status = 0; /* the item's end, not the room's */
	}
	if (status == 0 && x->bytes != cs->bytes) {
		status = -EIO;
		snprintf(x->why, sizeof(x->why), "%llu of %llu bytes moved",
			 (unsigned long long)x->bytes, (unsigned long long)cs->bytes);
	}
	if (cs->done)
		cs->done(cs->arg, status, status < 0 ? x->why : NULL);
	stream_free(cs);
}

/* A transfer of @n pieces, taking the references of @mem. Return: owned, or NULL. */
static struct tpd_chan_stream *stream_new(struct tpd_peer *pr, const struct tpb_mem *mem,
					  const uint64_t *len, size_t n,
					  tpd_chan_copy_done_fn done, void *arg)
{
	struct tpd_chan_stream *cs = calloc(1, sizeof(*cs));

	if (cs)
		cs->segs = calloc(n ? n : 1, sizeof(*cs->segs));
	if (!cs || !cs->segs) {
		for (size_t i = 0; i < n; i++) {
			struct tpb_mem m = mem[i];

			tpd_chan_copy_put(&m);
		}
		free(cs);
		return NULL;
	}
	tpu_list_init(&cs->node);
	for (size_t i = 0; i < n; i++) {
		cs->segs[i] = (struct tpb_stripe_seg){ .mem = mem[i], .len = len[i] };
		cs->bytes += len[i];
	}
	cs->n = n;
	cs->pr = pr;
	cs->st = tpd_peer_stripe(pr);
	cs->done = done;
	cs->arg = arg;
	cs->x.segs = cs->segs;
	cs->x.n_segs = n;
	cs->x.done = stream_on_done;
	cs->x.arg = cs;
	return cs;
}

int tpd_chan_stream_send(struct tpd_peer *pr, uint64_t xfer_id, const struct tpb_mem *mem,
			 const uint64_t *len, size_t n, tpd_chan_copy_done_fn done, void *arg,
			 struct tpd_chan_stream **ret)
{
	struct tpd_chan_stream *cs = stream_new(pr, mem, len, n, done, arg);
	int r;

	if (!cs)
		return -ENOMEM;
	cs->x.xfer_id = xfer_id;
	r = cs->st ? tpb_stripe_send(cs->st, &cs->x) : -ENOTCONN;
	if (r < 0) {
		stream_free(cs);
		return r;
	}
	cs->sending = true; /* the link watches that its chunks go */
	tpd_peer_sending(pr, true);
	tpu_list_insert_tail(&streams, &cs->node);
	if (ret)
		*ret = cs;
	return 0;
}

int tpd_chan_stream_recv(struct tpd_peer *pr, const struct tpb_mem *mem, const uint64_t *len,
			 size_t n, tpd_chan_copy_done_fn done, void *arg, uint64_t *ret_xfer_id,
			 struct tpd_chan_stream **ret)
{
	struct tpd_chan_stream *cs = stream_new(pr, mem, len, n, done, arg);
	uint64_t id;
	int r;

	if (!cs)
		return -ENOMEM;
	/* An id no other receive of the link's stripe has (cross-host pipes' included). */
	id = tpd_peer_xfer_add(pr, cs);
	if (id)
		tpd_peer_xfer_drop(pr, id);
	cs->x.xfer_id = id;
	cs->recv = true;
	r = !id ? -ENOMEM : cs->st ? tpb_stripe_recv(cs->st, &cs->x) : -ENOTCONN;
	if (r < 0) {
		stream_free(cs);
		return r;
	}
	tpu_list_insert_tail(&streams, &cs->node);
	*ret_xfer_id = id;
	if (ret)
		*ret = cs;
	return 0;
}

void tpd_chan_stream_cancel(struct tpd_chan_stream *cs)
{
	if (cs->recv)
		tpb_stripe_recv_cancel(cs->st, &cs->x);
	else
		tpb_stripe_send_cancel(cs->st, &cs->x);
}

void tpd_chan_stream_shorten(struct tpd_chan_stream *cs, uint64_t bytes)
{
	cs->bytes = bytes;
	cs->shortened = true;
	/* The stripe ends a receive early only with an error: this one, told apart above. */
	tpb_stripe_recv_expect(cs->st, &cs->x, bytes, -ENODATA, "the item ends here");
}

static void stream_on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_chan_stream *cs = arg;
	uint64_t now = tpb_stripe_recv_progress(&cs->x);
	char why[120];

	(void)fd;
	(void)what;
	if (now != cs->seen) {
		cs->seen = now;
		return;
	}
	/* This transfer's own bytes: chunks of others (or of none) do not keep it alive. */
	snprintf(why, sizeof(why), "no byte of the item came for %u ms", cs->idle_ms);
	event_del(cs->idle);
	tpb_stripe_recv_stalled(cs->st, &cs->x, why);
}

int tpd_chan_stream_deadline(struct tpd_chan_stream *cs, struct event_base *base, uint32_t idle_ms)
{
	struct timeval tv = { .tv_sec = idle_ms / 1000,
			      .tv_usec = (suseconds_t)(idle_ms % 1000) * 1000 };

	cs->idle = event_new(base, -1, EV_PERSIST, stream_on_idle, cs);
	if (!cs->idle || tpd_timer_add(cs->idle, &tv) < 0) {
		if (cs->idle)
			event_free(cs->idle);
		cs->idle = NULL;
		return -ENOMEM;
	}
	cs->idle_ms = idle_ms;
	cs->seen = tpb_stripe_recv_progress(&cs->x);
	return 0;
}

void tpd_chan_stream_end(struct tpd_peer *pr, uint64_t xfer_id, uint64_t bytes, int status,
			 const char *why)
{
	struct tpd_chan_stream *cs;

	tpu_list_for_each(cs, &streams, node)
		if (cs->recv && cs->pr == pr && cs->x.xfer_id == xfer_id)
			return tpb_stripe_recv_expect(cs->st, &cs->x, bytes, status, why);
}

uint64_t tpd_chan_stream_recv_bytes(const struct tpd_peer *pr)
{
	const struct tpd_chan_stream *cs;
	uint64_t b = 0;

	tpu_list_for_each(cs, &streams, node)
		if (cs->recv && tpd_peer_same(cs->pr, pr))
			b += cs->bytes;
	return b;
}
