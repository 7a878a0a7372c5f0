/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd pipes: the Pipe and Descriptor types, and the wait that makes one
 * asynchronous libtpclient call a blocking Python call. Every call is started with the GIL
 * held (libtpclient's start calls return at once) and waited for without it, on a condition
 * the library's callback signals; closing a pipe or listener from another thread therefore
 * never frees what a waiting thread still uses: the library completes the pending operation
 * with -ECANCELED and the waiter wakes. Message framing of tensors (dtype, shape) is the
 * Python package's (tpipd/_tensor.py); this file moves bytes.
 */
#include <errno.h>
#include <time.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	tpy_context *ctx;
	struct tp_pipe *p;
	struct tpy_child descs; /* Descriptor objects not yet read: freed before the pipe */
	bool in_set;		/* a pipe set (fan.c) owns p: close() forgets it, never closes it */
} tpy_pipe;

/* A descriptor of a Pipe (linked into its descs: closing the pipe frees it) or of a Channel
 * (chan.c: @drop frees it, dropping the channel item it describes). */
typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	PyObject *owner; /* the Pipe or Channel it came from (a reference) */
	struct tp_descriptor *d;
	void (*drop)(PyObject *owner, struct tp_descriptor *d); /* NULL: tp_descriptor_free() */
} tpy_descriptor;

/* ---- waiting ----------------------------------------------------------------------------- */

void tpy_pipe_wait_init(struct tpy_wait *w)
{
	pthread_condattr_t a;

	memset(w, 0, sizeof(*w));
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &a);
	pthread_condattr_destroy(&a);
}

void tpy_pipe_wait_done(struct tpy_wait *w)
{
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
}

void tpy_pipe_wait_signal(struct tpy_wait *w, int status, const char *errmsg)
{
	pthread_mutex_lock(&w->lock);
	w->status = status;
	if (status < 0 && errmsg)
		snprintf(w->msg, sizeof(w->msg), "%s", errmsg);
	w->done = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

void tpy_pipe_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	tpy_pipe_wait_signal(arg, status, errmsg);
}

static void pipe_on_descriptor(void *arg, struct tp_pipe *p, int status, const char *errmsg,
			       struct tp_descriptor *d)
{
	struct tpy_wait *w = arg;

	w->desc = d;
	tpy_pipe_wait_signal(w, status, errmsg);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to 200 ms (or until @until_ms) for @w. Return: whether the callback ran. */
static bool wait_slice(struct tpy_wait *w, int64_t until_ms)
{
	int64_t end = now_ms() + 200;
	struct timespec ts;
	bool done;

	if (until_ms >= 0 && until_ms < end)
		end = until_ms;
	ts.tv_sec = end / 1000;
	ts.tv_nsec = (end % 1000) * 1000000;
	pthread_mutex_lock(&w->lock);
	while (!w->done)
		if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT)
			break;
	done = w->done;
	pthread_mutex_unlock(&w->lock);
	return done;
}

int tpy_pipe_wait(tpy_context *ctx, struct tpy_wait *w, uint64_t op, int timeout_ms)
{
	int64_t until = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	bool cancelled = false, timed_out = false, interrupted = false, done;

	for (;;) {
		Py_BEGIN_ALLOW_THREADS
		done = wait_slice(w, cancelled ? -1 : until);
		Py_END_ALLOW_THREADS
		if (done)
			break;
		if (cancelled)
			continue;
		if (until >= 0 && now_ms() >= until)
			timed_out = true;
		else if (PyErr_CheckSignals() < 0)
			interrupted = true;
		else
			continue;
		/* The callback still runs: after it, the operation's memory is free. */
		if (ctx->ctx)
			tp_cancel(ctx->ctx, op);
		cancelled = true;
	}
	if (interrupted)
		return -EINTR;
	if (timed_out && w->status == -ECANCELED) {
		snprintf(w->msg, sizeof(w->msg), "timed out after %d ms", timeout_ms);
		return -ETIMEDOUT;
	}
	return w->status;
}

