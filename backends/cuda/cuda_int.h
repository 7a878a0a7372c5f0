/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals shared by the CUDA channel files: a mapping of one client IPC handle (memory or
 * event) and the hooks that open and close it with the driver.
 */
#ifndef TPB_CUDA_INT_H
#define TPB_CUDA_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "tpconfig.h"
#include "../tpb.h"
#include "tpu.h"

#define CUDA_BUS_ID_LEN 32

struct tpb_cuda_map {
	struct tpu_list node; /* in the daemon-wide table (table lock) */
	uint8_t handle[TPB_CUDA_HANDLE_BYTES];
	bool event;
	char bus_id[CUDA_BUS_ID_LEN];
	uint64_t size;
	unsigned refs; /* table lock */

	pthread_mutex_t open_lock; /* guards what follows */
	int state;		   /* 0 not opened yet, 1 open, -errno: opening failed (sticky) */
	char why[160];		   /* why opening failed */
	int dev;		   /* the daemon's ordinal of the device, once open */
	uint64_t ptr;		   /* memory: the mapping's CUdeviceptr */
	void *ev;		   /* event: the CUevent */
};

/*
 * tpb_cuda_map_open() - open @m with the driver if not done yet (thread safe, sticky on failure).
 * Return: 0, or -errno with the reason in @why.
 */
int tpb_cuda_map_open(struct tpb_cuda_map *m, char *why, size_t why_len);
/* Closes what tpb_cuda_map_open() opened (last reference gone). */
void tpb_cuda_map_close(struct tpb_cuda_map *m);
/* 1 if the driver can be used here, else 0 with the reason in @why. */
int tpb_cuda_available(char *why, size_t why_len);

#if HAVE_CUDA
#include "tpcuda.h"

/* The driver's entry points (bound once, see tpcuda.h); call only where it loaded. */
static inline const struct tpcuda_api *api(void)
{
	return tpcuda_api(NULL, 0);
}

/* Names the failed driver call @call in @why (borrowed). Return: its -errno, else -EIO. */
static inline int fail(CUresult r, const char *call, char *why, size_t wl)
{
	tpcuda_why(api(), call, r, why, wl);
	return tpcuda_errno(r) ? tpcuda_errno(r) : -EIO;
}

/*
 * tpb_cuda_dev_enter() - make device @dev's primary context current on this thread, retaining
 * it the first time any thread needs it. Borrows @why.
 * Return: 0, -EINVAL for an ordinal out of range, or the driver's -errno with the reason in @why.
 */
int tpb_cuda_dev_enter(int dev, char *why, size_t why_len);
#endif

#endif
