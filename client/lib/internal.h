/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libtpclient internals shared by the files of client/lib: the context, pipe, listener,
 * operation, descriptor and shared-buffer objects and the functions each file offers the
 * others. Nothing here is installed or exported; every name starts with tpc_ (never tp_, which
 * the version script exports).
 *
 * Threads and locks. Each context has one library thread (the "io thread") that reads daemon
 * frames, updates state and runs every callback. Two locks:
 *   - send_lock serialises writes to the socket and everything that must reach the daemon in the
 *     order it was decided (ids, msg_id order of reads). Taken first.
 *   - lock guards all object state (maps, lists, pipe states, the done queue, buffers).
 * The socket is never written while holding lock, so the io thread can always keep reading
 * while another thread waits for socket space. Callbacks run with no lock held.
 * Functions named *_locked expect lock held; "send_lock held" is stated where it applies.
 */
#ifndef TPC_INTERNAL_H
#define TPC_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "tpclient.h"
#include "frame.h"
#include "validate.h"
#include "ring.h"
#include "tpu.h"
#include "tpconfig.h"
#if HAVE_VALGRIND
#include <valgrind/memcheck.h>
#endif

#define TP_EXPORT __attribute__((visibility("default")))

/* Default deadline of every wait for the daemon's answer (HelloReply, Reply to Listen and
 * BufferRegister, room on the socket): tp_context_options.reply_timeout_ms overrides it. */
#define TPC_REPLY_TIMEOUT_MS 10000
#define TPC_EAGER_DEFAULT (64u << 10)
#define TPC_INLINE_SMALL 4096u	 /* segments up to this size ride inline in rendezvous writes */
#define TPC_DESC_KEEP 16u	 /* freed descriptor blocks with inline bytes a context keeps */
/* tp_last_error(): the daemon's longest message (TPW_MESSAGE_MAX) and context the library adds. */
#define TPC_ERRMSG_MAX (TPW_MESSAGE_MAX + 256 + 1)
#define TPC_CONN_LOST "daemon connection lost"
#define TPC_SPIN_DEFAULT_US 100
#define TPC_SPIN_MAX_US 100000
#define TPC_WIN_MSGS_MAX (1u << 24) /* the daemon's own bound on pipe-queue-max */

/* ---- id map: uint64 key (never 0) -> pointer, open addressing ----------------------------- */

struct tpc_map {
	uint64_t *keys;
	void **vals;
	size_t cap; /* power of two, or 0 */
	size_t n;
};

/* Files @val under @key. Keeps @val without owning it (the map never frees a value); borrows
 * @m. Return: 0, -EEXIST, -ENOMEM. */
int tpc_map_put(struct tpc_map *m, uint64_t key, void *val);

/* Who may open a channel or work queue, as the wire says it (ChanOp, WqOp). */
struct tpc_access_wire {
	Tpw__V1__Access access;
	uint32_t gid;
	bool owner_set;
	uint32_t owner_uid;
};

/*
 * tpc_access_wire() - check an options struct's @access (enum tp_access), @gid and @owner_uid
 * (-1: the caller's) and put them as the wire says them into the caller's @ret.
 * Return: 0, or -EINVAL with the error set.
 */
int tpc_access_wire(int access, long gid, long owner_uid, struct tpc_access_wire *ret);
/*
 * tpc_remote_wire() - check an options struct's @remote (enum tp_remote_access) and its @peers
 * (@n; TP_REMOTE_PEERS only) and say them as the wire does into @ret_remote, @ret_peers (which
 * borrows @peers) and @ret_n.
 * Return: 0, or -EINVAL with the error set.
 */
int tpc_remote_wire(int remote, const char *const *peers, size_t n,
		    Tpw__V1__RemoteAccess *ret_remote, char ***ret_peers, size_t *ret_n);
/* Is @name a channel or queue name, or an address tpip://HOST[:PORT]/NAME of one on another
 * host? */
bool tpc_object_name_ok(const char *name);
/* Return: the value under @key (borrowed: the map does not own it), or NULL. */
void *tpc_map_get(const struct tpc_map *m, uint64_t key);
/* Removes @key. Return: its value (the map holds it no more), or NULL if absent. */
void *tpc_map_del(struct tpc_map *m, uint64_t key);
/* Removes every entry, calling @fn on each value (which may not touch @m). @fn runs within the
 * call, on the calling thread, with @arg (borrowed for the call); it may free the value. */
void tpc_map_drain(struct tpc_map *m, void (*fn)(void *val, void *arg), void *arg);
/* Frees the table (not the values); @m itself is the caller's storage. */
void tpc_map_done(struct tpc_map *m);

/* tp_pipe_write_ex(): the write's operation id in *@ret_id (NULL: not wanted). Ownership as
 * tp_pipe_write(): borrows @p and @msg (copied during the call), keeps the data @msg points to
 * until @cb, which runs once, on the io thread, with @arg. */
int tpc_pipe_write(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb, void *arg,
		   uint64_t *ret_id);

/*
 * tpc_pipes_broadcast() - writes @msg to the @n pipes @pipes (distinct, of one context) with one
 * Broadcast frame (daemon fan-out): each pipe gets its own write, completed by its own
 * WriteDone through @cb with @args[i] (and resent alone if the daemon-wide budget turns it
 * back). Used only when it can go at once: every pipe open with room in its window and nothing
 * held, no CUDA tensor, nothing to stage, the daemon taking Broadcasts of @n pipes.
 * Ownership as tpc_pipe_write() for each pipe.
 * @ret_ops: the op id of pipe i's write (for tp_cancel()), 0 where it was refused here.
 * @ret_status: 0 where the write was filed (@cb will run), else its -errno (no callback).
 * Return: 0 (filed and sent); -EOPNOTSUPP (nothing filed: write each pipe instead); or -errno
 * as tpc_pipe_write() (nothing filed).
 */
int tpc_pipes_broadcast(struct tp_pipe *const *pipes, unsigned n, const struct tp_message *msg,
			tp_done_fn cb, void *const *args, uint64_t *ret_ops, int *ret_status);

/*
 * tpc_pipe_read() - tp_pipe_read(), and for a blocking read (@ret_inline not NULL, starts false)
 * an eager message with no read before it completes in the call: *@ret_inline is set and @cb
 * is never called. Ownership as tp_pipe_read(): takes @dp (also on failure), copies @alloc and
 * keeps the memory it points to until @cb, which runs once, on the io thread, with @arg.
 */
int tpc_pipe_read(struct tp_pipe *p, struct tp_descriptor *dp, const struct tp_allocation *alloc,
		  tp_done_fn cb, void *arg, bool *ret_inline, uint64_t *ret_id);

/*
 * tpc_context_help() - for a thread spinning in a blocking call: read what the daemon->client
 * ring holds if no other thread is reading it, and run the completed operation whose arg is
 * @arg if it is next in the done queue and no callback is running. @arg is only compared, never
 * dereferenced; borrows @ctx.
 * Return: true if that operation ran (its callback was called on this thread).
 */
