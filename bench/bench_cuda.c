/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_cuda: one-way throughput of CUDA tensors through tpipd, one tensor per message, between
 * a writer (this process) and a reader it forks before either touches CUDA (CUDA does not
 * survive fork). Three tables, each size from 1 MiB to 1 GiB in x4 steps:
 *   ipc  CUDA -> CUDA on one device (the cuda_ipc channel), against cuMemcpyDtoD between two
 *        buffers of that device;
 *   h2d  a shared CPU buffer (tp_buffer_alloc) -> CUDA, against cuMemcpyHtoD from pinned
 *        (cuMemAllocHost) and from pageable (malloc) memory;
 *   d2h  CUDA -> a shared CPU buffer, against cuMemcpyDtoH into pinned and pageable memory.
 * Both processes allocate their memory once, at the largest size, and reuse it for every
 * message, so the daemon's mappings of it are cached after the first message, as they would be
 * in a training loop. The writer keeps a few writes in flight, the reader as many reads; a
 * phase ends when the reader has read the message flagged last and says so; the figure is bytes
 * over that wall time. Every baseline is measured in the same run, in the writer process, right
 * before the phase it is compared with: the best of three trials of back-to-back copies. The
 * driver is loaded at run time (tpcuda); without one the program prints "skipped: <reason>" and
 * exits 0. It prints figures only; it never judges them.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "tpcuda.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define TIMEOUT_MS 120000
#define TAG_MAGIC 0x42435544u /* "BCUD" */
#define TAG_LAST 1u
#define SIZES_MAX 16
#define INFLIGHT_MAX 16
#define TRIALS 3

enum tag_type { TAG_DATA = 1, TAG_DONE, TAG_QUIT };
enum slot_kind { SLOT_CUDA = 1, SLOT_SHM };

/* Metadata of every message. */
struct tag {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint32_t slot; /* DATA: enum slot_kind the reader reads into */
	uint32_t pad;
	uint64_t phase;
};

struct opts {
	size_t sizes[SIZES_MAX];
	size_t n_sizes;
	size_t max_size;
	const char *kinds;	 /* comma list of ipc, h2d, d2h */
	int device;		 /* CUDA ordinal for both processes */
	int inflight;		 /* writes (and reads) in flight */
	double min_s;		 /* minimum timed seconds per phase and per baseline */
	long min_msgs;		 /* minimum timed messages per phase */
	const char *socket_path; /* NULL: $TPIPD_SOCKET, then the library's rules */
	const char *tpipd;	 /* start this tpipd on a private socket (-D) */
	char listener[64];
};

/* ---- the driver ---------------------------------------------------------------------------- */

struct cuda {
	const struct tpcuda_api *api;
	CUdevice dev;
	CUcontext ctx;
};

static int cu_check(const struct cuda *c, CUresult r, const char *call)
{
	char why[256];

	if (r == CUDA_SUCCESS)
		return 0;
	fprintf(stderr, "bench_cuda: %s\n", tpcuda_why(c->api, call, r, why, sizeof(why)));
	return tpcuda_errno(r) < 0 ? tpcuda_errno(r) : -EIO;
}

/* Calls driver entry point @call through @c; evaluates to 0 or -errno (printed). */
#define CU(c, call) cu_check((c), (c)->api->call, #call)

/* Binds the driver and makes device @ordinal's primary context current. Return: 0 or -errno. */
static int cuda_open(int ordinal, struct cuda *c)
{
	char why[256];
	int r;

	c->api = tpcuda_api(why, sizeof(why));
	if (!c->api) {
		fprintf(stderr, "bench_cuda: %s\n", why);
		return -ENODEV;
	}
	r = CU(c, cuDeviceGet(&c->dev, ordinal));
	if (r == 0)
		r = CU(c, cuDevicePrimaryCtxRetain(&c->ctx, c->dev));
	if (r == 0)
		r = CU(c, cuCtxSetCurrent(c->ctx));
	return r;
}

