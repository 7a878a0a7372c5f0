/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The internal interface of _tpipd, the CPython extension over libtpclient: the object types,
 * the error mapping (module.c), the wait that turns one asynchronous libtpclient call into a
 * blocking Python call with the GIL released (pipe.c), and the tracking that lets
 * Context.close() close every pipe, listener and group first. Tensor headers, dtypes, futures
 * and numpy/torch live in the pure-Python package (tpipd/), not here.
 */
#ifndef TPY_H
#define TPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <tpclient.h>

#define TPY_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Something of a context that Context.close() must close first (a pipe, listener or group). */
struct tpy_child {
	struct tpy_child *next, *prev;
	void (*close)(struct tpy_child *c);
};

typedef struct {
	PyObject_HEAD
	struct tp_context *ctx; /* NULL once freed */
	bool closed;		/* close() ran: no new operation; free once no buffer is left */
	Py_ssize_t n_buffers;	/* SharedBuffer objects alive */
	struct tpy_child children;
	PyObject *weakrefs; /* the package's CUDA release tracking keys on the context */
} tpy_context;

/* One asynchronous call waited for by a Python thread (lives on that thread's stack). */
struct tpy_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int status;
	char msg[1100];
	struct tp_pipe *pipe;	      /* accept result */
	struct tp_descriptor *desc; /* descriptor result */
};

extern PyTypeObject tpy_context_type, tpy_listener_type, tpy_pipe_type, tpy_descriptor_type;
extern PyTypeObject tpy_buffer_type, tpy_group_type, tpy_collreq_type, tpy_chan_type;
extern PyTypeObject tpy_set_type, tpy_wq_type, tpy_dlview_type, tpy_block_type;

/* module.c */
/*
 * tpy_module_raise() - set the exception for -errno @err with @msg (NULL: tp_last_error()).
 * Return: NULL, for `return tpy_module_raise(...)`.
 */
PyObject *tpy_module_raise(int err, const char *msg);
/* Raise tpipd.Closed for an object used after close(). Return: NULL. */
PyObject *tpy_module_closed(const char *what);
/* Link @c into @ctx's children (borrows both; @c unlinks itself with tpy_module_unlink()). */
void tpy_module_link(tpy_context *ctx, struct tpy_child *c);
void tpy_module_unlink(struct tpy_child *c);
int tpy_module_add_types(PyObject *m);

/* pipe.c */
void tpy_pipe_wait_init(struct tpy_wait *w);
void tpy_pipe_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg);
/*
 * tpy_pipe_wait() - wait, without the GIL, for the callback of the operation @op of @ctx to
 * fire into @w. After @timeout_ms (< 0: never) or on a pending signal it cancels @op and still
 * waits for the callback, so the operation's memory is free when it returns.
 * Return: the operation's status; -ETIMEDOUT when cancelled by the timeout; -EINTR when a
 * signal handler raised (the exception is set).
 */
int tpy_pipe_wait(tpy_context *ctx, struct tpy_wait *w, uint64_t op, int timeout_ms);
void tpy_pipe_wait_signal(struct tpy_wait *w, int status, const char *errmsg);
void tpy_pipe_wait_done(struct tpy_wait *w);
/* A timeout in seconds (None: -1) as milliseconds. Return: 0, or -1 with an exception set. */
int tpy_pipe_timeout(PyObject *o, int *ret);
/* A new Pipe of @ctx; takes @p (closed on failure). */
PyObject *tpy_pipe_wrap(tpy_context *ctx, struct tp_pipe *p);
/* Context.connect(): borrows @self, returns a new reference. */
PyObject *tpy_pipe_connect(tpy_context *self, PyObject *args, PyObject *kw);
int tpy_pipe_add_types(PyObject *m);
/*
 * tpy_pipe_message_new() - the tp_message of write arguments (@meta, @pay a sequence of
 * bytes-like objects, @ten of (buffer or CUDA tuple, metadata) pairs) into @ret, borrowing them.
 * Return: the parts @ret points into, free with tpy_pipe_message_free() after the write; NULL
 * with an exception set.
 */
void *tpy_pipe_message_new(const Py_buffer *meta, PyObject *pay, PyObject *ten,
			   struct tp_message *ret);
void tpy_pipe_message_free(void *parts);
/* Pipe @o of @ctx joins set @s (tp_set_add), which owns its library pipe from then on; the
 * object stays for reading what recv_any() returns. Return: 0, or -1 with an exception set. */
int tpy_pipe_to_set(PyObject *o, tpy_context *ctx, struct tp_pipe_set *s);
/* Pipe @o left its set: @ended (reported ended: the object owns its pipe again) or the set was
 * freed (the pipe is closed: the object is closed). */
void tpy_pipe_from_set(PyObject *o, bool ended);
/* A new Descriptor of Pipe @o for @d (takes @d). */
PyObject *tpy_pipe_descriptor(PyObject *o, struct tp_descriptor *d);
/*
 * tpy_descriptor_new() - a new Descriptor of @owner (a reference kept) for @d, which it takes
 * (also on failure): @drop(owner, d) frees it unread (NULL: tp_descriptor_free()).
 */
