/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd module: its initialisation, the exception hierarchy that maps libtpclient's negative
 * errno codes to Python exceptions (tpipd.Error and its subclasses, each also a built-in
 * OSError subclass where one fits), and the Context type (one session with the local tpipd).
 * Pipes are in pipe.c, listeners in listener.c, shared buffers and tensor memory in buffer.c, groups in
 * group.c, channels in chan.c, pipe sets in fan.c, work queues in wq.c, DLPack in dlpack.c.
 */
#include <errno.h>
#include "tpy.h"

static PyObject *error_base;

static struct {
	int err;
	const char *name;
	PyObject *builtin_base; /* filled in at init (NULL: Error only) */
	PyObject *type;
	const char *doc;
} errors[] = {
	{ ECONNRESET, "PeerDied", NULL, NULL, "the other end's process (or its daemon) died" },
	{ EPIPE, "PipeClosed", NULL, NULL, "the other end closed, left or aborted" },
	{ ENOENT, "NoListener", NULL, NULL, "no such listener (or no daemon socket)" },
	{ ECONNREFUSED, "NoDaemon", NULL, NULL, "nothing listens at that address" },
	{ ETIMEDOUT, "Timeout", NULL, NULL, "the operation did not complete in time" },
	{ EACCES, "AccessDenied", NULL, NULL, "refused by an access policy" },
	{ EPERM, "AccessDenied", NULL, NULL, NULL },
	{ ECANCELED, "Cancelled", NULL, NULL, "cancelled or closed, here or by the other end" },
	{ ECONNABORTED, "Aborted", NULL, NULL, "an administrator closed the session" },
	{ EMSGSIZE, "LimitExceeded", NULL, NULL, "over a size, count or queue limit" },
	{ ENOBUFS, "LimitExceeded", NULL, NULL, NULL },
	{ E2BIG, "LimitExceeded", NULL, NULL, NULL },
	{ EADDRINUSE, "NameInUse", NULL, NULL, "listener name or group rank taken" },
	{ EPROTO, "Mismatch", NULL, NULL, "group members called different collectives" },
	{ EINVAL, "InvalidArgument", NULL, NULL, "invalid argument" },
	{ EOPNOTSUPP, "NotSupported", NULL, NULL, "not supported here" },
	{ ESHUTDOWN, "Closed", NULL, NULL, "used after close(), or the daemon is stopping" },
	{ EBADMSG, "ProtocolError", NULL, NULL, "a malformed tensor header or message" },
	{ EINPROGRESS, "InDoubt", NULL, NULL,
	  "no answer came in time and the operation may still happen (a channel write: the "
	  "daemon holds the batch and may append it): do not assume it failed" },
};

