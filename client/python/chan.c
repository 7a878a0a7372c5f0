/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd channels: the Channel type over libtpclient's daemon-hosted channels (tp_chan_*,
 * docs/channels.md) and the Drained exception. tp_chan_read() and tp_chan_write() block in the
 * calling thread, so every wait is cut into slices of at most TPY_SLICE_MS run without the
 * GIL (gate.c); between slices the thread checks for signals (Ctrl-C raises KeyboardInterrupt within a
 * slice) and for a release from another thread. A slice that ends unanswered has written or
 * taken nothing (the daemon answers each timed request), so slicing loses no item; a waiting
 * reader or writer only gives up its place in the daemon's queue for the next slice. Item
 * types (numpy, torch) and the Python-level state are the package's (tpipd/_channel.py);
 * read_block() hands the library's copy of an item to Python as a Block (dlpack.c), which a
 * typed item's array or tensor then lives over. Message items (tp_chan_write_msgs(),
 * tp_chan_read_descriptor(), tp_chan_read_msg()) reuse the pipe's message parts, read slots
 * and Descriptor type (pipe.c); their tensors' headers and allocation are the package's.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	struct tpy_handle h; /* the library's struct tp_chan (gate.c) */
	/* Descriptors dropped unread while the handle was being released or after: the library
	 * frees them (their item went back to the channel) once the release is done; here at
	 * dealloc, as every Descriptor keeps its Channel. */
	struct tp_descriptor **later;
	size_t n_later;
} tpy_chan;

static PyObject *drained_type;

/* ---- lifetime ------------------------------------------------------------------------------ */

static struct tp_chan *chan_lib(tpy_chan *self)
{
	return self->h.lib;
}

static int chan_lib_release(void *lib)
{
	return tp_chan_release(lib);
}

/* Enters a call: refused after a release. Return: 0, or -1 with Closed raised. */
static int chan_enter(tpy_chan *self)
{
	return tpy_handle_enter(&self->h);
}

PyObject *tpy_chan_open(tpy_context *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "flags", "access", "gid", "capacity_items",
				  "capacity_bytes", "owner_uid", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char *name;
	unsigned int flags = 0, cap_items = 0;
	int access = 0;
	long long gid = -1, owner = -1;
	unsigned long long cap_bytes = 0;
	struct tp_chan *ch;
	tpy_chan *ret;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|IiLIKL:open_channel", kwlist, &name, &flags,
					 &access, &gid, &cap_items, &cap_bytes, &owner))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	o.flags = flags;
	o.access = (enum tp_access)access;
	o.gid = gid < 0 ? 0 : (gid_t)gid;
	o.capacity_items = cap_items;
	o.capacity_bytes = cap_bytes;
	o.owner_uid = owner < 0 ? -1 : (long)owner;
	Py_BEGIN_ALLOW_THREADS
	r = tp_chan_open(self->ctx, name, &o, &ch);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	ret = PyObject_New(tpy_chan, &tpy_chan_type);
	if (!ret) {
		tp_chan_release(ch);
		return NULL;
	}
	ret->later = NULL;
	ret->n_later = 0;
	tpy_handle_init(&ret->h, self, ch, chan_lib_release, "Channel");
	return (PyObject *)ret;
}