struct probe_msg {
	int n_devices;
	char why[256];
};

/*
 * Asks a child process whether CUDA works (this process must stay free of CUDA state until it
 * has forked the reader). Return: the number of devices, or 0 with @why filled.
 */
static int cuda_probe(char *why, size_t why_len)
{
	struct probe_msg m = { 0 };
	int fd[2], st;
	ssize_t k = -1;
	pid_t pid;

	if (pipe2(fd, O_CLOEXEC) < 0) {
		snprintf(why, why_len, "pipe: %s", strerror(errno));
		return 0;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		const struct tpcuda_api *api = tpcuda_api(m.why, sizeof(m.why));

		m.n_devices = api ? api->n_devices : 0;
		_exit(write(fd[1], &m, sizeof(m)) == (ssize_t)sizeof(m) ? 0 : 1);
	}
	close(fd[1]);
	if (pid > 0)
		k = bench_read_full(fd[0], &m, sizeof(m)) == 0 ? (ssize_t)sizeof(m) : -1;
	close(fd[0]);
	if (pid > 0)
		waitpid(pid, &st, 0);
	m.why[sizeof(m.why) - 1] = '\0';
	if (k != (ssize_t)sizeof(m))
		snprintf(why, why_len, "the CUDA probe process failed");
	else if (m.n_devices <= 0)
		snprintf(why, why_len, "%s", m.why);
	return k == (ssize_t)sizeof(m) && m.n_devices > 0 ? m.n_devices : 0;
}

/* ---- a private tpipd (-D) ------------------------------------------------------------------- */

struct daemon {
	pid_t pid;
	char dir[64];
	char sock[100];
	char log[128];
};

static bool socket_accepts(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

static void daemon_exec(const char *bin, const struct daemon *d)
{
	int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	if (fd >= 0)
		dup2(fd, STDERR_FILENO);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	execl(bin, bin, "--socket", d->sock, "--log-level", "warning", "--peer-listen", "off",
	      (char *)NULL);
	_exit(127);
}

/* Starts @bin on a socket in a fresh temporary directory. Return: 0 or -errno (printed). */
static int daemon_start(const char *bin, struct daemon *d)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/bench-cuda.XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	snprintf(d->sock, sizeof(d->sock), "%s/tpipd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/tpipd.log", d->dir);
	fflush(NULL);
	d->pid = fork();
	if (d->pid < 0)
		return -errno;
	if (d->pid == 0)
		daemon_exec(bin, d);
	for (int i = 0; i < 200; i++) {
		struct timespec ts = { 0, 50000000L };

		if (socket_accepts(d->sock))
			return 0;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			break;
		}
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "bench_cuda: %s did not start (log: %s)\n", bin, d->log);
	return -ETIMEDOUT;
}

static void daemon_stop(struct daemon *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		waitpid(d->pid, NULL, 0);
	}
	unlink(d->sock);
	unlink(d->log);
	rmdir(d->dir);
}

/* ---- the reader (forked child) -------------------------------------------------------------- */

struct reader {
	const struct opts *o;
	struct cuda cu;
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct bench_counter pending; /* reads in flight */
	CUdeviceptr dev;	      /* the CUDA slot, max_size bytes */
	void *shm;		      /* the shared-buffer slot, max_size bytes */
};

static void r_on_read(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	if (status < 0)
		fprintf(stderr, "bench_cuda: read failed: %s (%s)\n", tp_strerror(status),
			errmsg ? errmsg : "");
	bench_counter_add(arg, -1, status);
}

