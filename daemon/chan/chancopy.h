/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_chan_copy: the memory side of channel items that do not ride inline (issue 25 part
 * chanfast; docs/channels.md). Resolves a client's segment (a range of one of its registered
 * shared buffers, or an address in its own process for CMA) into memory a copy can reach, with
 * references, and runs copies between such memory and the items the daemon holds on the
 * daemon's copy threads (backends/base/copier.h), completing on the loop thread. Not
 * responsible for channels' state (chan.c) nor for deciding what is copied where.
 */
#ifndef TPD_CHAN_COPY_H
#define TPD_CHAN_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "tpb.h"
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_session;

/*
 * tpd_chan_copy_resolve() - the memory @g names in the process of @s: a range of one of @s's
 * own shared buffers (checked against its registered size) or, where @s may use CMA, an
 * address in @s's pinned process. Nothing else: a segment can only name its own client's
 * memory. @g is validated (proto/validate.c).
 * @ret: filled with a reference on the buffer or the process, drop with tpd_chan_copy_put().
 * Return: 0, -ENOENT (no such buffer), -ERANGE (outside it), -EINVAL (no CMA for @s, or not a
 * shared buffer nor an address); the reason in @why.
 */
int tpd_chan_copy_resolve(struct tpd_session *s, const Tpw__V1__Segment *g, struct tpb_mem *ret,
			  char *why, size_t wl);

/* Drops the reference tpd_chan_copy_resolve() took into @m (and clears it). Accepts a zeroed
 * @m. */
void tpd_chan_copy_put(struct tpb_mem *m);

/* Runs on the loop thread when a copy ends: @status 0 or -errno, @why more about a failure
 * (borrowed for the call). */
typedef void (*tpd_chan_copy_done_fn)(void *arg, int status, const char *why);

/*
 * tpd_chan_copy_start() - copy the @n transfers @x on @d's copy threads, then call @done with
 * @arg exactly once, later, on the loop thread (also when the daemon stops first: -ECANCELED).
 * The copy takes references of its own on the buffers and processes of @x (the caller may drop
 * its own at once); the daemon memory @x names must stay until @done.
 * Ownership: borrows @x for the call; keeps @arg until @done.
 * Return: 0, -ENOMEM, -EOPNOTSUPP (no channel copies these kinds of memory) or -ENOBUFS (more
 * than two processes); no @done then.
 */
int tpd_chan_copy_start(struct tpd_daemon *d, const struct tpb_xfer *x, size_t n,
			tpd_chan_copy_done_fn done, void *arg);

#endif