PyObject *tpy_chan_unlink(tpy_context *self, PyObject *args)
{
	const char *name;
	long long owner = -1;
	int r;

	if (!PyArg_ParseTuple(args, "s|L:unlink_channel", &name, &owner))
		return NULL;
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	Py_BEGIN_ALLOW_THREADS
	r = tp_chan_unlink(self->ctx, name, owner < 0 ? -1 : (long)owner);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

/* ---- calls ------------------------------------------------------------------------------- */

/* Raises the exception of a failed call @r (after a sliced wait of @timeout_ms). */
static PyObject *chan_raise(tpy_chan *self, int r, int timeout_ms)
{
	char msg[160];

	if (r == -EAGAIN || (r == -ETIMEDOUT && timeout_ms == 0))
		return tpy_module_raise(-ETIMEDOUT, "the channel is empty");
	if (r == -ETIMEDOUT && self->h.gate.closing)
		return tpy_module_closed("Channel");
	if (r == -ETIMEDOUT) {
		snprintf(msg, sizeof(msg), "timed out after %d ms", timeout_ms);
		return tpy_module_raise(r, msg);
	}
	return tpy_module_raise(r, NULL);
}

/* A read of a drained channel: Drained (a PipeClosed) with the library's message. */
static PyObject *chan_raise_drained(void)
{
	const char *msg = tp_last_error();
	PyObject *exc = PyObject_CallFunction(drained_type, "is", EPIPE,
					      msg && *msg ? msg : "the channel is drained");

	if (exc) {
		PyErr_SetObject(drained_type, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* The library call of one slice of a write (@arg: what to write). Return: as tp_chan_write(). */
typedef int (*chan_write_fn)(struct tp_chan *ch, void *arg, int slice_ms);

/* A write of @self by @fn within @timeout_ms, sliced. Return: 0, -errno (exception set) or
 * -EINTR (a signal handler raised). */
static int chan_write_sliced(tpy_chan *self, int timeout_ms, chan_write_fn fn, void *arg)
{
	int slice, again, r;
	int64_t until;

	if (chan_enter(self) < 0)
		return -EINTR;
	until = timeout_ms < 0 ? -1 : tpy_gate_now_ms() + timeout_ms;
	do {
		slice = tpy_gate_slice(until);
		Py_BEGIN_ALLOW_THREADS
		r = fn(chan_lib(self), arg, slice);
		Py_END_ALLOW_THREADS
		/* A full channel with a zero slice answers -ENOBUFS: the wait's end, as a timeout
		 * unless the caller asked not to wait (then the daemon's -ENOBUFS stands). */
		if (r == -ENOBUFS && slice == 0 && timeout_ms != 0)
			r = -ETIMEDOUT;
		again = tpy_gate_again(&self->h.gate, r, slice, until);
	} while (again > 0);
	tpy_gate_leave(&self->h.gate);
	if (again < 0)
		return -EINTR;
	if (r < 0)
		chan_raise(self, r, timeout_ms);
	return r;
}

struct bytes_write {
	const struct iovec *iov;
	size_t n;
};

static int bytes_write(struct tp_chan *ch, void *arg, int slice_ms)
{
	struct bytes_write *w = arg;

	return tp_chan_write(ch, w->iov, w->n, slice_ms);
}

static PyObject *chan_write(tpy_chan *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "items", "timeout", NULL };
	PyObject *items, *seq = NULL, *tmo = Py_None, *ret = NULL;
	Py_buffer *views = NULL;
	struct iovec *iov = NULL;
	Py_ssize_t n = 0, got = 0;
	int timeout_ms;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:write", kwlist, &items, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	seq = PySequence_Fast(items, "items must be a sequence of bytes-like objects");
	if (!seq)
		return NULL;
	n = PySequence_Fast_GET_SIZE(seq);
	views = PyMem_Calloc((size_t)n + 1, sizeof(*views));
	iov = PyMem_Calloc((size_t)n + 1, sizeof(*iov));
	if (!views || !iov) {
		PyErr_NoMemory();
		goto out;
	}
	for (; got < n; got++) {
		if (tpy_buffer_get(PySequence_Fast_GET_ITEM(seq, got), &views[got], false,
				   "item") < 0)
			goto out;
		iov[got].iov_base = views[got].buf;
		iov[got].iov_len = (size_t)views[got].len;
	}
	if (chan_write_sliced(self, timeout_ms, bytes_write,
			      &(struct bytes_write){ iov, (size_t)n }) == 0)
		ret = Py_NewRef(Py_None);
out:
	for (Py_ssize_t i = 0; i < got; i++)
		PyBuffer_Release(&views[i]);
	PyMem_Free(views);
	PyMem_Free(iov);
	Py_DECREF(seq);
	return ret;
}

/* The library call of one slice of a read (@arg: where its result goes). Return: as
 * tp_chan_read(). */
typedef int (*chan_read_fn)(struct tp_chan *ch, void *arg, int slice_ms);

/* A read of @self by @fn within @timeout_ms, sliced. Return: 0 or TP_CHAN_CLOSED with what
 * @fn returns, or -EINTR with an exception set (Drained once the channel is drained). */
static int chan_read_sliced(tpy_chan *self, int timeout_ms, chan_read_fn fn, void *arg)
{
	int64_t until = timeout_ms < 0 ? -1 : tpy_gate_now_ms() + timeout_ms;
	int slice, again, r;

	if (chan_enter(self) < 0)
		return -EINTR;
	do {
		slice = tpy_gate_slice(until);
		Py_BEGIN_ALLOW_THREADS
		r = fn(chan_lib(self), arg, slice);
		Py_END_ALLOW_THREADS
		if (r == -EAGAIN && timeout_ms != 0)
			r = -ETIMEDOUT; /* the last slice of a longer wait */
		again = tpy_gate_again(&self->h.gate, r, slice, until);
	} while (again > 0);
	tpy_gate_leave(&self->h.gate);
	if (again < 0)
		return -EINTR;
	if (r == -EPIPE)
		chan_raise_drained();
	else if (r < 0)
		chan_raise(self, r, timeout_ms);
	return r < 0 ? -EINTR : r;
}

struct bytes_read {
	void *item;
	size_t len;
};

static int bytes_read(struct tp_chan *ch, void *arg, int slice_ms)
{
	struct bytes_read *rd = arg;

	return tp_chan_read(ch, &rd->item, &rd->len, slice_ms);
}

/* Reads one item into *@ret_item (malloc'd) within @timeout_ms, sliced.
 * Return: 0 or TP_CHAN_CLOSED with the item, or -EINTR with an exception set. */
static int chan_read_item(tpy_chan *self, int timeout_ms, void **ret_item, size_t *ret_len)
{
	struct bytes_read rd = { NULL, 0 };
	int r = chan_read_sliced(self, timeout_ms, bytes_read, &rd);

	*ret_item = rd.item;
	*ret_len = rd.len;
	return r;
}

/* read() (bytes, a copy) or read_block() (a Block owning the library's memory, no copy). */
static PyObject *chan_read_as(tpy_chan *self, PyObject *args, PyObject *kw, bool block)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None, *item;
	void *p = NULL;
	size_t len = 0;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:read", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	r = chan_read_item(self, timeout_ms, &p, &len);
	if (r < 0)
		return NULL;
	if (block) {
		item = tpy_dlpack_block(p, len); /* takes p */
	} else {
		item = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
		free(p);
	}
	if (!item)
		return NULL;
	return Py_BuildValue("(NO)", item, r == TP_CHAN_CLOSED ? Py_True : Py_False);
}

static PyObject *chan_read(tpy_chan *self, PyObject *args, PyObject *kw)
{
	return chan_read_as(self, args, kw, false);
}

static PyObject *chan_read_block(tpy_chan *self, PyObject *args, PyObject *kw)
{
	return chan_read_as(self, args, kw, true);
}

/* An item longer than the destination: LimitExceeded carrying the item (it left the channel). */
static PyObject *chan_raise_too_long(void *p, size_t len, Py_ssize_t room)
{
	PyObject *type, *val, *tb, *item;
	char msg[128];

	snprintf(msg, sizeof(msg), "an item of %zu bytes does not fit the destination's %zd "
		 "(the item is the exception's .item)", len, room);
	tpy_module_raise(-EMSGSIZE, msg);
	PyErr_Fetch(&type, &val, &tb);
	PyErr_NormalizeException(&type, &val, &tb);
	item = PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
	if (item && val)
		PyObject_SetAttrString(val, "item", item);
	Py_XDECREF(item);
	PyErr_Restore(type, val, tb);
	return NULL;
}

static PyObject *chan_read_into(tpy_chan *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "buffer", "timeout", NULL };
	PyObject *dst, *tmo = Py_None, *ret = NULL;
	Py_buffer view;
	void *p = NULL;
	size_t len = 0;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:read_into", kwlist, &dst, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0 ||
	    tpy_buffer_get(dst, &view, true, "destination") < 0)
		return NULL;
	r = chan_read_item(self, timeout_ms, &p, &len);
	if (r >= 0 && len > (size_t)view.len)
		chan_raise_too_long(p, len, view.len);
	else if (r >= 0) {
		memcpy(view.buf, p, len);
		ret = Py_BuildValue("(nO)", (Py_ssize_t)len, r == TP_CHAN_CLOSED ? Py_True : Py_False);
	}
	free(p);
	PyBuffer_Release(&view);
	return ret;
}