PyObject *tpy_descriptor_new(PyObject *owner, struct tp_descriptor *d,
			     void (*drop)(PyObject *owner, struct tp_descriptor *d));
/* The library descriptor of Descriptor @o of @owner; with @take taken from it (the object is
 * read). Return: owned with @take, else borrowed; NULL with ValueError set (another owner's,
 * or read already). */
struct tp_descriptor *tpy_descriptor_of(PyObject *o, PyObject *owner, bool take);
/*
 * tpy_pipe_slots_new() - the allocation for @d from read destinations (@pay, @ten: sequences
 * of writable buffers or CUDA tuples, one per payload and tensor, each large enough) into
 * @ret, borrowing them. Return: the parts @ret points into, free with tpy_pipe_message_free()
 * after the read; NULL with an exception set.
 */
void *tpy_pipe_slots_new(const struct tp_descriptor *d, PyObject *pay, PyObject *ten,
			 struct tp_allocation *ret);

/* listener.c */
/* Context.listen(): borrows @self, returns a new Listener keeping @self. */
PyObject *tpy_listener_new(tpy_context *self, PyObject *args, PyObject *kw);
int tpy_listener_add_types(PyObject *m);

/* buffer.c */
/*
 * tpy_buffer_get() - the buffer of @obj (C-contiguous; writable if @writable).
 * Return: 0, or -1 with a Python exception set naming @what.
 */
int tpy_buffer_get(PyObject *obj, Py_buffer *view, bool writable, const char *what);
/*
 * tpy_buffer_tensor() - fill @t (a tensor to write) or @s (a read slot), whichever is not NULL,
 * from @obj: a buffer-protocol object (CPU) or a tuple (ptr, nbytes, device, stream) for CUDA
 * memory. A CPU buffer is acquired into @view (release it with PyBuffer_Release when view->obj
 * is set). Return: 0, or -1 with an exception set.
 */
int tpy_buffer_tensor(PyObject *obj, Py_buffer *view, bool writable, struct tp_tensor *t,
		      struct tp_slot *s, size_t *ret_len);
/* Context.alloc_buffer(size): a new SharedBuffer keeping @self. */
PyObject *tpy_buffer_alloc(tpy_context *self, PyObject *args);
/* A SharedBuffer went away: free @self's context if it is closed and this was its last one. */
void tpy_buffer_released(tpy_context *self);
int tpy_buffer_add_types(PyObject *m);

/* group.c */
#define TPY_REMOTE_PEERS_MAX 32 /* as libtpclient's */

/* A remote access from Python (a group's remote=, a connect's expect_peer=). */
struct tpy_remote {
	enum tp_remote_access mode;
	const char *peers[TPY_REMOTE_PEERS_MAX]; /* TP_REMOTE_PEERS: into @seq's items */
	size_t n;
	PyObject *seq; /* owned, or NULL */
};

/*
 * tpy_remote_parse() - @v, the argument named @arg, as a remote access: None (TP_REMOTE_NONE),
 * "none" (with @none_ok), "any-peer", or a sequence of 1..32 str peer identities
 * (TP_REMOTE_PEERS). Borrows @v and @arg. Return: 0 with @ret (release with tpy_remote_done()),
 * or -1 with a ValueError or TypeError raised (nothing to release).
 */
int tpy_remote_parse(PyObject *v, const char *arg, bool none_ok, struct tpy_remote *ret);
void tpy_remote_done(struct tpy_remote *r);

/* Context.join_group(): a new Group keeping @self. */
PyObject *tpy_group_join(tpy_context *self, PyObject *args, PyObject *kw);
int tpy_group_add_types(PyObject *m);

/* gate.c */
/* The longest one blocking library call runs without checking signals or a release. */
#define TPY_SLICE_MS 200

/* Threads inside the blocking calls of one object (fields changed with the GIL held). */
struct tpy_gate {
	int inflight;
	bool closing; /* tpy_gate_drain() began: calls end at their slice, no new one starts */
	pthread_mutex_t lock;
	pthread_cond_t idle; /* signalled when inflight drops to 0 */
};

void tpy_gate_init(struct tpy_gate *g);
void tpy_gate_done(struct tpy_gate *g);
/*
 * tpy_gate_enter() - enter a call on an object whose library handle is @handle (NULL once
 * released) in context @ctx: refused once released, closing, or the context closed.
 * @what: the Python type, for the Closed error. Return: 0 (leave with tpy_gate_leave()), or
 * -1 with Closed raised.
 */
int tpy_gate_enter(struct tpy_gate *g, const void *handle, const tpy_context *ctx,
		   const char *what);
