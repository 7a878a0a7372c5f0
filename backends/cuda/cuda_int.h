/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA layer's interface to the CUDA channels (backends/cuda_ipc/, backends/cuda_basic/,
 * backends/cuda_gdr/) and to its own files: a mapping of one client IPC handle (memory or
 * event) and the hooks that open and close it with the driver; with CUDA built in, the devices,
 * a copy or stripe thread's CUDA state and the steps of a copy (cuda.c). Not installed, and
 * not for the daemon, which goes through backends/tpb.h.
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
	uint8_t uuid[TPB_CUDA_UUID_BYTES]; /* the device's, if @has_uuid (set under open_lock) */
	bool has_uuid;
	uint64_t size;
	unsigned refs; /* table lock */
	unsigned holds; /* table lock: sessions caching it (tpb_cuda_hold()) */

	pthread_mutex_t open_lock; /* guards what follows */
	int state;		   /* 0 not opened yet, 1 open, -errno: opening failed (sticky) */
	unsigned users;		   /* copy jobs running on it (tpb_cuda_maps_busy()) */
	bool open_queued;	   /* atomic: tpb_cuda_map_open_bg() queued it */
	unsigned gen;		   /* the device's generation when opened (or failed) */
	char why[256];		   /* why opening failed */
	int dev;		   /* the daemon's ordinal of the device, once open */
	uint64_t ptr;		   /* memory: the mapping's CUdeviceptr */
	void *ev;		   /* event: the CUevent */
};

/*
 * tpb_cuda_map_open() - open @m with the driver if not done yet (thread safe, sticky on failure).
 * Return: 0, or -errno with the reason in @why.
 */
int tpb_cuda_map_open(struct tpb_cuda_map *m, char *why, size_t why_len);
/*
 * tpb_cuda_map_open_bg() - have the CUDA layer's worker thread run tpb_cuda_map_open() on @m
 * (a reference is held meanwhile), unless it is queued already: for callers on the event loop,
 * which poll the mapping's state instead of blocking in the driver.
 */
void tpb_cuda_map_open_bg(struct tpb_cuda_map *m);
/* Closes what tpb_cuda_map_open() opened (last reference gone). */
void tpb_cuda_map_close(struct tpb_cuda_map *m);
/* The last unref of a pinned shared buffer (tpb_buffer.unpin): hands @b to the CUDA layer's
 * worker thread, which unregisters the mapping (tpb_cuda_buffer_unpin_now()), unmaps and frees
 * it; does it on the caller's thread if that worker cannot start. Takes @b. */
void tpb_cuda_buffer_unpin(struct tpb_buffer *b);
/* 1 if the driver can be used here, else 0 with the reason in @why. */
int tpb_cuda_available(char *why, size_t why_len);

#if HAVE_CUDA
#include "tpcuda.h"

/* The driver's entry points (bound once, see tpcuda.h); call only where it loaded. */
static inline const struct tpcuda_api *api(void)
{
	return tpcuda_api(NULL, 0);
}

/*
 * tpb_cuda_dev_poison() - the driver call @call failed with a sticky error @r in the current
 * context: mark its device broken (the next tpb_cuda_dev_enter() resets it) and say so in
 * @why, naming the device and the cause. Borrows @call and @why.
 * Return: -EIO.
 */
int tpb_cuda_dev_poison(CUresult r, const char *call, char *why, size_t why_len);

/* Names the failed driver call @call in @why (borrowed). Return: its -errno, else -EIO. */
static inline int fail(CUresult r, const char *call, char *why, size_t wl)
{
	if (tpcuda_sticky(r))
		return tpb_cuda_dev_poison(r, call, why, wl);
	tpcuda_why(api(), call, r, why, wl);
	return tpcuda_errno(r) ? tpcuda_errno(r) : -EIO;
}

/*
 * tpb_cuda_dev_enter() - make device @dev's primary context current on this thread, retaining
 * it the first time any thread needs it; a device that hit a sticky error (tpb_cuda_dev_poison())
 * has its primary context reset first, which ends every mapping, stream and event made in it
 * (each carries the device's generation and is made again on next use). The reset waits for no
 * one: while a copy is inside the gate (tpb_cuda_gate_enter()), or when this thread is one, the
 * broken device answers -EIO and the next tpb_cuda_gate_enter() resets it. Borrows @why.
 * Return: 0, -EINVAL for an ordinal out of range, or the driver's -errno with the reason in @why.
 */
int tpb_cuda_dev_enter(int dev, char *why, size_t why_len);

/*
 * tpb_cuda_gate_enter() - a copy is about to use CUDA mappings, streams and events: first reset
 * the devices a sticky error broke, waiting for the copies inside to leave (a reset frees what
 * they use), then count this thread in until tpb_cuda_gate_exit(). Copy threads; not nested.
 */
void tpb_cuda_gate_enter(void);
void tpb_cuda_gate_exit(void);

#define DEVS_MAX 64

struct tpb_cuda_dev {
	CUcontext ctx; /* retained primary context, NULL until first use */
	uint64_t peer; /* bit per device with peer access enabled from this one */
	unsigned gen;  /* raised by each reset: what was made before is gone (atomic) */
	bool broken;   /* a sticky error: reset at the next tpb_cuda_dev_enter() (atomic) */
	char cause[200]; /* the call and error that broke it (the CUDA layer's lock) */
};

/* Every device the daemon has used, by ordinal (peer bits under the CUDA layer's lock). */
extern struct tpb_cuda_dev tpb_cuda_devs[DEVS_MAX];

