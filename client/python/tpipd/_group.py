# SPDX-License-Identifier: BSD-3-Clause
"""Groups and collectives with torch.distributed's shape over _tpipd: init_group() (arguments or
the environment), all_reduce in place, broadcast, barrier, all_gather, reduce_scatter, and
Work handles for async_op=True. The reductions run in libtpclient; this module maps tensors,
dtypes and op names. Not here: pipes (_pipe.py)."""
import os

from . import _cuda, _tensor, _tpipd

_BOOTSTRAP = {"auto": 0, "local": 1, "coordinator": 2, "slurm": 3}
_OPS = {"sum": 1, "prod": 2, "min": 3, "max": 4}


class ReduceOp:
    """Reduction operations (torch.distributed.ReduceOp's names)."""
    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"


def _op(op):
    code = _OPS.get(op) if type(op) is str else None  # the common case: a name
    if code is not None:
        return code
    name = getattr(op, "name", op)
    name = str(name).lower()
    if name == "product":
        name = "prod"
    if name not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, not {op!r}")
    return _OPS[name]


def _to_dlpack(t):
    global _to_dlpack
    from torch.utils.dlpack import to_dlpack
    _to_dlpack = to_dlpack  # from now on, directly
    return to_dlpack(t)


_CODES = {}  # numpy or torch dtype -> collective dtype code (0: none), filled on first use


def _code(t, what):
    code = _CODES.get(t.dtype)
    if code is None:
        name = _tensor.dtype_name(t.dtype)
        code = _CODES[t.dtype] = _tensor.DTYPES[_tensor._CODE_OF[name]][2] if name else 0
    if not code:
        raise _tpipd.InvalidArgument(22, f"{what}: dtype {t.dtype} has no reduction (float16, "
                                     "bfloat16, float32, float64, int8, uint8, int32, int64)")
    return code


def _buf(t, what):
    """(buffer, collective dtype code) of a contiguous tensor or array: a numpy array as
    itself (buffer protocol), a CPU torch tensor as its DLPack capsule (to_dlpack: no copy, no
    detach() needed, cheaper than Tensor.__dlpack__), a CUDA tensor (torch, or an object with
    __cuda_array_interface__ or a CUDA __dlpack__) as a range (ptr, nbytes, device, stream,
    keep-alive) that the extension hands libtpclient with its device and stream. Called once
    per collective: kept short."""
    if _tensor.is_torch(t):
        if not t.is_contiguous():
            raise _tpipd.InvalidArgument(22, f"{what} is not contiguous")
        if t.is_cuda:
            return _cuda.torch_range(t) + (t,), _code(t, what)
        return _to_dlpack(t), _code(t, what)
    np = _tensor._np()
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise _tpipd.InvalidArgument(22, f"{what} is not contiguous")
        return t, _code(t, what)
    cuda = _cuda.describe(t, what, writable=True)
    if cuda is None:
        raise TypeError(f"{what}: a numpy.ndarray, a torch.Tensor or a CUDA array is needed, "
                        f"not {type(t).__name__}")
    rng, code, _, cap = cuda
    coll = _tensor.DTYPES[code][2]
    if not coll:
        raise _tpipd.InvalidArgument(22, f"{what}: dtype {_tensor.DTYPES[code][0]} has no "
                                     "reduction")
    return rng + (cap,), coll


class Work:
    """An asynchronous collective (async_op=True). Its tensors are borrowed until wait()."""

    def __init__(self, req, after=None):
        self._req = req
        self._after = after

    def wait(self):
        """Wait for the collective (GIL released); raise its error. Returns True."""
        self._req.wait()
        if self._after is not None:
            after, self._after = self._after, None
            after()
        return True

    def is_completed(self):
        return self._req.is_completed()

    def get_future(self):
        """A concurrent.futures.Future completed (with True, or the error) when the collective
        ends; wait() runs on a helper thread."""
        import concurrent.futures
        global _waiters
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="tpipd-coll")
        return _waiters.submit(self.wait)

    def __await__(self):
        import asyncio
        return asyncio.wrap_future(self.get_future()).__await__()