int tpy_pipe_timeout(PyObject *o, int *ret)
{
	double s;

	if (o == Py_None) {
		*ret = -1;
		return 0;
	}
	s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (s < 0 || s > 86400.0 * 24) {
		PyErr_SetString(PyExc_ValueError, "timeout must be None or 0..2073600 seconds");
		return -1;
	}
	*ret = (int)(s * 1000.0);
	return 0;
}

/* ---- Pipe -------------------------------------------------------------------------------- */

static void descriptor_drop(tpy_descriptor *d)
{
	struct tp_descriptor *desc = d->d;

	tpy_module_unlink(&d->child);
	d->d = NULL;
	if (desc && d->drop)
		d->drop(d->owner, desc);
	else if (desc)
		tp_descriptor_free(desc);
}

static void descriptor_on_pipe_close(struct tpy_child *c)
{
	descriptor_drop(TPY_CONTAINER(c, tpy_descriptor, child));
}

static void pipe_close_now(tpy_pipe *self)
{
	struct tp_pipe *p = self->p;

	tpy_module_unlink(&self->child);
	while (self->descs.next != &self->descs) {
		struct tpy_child *c = self->descs.next;

		c->close(c);
	}
	self->p = NULL;
	if (p && !self->in_set)
		tp_pipe_close(p);
}

static void pipe_on_context_close(struct tpy_child *c)
{
	pipe_close_now(TPY_CONTAINER(c, tpy_pipe, child));
}

PyObject *tpy_pipe_wrap(tpy_context *ctx, struct tp_pipe *p)
{
	tpy_pipe *self = PyObject_New(tpy_pipe, &tpy_pipe_type);

	if (!self) {
		tp_pipe_close(p);
		return NULL;
	}
	self->ctx = (tpy_context *)Py_NewRef(ctx);
	self->p = p;
	self->descs.next = self->descs.prev = &self->descs;
	self->in_set = false;
	self->child.close = pipe_on_context_close;
	self->child.next = self->child.prev = NULL;
	tpy_module_link(ctx, &self->child);
	return (PyObject *)self;
}

PyObject *tpy_pipe_connect(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "address", "wait_ms", "expect_uid", "expect_peer", NULL };
	struct tp_connect_options o = { .size = sizeof(o) };
	PyObject *expect_peer = Py_None;
	const char *addr;
	unsigned int wait_ms = 0;
	long long uid = -1;
	struct tpy_remote rm;
	struct tp_pipe *p;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|ILO:connect", kwlist, &addr, &wait_ms, &uid,
					 &expect_peer))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	if (tpy_remote_parse(expect_peer, "expect_peer", false, &rm) < 0)
		return NULL;
	o.wait_ms = wait_ms;
	if (uid >= 0) {
		o.flags |= TP_CONNECT_EXPECT_UID;
		o.expect_uid = (uid_t)uid;
	}
	if (rm.mode != TP_REMOTE_NONE) {
		o.flags |= TP_CONNECT_EXPECT_PEER;
		o.expect_remote = rm.mode;
		o.expect_peers = rm.n ? rm.peers : NULL;
		o.n_expect_peers = rm.n;
	}
	r = tp_connect_ex(self->ctx, addr, &o, &p);
	tpy_remote_done(&rm);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	return tpy_pipe_wrap(self, p);
}

static PyObject *pipe_close(tpy_pipe *self, PyObject *unused)
{
	pipe_close_now(self);
	Py_RETURN_NONE;
}

static void pipe_dealloc(tpy_pipe *self)
{
	pipe_close_now(self);
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

static PyObject *pipe_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *pipe_exit(tpy_pipe *self, PyObject *args)
{
	return pipe_close(self, NULL);
}

/* Drops the Py_buffers acquired so far (those with an owner). */
static void views_release(Py_buffer *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].obj)
			PyBuffer_Release(&v[i]);
}

struct msg_parts {
	PyObject *pay, *ten; /* fast sequences */
	Py_ssize_t np, nt;
	Py_buffer *views;    /* np + nt */
	struct tp_payload *payloads;
	struct tp_tensor *tensors;
	struct tp_slot *slots;
};

