/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: cross-host pipes. Two daemons on this machine treat each other as remote
 * hosts (--peer-force-cross-host, peer listeners on loopback ports the kernel picks); a client
 * of daemon A connects to tpip://127.0.0.1:PORT_B/NAME, a listener on daemon B accepts, and the
 * daemons carry the bytes over their peer link. Data of every size class around the eager limit
 * (0 B, 1 B, 64 KiB +- 1, 1 MiB, 16 MiB, and 512 MiB when memory allows) arrives intact from and
 * into shared buffers and private memory, also staged (TP_CONTEXT_NO_CMA) and as multi-segment
 * messages carved from one slab; both ends see the right remote name; a listener registered
 * with default options takes no pipes from the other host (the harness's listeners allow any
 * peer, TP_REMOTE_ANY_PEER); 1000 pipelined writes
 * arrive and complete in order; reads asked for all at once, whose receives overlap and
 * finish out of order, complete in order; 8 pipes carry traffic in both directions at once over one
 * link; tpipctl peers shows that link with its pipes and byte counters. Two daemons listening on
 * [::1] only carry a tensor over tpip://[::1]:PORT/NAME (skipped, saying why, where this host
 * cannot listen on [::1]). Failures of the link are in test_peer_faults.c.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"

#define T_MS TPT_SCALED_MS(60000)

static struct tpt_sync to_a, to_b, to_parent, go, release;

static void setup(void)
{
	tpt_peer_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&release), 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_sync_done(&to_parent);
	tpt_sync_done(&go);
	tpt_sync_done(&release);
	tpt_peer_fixture_stop();
}

/* The listening end on B (listener @name) and the connecting end on A. */
static struct tpt_end end_b(const char *ctx_name, const char *name)
{
	return (struct tpt_end){ .d = &tpt_peer_b, .ctx_name = ctx_name, .where = name,
				 .ready = &to_b, .timeout_ms = T_MS };
}

static struct tpt_end end_a(const char *ctx_name, const char *address)
{
	return (struct tpt_end){ .d = &tpt_peer_a, .ctx_name = ctx_name, .where = address,
				 .ready = &to_b, .timeout_ms = T_MS };
}

/* Runs a reader on B and a writer on A (through tpip://) for @n messages of @spec. */
static bool cross_xfer(const char *name, unsigned n, tpt_spec_fn spec, enum tpt_mem wmem,
		       enum tpt_mem rmem, uint32_t wflags, uint32_t rflags)
{
	char addr[128];
	struct tpt_xfer x = {
		.d = &tpt_peer_b,
		.writer_d = &tpt_peer_a,
		.name = name,
		.address = tpt_peer_address(&tpt_peer_b, name, addr, sizeof(addr)),
		.n_msgs = n,
		.spec = spec,
		.writer_mem = wmem,
		.reader_mem = rmem,
		.writer_flags = wflags,
		.reader_flags = rflags,
		.timeout_ms = T_MS,
	};

	return tpt_xfer_run(&x);
}

/* ---- sizes and memory kinds ---------------------------------------------------------------- */

static const size_t sizes[] = { 0, 1, (64u << 10) - 1, (64u << 10) + 1, 1u << 20, 16u << 20 };
static const enum tpt_mem mems[] = { TPT_MEM_SHM, TPT_MEM_PRIVATE };

#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

static size_t cur_size; /* set before the children fork */

/* Message 0: one tensor of cur_size bytes; message 1: one payload of it, with metadata. */
static void size_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 1;
	s->index = index;
	if (index == 0) {
		s->n_tensors = 1;
	} else {
		s->n_payloads = 1;
		s->meta_len = 8;
		s->seg_meta_len = 16;
	}
	s->lens[0] = cur_size;
}

static bool run_size(size_t size, unsigned n_msgs, enum tpt_mem wmem, enum tpt_mem rmem)
{
	uint64_t t0 = tpt_now_ms();
	bool ok;

	cur_size = size;
	ok = cross_xfer("sizes", n_msgs, size_spec, wmem, rmem, 0, 0);
	printf("cross-host %zu bytes, writer %s, reader %s: %s in %llu ms\n", size,
	       tpt_mem_name(wmem), tpt_mem_name(rmem), ok ? "ok" : "FAILED",
	       (unsigned long long)(tpt_now_ms() - t0));
	return ok;
}