PyObject *tpy_module_raise(int err, const char *msg)
{
	PyObject *type = error_base, *exc;

	if (!msg || !*msg)
		msg = tp_last_error();
	if (!msg || !*msg)
		msg = tp_strerror(err);
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].err == -err) {
			type = errors[i].type;
			break;
		}
	exc = PyObject_CallFunction(type, "is", -err, msg);
	if (exc) {
		PyErr_SetObject(type, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *tpy_module_closed(const char *what)
{
	char msg[128];

	snprintf(msg, sizeof(msg), "%s is closed", what);
	return tpy_module_raise(-ESHUTDOWN, msg);
}

void tpy_module_link(tpy_context *ctx, struct tpy_child *c)
{
	c->next = ctx->children.next;
	c->prev = &ctx->children;
	ctx->children.next->prev = c;
	ctx->children.next = c;
}

void tpy_module_unlink(struct tpy_child *c)
{
	if (!c->next)
		return;
	c->next->prev = c->prev;
	c->prev->next = c->next;
	c->next = c->prev = NULL;
}

static int errors_init(PyObject *m)
{
	PyObject *builtins[] = { PyExc_ConnectionResetError, PyExc_BrokenPipeError,
				 PyExc_FileNotFoundError, PyExc_ConnectionRefusedError,
				 PyExc_TimeoutError, PyExc_PermissionError,
				 PyExc_ConnectionAbortedError };
	const char *with_builtin[] = { "PeerDied", "PipeClosed", "NoListener", "NoDaemon",
				       "Timeout", "AccessDenied", "Aborted" };
	char qual[64];

	error_base = PyErr_NewExceptionWithDoc("tpipd.Error",
		"Base of tpipd's exceptions: an OSError whose errno is the library's code and whose "
		"strerror is the library's (or the daemon's) message.", PyExc_OSError, NULL);
	if (!error_base || PyModule_AddObjectRef(m, "Error", error_base) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
		PyObject *bases, *extra = NULL;

		for (size_t j = 0; j < i; j++)
			if (!strcmp(errors[j].name, errors[i].name))
				errors[i].type = errors[j].type;
		if (errors[i].type)
			continue;
		for (size_t j = 0; j < sizeof(builtins) / sizeof(builtins[0]); j++)
			if (!strcmp(with_builtin[j], errors[i].name))
				extra = builtins[j];
		if (!extra && (errors[i].err == EINVAL || errors[i].err == EBADMSG))
			extra = PyExc_ValueError;
		if (!extra && errors[i].err == EOPNOTSUPP)
			extra = PyExc_NotImplementedError;
		bases = extra ? PyTuple_Pack(2, error_base, extra) : PyTuple_Pack(1, error_base);
		if (!bases)
			return -1;
		snprintf(qual, sizeof(qual), "tpipd.%s", errors[i].name);
		errors[i].type = PyErr_NewExceptionWithDoc(qual, errors[i].doc, bases, NULL);
		Py_DECREF(bases);
		if (!errors[i].type || PyModule_AddObjectRef(m, errors[i].name, errors[i].type) < 0)
			return -1;
	}
	return 0;
}

/* ---- Context ---------------------------------------------------------------------------- */

static int context_init(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "socket_path", "name", "no_cma", "no_ring", "reply_timeout_ms",
				  NULL };
	const char *path = NULL, *name = NULL;
	int no_cma = 0, no_ring = 0, r;
	unsigned int reply_ms = 0;
	struct tp_context_options o = { .size = sizeof(o) };
	struct tp_context *ctx = NULL;

	if (self->ctx) {
		PyErr_SetString(PyExc_RuntimeError, "Context already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzppI:Context", kwlist, &path, &name, &no_cma,
					 &no_ring, &reply_ms))
		return -1;
	o.reply_timeout_ms = reply_ms;
	o.socket_path = path;
	o.name = name;
	o.flags = (no_cma ? TP_CONTEXT_NO_CMA : 0) | (no_ring ? TP_CONTEXT_NO_RING : 0);
	Py_BEGIN_ALLOW_THREADS
	r = tp_context_new(&o, &ctx);
	Py_END_ALLOW_THREADS
	if (r < 0) {
		tpy_module_raise(r, NULL);
		return -1;
	}
	self->ctx = ctx;
	self->closed = false;
	return 0;
}

static PyObject *context_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	tpy_context *self = (tpy_context *)type->tp_alloc(type, 0);

	if (self)
		self->children.next = self->children.prev = &self->children;
	return (PyObject *)self;
}

/* Frees the library context once closed and no shared buffer is left (they are its mappings). */
static void context_free_if_unused(tpy_context *self)
{
	struct tp_context *ctx = self->ctx;

	if (!ctx || !self->closed || self->n_buffers > 0)
		return;
	self->ctx = NULL;
	Py_BEGIN_ALLOW_THREADS
	tp_context_free(ctx);
	Py_END_ALLOW_THREADS
}

void tpy_buffer_released(tpy_context *self)
{
	self->n_buffers--;
	context_free_if_unused(self);
}

static PyObject *context_close(tpy_context *self, PyObject *unused)
{
	if (self->closed)
		Py_RETURN_NONE;
	self->closed = true;
	while (self->children.next != &self->children) {
		struct tpy_child *c = self->children.next;

		tpy_module_unlink(c);
		c->close(c);
	}
	context_free_if_unused(self);
	Py_RETURN_NONE;
}

