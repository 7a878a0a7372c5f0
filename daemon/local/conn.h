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
#include <stdint.h>
#include <sys/uio.h>
#include "ring.h"
#include "tpu.h"
#include "tpw.pb-c.h"

#define TPD_CONN_FDS_MAX 16 /* fds received ahead of the frames that announce them */

struct event;
struct tpd_session;

/*
 * Every function below borrows @s (the session whose connection it is) for the call; buffers
 * and fds it keeps are said at each function.
 */

/*
 * The connection of one session, embedded in it (struct tpd_session.conn); only conn.c reads or
 * writes these fields, except that session.c reads the peer credentials off @fd.
 */
struct tpd_conn {
	int fd; /* the accepted Unix socket, owned */
	struct event *ev_read;
	struct event *ev_write;
	uint8_t *in;
	size_t in_len, in_cap;
	size_t in_charged; /* input buffer bytes charged to the uid's quota */
	int fdq[TPD_CONN_FDS_MAX];
	unsigned n_fdq;
	struct tpu_list outq;
	uint64_t outq_bytes;
	uint64_t seq_out;
	uint64_t bytes_in, bytes_out;
	/* Shared-memory control rings (RingSetup): once `ring` is set, frames travel in
	 * them and the socket only carries doorbell bytes, fds and the end of the session. */
	bool ring;
	uint32_t ring_size;	 /* data bytes per direction */
	void *ring_map;		 /* tpu_ring_map_size(ring_size) bytes */
	struct tpu_ring ring_tx; /* daemon -> client */
	struct tpu_ring ring_rx; /* client -> daemon */
};

/*
 * tpd_conn_setup() - give @s (borrowed) its accepted socket: nothing allocated, nothing armed,
 * but tpd_conn_done() may run from here on.
 * @fd: takes @fd; tpd_conn_done() closes it.
 */
void tpd_conn_setup(struct tpd_session *s, int fd);

/*
 * tpd_conn_start() - allocate the input buffer and the events of @s's connection, make its
 * socket non-blocking and start reading it. Frames then go to tpd_sessmsg_handle().
 * Return: 0 or -errno; tpd_conn_done() frees what was allocated either way.
 */
int tpd_conn_start(struct tpd_session *s);

/* Stops reading and writing @s's connection (the session is failing); tpd_conn_done() follows. */
void tpd_conn_stop(struct tpd_session *s);

/*
 * tpd_conn_done() - free @s's connection: queued output (its quota released), the input
 * buffer (likewise), fds received and not claimed, the ring mapping, the events, and close the
 * socket. Accepts a connection only set up, or half started; @s itself stays the caller's.
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
 * tpd_conn_ring_attach() - map the control rings of @s from memfd @fd (@ring_bytes data bytes
 * per direction); frames still travel on the socket until tpd_conn_ring_switch().
 * @fd: borrowed; the mapping stays after it is closed, until tpd_conn_done().
 * Return: 0 or the error of tpu_ring_attach() (-EPERM, -EACCES, -EBADF: not a fitting memfd).
 */
int tpd_conn_ring_attach(struct tpd_session *s, int fd, uint32_t ring_bytes);

/*
 * tpd_conn_ring_switch() - from now on, @s's frames travel in the rings mapped by
 * tpd_conn_ring_attach() (both directions).
 * Return: 0, or -EBUSY if output is still queued on the socket (the client does not read).
 */
int tpd_conn_ring_switch(struct tpd_session *s);

/* Do @s's frames travel in control rings? */
bool tpd_conn_is_ring(const struct tpd_session *s);

/* Data bytes per direction of @s's control rings, 0 on the socket. */
uint32_t tpd_conn_ring_bytes(const struct tpd_session *s);

/* Bytes of frames read from (@ret_in) and written to (@ret_out) @s's client so far. */
void tpd_conn_bytes(const struct tpd_session *s, uint64_t *ret_in, uint64_t *ret_out);

/*
 * tpd_conn_ring_poll() - for the spin loop (local.c): take what @s's ring holds and push
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

#endif