/* _i: size index * 4 + writer memory * 2 + reader memory. */
START_TEST(test_peers_sizes_arrive_intact)
{
	size_t size = sizes[_i / 4];
	enum tpt_mem wmem = mems[(_i / 2) % 2], rmem = mems[_i % 2];

	ck_assert_msg(run_size(size, 2, wmem, rmem), "%zu bytes, %s -> %s", size,
		      tpt_mem_name(wmem), tpt_mem_name(rmem));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b),
		      "a daemon died");
}
END_TEST

/* MemAvailable in MiB, or -1. */
static long mem_available_mib(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb / 1024;
}

START_TEST(test_peers_512mib_tensor_arrives_intact)
{
	long avail = mem_available_mib();

	/* Writer and reader copies, plus headroom for both daemons and the page cache. */
	if (avail < 3072) {
		printf("SKIP 512 MiB cross-host transfer: only %ld MiB available\n", avail);
		return;
	}
	ck_assert(run_size(512u << 20, 1, TPT_MEM_PRIVATE, TPT_MEM_SHM));
}
END_TEST

/* Six segments around the eager limit (rotated per message); message 3 is all small. */
static void shapes_spec(unsigned index, struct tpt_msg_spec *s)
{
	static const size_t lens[] = { 0, 1, (64u << 10) - 1, (64u << 10) + 1, (1u << 20) + 5,
				       3u << 20 };

	s->pipe = 3;
	s->index = index;
	s->n_payloads = 3;
	s->n_tensors = 3;
	s->meta_len = 32 + index;
	s->seg_meta_len = 8;
	for (size_t k = 0; k < 6; k++)
		s->lens[k] = index == 3 ? k * 100 : lens[(k + index) % 6];
}

/* _i picks the writer / reader memory kinds and flags. */
START_TEST(test_peers_segment_kinds_arrive_intact)
{
	static const struct {
		enum tpt_mem w, r;
		uint32_t wf, rf;
	} kinds[] = {
		{ TPT_MEM_SLAB, TPT_MEM_MIXED, 0, 0 },
		{ TPT_MEM_MIXED, TPT_MEM_SLAB, 0, 0 },
		{ TPT_MEM_PRIVATE, TPT_MEM_PRIVATE, TP_CONTEXT_NO_CMA, TP_CONTEXT_NO_CMA },
		{ TPT_MEM_SHM, TPT_MEM_PRIVATE, TP_CONTEXT_NO_CMA, 0 },
		{ TPT_MEM_PRIVATE, TPT_MEM_SHM, 0, TP_CONTEXT_NO_CMA },
	};
	bool ok = cross_xfer("shapes", 4, shapes_spec, kinds[_i].w, kinds[_i].r, kinds[_i].wf,
			     kinds[_i].rf);

	ck_assert_msg(ok, "writer %s%s -> reader %s%s", tpt_mem_name(kinds[_i].w),
		      kinds[_i].wf ? " (no cma)" : "", tpt_mem_name(kinds[_i].r),
		      kinds[_i].rf ? " (no cma)" : "");
}
END_TEST

/* ---- remote names --------------------------------------------------------------------------- */

static void tiny_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 4;
	s->index = index;
	s->n_payloads = 1;
	s->lens[0] = 10 + index;
}

static int names_listener(void *arg)
{
	struct tpt_end e = end_b("names-listener-ctx", "rname");
	struct tpt_msg_spec s;
	const char *rn;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	rn = tp_pipe_remote_name(e.p);
	TPT_REQUIRE(rn && strcmp(rn, "names-connector-ctx") == 0, 1,
		    "acceptor sees remote name '%s', want the connecting context's name", rn);
	tiny_spec(0, &s);
	r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "read: %d", r);
	tpt_sync_post(&to_a, 0);
	tpt_end_close(&e);
	return 0;
}