static void parts_free(struct msg_parts *m)
{
	if (m->views)
		views_release(m->views, (size_t)(m->np + m->nt));
	PyMem_Free(m->views);
	PyMem_Free(m->payloads);
	PyMem_Free(m->tensors);
	PyMem_Free(m->slots);
	Py_XDECREF(m->pay);
	Py_XDECREF(m->ten);
}

static PyObject *fast_or_empty(PyObject *o, const char *msg)
{
	if (!o || o == Py_None)
		return PyTuple_New(0);
	return PySequence_Fast(o, msg);
}

static int parts_alloc(struct msg_parts *m, PyObject *pay, PyObject *ten, bool read)
{
	memset(m, 0, sizeof(*m));
	m->pay = fast_or_empty(pay, "payloads must be a sequence");
	m->ten = m->pay ? fast_or_empty(ten, "tensors must be a sequence") : NULL;
	if (!m->ten)
		return -1;
	m->np = PySequence_Fast_GET_SIZE(m->pay);
	m->nt = PySequence_Fast_GET_SIZE(m->ten);
	m->views = PyMem_Calloc((size_t)(m->np + m->nt) + 1, sizeof(Py_buffer));
	if (read)
		m->slots = PyMem_Calloc((size_t)(m->np + m->nt) + 1, sizeof(struct tp_slot));
	else {
		m->payloads = PyMem_Calloc((size_t)m->np + 1, sizeof(struct tp_payload));
		m->tensors = PyMem_Calloc((size_t)m->nt + 1, sizeof(struct tp_tensor));
	}
	if (!m->views || (read ? !m->slots : !m->payloads || !m->tensors)) {
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

/* Fills m->tensors from (buffer_or_cuda, metadata bytes) pairs. */
static int parts_tensors(struct msg_parts *m)
{
	for (Py_ssize_t i = 0; i < m->nt; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(m->ten, i), *obj, *meta;
		struct tp_tensor *t = &m->tensors[i];
		char *mp;
		Py_ssize_t ml;
		size_t len;

		if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
			PyErr_SetString(PyExc_TypeError, "each tensor is a (buffer, metadata) pair");
			return -1;
		}
		obj = PyTuple_GET_ITEM(it, 0);
		meta = PyTuple_GET_ITEM(it, 1);
		if (PyBytes_AsStringAndSize(meta, &mp, &ml) < 0)
			return -1;
		if (tpy_buffer_tensor(obj, &m->views[m->np + i], false, t, NULL, &len) < 0)
			return -1;
		t->length = len;
		t->metadata = mp;
		t->metadata_len = (size_t)ml;
	}
	return 0;
}

/* Fills m->payloads and m->tensors from the write arguments (see tpy_pipe_message_new()). */
static int parts_write(struct msg_parts *m, PyObject *pay, PyObject *ten)
{
	if (parts_alloc(m, pay, ten, false) < 0)
		return -1;
	for (Py_ssize_t i = 0; i < m->np; i++) {
		if (tpy_buffer_get(PySequence_Fast_GET_ITEM(m->pay, i), &m->views[i], false,
				   "payload") < 0)
			return -1;
		m->payloads[i].data = m->views[i].buf;
		m->payloads[i].length = (size_t)m->views[i].len;
	}
	return parts_tensors(m);
}

void *tpy_pipe_message_new(const Py_buffer *meta, PyObject *pay, PyObject *ten,
			   struct tp_message *ret)
{
	struct msg_parts *m = PyMem_Calloc(1, sizeof(*m));

	if (!m)
		return PyErr_NoMemory();
	if (parts_write(m, pay, ten) < 0) {
		tpy_pipe_message_free(m);
		return NULL;
	}
	*ret = (struct tp_message){ .metadata = meta->buf, .metadata_len = (size_t)meta->len,
				    .payloads = m->payloads, .n_payloads = (size_t)m->np,
				    .tensors = m->tensors, .n_tensors = (size_t)m->nt };
	return m;
}

void tpy_pipe_message_free(void *parts)
{
	if (!parts)
		return;
	parts_free(parts);
	PyMem_Free(parts);
}

static PyObject *pipe_write(tpy_pipe *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "metadata", "payloads", "tensors", "timeout", NULL };
	Py_buffer meta = { 0 };
	PyObject *pay = NULL, *ten = NULL, *tmo = Py_None;
	struct tp_message msg = { 0 };
	void *parts = NULL;
	struct tpy_wait w;
	uint64_t op = 0;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|OOO:write", kwlist, &meta, &pay, &ten, &tmo))
		return NULL;
	tpy_pipe_wait_init(&w);
	if (tpy_pipe_timeout(tmo, &timeout_ms) < 0 ||
	    !(parts = tpy_pipe_message_new(&meta, pay, ten, &msg)))
		goto fail;
	if (!self->p) {
		tpy_module_closed("Pipe");
		goto fail;
	}
	r = tp_pipe_write_ex(self->p, &msg, tpy_pipe_on_done, &w, &op);
	if (r < 0) {
		tpy_module_raise(r, NULL);
		goto fail;
	}
	r = tpy_pipe_wait(self->ctx, &w, op, timeout_ms);
	if (r < 0 && r != -EINTR)
		tpy_module_raise(r, w.msg);
	tpy_pipe_message_free(parts);
	PyBuffer_Release(&meta);
	tpy_pipe_wait_done(&w);
	if (r < 0)
		return NULL;
	Py_RETURN_NONE;
fail:
	tpy_pipe_message_free(parts);
	PyBuffer_Release(&meta);
	tpy_pipe_wait_done(&w);
	return NULL;
}

