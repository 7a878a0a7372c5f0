/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-demo: a small, complete libtpclient program. By default it forks a listener process and a
 * connector process (before either creates a tp_context); the connector sends a few messages,
 * each with metadata, a small private payload, a payload and a tensor in a shared buffer from
 * tp_buffer_alloc() and a large private (malloc'd) tensor, all filled with a known pattern; the
 * listener reads each descriptor, allocates (malloc'd memory and a shared buffer), reads, checks
 * every byte and answers with one short message. It prints what moved and exits non-zero on any
 * error or mismatch. Only the public API in tpclient.h is used; this is example code, not a test.
 *
 * Roles: "both" (default), or "listen" and "connect" to run the two halves in two terminals.
 * Builds on its own: cc demo.c $(pkg-config --cflags --libs libtpclient).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2() */
#endif
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <tpclient.h>

#define DEMO_TIMEOUT_MS 30000	  /* accept, descriptor and connect waits */
#define DEMO_RUN_MAX_MS 300000	  /* whole run in "both" mode */
#define DEMO_HOLD_MAX_MS 120000	  /* longest --hold */
#define DEMO_SMALL_BYTES 64	  /* the small payload: travels inline */
#define DEMO_SHM_PAYLOAD (256u << 10) /* the payload that lives in the shared buffer */
#define DEMO_SLOTS_MAX 8	  /* segments per message the listener accepts */
#define DEMO_LABEL_MAX 32

enum demo_role { ROLE_BOTH, ROLE_LISTEN, ROLE_CONNECT };

struct demo_opts {
	const char *socket_path;
	const char *name;    /* listener name */
	unsigned messages;
	size_t tensor_bytes; /* the private tensor; the shared tensor is half of it */
	const char *hold_file;
	bool no_cma;
	bool remote; /* the listener takes pipes from other hosts' daemons */
	enum demo_role role;
};

/* Pipes between the "both" parent and its children; -1 when running one role alone. */
struct demo_sync {
	int ready_w;   /* listener -> parent: the name is registered */
	int done_w;    /* child -> parent: my work succeeded */
	int release_r; /* parent -> children: EOF means close and exit */
};

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *fmt_size(size_t n, char *buf, size_t len)
{
	if (n < 1024)
		snprintf(buf, len, "%zu B", n);
	else if (n < (1u << 20))
		snprintf(buf, len, "%.1f KiB", n / 1024.0);
	else
		snprintf(buf, len, "%.1f MiB", n / 1048576.0);
	return buf;
}

static double mib_per_s(uint64_t bytes, uint64_t ns)
{
	return ns ? (bytes / 1048576.0) / (ns / 1e9) : 0.0;
}

/* Prints "who: what: error (detail)" and returns 1, the exit status of a failed role. */
static int fail(const char *who, const char *what, int err)
{
	fprintf(stderr, "%s: %s: %s (%s)\n", who, what, tp_strerror(err), tp_last_error());
	return 1;
}

/* Every byte of segment @seg of message @msg is derived from (msg, seg, offset). */
static uint8_t pattern_byte(uint32_t seed, size_t k)
{
	return (uint8_t)(k * 167u + (k >> 11) + seed * 59u);
}

static uint32_t pattern_seed(unsigned msg, unsigned seg)
{
	return msg * 16u + seg + 1u;
}

static void pattern_fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t k = 0; k < n; k++)
		p[k] = pattern_byte(seed, k);
}

/* Return: offset of the first wrong byte, or -1 if all @n bytes match. */
static ssize_t pattern_check(const uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t k = 0; k < n; k++)
		if (p[k] != pattern_byte(seed, k))
			return (ssize_t)k;
	return -1;
}

static int context_open(const struct demo_opts *o, const char *name, struct tp_context **ret)
{
	struct tp_context_options co = {
		.size = sizeof(co),
		.socket_path = o->socket_path,
		.name = name,
		.flags = o->no_cma ? TP_CONTEXT_NO_CMA : 0,
	};

	return tp_context_new(&co, ret);
}

