/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpcuda: the CUDA driver API, resolved from libcuda.so.1 at run time. Nothing in tpipd links
 * the driver: a daemon or a client on a machine without a GPU driver loads, starts and serves
 * CPU memory, and every CUDA path reports why it is not viable instead. The entry points are
 * looked up under the ABI names cuda.h maps them to (cuMemAlloc -> "cuMemAlloc_v2"), exactly as
 * a program linked against the driver would bind them. Built only when cuda.h was found
 * (meson feature `cuda`); the header is shared by the client library and the daemon.
 */
#ifndef TPCUDA_H
#define TPCUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

/* Every driver entry point tpipd uses, client library, daemon, tests and benchmarks. */
#define TPCUDA_FUNCS(X)                                                                            \
	X(cuInit)                                                                                  \
	X(cuGetErrorString)                                                                        \
	X(cuGetErrorName)                                                                          \
	X(cuDriverGetVersion)                                                                      \
	X(cuDeviceGetCount)                                                                        \
	X(cuDeviceGet)                                                                             \
	X(cuDeviceGetName)                                                                         \
	X(cuDeviceGetPCIBusId)                                                                     \
	X(cuDeviceGetByPCIBusId)                                                                   \
	X(cuDeviceGetAttribute)                                                                    \
	X(cuDeviceCanAccessPeer)                                                                   \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuDevicePrimaryCtxRelease)                                                               \
	X(cuDevicePrimaryCtxReset)                                                                 \
	X(cuCtxSetCurrent)                                                                         \
	X(cuCtxGetCurrent)                                                                         \
	X(cuCtxPushCurrent)                                                                        \
	X(cuCtxPopCurrent)                                                                         \
	X(cuCtxEnablePeerAccess)                                                                   \
	X(cuPointerGetAttribute)                                                                   \
	X(cuMemGetAddressRange)                                                                    \
	X(cuIpcGetMemHandle)                                                                       \
	X(cuIpcOpenMemHandle)                                                                      \
	X(cuIpcCloseMemHandle)                                                                     \
	X(cuIpcGetEventHandle)                                                                     \
	X(cuIpcOpenEventHandle)                                                                    \
	X(cuEventCreate)                                                                           \
	X(cuEventRecord)                                                                           \
	X(cuEventSynchronize)                                                                      \
	X(cuEventQuery)                                                                            \
	X(cuEventDestroy)                                                                          \
	X(cuStreamCreate)                                                                          \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamWaitEvent)                                                                       \
	X(cuStreamSynchronize)                                                                     \
	X(cuMemcpyAsync)                                                                           \
	X(cuMemcpyPeerAsync)                                                                       \
	X(cuMemcpyHtoDAsync)                                                                       \
	X(cuMemcpyDtoHAsync)                                                                       \
	X(cuMemcpyDtoDAsync)                                                                       \
	X(cuMemHostRegister)                                                                       \
	X(cuMemHostUnregister)                                                                     \
	X(cuMemAllocHost)                                                                          \
	X(cuMemFreeHost)                                                                           \
	X(cuMemHostAlloc)                                                                          \
	X(cuMemAlloc)                                                                              \
	X(cuMemFree)                                                                               \
	X(cuMemsetD8Async)                                                                         \
	X(cuMemcpyDtoH)                                                                            \
	X(cuMemcpyHtoD)                                                                            \
	X(cuMemcpyDtoD)                                                                            \
	X(cuLaunchHostFunc)

/* Entry points introduced late enough that a driver may lack them: NULL when absent. */
#define TPCUDA_OPTIONAL_FUNCS(X)                                                                   \
	X(cuMemGetHandleForAddressRange) X(cuDeviceGetUuid) X(cuFlushGPUDirectRDMAWrites)

#define TPCUDA_MEMBER(f) __typeof__(f) *f;
struct tpcuda_api {
	int driver_version; /* cuDriverGetVersion(), e.g. 12040 */
	int n_devices;	    /* cuDeviceGetCount() */
	TPCUDA_FUNCS(TPCUDA_MEMBER)
	TPCUDA_OPTIONAL_FUNCS(TPCUDA_MEMBER)
};
#undef TPCUDA_MEMBER

#define TPCUDA_IPC_HANDLE_BYTES 64 /* CU_IPC_HANDLE_SIZE */
#define TPCUDA_BUS_ID_MAX 32	   /* "dddd:bb:dd.f" plus room */

/*
 * tpcuda_api() - the driver API: on the first call, load libcuda.so.1 (or $TPIPD_CUDA_LIBRARY),
 * resolve every entry point, run cuInit(0) and count the devices; later calls return the same
 * result. Creates no CUDA context. Thread safe.
 * @why: filled with the reason when NULL is returned ("no CUDA driver: libcuda.so.1: cannot
 * open shared object file", "cuInit: CUDA_ERROR_NO_DEVICE ...").
 * Return: borrowed pointer valid for the life of the process, or NULL.
 */
const struct tpcuda_api *tpcuda_api(char *why, size_t why_len);

/*
 * tpcuda_why() - describe a failed driver call: "<call>: <NAME> (<description>)" into @buf.
 * @api may be NULL (the code alone is printed). Return: @buf.
 */
char *tpcuda_why(const struct tpcuda_api *api, const char *call, CUresult r, char *buf,
		 size_t len);

/*
 * tpcuda_sticky() - whether @r is one of the errors that leave the context unusable: every later
 * call in it fails the same way until the context is destroyed or reset (an illegal address,
 * a kernel that faulted, an uncorrectable ECC error).
 */
int tpcuda_sticky(CUresult r);

/* The -errno for a driver result: -ENOMEM, -EINVAL, -ENODEV, -EOPNOTSUPP, -EIO, ... (0 for OK). */
int tpcuda_errno(CUresult r);

#endif