PyObject *tpy_descriptor_new(PyObject *owner, struct tp_descriptor *d,
			     void (*drop)(PyObject *owner, struct tp_descriptor *d))
{
	tpy_descriptor *self = PyObject_New(tpy_descriptor, &tpy_descriptor_type);

	if (!self) {
		if (drop)
			drop(owner, d);
		else
			tp_descriptor_free(d);
		return NULL;
	}
	self->owner = Py_NewRef(owner);
	self->d = d;
	self->drop = drop;
	self->child.next = self->child.prev = NULL;
	self->child.close = descriptor_on_pipe_close;
	return (PyObject *)self;
}

struct tp_descriptor *tpy_descriptor_of(PyObject *o, PyObject *owner, bool take)
{
	tpy_descriptor *self = (tpy_descriptor *)o;
	struct tp_descriptor *d;

	if (!PyObject_TypeCheck(o, &tpy_descriptor_type) || !self->d || self->owner != owner) {
		PyErr_SetString(PyExc_ValueError, "descriptor already read, or not of this object");
		return NULL;
	}
	d = self->d;
	if (take) {
		self->d = NULL;
		tpy_module_unlink(&self->child);
	}
	return d;
}

static PyObject *descriptor_wrap(tpy_pipe *pipe, struct tp_descriptor *d)
{
	tpy_descriptor *self = (tpy_descriptor *)tpy_descriptor_new((PyObject *)pipe, d, NULL);

	if (!self)
		return NULL;
	self->child.next = pipe->descs.next;
	self->child.prev = &pipe->descs;
	pipe->descs.next->prev = &self->child;
	pipe->descs.next = &self->child;
	return (PyObject *)self;
}

int tpy_pipe_to_set(PyObject *o, tpy_context *ctx, struct tp_pipe_set *s)
{
	tpy_pipe *self = (tpy_pipe *)o;
	int r;

	if (!PyObject_TypeCheck(o, &tpy_pipe_type)) {
		PyErr_SetString(PyExc_TypeError, "a Pipe is needed");
		return -1;
	}
	if (!self->p || self->in_set) {
		tpy_module_closed(self->p ? "Pipe (already in a set)" : "Pipe");
		return -1;
	}
	if (self->ctx != ctx || self->descs.next != &self->descs) {
		tpy_module_raise(-EINVAL, self->ctx != ctx ? "the pipe belongs to another context" :
				 "the pipe has unread descriptors");
		return -1;
	}
	r = tp_set_add(s, self->p);
	if (r < 0) {
		tpy_module_raise(r, NULL);
		return -1;
	}
	self->in_set = true;
	return 0;
}

