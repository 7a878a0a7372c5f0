/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client-side helpers shared by the integration suites (they link libtpclient): contexts on a
 * test daemon, messages built from a spec with deterministic contents in private or shared
 * memory, reading a message back and checking every count, length, metadata byte and data byte,
 * and a two-process transfer (reader + writer children) driven by a spec. Everything here runs
 * in forked children: failures are printed and returned, never asserted.
 */
#ifndef TPT_ITEST_H
#define TPT_ITEST_H

#include <check.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tpclient.h"
#include "tpt.h"

/* Where a segment's bytes live. */
enum tpt_mem {
	TPT_MEM_PRIVATE, /* malloc */
	TPT_MEM_SHM,	 /* one tp_buffer_alloc() per segment */
	TPT_MEM_SLAB,	 /* all segments carved at odd offsets from one tp_buffer_alloc() */
	TPT_MEM_MIXED,	 /* alternate private / shm per segment */
};

const char *tpt_mem_name(enum tpt_mem m);

#define TPT_SEGS_MAX 132

/* What a message holds. Contents and metadata derive from (pipe, index). */
struct tpt_msg_spec {
	unsigned pipe, index;
	size_t n_payloads, n_tensors;
	size_t lens[TPT_SEGS_MAX]; /* payloads first, then tensors */
	size_t meta_len;	   /* bytes of message metadata (0: none) */
	size_t seg_meta_len;	   /* bytes of metadata per payload and tensor (0: none) */
	bool tensor_target;	   /* tensors ask for CUDA device 1 on the reader */
};

/* A built message; owns its data (free with tpt_msg_free()). */
struct tpt_msg {
	struct tp_message m;
	struct tp_payload payloads[TPT_SEGS_MAX];
	struct tp_tensor tensors[TPT_SEGS_MAX];
	void *bufs[TPT_SEGS_MAX + 1]; /* per segment (+ slab), to free */
	bool shm[TPT_SEGS_MAX + 1];
	uint8_t *meta;
};

/* Fills the metadata of a spec'd message: @what is 'm', 'p' or 't', @i the segment. */
void tpt_meta_fill(uint8_t *buf, size_t len, const struct tpt_msg_spec *s, char what, size_t i);

int tpt_msg_build(struct tp_context *ctx, const struct tpt_msg_spec *s, enum tpt_mem mem,
		  struct tpt_msg *ret);
void tpt_msg_free(struct tp_context *ctx, struct tpt_msg *m);

/*
 * tpt_msg_read_check() - read the next message on @p into memory of kind @mem and check it
 * against @s. Return: 0; 1 on a content mismatch (printed); -errno from the library.
 */
int tpt_msg_read_check(struct tp_context *ctx, struct tp_pipe *p, const struct tpt_msg_spec *s,
		       enum tpt_mem mem, int timeout_ms);

/*
 * tpt_chan_msg_read_check() - tpt_msg_read_check() for the next item of channel @ch, read as a
 * message (tp_chan_read_descriptor(), tp_chan_read_msg()). @ret_closed (may be NULL): whether
 * the read said TP_CHAN_CLOSED. Return: 0; 1 on a mismatch (printed); -errno.
 */
int tpt_chan_msg_read_check(struct tp_context *ctx, struct tp_chan *ch,
			    const struct tpt_msg_spec *s, enum tpt_mem mem, int timeout_ms,
			    bool *ret_closed);

/*
 * tpt_wq_msg_read_check() - read the question or answer @d of work queue @q (from
 * tp_wq_take_descriptor() or tp_wq_answer_descriptor(); taken) into memory of kind @mem with
 * tp_wq_read_msg() and check it against @s. Return: 0; 1 on a mismatch (printed); -errno.
 */
int tpt_wq_msg_read_check(struct tp_context *ctx, struct tp_wq *q, struct tp_descriptor *d,
			  const struct tpt_msg_spec *s, enum tpt_mem mem);

/* Takes one question of @q; *@ret_id: its id. Return: 0 or -errno. */
typedef int (*tpt_wq_take_fn)(struct tp_wq *q, uint64_t *ret_id);

/*
 * tpt_wq_take_and_die() - forks a worker of queue @name on @d that takes one question with
 * @take and tells its id, then SIGKILLs it and reaps it (check assertions).
 * Return: the id the worker took.
 */
uint64_t tpt_wq_take_and_die(const struct tpt_daemon *d, const char *name, tpt_wq_take_fn take);

/* Opens a context on @d's socket with @flags and @name (NULL: library default). */
int tpt_ctx_new(const struct tpt_daemon *d, uint32_t flags, const char *name,
		struct tp_context **ret);

/* ---- one end of a pipe in a child process ------------------------------------------------ */

/*
 * A client end: a context on @d named @ctx_name, and either a listener @where (accepting pipes)
 * or a pipe connected to @where (a local name or a tpip:// address). @ready is posted by the
 * listening end (0, or -1 if it failed) and awaited by the connecting end before it connects.
 */
struct tpt_end {
	const struct tpt_daemon *d;
	const char *ctx_name;
	const char *where;
	struct tpt_sync *ready;
	int timeout_ms;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
};

/*
 * tpt_end_listen() - open the context and listener (owner only on this host, open to every peer
 * daemon: TP_REMOTE_ANY_PEER, as tpt_xfer_run()'s reader's too), post @e->ready, and if @accept,
 * accept one pipe into @e->p. Return: 0 or -errno (printed).
 */
int tpt_end_listen(struct tpt_end *e, bool accept);