static int names_connector(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("names-connector-ctx",
				 tpt_peer_address(&tpt_peer_b, "rname", addr, sizeof(addr)));
	struct tpt_msg_spec s;
	struct tpt_msg m;
	const char *rn;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	rn = tp_pipe_remote_name(e.p);
	TPT_REQUIRE(rn && strcmp(rn, "rname") == 0, 1,
		    "connector sees remote name '%s', want the listener name 'rname'", rn);
	tiny_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	r = tp_pipe_write_sync(e.p, &m.m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	tpt_sync_wait(&to_a, T_MS);
	tpt_msg_free(e.ctx, &m);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peers_remote_names_on_both_ends)
{
	ck_assert(tpt_run_pair(names_listener, names_connector, NULL, 2 * T_MS));
}
END_TEST

/* ---- remote access is the listener's choice ------------------------------------------------- */

/* On B: "local-only" with default options (this host only), kept until A is done. */
static int default_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	int r = tpt_ctx_new(&tpt_peer_b, 0, "default-listener", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "local-only", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "no word from the connector");
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* On A: tpip://B/local-only fails as a missing name would, saying why it may. */
static int default_connector(void *arg)
{
	char addr[128];
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_peer_a, 0, "default-connector", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, tpt_peer_address(&tpt_peer_b, "local-only", addr, sizeof(addr)), &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -ENOENT && strstr(tp_last_error(), "accepts pipes from other hosts"), 1,
		    "connect to a listener with default options from another host: %d %s", r,
		    tp_last_error());
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_peers_listener_takes_no_remote_pipes_by_default)
{
	ck_assert(tpt_run_pair(default_listener, default_connector, NULL, 2 * T_MS));
}
END_TEST

/* ---- 1000 pipelined writes ------------------------------------------------------------------ */

#define N_PIPELINED 1000

/* Mostly eager messages; every tenth carries a rendezvous tensor of ~200 KB. */
static void pipelined_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 9;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->meta_len = 8;
	s->lens[0] = (index * 37) % 2000;
	s->lens[1] = index % 10 == 0 ? 200000 + index : (index * 101) % 5000;
}

static int pipelined_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("pipelined-writer",
				 tpt_peer_address(&tpt_peer_b, "pipelined", addr, sizeof(addr)));
	struct tpt_msg *msgs = calloc(N_PIPELINED, sizeof(*msgs));
	struct tpt_msg_spec s;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0 && msgs, 1, "setup");
	for (unsigned i = 0; i < N_PIPELINED; i++) {
		memset(&s, 0, sizeof(s));
		pipelined_spec(i, &s);
		r = tpt_msg_build(e.ctx, &s, i % 4 ? TPT_MEM_PRIVATE : TPT_MEM_MIXED, &msgs[i]);
		TPT_REQUIRE(r == 0, 1, "build %u", i);
	}
	TPT_REQUIRE(tpt_write_all_in_order(e.p, msgs, N_PIPELINED, T_MS) == 0, 1, "writes");
	tpt_sync_post(&to_a, 0);
	tpt_sync_wait(&release, T_MS); /* the reader is through */
	for (unsigned i = 0; i < N_PIPELINED; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	free(msgs);
	tpt_end_close(&e);
	return 0;
}

