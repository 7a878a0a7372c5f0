/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd work queues: the WorkQueue type over libtpclient's daemon-hosted work queues (tp_wq_*,
 * docs/queues.md) and the NothingOutstanding exception. tp_wq_take(), tp_wq_answer() and
 * tp_wq_drain() block in the calling thread, so their waits are cut into slices of at most
 * TPY_SLICE_MS run without the GIL (gate.c), as chan.c does: between slices the thread checks
 * for signals and for a release from another thread. The daemon answers each timed request, so
 * a slice that ends unanswered has taken nothing. tp_wq_submit() and tp_wq_reply() never wait
 * for room (a full queue refuses at once) and run in one call without the GIL. Items come back
 * as Blocks (dlpack.c) that own the library's copy, so a typed item becomes a tensor without a
 * further copy. Questions and answers as messages (tp_wq_submit_msg(), tp_wq_reply_msg(),
 * tp_wq_take_descriptor(), tp_wq_answer_descriptor(), tp_wq_read_msg()) reuse the pipe's message
 * parts, read slots and Descriptor type (pipe.c), as channels' message items do (chan.c); their
 * tensors' headers and allocation are the package's. Item types and iteration are the
 * package's (tpipd/_wq.py).
 */
#include <errno.h>
#include <stdlib.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	struct tpy_handle h; /* the library's struct tp_wq (gate.c) */
	bool owner;
	/* Descriptors dropped unread while the handle was being released or after: the release
	 * orphans them in the library (a taken question goes back to the queue, a held answer
	 * goes with the owner's queue); freed here at dealloc, as every Descriptor keeps its
	 * WorkQueue. */
	struct tp_descriptor **later;
	size_t n_later;
} tpy_wq;

static PyObject *idle_type;

/* ---- lifetime ------------------------------------------------------------------------------ */

static struct tp_wq *wq_lib(tpy_wq *self)
{
	return self->h.lib;
}

static int wq_lib_release(void *lib)
{
	return tp_wq_release(lib);
}

/* Enters a call: refused after a release. Return: 0, or -1 with Closed raised. */
static int wq_enter(tpy_wq *self)
{
	return tpy_handle_enter(&self->h);
}

PyObject *tpy_wq_open(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "flags", "access", "gid", "owner_uid", NULL };
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char *name;
	unsigned int flags = 0;
	int access = 0;
	long long gid = -1, owner = -1;
	struct tp_wq *q;
	tpy_wq *ret;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|IiLL:open_queue", kwlist, &name, &flags,
					 &access, &gid, &owner))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	o.flags = flags;
	o.access = (enum tp_access)access;
	o.gid = gid < 0 ? 0 : (gid_t)gid;
	o.owner_uid = owner < 0 ? -1 : (long)owner;
	Py_BEGIN_ALLOW_THREADS
	r = tp_wq_open(self->ctx, name, &o, &q);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	ret = PyObject_New(tpy_wq, &tpy_wq_type);
	if (!ret) {
		tp_wq_release(q);
		return NULL;
	}
	ret->owner = tp_wq_is_owner(q);
	ret->later = NULL;
	ret->n_later = 0;
	tpy_handle_init(&ret->h, self, q, wq_lib_release, "WorkQueue");
	return (PyObject *)ret;
}

/* ---- calls ------------------------------------------------------------------------------- */

/* Raises the exception of a failed call @r (after a sliced wait of @timeout_ms). */
static PyObject *wq_raise(tpy_wq *self, int r, int timeout_ms, const char *empty)
{
	char msg[160];

	if (r == -EAGAIN || (r == -ETIMEDOUT && timeout_ms == 0))
		return tpy_module_raise(-ETIMEDOUT, empty);
	if (r == -ETIMEDOUT && self->h.gate.closing)
		return tpy_module_closed("WorkQueue");
	if (r == -ETIMEDOUT) {
		snprintf(msg, sizeof(msg), "timed out after %d ms", timeout_ms);
		return tpy_module_raise(r, msg);
	}
	if (r == -ENOMSG) {
		const char *m = tp_last_error();
		PyObject *exc = PyObject_CallFunction(idle_type, "is", ENOMSG, m && *m ? m :
			"no question is outstanding: every one was answered and received");

		if (exc) {
			PyErr_SetObject(idle_type, exc);
			Py_DECREF(exc);
		}
		return NULL;
	}
	return tpy_module_raise(r, NULL);
}

