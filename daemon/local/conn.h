/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_conn: the connection of one attached client (struct tpd_session): reading frames with
 * fd passing from the Unix socket or the client->daemon control ring into the session's input
 * buffer, handing each complete frame to its owner (the session, through struct tpd_conn_ops:
 * sessmsg.c handles it), the output queue and its EV_WRITE interest, packing frames straight
 * into the daemon->client ring, doorbells, and the polling of busy rings for the daemon's spin
 * loop. Who the client is, its Hello, its quotas of sessions and its life cycle are session.c's;
 * what frames mean is sessmsg.c's. This file does not know struct tpd_session: what it asks of
 * its owner goes through the owner's const struct tpd_conn_ops.
 */
#ifndef TPD_CONN_H
#define TPD_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include "ring.h"
#include "tpu.h"
#include "tpw.pb-c.h"

/* fds received ahead of the frames that announce them. Those still queued when a read of the
 * session ends are charged to its uid as kept fds (tpd_quota_charge_parked_fd()), as are: */
#define TPD_CONN_FDS_MAX 16
#define TPD_CONN_OUT_FDS_MAX 8 /* fds queued for a socket session that has not read them */
#define TPD_SEND_TAIL_MAX 8 /* data pieces a frame sent by tpd_session_send() may carry inline */

struct event;
struct tpd_daemon;
struct tpd_uid_acct;
struct tpw_hdr;

/*
 * What a connection asks of its owner (the session: session.c sets it up). Each is called on
 * the loop thread with the @owner given to tpd_conn_setup(), never after tpd_conn_done().
 */
struct tpd_conn_ops {
	/*
	 * A complete frame: header @h, @body (@h->msg_len message bytes, a private copy) and
	 * @tail (@h->data_len data bytes), all borrowed for the call; takes @fd (the fd the frame
	 * announced, or -EBADF), also on failure. @tail_shared: the tail still lies in the
	 * client's ring, where the client may change it at any time (read it only as bytes to
	 * copy, never to decide anything); otherwise it follows @body in private memory.
	 * Return: 0, or < 0 once the owner failed (on_fail).
	 */
	int (*on_frame)(void *owner, const struct tpw_hdr *h, const uint8_t *body,
			const uint8_t *tail, bool tail_shared, int fd);
	/*
	 * The connection failed, or its client broke the protocol: the owner logs @msg (borrowed)
	 * at @level, fails with @status and calls tpd_conn_stop(). May come again afterwards: the
	 * owner ignores the later ones.
	 */
	void (*on_fail)(void *owner, int level, Tpw__V1__Status status, const char *msg);
	/* The largest frame the owner takes now (small until its client's Hello). */
	uint32_t (*frame_max)(const void *owner);
	/* Did the client say it ends (SessionEnd)? Its hang-up is then a clean close. */
	bool (*ended_clean)(const void *owner);
};

/*
 * Every function below borrows @c (the connection, embedded in its session) for the call;
 * buffers and fds it keeps are said at each function.
 */

/*
 * The connection of one session, embedded in it (struct tpd_session.conn); only conn.c reads or
 * writes these fields, except that session.c reads the peer credentials off @fd.
 */