bool tpc_context_help(struct tp_context *ctx, const void *arg);

/* Rings the daemon's doorbell (one byte on the socket; any thread, no lock needed). Borrows
 * @ctx. */
void tpc_wire_doorbell(struct tp_context *ctx);

/*
 * tpc_spin_until() - spin (bounded, adaptive per thread) until *@flag is non-zero, helping the
 * io thread (tpc_context_help() with @arg, the waiting operation's callback argument; NULL: do
 * not help) meanwhile. A helping thread of a ring context is the one that polls the ring while
 * it spins: the io thread sleeps meanwhile, and is woken only for callbacks it must run.
 * Borrows @ctx and @flag for the call; @arg is only compared.
 * Return: true if it became non-zero while spinning; false: the caller should sleep.
 */
bool tpc_spin_until(struct tp_context *ctx, const bool *flag, const void *arg);

/* ---- requests answered by Reply ------------------------------------------------------------ */

struct tpc_req;
/* Called with lock held by the io thread; @r is NULL when the connection was lost. Borrows @req
 * (its owner's, filed until this call) and @r (valid only during the call). */
typedef void (*tpc_reply_fn)(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r);

struct tpc_req {
	uint64_t id;
	tpc_reply_fn on_reply;
	bool done;
	int status;
	uint64_t result_id;
	char msg[TPC_ERRMSG_MAX];
};

/* ---- operations: pending on a pipe or listener, then queued for their callback ------------- */

enum tpc_op_kind {
	TPC_OP_WRITE,
	TPC_OP_READ,
	TPC_OP_DESC,
	TPC_OP_ACCEPT,
	TPC_OP_PIPE_FREE,     /* drop the user's reference after the pipe's callbacks */
	TPC_OP_LISTENER_FREE, /* free a closed listener after its callbacks */
};

struct tpc_copy { /* a staged read segment: stage + off -> dst after ReadDone */
	void *dst;
	size_t off; /* TPC_COPY_CMA: the daemon writes @dst itself, nothing to copy */
	size_t len;
};

#define TPC_COPY_CMA SIZE_MAX

/*
 * tpc_mem_written() - [@p, @p + @len), host memory of this process, now holds the bytes the
 * daemon was asked to put there. The daemon writes a reader's private memory from its own
 * process (CMA), which a memory checker in this process (valgrind's memcheck) cannot see: the
 * program would be told it uses uninitialised bytes it received. This tells memcheck they are
 * defined; outside valgrind it costs a few instructions, and nothing where the build had no
 * valgrind header. Call it only for bytes a successful read or take has written.
 */
static inline void tpc_mem_written(const void *p, size_t len)
{
#if HAVE_VALGRIND
	if (len)
		(void)VALGRIND_MAKE_MEM_DEFINED(p, len);
#else
	(void)p;
	(void)len;
#endif
}

struct tpc_desc;
struct tpc_held_write; /* write.c */
struct tpc_buf;
struct tpc_cuda;       /* cuda.c: a context's IPC handle cache and event pools */
struct tpc_cuda_event; /* cuda.c: an interprocess event recorded for one operation */

struct tpc_pring;

struct tpc_op {
	struct tpu_list node; /* owner's pending list, then ctx->done */
	enum tpc_op_kind kind;
	bool pending;
	bool ready; /* result known, waiting for earlier ops of its list */
	int status;
	char *errmsg; /* owned; NULL when status == 0 */
	union {
		tp_done_fn done;
		tp_descriptor_fn desc;
		tp_accept_fn accept;
	} cb;
	void *arg;
	struct tp_pipe *pipe;
	struct tp_listener *listener;
	uint64_t id;		  /* write_id or msg_id */
	struct tpc_desc *desc;	  /* TPC_OP_DESC result */
	struct tp_pipe *accepted; /* TPC_OP_ACCEPT result */
	/* tp_cancel(): the id the caller got (never reused in the context; 0 for internal ops),
	 * filed in ctx->ops while the op can be cancelled. @sent: a write or read whose frame
	 * went to the daemon (a library-held one, not sent yet, is cancelled here alone);
	 * @cancel_sent: its Cancel went too. */
	uint64_t op_id;
	bool sent;
	bool cancel_sent;
	struct tpc_buf *stage;	  /* staging buffer, released after the callback */
	/* A write whose thread is still copying the caller's bytes into @stage, with no lock
	 * held (write.c): it waits in pipe->wheld, and if it completes meanwhile (its pipe fails
	 * or closes, tp_cancel()) its callback, and every callback behind it in ctx->done, waits
	 * until the copy ends, so neither @stage nor the caller's memory is reused under it.
	 * Lock. */
	bool copying;
	/* The pipe ring whose thread copies it (pring.c), while its side of that copy has not
	 * ended (atomic; set with the lock held): a completion meanwhile means the daemon gave
	 * the ring up, and the thread is stopped rather than left waiting on the other end. */
	struct tpc_pring *pring;
	size_t n_copies;
	struct tpc_copy *copies; /* allocated with the op */
	/* Events recorded on the streams of the op's CUDA segments: the daemon waits for them
	 * before its copy. Back to their pool when the op is freed (after its callback). */
	struct tpc_cuda_event *cuda_events;
	/* The same, shared by the deliveries of one Broadcast (one export, one event per
	 * stream, which the daemon waits for before each delivery's copy): back to their pool
	 * when the last of those ops is freed. */
	struct tpc_cuda_shared *cuda_shared;
	/* With flow control, a write's packed frame (a reference; its data pieces still point
	 * into the caller's memory), kept while the write is pending so that it can be resent
	 * when the daemon-wide budget turns it back (WriteDone{resend}); without, kept for a
	 * write held. In pipe->wheld (hnode) while held by the library: beyond the window,
	 * turned back, being staged (@copying) or behind one that is. @stale: refusals still
	 * due for copies of it sent before the daemon turned back an earlier write; ignored. */
	struct tpc_held_write *held;
	struct tpu_list hnode;
	unsigned stale;
};

/* ---- shared buffers ------------------------------------------------------------------------ */

struct tpc_buf {
	void *addr;
	size_t size; /* mapped and registered bytes (page multiple) */
	uint64_t id;
	uint64_t gen;
	bool staging;
	/* A channel handle's own buffer (tpc_buffer_chan_new()): readers of that one channel may
	 * map it; never in the staging pool, never used for anything else. */
	bool chan;
	bool failed; /* the daemon refused the registration */
	struct tpc_req req;
	struct tpu_list pool_link;
	uint64_t used_ns; /* staging: when it went back to the pool (tpu_now_ns()) */
};

/* ---- context ------------------------------------------------------------------------------- */

