/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd pipe sets: the PipeSet type over libtpclient's tp_set_* (docs/fanout.md), a server's
 * accepted pipes read as one (read_any: whichever pipe has a message, fairly) and written as
 * one (broadcast: the writer's memory read once). The set owns the library pipes added to it;
 * their Pipe objects stay, to read the messages read_any() announces (pipe.c). read_any()
 * waits in slices without the GIL (gate.c), so Ctrl-C interrupts it; broadcast() is bounded by
 * its timeout instead. The fan-out mode (tp_set_set_fanout(): the daemon's or the set's own
 * writes) is a property; last_fanout says which the last broadcast used. Keys, Messages and
 * tensors are the package's (tpipd/_set.py).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	tpy_context *ctx;
	struct tp_pipe_set *s; /* NULL once closed */
	struct tpy_gate gate;
	PyObject *members; /* dict: the library pipe's address -> its Pipe object */
	enum tp_fanout fanout; /* the last tp_set_set_fanout() value (TP_FANOUT_AUTO at first) */
} tpy_set;

/* Frees the set (closing its pipes) once no thread is inside a call. */
static void set_close_now(tpy_set *self)
{
	struct tp_pipe_set *s;
	PyObject *key, *pipe;
	Py_ssize_t pos = 0;

	tpy_module_unlink(&self->child);
	tpy_gate_drain(&self->gate);
	s = self->s;
	self->s = NULL;
	if (s) {
		Py_BEGIN_ALLOW_THREADS
		tp_set_free(s);
		Py_END_ALLOW_THREADS
	}
	while (self->members && PyDict_Next(self->members, &pos, &key, &pipe))
		tpy_pipe_from_set(pipe, false);
	if (self->members)
		PyDict_Clear(self->members);
}

static void set_on_context_close(struct tpy_child *c)
{
	set_close_now(TPY_CONTAINER(c, tpy_set, child));
}

static int set_init(tpy_set *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "context", "max_pipes", NULL };
	tpy_context *ctx;
	unsigned int max = 64;
	int r;

	if (self->ctx) {
		PyErr_SetString(PyExc_RuntimeError, "PipeSet already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|I:PipeSet", kwlist, &tpy_context_type, &ctx,
					 &max))
		return -1;
	if (!ctx->ctx || ctx->closed) {
		tpy_module_closed("Context");
		return -1;
	}
	self->members = PyDict_New();
	if (!self->members)
		return -1;
	r = tp_set_new(ctx->ctx, max, &self->s);
	if (r < 0) {
		tpy_module_raise(r, NULL);
		return -1;
	}
	self->ctx = (tpy_context *)Py_NewRef(ctx);
	tpy_gate_init(&self->gate);
	self->child.close = set_on_context_close;
	tpy_module_link(ctx, &self->child);
	return 0;
}

/* Enters a call: one thread at a time, never after close. Return: 0, or -1 with an exception. */
static int set_enter(tpy_set *self)
{
	if (!self->s || self->gate.closing) {
		tpy_module_closed("PipeSet");
		return -1;
	}
	if (self->gate.inflight > 0) {
		PyErr_SetString(PyExc_RuntimeError, "PipeSet is in use by another thread");
		return -1;
	}
	self->gate.inflight++;
	return 0;
}

static PyObject *pipe_key(struct tp_pipe *p)
{
	return PyLong_FromVoidPtr(p);
}

static PyObject *set_add(tpy_set *self, PyObject *pipe)
{
	PyObject *key;

	if (set_enter(self) < 0)
		return NULL;
	if (tpy_pipe_to_set(pipe, self->ctx, self->s) < 0) {
		tpy_gate_leave(&self->gate);
		return NULL;
	}
	/* The pipe added last is the set's last (tp_set_pipe() keeps the order of addition). */
	key = pipe_key(tp_set_pipe(self->s, tp_set_size(self->s) - 1));
	tpy_gate_leave(&self->gate);
	if (!key || PyDict_SetItem(self->members, key, pipe) < 0) {
		Py_XDECREF(key);
		return NULL;
	}
	Py_DECREF(key);
	Py_RETURN_NONE;
}