static int pipelined_reader(void *arg)
{
	struct tpt_end e = end_b("pipelined-reader", "pipelined");
	struct tpt_msg_spec s;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < N_PIPELINED; i++) {
		memset(&s, 0, sizeof(s));
		pipelined_spec(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, i % 3 ? TPT_MEM_PRIVATE : TPT_MEM_SHM,
				       T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_sync_post(&release, 0);
	r = tpt_sync_wait(&to_a, T_MS);
	TPT_REQUIRE(r == 0, 1, "writer did not see every completion");
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peers_pipelined_writes_arrive_and_complete_in_order)
{
	ck_assert(tpt_run_pair(pipelined_reader, pipelined_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- a burst of eager messages ------------------------------------------------------------ */

/*
 * 400 eager messages of about 60 KB, all written before the reader reads any: the writer's
 * daemon queues some 24 MB of control frames on the link in a few loop passes, far more than
 * the control socket takes at once, so the frames a pass queued go out partly at its end and
 * the rest through the socket's write event, after earlier ones. They must arrive whole and in
 * order.
 */
#define N_BURST 400

static void burst_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 13;
	s->index = index;
	s->n_payloads = 1;
	s->lens[0] = 60000 + 11 * index;
}

static int burst_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("burst-writer",
				 tpt_peer_address(&tpt_peer_b, "burst", addr, sizeof(addr)));
	struct tpt_msg *msgs = calloc(N_BURST, sizeof(*msgs));
	struct tpt_msg_spec s;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0 && msgs, 1, "setup");
	for (unsigned i = 0; i < N_BURST; i++) {
		burst_spec(i, &s);
		r = tpt_msg_build(e.ctx, &s, i % 2 ? TPT_MEM_PRIVATE : TPT_MEM_SHM, &msgs[i]);
		TPT_REQUIRE(r == 0, 1, "build %u", i);
	}
	/* Eager writes complete once the writer's daemon holds their bytes. */
	TPT_REQUIRE(tpt_write_all_in_order(e.p, msgs, N_BURST, T_MS) == 0, 1, "writes");
	tpt_sync_post(&go, 0);
	tpt_sync_wait(&release, T_MS);
	for (unsigned i = 0; i < N_BURST; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	free(msgs);
	tpt_end_close(&e);
	return 0;
}

static int burst_reader(void *arg)
{
	struct tpt_end e = end_b("burst-reader", "burst");
	struct tpt_msg_spec s;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	r = tpt_sync_wait(&go, T_MS);
	TPT_REQUIRE(r == 0, 1, "the writer did not finish writing");
	for (unsigned i = 0; i < N_BURST; i++) {
		burst_spec(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, i % 3 ? TPT_MEM_PRIVATE : TPT_MEM_SHM, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_sync_post(&release, 0);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peers_eager_burst_arrives_whole_and_in_order)
{
	ck_assert(tpt_run_pair(burst_reader, burst_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- overlapping reads ---------------------------------------------------------------------- */

/*
 * The reader takes every descriptor before it reads, then asks for all messages at once, so its
 * daemon runs several receives of one pipe at the same time. Large and small tensors alternate,
 * so later receives finish before earlier ones: the reads must still complete in order.
 */
#define N_OVERLAP 12

static size_t overlap_len(unsigned i)
{
	return i % 3 == 0 ? (12u << 20) + i : (256u << 10) + 7 * i;
}

static void overlap_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 11;
	s->index = index;
	s->n_tensors = 1;
	s->lens[0] = overlap_len(index);
}

static int overlap_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("overlap-writer",
				 tpt_peer_address(&tpt_peer_b, "overlap", addr, sizeof(addr)));
	static struct tpt_msg msgs[N_OVERLAP];
	struct tpt_msg_spec s;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < N_OVERLAP; i++) {
		overlap_spec(i, &s);
		r = tpt_msg_build(e.ctx, &s, i % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE, &msgs[i]);
		TPT_REQUIRE(r == 0, 1, "build %u", i);
	}
	TPT_REQUIRE(tpt_write_all_in_order(e.p, msgs, N_OVERLAP, T_MS) == 0, 1, "writes");
	tpt_sync_wait(&release, T_MS);
	for (unsigned i = 0; i < N_OVERLAP; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	tpt_end_close(&e);
	return 0;
}

static int overlap_reader(void *arg)
{
	struct tpt_end e = end_b("overlap-reader", "overlap");
	struct tp_descriptor *d[N_OVERLAP];
	struct tpt_done_arg args[N_OVERLAP];
	static struct tpt_done done;
	static uint8_t *bufs[N_OVERLAP];
	struct tp_slot slots[N_OVERLAP];
	size_t off;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	tpt_done_init(&done);
	for (unsigned i = 0; i < N_OVERLAP; i++) {
		r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d[i]);
		TPT_REQUIRE(r == 0, 1, "descriptor %u: %d %s", i, r, tp_last_error());
		TPT_REQUIRE(d[i]->n_tensors == 1 && d[i]->tensors[0].length == overlap_len(i), 1,
			    "descriptor %u: wrong shape", i);
		bufs[i] = malloc(overlap_len(i));
		TPT_REQUIRE(bufs[i], 1, "malloc");
	}
	for (unsigned i = 0; i < N_OVERLAP; i++) {
		struct tp_allocation a = { .tensors = &slots[i], .n_tensors = 1 };

		slots[i] = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = bufs[i] };
		args[i] = (struct tpt_done_arg){ &done, i };
		r = tp_pipe_read(e.p, d[i], &a, tpt_done_cb, &args[i]);
		TPT_REQUIRE(r == 0, 1, "read %u: %d %s", i, r, tp_last_error());
	}
	r = tpt_done_wait(&done, N_OVERLAP, T_MS);
	TPT_REQUIRE(r == 0, 1, "only %u of %d reads completed", done.count, N_OVERLAP);
	TPT_REQUIRE(done.order_errors == 0, 1, "%u reads completed out of order",
		    done.order_errors);
	for (unsigned i = 0; i < N_OVERLAP; i++) {
		TPT_REQUIRE(done.status[i] == 0, 1, "read %u: status %d", i, done.status[i]);
		TPT_REQUIRE(tpt_verify(bufs[i], overlap_len(i), tpt_seed(11, i, 0), &off), 1,
			    "message %u: wrong byte at %zu", i, off);
		free(bufs[i]);
	}
	tpt_sync_post(&release, 0);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peers_overlapping_reads_complete_in_order)
{
	ck_assert(tpt_run_pair(overlap_reader, overlap_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- tpipctl peers -------------------------------------------------------------------------- */

/* Polls until @d has exactly one link with @pipes pipes; fails the test otherwise. */
static void expect_one_link(const struct tpt_daemon *d, long pipes, struct tpt_link *ret)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)TPT_SCALED_MS(5000);
	int n;

	for (unsigned round = 0;; round++) {
		n = tpt_peer_links(d, ret);
		if ((n == 1 && ret->pipes == pipes) || tpt_now_ms() >= deadline)
			break;
		tpt_backoff(round);
	}
	ck_assert_msg(n == 1, "%s: %d peer links, want 1", d->socket, n);
	ck_assert_msg(ret->pipes == pipes, "%s: link has %ld pipes, want %ld", d->socket,
		      ret->pipes, pipes);
	ck_assert_msg(strcmp(ret->state, "up") == 0, "%s: link state '%s', want 'up'", d->socket,
		      ret->state);
	ck_assert_msg(ret->data_conns == 4, "%s: %ld data connections, want 4 (default)",
		      d->socket, ret->data_conns);
	ck_assert_msg(ret->authenticated, "%s: a keyed (TLS) link does not show authenticated",
		      d->socket);
}

#define CTL_LEN (4u << 20)

static void ctl_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 5;
	s->index = index;
	s->n_tensors = 1;
	s->lens[0] = CTL_LEN;
}

static int ctl_listener(void *arg)
{
	struct tpt_end e = end_b("ctl-listener", "ctl");
	struct tpt_msg_spec s;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	ctl_spec(0, &s);
	r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "read: %d", r);
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, T_MS);
	tpt_end_close(&e);
	return 0;
}

static int ctl_connector(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("ctl-connector",
				 tpt_peer_address(&tpt_peer_b, "ctl", addr, sizeof(addr)));
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	ctl_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	r = tp_pipe_write_sync(e.p, &m.m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, T_MS);
	tpt_msg_free(e.ctx, &m);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peers_tpipctl_peers_shows_the_link)
{
	pid_t lp = tpt_fork(ctl_listener, NULL), cp = tpt_fork(ctl_connector, NULL);
	struct tpt_link la, lb;
	char port[16], *text;
	uint64_t deadline;

	ck_assert_int_gt(lp, 0);
	ck_assert_int_gt(cp, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	expect_one_link(&tpt_peer_a, 1, &la);
	expect_one_link(&tpt_peer_b, 1, &lb);
	ck_assert_msg(la.outgoing && !lb.outgoing, "A dialled, so A's link is out and B's in");
	snprintf(port, sizeof(port), ":%d", tpt_peer_b.peer_port);
	ck_assert_msg(strstr(la.address, port), "A's link address '%s' lacks B's port %s",
		      la.address, port);
	ck_assert_msg(la.bytes_sent >= CTL_LEN, "A sent %llu bytes, want >= %u",
		      (unsigned long long)la.bytes_sent, CTL_LEN);
	ck_assert_msg(lb.bytes_received >= CTL_LEN, "B received %llu bytes, want >= %u",
		      (unsigned long long)lb.bytes_received, CTL_LEN);
	text = tpt_ctl_peers(&tpt_peer_a, false);
	ck_assert_msg(strstr(text, "STATE") && strstr(text, "CONNS") && strstr(text, "ADDRESS"),
		      "no table header:\n%s", text);
	ck_assert_msg(strstr(text, "up") && strstr(text, port), "no row for the link:\n%s", text);
	free(text);
	tpt_sync_post(&release, 0);
	tpt_sync_post(&release, 0);
	ck_assert(tpt_wait_ok(lp, T_MS, "listener"));
	ck_assert(tpt_wait_ok(cp, T_MS, "connector"));
	/* Both ends closed: no link counts the pipe any more (an idle link may stay or go). */
	deadline = tpt_now_ms() + (uint64_t)TPT_SCALED_MS(5000);
	for (unsigned round = 0; tpt_now_ms() < deadline; round++) {
		if (tpt_peer_links(&tpt_peer_a, &la) == 0 || la.pipes == 0)
			break;
		tpt_backoff(round);
	}
	ck_assert_msg(tpt_peer_links(&tpt_peer_a, &la) == 0 || la.pipes == 0,
		      "A's link still counts %ld pipes after both ends closed", la.pipes);
}
END_TEST

/* ---- 8 pipes, both directions, one link ----------------------------------------------------- */

#define N_PIPES 8
#define N_PER_PIPE 12

/* Direction 0: A -> B, direction 1: B -> A; @pipe 0..N_PIPES-1. */
static void multi_spec(unsigned dir, unsigned pipe, unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 100 * (dir + 1) + pipe;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->seg_meta_len = 4;
	s->lens[0] = (pipe * 131 + index * 17) % 3000;
	s->lens[1] = (index % 4 == 3) ? (2u << 20) + pipe : (index * 4099) % 70000;
}

struct pipe_job {
	struct tp_context *ctx;
	struct tp_pipe *p;
	unsigned dir, pipe;
	bool write; /* else read */
	enum tpt_mem mem;
	int result;
};

static void *pipe_job_run(void *arg)
{
	struct pipe_job *j = arg;
	struct tpt_msg_spec s;
	struct tpt_msg *m = malloc(sizeof(*m));

	j->result = m ? 0 : -ENOMEM;
	for (unsigned i = 0; j->result == 0 && i < N_PER_PIPE; i++) {
		multi_spec(j->dir, j->pipe, i, &s);
		if (!j->write) {
			j->result = tpt_msg_read_check(j->ctx, j->p, &s, j->mem, T_MS);
			continue;
		}
		j->result = tpt_msg_build(j->ctx, &s, j->mem, m);
		if (j->result == 0)
			j->result = tp_pipe_write_sync(j->p, &m->m);
		tpt_msg_free(j->ctx, m);
	}
	if (j->result)
		tpt_log("dir %u pipe %u %s: %d %s", j->dir, j->pipe, j->write ? "write" : "read",
			j->result, tp_last_error());
	free(m);
	return NULL;
}

/* Writes direction @out and reads direction 1 - @out on every pipe, all at once. */
static int run_duplex(struct tp_context *ctx, struct tp_pipe **p, unsigned out)
{
	struct pipe_job jobs[2 * N_PIPES];
	pthread_t th[2 * N_PIPES];
	int bad = 0;

	for (unsigned i = 0; i < 2 * N_PIPES; i++) {
		bool w = i < N_PIPES;
		jobs[i] = (struct pipe_job){ ctx, p[i % N_PIPES], w ? out : 1 - out, i % N_PIPES, w,
					     (i + out) % 3 ? TPT_MEM_PRIVATE : TPT_MEM_SHM, 0 };
	}
	for (unsigned i = 0; i < 2 * N_PIPES; i++)
		if (pthread_create(&th[i], NULL, pipe_job_run, &jobs[i]) != 0)
			return -EAGAIN;
	for (unsigned i = 0; i < 2 * N_PIPES; i++) {
		pthread_join(th[i], NULL);
		bad += jobs[i].result != 0;
	}
	return bad;
}

static int multi_listener(void *arg)
{
	struct tpt_end e = end_b("multi-listener", "multi");
	struct tp_pipe *p[N_PIPES];
	int r = tpt_end_listen(&e, false);

	TPT_REQUIRE(r == 0, 1, "setup");
	/* The connector waits for each pipe before the next: accepts come in connect order. */
	for (unsigned i = 0; i < N_PIPES; i++) {
		r = tp_listener_accept_sync(e.l, T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "accept %u: %d %s", i, r, tp_last_error());
	}
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "no go");
	r = run_duplex(e.ctx, p, 1);
	tpt_sync_post(&to_parent, (int8_t)(r ? 1 : 0));
	tpt_sync_wait(&release, T_MS);
	for (unsigned i = 0; i < N_PIPES; i++)
		tp_pipe_close(p[i]);
	tpt_end_close(&e);
	return r ? 1 : 0;
}

static int multi_connector(void *arg)
{
	char addr[128];
	struct tpt_end e = end_a("multi-connector",
				 tpt_peer_address(&tpt_peer_b, "multi", addr, sizeof(addr)));
	struct tp_pipe *p[N_PIPES];
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	p[0] = e.p;
	e.p = NULL;
	for (unsigned i = 1; i < N_PIPES; i++) {
		r = tp_connect(e.ctx, addr, &p[i]);
		if (r == 0)
			r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "pipe %u: %d %s", i, r, tp_last_error());
	}
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "no go");
	r = run_duplex(e.ctx, p, 0);
	tpt_sync_post(&to_parent, (int8_t)(r ? 1 : 0));
	tpt_sync_wait(&release, T_MS);
	for (unsigned i = 0; i < N_PIPES; i++)
		tp_pipe_close(p[i]);
	tpt_end_close(&e);
	return r ? 1 : 0;
}

