/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libtpclient: the public C API of tpipd. A process creates a context (one Unix-socket session
 * with the local tpipd), listens on names, connects pipes, and writes and reads messages made of
 * metadata, payloads and tensors. The daemon moves the bytes; this library never opens a network
 * connection. Modelled on TensorPipe: a reader first gets a descriptor, then supplies an
 * allocation, and only then do bytes move.
 *
 * Threads: every function is thread safe. Callbacks run on one library-owned thread per context,
 * exactly once per accepted call, in order per pipe, and never inside the call that started
 * them. Blocking (_sync) variants must not be called from a callback (they return -EDEADLK).
 *
 * Errors: functions return 0 (or a count) on success and a negative errno on failure. An async
 * call that returns 0 fires its callback exactly once, later; one that returns < 0 never does.
 * Callbacks receive the status and, when it is an error, a readable message. Notable codes:
 *   -ENOENT     no such listener            -EACCES     refused by the listener's access policy
 *   -EPIPE      the remote end closed       -ECONNRESET the remote process died ("peer died")
 *   -ECANCELED  closed or tp_cancel()ed, here or (for that message) by the other end
 *   -ERANGE     buffer range outside registered memory
 *   -EMSGSIZE   over a size limit           -ENOBUFS    over a count or queue limit
 *   -ECONNABORTED an administrator closed this session or the other end's (tpipctl)
 *   -ECONNREFUSED / -ENOENT from tp_context_new(): no daemon listens on the socket
 * tp_last_error() gives the message of the last failed call on the calling thread.
 *
 * Memory: a payload, tensor or allocation that lies inside memory from tp_buffer_alloc() moves
 * with one copy (daemon <-> shared mapping). Other CPU memory is read or written by the daemon
 * through cross-memory attach, or staged through a shared buffer when that is not permitted. A
 * range that starts inside a buffer from tp_buffer_alloc() but runs past its end is refused at
 * once with -ERANGE (tp_pipe_write(), tp_pipe_read()).
 * Buffers passed to a write or read are kept (must stay valid and untouched) until its callback;
 * once the callback has run, whatever its status, the daemon no longer touches them.
 */
#ifndef TPCLIENT_H
#define TPCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_API_VERSION_MAJOR 0
/* 2: CUDA tensors (cuda_stream fields, tp_cuda_release()); 3: tp_cancel() and the _ex start
 * calls, tp_pipe_write_sync_timeout(), tp_pipe_read_sync_timeout(), reply_timeout_ms */
#define TP_API_VERSION_MINOR 3

struct tp_context;
struct tp_listener;
struct tp_pipe;

enum tp_device_type {
	TP_DEVICE_CPU = 0,
	TP_DEVICE_CUDA = 1,
};

struct tp_device {
	enum tp_device_type type;
	int index; /* CUDA device ordinal; 0 for CPU */
};

/* ---- context ------------------------------------------------------------------------------ */

enum tp_context_flags {
	/* Never use cross-memory attach: private memory is staged through shared buffers. */
	TP_CONTEXT_NO_CMA = 1u << 0,
	/* Keep every frame on the Unix socket: no shared-memory control ring. */
	TP_CONTEXT_NO_RING = 1u << 1,
	/* Never spin: every wait for the daemon sleeps at once (lowest CPU, highest latency). */
	TP_CONTEXT_NO_SPIN = 1u << 2,
};

struct tp_context_options {
	size_t size;		 /* sizeof(struct tp_context_options): set it, for growth */
	const char *socket_path; /* NULL: $TPIPD_SOCKET, /run/tpipd/tpipd.sock (root),
				  * $XDG_RUNTIME_DIR/tpipd.sock and, when that is
				  * missing, /run/tpipd/tpipd.sock (libtpclient(3)) */
	const char *name;	 /* shown as remote name to peers; NULL: "<comm>:<pid>" */
	size_t eager_max;	 /* messages with at most this many data bytes travel inline
				  * with their descriptor; 0: 64 KiB, or an eighth of the
				  * control ring if that is less; capped by the daemon */
	uint32_t flags;		 /* enum tp_context_flags */
	/* Shared-memory control ring between this process and the daemon, bytes per direction
	 * (a power of two, 4 KiB..64 MiB; 0: $TPIPD_RING_BYTES if set, else 512 KiB; the
	 * variable set to 0 means TP_CONTEXT_NO_RING). Falls back to the socket if the daemon
	 * refuses it. */
	uint32_t ring_bytes;
	/* Waits for the daemon poll for up to this many microseconds before they sleep, and
	 * adapt below it when answers come slower (0: $TPIPD_SPIN_US if set, else 100; the
	 * variable set to 0 means TP_CONTEXT_NO_SPIN). */
	uint32_t spin_us;
	/* How long a call waits for the daemon's answer to a request before it gives up with
	 * -ETIMEDOUT naming the call, in milliseconds (0: 10000): the Hello of tp_context_new(),
	 * tp_listen(), tp_buffer_alloc(), and room on the daemon socket (or control ring) for any
	 * frame: a daemon that stops reading that long is taken as hung, the connection is
	 * dropped and pending operations fail as on a lost daemon connection. Added in API 0.3;
	 * a caller built before (smaller @size) gets the default. */
	uint32_t reply_timeout_ms;
};

/*
 * tp_context_new() - connect to the local tpipd and start the callback thread.
 * @opts: NULL for defaults (borrowed).
 * @ret: returns owned context, free with tp_context_free().
 * Return: 0; -ENOENT / -ECONNREFUSED when no daemon runs at the socket path; -ETIMEDOUT when
 * the daemon does not answer within reply_timeout_ms; -EPROTONOSUPPORT on a protocol version
 * mismatch; -ENOBUFS when the daemon refuses the session for one of its
 * session limits (tp_last_error() names it: per uid, in total, slots kept for admins); other
 * -errno.
 */
int tp_context_new(const struct tp_context_options *opts, struct tp_context **ret);

/*
 * tp_context_free() - close every pipe and listener of @ctx, complete their pending operations
 * with -ECANCELED (callbacks run before this returns), release shared buffers, disconnect.
 * It waits for the daemon to confirm that no copy uses the memory of pending writes and reads,
 * at most 10 s (a hung daemon: then it disconnects anyway). Must not be called from a
 * callback. Accepts NULL.
 */
void tp_context_free(struct tp_context *ctx);

/* Returns borrowed string, valid until tp_context_free(): the context's name. */
const char *tp_context_name(const struct tp_context *ctx);

/* True if the daemon can reach this process's memory by cross-memory attach. It turns false for
 * good once the daemon is refused access (say the process changed its uid or exec'd a setuid
 * binary): the writes and reads then in flight with private memory fail, later ones stage it
 * through shared buffers. */
bool tp_context_cma_ok(const struct tp_context *ctx);

/*
 * tp_context_transport() - how this context talks to the daemon: "ring" (shared-memory control
 * ring, see tp_context_options.ring_bytes) or "unix" (every frame on the Unix socket: the ring
 * was turned off, refused by the daemon, or the daemon predates it).
 * Return: a static string.
 */
const char *tp_context_transport(const struct tp_context *ctx);

/* Opt-in diagnostics: @fn is called (on any thread) with a syslog level and a line. Without a
 * handler the library is silent, unless TPIPD_LOG=debug|info|warn is set: then lines at that
 * level and above go to stderr as "tpclient[PID]: CONTEXT: LEVEL: text". */
typedef void (*tp_log_fn)(void *arg, int level, const char *line);
void tp_context_set_log(struct tp_context *ctx, tp_log_fn fn, void *arg);

/* ---- errors ------------------------------------------------------------------------------- */

/* Returns a static description of @err (negative errno), e.g. -ECONNRESET -> "peer died". It is
 * generic (-ECONNREFUSED: "connection refused: nothing listens at that address"); the message
 * of tp_last_error() or of a callback says which socket, peer or limit. */
const char *tp_strerror(int err);

/* Returns the message of the last failed call made by this thread (thread-local, never NULL); it
 * holds the daemon's longest message (1024 bytes) whole, with context the library adds. */
const char *tp_last_error(void);

/* ---- shared buffers ----------------------------------------------------------------------- */

/*
 * tp_buffer_alloc() - allocate @size bytes of shared memory, registered with the daemon, so
 * that data written from or read into it moves without a copy on this side.
 * @ret: returns the mapping's address (page aligned), free with tp_buffer_free().
 * Return: 0; -ENOBUFS over the daemon's buffer limits; -ENOMEM; -ETIMEDOUT when the daemon
 * does not answer within reply_timeout_ms; other -errno.
 */
int tp_buffer_alloc(struct tp_context *ctx, size_t size, void **ret);

/*
 * tp_buffer_free() - unregister and unmap a buffer from tp_buffer_alloc(). Must not be called
 * while an operation using the buffer is pending. Accepts NULL @ptr.
 * Return: 0, -EINVAL if @ptr is not the start of a buffer of @ctx.
 */
int tp_buffer_free(struct tp_context *ctx, void *ptr);

/* ---- CUDA memory -------------------------------------------------------------------------- */

/*
 * CUDA tensors and slots (device TP_DEVICE_CUDA) travel as a CUDA IPC handle of the whole
 * allocation that contains them plus their offset in it, with an IPC event recorded on their
 * stream; the daemon maps the allocation once and keeps it mapped for later messages. The
 * library needs no link-time CUDA dependency: it uses the process's CUDA driver
 * (libcuda.so.1) at run time. Memory from the stream-ordered allocator (cudaMallocAsync) and
 * from cuMemCreate cannot be shared this way and is refused with -EINVAL.
 */

/*
 * tp_cuda_release() - tell the daemon to drop its mapping of the CUDA allocation containing
 * @ptr. Call it before freeing (cudaFree) device memory that a pipe wrote from or read into:
 * while the daemon holds its mapping the driver keeps the memory allocated. The daemon also
 * drops mappings when the context ends and keeps at most a bounded number per context.
 * Must not be called while an operation using that allocation is pending.
 * Return: 0 (also when the daemon never mapped it); -EINVAL if @ptr is not CUDA device memory;
 * -EOPNOTSUPP without a CUDA driver; other -errno.
 */
int tp_cuda_release(struct tp_context *ctx, void *ptr);

/* ---- listeners ---------------------------------------------------------------------------- */

enum tp_access {
	TP_ACCESS_OWNER = 0,  /* the listener's uid and root may connect (default) */
	TP_ACCESS_GROUP = 1,  /* also members of @gid */
	TP_ACCESS_ANYONE = 2, /* every local user */
};

/*
 * Who on other hosts may open pipes (tpip://THISHOST/NAME) to a listener. A process on another
 * host is never one of this host's users: the daemon decides on the peer link's authenticated
 * identity only, and the uid that host's daemon claims for its process is informational.
 */