/* The result of read_any() for @p with @d (NULL: @p ended with @status, @msg). */
static PyObject *set_result(tpy_set *self, struct tp_pipe *p, struct tp_descriptor *d,
			    int status, const char *msg)
{
	PyObject *key = pipe_key(p), *pipe, *ret = NULL;

	pipe = key ? PyDict_GetItemWithError(self->members, key) : NULL;
	if (!pipe) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "read_any(): a pipe the set never had");
		if (d)
			tp_descriptor_free(d);
		Py_XDECREF(key);
		return NULL;
	}
	Py_INCREF(pipe);
	if (d)
		ret = Py_BuildValue("(NN)", Py_NewRef(pipe), tpy_pipe_descriptor(pipe, d));
	else {
		tpy_pipe_from_set(pipe, true);
		PyDict_DelItem(self->members, key);
		ret = Py_BuildValue("(OOis)", pipe, Py_None, status, msg);
	}
	Py_DECREF(pipe);
	Py_DECREF(key);
	return ret;
}

static PyObject *set_read_any(tpy_set *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	struct tp_descriptor *d = NULL;
	struct tp_pipe *p = NULL;
	int timeout_ms, slice, again, r, status;
	int64_t until;
	const char *msg;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:read_any", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0 || set_enter(self) < 0)
		return NULL;
	until = timeout_ms < 0 ? -1 : tpy_gate_now_ms() + timeout_ms;
	do {
		slice = tpy_gate_slice(until);
		Py_BEGIN_ALLOW_THREADS
		r = tp_set_read_any(self->s, slice, &p, &d);
		Py_END_ALLOW_THREADS
		again = tpy_gate_again(&self->gate, r, slice, until);
	} while (again > 0);
	tpy_gate_leave(&self->gate);
	if (again < 0)
		return NULL;
	if (r == -ETIMEDOUT && self->gate.closing)
		return tpy_module_closed("PipeSet");
	if (r < 0)
		return tpy_module_raise(r, r == -ENOENT ? "the set has no pipe left" : NULL);
	status = r == 1 ? tp_set_last_status(self->s) : 0;
	msg = r == 1 ? tp_last_error() : "";
	return set_result(self, p, r == 0 ? d : NULL, status, msg ? msg : "");
}

/* [(Pipe, status)] of the @n broadcast statuses @st, in tp_set_pipe() order. */
static PyObject *set_statuses(tpy_set *self, const int *st, unsigned n)
{
	PyObject *l = PyList_New(n);

	for (unsigned i = 0; l && i < n; i++) {
		PyObject *key = pipe_key(tp_set_pipe(self->s, i)), *pipe, *t = NULL;

		pipe = key ? PyDict_GetItemWithError(self->members, key) : NULL;
		if (pipe)
			t = Py_BuildValue("(Oi)", pipe, st[i]);
		Py_XDECREF(key);
		if (!t) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_RuntimeError, "broadcast: an unknown pipe");
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, i, t);
	}
	return l;
}

static PyObject *set_broadcast(tpy_set *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "metadata", "payloads", "tensors", "timeout", NULL };
	Py_buffer meta = { 0 };
	PyObject *pay = NULL, *ten = NULL, *tmo = Py_None, *ret = NULL;
	struct tp_message msg;
	void *parts = NULL;
	int *st = NULL, timeout_ms, r;
	unsigned n = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|OOO:broadcast", kwlist, &meta, &pay, &ten,
					 &tmo))
		return NULL;
	if (tpy_pipe_timeout(tmo, &timeout_ms) < 0 || set_enter(self) < 0)
		goto out;
	n = tp_set_size(self->s);
	st = PyMem_Calloc(n + 1, sizeof(*st));
	parts = st ? tpy_pipe_message_new(&meta, pay, ten, &msg) : PyErr_NoMemory();
	if (parts) {
		Py_BEGIN_ALLOW_THREADS
		r = tp_set_broadcast(self->s, &msg, timeout_ms, st, n);
		Py_END_ALLOW_THREADS
		if (r < 0)
			tpy_module_raise(r, NULL);
		else
			ret = set_statuses(self, st, n);
	}
	tpy_gate_leave(&self->gate);
out:
	tpy_pipe_message_free(parts);
	PyMem_Free(st);
	PyBuffer_Release(&meta);
	return ret;
}

static PyObject *set_close(tpy_set *self, PyObject *unused)
{
	set_close_now(self);
	Py_RETURN_NONE;
}

