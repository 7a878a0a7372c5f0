/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the two halves of bench_throughput share: the tag every message carries as metadata, the
 * memory kinds, the options, the kind's buffer allocator, and the forked reader's entry point
 * (bench_tput_reader.c). The writer, baselines and driver live in bench_throughput.c.
 */
#ifndef BENCH_TPUT_H
#define BENCH_TPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpclient.h"

#define TP_TIMEOUT_MS 60000
/* The reader's wait for the next message: between two sizes the writer measures its baselines
 * and fills a fresh source, which at the largest sizes takes minutes on a slow machine. */
#define TP_PHASE_TIMEOUT_MS 600000
/* Distinct memory slots per end hold at most this many bytes (see bench_tput_slots()). */
#define SLOTS_BYTES_MAX (4ull << 30)
#define TAG_MAGIC 0x54505442u /* "BTPT" */
#define TAG_LAST 1u
#define SLOTS_MAX 16
#define SIZES_MAX 16
#define RATE_SIZE 4096
#define RATE_INFLIGHT 4
#define RAW_STREAMS_MAX 16

enum tag_type { TAG_DATA = 1, TAG_CREDIT, TAG_DONE, TAG_QUIT };

/* Metadata of every message this benchmark sends. */
struct tag {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint64_t phase;
	uint64_t seq; /* DATA: index in phase; CREDIT/DONE: messages read in phase */
};

struct kind {
	const char *key;
	const char *label;
	uint32_t ctx_flags;
	bool shm;
};

struct opts {
	size_t sizes[SIZES_MAX];
	size_t n_sizes;
	const char *kinds; /* comma list of kind keys */
	int inflight;
	double min_s;
	long min_msgs;
	long window; /* messages the reader may be behind before the writer waits */
	bool rate;
	bool baselines;		   /* memcpy and raw socketpair figures next to each row */
	const char *socket_path;   /* the writer's daemon */
	const char *reader_socket; /* the reader's daemon (NULL: socket_path) */
	const char *addr_prefix;   /* the writer connects to this + listener name ("": local) */
	const char *row_prefix;	   /* prepended to every row's case name */
	const char *tcp_host;	   /* raw TCP baseline to this address (NULL: none) */
	const char *netns;	   /* its receiver's network namespace (NULL: this one) */
	int streams;		   /* its TCP connections */
	size_t write_size;	   /* its bytes per write() (0: a whole slice per write) */
};

/*
 * bench_tput_buf_get() - allocate @size bytes of a kind's memory (tp_buffer_alloc() when @shm,
 * else page-aligned malloc) and touch every page.
 * @ret: returns owned memory, free with bench_tput_buf_put() (same @ctx and @shm).
 * Return: 0 or -errno (a line goes to stderr).
 */
int bench_tput_buf_get(struct tp_context *ctx, bool shm, size_t size, void **ret);

/*
 * bench_tput_slots() - how many distinct slots of @size bytes an end cycles through for @k
 * messages in flight: @k, but no more than SLOTS_BYTES_MAX bytes of them (and at least one), so
 * that a deep window at the largest sizes fits in memory on both ends. The reader never has
 * more reads in flight than it has slots, so the window is then that many messages.
 * Return: 1 .. @k.
 */
int bench_tput_slots(int k, size_t size);
void bench_tput_buf_put(struct tp_context *ctx, bool shm, void *p);

/* What the forked reader needs. */
struct bench_tput_reader_arg {
	const struct opts *o;
	const struct kind *k;
	char listener[64];
};

/*
 * bench_tput_reader_run() - the reader process: connect with the kind's flags, listen on
 * @arg->listener, report readiness on @ready_fd, accept one pipe, read data messages into a ring
 * of slots and answer with credits and phase-done messages until the writer says quit.
 * Borrows @arg. Return: 0 or -errno (lines go to stderr).
 */
int bench_tput_reader_run(void *arg, int ready_fd);

/*
 * bench_rawtcp_gbps() - the raw TCP baseline (bench_rawtcp.c): @o->streams TCP connections to a
 * receiver forked into @o->netns that listens on @o->tcp_host carry messages of @size bytes, one
 * slice per connection, from @o->inflight distinct source slots into as many destination slots,
 * for at least @o->min_s and @o->min_msgs. Return: GB/s (1e9 bytes), or 0 (a line goes to stderr).
 */
double bench_rawtcp_gbps(const struct opts *o, size_t size);

#endif
