/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The inside of tpd_wq (wq.h), shared by its files: wq.c (the registry, queues, handles, waits,
 * the ops and what a worker's or the owner's end does) and wqmsg.c (questions and answers as
 * messages, issue 25 part wqmsg: their bodies, the copies in from a client's memory and out into
 * a reader's slots, the descriptor answers, reads and drops). Nothing else includes it.
 */
#ifndef TPD_WQ_INT_H
#define TPD_WQ_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "handix.h"
#include "tpu.h"
#include "wq.h"

#define WQ_WAITS_PER_HANDLE 64u
#define WQ_COPIES_PER_HANDLE 64u /* copies in and out one handle may have running at once */
#define WQ_HANDLES_PER_SESSION 1024u
#define WQ_NO_DEADLINE UINT32_MAX

struct chan_item;
struct tpd_chans;

/* A question's or answer's bytes and message descriptor: a channel item (daemon/chan/chanitem.c,
 * its descriptor NULL for a byte item), shared by the item and the copies that read it. */
struct wq_body {
	unsigned refs;
	struct tpd_chans *cs; /* where its buffer goes back (spare buffers) */
	struct chan_item *ci;
};

/* A question (queued or taken) or an answer (waiting for the owner, or held by it). */
struct wq_item {
	struct tpu_list node;
	uint64_t id;
	struct wq_handle *taker; /* taken: the worker's handle */
	Tpw__V1__Status status;	 /* an answer's: STATUS_PEER_DIED when its worker died */
	struct wq_body *b;	 /* NULL: no bytes (an error answer) */
	bool replying;		 /* taken: its worker's reply is being copied in */
};

enum wq_wait_kind { WAIT_TAKE, WAIT_ANSWER, WAIT_DRAIN };

struct wq {
	struct tpu_list node; /* in tpd_wqs.wqs while named, then tpd_wqs.gone */
	char *name;
	uid_t uid;
	Tpw__V1__Access access;
	gid_t gid;
	Tpw__V1__RemoteAccess remote; /* who on other hosts may open it as a worker */
	char **remote_peers;	      /* REMOTE_PEERS: the identities allowed */
	size_t n_remote_peers;
	char *creator; /* made for a far daemon: its tpd_peer_account(), charged its share */
	bool at_most_once, closed, gone;
	struct wq_handle *owner; /* NULL once gone */
	struct tpd_wqs *ws;	 /* its registry */
	/* wq_item, oldest first; @held: answers the owner took by descriptor (WqOp.msg), until
	 * read or dropped */
	struct tpu_list queued, taken, answers, held;
	struct tpu_list waits;			/* wq_wait, oldest first */
	uint32_t n_queued, n_taken, n_answers, n_held, n_handles;
	/* Copies in running (submits and replies by reference): each holds its room here
	 * (@n_arriving question slots, @bytes and @answer_bytes); the queue stays while any
	 * runs. */
	uint32_t n_arriving, n_copies;
	uint64_t bytes, answer_bytes, answered, requeued, next_qid;
};

/* Whom a handle answers: a local session, or a peer link (a worker's handle another host's
 * daemon opened for its client, whose uid there is @uid: a claim, never a permission). */
struct wq_who {
	struct tpd_session *s; /* NULL for a peer link's */
	struct tpd_peer *pr;
	uint32_t uid;
};

struct wq_handle {
	struct tpu_list node; /* in tpd_wqs.handles */
	struct wq_who who;
	uint64_t id;
	struct wq *q;
	unsigned waits;
	unsigned copies; /* copies in and out of this handle's requests running */
};

struct wq_wait {
	struct tpu_list node; /* in wq.waits */
	struct wq_handle *h;
	uint64_t req_id;
	enum wq_wait_kind kind;
	bool msg; /* a take or answer read by descriptor (WqOp.msg) */
	struct event *ev;
	struct tpd_uid_acct *acct; /* a local client's: its uid's account, charged the wait */
	const struct tpd_peer *link; /* a peer's: its link, the wait counted there (ws->ix) */
};

struct tpd_wqs {
	struct tpd_daemon *d;
	struct tpu_list wqs;
	/* Queues whose owner is gone while workers' handles keep them: no longer found by name,
	 * holding no question nor answer, counted in no uid's wqs-per-uid (owner_gone()). */
	struct tpu_list gone;
	struct tpu_list handles;
	struct tpd_handix ix; /* the handles by id, and how many each session or link holds */
	uint64_t next_id;
	uint64_t answers_dropped; /* answers whose owner went before receiving them */
};

/* An answer to a request: a status (@why), a question id, an item inline (@it), or with @held
 * its descriptor only (@desc, NULL for a byte item), or with @copied the bytes copied. */
struct wq_ans {
	int err;
	const char *why;
	bool idle; /* -ENOENT because no question is outstanding */
	uint64_t qid;
	Tpw__V1__Status status;
	const struct wq_item *it;
	bool held, copied;
	uint64_t copied_len; /* @copied to a peer: the bytes sent over the link */
	uint64_t xfer_id;    /* to a peer: its streamed payload admitted, to be sent as this */
	Tpw__V1__Descriptor *desc;
};

/* wq.c: answers, the waits of a queue served, a queue nothing keeps freed, a handle by id,
 * items freed, whether a payload crosses to a handle's host, and a question answered. */
void tpd_wq_send(struct wq_handle *h, const struct wq_who *who, uint64_t req_id,
		 const struct wq_ans *a);
void tpd_wq_err(struct wq_handle *h, uint64_t req_id, int err, const char *why);
void tpd_wq_serve(struct wq *q);
void tpd_wq_maybe_free(struct wq *q);
struct wq_handle *tpd_wq_handle_by_id(struct tpd_wqs *ws, uint64_t id);
struct wq_item *tpd_wq_item_new(uint64_t id, struct wq_body *b);
void tpd_wq_item_free(struct wq_item *it);
bool tpd_wq_fits_link(const struct wq_handle *h, size_t len, bool msg, const char *what,
		      char *why, size_t wl);
void tpd_wq_question_answered(struct wq *q, struct wq_item *it, struct wq_item *ans);

/* wqmsg.c: bodies (their bytes, what they cost a queue, whether a message's, the descriptor
 * unpacked), one made from an op's data tail or copied in from its segment (@question: the
 * question a reply answers), and a message read or drop. */
size_t tpd_wq_msg_body_len(const struct wq_body *b);
uint64_t tpd_wq_msg_body_charge(const struct wq_body *b);
bool tpd_wq_msg_body_msg(const struct wq_body *b);
const uint8_t *tpd_wq_msg_body_bytes(const struct wq_body *b);
int tpd_wq_msg_body_desc(const struct wq_body *b, Tpw__V1__Descriptor **ret);
void tpd_wq_msg_desc_free(Tpw__V1__Descriptor *d);
void tpd_wq_msg_body_unref(struct wq_body *b);
int tpd_wq_msg_body_new(struct tpd_wqs *ws, const Tpw__V1__WqOp *o, const uint8_t *tail, size_t len,
		    struct wq_body **ret, char *why, size_t wl);
void tpd_wq_msg_copy_in(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
			struct wq_body *b, struct wq_item *question);
void tpd_wq_msg_read(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o);
void tpd_wq_msg_drop(struct wq_handle *h, const Tpw__V1__WqOp *o);

#endif
