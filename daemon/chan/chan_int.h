/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The inside of tpd_chan (chan.h), shared by its files: chan.c (the registry, channels and their
 * limits per uid, handles, open and unlink, the ops' entry and tpipctl rows), chanitem.c (items,
 * the daemon's spare buffers and the staging buffers writers lend) and chanio.c (writes and
 * reads: waits, delivery to readers, copies in and out). Nothing outside daemon/chan/chan*.c
 * includes it but daemon/chan/wqmsg.c, whose questions and answers are channel items.
 */
#ifndef TPD_CHAN_INT_H
#define TPD_CHAN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "chan.h"
#include "chancopy.h"
#include "frame.h"
#include "handix.h"
#include "hmap.h"
#include "tpb.h"
#include "tpu.h"

struct event;
struct tpd_session;

#define CHAN_WAITS_PER_HANDLE 64u /* reads one handle may have waiting at once */
#define CHAN_HANDLES_PER_SESSION 1024u
#define CHAN_NO_DEADLINE UINT32_MAX
/* Freed buffers of items copied in by reference kept for the next ones (malloc() would map and
 * unmap, and the kernel zero, every large item's pages): at most this many, this many bytes,
 * daemon-wide. */
#define CHAN_SPARE_MAX 8u
#define CHAN_SPARE_BYTES (64ull << 20)
/* Keys of writers' buffers whose fd one reader handle was sent and that are not retired yet,
 * kept to tell it when they are (ChanReply.retired; client minor 12); beyond this many the
 * oldest is forgotten (the reader unmaps it as its least recently used, or at release). */
#define CHAN_SENT_MAX 32u

/*
 * Who pays for the items of channels: the principal whose write put them there, not the channel's
 * owner (whose capacity still bounds the channel). A local writer pays with its uid
 * (chan-bytes-per-uid, with the buffers it lends: tpd_chan_uid_bytes()); a far daemon writing
 * over a peer link with its account (tpd_peer_account(); chan-remote-bytes-per-peer), never as a
 * local uid, neither the uid its client claims nor the channel's owner, and all far daemons
 * together within one chan-bytes-per-uid of their own (tpd_chans.remote_bytes); a holder of the
 * pre-shared key is charged by the address it connects from, not by the host name it states.
 * Kept while an item or a
 * waiting write names it; the charge goes when the item is freed (read, dropped, the channel
 * freed), wherever it is then.
 */
struct chan_payer {
	uint64_t key;		 /* in tpd_chans.payers (payer_hkey()) */
	struct chan_payer *next; /* another far account whose key is the same: a chain */
	bool remote;
	uid_t uid;     /* a local writer's */
	char *account; /* a far daemon's ("" for links without authentication) */
	uint64_t bytes; /* its items' charges and the bytes its waiting writes hold */
	uint32_t refs;	/* items and waiting writes naming it */
	struct tpd_chans *cs;
};

/* A staging buffer a writer lent to a channel (ChanOp.lend): items of the channel lie in it. The
 * daemon keeps it mapped until the last of them leaves, and charges the lender's uid's
 * chan-bytes-per-uid the whole buffer meanwhile (tpd_chans.lent), besides the items in it, which
 * the lender pays for as their writer. */
struct chan_lend {
	struct tpu_list node;	/* in chan_handle.lends; unlinked once the handle is gone */
	struct chan_handle *h;	/* the lender, told when the last item leaves; NULL once gone */
	struct chan *c;
	struct tpb_buffer *buf; /* with a reference */
	uint32_t uid; /* the lender's: charged the buffer; only its readers of that uid map it */
	uint32_t items;
};

struct chan_item {
	struct tpu_list node;
	size_t len;
	/* A write's item still in the writer's memory (no @data yet): where, with a reference
	 * (tpd_chan_copy_put()). In a channel's list only when @lend: its bytes stay there. */
	bool ref;
	struct tpb_mem src;
	struct chan_lend *lend;
	size_t cap; /* an item copied in: @data's bytes, reusable (tpd_chans.spare); else 0 */
	/* An item written as a message (ChanOp.msgs): its descriptor, packed (Descriptor), charged
	 * to the channel with its bytes; NULL for a byte item. */
	uint8_t *desc;
	size_t desc_len;
	/* Who pays for it, with a reference, and what: its charge when admitted
	 * (tpd_chan_item_pay()); NULL for an item no channel holds yet, or a queue's. */
	struct chan_payer *payer;
	uint64_t paid;
	uint8_t data[];
};