static void set_dealloc(tpy_set *self)
{
	if (self->ctx) {
		set_close_now(self);
		tpy_gate_done(&self->gate);
	}
	Py_XDECREF(self->members);
	Py_XDECREF(self->ctx);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *set_get_size(tpy_set *self, void *unused)
{
	return PyLong_FromUnsignedLong(self->s ? tp_set_size(self->s) : 0);
}

static PyMethodDef set_methods[] = {
	{ "add", (PyCFunction)set_add, METH_O,
	  "add(pipe)\n--\n\nThe set takes @pipe's library pipe (it closes it); read its messages "
	  "through read_any() only." },
	{ "read_any", (PyCFunction)(void (*)(void))set_read_any, METH_VARARGS | METH_KEYWORDS,
	  "read_any(timeout=None) -> (Pipe, Descriptor) | (Pipe, None, errno, message)\n--\n\n"
	  "The next descriptor of whichever pipe has one, round-robin; or a pipe's end (it left "
	  "the set and its Pipe owns it again). Read the message before the next call." },
	{ "broadcast", (PyCFunction)(void (*)(void))set_broadcast, METH_VARARGS | METH_KEYWORDS,
	  "broadcast(metadata, payloads=(), tensors=(), timeout=None) -> [(Pipe, status)]\n--\n\n"
	  "Write one message to every pipe, reading the writer's memory once; status 0 or that "
	  "pipe's -errno. Borrows everything until it returns." },
	{ "close", (PyCFunction)set_close, METH_NOARGS,
	  "close()\n--\n\nClose every pipe still in the set and free it." },
	{ 0 }
};

static PyObject *set_get_fanout(tpy_set *self, void *unused)
{
	return PyLong_FromLong(self->fanout);
}

/* tp_set_set_fanout() with an int (TP_FANOUT_*); refused once the set is closed. */
static int set_set_fanout(tpy_set *self, PyObject *v, void *unused)
{
	long how;
	int r;

	if (!v) {
		PyErr_SetString(PyExc_AttributeError, "fanout cannot be deleted");
		return -1;
	}
	how = PyLong_AsLong(v);
	if (how == -1 && PyErr_Occurred())
		return -1;
	if (set_enter(self) < 0)
		return -1;
	r = how < 0 || how > INT_MAX ? -EINVAL : tp_set_set_fanout(self->s, (enum tp_fanout)how);
	tpy_gate_leave(&self->gate);
	if (r < 0) {
		tpy_module_raise(r, "fanout: 0 (auto), 1 (library) or 2 (daemon)");
		return -1;
	}
	self->fanout = (enum tp_fanout)how;
	return 0;
}

static PyObject *set_get_last_fanout(tpy_set *self, void *unused)
{
	return PyLong_FromLong(self->s ? tp_set_last_fanout(self->s) : TP_FANOUT_AUTO);
}

static PyGetSetDef set_getset[] = {
	{ "size", (getter)set_get_size, NULL, "pipes in the set", NULL },
	{ "fanout", (getter)set_get_fanout, (setter)set_set_fanout,
	  "how broadcasts fan out from now on (tp_set_set_fanout()): 0 auto (the daemon's where "
	  "it can, else one write per pipe), 1 library (one write per pipe), 2 daemon (only the "
	  "daemon's: broadcast() raises NotSupported where it cannot)", NULL },
	{ "last_fanout", (getter)set_get_last_fanout, NULL,
	  "how the last broadcast fanned out (tp_set_last_fanout()): 2 daemon, 1 library; 0 before "
	  "the first", NULL },
	{ 0 }
};

PyTypeObject tpy_set_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.PipeSet",
	.tp_basicsize = sizeof(tpy_set),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "PipeSet(context, max_pipes=64)\n--\n\nA server's accepted pipes read and "
		  "written as one (tp_set_*).",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)set_init,
	.tp_dealloc = (destructor)set_dealloc,
	.tp_methods = set_methods,
	.tp_getset = set_getset,
};

int tpy_set_add_types(PyObject *m)
{
	if (PyType_Ready(&tpy_set_type) < 0 ||
	    PyModule_AddObjectRef(m, "PipeSet", (PyObject *)&tpy_set_type) < 0)
		return -1;
	return 0;
}
