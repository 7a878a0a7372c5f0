/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd DLPack: tensors in and out of the module without numpy's buffer protocol in between.
 * In: tpy_dlpack_get() fills a Py_buffer from an object's __dlpack__() capsule (CPU memory,
 * C-contiguous), holding the capsule (so the producer's memory) until PyBuffer_Release();
 * tpy_buffer_get() uses it for objects without the buffer protocol (torch tensors). Out: the
 * DLView type exports any writable buffer (a SharedBuffer, a Block) as a DLPack tensor of a
 * dtype and shape for numpy.from_dlpack() / torch.from_dlpack(), keeping the buffer until the
 * consumer's tensor is freed; and the Block type, memory received from libtpclient (a work
 * queue's item) owned by Python without a copy. The dtype table and header are the package's
 * (tpipd/_tensor.py); no copy is made here.
 *
 * The structures are DLPack's stable ABI (dlpack.h, versions 0.5 to 0.8), declared here because
 * Debian ships no dlpack header.
 */
#include <errno.h>
#include <stdlib.h>
#include "tpy.h"

/* ---- DLPack ABI -------------------------------------------------------------------------- */

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_COMPLEX = 5 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DL_MAX_NDIM 32

/* Our dtype codes (tpipd/_tensor.py DTYPES) as DLPack types; bool travels as uint8 (neither
 * numpy 1.24 nor torch 1.13 exports or imports a DLPack bool): the package views it back. */
static const DLDataType dl_types[] = {
	[1] = { DL_UINT, 8, 1 },     [2] = { DL_INT, 8, 1 },	   [3] = { DL_UINT, 8, 1 },
	[4] = { DL_INT, 16, 1 },     [5] = { DL_UINT, 16, 1 },	   [6] = { DL_INT, 32, 1 },
	[7] = { DL_UINT, 32, 1 },    [8] = { DL_INT, 64, 1 },	   [9] = { DL_UINT, 64, 1 },
	[10] = { DL_FLOAT, 16, 1 },  [11] = { DL_BFLOAT, 16, 1 },  [12] = { DL_FLOAT, 32, 1 },
	[13] = { DL_FLOAT, 64, 1 },  [14] = { DL_COMPLEX, 64, 1 }, [15] = { DL_COMPLEX, 128, 1 },
};

/* ---- in: a Py_buffer over a __dlpack__ capsule ---------------------------------------------- */

static PyObject *dl_raise(const char *what, const char *why, PyObject *cap)
{
	char msg[256];

	Py_XDECREF(cap);
	snprintf(msg, sizeof(msg), "%s: %s", what, why);
	return tpy_module_raise(-EINVAL, msg);
}

/* Whether @t is C-contiguous (strides NULL or matching its shape; size-1 dims ignored; an
 * empty tensor has no bytes to be out of order, and torch gives it made-up strides). */
static bool dl_compact(const DLTensor *t)
{
	int64_t want = 1;

	if (!t->strides)
		return true;
	for (int i = 0; i < t->ndim; i++)
		if (t->shape[i] == 0)
			return true;
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->strides[i] != want)
			return false;
		want *= t->shape[i];
	}
	return true;
}

/* Checks what a consumer needs of @t (a dtype of whole bytes, at most 32 C-contiguous
 * dimensions) and its byte size into *@ret_len. Return: 0, or -1 with InvalidArgument set. */
static int dl_check(const DLTensor *t, const char *what, size_t *ret_len)
{
	size_t n;

	if (t->ndim < 0 || t->ndim > DL_MAX_NDIM || t->dtype.lanes != 1 || t->dtype.bits % 8 ||
	    !t->dtype.bits) {
		dl_raise(what, "unsupported DLPack dimensions or dtype", NULL);
		return -1;
	}
	if (!dl_compact(t)) {
		dl_raise(what, "is not contiguous: pass contiguous=True to send a contiguous copy, "
			 "or make it contiguous yourself", NULL);
		return -1;
	}
	n = t->dtype.bits / 8;
	for (int i = 0; i < t->ndim; i++) {
		if (t->shape[i] < 0 || (t->shape[i] && n > PY_SSIZE_T_MAX / (size_t)t->shape[i])) {
			dl_raise(what, "bad DLPack shape", NULL);
			return -1;
		}
		n *= (size_t)t->shape[i];
	}
	*ret_len = n;
	return 0;
}

