# SPDX-License-Identifier: BSD-3-Clause
"""CUDA memory in the tpipd package: which objects are CUDA tensors (torch CUDA tensors, any
object with ``__cuda_array_interface__``, any DLPack producer whose ``__dlpack_device__()`` is
CUDA), their device range, dtype and shape as libtpclient and the tensor header need them, and
the release of the daemon's mapping of their allocation (tp_cuda_release()) once such an object
is garbage. Allocating or copying device memory is not done here: the module links no CUDA
library (libtpclient loads the driver itself); readers allocate through their framework.

Streams: a ``__cuda_array_interface__`` object's ``stream`` (version 3; None or absent: the
legacy default stream) and a torch tensor's current stream go to libtpclient, whose copy starts
after the work queued on that stream; DLPack producers are asked for ``__dlpack__(stream=1)``,
so they order their pending work before the legacy default stream, and libtpclient waits for
that one."""
import math
import threading
import weakref

from . import _tensor, _tpipd

DL_CUDA = 2
CU_STREAM_LEGACY = 1

# DLPack (type code, bits) -> our dtype code (_tensor.DTYPES); DLPack bool is code 6
_DL_CODES = {(0, 8): 2, (1, 8): 3, (0, 16): 4, (1, 16): 5, (0, 32): 6, (1, 32): 7, (0, 64): 8,
             (1, 64): 9, (2, 16): 10, (4, 16): 11, (2, 32): 12, (2, 64): 13, (5, 64): 14,
             (5, 128): 15, (6, 8): 1}
# __cuda_array_interface__ typestr (kind, itemsize) -> our dtype code
_CAI_CODES = {("b", 1): 1, ("i", 1): 2, ("u", 1): 3, ("i", 2): 4, ("u", 2): 5, ("i", 4): 6,
              ("u", 4): 7, ("i", 8): 8, ("u", 8): 9, ("f", 2): 10, ("f", 4): 12, ("f", 8): 13,
              ("c", 8): 14, ("c", 16): 15}

_CAI_TYPESTR = {code: ("|" if size == 1 else "<") + kind + str(size)
                for (kind, size), code in _CAI_CODES.items()}


def _dlpack_device(obj):
    f = getattr(obj, "__dlpack_device__", None)
    if f is None:
        return None
    try:
        return tuple(f())
    except Exception:  # noqa: BLE001 - a producer that cannot say is not a CUDA one
        return None


def is_cuda(obj):
    """Whether ``obj`` is a tensor in CUDA device memory (torch, CAI or DLPack)."""
    if _tensor.is_torch(obj):
        return obj.is_cuda
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = _dlpack_device(obj)
    return dev is not None and dev[0] == DL_CUDA


def torch_range(t):
    """(ptr, nbytes, device, stream) of a contiguous torch CUDA tensor, on its current
    stream (torch 1.13's __cuda_array_interface__ names no stream and refuses tensors that
    require grad, so torch's own accessors are used)."""
    torch = _tensor.torch_module()
    stream = torch.cuda.current_stream(t.device).cuda_stream
    return (t.data_ptr(), t.numel() * t.element_size(), t.device.index or 0, stream)


def _cai(obj, what, writable):
    """(range, dtype code, shape) of a __cuda_array_interface__ object."""
    cai = obj.__cuda_array_interface__
    ts = cai["typestr"]
    code = _CAI_CODES.get((ts[1:2], int(ts[2:] or 0))) if ts[:1] in "<|" else None
    if code is None:
        raise _tpipd.InvalidArgument(22, f"{what}: CUDA dtype {ts} cannot travel through tpipd")
    shape = tuple(int(d) for d in cai["shape"])
    item = _tensor.DTYPES[code][1]
    strides = cai.get("strides")
    if strides is not None and 0 not in shape:
        want = item
        for d, s in zip(reversed(shape), reversed(tuple(strides))):
            if d != 1 and s != want:
                raise _tpipd.InvalidArgument(
                    22, f"{what} is not contiguous (strides {tuple(strides)}): make it "
                    "contiguous first (its framework's copy)")
            want *= d
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise _tpipd.InvalidArgument(22, f"{what}: destination is read-only")
    nbytes = math.prod(shape) * item
    if ptr == 0 and nbytes:
        raise _tpipd.InvalidArgument(22, f"{what}: CUDA pointer is NULL")
    dev = _dlpack_device(obj)
    device = dev[1] if dev is not None and dev[0] == DL_CUDA else 0
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return (ptr or 0, nbytes, device, stream or 0), code, shape


def describe(obj, what, writable=False):
    """(range, dtype code, shape, keep-alive) of a CUDA object that is not a torch tensor,
    or None if ``obj`` is not one. range is (ptr, nbytes, device, stream) for libtpclient;
    keep-alive (a DLPack capsule or None) must live until libtpclient is done with it."""
    if hasattr(obj, "__cuda_array_interface__"):
        rng, code, shape = _cai(obj, what, writable)
        return rng, code, shape, None
    dev = _dlpack_device(obj)
    if dev is None or dev[0] != DL_CUDA:
        return None
    cap, rng, dl, shape = _tpipd.dlpack_cuda(obj)
    code = _DL_CODES.get(tuple(dl))
    if code is None:
        raise _tpipd.InvalidArgument(22, f"{what}: DLPack dtype {dl} cannot travel through "
                                     "tpipd")
    return rng, code, tuple(shape), cap


