/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to the pipe module (the files of daemon/broker/): the broker's state, the message
 * object and the functions these files call in each other. Nothing outside the module includes
 * it; the rest of the daemon uses pipe.h. Everything declared here runs on the loop thread.
 */
#ifndef TPD_PIPE_INT_H
#define TPD_PIPE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <event2/event.h>
#include "copier.h"
#include "core.h"
#include "pipe.h"
#include "tpb.h"
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpb_buffer;
struct tpb_copy_job;
struct tpd_bcast;
struct tpd_listener;
struct tpd_peer;
struct tpd_xh;

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
	struct tpd_pring *ring; /* pring.c: the ring this end's messages use, once one did */
	/* pring.c: its writer (without CMA) was offered @ring for good and may name its memory
	 * by ring_addr; a retired ring is replaced at once */
	bool ring_offered;
	/* pring.c: a library of this pipe direction declined a ring (it holds its limit of
	 * them): its messages go by cma from then on */
	bool ring_declined;
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
	bool ring_used;		    /* a message went through a pipe ring (pring.c) */
	uint64_t created_ns;
	unsigned jobs;		    /* copy jobs and peer transfers in flight */
	/* staging reads of a broadcast's CUDA source that deliveries on this pipe took part in
	 * (bcast.c): its PipeClosed and its freeing wait for them, as for its own copies */
	unsigned stage_reads;

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
	/* connector over a link: refuse unless the link authenticated as an identity these allow
	 * (Connect.expect_remote: UNSPECIFIED no check, ANY_PEER, PEERS one of expect_peers) */
	Tpw__V1__RemoteAccess expect_remote;
	char **expect_peers;
	size_t n_expect_peers;
	uint32_t remote_uid;	    /* remote end's uid as its daemon claims */
	bool waiting;		    /* connecting to a local name not registered yet */
	uint32_t wait_ms;	    /* ... for at most this long */
	char peer_addr[300];	    /* "HOST:PORT" */
	char why[200];		    /* why the remote end went away, for error messages */
};

/* Pipe end ids handed to accepting sessions start here, apart from the ids clients choose. */
#define TPD_PIPE_ACCEPT_ID_BASE (1ull << 63)

/* One source segment of a message: where the daemon reads it (or, for a message written on
 * another host, only its length and device). */
struct tpd_msg_src {
	struct tpb_mem mem;
	struct tpb_buffer *buf; /* reference held for shm sources */
	uint64_t len;
	bool remote_cuda; /* written on another host from CUDA memory */
	bool ring_only;	  /* a ring_addr: reached only through the writer's pipe ring */
};

/*
 * A message written by end @from. It lives on @from's lists: wq until its WriteDone is sent (in
 * order), rq until the reader has consumed it (eager ack, completed copy, discard, or failure).
 * It is freed when it is on neither list and no copy uses it.
 */
struct tpd_msg {
	struct tpu_list wnode;
	struct tpu_list rnode;
	struct tpd_pipe_end *from;
	uint64_t msg_id;
	uint64_t write_id;
	uint64_t bytes;
	uint8_t *tail; /* inline data held for a rendezvous message */
	uint32_t tail_len;
	struct tpd_msg_src *src; /* payloads then tensors */
	size_t n_src;
	struct tpb_copy_job *job; /* built at Read, submitted in order */
	struct tpd_xh *xh;	  /* cross-host: the send or receive of this message */
	bool eager;
	bool read_requested;
	bool copying;
	bool write_ready;
	bool canceled; /* its writer cancelled it before anyone asked for it (cancel.c) */
	bool ring;     /* its clients move it through the pipe ring (pring.c); @job holds its
			* processes and transfers but is not submitted */
	bool ring_only; /* some source is a ring_addr (a writer without CMA): the ring or nothing */
	Tpw__V1__Status write_status;
	char write_why[160];
	uint64_t cost; /* charged to the daemon-wide pipe budget while on rq (tpd_msg_cost()) */
	/* A broadcast's delivery on this host whose sources the daemon stages, or may stage
	 * (bcast.c): referenced; NULL otherwise. While the staging read of a CUDA source runs,
	 * its WriteDone waits (the writer may free its memory once its broadcast is done). */
	struct tpd_bcast *bcast;
	size_t bcast_slot;
	/* ... and the staging reads its copy reads from (bcast.c: a bit each, its private
	 * segments' and its CUDA segments'): it waits until they are done, and fails with the
	 * first that failed */
	uint8_t bcast_reads;
	/* Announced to the reader's daemon in a PeerBcast (bcast.c): it may ask for the bytes of
	 * this message out of the pipe's order (PeerReadReq.bcast). */
	bool xbcast;
	bool xcarrier; /* ... and the one that daemon asked the bytes of (PeerReadReq.bcast) */
};