int tpy_dlpack_get(PyObject *obj, Py_buffer *view, const char *what)
{
	PyObject *cap;
	DLManagedTensor *m;
	const DLTensor *t;
	size_t n;

	view->obj = NULL;
	/* A capsule itself (the package's torch.utils.dlpack.to_dlpack(), cheaper than the
	 * tensor's __dlpack__ wrapper), or the object's __dlpack__(). */
	cap = PyCapsule_CheckExact(obj) ? Py_NewRef(obj) : PyObject_CallMethod(obj, "__dlpack__",
									   NULL);
	if (!cap)
		return -1;
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (!m) {
		Py_DECREF(cap);
		return -1;
	}
	t = &m->dl_tensor;
	if (t->device.device_type != DL_CPU && t->device.device_type != DL_CUDA_HOST) {
		dl_raise(what, "DLPack tensor not in CPU memory (the package sends CUDA DLPack "
			 "tensors as CUDA ranges: tpipd/_cuda.py)", cap);
		return -1;
	}
	if (dl_check(t, what, &n) < 0) {
		Py_DECREF(cap);
		return -1;
	}
	memset(view, 0, sizeof(*view));
	view->buf = t->data ? (char *)t->data + t->byte_offset : NULL;
	view->len = (Py_ssize_t)n;
	view->itemsize = 1;
	view->ndim = 1;
	view->obj = cap; /* its destructor calls the producer's deleter (we never consume it) */
	return 0;
}

/* ---- in: CUDA memory of a __dlpack__ capsule --------------------------------------------- */

/* CU_STREAM_LEGACY: DLPack's stream 1, the stream a consumer passing stream=1 works on. */
#define DL_STREAM_LEGACY 1

/* The (ptr, nbytes, device, stream) range, DLPack dtype and shape of @t, kept by @cap. */
static PyObject *dl_cuda_tuple(PyObject *cap, const DLTensor *t, size_t n)
{
	PyObject *shape = PyTuple_New(t->ndim), *r;

	if (!shape)
		return NULL;
	for (int i = 0; i < t->ndim; i++) {
		PyObject *d = PyLong_FromLongLong(t->shape[i]);

		if (!d) {
			Py_DECREF(shape);
			return NULL;
		}
		PyTuple_SET_ITEM(shape, i, d);
	}
	r = Py_BuildValue("(O(KKiK)(ii)N)", cap,
			  (unsigned long long)(uintptr_t)((char *)t->data + t->byte_offset),
			  (unsigned long long)n, (int)t->device.device_id,
			  (unsigned long long)DL_STREAM_LEGACY, (int)t->dtype.code,
			  (int)t->dtype.bits, shape);
	return r;
}

PyObject *tpy_dlpack_cuda(PyObject *mod, PyObject *obj)
{
	PyObject *fn, *kw, *noargs, *cap = NULL;
	DLManagedTensor *m;
	const DLTensor *t;
	PyObject *ret;
	size_t n;

	/* stream=1: the producer orders its pending work before the legacy default stream,
	 * which libtpclient then waits for (DLPack's stream semantics for CUDA). */
	fn = PyObject_GetAttrString(obj, "__dlpack__");
	if (!fn)
		return NULL;
	kw = Py_BuildValue("{si}", "stream", DL_STREAM_LEGACY);
	noargs = PyTuple_New(0);
	if (kw && noargs)
		cap = PyObject_Call(fn, noargs, kw);
	Py_DECREF(fn);
	Py_XDECREF(kw);
	Py_XDECREF(noargs);
	if (!cap)
		return NULL;
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (!m) {
		Py_DECREF(cap);
		return NULL;
	}
	t = &m->dl_tensor;
	if (t->device.device_type != DL_CUDA || t->device.device_id < 0)
		return dl_raise("dlpack_cuda", "DLPack tensor not in CUDA device memory", cap);
	if (dl_check(t, "CUDA tensor", &n) < 0) {
		Py_DECREF(cap);
		return NULL;
	}
	if (!t->data && n)
		return dl_raise("dlpack_cuda", "DLPack tensor with a NULL pointer", cap);
	ret = dl_cuda_tuple(cap, t, n);
	Py_DECREF(cap);
	return ret;
}

/* ---- out: DLView ------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD
	Py_buffer view; /* of the source, writable (CUDA: only view.buf, the device pointer) */
	PyObject *owner; /* CUDA: what keeps the device memory, or NULL */
	DLDevice device;
	Py_ssize_t offset;
	DLDataType dtype;
	int ndim;
	int64_t shape[DL_MAX_NDIM];
} tpy_dlview;

struct dl_managed {
	DLManagedTensor m;
	int64_t shape[DL_MAX_NDIM], strides[DL_MAX_NDIM];
};