static void sync_signal(int fd)
{
	if (fd >= 0 && write(fd, "D", 1) != 1)
		perror("tp-demo: signalling the parent");
}

/* Blocks until the parent closes the release pipe (at once when running alone). */
static void sync_wait_release(const struct demo_sync *s)
{
	char c;

	if (s->release_r >= 0)
		while (read(s->release_r, &c, 1) < 0 && errno == EINTR)
			;
}

/* ---- connector ---------------------------------------------------------------------------- */

/* Source memory of the connector, reused (refilled) for every message. */
struct src_mem {
	uint8_t small[DEMO_SMALL_BYTES]; /* private, inside this struct */
	uint8_t *shm;			 /* tp_buffer_alloc(): payload 1, then tensor 0 */
	size_t shm_tensor;		 /* bytes of tensor 0 */
	uint8_t *priv;			 /* malloc(): tensor 1 */
	size_t priv_len;
};

static int src_alloc(struct tp_context *ctx, const struct demo_opts *o, struct src_mem *m)
{
	void *p = NULL;
	int r;

	m->shm_tensor = o->tensor_bytes / 2 ? o->tensor_bytes / 2 : 1;
	r = tp_buffer_alloc(ctx, DEMO_SHM_PAYLOAD + m->shm_tensor, &p);
	if (r < 0)
		return fail("connector", "tp_buffer_alloc", r);
	m->shm = p;
	m->priv_len = o->tensor_bytes;
	m->priv = malloc(m->priv_len);
	if (!m->priv) {
		fprintf(stderr, "connector: out of memory\n");
		return 1;
	}
	return 0;
}

static void src_free(struct tp_context *ctx, struct src_mem *m)
{
	if (m->shm)
		tp_buffer_free(ctx, m->shm);
	free(m->priv);
}

static void src_fill(struct src_mem *m, unsigned msg)
{
	pattern_fill(m->small, sizeof(m->small), pattern_seed(msg, 0));
	pattern_fill(m->shm, DEMO_SHM_PAYLOAD, pattern_seed(msg, 1));
	pattern_fill(m->shm + DEMO_SHM_PAYLOAD, m->shm_tensor, pattern_seed(msg, 2));
	pattern_fill(m->priv, m->priv_len, pattern_seed(msg, 3));
}

static int src_write(struct tp_pipe *p, struct src_mem *m, unsigned msg, unsigned total)
{
	static const char md_small[] = "small/private", md_pshm[] = "payload/shared",
			  md_tshm[] = "tensor/shared", md_tpriv[] = "tensor/private";
	char md[64];
	struct tp_payload pl[2] = {
		{ m->small, sizeof(m->small), md_small, sizeof(md_small) - 1 },
		{ m->shm, DEMO_SHM_PAYLOAD, md_pshm, sizeof(md_pshm) - 1 },
	};
	struct tp_tensor tn[2] = {
		{ .device = { TP_DEVICE_CPU, 0 }, .data = m->shm + DEMO_SHM_PAYLOAD,
		  .length = m->shm_tensor, .metadata = md_tshm,
		  .metadata_len = sizeof(md_tshm) - 1 },
		{ .device = { TP_DEVICE_CPU, 0 }, .data = m->priv, .length = m->priv_len,
		  .metadata = md_tpriv, .metadata_len = sizeof(md_tpriv) - 1 },
	};
	struct tp_message msg_desc = {
		.metadata = md, .payloads = pl, .n_payloads = 2, .tensors = tn, .n_tensors = 2,
	};

	msg_desc.metadata_len = (size_t)snprintf(md, sizeof(md), "tp-demo %u/%u", msg + 1, total);
	return tp_pipe_write_sync(p, &msg_desc);
}

/* Reads the listener's one-payload answer and prints it. */
static int src_read_reply(struct tp_pipe *p)
{
	struct tp_descriptor *d = NULL;
	char text[257] = "";
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = text };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	int r;

	r = tp_pipe_read_descriptor_sync(p, DEMO_TIMEOUT_MS, &d);
	if (r < 0)
		return fail("connector", "reading the answer's descriptor", r);
	if (d->n_payloads != 1 || d->n_tensors != 0 || d->payloads[0].length >= sizeof(text)) {
		fprintf(stderr, "connector: unexpected answer from the listener\n");
		tp_descriptor_free(d);
		return 1;
	}
	r = tp_pipe_read_sync(p, d, &a);
	if (r < 0)
		return fail("connector", "reading the answer", r);
	printf("connector: listener answered: %s\n", text);
	return 0;
}