enum tp_remote_access {
	TP_REMOTE_NONE = 0,	/* pipes from this host only (default) */
	TP_REMOTE_ANY_PEER = 1, /* any peer daemon this daemon accepted a link from */
	TP_REMOTE_PEERS = 2,	/* only links authenticated as one of @remote_peers */
};
/* An entry of @remote_peers: "psk" (any daemon that proved the pre-shared key), "cert:HOST"
 * (a daemon whose certificate from the cluster CA names HOST, a DNS name or an IP address), or
 * an identity exactly as `tpipctl peers` shows it ("cert:CN=gpu17,DNS:gpu17.cluster"). */

struct tp_listen_options {
	size_t size; /* sizeof(struct tp_listen_options) */
	enum tp_access access;
	gid_t gid; /* for TP_ACCESS_GROUP */
	/* Added with remote access (a caller built before, with a smaller @size, gets these
	 * defaults): */
	enum tp_remote_access remote;	 /* default TP_REMOTE_NONE */
	const char *const *remote_peers; /* TP_REMOTE_PEERS: 1..32 peer identities (borrowed) */
	size_t n_remote_peers;
};

/*
 * tp_listen() - register listener @name (1..255 bytes of [A-Za-z0-9._@:+-]) with the daemon.
 * Names are one name space per host, first come first served: check who owns a listener before
 * sending to it (tp_connect_ex() with TP_CONNECT_EXPECT_UID), or use a name "@UID:rest" (UID in
 * decimal), which only uid UID may register. Waits for the daemon's answer.
 * @opts: NULL for owner-only access from this host (borrowed).
 * @ret: returns owned listener, close with tp_listener_close().
 * Return: 0; -EADDRINUSE if the name is taken; -EACCES for a name "@UID:..." of another uid;
 * -EINVAL for a bad name or options; -ETIMEDOUT when the daemon does not answer within
 * reply_timeout_ms; -EDEADLK from a callback.
 */
int tp_listen(struct tp_context *ctx, const char *name, const struct tp_listen_options *opts,
	      struct tp_listener **ret);

/*
 * Accept callback. On success @pipe is a new pipe owned by the callee (close it with
 * tp_pipe_close()); on error @pipe is NULL.
 */
typedef void (*tp_accept_fn)(void *arg, struct tp_listener *l, int status, const char *errmsg,
			     struct tp_pipe *pipe);

/* Asks for the next incoming pipe; accept calls match connections FIFO. Keeps @arg until @cb. */
int tp_listener_accept(struct tp_listener *l, tp_accept_fn cb, void *arg);

/* Blocking accept. @timeout_ms < 0 waits forever. Return: 0, -ETIMEDOUT, other -errno. */
int tp_listener_accept_sync(struct tp_listener *l, int timeout_ms, struct tp_pipe **ret);

/* tp_listener_accept() that also returns the accept's operation id for tp_cancel() in *@ret_op
 * (written on success, before the call returns; the callback may run before the caller reads
 * it). */
int tp_listener_accept_ex(struct tp_listener *l, tp_accept_fn cb, void *arg, uint64_t *ret_op);

/* Returns borrowed string: the listener's name. */
const char *tp_listener_name(const struct tp_listener *l);

/*
 * tp_listener_close() - unregister the name; pending accepts complete with -ECANCELED. Pipes
 * already accepted are unaffected. @l is freed once its callbacks have run. Accepts NULL.
 */
void tp_listener_close(struct tp_listener *l);

/* ---- pipes -------------------------------------------------------------------------------- */

/*
 * tp_connect() - open a pipe to @address: a listener NAME on this host, or
 * tpip://HOST[:PORT]/NAME, listener NAME on another host's daemon (HOST a name, an IPv4
 * address or a bracketed IPv6 address; PORT defaults to the daemon's peer-port, 7420). For a
 * tpip:// address the local daemon opens or reuses a peer link to that daemon; this process
 * opens no network connection. Returns at once; if the connect fails, operations on the pipe
 * (and tp_pipe_wait_connected()) complete with that error: -ENOENT no such listener; -EACCES
 * access refused, or the daemons failed to authenticate each other; -ECONNREFUSED nothing
 * listens on the peer port; -ETIMEDOUT or -EHOSTUNREACH the peer cannot be reached (in time);
 * -EPROTONOSUPPORT protocol version mismatch; -EOPNOTSUPP the peer daemon runs on this host;
 * -ECONNRESET the peer daemon died or the link broke (also later, on a connected pipe).
 * @ret: returns owned pipe, close with tp_pipe_close().
 * Return: 0; -EINVAL for a malformed address (checked here before anything is sent: port
 * 1..65535, HOST a name, an IPv4 address or a bracketed IPv6 address); -ENOBUFS over the pipe
 * limit.
 */
int tp_connect(struct tp_context *ctx, const char *address, struct tp_pipe **ret);

enum tp_connect_flags {
	TP_CONNECT_EXPECT_UID = 1u << 0, /* refuse unless the listener's owner is @expect_uid */
	TP_CONNECT_EXPECT_PEER = 1u << 1, /* tpip://: refuse unless the far daemon is one
					     @expect_remote allows */
};

struct tp_connect_options {
	size_t size;	  /* sizeof(struct tp_connect_options) */
	unsigned flags;	  /* TP_CONNECT_* */
	uid_t expect_uid; /* with TP_CONNECT_EXPECT_UID */
	unsigned wait_ms; /* a name not registered yet: wait this long for it (0: -ENOENT) */
	/* Added with TP_CONNECT_EXPECT_PEER (a caller built before, with a smaller @size, sets
	 * neither): which far daemons the pipe may reach, named as a listener's remote peers. */
	enum tp_remote_access expect_remote; /* TP_REMOTE_ANY_PEER or TP_REMOTE_PEERS */
	const char *const *expect_peers;     /* TP_REMOTE_PEERS: 1..32 peer identities (borrowed) */
	size_t n_expect_peers;
};

/*
 * tp_connect_ex() - tp_connect() with options. With TP_CONNECT_EXPECT_UID the daemon that holds
 * the listener refuses the connect with -EACCES unless the listener's owner is @expect_uid; the
 * check is made before the listener learns of the connect, so writes issued on the pipe right
 * away are never delivered to a listener of another owner (a "squatter" that registered the
 * name first). For a tpip:// address the owner is the one the far daemon reports; this daemon
 * checks its answer too and holds every write until it has. A daemon older than this option
 * ignores it (tp_pipe_remote_uid() then returns -ENODATA): where that may be, wait for
 * tp_pipe_wait_connected() and check tp_pipe_remote_uid() before writing.
 * With @wait_ms > 0 and a local name that no listener has registered yet, the daemon keeps the
 * connect pending until a listener of that name registers (its access checks then run as
 * usual) or @wait_ms passes: the connect then fails with -ETIMEDOUT, naming the listener. Two
 * processes started together need no retry loop. Writes issued meanwhile are held by the
 * daemon (within its pipe queue limits); a pending connect counts against pipes-max and ends
 * with the context or tp_pipe_close(). For a tpip://HOST/NAME address the far daemon waits the
 * same way for a listener that takes pipes from this host (one that does not is no listener to
 * this host: the wait runs out), with the same checks when it comes; the -ETIMEDOUT text names
 * the far host. Over tpip:// a wait is at most one hour (longer ones are cut to that), the far
 * daemon keeps at most its pipes-max waiting connects per peer host (-ENOBUFS above), closing
 * the pipe cancels the wait there, a link lost meanwhile fails the connect as any link loss
 * does, and an address that is this daemon's own waits as a local name. A daemon older than
 * this field, or a far daemon older than peer protocol 2.1, fails at once with -ENOENT.
 * With TP_CONNECT_EXPECT_PEER (tpip:// addresses only) this host's daemon refuses the connect
 * with -EACCES, naming the identity it found, unless the peer link the pipe goes over
 * authenticated as a daemon @expect_remote allows: TP_REMOTE_ANY_PEER any authenticated one,
 * TP_REMOTE_PEERS one that an entry of @expect_peers names (entries as for a listener's
 * @remote_peers); an unauthenticated (--peer-insecure) link never. It decides before anything
 * of the connect reaches the far daemon, so writes issued on the pipe right away never do.
 * The address alone does not say which daemon answers it: this does. Needs a daemon of
 * protocol minor 15 (-EOPNOTSUPP otherwise, before anything is sent); an address that is this
 * daemon's own connects locally as usual.
 * @opts: borrowed; NULL is tp_connect().
 * @ret: returns owned pipe, close with tp_pipe_close().
 * Return: as tp_connect(); -EINVAL for unknown flags, a @size of 0, or with
 * TP_CONNECT_EXPECT_PEER a local name, another @expect_remote, or @expect_peers out of bounds.
 */
int tp_connect_ex(struct tp_context *ctx, const char *address,
		  const struct tp_connect_options *opts, struct tp_pipe **ret);

/* tp_pipe_remote_uid() returns it when the other end is on another host. */
#define TP_UID_CLAIMED 1

/*
 * tp_pipe_remote_uid() - the uid of the other end: for a connected pipe, the listener's owner;
 * for an accepted pipe, the connecting process.
 * @ret: the uid.
 * Return: 0, the uid is the kernel's word for a process on this host; TP_UID_CLAIMED, the other
 * end is on another host and the uid is only what that host's daemon claims (it names no user
 * of this host); -EINPROGRESS while the connect is pending; -ENODATA if the daemon did not say;
 * -EINVAL for a NULL argument.
 */
int tp_pipe_remote_uid(struct tp_pipe *p, uid_t *ret);

/* Waits until the daemon has accepted or refused the connect. Return: 0 or the connect error. */
int tp_pipe_wait_connected(struct tp_pipe *p, int timeout_ms);

/*
 * Returns borrowed string, valid until tp_pipe_close(): who is on the other end. For a connected
 * pipe, the listener's name; for an accepted pipe, the connecting context's name. "" while a
 * connect is still pending.
 */
const char *tp_pipe_remote_name(struct tp_pipe *p);

/*
 * tp_pipe_close() - close the pipe. Pending descriptor requests complete with -ECANCELED at
 * once; pending writes and reads complete (-ECANCELED, or their result if their copy had already
 * finished) once the daemon confirms that no copy uses their memory, so a completed operation's
 * buffers are always free to reuse. The other end reads what was already written and then gets
 * -EPIPE. @p is freed once its callbacks have run; do not use it after this call. Accepts NULL.
 */
void tp_pipe_close(struct tp_pipe *p);

struct tp_payload {
	void *data; /* CPU memory */
	size_t length;
	const void *metadata;
	size_t metadata_len;
};

