# SPDX-License-Identifier: BSD-3-Clause
"""Contexts, listeners and pipes in Python's idiom over _tpipd: messages of metadata, payloads
and tensors; blocking calls (the GIL is released while they wait), futures and awaitables;
shared-buffer arrays (empty/zeros). Not here: groups (_group.py), framing (_tensor.py)."""
import asyncio
import collections
import concurrent.futures
import math
import threading

from . import _cuda, _tensor, _tpipd

Message = collections.namedtuple("Message", "metadata payloads tensors")
Message.__doc__ = """A received message: metadata (bytes), payloads (list of bytearray) and
tensors (list of numpy arrays / torch tensors, the kind the writer sent). The caller owns all."""


def message_wire(tensors, contiguous):
    """The wire form of a message's tensors: (buffer or CUDA range, header, keep-alive) each,
    for a Pipe's write and a Channel's message items."""
    return [_tensor.to_wire(t, contiguous, f"tensor {i}") for i, t in enumerate(tensors)]


def message_args(metadata, payloads, tensors, contiguous):
    """(raw, keep): a message to send as the extension's (metadata, payloads, [(buffer or CUDA
    range, header)]) triple, for a Channel's message items and a WorkQueue's message questions
    and answers, and what keeps its tensors' memory alive until the call returned."""
    wire = message_wire(tensors, contiguous)
    return (metadata, list(payloads), [(b, h) for b, h, _ in wire]), wire


def read_message(desc, tensors, payloads, shared, cuda_alloc, move, context=None):
    """The Message of ``desc`` (a Pipe's or a Channel's Descriptor): its tensors' headers read,
    destinations checked or allocated (see Pipe.read()), then ``move(desc, payloads,
    buffers)`` moves the bytes. ``context``: the raw Context whose daemon may keep CUDA
    destinations mapped (a pipe's), or None."""
    tds = desc.tensors
    pds = desc.payloads
    if tensors is not None and len(tensors) != len(tds):
        raise _tpipd.InvalidArgument(22, f"the message has {len(tds)} tensors, "
                                     f"{len(tensors)} destinations given")
    if payloads is not None and len(payloads) != len(pds):
        raise _tpipd.InvalidArgument(22, f"the message has {len(pds)} payloads, "
                                     f"{len(payloads)} destinations given")
    alloc = None if shared is None else (
        lambda shape, name, like: shared.empty(shape, name, like=like))
    outs, bufs, keep = [], [], []
    for i, (length, meta, dev_type, dev_index) in enumerate(tds):
        kind, code, shape = _tensor.unpack_header(meta, length)
        dst = tensors[i] if tensors is not None else None
        if dst is None:
            dst = _tensor.empty_like_header(kind, code, shape, dev_type, dev_index, alloc,
                                            cuda_alloc)
        outs.append(dst)
        buf, cap = _tensor.check_destination(dst, code, shape, f"tensor {i}")
        bufs.append(buf)
        keep.append(cap)
    pays = []
    for i, (length, _) in enumerate(pds):
        p = payloads[i] if payloads is not None else None
        pays.append(bytearray(length) if p is None else p)
    metadata = desc.metadata
    for b, dst in zip(bufs, outs):
        if context is not None and type(b) is tuple:  # the daemon may keep it mapped
            _cuda.track(context, dst, b[0])
    move(desc, pays, bufs)
    del keep  # DLPack capsules of CUDA destinations lived until here
    return Message(metadata, pays, outs)