static int src_send_all(struct tp_pipe *p, struct src_mem *m, const struct demo_opts *o)
{
	size_t per_msg = DEMO_SMALL_BYTES + DEMO_SHM_PAYLOAD + m->shm_tensor + m->priv_len;
	uint64_t t0 = now_ns(), dt;
	char b[32];
	int r;

	for (unsigned i = 0; i < o->messages; i++) {
		src_fill(m, i);
		r = src_write(p, m, i, o->messages);
		if (r < 0)
			return fail("connector", "tp_pipe_write_sync", r);
	}
	dt = now_ns() - t0;
	r = src_read_reply(p);
	if (r == 0)
		printf("connector: wrote %u messages of %s each in %.1f ms (%.0f MiB/s, pattern "
		       "fill included)\n",
		       o->messages, fmt_size(per_msg, b, sizeof(b)), dt / 1e6,
		       mib_per_s((uint64_t)per_msg * o->messages, dt));
	return r;
}

static int connector_main(const struct demo_opts *o, const struct demo_sync *s)
{
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	struct src_mem m = { 0 };
	int r;

	r = context_open(o, "tp-demo-connector", &ctx);
	if (r < 0)
		return fail("connector", "tp_context_new", r);
	r = tp_connect(ctx, o->name, &p);
	if (r < 0) {
		r = fail("connector", "tp_connect", r);
		goto out;
	}
	r = tp_pipe_wait_connected(p, DEMO_TIMEOUT_MS);
	if (r < 0) {
		r = fail("connector", o->name, r);
		goto out;
	}
	printf("connector: connected to '%s' (cma %s)\n", tp_pipe_remote_name(p),
	       tp_context_cma_ok(ctx) ? "ok" : "not permitted: staging");
	r = src_alloc(ctx, o, &m);
	if (r == 0)
		r = src_send_all(p, &m, o);
	if (r == 0) {
		sync_signal(s->done_w);
		sync_wait_release(s);
	}
out:
	tp_pipe_close(p);
	src_free(ctx, &m);
	tp_context_free(ctx);
	return r;
}

/* ---- listener ----------------------------------------------------------------------------- */

/* What the listener keeps of a descriptor; tp_pipe_read() takes the descriptor itself. */
struct msg_info {
	unsigned idx, total; /* from the message metadata "tp-demo IDX/TOTAL" */
	size_t npay, nseg;   /* payloads, then tensors */
	size_t len[DEMO_SLOTS_MAX];
	char label[DEMO_SLOTS_MAX][DEMO_LABEL_MAX];
};

/* Destination memory, one slot per segment, reused while it is large enough. */
struct dst_slot {
	void *p;
	size_t cap;
	bool shared; /* from tp_buffer_alloc(), else malloc() */
};

struct dst_mem {
	struct dst_slot slot[DEMO_SLOTS_MAX];
};

static void info_label(char *dst, const void *md, size_t len)
{
	if (len >= DEMO_LABEL_MAX)
		len = DEMO_LABEL_MAX - 1;
	memcpy(dst, md, len);
	dst[len] = '\0';
}