/* The slot of @kind, allocated at the largest size on first use. Return: 0 or -errno. */
static int r_slot(struct reader *rd, uint32_t kind, struct tp_slot *ret)
{
	int r = 0;

	if (kind == SLOT_CUDA) {
		if (!rd->dev)
			r = CU(&rd->cu, cuMemAlloc(&rd->dev, rd->o->max_size));
		*ret = (struct tp_slot){ .device = { TP_DEVICE_CUDA, rd->o->device },
					 .data = (void *)(uintptr_t)rd->dev };
		return r;
	}
	if (!rd->shm) {
		r = tp_buffer_alloc(rd->ctx, rd->o->max_size, &rd->shm);
		if (r == 0)
			memset(rd->shm, 0, rd->o->max_size);
		else
			fprintf(stderr, "bench_cuda: tp_buffer_alloc: %s\n", tp_last_error());
	}
	*ret = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = rd->shm };
	return r;
}

/* Tells the writer that phase @phase was read in full (every read completed). */
static int r_done(struct reader *rd, uint64_t phase)
{
	struct tag t = { .magic = TAG_MAGIC, .type = TAG_DONE, .phase = phase };
	struct tp_message m = { .metadata = &t, .metadata_len = sizeof(t) };
	int r = bench_counter_wait_le(&rd->pending, 0);

	return r < 0 ? r : tp_pipe_write_sync(rd->p, &m);
}

/* Reads one message. Return: 1 after QUIT, 0 to go on, -errno. */
static int r_one(struct reader *rd)
{
	struct tp_allocation none = { 0 }, a = { .n_tensors = 1 };
	struct tp_descriptor *d = NULL;
	struct tp_slot slot;
	struct tag t = { 0 };
	int r = tp_pipe_read_descriptor_sync(rd->p, TIMEOUT_MS, &d);

	if (r < 0)
		return r;
	if (d->metadata_len == sizeof(t))
		memcpy(&t, d->metadata, sizeof(t));
	if (t.magic != TAG_MAGIC || t.type != TAG_DATA || d->n_tensors != 1 ||
	    d->tensors[0].length > rd->o->max_size) {
		r = tp_pipe_read_sync(rd->p, d, &none);
		return t.type == TAG_QUIT ? 1 : -EPROTO;
	}
	r = r_slot(rd, t.slot, &slot);
	if (r == 0)
		r = bench_counter_wait_le(&rd->pending, rd->o->inflight - 1);
	if (r < 0) {
		tp_descriptor_free(d);
		return r;
	}
	a.tensors = &slot;
	bench_counter_add(&rd->pending, 1, 0);
	r = tp_pipe_read(rd->p, d, &a, r_on_read, &rd->pending);
	if (r < 0) {
		bench_counter_add(&rd->pending, -1, 0);
		return r;
	}
	return t.flags & TAG_LAST ? r_done(rd, t.phase) : 0;
}

static int r_serve(struct reader *rd, int ready_fd)
{
	struct tp_listener *l = NULL;
	int r = bench_context_open(rd->o->socket_path, 0, &rd->ctx);

	if (r == 0)
		r = tp_listen(rd->ctx, rd->o->listener, &remote_any, &l);
	bench_ready_send(ready_fd, r);
	if (r == 0)
		r = tp_listener_accept_sync(l, TIMEOUT_MS, &rd->p);
	while (r == 0)
		r = r_one(rd);
	if (r < 0)
		fprintf(stderr, "bench_cuda: reader: %s (%s)\n", tp_strerror(r), tp_last_error());
	bench_counter_wait_le(&rd->pending, 0);
	tp_pipe_close(rd->p);
	tp_listener_close(l);
	return r < 0 ? r : 0;
}

static int reader_run(void *arg, int ready_fd)
{
	struct reader rd = { .o = arg };
	int r;

	bench_counter_init(&rd.pending);
	r = cuda_open(rd.o->device, &rd.cu);
	if (r < 0)
		bench_ready_send(ready_fd, r);
	else
		r = r_serve(&rd, ready_fd);
	if (rd.shm)
		tp_buffer_free(rd.ctx, rd.shm);
	if (rd.dev) {
		tp_cuda_release(rd.ctx, (void *)(uintptr_t)rd.dev);
		rd.cu.api->cuMemFree(rd.dev);
	}
	tp_context_free(rd.ctx);
	bench_counter_done(&rd.pending);
	return r;
}

