# SPDX-License-Identifier: BSD-3-Clause
"""Tensor framing for tpipd: which objects can travel as tensors (numpy arrays through the
buffer protocol, torch tensors on the CPU through DLPack, other DLPack producers as numpy arrays
(numpy.from_dlpack), CUDA tensors as ranges (_cuda.py)), the versioned header
that carries their dtype and shape in each tensor's metadata, its validation on read (the bytes
come from another process: every field is bounded), allocation of the reader's objects, and
arrays and tensors over memory the module holds (from_memory(), through DLPack: no copy).
Moving bytes is the C extension's job (_tpipd), not this module's.

Header, version 1 (little endian, 8 + 8 * ndim bytes, nothing after it):

    offset 0  4 bytes  magic b"TPT" followed by the version byte 0x01
    offset 4  u8       kind: 0 numpy.ndarray, 1 torch.Tensor
    offset 5  u8       dtype code (DTYPES below)
    offset 6  u8       ndim, 0..32 (0: a scalar array)
    offset 7  u8       flags, 0 (a reader refuses other values)
    offset 8  u64[ndim] shape, each at most 2**48

The tensor's byte length (in the descriptor) must equal prod(shape) * itemsize.
"""
import math
import struct

from . import _tpipd

MAGIC = b"TPT\x01"
VERSION = 1
MAX_NDIM = 32
MAX_DIM = 1 << 48
KIND_NUMPY = 0
KIND_TORCH = 1

# code: (name, itemsize, collective dtype code of libtpclient or 0)
DTYPES = {
    1: ("bool", 1, 0),
    2: ("int8", 1, 5),
    3: ("uint8", 1, 6),
    4: ("int16", 2, 0),
    5: ("uint16", 2, 0),
    6: ("int32", 4, 7),
    7: ("uint32", 4, 0),
    8: ("int64", 8, 8),
    9: ("uint64", 8, 0),
    10: ("float16", 2, 1),
    11: ("bfloat16", 2, 2),
    12: ("float32", 4, 3),
    13: ("float64", 8, 4),
    14: ("complex64", 8, 0),
    15: ("complex128", 16, 0),
}
_CODE_OF = {name: code for code, (name, _, _) in DTYPES.items()}

_torch = None


def torch_module():
    """torch if it is installed (imported on first need), else None."""
    global _torch
    if _torch is None:
        try:
            import torch
            _torch = torch
        except ImportError:
            _torch = False
    return _torch or None


def _np():
    try:
        import numpy
    except ImportError as e:
        raise ImportError(f"tpipd: tensors need numpy (Debian: python3-numpy): {e}") from None
    return numpy


def is_torch(obj):
    t = torch_module() if "torch" in type(obj).__module__ else None
    return t is not None and isinstance(obj, t.Tensor)


def dtype_name(obj_dtype):
    """Our name for a numpy or torch dtype (str), or None when it cannot travel."""
    s = str(obj_dtype)
    if s.startswith("torch."):
        s = s[6:]
    else:
        np = _np()
        d = np.dtype(obj_dtype)
        if d.byteorder == ">" or (d.byteorder == "=" and not np.little_endian):
            return None
        s = d.name
    return s if s in _CODE_OF else None


def _dtype_code(obj):
    name = dtype_name(obj.dtype)
    if name is None:
        raise _tpipd.InvalidArgument(22, f"dtype {obj.dtype} cannot travel through tpipd "
                                     f"(supported: {', '.join(_CODE_OF)})")
    return _CODE_OF[name]


def pack_header(kind, code, shape):
    if len(shape) > MAX_NDIM:
        raise _tpipd.InvalidArgument(22, f"{len(shape)} dimensions, at most {MAX_NDIM}")
    return MAGIC + bytes((kind, code, len(shape), 0)) + struct.pack(f"<{len(shape)}Q", *shape)


def unpack_header(meta, length):
    """(kind, dtype code, shape) of a received tensor; ProtocolError for anything malformed."""
    def bad(why):
        return _tpipd.ProtocolError(74, f"malformed tensor header: {why}")
    if len(meta) < 8:
        raise bad(f"{len(meta)} bytes, at least 8")
    if meta[:3] != MAGIC[:3]:
        raise bad("bad magic (not sent by tpipd's Python module?)")
    if meta[3] != VERSION:
        raise bad(f"version {meta[3]}, this module reads {VERSION}")
    kind, code, ndim, flags = meta[4], meta[5], meta[6], meta[7]
    if kind not in (KIND_NUMPY, KIND_TORCH):
        raise bad(f"kind {kind}")
    if code not in DTYPES:
        raise bad(f"dtype code {code}")
    if ndim > MAX_NDIM:
        raise bad(f"{ndim} dimensions, at most {MAX_NDIM}")
    if flags:
        raise bad(f"flags {flags:#x}")
    if len(meta) != 8 + 8 * ndim:
        raise bad(f"{len(meta)} bytes for {ndim} dimensions")
    shape = struct.unpack_from(f"<{ndim}Q", meta, 8)
    n = DTYPES[code][1]
    for d in shape:
        if d > MAX_DIM:
            raise bad(f"dimension {d} over {MAX_DIM}")
        n *= d
        if n > length:  # also bounds the product: Python ints do not overflow, but stay small
            n = length + 1
    if n != length:
        raise bad(f"shape {tuple(shape)} of {DTYPES[code][0]} is not {length} bytes")
    return kind, code, tuple(shape)