struct tpc_limits {
	uint32_t frame_max;
	uint32_t inline_max;
	uint32_t segments_max;
	uint64_t message_bytes_max;
	uint32_t metadata_max;
	uint32_t buffers_max; /* 0: no limit announced */
	uint64_t buffer_bytes_max;
	uint32_t pipes_max;
	uint32_t win_msgs;  /* write window per pipe (flow control), messages */
	uint64_t win_bytes; /* ... and inline bytes */
	uint32_t bcast_pipes_max; /* targets of one Broadcast; 0: the daemon takes none */
};

struct tp_context {
	pthread_mutex_t send_lock;
	pthread_mutex_t lock;
	pthread_mutex_t rx_lock; /* reading frames (rbuf, ring_rx): the io thread, or a helping
				  * blocked caller (tpc_context_help()); taken before lock */
	pthread_cond_t cond; /* replies, connect results, connection loss */
	int fd;
	int efd; /* eventfd: wakes the io thread */
	pthread_t thread;
	bool thread_started;
	char *name;
	uint64_t probe; /* CMA probe word, read by the daemon during Hello */
	bool cma_ok; /* set by Hello, cleared by a WriteDone/ReadDone with cma_off (lock held) */
	bool close_acks; /* the daemon acknowledges PipeClose (protocol minor >= 1) */
	uint32_t daemon_minor; /* HelloReply.minor */
	bool flow; /* the daemon returns write-window room with FlowCredit (minor >= 5) */
	size_t eager_max;
	struct tpc_limits lim;
	uint64_t session_id;
	int reply_ms; /* tp_context_options.reply_timeout_ms, or TPC_REPLY_TIMEOUT_MS */
	tp_log_fn log_fn;
	void *log_arg;

	/* Control ring (set up in tp_context_new, fixed afterwards). ring_tx is written with
	 * send_lock held; ring_rx is read by the io thread only. */
	bool ring;
	uint32_t ring_size;
	void *ring_map;
	struct tpu_ring ring_tx, ring_rx;
	uint64_t spin_ns;     /* 0: never spin */
	uint32_t io_sleeping; /* atomic: the io thread blocks in poll() */
	/* atomic: threads in blocking calls that poll ring_rx (tpc_spin_until()); while there
	 * are any the io thread sleeps without the ring's sleeping flag, and the last one to
	 * stop sets it for the io thread (context.c) */
	uint32_t ring_pollers;
	uint64_t wake_seq;    /* atomic: bumped by tpc_context_wake() */
	bool running_op;      /* lock: the io thread runs a completed operation's callback */
	/* lock: an asynchronous eager read completed in its caller's thread since the io thread
	 * last looked, leaving it the callback: the io thread may linger (context.c) */
	bool io_handed;
	/* atomic slots: freed descriptor blocks of inline bytes kept for the next (read.c) */
	struct tpc_desc *desc_keep[TPC_DESC_KEEP];
	size_t desc_kept; /* atomic: their bytes */

	/* send_lock */
	uint64_t seq;
	uint8_t *sbuf;
	size_t sbuf_cap;
	struct iovec *siov;
	size_t siov_cap;

	/* io thread only (and tp_context_new before it starts) */
	uint8_t *rbuf;
	size_t rpos; /* start of the first unconsumed frame */
	size_t rlen; /* end of the received bytes */
	size_t rcap;

	/* lock */
	int dead; /* 0, or -errno once the daemon connection is gone */
	char dead_msg[TPC_ERRMSG_MAX];
	bool stopping; /* tp_context_free() started: new operations are refused */
	bool stop;     /* the io thread exits once the done queue is empty */
	uint64_t next_pipe_id;
	uint64_t next_req_id;
	uint64_t next_buf_id;
	struct tpc_map pipes; /* pipes the daemon still knows: id -> pipe */
	struct tpc_map reqs;  /* req_id -> struct tpc_req */
	struct tpc_map ops;   /* op_id -> struct tpc_op, while tp_cancel() can act on it */
	uint64_t next_op_id;
	struct tpu_list all_pipes;
	struct tpu_list listeners;
	struct tpu_list groups; /* struct tp_group (group.c), joined and not left */
	struct tpu_list done; /* completed ops, run in order by the io thread */
	struct tpc_buf **bufs; /* sorted by address */
	size_t n_bufs;
	size_t bufs_cap;
	uint64_t buf_bytes;
	struct tpu_list stage_pool;
	size_t n_pool;
	size_t pool_bytes;	/* bytes of staging buffers in stage_pool */
	/* Channel handles (struct tp_chan, chanmap.c): found by id for the daemon's notices;
	 * those that map lent items keep buffers of their own, released once idle by the io
	 * thread; @chan_own: those free buffers, all handles together; @chan_back: lent buffers
	 * notices gave back, for the io thread (tp_chan.back). */
	struct tpu_list chans;
	size_t chan_own;
	size_t chan_back;
	/* Writes waiting on @cond for a lent buffer back (chanwrite.c): a notice that gives one
	 * back wakes them. */
	unsigned chan_lend_waiters;
	/* When a free buffer was last put back (0: never): for a second after it the io thread
	 * waits with a timeout, so that a stream whose one buffer goes back and forth costs no
	 * wake-up per item (chanmap.c). */
	uint64_t chan_own_put_ns;
	bool io_untimed; /* the io thread waits with no timeout (it is woken for a first one) */

	/* CUDA (cuda.c): created by the first use of CUDA memory, NULL until then. cuda_lock
	 * guards it and is a leaf: nothing else is locked while it is held. */
	pthread_mutex_t cuda_lock;
	struct tpc_cuda *cuda;

	/* Pipe rings (pring.c, issue 27): the rings mapped, one thread each (lock); the fds the
	 * daemon sent on the socket for frames not yet read (RingXfer, ChanReply, GroupJoined;
	 * rx_lock). */
	struct tpu_list prings;
	unsigned n_prings;
	unsigned pring_max; /* rings it takes at most ($TPIPD_PIPE_RINGS_MAX) */
	int pring_fds[8];
	unsigned n_pring_fds;
};
#define TPC_PRING_FDS_MAX 8

/* ---- pipes, descriptors, listeners --------------------------------------------------------- */

/* The pipe's other end is on another host (its uid is only claimed). */
#define TPC_PIPE_REMOTE(p) ((p)->remote_uid_status == TP_UID_CLAIMED)

enum tpc_pipe_state {
	TPC_PIPE_CONNECTING,
	TPC_PIPE_OPEN,
	TPC_PIPE_FAILED, /* connect refused; PipeClosed still to come */
	TPC_PIPE_CLOSING, /* closed by the user; writes and reads wait for the daemon to confirm
			   * that no copy uses their memory (PipeClosed{CANCELED}) */
	TPC_PIPE_CLOSED, /* PipeClosed received or daemon connection lost: the daemon forgot it */
};