/* ---- the writer: baselines ------------------------------------------------------------------ */

struct writer {
	const struct opts *o;
	struct cuda cu;
	CUstream stream;
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct bench_counter pending; /* writes in flight */
	uint64_t phase;
	CUdeviceptr src;     /* the CUDA tensor, and the baselines' device source */
	CUdeviceptr dst;     /* the baselines' device destination */
	void *shm;	     /* the CPU tensor (shared buffer) */
	void *pinned;	     /* baselines: cuMemAllocHost */
	void *pageable;	     /* baselines: malloc, touched */
};

enum copy_kind { COPY_DTOD, COPY_HTOD_PINNED, COPY_HTOD_PAGEABLE, COPY_DTOH_PINNED,
		 COPY_DTOH_PAGEABLE };

static int copy_once(struct writer *w, enum copy_kind k, size_t size)
{
	struct cuda *c = &w->cu;

	switch (k) {
	case COPY_DTOD: return CU(c, cuMemcpyDtoDAsync(w->dst, w->src, size, w->stream));
	case COPY_HTOD_PINNED: return CU(c, cuMemcpyHtoDAsync(w->dst, w->pinned, size, w->stream));
	case COPY_HTOD_PAGEABLE: return CU(c, cuMemcpyHtoD(w->dst, w->pageable, size));
	case COPY_DTOH_PINNED: return CU(c, cuMemcpyDtoHAsync(w->pinned, w->src, size, w->stream));
	case COPY_DTOH_PAGEABLE: return CU(c, cuMemcpyDtoH(w->pageable, w->src, size));
	}
	return -EINVAL;
}

/* One trial: batches of back-to-back copies, each batch waited for, for at least @min_s. */
static double copy_trial(struct writer *w, enum copy_kind k, size_t size, double min_s)
{
	long batch = (long)((256u << 20) / size), reps = 0;
	uint64_t t0 = bench_now_ns(), el;

	batch = batch < 1 ? 1 : batch > 64 ? 64 : batch;
	do {
		for (long i = 0; i < batch; i++)
			if (copy_once(w, k, size) < 0)
				return 0;
		if (CU(&w->cu, cuStreamSynchronize(w->stream)) < 0 ||
		    CU(&w->cu, cuStreamSynchronize(NULL)) < 0)
			return 0;
		reps += batch;
		el = bench_now_ns() - t0;
	} while (reps < 2 || (double)el < min_s * 1e9);
	return (double)reps * (double)size / (double)el;
}

/* The best of TRIALS trials sharing @min_s, in GB/s (1e9 bytes); 0 if a copy failed. */
static double copy_gbps(struct writer *w, enum copy_kind k, size_t size)
{
	double best = 0, min_s = w->o->min_s < 0.3 ? w->o->min_s : 0.3;

	copy_once(w, k, size); /* warm */
	for (int i = 0; i < TRIALS; i++) {
		double bw = copy_trial(w, k, size, min_s / TRIALS);

		if (bw == 0)
			return 0;
		best = bw > best ? bw : best;
	}
	return best;
}

/* ---- the writer: phases through tpipd ------------------------------------------------------- */

struct phase_result {
	long msgs;
	double secs;
};

static int w_send(struct writer *w, const struct tp_tensor *t, uint32_t slot, bool last)
{
	struct tag tag = { .magic = TAG_MAGIC, .type = TAG_DATA, .flags = last ? TAG_LAST : 0,
			   .slot = slot, .phase = w->phase };
	struct tp_message m = { .metadata = &tag, .metadata_len = sizeof(tag),
				.tensors = (struct tp_tensor *)t, .n_tensors = 1 };
	int r = bench_counter_wait_le(&w->pending, w->o->inflight - 1);

	if (r < 0)
		return r;
	bench_counter_add(&w->pending, 1, 0);
	r = tp_pipe_write(w->p, &m, bench_on_done_dec, &w->pending);
	if (r < 0) {
		bench_counter_add(&w->pending, -1, 0);
		fprintf(stderr, "bench_cuda: tp_pipe_write: %s (%s)\n", tp_strerror(r),
			tp_last_error());
	}
	return r;
}