/* What @it costs its channel (chan.bytes, capacity_bytes, chan-bytes-per-uid): its bytes and
 * its message descriptor. */
static inline uint64_t tpd_chan_item_charge(const struct chan_item *it)
{
	return (uint64_t)it->len + it->desc_len;
}

/* What a read asks for. */
struct chan_read {
	uint64_t req_id;
	uint32_t max;	    /* items one answer may carry (>= 1) */
	bool fast;	    /* the reader takes held items (client minor >= 7) */
	bool msg;	    /* a message read (ChanOp.msg): the item is held, its descriptor sent */
	bool pack;	    /* ChanOp.pack: inline items packed into @room (tpw_chan_pack_at()) */
	bool pack_copied;   /* ChanOp.pack_copied: and large items copied to their packed places */
	bool pack_mapped;   /* ChanOp.pack_mapped: and several large items handed out by mapping */
	bool dst_set;	    /* the read names where a large item goes: */
	struct tpb_mem dst; /* with a reference (tpd_chan_copy_put()) */
	uint64_t room;
	/* The reader maps a lent item itself (ChanOp.map_ok; a local client of minor >= 9), and
	 * the keys of the buffers it has mapped (no fd is sent for those). */
	bool map;
	uint64_t mapped[TPW_CHAN_MAPPED_MAX];
	size_t n_mapped;
};

struct chan {
	struct tpu_list node; /* in tpd_chans.chans while named, then tpd_chans.unlinked */
	char *name;
	uid_t uid;
	Tpw__V1__Access access;
	gid_t gid;
	Tpw__V1__RemoteAccess remote; /* who on other hosts may open it (NONE, ANY_PEER, PEERS) */
	char **remote_peers;	      /* REMOTE_PEERS: the identities allowed */
	size_t n_remote_peers;
	char *creator; /* made for a far daemon: its tpd_peer_account(), counted in its share */
	bool persistent, closed, named;
	uint32_t cap_items;
	uint64_t cap_bytes;
	struct tpu_list items;	 /* chan_item, oldest first */
	struct tpu_list waiters; /* chan_wait of reads, oldest first */
	struct tpu_list writers; /* chan_wait of writes waiting for room, oldest first */
	uint32_t n_items, n_handles, n_waiters, n_writers, n_remote;
	/* @bytes counts the items in @items, those held for a handle or being copied to a reader
	 * (@n_outs of them) and the batches being copied in (@res_items items). */
	uint64_t bytes, written, read;
	uint64_t mapped; /* items readers took by mapping their writer's buffer (map_offer()) */
	uint64_t maps_retired; /* notices to its handles that a buffer they got is gone */
	uint32_t maps_held;    /* keys its handles keep in chan_handle.sent */
	/* Items handed off (chanhand.c): copied from the writer's memory straight into a waiting
	 * reader's allocation; and those whose reader went during the copy (copied in instead). */
	uint64_t handed, handed_back;
	/* @res_items counts the items of batches being copied in or handed off, @handing those
	 * of hand-offs: no other batch is copied in while they are equal. */
	uint32_t res_items, n_outs, handing;
	struct tpu_list copies; /* chan_copy running; the channel stays while there are some */
	struct tpd_chans *cs;
};

/* Whom a handle answers: a local session, or a peer link (the handle another host's daemon
 * opened for its client, whose uid there is @uid: a claim, never a permission). */
struct chan_who {
	struct tpd_session *s; /* NULL for a peer link's */
	struct tpd_peer *pr;
	uint32_t uid;
};