#define CHAN_MANY_MAX 1024 /* items of one read_many_into() at most */

struct many_read {
	void *buf;
	size_t size, max, n;
	struct tp_chan_item items[];
};

static int many_read(struct tp_chan *ch, void *arg, int slice_ms)
{
	struct many_read *rd = arg;

	return tp_chan_read_many_into(ch, rd->buf, rd->size, rd->items, rd->max, &rd->n, slice_ms);
}

/* read_many_into(buffer, max, timeout) -> ([(offset, nbytes), ...], closed): up to @max items
 * packed into @buffer by tp_chan_read_many_into() (docs/channels.md). */
static PyObject *chan_read_many_into(tpy_chan *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "buffer", "max", "timeout", NULL };
	PyObject *dst, *tmo = Py_None, *list = NULL, *ret = NULL;
	Py_ssize_t max = 64;
	struct many_read *rd;
	Py_buffer view;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nO:read_many_into", kwlist, &dst, &max,
					 &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	if (max < 1 || max > CHAN_MANY_MAX)
		return PyErr_Format(PyExc_ValueError, "max must be 1 to %d", CHAN_MANY_MAX);
	if (tpy_buffer_get(dst, &view, true, "destination") < 0)
		return NULL;
	rd = PyMem_Calloc(1, sizeof(*rd) + (size_t)max * sizeof(rd->items[0]));
	if (!rd) {
		PyBuffer_Release(&view);
		return PyErr_NoMemory();
	}
	rd->buf = view.buf;
	rd->size = (size_t)view.len;
	rd->max = (size_t)max;
	r = chan_read_sliced(self, timeout_ms, many_read, rd);
	if (r >= 0 && (list = PyList_New((Py_ssize_t)rd->n))) {
		for (size_t k = 0; k < rd->n; k++) {
			Py_ssize_t off = (uint8_t *)rd->items[k].data - (uint8_t *)view.buf;
			PyObject *t = Py_BuildValue("(nn)", off, (Py_ssize_t)rd->items[k].len);

			if (!t) {
				Py_CLEAR(list);
				break;
			}
			PyList_SET_ITEM(list, (Py_ssize_t)k, t);
		}
		if (list)
			ret = Py_BuildValue("(NO)", list, r == TP_CHAN_CLOSED ? Py_True : Py_False);
	}
	PyMem_Free(rd);
	PyBuffer_Release(&view);
	return ret;
}