/* Waits for the reader's DONE of the current phase. */
static int w_wait_done(struct writer *w)
{
	struct tp_allocation none = { 0 };
	struct tp_descriptor *d = NULL;
	struct tag t = { 0 };
	int r = tp_pipe_read_descriptor_sync(w->p, TIMEOUT_MS, &d);

	if (r < 0)
		return r;
	if (d->metadata_len == sizeof(t))
		memcpy(&t, d->metadata, sizeof(t));
	r = tp_pipe_read_sync(w->p, d, &none);
	if (r == 0 && (t.magic != TAG_MAGIC || t.type != TAG_DONE || t.phase != w->phase))
		r = -EPROTO;
	return r;
}

/* Sends @t until @min_s and @min_msgs, flags the last; ends when the reader has read it. */
static int w_phase(struct writer *w, const struct tp_tensor *t, uint32_t slot, double min_s,
		   long min_msgs, struct phase_result *ret)
{
	uint64_t t0 = bench_now_ns();
	long seq;
	int r;

	w->phase++;
	for (seq = 0;; seq++) {
		bool last = seq + 1 >= min_msgs && (double)(bench_now_ns() - t0) >= min_s * 1e9;

		r = w_send(w, t, slot, last);
		if (r < 0)
			return r;
		if (last)
			break;
	}
	r = w_wait_done(w);
	if (r == 0)
		r = bench_counter_wait_le(&w->pending, 0);
	ret->msgs = seq + 1;
	ret->secs = (double)(bench_now_ns() - t0) / 1e9;
	return r;
}

/* Untimed warm-up (the daemon maps both allocations), then the timed phase, in GB/s. */
static int w_measure(struct writer *w, bool from_cuda, uint32_t slot, size_t size,
		     double *ret_gbps, struct phase_result *ret)
{
	struct tp_tensor t = { .length = size };
	struct phase_result warm;
	int r;

	if (from_cuda) {
		t.device = (struct tp_device){ TP_DEVICE_CUDA, w->o->device };
		t.data = (void *)(uintptr_t)w->src;
		t.cuda_stream = w->stream;
	} else {
		t.device = (struct tp_device){ TP_DEVICE_CPU, 0 };
		t.data = w->shm;
	}
	r = w_phase(w, &t, slot, 0, 2L * w->o->inflight, &warm);
	if (r == 0)
		r = w_phase(w, &t, slot, w->o->min_s, w->o->min_msgs, ret);
	if (r == 0)
		*ret_gbps = (double)ret->msgs * (double)size / ret->secs / 1e9;
	return r;
}

/* ---- tables --------------------------------------------------------------------------------- */

static void row(const char *name, size_t size, double gbps, const struct phase_result *pr,
		const char *base_name, double base)
{
	char sz[32], res[96], b[64], ratio[24];

	snprintf(res, sizeof(res), "%.2f GB/s (%ld msgs, %.2f s)", gbps, pr->msgs, pr->secs);
	snprintf(b, sizeof(b), "%s %.2f GB/s", base_name, base);
	snprintf(ratio, sizeof(ratio), "%.3f", base > 0 ? gbps / base : 0);
	bench_row(name, bench_fmt_size(size, sz, sizeof(sz)), res, base > 0 ? b : "error", ratio);
}

static void row_error(const char *name, size_t size)
{
	char sz[32];

	bench_row(name, bench_fmt_size(size, sz, sizeof(sz)), "error (see stderr)", "-", "-");
}