void tpy_pipe_from_set(PyObject *o, bool ended)
{
	tpy_pipe *self = (tpy_pipe *)o;

	if (ended) {
		self->in_set = false; /* the caller's again: close() closes it */
		return;
	}
	pipe_close_now(self); /* the set closed it */
	self->in_set = false;
}

PyObject *tpy_pipe_descriptor(PyObject *o, struct tp_descriptor *d)
{
	return descriptor_wrap((tpy_pipe *)o, d);
}

static PyObject *pipe_read_descriptor(tpy_pipe *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None, *ret = NULL;
	struct tpy_wait w;
	uint64_t op = 0;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:read_descriptor", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	if (!self->p)
		return tpy_module_closed("Pipe");
	if (self->in_set)
		return tpy_module_raise(-EINVAL, "the pipe is in a PipeSet: read it through "
					"recv_any()");
	tpy_pipe_wait_init(&w);
	r = tp_pipe_read_descriptor_ex(self->p, pipe_on_descriptor, &w, &op);
	if (r < 0) {
		tpy_pipe_wait_done(&w);
		return tpy_module_raise(r, NULL);
	}
	r = tpy_pipe_wait(self->ctx, &w, op, timeout_ms);
	if (r == 0 && w.desc && self->p)
		ret = descriptor_wrap(self, w.desc);
	else if (r == 0 && w.desc)
		tp_descriptor_free(w.desc); /* the pipe was closed meanwhile */
	else if (r == 0)
		tpy_module_closed("Pipe");
	else if (r == -EINTR && w.desc)
		tp_descriptor_free(w.desc);
	if (r < 0 && r != -EINTR)
		tpy_module_raise(r, w.msg);
	tpy_pipe_wait_done(&w);
	return ret;
}

/* Fills m->slots from the destinations (writable buffers or CUDA tuples), checking sizes. */
static int parts_slots(struct msg_parts *m, const struct tp_descriptor *d)
{
	if ((size_t)m->np != d->n_payloads || (size_t)m->nt != d->n_tensors) {
		PyErr_Format(PyExc_ValueError, "the message has %zu payloads and %zu tensors, "
			     "%zd and %zd destinations given", d->n_payloads, d->n_tensors, m->np,
			     m->nt);
		return -1;
	}
	for (Py_ssize_t i = 0; i < m->np + m->nt; i++) {
		bool pay = i < m->np;
		PyObject *o = pay ? PySequence_Fast_GET_ITEM(m->pay, i) :
				    PySequence_Fast_GET_ITEM(m->ten, i - m->np);
		size_t need = pay ? d->payloads[i].length : d->tensors[i - m->np].length, len;

		if (tpy_buffer_tensor(o, &m->views[i], true, NULL, &m->slots[i], &len) < 0)
			return -1;
		if (len < need) {
			PyErr_Format(PyExc_ValueError, "%s %zd: destination of %zu bytes for %zu",
				     pay ? "payload" : "tensor", pay ? i : i - m->np, len, need);
			return -1;
		}
	}
	return 0;
}

void *tpy_pipe_slots_new(const struct tp_descriptor *d, PyObject *pay, PyObject *ten,
			 struct tp_allocation *ret)
{
	struct msg_parts *m = PyMem_Calloc(1, sizeof(*m));

	if (!m)
		return PyErr_NoMemory();
	if (parts_alloc(m, pay, ten, true) < 0 || parts_slots(m, d) < 0) {
		tpy_pipe_message_free(m);
		return NULL;
	}
	*ret = (struct tp_allocation){ .payloads = m->slots, .n_payloads = (size_t)m->np,
				       .tensors = m->slots + m->np, .n_tensors = (size_t)m->nt };
	return m;
}