/*
 * Per copy or stripe thread (tpb_scratch.cuda). A driver records an event only on a stream of
 * the event's own context, and one thread serves every device: so streams and events are kept
 * per device, each made in that device's context (tpb_cuda_event_make()). The pinned buffers
 * are portable (usable from every context) and freed in the context that made them.
 */
struct tpb_cuda_thread {
	CUstream stream[DEVS_MAX];
	CUevent done[DEVS_MAX];	   /* recorded behind a copy on that device, polled until done */
	CUevent half[DEVS_MAX][2]; /* cuda_ipc's double buffer halves, per device */
	void *pinned; /* cuda_ipc's double buffer, 2 * PINNED_HALF (cuda_ipc.c), portable */
	int pinned_dev; /* the device whose context allocated @pinned */
	void *reg; /* the thread's bounce buffer, registered (pinned) once */
	int reg_dev; /* the device whose context registered @reg */
	struct tpb_proc *procs[2]; /* the clients of the current copy: a wait for their events
				    * gives up when one exits (borrowed for the copy) */
	unsigned gen[DEVS_MAX]; /* the device's generation the handles above were made in */
};

/* A CUDA side of a transfer, opened: device, pointer, event to wait for. */
struct tpb_cuda_side {
	bool cuda;
	int dev;
	CUdeviceptr ptr;
	CUevent wait;
};

/*
 * tpb_cuda_thread_state() - the calling thread's CUDA state, kept in its scratch @s (borrowed)
 * and made on first use.
 * Return: borrowed pointer, valid until tpb_cuda_scratch_done(@s); NULL without memory.
 */
struct tpb_cuda_thread *tpb_cuda_thread_state(struct tpb_scratch *s);

/*
 * tpb_cuda_side_open() - describe @m at offset @off as a side of a copy in @sd (the caller's):
 * for CUDA memory, its device, device pointer and event, the mapping and event opened with the
 * driver if no copy has yet; else @sd->cuda is false. Borrows @m and @why.
 * Return: 0, or -errno with the reason in @why.
 */
int tpb_cuda_side_open(const struct tpb_mem *m, uint64_t off, struct tpb_cuda_side *sd, char *why,
		       size_t why_len);

/*
 * tpb_cuda_copy_begin() - wait on the host until both sides' client events completed (giving up
 * when a client of the copy, t->procs, exits), then enter the context of the device that runs a
 * copy from @a to @b. The thread's streams never wait for a client's event themselves (one
 * recorded by a process that died first never completes, and the driver's IPC close waits for
 * every stream of the context). Borrows @t, @a, @b and @why.
 * @ret: the stream to queue the copy on (@t's), written on success.
 * Return: 0, -ESRCH (a client exited first), or the driver's -errno with the reason in @why.
 */
int tpb_cuda_copy_begin(struct tpb_cuda_thread *t, const struct tpb_cuda_side *a,
			const struct tpb_cuda_side *b, CUstream *ret, char *why, size_t why_len);

/*
 * tpb_cuda_stream_wait() - record t->done[@dev] behind everything queued on @st (on device @dev) and
 * wait for it: the thread's own copies, which always end. Borrows @t and @why.
 * Return: 0, or the driver's -errno with the reason in @why.
 */
int tpb_cuda_stream_wait(struct tpb_cuda_thread *t, int dev, CUstream st, char *why,
			 size_t why_len);

/*
 * tpb_cuda_event_make() - unless made already, enter device @dev's context (it stays current)
 * and make *@ev there, an event without timing. Borrows @ev and @why.
 * Return: 0, or the driver's -errno with the reason in @why.
 */
int tpb_cuda_event_make(int dev, CUevent *ev, char *why, size_t why_len);

/* The device whose context and stream run a copy from @a to @b (borrowed): the destination's
 * if CUDA. */
int tpb_cuda_copy_dev(const struct tpb_cuda_side *a, const struct tpb_cuda_side *b);

/*
 * tpb_cuda_event_wait() - wait until @ev, recorded on one of @t's own streams on @dev, completes;
 * not cut short when a client exits (the copy may still be writing the other client's memory).
 * Borrows @t and @why.
 * Return: 0, or the driver's -errno with the reason in @why.
 */
int tpb_cuda_event_wait(struct tpb_cuda_thread *t, int dev, CUevent ev, char *why,
			size_t why_len);

/*
 * tpb_cuda_buffer_pin() - page-lock client shared buffer @b with the driver (portable, so every
 * device's copies use it) the first time a copy on device @dev (its context current) moves its
 * bytes, so that the GPU reads and writes it by DMA instead of through the driver's staging;
 * again after a reset of the device that pinned it. Only one thread tries at a time; a refusal
 * (no memory to lock) is logged once per buffer and the copies go on unpinned. Borrows @b.
 */
void tpb_cuda_buffer_pin(struct tpb_buffer *b, int dev);

/* Unregisters @b's mapping if its pinning is still alive, then unmaps and frees @b. */
void tpb_cuda_buffer_unpin_now(struct tpb_buffer *b);

/* Enables peer access from device @dev (its context current) to @peer, once, where the
 * hardware allows it. */
void tpb_cuda_peer_enable(int dev, int peer);
#endif

/* The probe of cuda_ipc and cuda_basic: a CUDA driver is there (tpb_cuda_available()).
 * Borrows @cfg and @why. Return: 1 viable, else 0 with the reason in @why. */
int tpb_cuda_probe(const struct tpb_config *cfg, char *why, size_t why_len);

#endif
