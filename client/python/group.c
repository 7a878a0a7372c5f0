/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd groups: the Group type (tp_group_join() and the collectives, blocking with the GIL
 * released, or started asynchronously) and the CollReq type (an asynchronous collective that
 * holds its buffers until it is waited for). Buffers are CPU memory or CUDA ranges (the group's
 * collective options follow the buffers of each call: tp_group_set_coll_options()). Dtype and
 * op names, tensors and torch.distributed's shape are the Python package's (tpipd/_group.py);
 * here counts come from buffer lengths.
 */
#include <errno.h>
#include <unistd.h>
#include "tpy.h"

/* Where a collective's buffers are: the CPU, or a CUDA device and the stream to order on. */
struct coll_where {
	struct tp_device dev;
	void *stream;
};

typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	tpy_context *ctx;
	struct tp_group *g;
	int busy;		 /* threads inside a blocking call on @g */
	struct tpy_child reqs;	 /* CollReq objects not yet waited for */
	struct coll_where where; /* @g's collective options now (tp_group_set_coll_options) */
} tpy_group;

typedef struct {
	PyObject_HEAD
	struct tpy_child child;
	tpy_group *group;
	struct tp_coll_req *req;
	Py_buffer views[2];
} tpy_collreq;

enum coll_kind { COLL_ALLREDUCE, COLL_BROADCAST, COLL_BARRIER, COLL_ALLGATHER, COLL_SCATTER };

/* Ends @r's collective (blocking without the GIL), frees its buffers. Return: its result. */
static int collreq_finish(tpy_collreq *r)
{
	struct tp_coll_req *req = r->req;
	tpy_group *g = r->group;
	int ret = 0;

	tpy_module_unlink(&r->child);
	if (req) {
		r->req = NULL;
		g->busy++;
		Py_BEGIN_ALLOW_THREADS
		ret = tp_coll_wait(req);
		Py_END_ALLOW_THREADS
		g->busy--;
	}
	for (int i = 0; i < 2; i++)
		if (r->views[i].obj)
			PyBuffer_Release(&r->views[i]);
	return ret;
}

static void collreq_on_leave(struct tpy_child *c)
{
	collreq_finish(TPY_CONTAINER(c, tpy_collreq, child));
}

static void group_close_now(tpy_group *self)
{
	struct tp_group *g = self->g;

	tpy_module_unlink(&self->child);
	if (!g)
		return;
	if (self->busy)
		tp_group_abort(g); /* a collective on another thread: make it return */
	while (self->busy) {
		Py_BEGIN_ALLOW_THREADS
		usleep(1000);
		Py_END_ALLOW_THREADS
	}
	while (self->reqs.next != &self->reqs)
		self->reqs.next->close(self->reqs.next);
	self->g = NULL;
	Py_BEGIN_ALLOW_THREADS
	tp_group_leave(g);
	Py_END_ALLOW_THREADS
}

static void group_on_context_close(struct tpy_child *c)
{
	group_close_now(TPY_CONTAINER(c, tpy_group, child));
}

int tpy_remote_parse(PyObject *v, const char *arg, bool none_ok, struct tpy_remote *ret)
{
	const char *what = none_ok ? "None, 'none', 'any-peer' or a list of peer identities" :
				     "None, 'any-peer' or a list of peer identities";
	Py_ssize_t n;

	ret->mode = TP_REMOTE_NONE;
	ret->n = 0;
	ret->seq = NULL;
	if (v == Py_None)
		return 0;
	if (PyUnicode_Check(v)) {
		const char *s = PyUnicode_AsUTF8(v);

		if (!s)
			return -1;
		if (none_ok && strcmp(s, "none") == 0)
			return 0;
		if (strcmp(s, "any-peer") == 0) {
			ret->mode = TP_REMOTE_ANY_PEER;
			return 0;
		}
		PyErr_Format(PyExc_ValueError, "%s must be %s", arg, what);
		return -1;
	}
	ret->seq = PySequence_Fast(v, "a remote access is a str or a list of peer identities");
	if (!ret->seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(ret->seq);
	if (n < 1 || n > TPY_REMOTE_PEERS_MAX) {
		tpy_remote_done(ret);
		PyErr_Format(PyExc_ValueError, "%s names 1..%d peer identities", arg,
			     TPY_REMOTE_PEERS_MAX);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(ret->seq, i);

		ret->peers[i] = PyUnicode_Check(it) ? PyUnicode_AsUTF8(it) : NULL;
		if (!ret->peers[i]) {
			tpy_remote_done(ret);
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "a peer identity is a str");
			return -1;
		}
	}
	ret->mode = TP_REMOTE_PEERS;
	ret->n = (size_t)n;
	return 0;
}