/* What a queued message of @n_src segments and @tail_len inline bytes costs the daemon-wide
 * pipe budget (--pipe-queue-bytes-max): its inline bytes and its bookkeeping. */
static inline uint64_t tpd_msg_cost(uint32_t tail_len, size_t n_src)
{
	return (uint64_t)tail_len + sizeof(struct tpd_msg) + n_src * sizeof(struct tpd_msg_src);
}

/* The broker's state (broker.c): one per daemon, tpd_daemon_broker() finds it. */
struct tpd_broker {
	struct tpu_list pipes;	     /* struct tpd_pipe, oldest first */
	unsigned n_pipes;
	uint64_t next_pipe_id;
	struct tpu_list flow_dirty;  /* pipe ends with FlowCredit to send at the end of the pass */
	struct tpu_list budget_wait; /* pipe ends waiting for the daemon-wide budget, FIFO */
	struct tpu_list xwaits;	     /* peers' connects waiting for a listener (xaccept.c) */
	unsigned xh_running;	     /* cross-host transfers on the stripe threads */
	uint64_t bytes_moved;
	uint64_t messages_moved;
	struct tpd_bcast_stats bcast; /* daemon fan-out (bcast.c) */
	struct tpu_list bcast_uids;   /* staging bytes held per uid (bcast.c) */
	/* pipe rings (pring.c): live rings, their bytes, the last ring id, messages moved */
	uint64_t rings;
	uint64_t ring_bytes;
	uint64_t ring_next_id;
	uint64_t ring_msgs;
};

/* ---- broker.c ---- */

/* Links new pipe @p into @b's list (and count). @b keeps @p until tpd_broker_pipe_remove(). */
void tpd_broker_pipe_add(struct tpd_broker *b, struct tpd_pipe *p);
/* Unlinks @p, which is being freed, from @b. Borrows @b and @p. */
void tpd_broker_pipe_remove(struct tpd_broker *b, struct tpd_pipe *p);

/* ---- pipe.c ---- */

/* Logs through @s's session logger with a TPIPD_PIPE field, or plainly without a session.
 * Borrows @p, @s (may be NULL) and @fmt. */
void tpd_pipe_log(const struct tpd_pipe *p, const struct tpd_session *s, int level, const char *fmt,
		  ...) _printf_(4, 5);
/* Says why an end went away (@s: its gone status). Return: a static string. */
const char *tpd_pipe_gone_text(Tpw__V1__Status s);
/* Why the other end went away, for the survivor: the peer link's reason if there is one.
 * Borrows @p. Return: borrowed string, valid while @p lives. */
const char *tpd_pipe_why(const struct tpd_pipe *p, Tpw__V1__Status s);
/* A new pipe of @d to listener @name; the caller sets up its ends and links it into the
 * broker's pipes (tpd_broker_pipe_add()).
 * Keeps @d (it outlives every pipe); borrows @name (copied).
 * Return: owned pipe (freed by tpd_pipe_maybe_free() once linked), or NULL without memory. */
struct tpd_pipe *tpd_pipe_new(struct tpd_daemon *d, const char *name);
/* Frees @p if both ends are detached and nothing is in flight (takes @p then, borrows it
 * otherwise): the caller must not touch @p afterwards unless it knows one of those still holds. */
void tpd_pipe_maybe_free(struct tpd_pipe *p);
/* Remembers that @channel served a (source device, destination device) pair on @p. Borrows @p. */
void tpd_pipe_pair_record(struct tpd_pipe *p, enum tpb_loc src, enum tpb_loc dst, int channel);

#define TPD_PIPE_CHANNEL_NOTES 16

/*
 * tpd_pipe_channel_note() - remember, and log at debug, why @channel serves @what ("cpu>cpu",
 * "eager", "cross-host send") on @p, the first time that channel serves @what: for tpipctl pipes
 * -v. Borrows @p, @what and @why (copied). Out of memory or past TPD_PIPE_CHANNEL_NOTES: only
 * logged.
 */
void tpd_pipe_channel_note(struct tpd_pipe *p, const char *what, int channel, const char *why);
/*
 * tpd_pipe_write_one() - write @w on end @e as write @write_id (Write, or one target of a
 * Broadcast @bc, NULL for a Write): queue limits, message, descriptor, eager completion; a
 * refusal is answered with WriteDone. The pipe must not be connecting. Borrows @e, @w, @tail
 * (copied where kept) and @bc.
 */