/* Data bytes of direction @dir, over all pipes. */
static uint64_t multi_bytes(unsigned dir)
{
	struct tpt_msg_spec s;
	uint64_t n = 0;

	for (unsigned p = 0; p < N_PIPES; p++)
		for (unsigned i = 0; i < N_PER_PIPE; i++) {
			multi_spec(dir, p, i, &s);
			n += s.lens[0] + s.lens[1];
		}
	return n;
}

START_TEST(test_peers_eight_pipes_both_directions_share_one_link)
{
	pid_t lp = tpt_fork(multi_listener, NULL), cp = tpt_fork(multi_connector, NULL);
	struct tpt_link la;
	uint64_t t0;

	ck_assert_int_gt(lp, 0);
	ck_assert_int_gt(cp, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	expect_one_link(&tpt_peer_a, N_PIPES, &la);
	t0 = tpt_now_ms();
	tpt_sync_post(&go, 0);
	tpt_sync_post(&go, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, 2 * T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, 2 * T_MS), 0);
	printf("8 pipes x %u messages each way: %llu ms\n", N_PER_PIPE,
	       (unsigned long long)(tpt_now_ms() - t0));
	expect_one_link(&tpt_peer_a, N_PIPES, &la);
	/* Counters include framing, so they are at least the data bytes of each direction. */
	ck_assert_msg(la.bytes_sent >= multi_bytes(0), "A sent %llu bytes, data alone is %llu",
		      (unsigned long long)la.bytes_sent, (unsigned long long)multi_bytes(0));
	ck_assert_msg(la.bytes_received >= multi_bytes(1),
		      "A received %llu bytes, data alone is %llu",
		      (unsigned long long)la.bytes_received, (unsigned long long)multi_bytes(1));
	tpt_sync_post(&release, 0);
	tpt_sync_post(&release, 0);
	ck_assert(tpt_wait_ok(lp, T_MS, "listener"));
	ck_assert(tpt_wait_ok(cp, T_MS, "connector"));
}
END_TEST