struct tp_pipe {
	struct tp_context *ctx;
	uint64_t id;
	enum tpc_pipe_state state;
	bool user_closed; /* tp_pipe_close() called: the daemon forgot it too */
	int refs;	  /* the user's handle + descriptors the user holds */
	int connect_status; /* 1 while connecting, then 0 or -errno */
	int err;	    /* why the pipe is unusable (first cause) */
	char *errmsg;
	char *remote_name;
	uid_t remote_uid;
	int remote_uid_status; /* -ENODATA, 0 or TP_UID_CLAIMED (tp_pipe_remote_uid()) */
	struct tpc_req connect_req;
	uint64_t next_write_id;
	struct tpu_list writes;	   /* pending write ops, write order */
	struct tpu_list reads;	   /* pending read ops, msg_id order */
	struct tpu_list desc_reqs; /* pending read_descriptor ops */
	struct tpu_list descs;	   /* descriptors not yet handed out */
	struct tpu_list held;	   /* descriptors the user holds, msg_id order */
	/* Flow control: Writes sent that the daemon has not returned with FlowCredit, and the
	 * writes held beyond that window (in p->writes too), sent in order as room returns. */
	uint32_t win_msgs;
	uint64_t win_bytes;
	struct tpu_list wheld;
	/* The daemon turned a write back (budget, far limits): nothing goes until FlowResume. */
	bool wait_resume;
	struct tpu_list ctx_link;
	struct tpu_list backlog_link; /* in a listener's backlog until accepted */
	struct tpc_op free_op;
	/* The daemon offered this pipe's writing end a ring (RingXfer.offer; this library has no
	 * CMA): writes of at least this many bytes name their memory by ring_addr. 0: none. */
	uint64_t ring_min;
};

struct tpc_desc {
	struct tp_descriptor pub;
	struct tp_pipe *pipe;
	size_t cap; /* bytes of the block, this struct included */
	uint64_t msg_id;
	bool eager;
	bool ring_only; /* the writer's memory goes only through the pipe ring: answer ring_addr */
	bool dropped; /* freed by the user out of order: discard when its turn comes */
	struct tpu_list node;
	const uint8_t *data; /* eager bytes: payloads then tensors */
	size_t data_len;
};

struct tp_listener {
	struct tp_context *ctx;
	uint64_t id;
	char *name;
	bool closed;
	bool user_closed;
	int err; /* why accepts fail (closed, connection lost) */
	struct tpc_req req;
	struct tpu_list link;	 /* ctx->listeners */
	struct tpu_list accepts; /* pending accept ops */
	struct tpu_list backlog; /* accepted pipes not yet handed out */
	struct tpc_op free_op;
};

/* ---- context.c ----------------------------------------------------------------------------- */

/* Reads the doorbell bytes on a ring context's socket until it is empty, keeping the fds that
 * come with them for RingXfer (ctx->pring_fds); rx_lock held. Return: 0, or -ECONNRESET at its
 * end. */
int tpc_context_drain_bells(struct tp_context *ctx);

/* Keeps the fds that came with @mh (SCM_RIGHTS) in ctx->pring_fds for the frames that announce
 * them (closed past TPC_PRING_FDS_MAX); rx_lock held. */
void tpc_context_keep_fds(struct tp_context *ctx, struct msghdr *mh);

/* True when called on @ctx's library thread (inside a callback or a frame handler). Borrows
 * @ctx. */
bool tpc_context_on_io_thread(const struct tp_context *ctx);
/* Wakes the io thread (eventfd). Borrows @ctx. */
void tpc_context_wake(struct tp_context *ctx);
/* Passes a line to the opt-in log handler, if any; @level is a syslog level. Borrows @ctx and
 * @fmt; the handler gets a line valid only during its call. */
void tpc_context_log(struct tp_context *ctx, int level, const char *fmt, ...) _printf_(3, 4);
/* Assigns a req id and files @req; lock held. Keeps @req (the caller's storage) in ctx->reqs
 * until @fn runs for it (its Reply, or connection loss), on the io thread with lock held. */
int tpc_context_req_start_locked(struct tp_context *ctx, struct tpc_req *req, tpc_reply_fn fn);
/* Waits for @req (lock held, dropped while waiting). Borrows @ctx and @req.
 * Return: req status, -ETIMEDOUT, dead err. */
int tpc_context_req_wait_locked(struct tp_context *ctx, struct tpc_req *req, int timeout_ms);
/* A tpc_reply_fn that records the result in @req and wakes waiters. Borrows @req and @r (NULL:
 * connection lost; its message is copied). */
void tpc_context_req_done(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r);
/* Returns 0 if the context accepts new operations, else -errno (message set). Lock held.
 * Borrows @ctx. */
int tpc_context_check_locked(struct tp_context *ctx);
/* Allocates an op of @kind with room for @n_copies copies.
 * Return: owned op, free with tpc_op_free() (or hand to the done queue), or NULL. */
struct tpc_op *tpc_op_new(enum tpc_op_kind kind, size_t n_copies);
/* Frees @op and its message. Takes @op. Accepts NULL. */
void tpc_op_free(struct tpc_op *op);
/* Moves a pending op to the done queue with @status and @msg (NULL: tp_strerror). Lock held.
 * Takes @op: the io thread runs its callback, then frees it. Borrows @msg (copied). */
void tpc_op_complete_locked(struct tp_context *ctx, struct tpc_op *op, int status, const char *msg);
/*
 * Records the result of @op, pending on the in-order @list, then completes the ops at the head
 * of @list whose results are known, so callbacks keep the list's order. Lock held. Borrows @list;
 * @op stays on it until completed, then goes to the done queue as tpc_op_complete_locked().
 * Borrows @msg (copied).
 */
void tpc_op_ready_locked(struct tp_context *ctx, struct tpu_list *list, struct tpc_op *op,
			 int status, const char *msg);
/* Unlinks and frees a pending @op: its callback will not run. Lock held. Takes @op. */
void tpc_op_cancel_locked(struct tp_context *ctx, struct tpc_op *op);
/*
 * tpc_op_track_locked() - give @op the context's next operation id (*@ret_id if not NULL)
 * and, if @cancellable, file it in ctx->ops for tp_cancel() until its result is known. Lock
 * held. Borrows @op, which ctx->ops keeps (not owned) until its result is known.
 * Return: 0 or -ENOMEM (message set; nothing changed).
 */
int tpc_op_track_locked(struct tp_context *ctx, struct tpc_op *op, bool cancellable,
			uint64_t *ret_id);
/* Absolute CLOCK_MONOTONIC deadline for pthread_cond_timedwait, @timeout_ms >= 0, into the
 * caller's @ts. */
void tpc_deadline(struct timespec *ts, int timeout_ms);
/*
 * Unpacks and validates the daemon frame @h whose message starts at @body (borrowed; the data
 * tail follows it). Return: 0 with *@ret owned (free with tpw_daemon_msg_free()), or -errno
 * with a sentence in @why.
 */
int tpc_context_decode(const struct tpw_hdr *h, const uint8_t *body, Tpw__V1__DaemonMsg **ret,
		       char *why, size_t why_len);
/* Starts @ctx's io thread (which takes no signals); the thread uses @ctx until
 * tp_context_free() joins it. Return: 0 or -errno (message set). */