struct tpd_conn {
	struct tpd_daemon *d;		 /* borrowed: settings, event base, quotas, scratch */
	const struct tpd_conn_ops *ops; /* the owner's, borrowed (static) */
	void *owner;			 /* handed to @ops */
	struct tpd_uid_acct *acct;	 /* the uid's quota account, borrowed; NULL until started */
	bool stopped;			 /* tpd_conn_stop() was called: the owner failed */
	int fd; /* the accepted Unix socket, owned */
	struct event *ev_read;
	struct event *ev_write;
	uint8_t *in;
	size_t in_len, in_cap;
	size_t in_charged; /* input buffer bytes charged to the uid's quota */
	int fdq[TPD_CONN_FDS_MAX];
	unsigned n_fdq;
	unsigned fdq_charged; /* of those, charged to the uid as parked fds (quota.h) */
	struct tpu_list outq;
	uint64_t outq_bytes;
	unsigned outq_fds; /* of the queued frames' fds, those not sent yet */
	unsigned outq_fds_charged; /* of those, charged to the uid as parked fds */
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
 * tpd_conn_setup() - give @c (zeroed, borrowed) its accepted socket, its daemon and its owner:
 * nothing allocated, nothing armed, but tpd_conn_done() may run from here on.
 * @d: borrowed; must outlive @c.
 * @fd: takes @fd; tpd_conn_done() closes it.
 * @ops, @owner: borrowed; kept until tpd_conn_done() (@ops is the owner's static table).
 */
void tpd_conn_setup(struct tpd_conn *c, struct tpd_daemon *d, int fd,
		    const struct tpd_conn_ops *ops, void *owner);

/*
 * tpd_conn_start() - allocate the input buffer and the events of @c, make its socket
 * non-blocking and start reading it. Frames then go to @c's ops->on_frame.
 * @acct: the uid's quota account the buffers are charged to; borrowed, kept until
 * tpd_conn_done() (the owner leaves the quota after it).
 * Return: 0 or -errno; tpd_conn_done() frees what was allocated either way.
 */
int tpd_conn_start(struct tpd_conn *c, struct tpd_uid_acct *acct);

/* Stops reading and writing @c (its owner is failing; sends are refused from now on);
 * tpd_conn_done() follows. Accepts a connection only set up. */
void tpd_conn_stop(struct tpd_conn *c);

/*
 * tpd_conn_done() - free @c: queued output (its quota released), the input buffer
 * (likewise), fds received and not claimed (likewise), the ring mapping, the events, and close
 * the socket. Accepts a connection only set up, or half started; @c itself stays the caller's.
 */
void tpd_conn_done(struct tpd_conn *c);

/*
 * tpd_conn_send() - queue a frame of @m followed by @n_tail data pieces on @c, or pack it
 * straight into @c's ring when nothing is queued and it fits.
 * @m, @tail: borrowed; copied.
 * An output queue past its limit or the uid's budget fails the owner. Return: 0 or -errno
 * (-EPIPE: @c is stopped).
 */
int tpd_conn_send(struct tpd_conn *c, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		  int n_tail);

/* Writes what @c has queued, as far as the socket or ring takes it. Return: 0 or -errno (the
 * connection is dead; the caller decides whether that fails the owner). */
int tpd_conn_flush(struct tpd_conn *c);

/*
 * tpd_conn_ring_attach() - map the control rings of @c from memfd @fd (@ring_bytes data bytes
 * per direction); frames still travel on the socket until tpd_conn_ring_switch().
 * @fd: borrowed; the mapping stays after it is closed, until tpd_conn_done().
 * Return: 0 or the error of tpu_ring_attach() (-EPERM, -EACCES, -EBADF: not a fitting memfd).
 */
int tpd_conn_ring_attach(struct tpd_conn *c, int fd, uint32_t ring_bytes);

/*
 * tpd_conn_ring_switch() - from now on, @c's frames travel in the rings mapped by
 * tpd_conn_ring_attach() (both directions).
 * Return: 0, or -EBUSY if output is still queued on the socket (the client does not read).
 */
int tpd_conn_ring_switch(struct tpd_conn *c);

/* Do @c's frames travel in control rings? */
bool tpd_conn_is_ring(const struct tpd_conn *c);

/*
 * tpd_conn_send_fd() - sends @fd to @c's client now, on one doorbell byte (SCM_RIGHTS), ahead
 * of every frame queued after this call (pipe rings, issue 27). Only for a ring session, whose
 * socket carries nothing but doorbells. Borrows @fd (the kernel duplicates it).
 * Return: 0, -EOPNOTSUPP (not a ring session), -EAGAIN (socket full) or -errno.
 */
int tpd_conn_send_fd(struct tpd_conn *c, int fd);

/*
 * tpd_conn_send_with_fd() - tpd_conn_send() of @m (no data tail) with @fd handed to the client
 * by SCM_RIGHTS ahead of it: on a ring session as tpd_conn_send_fd() does, on the socket with
 * the frame's first byte (a duplicate waits in the output queue until then, charged to the
 * uid as a parked fd, and is closed with the queue if the session ends first; over the uid's
 * or the daemon's fd limit that fails the owner). Borrows @fd.
 * Return: 0 or -errno (as tpd_conn_send_fd() and tpd_conn_send()).
 */
int tpd_conn_send_with_fd(struct tpd_conn *c, Tpw__V1__DaemonMsg *m, int fd);

/* Data bytes per direction of @c's control rings, 0 on the socket. */
uint32_t tpd_conn_ring_bytes(const struct tpd_conn *c);

/* Bytes of frames read from (@ret_in) and written to (@ret_out) @c's client so far. */
void tpd_conn_bytes(const struct tpd_conn *c, uint64_t *ret_in, uint64_t *ret_out);

/*
 * tpd_conn_ring_poll() - for the spin loop (local.c): take what @c's ring holds and push
 * queued output into it. Return: true if anything moved.
 */
bool tpd_conn_ring_poll(struct tpd_conn *c);

/*
 * tpd_conn_ring_sleep() - before the daemon sleeps: set @c's sleeping flag so that its
 * client rings the doorbell. Return: true if data arrived meanwhile (do not sleep).
 */
bool tpd_conn_ring_sleep(struct tpd_conn *c);

/* Withdraws @c's sleeping flag while the daemon polls. */
void tpd_conn_ring_wake(struct tpd_conn *c);

#endif