void tpd_pipe_write_one(struct tpd_pipe_end *e, const Tpw__V1__Write *w, uint64_t write_id,
			const uint8_t *tail, uint32_t tail_len, struct tpd_bcast *bc);

/* tpd_pipe_channel_note() for a path that is not a registry channel (@name: "ring"). */
void tpd_pipe_channel_note_name(struct tpd_pipe *p, const char *what, const char *name,
				const char *why);
/* Completes write @write_id of @e with @err, behind the writes of @e still pending. Borrows @e
 * and @why (copied when the WriteDone must wait). */
void tpd_pipe_write_reject(struct tpd_pipe_end *e, uint64_t write_id, int err, const char *why);
/* The reader is done with @m (successfully or not): complete the write, drop it from rq. May
 * free @m: the caller must not touch it afterwards. Borrows @why (copied). */
void tpd_pipe_msg_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why);
/* Sends ReadDone for @msg_id to reader end @r, if it is still attached. Borrows @r and @why. */
void tpd_pipe_send_read_done(struct tpd_pipe_end *r, uint64_t msg_id, Tpw__V1__Status st,
			     const char *why);
/* Starts the copies (or cross-host transfers) of @w's messages the reader asked for. Borrows @w;
 * each started copy keeps its message until it completes. */
void tpd_pipe_start_next_copy(struct tpd_pipe_end *w);
/* The oldest message of writer end @w the reader has not asked for, or NULL. Borrows @w.
 * Return: borrowed pointer, valid until the message is consumed or @w's pipe is freed. */
struct tpd_msg *tpd_pipe_next_unread(struct tpd_pipe_end *w);

/* Completes the write of @m with @st (@why: NULL when OK) and sends the WriteDone of every
 * completed write at the head of its writer's queue. Borrows @m, but may free it: the caller
 * must not touch it afterwards. Borrows @why (copied). */
void tpd_pipe_write_complete(struct tpd_msg *m, Tpw__V1__Status st, const char *why);
/* Sends the WriteDone of every completed write at the head of @e's queue (one held back by
 * tpd_bcast_holds() stops it). May free those messages. Borrows @e. */
void tpd_pipe_write_flush(struct tpd_pipe_end *e);
/* Frees @m once it is on neither of its writer's lists and no copy uses it (takes @m then,
 * borrows it otherwise): the caller must not touch it afterwards. */
void tpd_pipe_msg_maybe_free(struct tpd_msg *m);

/*
 * tpd_pipe_credit() - a Write of local end @e carrying @bytes inline bytes no longer occupies the
 * daemon's queue (consumed, refused or failed): return its room to @e's client with FlowCredit at
 * the end of this loop pass, if the client speaks minor >= TPW_MINOR_FLOW. Borrows @e (the
 * broker's flow list keeps it until the pass ends, or until its pipe is freed).
 */
void tpd_pipe_credit(struct tpd_pipe_end *e, uint64_t bytes);

/* ---- pipeend.c ---- */

/* The other end of @e. Borrows @e. Return: borrowed pointer, valid as long as @e (same pipe). */
struct tpd_pipe_end *tpd_pipe_end_peer(struct tpd_pipe_end *e);

/* Dying: a local end whose session died or left, a remote end that went away. Borrows @e. */
bool tpd_pipe_end_dying(const struct tpd_pipe_end *e);
/* Attached: a local end with its session, or a remote end that has not gone away. Borrows @e. */
bool tpd_pipe_end_attached(const struct tpd_pipe_end *e);
/* Why an end that is dying or gone went away. Borrows @e. */
Tpw__V1__Status tpd_pipe_end_gone_status(const struct tpd_pipe_end *e);
/* Sets up end @e of @p for session @s (NULL for a remote end) under @local_id. @e (embedded in
 * @p) keeps @p, and @s until the end detaches. */
void tpd_pipe_end_init(struct tpd_pipe_end *e, struct tpd_pipe *p, struct tpd_session *s,
		       uint64_t local_id);
/* Sends the PipeClosed owed to @e's session once no copy touches @e's memory. Borrows @e. */
void tpd_pipe_end_owed_maybe(struct tpd_pipe_end *e);

/* ---- pipeconnect.c ---- */

/* Answers a refused Connect @c from @s: Reply with @err and @why, then PipeClosed. Borrows @s,
 * @c and @why. */