def _contiguous(obj, contiguous, what):
    if contiguous:
        return obj.contiguous() if is_torch(obj) else _np().ascontiguousarray(obj)
    raise _tpipd.InvalidArgument(
        22, f"{what} is not contiguous (strides {tuple(obj.stride()) if is_torch(obj) else obj.strides}): "
        "pass contiguous=True to send a contiguous copy, or call .contiguous() / "
        "numpy.ascontiguousarray() yourself")


def cpu_buffer(obj):
    """A buffer-protocol object over the bytes of a contiguous CPU tensor or array (a numpy
    view; a copy of nothing). The module itself passes wire_buffer() to the extension."""
    if is_torch(obj):
        t = obj.detach()
        if t.dtype == torch_module().bfloat16:
            t = t.view(torch_module().int16)
        return t.numpy()
    return obj


def wire_buffer(obj):
    """What the extension reads as the bytes of a contiguous CPU tensor or array, without a
    copy: a numpy array (buffer protocol) as it is, a torch tensor as itself (the extension
    takes its memory through __dlpack__, so numpy is not needed; bool, which DLPack cannot
    carry, as a uint8 view)."""
    if is_torch(obj):
        t = obj.detach()
        if t.dtype == torch_module().bool:
            t = t.view(torch_module().uint8)
        return t
    return obj


def raw_bytes(buf):
    """A copy of the bytes of what wire_buffer() returned (bytes)."""
    return cpu_buffer(buf).tobytes()


def from_dlpack_object(obj, what):
    """A numpy array over the memory of a DLPack producer that is neither numpy nor torch (no
    copy; numpy.from_dlpack). InvalidArgument when it cannot be read as one."""
    try:
        return _np().from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise _tpipd.InvalidArgument(22, f"{what}: its __dlpack__ cannot be read as a CPU "
                                     f"array: {e}") from None


def from_memory(buf, offset, kind, code, shape):
    """The array (kind 0, or torch absent) or tensor of dtype ``code`` and ``shape`` over the
    writable buffer ``buf`` from byte ``offset``, without a copy: torch.from_dlpack() /
    numpy.from_dlpack() of a _tpipd.DLView, which keeps ``buf`` alive as long as the result
    (or a view of it) lives. bool travels as uint8 and is viewed back."""
    name = DTYPES[code][0]
    torch = torch_module() if kind == KIND_TORCH or name == "bfloat16" else None
    dl_code = _CODE_OF["uint8"] if name == "bool" else code
    if kind == KIND_TORCH and torch is not None:
        if getattr(torch, name, None) is None:
            raise _tpipd.NotSupported(95, f"this torch has no dtype {name}")
        t = torch.from_dlpack(_tpipd.dlpack_view(buf, offset, dl_code, shape))
        return t.view(torch.bool) if name == "bool" else t
    if name == "bfloat16":
        raise _tpipd.NotSupported(95, "a bfloat16 tensor needs torch to be received")
    np = _np()
    global _np_dlpack_writable
    if _np_dlpack_writable:
        a = np.from_dlpack(_tpipd.dlpack_view(buf, offset, dl_code, shape))
        _np_dlpack_writable = a.flags.writeable
    if not _np_dlpack_writable:  # numpy before 1.25 makes DLPack arrays read-only
        dt = np.dtype("uint8" if name == "bool" else name)
        a = np.frombuffer(buf, dt, count=math.prod(shape), offset=offset).reshape(shape)
    return a.view(np.bool_) if name == "bool" else a


_np_dlpack_writable = True  # until numpy.from_dlpack() is seen to return a read-only array


