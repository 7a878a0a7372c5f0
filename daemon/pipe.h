/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_pipe: a pipe between two sessions (its two ends) and the transfer state machine of the
 * messages on it: queueing writes, sending descriptors, eager completion, building copy jobs
 * from the reader's allocation, in-order completions, and failing what is pending when an end
 * closes or dies. Each direction is independent. The pipe is freed when both ends are detached
 * and no copy is in flight.
 */
#ifndef TPD_PIPE_H
#define TPD_PIPE_H

#include <stdbool.h>
#include <stdint.h>
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_session;
struct tpd_pipe;

struct tpd_pipe_end {
	struct tpd_pipe *pipe;
	struct tpd_session *session; /* NULL once detached */
	uint64_t local_id;	     /* the id in the session's namespace */
	struct tpu_list wq;	     /* messages written by this end awaiting WriteDone */
	struct tpu_list rq;	     /* messages written by this end not yet consumed */
	uint64_t next_msg_id;
	uint32_t queued;	     /* messages in rq */
	uint64_t queued_bytes;	     /* inline bytes held for rq */
	bool copying;		     /* a copy job for one of this end's messages is running */
	uint64_t msgs_sent;
	uint64_t bytes_sent;
	Tpw__V1__Status gone;	     /* why the end detached (UNSPECIFIED while attached) */
	/* PipeClosed owed to this end's session (by id), sent once no copy touches its memory:
	 * CANCELED acknowledges its own close, others say why the other end went away. */
	Tpw__V1__Status owed;
	uint64_t owed_session;
};

struct tpd_pipe {
	struct tpu_list node;
	struct tpd_daemon *d;
	uint64_t id;
	char *listener;
	struct tpd_pipe_end end[2]; /* [0] connector, [1] acceptor */
	unsigned channels;	    /* bit per registry channel used */
	uint64_t created_ns;
	unsigned jobs;		    /* copy jobs in flight */
};

/*
 * tpd_pipe_connect() - handle Connect from @s: find the listener, check access, create the pipe,
 * answer the connector (Reply) and the listener's session (Accepted). Failures are answered with
 * Reply and PipeClosed.
 */
void tpd_pipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c);

/*
 * tpd_pipe_write() - handle Write on end @e.
 * @m: takes @m (the unpacked ClientMsg holding the Write).
 * @tail: borrowed data tail of the frame.
 */
void tpd_pipe_write(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *m, const uint8_t *tail,
		    uint32_t tail_len);

/* Handle Read (allocation, eager ack or discard) on end @e for a message of the other end. */
void tpd_pipe_read(struct tpd_pipe_end *e, const Tpw__V1__Read *rd);

/*
 * tpd_pipe_end_detach() - end @e leaves (PipeClose, session end). The other end learns @why
 * (STATUS_CLOSED, STATUS_PEER_DIED, STATUS_SHUTDOWN). The caller removes @e from its session's
 * table. May free the pipe.
 */
void tpd_pipe_end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why);

/*
 * tpd_pipe_end_close() - handle PipeClose from @e's session: detach @e (the other end learns
 * STATUS_CLOSED) and acknowledge with PipeClosed{STATUS_CANCELED} as soon as no copy reads or
 * writes @e's memory, so that its client may then reuse the buffers of its pending operations.
 * The caller removes @e from the session's table first. May free the pipe.
 */
void tpd_pipe_end_close(struct tpd_pipe_end *e);

/* The other end of @e. */
struct tpd_pipe_end *tpd_pipe_end_peer(struct tpd_pipe_end *e);

/* Channel names used so far, comma separated, into @buf. */
void tpd_pipe_channels(const struct tpd_pipe *p, char *buf, size_t len);

#endif
