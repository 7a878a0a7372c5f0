/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_chan_stream: channel items across hosts that do not ride inline (issue 25 part xhost;
 * docs/channels.md). One send or one receive of a channel's items over a peer link's data
 * connections (the link's stripe, backends/mpt/stripe.h, the one cross-host pipes use), in
 * bounded chunks straight from and into the memory named (a client's shared buffer, a client's
 * process by CMA, or an item the daemon holds); its end comes back on the loop thread. Not
 * responsible for what the bytes are (chan.c, chanx.c) nor for the link (daemon/peer/).
 * One daemon per process: the receives waiting for their sender's word are kept in one list.
 */
#ifndef TPD_CHAN_STREAM_H
#define TPD_CHAN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "chancopy.h"
#include "tpb.h"

struct event_base;
struct tpd_peer;
struct tpd_chan_stream;

/*
 * tpd_chan_stream_send() - send @n pieces (@mem[i], @len[i] bytes each), back to back in order,
 * as transfer @xfer_id over the data connections of @pr, then call @done with @arg exactly
 * once, later, on the loop thread (-ECONNRESET when the link fails first).
 * Ownership: takes the references @mem holds (tpd_chan_copy_resolve(); also on failure); the
 * daemon memory @mem names must stay until @done; keeps @arg until @done.
 * @ret: returns borrowed pointer (for tpd_chan_stream_cancel()), valid until @done; may be NULL.
 * Return: 0, -ENOMEM or -ENOTCONN (no data connection up); no @done then.
 */
int tpd_chan_stream_send(struct tpd_peer *pr, uint64_t xfer_id, const struct tpb_mem *mem,
			 const uint64_t *len, size_t n, tpd_chan_copy_done_fn done, void *arg,
			 struct tpd_chan_stream **ret);

/*
 * tpd_chan_stream_recv() - receive @n pieces into @mem (as tpd_chan_stream_send()) as a new
 * transfer of @pr, whose id *@ret_xfer_id the sender must use; @done as for a send, once every
 * byte arrived, the sender's word says it stopped early (tpd_chan_stream_end()), or the link
 * failed. Ownership: as tpd_chan_stream_send().
 * Return: 0, -ENOMEM or -ENOTCONN; no @done then.
 */
int tpd_chan_stream_recv(struct tpd_peer *pr, const struct tpb_mem *mem, const uint64_t *len,
			 size_t n, tpd_chan_copy_done_fn done, void *arg, uint64_t *ret_xfer_id,
			 struct tpd_chan_stream **ret);

/* Cancels @cs (a send stops handing out chunks, a receive ends): its @done still comes, with
 * -ECANCELED unless it ended first. */
void tpd_chan_stream_cancel(struct tpd_chan_stream *cs);

/* Receive @cs ends once its first @bytes arrived (an item shorter than the room it was
 * posted with; @bytes at most that room): @done then comes with 0. */
void tpd_chan_stream_shorten(struct tpd_chan_stream *cs, uint64_t bytes);

/*
 * tpd_chan_stream_deadline() - receive @cs ends with -ETIMEDOUT once its link has received no
 * byte at all for @idle_ms (checked every @idle_ms on @base's loop): a sender that stopped while
 * its link stays up cannot hold the receive's memory for ever. Borrows @base (it outlives @cs).
 * Return: 0 or -ENOMEM (no deadline then).
 */
int tpd_chan_stream_deadline(struct tpd_chan_stream *cs, struct event_base *base, uint32_t idle_ms);

/* The sender of @pr's receive @xfer_id stopped after @bytes with @status (@why): that receive
 * ends so, once those bytes are in; an unknown id is ignored. Borrows all. */
void tpd_chan_stream_end(struct tpd_peer *pr, uint64_t xfer_id, uint64_t bytes, int status,
			 const char *why);

/* Bytes of the receives running over the data connections of @pr's peer: every link of it
 * (tpd_peer_same()), not @pr's alone. */
uint64_t tpd_chan_stream_recv_bytes(const struct tpd_peer *pr);

#endif
