/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_cuda_calls: what each CUDA driver call on a message's path through tpipd costs on this
 * machine, so that the per-message overhead bench_cuda shows can be laid against its parts. An
 * exporter process (forked before either touches CUDA, which does not survive fork) allocates
 * device memory and an interprocess event, records the event and passes both IPC handles over a
 * pipe, as a client does through tpipd; this process, the importer, plays the daemon and the
 * client library and times each step N times: the median and the 90th percentile in
 * microseconds. The steps: opening and closing the mapping of the exporter's memory and event
 * (the daemon, once per transfer unless cuda-cache-mappings), querying an imported event that
 * completed (the copy thread's wait for a client's work), a copy from the imported mapping into
 * local memory with the wait on an event recorded behind it (the copy itself, for 4 KiB and the
 * -s size), the client library's export steps (buffer id attribute, context push and pop, event
 * record, IPC handles), and the host's own sched_yield and a 20 us nanosleep (the copy thread's
 * polling steps). The driver is loaded at run time; without one it prints "skipped: <reason>"
 * and exits 0. It prints figures only; it never judges them.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpcuda.h"

#define DEFAULT_N 200
#define DEFAULT_SIZE (1u << 20)

struct handles {
	CUipcMemHandle mem;
	CUipcEventHandle ev;
	int status; /* 0, or the exporter's -errno */
	char why[200];
};

static const struct tpcuda_api *api;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Prints the median and p90 of @t[0..@n). */
static void row(const char *what, double *t, int n)
{
	qsort(t, (size_t)n, sizeof(*t), cmp_double);
	printf("%-54s %10.2f %10.2f\n", what, t[n / 2], t[(n * 9) / 10]);
}

static int fail(CUresult r, const char *call)
{
	char why[256];

	fprintf(stderr, "bench_cuda_calls: %s\n", tpcuda_why(api, call, r, why, sizeof(why)));
	return 1;
}

#define CK(call)                                                                                   \
	do {                                                                                       \
		CUresult r_ = api->call;                                                           \
		if (r_ != CUDA_SUCCESS)                                                            \
			return fail(r_, #call);                                                    \
	} while (0)

static int context(CUcontext *ctx)
{
	char why[256];
	CUdevice dev;

	api = tpcuda_api(why, sizeof(why));
	if (!api || api->n_devices < 1) {
		printf("skipped: %s\n", api ? "no CUDA device" : why);
		return -1;
	}
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(ctx, dev));
	CK(cuCtxSetCurrent(*ctx));
	return 0;
}

/* The exporter: memory and a recorded interprocess event, handles to @fd, then waits for EOF. */
static int exporter(int wfd, int rfd, size_t size)
{
	struct handles h = { 0 };
	CUcontext ctx;
	CUdeviceptr p = 0;
	CUevent ev = NULL;
	CUresult r;
	char c;

	if (context(&ctx) != 0)
		return 1;
	r = api->cuMemAlloc(&p, size);
	if (r == CUDA_SUCCESS)
		r = api->cuMemsetD8Async(p, 0x5a, size, NULL);
	if (r == CUDA_SUCCESS)
		r = api->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
	if (r == CUDA_SUCCESS)
		r = api->cuEventRecord(ev, NULL);
	if (r == CUDA_SUCCESS)
		r = api->cuEventSynchronize(ev);
	if (r == CUDA_SUCCESS)
		r = api->cuIpcGetMemHandle(&h.mem, p);
	if (r == CUDA_SUCCESS)
		r = api->cuIpcGetEventHandle(&h.ev, ev);
	if (r != CUDA_SUCCESS) {
		h.status = -EIO;
		tpcuda_why(api, "exporter", r, h.why, sizeof(h.why));
	}
	if (write(wfd, &h, sizeof(h)) != (ssize_t)sizeof(h))
		return 1;
	while (read(rfd, &c, 1) > 0) /* the importer is done when it closes its end */
		;
	return 0;
}

struct run {
	int n;
	size_t size;
	double *t;
	CUcontext ctx;
	CUstream st;
	CUevent done;
	const struct handles *h;
};

static int poll_event(CUevent ev)
{
	CUresult r;

	while ((r = api->cuEventQuery(ev)) == CUDA_ERROR_NOT_READY)
		;
	return r == CUDA_SUCCESS ? 0 : fail(r, "cuEventQuery");
}