static void dl_deleter(DLManagedTensor *m)
{
	PyGILState_STATE g = PyGILState_Ensure();

	Py_XDECREF((PyObject *)m->manager_ctx);
	PyMem_RawFree(m);
	PyGILState_Release(g);
}

static void dl_capsule_destructor(PyObject *cap)
{
	DLManagedTensor *m;

	if (!PyCapsule_IsValid(cap, "dltensor"))
		return; /* consumed: the consumer calls the deleter */
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (m && m->deleter)
		m->deleter(m);
}

static PyObject *dlview_dlpack(tpy_dlview *self, PyObject *args, PyObject *kw)
{
	struct dl_managed *d;
	PyObject *cap;
	int64_t stride = 1;

	/* stream (and later keywords): nothing to order, CPU memory or CUDA memory a completed
	 * read filled (its bytes are in place before the read returns). */
	d = PyMem_RawCalloc(1, sizeof(*d));
	if (!d)
		return PyErr_NoMemory();
	for (int i = self->ndim - 1; i >= 0; i--) {
		d->shape[i] = self->shape[i];
		d->strides[i] = stride;
		stride *= self->shape[i] ? self->shape[i] : 1;
	}
	d->m.dl_tensor.data = (char *)self->view.buf + self->offset;
	d->m.dl_tensor.device = self->device;
	d->m.dl_tensor.ndim = self->ndim;
	d->m.dl_tensor.dtype = self->dtype;
	d->m.dl_tensor.shape = d->shape;
	d->m.dl_tensor.strides = d->strides;
	d->m.manager_ctx = Py_NewRef(self);
	d->m.deleter = dl_deleter;
	cap = PyCapsule_New(&d->m, "dltensor", dl_capsule_destructor);
	if (!cap)
		dl_deleter(&d->m);
	return cap;
}

static PyObject *dlview_device(tpy_dlview *self, PyObject *unused)
{
	return Py_BuildValue("(ii)", (int)self->device.device_type, (int)self->device.device_id);
}

static void dlview_dealloc(tpy_dlview *self)
{
	if (self->view.obj)
		PyBuffer_Release(&self->view);
	Py_XDECREF(self->owner);
	PyObject_Free(self);
}

static PyMethodDef dlview_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))dlview_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "__dlpack__(stream=None) -> capsule\n--\n\nA DLPack capsule over the memory (no copy); "
	  "the memory lives until the consumer's tensor is freed." },
	{ "__dlpack_device__", (PyCFunction)dlview_device, METH_NOARGS,
	  "__dlpack_device__() -> (1, 0) for CPU memory, (2, device) for CUDA memory" },
	{ 0 }
};

PyTypeObject tpy_dlview_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.DLView",
	.tp_basicsize = sizeof(tpy_dlview),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "dlpack_view(buffer, offset, dtype_code, shape): a typed view of a writable "
		  "buffer for numpy.from_dlpack() and torch.from_dlpack() (no copy; the buffer "
		  "stays alive while any tensor made from it is); dlpack_cuda_view(ptr, device, "
		  "dtype_code, shape, owner): the same over CUDA memory that @owner keeps.",
	.tp_dealloc = (destructor)dlview_dealloc,
	.tp_methods = dlview_methods,
};

/* A new DLView of dtype @code and @shape (borrowed); its byte size into *@ret_len. */
static tpy_dlview *dlview_new(int code, PyObject *shape, size_t *ret_len)
{
	PyObject *seq;
	Py_ssize_t nd;
	size_t n;
	tpy_dlview *v;

	if (code < 1 || code >= (int)(sizeof(dl_types) / sizeof(dl_types[0]))) {
		PyErr_SetString(PyExc_ValueError, "dlpack_view: bad dtype code");
		return NULL;
	}
	seq = PySequence_Fast(shape, "dlpack_view: shape must be a sequence of ints");
	if (!seq)
		return NULL;
	nd = PySequence_Fast_GET_SIZE(seq);
	v = nd > DL_MAX_NDIM ? NULL : PyObject_New(tpy_dlview, &tpy_dlview_type);
	if (!v) {
		Py_DECREF(seq);
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "dlpack_view: more than 32 dimensions");
		return NULL;
	}
	memset(&v->view, 0, sizeof(v->view));
	v->owner = NULL;
	v->device = (DLDevice){ DL_CPU, 0 };
	v->offset = 0;
	v->dtype = dl_types[code];
	v->ndim = (int)nd;
	n = v->dtype.bits / 8;
	for (Py_ssize_t i = 0; i < nd; i++) {
		long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));

		if (d < 0 || d > (1LL << 48)) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "dlpack_view: bad dimension");
			Py_DECREF(seq);
			Py_DECREF(v);
			return NULL;
		}
		v->shape[i] = d;
		n = d && n > PY_SSIZE_T_MAX / (size_t)d ? (size_t)PY_SSIZE_T_MAX : n * (size_t)d;
	}
	Py_DECREF(seq);
	*ret_len = n;
	return v;
}