static int info_parse(const struct tp_descriptor *d, unsigned want, struct msg_info *mi)
{
	char md[DEMO_LABEL_MAX];

	info_label(md, d->metadata, d->metadata_len);
	if (sscanf(md, "tp-demo %u/%u", &mi->idx, &mi->total) != 2 || mi->idx != want + 1 ||
	    mi->total == 0 || mi->idx > mi->total) {
		fprintf(stderr, "listener: unexpected message metadata '%s'\n", md);
		return 1;
	}
	mi->npay = d->n_payloads;
	mi->nseg = d->n_payloads + d->n_tensors;
	if (mi->nseg > DEMO_SLOTS_MAX) {
		fprintf(stderr, "listener: message with %zu segments\n", mi->nseg);
		return 1;
	}
	for (size_t j = 0; j < d->n_payloads; j++) {
		mi->len[j] = d->payloads[j].length;
		info_label(mi->label[j], d->payloads[j].metadata, d->payloads[j].metadata_len);
	}
	for (size_t t = 0; t < d->n_tensors; t++) {
		mi->len[mi->npay + t] = d->tensors[t].length;
		info_label(mi->label[mi->npay + t], d->tensors[t].metadata,
			   d->tensors[t].metadata_len);
		if (d->tensors[t].device.type != TP_DEVICE_CPU) {
			fprintf(stderr, "listener: tensor %zu is not in CPU memory\n", t);
			return 1;
		}
	}
	return 0;
}

static void dst_slot_free(struct tp_context *ctx, struct dst_slot *s)
{
	if (s->shared)
		tp_buffer_free(ctx, s->p);
	else
		free(s->p);
	*s = (struct dst_slot){ 0 };
}

/* Tensors at odd positions land in a shared buffer, everything else in malloc'd memory. */
static int dst_prepare(struct tp_context *ctx, struct dst_mem *m, const struct msg_info *mi)
{
	for (size_t j = 0; j < mi->nseg; j++) {
		struct dst_slot *s = &m->slot[j];
		bool shared = j >= mi->npay && ((j - mi->npay) & 1);
		size_t len = mi->len[j] ? mi->len[j] : 1;
		int r = 0;

		if (s->p && s->cap >= len && s->shared == shared)
			continue;
		dst_slot_free(ctx, s);
		if (shared)
			r = tp_buffer_alloc(ctx, len, &s->p);
		else if (!(s->p = malloc(len)))
			r = -ENOMEM;
		if (r < 0)
			return fail("listener", "allocating the destination", r);
		s->cap = len;
		s->shared = shared;
	}
	return 0;
}

static void dst_free(struct tp_context *ctx, struct dst_mem *m)
{
	for (size_t j = 0; j < DEMO_SLOTS_MAX; j++)
		if (m->slot[j].p)
			dst_slot_free(ctx, &m->slot[j]);
}

/* Checks every byte of every segment and prints one line per segment. */
static int dst_verify(const struct dst_mem *m, const struct msg_info *mi, uint64_t ns)
{
	uint64_t bytes = 0;
	int bad = 0;
	char b[32];

	for (size_t j = 0; j < mi->nseg; j++)
		bytes += mi->len[j];
	printf("listener: message %u/%u: %zu segments, %s in %.2f ms (%.0f MiB/s)\n", mi->idx,
	       mi->total, mi->nseg, fmt_size(bytes, b, sizeof(b)), ns / 1e6, mib_per_s(bytes, ns));
	for (size_t j = 0; j < mi->nseg; j++) {
		bool pay = j < mi->npay;
		ssize_t off = pattern_check(m->slot[j].p, mi->len[j], pattern_seed(mi->idx - 1, j));

		printf("listener:   %-7s %zu  %-15s %10s -> %-7s  ", pay ? "payload" : "tensor",
		       pay ? j : j - mi->npay, mi->label[j], fmt_size(mi->len[j], b, sizeof(b)),
		       m->slot[j].shared ? "shared" : "private");
		if (off < 0) {
			printf("ok\n");
			continue;
		}
		printf("MISMATCH at byte %zd\n", off);
		bad = 1;
	}
	return bad;
}

static int dst_read_one(struct tp_context *ctx, struct tp_pipe *p, struct dst_mem *m,
			struct msg_info *mi)
{
	struct tp_slot slots[DEMO_SLOTS_MAX];
	struct tp_descriptor *d = NULL;
	struct tp_allocation a;
	uint64_t t0;
	unsigned want = mi->idx;
	int r;