static void context_dealloc(tpy_context *self)
{
	PyObject *r;

	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	r = context_close(self, NULL);

	Py_XDECREF(r);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *context_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *context_exit(tpy_context *self, PyObject *args)
{
	return context_close(self, NULL);
}

static PyObject *context_get_name(tpy_context *self, void *unused)
{
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	return PyUnicode_FromString(tp_context_name(self->ctx));
}

static PyObject *context_get_transport(tpy_context *self, void *unused)
{
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	return PyUnicode_FromString(tp_context_transport(self->ctx));
}

static PyObject *context_get_closed(tpy_context *self, void *unused)
{
	return PyBool_FromLong(self->closed);
}

static PyObject *context_listen(tpy_context *self, PyObject *args, PyObject *kw)
{
	return tpy_listener_new(self, args, kw);
}

static PyObject *context_connect(tpy_context *self, PyObject *args, PyObject *kw)
{
	return tpy_pipe_connect(self, args, kw);
}

static PyObject *context_alloc_buffer(tpy_context *self, PyObject *args)
{
	return tpy_buffer_alloc(self, args);
}

static PyObject *context_join_group(tpy_context *self, PyObject *args, PyObject *kw)
{
	return tpy_group_join(self, args, kw);
}

static PyObject *context_open_channel(tpy_context *self, PyObject *args, PyObject *kw)
{
	return tpy_chan_open(self, args, kw);
}

static PyObject *context_unlink_channel(tpy_context *self, PyObject *args)
{
	return tpy_chan_unlink(self, args);
}

static PyObject *context_open_queue(tpy_context *self, PyObject *args, PyObject *kw)
{
	return tpy_wq_open(self, args, kw);
}

/* Context.cuda_release(ptr): tp_cuda_release() of the CUDA allocation containing @ptr. */
static PyObject *context_cuda_release(tpy_context *self, PyObject *arg)
{
	void *ptr = PyLong_AsVoidPtr(arg);
	int r;

	if (!ptr && PyErr_Occurred())
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	Py_BEGIN_ALLOW_THREADS
	r = tp_cuda_release(self->ctx, ptr);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyMethodDef context_methods[] = {
	{ "close", (PyCFunction)context_close, METH_NOARGS,
	  "close()\n--\n\nClose every pipe, listener and group of this context (their pending "
	  "operations fail with Cancelled) and disconnect from the daemon. Shared buffers stay "
	  "mapped until the last array using them is gone; the session ends then." },
	{ "__enter__", context_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)context_exit, METH_VARARGS, NULL },
	{ "listen", (PyCFunction)(void (*)(void))context_listen, METH_VARARGS | METH_KEYWORDS,
	  "listen(name, access=0, gid=-1) -> Listener\n--\n\nRegister listener @name." },
	{ "connect", (PyCFunction)(void (*)(void))context_connect, METH_VARARGS | METH_KEYWORDS,
	  "connect(address, wait_ms=0, expect_uid=-1, expect_peer=None) -> Pipe\n--\n\nOpen a "
	  "pipe; with wait_ms the daemon waits that long for the listener to appear; with "
	  "expect_peer ('any-peer' or a list of peer identities; tpip:// only) only over a peer "
	  "link authenticated as a daemon it allows (TP_CONNECT_EXPECT_PEER)." },
	{ "cuda_release", (PyCFunction)context_cuda_release, METH_O,
	  "cuda_release(ptr)\n--\n\nTell the daemon to drop its mapping of the CUDA allocation "
	  "containing device pointer @ptr (tp_cuda_release()); the memory must still be "
	  "allocated. InvalidArgument: not CUDA memory; NotSupported: no CUDA driver." },
	{ "alloc_buffer", (PyCFunction)context_alloc_buffer, METH_VARARGS,
	  "alloc_buffer(size) -> SharedBuffer\n--\n\nShared memory registered with the daemon; "
	  "it stays mapped while the SharedBuffer (or a view of it) is alive." },
	{ "join_group", (PyCFunction)(void (*)(void))context_join_group,
	  METH_VARARGS | METH_KEYWORDS,
	  "join_group(name, nranks, rank=-1, bootstrap=0, join_timeout_ms=0, op_timeout_ms=0, "
	  "coordinator=None, remote=None) -> Group\n--\n\nJoin a group (blocks until every member "
	  "joined); remote: None, 'none', 'any-peer' or a list of peer identities." },
	{ "open_channel", (PyCFunction)(void (*)(void))context_open_channel,
	  METH_VARARGS | METH_KEYWORDS,
	  "open_channel(name, flags=0, access=0, gid=-1, capacity_items=0, capacity_bytes=0, "
	  "owner_uid=-1) -> Channel\n--\n\nOpen (flags TP_CHAN_*: create) a named channel." },
	{ "unlink_channel", (PyCFunction)context_unlink_channel, METH_VARARGS,
	  "unlink_channel(name, owner_uid=-1)\n--\n\nRemove a persistent channel's name." },
	{ "open_queue", (PyCFunction)(void (*)(void))context_open_queue,
	  METH_VARARGS | METH_KEYWORDS,
	  "open_queue(name, flags=0, access=0, gid=-1, owner_uid=-1) -> WorkQueue\n--\n\n"
	  "Open (flags TP_WQ_*: create and own) a named work queue." },
	{ 0 }
};

static PyGetSetDef context_getset[] = {
	{ "name", (getter)context_get_name, NULL, "the context's name", NULL },
	{ "transport", (getter)context_get_transport, NULL, "'ring' or 'unix'", NULL },
	{ "closed", (getter)context_get_closed, NULL, "whether close() ran", NULL },
	{ 0 }
};

PyTypeObject tpy_context_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Context",
	.tp_basicsize = sizeof(tpy_context),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "Context(socket_path=None, name=None, no_cma=False, no_ring=False, "
		  "reply_timeout_ms=0)\n--\n\n"
		  "One session with the local tpipd (libtpclient's tp_context).",
	.tp_new = context_new,
	.tp_init = (initproc)context_init,
	.tp_dealloc = (destructor)context_dealloc,
	.tp_weaklistoffset = offsetof(tpy_context, weakrefs),
	.tp_methods = context_methods,
	.tp_getset = context_getset,
};