static int table_ipc(struct writer *w)
{
	char name[96];
	struct phase_result pr;
	double base, gbps = 0;
	int r = 0;

	snprintf(name, sizeof(name), "cuda ipc cuda:%d->cuda:%d k=%d", w->o->device,
		 w->o->device, w->o->inflight);
	bench_table_header("CUDA -> CUDA on one device (ratio = tpipd/cuMemcpyDtoD)");
	for (size_t i = 0; i < w->o->n_sizes && r == 0; i++) {
		size_t size = w->o->sizes[i];

		base = copy_gbps(w, COPY_DTOD, size);
		r = w_measure(w, true, SLOT_CUDA, size, &gbps, &pr);
		if (r < 0)
			row_error(name, size);
		else
			row(name, size, gbps, &pr, "cuMemcpyDtoD", base);
	}
	return r;
}

/* h2d (!@to_host): shared buffer -> CUDA; d2h: CUDA -> shared buffer; against pinned and
 * pageable cuMemcpy of the same direction. */
static int table_host(struct writer *w, bool to_host)
{
	const char *what = to_host ? "DtoH" : "HtoD";
	char name[96], name_pg[128], pinned[32], pageable[32];
	struct phase_result pr;
	double b_pin, b_pg, gbps = 0;
	int r = 0;

	snprintf(name, sizeof(name), "cuda %s k=%d", to_host ? "cuda->shm" : "shm->cuda",
		 w->o->inflight);
	snprintf(name_pg, sizeof(name_pg), "%s vs pageable", name);
	snprintf(pinned, sizeof(pinned), "%s pinned", what);
	snprintf(pageable, sizeof(pageable), "%s pageable", what);
	bench_table_header(to_host ? "CUDA -> CPU shared buffer (ratio = tpipd/cuMemcpyDtoH)" :
				     "CPU shared buffer -> CUDA (ratio = tpipd/cuMemcpyHtoD)");
	for (size_t i = 0; i < w->o->n_sizes && r == 0; i++) {
		size_t size = w->o->sizes[i];

		b_pin = copy_gbps(w, to_host ? COPY_DTOH_PINNED : COPY_HTOD_PINNED, size);
		b_pg = copy_gbps(w, to_host ? COPY_DTOH_PAGEABLE : COPY_HTOD_PAGEABLE, size);
		r = w_measure(w, to_host, to_host ? SLOT_SHM : SLOT_CUDA, size, &gbps, &pr);
		if (r < 0) {
			row_error(name, size);
			break;
		}
		row(name, size, gbps, &pr, pinned, b_pin);
		row(name_pg, size, gbps, &pr, pageable, b_pg);
	}
	return r;
}

/* ---- the writer: set-up and driver ---------------------------------------------------------- */

/* Every buffer at the largest size, touched once. Return: 0 or -errno (printed). */
static int w_alloc(struct writer *w)
{
	size_t n = w->o->max_size;
	int r = CU(&w->cu, cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING));

	if (r == 0)
		r = CU(&w->cu, cuMemAlloc(&w->src, n));
	if (r == 0)
		r = CU(&w->cu, cuMemAlloc(&w->dst, n));
	if (r == 0)
		r = CU(&w->cu, cuMemsetD8Async(w->src, 0x5a, n, w->stream));
	if (r == 0)
		r = CU(&w->cu, cuMemAllocHost(&w->pinned, n));
	if (r == 0 && !(w->pageable = malloc(n)))
		r = -ENOMEM;
	if (r == 0) {
		memset(w->pinned, 0xa5, n);
		memset(w->pageable, 0xa5, n);
		r = tp_buffer_alloc(w->ctx, n, &w->shm);
		if (r < 0)
			fprintf(stderr, "bench_cuda: tp_buffer_alloc(%zu): %s\n", n,
				tp_last_error());
	}
	if (r == 0) {
		memset(w->shm, 0xa5, n);
		r = CU(&w->cu, cuStreamSynchronize(w->stream));
	}
	return r;
}