_waiters = None


def _run(req, after=None):
    if isinstance(req, _tpipd.CollReq):
        return Work(req, after)
    if after is not None:
        after()
    return None


class Group:
    """Members running collectives together. Every member calls the same collectives in the
    same order with matching arguments (Mismatch otherwise); a member that dies fails the
    others' collectives with PeerDied, one that leaves or aborts with PipeClosed. Tensors are
    borrowed for the call (async: until Work.wait()). One thread at a time per member.

    Tensors are CPU (numpy, torch) or CUDA (torch CUDA tensors, __cuda_array_interface__
    objects, CUDA DLPack producers): libtpclient copies a CUDA input to host memory after the
    work queued on its stream, reduces there, and copies the result back on that stream,
    waiting for it before the call returns (async: before wait() returns)."""

    def __init__(self, raw, context, own_context):
        self._raw = raw
        self._context = context
        self._own = own_context

    rank = property(lambda self: self._raw.rank)
    size = property(lambda self: self._raw.size)
    local_rank = property(lambda self: self._raw.local_rank)
    local_size = property(lambda self: self._raw.local_size)

    def all_reduce(self, tensor, op="sum", async_op=False):
        """Reduce ``tensor`` over the members, in place (rank order: identical everywhere)."""
        b, code = _buf(tensor, "tensor")
        r = self._raw.allreduce(b, b, code, _op(op), async_op)
        return None if r is None else _run(r)

    def broadcast(self, tensor, src=0, async_op=False):
        """Copy ``tensor`` of rank ``src`` into ``tensor`` of every member."""
        b, code = _buf(tensor, "tensor")
        return _run(self._raw.broadcast(b, code, src, async_op))

    def barrier(self, async_op=False):
        """Return once every member called barrier()."""
        return _run(self._raw.barrier(async_op))

    def all_gather(self, output, tensor, async_op=False):
        """Gather every rank's ``tensor``: ``output`` is a list of size tensors (as
        torch.distributed) or one tensor of size * numel elements (all_gather_into_tensor)."""
        b, code = _buf(tensor, "tensor")
        if isinstance(output, (list, tuple)):
            if len(output) != self.size:
                raise ValueError(f"output: {self.size} tensors needed")
            flat = _flat_like(tensor, self.size)
            fb, _ = _buf(flat, "output")

            def after():
                for i, o in enumerate(output):
                    _copy_into(o, flat[i])
            return _run(self._raw.allgather(b, fb, code, async_op), after)
        ob, ocode = _buf(output, "output")
        return _run(self._raw.allgather(b, ob, code, async_op))

    def reduce_scatter(self, output, input, op="sum", async_op=False):
        """Reduce ``input`` (a list of size tensors, or one of size * numel elements) over the
        members; rank r's ``output`` gets part r."""
        ob, code = _buf(output, "output")
        if isinstance(input, (list, tuple)):
            if len(input) != self.size:
                raise ValueError(f"input: {self.size} tensors needed")
            input = _stack(input)
        ib, _ = _buf(input, "input")
        return _run(self._raw.reduce_scatter(ib, ob, code, _op(op), async_op))

    def abort(self):
        """Fail the group for every member (they get PipeClosed naming this rank)."""
        self._raw.abort()

    def leave(self):
        """Wait for this member's async collectives, then leave (the others' later calls fail
        with PipeClosed: leave after the last one)."""
        self._raw.leave()
        if self._own:
            self._context.close()

    destroy = leave

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()


def _flat_like(t, n):
    if _tensor.is_torch(t):
        return _tensor.torch_module().empty((n,) + tuple(t.shape), dtype=t.dtype,
                                            device=t.device)
    if not isinstance(t, _tensor._np().ndarray):
        raise _tpipd.NotSupported(95, "the list form needs torch tensors or numpy arrays (the "
                                  "module cannot allocate device memory): pass one tensor")
    return _tensor._np().empty((n,) + t.shape, dtype=t.dtype)


