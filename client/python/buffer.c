/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * _tpipd memory: the SharedBuffer type (memory from tp_buffer_alloc(), exported through the
 * buffer protocol so numpy arrays and torch tensors can live in it, the mapping alive as long
 * as any of them is), and the conversion of Python objects into libtpclient tensors and read
 * slots: CPU memory through the buffer protocol or, for objects without it (torch tensors),
 * DLPack (dlpack.c); CUDA memory as a (ptr, nbytes, device, stream) tuple built by the Python
 * package from __cuda_array_interface__.
 */
#include <errno.h>
#include "tpy.h"

typedef struct {
	PyObject_HEAD
	tpy_context *ctx;
	void *ptr;
	Py_ssize_t size;
} tpy_buffer;

int tpy_buffer_get(PyObject *obj, Py_buffer *view, bool writable, const char *what)
{
	int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);

	/* DLPack capsules, torch tensors (and other DLPack producers without the buffer
	 * protocol) */
	if (PyCapsule_CheckExact(obj) ||
	    (!PyObject_CheckBuffer(obj) && PyObject_HasAttrString(obj, "__dlpack__")))
		return tpy_dlpack_get(obj, view, what);
	if (PyObject_GetBuffer(obj, view, flags) == 0)
		return 0;
	view->obj = NULL;
	if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "%s: a C-contiguous%s buffer is needed (got %.80s)",
			     what, writable ? ", writable" : "", Py_TYPE(obj)->tp_name);
	}
	return -1;
}

/* A CUDA range: (ptr, nbytes, device, stream) with ints, and optionally a keep-alive object
 * (whatever holds the memory: the tuple holds it for as long as the call holds the tuple). */
static int buffer_cuda(PyObject *obj, void **ret_ptr, size_t *ret_len, int *ret_dev,
		       void **ret_stream)
{
	unsigned long long ptr, len, stream;
	PyObject *keep;
	int dev;

	if (!PyArg_ParseTuple(obj, "KKiK|O;a CUDA range is (ptr, nbytes, device, stream[, keep])",
			      &ptr, &len, &dev, &stream, &keep))
		return -1;
	if (dev < 0 || (ptr == 0 && len > 0)) {
		PyErr_SetString(PyExc_ValueError, "CUDA range: bad device or NULL pointer");
		return -1;
	}
	*ret_ptr = (void *)(uintptr_t)ptr;
	*ret_len = (size_t)len;
	*ret_dev = dev;
	*ret_stream = (void *)(uintptr_t)stream;
	return 0;
}

int tpy_buffer_tensor(PyObject *obj, Py_buffer *view, bool writable, struct tp_tensor *t,
		      struct tp_slot *s, size_t *ret_len)
{
	struct tp_device dev = { .type = TP_DEVICE_CPU };
	void *ptr, *stream = NULL;
	size_t len;

	view->obj = NULL;
	if (PyTuple_Check(obj)) {
		if (buffer_cuda(obj, &ptr, &len, &dev.index, &stream) < 0)
			return -1;
		dev.type = TP_DEVICE_CUDA;
	} else {
		if (tpy_buffer_get(obj, view, writable, "tensor") < 0)
			return -1;
		ptr = view->buf;
		len = (size_t)view->len;
	}
	if (t) {
		t->device = dev;
		t->data = ptr;
		t->cuda_stream = stream;
	} else {
		s->device = dev;
		s->data = ptr;
		s->cuda_stream = stream;
	}
	*ret_len = len;
	return 0;
}

PyObject *tpy_buffer_alloc(tpy_context *self, PyObject *args)
{
	Py_ssize_t size;
	tpy_buffer *b;
	void *ptr = NULL;
	int r;

	if (!PyArg_ParseTuple(args, "n:alloc_buffer", &size))
		return NULL;
	if (size < 0) {
		PyErr_SetString(PyExc_ValueError, "size must be >= 0");
		return NULL;
	}
	if (!self->ctx || self->closed)
		return tpy_module_closed("Context");
	/* Zero bytes still get a page: the array is empty, the mapping is real. */
	Py_BEGIN_ALLOW_THREADS
	r = tp_buffer_alloc(self->ctx, size ? (size_t)size : 1, &ptr);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return tpy_module_raise(r, NULL);
	b = PyObject_New(tpy_buffer, &tpy_buffer_type);
	if (!b) {
		tp_buffer_free(self->ctx, ptr);
		return NULL;
	}
	b->ctx = (tpy_context *)Py_NewRef(self);
	b->ptr = ptr;
	b->size = size;
	self->n_buffers++;
	return (PyObject *)b;
}

static void buffer_dealloc(tpy_buffer *self)
{
	tpy_context *ctx = self->ctx;

	/* Alive while exported, so no array uses it now; no operation holds it either (they
	 * borrow an export until they return). */
	if (ctx->ctx)
		tp_buffer_free(ctx->ctx, self->ptr);
	tpy_buffer_released(ctx);
	Py_DECREF(ctx);
	PyObject_Free(self);
}

static int buffer_getbuffer(tpy_buffer *self, Py_buffer *view, int flags)
{
	return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->size, 0, flags);
}

static PyBufferProcs buffer_as_buffer = {
	.bf_getbuffer = (getbufferproc)buffer_getbuffer,
};

static PyObject *buffer_get_address(tpy_buffer *self, void *unused)
{
	return PyLong_FromVoidPtr(self->ptr);
}

static Py_ssize_t buffer_len(tpy_buffer *self)
{
	return self->size;
}

static PySequenceMethods buffer_as_sequence = {
	.sq_length = (lenfunc)buffer_len,
};

static PyGetSetDef buffer_getset[] = {
	{ "address", (getter)buffer_get_address, NULL, "the mapping's address", NULL },
	{ 0 }
};

PyTypeObject tpy_buffer_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "_tpipd.SharedBuffer",
	.tp_basicsize = sizeof(tpy_buffer),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Shared memory registered with the daemon (Context.alloc_buffer()). Writable "
		  "through the buffer protocol; unregistered and unmapped when the last view of "
		  "it is gone. It keeps its Context's session open.",
	.tp_dealloc = (destructor)buffer_dealloc,
	.tp_as_buffer = &buffer_as_buffer,
	.tp_as_sequence = &buffer_as_sequence,
	.tp_getset = buffer_getset,
};

int tpy_buffer_add_types(PyObject *m)
{
	if (PyType_Ready(&tpy_buffer_type) < 0)
		return -1;
	return PyModule_AddObjectRef(m, "SharedBuffer", (PyObject *)&tpy_buffer_type);
}