struct tp_tensor {
	struct tp_device device; /* where data lives */
	void *data;		 /* CUDA: a device pointer anywhere inside a cudaMalloc'd block */
	size_t length;
	const void *metadata;
	size_t metadata_len;
	bool has_target;	 /* the writer's wish for the reader's device */
	struct tp_device target;
	/* CUDA only: the stream (CUstream / cudaStream_t) whose queued work produces @data. The
	 * daemon's copy starts after the work queued on it before tp_pipe_write(); the write's
	 * callback runs once the copy has finished. NULL: the legacy default stream. */
	void *cuda_stream;
};

struct tp_message {
	const void *metadata;
	size_t metadata_len;
	struct tp_payload *payloads;
	size_t n_payloads;
	struct tp_tensor *tensors;
	size_t n_tensors;
};

/* Completion of a write or read. @errmsg is NULL when @status is 0, else valid only until the
 * callback returns (as for every callback's @errmsg). */
typedef void (*tp_done_fn)(void *arg, struct tp_pipe *p, int status, const char *errmsg);

/*
 * tp_pipe_write() - send @msg. The message struct and metadata are copied during the call; the
 * payload and tensor data are kept until @cb. Writes complete in order: a small message sent
 * inline once the daemon holds it, any other once its bytes are in the reader's allocation
 * (across hosts too: the reader's daemon confirms it), with the status of that transfer.
 * Across hosts keep several writes in flight (8 to 16 for tensors of a few MiB) to keep the
 * link busy. A writer ahead of its reader waits instead of failing: beyond the pipe's window
 * (the daemon's --pipe-queue-max messages and --pipe-queue-bytes inline bytes not yet consumed
 * by the reader) writes stay pending in the library, in order and without a copy, and go out as
 * the reader consumes; their callbacks come later (tp_pipe_write_sync() blocks meanwhile). A
 * held write completes with the pipe's error if it fails, -ECANCELED if it is closed. Writes
 * wait the same way while the daemon-wide budget (--pipe-queue-bytes-max) is spent by many
 * pipes: read every pipe that has data (a reader blocked on one frees no room for others).
 * Across hosts the window is the smaller of both daemons' limits. The callback reports -ENOBUFS
 * only for limits set on purpose (a message larger than that budget or than the reader's
 * daemon's --pipe-queue-bytes) or from a daemon older than protocol minor 5; a small message
 * the reader's daemon dropped after its write completed fails the pipe (-ENOBUFS).
 * Return: 0 (callback will fire); -EINVAL, -EMSGSIZE, -E2BIG for a message over the limits;
 * -EPIPE / -ECONNRESET if the pipe is already known to be closed.
 */
int tp_pipe_write(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb, void *arg);

struct tp_payload_desc {
	size_t length;
	const void *metadata;
	size_t metadata_len;
};

struct tp_tensor_desc {
	size_t length;
	const void *metadata;
	size_t metadata_len;
	struct tp_device device; /* where the writer's data lives */
	bool has_target;
	struct tp_device target;
};

/* What the reader learns of a message before it allocates. Owned by the library. */
struct tp_descriptor {
	const void *metadata;
	size_t metadata_len;
	size_t n_payloads;
	const struct tp_payload_desc *payloads;
	size_t n_tensors;
	const struct tp_tensor_desc *tensors;
};

/*
 * Descriptor callback. On success @d is owned by the callee until it is passed to tp_pipe_read()
 * (or tp_descriptor_free()); on error @d is NULL.
 */
typedef void (*tp_descriptor_fn)(void *arg, struct tp_pipe *p, int status, const char *errmsg,
				 struct tp_descriptor *d);

/*
 * Asks for the next message's descriptor; calls match messages FIFO, in the order written. Once
 * the pipe has failed (the peer died, the link was lost, it was closed), descriptors of small
 * messages whose bytes already arrived with them are still handed out; from the first message
 * whose bytes were still with the writer on, pending and later calls fail with the pipe's error.
 */
int tp_pipe_read_descriptor(struct tp_pipe *p, tp_descriptor_fn cb, void *arg);

struct tp_slot {
	struct tp_device device;
	void *data; /* at least the descriptor's length bytes; CUDA: a device pointer */
	/* CUDA only: the copy into @data starts after the work queued on this stream before
	 * tp_pipe_read() (e.g. the allocation's own stream); the read's callback runs once the
	 * bytes are in @data. NULL: the legacy default stream. */
	void *cuda_stream;
};

/* Where the reader wants the message's bytes: one slot per payload and per tensor. */
struct tp_allocation {
	struct tp_slot *payloads;
	size_t n_payloads;
	struct tp_slot *tensors;
	size_t n_tensors;
};

/*
 * tp_pipe_read() - receive the message described by @d into @alloc.
 * @d: takes @d (also on failure): it is freed by the library.
 * @alloc: copied during the call; the memory it points to is kept until @cb.
 * Reads must be issued in descriptor order.
 * Return: 0; -EINVAL if @alloc does not match @d or @d is not the pipe's next descriptor.
 */
int tp_pipe_read(struct tp_pipe *p, struct tp_descriptor *d, const struct tp_allocation *alloc,
		 tp_done_fn cb, void *arg);

/* Drops a descriptor without reading it (the message is discarded). Accepts NULL. */
void tp_descriptor_free(struct tp_descriptor *d);

/* Blocking variants. @timeout_ms < 0 waits forever. -EDEADLK if called from a callback.
 * tp_pipe_write_sync() and tp_pipe_read_sync() wait forever: see the _timeout variants. */
int tp_pipe_write_sync(struct tp_pipe *p, const struct tp_message *msg);
int tp_pipe_read_descriptor_sync(struct tp_pipe *p, int timeout_ms, struct tp_descriptor **ret);
int tp_pipe_read_sync(struct tp_pipe *p, struct tp_descriptor *d,
		      const struct tp_allocation *alloc);

/*
 * tp_pipe_write_sync_timeout() / tp_pipe_read_sync_timeout() - tp_pipe_write_sync() and
 * tp_pipe_read_sync() that give up after @timeout_ms (< 0: never). Giving up cancels the
 * operation (tp_cancel()) and waits for its completion, so that whatever they return, the
 * message's and the allocation's memory is free again when they return. The read takes @d as
 * tp_pipe_read() does.
 * Return: 0; -ETIMEDOUT when the operation did not complete in time and was cancelled (for a
 * write, the reader gets -ECANCELED when it reads the message; for a read, the message is
 * dropped and its writer's write fails with -ECANCELED; the pipe stays usable); the
 * operation's own result when it completed meanwhile or could no longer be stopped (its bytes
 * were being copied: this can take longer than @timeout_ms, as can a cancelled operation
 * whose callback waits for earlier ones of its pipe); -EDEADLK from a callback; other
 * -errno as tp_pipe_write() / tp_pipe_read(). With a daemon older than tpipd protocol 1.5,
 * which cannot cancel, they wait for the operation's completion after @timeout_ms.
 */
int tp_pipe_write_sync_timeout(struct tp_pipe *p, const struct tp_message *msg, int timeout_ms);
int tp_pipe_read_sync_timeout(struct tp_pipe *p, struct tp_descriptor *d,
			      const struct tp_allocation *alloc, int timeout_ms);

/* ---- cancelling one operation --------------------------------------------------------------- */

/*
 * The _ex start calls are the plain ones that also return an operation id (> 0, never reused
 * within the context) in *@ret_op, written on success before the call returns (the callback
 * may run before the caller reads it). Ownership and callbacks are as for the plain calls.
 */
int tp_pipe_write_ex(struct tp_pipe *p, const struct tp_message *msg, tp_done_fn cb, void *arg,
		     uint64_t *ret_op);
int tp_pipe_read_ex(struct tp_pipe *p, struct tp_descriptor *d, const struct tp_allocation *alloc,
		    tp_done_fn cb, void *arg, uint64_t *ret_op);
int tp_pipe_read_descriptor_ex(struct tp_pipe *p, tp_descriptor_fn cb, void *arg,
			       uint64_t *ret_op);

/*
 * tp_cancel() - give up on the pending operation @op of @ctx (an id from a _ex call). Returns at
 * once; it never runs the callback itself. The callback still runs exactly once, later, on the
 * library thread and in its pipe's order (after the callbacks of earlier writes, or reads, of
 * that pipe): with -ECANCELED if the operation was stopped, or with its real result if it had
 * already finished or could no longer be stopped. Only when the callback has run is the
 * memory the operation references free (payloads, tensors, allocation slots, @arg).
 * What is stopped:
 *   - a descriptor request or an accept: always (the library holds it);
 *   - a write whose bytes nobody is copying (the reader has not supplied its allocation, or
 *     its copy waits behind another): its callback gets -ECANCELED. The message stays in line:
 *     the reader, which may already hold its descriptor, gets -ECANCELED ("the writer
 *     cancelled this message") when it reads it, and later messages arrive in order;
 *   - a read whose copy has not started: its callback gets -ECANCELED, the message is
 *     discarded (the next read_descriptor returns the next message) and its writer's write
 *     completes with -ECANCELED ("the reader cancelled its read of this message").
 * Not stopped: a small write that travelled with its descriptor (it completes at once), a
 * read of such a message, and a write or read whose bytes are being copied or, across hosts,
 * whose transfer has started on the peer link: they complete with their result. Across hosts,
 * a write the far reader has not asked for yet, and a read not yet sent to the writer's daemon,
 * are stopped as above. On a pipe being closed, pending writes and reads complete with the
 * close as tp_pipe_close() says.
 * Return: 0 (the callback will say how it ended); -ENOENT if @op is unknown, or its result is
 * already known (its callback ran, or waits for earlier ones of its pipe); -EALREADY if it is
 * already being cancelled; -EOPNOTSUPP if a daemon older than tpipd protocol 1.5 holds the write
 * or read (descriptor requests and accepts are cancelled all the same); -EINVAL for a NULL @ctx.
 * May be called from a callback and from any thread.
 */
int tp_cancel(struct tp_context *ctx, uint64_t op);

/* ---- groups and collectives (docs/collectives.md) ------------------------------------------ */

/*
 * A group is @size processes that run collectives together. Groups are named per user: the
 * daemon keys them by the caller's uid (from the kernel), so another user can neither join nor
 * see a group. Every member calls the same collectives in the same order with matching
 * arguments; a call that does not match (another collective, dtype, count, operation or root)
 * fails on every member with -EPROTO and a message saying what differed, and never hangs. Every
 * member gets bitwise-identical results: each element is reduced in rank order 0, 1, ... N-1,
 * whoever computes it. On one host the members reduce through a shared-memory arena the daemon
 * creates: each member reduces its own slice of every chunk (all cores work), then copies the
 * result out. When a member's process dies, or it leaves or aborts, every pending and later
 * collective of the group fails on the others with -ECONNRESET (died) or -EPIPE (left,
 * aborted), naming its rank and pid in tp_last_error(); other groups are untouched.
 * A group is used by one thread at a time per member (collectives are ordered calls).
 */
