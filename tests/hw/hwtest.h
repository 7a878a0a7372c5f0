/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the hw suite (tests/hw): CUDA tensors through a real tpipd. Deciding whether the
 * suite can run at all (the driver is probed in a child process, so that the test process and
 * every client it forks later start without CUDA state: CUDA does not survive fork), a client's
 * CUDA context (the device's primary context, as the runtime API uses), device memory filled and
 * checked with the harness's byte patterns, and a two-process transfer driven by a table of
 * cases, each one tensor between CPU memory (shared buffer or private) or CUDA memory on either
 * side, optionally inside a larger allocation whose surrounding bytes must stay untouched.
 * Everything CUDA here runs in forked children; failures are printed and returned, never
 * asserted. The driver is reached through tpcuda_api() only: nothing links libcuda.
 */
#ifndef TPT_HWTEST_H
#define TPT_HWTEST_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "itest.h"
#include "tpcuda.h"

#define HWT_EXIT_SKIP 77 /* meson's exit code for a skipped test */
#define HWT_T_MS TPT_SCALED_MS(60000)

/*
 * hwt_main() - run @s (tpt_run_suite()) if CUDA works here with at least @min_devices devices.
 * The driver is probed in a child process; this process never touches CUDA. Otherwise prints
 * "SKIP: <reason>" (e.g. "SKIP: no CUDA driver: libcuda.so.1: cannot open shared object file",
 * "SKIP: needs 2 CUDA devices, found 1") and returns 77, meson's skip code; with
 * $TPT_HW_REQUIRE=1 in the environment a missing or unusable driver prints "FAIL: ..." and
 * returns 1 instead, so that a run on a GPU machine cannot pass by skipping; too few devices
 * (a suite that needs two GPUs on a one-GPU machine) still skips.
 * Return: the exit status for main().
 */
int hwt_main(Suite *s, int min_devices);

/*
 * hwt_probe() - in a child process: load the driver and count the devices.
 * @why: the reason when the driver is unusable.
 * Return: the number of devices (> 0), or 0 with @why filled.
 */
int hwt_probe(char *why, size_t why_len);

/* A client's CUDA state: the driver and the primary context of one device, current here. */
struct hwt_cuda {
	const struct tpcuda_api *api;
	int ordinal;
	CUdevice dev;
	CUcontext ctx;
};

/*
 * hwt_cuda_open() - retain the primary context of device @ordinal and make it current on the
 * calling thread (call it in every thread that uses CUDA). Only in a forked child.
 * Return: 0 or -errno (printed).
 */
int hwt_cuda_open(int ordinal, struct hwt_cuda *ret);
/* Releases the primary context. Accepts a zeroed @c. */
void hwt_cuda_close(struct hwt_cuda *c);

/* Prints "<file>:<line>: <expr>: <NAME> (<description>)". */
void hwt_cu_log(const struct hwt_cuda *c, CUresult r, const char *expr, const char *file,
		int line);

/*
 * HWT_CU() - call the driver entry point @call (e.g. cuMemAlloc(&p, n)) through @c's API; on
 * failure print it and return @ret from the enclosing function.
 */
#define HWT_CU(c, call, ret)                                                                       \
	do {                                                                                       \
		CUresult hwt_r_ = (c)->api->call;                                                  \
		if (hwt_r_ != CUDA_SUCCESS) {                                                      \
			hwt_cu_log((c), hwt_r_, #call, __FILE__, __LINE__);                        \
			return (ret);                                                              \
		}                                                                                  \
	} while (0)

/* Device pointer <-> the void * of tp_tensor.data / tp_slot.data. */
static inline void *hwt_ptr(CUdeviceptr p)
{
	return (void *)(uintptr_t)p;
}

/*
 * hwt_dev_put() - copy @len bytes of @host to device @p: on @stream (cuMemcpyHtoDAsync, @host
 * must stay valid until the stream passed the copy), or with @stream NULL, cuMemcpyHtoD on the
 * legacy default stream. Return: 0 or -errno (printed).
 */
int hwt_dev_put(const struct hwt_cuda *c, CUdeviceptr p, const void *host, size_t len,
		CUstream stream);
/* Copies @len bytes from device @p to @host (cuMemcpyDtoH, synchronous). Return: 0 or -errno. */
int hwt_dev_get(const struct hwt_cuda *c, CUdeviceptr p, void *host, size_t len);
/* Sets @len bytes at @p to @value and waits for it (legacy stream). Return: 0 or -errno. */
int hwt_dev_set(const struct hwt_cuda *c, CUdeviceptr p, uint8_t value, size_t len);
/*
 * hwt_dev_alloc_fill() - cuMemAlloc @len bytes and fill them with tpt_fill(@seed)'s pattern
 * (synchronous). @ret: the allocation, for cuMemFree. Return: 0 or -errno (printed).
 */
int hwt_dev_alloc_fill(const struct hwt_cuda *c, size_t len, uint64_t seed, CUdeviceptr *ret);

/*
 * hwt_dev_expect() - read @len bytes at device @p back and compare them with @want.
 * @what: names the range in the message printed on a mismatch.
 * Return: 0; 1 on a mismatch (the first differing offset is printed); -errno.
 */
int hwt_dev_expect(const struct hwt_cuda *c, CUdeviceptr p, const void *want, size_t len,
		   const char *what);
/* As hwt_dev_expect(), against @len bytes of value @value. */
int hwt_dev_expect_byte(const struct hwt_cuda *c, CUdeviceptr p, uint8_t value, size_t len,
			const char *what);

/* Compares @len bytes; on a difference prints @what and the first offset. Return: true if equal. */
bool hwt_same(const void *got, const void *want, size_t len, const char *what);

/* ---- table-driven transfers ------------------------------------------------------------- */

/* Where one side's bytes live. */
enum hwt_mem {
	HWT_CPU_SHM,	 /* tp_buffer_alloc() */
	HWT_CPU_PRIVATE, /* malloc() */
	HWT_CUDA,	 /* cuMemAlloc() on @device */
};

struct hwt_side {
	enum hwt_mem mem;
	int device;	   /* CUDA ordinal (HWT_CUDA) */
	bool stream;	   /* CUDA: fill and pass a stream of our own; false: the legacy stream */
	size_t pad_before; /* bytes of the allocation before the tensor */
	size_t pad_after;  /* and after it */
};

/* One message: one tensor of @len bytes from the writer's side to the reader's. */
struct hwt_case {
	size_t len;
	struct hwt_side w, r;
	bool has_target;	 /* the writer's wish, which the reader's descriptor must show */
	struct tp_device target;
};

const char *hwt_mem_name(enum hwt_mem m);
/* "cuda:0 (stream) at +1048699, 1048453 after" style description of a side. Return: @buf. */
const char *hwt_side_name(const struct hwt_side *s, char *buf, size_t len);

struct hwt_xfer {
	const struct tpt_daemon *d;
	const char *name;	      /* listener name */
	const struct hwt_case *cases; /* one message each, in this order, on one pipe */
	size_t n_cases;
	unsigned seed;		      /* distinguishes the patterns of runs */
	/* Across daemons: the writer is a client of @writer_d and connects to @address
	 * ("tpip://HOST:PORT/NAME" of @name on @d). NULL: the writer is on @d too. */
	const struct tpt_daemon *writer_d;
	const char *address;
};

/*
 * hwt_xfer_run() - fork a reader (listens on @x->name) and a writer (connects); the writer
 * sends one message per case, a tensor in the case's writer memory filled with a pattern and
 * the bytes around it in the allocation filled with another; the reader checks each
 * descriptor (length, metadata, the writer's device, target), reads into its memory of the
 * case (pre-filled with a third pattern, the tensor's range with its complement) and checks
 * that exactly the tensor's range changed and holds the writer's bytes. Each process opens
 * CUDA only if one of its sides needs it. Called from the test process (which holds no CUDA
 * state). Return: true if both children succeeded (else they printed why).
 */
bool hwt_xfer_run(const struct hwt_xfer *x);

/* ---- tpipctl -------------------------------------------------------------------------------- */

/*
 * hwt_ctl() - run $TPIPCTL_BIN --socket @d->socket [--json] @cmd and return its stdout if it
 * exited 0. Return: owned string (free()), or NULL (printed why; also when TPIPCTL_BIN is unset).
 */
char *hwt_ctl(const struct tpt_daemon *d, const char *cmd, bool json);

#endif
