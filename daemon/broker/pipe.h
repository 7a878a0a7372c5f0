/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_pipe: a pipe between two sessions (its two ends) and the transfer state machine of the
 * messages on it: queueing writes, sending descriptors, eager completion, building copy jobs
 * from the reader's allocation, in-order completions, and failing what is pending when an end
 * closes or dies. Each direction is independent. The pipe is freed when both ends are detached
 * and no copy is in flight. This header is the interface of daemon/broker/ to the rest of the
 * daemon; pipe_int.h is private to its files: pipe.c (pipes, writes, reads, completions),
 * pipeend.c (the ends: detach, close), pipeconnect.c (connecting two sessions of this host),
 * msg.c (a message's memory and copy job), budget.c (the daemon-wide budget), cancel.c,
 * xpipe.c, xconnect.c and xaccept.c (pipes to another host's daemon: the messages of an open
 * pipe, the connecting side, the accepting side), xh.c (a message's transfer over a peer link)
 * and broker.c (the broker's state: the pipes, their queues, the totals).
 */
#ifndef TPD_PIPE_H
#define TPD_PIPE_H

#include <stdbool.h>
#include <stdint.h>
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_broker;
struct tpd_daemon;
struct tpd_local;
struct tpd_session;
struct tpd_pipe;
struct tpd_pipe_end;
struct tpd_peer;

/* tpd_pipes_flow_flush() - send the FlowCredit the pass collected and FlowResume to the ends
 * waiting for the daemon-wide budget that now fit (end of each loop pass). Borrows @d. */
void tpd_pipes_flow_flush(struct tpd_daemon *d);

/*
 * tpd_budget_resumed() - the client of local end @e answered FlowResume (borrows @fr):
 * its Writes that follow are taken again. Ignored unless the daemon sent FlowResume to @e.
 * Borrows @e.
 */
void tpd_budget_resumed(struct tpd_pipe_end *e, const Tpw__V1__FlowResume *fr);

/*
 * tpd_pipe_connect() - handle Connect from @s: find the listener, check access, create the pipe,
 * answer the connector (Reply) and the listener's session (Accepted). Failures are answered with
 * Reply and PipeClosed.
 * Ownership: borrows @d and @c (what outlives the call is copied: names, ids); the new pipe's end
 * keeps @s until it detaches (tpd_pipe_end_detach(), which the session calls as it ends).
 */
void tpd_pipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c);

/*
 * tpd_pipe_write() - handle Write on end @e.
 * @e: borrowed.
 * @m: takes @m (the unpacked ClientMsg holding the Write), also when the Write is refused.
 * @tail: borrowed data tail of the frame (@tail_len bytes; what outlives the call is copied).
 */
void tpd_pipe_write(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *m, const uint8_t *tail,
		    uint32_t tail_len);

/* Handle Read (allocation, eager ack or discard) on end @e for a message of the other end.
 * Borrows @e and @rd (a copy job or transfer built from @rd copies what it needs). */
void tpd_pipe_read(struct tpd_pipe_end *e, const Tpw__V1__Read *rd);

/*
 * tpd_cancel_handle() - handle Cancel from @e's session (cancel.c): stop the write or read it
 * names if its bytes are not being copied; it then completes with STATUS_CANCELED, otherwise
 * with its result. Unknown or completed ids are ignored. Borrows @e and @c.
 */
void tpd_cancel_handle(struct tpd_pipe_end *e, const Tpw__V1__Cancel *c);

/*
 * tpd_pring_on_done() - handle RingDone from @e's session (pring.c): its side of the pipe ring
 * transfer it names ended. Answers that name no running transfer of @e are ignored. Borrows @e
 * and @rd; may complete the message (and free the pipe once both ends left).
 */
void tpd_pring_on_done(struct tpd_pipe_end *e, const Tpw__V1__RingDone *rd);
/* Pipe rings of @d now, their bytes, and messages moved through one (tpipctl status).
 * Borrows @d. */
void tpd_pring_totals(struct tpd_daemon *d, uint64_t *ret_rings, uint64_t *ret_bytes,
		      uint64_t *ret_msgs);

/*
 * tpd_pipe_end_detach() - end @e leaves (PipeClose, session end). The other end learns @why
 * (STATUS_CLOSED, STATUS_PEER_DIED, STATUS_SHUTDOWN). The caller removes @e from its session's
 * table. Borrows @e, but may free the pipe, and with it @e: the caller must not touch @e
 * afterwards.
 */
void tpd_pipe_end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why);

/*
 * tpd_pipe_end_close() - handle PipeClose from @e's session: detach @e (the other end learns
 * STATUS_CLOSED) and acknowledge with PipeClosed{STATUS_CANCELED} as soon as no copy reads or
 * writes @e's memory, so that its client may then reuse the buffers of its pending operations.
 * The caller removes @e from the session's table first. Borrows @e, but may free the pipe,
 * and with it @e: the caller must not touch @e afterwards.
 */
void tpd_pipe_end_close(struct tpd_pipe_end *e);

/* Listener @name was just registered: connect the pipes waiting for it. Borrows @d and @name. */
void tpd_xpipe_listener_added(struct tpd_daemon *d, const char *name);

/* ---- cross-host pipes (xpipe.c, xconnect.c, xaccept.c and xh.c) ---- */

/*
 * tpd_xpipe_start() - register the broker's struct tpd_peer_pipe_ops with the peer part (their
 * functions are declared in pipe_int.h: the peer part calls them only through the table). Call
 * before tpd_peers_start().
 */
void tpd_xpipe_start(void);

/* ---- the broker's state (broker.c), for core/ and ctl/ ---- */

/*
 * tpd_broker_new() - the broker's state of one daemon: its pipes, the ends owed FlowCredit or
 * waiting for the daemon-wide budget, the far daemons' connects waiting for a listener, the
 * cross-host transfers running and the totals moved. The daemon reaches it with
 * tpd_daemon_broker().
 * @ret: returns owned broker, free with tpd_broker_free() once every session and peer link is
 * gone (they end the pipes and the waiting connects).
 * Return: 0 or -ENOMEM.
 */
int tpd_broker_new(struct tpd_broker **ret);

/* Frees @b. Takes @b; accepts NULL. */
void tpd_broker_free(struct tpd_broker *b);

/*
 * tpd_broker_serve_local() - hand the local part @l (borrowed) the broker's handlers of the
 * client messages about pipes (struct tpd_local_pipe_ops), before the first session attaches.
 */
void tpd_broker_serve_local(struct tpd_local *l);

/* Open pipes (connecting, open or half-closed, not yet freed). Borrows @b. */
unsigned tpd_broker_pipe_count(const struct tpd_broker *b);

/*
 * tpd_broker_pipe_next() - iterate the pipes of @b, oldest first: the first with @p NULL, then
 * the one after @p. Borrows @b and @p.
 * Return: borrowed pointer, valid until the pipe is freed (the caller calls nothing that could
 * end a pipe while it iterates), or NULL after the last.
 */
struct tpd_pipe *tpd_broker_pipe_next(const struct tpd_broker *b, const struct tpd_pipe *p);

/* Messages delivered (read by their reader) since the daemon started. Borrows @b. */
uint64_t tpd_broker_messages_moved(const struct tpd_broker *b);
/* Payload and tensor bytes of the messages delivered since the daemon started. Borrows @b. */
uint64_t tpd_broker_bytes_moved(const struct tpd_broker *b);
/* The daemon's fan-out (Broadcast, bcast.c) since start, for tpipctl status. */
struct tpd_bcast_stats {
	uint64_t requests;	/* Broadcast frames */
	uint64_t targets;	/* pipes they named */
	uint64_t staged_bytes;	/* private bytes read once into staging */
	uint64_t unstaged;	/* broadcasts over the staging limit (readers read the writer) */
	uint64_t stage_held;	/* staging bytes held now */
};

/* The fan-out counters of @b (borrowed). Return: borrowed, valid while @b lives. */
const struct tpd_bcast_stats *tpd_bcast_stats(const struct tpd_broker *b);

/* True while cross-host transfers run on the stripe threads. Borrows @b. */
bool tpd_broker_busy(const struct tpd_broker *b);

/* Channel names used so far, comma separated, into @buf (@len bytes, NUL-terminated; @len > 0).
 * Borrows @p. */
void tpd_pipe_channels(const struct tpd_pipe *p, char *buf, size_t len);

/* What tpipctl shows of one end of a pipe (struct tpd_pipe_info). */
struct tpd_pipe_end_info {
	/* The end's session; NULL once it detached, and for a remote end. Borrowed from the
	 * local part, valid while the pipe is (see tpd_broker_pipe_next()). */
	struct tpd_session *session;
	bool remote; /* on another host, behind the pipe's peer link */
	bool gone;   /* detached (closed, died, or its host went away) */
	uint32_t queued;       /* messages written by this end not yet consumed */
	uint64_t queued_bytes; /* inline bytes held for them */
	uint64_t msgs_sent;
	uint64_t bytes_sent;
};

/* What tpipctl shows of a pipe (tpd_pipe_info()). */
struct tpd_pipe_info {
	uint64_t id;
	const char *listener;	  /* the name it was connected to */
	bool connecting;	  /* waiting for the peer daemon's answer */
	uint64_t created_ns;	  /* on tpu_now_ns()'s clock */
	char *const *channel_notes; /* why each channel serves it ("WHAT: NAME: reason") */
	unsigned n_channel_notes;
	const char *peer_addr;	  /* "HOST:PORT" of the other host's daemon (cross-host pipes) */
	uint32_t remote_uid;	  /* the remote end's uid, as its daemon claims */
	struct tpd_pipe_end_info end[2]; /* [0] connector, [1] acceptor */
};

/*
 * tpd_pipe_info() - what tpipctl shows of @p (borrowed), into @ret.
 * The strings and the session pointers in @ret are borrowed from the broker (owned by @p, or by
 * the local part for the sessions): valid while @p is, as tpd_broker_pipe_next() says.
 */
void tpd_pipe_info(const struct tpd_pipe *p, struct tpd_pipe_info *ret);

#endif