static PyObject *pipe_read(tpy_pipe *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "descriptor", "payloads", "tensors", "timeout", NULL };
	PyObject *pay = NULL, *ten = NULL, *tmo = Py_None;
	tpy_descriptor *desc;
	void *parts = NULL;
	struct tp_allocation a;
	struct tp_descriptor *d;
	struct tpy_wait w;
	uint64_t op = 0;
	int timeout_ms, r = -1;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OOO:read", kwlist, &tpy_descriptor_type,
					 &desc, &pay, &ten, &tmo))
		return NULL;
	tpy_pipe_wait_init(&w);
	if (tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		goto out;
	if (!desc->d || desc->owner != (PyObject *)self) {
		PyErr_SetString(PyExc_ValueError, "descriptor already read, or of another pipe");
		goto out;
	}
	if (!(parts = tpy_pipe_slots_new(desc->d, pay, ten, &a)))
		goto out;
	if (!self->p) {
		tpy_module_closed("Pipe");
		goto out;
	}
	d = tpy_descriptor_of((PyObject *)desc, (PyObject *)self, true);
	r = tp_pipe_read_ex(self->p, d, &a, tpy_pipe_on_done, &w, &op);
	if (r < 0) {
		tpy_module_raise(r, NULL);
		goto out;
	}
	r = tpy_pipe_wait(self->ctx, &w, op, timeout_ms);
	if (r < 0 && r != -EINTR)
		tpy_module_raise(r, w.msg);
out:
	tpy_pipe_message_free(parts);
	tpy_pipe_wait_done(&w);
	if (r < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *pipe_wait_connected(tpy_pipe *self, PyObject *args)
{
	double s = 10.0;
	int r;

	if (!PyArg_ParseTuple(args, "|d:wait_connected", &s))
		return NULL;
	if (!self->p)
		return tpy_module_closed("Pipe");
	/* Bounded: closing the pipe meanwhile from another thread is not supported. */
	Py_BEGIN_ALLOW_THREADS
	r = tp_pipe_wait_connected(self->p, s < 0 ? 0 : s > 3600 ? 3600000 : (int)(s * 1000));
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *pipe_get_remote_name(tpy_pipe *self, void *unused)
{
	if (!self->p)
		return tpy_module_closed("Pipe");
	return PyUnicode_FromString(tp_pipe_remote_name(self->p));
}

static PyObject *pipe_get_remote_uid(tpy_pipe *self, void *unused)
{
	uid_t uid;
	int r;

	if (!self->p)
		return tpy_module_closed("Pipe");
	r = tp_pipe_remote_uid(self->p, &uid);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	return PyLong_FromUnsignedLong(uid);
}

static PyObject *pipe_get_closed(tpy_pipe *self, void *unused)
{
	return PyBool_FromLong(self->p == NULL);
}

static PyObject *pipe_get_context(tpy_pipe *self, void *unused)
{
	return Py_NewRef((PyObject *)self->ctx);
}

static PyMethodDef pipe_methods[] = {
	{ "write", (PyCFunction)(void (*)(void))pipe_write, METH_VARARGS | METH_KEYWORDS,
	  "write(metadata, payloads=(), tensors=(), timeout=None)\n--\n\nSend a message and wait "
	  "until it is in the reader's memory (or queued, for a small one). @tensors are "
	  "(buffer, metadata) pairs; a CUDA buffer is a (ptr, nbytes, device, stream) tuple. "
	  "Every buffer is borrowed until write() returns, whatever it raises." },
	{ "read_descriptor", (PyCFunction)(void (*)(void))pipe_read_descriptor,
	  METH_VARARGS | METH_KEYWORDS,
	  "read_descriptor(timeout=None) -> Descriptor\n--\n\nWait for the next message's "
	  "descriptor (metadata and sizes; its bytes are not moved yet)." },
	{ "read", (PyCFunction)(void (*)(void))pipe_read, METH_VARARGS | METH_KEYWORDS,
	  "read(descriptor, payloads=(), tensors=(), timeout=None)\n--\n\nMove the message of "
	  "@descriptor (consumed, also on failure) into writable buffers, one per payload and "
	  "tensor, borrowed until read() returns." },
	{ "wait_connected", (PyCFunction)pipe_wait_connected, METH_VARARGS,
	  "wait_connected(timeout=10.0)\n--\n\nWait until the daemon accepted or refused the "
	  "connect." },
	{ "close", (PyCFunction)pipe_close, METH_NOARGS,
	  "close()\n--\n\nClose the pipe; pending operations fail with Cancelled, unread "
	  "descriptors are dropped." },
	{ "__enter__", pipe_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)pipe_exit, METH_VARARGS, NULL },
	{ 0 }
};

static PyGetSetDef pipe_getset[] = {
	{ "remote_name", (getter)pipe_get_remote_name, NULL, "who is on the other end", NULL },
	{ "remote_uid", (getter)pipe_get_remote_uid, NULL, "the other end's uid", NULL },
	{ "closed", (getter)pipe_get_closed, NULL, "whether close() ran", NULL },
	{ "context", (getter)pipe_get_context, NULL, "the Context the pipe belongs to", NULL },
	{ 0 }
};

PyTypeObject tpy_pipe_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Pipe",
	.tp_basicsize = sizeof(tpy_pipe),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A pipe to one other process (from Context.connect() or Listener.accept()).",
	.tp_dealloc = (destructor)pipe_dealloc,
	.tp_methods = pipe_methods,
	.tp_getset = pipe_getset,
};

/* ---- Descriptor --------------------------------------------------------------------------- */

static void descriptor_dealloc(tpy_descriptor *self)
{
	descriptor_drop(self);
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static PyObject *descriptor_get_metadata(tpy_descriptor *self, void *unused)
{
	if (!self->d)
		return tpy_module_closed("Descriptor");
	return PyBytes_FromStringAndSize(self->d->metadata, (Py_ssize_t)self->d->metadata_len);
}

static PyObject *descriptor_get_payloads(tpy_descriptor *self, void *unused)
{
	PyObject *l;

	if (!self->d)
		return tpy_module_closed("Descriptor");
	l = PyList_New((Py_ssize_t)self->d->n_payloads);
	for (size_t i = 0; l && i < self->d->n_payloads; i++) {
		const struct tp_payload_desc *p = &self->d->payloads[i];
		PyObject *t = Py_BuildValue("(ny#)", (Py_ssize_t)p->length, p->metadata,
					    (Py_ssize_t)p->metadata_len);

		if (!t) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, t);
	}
	return l;
}

static PyObject *descriptor_get_tensors(tpy_descriptor *self, void *unused)
{
	PyObject *l;

	if (!self->d)
		return tpy_module_closed("Descriptor");
	l = PyList_New((Py_ssize_t)self->d->n_tensors);
	for (size_t i = 0; l && i < self->d->n_tensors; i++) {
		const struct tp_tensor_desc *t = &self->d->tensors[i];
		PyObject *o = Py_BuildValue("(ny#ii)", (Py_ssize_t)t->length, t->metadata,
					    (Py_ssize_t)t->metadata_len, (int)t->device.type,
					    t->device.index);

		if (!o) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, o);
	}
	return l;
}

static PyGetSetDef descriptor_getset[] = {
	{ "metadata", (getter)descriptor_get_metadata, NULL, "the message's metadata", NULL },
	{ "payloads", (getter)descriptor_get_payloads, NULL, "[(length, metadata)]", NULL },
	{ "tensors", (getter)descriptor_get_tensors, NULL,
	  "[(length, metadata, device_type, device_index)] (device_type 0 CPU, 1 CUDA)", NULL },
	{ 0 }
};

PyTypeObject tpy_descriptor_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Descriptor",
	.tp_basicsize = sizeof(tpy_descriptor),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "What a reader learns of a message before it supplies memory. Dropping it "
		  "unread discards the message.",
	.tp_dealloc = (destructor)descriptor_dealloc,
	.tp_getset = descriptor_getset,
};

int tpy_pipe_add_types(PyObject *m)
{
	PyTypeObject *types[] = { &tpy_pipe_type, &tpy_descriptor_type };
	const char *names[] = { "Pipe", "Descriptor" };

	for (size_t i = 0; i < 2; i++)
		if (PyType_Ready(types[i]) < 0 ||
		    PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
			return -1;
	return 0;
}
