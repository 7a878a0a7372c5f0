# SPDX-License-Identifier: BSD-3-Clause
"""Device memory for the python suite's CUDA tests, through the CUDA driver the test runs with
(the fakecuda stand-in under `meson test --setup fakecuda`, $TPIPD_CUDA_LIBRARY; else
libcuda.so.1) called with ctypes: allocation, copies to and from the host, streams, and two
small array classes a CUDA framework would provide, one exposing __cuda_array_interface__ and
one exposing __dlpack__/__dlpack_device__. Only the tests use ctypes; the tpipd module does
not. Not a test by itself."""
import ctypes
import os

CUDA_SUCCESS = 0
DL_CUDA = 2
# our dtype name -> (typestr, DLPack code, bits)
DTYPES = {"float32": ("<f4", 2, 32), "int16": ("<i2", 0, 16), "uint8": ("|u1", 1, 8),
          "float64": ("<f8", 2, 64), "int64": ("<i8", 0, 64)}
ITEMSIZE = {"float32": 4, "int16": 2, "uint8": 1, "float64": 8, "int64": 8}


def library_path():
    return os.environ.get("TPIPD_CUDA_LIBRARY") or "libcuda.so.1"


def why_not():
    """None if a CUDA driver with a device answers here, else the reason."""
    try:
        lib = ctypes.CDLL(library_path())
    except OSError as e:
        return f"no CUDA driver ({e}): run `meson test -C build --setup fakecuda --suite hw`"
    r = lib.cuInit(0)
    if r != CUDA_SUCCESS:
        return f"cuInit failed ({r}): no CUDA device"
    return None


class Driver:
    """The driver's primary context of device ``ordinal``, current on the calling thread."""

    def __init__(self, ordinal=0):
        self.lib = lib = ctypes.CDLL(library_path())
        self._ok(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._ok(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev),
                 "cuDevicePrimaryCtxRetain")
        self.current()
        self.ordinal = ordinal
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        lib.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t,
                                        ctypes.c_void_p]
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]

    @staticmethod
    def _ok(r, what):
        if r != CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    def current(self):
        """Make the context current on this thread (ctypes calls from other threads)."""
        self._ok(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def alloc(self, n):
        p = ctypes.c_uint64()
        self._ok(self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(max(n, 1))),
                 "cuMemAlloc")
        return p.value

    def free(self, ptr):
        self._ok(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def htod(self, ptr, data):
        data = bytes(data)
        self._ok(self.lib.cuMemcpyHtoD_v2(ptr, data, len(data)), "cuMemcpyHtoD")

    def dtoh(self, ptr, n):
        buf = ctypes.create_string_buffer(n)
        self._ok(self.lib.cuMemcpyDtoH_v2(buf, ptr, n), "cuMemcpyDtoH")
        return buf.raw

    def stream(self):
        s = ctypes.c_void_p()
        self._ok(self.lib.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return s.value

    def memset_async(self, ptr, value, n, stream):
        self._ok(self.lib.cuMemsetD8Async(ptr, value, n, stream), "cuMemsetD8Async")

    def host_func(self, stream, fn):
        """Queue ``fn()`` on ``stream`` (the stream waits for it to return)."""
        cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: fn())
        self._ok(self.lib.cuLaunchHostFunc(stream, cb, None), "cuLaunchHostFunc")
        return cb  # keep it alive until the stream ran it

    def sync(self, stream):
        self._ok(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")


_pool = {}  # bytes -> device pointers of dead DevAllocs, for the next of that size


class DevAlloc:
    """``n`` bytes of device memory from a pool, as frameworks allocate (torch's caching
    allocator): a DevAlloc that is garbage returns its memory to the pool, never to the
    driver, so the daemon never holds a mapping of freed memory (closing one is undefined
    behaviour in CUDA, and poisons the daemon's context on the stand-in; tp_cuda_release() is
    not acknowledged, so a client cannot know when a freed allocation is safe)."""

    def __init__(self, drv, n):
        free = _pool.get(n)
        self.drv, self.n = drv, n
        self.ptr = free.pop() if free else drv.alloc(n)

    def __del__(self):
        _pool.setdefault(self.n, []).append(self.ptr)


class CaiArray:
    """A C-contiguous device array exposing __cuda_array_interface__ (version 3, with a stream)
    and __dlpack_device__ (its device), over a DevAlloc."""

    def __init__(self, drv, shape, dtype, stream=None, strides=None, alloc=None):
        self.shape, self.dtype, self.drv = tuple(shape), dtype, drv
        self.nbytes = ITEMSIZE[dtype]
        for d in self.shape:
            self.nbytes *= d
        self.mem = alloc or DevAlloc(drv, self.nbytes)
        self.stream, self.strides = stream, strides

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": DTYPES[self.dtype][0], "strides": self.strides,
                "data": (self.mem.ptr, False), "version": 3, "stream": self.stream}

    def __dlpack_device__(self):
        return (DL_CUDA, self.drv.ordinal)

    def to_host(self):
        return self.drv.dtoh(self.mem.ptr, self.nbytes)


# ---- a DLPack producer ------------------------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLArray:
    """A C-contiguous device array exposing only __dlpack__ and __dlpack_device__ (no deleter:
    the structures live as long as this object, which outlives every capsule in these
    tests). ``streams`` records the stream each __dlpack__ call asked for."""

    def __init__(self, drv, shape, dtype):
        self.shape, self.dtype, self.drv = tuple(shape), dtype, drv
        self.nbytes = ITEMSIZE[dtype]
        for d in self.shape:
            self.nbytes *= d
        self.mem = DevAlloc(drv, self.nbytes)
        self.streams = []
        self._keep = []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        _, code, bits = DTYPES[self.dtype]
        m = _DLManaged(data=self.mem.ptr, device=_DLDevice(DL_CUDA, self.drv.ordinal),
                       ndim=len(self.shape), dtype=_DLDataType(code, bits, 1),
                       shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)))
        self._keep.append((shape, m))
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)

    def __dlpack_device__(self):
        return (DL_CUDA, self.drv.ordinal)

    def to_host(self):
        return self.drv.dtoh(self.mem.ptr, self.nbytes)


def dlpack_info(obj):
    """(data pointer, (device type, id), shape, (code, bits)) of obj.__dlpack__()'s capsule,
    read as a consumer would (the capsule is not consumed)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    cap = obj.__dlpack__()
    m = _DLManaged.from_address(get(cap, b"dltensor"))
    shape = tuple(m.shape[i] for i in range(m.ndim))
    info = (m.data + m.byte_offset, (m.device.device_type, m.device.device_id), shape,
            (m.dtype.code, m.dtype.bits))
    del m, cap
    return info