/* ---- IPv6 ------------------------------------------------------------------------------------ */

/* Whether a TCP socket can listen on [::1] here; else why not in @why. */
static bool ipv6_loopback(char *why, size_t wl)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
		  listen(fd, 1) == 0;

	if (!ok)
		snprintf(why, wl, "%s", strerror(errno));
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Message 0: a 4 MiB tensor (striped); message 1: an eager payload. */
static void ipv6_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 6;
	s->index = index;
	if (index == 0) {
		s->n_tensors = 1;
		s->lens[0] = 4u << 20;
	} else {
		s->n_payloads = 1;
		s->lens[0] = 1000;
	}
}

/*
 * Both daemons listen on [::1] only and the writer dials tpip://[::1]:PORT/NAME: the link is
 * IPv6 end to end (the daemons have no IPv4 listener to fall back on), carries a striped tensor
 * and an eager payload intact, and tpipctl peers shows B's bracketed address.
 */
START_TEST(test_peers_ipv6_link_carries_tensors)
{
	const char *extra[] = { "--peer-listen", "[::1]:0", NULL };
	const char *const *base = tpt_peer_args();
	const char *args[16];
	char addr[128], want[64], why[128];
	struct tpt_link la;
	size_t n = 0;
	bool ok;

	if (!ipv6_loopback(why, sizeof(why))) {
		printf("SKIP IPv6 peer link: cannot listen on [::1] here: %s\n", why);
		return;
	}
	for (size_t i = 0; base[i]; i++)
		args[n++] = base[i];
	for (size_t i = 0; extra[i]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, args), 0);
	snprintf(addr, sizeof(addr), "tpip://[::1]:%d/ipv6", tpt_peer_b.peer_port);
	ok = tpt_xfer_run(&(struct tpt_xfer){ .d = &tpt_peer_b, .writer_d = &tpt_peer_a,
					      .name = "ipv6", .address = addr, .n_msgs = 2,
					      .spec = ipv6_spec, .writer_mem = TPT_MEM_SHM,
					      .reader_mem = TPT_MEM_PRIVATE, .timeout_ms = T_MS });
	ck_assert_msg(ok, "transfer over %s failed", addr);
	ck_assert_int_eq(tpt_peer_links(&tpt_peer_a, &la), 1);
	snprintf(want, sizeof(want), "[::1]:%d", tpt_peer_b.peer_port);
	ck_assert_msg(strcmp(la.address, want) == 0, "A's link address '%s', want '%s'",
		      la.address, want);
	ck_assert_msg(la.bytes_sent >= (4u << 20), "A sent %llu bytes over IPv6, want >= 4 MiB",
		      (unsigned long long)la.bytes_sent);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
}
END_TEST

