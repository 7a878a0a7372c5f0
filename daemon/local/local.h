/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_local: the state of the local part as a whole (daemon/local/): the list of attached
 * sessions and their ids, the scratch buffer frames are packed in on their way into a control
 * ring, and the spin loop that polls busy control rings between events. The daemon (core/)
 * creates and frees it and reaches the sessions only through the functions below (counting,
 * iterating and finding them for tpipctl, metrics and the broker); what one session does is
 * session.h's and conn.h's.
 */
#ifndef TPD_LOCAL_H
#define TPD_LOCAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tpw.pb-c.h"

struct tpb_buffer;
struct tpd_daemon;
struct tpd_local;
struct tpd_pipe_end;
struct tpd_session;

/*
 * What the local part hands up to the broker (the part above it): the client messages about
 * pipes and the pipe ends of a session that leave. The broker registers its table
 * (tpd_broker_serve_local()) before the first session attaches; this part calls the broker only
 * through it. Each op borrows its arguments and has the meaning of the broker function it names
 * (broker/pipe.h).
 */
struct tpd_local_pipe_ops {
	/* Connect from @s (tpd_pipe_connect()). */
	void (*connect)(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c);
	/* Write on @e (tpd_pipe_write()); takes @m. */
	void (*write)(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *m, const uint8_t *tail,
		      uint32_t tail_len);
	/* Read on @e (tpd_pipe_read()). */
	void (*read)(struct tpd_pipe_end *e, const Tpw__V1__Read *rd);
	/* Cancel on @e (tpd_cancel_handle()). */
	void (*cancel)(struct tpd_pipe_end *e, const Tpw__V1__Cancel *c);
	/* FlowResume on @e (tpd_budget_resumed()). */
	void (*flow_resumed)(struct tpd_pipe_end *e, const Tpw__V1__FlowResume *fr);
	/* PipeClose on @e (tpd_pipe_end_close()); may free @e. */
	void (*end_close)(struct tpd_pipe_end *e);
	/* @e's session ends (tpd_pipe_end_detach()); may free @e. */
	void (*end_detach)(struct tpd_pipe_end *e, Tpw__V1__Status why);
	/* Listener @name was registered (tpd_xpipe_listener_added()). */
	void (*listener_added)(struct tpd_daemon *d, const char *name);
	/* Broadcast from @s (tpd_bcast_handle()); borrows @m and @tail. */
	void (*broadcast)(struct tpd_session *s, const Tpw__V1__Broadcast *m, const uint8_t *tail,
			  uint32_t tail_len);
	/* RingDone on @e (tpd_pring_on_done(), issue 27); may free @e. */
	void (*ring_done)(struct tpd_pipe_end *e, const Tpw__V1__RingDone *rd);
};

/*
 * What the local part hands up to the group registry (daemon/group/, group.h): the group
 * messages of a session, and a session ending. Registered by tpd_group_serve_local(); each op
 * borrows its arguments for the call.
 */
struct tpd_local_group_ops {
	void (*join)(struct tpd_session *s, const Tpw__V1__GroupJoin *j);
	void (*ready)(struct tpd_session *s, const Tpw__V1__GroupReady *r);
	void (*leave)(struct tpd_session *s, const Tpw__V1__GroupLeave *l);
	/* @s ends (it is dead: nothing more can be sent to it). */
	void (*session_end)(struct tpd_session *s);
	/* @s let go of its buffer @b (borrowed), which readers of a channel may have mapped
	 * (@b->map_key set): released, or @s ended (after session_end). Called before @s drops
	 * its reference. */
	void (*buffer_gone)(struct tpd_session *s, struct tpb_buffer *b);
};

/* What a session hands the channel registry (daemon/chan/): its channel ops and its end. */
struct tpd_local_chan_ops {
	/* @tail, @tail_len: the frame's data tail (WRITE's items), valid during the call. */
	void (*op)(struct tpd_session *s, const Tpw__V1__ChanOp *c, const uint8_t *tail,
		   size_t tail_len);
	/* @s ends (it is dead: nothing more can be sent to it). */
	void (*session_end)(struct tpd_session *s);
	/* @s let go of its buffer @b (borrowed), which readers of a channel may have mapped
	 * (@b->map_key set): released, or @s ended (after session_end). Called before @s drops
	 * its reference. */
	void (*buffer_gone)(struct tpd_session *s, struct tpb_buffer *b);
};

/*
 * tpd_local_new() - create the local part's state for @d: no session yet, the spin loop idle.
 * @d: borrowed; must outlive the result (its event base and settings are read through it).
 * @ret: returns owned state, free with tpd_local_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_local_new(struct tpd_daemon *d, struct tpd_local **ret);

/*
 * tpd_local_free() - close every session still attached (tpd_local_stop()), then free @l.
 * Accepts NULL.
 */
void tpd_local_free(struct tpd_local *l);

/* Closes and frees every session of @l (borrowed) at once, failing its pipes with
 * STATUS_SHUTDOWN (the daemon stops). Accepts NULL. */
void tpd_local_stop(struct tpd_local *l);

/* Number of attached sessions, dead ones not yet freed included. Borrows @l. */
unsigned tpd_local_session_count(const struct tpd_local *l);

/*
 * tpd_local_session_next() - iterate @l's sessions in attach order: the first with @prev NULL,
 * then the one after @prev (borrowed, still attached).
 * Return: borrowed session, valid until it is freed (from its close event, or by
 * tpd_local_stop()); NULL past the last.
 */
struct tpd_session *tpd_local_session_next(struct tpd_local *l, struct tpd_session *prev);

#define tpd_local_for_each_session(s, l)                                                         \
	for ((s) = tpd_local_session_next((l), NULL); (s); (s) = tpd_local_session_next((l), (s)))

/*
 * tpd_local_session_find() - the live session of @l (borrowed) numbered @id.
 * Return: borrowed session, or NULL if none or it is dead (closing).
 */
struct tpd_session *tpd_local_session_find(struct tpd_local *l, uint64_t id);

/*
 * tpd_local_spin_kick() - a control ring moved: poll every ring session of @l (borrowed) from
 * the event loop (between other events) until none moves for the spin budget (--spin-us,
 * adaptive), then set the rings' sleeping flags so that clients ring the doorbell, and sleep in
 * the event loop.
 * Never polls from inside the call (the caller may be parsing a frame).
 */
void tpd_local_spin_kick(struct tpd_local *l);

/*
 * tpd_local_set_pipe_ops() - register the broker's table: @l keeps @ops (static, const) until
 * tpd_local_free(). Called once, before the first session attaches.
 */
void tpd_local_set_pipe_ops(struct tpd_local *l, const struct tpd_local_pipe_ops *ops);

/* tpd_local_set_group_ops() - register the group registry's table: @l keeps @ops (static,
 * const) until tpd_local_free(). Called once, before the first session attaches. */
void tpd_local_set_group_ops(struct tpd_local *l, const struct tpd_local_group_ops *ops);

/* What a session hands the work queues (daemon/chan/wq.c): their ops and its end. */
struct tpd_local_wq_ops {
	/* @tail, @tail_len: the frame's data tail (a payload), valid during the call. */
	void (*op)(struct tpd_session *s, const Tpw__V1__WqOp *q, const uint8_t *tail,
		   size_t tail_len);
	/* @s ends (it is dead: nothing more can be sent to it). */
	void (*session_end)(struct tpd_session *s);
	/* @s let go of its buffer @b (borrowed), which readers of a channel may have mapped
	 * (@b->map_key set): released, or @s ended (after session_end). Called before @s drops
	 * its reference. */
	void (*buffer_gone)(struct tpd_session *s, struct tpb_buffer *b);
};

/* tpd_local_set_chan_ops() - register the channel registry's table: @l keeps @ops (static,
 * const) until tpd_local_free(). Called once, before the first session attaches. */
void tpd_local_set_chan_ops(struct tpd_local *l, const struct tpd_local_chan_ops *ops);

/* tpd_local_set_wq_ops() - register the work queues' table: @l keeps @ops (static, const)
 * until tpd_local_free(). Called once, before the first session attaches. */
void tpd_local_set_wq_ops(struct tpd_local *l, const struct tpd_local_wq_ops *ops);

/*
 * For session.c, sessmsg.c and conn.c only.
 */

/* Return: the channel registry's table registered on @l (borrowed, static), or NULL. */
const struct tpd_local_chan_ops *tpd_local_chan_ops(const struct tpd_local *l);

/* Return: the work queues' table registered on @l (borrowed, static), or NULL. */
const struct tpd_local_wq_ops *tpd_local_wq_ops(const struct tpd_local *l);

/* Return: the group registry's table registered on @l (borrowed, static), or NULL. */
const struct tpd_local_group_ops *tpd_local_group_ops(const struct tpd_local *l);

/* Return: the broker's table registered on @l (borrowed, static). */
const struct tpd_local_pipe_ops *tpd_local_pipe_ops(const struct tpd_local *l);

/*
 * tpd_local_session_add() - number @s (borrowed; @l keeps it on its list until
 * tpd_local_session_remove()) and count it.
 * Return: the session's id, from 1 up, never reused.
 */
uint64_t tpd_local_session_add(struct tpd_local *l, struct tpd_session *s);

/* Takes @s off @l's list and count (borrows both). */
void tpd_local_session_remove(struct tpd_local *l, struct tpd_session *s);

/*
 * tpd_local_scratch() - @l's scratch buffer, frames are packed in it before they are copied
 * into a control ring; grown to at least @len bytes.
 * Return: borrowed buffer of @l, valid until the next call or tpd_local_free(); NULL if it
 * cannot grow (the caller queues the frame instead).
 */
uint8_t *tpd_local_scratch(struct tpd_local *l, size_t len);

#endif