def to_wire(obj, contiguous=False, what="tensor"):
    """(buffer or CUDA range, header, keep-alive) for a tensor to write. A CUDA range is a
    tuple (ptr, nbytes, device, stream); keep-alive is the object itself, or (object, DLPack
    capsule) for a CUDA DLPack producer."""
    if is_torch(obj):
        if not obj.is_contiguous():
            obj = _contiguous(obj, contiguous, what)
        code = _dtype_code(obj)
        hdr = pack_header(KIND_TORCH, code, tuple(obj.shape))
        if obj.is_cuda:
            return _cuda.torch_range(obj), hdr, obj
        return wire_buffer(obj), hdr, obj
    np = _np()
    if isinstance(obj, np.generic):
        obj = np.asarray(obj)  # a numpy scalar: sent as a 0-d array
    if not isinstance(obj, np.ndarray):
        cuda = _cuda.describe(obj, what)  # __cuda_array_interface__ or a CUDA __dlpack__
        if cuda is not None:
            rng, code, shape, cap = cuda
            return rng, pack_header(KIND_NUMPY, code, shape), (obj, cap)
    if not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack__"):
        obj = from_dlpack_object(obj, what)  # another DLPack producer: read as numpy
    if not isinstance(obj, np.ndarray):
        raise TypeError(f"{what}: a numpy.ndarray or torch.Tensor is needed, not "
                        f"{type(obj).__name__} (send bytes-like objects as payloads)")
    if not obj.flags.c_contiguous:
        obj = _contiguous(obj, contiguous, what)
    code = _dtype_code(obj)
    return obj, pack_header(KIND_NUMPY, code, obj.shape), obj


def empty_like_header(kind, code, shape, device_type=0, device_index=0, alloc=None,
                      cuda_alloc=None):
    """A new array (kind 0, or torch absent and the dtype numpy's) or tensor for a header;
    for a tensor the writer sent from CUDA memory (device_type 1): cuda_alloc(shape, dtype
    name, device index) where given, a torch CUDA tensor where kind is torch and torch sees
    a GPU, else host memory."""
    name = DTYPES[code][0]
    if device_type == 1 and cuda_alloc is not None:
        return cuda_alloc(shape, name, device_index)
    torch = torch_module() if kind == KIND_TORCH or name == "bfloat16" else None
    if kind == KIND_TORCH and torch is not None:
        dt = getattr(torch, name, None)
        if dt is None:
            raise _tpipd.NotSupported(95, f"this torch has no dtype {name}")
        if device_type == 1 and torch.cuda.is_available():
            # the writer's device number; a reader with fewer GPUs (another host) uses its own
            if device_index >= torch.cuda.device_count():
                device_index = torch.cuda.current_device()
            return torch.empty(shape, dtype=dt, device=f"cuda:{device_index}")
        if alloc is not None:
            return alloc(shape, name, "torch")
        return torch.empty(shape, dtype=dt)
    if name == "bfloat16":
        raise _tpipd.NotSupported(95, "a bfloat16 tensor needs torch to be received")
    if alloc is not None:
        return alloc(shape, name, "numpy")
    return _np().empty(shape, dtype=name)


def check_destination(obj, code, shape, what):
    """(buffer or CUDA range, keep-alive) of a destination the caller passed: a numpy array,
    a torch tensor, or a CUDA object (__cuda_array_interface__ or a CUDA __dlpack__); it must
    match exactly. keep-alive (a DLPack capsule or None) must live until the read is done."""
    name = DTYPES[code][0]

    def mismatch(got_name, got_shape):
        return _tpipd.InvalidArgument(22, f"{what}: the message holds {name}{list(shape)}, "
                                      f"the destination is {got_name}{list(got_shape)}")
    if is_torch(obj) or isinstance(obj, _np().ndarray):
        if dtype_name(obj.dtype) != name or tuple(obj.shape) != tuple(shape):
            raise mismatch(obj.dtype, obj.shape)
    if is_torch(obj):
        if not obj.is_contiguous():
            raise _tpipd.InvalidArgument(22, f"{what}: destination is not contiguous")
        return (_cuda.torch_range(obj) if obj.is_cuda else wire_buffer(obj)), None
    if isinstance(obj, _np().ndarray):
        if not obj.flags.c_contiguous or not obj.flags.writeable:
            raise _tpipd.InvalidArgument(22, f"{what}: destination is not contiguous and "
                                         "writable")
        return obj, None
    cuda = _cuda.describe(obj, what, writable=True)
    if cuda is None:
        raise TypeError(f"{what}: a destination is a numpy.ndarray, a torch.Tensor or a CUDA "
                        f"array, not {type(obj).__name__}")
    rng, got, got_shape, cap = cuda
    if got != code or got_shape != tuple(shape):
        raise mismatch(DTYPES[got][0], got_shape)
    return rng, cap

from . import _cuda  # noqa: E402 - it uses this module's names