void tpd_pipe_connect_fail(struct tpd_session *s, const Tpw__V1__Connect *c, int err,
			   const char *why);
/* Checks that a local connect can go ahead. Borrows @d, @s and @c.
 * @ret: returns borrowed listener, valid until it is removed from the registry.
 * Return: 0 with the listener in @ret, or -errno with the reason in @why. */
int tpd_pipe_connect_check(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c,
			   struct tpd_listener **ret, char *why, size_t wl);
/*
 * tpd_pipe_connect_reply() - answer @s's Connect @req_id: pipe @pipe_id is open to listener
 * @name owned by @owner_uid (@owner_remote: on another host, as its daemon claims).
 * Borrows @s and @name.
 */
void tpd_pipe_connect_reply(struct tpd_session *s, uint64_t req_id, uint64_t pipe_id,
			    const char *name, uint32_t owner_uid, bool owner_remote);
/* Tells listener @l's session @ls that end @e was accepted for connector @cs. Borrows all four. */
void tpd_pipe_connect_accepted(struct tpd_session *ls, struct tpd_listener *l,
			       struct tpd_pipe_end *e, struct tpd_session *cs);

/* ---- msg.c ---- */

/* Frees @m with its sources' references, its copy job and its cross-host transfer. Takes @m. */
void tpd_msg_free(struct tpd_msg *m);
/* Drops @m's sources and their references: nothing of the writer's memory is used any more.
 * Borrows @m. */
void tpd_msg_release_src(struct tpd_msg *m);
/* Resolves every source of write @w from session @s into @m. Borrows @s and @w; @m takes its
 * own references (shared buffers, the client process). @tail: the frame's data tail, borrowed:
 * inline sources point into it, so the caller copies it before the frame goes and re-points them
 * (tpd_pipe_write() does). Return: 0, or -errno with the reason in @why. */
int tpd_msg_resolve(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Write *w,
		    const uint8_t *tail, char *why, size_t wl);
/* Sends the descriptor of @m (written as @w) to reader end @r, with its bytes if eager: to its
 * session, or through the peer link. Borrows @r, @m and @w (sent or copied within the call).
 * Return: 0 or -errno. */
int tpd_msg_send_descriptor(struct tpd_pipe_end *r, struct tpd_msg *m, const Tpw__V1__Write *w);
/* Announces the rendezvous messages @ms (@n, written as @w, each on a pipe of @link whose
 * reader is on the far host) with one PeerBcast instead of a PeerDescriptor each. Borrows all.
 * Return: 0 or -errno. */
int tpd_msg_send_peer_bcast(struct tpd_peer *link, struct tpd_msg *const *ms, size_t n,
			    const Tpw__V1__Write *w);
/* Segment @i of allocation @rd (payloads then tensors). Return: borrowed from @rd. */
const Tpw__V1__Segment *tpd_msg_read_segment(const Tpw__V1__Read *rd, size_t i);
/* Where one segment of a reader's allocation lands. */
struct tpd_msg_dst {
	struct tpb_xfer x;	/* the source and that destination */
	struct tpb_buffer *buf; /* the shared buffer it lies in, or NULL; the job holds it */
};

/* Resolves the reader's destination @seg for source @src into @d; buffer and CUDA references
 * go into @job, which keeps them until it is freed. Borrows @s, @seg, @src and @job.
 * Return: 0, or -errno with the reason in @why. */
int tpd_msg_resolve_dst(struct tpd_session *s, const Tpw__V1__Segment *seg,
			const struct tpd_msg_src *src, struct tpb_copy_job *job,
			struct tpd_msg_dst *d, char *why, size_t wl);
/* Builds the local copy job of @m into allocation @rd of reader session @s, completing
 * through @done with @m as its argument (the job keeps @m until @done runs; borrows @s and @rd).
 * Return: 0 and an owned job in @ret (free with
 * tpb_copier_job_free()), or -errno with the reason in @why. */
int tpd_msg_build_job(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd,
		      tpb_copy_done_fn done, struct tpb_copy_job **ret, char *why, size_t wl);

/* ---- pring.c ---- */

/*
 * tpd_pring_choose() - should @m, whose copy job @job (into reader session @rs) is built, move
 * through a pipe ring? Yes when pipe rings are on, every transfer is private to private, the
 * message is at least pipe-ring-min bytes and both libraries take rings. Borrows all.
 * Return: true, with why in @why; false, with why in @why when it is worth saying (else "").
 */
bool tpd_pring_choose(const struct tpd_msg *m, const struct tpd_session *rs,
		      const struct tpb_copy_job *job, char *why, size_t wl);