struct tp_group;

/* How members find each other. COORDINATOR: through the daemon at an explicit
 * tpip://HOST[:PORT] address (docs/collectives.md); SLURM: rank and size from Slurm's
 * variables, the group keyed by job and step, the coordinator the daemon of the step's first
 * host (a step on one node: the local daemon alone); AUTO: SLURM in a Slurm task
 * (SLURM_JOB_ID and SLURM_PROCID set) when nranks is 0 or the step's task count and rank -1 or
 * SLURM_PROCID, else LOCAL. */
enum tp_group_bootstrap {
	TP_GROUP_BOOTSTRAP_AUTO = 0,
	TP_GROUP_BOOTSTRAP_LOCAL = 1,
	TP_GROUP_BOOTSTRAP_COORDINATOR = 2,
	TP_GROUP_BOOTSTRAP_SLURM = 3,
};

struct tp_group_options {
	size_t size;		 /* sizeof(struct tp_group_options) */
	int rank;		 /* 0..nranks-1, or -1: the daemon assigns ranks in join order */
	unsigned nranks;	 /* members, >= 1 */
	enum tp_group_bootstrap bootstrap;
	int join_timeout_ms;	 /* all members must join within this; <= 0: 30000 */
	int op_timeout_ms;	 /* a collective waits at most this for the others; <= 0: no limit */
	const char *coordinator; /* COORDINATOR: "tpip://HOST[:PORT]"; else NULL */
	/* Added with a group's remote access (a caller built before, with a smaller @size, gets
	 * these defaults): which peer daemons may take part in a group across hosts, as for a
	 * listener. A process on another host is never one of this host's users: the daemons
	 * decide on the authenticated identity of each peer link, and the uid another host's
	 * daemon claims for its member is only a claim. The coordinator admits a member from
	 * another host only over a link that this setting allows, and this member's daemon sends
	 * its join to (and takes the answer from) a coordinator on another host only over such a
	 * link; the hosts' leaders' pipes take only such links too. Every member must state the
	 * same setting (the peers as a set); another one fails its join with -EINVAL where the
	 * group has a member that setting admits (else that join waits apart and times out):
	 * joins stating another setting, by daemons this one does not allow, never disturb it.
	 *   TP_REMOTE_NONE (default): this host's members only; a coordinator on another host
	 *     is refused with -EACCES. With the default the environment decides: TP_GROUP_REMOTE
	 *     set to "any-peer", or to peer identities separated by ';' ("psk;cert:gn02"),
	 *     stands for TP_REMOTE_ANY_PEER or TP_REMOTE_PEERS ("none": the default).
	 *   TP_REMOTE_ANY_PEER: any peer daemon that authenticated (the pre-shared key or a
	 *     certificate of the cluster CA; an unauthenticated link never).
	 *   TP_REMOTE_PEERS: only daemons authenticated as one of @remote_peers (entries as
	 *     for tp_listen_options). */
	enum tp_remote_access remote;
	const char *const *remote_peers; /* TP_REMOTE_PEERS: 1..32 peer identities (borrowed) */
	size_t n_remote_peers;
};

enum tp_dtype {
	TP_DTYPE_F16 = 1,  /* IEEE binary16, reduced in float, rounded to nearest even */
	TP_DTYPE_BF16 = 2, /* bfloat16, likewise */
	TP_DTYPE_F32 = 3,
	TP_DTYPE_F64 = 4,
	TP_DTYPE_I8 = 5,   /* integers wrap (two's complement) on overflow */
	TP_DTYPE_U8 = 6,
	TP_DTYPE_I32 = 7,
	TP_DTYPE_I64 = 8,
};

/* Floats: a NaN operand of min or max, and any NaN a sum or product makes, gives the quiet NaN
 * of positive sign (f32 0x7fc00000, f64 0x7ff8000000000000, f16 0x7e00, bf16 0x7fc0), whatever
 * NaNs went in, on every CPU and build: NaN payloads are not carried through. */
enum tp_reduce_op {
	TP_OP_SUM = 1,
	TP_OP_PROD = 2,
	TP_OP_MIN = 3,
	TP_OP_MAX = 4,
};

/*
 * A user reduction: fold @in into @inout, @count elements of @dtype each (@inout[i] =
 * f(@inout[i], @in[i])). Called on a library or caller thread, possibly on several members at
 * once for different slices; it must be deterministic for results to be identical everywhere.
 * Borrows @inout and @in for the call.
 */
typedef void (*tp_reduce_fn)(void *inout, const void *in, size_t count, enum tp_dtype dtype,
			     void *user);

/* Bytes of one element of @dtype, or 0 for an unknown one. */
size_t tp_dtype_size(enum tp_dtype dtype);

/*
 * tp_group_join() - join group @name of the caller's uid through @ctx's daemon.
 * Returns once every member joined and a start barrier passed, or fails: -ETIMEDOUT (not every
 * member joined within the join timeout; the message lists the missing ranks), -EINVAL (@opts
 * disagree with those the group was formed with, e.g. another size or remote access),
 * -EADDRINUSE (the rank is taken), -EBUSY (a group of that name is formed and not yet left by
 * every member), -ENOBUFS (a daemon limit: groups-per-uid, group-members-max,
 * group-bytes-per-uid), -EACCES (the group's remote access does not allow the coordinator's
 * daemon, or the coordinator's setting does not allow this member's daemon, or either runs a
 * tpipd that does not check it), -EOPNOTSUPP (a bootstrap not available; a remote access
 * other than none with a local daemon too old to enforce it), -ENAMETOOLONG (@name over 128
 * bytes), -EPROTO (the daemon's arena is not a memfd sealed against shrinking and growing of
 * the announced size, or an older tpipd names it by a path, which this library never opens).
 * Borrows @ctx (it must outlive the group), @name and @opts. @ret: returns an owned group, free
 * with tp_group_leave().
 */
int tp_group_join(struct tp_context *ctx, const char *name, const struct tp_group_options *opts,
		  struct tp_group **ret);

/* Queries; each borrows @g. On one host local rank and size are rank and size, host index 0 of
 * 1 host. */
int tp_group_rank(const struct tp_group *g);
int tp_group_size(const struct tp_group *g);
int tp_group_local_rank(const struct tp_group *g);
int tp_group_local_size(const struct tp_group *g);
int tp_group_host_index(const struct tp_group *g);
int tp_group_hosts(const struct tp_group *g);
/* Bytes of the group's shared-memory arena (what group-bytes-per-uid counts). */
uint64_t tp_group_arena_bytes(const struct tp_group *g);

/*
 * tp_group_abort() - fail the group for every member: their pending and later collectives
 * return -EPIPE naming this rank as having aborted. Collectives of @g on other threads of this
 * process return too. @g stays allocated: free it with tp_group_leave(). Borrows @g.
 */
void tp_group_abort(struct tp_group *g);

/*
 * tp_group_leave() - leave and free @g (takes @g; NULL is accepted). Waits for this member's
 * asynchronous collectives to end first. The others' later collectives fail (-EPIPE, "rank R
 * left"), so every member leaves after its last collective.
 * Return: 0, or the error of the last collective that failed and was not waited for.
 */
int tp_group_leave(struct tp_group *g);

/*
 * Blocking collectives. Each returns 0 or -errno (message in tp_last_error()): -EPROTO for a
 * mismatched call, -ECONNRESET / -EPIPE when a member died / left or aborted, -ETIMEDOUT after
 * op_timeout_ms (which fails the group for every member), -EINVAL for bad arguments (unknown
 * dtype or op, NULL buffers with count > 0, root out of range). Buffers are borrowed for the call
 * and may be any CPU memory; @send may equal @recv (in place) for all-reduce. Counts are in
 * elements and may be 0.
 *   tp_allreduce: @recv[i] = op over ranks of @send[i], @count elements.
 *   tp_allreduce_fn: the same with the user reduction @fn(@user).
 *   tp_broadcast: @buf of @root copied to @buf of every member.
 *   tp_barrier: returns once every member called it.
 *   tp_allgather: @recv (size * @count elements) gets each rank r's @send at r * @count.
 *   tp_reduce_scatter: @send holds size * @count elements; rank r's @recv gets op over ranks
 *     of elements r * @count .. r * @count + @count - 1.
 */
int tp_allreduce(struct tp_group *g, const void *send, void *recv, size_t count,
		 enum tp_dtype dtype, enum tp_reduce_op op);
int tp_allreduce_fn(struct tp_group *g, const void *send, void *recv, size_t count,
		    enum tp_dtype dtype, tp_reduce_fn fn, void *user);
int tp_broadcast(struct tp_group *g, void *buf, size_t count, enum tp_dtype dtype, int root);
int tp_barrier(struct tp_group *g);
int tp_allgather(struct tp_group *g, const void *send, void *recv, size_t count,
		 enum tp_dtype dtype);
int tp_reduce_scatter(struct tp_group *g, const void *send, void *recv, size_t count,
		      enum tp_dtype dtype, enum tp_reduce_op op);

/*
 * tp_allreduce_uneven() - all-reduce for uneven steps (torch-ipc): a member that has finished
 * its own steps calls it with @send NULL and contributes nothing (the identity of @op) while the
 * others go on; every member passes the same @count, @dtype and @op. The result is the
 * reduction, in rank order, over the members that contributed, and *@ret_contributors (if not
 * NULL) says how many did, the same on every member: 0 means every member has finished, and
 * then @recv is left as it was. Otherwise as tp_allreduce().
 */
int tp_allreduce_uneven(struct tp_group *g, const void *send, void *recv, size_t count,
			enum tp_dtype dtype, enum tp_reduce_op op, unsigned *ret_contributors);

/*
 * Asynchronous collectives: the _start forms queue the call (in call order, behind this
 * member's earlier ones) on the group's own thread and return at once with an owned request in
 * *@ret (free with tp_coll_wait() or tp_coll_free()). Buffers are kept until the request ends.
 * A blocking call made while requests are queued runs after them. Return of _start: 0 or
 * -EINVAL / -ENOMEM (nothing queued).
 */
struct tp_coll_req;
int tp_allreduce_start(struct tp_group *g, const void *send, void *recv, size_t count,
		       enum tp_dtype dtype, enum tp_reduce_op op, struct tp_coll_req **ret);
int tp_broadcast_start(struct tp_group *g, void *buf, size_t count, enum tp_dtype dtype,
		       int root, struct tp_coll_req **ret);
int tp_barrier_start(struct tp_group *g, struct tp_coll_req **ret);
int tp_allgather_start(struct tp_group *g, const void *send, void *recv, size_t count,
		       enum tp_dtype dtype, struct tp_coll_req **ret);
int tp_reduce_scatter_start(struct tp_group *g, const void *send, void *recv, size_t count,
			    enum tp_dtype dtype, enum tp_reduce_op op, struct tp_coll_req **ret);