def _stack(ts):
    if not _tensor.is_torch(ts[0]) and not isinstance(ts[0], _tensor._np().ndarray):
        raise _tpipd.NotSupported(95, "the list form needs torch tensors or numpy arrays (the "
                                  "module cannot allocate device memory): pass one tensor")
    if _tensor.is_torch(ts[0]):
        return _tensor.torch_module().stack(list(ts)).contiguous()
    return _tensor._np().ascontiguousarray(_tensor._np().stack(ts))


def _copy_into(dst, src):
    if _tensor.is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src


_default = None


def init_group(name=None, world_size=None, rank=None, *, context=None, bootstrap="auto",
               join_timeout=None, op_timeout=None, coordinator=None, remote=None):
    """Join group ``name`` and make it the default of the module-level collectives.

    Missing arguments come from the environment: TPIPD_GROUP (default "default"), WORLD_SIZE
    (or TPIPD_WORLD_SIZE), RANK (or TPIPD_RANK; absent: the daemon assigns ranks in join
    order). bootstrap (libtpclient's): "local" (members on this host, through its daemon);
    "coordinator" (members on several hosts, joined through the daemon at ``coordinator``,
    tpip://HOST[:PORT], over authenticated peer links); "slurm" (rank and size from Slurm's
    variables, world_size then optional; the group NAME@slurm:JOB.STEP, joined locally for a
    one-node step, else through the daemon of the step's first node); "auto": "slurm" in a
    Slurm task whose size and rank are the step's (or not given), else "local".
    remote: which peer daemons may take part in a group across hosts (libtpclient's
    tp_group_options.remote): None or "none" (libtpclient's default, this host's members
    only, unless TP_GROUP_REMOTE in the environment says otherwise), "any-peer" (any
    authenticated peer daemon), or a list of peer identities ("psk", "cert:HOST", or an
    identity as `tpipctl peers` shows it).
    Every member must state the same; a coordinator on another host needs one that allows it.
    Blocks until every member joined (Timeout after join_timeout seconds, 30 by default).
    context: a Context to use (kept open); None opens one that leave() closes."""
    global _default
    from ._pipe import Context
    env = os.environ
    name = name or env.get("TPIPD_GROUP", "default")
    slurm = bootstrap == "slurm" or (bootstrap == "auto" and "SLURM_JOB_ID" in env and
                                     "SLURM_PROCID" in env)
    if world_size is None:
        ws = env.get("WORLD_SIZE") or env.get("TPIPD_WORLD_SIZE")
        if ws is None and not slurm:
            raise ValueError("world_size not given and WORLD_SIZE not set")
        world_size = 0 if ws is None else int(ws)  # 0 in a Slurm task: libtpclient's count
    if rank is None:
        r = env.get("RANK") or env.get("TPIPD_RANK")
        rank = int(r) if r is not None else -1
    if bootstrap not in _BOOTSTRAP:
        raise ValueError(f"bootstrap must be one of {sorted(_BOOTSTRAP)}")
    own = context is None
    ctx = Context() if own else context
    try:
        raw = ctx._raw.join_group(name, int(world_size), int(rank), _BOOTSTRAP[bootstrap],
                                  int((join_timeout or 0) * 1000), int((op_timeout or 0) * 1000),
                                  coordinator, remote)
    except BaseException:
        if own:
            ctx.close()
        raise
    g = Group(raw, ctx, own)
    _default = g
    return g


def _group(group):
    g = group or _default
    if g is None:
        raise RuntimeError("no group: call tpipd.init_group() first")
    return g


def all_reduce(tensor, op="sum", group=None, async_op=False):
    return _group(group).all_reduce(tensor, op, async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return _group(group).broadcast(tensor, src, async_op)


def barrier(group=None, async_op=False):
    return _group(group).barrier(async_op)


def all_gather(output, tensor, group=None, async_op=False):
    return _group(group).all_gather(output, tensor, async_op)


def reduce_scatter(output, input, op="sum", group=None, async_op=False):
    return _group(group).reduce_scatter(output, input, op, async_op)


def destroy_group(group=None):
    global _default
    g = _group(group)
    g.leave()
    if g is _default:
        _default = None