int tpc_context_start_thread(struct tp_context *ctx);
/* Unmaps @ctx's control ring, if any; the context is back on the socket. Borrows @ctx. */
void tpc_context_ring_free(struct tp_context *ctx);

/* ---- wire.c -------------------------------------------------------------------------------- */

/* Sends @m plus @data as one frame (+ @fd by SCM_RIGHTS if >= 0); send_lock held. Borrows @m,
 * @data and @fd (sent, never closed: the caller still owns it). Return: 0 or -errno (the
 * connection is then shut down). */
int tpc_wire_send(struct tp_context *ctx, Tpw__V1__ClientMsg *m, const struct iovec *data,
		  size_t n_data, int fd);
/* Reads once into the receive buffer (io thread). Borrows @ctx.
 * Return: bytes, -EAGAIN, -ECONNRESET at EOF, -errno. */
int tpc_wire_fill(struct tp_context *ctx);
/*
 * tpc_wire_ring_take() - with a control ring and nothing buffered, takes the next frame out of
 * the ring if it is whole there: its header and message into the receive buffer (the message
 * at ctx->rbuf + TPW_HDR_SIZE), and its data tail too unless it is large and in one piece in
 * the ring; then @ret_tail points at the tail in the ring (else NULL: it follows the message).
 * Hand the frame back with tpc_wire_ring_done() before the next read. Borrows @ctx.
 * Return: 1 (@ret, @ret_tail filled), 0 (no whole frame there, or bytes buffered: use
 * tpc_wire_fill()), -errno if malformed.
 */
int tpc_wire_ring_take(struct tp_context *ctx, struct tpw_hdr *ret, const uint8_t **ret_tail);
/* Ends the frame of tpc_wire_ring_take(): releases a tail left in the ring (@tail, its pointer
 * then invalid) and empties the receive buffer. Borrows @h. */
void tpc_wire_ring_done(struct tp_context *ctx, const struct tpw_hdr *h, const uint8_t *tail);
/* After frames were taken with tpc_wire_ring_take(): wakes a daemon that waits for room. */
void tpc_wire_ring_room(struct tp_context *ctx);
/* Return: 1 and the header (into the caller's @ret) if a whole frame is buffered, 0 if not yet,
 * -errno if malformed. Borrows @ctx. */
int tpc_wire_peek(struct tp_context *ctx, struct tpw_hdr *ret);
/* Drops the frame @h (the one tpc_wire_peek() returned) from the receive buffer: pointers into
 * that frame (a body, a data tail) are invalid afterwards. Borrows @h. */
void tpc_wire_consume(struct tp_context *ctx, const struct tpw_hdr *h);
/* Sends a frame whose message is already packed (@body, @body_len) plus @data; send_lock held.
 * Borrows @body and @data for the call. */
int tpc_wire_send_packed(struct tp_context *ctx, const uint8_t *body, size_t body_len,
			 const struct iovec *data, size_t n_data);
/* Sends a message without data; send_lock held. Borrows @ctx. */
int tpc_wire_send_pipe_close(struct tp_context *ctx, uint64_t pipe_id);
/* SessionEnd{CLOSED}: tp_context_free() ends the session on purpose (daemon minor >= 4).
 * Borrows @ctx. */
int tpc_wire_send_session_end(struct tp_context *ctx);

/* ---- pipe.c -------------------------------------------------------------------------------- */

/* A pipe with one reference (the user's), filed in ctx->all_pipes; lock held. Keeps @ctx (the
 * context outlives its pipes). Return: owned reference, drop with tpc_pipe_unref_locked(); NULL
 * without memory. */
struct tp_pipe *tpc_pipe_new(struct tp_context *ctx, uint64_t id);
/*
 * Local close. @user: the user's tp_pipe_close(): descriptor requests are canceled at once,
 * writes and reads once the daemon acknowledges the close (the pipe stays in CLOSING until
 * then), and the user's reference is dropped after them. Without @user (a backlog pipe nobody
 * accepted), the id is forgotten at once. Borrows @p (the user's reference goes later, by the
 * pipe's free op). Return: true if PipeClose must be sent.
 */
bool tpc_pipe_close_locked(struct tp_pipe *p, bool user);
/* Returns 0 if operations may be started on @p, else its error (message set). Lock held.
 * Borrows @p. */
int tpc_pipe_check_locked(struct tp_pipe *p);
/* True while the daemon knows the pipe (frames about it may be sent). Lock held. Borrows @p. */
bool tpc_pipe_at_daemon(const struct tp_pipe *p);
/* Drops a reference (takes one reference of @p); the last one frees @p and its descriptors.
 * Lock held. */
void tpc_pipe_unref_locked(struct tp_pipe *p);
/* Marks @p closed with @err and fails its pending operations; lock held. Borrows @p and @msg
 * (copied). */
void tpc_pipe_fail_locked(struct tp_pipe *p, int err, const char *msg);
/* Handlers of daemon events, called by the io thread with lock held. Borrow @ctx and the message
 * (valid only during the call). */
void tpc_pipe_on_closed(struct tp_context *ctx, const Tpw__V1__PipeClosed *m);
/* Frees every pipe (context teardown, io thread stopped), whatever references remain. */
void tpc_pipe_free_all(struct tp_context *ctx);

/* ---- write.c / read.c ---------------------------------------------------------------------- */

/* Handlers of daemon events, called by the io thread with lock held. They borrow @ctx, the
 * message and @tail (valid only during the call: a descriptor copies the bytes it keeps). */
void tpc_write_on_done(struct tp_context *ctx, const Tpw__V1__WriteDone *m);
/* FlowCredit: returns room in the pipe's write window. Return: true if held writes of that
 * pipe may now go (tpc_write_pump()). */
bool tpc_write_on_credit(struct tp_context *ctx, const Tpw__V1__FlowCredit *m);
/* FlowResume for pipe @pipe_id (daemon-wide budget): answers it, then sends the held writes
 * as tpc_write_pump(). Takes send_lock and lock; neither may be held. */
void tpc_write_resume(struct tp_context *ctx, uint64_t pipe_id);
/* Sends the held writes of pipe @pipe_id that fit its window, in order. Takes send_lock and
 * lock; neither may be held. */
void tpc_write_pump(struct tp_context *ctx, uint64_t pipe_id);
/* Drops a reference to a write's frame (takes one reference of @h; the last one frees it).
 * Accepts NULL. */
void tpc_write_held_free(struct tpc_held_write *h);
void tpc_read_on_descriptor(struct tp_context *ctx, const Tpw__V1__Descriptor *m,
			    const uint8_t *tail, size_t tail_len);
void tpc_read_on_done(struct tp_context *ctx, const Tpw__V1__ReadDone *m);
/* Hands queued descriptors to pending read_descriptor calls; lock held. Borrows @p. */
void tpc_read_match_locked(struct tp_pipe *p);
/* tp_pipe_read_descriptor() that also returns the op (borrowed, valid while it is pending)
 * and its id (either may be NULL). Borrows @p; @cb runs once, on the io thread, with @arg. */