/*
 * tpd_pring_start() - hand @m (m->ring, its job built, counted as copying) to both ends through
 * its writer end's ring, created within the limits on first use. It completes through
 * m->job->done once both ends said RingDone, or failed. Borrows @m.
 * Return: 0, or -errno: nothing started, the caller copies it as usual.
 */
int tpd_pring_start(struct tpd_msg *m);
/* May another message of writer end @w go on its ring now, while those before it still move
 * (every transfer of @w running is on that ring, which has room, and the writer has put the
 * last of them all in)? Borrows @w. */
bool tpd_pring_can_add(const struct tpd_pipe_end *w);
/* Abandons @m's running ring transfer (an end left): the ring dies for both clients, @m
 * completes cancelled from the event loop. Borrows @m. */
void tpd_pring_abort(struct tpd_msg *m);
/* Frees ring @r (NULL is fine), killing it for the clients that map it. Takes @r. */
void tpd_pring_free(struct tpd_pring *r);
/*
 * tpd_pring_offer() - after writer end @w queued @m: if its session has no CMA, both ends take
 * pipe rings and @m is a large rendezvous message that had to be staged, create @w's ring
 * within the limits and offer it to the writer (RingXfer.offer), so that its library names its
 * later messages' memory by ring_addr instead of staging them. Once per end. Borrows both.
 */
void tpd_pring_offer(struct tpd_pipe_end *w, const struct tpd_msg *m);

/* ---- xh.c ---- */

/* Frees @xh (NULL is fine); only for one that is not running. Takes @xh. */
void tpd_xh_free(struct tpd_xh *xh);
/* Stops running transfer @xh; it completes, failed, once no thread touches the memory. Borrows
 * @xh (its message owns it). */
void tpd_xh_cancel(struct tpd_xh *xh);
/* Starts @m's send or receive (m->xh). Keeps @m until the transfer completes.
 * Return: 0, or -errno when it failed at once and has completed. */
int tpd_xh_start(struct tpd_msg *m);
/* The reader's allocation @rd for message @m of a remote writer: a receive, kept in m->xh and
 * started in turn (@m owns it). Borrows @s and @rd.
 * Return: 0, or -errno with the reason in @why. */
int tpd_xh_build_recv(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd, char *why,
		      size_t wl);
/* The receive of remote message @m into daemon memory (@base + @off[i] for segment i, NULL
 * offsets: none) for the fan-out of a far daemon's broadcast: kept in m->xh; it asks with
 * PeerReadReq.bcast and without an RDMA offer, and ends in tpd_bcast_staged(). Borrows @m.
 * Return: 0 or -ENOMEM. */
int tpd_xh_build_recv_stage(struct tpd_msg *m, uint8_t *base, const uint64_t *off);
/* The remote reader asked for message @m (@rr): a send, kept in m->xh and started in turn (@m
 * owns it). Borrows @rr (its RDMA offer is copied). Return: 0 or -ENOMEM. */
int tpd_xh_build_send(struct tpd_msg *m, const Tpw__V1__PeerReadReq *rr);
/* The remote reader finished with @m (status @st) while its send still runs: stop the send;
 * the write completes with @st once it stopped. Borrows @xh and @why (copied). */
void tpd_xh_stop_early(struct tpd_xh *xh, Tpw__V1__Status st, const char *why);
/* Ends running staging receive @xh (tpd_xh_build_recv_stage()) with @status (< 0) and @why:
 * it completes in tpd_bcast_staged() once no thread writes the staging. No-op for another
 * transfer, or one not running. Borrows @xh and @why (copied). */
void tpd_xh_stage_stop(struct tpd_xh *xh, int status, const char *why);
/* Drops @m's send or receive that has not started (NULL or started: nothing): a send tells
 * the reader's daemon it ended with @st and @why. Borrows @m and @why. */
void tpd_xh_abandon(struct tpd_msg *m, Tpw__V1__Status st, const char *why);
/* Tells the reader's daemon that transfer @xfer_id ended with @st (@why: NULL when OK). Borrows
 * @p and @why. */
void tpd_xh_tell_end(struct tpd_pipe *p, uint64_t xfer_id, Tpw__V1__Status st, const char *why,
		     uint64_t bytes, bool rdma);

/* ---- xpipe.c, xconnect.c, xaccept.c: pipes to another host's daemon ---- */

/* The end of cross-host pipe @p on the other host. Return: borrowed, valid as long as @p. */
static inline struct tpd_pipe_end *tpd_xpipe_remote_end(struct tpd_pipe *p)
{
	return p->end[0].remote ? &p->end[0] : &p->end[1];
}