/* The outcome @r of a SUBMIT or a REPLY (@reply). Return: 0, or -1 with an exception set. */
static int wq_sent(tpy_wq *self, int r, bool reply)
{
	if (r == -ETIMEDOUT) {
		/* The call itself never waits: no answer within the context's reply timeout, and
		 * the daemon may still act on it (libtpclient returns -ETIMEDOUT for both). */
		tpy_module_raise(-EINPROGRESS, reply ? "no answer from the daemon in time: the "
				 "reply may be delivered yet" : "no answer from the daemon in time: "
				 "the question may be queued yet (its id is unknown)");
		return -1;
	}
	if (r < 0) {
		wq_raise(self, r, -1, NULL);
		return -1;
	}
	return 0;
}

/* SUBMIT (@id NULL) or REPLY to @id: one bytes-like @item, in one call (never waits). */
static int wq_send(tpy_wq *self, PyObject *item, const uint64_t *id, uint64_t *ret_id)
{
	Py_buffer view;
	int r;

	if (tpy_buffer_get(item, &view, false, "item") < 0)
		return -1;
	if (wq_enter(self) < 0) {
		PyBuffer_Release(&view);
		return -1;
	}
	Py_BEGIN_ALLOW_THREADS
	if (id)
		r = tp_wq_reply(wq_lib(self), *id, view.buf, (size_t)view.len);
	else
		r = tp_wq_submit(wq_lib(self), view.buf, (size_t)view.len, ret_id);
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	PyBuffer_Release(&view);
	return wq_sent(self, r, id != NULL);
}

/* SUBMIT (@id NULL) or REPLY to @id: the message of @meta, @pay and @ten (the pipe's write
 * arguments, borrowed), in one call (never waits). */
static int wq_send_msg(tpy_wq *self, const Py_buffer *meta, PyObject *pay, PyObject *ten,
		       const uint64_t *id, uint64_t *ret_id)
{
	struct tp_message m;
	void *parts = tpy_pipe_message_new(meta, pay, ten, &m);
	int r;

	if (!parts)
		return -1;
	if (wq_enter(self) < 0) {
		tpy_pipe_message_free(parts);
		return -1;
	}
	Py_BEGIN_ALLOW_THREADS
	if (id)
		r = tp_wq_reply_msg(wq_lib(self), *id, &m);
	else
		r = tp_wq_submit_msg(wq_lib(self), &m, ret_id);
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	tpy_pipe_message_free(parts);
	return wq_sent(self, r, id != NULL);
}