int tpc_read_descriptor_start(struct tp_pipe *p, tp_descriptor_fn cb, void *arg,
			      struct tpc_op **ret_op, uint64_t *ret_id);
/* Unlinks and frees a descriptor without telling the daemon. Takes @d. Accepts NULL. */
void tpc_read_desc_free(struct tpc_desc *d);
void tpc_read_desc_keep_free(struct tp_context *ctx);

/* ---- listener.c ---------------------------------------------------------------------------- */

/* Accepted event (lock held). *ret_reject: a pipe id to refuse with PipeClose after unlock.
 * Borrows @ctx and @m (valid only during the call). */
void tpc_listener_on_accepted(struct tp_context *ctx, const Tpw__V1__Accepted *m,
			      uint64_t *ret_reject);
/* Fails pending accepts with @err (connection loss, context teardown); lock held. Borrows @ctx
 * and @msg (copied). */
void tpc_listener_fail_all_locked(struct tp_context *ctx, int err, const char *msg);
/* Frees every listener (context teardown, io thread stopped). Borrows @ctx. */
void tpc_listener_free_all(struct tp_context *ctx);
/* tp_listener_accept() that also returns the op (borrowed, valid while it is pending) and
 * its id (either may be NULL). Borrows @l; @cb runs once, on the io thread, with @arg. */
int tpc_listener_accept_start(struct tp_listener *l, tp_accept_fn cb, void *arg,
			      struct tpc_op **ret_op, uint64_t *ret_id);
/* Unlinks and frees @l (lock held, or teardown). Takes @l. Accepts NULL. */
void tpc_listener_free(struct tp_listener *l);

/* ---- buffer.c ------------------------------------------------------------------------------ */

/* Finds the registered (non-staging) buffer holding [ptr, ptr+len); lock held. @ptr is only
 * compared. Return: borrowed buffer, valid while lock is held (until it is unregistered), or
 * NULL. */
struct tpc_buf *tpc_buffer_lookup_locked(struct tp_context *ctx, const void *ptr, size_t len);

/*
 * tpc_buffer_check_range_locked() - refuses a range that starts inside a registered buffer and
 * runs past its end (it would otherwise go by CMA and fail later with -EFAULT). Lock held.
 * Borrows @what; @ptr is only compared.
 * @what, @idx: the segment, for the error text ("payload", 2: "payload 2"), formatted only
 * on failure (this runs for every segment of every message).
 * Return: 0 (inside one buffer, or in none), or -ERANGE (tp_last_error() says why).
 */
int tpc_buffer_check_range_locked(struct tp_context *ctx, const void *ptr, size_t len,
				  const char *what, size_t idx);
/* A registered staging buffer of >= @size bytes; send_lock held, lock not held.
 * @ret: returns owned buffer, give back with tpc_buffer_stage_put(). Return: 0 or -errno. */
int tpc_buffer_stage_get(struct tp_context *ctx, size_t size, struct tpc_buf **ret);
/* Returns a staging buffer (to the pool if @reuse, never a channel's own buffer: that one is
 * released); no lock held. Takes @b. Accepts NULL. */
void tpc_buffer_stage_put(struct tp_context *ctx, struct tpc_buf *b, bool reuse);
/* The bytes of the staging buffer (or channel buffer) made for @size bytes: the next power of
 * two from 64 KiB; UINT64_MAX if none. */
uint64_t tpc_buffer_stage_class(uint64_t size);
/*
 * tpc_buffer_chan_new() - a new buffer of at least @size bytes for one channel handle to stage
 * its items in and lend (issue 25 part map): a fresh memfd (zeros), registered with the daemon
 * as a staging buffer whose fd it keeps (BufferRegister.chan_map), then, once the daemon has
 * mapped it, sealed with F_SEAL_FUTURE_WRITE: no fd of it, the read-only ones readers get
 * included, can map it writable or write it; only this mapping writes it. Never in the staging
 * pool. Not on the io thread (it waits for the registration). No lock held.
 * @ret: returns owned buffer, release with tpc_buffer_stage_put(ctx, b, false).
 * Return: 0 or -errno (-EWOULDBLOCK on the io thread).
 */
int tpc_buffer_chan_new(struct tp_context *ctx, size_t size, struct tpc_buf **ret);
/* Milliseconds until the least recently used free staging buffer has been idle long enough to
 * be released (0: now), or -1 when none is free (poll() timeout of the io thread). Lock held. */
int tpc_buffer_pool_timeout_locked(struct tp_context *ctx);
/* Releases the free staging buffers that have been idle long enough (io thread, no lock held).
 * Borrows @ctx. */
void tpc_buffer_pool_expire(struct tp_context *ctx);
/* Unmaps every buffer (context teardown). Borrows @ctx. */
void tpc_buffer_free_all(struct tp_context *ctx);

/* ---- cuda.c -------------------------------------------------------------------------------- */

/* A CUDA tensor or slot as the caller gave it. */
struct tpc_cuda_mem {
	void *data;
	size_t length;
	int device;    /* the ordinal the memory must be on; -1: any */
	void *stream;  /* CUstream; NULL: the legacy default stream */
	char what[32]; /* "tensor 3", for messages */
	bool remote;   /* for a pipe to another host: hand the daemon a dma-buf of it (RDMA) */
};

/* The CudaRef of one segment and the bytes it points to. */
struct tpc_cuda_seg {
	Tpw__V1__CudaRef ref;
	uint8_t mem_handle[TPW_CUDA_HANDLE_BYTES];
	uint8_t event_handle[TPW_CUDA_HANDLE_BYTES];
	char bus_id[TPW_BUS_ID_MAX + 1];
	uint8_t uuid[TPW_CUDA_UUID_BYTES]; /* the device's, if @has_uuid */
	bool has_uuid;
};

/*
 * tpc_cuda_check() - whether CUDA memory can be used here: libtpclient built with CUDA, the
 * CUDA driver loadable (loads it on first use), and with @daemon, a daemon that speaks protocol
 * minor >= TPW_MINOR_CUDA. Makes no call on any CUDA context. Borrows @ctx.
 * Return: 0, or -EOPNOTSUPP with the reason as the thread's error message.
 */
int tpc_cuda_check(struct tp_context *ctx, bool daemon);

/*
 * tpc_cuda_export() - describe @m as a CUDA segment: the IPC handle of the allocation that
 * contains it (cached per context), its offset, its device's PCI bus id, and an interprocess
 * event recorded on @m->stream now (one per CUDA context and stream in @ret_events; if the
 * context already holds the most events it may, the stream is synchronized instead and the
 * segment names no event). With @m->remote, the first time for an allocation of whole pages
 * on a device that exports dma-bufs and a daemon of minor >= TPW_MINOR_CUDA_DMABUF, it also
 * exports the dma-buf of the whole allocation and hands it to the daemon (CudaDmabuf, sent
 * ahead of the caller's frame) for RDMA registration; a failure there only leaves the daemon
 * its other ways. No lock held; call tpc_cuda_check() first. Borrows @ctx and @m.
 * @cs: filled; @s points into it afterwards, so it must outlive the frame's sending.
 * @s: becomes a Segment{length, cuda}.
 * @ret_events: the operation's events; the new one is added (owned by the operation, given
 * back by tpc_cuda_events_put()), also when a later segment fails.
 * Return: 0; -EINVAL (not device memory of @m->device, or memory CUDA IPC cannot share);
 * -ERANGE (the range leaves its allocation); other -errno from the driver. The message is
 * set.
 */
