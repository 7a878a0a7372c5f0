/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd listeners: the Listener type (Context.listen(), accept() waited for without the GIL,
 * close). The pipes it accepts are pipe.c's.
 */
#include <errno.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	tpy_context *ctx;
	struct tp_listener *l;
} tpy_listener;

static void pipe_on_accept(void *arg, struct tp_listener *l, int status, const char *errmsg,
			   struct tp_pipe *pipe)
{
	struct tpy_wait *w = arg;

	w->pipe = pipe;
	tpy_pipe_wait_signal(w, status, errmsg);
}

/* ---- Listener ----------------------------------------------------------------------------- */

static void listener_close_now(tpy_listener *self)
{
	struct tp_listener *l = self->l;

	tpy_module_unlink(&self->child);
	self->l = NULL;
	if (l)
		tp_listener_close(l);
}

static void listener_on_context_close(struct tpy_child *c)
{
	listener_close_now(TPY_CONTAINER(c, tpy_listener, child));
}

PyObject *tpy_listener_new(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "access", "gid", NULL };
	struct tp_listen_options o = { .size = sizeof(o) };
	const char *name;
	int access = 0;
	long long gid = -1;
	struct tp_listener *l;
	tpy_listener *ret;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|iL:listen", kwlist, &name, &access, &gid))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	o.access = (enum tp_access)access;
	o.gid = gid < 0 ? 0 : (gid_t)gid;
	Py_BEGIN_ALLOW_THREADS
	r = tp_listen(self->ctx, name, &o, &l);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	ret = PyObject_New(tpy_listener, &tpy_listener_type);
	if (!ret) {
		tp_listener_close(l);
		return NULL;
	}
	ret->ctx = (tpy_context *)Py_NewRef(self);
	ret->l = l;
	ret->child.close = listener_on_context_close;
	tpy_module_link(self, &ret->child);
	return (PyObject *)ret;
}

static PyObject *listener_accept(tpy_listener *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None, *ret = NULL;
	struct tpy_wait w;
	uint64_t op = 0;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:accept", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	if (!self->l)
		return tpy_module_closed("Listener");
	tpy_pipe_wait_init(&w);
	r = tp_listener_accept_ex(self->l, pipe_on_accept, &w, &op);
	if (r < 0) {
		tpy_pipe_wait_done(&w);
		return tpy_module_raise(r, NULL);
	}
	r = tpy_pipe_wait(self->ctx, &w, op, timeout_ms);
	if (r == 0 && w.pipe)
		ret = tpy_pipe_wrap(self->ctx, w.pipe);
	else if (r == -EINTR && w.pipe)
		tp_pipe_close(w.pipe);
	if (r < 0 && r != -EINTR)
		tpy_module_raise(r, w.msg);
	tpy_pipe_wait_done(&w);
	return ret;
}

static PyObject *listener_close(tpy_listener *self, PyObject *unused)
{
	listener_close_now(self);
	Py_RETURN_NONE;
}

static void listener_dealloc(tpy_listener *self)
{
	listener_close_now(self);
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

static PyObject *listener_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *listener_exit(tpy_listener *self, PyObject *args)
{
	return listener_close(self, NULL);
}

static PyObject *listener_get_name(tpy_listener *self, void *unused)
{
	if (!self->l)
		return tpy_module_closed("Listener");
	return PyUnicode_FromString(tp_listener_name(self->l));
}

static PyMethodDef listener_methods[] = {
	{ "accept", (PyCFunction)(void (*)(void))listener_accept, METH_VARARGS | METH_KEYWORDS,
	  "accept(timeout=None) -> Pipe\n--\n\nWait for the next incoming pipe." },
	{ "close", (PyCFunction)listener_close, METH_NOARGS,
	  "close()\n--\n\nUnregister the name; pending accepts fail with Cancelled." },
	{ "__enter__", listener_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)listener_exit, METH_VARARGS, NULL },
	{ 0 }
};

static PyGetSetDef listener_getset[] = {
	{ "name", (getter)listener_get_name, NULL, "the listener's name", NULL },
	{ 0 }
};

PyTypeObject tpy_listener_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Listener",
	.tp_basicsize = sizeof(tpy_listener),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A registered listener name (from Context.listen()).",
	.tp_dealloc = (destructor)listener_dealloc,
	.tp_methods = listener_methods,
	.tp_getset = listener_getset,
};

int tpy_listener_add_types(PyObject *m)
{
	if (PyType_Ready(&tpy_listener_type) < 0)
		return -1;
	return PyModule_AddObjectRef(m, "Listener", (PyObject *)&tpy_listener_type);
}