	r = tp_pipe_read_descriptor_sync(p, DEMO_TIMEOUT_MS, &d);
	if (r < 0)
		return fail("listener", "tp_pipe_read_descriptor_sync", r);
	if (info_parse(d, want, mi) || dst_prepare(ctx, m, mi)) {
		tp_descriptor_free(d);
		return 1;
	}
	for (size_t j = 0; j < mi->nseg; j++)
		slots[j] = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = m->slot[j].p };
	a = (struct tp_allocation){ .payloads = slots, .n_payloads = mi->npay,
				    .tensors = slots + mi->npay, .n_tensors = mi->nseg - mi->npay };
	t0 = now_ns();
	r = tp_pipe_read_sync(p, d, &a);
	if (r < 0)
		return fail("listener", "tp_pipe_read_sync", r);
	return dst_verify(m, mi, now_ns() - t0);
}

/* Receives every message into @m, then answers with one short text payload. */
static int dst_receive_all(struct tp_context *ctx, struct tp_pipe *p, struct dst_mem *m)
{
	struct msg_info mi = { 0 };
	uint64_t bytes = 0, t0 = now_ns(), dt;
	char text[128], b[32];
	struct tp_payload pl = { .data = text };
	struct tp_message reply = { .payloads = &pl, .n_payloads = 1 };
	int r;

	do {
		r = dst_read_one(ctx, p, m, &mi);
		for (size_t j = 0; r == 0 && j < mi.nseg; j++)
			bytes += mi.len[j];
	} while (r == 0 && mi.idx < mi.total);
	dt = now_ns() - t0;
	if (r)
		return r;
	printf("listener: %u messages, %s verified in %.1f ms (%.0f MiB/s)\n", mi.total,
	       fmt_size(bytes, b, sizeof(b)), dt / 1e6, mib_per_s(bytes, dt));
	snprintf(text, sizeof(text), "verified %u messages, %" PRIu64 " bytes", mi.total, bytes);
	pl.length = strlen(text) + 1;
	r = tp_pipe_write_sync(p, &reply);
	return r < 0 ? fail("listener", "writing the answer", r) : 0;
}

static int listener_main(const struct demo_opts *o, const struct demo_sync *s)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *p = NULL;
	struct dst_mem m = { 0 };
	/* Owner-only on this host; other hosts only when asked for (--remote). */
	struct tp_listen_options lo = {
		.size = sizeof(lo),
		.access = TP_ACCESS_OWNER,
		.remote = o->remote ? TP_REMOTE_ANY_PEER : TP_REMOTE_NONE,
	};
	int r;

	r = context_open(o, "tp-demo-listener", &ctx);
	if (r < 0)
		return fail("listener", "tp_context_new", r);
	r = tp_listen(ctx, o->name, &lo, &l);
	if (r < 0) {
		r = fail("listener", "tp_listen", r);
		goto out;
	}
	printf("listener: listening on '%s' (cma %s)\n", o->name,
	       tp_context_cma_ok(ctx) ? "ok" : "not permitted: staging");
	if (s->ready_w < 0)
		printf("listener: now run: tp-demo connect --name %s\n", o->name);
	sync_signal(s->ready_w);
	r = tp_listener_accept_sync(l, DEMO_TIMEOUT_MS, &p);
	if (r < 0) {
		r = fail("listener", "tp_listener_accept_sync", r);
		goto out;
	}
	printf("listener: accepted a pipe from '%s'\n", tp_pipe_remote_name(p));
	r = dst_receive_all(ctx, p, &m);
	if (r == 0) {
		sync_signal(s->done_w);
		sync_wait_release(s);
	}
out:
	tp_pipe_close(p);
	tp_listener_close(l);
	dst_free(ctx, &m);
	tp_context_free(ctx);
	return r;
}

/* ---- "both": parent of a listener and a connector ----------------------------------------- */

struct kids {
	pid_t pid[2]; /* listener, connector; 0 when not started or reaped */
	int status[2];
};

/* Reaps children that exited. Return: true if any exited since the last call. */
static bool kids_reap(struct kids *k, int flags)
{
	bool any = false;

	for (int i = 0; i < 2; i++) {
		if (k->pid[i] > 0 && waitpid(k->pid[i], &k->status[i], flags) == k->pid[i]) {
			k->pid[i] = 0;
			any = true;
		}
	}
	return any;
}