int tpc_cuda_export(struct tp_context *ctx, const struct tpc_cuda_mem *m, struct tpc_cuda_seg *cs,
		    Tpw__V1__Segment *s, struct tpc_cuda_event **ret_events);

/*
 * tpc_cuda_copy_in() - copy @m->length bytes from host memory @src to the device memory @m on
 * @m->stream, and wait for that stream (eager bytes read into a CUDA slot). No lock held; call
 * tpc_cuda_check() first. Borrows @src.
 * @ret_status: 0, or the -errno of a failed copy or wait (message set): the read's status.
 * Return: 0 (see @ret_status); -EINVAL or -ERANGE if @m cannot be a destination, -errno if its
 * context cannot be made current; nothing was copied then.
 */
int tpc_cuda_copy_in(struct tp_context *ctx, const struct tpc_cuda_mem *m, const void *src,
		     int *ret_status);

/*
 * tpc_cuda_copy_out() - copy @m->length bytes of the device memory @m to host memory @dst on
 * @m->stream, after the work queued on it, and wait for that stream. As tpc_cuda_copy_in(),
 * the other way. Borrows @dst.
 */
int tpc_cuda_copy_out(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *dst,
		      int *ret_status);

/*
 * tpc_cuda_fold() - @fn(device copy of @acc, device copy of @in, @n, @dt, @m->stream, @user),
 * then the result back into @acc: in @m's context (@m names the call's device memory, its
 * device and stream), scratch device memory of 2 x @m->length bytes allocated and freed here,
 * the copies and @fn's work on @m->stream, waited for. Borrows everything.
 * Return: 0 or -errno (message set: the failed call).
 */
int tpc_cuda_fold(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *acc, const void *in,
		  size_t n, enum tp_dtype dt, tp_reduce_cuda_fn fn, void *user);

/* Gives the events of an operation back to their pools. Takes @list. Any lock may be held. */
void tpc_cuda_events_put(struct tpc_cuda_event *list);

/* Events recorded for one export that several operations name (a Broadcast's deliveries). */
struct tpc_cuda_shared {
	unsigned refs; /* atomic */
	struct tpc_cuda_event *events;
};

/* Takes a reference on @sh (NULL: nothing). Return: @sh. */
struct tpc_cuda_shared *tpc_cuda_shared_ref(struct tpc_cuda_shared *sh);
/* Drops a reference on @sh (NULL: nothing); the last gives its events back and frees it. Any
 * lock may be held. */
void tpc_cuda_shared_unref(struct tpc_cuda_shared *sh);

/* Destroys the pooled events (in their CUDA contexts) and the cache; no CUDA call if the
 * context never used CUDA memory. Context teardown, after every operation was freed. Borrows
 * @ctx (frees only what it holds for CUDA). */
void tpc_cuda_free(struct tp_context *ctx);

/* ---- group.c ------------------------------------------------------------------------------- */

/* The daemon's answer to a GroupJoin: completes the waiting join (lock held, io thread). Borrows
 * @m. */
void tpc_group_on_joined(struct tp_context *ctx, const Tpw__V1__GroupJoined *m);
/* The daemon connection is lost: fail every group of @ctx for all its members, naming this one
 * (the daemon can no longer tell them). Lock held. */
void tpc_group_fail_all_locked(struct tp_context *ctx);
/* The daemon's answer to a ChanOp: completes the waiting call with the item in @tail (lock held,
 * io thread). Borrows @m and @tail. */
void tpc_chan_on_reply(struct tp_context *ctx, const Tpw__V1__ChanReply *m, const uint8_t *tail,
		       size_t tail_len);
/* The next idle channel buffer to release (as tpc_buffer_pool_timeout_locked(): ms, 0 now, -1
 * none; lock held) and their release (io thread, no lock held; chanmap.c). */
int tpc_chan_own_timeout_locked(struct tp_context *ctx);
void tpc_chan_own_expire(struct tp_context *ctx);
/* The io thread, lock not held: the lent buffers notices gave back (tp_context.chan_back)
 * handled as a write's answer's are: kept by their handle for its next batches, or released
 * (a handle's own), or put back into the staging pool. */
void tpc_chan_back_run(struct tp_context *ctx);
/* The daemon's answer to a WqOp (wq.c): completes the waiting call with the payload in @tail
 * (lock held, io thread). Borrows @m and @tail. */
void tpc_wq_on_reply(struct tp_context *ctx, const Tpw__V1__WqReply *m, const uint8_t *tail,
		     size_t tail_len);

/* ---- errors.c ------------------------------------------------------------------------------ */

/* Records a message for tp_last_error() on this thread and returns @err. Borrows @fmt (the
 * message is formatted into thread-local storage). */
int tpc_error(int err, const char *fmt, ...) _printf_(2, 3);
/* Records @msg (or tp_strerror(@err) if NULL) and returns @err. Borrows @msg (copied). */
int tpc_error_msg(int err, const char *msg);

/* ---- slurm.c: bootstrap from Slurm's environment ------------------------------------------- */

/* Bounds on what the environment may make the library hold (docs/slurm.md). */
#define TPC_SLURM_LIST_MAX 131072u    /* characters of one host list (the kernel's MAX_ARG_STRLEN) */
#define TPC_SLURM_HOSTS_MAX 65536u    /* hosts in one expanded list */
#define TPC_SLURM_NAME_MAX 255u	      /* characters of one host name */
#define TPC_SLURM_SPAN_MAX 65536u     /* values of one range lo-hi (Slurm's MAX_RANGE) */
#define TPC_SLURM_GROUPS_MAX 4u	      /* bracket groups in one element: rack[1-2]n[1-4] is 2 */
#define TPC_SLURM_DIGITS_MAX 18u      /* digits of one number in a bracket */
#define TPC_SLURM_RANKS_MAX (1u << 20) /* tasks of one step */
#define TPC_SLURM_KEY_MAX 32u	      /* "slurm:<job>.<step>" and its NUL */

/* An expanded host list: @n names, back to back in @names, each NUL-terminated. */
struct tpc_hostlist {
	uint32_t n;
	uint32_t *off; /* name i starts at names + off[i] */
	char *names;
};

