/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_chan: the daemon's registry of named channels (daemon/chan/). A channel is a FIFO of
 * items named within its creator's uid (SO_PEERCRED), with an access mode like a listener's.
 * This part answers ChanOp messages (open, write a batch, read with a deadline, close, release,
 * unlink), holds the items, wakes waiting readers oldest first, drops a session's handles and
 * waits when it ends, and bounds channels per uid, items and bytes per channel and bytes per
 * uid. Items travel in frames' data tails: this part does not move shared-buffer or CMA items
 * (docs/channels.md says what is not built). Work queues are not here.
 */
#ifndef TPD_CHAN_H
#define TPD_CHAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_chans;
struct tpd_chanx;
struct tpd_local;
struct tpd_peer;

/*
 * tpd_chan_new() - the part's state for @d (borrowed; must outlive it): no channel.
 * @ret: returns owned state, free with tpd_chan_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_chan_new(struct tpd_daemon *d, struct tpd_chans **ret);

/* Frees every channel, its items and @c. Accepts NULL. Call after the sessions are gone. */
void tpd_chan_free(struct tpd_chans *c);

/* Registers this part's ops on @l (borrowed), so that sessions hand channel ops and their end
 * up to it. Called once, before the first session attaches. */
void tpd_chan_serve_local(struct tpd_local *l);

/*
 * tpd_chan_ctl() - describe the channels for tpipctl channels: every one, or with @own_only
 * only those of uid @viewer.
 * @ret, @n: returns an owned array of owned messages, free with tpd_chan_ctl_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_chan_ctl(struct tpd_chans *c, bool own_only, uid_t viewer, Tpw__V1__CtlChannel ***ret,
		 size_t *n);
void tpd_chan_ctl_free(Tpw__V1__CtlChannel **v, size_t n);

/*
 * tpd_chan_peer_op() - PeerChanOp @po (validated) from the far daemon of link @pr: OPEN of an
 * existing channel whose remote access admits @pr, or an op on a handle @pr opened; answered over
 * @pr (PeerChanReply). @tail (@tail_len bytes): WRITE's items. Borrows everything for the call.
 * Reads and writes that would wait are refused with -ENOBUFS once the handles of @pr hold
 * chan-peer-ops-max of them.
 */
void tpd_chan_peer_op(struct tpd_chans *c, struct tpd_peer *pr, const Tpw__V1__PeerChanOp *po,
		      const uint8_t *tail, size_t tail_len);

/* Drops every handle link @pr opened here (the link failed), with their waits. Borrows both. */
void tpd_chan_peer_gone(struct tpd_chans *c, struct tpd_peer *pr);

/* A new handle id of @c, unique among its handles (chanx.c's handles of remote channels take
 * theirs here too). */
uint64_t tpd_chan_new_id(struct tpd_chans *c);

/* The cross-host part of @c (chanx.c). Return: borrowed, valid as long as @c. */
struct tpd_chanx *tpd_chan_x(struct tpd_chans *c);

/* Counts for metrics: named channels, unlinked ones that something still keeps, and the items
 * and item bytes both hold. Borrows @c. */
void tpd_chan_counts(const struct tpd_chans *c, uint32_t *ret_chans, uint32_t *ret_unlinked,
		     uint64_t *ret_items, uint64_t *ret_bytes);

/* Items handed off from a writer's shared buffer straight to a waiting reader, in every
 * channel since the daemon started (docs/channels.md, "Items handed off"). Borrows @c. */
uint64_t tpd_chan_handed(const struct tpd_chans *c);

#endif