static void kids_kill(struct kids *k)
{
	for (int i = 0; i < 2; i++)
		if (k->pid[i] > 0)
			kill(k->pid[i], SIGTERM);
	kids_reap(k, 0);
}

/* Reads @want bytes from @fd; fails if a child exits first or @timeout_ms passes. */
static int wait_bytes(int fd, struct kids *k, int want, int timeout_ms)
{
	uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	char c;

	while (want > 0) {
		if (poll(&pfd, 1, 100) > 0) {
			ssize_t n = read(fd, &c, 1);
			if (n == 0)
				return -EPIPE;
			want -= n == 1;
			continue;
		}
		if (kids_reap(k, WNOHANG))
			return -ECHILD;
		if (now_ns() > deadline)
			return -ETIMEDOUT;
	}
	return 0;
}

/* Creates @path, then waits until someone removes it (at most DEMO_HOLD_MAX_MS). */
static void hold_wait(const char *path)
{
	const struct timespec tick = { 0, 50 * 1000000 };
	uint64_t deadline = now_ns() + (uint64_t)DEMO_HOLD_MAX_MS * 1000000ull;
	FILE *f = fopen(path, "we");

	if (!f) {
		perror("tp-demo: --hold file");
		return;
	}
	fprintf(f, "%d\n", (int)getpid());
	fclose(f);
	printf("tp-demo: pipes stay open until %s is removed\n", path);
	fflush(stdout);
	while (access(path, F_OK) == 0) {
		if (now_ns() > deadline) {
			fprintf(stderr, "tp-demo: %s still there after %d s, going on\n", path,
				DEMO_HOLD_MAX_MS / 1000);
			unlink(path);
			break;
		}
		nanosleep(&tick, NULL);
	}
}

static pid_t spawn(int (*role_main)(const struct demo_opts *, const struct demo_sync *),
		   const struct demo_opts *o, const struct demo_sync *s, const int *close_fds,
		   int nclose)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid != 0)
		return pid;
	for (int i = 0; i < nclose; i++)
		close(close_fds[i]);
	_exit(role_main(o, s));
}

static int both_report(const struct kids *k, int err)
{
	static const char *const who[2] = { "listener", "connector" };
	bool ok = err == 0;

	for (int i = 0; i < 2; i++) {
		int st = k->status[i];
		bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (!good)
			fprintf(stderr, "tp-demo: %s %s %d\n", who[i],
				WIFSIGNALED(st) ? "killed by signal" : "exited with status",
				WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		ok = ok && good;
	}
	if (err)
		fprintf(stderr, "tp-demo: %s\n",
			err == -ETIMEDOUT ? "timed out" : "a child failed");
	printf("tp-demo: %s\n", ok ? "all bytes verified" : "FAILED");
	return ok ? 0 : 1;
}

/* Fork both children before anything creates a tp_context; wire them with three pipes. */
static int run_both(const struct demo_opts *o)
{
	int ready[2], done[2], release[2], r;
	struct kids k = { 0 };
	struct demo_sync s;

	if (pipe2(ready, O_CLOEXEC) || pipe2(done, O_CLOEXEC) || pipe2(release, O_CLOEXEC)) {
		perror("tp-demo: pipe2");
		return 1;
	}
	s = (struct demo_sync){ .ready_w = ready[1], .done_w = done[1], .release_r = release[0] };
	k.pid[0] = spawn(listener_main, o, &s, (int[]){ ready[0], done[0], release[1] }, 3);
	close(ready[1]);
	r = k.pid[0] < 0 ? -errno : wait_bytes(ready[0], &k, 1, DEMO_TIMEOUT_MS);
	close(ready[0]);
	s.ready_w = -1;
	if (r == 0)
		k.pid[1] = spawn(connector_main, o, &s, (int[]){ done[0], release[1] }, 2);
	close(done[1]);
	close(release[0]);
	if (r == 0)
		r = k.pid[1] < 0 ? -errno : wait_bytes(done[0], &k, 2, DEMO_RUN_MAX_MS);
	if (r == 0 && o->hold_file)
		hold_wait(o->hold_file);
	close(release[1]);
	if (r == 0)
		kids_reap(&k, 0);
	else
		kids_kill(&k);
	close(done[0]);
	return both_report(&k, r);
}

/* ---- command line ------------------------------------------------------------------------- */

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: tp-demo [OPTIONS] [both|listen|connect]\n"
		"\n"
		"Moves a few messages between two processes through tpipd and checks every byte.\n"
		"'both' (default) forks a listener and a connector; 'listen' and 'connect'\n"
		"run one half each, e.g. in two terminals.\n"
		"\n"
		"  -s, --socket PATH    tpipd socket (default: as libtpclient resolves it)\n"
		"  -n, --name NAME      listener name (default tp-demo)\n"
		"  -m, --messages N     messages to send (default 3, at most 1000)\n"
		"  -z, --size MIB       private tensor size in MiB (default 8; the shared tensor\n"
		"                       is half of it)\n"
		"      --hold FILE      'both' only: after the transfer, create FILE and keep the\n"
		"                       pipe open until FILE is removed (at most %d s)\n"
		"      --no-cma         never use cross-memory attach (stage through shared\n"
		"                       buffers)\n"
		"      --remote         'listen': also accept pipes from other hosts' daemons\n"
		"                       (tpip://THISHOST/NAME); by default only this host\n"
		"  -h, --help           show this help\n",
		DEMO_HOLD_MAX_MS / 1000);
}