/* ---- message items ------------------------------------------------------------------------ */

struct msgs_write {
	const struct tp_message *msgs;
	size_t n;
};

static int msgs_write(struct tp_chan *ch, void *arg, int slice_ms)
{
	struct msgs_write *w = arg;

	return tp_chan_write_msgs(ch, w->msgs, w->n, slice_ms);
}

/* write_msgs(messages, timeout): each message a (metadata, payloads, tensors) triple of the
 * pipe's write arguments. */
static PyObject *chan_write_msgs(tpy_chan *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "messages", "timeout", NULL };
	PyObject *msgs, *seq, *tmo = Py_None, *ret = NULL, *pay, *ten;
	struct tp_message *tm = NULL;
	Py_buffer *metas = NULL;
	void **parts = NULL;
	Py_ssize_t n, got = 0;
	int timeout_ms;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:write_msgs", kwlist, &msgs, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	seq = PySequence_Fast(msgs, "messages must be a sequence of (metadata, payloads, "
			      "tensors)");
	if (!seq)
		return NULL;
	n = PySequence_Fast_GET_SIZE(seq);
	tm = PyMem_Calloc((size_t)n + 1, sizeof(*tm));
	metas = PyMem_Calloc((size_t)n + 1, sizeof(*metas));
	parts = PyMem_Calloc((size_t)n + 1, sizeof(*parts));
	if (!tm || !metas || !parts) {
		PyErr_NoMemory();
		goto out;
	}
	for (; got < n; got++) {
		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, got), "y*OO:message",
				      &metas[got], &pay, &ten))
			goto out;
		parts[got] = tpy_pipe_message_new(&metas[got], pay, ten, &tm[got]);
		if (!parts[got]) {
			got++; /* its metadata is acquired */
			goto out;
		}
	}
	if (chan_write_sliced(self, timeout_ms, msgs_write,
			      &(struct msgs_write){ tm, (size_t)n }) == 0)
		ret = Py_NewRef(Py_None);
