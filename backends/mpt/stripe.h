/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_stripe: the data connections of one peer link and the threads that move tensor bytes over
 * them ("mpt": one large tensor is cut into chunks striped across every connection). Each
 * connection has a sender thread (chunks queued by tpb_stripe_send()) and a receiver thread
 * (chunks land straight in the destination registered by tpb_stripe_recv(): into a mapping the
 * daemon holds, or into a client's memory by CMA through a bounce buffer). Both directions use
 * every connection. Completions come back through a completion queue (cq.h) whose eventfd the
 * owner polls on its loop, calling tpb_stripe_progress(): the stripe never touches the loop. The
 * stripe knows nothing about pipes, sessions or the control connection: the peer
 * link tells the receiver how many bytes to expect and when a sender gave up.
 *
 * Chunk on the wire (all little endian), followed by @len raw bytes:
 *   0  u32 magic   TPB_STRIPE_MAGIC ("TPC1")
 *   4  u32 seg     segment index in the transfer
 *   8  u64 xfer_id the receiver's transfer id
 *  16  u64 offset  byte offset inside the segment
 *  24  u32 len     1 .. TPB_STRIPE_CHUNK_MAX (senders cut at their configured chunk size)
 *  28  u32 flags   0
 * A receive takes each of its bytes once: a chunk that overlaps one already taken (or being
 * written) for the same transfer is a protocol violation, so a transfer is complete only once
 * every byte of it (or of the prefix its sender ended at) was written by the peer, never when the
 * right number of bytes came. Its pieces are kept as ranges, at most TPB_STRIPE_PIECES_MAX apart.
 */
#ifndef TPB_STRIPE_H
#define TPB_STRIPE_H

#include <stdint.h>
#include "tpb.h"
#include "tpu.h"
#include "../base/work.h"

#define TPB_STRIPE_MAGIC 0x31435054u /* "TPC1" */
#define TPB_STRIPE_HDR 32
#define TPB_STRIPE_CONNS_MAX 16
#define TPB_STRIPE_CHUNK_MAX (16u << 20) /* larger chunks are a protocol violation */
/* Separate ranges one receive may hold while its chunks arrive out of order (each connection
 * delivers its chunks in order, so a sender leaves about one gap per connection and chunk
 * queued in its socket): more is a protocol violation. */
#define TPB_STRIPE_PIECES_MAX 4096u
#define TPB_STRIPE_SEND_SIZE_MIN 4096u

struct tpb_buffer;
struct tpb_stripe;
struct tpb_stripe_xfer;

typedef void (*tpb_stripe_done_fn)(struct tpb_stripe_xfer *x);
/* A connection failed (peer closed it, reset, protocol violation): @why names it. */
typedef void (*tpb_stripe_error_fn)(struct tpb_stripe *st, int err, const char *why, void *arg);

/* One source or destination range: a pointer in the daemon (TPB_LOC_LOCAL) or an address in a
 * client process (TPB_LOC_PROCESS, reached by process_vm_readv/writev). */
struct tpb_stripe_seg {
	struct tpb_mem mem;
	uint64_t len;
	/* TPB_LOC_LOCAL in a client's shared buffer: that buffer (borrowed; whoever builds the
	 * transfer holds a reference until it ends), for RDMA registration; else NULL */
	struct tpb_buffer *buf;
};

struct tpb_stripe_xfer {
	/* Set by the caller; borrowed by the stripe until @done has run. */
	uint64_t xfer_id;		/* receive: the id chunks carry; send: the id to tag */
	const struct tpb_stripe_seg *segs;
	size_t n_segs;
	tpb_stripe_done_fn done;	/* runs once, from tpb_stripe_progress(), not in a call */
	void *arg;

	/* Results, valid in @done. */
	int status;			/* 0, or -errno (-ECANCELED, -ECONNRESET, -EFAULT, ...) */
	char why[160];			/* reason when @status < 0 */
	uint64_t bytes;			/* bytes sent (send) or received (receive: each byte once) */
	bool exact;			/* receive: the bytes received are the first @bytes of the
					 * transfer (a transfer ended early by its sender, see
					 * tpb_stripe_recv_expect(), is whole only then) */
	uint64_t ns;			/* time from start to done */

	/* Private to the stripe (guarded by its lock while the transfer is active). */
	struct tpb_work_job work;	/* send: the job its senders claim chunks of (work.h);
					 * both: work.node is its place in the done queue */
	uint64_t total, start_ns, expect;
	int expect_status, busy;	/* receive: busy: chunks a thread is writing right now */
	uint64_t progress;		/* receive: payload bytes read for it, chunks being read
					 * included (atomic) */
	bool canceled, is_recv, queued_done; /* receive */
	bool broken;			/* receive: a chunk was cut short by a failed connection */
	char expect_why[160];
	struct tpu_ranges got;		/* receive: the bytes taken or being written (offsets in the
					 * transfer, segments back to back) */
};

struct tpb_stripe_config {
	uint32_t chunk;		/* bytes per chunk (default 1 MiB when 0, at most 16 MiB) */
	uint32_t send_size;	/* bytes per socket write (default 60 KiB when 0, at least 4 KiB) */
	const char *name;	/* for log lines and thread names, e.g. "peer 3" */
	tpb_stripe_error_fn on_error; /* runs once per stripe, from tpb_stripe_progress() */
	void *arg;
};

/*
 * tpb_stripe_new() - an empty stripe; its completions wait for tpb_stripe_progress().
 * @cfg: borrowed; copied (@cfg->name too).
 * @ret: returns owned stripe, free with tpb_stripe_free().
 * Return: 0, -EINVAL for a chunk size over TPB_STRIPE_CHUNK_MAX or a send size under
 * TPB_STRIPE_SEND_SIZE_MIN, or -errno.
 */
int tpb_stripe_new(const struct tpb_stripe_config *cfg, struct tpb_stripe **ret);

/*
 * tpb_stripe_event_fd() - the fd that turns readable when completions (or a connection failure
 * to report) wait: the owner polls it on its loop and calls tpb_stripe_progress(). Borrows @st.
 * Return: the fd, borrowed (valid until tpb_stripe_free(); never close it).
 */
int tpb_stripe_event_fd(const struct tpb_stripe *st);

/*
 * tpb_stripe_progress() - on the calling (loop) thread, run the done callbacks of completed
 * transfers, then the on_error callback once if a connection failed; never blocks. Any callback
 * may free @st: the caller must not touch @st after this call unless it knows none did.
 * Borrows @st. Return: how many done callbacks ran.
 */
int tpb_stripe_progress(struct tpb_stripe *st);

/*
 * tpb_stripe_add_conn() - add a connected, handshaken TCP socket and start its two threads.
 * @fd: takes @fd (also on failure). It is switched to blocking mode with TCP_NODELAY.
 * Return: 0, -E2BIG over TPB_STRIPE_CONNS_MAX, or -errno.
 */
int tpb_stripe_add_conn(struct tpb_stripe *st, int fd);

struct ssl_st;

/*
 * tpb_stripe_add_conn_tls() - tpb_stripe_add_conn() for a connection whose TLS handshake is
 * done: chunks travel through @ssl (SSL_read/SSL_write, kTLS when OpenSSL set it up), the socket
 * stays non-blocking. @ssl NULL is tpb_stripe_add_conn().
 * @fd, @ssl: takes both (also on failure); @ssl is freed, without a TLS shutdown, with the stripe.
 * Return: as tpb_stripe_add_conn().
 */
int tpb_stripe_add_conn_tls(struct tpb_stripe *st, int fd, struct ssl_st *ssl);

/* Connections added and not failed. */
unsigned tpb_stripe_conns(const struct tpb_stripe *st);

/*
 * tpb_stripe_send() - send every segment of @x, tagged with @x->xfer_id, in chunks spread over
 * all connections. Reads a TPB_LOC_PROCESS source with process_vm_readv into a per-thread bounce
 * buffer just before sending that chunk; a failed read ends the transfer with that error (chunks
 * already sent stay sent, a chunk is never sent half). @done runs once every chunk is written
 * to a socket or the transfer failed or was canceled; @x->bytes says how many were sent.
 * @x: keeps @x (and its segments' memory) until @done.
 * Return: 0, -ENOTCONN without connections, -EINVAL for more than UINT32_MAX segments or a
 * total size that overflows (no @done).
 */
int tpb_stripe_send(struct tpb_stripe *st, struct tpb_stripe_xfer *x);

/* Stops sending @x's chunks not yet started; @done then runs with -ECANCELED once no thread
 * reads @x's memory. No-op once @done is queued. */
void tpb_stripe_send_cancel(struct tpb_stripe *st, struct tpb_stripe_xfer *x);

/*
 * tpb_stripe_recv() - register @x as the destination of incoming chunks tagged @x->xfer_id.
 * Chunks land at seg/offset; one that falls outside @x's segments is a protocol violation
 * (on_error). @done runs with status 0 once all of @x's bytes have arrived, or as set by
 * tpb_stripe_recv_expect(). A CMA write that fails (process gone: -ESRCH, bad address:
 * -EFAULT) sets that status; the rest of the transfer is still drained from the sockets.
 * @x: keeps @x (and its segments' memory) until @done.
 * Return: 0, -EEXIST for a registered id, -EINVAL for id 0, -ENOTCONN without connections
 * (no @done).
 */
int tpb_stripe_recv(struct tpb_stripe *st, struct tpb_stripe_xfer *x);

/* The sender ended @x after @bytes with @status (its PeerXferEnd): complete @x once @bytes have
 * arrived, with @status (and @why). A status of 0 with all bytes is a no-op. An owner that takes
 * such a transfer's first @bytes as whole checks @x->exact: the right count of bytes may lie
 * anywhere in the transfer. */
void tpb_stripe_recv_expect(struct tpb_stripe *st, struct tpb_stripe_xfer *x, uint64_t bytes,
			    int status, const char *why);

/* Stops writing into @x's memory: later chunks for it are read and dropped; @done runs with
 * -ECANCELED once no thread writes @x's memory. No-op once @done is queued. */
void tpb_stripe_recv_cancel(struct tpb_stripe *st, struct tpb_stripe_xfer *x);

/* tpb_stripe_recv_progress() - payload bytes read for receive @x so far, chunks still being read
 * included (it moves while an honest sender's large chunk arrives slowly). */
uint64_t tpb_stripe_recv_progress(const struct tpb_stripe_xfer *x);

/*
 * tpb_stripe_recv_stalled() - the sender of @x stopped sending it: @done runs with -ETIMEDOUT
 * (@why) once no thread writes @x's memory; later chunks for it are dropped. A connection in the
 * middle of one of @x's chunks, waiting for the peer's bytes, is failed (the peer stalled it
 * there: nothing else would get the thread out of @x's memory); one copying into a process's
 * memory is left to finish. No-op once @done is queued.
 */
void tpb_stripe_recv_stalled(struct tpb_stripe *st, struct tpb_stripe_xfer *x, const char *why);

/* tpb_stripe_local_busy() - whether a connection's thread is in a copy from or into a process's
 * memory right now (CMA, CUDA staging): a stall there is local (a file mapping behind a slow
 * server, say), not the peer's. */
bool tpb_stripe_local_busy(const struct tpb_stripe *st);

/* Bytes of chunk payload sent and received over all connections (approximate while running). */
uint64_t tpb_stripe_bytes_sent(const struct tpb_stripe *st);
uint64_t tpb_stripe_bytes_received(const struct tpb_stripe *st);

/*
 * tpb_stripe_free() - shut every connection down, join the threads, and run the @done of every
 * transfer still registered or queued with -ECONNRESET ("peer link closed"), before returning,
 * on the calling (loop) thread. Accepts NULL.
 */
void tpb_stripe_free(struct tpb_stripe *st);

#endif