static int parse_uint(const char *s, unsigned long max, unsigned long *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v == 0 || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_role(const char *s, enum demo_role *ret)
{
	if (strcmp(s, "both") == 0)
		*ret = ROLE_BOTH;
	else if (strcmp(s, "listen") == 0)
		*ret = ROLE_LISTEN;
	else if (strcmp(s, "connect") == 0)
		*ret = ROLE_CONNECT;
	else
		return -EINVAL;
	return 0;
}

/* Return: -1 to go on, else an exit status. */
static int parse_args(int argc, char **argv, struct demo_opts *o)
{
	enum { OPT_HOLD = 256, OPT_NO_CMA, OPT_REMOTE };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "name", required_argument, NULL, 'n' },
		{ "messages", required_argument, NULL, 'm' },
		{ "size", required_argument, NULL, 'z' },
		{ "hold", required_argument, NULL, OPT_HOLD },
		{ "no-cma", no_argument, NULL, OPT_NO_CMA },
		{ "remote", no_argument, NULL, OPT_REMOTE },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	unsigned long v;
	int c;

	while ((c = getopt_long(argc, argv, "s:n:m:z:h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': o->socket_path = optarg; break;
		case 'n': o->name = optarg; break;
		case 'm':
			if (parse_uint(optarg, 1000, &v) < 0)
				goto bad;
			o->messages = (unsigned)v;
			break;
		case 'z':
			if (parse_uint(optarg, 4096, &v) < 0)
				goto bad;
			o->tensor_bytes = (size_t)v << 20;
			break;
		case OPT_HOLD: o->hold_file = optarg; break;
		case OPT_NO_CMA: o->no_cma = true; break;
		case OPT_REMOTE: o->remote = true; break;
		case 'h': usage(stdout); return 0;
		default: goto bad;
		}
	}
	if (optind < argc && parse_role(argv[optind++], &o->role) < 0)
		goto bad;
	if (optind == argc)
		return -1;
bad:
	fprintf(stderr, "tp-demo: bad arguments; try 'tp-demo --help'\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct demo_opts o = { .name = "tp-demo", .messages = 3, .tensor_bytes = 8u << 20 };
	struct demo_sync alone = { -1, -1, -1 };
	int r = parse_args(argc, argv, &o);

	if (r >= 0)
		return r;
	setvbuf(stdout, NULL, _IOLBF, 0);
	switch (o.role) {
	case ROLE_LISTEN: return listener_main(&o, &alone);
	case ROLE_CONNECT: return connector_main(&o, &alone);
	default: return run_both(&o);
	}
}
