/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The inside of the library's channels (tpclient.h, "channels"), shared by their files: chan.c
 * (handles opened, closed and released, the requests and their answers, late reads given back),
 * chanwrite.c (tp_chan_write(): items by reference, staged, and the staging buffers lent),
 * chanread.c (tp_chan_read(), tp_chan_read_into(), tp_chan_read_many() and the late reads they
 * return) and chanmap.c (a handle's own buffers, lent items read by mapping). Nothing outside
 * client/lib/chan*.c includes it.
 */
#ifndef TPC_CHAN_INT_H
#define TPC_CHAN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "internal.h"

#define CHAN_LENT_MAX 8u		   /* staging buffers one handle lends at once, at most */
#define CHAN_LENT_BYTES (64ull << 20) /* and their bytes */
/* A handle of a channel whose readers map lent items (tp_chan.map) stages and lends only
 * buffers of its own, kept while not lent (the next batches go into them): at most this many,
 * and CHAN_LENT_BYTES, besides the lent ones. */
#define CHAN_OWN_FREE 8u
/* A private item of this size or more that a writer lends while its readers are behind by a
 * quarter of the cache (what it has lent, this batch included) is copied in with non-temporal
 * stores (tpc_copy_stream()), as items from a quarter of the cache always are: its readers
 * will read it from memory. Smaller items are often read while still cached. */
#define CHAN_STREAM_ITEM_MIN (1u << 20)
/* A write whose handle has lent all it may waits for one of those buffers back rather than have
 * the daemon copy its batch in (chanwrite.c, chan_lend_wait_locked()): about what that copy
 * takes, 1 ms a MiB, from 4 to 64 ms. */
#define CHAN_LEND_WAIT_MS_PER_MIB 1u
#define CHAN_LEND_WAIT_MIN_MS 4u
#define CHAN_LEND_WAIT_MAX_MS 64u
/* ... and each released once it has not been used for this long (the io thread), so that a
 * burst does not keep its buffers for the handle's lifetime. */
#define CHAN_OWN_IDLE_MS 1000u
/* Writers' buffers one handle keeps mapped to read lent items from (least recently used
 * unmapped first); each mapped only while the library copies out of it is never unmapped
 * under that copy. At most TPW_CHAN_MAPPED_MAX. */
#define CHAN_MAP_MAX 8u

/* A writer's buffer this handle mapped read-only (ChanReply.map_key); under ctx->lock. */
struct chan_map {
	uint64_t key;
	const uint8_t *addr;
	size_t size;   /* mapped bytes: the file's size (fstat), sealed against shrinking */
	unsigned refs; /* copies out of it running */
	uint64_t used; /* tp_chan.map_tick when last used */
	bool retired;  /* the daemon said the buffer is gone: unmapped once @refs is 0 */
};

struct tp_chan {
	struct tp_context *ctx;
	uint64_t id;
	char *name;
	long owner_uid;	      /* as opened: a release reopens the channel to give items back */
	bool remote;	      /* hosted by another host's daemon: items ride inline, unless */
	bool remote_refs;     /* its daemon streams large items over the link (ChanReply 591) */
	bool pack;	      /* its daemon takes packed batch reads (ChanReply.pack_reads) */
	struct tpu_list late; /* chan_req of reads whose caller gave up, oldest first: waiting for
			       * the daemon, or done with an item; under ctx->lock */
	/* Staging buffers lent to the channel (ChanReply.lent), not yet given back; under
	 * ctx->lock. */
	struct tpc_buf *lent[CHAN_LENT_MAX];
	unsigned n_lent;
	uint64_t lent_bytes;
	/* Lent buffers a notice gave back (ChanReply.released, daemon minor >= 13), taken out of
	 * @lent by the reply handler, for the io thread to handle as a write's answer's
	 * (tpc_chan_back_run()); under ctx->lock. Never more than CHAN_LENT_MAX with @lent. */
	struct tpc_buf *back[CHAN_LENT_MAX];
	unsigned n_back;
	/* A write's wait for a lent buffer back ended with none: no write waits again until one
	 * comes back (chanwrite.c); under ctx->lock. */
	bool lend_stalled;
	/* Descriptors of message reads not yet read or freed (chanmsg.c); under ctx->lock. */
	struct tpu_list descs;
	/* Message reads whose caller gave up (chanmsg.c), waiting for the daemon, oldest first;
	 * and the descriptor one of them brought, for the handle's next tp_chan_read_descriptor()
	 * (the daemon holds its item for the handle); under ctx->lock. */
	struct tpu_list late_msg;
	struct chan_req *late_desc;
	/* Takes (tp_chan_read_msg() inline) whose caller gave up, oldest first: waiting for the
	 * daemon, or done with the item's bytes, which the next tp_chan_read_descriptor()
	 * describes (the daemon no longer has the item); under ctx->lock. */
	struct tpu_list late_takes;
	/* A channel of this host and a daemon of minor >= 9 (issue 25 part map): the handle
	 * stages and lends only buffers of its own (@own: those not lent now), and its reads take
	 * lent items by mapping their writer's buffer (@maps). Under ctx->lock. */
	bool map, map_read; /* @map_read: off once a mapped item could not be read */
	struct tpc_buf *own[CHAN_OWN_FREE];
	unsigned n_own;
	uint64_t own_bytes;
	struct chan_map maps[CHAN_MAP_MAX];
	unsigned n_maps;
	uint64_t map_tick;
	struct tpu_list ctx_node; /* in tp_context.chans until released */
};

struct chan_req {
	struct tpc_req req;   /* first: the reply handler finds the chan_req from it */
	struct tpu_list node; /* in ch->late */
	struct tp_chan *ch;   /* set once the read's caller gave up: heap-allocated, on ch->late */
	struct iovec *items;  /* the answer's items, each malloc()ed (but see @into, @pack), @next
			       * first */
	size_t n, next;
	bool closed;
	uint64_t chan_id;
	bool remote_refs;
	uint64_t held_len; /* the daemon holds an item of this length for the handle (or, with
			    * -EMSGSIZE, the item that did not fit the read's allocation) */
	/* A read naming where its item goes (ChanOp.segments): @dst, @dst_len bytes; the caller's
	 * memory (@into) or a buffer this library allocated for the item. Never freed while the
	 * daemon may still copy into it: a read released unanswered leaves it allocated. */
	void *dst;
	size_t dst_len;
	bool into;
	/* A packed batch read into the caller's memory @dst (ChanOp.pack: @into is set too) of up
	 * to @pack_max items: an answer's inline items go straight there, each where
	 * tpw_chan_pack_at() puts it, once all are checked to fit @dst_len. */
	bool pack;
	size_t pack_max;
	/* ChanOp.pack_copied: @dst is the caller's shared buffer, and a `copied` answer may name
	 * several items the daemon put there, each where tpw_chan_pack_at() puts it. */
	bool pack_copied;
	bool pack_reads; /* an OPEN's answer: ChanReply.pack_reads */
	/* A staging buffer of the context the daemon copies the item into (then copied to @dst by
	 * read_unstage()), or NULL. One whose read is never answered stays registered until the
	 * context goes (the daemon may still copy into it). */
	struct tpc_buf *stage;
	/* A write (@write) and its answer: its staging buffer was lent; ids of buffers given back
	 * (malloc()ed). @lend_buf: the staging buffer the write offers to lend (ChanOp.lend), on
	 * handle @wch; the reply handler files it in @wch->lent at once (@lend_kept), so that a
	 * notice that gives it back, which may come right after the answer, finds it there. */
	bool write, lent, lend_kept;
	uint64_t *released;
	size_t n_released;
	struct tp_chan *wch;
	struct tpc_buf *lend_buf;
	/* A message read (chanmsg.c): the answer's held item and its descriptor (owned, made from
	 * ChanReply.msg_desc by the reply handler), or a take's answer (msg_taken); for a take
	 * inline (@scatter), the CPU slots of @scatter filled from the answer by the handler and
	 * the CUDA slots' bytes in @host, at their offsets in the item. */
	bool msg_held, msg_taken;
	bool msg_read; /* a tp_chan_read_descriptor(): given up, it goes on ch->late_msg */
	bool msg_take; /* a take given up (on ch->late_takes): the handler keeps its bytes in @host */
	struct tp_descriptor *desc;
	const struct tp_allocation *scatter;
	const struct tp_descriptor *scatter_desc;
	uint8_t *host;
	/* A read that takes lent items by mapping (ChanOp.map_ok), and its answer: the item,
	 * items[0].iov_len bytes, lies at @map_off in buffer @map_key, whose fd came with it
	 * (@map_fd, when @map_has_fd); items[0].iov_base stays NULL until tpc_chan_map_take(). */
	bool map_req, map_pending, map_has_fd;
	uint64_t map_key, map_off;
	int map_fd;
	/* ChanOp.pack_mapped: the answer may name several items in @map_key, at @map_offs (owned,
	 * one an item; NULL for one item), each copied out to its packed place in @dst. */
	bool pack_mapped;
	uint64_t *map_offs;
};

/* chan.c: a request's end, whether @ch has a late read done, sending a ChanOp and waiting for
 * its answer (tpc_chan_call(): both), and whether a channel takes items by reference. */
void tpc_chan_req_free(struct chan_req *cr);
bool tpc_chan_late_ready_locked(struct tp_chan *ch);
int tpc_chan_send(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		  size_t n, struct chan_req *cr);
int tpc_chan_wait_locked(struct tp_context *ctx, struct chan_req *cr, int wait_ms,
			 struct tp_chan *late);
int tpc_chan_call(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		  size_t n, int wait_ms, struct chan_req *cr);
bool tpc_chan_fast(const struct tp_chan *ch);

/* chanmsg.c: the descriptor of a held item from its answer, and a take's bytes scattered into
 * the read's slots (reply handler, lock held). Return: 0 or -errno. */
int tpc_chan_msg_on_held(struct tp_context *ctx, struct chan_req *cr,
			 const Tpw__V1__ChanReply *m);
int tpc_chan_msg_on_taken(struct chan_req *cr, const Tpw__V1__ChanReply *m, const uint8_t *tail);
/* At release: @ch's descriptors outlive it, their item given back by the daemon; its message
 * reads that gave up are dropped (lock not held). */
void tpc_chan_msg_orphan(struct tp_chan *ch);
/* A message read or take whose caller gave up, answered: its descriptor (or item) filed on
 * its handle, or @cr freed (lock held). */
void tpc_chan_msg_late_locked(struct chan_req *cr);
/* Whether @ch keeps message items the daemon no longer has (late takes, descriptors of them
 * not read yet), which a release writes back (lock not held). */
bool tpc_chan_msg_kept_any(struct tp_chan *ch);
/* Writes those items of @ch back to the channel through @via (NULL: drops them): a second
 * handle once the release of @ch was answered, or @ch itself before its release. Return: 0 or
 * -errno (message set), counting the items dropped. */
int tpc_chan_msg_give_back(struct tp_chan *ch, struct tp_chan *via);

/* chanmap.c. tpc_chan_map_op(): a READ @op of @ch takes lent items by mapping, listing the
 * keys @ch has mapped in @keys (CHAN_MAP_MAX, the caller's; borrowed by @op until sent); @cr
 * marked so. No lock held. */
void tpc_chan_map_op(struct tp_chan *ch, Tpw__V1__ChanOp *op, uint64_t *keys,
		     struct chan_req *cr);
/* An answer by mapping @m for @cr (reply handler, rx_lock and lock held): its fd taken from
 * the context's queue, kept in @cr with the item's place. Return: 0, -EPROTO (@cr asked for
 * no such answer, or no fd came), -ENOMEM. */
int tpc_chan_map_on_reply(struct tp_context *ctx, struct chan_req *cr,
			  const Tpw__V1__ChanReply *m);
/* The item of @cr's answer by mapping copied out of the writer's buffer (mapped now if need
 * be, every bound checked against the mapping) into @cr's allocation or a new one, then
 * acknowledged (map_done, or map_fail: the item goes back). Once per answer; no lock held.
 * Return: 0, -ESTALE (no fd and no mapping), -EPROTO (out of bounds), -ENOMEM, -errno of
 * mmap(). */
int tpc_chan_map_take(struct tp_chan *ch, struct chan_req *cr);
/* A new handle @ch joins its context's list (no lock held): notices find it there. */
void tpc_chan_map_open(struct tp_chan *ch);
/* At release: @ch leaves that list, its mappings unmapped, its own buffers not lent and those
 * a notice gave back released (before its lent ones are dropped: no notice reaches it then). */
void tpc_chan_map_drop(struct tp_chan *ch);
/* The daemon's notice @m (validated: at most TPW_CHAN_RELEASED_MAX ids, nothing else): the
 * buffers the handle it names lent and that it gives back leave @lent for @back, for the io
 * thread; ids the handle did not lend, and handles that are not its context's, are ignored
 * (reply handler, lock held). */
/* Whether @ch can file one more lent buffer: @lent and @back together stay within
 * CHAN_LENT_MAX (a notice moves buffers from one to the other before the io thread empties
 * @back); ctx->lock held. */
bool tpc_chan_lend_room(const struct tp_chan *ch);

/* Files @b as lent by @ch if tpc_chan_lend_room(). Return: whether it did; ctx->lock held. */
bool tpc_chan_lend_file(struct tp_chan *ch, struct tpc_buf *b);

void tpc_chan_on_released(struct tp_context *ctx, const Tpw__V1__ChanReply *m);
/* The daemon's notice @m (validated: at most TPW_CHAN_RETIRED_MAX keys): the handle it names
 * unmaps each retired buffer it keeps mapped, at once or once the copies out of it end; keys
 * it does not keep, and handles that are not its context's, are ignored (reply handler, lock
 * held). */
void tpc_chan_map_on_retired(struct tp_context *ctx, const Tpw__V1__ChanReply *m);
/* A buffer of @ch's own of at least @size bytes and at most twice that: a free one, else a new
 * one (tpc_buffer_chan_new()). No lock held. Return: owned (tpc_chan_own_put()), or NULL. */
struct tpc_buf *tpc_chan_own_get(struct tp_chan *ch, uint64_t size);
/* Takes @b (a buffer of @ch's own, not lent): kept for @ch's next batches if @reuse (the least
 * recently kept released beyond CHAN_OWN_FREE and CHAN_LENT_BYTES), else released. */
void tpc_chan_own_put(struct tp_chan *ch, struct tpc_buf *b, bool reuse);

/* chanwrite.c: the segment of a memory range by reference, whether the daemon refused a staging
 * buffer, and the lent buffers dropped at release. */
int tpc_chan_ref(struct tp_context *ctx, const void *p, size_t len, bool cma,
		 Tpw__V1__Segment *g, Tpw__V1__ShmRef *ref);
bool tpc_chan_stage_refused(struct tp_context *ctx, const struct tpc_buf *b);
void tpc_chan_lent_drop(struct tp_chan *ch);

/*
 * tpc_chan_write_items() - tp_chan_write() of @n items, with @msgs (NULL: byte items) one
 * message descriptor per item (tp_chan_write_msgs(); items may then be empty). Borrows @items
 * and @msgs. Return: as tp_chan_write().
 */
int tpc_chan_write_items(struct tp_chan *ch, const struct iovec *items, size_t n,
			 Tpw__V1__Descriptor **msgs, int timeout_ms);

#endif
