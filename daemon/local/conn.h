/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_conn: the connection of one attached client (struct tpd_session): reading frames with
 * fd passing from the Unix socket or the client->daemon control ring into the session's input
 * buffer, handing each complete frame to sessmsg.c, the output queue and its EV_WRITE interest,
 * packing frames straight into the daemon->client ring, doorbells, and the polling of busy rings
 * for the daemon's spin loop. Who the client is, its Hello, its quotas of sessions and its life
 * cycle are session.c's; what frames mean is sessmsg.c's.
 */
#ifndef TPD_CONN_H
#define TPD_CONN_H

#include <stdbool.h>
#include <sys/uio.h>
#include "tpw.pb-c.h"

struct tpd_session;

/*
 * tpd_conn_init() - allocate the connection of @s (borrowed), whose fd is set: the input
 * buffer and the read and write events, none armed yet.
 * Return: 0 or -ENOMEM; tpd_conn_done() frees what was allocated either way.
 */
int tpd_conn_init(struct tpd_session *s);

/*
 * tpd_conn_start() - make @s's socket non-blocking and start reading it.
 * Return: 0 or -errno.
 */
int tpd_conn_start(struct tpd_session *s);

/*
 * tpd_conn_done() - free @s's connection: queued output (its quota released), the input
 * buffer (likewise), fds received and not claimed, the ring mapping, the events, and close the
 * socket. Accepts a half-built connection; @s itself stays the caller's.
 */
void tpd_conn_done(struct tpd_session *s);

/*
 * tpd_conn_send() - queue a frame of @m followed by @n_tail data pieces for @s, or pack it
 * straight into @s's ring when nothing is queued and it fits.
 * @m, @tail: borrowed; copied.
 * An output queue past its limit or the uid's budget fails @s. Return: 0 or -errno (-EPIPE: @s
 * is NULL or dead).
 */
int tpd_conn_send(struct tpd_session *s, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		  int n_tail);

/* Writes what @s has queued, as far as the socket or ring takes it. Return: 0 or -errno (the
 * connection is dead; the caller decides whether that fails @s). */
int tpd_conn_flush(struct tpd_session *s);

/*
 * tpd_conn_ring_poll() - for the daemon's spin loop: take what @s's ring holds and push
 * queued output into it. Return: true if anything moved.
 */
bool tpd_conn_ring_poll(struct tpd_session *s);

/*
 * tpd_conn_ring_sleep() - before the daemon sleeps: set @s's sleeping flag so that its
 * client rings the doorbell. Return: true if data arrived meanwhile (do not sleep).
 */
bool tpd_conn_ring_sleep(struct tpd_session *s);

/* Withdraws @s's sleeping flag while the daemon polls. */
void tpd_conn_ring_wake(struct tpd_session *s);

/*
 * tpd_conn_ring_take_side() - take the fds waiting on the socket of ring session @s into its
 * fd queue (a ring client sends them before it writes the frame that announces them); doorbell
 * bytes are dropped. Too many or truncated fds fail @s.
 */
void tpd_conn_ring_take_side(struct tpd_session *s);

#endif