/*
 * tp_coll_test() - has @req ended? Return: 1 (ended; tp_coll_wait() returns at once), 0 (not
 * yet). Borrows @req.
 */
int tp_coll_test(struct tp_coll_req *req);

/*
 * tp_coll_wait() - wait for @req to end and free it (takes @req).
 * Return: the collective's result (0 or -errno as the blocking form, message in
 * tp_last_error()).
 */
int tp_coll_wait(struct tp_coll_req *req);

/*
 * Where a group's collectives find their buffers: CPU memory by default. With a CUDA device,
 * the send and receive buffers of the collectives started afterwards are device memory of that
 * device: the library copies the input to host memory after the work queued on @cuda_stream
 * (NULL: the legacy default stream), runs the collective on host memory, and copies the result
 * back on that stream, waiting for it before the call returns (a _start form: before its
 * request ends). A user reduction (tp_allreduce_fn()) is called on those host copies. A member
 * whose input cannot be copied out aborts the group (tp_group_abort()): the others would
 * otherwise reduce what it never gave.
 */
struct tp_coll_options {
	size_t size;		 /* sizeof(struct tp_coll_options) */
	struct tp_device device; /* TP_DEVICE_CPU (index 0) or TP_DEVICE_CUDA and its ordinal */
	void *cuda_stream;	 /* CUDA: CUstream / cudaStream_t, or NULL */
};

/*
 * tp_group_set_coll_options() - use @opts for the collectives @g starts from now on (calls
 * already started keep the options they were made with). Not for use while another thread
 * starts a collective on @g. Borrows @opts.
 * Return: 0; -EINVAL (bad options); -EOPNOTSUPP (CUDA: this build has no CUDA support or no
 * CUDA driver can be loaded; tp_last_error() says which).
 */
int tp_group_set_coll_options(struct tp_group *g, const struct tp_coll_options *opts);

/* Frees @req without its result (takes @req; NULL accepted); if it has not ended, it still runs
 * and its buffers stay in use until it does (tp_group_leave() waits for it). */
void tp_coll_free(struct tp_coll_req *req);

/* ---- server fan-in and fan-out over accepted pipes --------------------------------------- */

/*
 * A pipe set: the pipes a server accepted, read as one (torch-ipc's recvAny) and written as one
 * (its broadcast). A set belongs to one context and owns the pipes in it; it is used from one
 * thread at a time and never from a callback (-EDEADLK).
 */
struct tp_pipe_set;

/* The most pipes one set holds (its @max_pipes). */
#define TP_SET_MAX_PIPES 1024
/* The most bytes of private memory one tp_set_broadcast() stages (see there). */
#define TP_SET_STAGE_MAX ((size_t)1 << 30)

/*
 * tp_set_new() - an empty set of at most @max_pipes pipes of @ctx.
 * @ret: returns owned set, free with tp_set_free().
 * Return: 0; -EINVAL for @max_pipes 0 or above TP_SET_MAX_PIPES; -ENOMEM.
 */
int tp_set_new(struct tp_context *ctx, unsigned max_pipes, struct tp_pipe_set **ret);

/*
 * tp_set_free() - closes every pipe still in @s (descriptors it read ahead are dropped) and
 * frees it once their requests have completed. Takes @s. Accepts NULL.
 */
void tp_set_free(struct tp_pipe_set *s);

/*
 * tp_set_add() - adds @p; from now on the set reads @p's descriptors ahead, so read @p only
 * through tp_set_read_any().
 * @p: takes @p on success (the set closes it); on failure the caller keeps it.
 * Return: 0; -E2BIG when the set is full; -EXDEV when @p belongs to another context; -EEXIST
 * when @p is already in the set; -EDEADLK from a callback; -EINVAL for NULL.
 */
int tp_set_add(struct tp_pipe_set *s, struct tp_pipe *p);

/* Number of pipes in @s (ended ones leave it once reported). */
unsigned tp_set_size(const struct tp_pipe_set *s);

/* Returns borrowed pipe number @i (0 <= @i < tp_set_size()), valid while it stays in the set;
 * NULL out of range. The order is the order of tp_set_add() (and of broadcast results). */
struct tp_pipe *tp_set_pipe(const struct tp_pipe_set *s, unsigned i);

/*
 * tp_set_wait_pipes() - accepts pipes on @l into @s until it holds @n pipes.
 * Borrows @l. @timeout_ms < 0 waits forever.
 * Return: 0 once the set holds @n (at once if it already does); -ETIMEDOUT when fewer arrived in
 * time (those that did stay in the set); -E2BIG when @n is above the set's @max_pipes; the
 * accept's error otherwise.
 */
int tp_set_wait_pipes(struct tp_pipe_set *s, struct tp_listener *l, unsigned n, int timeout_ms);

/*
 * tp_set_read_any() - the next message of whichever pipe has one, fairly: among the pipes that
 * have a message (or have ended), round-robin from the one after the pipe served last, so a busy
 * pipe never starves the others. The set reads a few descriptors ahead on each pipe. Read the
 * message with tp_pipe_read*() on *@ret_pipe (or tp_descriptor_free() it) before the next
 * tp_set_read_any(): a pipe's reads must follow its descriptor order.
 * @ret_pipe: returns borrowed pipe, valid while in the set; when the call returns the pipe's end,
 * owned by the caller (close it with tp_pipe_close()).
 * @ret_desc: returns owned descriptor (as tp_pipe_read_descriptor()), NULL at a pipe's end.
 * Return: 0 with a descriptor; 1 with *@ret_desc NULL and *@ret_pipe the pipe that ended (its
 * error, e.g. -EPIPE, as tp_last_error() text and through tp_set_last_status()): reported once,
 * and the pipe has left the set; -ENOENT when the set is empty; -ETIMEDOUT (@timeout_ms < 0
 * waits forever, 0 tries once); -EDEADLK from a callback.
 */
int tp_set_read_any(struct tp_pipe_set *s, int timeout_ms, struct tp_pipe **ret_pipe,
		    struct tp_descriptor **ret_desc);

/* The error with which the pipe last reported by tp_set_read_any() ended (0 if none did). */
int tp_set_last_status(const struct tp_pipe_set *s);

/*
 * tp_set_broadcast() - writes @msg to every pipe of @s, reading the writer's memory once: data
 * in shared buffers (tp_buffer_alloc()) is copied by the daemon from that one source into each
 * reader's allocation; private CPU memory is first copied once into one staging shared buffer
 * (at most TP_SET_STAGE_MAX bytes, and within the daemon's shared-buffer limits) from which all
 * deliveries copy; CUDA tensors are exported once and read by each delivery. Where the daemon
 * offers it, one request names every pipe and the daemon fans out, reading private memory once
 * itself (see "daemon fan-out" at the end of this header, tp_set_set_fanout()). A reader that
 * is slow (not done after @timeout_ms: that delivery is cancelled) or gone fails only its own
 * delivery.
 * Borrows @msg and its memory until the call returns.
 * @ret_status: @n_status entries, written for pipes 0..n_status-1 in tp_set_pipe() order: 0
 * delivered, else that pipe's -errno. May be NULL when @n_status is 0.
 * Return: the number of pipes delivered to (>= 0); -ENOENT for an empty set; -E2BIG when the
 * private bytes exceed TP_SET_STAGE_MAX; -EINVAL, -EMSGSIZE as tp_pipe_write(); the staging
 * allocation's error; -EOPNOTSUPP with TP_FANOUT_DAEMON where the daemon cannot fan out;
 * -EDEADLK from a callback.
 */
int tp_set_broadcast(struct tp_pipe_set *s, const struct tp_message *msg, int timeout_ms,
		     int *ret_status, size_t n_status);

/* ---- channels (docs/channels.md) ------------------------------------------------------------
 *
 * A channel is a named FIFO of items hosted by the daemon: any process of the host may open it
 * by name, write batches of items and read them one at a time. A channel is named within its
 * creator's uid; others open it by naming that uid (tp_chan_options.owner_uid) and pass its
 * access mode. Items are byte strings of at least 1 byte, or messages (tp_chan_write_msgs(),
 * below). All calls block and are thread safe; a handle is used by one thread at a time.
 */
struct tp_chan;

#define TP_CHAN_CREATE 0x1u	/* create the channel if it does not exist */
#define TP_CHAN_EXCL 0x2u	/* with TP_CHAN_CREATE: fail with -EADDRINUSE if it exists */
#define TP_CHAN_PERSISTENT 0x4u /* with TP_CHAN_CREATE: live until tp_chan_unlink(), not only
				 * while a handle is open */

struct tp_chan_options {
	size_t size;		 /* sizeof(struct tp_chan_options) */
	unsigned flags;		 /* TP_CHAN_* */
	enum tp_access access;	 /* who else may open it (creation only) */
	gid_t gid;		 /* for TP_ACCESS_GROUP */
	uint32_t capacity_items; /* 0: the daemon's chan-items-max */
	uint64_t capacity_bytes; /* 0: the daemon's chan-bytes-max */
	long owner_uid;		 /* the channel of this uid; -1 (or a zeroed field with size
				  * smaller than this one): the caller's own */
	/* Added with channels across hosts (a caller built before, with a smaller @size, gets
	 * these defaults): who on other hosts may open the channel (creation only), decided on
	 * the peer link's authenticated identity as for tp_listen_options. */
	enum tp_remote_access remote;	 /* default TP_REMOTE_NONE */
	const char *const *remote_peers; /* TP_REMOTE_PEERS: 1..32 peer identities (borrowed) */
	size_t n_remote_peers;
};

/*
 * tp_chan_open() - open (or with TP_CHAN_CREATE create) channel @name.
 * @name: a channel name, or "tpip://HOST[:PORT]/NAME" for channel NAME hosted by the daemon of
 * HOST: this daemon forwards every call over its peer link, with the same semantics and errors.
 * Such a channel is only opened, never created there (TP_CHAN_CREATE opens it if it exists),
 * of uid @o->owner_uid (-1: a channel of the caller's uid number on HOST), and only if its
 * creator allowed the link (tp_chan_options.remote); otherwise it does not exist, to this
 * caller. Once the link fails (the far daemon died, the network was cut: within its
 * --peer-timeout), every call on the handle fails with -ECONNRESET naming HOST.
 * @o: NULL for defaults (open an existing channel of the caller's uid).
 * @ret: returns an owned handle, free with tp_chan_release().
 * Return: 0; -ENOENT (no such channel, or one whose access mode refuses this uid: to it the two
 * are the same, so that another uid's private names cannot be probed), -EADDRINUSE
 * (TP_CHAN_EXCL and it exists), -ENOBUFS (chans-per-uid, or a capacity above the daemon's
 * limits, or chan-peer-ops-max), -EINVAL (bad name or options), -ECONNRESET,
 * -ECONNREFUSED or -ETIMEDOUT (the far daemon cannot be reached) or the connection's error.
 */