/* The daemon's side: mappings, imported event, copies out of the mapping. */
static int daemon_steps(struct run *x)
{
	CUdeviceptr m, local;
	CUevent iev;
	double t0;
	size_t sizes[2] = { 4096, x->size };

	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuIpcOpenMemHandle(&m, x->h->mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
		x->t[i] = now_us() - t0;
		CK(cuIpcCloseMemHandle(m));
	}
	row("cuIpcOpenMemHandle", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		CK(cuIpcOpenMemHandle(&m, x->h->mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
		t0 = now_us();
		CK(cuIpcCloseMemHandle(m));
		x->t[i] = now_us() - t0;
	}
	row("cuIpcCloseMemHandle", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuIpcOpenEventHandle(&iev, x->h->ev));
		CK(cuEventDestroy(iev));
		x->t[i] = now_us() - t0;
	}
	row("cuIpcOpenEventHandle + cuEventDestroy", x->t, x->n);
	CK(cuIpcOpenEventHandle(&iev, x->h->ev));
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		if (poll_event(iev) != 0)
			return 1;
		x->t[i] = now_us() - t0;
	}
	row("cuEventQuery, imported event that completed", x->t, x->n);
	CK(cuEventDestroy(iev));
	CK(cuIpcOpenMemHandle(&m, x->h->mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CK(cuMemAlloc(&local, x->size));
	for (int k = 0; k < 2; k++) {
		char what[80];

		for (int i = 0; i < x->n; i++) {
			t0 = now_us();
			CK(cuMemcpyDtoDAsync(local, m, sizes[k], x->st));
			CK(cuEventRecord(x->done, x->st));
			if (poll_event(x->done) != 0)
				return 1;
			x->t[i] = now_us() - t0;
		}
		snprintf(what, sizeof(what), "copy %zu B from the mapping + record + poll",
			 sizes[k]);
		row(what, x->t, x->n);
	}
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuEventRecord(x->done, x->st));
		if (poll_event(x->done) != 0)
			return 1;
		x->t[i] = now_us() - t0;
	}
	row("cuEventRecord on an idle stream + poll", x->t, x->n);
	CK(cuMemFree(local));
	CK(cuIpcCloseMemHandle(m));
	return 0;
}

/* The client library's export of a tensor (client/lib/cuda.c). */
static int client_steps(struct run *x)
{
	CUdeviceptr p;
	unsigned long long id;
	CUipcMemHandle mh;
	CUipcEventHandle eh;
	CUevent ev;
	CUcontext popped;
	double t0;

	CK(cuMemAlloc(&p, x->size));
	CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS));
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
		x->t[i] = now_us() - t0;
	}
	row("cuPointerGetAttribute(BUFFER_ID)", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuCtxPushCurrent(x->ctx));
		CK(cuCtxPopCurrent(&popped));
		x->t[i] = now_us() - t0;
	}
	row("cuCtxPushCurrent + cuCtxPopCurrent", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuEventRecord(ev, x->st));
		x->t[i] = now_us() - t0;
	}
	row("cuEventRecord of an interprocess event", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuIpcGetMemHandle(&mh, p));
		x->t[i] = now_us() - t0;
	}
	row("cuIpcGetMemHandle", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		CK(cuIpcGetEventHandle(&eh, ev));
		x->t[i] = now_us() - t0;
	}
	row("cuIpcGetEventHandle", x->t, x->n);
	CK(cuEventSynchronize(ev));
	CK(cuEventDestroy(ev));
	CK(cuMemFree(p));
	return 0;
}

/* The copy thread's polling steps, for scale. */
static void host_steps(struct run *x)
{
	struct timespec step = { 0, 20000 };
	double t0;

	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		sched_yield();
		x->t[i] = now_us() - t0;
	}
	row("sched_yield", x->t, x->n);
	for (int i = 0; i < x->n; i++) {
		t0 = now_us();
		nanosleep(&step, NULL);
		x->t[i] = now_us() - t0;
	}
	row("nanosleep(20 us)", x->t, x->n);
}

static int importer(int rfd, struct run *x)
{
	struct handles h;
	int r;

	if (read(rfd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
		printf("skipped: the exporter did not start\n");
		return 0;
	}
	if (h.status != 0) {
		printf("skipped: %s\n", h.why);
		return 0;
	}
	if (context(&x->ctx) != 0)
		return 0;
	x->h = &h;
	CK(cuStreamCreate(&x->st, CU_STREAM_NON_BLOCKING));
	CK(cuEventCreate(&x->done, CU_EVENT_DISABLE_TIMING));
	printf("%-54s %10s %10s\n", "step (us)", "median", "p90");
	r = daemon_steps(x);
	if (r == 0)
		r = client_steps(x);
	if (r == 0)
		host_steps(x);
	return r;
}

int main(int argc, char **argv)
{
	struct run x = { .n = DEFAULT_N, .size = DEFAULT_SIZE };
	int to_child[2], to_parent[2], opt, r, st;
	pid_t pid;

	while ((opt = getopt(argc, argv, "n:s:h")) != -1) {
		if (opt == 'n' && atoi(optarg) > 0)
			x.n = atoi(optarg);
		else if (opt == 's' && strtoull(optarg, NULL, 0) > 0)
			x.size = (size_t)strtoull(optarg, NULL, 0);
		else {
			printf("usage: bench_cuda_calls [-n TIMES] [-s BYTES]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	x.t = calloc((size_t)x.n, sizeof(*x.t));
	if (!x.t || pipe(to_child) < 0 || pipe(to_parent) < 0)
		return 1;
	pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		close(to_child[1]);
		close(to_parent[0]);
		_exit(exporter(to_parent[1], to_child[0], x.size));
	}
	close(to_child[0]);
	close(to_parent[1]);
	r = importer(to_parent[0], &x);
	close(to_child[1]); /* the exporter may go */
	waitpid(pid, &st, 0);
	free(x.t);
	return r;
}