static void w_free(struct writer *w)
{
	if (w->shm)
		tp_buffer_free(w->ctx, w->shm);
	free(w->pageable);
	if (w->pinned)
		w->cu.api->cuMemFreeHost(w->pinned);
	if (w->src) {
		tp_cuda_release(w->ctx, (void *)(uintptr_t)w->src);
		w->cu.api->cuMemFree(w->src);
	}
	if (w->dst)
		w->cu.api->cuMemFree(w->dst);
	if (w->stream)
		w->cu.api->cuStreamDestroy(w->stream);
}

static int w_tables(struct writer *w)
{
	struct tag quit = { .magic = TAG_MAGIC, .type = TAG_QUIT };
	struct tp_message m = { .metadata = &quit, .metadata_len = sizeof(quit) };
	int r = 0, failed = 0;

	if (bench_list_has(w->o->kinds, "ipc") && (r = table_ipc(w)) < 0)
		failed = r;
	if (r == 0 && bench_list_has(w->o->kinds, "h2d") && (r = table_host(w, false)) < 0)
		failed = r;
	if (r == 0 && bench_list_has(w->o->kinds, "d2h") && (r = table_host(w, true)) < 0)
		failed = r;
	if (bench_counter_wait_le(&w->pending, 0) == 0)
		tp_pipe_write_sync(w->p, &m);
	return failed;
}

