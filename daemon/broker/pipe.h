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
struct tpd_session;
struct tpd_pipe;
struct tpd_peer;

enum tpd_budget_state {
	TPD_BUDGET_OPEN = 0,
	TPD_BUDGET_WAITING,
	TPD_BUDGET_WAITING_FAR, /* for room in the far daemon's queue of a cross-host pipe */
	TPD_BUDGET_RESUMED,
};

struct tpd_pipe_end {
	struct tpd_pipe *pipe;
	struct tpd_session *session; /* NULL once detached */
	uint64_t local_id;	     /* the id in the session's namespace */
	struct tpu_list wq;	     /* messages written by this end awaiting WriteDone */
	struct tpu_list rq;	     /* messages written by this end not yet consumed */
	uint64_t next_msg_id;
	uint32_t queued;	     /* messages in rq */
	uint64_t queued_bytes;	     /* inline bytes held for rq */
	unsigned copying;	     /* copy jobs or peer transfers of this end's messages running */
	uint64_t msgs_sent;
	uint64_t bytes_sent;
	Tpw__V1__Status gone;	     /* why the end detached (UNSPECIFIED while attached) */
	/* PipeClosed owed to this end's session (by id), sent once no copy touches its memory:
	 * CANCELED acknowledges its own close, others say why the other end went away. */
	Tpw__V1__Status owed;
	uint64_t owed_session;
	bool remote;		     /* the end is on another host, behind the pipe's peer link */
	bool dropped; /* remote writer: the reader's daemon refused one of its eager messages */
	/* Flow control: room in this end's write window not yet returned to its client
	 * (FlowCredit, sent at the end of the loop pass while linked in the broker's
	 * flow_dirty). */
	uint32_t credit_msgs;
	uint64_t credit_bytes;
	struct tpu_list credit_node;
	/* The daemon-wide budget (budget.c): OPEN, or WAITING in the broker's budget_wait for
	 * @budget_need bytes, or RESUMED (FlowResume sent, @reserved bytes set aside) until the
	 * client answers. Writes are refused with WriteDone{resend} unless OPEN; @reserved goes
	 * with the next. */
	enum tpd_budget_state budget;
	uint64_t budget_need;
	uint64_t reserved;
	struct tpu_list budget_node;
};

struct tpd_pipe {
	struct tpu_list node;
	struct tpd_daemon *d;
	uint64_t id;
	char *listener;
	struct tpd_pipe_end end[2]; /* [0] connector, [1] acceptor */
	unsigned channels;	    /* bit per registry channel used */
	/* Bit per registry channel used for each (source, destination) memory pair: [0] CPU to
	 * CPU, [1] CPU to CUDA, [2] CUDA to CPU, [3] CUDA to CUDA. */
	unsigned pair_channels[4];
	/* Why each channel serves this pipe: "WHAT: NAME: reason", one per (WHAT, channel) pair,
	 * owned, at most TPD_PIPE_CHANNEL_NOTES; logged at debug when first noted. */
	char **channel_notes;
	unsigned n_channel_notes;
	uint64_t created_ns;
	unsigned jobs;		    /* copy jobs and peer transfers in flight */

	/* Cross-host pipes: one end is remote (end[1] here if we connected, end[0] if the peer
	 * did). Their messages go through the peer link. */
	struct tpd_peer *link;	    /* NULL on one host, and once the link failed */
	uint64_t remote_id;	    /* the pipe's id on the peer daemon, 0 while connecting */
	/* The peer daemon's per-pipe queue limits (PeerConnect/PeerConnectReply; 0: not said):
	 * what the local end writes is queued there, so it stays within these as well. */
	uint32_t far_queue_max;
	uint64_t far_queue_bytes;
	bool connecting;	    /* waiting for PeerConnectReply */
	bool connect_sent;
	uint64_t connect_req_id;    /* the client's Connect, answered when the peer answers */
	struct event *ev_connect;   /* connect deadline */
	struct tpu_list held;	    /* writes received while connecting, replayed in order */
	uint32_t n_held;
	uint64_t held_bytes;
	bool expect_uid_set;	    /* connector: refuse unless the listener's owner is this */
	uint32_t expect_uid;
	uint32_t remote_uid;	    /* remote end's uid as its daemon claims */
	bool waiting;		    /* connecting to a local name not registered yet */
	uint32_t wait_ms;	    /* ... for at most this long */
	char peer_addr[300];	    /* "HOST:PORT" */
	char why[200];		    /* why the remote end went away, for error messages */
};

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