int tp_chan_open(struct tp_context *ctx, const char *name, const struct tp_chan_options *o,
		 struct tp_chan **ret);

/*
 * tp_chan_write() - append @n items atomically and contiguously: either all of them follow
 * each other in the channel, or none is written. A batch that does not fit waits for room up
 * to @timeout_ms (0: do not wait; -1: no deadline), behind writes already waiting. Borrows
 * @items.
 * Return: 0; -EPIPE (the channel is closed, also while waiting), -ENOBUFS (full and
 * @timeout_ms 0, or the caller's uid's chan-bytes-per-uid is spent: the items its writes hold
 * in any channel, whoever owns it, and the inline items of its writes waiting for room, or it would wait over waits-per-uid: nothing written), -ETIMEDOUT (the daemon answered: still full at the
 * deadline, nothing written), -EINPROGRESS (the
 * daemon did not answer within @timeout_ms plus tp_context_options.reply_timeout_ms and the
 * call gave up: the batch may be written, now or later, so a retry may write it twice),
 * -EMSGSIZE (the batch is larger than the channel's capacity, or than the daemon's inline
 * limit), -EINVAL (n == 0 or an empty item).
 * On a channel of this host's daemon (protocol minor 7) items above 16 KiB do not ride inline:
 * the daemon copies each once (memcpy) from the shared buffer it lies in (tp_buffer_alloc()),
 * or, for other memory, from a staging buffer the library copies it into first (by CMA from the
 * caller's memory, for items above 256 KiB, when no staging buffer can be had), before it
 * answers; any size up to the channel's capacity. Without either, such an item rides inline
 * (the inline limit applies).
 * A handle whose staging buffers are all lent to its channel (its readers behind by 64 MiB or
 * 8 batches) waits, within @timeout_ms and never over 64 ms, for one to come back rather than
 * have the daemon copy the batch in (docs/channels.md, "A writer ahead of its readers").
 * When the call returns (any result but -EINPROGRESS) the daemon no longer reads the items.
 */
int tp_chan_write(struct tp_chan *ch, const struct iovec *items, size_t n, int timeout_ms);

#define TP_CHAN_CLOSED 1 /* tp_chan_read(): an item, and the channel is closed */

/*
 * tp_chan_read() - take the oldest item; waits up to @timeout_ms (0: try once; -1: no
 * deadline). Readers waiting on one channel get items oldest reader first.
 * @ret_item, @ret_len: return an owned copy of the item (free with free()), only on success.
 * No item is lost when the call gives up waiting for the daemon (-ETIMEDOUT after @timeout_ms
 * plus tp_context_options.reply_timeout_ms): an item the daemon hands to that read later is kept
 * on the handle and returned, in order, by its next tp_chan_read() (which also returns as soon as
 * such an item comes), or written back to the channel by tp_chan_release().
 * Return: 0 (an item), TP_CHAN_CLOSED (an item; the channel is closed), -EPIPE (closed and
 * drained: no item will come), -EAGAIN (@timeout_ms 0 and empty), -ETIMEDOUT, -ECANCELED (the
 * handle was released meanwhile), -ENOBUFS (it would wait, and the caller's uid has the
 * daemon's waits-per-uid calls on channels and work queues waiting already, or this handle 64).
 */
int tp_chan_read(struct tp_chan *ch, void **ret_item, size_t *ret_len, int timeout_ms);

/* tp_chan_close() - close the channel for every handle: writes fail with -EPIPE, readers get
 * what is left and then -EPIPE, every waiting reader in every process wakes. Idempotent.
 * Return: 0 or -errno. */
int tp_chan_close(struct tp_chan *ch);

/* tp_chan_release() - drop the handle (takes @ch; NULL accepted). Not a close: a channel
 * without handles goes unless persistent. Items kept on the handle for reads that gave up
 * (tp_chan_read()) are first written back to the channel, at its tail, through a second handle
 * (waiting up to reply_timeout_ms for room); one that cannot be (the channel was closed, or the
 * daemon does not answer the release in time) is dropped and the call fails naming how many.
 * Return: 0 or -errno (the handle is freed anyway). */
int tp_chan_release(struct tp_chan *ch);

/* tp_chan_unlink() - remove the name of persistent channel @name of uid @owner_uid (-1: the
 * caller's own; only its owner or root may). Open handles keep the channel until released.
 * Return: 0, -ENOENT (also a channel whose access mode refuses the caller), -EACCES (one it may
 * open but does not own) or -errno. */
int tp_chan_unlink(struct tp_context *ctx, const char *name, long owner_uid);

/* ---- work queues (docs/queues.md) -----------------------------------------------------------
 *
 * A work queue is a named object hosted by the daemon, like a channel: its creator (the owner)
 * submits questions and receives answers that carry the question's id; any other process the
 * queue's access mode admits opens it as a worker, takes questions and replies to the ids it
 * took. The daemon sees workers and the owner die: a question held by a worker whose session ends
 * is queued again (at the head, once per death: at-least-once), or with TP_WQ_AT_MOST_ONCE
 * answered with -ECONNRESET; the owner's end closes the queue and frees it (workers get -EPIPE).
 * No call waits for room: tp_wq_submit() and tp_wq_reply() fail at once with -ENOBUFS when the
 * queue is full, so answers always reach an owner whose submits are refused (no deadlock of two
 * bounded directions). Byte payloads are 1 byte up to the daemon's inline limit (messages, below,
 * may be larger). All calls block and
 * are thread safe; a handle is used by one thread at a time.
 */
struct tp_wq;

#define TP_WQ_CREATE 0x1u	 /* create the queue (the caller becomes its owner) */
#define TP_WQ_EXCL 0x2u		 /* with TP_WQ_CREATE: fail with -EADDRINUSE if it exists */
#define TP_WQ_AT_MOST_ONCE 0x4u /* with TP_WQ_CREATE: a dead worker's question is answered with
				  * -ECONNRESET instead of queued again */

struct tp_wq_options {
	size_t size;		/* sizeof(struct tp_wq_options) */
	unsigned flags;		/* TP_WQ_* */
	enum tp_access access;	/* who else may open it as a worker (creation only) */
	gid_t gid;		/* for TP_ACCESS_GROUP */
	long owner_uid;		/* the queue of this uid; -1: the caller's own */
	/* Added with queues across hosts (a caller built before, with a smaller @size, gets
	 * these defaults): who on other hosts may open the queue as a worker (creation only). */
	enum tp_remote_access remote;	 /* default TP_REMOTE_NONE */
	const char *const *remote_peers; /* TP_REMOTE_PEERS: 1..32 peer identities (borrowed) */
	size_t n_remote_peers;
};

/*
 * tp_wq_open() - open work queue @name as a worker, or with TP_WQ_CREATE create it and own it.
 * @name: a queue name, or "tpip://HOST[:PORT]/NAME" for queue NAME hosted by the daemon of HOST,
 * as tp_chan_open() says for channels: opened as a worker only if its creator allowed the link
 * (tp_wq_options.remote), -ECONNRESET naming HOST once the link fails (a worker whose link fails
 * is a dead worker there). With TP_WQ_CREATE, created there and owned by this handle only if
 * HOST's daemon sets chan-remote-create-uid (the uid that owns it there; else -ENOENT) and
 * speaks peer protocol 2.8 or later (else -EOPNOTSUPP); the owner's death, release or failed
 * link closes it as a local owner's.
 * @o: NULL for defaults (open an existing queue of the caller's uid).
 * @ret: returns an owned handle, free with tp_wq_release().
 * Return: 0, -ENOENT (no such queue, or one whose access mode refuses the caller: the same to
 * it), -EADDRINUSE, -ENOBUFS (wqs-per-uid), -EINVAL or -errno.
 */
int tp_wq_open(struct tp_context *ctx, const char *name, const struct tp_wq_options *o,
	       struct tp_wq **ret);

/* tp_wq_is_owner() - Return: whether @q is its queue's owner's handle. */
bool tp_wq_is_owner(const struct tp_wq *q);

/*
 * tp_wq_submit() - owner: queue a question (@len bytes at @data, copied). Never waits.
 * @ret_id: returns the question's id (answers carry it).
 * Return: 0, -EPIPE (closed), -ENOBUFS (wq-questions-max questions unanswered or not yet
 * received, or wq-bytes-max question bytes), -EACCES (not the owner), -EMSGSIZE (above the
 * daemon's inline limit, or, for a queue of another host, above that host's frame-max less
 * 64 KiB) or -errno.
 */
int tp_wq_submit(struct tp_wq *q, const void *data, size_t len, uint64_t *ret_id);

/*
 * tp_wq_answer() - owner: receive the oldest answer; waits up to @timeout_ms (0: try once; -1:
 * no deadline).
 * @ret_id: returns the question's id; @ret_data, @ret_len: an owned copy of the answer (free
 * with free(); NULL and 0 for an error answer).
 * Return: 0 (an answer), -ECONNRESET (the question's worker died, the queue is at-most-once:
 * *@ret_id is set), -ENOMSG (no question outstanding), -EAGAIN (@timeout_ms 0, none ready),
 * -ETIMEDOUT, -ENOBUFS (it would wait, over waits-per-uid, as tp_chan_read()) or -errno.
 */
int tp_wq_answer(struct tp_wq *q, uint64_t *ret_id, void **ret_data, size_t *ret_len,
		 int timeout_ms);

/*
 * tp_wq_take() - worker: take the oldest queued question; waits up to @timeout_ms (0: try
 * once; -1: no deadline). The question stays this handle's until answered or the handle goes.
 * @ret_id, @ret_data, @ret_len: as tp_wq_answer().
 * Return: 0, -EPIPE (closed and no question queued, or the owner is gone), -EAGAIN, -ETIMEDOUT,
 * -EMSGSIZE (a queue of another host whose oldest question this daemon's frames cannot take;
 * it stays queued), -ENOBUFS (it would wait, over waits-per-uid, as tp_chan_read()) or -errno.
 */
int tp_wq_take(struct tp_wq *q, uint64_t *ret_id, void **ret_data, size_t *ret_len,
	       int timeout_ms);

/*
 * tp_wq_reply() - worker: answer question @id, which this handle took. Never waits.
 * Return: 0, -ENOENT (this handle did not take @id), -EPIPE (the owner is gone), -ENOBUFS
 * (wq-answer-bytes-max: the question stays taken; try again), -EMSGSIZE (as tp_wq_submit(), or
 * an owner on another host whose frames cannot take the answer: it stays taken) or -errno.
 */
int tp_wq_reply(struct tp_wq *q, uint64_t id, const void *data, size_t len);

