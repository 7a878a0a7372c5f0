/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The inside of tpd_chanx (chanx.h), shared by its files: chanx.c (handles of other hosts'
 * channels and queues, the ops forwarded for them, the link's events), chanxbig.c (their large
 * channel items and queue messages, over the link's data connections) and chanxctl.c (their
 * rows in tpipctl channels and queues). Nothing outside daemon/chan/chanx*.c includes it.
 */
#ifndef TPD_CHANX_INT_H
#define TPD_CHANX_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "chanx.h"
#include "frame.h"
#include "tpb.h"
#include "tpu.h"
#include "validate.h"

struct tpd_chan_stream;

#define XH_HANDLES_PER_SESSION 1024u /* handles of remote objects one session may hold */
#define XH_HOST_MAX (TPW_TPIP_HOST_MAX + 10)

enum xkind { X_CHAN, X_WQ };

/* A client's handle of a channel or queue on another host. */
struct xh {
	struct tpu_list node; /* in tpd_chanx.xhs */
	enum xkind kind;
	struct tpd_session *s;
	uint64_t id;	     /* the id the client knows (chan.c's or wq.c's id space) */
	uint64_t far_id;     /* the hosting daemon's handle id; 0 until the OPEN is answered */
	bool far_pack;	     /* its OPEN answer said ChanReply.pack_peer */
	struct tpd_peer *pr; /* NULL once the link failed */
	char host[XH_HOST_MAX]; /* "HOST:PORT" as the address named it */
	char name[TPW_NAME_MAX + 1]; /* the object's name on that host */
	char why[200];		/* the link's failure, once it failed */
};

struct xop;

/*
 * A large item's transfer over the link's data connections (chanstream.h) for op @xo: a WRITE's
 * items by reference going out, or a READ's item coming into the client's allocation. It
 * outlives its op (the transfer keeps the client's memory referenced until it ends), so that a
 * send that stops early can still tell the hosting daemon (PeerMsg.chan_xfer_end).
 */
struct xstream {
	struct xop *xo; /* NULL once the op is gone */
	struct tpd_chanx *x;
	struct tpd_peer *pr;
	uint64_t xfer_id;
	struct tpd_chan_stream *cs;
	bool send;
};

/* An op forwarded (or, an OPEN, waiting for its link to come up) and not answered yet. */
struct xop {
	struct tpu_list node; /* in tpd_chanx.xops */
	enum xkind kind;
	struct tpd_peer *pr;
	uint64_t op_id;		/* the PeerChanOp's / PeerWqOp's req_id */
	struct tpd_session *s;	/* NULL: the session ended (an OPEN's handle goes when answered) */
	uid_t by_uid;		/* the kernel's uid of the session that made it (its peer-ops share) */
	uint64_t req_id;	/* the client's */
	uint64_t local_id;	/* the client's handle id */
	int op;			/* ChanOpKind or WqOpKind */
	uint32_t max_items;	/* a READ's items per answer as forwarded (0: one) */
	bool pack;		/* a READ forwarded with ChanOp.pack_peer (packed within @room) */
	bool msg;		/* a queue's TAKE or ANSWER with WqOp.msg: answered by descriptor */
	struct xh *xh;		/* OPEN: the handle it opens */
	bool sent;
	/* OPEN while the link comes up: what to send */
	char name[TPW_NAME_MAX + 1];
	bool create, exclusive, owner_set;
	uint32_t owner_uid, uid, pid;
	/* An OPEN with create: the rest of the creation, as the client asked (a channel's: peer
	 * minor >= 6 creates, an older hosting daemon only opens; a queue's: minor >= 8 creates,
	 * an older one is not asked) */
	bool persistent, at_most_once;
	Tpw__V1__Access access;
	uint32_t gid, capacity_items;
	uint64_t capacity_bytes;
	Tpw__V1__RemoteAccess remote;
	char **remote_peers;
	size_t n_remote_peers;
	/* Large items (peer minor >= 6): a WRITE's items by reference (their memory, referenced,
	 * until the hosting daemon says where to send them), or a READ's transfer into the
	 * client's allocation and its answer if that came first (@got). */
	struct tpb_mem *out_mem;
	uint64_t *out_len;
	size_t n_out;
	struct xstream *xs; /* running, or NULL */
	uint64_t room;	      /* READ: its allocation's bytes */
	bool got, got_closed; /* READ: the answer (an item of @got_len bytes copied) came */
	bool got_msg;	      /* READ: that answer was a message read's take (msg_taken) */
	uint64_t got_len;
	uint64_t got_qid;     /* a queue's message read: the question id answered */
	bool recvd;	    /* READ: the transfer ended, with: */
	int recv_err;
	char recv_why[160];
};