struct chan_handle {
	struct tpu_list node; /* in tpd_chans.handles */
	struct chan_who who;
	uint64_t id;
	struct chan *c;
	unsigned waits;	 /* reads waiting */
	bool write_waits; /* a write waiting (one at most: its batch is held here) */
	struct chan_item *held; /* an item too large to answer inline, out of @c for this handle's
				 * next READ with take_held (ChanReply.held_len) */
	struct chan_item *mapped; /* an item handed out by mapping (ChanReply.map_key), out of
				   * @c until the reader's READ with map_done */
	/* the items after @mapped handed out with it (ChanOp.pack_mapped), in channel order */
	struct chan_item **map_rest;
	size_t n_map_rest;
	struct tpu_list lends;	/* chan_lend of buffers this handle lent */
	/* Ids of its lent buffers given up, each once: for its next write's answer, or, to a
	 * client of minor >= 13, a notice at the end of the loop's turn (@noticing: in
	 * tpd_chans.noticing meanwhile), whichever goes first. */
	uint64_t *released;
	uint32_t n_released, cap_released;
	bool noticing;
	struct tpu_list notice_node;
	/* A reader of client minor >= 12: keys of the writers' buffers it was sent an fd of and
	 * not yet told are gone (map_offer(), tpd_chan_item_retire()), oldest first. */
	uint64_t sent[CHAN_SENT_MAX];
	uint32_t n_sent;
};

struct chan_wait {
	struct tpu_list node; /* in chan.waiters */
	struct chan_handle *h;
	uint64_t req_id;
	struct event *ev;
	struct tpd_chans *cs;
	bool write;		/* a write waiting for room: its batch */
	bool lend;		/* its items may stay in the buffer the writer lends */
	struct tpu_list batch; /* chan_item */
	size_t n;
	uint64_t bytes;
	/* A write's: what of @bytes the daemon holds while it waits, paid by @payer (with a
	 * reference) */
	uint64_t held;
	struct chan_payer *payer;
	struct tpd_uid_acct *acct; /* a local client's: its uid's account, charged the wait */
	const struct tpd_peer *link; /* a peer's: its link, the wait counted there (cs->ix) */
	struct chan_read rd; /* a read's */
};

/* A copy running between a client's memory and the daemon (chancopy.c): a batch of items
 * coming in (its room reserved in the channel), or an item going out to a reader. */
struct chan_copy {
	struct tpu_list node; /* in chan.copies */
	struct chan *c;
	struct chan_handle *h; /* NULL once the handle is gone: nobody is answered */
	uint64_t req_id;
	struct tpu_list batch; /* in: the items being filled */
	size_t n;
	uint64_t bytes;
	struct chan_item *item; /* out: the item */
	/* out, a packed read's (ChanOp.pack_copied): @outs[0..n_outs) (@item is @outs[0]), in
	 * channel order, each copied to its packed place */
	struct chan_item **outs;
	size_t n_outs;
	bool msg;		/* out: a message read's take (ChanReply.msg_taken) */
	/* A hand-off (chanhand.c): the first @k items of @batch, the writer's by reference, go to
	 * the reads @to (a reader NULL once its handle is gone); the others are copied in. */
	struct chan_hand {
		struct chan_handle *h;
		uint64_t req_id;
	} *to;
	size_t k;
};

struct tpd_chans {
	struct tpd_daemon *d;
	struct tpu_list chans;
	/* Channels unlinked while something keeps them (a handle, a copy): no longer found by
	 * name, still charged to their owner's chans-per-uid and chan-bytes-per-uid. */
	struct tpu_list unlinked;
	struct tpu_list handles;
	struct tpd_handix ix; /* the handles by id, and how many each session or link holds */
	uint64_t next_id;
	struct tpd_chanx *x; /* channels and queues of other hosts (chanx.c) */
	struct tpu_list spare; /* chan_item buffers to reuse, oldest first (CHAN_SPARE_*) */
	unsigned n_spare;
	uint64_t spare_bytes;
	/* Bytes of lent buffers per lender's uid, whether the channel is named or not. */
	struct chan_lent_uid {
		uid_t uid;
		uint64_t bytes;
	} *lent;
	size_t n_lent, cap_lent;
	/* chan_payer by key: a local writer's uid + 1, or a hash of a far daemon's account with
	 * bit 63 set (accounts whose hashes are equal chain from the one in the map). Looked up
	 * on every admitted write, so not a list to walk. */
	struct tpu_hmap payers;
	uint64_t remote_bytes;	/* what the remote ones pay, together */
	uint64_t handed; /* items handed off in all channels, ever (a metric) */
	/* Handles with lent buffers given up to tell of (chan_handle.noticing), and the event
	 * that tells them all, once a turn of the loop (made at the first). */
	struct tpu_list noticing;
	struct event *notice_ev;
};