out:
	for (Py_ssize_t i = 0; i < got; i++) {
		tpy_pipe_message_free(parts[i]);
		PyBuffer_Release(&metas[i]);
	}
	PyMem_Free(tm);
	PyMem_Free(metas);
	PyMem_Free(parts);
	Py_DECREF(seq);
	return ret;
}

/* A Descriptor of @owner dropped unread: its item dropped (tp_chan_descriptor_free()); once
 * the handle's release began, kept for dealloc (the release gives the item back). */
static void chan_desc_drop(PyObject *owner, struct tp_descriptor *d)
{
	tpy_chan *self = (tpy_chan *)owner;
	struct tp_descriptor **l;
	PyObject *type, *val, *tb;

	PyErr_Fetch(&type, &val, &tb); /* a dealloc may run while an exception is set */
	if (chan_enter(self) == 0) {
		Py_BEGIN_ALLOW_THREADS
		tp_chan_descriptor_free(d);
		Py_END_ALLOW_THREADS
		tpy_gate_leave(&self->h.gate);
	} else if ((l = PyMem_Realloc(self->later, (self->n_later + 1) * sizeof(*l)))) {
		self->later = l;
		l[self->n_later++] = d;
	}
	PyErr_Restore(type, val, tb);
}

static int desc_read(struct tp_chan *ch, void *arg, int slice_ms)
{
	return tp_chan_read_descriptor(ch, arg, slice_ms);
}

/* read_descriptor(timeout) -> (Descriptor, closed): the oldest item held for this handle. */
static PyObject *chan_read_descriptor(tpy_chan *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None, *desc;
	struct tp_descriptor *d = NULL;
	int timeout_ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:read_descriptor", kwlist, &tmo) ||
	    tpy_pipe_timeout(tmo, &timeout_ms) < 0)
		return NULL;
	r = chan_read_sliced(self, timeout_ms, desc_read, &d);
	if (r < 0)
		return NULL;
	desc = tpy_descriptor_new((PyObject *)self, d, chan_desc_drop);
	if (!desc)
		return NULL;
	return Py_BuildValue("(NO)", desc, r == TP_CHAN_CLOSED ? Py_True : Py_False);
}

