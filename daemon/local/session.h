/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_session: one attached client (a libtpclient context or tpipctl). Owns the connection:
 * peer credentials, frame reading with fd passing, the output queue, the control rings, and the
 * session's tables of pipe ends, shared buffers and listeners. Each complete frame goes to
 * sessmsg.c (bounded unpack, validation, the handlers that dispatch requests to the listener
 * registry and to pipes). A protocol violation closes this session only; it is closed from its
 * own deferred event, never in the middle of a handler.
 */
#ifndef TPD_SESSION_H
#define TPD_SESSION_H

#include <stdarg.h>
#include <sys/types.h>
#include <sys/uio.h>
#include "buffer.h"
#include "hmap.h"
#include "ring.h"
#include "tpb.h"
#include "tpu.h"
#include "tpw.pb-c.h"

#define TPD_SEND_TAIL_MAX 8 /* data pieces a frame sent by tpd_session_send() may carry inline */

struct tpd_daemon;

struct tpd_session {
	struct tpu_list node;
	struct tpd_daemon *d;
	uint64_t id;
	int fd;
	pid_t pid;  /* at attach, for messages: CMA goes through @proc only */
	uid_t uid;
	gid_t gid;
	gid_t *groups;
	size_t n_groups;
	char comm[32];
	char *name;
	Tpw__V1__Role role;
	bool hello_done;
	bool cma_ok; /* the Hello probe succeeded; see tpd_session_cma() */
	/* The client process pinned at attach (NULL: none, so no CMA); owned reference. */
	struct tpb_proc *proc;
	bool dead;
	Tpw__V1__Status dead_status;
	uint32_t client_minor; /* Hello.minor: what the client understands */
	bool ended_clean;      /* the client said SessionEnd: its disconnect is a clean close */
	struct event *ev_read;
	struct event *ev_write;
	struct event *ev_close;
	uint8_t *in;
	size_t in_len, in_cap;
	size_t in_charged;	 /* input buffer bytes charged to the uid's quota */
	struct tpd_uid_acct *acct; /* the uid's quota account (quota.c), NULL until admitted */
	struct event *ev_hello;	 /* Hello deadline */
	int fdq[16];
	unsigned n_fdq;
	struct tpu_list outq;
	uint64_t outq_bytes;
	uint64_t seq_out;
	struct tpu_hmap pipes;	 /* local pipe id -> struct tpd_pipe_end */
	struct tpu_hmap buffers; /* buf_id -> struct tpb_buffer */
	uint64_t buffer_bytes;
	struct tpu_list listeners;
	unsigned n_listeners;
	uint64_t next_accept_id;
	uint64_t bytes_in, bytes_out;
	uint64_t attached_ns;
	/* Shared-memory control rings (RingSetup): once `ring` is set, frames travel in
	 * them and the socket only carries doorbell bytes, fds and the end of the session. */
	bool ring;
	bool ring_allowed;	    /* RingSetup may come: the next frame after a client's Hello */
	uint32_t ring_size;	    /* data bytes per direction */
	void *ring_map;		    /* tpu_ring_map_size(ring_size) bytes */
	struct tpu_ring ring_tx;    /* daemon -> client */
	struct tpu_ring ring_rx;    /* client -> daemon */
	struct tpb_cuda_holds *cuda; /* CUDA mappings held (daemon/devmem.c), NULL until used */
};

/*
 * tpd_session_new() - attach a client on accepted socket @fd.
 * @fd: takes @fd (also on failure).
 * @ret: returns borrowed session, owned by the daemon's list; it frees itself when it ends.
 * Return: 0 or -errno.
 */
int tpd_session_new(struct tpd_daemon *d, int fd, struct tpd_session **ret);

/* Closes and frees @s at once (daemon shutdown). Its pipes fail with @why. */
void tpd_session_free(struct tpd_session *s, Tpw__V1__Status why);

/*
 * tpd_session_send() - queue a frame of @m followed by @n_tail data pieces.
 * @m, @tail: borrowed; copied into the output queue.
 * A session whose output queue would exceed the limit is failed. Sending to a dead session is a
 * no-op. Return: 0 or -errno.
 */
int tpd_session_send(struct tpd_session *s, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		     int n_tail);

/* Marks @s dead with @status (PEER_DIED for a vanished client), logs @fmt at @level, and
 * schedules its close. Idempotent. */
void tpd_session_fail(struct tpd_session *s, int level, Tpw__V1__Status status, const char *fmt,
		      ...) _printf_(4, 5);

/*
 * tpd_session_end() - end @s on the daemon's initiative: tell a client that understands it
 * (minor >= 4) why with SessionEnd{@status, @msg}, flush what is queued (best effort), then
 * tpd_session_fail() with @status and @msg logged at @level.
 */
void tpd_session_end(struct tpd_session *s, int level, Tpw__V1__Status status, const char *msg);

/* Logs "session N (pid P, comm): ..." with TPIPD_SESSION, TPIPD_CLIENT_PID and
 * TPIPD_CLIENT_UID fields. */
void tpd_session_log(const struct tpd_session *s, int level, const char *fmt, ...)
	_printf_(3, 4);

/* Returns borrowed buffer (@id, @gen) of @s, or NULL. */
struct tpb_buffer *tpd_session_buffer(struct tpd_session *s, uint64_t id, uint64_t gen);

/* Sends Reply{req_id, status from @err, @why, id, remote_name}. */
void tpd_session_reply(struct tpd_session *s, uint64_t req_id, int err, const char *why, uint64_t id,
		       const char *remote_name);

/*
 * tpd_session_ring_poll() - for the daemon's spin loop: take what @s's ring holds and push
 * queued output into it. Return: true if anything moved.
 */
bool tpd_session_ring_poll(struct tpd_session *s);

/*
 * tpd_session_ring_sleep() - before the daemon sleeps: set @s's sleeping flag so that its
 * client rings the doorbell. Return: true if data arrived meanwhile (do not sleep).
 */
bool tpd_session_ring_sleep(struct tpd_session *s);

/* Withdraws @s's sleeping flag while the daemon polls. */
void tpd_session_ring_wake(struct tpd_session *s);

/*
 * tpd_session_ring_take_side() - take the fds waiting on the socket of ring session @s into its
 * fd queue (a ring client sends them before it writes the frame that announces them); doorbell
 * bytes are dropped. Too many or truncated fds fail @s.
 */
void tpd_session_ring_take_side(struct tpd_session *s);

/* May @s name addresses in its own process (CMA)? Its Hello probe succeeded and no access
 * has been refused since. */
bool tpd_session_cma(const struct tpd_session *s);

/* Had @s CMA, and has it been turned off since (a refused access)? Said in every WriteDone and
 * ReadDone, so that the client stages from then on. */
bool tpd_session_cma_revoked(const struct tpd_session *s);

/* Number of pipe ends attached to @s. */
unsigned tpd_session_pipe_count(const struct tpd_session *s);

#endif