/*
 * tpc_slurm_hostlist_parse() - expand a Slurm host list ("gn[01-04,10],gpu7").
 * @s: the list: elements separated by ',', each a name or a name with up to
 *     TPC_SLURM_GROUPS_MAX bracket groups of numbers and ranges (zero padding is kept, the
 *     width being that of the range's first number); nothing may follow the last ']'.
 * @ret: the expanded list, in order (duplicates are kept, as Slurm keeps them).
 *
 * Names hold letters, digits, '.', '-' and '_' only; empty elements, whitespace, nested or
 * unbalanced brackets, descending or signed ranges and Slurm's 3-D "box" ranges are refused.
 * Ownership: borrows @s; returns owned @ret, free with tpc_slurm_hostlist_free().
 * Return: 0; -EINVAL (syntax), -EMSGSIZE (list, name or number too long), -ENOBUFS (too many
 * hosts, groups or values in a range), -ENOMEM; tp_last_error() says where and why.
 */
int tpc_slurm_hostlist_parse(const char *s, struct tpc_hostlist **ret);
/* Frees @hl (NULL is fine). Takes @hl. */
void tpc_slurm_hostlist_free(struct tpc_hostlist *hl);
/* Return: name @i (< hl->n) of @hl, a borrowed pointer valid until @hl is freed. */
const char *tpc_slurm_hostlist_name(const struct tpc_hostlist *hl, uint32_t i);

/*
 * tpc_slurm_tasks_parse() - expand a tasks-per-node list ("2(x3),1": 2, 2, 2, 1).
 * @s: elements separated by ',', each COUNT or COUNT(xREPEAT), both >= 1.
 * @nodes: how many nodes the list must describe (the node list's length).
 * @ret: @nodes counts, in node order; @ret_total (may be NULL): their sum.
 * Ownership: borrows @s; returns owned @ret, free with free().
 * Return: 0; -EINVAL (syntax, or not @nodes nodes), -ENOBUFS (over TPC_SLURM_HOSTS_MAX nodes
 * or TPC_SLURM_RANKS_MAX tasks), -ENOMEM; tp_last_error() says why.
 */
int tpc_slurm_tasks_parse(const char *s, uint32_t nodes, uint32_t **ret, uint32_t *ret_total);

/* The variables read, each NULL when unset (tpc_slurm_vars_from_env() fills them). */
struct tpc_slurm_vars {
	const char *job_id;		/* SLURM_JOB_ID, else SLURM_JOBID */
	const char *step_id;		/* SLURM_STEP_ID, else SLURM_STEPID */
	const char *procid;		/* SLURM_PROCID */
	const char *ntasks;		/* SLURM_NTASKS */
	const char *nprocs;		/* SLURM_NPROCS */
	const char *step_num_tasks;	/* SLURM_STEP_NUM_TASKS */
	const char *localid;		/* SLURM_LOCALID */
	const char *nodeid;		/* SLURM_NODEID */
	const char *step_nodelist;	/* SLURM_STEP_NODELIST */
	const char *job_nodelist;	/* SLURM_JOB_NODELIST, else SLURM_NODELIST */
	const char *step_tasks_per_node; /* SLURM_STEP_TASKS_PER_NODE */
	const char *tasks_per_node;	/* SLURM_TASKS_PER_NODE */
};

/* What a task of a Slurm step is: its place in the step and where the group meets. */
struct tpc_slurm {
	uint32_t job_id, step_id;
	uint32_t rank, size;		/* SLURM_PROCID, the step's task count */
	uint32_t local_rank, local_size; /* SLURM_LOCALID, the tasks on this node */
	uint32_t node, nodes;		/* SLURM_NODEID, the step's node count */
	char key[TPC_SLURM_KEY_MAX];	/* the group's key, "slurm:<job>.<step>" */
	char coordinator[TPC_SLURM_NAME_MAX + 1]; /* first host of the step's node list */
	char node_name[TPC_SLURM_NAME_MAX + 1];   /* this task's host in that list */
};

/* Fills @ret from getenv() (pointers into the environment, valid while it is unchanged). */
void tpc_slurm_vars_from_env(struct tpc_slurm_vars *ret);
/* True when SLURM_JOB_ID (or SLURM_JOBID) and SLURM_PROCID are both set: a Slurm task. */
bool tpc_slurm_detected(const struct tpc_slurm_vars *v);

/*
 * tpc_slurm_from_vars() - derive a task's place from Slurm's variables, all hostile input.
 * @v: the variables; the task count is SLURM_STEP_NUM_TASKS, SLURM_NTASKS or SLURM_NPROCS
 *     (those set must agree); the node list the step's, else the job's; tasks per node the
 *     step's, else the job's. Both lists must describe the same number of nodes.
 * @ret: written only on success.
 * Checks rank < size, node < nodes, local rank < the node's task count and that the counts
 * add up to size. Ownership: borrows @v.
 * Return: 0; -ENOENT (a variable is missing), -EINVAL (malformed or inconsistent), the
 * errors of the list parsers; tp_last_error() names the variable and the reason.
 */
int tpc_slurm_from_vars(const struct tpc_slurm_vars *v, struct tpc_slurm *ret);
/* tpc_slurm_from_vars() over this process's environment. Return: as that. */
int tpc_slurm_from_env(struct tpc_slurm *ret);

/* ---- pring.c (pipe rings, issue 27) -------------------------------------------------------- */

/*
 * tpc_pring_on_xfer() - RingXfer @x from the daemon (the frame's reader, rx_lock held, lock not
 * held): queue its copy on the pipe direction's ring thread (mapping the ring from the fd that
 * came before it when new); the op it names waits (copying) until the copy ended. A transfer it
 * cannot take is answered RingDone with the error. Borrows @ctx and @x.
 */
void tpc_pring_on_xfer(struct tp_context *ctx, const Tpw__V1__RingXfer *x);
/* The next fd the daemon sent ahead of a frame (RingXfer, ChanReply.map_fd,
 * GroupJoined.arena_fd); rx_lock held.
 * Return: owned fd, or -ENOENT. */
int tpc_pring_take_fd(struct tp_context *ctx);
/* Pipe @pipe_id is gone (PipeClosed, or closed here): its rings' threads give up their copies
 * at once, by a flag of this process, and free them; lock held. */
void tpc_pring_pipe_gone_locked(struct tp_context *ctx, uint64_t pipe_id);
/* Stops every ring thread and waits until they freed their rings; no lock held. Borrows @ctx. */
void tpc_pring_free_all(struct tp_context *ctx);
/* @op completes (lock held): if a ring's thread still copies it, the daemon gave that ring up
 * (the other end failed it, or declined it): the thread stops now, by this process's flag,
 * whatever the other end writes in the ring, and the op's callback no longer waits for it. */
void tpc_pring_op_done_locked(struct tp_context *ctx, struct tpc_op *op);
/* Sets how many rings @ctx takes at most from $TPIPD_PIPE_RINGS_MAX (unset or empty: 64).
 * Return: 0, or -EINVAL (tp_last_error() says why) for a value that is not 0..4096. */
int tpc_pring_env(struct tp_context *ctx);

#endif
