/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_session: one attached client (a libtpclient context or tpipctl): its peer credentials,
 * admission, Hello deadline and life cycle, its connection (conn.h: frame reading with fd
 * passing, the output queue, the control rings), and the session's tables of pipe ends, shared
 * buffers and listeners. Each complete frame goes to sessmsg.c (bounded unpack, validation, the
 * handlers that dispatch requests to the listener registry and to pipes). A protocol violation
 * closes this session only; it is closed from its own deferred event, never in the middle of a
 * handler.
 */
#ifndef TPD_SESSION_H
#define TPD_SESSION_H

#include <stdarg.h>
#include <sys/types.h>
#include <sys/uio.h>
#include "buffer.h"
#include "conn.h"
#include "hmap.h"
#include "local.h"
#include "ring.h"
#include "tpb.h"
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_listener;
struct tpd_pipe_end;

struct tpd_session {
	struct tpu_list node;
	struct tpd_daemon *d;
	uint64_t id;
	struct tpd_conn conn; /* its socket, or its control rings (conn.c) */
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
	bool pipe_ring;	       /* Hello.pipe_ring (issue 27) */
	bool pipe_ring_addr;   /* Hello.pipe_ring_addr (issue 27, clients without CMA) */
	bool group_arena_fd;   /* Hello.group_arena_fd: takes group arenas as sealed memfds */
	bool ended_clean;      /* the client said SessionEnd: its disconnect is a clean close */
	struct event *ev_close;
	struct tpd_uid_acct *acct; /* the uid's quota account (quota.c), NULL until admitted */
	struct event *ev_hello;	 /* Hello deadline */
	struct tpu_hmap pipes;	 /* local pipe id -> struct tpd_pipe_end */
	struct tpu_hmap buffers; /* buf_id -> struct tpb_buffer */
	uint64_t buffer_bytes;
	unsigned n_staging;	/* of @buffers, registered as staging buffers */
	uint64_t staging_bytes; /* their bytes (of @buffer_bytes) */
	struct tpu_list listeners;
	unsigned n_listeners;
	uint64_t next_accept_id;
	uint64_t attached_ns;
	bool ring_allowed;	    /* RingSetup may come: the next frame after a client's Hello */
	struct tpb_cuda_holds *cuda; /* CUDA mappings held (local/devmem.c), NULL until used */
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
 * tpd_session_send() - queue a frame of @m followed by @n_tail data pieces (tpd_conn_send()).
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
 * TPIPD_CLIENT_UID fields. Below err, within the budget of the session's uid
 * (tpd_session_log_ok()). */
/*
 * tpd_session_log_ok() - may a line a client provokes at will, under the name @key (a uid for
 * tpd_session_log(); the uids or peer of a pipe's ends for a line about the pipe alone), be
 * logged now? TPD_SESSION_LOG_BURST lines of one name in each TPD_SESSION_LOG_WINDOW_MS,
 * TPD_SESSION_LOG_ALL_BURST of all names together. Safe from any thread.
 * @ret_held: lines of that name held back since its last logged one (written when true).
 * Return: true to log.
 */
bool tpd_session_log_ok(struct tpd_daemon *d, const char *key, unsigned *ret_held);

void tpd_session_log(const struct tpd_session *s, int level, const char *fmt, ...)
	_printf_(3, 4);

/* Returns borrowed buffer (@id, @gen) of @s, or NULL. */
struct tpb_buffer *tpd_session_buffer(struct tpd_session *s, uint64_t id, uint64_t gen);

/*
 * tpd_session_buffer_range() - [@ref->offset, + @len) of @s's shared buffer @ref (what a
 * client's segment names: hostile, checked here once for every user).
 * @ret_b: the buffer (borrowed); @ret_ptr: the range's first byte in the daemon's mapping.
 * Return: 0, -ENOENT (no such buffer of this session) or -ERANGE (outside it), with @why.
 */
int tpd_session_buffer_range(struct tpd_session *s, const Tpw__V1__ShmRef *ref, uint64_t len,
			     struct tpb_buffer **ret_b, void **ret_ptr, char *why, size_t wl);

/* Sends Reply{req_id, status from @err, @why, id, remote_name}. */
void tpd_session_reply(struct tpd_session *s, uint64_t req_id, int err, const char *why, uint64_t id,
		       const char *remote_name);

/* May @s name addresses in its own process (CMA)? Its Hello probe succeeded and no access
 * has been refused since. */
bool tpd_session_cma(const struct tpd_session *s);

/* Had @s CMA, and has it been turned off since (a refused access)? Said in every WriteDone and
 * ReadDone, so that the client stages from then on. */
bool tpd_session_cma_revoked(const struct tpd_session *s);

/* Number of pipe ends attached to @s. */
unsigned tpd_session_pipe_count(const struct tpd_session *s);

/*
 * What the broker reads of a session (the broker does not reach into struct tpd_session). Each
 * borrows @s for the call; a pointer returned is borrowed from @s.
 */

/* The session's number (HelloReply.session_id, tpipctl's SESSION). */
uint64_t tpd_session_id(const struct tpd_session *s);

/* Has @s failed (its close is pending)? */
bool tpd_session_dead(const struct tpd_session *s);

/* Why @s failed; STATUS_UNSPECIFIED (0) while it lives. */
Tpw__V1__Status tpd_session_dead_status(const struct tpd_session *s);

/* The protocol minor version @s's client said Hello with (what it understands). */
uint32_t tpd_session_client_minor(const struct tpd_session *s);

/* Can @s's library serve pipe rings (Hello.pipe_ring, a client on control rings, which can
 * take fds beside them)? */
bool tpd_session_pipe_ring(const struct tpd_session *s);
/* ... and take a ring offered to a writer without CMA, answering ring-only messages by
 * ring_addr (Hello.pipe_ring_addr)? Borrows @s. */
bool tpd_session_pipe_ring_addr(const struct tpd_session *s);

/* tpd_conn_send_fd() on @s's connection. Borrows @s and @fd. Return: as that. */
int tpd_session_send_fd(struct tpd_session *s, int fd);

/* tpd_conn_send_with_fd() on @s's connection: @m with @fd ahead of it, on a ring session or on
 * the socket. Borrows @s, @m and @fd. Return: as that. */
int tpd_session_send_with_fd(struct tpd_session *s, Tpw__V1__DaemonMsg *m, int fd);

/*
 * tpd_session_proc() - the client process pinned at attach.
 * Return: borrowed pointer, valid until @s is freed (tpb_proc_ref() to keep it longer); NULL
 * if none was pinned (no CMA).
 */
struct tpb_proc *tpd_session_proc(const struct tpd_session *s);

/* The client's peer credentials (SO_PEERCRED at attach). */
uid_t tpd_session_uid(const struct tpd_session *s);
gid_t tpd_session_gid(const struct tpd_session *s);
pid_t tpd_session_pid(const struct tpd_session *s);

/* Is @g @s's client's group, primary or supplementary (SO_PEERGROUPS at attach)? */
bool tpd_session_in_group(const struct tpd_session *s, gid_t g);

/*
 * tpd_session_daemon() - the daemon @s is attached to.
 * Return: borrowed pointer, owned by the daemon (core/), valid as long as @s.
 */
struct tpd_daemon *tpd_session_daemon(const struct tpd_session *s);

/*
 * tpd_session_comm() - the client's command name (/proc/PID/comm at attach).
 * Return: borrowed string, owned by @s, valid until @s is freed; never NULL.
 */
const char *tpd_session_comm(const struct tpd_session *s);

/* The role the client said Hello with (ROLE_UNSPECIFIED before Hello). */
Tpw__V1__Role tpd_session_role(const struct tpd_session *s);

/* Number of listeners @s registered and still holds. */
unsigned tpd_session_listener_count(const struct tpd_session *s);

/* Number of shared buffers @s registered, and their bytes in all. */
unsigned tpd_session_buffer_count(const struct tpd_session *s);
uint64_t tpd_session_buffer_bytes(const struct tpd_session *s);
/* Of those, the ones its library registered as staging buffers, and their bytes. */
unsigned tpd_session_staging_count(const struct tpd_session *s);
uint64_t tpd_session_staging_bytes(const struct tpd_session *s);

/*
 * tpd_session_conn() - @s's connection (conn.h: its transport and byte counts).
 * Return: borrowed pointer, owned by @s (embedded in it), valid until @s is freed.
 */
const struct tpd_conn *tpd_session_conn(const struct tpd_session *s);

/* May @s's client use listener @l (borrowed), by its credentials (tpd_listener_permits())? */
bool tpd_session_permitted(const struct tpd_session *s, const struct tpd_listener *l);

/*
 * tpd_session_name() - the client's name (Hello.name, or "comm:pid").
 * Return: borrowed string, valid until @s is freed; NULL before Hello.
 */
const char *tpd_session_name(const struct tpd_session *s);

/*
 * tpd_session_pipe_find() - the pipe end @s knows as its local pipe id @id.
 * Return: borrowed pointer, NULL if none.
 */
struct tpd_pipe_end *tpd_session_pipe_find(const struct tpd_session *s, uint64_t id);

/*
 * tpd_session_pipe_add() - file pipe end @e under @s's local pipe id @id.
 * @e: borrowed; @s keeps the pointer until tpd_session_pipe_remove() or until @s is freed
 * (which detaches @e, tpd_pipe_end_detach()).
 * Return: 0, -EEXIST if @id is taken, -EINVAL for id 0, or -ENOMEM.
 */
int tpd_session_pipe_add(struct tpd_session *s, uint64_t id, struct tpd_pipe_end *e);

/* Forgets @s's local pipe id @id (no-op if none). */
void tpd_session_pipe_remove(struct tpd_session *s, uint64_t id);

#endif