/* The end of cross-host pipe @p on this host. Return: borrowed, valid as long as @p. */
static inline struct tpd_pipe_end *tpd_xpipe_local_end(struct tpd_pipe *p)
{
	return p->end[0].remote ? &p->end[1] : &p->end[0];
}

/*
 * Arms a wait deadline @tv from now. libevent measures it from the time cached at the start of
 * the loop pass, which long work in the same pass (or valgrind) leaves tens of milliseconds
 * stale: the wait would end early. Refresh the cache first.
 */
static inline void tpd_xpipe_timer_add_fresh(struct event *ev, const struct timeval *tv)
{
	event_base_update_cache_time(event_get_base(ev));
	tpd_timer_add(ev, tv);
}

/* Sends @pm (with @n data iovecs) on @p's peer link, if it has one. Borrows @p, @pm and @iov
 * (tpd_peer_send() copies them). */
void tpd_xpipe_tell(struct tpd_pipe *p, Tpw__V1__PeerMsg *pm, const struct iovec *iov, int n);
/* Tells the peer of @link that its pipe @remote_id ended with @st (@why: NULL or a reason).
 * Borrows @link and @why. */
void tpd_xpipe_tell_close(struct tpd_peer *link, uint64_t remote_id, Tpw__V1__Status st,
			  const char *why);
/* Tells the writer's daemon that @m (written there) is consumed with @st. Borrows @m and @why. */
void tpd_xpipe_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why);

/* ---- xconnect.c ---- */

/*
 * tpd_xconnect_wait_local() - Connect @c names a local listener that does not exist yet and asks
 * to wait (wait_ms > 0): keep the pipe connecting (writes are held, the pipe counts against
 * pipes-max) until a listener of that name registers (then the access checks run) or wait_ms
 * passes (-ETIMEDOUT). Ending the session or closing the pipe cancels it.
 * Ownership: borrows @d and @c; the waiting pipe's end keeps @s, as tpd_pipe_connect() does.
 */
void tpd_xconnect_wait_local(struct tpd_daemon *d, struct tpd_session *s,
			     const Tpw__V1__Connect *c);

/* Connect @c from @s to a tpip:// address: dial or reuse the peer link. Borrows @d and @c; the
 * new pipe's end keeps @s, as tpd_pipe_connect() does. */
void tpd_xconnect_remote(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c);
/* A write on a pipe still connecting: keeps it, within the queue limits, for later.
 * Borrows @e; takes @cm (also when refused); borrows @tail (copied). */
void tpd_xconnect_hold(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		       uint32_t tail_len);
/* Drops the write @write_id held while @p connects. Borrows @p. Return: true if it was held. */
bool tpd_xconnect_held_cancel(struct tpd_pipe *p, uint64_t write_id);
/* The tpip:// address of connecting pipe @p was this daemon's own, or the local listener it
 * waits for registered: connect @p to the local listener (the access checks run), or fail the
 * connect. Borrows @p. */
void tpd_xconnect_reroute_local(struct tpd_pipe *p);
/* The local end of cross-host pipe @p left with @why: tell the peer, stop connecting. Borrows
 * @p. */
void tpd_xconnect_local_left(struct tpd_pipe *p, Tpw__V1__Status why);
/* Frees the cross-host state of @p, which is being freed (not @p itself). Borrows @p. */
void tpd_xconnect_done(struct tpd_pipe *p);

/* ---- xaccept.c ---- */

/* Listener @l was just registered: answer the far daemons' connects waiting for it that it
 * admits, as any connect. Borrows @d and @l. */
void tpd_xaccept_listener_added(struct tpd_daemon *d, struct tpd_listener *l);

/* ---- what a peer link calls up into (its struct tpd_peer_pipe_ops, tpd_xpipe_start()) ---- */

/* The peer link @pr goes away: forget the connects of its far daemon waiting for a listener.
 * Borrows @d and @pr. */
void tpd_xaccept_waits_drop(struct tpd_daemon *d, struct tpd_peer *pr);
/* The far daemon of @pr gave up on its connect @pipe_id waiting for a listener: forget it.
 * Borrows @d and @pr. */
void tpd_xaccept_wait_cancel(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t pipe_id);

/* The link of connecting pipe @p is up: ask the peer for the listener. Borrows @p. */
void tpd_xconnect_link_up(struct tpd_pipe *p);
/* The link of @p failed with @err: fail the connect, or the remote end (STATUS_PEER_DIED).
 * -ELOOP means the address was this daemon's own: the pipe connects locally instead.
 * Borrows @p and @why (copied into p->why). */
