/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_sessmsg: what the frames of an attached client mean: unpacking, validation, the check
 * against the session's state, and the handlers of client messages (Hello, RingSetup, listeners,
 * shared buffers; the rest is handed to pipes, ctl and devmem). The connection (reading, frame
 * boundaries, the fd queue, output, control rings) is conn.c's, the session's life session.c's.
 */
#ifndef TPD_SESSMSG_H
#define TPD_SESSMSG_H

#include <stdint.h>
#include "tpw.pb-c.h"

struct tpd_session;
struct tpw_hdr;

/* Answers CtlRequest @req on @s (borrows both). */
typedef void tpd_sessmsg_ctl_fn(struct tpd_session *s, const Tpw__V1__CtlRequest *req);

/*
 * tpd_sessmsg_set_ctl() - register who answers CtlRequest (the ctl part, above this one), before
 * the first session attaches; this part calls it only through @fn. One daemon per process.
 */
void tpd_sessmsg_set_ctl(tpd_sessmsg_ctl_fn *fn);

/*
 * tpd_sessmsg_handle() - handle one complete frame of @s: unpack and validate its message,
 * check it against @s's state, and dispatch it.
 * @h: the frame's parsed header (borrowed).
 * @body: borrowed, for the call only: the message (@h->msg_len bytes, a private copy).
 * @tail: borrowed, for the call only: the data tail (@h->data_len bytes).
 * @tail_shared: @tail lies in the client's control ring, which the client may change at any
 * time: only a Write's handler takes it there (it copies those bytes, never interprets them);
 * any other message gets a private copy first.
 * @frame_fd: the fd the frame announced (conn.c took it from the fd queue), or -EBADF; takes
 * @frame_fd (also on failure): a handler keeps it or it is closed.
 * Return: 0, or < 0 after failing @s (tpd_session_fail()).
 */
int tpd_sessmsg_handle(struct tpd_session *s, const struct tpw_hdr *h, const uint8_t *body,
		       const uint8_t *tail, bool tail_shared, int frame_fd);

#endif