/* read_msg(descriptor, payloads, tensors): the item into the destinations (as Pipe.read()). */
static PyObject *chan_read_msg(tpy_chan *self, PyObject *args, PyObject *kw)
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
	if (chan_enter(self) < 0) {
		chan_desc_drop((PyObject *)self, d);
		tpy_pipe_message_free(parts);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	r = tp_chan_read_msg(chan_lib(self), d, &a);
	if (r == -EINVAL)
		tp_chan_descriptor_free(d); /* not taken: cannot happen, the slots match */
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	tpy_pipe_message_free(parts);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *chan_close(tpy_chan *self, PyObject *unused)
{
	int r;

	if (chan_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = tp_chan_close(chan_lib(self));
	Py_END_ALLOW_THREADS
	tpy_gate_leave(&self->h.gate);
	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *chan_release(tpy_chan *self, PyObject *unused)
{
	int r = tpy_handle_release(&self->h);

	if (r < 0)
		return tpy_module_raise(r, NULL);
	Py_RETURN_NONE;
}

static void chan_dealloc(tpy_chan *self)
{
	/* No thread is inside a call: each holds a reference while it is. */
	tpy_handle_done(&self->h);
	for (size_t i = 0; i < self->n_later; i++)
		tp_chan_descriptor_free(self->later[i]); /* released: frees only */
	PyMem_Free(self->later);
	PyObject_Free(self);
}

static PyObject *chan_get_released(tpy_chan *self, void *unused)
{
	return PyBool_FromLong(tpy_handle_released(&self->h));
}

static PyMethodDef chan_methods[] = {
	{ "write", (PyCFunction)(void (*)(void))chan_write, METH_VARARGS | METH_KEYWORDS,
	  "write(items, timeout=None)\n--\n\nAppend the bytes-like @items (each at least 1 byte) "
	  "as one atomic batch, waiting for room up to @timeout seconds (None: no deadline, 0: "
	  "LimitExceeded when full). Borrows @items until it returns." },
	{ "read", (PyCFunction)(void (*)(void))chan_read, METH_VARARGS | METH_KEYWORDS,
	  "read(timeout=None) -> (bytes, closed)\n--\n\nTake the oldest item; @closed is True "
	  "once the channel is closed. Drained when closed and empty, Timeout when none came." },
	{ "read_block", (PyCFunction)(void (*)(void))chan_read_block, METH_VARARGS | METH_KEYWORDS,
	  "read_block(timeout=None) -> (Block, closed)\n--\n\nread() without the copy into "
	  "bytes: the Block owns the memory the library received the item in." },
	{ "read_into", (PyCFunction)(void (*)(void))chan_read_into, METH_VARARGS | METH_KEYWORDS,
	  "read_into(buffer, timeout=None) -> (nbytes, closed)\n--\n\nread() into a writable "
	  "C-contiguous buffer (borrowed until it returns)." },
	{ "read_many_into", (PyCFunction)(void (*)(void))chan_read_many_into,
	  METH_VARARGS | METH_KEYWORDS,
	  "read_many_into(buffer, max=64, timeout=None) -> ([(offset, nbytes), ...], closed)\n--\n"
	  "\nTake up to @max items (the oldest, waiting as read() does, and those behind it that "
	  "ride inline and fit) packed into one writable C-contiguous buffer, each at the next "
	  "multiple of 64 bytes (borrowed until it returns). An oldest item larger than the "
	  "buffer raises LimitExceeded and stays first in the channel." },
	{ "write_msgs", (PyCFunction)(void (*)(void))chan_write_msgs, METH_VARARGS | METH_KEYWORDS,
	  "write_msgs(messages, timeout=None)\n--\n\nAppend messages, each a (metadata, "
	  "payloads, tensors) triple as Pipe.write() takes them, as one atomic batch of message "
	  "items. Borrows them until it returns." },
	{ "read_descriptor", (PyCFunction)(void (*)(void))chan_read_descriptor,
	  METH_VARARGS | METH_KEYWORDS,
	  "read_descriptor(timeout=None) -> (Descriptor, closed)\n--\n\nTake the oldest item "
	  "(held for this handle) and describe it as a message; dropping the Descriptor unread "
	  "drops the item." },
	{ "read_msg", (PyCFunction)(void (*)(void))chan_read_msg, METH_VARARGS | METH_KEYWORDS,
	  "read_msg(descriptor, payloads=(), tensors=())\n--\n\nMove the item of @descriptor "
	  "(consumed) into writable buffers, one per payload and tensor, borrowed until it "
	  "returns." },
	{ "close", (PyCFunction)chan_close, METH_NOARGS,
	  "close()\n--\n\nClose the channel for every handle in every process." },
	{ "release", (PyCFunction)chan_release, METH_NOARGS,
	  "release()\n--\n\nDrop this handle (not a close); waits for calls of other threads "
	  "on it to end (within 0.2 s)." },
	{ 0 }
};

static PyGetSetDef chan_getset[] = {
	{ "released", (getter)chan_get_released, NULL, "whether release() ran", NULL },
	{ 0 }
};

PyTypeObject tpy_chan_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Channel",
	.tp_basicsize = sizeof(tpy_chan),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A handle on a daemon-hosted channel (Context.open_channel()).",
	.tp_dealloc = (destructor)chan_dealloc,
	.tp_methods = chan_methods,
	.tp_getset = chan_getset,
};

int tpy_chan_add_types(PyObject *m)
{
	PyObject *base = PyObject_GetAttrString(m, "PipeClosed");

	if (!base)
		return -1;
	drained_type = PyErr_NewExceptionWithDoc("tpipd.Drained",
		"A channel is closed and empty: no item will come (a PipeClosed, so also a "
		"BrokenPipeError).", base, NULL);
	Py_DECREF(base);
	if (!drained_type || PyModule_AddObjectRef(m, "Drained", drained_type) < 0 ||
	    PyType_Ready(&tpy_chan_type) < 0 ||
	    PyModule_AddObjectRef(m, "Channel", (PyObject *)&tpy_chan_type) < 0)
		return -1;
	return 0;
}