static PyObject *module_strerror(PyObject *m, PyObject *arg)
{
	long e = PyLong_AsLong(arg);

	if (e == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(tp_strerror((int)(e > 0 ? -e : e)));
}

static PyMethodDef module_methods[] = {
	{ "strerror", module_strerror, METH_O, "strerror(errno) -> str: libtpclient's text" },
	{ "dlpack_cuda", tpy_dlpack_cuda, METH_O,
	  "dlpack_cuda(obj) -> (capsule, (ptr, nbytes, device, stream), (dl_code, bits), "
	  "shape)\n--\n\nThe CUDA memory of obj.__dlpack__(stream=1), held by the capsule." },
	{ "dlpack_cuda_view", tpy_dlpack_cuda_view, METH_VARARGS,
	  "dlpack_cuda_view(ptr, device, dtype_code, shape, owner=None) -> DLView\n--\n\nA "
	  "DLPack exporter over CUDA memory (no copy) that keeps @owner." },
	{ "dlpack_view", tpy_dlpack_view, METH_VARARGS,
	  "dlpack_view(buffer, offset, dtype_code, shape) -> DLView\n--\n\nA DLPack exporter "
	  "over a writable buffer (no copy)." },
	{ 0 }
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "_tpipd",
	.m_doc = "The C half of the tpipd package (import tpipd instead).",
	.m_size = -1,
	.m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__tpipd(void);
PyMODINIT_FUNC PyInit__tpipd(void)
{
	PyObject *m = PyModule_Create(&module_def);

	if (!m)
		return NULL;
	if (errors_init(m) < 0 || PyType_Ready(&tpy_context_type) < 0 ||
	    PyModule_AddObjectRef(m, "Context", (PyObject *)&tpy_context_type) < 0 ||
	    tpy_pipe_add_types(m) < 0 || tpy_listener_add_types(m) < 0 || tpy_buffer_add_types(m) < 0 ||
	    tpy_group_add_types(m) < 0 || tpy_chan_add_types(m) < 0 ||
	    tpy_set_add_types(m) < 0 || tpy_wq_add_types(m) < 0 || tpy_dlpack_add_types(m) < 0 ||
	    PyModule_AddIntConstant(m, "API_VERSION_MINOR", TP_API_VERSION_MINOR) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