void tpd_xconnect_link_failed(struct tpd_pipe *p, int err, const char *why);
/* The peer asks for a local listener: accept, refuse, or (with wait_ms, a name that no listener
 * admitting the link has registered) keep the connect waiting until one does or wait_ms passes.
 * Borrows @d and @c (a waiting connect keeps its own copy). Keeps @pr: as the new pipe's link
 * until tpd_xconnect_link_failed(), or in the waiting connect until tpd_xaccept_waits_drop(). */
void tpd_xaccept_connect(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerConnect *c);
/* The peer answered our PeerConnect; @p is NULL if the pipe already ended here. Borrows @pr, @p
 * and @r. */
void tpd_xconnect_reply(struct tpd_peer *pr, struct tpd_pipe *p,
			const Tpw__V1__PeerConnectReply *r);
/* A message the remote end wrote. Borrows @p, @dd and @tail (the eager bytes, sent on to the
 * reader's session within the call). */
void tpd_xpipe_peer_descriptor(struct tpd_pipe *p, const Tpw__V1__Descriptor *dd,
			       const uint8_t *tail, uint32_t tail_len);
/* The remote reader has its allocation for one of our messages: send it. Borrows @p and @rr
 * (the send copies what it needs). */
void tpd_xpipe_peer_read_req(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr);
/* The sender of receive @arg (from tpd_peer_xfer_add()) stopped sending. Borrows @pr, @arg and
 * @xe. */
void tpd_xh_peer_xfer_end(struct tpd_peer *pr, void *arg, const Tpw__V1__PeerXferEnd *xe);
/* The remote reader is done with one of our messages. Borrows @p and @c. */
void tpd_xpipe_peer_consumed(struct tpd_pipe *p, const Tpw__V1__PeerConsumed *c);
/* The remote end went away. Borrows @p and @why (copied into p->why). */
void tpd_xpipe_peer_close(struct tpd_pipe *p, Tpw__V1__Status st, const char *why);

/* ---- bcast.c: the daemon's fan-out ---- */

/*
 * tpd_bcast_handle() - Broadcast @b from @s: write @b->write to each target pipe of @s as its
 * own message (tpd_pipe_write_one()), reading private memory once into daemon staging for the
 * targets whose reader is on this host (a CUDA source: at the first read into CPU memory,
 * tpd_bcast_cuda_src()). Borrows @s, @b and @tail (copied where kept).
 */
void tpd_bcast_handle(struct tpd_session *s, const Tpw__V1__Broadcast *b, const uint8_t *tail,
		      uint32_t tail_len);
/* Re-points @m's private-memory sources at @bc's staging copy and makes @m wait for it, when
 * @bc staged and reader end @r is on this host; joins @m to @bc when @bc may stage its CUDA
 * sources later (tpd_bcast_cuda_src(), beside its private staging or not); else nothing.
 * Borrows @bc (@m takes a reference), @m and @r. */
void tpd_bcast_attach(struct tpd_bcast *bc, struct tpd_msg *m, const struct tpd_pipe_end *r);
/*
 * tpd_bcast_cuda_src() - segment @i of broadcast delivery @m, a CUDA source that its reader
 * wants in CPU memory: where its broadcast stages it (the first such read of a broadcast with
 * another local delivery still unread starts the one read of the device), point @src at the
 * staging copy instead and make @m wait for it; else leave @src (the copy reads the device, as
 * a Write's would). Borrows @m; @src is the transfer's source, rewritten in place.
 */
void tpd_bcast_cuda_src(struct tpd_msg *m, size_t i, struct tpb_mem *src);
/* Whether @m's WriteDone must wait: the staging read of its broadcast reads the writer's CUDA
 * memory. When every delivery is done, that read is abandoned (it then ends soon). Borrows @m. */
bool tpd_bcast_holds(struct tpd_msg *m);
/* @m, being freed, drops its staging reference (NULL: nothing). Borrows @m. */
void tpd_bcast_detach(struct tpd_msg *m);
/* Write @m of a Broadcast to remote reader end @r: instead of its PeerDescriptor now, announce it
 * with the other targets on the same link in one PeerBcast (tpd_bcast_handle() sends it).
 * Return: true if deferred so; false: send its descriptor as usual. Borrows all. */