class CudaArray:
    """A C-contiguous array over CUDA memory the caller allocated, for frameworks to consume:
    ``__cuda_array_interface__`` (version 3) and ``__dlpack__`` / ``__dlpack_device__`` (CUDA,
    no copy; the capsule keeps this array's ``owner``). Pipes write from it and read into it;
    a ``cuda_alloc`` of Pipe.read() can return one over raw device memory (from any allocator)
    so that the received tensor is an object torch.from_dlpack(), CuPy or Numba take as it is.

    CudaArray(ptr, shape, dtype, device=0, owner=None, stream=None): ``ptr`` a device pointer
    (int), ``dtype`` one of tpipd's dtype names ("float32", ...), ``owner`` whatever keeps the
    memory allocated (held as long as this array or a tensor made from it lives), ``stream``
    the CUstream (int) whose queued work produces the bytes (None: nothing pending)."""

    def __init__(self, ptr, shape, dtype, device=0, owner=None, stream=None):
        if isinstance(shape, int):
            shape = (shape,)
        code = _tensor._CODE_OF.get(dtype)
        if code is None:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_tensor._CODE_OF)}")
        self.ptr, self.shape, self.dtype = int(ptr), tuple(int(d) for d in shape), dtype
        self.device, self.owner, self.stream = int(device), owner, stream
        self.nbytes = math.prod(self.shape) * _tensor.DTYPES[code][1]
        # bool travels in DLPack as uint8 (see _tensor.from_memory)
        dl_code = _tensor._CODE_OF["uint8"] if dtype == "bool" else code
        self._view = _tpipd.dlpack_cuda_view(self.ptr, self.device, dl_code, self.shape, owner)

    @property
    def __cuda_array_interface__(self):
        ts = _CAI_TYPESTR.get(_tensor._CODE_OF[self.dtype])
        if ts is None:
            raise TypeError(f"{self.dtype} has no __cuda_array_interface__ typestr")
        return {"shape": self.shape, "typestr": ts, "strides": None,
                "data": (self.ptr, False), "version": 3, "stream": self.stream}

    def __dlpack__(self, stream=None):
        return self._view.__dlpack__()

    def __dlpack_device__(self):
        return (DL_CUDA, self.device)

    def __repr__(self):
        return (f"<tpipd.CudaArray {self.dtype}{list(self.shape)} cuda:{self.device} "
                f"at {self.ptr:#x}>")


# ---- release of the daemon's mappings ---------------------------------------------------------

# raw context -> {id(obj): weakref.finalize}: the CUDA objects that context wrote from or read
# into and that are still alive. Each finalizer releases its object's allocations once.
_sent = weakref.WeakKeyDictionary()
_lock = threading.RLock()  # reentrant: a finalizer may run (GC) while this thread holds it


def _release(ctx_ref, key, ptrs):
    ctx = ctx_ref()
    if ctx is None:
        return
    with _lock:
        reg = _sent.get(ctx)
        if reg is not None:
            reg.pop(key, None)
    if ctx.closed:
        return  # the session's end dropped every mapping
    for p in ptrs:
        try:
            ctx.cuda_release(p)
        except _tpipd.Error:
            pass  # not CUDA memory any more (freed before its object died), or no daemon


def owner(obj):
    """What holds the memory of ``obj`` for as long as it matters: a torch view's base tensor
    (so that writing a temporary view, ``t[:n]``, does not drop the mapping of ``t`` when the
    view dies right after the write), else ``obj``."""
    if _tensor.is_torch(obj):
        while obj._base is not None:
            obj = obj._base
    return obj


def track(ctx, obj, ptr):
    """Release the daemon's mapping of the allocation holding ``ptr`` (through context
    ``ctx``, a _tpipd.Context) when ``obj`` (its owner(): a torch view's base) is garbage.
    Return: False if it cannot be tracked (no weak references): the mapping then lives until
    released by hand or the context closes."""
    obj = owner(obj)
    with _lock:
        reg = _sent.setdefault(ctx, {})
        f = reg.get(id(obj))
        if f is not None and f.alive:
            f.peek()[2][2].add(ptr)
            return True
        try:
            f = weakref.finalize(obj, _release, weakref.ref(ctx), id(obj), {ptr})
        except TypeError:
            return False
        f.atexit = False
        reg[id(obj)] = f
        return True


def track_wire(ctx, wire):
    """track() the CUDA tensors of to_wire() results ``wire`` written through ``ctx``."""
    for b, _, keep in wire:
        if type(b) is tuple:  # a CUDA range: (ptr, nbytes, device, stream)
            track(ctx, keep[0] if type(keep) is tuple else keep, b[0])


def release(ctx, obj):
    """Release now what ``obj`` (a CUDA object or a device pointer) holds mapped through
    ``ctx``; its finalizer, if any, is dropped."""
    if isinstance(obj, int):
        ctx.cuda_release(obj)
        return
    with _lock:
        f = _sent.get(ctx, {}).pop(id(owner(obj)), None)
    ptrs = set()
    if f is not None:
        info = f.detach()
        if info is not None:
            ptrs = info[2][2]
    if not ptrs:
        if _tensor.is_torch(obj):
            ptrs = {obj.data_ptr()}
        else:
            d = describe(obj, "cuda_release")
            if d is None:
                raise _tpipd.InvalidArgument(22, "cuda_release: not a CUDA tensor")
            ptrs = {d[0][0]}
    for p in ptrs:
        ctx.cuda_release(p)


def forget(ctx):
    """``ctx`` closes (its session's end drops its mappings): drop its finalizers."""
    with _lock:
        reg = _sent.pop(ctx, None)
    for f in (reg or {}).values():
        f.detach()


def tracked(ctx):
    """How many live CUDA objects ``ctx`` will release (for tests)."""
    with _lock:
        return sum(1 for f in _sent.get(ctx, {}).values() if f.alive)