void tpy_remote_done(struct tpy_remote *r)
{
	Py_CLEAR(r->seq);
	r->n = 0;
}

PyObject *tpy_group_join(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "nranks", "rank", "bootstrap", "join_timeout_ms",
				  "op_timeout_ms", "coordinator", "remote", NULL };
	struct tp_group_options o = { .size = sizeof(o), .rank = -1 };
	const char *name, *coord = NULL;
	PyObject *remote = Py_None;
	struct tpy_remote rm;
	int boot = 0;
	struct tp_group *g = NULL;
	tpy_group *ret;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "sI|iiiizO:join_group", kwlist, &name,
					 &o.nranks, &o.rank, &boot, &o.join_timeout_ms,
					 &o.op_timeout_ms, &coord, &remote))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	if (tpy_remote_parse(remote, "remote", true, &rm) < 0)
		return NULL;
	o.remote = rm.mode;
	o.remote_peers = rm.n ? rm.peers : NULL;
	o.n_remote_peers = rm.n;
	o.bootstrap = (enum tp_group_bootstrap)boot;
	o.coordinator = coord;
	Py_BEGIN_ALLOW_THREADS
	r = tp_group_join(self->ctx, name, &o, &g);
	Py_END_ALLOW_THREADS
	tpy_remote_done(&rm);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	ret = PyObject_New(tpy_group, &tpy_group_type);
	if (!ret) {
		tp_group_leave(g);
		return NULL;
	}
	ret->ctx = (tpy_context *)Py_NewRef(self);
	ret->g = g;
	ret->busy = 0;
	ret->where = (struct coll_where){ .dev = { TP_DEVICE_CPU, 0 } };
	ret->reqs.next = ret->reqs.prev = &ret->reqs;
	ret->child.close = group_on_context_close;
	tpy_module_link(self, &ret->child);
	return (PyObject *)ret;
}

struct coll_args {
	enum coll_kind kind;
	Py_buffer *send, *recv; /* send may be NULL (broadcast, barrier) */
	size_t count;
	enum tp_dtype dtype;
	enum tp_reduce_op op;
	int root;
	bool has_where; /* not for a barrier */
	struct coll_where where;
};

/* Makes @w the options of @self's collectives from now on, if they are not already. Return:
 * 0, or -1 with an exception set (NotSupported: no CUDA driver). */
static int group_where(tpy_group *self, const struct coll_where *w)
{
	struct tp_coll_options o = { .size = sizeof(o), .device = w->dev,
				     .cuda_stream = w->stream };
	int r;

	if (self->where.dev.type == w->dev.type && self->where.dev.index == w->dev.index &&
	    self->where.stream == w->stream)
		return 0;
	r = tp_group_set_coll_options(self->g, &o);
	if (r < 0) {
		tpy_module_raise(r, NULL);
		return -1;
	}
	self->where = *w;
	return 0;
}

/* Element count of @a from the buffer lengths, checked against the group size. */
static int coll_count(tpy_group *self, struct coll_args *a)
{
	size_t es = tp_dtype_size(a->dtype), n = (size_t)tp_group_size(self->g);
	size_t rl = a->recv ? (size_t)a->recv->len : 0, sl = a->send ? (size_t)a->send->len : 0;

	if (a->kind != COLL_BARRIER && es == 0) {
		PyErr_Format(PyExc_ValueError, "unknown dtype code %d", (int)a->dtype);
		return -1;
	}
	if (a->kind == COLL_BARRIER)
		return 0;
	if (rl % es || sl % es) {
		PyErr_SetString(PyExc_ValueError, "buffer length is not a multiple of the dtype");
		return -1;
	}
	if ((a->kind == COLL_ALLREDUCE && sl != rl) || (a->kind == COLL_ALLGATHER && rl != n * sl) ||
	    (a->kind == COLL_SCATTER && sl != n * rl)) {
		PyErr_Format(PyExc_ValueError, "buffer sizes do not match (send %zu bytes, receive "
			     "%zu bytes, group of %zu)", sl, rl, n);
		return -1;
	}
	a->count = (a->kind == COLL_ALLGATHER ? sl : rl) / es;
	return 0;
}