/* tp_wq_drain() - owner: wait up to @timeout_ms until every submitted question is answered
 * (taken ones included). Return: 0, -EAGAIN (@timeout_ms 0), -ETIMEDOUT or -errno. */
int tp_wq_drain(struct tp_wq *q, int timeout_ms);

/* tp_wq_close() - owner: no more submits; workers get -EPIPE once no question is queued.
 * Idempotent. Return: 0 or -errno. */
int tp_wq_close(struct tp_wq *q);

/* tp_wq_release() - drop the handle (takes @q; NULL accepted). A worker's taken questions are
 * queued again (or answered with an error); the owner's release closes and frees the queue.
 * Return: 0 or -errno (the handle is freed anyway). */
int tp_wq_release(struct tp_wq *q);

/* ---- work queue questions and answers as messages (docs/queues.md; daemon protocol minor 10) --
 *
 * A question or an answer may be a message (struct tp_message: metadata, payloads, CPU and CUDA
 * tensors), taken in two steps as a channel's message item (tp_chan_read_descriptor()): its
 * descriptor first, then its bytes into the caller's allocation. It moves as a channel's
 * message item does: its payloads and tensors back to back, its descriptor beside it, counted
 * with its bytes toward wq-bytes-max (questions) and wq-answer-bytes-max (answers); up to 16 KiB
 * inline in the frames; larger ones by reference, with no size limit but those: from a shared
 * buffer (tp_buffer_alloc()) copied by the daemon, private memory copied by the library into a
 * staging buffer first (else CMA), and read by the daemon's copy straight into CPU slots in
 * shared buffers (the others through a staging buffer). Several non-empty parts are gathered
 * into one buffer first, and CUDA tensors copied to host memory, as for channels. Everything
 * else is the byte calls': never waiting for room, requeue at a worker's death (the message
 * intact), at-most-once, drain, close and the owner's end.
 * Mixing: a byte question or answer taken by descriptor is a message of one payload (no
 * metadata); a message refuses tp_wq_take() and tp_wq_answer() with -EOPNOTSUPP and stays first
 * (a daemon decides it, so an older library sees the same). Across hosts (tpip://HOST/NAME)
 * messages need a hosting daemon of peer protocol 2.9 (-EOPNOTSUPP naming its version
 * otherwise); small ones ride inline, larger ones move by reference over the peer link's data
 * connections, straight from the sender's memory and into the reader's allocation (one
 * destination: a one-part message's shared-buffer slot, else a staging buffer), where the
 * hosting daemon speaks peer protocol 2.11 (-EMSGSIZE naming its version above the inline limit
 * otherwise); a link that fails meanwhile fails the call with -ECONNRESET, leaving nothing.
 */

/*
 * tp_wq_submit_msg() - owner: queue message @m as a question, as tp_wq_submit() (never waits),
 * at most the daemon's segments_max payloads and tensors and metadata_max metadata bytes (-E2BIG,
 * -EMSGSIZE); @m may be empty. Borrows @m: its memory may be reused once the call returns.
 * @ret_id: returns the question's id.
 * Return: as tp_wq_submit(); -EMSGSIZE (a frame above the daemon's frame-max, above the inline
 * limit without a staging buffer nor CMA or to a hosting daemon older than peer protocol 2.11),
 * -ENOBUFS also over that host's chan-peer-bytes-max, -EOPNOTSUPP (an older daemon, CUDA
 * unavailable), -EINVAL, or the daemon's copy errors (-ENOENT, -ERANGE: a shared buffer range
 * not the caller's; -EFAULT).
 */
int tp_wq_submit_msg(struct tp_wq *q, const struct tp_message *m, uint64_t *ret_id);

/*
 * tp_wq_take_descriptor() - worker: take the oldest queued question as tp_wq_take() does, and
 * describe it. The question is this handle's until replied to (tp_wq_reply() or
 * tp_wq_reply_msg()) or the handle goes; its bytes may be read (tp_wq_read_msg()) until then.
 * @ret_id: returns the question's id; @ret: returns an owned descriptor, for tp_wq_read_msg()
 * or tp_wq_descriptor_free().
 * Return: as tp_wq_take(); -EOPNOTSUPP (an older daemon), -EPROTO (a descriptor that does not
 * add up).
 */
int tp_wq_take_descriptor(struct tp_wq *q, uint64_t *ret_id, struct tp_descriptor **ret,
			  int timeout_ms);

/*
 * tp_wq_reply_msg() - worker: answer question @id with message @m, as tp_wq_reply() (never
 * waits); @m as for tp_wq_submit_msg(). Borrows @m.
 * Return: as tp_wq_reply() and tp_wq_submit_msg(); -EBUSY (a reply to @id is being copied in).
 */
int tp_wq_reply_msg(struct tp_wq *q, uint64_t id, const struct tp_message *m);

/*
 * tp_wq_answer_descriptor() - owner: receive the oldest answer as tp_wq_answer() does, and
 * describe it. The daemon holds the answer for the owner (counted as before) until
 * tp_wq_read_msg() or tp_wq_descriptor_free().
 * @ret_id: returns the question's id; @ret: returns an owned descriptor (NULL with -ECONNRESET).
 * Return: as tp_wq_answer() (-ECONNRESET: the worker died in an at-most-once queue, *@ret_id
 * set); -EOPNOTSUPP, -EPROTO.
 */
int tp_wq_answer_descriptor(struct tp_wq *q, uint64_t *ret_id, struct tp_descriptor **ret,
			    int timeout_ms);

/*
 * tp_wq_read_msg() - the question or answer @d describes into @alloc (one slot per payload and
 * tensor, as tp_chan_read_msg()): CPU slots in a shared buffer written by the daemon's copy,
 * other CPU slots through a staging buffer (else CMA), small items from the daemon's answer;
 * CUDA slots by the library on the slot's cuda_stream. Blocks until the bytes are in @alloc. A
 * question stays taken (reply to it); an answer read leaves the queue.
 * @d: taken, also on failure, except -EINVAL (the caller keeps it).
 * Return: 0; -EINVAL (@alloc does not match @d, or @d is not @q's: checked before anything is
 * sent, so only then is @d still the caller's); -ENOENT (the question is no longer this
 * handle's, or the answer was dropped); -EIO (the daemon refused the read, e.g. CMA turned off
 * for this process since it attached: the message says why); -EFAULT and other copy errors;
 * -EOPNOTSUPP (an item above the inline limit with neither a staging buffer nor CMA);
 * -EMSGSIZE (across hosts, such an item from a hosting daemon older than peer protocol 2.11);
 * -ECONNRESET (the link failed); -ETIMEDOUT.
 */
int tp_wq_read_msg(struct tp_wq *q, struct tp_descriptor *d, const struct tp_allocation *alloc);

/*
 * tp_wq_descriptor_free() - free @d unread: an answer's is dropped (it leaves the queue); a
 * question's stays taken until replied to. Takes @d; accepts NULL.
 * Return: 0, -EINVAL (not a work queue's descriptor) or -errno.
 */
int tp_wq_descriptor_free(struct tp_descriptor *d);

/* ---- daemon fan-out of pipe-set broadcasts (docs/fanout.md) ---------------------------------
 *
 * Where the daemon offers it (its bcast-pipes-max at least the set's size; 1024 by default),
 * tp_set_broadcast() sends one request naming every pipe of the set and the daemon fans the
 * message out: it reads the writer's memory once (a shared buffer in place; private memory by
 * one read into its own staging, within --bcast-stage-bytes-per-uid) and delivers it on each
 * pipe as an ordinary message, in that pipe's order. Readers see no difference. Otherwise (an
 * older daemon, more pipes than it takes, CUDA tensors with a daemon of protocol minor below
 * 11, private memory without CMA, or a pipe with writes held back by flow control) the set
 * writes each pipe itself, as before. Across hosts the daemon's fan-out crosses each peer link
 * once, CUDA tensors included, and the far daemon fans it out to its readers (both daemons of
 * this version; otherwise each delivery crosses the link).
 */
enum tp_fanout {
	TP_FANOUT_AUTO = 0,	/* the daemon's fan-out where it can, else the set's (default) */
	TP_FANOUT_LIBRARY = 1,	/* always the set's own: one write per pipe */
	TP_FANOUT_DAEMON = 2,	/* only the daemon's: tp_set_broadcast() fails with -EOPNOTSUPP
				 * where the daemon cannot fan this broadcast out */
};

/* tp_set_set_fanout() - how @s's broadcasts fan out from now on. Return: 0; -EINVAL for NULL or
 * an unknown value. */
int tp_set_set_fanout(struct tp_pipe_set *s, enum tp_fanout how);

/* tp_set_last_fanout() - how @s's last tp_set_broadcast() fanned out: TP_FANOUT_DAEMON or
 * TP_FANOUT_LIBRARY; TP_FANOUT_AUTO before the first (and for NULL). */
enum tp_fanout tp_set_last_fanout(const struct tp_pipe_set *s);

/* ---- channel items at any size, batch reads (docs/channels.md; daemon protocol minor 7) -----
 *
 * tp_chan_read() takes an item of any size up to the channel's capacity (an item above 256 KiB
 * is copied by the daemon into a staging buffer, then by the library into the new allocation,
 * or by CMA straight into it: without CMA such an item larger than the daemon's inline limit
 * fails the read with -EMSGSIZE and stays first in the channel; read it with
 * tp_chan_read_into()). The calls below need a channel of this
 * host's daemon of protocol minor 7 (-EOPNOTSUPP otherwise, or: tp_chan_read_many() and
 * tp_chan_read_many_into() take one item per call from an older daemon, and from a channel on
 * another host unless both daemons take packed reads across hosts: then several that ride
 * inline a call, docs/channels.md).
 */

/*
 * tp_chan_read_into() - tp_chan_read() into the caller's allocation @buf of @size bytes: the
 * daemon copies the item straight there with memcpy when @buf lies in a shared buffer of the
 * context (tp_buffer_alloc(); items above 16 KiB: one copy from the daemon), else into a
 * staging buffer the library copies it from (or, without one, by CMA for items above 256 KiB);
 * smaller items come inline and the library copies them. A private item another handle of
 * this host staged and lent (daemon of protocol minor 9, a context on control rings) is read
 * by mapping its writer's buffer read-only and copying it straight out: here and in
 * tp_chan_read() (the process keeps up to 8 such mappings per handle, until its release).
 * @ret_len: the item's length; with -EMSGSIZE, the length of the item that does not fit (it
 * stays first in the channel, for this or another reader).
 * A call that gives up waiting for the daemon (-ETIMEDOUT past reply_timeout_ms) may still have
 * its item copied into @buf later; that item is then returned by the handle's next read, from a
 * copy taken when the answer came.
 * Return: as tp_chan_read(), and -EMSGSIZE, -EOPNOTSUPP (another host's channel, an older
 * daemon, or @buf outside a shared buffer with neither a staging buffer nor CMA), -EINVAL.
 */