static PyObject *wq_submit(tpy_wq *self, PyObject *item)
{
	uint64_t id = 0;

	if (wq_send(self, item, NULL, &id) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(id);
}

static PyObject *wq_reply(tpy_wq *self, PyObject *args)
{
	unsigned long long id;
	PyObject *item;
	uint64_t qid;

	if (!PyArg_ParseTuple(args, "KO:reply", &id, &item))
		return NULL;
	qid = id;
	if (wq_send(self, item, &qid, NULL) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *wq_submit_msg(tpy_wq *self, PyObject *args)
{
	PyObject *pay, *ten, *ret = NULL;
	Py_buffer meta;
	uint64_t id = 0;

	if (!PyArg_ParseTuple(args, "y*OO:submit_msg", &meta, &pay, &ten))
		return NULL;
	if (wq_send_msg(self, &meta, pay, ten, NULL, &id) == 0)
		ret = PyLong_FromUnsignedLongLong(id);
	PyBuffer_Release(&meta);
	return ret;
}

static PyObject *wq_reply_msg(tpy_wq *self, PyObject *args)
{
	unsigned long long id;
	PyObject *pay, *ten, *ret = NULL;
	Py_buffer meta;
	uint64_t qid;

	if (!PyArg_ParseTuple(args, "Ky*OO:reply_msg", &id, &meta, &pay, &ten))
		return NULL;
	qid = id;
	if (wq_send_msg(self, &meta, pay, ten, &qid, NULL) == 0)
		ret = Py_NewRef(Py_None);
	PyBuffer_Release(&meta);
	return ret;
}

/* A Descriptor of @owner dropped unread (tp_wq_descriptor_free(): a held answer leaves the
 * queue, a question stays taken); once the handle's release began, kept for dealloc. */
static void wq_desc_drop(PyObject *owner, struct tp_descriptor *d)
{
	tpy_wq *self = (tpy_wq *)owner;
	struct tp_descriptor **l;
	PyObject *type, *val, *tb;

	PyErr_Fetch(&type, &val, &tb); /* a dealloc may run while an exception is set */
	if (wq_enter(self) == 0) {
		Py_BEGIN_ALLOW_THREADS
		tp_wq_descriptor_free(d);
		Py_END_ALLOW_THREADS
		tpy_gate_leave(&self->h.gate);
	} else if ((l = PyMem_Realloc(self->later, (self->n_later + 1) * sizeof(*l)))) {
		self->later = l;
		l[self->n_later++] = d;
	}
	PyErr_Restore(type, val, tb);
}

/* What one TAKE or ANSWER returns: bytes (@p, @len) or, by descriptor, @d. */
struct wq_got {
	uint64_t id;
	void *p;
	size_t len;
	struct tp_descriptor *d;
};

/* One slice of a TAKE (@take) or ANSWER, by descriptor (@msg) or for bytes, into @g. */
static int wq_get_slice(struct tp_wq *q, bool take, bool msg, struct wq_got *g, int slice)
{
	if (msg)
		return take ? tp_wq_take_descriptor(q, &g->id, &g->d, slice) :
			      tp_wq_answer_descriptor(q, &g->id, &g->d, slice);
	return take ? tp_wq_take(q, &g->id, &g->p, &g->len, slice) :
		      tp_wq_answer(q, &g->id, &g->p, &g->len, slice);
}

/* Sets .question_id = @id on the exception being raised (an error answer). */
static void wq_raise_set_id(uint64_t id)
{
	PyObject *type, *val, *tb, *n = PyLong_FromUnsignedLongLong(id);

	PyErr_Fetch(&type, &val, &tb);
	PyErr_NormalizeException(&type, &val, &tb);
	if (n && val)
		PyObject_SetAttrString(val, "question_id", n);
	Py_XDECREF(n);
	PyErr_Restore(type, val, tb);
}

/* TAKE (@take) or ANSWER within @timeout_ms, sliced, by descriptor (@msg) or for bytes.
 * Return: (id, Block) or (id, Descriptor); NULL with an exception set (an error answer:
 * PeerDied with the question's id as .question_id). */
static PyObject *wq_get(tpy_wq *self, bool take, bool msg, int timeout_ms)
{
	int64_t until = timeout_ms < 0 ? -1 : tpy_gate_now_ms() + timeout_ms;
	struct wq_got g = { 0 };
	int slice, again, r;
	PyObject *item;

	if (wq_enter(self) < 0)
		return NULL;
	do {
		slice = tpy_gate_slice(until);
		Py_BEGIN_ALLOW_THREADS
		r = wq_get_slice(wq_lib(self), take, msg, &g, slice);
		Py_END_ALLOW_THREADS
		if (r == -EAGAIN && timeout_ms != 0)
			r = -ETIMEDOUT; /* the last slice of a longer wait */
		again = tpy_gate_again(&self->h.gate, r, slice, until);
	} while (again > 0);
	tpy_gate_leave(&self->h.gate);
	if (again < 0)
		return NULL;
	if (r < 0) {
		free(g.p);
		wq_raise(self, r, timeout_ms, take ? "no question is queued" :
			 "no answer is waiting");
		if (!take && r == -ECONNRESET)
			wq_raise_set_id(g.id);
		return NULL;
	}
	if (msg) /* takes g.d */
		item = tpy_descriptor_new((PyObject *)self, g.d, wq_desc_drop);
	else
		item = tpy_dlpack_block(g.p, g.len); /* takes g.p */
	if (!item)
		return NULL;
	return Py_BuildValue("(KN)", (unsigned long long)g.id, item);
}

static PyObject *wq_take(tpy_wq *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	int timeout_ms;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:take", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	return wq_get(self, true, false, timeout_ms);
}

static PyObject *wq_answer(tpy_wq *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	int timeout_ms;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:answer", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	return wq_get(self, false, false, timeout_ms);
}

/* take_descriptor() (@take) or answer_descriptor(): (id, Descriptor). */
static PyObject *wq_get_descriptor(tpy_wq *self, PyObject *args, PyObject *kw, bool take)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	int timeout_ms;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:take_descriptor", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	return wq_get(self, take, true, timeout_ms);
}

static PyObject *wq_take_descriptor(tpy_wq *self, PyObject *args, PyObject *kw)
{
	return wq_get_descriptor(self, args, kw, true);
}

static PyObject *wq_answer_descriptor(tpy_wq *self, PyObject *args, PyObject *kw)
{
	return wq_get_descriptor(self, args, kw, false);
}

/* read_msg(descriptor, payloads, tensors): the question or answer into the destinations. */
static PyObject *wq_read_msg(tpy_wq *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "descriptor", "payloads", "tensors", NULL };
	PyObject *desc, *pay = NULL, *ten = NULL;
	struct tp_allocation a;
	struct tp_descriptor *d;
	void *parts;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:read_msg", kwlist, &desc, &pay, &ten) ||
	    !(d = tpy_descriptor_of(desc, (PyObject *)self, false)) ||
	    !(parts = tpy_pipe_slots_new(d, pay, ten, &a)))
		return NULL;
	d = tpy_descriptor_of(desc, (PyObject *)self, true);
	if (wq_enter(self) < 0) {
		wq_desc_drop((PyObject *)self, d);
		tpy_pipe_message_free(parts);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	r = tp_wq_read_msg(wq_lib(self), d, &a);
	if (r == -EINVAL)
		tp_wq_descriptor_free(d); /* not taken: cannot happen, the slots match */
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	tpy_pipe_message_free(parts);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *wq_drain(tpy_wq *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	int timeout_ms, slice, again, r;
	int64_t until;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:drain", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0 || wq_enter(self) < 0)
		return NULL;
	until = timeout_ms < 0 ? -1 : tpy_gate_now_ms() + timeout_ms;
	do {
		slice = tpy_gate_slice(until);
		Py_BEGIN_ALLOW_THREADS
		r = tp_wq_drain(wq_lib(self), slice);
		Py_END_ALLOW_THREADS
		if (r == -EAGAIN && timeout_ms != 0)
			r = -ETIMEDOUT;
		again = tpy_gate_again(&self->h.gate, r, slice, until);
	} while (again > 0);
	tpy_gate_leave(&self->h.gate);
	if (again < 0)
		return NULL;
	if (r < 0)
		return wq_raise(self, r, timeout_ms, "questions are still queued or taken");
	Py_RETURN_NONE;
}

static PyObject *wq_close(tpy_wq *self, PyObject *unused)
{
	int r;

	if (wq_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = tp_wq_close(wq_lib(self));
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *wq_release(tpy_wq *self, PyObject *unused)
{
	int r = tpy_handle_release(&self->h);

	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static void wq_dealloc(tpy_wq *self)
{
	/* No thread is inside a call: each holds a reference while it is. */
	tpy_handle_done(&self->h);
	for (size_t i = 0; i < self->n_later; i++)
		tp_wq_descriptor_free(self->later[i]); /* released: frees only */
	PyMem_Free(self->later);
	PyObject_Free(self);
}

static PyObject *wq_get_released(tpy_wq *self, void *unused)
{
	return PyBool_FromLong(tpy_handle_released(&self->h));
}

static PyObject *wq_get_owner(tpy_wq *self, void *unused)
{
	return PyBool_FromLong(self->owner);
}

static PyMethodDef wq_methods[] = {
	{ "submit", (PyCFunction)wq_submit, METH_O,
	  "submit(item) -> id\n--\n\nOwner: queue a copy of the bytes-like @item (borrowed until "
	  "it returns). Never waits: LimitExceeded when the queue is full." },
	{ "answer", (PyCFunction)(void (*)(void))wq_answer, METH_VARARGS | METH_KEYWORDS,
	  "answer(timeout=None) -> (id, Block)\n--\n\nOwner: the oldest answer. PeerDied (with "
	  ".question_id) for a question whose worker died on an at-most-once queue; "
	  "NothingOutstanding when no question waits for an answer." },
	{ "take", (PyCFunction)(void (*)(void))wq_take, METH_VARARGS | METH_KEYWORDS,
	  "take(timeout=None) -> (id, Block)\n--\n\nWorker: the oldest queued question, this "
	  "handle's until replied to. PipeClosed once closed and empty or the owner is gone." },
	{ "reply", (PyCFunction)wq_reply, METH_VARARGS,
	  "reply(id, item)\n--\n\nWorker: answer question @id, which this handle took (borrows "
	  "@item until it returns). Never waits." },
	{ "submit_msg", (PyCFunction)wq_submit_msg, METH_VARARGS,
	  "submit_msg(metadata, payloads, tensors) -> id\n--\n\nOwner: queue a message question "
	  "(the pipe's write arguments, borrowed until it returns). Never waits." },
	{ "answer_descriptor", (PyCFunction)(void (*)(void))wq_answer_descriptor,
	  METH_VARARGS | METH_KEYWORDS,
	  "answer_descriptor(timeout=None) -> (id, Descriptor)\n--\n\nOwner: the oldest answer, "
	  "described (held for this handle until read; dropping the Descriptor unread drops "
	  "it). Errors as answer()." },
	{ "take_descriptor", (PyCFunction)(void (*)(void))wq_take_descriptor,
	  METH_VARARGS | METH_KEYWORDS,
	  "take_descriptor(timeout=None) -> (id, Descriptor)\n--\n\nWorker: take() the oldest "
	  "question, described; it stays taken whether it is read or not." },
	{ "reply_msg", (PyCFunction)wq_reply_msg, METH_VARARGS,
	  "reply_msg(id, metadata, payloads, tensors)\n--\n\nWorker: answer question @id with a "
	  "message (borrowed until it returns). Never waits." },
	{ "read_msg", (PyCFunction)(void (*)(void))wq_read_msg, METH_VARARGS | METH_KEYWORDS,
	  "read_msg(descriptor, payloads=(), tensors=())\n--\n\nMove the question or answer of "
	  "@descriptor (consumed) into writable buffers, one per payload and tensor, borrowed "
	  "until it returns." },
	{ "drain", (PyCFunction)(void (*)(void))wq_drain, METH_VARARGS | METH_KEYWORDS,
	  "drain(timeout=None)\n--\n\nOwner: wait until no question is queued or taken." },
	{ "close", (PyCFunction)wq_close, METH_NOARGS,
	  "close()\n--\n\nOwner: no more submits; workers see PipeClosed once the queue is "
	  "empty. Idempotent." },
	{ "release", (PyCFunction)wq_release, METH_NOARGS,
	  "release()\n--\n\nDrop this handle (a worker's taken questions are queued again; the "
	  "owner's release closes and frees the queue); waits for other threads' calls on it "
	  "to end (within 0.2 s)." },
	{ 0 }
};

static PyGetSetDef wq_getset[] = {
	{ "released", (getter)wq_get_released, NULL, "whether release() ran", NULL },
	{ "owner", (getter)wq_get_owner, NULL, "whether this handle owns the queue", NULL },
	{ 0 }
};

PyTypeObject tpy_wq_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.WorkQueue",
	.tp_basicsize = sizeof(tpy_wq),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A handle on a daemon-hosted work queue (Context.open_queue()).",
	.tp_dealloc = (destructor)wq_dealloc,
	.tp_methods = wq_methods,
	.tp_getset = wq_getset,
};

int tpy_wq_add_types(PyObject *m)
{
	PyObject *base = PyObject_GetAttrString(m, "Error");

	if (!base)
		return -1;
	idle_type = PyErr_NewExceptionWithDoc("tpipd.NothingOutstanding",
		"A work queue's owner asked for an answer while no question was outstanding (every "
		"one submitted was answered and received): waiting could never end.", base, NULL);
	Py_DECREF(base);
	if (!idle_type || PyModule_AddObjectRef(m, "NothingOutstanding", idle_type) < 0 ||
	    PyType_Ready(&tpy_wq_type) < 0 ||
	    PyModule_AddObjectRef(m, "WorkQueue", (PyObject *)&tpy_wq_type) < 0)
		return -1;
	return 0;
}