/* chan.c: answers (reply_send: @r with @tail, @n_tail pieces; answer: a status, with @it inline
 * if not NULL; answer_len: the length of an item a read did not get), the bytes lent to channels
 * by a uid and those its writes hold, the channels a far daemon created, the payers (payer_get:
 * the payer of @who's writes, made if missing, with a reference, or NULL; payer_charge: @p's
 * bytes moved by @delta, a charge or, negative, its release), and the freeing of a channel
 * nothing keeps. */
void tpd_chan_reply_send(const struct chan_who *who, Tpw__V1__ChanReply *r,
			 const struct iovec *tail, size_t n_tail);
void tpd_chan_answer(const struct chan_who *who, uint64_t req_id, int err, const char *why,
		     uint64_t id, bool closed, const struct chan_item *it);
void tpd_chan_answer_len(const struct chan_handle *h, uint64_t req_id, int err,
			 const char *why, uint64_t len);
uint64_t *tpd_chan_lent_of(struct tpd_chans *cs, uid_t uid, bool add);
uint64_t tpd_chan_uid_bytes(const struct tpd_chans *cs, uid_t uid, uint32_t *ret_count);
uint32_t tpd_chan_creator_count(const struct tpd_chans *cs, const char *creator);
/* Why @bytes more cannot be charged to the payer of @who's writes (in @c: its channel, for the
 * message), or NULL when they can. */
const char *tpd_chan_over_bytes(const struct chan *c, const struct chan_who *who,
				uint64_t bytes);
struct chan_payer *tpd_chan_payer_get(struct tpd_chans *cs, const struct chan_who *who);
void tpd_chan_payer_ref(struct chan_payer *p);
void tpd_chan_payer_unref(struct chan_payer *p);
void tpd_chan_payer_charge(struct chan_payer *p, int64_t delta);
void tpd_chan_maybe_free(struct chan *c);

/* chanitem.c: where an item's bytes lie, freeing items and batches (or keeping their buffers),
 * taking the oldest item out of a channel and back, a write's batch built from its op, and a
 * batch kept in the buffer its writer lends. */
const uint8_t *tpd_chan_item_bytes(const struct chan_item *it);
void tpd_chan_item_free(struct tpd_chans *cs, struct chan_item *it);
struct chan_item *tpd_chan_item_new_copied(struct tpd_chans *cs, size_t len);
void tpd_chan_item_batch_free(struct tpd_chans *cs, struct tpu_list *batch);
struct chan_item *tpd_chan_item_take(struct chan *c);
void tpd_chan_item_give_back(struct chan *c, struct chan_item *it);
void tpd_chan_item_done(struct chan *c, struct chan_item *it);
int tpd_chan_item_batch_build(struct tpd_session *s, const Tpw__V1__ChanOp *o, const uint8_t *tail,
			      struct tpu_list *batch, char *why, size_t wl);
bool tpd_chan_item_lend_batch(struct chan_handle *h, struct tpu_list *batch);
/* @b (borrowed; a buffer readers may map) is gone for good: its session let go of it and no
 * item lies in it. Each reader handle sent its fd is told (ChanReply.retired) and forgets it. */
void tpd_chan_item_retire(struct tpd_chans *cs, struct tpb_buffer *b);
/* @from's message descriptor and payer (its charge) move to @to, copied in in its place. */
void tpd_chan_item_move_desc(struct chan_item *to, struct chan_item *from);
/* Each item of @batch is charged to @p (borrowed; each item takes a reference): its bytes and
 * descriptor, released when the item is freed. */
void tpd_chan_item_pay(struct chan_payer *p, struct tpu_list *batch);
/* @it's message descriptor, packed from @m (borrowed). Return: 0 or -ENOMEM. */
int tpd_chan_item_set_desc(struct chan_item *it, const Tpw__V1__Descriptor *m);
/* The sources of the @n transfers @x out of @it: its bytes back to back, in order, with the
 * lengths @x has (adding up to @it's). */
void tpd_chan_item_srcs(const struct chan_item *it, struct tpb_xfer *x, size_t n);

/* chanmsg.c: items as messages (ChanOp.msgs, ChanOp.msg): a write's descriptors checked and
 * their charge, a held item's descriptor answered, and a message read's take (inline, into the
 * reader's slots, or dropped). */