static Suite *peers_suite(void)
{
	Suite *s = suite_create("peers");
	TCase *sz = tcase_create("sizes");
	TCase *tc = tcase_create("pipes");
	TCase *v6 = tcase_create("ipv6"); /* starts its own pair of daemons */

	tcase_add_checked_fixture(sz, setup, teardown);
	tcase_add_loop_test(sz, test_peers_sizes_arrive_intact, 0, (int)N_SIZES * 4);
	tcase_add_test(sz, test_peers_512mib_tensor_arrives_intact);
	tcase_add_loop_test(sz, test_peers_segment_kinds_arrive_intact, 0, 5);
	tcase_set_timeout(sz, 200);
	suite_add_tcase(s, sz);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_peers_remote_names_on_both_ends);
	tcase_add_test(tc, test_peers_listener_takes_no_remote_pipes_by_default);
	tcase_add_test(tc, test_peers_pipelined_writes_arrive_and_complete_in_order);
	tcase_add_test(tc, test_peers_eager_burst_arrives_whole_and_in_order);
	tcase_add_test(tc, test_peers_overlapping_reads_complete_in_order);
	tcase_add_test(tc, test_peers_tpipctl_peers_shows_the_link);
	tcase_add_test(tc, test_peers_eight_pipes_both_directions_share_one_link);
	tcase_set_timeout(tc, 200);
	suite_add_tcase(s, tc);

	tcase_add_test(v6, test_peers_ipv6_link_carries_tensors);
	tcase_set_timeout(v6, 200);
	suite_add_tcase(s, v6);
	return s;
}

int main(void)
{
	return tpt_run_suite(peers_suite());
}