/* tpt_end_connect() - wait for @e->ready, open the context, connect and wait until connected.
 * Return: 0 or -errno (printed); on a connect error @e->p stays open for inspection. */
int tpt_end_connect(struct tpt_end *e);

/* Closes whatever of @e is open (pipe, listener, context). */
void tpt_end_close(struct tpt_end *e);

/* ---- waiting for async completions ---------------------------------------------------------- */

/* Collects callback results; thread safe. */
struct tpt_done {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned count;	      /* callbacks seen */
	unsigned order_errors; /* callbacks seen out of the expected order */
	unsigned next;	      /* expected arg of the next callback (for ordered use) */
	int status[4096];     /* by arg index, for ordered use */
	int last_status;
	unsigned bad_errmsg;  /* an error without a message, or a success with one */
};

void tpt_done_init(struct tpt_done *d);
/* tp_done_fn; @arg is a struct tpt_done_arg. */
void tpt_done_cb(void *arg, struct tp_pipe *p, int status, const char *errmsg);
/* Waits until @count callbacks were seen. Return: 0 or -ETIMEDOUT. */
int tpt_done_wait(struct tpt_done *d, unsigned count, int timeout_ms);

struct tpt_done_arg {
	struct tpt_done *done;
	unsigned index;
};

/*
 * tpt_write_all_in_order() - write @msgs[0..@n) on @p all at once (n <= 4096), then wait up to
 * @timeout_ms for every completion: in write order, each OK and without an error message.
 * Return: 0, or 1 (logged).
 */
int tpt_write_all_in_order(struct tp_pipe *p, struct tpt_msg *msgs, unsigned n, int timeout_ms);

/* ---- two-process transfer ----------------------------------------------------------------- */

typedef void (*tpt_spec_fn)(unsigned index, struct tpt_msg_spec *ret);

struct tpt_xfer {
	const struct tpt_daemon *d; /* the reader's daemon (and the writer's, see writer_d) */
	const char *name;     /* listener name */
	const struct tpt_daemon *writer_d; /* the writer's daemon; NULL: @d */
	const char *address;  /* what the writer connects to (tpip://...); NULL: @name */
	unsigned n_msgs;
	tpt_spec_fn spec;     /* message @index's spec */
	enum tpt_mem writer_mem, reader_mem;
	uint32_t writer_flags, reader_flags;
	int timeout_ms;       /* per child; 0: TPT_CHILD_TIMEOUT_MS */
};

/* Runs reader and writer children; returns true if both exit 0 (else prints why). */
bool tpt_xfer_run(const struct tpt_xfer *x);

/*
 * tpt_run_pair() - fork @a(@arg) and @b(@arg) as child processes (tpt_fork) and wait for both,
 * each within @timeout_ms. Return: true if both exited 0 (failures are logged).
 */
bool tpt_run_pair(tpt_child_fn a, tpt_child_fn b, void *arg, int timeout_ms);

/* Checked-fixture helpers: a daemon per test with default flags, stopped (status checked). */
extern struct tpt_daemon tpt_fixture_daemon;
void tpt_fixture_start(void);
void tpt_fixture_stop(void);

/*
 * tpt_time_scale() - how many times longer than in a plain run the suites allow for what they
 * wait for: $TPT_TIME_SCALE, which `meson test --setup valgrind` sets (daemons under valgrind
 * run many times slower), or 1 when it is unset or not a number in 1..100. Scaled with it:
 * the daemons' peer timeouts, the deadlines by which a failure or a completion must show, and
 * waits for a daemon to settle. Checks stay the same; a plain run is unchanged.
 * Return: 1..100.
 */
unsigned tpt_time_scale(void);
#define TPT_SCALED_MS(ms) ((int)(ms) * (int)tpt_time_scale())

/*
 * Peer fixture: two daemons on this machine that treat each other as remote hosts
 * (tpt_daemon_pair_start() with --peer-timeout TPT_PEER_TIMEOUT_MS and --peer-connect-timeout
 * TPT_PEER_CONNECT_TIMEOUT_MS). Clients of tpt_peer_a reach listeners of tpt_peer_b through
 * tpt_peer_address(&tpt_peer_b, name, ...) and the other way round.
 */
#define TPT_PEER_TIMEOUT_MS TPT_SCALED_MS(3000)
#define TPT_PEER_CONNECT_TIMEOUT_MS TPT_SCALED_MS(2000)
extern struct tpt_daemon tpt_peer_a, tpt_peer_b;
/* The peer timeouts above as daemon arguments. Return: a NULL-terminated list, valid until the
 * next call. */
const char *const *tpt_peer_args(void);
void tpt_peer_fixture_start(void);
void tpt_peer_fixture_stop(void);

/*
 * tpt_chan_items_survive() - writes two private items of 1 MiB to @ch (tpt_fill() of
 * tpt_seed(@seed, k, 0)), runs @child in a process of its own (it must exit 0; @what names it),
 * closes @ch and reads both items back byte-exact, then -EPIPE: what a reader that died held
 * or was reading comes back to the channel.
 */
void tpt_chan_items_survive(struct tp_chan *ch, unsigned seed, tpt_child_fn child,
			    const char *what);

/*
 * tpt_ctl_channel_field() - field @field of the row of channel @name in `tpipctl --json
 * channels` of @d. Return: its value, or -1 when there is no such row or field, or tpipctl
 * failed ($TPIPCTL_BIN).
 */
long tpt_ctl_channel_field(const struct tpt_daemon *d, const char *name, const char *field);

/* Runs @s (CK_FORK) and returns the process exit status for main(). */
int tpt_run_suite(Suite *s);

#endif
