/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_chanx: channels and work queues of other hosts (issue 25 part xhost; docs/channels.md,
 * docs/queues.md). A client's OPEN of "tpip://HOST[:PORT]/NAME" makes this daemon (the
 * forwarding one) keep a handle of its own and forward every op of that handle over the peer
 * link to HOST's daemon (the hosting one) as PeerChanOp or PeerWqOp; the answers come back as
 * PeerChanReply or PeerWqReply and go to the client as its daemon's own answers. This part also
 * takes the hosting side's messages off the link and hands them to chan.c and wq.c, and tells
 * them when a link goes. It bounds the ops it has forwarded and not seen answered, per link
 * (chan-peer-ops-max), and fails every forwarded op and remote handle of a failed link with
 * -ECONNRESET naming the host. Not responsible for channels' or queues' state (chan.c, wq.c) nor
 * for links (daemon/peer/). Everything runs on the daemon's loop thread.
 */
#ifndef TPD_CHANX_H
#define TPD_CHANX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "chancopy.h"
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_chans;
struct tpd_chanx;
struct tpd_peer;
struct tpd_session;

/*
 * tpd_chanx_new() - the part's state for @d and its channels @cs (both borrowed; they outlive
 * it), and registers its peer ops (tpd_peer_chan_set_ops()).
 * @ret: returns owned state, free with tpd_chanx_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_chanx_new(struct tpd_daemon *d, struct tpd_chans *cs, struct tpd_chanx **ret);

/* Frees @x and what it holds (accepts NULL); its sessions' ends were told first. */
void tpd_chanx_free(struct tpd_chanx *x);

/* True if @name is an address tpip://... (of a channel or queue on another host). */
bool tpd_chanx_is_address(const char *name);

/*
 * tpd_chanx_admit_link() - the remote access of a channel or work queue link @pr creates here
 * (with its identity @id): when *@remote and the *@n entries of *@peers do not admit that link,
 * they become REMOTE_PEERS over the same entries and @id, in @room (TPW_REMOTE_PEERS_MAX + 1
 * slots; *@n is at most TPW_REMOTE_PEERS_MAX, validated), so that its creator can use it.
 */
void tpd_chanx_admit_link(const struct tpd_peer *pr, const char *id,
			  Tpw__V1__RemoteAccess *remote, char ***peers, size_t *n, char **room);

/* tpd_chanx_open() - @s's ChanOp OPEN @o of address @o->name (validated): forward it to the
 * daemon of its host, dialling a link if none is up; the answer comes later. Borrows all. */
void tpd_chanx_open(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o);

/*
 * tpd_chanx_op() - @s's ChanOp @o (not OPEN nor UNLINK) with data tail @tail: if @o->chan_id is
 * one of @s's handles of a channel on another host, forward it (or answer it, once the link
 * failed). Borrows all.
 * Return: true if it was such a handle (@o is answered or forwarded), false otherwise.
 */
bool tpd_chanx_op(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o,
		  const uint8_t *tail, size_t tail_len);

/* tpd_chanx_unlink() - @s's ChanOp UNLINK @o of address @o->name (validated): forwarded as
 * tpd_chanx_open() is, to a hosting daemon of peer minor >= 6 (older: -EOPNOTSUPP). */
void tpd_chanx_unlink(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o);

/* As tpd_chanx_open() and tpd_chanx_op(), for work queues (WqOp). */
void tpd_chanx_wq_open(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__WqOp *o);
bool tpd_chanx_wq_op(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__WqOp *o,
		     const uint8_t *tail, size_t tail_len);

/* @s ends: release its handles on other hosts (told to their daemons) and forget its forwarded
 * ops. Borrows both. */
void tpd_chanx_session_end(struct tpd_chanx *x, struct tpd_session *s);

/* Hosting side: answer @r (and @tail, @n_tail items, or NULL) to the far daemon of @pr as
 * PeerChanReply or PeerWqReply. Borrows all; a failed link drops it. */
void tpd_chanx_reply(struct tpd_peer *pr, Tpw__V1__ChanReply *r, const struct iovec *tail,
		     size_t n_tail);
void tpd_chanx_wq_reply(struct tpd_peer *pr, Tpw__V1__WqReply *r, const struct iovec *tail);

/*
 * Hosting side, large items (peer minor >= 6; chanstream.h): tpd_chanx_big_copy_in() posts the
 * receive of a peer WRITE's streamed items into the daemon memory @x[i].dst (@n of them) and
 * tells the far daemon of @pr, answering its op @req_id on handle @chan_id with the transfer's
 * id, to send them (the receive fails with -ETIMEDOUT once the link brings no byte for @d's
 * peer timeout); tpd_chanx_big_copy_out() sends an item @x->src (daemon memory, or a lent
 * buffer: the stream takes references of its own) to the far
 * daemon's receive @x->dst (TPB_LOC_REMOTE, its id in @x->dst.addr). Then @done with @arg once,
 * later, on the loop thread. Ownership: borrows @x; the memory must stay until @done.
 * Return: 0, -ENOMEM or -ENOTCONN (no data connection); no @done then.
 */
/*
 * tpd_chanx_big_admit() - may peer WRITE @o of link @pr (validated) stream its items here? Its
 * streamed bytes and those already arriving over @pr within @d's chan-peer-bytes-max. Borrows
 * all. Return: 0, or -ENOBUFS with the reason in @why.
 */
int tpd_chanx_big_admit(struct tpd_daemon *d, const struct tpd_peer *pr, const Tpw__V1__ChanOp *o,
			char *why, size_t wl);
/* The same for @bytes arriving over @pr (a work queue message's, peer minor >= 11). */
int tpd_chanx_big_admit_bytes(struct tpd_daemon *d, const struct tpd_peer *pr, uint64_t bytes,
			      char *why, size_t wl);

/*
 * tpd_chanx_big_recv() - posts the receive of @n items into the daemon memory @x[i].dst from
 * the far daemon of @pr, as tpd_chanx_big_copy_in() does, without answering: *@ret_xfer_id is
 * the id its sender must be told. tpd_chanx_big_copy_in() is this plus the channel's answer.
 * Ownership and Return: as tpd_chanx_big_copy_in().
 */
int tpd_chanx_big_recv(struct tpd_daemon *d, struct tpd_peer *pr, const struct tpb_xfer *x,
		       size_t n, tpd_chan_copy_done_fn done, void *arg, uint64_t *ret_xfer_id);

int tpd_chanx_big_copy_in(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t req_id,
			  uint64_t chan_id, const struct tpb_xfer *x, size_t n,
			  tpd_chan_copy_done_fn done, void *arg);
int tpd_chanx_big_copy_out(struct tpd_peer *pr, const struct tpb_xfer *x,
			   tpd_chan_copy_done_fn done, void *arg);

/*
 * tpd_chanx_ctl_channels() - appends to @v (@n entries) one entry per handle of a channel on
 * another host that this daemon's clients hold (all, or @viewer's with @own_only), named
 * tpip://HOST:PORT/NAME (CtlChannel.remote_handle); tpd_chanx_ctl_queues() the same for queues.
 * @v, @n: an array from tpd_chan_ctl() (tpd_wq_ctl()), grown here; free it as before.
 * Return: 0 or -ENOMEM (@v, @n still valid).
 */
int tpd_chanx_ctl_channels(struct tpd_chanx *x, bool own_only, uid_t viewer,
			   Tpw__V1__CtlChannel ***v, size_t *n);
int tpd_chanx_ctl_queues(struct tpd_chanx *x, bool own_only, uid_t viewer, Tpw__V1__CtlQueue ***v,
			 size_t *n);

#endif