PyObject *tpy_dlpack_view(PyObject *mod, PyObject *args)
{
	PyObject *obj, *shape;
	Py_ssize_t offset;
	int code;
	size_t n;
	tpy_dlview *v;

	if (!PyArg_ParseTuple(args, "OniO:dlpack_view", &obj, &offset, &code, &shape))
		return NULL;
	if (offset < 0) {
		PyErr_SetString(PyExc_ValueError, "dlpack_view: bad offset");
		return NULL;
	}
	v = dlview_new(code, shape, &n);
	if (!v)
		return NULL;
	v->offset = offset;
	if (tpy_buffer_get(obj, &v->view, true, "dlpack_view") < 0)
		goto fail;
	if (n > (size_t)v->view.len || (size_t)offset > (size_t)v->view.len - n) {
		PyErr_Format(PyExc_ValueError, "dlpack_view: %zu bytes at offset %zd overrun a "
			     "buffer of %zd", n, offset, v->view.len);
		goto fail;
	}
	return (PyObject *)v;
fail:
	Py_DECREF(v);
	return NULL;
}

PyObject *tpy_dlpack_cuda_view(PyObject *mod, PyObject *args)
{
	unsigned long long ptr;
	PyObject *shape, *owner = Py_None;
	int device, code;
	size_t n;
	tpy_dlview *v;

	if (!PyArg_ParseTuple(args, "KiiO|O:dlpack_cuda_view", &ptr, &device, &code, &shape,
			      &owner))
		return NULL;
	if (device < 0) {
		PyErr_SetString(PyExc_ValueError, "dlpack_cuda_view: bad device");
		return NULL;
	}
	v = dlview_new(code, shape, &n);
	if (!v)
		return NULL;
	if (!ptr && n) {
		PyErr_SetString(PyExc_ValueError, "dlpack_cuda_view: NULL pointer");
		Py_DECREF(v);
		return NULL;
	}
	v->view.buf = (void *)(uintptr_t)ptr;
	v->device = (DLDevice){ DL_CUDA, device };
	v->owner = Py_NewRef(owner);
	return (PyObject *)v;
}

/* ---- Block ------------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD
	void *p; /* malloc'd (libtpclient's), freed with the block */
	Py_ssize_t len;
} tpy_block;

PyObject *tpy_dlpack_block(void *p, size_t len)
{
	tpy_block *b;

	if (len > PY_SSIZE_T_MAX) {
		free(p);
		return PyErr_NoMemory();
	}
	b = PyObject_New(tpy_block, &tpy_block_type);
	if (!b) {
		free(p);
		return NULL;
	}
	b->p = p;
	b->len = (Py_ssize_t)len;
	return (PyObject *)b;
}

static void block_dealloc(tpy_block *self)
{
	free(self->p); /* no export is alive: each holds a reference */
	PyObject_Free(self);
}

static int block_getbuffer(tpy_block *self, Py_buffer *view, int flags)
{
	return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 0, flags);
}

static PyBufferProcs block_as_buffer = {
	.bf_getbuffer = (getbufferproc)block_getbuffer,
};

static Py_ssize_t block_len(tpy_block *self)
{
	return self->len;
}

static PySequenceMethods block_as_sequence = {
	.sq_length = (lenfunc)block_len,
};

PyTypeObject tpy_block_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.Block",
	.tp_basicsize = sizeof(tpy_block),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Bytes received from the daemon, owned by this object (writable through the "
		  "buffer protocol; freed when the last view of it is gone).",
	.tp_dealloc = (destructor)block_dealloc,
	.tp_as_buffer = &block_as_buffer,
	.tp_as_sequence = &block_as_sequence,
};

int tpy_dlpack_add_types(PyObject *m)
{
	if (PyType_Ready(&tpy_dlview_type) < 0 || PyType_Ready(&tpy_block_type) < 0 ||
	    PyModule_AddObjectRef(m, "DLView", (PyObject *)&tpy_dlview_type) < 0 ||
	    PyModule_AddObjectRef(m, "Block", (PyObject *)&tpy_block_type) < 0)
		return -1;
	return 0;
}