bool tpd_bcast_defer(struct tpd_bcast *bc, struct tpd_msg *m, const struct tpd_pipe_end *r);
/* PeerBcast from @pr (the link's pipes each target names in @pipes, NULL: not of this link):
 * each target becomes a message of its pipe as a PeerDescriptor would make it, read once from
 * the writer's daemon into staging where it can be. Borrows all. */
void tpd_bcast_peer(struct tpd_peer *pr, const Tpw__V1__PeerBcast *b, struct tpd_pipe **pipes);
/* PeerReadReq.bcast for @p: send message @rr->msg_id (announced in a PeerBcast) at once, out of
 * the pipe's order. Borrows @p and @rr. */
void tpd_bcast_peer_read(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr);
/* The receive into the staging of a far daemon's broadcast (carried by @m) ended with @status
 * (@why when < 0): its deliveries go on (or fail). Borrows @m and @why. */
void tpd_bcast_staged(struct tpd_msg *m, int status, const char *why);
/* A delivery of a far daemon's broadcast (@m, one of its messages, or its receive's carrier)
 * may no longer want the staging: once none does, the receive into it stops, or, once that
 * ended, the staging is freed. May free nothing; borrows @m. */
void tpd_bcast_unwanted(struct tpd_msg *m);
/* Whether @m's copy must still wait for a staging read it copies from (false once one of them
 * failed: tpd_bcast_error()). Borrows @m. */
bool tpd_bcast_waiting(const struct tpd_msg *m);
/* The error of the first failed staging read that @m copies from (0: none, or no staging), with
 * its reason in @why. Borrows @m. */
int tpd_bcast_error(const struct tpd_msg *m, const char **why);

/* ---- cancel.c ---- */

/* Reader end @r asks for canceled message @m (not discarding it): ReadDone{CANCELED} and the
 * message is consumed. Borrows @r, and @m, which this may free. */
void tpd_cancel_read_canceled(struct tpd_pipe_end *r, struct tpd_msg *m);
/* The remote reader asks (transfer @xfer_id) for canceled message @m of writer end @w: tell
 * its daemon the transfer ended CANCELED, and the message is consumed. Borrows @w, and @m,
 * which this may free. */
void tpd_cancel_peer_read_canceled(struct tpd_pipe_end *w, struct tpd_msg *m, uint64_t xfer_id);

/* ---- the daemon-wide budget (budget.c) ---- */

/* Adds @cost to the bytes held for unread messages (and the peak tpipctl status shows). Borrows
 * @d. */
void tpd_budget_charge(struct tpd_daemon *d, uint64_t cost);

/*
 * tpd_budget_check() - may a Write of local end @e costing @cost be queued under
 * pipe-queue-bytes-max? Takes back the room set aside for @e, if any.
 * Return: 0; -EAGAIN: refuse it with tpd_budget_refuse() (@e waits, or waited and its
 * client has not resumed yet); -ENOBUFS with the reason in @why (an older client, or a message
 * over the whole budget). Borrows @e; @e waiting stays linked in the budget's wait queue until
 * it resumes or leaves (tpd_budget_leave()).
 */
int tpd_budget_check(struct tpd_pipe_end *e, uint64_t cost, char *why, size_t wl);

/* Gives back the room set aside for @e after its wait (if any). Borrows @e. */
void tpd_budget_unreserve(struct tpd_pipe_end *e);

/* Refuses write @write_id of @e with WriteDone{resend} at once, and returns its room. Borrows
 * @e. */
void tpd_budget_refuse(struct tpd_pipe_end *e, uint64_t write_id, uint32_t tail_len);

/* @e leaves the budget's wait queue and gives back the room set aside for it (detach, free).
 * Borrows @e; the budget holds no pointer to it afterwards. */
void tpd_budget_leave(struct tpd_pipe_end *e);

/* Sends FlowResume to the waiting ends that fit now, first come first served. Borrows @d. */
void tpd_budget_wake(struct tpd_daemon *d);

/*
 * tpd_budget_far_check() - across hosts, is there room for a message of @tail_len inline bytes of
 * local writer end @e in the far daemon's per-pipe queue (its limits, learnt at set-up)?
 * Return: 0; -EAGAIN: @e waits (refuse with tpd_budget_refuse(); FlowResume follows as the
 * far reader consumes); -ENOBUFS with @why for an older client or a message over the far limit.
 * Borrows @e.
 */
int tpd_budget_far_check(struct tpd_pipe_end *e, uint32_t tail_len, char *why, size_t wl);

/* A message of @e left its queue: resume @e if it waits for the far queue and now fits. Borrows
 * @e. */
void tpd_budget_far_wake(struct tpd_pipe_end *e);

#endif