static int coll_start(tpy_group *self, const struct coll_args *a, struct tp_coll_req **ret)
{
	const void *s = a->send ? a->send->buf : NULL;
	void *d = a->recv ? a->recv->buf : NULL;

	switch (a->kind) {
	case COLL_ALLREDUCE:
		return tp_allreduce_start(self->g, s, d, a->count, a->dtype, a->op, ret);
	case COLL_BROADCAST:
		return tp_broadcast_start(self->g, d, a->count, a->dtype, a->root, ret);
	case COLL_BARRIER:
		return tp_barrier_start(self->g, ret);
	case COLL_ALLGATHER:
		return tp_allgather_start(self->g, s, d, a->count, a->dtype, ret);
	default:
		return tp_reduce_scatter_start(self->g, s, d, a->count, a->dtype, a->op, ret);
	}
}

/* The blocking form of @a, without the GIL (no Python object is touched). */
static int coll_blocking(struct tp_group *g, const struct coll_args *a)
{
	const void *s = a->send ? a->send->buf : NULL;
	void *d = a->recv ? a->recv->buf : NULL;

	switch (a->kind) {
	case COLL_ALLREDUCE:
		return tp_allreduce(g, s, d, a->count, a->dtype, a->op);
	case COLL_BROADCAST:
		return tp_broadcast(g, d, a->count, a->dtype, a->root);
	case COLL_BARRIER:
		return tp_barrier(g);
	case COLL_ALLGATHER:
		return tp_allgather(g, s, d, a->count, a->dtype);
	default:
		return tp_reduce_scatter(g, s, d, a->count, a->dtype, a->op);
	}
}

/* Runs @a (blocking) or starts it (@async: returns a CollReq that takes the views). */
static PyObject *group_coll(tpy_group *self, struct coll_args *a, Py_buffer v[2], bool async)
{
	struct tp_coll_req *req = NULL;
	tpy_collreq *cr;
	int r;

	if (!self->g) {
		tpy_module_closed("Group");
		goto fail;
	}
	if (coll_count(self, a) < 0 || (a->has_where && group_where(self, &a->where) < 0))
		goto fail;
	if (!async) {
		struct tp_group *g = self->g;

		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		r = coll_blocking(g, a);
		Py_END_ALLOW_THREADS
		self->busy--;
		for (int i = 0; i < 2; i++)
			if (v[i].obj)
				PyBuffer_Release(&v[i]);
		if (r < 0)
			return tpy_module_raise(r, NULL);
		Py_RETURN_NONE;
	}
	cr = PyObject_New(tpy_collreq, &tpy_collreq_type);
	if (!cr)
		goto fail;
	cr->group = (tpy_group *)Py_NewRef(self);
	cr->req = NULL;
	cr->views[0] = v[0];
	cr->views[1] = v[1];
	cr->child.next = cr->child.prev = NULL;
	r = coll_start(self, a, &req);
	if (r < 0) {
		Py_DECREF(cr); /* releases the views */
		return tpy_module_raise(r, NULL);
	}
	cr->req = req;
	cr->child.close = collreq_on_leave;
	cr->child.next = self->reqs.next;
	cr->child.prev = &self->reqs;
	self->reqs.next->prev = &cr->child;
	self->reqs.next = &cr->child;
	return (PyObject *)cr;
fail:
	for (int i = 0; i < 2; i++)
		if (v[i].obj)
			PyBuffer_Release(&v[i]);
	return NULL;
}

/*
 * The buffer of @o into @v and where it is into @ret: a CPU buffer (buffer protocol or DLPack),
 * or a CUDA range tuple (ptr, nbytes, device, stream[, keep-alive]) from the package, which
 * @v then holds (view->obj: the tuple, released as any view). Return: 0, or -1 with an
 * exception set and nothing held.
 */
static int group_view(PyObject *o, Py_buffer *v, bool writable, const char *what,
		      struct coll_where *ret)
{
	struct tp_tensor t = { 0 };
	size_t len;

	*ret = (struct coll_where){ .dev = { TP_DEVICE_CPU, 0 } };
	if (!PyTuple_Check(o))
		return tpy_buffer_get(o, v, writable, what);
	if (tpy_buffer_tensor(o, v, writable, &t, NULL, &len) < 0)
		return -1;
	if (len > PY_SSIZE_T_MAX) {
		PyErr_Format(PyExc_ValueError, "%s: %zu bytes", what, len);
		return -1;
	}
	memset(v, 0, sizeof(*v));
	v->buf = t.data;
	v->len = (Py_ssize_t)len;
	v->obj = Py_NewRef(o);
	ret->dev = t.device;
	ret->stream = t.cuda_stream;
	return 0;
}