class Context:
    """One session with the local tpipd daemon.

    Context(socket_path=None, name=None, *, no_cma=False, no_ring=False, reply_timeout=None).
    socket_path None follows libtpclient's rules ($TPIPD_SOCKET, ...). reply_timeout: seconds
    to wait for the daemon's answer to a request beyond the request's own wait (None:
    libtpclient's default); a request left unanswered past it raises Timeout, or InDoubt
    where it may still take effect (a channel write, a work queue submit or reply). close()
    (or leaving a ``with`` block) closes every pipe, listener, group, channel and work queue
    handle of the context; arrays from empty()/zeros() stay valid until they are garbage, and
    the session ends after the last of them.
    Raises NoListener/NoDaemon when no daemon listens at the socket."""

    def __init__(self, socket_path=None, name=None, *, no_cma=False, no_ring=False,
                 reply_timeout=None):
        ms = 0 if reply_timeout is None else max(1, int(reply_timeout * 1000))
        self._raw = _tpipd.Context(socket_path, name, no_cma, no_ring, ms)

    @property
    def name(self):
        return self._raw.name

    @property
    def transport(self):
        return self._raw.transport

    @property
    def closed(self):
        return self._raw.closed

    def listen(self, name, *, access="owner", gid=None):
        """Register listener ``name``; access "owner", "group" (with gid) or "anyone"."""
        codes = {"owner": 0, "group": 1, "anyone": 2}
        if access not in codes:
            raise ValueError(f"access must be one of {sorted(codes)}")
        return Listener(self._raw.listen(name, codes[access], -1 if gid is None else gid))

    def connect(self, address, *, timeout=None, expect_uid=None, expect_peer=None):
        """Open a pipe to ``address`` (a listener NAME or tpip://HOST[:PORT]/NAME).

        With ``timeout`` (seconds) the daemon waits that long for a listener that is not
        registered yet, and connect() returns once the pipe is connected (Timeout, NoListener,
        AccessDenied otherwise). Without it, a missing listener raises NoListener.
        ``expect_uid``: refuse (AccessDenied) unless the listener's owner is that uid.
        ``expect_peer`` (tpip:// only; libtpclient's TP_CONNECT_EXPECT_PEER): "any-peer" or a
        list of peer identities ("psk", "cert:HOST", ...): this host's daemon refuses the
        connect (AccessDenied, naming the identity it found) unless the peer link it goes over
        authenticated as a daemon that allows, before anything of it reaches that daemon."""
        wait_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        raw = self._raw.connect(address, wait_ms, -1 if expect_uid is None else expect_uid,
                                expect_peer)
        try:
            raw.wait_connected(10.0 if timeout is None else timeout + 10.0)
        except BaseException:
            raw.close()
            raise
        return Pipe(raw)

    def empty(self, shape, dtype="float32", *, like="numpy"):
        """An uninitialised array (like="numpy") or tensor (like="torch") in a shared buffer:
        writes from it and reads into it move with one copy. The mapping lives as long as the
        returned object (and any view of it)."""
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape) or len(shape) > _tensor.MAX_NDIM:
            raise ValueError(f"bad shape {shape}")
        name = _tensor.dtype_name(dtype) if not isinstance(dtype, str) else dtype
        code = _tensor._CODE_OF.get(name)
        if code is None:
            raise ValueError(f"dtype {dtype} is not supported")
        nbytes = math.prod(shape) * _tensor.DTYPES[code][1]
        buf = self._raw.alloc_buffer(nbytes)
        if like == "numpy":
            if name == "bfloat16":
                raise ValueError("numpy has no bfloat16: use like='torch'")
            np = _tensor._np()
            return np.frombuffer(buf, dtype=name, count=math.prod(shape)).reshape(shape)
        if like != "torch" or _tensor.torch_module() is None:
            raise ValueError("like must be 'numpy' or 'torch' (and torch installed)")
        # torch.from_dlpack over the buffer: no numpy in between (bfloat16 and bool as such)
        return _tensor.from_memory(buf, 0, _tensor.KIND_TORCH, code, shape)

    def zeros(self, shape, dtype="float32", *, like="numpy"):
        """empty() filled with zeros."""
        a = self.empty(shape, dtype, like=like)
        if like == "torch":
            a.zero_()
        else:
            a.fill(0)
        return a

    def join_group(self, name, world_size, rank=None, **kw):
        from ._group import init_group
        return init_group(name, world_size, rank, context=self, **kw)

    def channel(self, name, **kw):
        """tpipd.Channel(name, context=self, **kw): a named channel (see there)."""
        from ._channel import Channel
        return Channel(name, context=self, **kw)

    def work_queue(self, name, **kw):
        """tpipd.WorkQueue(name, context=self, **kw): a named work queue (see there)."""
        from ._wq import WorkQueue
        return WorkQueue(name, context=self, **kw)

    def cuda_release(self, obj):
        """Tell the daemon to drop its mapping of the CUDA allocation holding ``obj`` (a CUDA
        tensor or array this context wrote from or read into, or a device pointer): call it
        before freeing device memory yourself. The module does it by itself when such an
        object is garbage; this is for memory freed while its object lives (or objects
        without weak references). The memory must still be allocated."""
        _cuda.release(self._raw, obj)

    def close(self):
        """Close every pipe, listener, group, channel and work queue handle of the context;
        arrays from empty()/zeros() keep the session until they are garbage."""
        _cuda.forget(self._raw)
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Listener:
    """A registered listener name. accept() waits for the next pipe; close() unregisters."""

    def __init__(self, raw):
        self._raw = raw
        self._lock = threading.Lock()
        self._acceptor = None

    @property
    def name(self):
        return self._raw.name

    def accept(self, timeout=None):
        """The next incoming Pipe; Timeout after ``timeout`` seconds (None: wait)."""
        return Pipe(self._raw.accept(timeout))

    def accept_async(self, timeout=None):
        """accept() on a listener-owned thread: a Future of the Pipe, in call order."""
        with self._lock:
            if self._acceptor is None:
                self._acceptor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="tpipd-accept")
        return self._acceptor.submit(self.accept, timeout)

    async def aaccept(self, timeout=None):
        """accept() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.accept_async(timeout))

    def close(self):
        """Unregister the name; pending accepts fail with Cancelled."""
        self._raw.close()
        if self._acceptor is not None:
            self._acceptor.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Pipe:
    """A pipe to one other process.

    Ownership: write() borrows every payload and tensor until it returns (or, for
    write_async(), until its future is done): do not modify them meanwhile. read() returns
    objects the caller owns; destination tensors passed to read() are borrowed until it
    returns or its future is done. Writes are delivered in order; so are reads."""

    def __init__(self, raw):
        self._raw = raw
        self._lock = threading.Lock()
        self._writer = None
        self._reader = None

    @property
    def remote_name(self):
        return self._raw.remote_name

    @property
    def closed(self):
        return self._raw.closed

    def write(self, metadata=b"", payloads=(), tensors=(), *, timeout=None, contiguous=False):
        """Send a message and wait until it is delivered (a small one: queued at the daemon).

        metadata: bytes-like. payloads: bytes-like objects (C-contiguous). tensors: numpy
        arrays and torch tensors; CUDA tensors too (torch CUDA tensors, objects with
        __cuda_array_interface__, DLPack producers on a CUDA device), read by the daemon
        straight from device memory after the work queued on their stream. dtype and shape
        travel in each tensor's metadata. A non-contiguous tensor raises InvalidArgument
        unless contiguous=True (then a contiguous copy is sent).

        Ownership: everything is borrowed until write() returns (write_async(): until its
        future is done), whatever it raises; do not modify or free it meanwhile. The daemon
        may keep a CUDA allocation mapped after that (tpipd --cuda-cache-mappings): the
        module releases the mapping when the CUDA object is garbage (Context.cuda_release()
        does it at once). Raises PeerDied, PipeClosed, Cancelled, Timeout (the write was
        cancelled), LimitExceeded, InvalidArgument."""
        wire = message_wire(tensors, contiguous)
        _cuda.track_wire(self._raw.context, wire)
        self._raw.write(metadata, list(payloads), [(b, h) for b, h, _ in wire], timeout)
        del wire  # the keep-alives lived until here

    def read(self, tensors=None, payloads=None, *, timeout=None, shared=None, cuda_alloc=None):
        """Receive the next message as a Message(metadata, payloads, tensors).

        tensors: None (allocate every tensor), or a list with, per tensor, a destination of
        the same dtype and shape (filled in place and returned) or None (allocated). A
        destination may be a numpy array, a torch tensor (CPU or CUDA) or a CUDA object
        (__cuda_array_interface__, or a CUDA __dlpack__). payloads: None or a list of
        writable buffers / None likewise. shared: a Context whose shared buffers hold
        allocated CPU tensors (one copy; None: ordinary memory). cuda_alloc: for a tensor the
        writer sent from CUDA memory, cuda_alloc(shape, dtype_name, device_index) returns the
        CUDA object to fill (any of the destination kinds); without it such a tensor arrives
        as a torch CUDA tensor where torch sees a GPU and the writer sent torch, else in host
        memory. Timeout covers the wait for the message and its transfer (the read is
        cancelled then).

        Ownership: destinations are borrowed until read() returns (read_async(): until its
        future is done); the Message and what it holds are the caller's."""
        desc = self._raw.read_descriptor(timeout)
        try:
            return self._read_desc(desc, tensors, payloads, timeout, shared, cuda_alloc)
        finally:
            del desc

    def _read_desc(self, desc, tensors, payloads, timeout, shared, cuda_alloc=None):
        return read_message(desc, tensors, payloads, shared, cuda_alloc,
                            lambda d, p, b: self._raw.read(d, p, b, timeout), self._raw.context)

    def _executor(self, which):
        with self._lock:
            ex = getattr(self, which)
            if ex is None:
                ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tpipd-pipe")
                setattr(self, which, ex)
            return ex

    def write_async(self, *args, **kw):
        """write() on a pipe-owned thread: a concurrent.futures.Future (result None). Writes
        issued this way go out in call order; the buffers are borrowed until it is done."""
        return self._executor("_writer").submit(self.write, *args, **kw)

    def read_async(self, *args, **kw):
        """read() on a pipe-owned thread: a Future of the Message, in call order."""
        return self._executor("_reader").submit(self.read, *args, **kw)

    async def awrite(self, *args, **kw):
        """write() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.write_async(*args, **kw))

    async def aread(self, *args, **kw):
        """read() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.read_async(*args, **kw))

    def close(self):
        """Close the pipe: pending reads and writes fail with Cancelled, the other end gets
        PipeClosed after what was already written."""
        self._raw.close()
        for ex in (self._writer, self._reader):
            if ex is not None:
                ex.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