static int writer_run(const struct opts *o)
{
	struct writer w = { .o = o };
	int r;

	bench_counter_init(&w.pending);
	r = cuda_open(o->device, &w.cu);
	if (r == 0)
		r = bench_context_open(o->socket_path, 0, &w.ctx);
	if (r == 0)
		r = tp_connect(w.ctx, o->listener, &w.p);
	if (r == 0)
		r = tp_pipe_wait_connected(w.p, TIMEOUT_MS);
	if (r == 0)
		r = w_alloc(&w);
	if (r == 0)
		r = w_tables(&w);
	else
		fprintf(stderr, "bench_cuda: set-up failed: %s (%s)\n", tp_strerror(r),
			tp_last_error());
	tp_pipe_close(w.p);
	w_free(&w);
	tp_context_free(w.ctx);
	bench_counter_done(&w.pending);
	return r;
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(void)
{
	printf("usage: bench_cuda [-s SIZES] [-K KINDS] [-d DEVICE] [-k N] [-T SECONDS] [-m MSGS]\n"
	       "                  [-S SOCKET | -D TPIPD] [-t]\n"
	       "  -s SIZES    comma list, K/M/G suffixes (default 1M,4M,16M,64M,256M,1G, capped\n"
	       "              by $BENCH_CUDA_MAX_SIZE, e.g. 64M)\n"
	       "  -K KINDS    comma list of ipc (cuda->cuda), h2d (shm->cuda), d2h (cuda->shm)\n"
	       "  -d DEVICE   CUDA device ordinal of both processes (default 0)\n"
	       "  -k N        writes and reads in flight (default 2, at most %d)\n"
	       "  -T SECONDS  minimum timed duration per size (default 0.5)\n"
	       "  -m MSGS     minimum timed messages per size (default 4)\n"
	       "  -S SOCKET   tpipd socket (default: $TPIPD_SOCKET, then the library's rules)\n"
	       "  -D TPIPD    start this tpipd on a private socket for the run\n"
	       "  -t          tab-separated rows, no header (as bench/run.sh reads them)\n",
	       INFLIGHT_MAX);
}

static int parse_sizes(const char *arg, size_t cap, struct opts *o)
{
	char *dup = strdup(arg), *save = NULL, *tok;
	int r = dup ? 0 : -ENOMEM;
	size_t v;

	o->n_sizes = 0;
	o->max_size = 0;
	for (tok = dup ? strtok_r(dup, ",", &save) : NULL; tok && r == 0;
	     tok = strtok_r(NULL, ",", &save)) {
		r = bench_parse_size(tok, &v);
		if (r < 0 || (cap && v > cap))
			continue;
		if (o->n_sizes == SIZES_MAX)
			r = -E2BIG;
		else
			o->sizes[o->n_sizes++] = v;
		o->max_size = v > o->max_size ? v : o->max_size;
	}
	free(dup);
	return r == 0 && o->n_sizes == 0 ? -EINVAL : r;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	const char *cap_env = getenv("BENCH_CUDA_MAX_SIZE");
	size_t cap = 0;
	int opt, r = 0;

	*o = (struct opts){ .kinds = "ipc,h2d,d2h", .inflight = 2, .min_s = 0.5, .min_msgs = 4 };
	if (cap_env && *cap_env && bench_parse_size(cap_env, &cap) < 0)
		return -EINVAL;
	r = parse_sizes("1M,4M,16M,64M,256M,1G", cap, o);
	while ((opt = getopt(argc, argv, "s:K:d:k:T:m:S:D:th")) != -1 && r == 0) {
		switch (opt) {
		case 's': r = parse_sizes(optarg, 0, o); break;
		case 'K': o->kinds = optarg; break;
		case 'd': o->device = atoi(optarg); break;
		case 'k': o->inflight = atoi(optarg); break;
		case 'T': o->min_s = strtod(optarg, NULL); break;
		case 'm': o->min_msgs = strtol(optarg, NULL, 10); break;
		case 'S': o->socket_path = optarg; break;
		case 'D': o->tpipd = optarg; break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: r = -EINVAL; break;
		}
	}
	if (r == 0 && (o->inflight < 1 || o->inflight > INFLIGHT_MAX || o->min_s < 0 ||
		       o->min_msgs < 1 || o->device < 0 || optind != argc))
		r = -EINVAL;
	if (r < 0)
		usage();
	return r;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void skipped(const char *why)
{
	if (bench_tsv) { /* one row in the caller's table, the reason beside it on stderr */
		bench_row("cuda", "-", "skipped (no GPU: see stderr)", "-", "-");
		fprintf(stderr, "bench_cuda: skipped: %s\n", why);
	} else {
		printf("skipped: %s\n", why);
	}
	fflush(stdout);
}

/* Forks the reader (before this process touches CUDA), runs the writer, reaps the reader. */
static int run(struct opts *o)
{
	int ready_fd, r;
	pid_t pid;

	snprintf(o->listener, sizeof(o->listener), "bench-cuda-%d", (int)getpid());
	r = bench_spawn(reader_run, o, &pid, &ready_fd);
	if (r < 0)
		return r;
	r = bench_ready_wait(ready_fd, TIMEOUT_MS);
	close(ready_fd);
	if (r == 0)
		r = writer_run(o);
	else
		fprintf(stderr, "bench_cuda: the reader did not start: %s\n", strerror(-r));
	if (r < 0)
		kill(pid, SIGTERM);
	if (bench_reap(pid, "reader") < 0 && r == 0)
		r = -ECHILD;
	return r;
}

int main(int argc, char **argv)
{
	struct daemon d = { 0 };
	struct opts o;
	char why[300];
	int n, r;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	n = cuda_probe(why, sizeof(why));
	if (n > 0 && o.device >= n)
		snprintf(why, sizeof(why), "CUDA device %d requested, the driver sees %d",
			 o.device, n);
	if (n <= 0 || o.device >= n) {
		skipped(why);
		return 0;
	}
	if (o.tpipd) {
		r = daemon_start(o.tpipd, &d);
		if (r < 0)
			return 1;
		o.socket_path = d.sock;
	}
	r = run(&o);
	if (o.tpipd)
		daemon_stop(&d);
	return r < 0 ? 1 : 0;
}