int tpd_chan_msg_write_check(struct tpd_chans *cs, const Tpw__V1__ChanOp *o,
			     uint64_t *ret_bytes, char *why, size_t wl);
void tpd_chan_msg_answer_held(const struct chan_handle *h, uint64_t req_id,
			      const struct chan_item *it);
void tpd_chan_msg_take(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o);
/* A message descriptor @m (borrowed) for an item of @len bytes, checked against the daemon's
 * limits (segments-max, metadata-max; tpw_chan_msg_check()). Return: 0 or -errno (@why). */
int tpd_chan_msg_desc_check(struct tpd_chans *cs, const Tpw__V1__Descriptor *m, uint64_t len,
			    char *why, size_t wl);
/* @it's descriptor unpacked (*@ret NULL for a byte item). @ret: owned, free with
 * tpw__v1__descriptor__free_unpacked(). Return: 0 or -ENOMEM. */
int tpd_chan_msg_item_desc(const struct chan_item *it, Tpw__V1__Descriptor **ret);
/*
 * tpd_chan_msg_slots() - the destinations of a message read: the @n segments @segs (validated:
 * not empty, at most segments-max) resolved in @s's memory, which must add up to @len exactly.
 * @ret: an owned array of @n transfers (destinations and lengths; sources unset), each with
 * references, drop with tpd_chan_msg_slots_put(). Return: 0 or -errno (@why).
 */
int tpd_chan_msg_slots(struct tpd_session *s, Tpw__V1__Segment *const *segs, size_t n,
		       uint64_t len, struct tpb_xfer **ret, char *why, size_t wl);
void tpd_chan_msg_slots_put(struct tpb_xfer *x, size_t n);

/* chanio.c: the end of a wait, serving a channel's waiting readers and writers, and the WRITE
 * and READ ops of a handle. */
void tpd_chan_io_wait_free(struct chan_wait *w);
void tpd_chan_io_serve(struct chan *c);
void tpd_chan_io_write(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		       const uint8_t *tail, size_t tail_len);
void tpd_chan_io_read(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o);
/* The items @h took by mapping and did not say it copied out go back to the head of its channel,
 * in order. Return: whether there were any. */
bool tpd_chan_io_mapped_back(struct chan_handle *h);
int tpd_chan_io_copy_out(struct chan_handle *h, uint64_t req_id, struct chan_item *it,
			 const struct tpb_xfer *x, size_t n, bool msg);
/* For chanhand.c: @batch (@n items, @bytes) appended to @c; @h's write @req_id answered done
 * (copied, not lent); a copy of @c for @h (NULL: nobody to answer) and @req_id, owned, freed
 * with tpd_chan_io_copy_free(); and the copy in of the items by reference of @batch (@cp->n
 * items, set first; each replaced, in order, by an item of the daemon, and all of them moved to
 * @cp->batch once started), @done called as for tpd_chan_copy_start(). */
void tpd_chan_io_append(struct chan *c, struct tpu_list *batch, size_t n, uint64_t bytes);
void tpd_chan_io_write_answer(struct chan_handle *h, uint64_t req_id);
struct chan_copy *tpd_chan_io_copy_new(struct chan *c, struct chan_handle *h, uint64_t req_id);
void tpd_chan_io_copy_free(struct chan_copy *cp);
int tpd_chan_io_copy_in_start(struct chan_copy *cp, struct tpu_list *batch,
			      tpd_chan_copy_done_fn done);

/*
 * chanhand.c: tpd_chan_hand_try() - hands @h's write @req_id of @batch (@n items, @bytes, room
 * checked, not lent) to the readers waiting on its channel when it can (docs/channels.md,
 * "Items handed off"): every item by reference in one of the writer's shared buffers, the
 * channel holding no item and copying no other batch in, and the oldest waiting read naming a
 * shared buffer with room. Return: true if it took @batch's items (the write is answered
 * later), false if nothing was done.
 */
bool tpd_chan_hand_try(struct chan_handle *h, uint64_t req_id, struct tpu_list *batch, size_t n,
		       uint64_t bytes);
/* @h (a reader) is going: hand-offs to it give its item back to the channel instead. */
void tpd_chan_hand_forget(struct chan *c, const struct chan_handle *h);

#endif