struct tpd_chanx {
	struct tpd_daemon *d;
	struct tpd_chans *cs;
	struct tpu_list xhs;
	struct tpu_list xops;
	uint64_t next_op;
};

/* The client's memory of a channel op with large items: a WRITE's items by reference (@n of
 * them, in order), or a READ's allocation (one, @len[0] bytes of room). */
struct xlarge {
	struct tpb_mem *mem; /* with references (tpd_chan_copy_put()) */
	uint64_t *len;
	size_t n;
	bool read;
};

/* chanx.c: answers @r (its ids the client's) with @tail to @s. Borrows all. */
void tpd_chanx_to_client(struct tpd_session *s, Tpw__V1__ChanReply *r, const struct iovec *tail);

/* chanx.c: answers @r (its ids the client's) to @s. Borrows all. */
void tpd_chanx_to_client_wq(struct tpd_session *s, Tpw__V1__WqReply *r);

/* chanx.c: answers @s's request @req_id on handle @id (0: none) of kind @k with @err and a
 * reason. Borrows all. */
void tpd_chanx_refuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		      const char *fmt, ...) _printf_(6, 7);

/* chanx.c: unlinks and frees @xo (and what it holds; a transfer running goes on alone). */
void tpd_chanx_xop_free(struct xop *xo);

/*
 * chanxbig.c: tpd_chanx_big_segs() resolves the @n segments @segs (validated) of @s's op into
 * @lg: the items by reference of a WRITE, SUBMIT or REPLY (@streamed[i] set for each one
 * resolved; @streamed may be NULL) or a read's allocation (@read). tpd_chanx_big_get() does it
 * for channel op @o (@ret_streamed, owned, free(): which of its items they are). Return: 0 or
 * -errno with the reason in @why (nothing held then). tpd_chanx_big_put() drops what @lg holds
 * (accepts an empty one).
 */
int tpd_chanx_big_segs(struct tpd_session *s, Tpw__V1__Segment *const *segs, size_t n, bool read,
		       struct xlarge *lg, protobuf_c_boolean *streamed, char *why, size_t wl);
int tpd_chanx_big_get(struct tpd_session *s, const Tpw__V1__ChanOp *o, struct xlarge *lg,
		      protobuf_c_boolean **ret_streamed, char *why, size_t wl);
void tpd_chanx_big_put(struct xlarge *lg);

/* chanxbig.c: starts the receive of read @xo's item into the client's allocation @lg (taken,
 * also on failure); its id is @xo->xs->xfer_id and its room @xo->room. Return: 0 or -errno. */
int tpd_chanx_big_read_start(struct tpd_chanx *x, struct xop *xo, struct xlarge *lg);

/* What of a hosting daemon's answer (ChanReply or WqReply) matters to large items: a transfer
 * admitted (@xfer_id), or a read's item (@len bytes, question @qid of a queue) copied. */
struct xbig_ans {
	uint64_t xfer_id, len, qid;
	bool ok, copied, closed, msg;
};

/*
 * chanxbig.c: the hosting daemon of @pr answered @r to op @xo (NULL: none of this side's): the
 * parts of large items (a WRITE, SUBMIT or REPLY admitted: send its items; a read's item
 * copied: answer once its bytes are in; a read answered otherwise: its receive ends). Borrows
 * all; may free @xo.
 * Return: true if @r was taken here, false if it is answered as any other.
 */
bool tpd_chanx_big_reply(struct tpd_chanx *x, struct xop *xo, struct tpd_peer *pr,
			 const struct xbig_ans *r);

#endif