/* Leaves a call entered with tpy_gate_enter() (or g->inflight++ after checking g->closing). */
void tpy_gate_leave(struct tpy_gate *g);
/* Marks @g closing and waits, without the GIL, until no thread is inside (within a slice). */
void tpy_gate_drain(struct tpy_gate *g);
int64_t tpy_gate_now_ms(void);
/* The next slice (ms) of a wait that ends at @until (< 0: never). */
int tpy_gate_slice(int64_t until);
/*
 * tpy_gate_again() - whether a sliced wait goes on after a slice that ended with @r: only a
 * slice's own -ETIMEDOUT, before @until, with no signal pending and @g not closing.
 * Return: 1 go on; 0 done with @r; -1 a signal handler raised (exception set).
 */
int tpy_gate_again(struct tpy_gate *g, int r, int slice, int64_t until);

/*
 * A library handle that one Python object owns (a channel's, a work queue's): its calls enter
 * through the gate, and releasing it (release(), Context.close(), garbage collection) waits for
 * them to leave, then frees the handle once. Embedded in the object (chan.c, wq.c).
 */
struct tpy_handle {
	struct tpy_child child; /* in the context's children: Context.close() releases it */
	tpy_context *ctx;	/* a reference */
	void *lib;		/* the library's handle; NULL once released */
	int (*release)(void *lib);
	const char *what;	/* the Python type, for the Closed error */
	struct tpy_gate gate;	/* closing: the release began */
};

/*
 * tpy_handle_init() - set up @h over @lib, freed by @release, in @ctx: takes @lib, takes a
 * reference to @ctx and links @h to it (Context.close() releases it).
 */
void tpy_handle_init(struct tpy_handle *h, tpy_context *ctx, void *lib, int (*release)(void *),
		     const char *what);
/* Enters a call (tpy_gate_enter()): refused after a release. Return: 0 (leave with
 * tpy_gate_leave(&h->gate)), or -1 with Closed raised. */
int tpy_handle_enter(struct tpy_handle *h);
/*
 * tpy_handle_release() - unlink @h and free its library handle once no other thread is inside a
 * call (they leave within a slice). Called with the GIL held; releases it while waiting.
 * Idempotent. Return: the release function's result (0 when released already).
 */
int tpy_handle_release(struct tpy_handle *h);
/* Whether @h is released or being released. */
bool tpy_handle_released(const struct tpy_handle *h);
/* Releases @h and drops its context (the object's dealloc: no thread is inside a call). */
void tpy_handle_done(struct tpy_handle *h);

/* chan.c */
/* Context.open_channel(): a new Channel keeping @self (released by Context.close()). */
PyObject *tpy_chan_open(tpy_context *self, PyObject *args, PyObject *kw);
/* Context.unlink_channel(name, owner_uid=-1): tp_chan_unlink(). */
PyObject *tpy_chan_unlink(tpy_context *self, PyObject *args);
/* Adds Channel and the Drained exception (after the error types: it derives PipeClosed). */
int tpy_chan_add_types(PyObject *m);

/* fan.c */
int tpy_set_add_types(PyObject *m);

/* wq.c */
/* Context.open_queue(): a new WorkQueue keeping @self (released by Context.close()). */
PyObject *tpy_wq_open(tpy_context *self, PyObject *args, PyObject *kw);
/* Adds WorkQueue and the NothingOutstanding exception (after the error types). */
int tpy_wq_add_types(PyObject *m);

/* dlpack.c */
/*
 * tpy_dlpack_get() - a C-contiguous CPU buffer over @obj's __dlpack__() capsule (or over @obj,
 * a DLPack capsule itself, borrowed and never consumed) into @view (view->obj holds the
 * capsule: PyBuffer_Release() drops it; the producer's deleter runs with the capsule).
 * Return: 0, or -1 with an exception set naming @what (InvalidArgument: not contiguous).
 */
int tpy_dlpack_get(PyObject *obj, Py_buffer *view, const char *what);
/*
 * tpy_dlpack_cuda() - _tpipd.dlpack_cuda(obj): @obj's __dlpack__(stream=1) capsule of CUDA
 * device memory as (capsule, (ptr, nbytes, device, stream), (dl_code, bits), shape). The
 * capsule keeps the memory: hold it until libtpclient is done with the range (the stream is
 * 1, the legacy default stream, on which the producer ordered its pending work).
 * Return: a new tuple, or NULL with an exception set (InvalidArgument: not CUDA memory, not
 * contiguous, an unsupported dtype).
 */
PyObject *tpy_dlpack_cuda(PyObject *mod, PyObject *obj);
/* _tpipd.dlpack_view(buffer, offset, dtype_code, shape): a new DLView keeping @buffer. */
PyObject *tpy_dlpack_view(PyObject *mod, PyObject *args);
/* _tpipd.dlpack_cuda_view(ptr, device, dtype_code, shape, owner=None): a new DLView of CUDA
 * memory at @ptr on @device, keeping @owner (whatever keeps that memory allocated). */
PyObject *tpy_dlpack_cuda_view(PyObject *mod, PyObject *args);
/* A new Block owning @p (malloc'd, @len bytes; takes @p, also on failure). */
PyObject *tpy_dlpack_block(void *p, size_t len);
int tpy_dlpack_add_types(PyObject *m);

#endif