/* The buffers of @so and @ro into @v and @a: an in-place call (@so is @ro) acquires one, the
 * recv view, which serves as both (one __dlpack__ or buffer export per call, not two); both
 * must be on one device. Return: 0, or -1 with an exception set and nothing held. */
static int group_views(PyObject *so, PyObject *ro, Py_buffer v[2], struct coll_args *a)
{
	struct coll_where sw;

	if (group_view(ro, &v[1], true, "recv", &a->where) < 0)
		return -1;
	a->has_where = true;
	a->recv = &v[1];
	a->send = &v[1];
	if (so == ro)
		return 0;
	if (group_view(so, &v[0], false, "send", &sw) < 0) {
		PyBuffer_Release(&v[1]);
		return -1;
	}
	a->send = &v[0];
	if (sw.dev.type != a->where.dev.type || sw.dev.index != a->where.dev.index) {
		PyErr_SetString(PyExc_ValueError, "send and receive buffers are on different "
				"devices");
		PyBuffer_Release(&v[0]);
		PyBuffer_Release(&v[1]);
		return -1;
	}
	return 0;
}

/* all-reduce and reduce-scatter: (send, recv, dtype, op[, async_op]) for @kind; @fmt names the
 * call in argument errors. */
static PyObject *group_reducing(tpy_group *self, PyObject *args, PyObject *kw,
				enum coll_kind kind, const char *fmt)
{
	static char *kwlist[] = { "send", "recv", "dtype", "op", "async_op", NULL };
	PyObject *so, *ro;
	Py_buffer v[2] = { 0 };
	struct coll_args a = { .kind = kind };
	int dt, op, async = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &so, &ro, &dt, &op, &async))
		return NULL;
	if (group_views(so, ro, v, &a) < 0)
		return NULL;
	a.dtype = (enum tp_dtype)dt;
	a.op = (enum tp_reduce_op)op;
	return group_coll(self, &a, v, async);
}

static PyObject *group_allreduce(tpy_group *self, PyObject *args, PyObject *kw)
{
	return group_reducing(self, args, kw, COLL_ALLREDUCE, "OOii|p:allreduce");
}

static PyObject *group_reduce_scatter(tpy_group *self, PyObject *args, PyObject *kw)
{
	return group_reducing(self, args, kw, COLL_SCATTER, "OOii|p:reduce_scatter");
}

static PyObject *group_allgather(tpy_group *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "send", "recv", "dtype", "async_op", NULL };
	PyObject *so, *ro;
	Py_buffer v[2] = { 0 };
	struct coll_args a = { .kind = COLL_ALLGATHER };
	int dt, async = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOi|p:allgather", kwlist, &so, &ro, &dt,
					 &async))
		return NULL;
	if (group_views(so, ro, v, &a) < 0)
		return NULL;
	a.dtype = (enum tp_dtype)dt;
	return group_coll(self, &a, v, async);
}

static PyObject *group_broadcast(tpy_group *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "buf", "dtype", "root", "async_op", NULL };
	PyObject *bo;
	Py_buffer v[2] = { 0 };
	struct coll_args a = { .kind = COLL_BROADCAST };
	int dt, root, async = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii|p:broadcast", kwlist, &bo, &dt, &root,
					 &async))
		return NULL;
	if (group_view(bo, &v[1], true, "buf", &a.where) < 0)
		return NULL;
	a.has_where = true;
	a.recv = &v[1];
	a.dtype = (enum tp_dtype)dt;
	a.root = root;
	return group_coll(self, &a, v, async);
}

static PyObject *group_barrier(tpy_group *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "async_op", NULL };
	Py_buffer v[2] = { 0 };
	struct coll_args a = { .kind = COLL_BARRIER };
	int async = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:barrier", kwlist, &async))
		return NULL;
	return group_coll(self, &a, v, async);
}

static PyObject *group_leave(tpy_group *self, PyObject *unused)
{
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "a collective of this group is running on "
				"another thread (abort() first)");
		return NULL;
	}
	group_close_now(self);
	Py_RETURN_NONE;
}

static PyObject *group_abort(tpy_group *self, PyObject *unused)
{
	if (self->g)
		tp_group_abort(self->g);
	Py_RETURN_NONE;
}

static void group_dealloc(tpy_group *self)
{
	group_close_now(self);
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

static PyObject *group_enter(PyObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *group_exit(tpy_group *self, PyObject *args)
{
	return group_leave(self, NULL);
}

static PyObject *group_get(tpy_group *self, void *which)
{
	int (*fn)(const struct tp_group *) = (int (*)(const struct tp_group *))which;

	if (!self->g)
		return tpy_module_closed("Group");
	return PyLong_FromLong(fn(self->g));
}

static PyMethodDef group_methods[] = {
	{ "allreduce", (PyCFunction)(void (*)(void))group_allreduce, METH_VARARGS | METH_KEYWORDS,
	  "allreduce(send, recv, dtype, op, async_op=False)" },
	{ "broadcast", (PyCFunction)(void (*)(void))group_broadcast, METH_VARARGS | METH_KEYWORDS,
	  "broadcast(buf, dtype, root, async_op=False)" },
	{ "barrier", (PyCFunction)(void (*)(void))group_barrier, METH_VARARGS | METH_KEYWORDS,
	  "barrier(async_op=False)" },
	{ "allgather", (PyCFunction)(void (*)(void))group_allgather, METH_VARARGS | METH_KEYWORDS,
	  "allgather(send, recv, dtype, async_op=False)" },
	{ "reduce_scatter", (PyCFunction)(void (*)(void))group_reduce_scatter,
	  METH_VARARGS | METH_KEYWORDS, "reduce_scatter(send, recv, dtype, op, async_op=False)" },
	{ "leave", (PyCFunction)group_leave, METH_NOARGS,
	  "leave()\n--\n\nWait for this member's pending collectives, then leave the group." },
	{ "abort", (PyCFunction)group_abort, METH_NOARGS,
	  "abort()\n--\n\nFail the group for every member (PipeClosed naming this rank)." },
	{ "__enter__", group_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)group_exit, METH_VARARGS, NULL },
	{ 0 }
};

static PyGetSetDef group_getset[] = {
	{ "rank", (getter)group_get, NULL, "this member's rank", (void *)tp_group_rank },
	{ "size", (getter)group_get, NULL, "members", (void *)tp_group_size },
	{ "local_rank", (getter)group_get, NULL, "rank on this host", (void *)tp_group_local_rank },
	{ "local_size", (getter)group_get, NULL, "members on this host",
	  (void *)tp_group_local_size },
	{ 0 }
};

PyTypeObject tpy_group_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Group",
	.tp_basicsize = sizeof(tpy_group),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A group of processes running collectives (Context.join_group()).",
	.tp_dealloc = (destructor)group_dealloc,
	.tp_methods = group_methods,
	.tp_getset = group_getset,
};

/* ---- CollReq ----------------------------------------------------------------------------- */

static PyObject *collreq_wait(tpy_collreq *self, PyObject *unused)
{
	int r = collreq_finish(self);

	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *collreq_test(tpy_collreq *self, PyObject *unused)
{
	return PyBool_FromLong(!self->req || tp_coll_test(self->req) == 1);
}

static void collreq_dealloc(tpy_collreq *self)
{
	collreq_finish(self); /* its buffers are ours until it ends */
	Py_XDECREF(self->group);
	PyObject_Free(self);
}

static PyMethodDef collreq_methods[] = {
	{ "wait", (PyCFunction)collreq_wait, METH_NOARGS,
	  "wait()\n--\n\nWait for the collective (GIL released); raises its error. Its buffers "
	  "are borrowed until then." },
	{ "is_completed", (PyCFunction)collreq_test, METH_NOARGS,
	  "is_completed() -> bool\n--\n\nWhether wait() would return at once." },
	{ 0 }
};

PyTypeObject tpy_collreq_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.CollReq",
	.tp_basicsize = sizeof(tpy_collreq),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An asynchronous collective: wait() for it.",
	.tp_dealloc = (destructor)collreq_dealloc,
	.tp_methods = collreq_methods,
};

int tpy_group_add_types(PyObject *m)
{
	if (PyType_Ready(&tpy_group_type) < 0 || PyType_Ready(&tpy_collreq_type) < 0)
		return -1;
	if (PyModule_AddObjectRef(m, "Group", (PyObject *)&tpy_group_type) < 0 ||
	    PyModule_AddObjectRef(m, "CollReq", (PyObject *)&tpy_collreq_type) < 0)
		return -1;
	return 0;
}
