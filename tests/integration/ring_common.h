/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared harness of the control-ring suites (test_ring.c: libtpclient contexts; test_ring_raw.c:
 * raw ring clients): one tpipd per case with its fd baseline and sync points, the checks that
 * the daemon still serves and holds no ring mapping or extra fd, libtpclient contexts opened
 * with given ring options, and a raw client that says Hello and sets up its ring. Runs in the
 * test process and its forked clients (it asserts with Check); the cases stay in the suites.
 */
#ifndef TPT_RING_COMMON_H
#define TPT_RING_COMMON_H

#include <stdint.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define RING_MIN 4096u
#define SLOW_MS 5000 /* a round trip this slow means a lost wake-up */

/* The daemon of the running case and the sync points its client processes share. */
extern struct tpt_daemon ring_dmn;
extern struct tpt_sync ring_ready, ring_done, ring_st_a, ring_st_b, ring_release, ring_gate;

/*
 * ring_up() - start tpipd with @args (NULL-terminated, or NULL), init every sync point and note
 * the daemon's settled fd count as the baseline of ring_check_nothing_left().
 * Borrows @args. The test fails if the daemon does not start.
 */
void ring_up(const char *const *args);

/* ring_down() - free the sync points and stop the daemon (which must exit 0). */
void ring_down(void);

/* ring_up_default() - ring_up(NULL), for checked fixtures. */
void ring_up_default(void);

/*
 * ring_check_nothing_left() - the daemon is alive, maps no client ring and gets back to its fd
 * baseline within 10 s; the test fails otherwise.
 */
void ring_check_nothing_left(void);

/*
 * ring_check_daemon_serves() - a new pair of (ring) clients moves 4 checked messages over
 * listener @name; the test fails otherwise. Borrows @name.
 */
void ring_check_daemon_serves(const char *name);

/* ring_wait_log() - the daemon logs a line containing @needle within 10 s, or the test fails. */
void ring_wait_log(const char *needle);

/* How a client process opens its context. */
struct ring_cl {
	uint32_t flags, ring_bytes, spin_us;
	size_t eager_max;
};

/*
 * ring_ctx_open() - tp_context_new() on ring_dmn with the options of @c, named @name.
 * Borrows @c and @name. Returns owned @ret, free with tp_context_free().
 * Return: 0, or the negative errno of tp_context_new() (logged).
 */
int ring_ctx_open(const struct ring_cl *c, const char *name, struct tp_context **ret);

/*
 * ring_raw_open() - connect @raw to ring_dmn, say Hello and set up @g, a new ring of @size
 * bytes, which the daemon must take.
 * Borrows @raw and @g; once this returned 0, close both with ring_raw_close().
 * Return: 0, -EPROTO if the daemon refused the ring, or another negative errno (logged).
 */
int ring_raw_open(struct tpt_raw *raw, struct tpt_raw_ring *g, uint32_t size);

/* ring_raw_close() - close @raw's connection and free the ring @g. */
void ring_raw_close(struct tpt_raw *raw, struct tpt_raw_ring *g);

#endif