int tp_chan_read_into(struct tp_chan *ch, void *buf, size_t size, size_t *ret_len,
		      int timeout_ms);

/* An item of tp_chan_read_many() (owned: free @data with free()) or of
 * tp_chan_read_many_into() (@data borrowed, inside the caller's buffer). */
struct tp_chan_item {
	void *data;
	size_t len;
};

/*
 * tp_chan_read_many() - take up to @max items in one answer: the oldest item, waiting as
 * tp_chan_read() does, and the items that follow it in the channel, as long as each is at most
 * 256 KiB and they add up to the daemon's inline limit (a larger item comes alone, as
 * tp_chan_read() gets it). The reader whose turn it is (the oldest waiting) takes them all.
 * @items: filled with @ret_n owned items (1..@max) on success.
 * Return: as tp_chan_read() (TP_CHAN_CLOSED: the channel is closed), -EINVAL.
 */
int tp_chan_read_many(struct tp_chan *ch, struct tp_chan_item *items, size_t max,
		      size_t *ret_n, int timeout_ms);

/* Items of tp_chan_read_many_into() start at multiples of this in the caller's buffer. */
#define TP_CHAN_PACK_ALIGN 64

/*
 * tp_chan_read_many_into() - tp_chan_read_many() into the caller's buffer @buf of @size bytes,
 * with no allocation per item: the items are copied straight out of the daemon's answer into
 * @buf, packed back to back in channel order, each starting at a multiple of
 * TP_CHAN_PACK_ALIGN (64) bytes from @buf (the first at @buf itself), so that an item that
 * starts aligned in its writer's memory keeps its alignment. The daemon puts in one answer
 * only the items that fit @buf so (and @max, and its inline limit: items up to 256 KiB);
 * those that do not stay in the channel, first and in order, for this or another reader. An
 * item above 256 KiB comes into @buf as tp_chan_read_into() reads it, so one call reads any
 * item that fits @buf: alone, or, when @buf lies in one of the context's shared buffers
 * (tp_buffer_alloc()) and the daemon copies the items, with the items above 256 KiB that
 * follow it while they fit @buf packed, all copied by the daemon straight to their places;
 * or, when it is read by mapping its writer's buffer (a private item of this host's writer
 * of the same uid), with the items above 256 KiB after it in that buffer that fit, each
 * copied by the library out of the one mapping.
 * @items: @ret_n entries (1..@max) on success, each @data pointing into @buf (borrowed: the
 * caller frees nothing; valid until @buf is reused). With -EMSGSIZE, items[0].len is the
 * length of the first item, which does not fit @size: it stays first in the channel.
 * Needs a daemon that says it takes packed reads (this version's; tpipd answers a channel's
 * open so): with an older daemon, and for a channel of another host, each call reads one item
 * into @buf as tp_chan_read_into() does; with a daemon before protocol minor 7 (or another
 * host's that streams no large item) one item as tp_chan_read() reads it, copied into @buf
 * (then an item that does not fit stays with the handle, not the channel: -EMSGSIZE, and
 * the handle's next read returns it). Items that came after a call gave up waiting
 * (-ETIMEDOUT, as tp_chan_read_into()) are returned first by the handle's next read.
 * Return: as tp_chan_read_many() (0, TP_CHAN_CLOSED: the channel is closed; -EPIPE: closed
 * and drained; -EAGAIN: empty with @timeout_ms 0; -EOPNOTSUPP: the oldest item is a message),
 * -EMSGSIZE, -EINVAL (NULL argument, @size or @max 0).
 */
int tp_chan_read_many_into(struct tp_chan *ch, void *buf, size_t size,
			   struct tp_chan_item *items, size_t max, size_t *ret_n, int timeout_ms);

/* ---- channel items as messages (docs/channels.md; daemon protocol minor 8) -----------------
 *
 * An item may be a message, as a pipe carries (struct tp_message: metadata, payloads, CPU and
 * CUDA tensors), read in two steps as from a pipe: its descriptor first, then the bytes into the
 * reader's allocation. A message item moves as a byte item of its payloads and tensors back to
 * back, its descriptor beside it: the same capacity (its bytes and its descriptor's count),
 * limits, backpressure, close and fairness. Mixing: a byte item read with
 * tp_chan_read_descriptor() is a message of one payload (no metadata); a message item refuses
 * tp_chan_read(), tp_chan_read_into() and tp_chan_read_many() with -EOPNOTSUPP and stays first
 * in the channel (a daemon or library of minor 7 sees the same). These calls need a daemon of
 * protocol minor 8, and across hosts a hosting daemon that takes messages (-EOPNOTSUPP
 * otherwise).
 */

/*
 * tp_chan_write_msgs() - append @n messages as items, atomically and contiguously, as
 * tp_chan_write() does (the same @timeout_ms, results and limits), at most the daemon's
 * segments_max payloads and tensors and metadata_max metadata bytes per message (-E2BIG,
 * -EMSGSIZE). A message of one non-empty CPU payload or tensor goes exactly as a byte item
 * (from a shared buffer by the daemon's copy, private memory staged or by CMA); the parts of a
 * message of several are first gathered into one item by the library. A CUDA tensor is copied
 * to host memory by the library after the work queued on its cuda_stream (the call waits for
 * it); the reader's descriptor keeps its device and target. Borrows @msgs.
 * Return: as tp_chan_write(); -EMSGSIZE also for a batch whose descriptors and inline bytes
 * exceed the daemon's frame limit (--frame-max); -EOPNOTSUPP (an older daemon, CUDA
 * unavailable), -EINVAL.
 */
int tp_chan_write_msgs(struct tp_chan *ch, const struct tp_message *msgs, size_t n,
		       int timeout_ms);

/*
 * tp_chan_read_descriptor() - take the oldest item, waiting as tp_chan_read() does, and describe
 * it. The daemon holds the item for the handle until tp_chan_read_msg() or
 * tp_chan_descriptor_free(); meanwhile it is out of the channel (still charged to it) and a
 * channel closed meanwhile is not drained. If the handle is released first, the item goes back
 * to the head of the channel, for the next reader. A handle holds one item at most: another
 * call before then describes the same item again. A call that gave up waiting for the daemon
 * (-ETIMEDOUT past reply_timeout_ms) loses nothing: the daemon holds the item it hands out
 * later for the handle, and its descriptor is kept on the handle and returned by the next call
 * (at once, or as soon as it comes while that call waits); released first, the handle's held
 * item goes back to the head of the channel. Items kept on the handle for byte reads that gave
 * up (tp_chan_read()) are returned by the byte reads, not by this call.
 * @ret: returns an owned descriptor, for tp_chan_read_msg() or tp_chan_descriptor_free().
 * Return: 0, TP_CHAN_CLOSED (the channel is closed), -EPIPE, -EAGAIN, -ETIMEDOUT as
 * tp_chan_read(); -EOPNOTSUPP, -EPROTO (a descriptor that does not add up).
 */
int tp_chan_read_descriptor(struct tp_chan *ch, struct tp_descriptor **ret, int timeout_ms);

/*
 * tp_chan_read_msg() - the item described by @d into @alloc (one slot per payload and tensor,
 * as tp_pipe_read()): CPU slots in a shared buffer (tp_buffer_alloc()) are written by the
 * daemon's copy, other CPU slots as tp_chan_read_into() writes private memory (a staging buffer
 * the library copies from, else CMA), small items straight from the daemon's answer; CUDA slots
 * are written by the library from host memory on the slot's cuda_stream, and the call waits
 * for that stream. Blocks until the bytes are in @alloc.
 * @d: taken, also on failure, except -EINVAL (the caller keeps it).
 * Return: 0; -EINVAL (@alloc does not match @d, or @d is not @ch's: checked before anything
 * is sent, so only then is @d still the caller's); -EIO (the daemon refused the read, e.g. CMA
 * turned off for this process since it attached: the message says why); -EFAULT and other copy
 * errors (the item goes back to the head of the channel); -EOPNOTSUPP (an item above the
 * inline limit with neither a staging buffer nor CMA for its slots outside shared buffers, or
 * on a channel that takes items inline only: the item stays held, and goes back on release);
 * -ETIMEDOUT (no answer within the reply timeout: @alloc is not written; an item answered
 * inline later, which the daemon no longer has, is kept on the handle: the next
 * tp_chan_read_descriptor() describes it and tp_chan_read_msg() copies it from there, or
 * tp_chan_release() writes it back to the channel; a large item copied by the daemon may still
 * be copied into shared-buffer slots of @alloc later, and is not kept).
 */
int tp_chan_read_msg(struct tp_chan *ch, struct tp_descriptor *d,
		     const struct tp_allocation *alloc);

/*
 * tp_chan_descriptor_free() - drop the item @d describes, unread, as a pipe drops a message
 * whose descriptor is freed: it leaves the channel (counted as read). Takes @d; accepts NULL.
 * Return: 0 or -errno (the item then stays held, and goes back to the channel on release).
 */
int tp_chan_descriptor_free(struct tp_descriptor *d);

/* ---- a user reduction on CUDA memory ------------------------------------------------------- */

/*
 * A user reduction on the device (torch-ipc's reduce function on GPU tensors): fold @in into
 * @inout, @count elements of @dtype each, both device memory of the group's CUDA device, by work
 * queued on @cuda_stream (CUstream / cudaStream_t: the stream of the group's collective options,
 * NULL the legacy default stream). It may return before that work ends: the library waits for
 * the stream before it uses @inout. Called on a library or caller thread with the device's
 * context current, possibly on several members at once for different slices; it must be
 * deterministic for results to be identical everywhere. Borrows @inout and @in until the work
 * it queued has run.
 */
typedef void (*tp_reduce_cuda_fn)(void *inout, const void *in, size_t count, enum tp_dtype dtype,
				  void *cuda_stream, void *user);

/*
 * tp_allreduce_cuda_fn() - all-reduce of @count elements of CUDA memory with @fn, for a group
 * whose collective options name a CUDA device (tp_group_set_coll_options()). The collective
 * runs on host copies as for every CUDA call; each fold copies its two operands to the device
 * (scratch memory the library allocates for the call and frees), calls @fn on the options'
 * stream, and copies the result back after that stream. A fold that fails (a CUDA error) aborts
 * the group: the other members would otherwise take a result this member never computed.
 * Borrows @send, @recv (device memory; equal for in place) and @user for the call.
 * Return: 0; -EINVAL (no @fn, or the group's options are not CUDA), -EOPNOTSUPP (no CUDA),
 * the errors of tp_allreduce_fn(); a CUDA error of a fold as its -errno.
 */
int tp_allreduce_cuda_fn(struct tp_group *g, const void *send, void *recv, size_t count,
			 enum tp_dtype dtype, tp_reduce_cuda_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif
