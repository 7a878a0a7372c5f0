# SPDX-License-Identifier: BSD-3-Clause
"""Named channels hosted by the daemon (docs/channels.md) in Python's idiom over _tpipd.Channel:
items as bytes-like objects, numpy arrays or CPU torch tensors; reads returning bytes, filling a
buffer the caller owns, or (typed items) giving back the array or tensor that was written;
message items (metadata, payloads, tensors: the pipe's Message, CPU and CUDA tensors) written
and read as a Pipe writes and reads them; iteration that ends when the channel is drained; the
state this handle has seen. Moving bytes and waiting (sliced, GIL released, Ctrl-C) is the
extension's (chan.c); framing of typed items reuses the tensor header of _tensor.py, message
items the pipe's wire form and allocation (_pipe.py). Not here: pipes (_pipe.py), sets
(_set.py)."""
import asyncio
import concurrent.futures
import threading

from . import _cuda, _pipe, _tensor, _tpipd

CREATE = 0x1
EXCLUSIVE = 0x2
PERSISTENT = 0x4
_ACCESS = {"owner": 0, "group": 1, "anyone": 2}


def _item_buffer(obj, contiguous, what):
    """A C-contiguous CPU buffer over the bytes of ``obj`` (borrowed: no copy unless asked)."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return obj
    if _tensor.is_torch(obj):
        if obj.is_cuda:
            raise _tpipd.NotSupported(95, f"{what}: byte items are CPU memory (a CUDA "
                                      "tensor travels in write_msg() or a Pipe)")
        if not obj.is_contiguous():
            obj = _tensor._contiguous(obj, contiguous, what)
        return _tensor.wire_buffer(obj)
    np = _tensor._np() if "numpy" in type(obj).__module__ else None
    if np is not None and isinstance(obj, (np.ndarray, np.generic)):
        obj = np.asarray(obj)
        if not obj.flags.c_contiguous:
            obj = _tensor._contiguous(obj, contiguous, what)
        return obj
    if _cuda.is_cuda(obj):
        raise _tpipd.NotSupported(95, f"{what}: byte items are CPU memory (a CUDA "
                                  "tensor travels in write_msg() or a Pipe)")
    try:
        return memoryview(obj)  # any other buffer-protocol object
    except TypeError:
        if not hasattr(obj, "__dlpack__"):
            raise
    obj = _tensor.from_dlpack_object(obj, what)  # another DLPack producer, as numpy (no copy)
    if not obj.flags.c_contiguous:
        obj = _tensor._contiguous(obj, contiguous, what)
    return obj


def _typed_item(obj, contiguous):
    """One item holding the tensor header of ``obj`` followed by its bytes (one copy)."""
    if _tensor.is_torch(obj) and obj.is_cuda:
        raise _tpipd.NotSupported(95, "channel items are CPU memory")
    buf, hdr, _ = _tensor.to_wire(obj, contiguous, "item")
    if type(buf) is tuple:  # a CUDA range
        raise _tpipd.NotSupported(95, "channel items are CPU memory")
    src = _tensor.cpu_buffer(buf).reshape(-1).view("uint8")  # a view: no copy yet
    item = bytearray(len(hdr) + src.nbytes)
    item[:len(hdr)] = hdr
    _tensor._np().frombuffer(item, "uint8", offset=len(hdr))[:] = src  # the one copy
    return item


def _untyped(item):
    """The array or tensor of a typed item (a writable buffer: a Block, which the result then
    lives over without a copy; or bytes, copied once); ProtocolError for anything malformed."""
    if len(item) < 8:
        raise _tpipd.ProtocolError(74, f"a typed item of {len(item)} bytes, at least 8")
    hlen = 8 + 8 * item[6]
    if len(item) < hlen:
        raise _tpipd.ProtocolError(74, f"a typed item of {len(item)} bytes, its header {hlen}")
    kind, code, shape = _tensor.unpack_header(bytes(item[:hlen]), len(item) - hlen)
    if isinstance(item, bytes):
        item = bytearray(item)  # memory of the result's own
    return _tensor.from_memory(item, hlen, kind, code, shape)


class Channel:
    """A handle on a named channel hosted by the local tpipd: a FIFO of items (byte strings of
    at least 1 byte, or messages: write_msg(), read_msg()) any process of the host may open by
    name (docs/channels.md).

    Channel(name, *, context=None, create=False, exclusive=False, persistent=False,
    mode="owner", gid=None, capacity=0, capacity_bytes=0, owner_uid=None): open channel
    ``name`` of the caller's uid (or of ``owner_uid``) through ``context`` (default:
    tpipd.default_context()). create makes it if missing (exclusive: NameInUse if it exists;
    persistent: it outlives its handles until unlink_channel()); mode ("owner", "group" with
    gid, "anyone"), capacity (items) and capacity_bytes apply at creation (0: the daemon's
    limits). Raises NoListener (a FileNotFoundError: no such channel), NameInUse,
    AccessDenied (its mode refuses this uid), LimitExceeded, InvalidArgument.

    States, as this handle saw them (``state``): "open"; "closed" (someone called close():
    writes raise PipeClosed, reads return what is left); "drained" (closed and empty: read()
    raises Drained, iteration ends); "released" (release(), the end of a ``with`` block, or
    Context.close()). close() closes the channel for every handle in every process;
    release() only drops this handle (a channel that is not persistent goes with its last).

    Blocking calls release the GIL and wait in slices of at most 0.2 s: Ctrl-C raises
    KeyboardInterrupt within one, and a waiting call gives up its place in the daemon's queue
    of waiting readers (or writers) for the next slice. Calls of several threads on one
    handle may overlap (a second write waiting for room raises LimitExceeded: one per
    handle); release() waits for them to end."""

    def __init__(self, name, *, context=None, create=False, exclusive=False, persistent=False,
                 mode="owner", gid=None, capacity=0, capacity_bytes=0, owner_uid=None):
        self._lock = threading.Lock()
        self._executors = {}
        if mode not in _ACCESS:
            raise ValueError(f"mode must be one of {sorted(_ACCESS)}")
        if context is None:
            from . import default_context
            context = default_context()
        flags = (CREATE if create else 0) | (EXCLUSIVE if exclusive else 0) | \
            (PERSISTENT if persistent else 0)
        raw_ctx = getattr(context, "_raw", context)
        self._raw = raw_ctx.open_channel(name, flags, _ACCESS[mode], -1 if gid is None else gid,
                                         capacity, capacity_bytes,
                                         -1 if owner_uid is None else owner_uid)
        self.name = name
        self._state = "open"

    @property
    def state(self):
        """"open", "closed", "drained" or "released": what this handle has seen."""
        return "released" if self._raw.released else self._state

    def write(self, item, *, timeout=None, contiguous=False):
        """Append one item: bytes, bytearray, memoryview, a numpy array or a CPU torch tensor
        (its raw bytes; a non-contiguous one raises InvalidArgument unless contiguous=True).
        Waits for room up to ``timeout`` seconds (None: no deadline; 0: LimitExceeded when
        full; Timeout at the deadline: nothing written). Borrows ``item`` until it returns.
        Raises PipeClosed once the channel is closed, LimitExceeded (larger than the
        channel's capacity or the daemon's inline limit), InvalidArgument (an empty item),
        InDoubt (the daemon did not answer within the context's reply timeout: it holds the
        batch and may still append it, so writing it again may duplicate it)."""
        self.write_many((item,), timeout=timeout, contiguous=contiguous)

    def write_many(self, items, *, timeout=None, contiguous=False):
        """Append ``items`` as one atomic batch: all follow each other in the channel, or none
        is written. Otherwise as write()."""
        bufs = [_item_buffer(x, contiguous, f"item {i}") for i, x in enumerate(items)]
        try:
            self._raw.write(bufs, timeout)
        except _tpipd.PipeClosed:
            self._state = "closed"
            raise

    def write_tensor(self, tensor, *, timeout=None, contiguous=False):
        """Append one typed item: a numpy array or CPU torch tensor with its dtype and shape
        (tpipd's tensor header, then the bytes), for read_tensor(). Otherwise as write()."""
        self._write_typed((tensor,), timeout, contiguous)

    def write_tensors(self, tensors, *, timeout=None, contiguous=False):
        """write_tensor() of several tensors as one atomic batch."""
        self._write_typed(tensors, timeout, contiguous)

    def _write_typed(self, tensors, timeout, contiguous):
        items = [_typed_item(t, contiguous) for t in tensors]
        try:
            self._raw.write(items, timeout)
        except _tpipd.PipeClosed:
            self._state = "closed"
            raise

    def _seen(self, closed):
        if closed and self._state == "open":
            self._state = "closed"

    def read(self, timeout=None):
        """Take the oldest item as bytes (owned by the caller). ``timeout`` seconds (None:
        wait; 0: try once). Raises Drained (a PipeClosed) when the channel is closed and
        empty, Timeout when no item came, Closed after release()."""
        try:
            item, closed = self._raw.read(timeout)
        except _tpipd.Drained:
            self._state = "drained"
            raise
        self._seen(closed)
        return item

    def read_into(self, buffer, timeout=None):
        """Take the oldest item into ``buffer`` (a writable C-contiguous bytearray, memoryview,
        numpy array or CPU torch tensor, borrowed until it returns) and return its length in
        bytes. An item longer than ``buffer`` raises LimitExceeded with the item (it has left
        the channel) as the exception's ``item``. Otherwise as read()."""
        dst = _item_buffer(buffer, False, "destination")
        try:
            n, closed = self._raw.read_into(dst, timeout)
        except _tpipd.Drained:
            self._state = "drained"
            raise
        self._seen(closed)
        return n

    def read_many_into(self, buffer, max=64, timeout=None):
        """Take up to ``max`` items (1 to 1024) in one request, packed into ``buffer`` (a
        writable C-contiguous bytearray, memoryview, numpy array or CPU torch tensor, borrowed
        until it returns): the oldest item, waiting as read() does, and those behind it that
        ride inline (at most 256 KiB each) and fit, each at the next multiple of 64 bytes from
        the buffer's start. Return a list of ``(offset, nbytes)``, one per item, in channel
        order. An oldest item larger than ``buffer`` raises LimitExceeded and stays first in
        the channel; items that do not fit after the first stay there too, in order.
        Otherwise as read()."""
        dst = _item_buffer(buffer, False, "destination")
        try:
            items, closed = self._raw.read_many_into(dst, max, timeout)
        except _tpipd.Drained:
            self._state = "drained"
            raise
        self._seen(closed)
        return items

    def read_tensor(self, timeout=None):
        """Take the oldest item, written by write_tensor(), as the numpy array or torch tensor
        (same dtype and shape; a new object the caller owns). ProtocolError when the item is
        not a typed item. Otherwise as read(). The result lives in the memory the item was
        received in (no copy on our side)."""
        try:
            block, closed = self._raw.read_block(timeout)
        except _tpipd.Drained:
            self._state = "drained"
            raise
        self._seen(closed)
        return _untyped(memoryview(block))

    def write_msg(self, metadata=b"", payloads=(), tensors=(), *, timeout=None,
                  contiguous=False):
        """Append one message item, as Pipe.write() sends a message: ``metadata`` (bytes-like),
        ``payloads`` (bytes-like objects) and ``tensors`` (numpy arrays, torch tensors, CUDA
        tensors and arrays; dtype and shape travel in each tensor's metadata; a
        non-contiguous one raises InvalidArgument unless contiguous=True). A message may be
        empty. The library copies a CUDA tensor to host memory after the work queued on its
        stream (the call waits for it); the reader sees its device. Read it with
        read_msg(). Waits for room, borrows, and raises as write()."""
        self.write_msgs(((metadata, payloads, tensors),), timeout=timeout,
                        contiguous=contiguous)

    def write_msgs(self, messages, *, timeout=None, contiguous=False):
        """Append ``messages`` (each a Message or a (metadata, payloads, tensors) triple) as
        one atomic batch of message items. Otherwise as write_msg()."""
        wires, raw = [], []
        for m in messages:
            metadata, payloads, tensors = m
            args, wire = _pipe.message_args(metadata, payloads, tensors, contiguous)
            wires.append(wire)
            raw.append(args)
        try:
            self._raw.write_msgs(raw, timeout)
        except _tpipd.PipeClosed:
            self._state = "closed"
            raise
        del wires  # the keep-alives lived until here

    def read_msg(self, tensors=None, payloads=None, *, timeout=None, shared=None,
                 cuda_alloc=None):
        """Take the oldest item as a Message(metadata, payloads, tensors), as Pipe.read()
        receives one: ``tensors``, ``payloads``, ``shared`` and ``cuda_alloc`` as there (None:
        allocate fresh numpy arrays / torch tensors, CUDA ones for tensors sent from CUDA
        where torch sees a GPU). A byte item reads as a message of one payload and no
        metadata. A destination that does not match raises InvalidArgument and the item
        is dropped, as a pipe drops a message whose descriptor is not read. Timeout,
        Drained and Closed as read()."""
        try:
            desc, closed = self._raw.read_descriptor(timeout)
        except _tpipd.Drained:
            self._state = "drained"
            raise
        self._seen(closed)
        try:
            return _pipe.read_message(desc, tensors, payloads, shared, cuda_alloc,
                                      lambda d, p, b: self._raw.read_msg(d, p, b))
        finally:
            del desc

    def msgs(self):
        """Like iterating, with read_msg(): Messages until drained."""
        while True:
            try:
                yield self.read_msg()
            except _tpipd.Drained:
                return

    def __iter__(self):
        """Items (bytes) until the channel is drained: ``for item in chan:``."""
        while True:
            try:
                yield self.read()
            except _tpipd.Drained:
                return

    def tensors(self):
        """Like iterating, with read_tensor(): arrays or tensors until drained."""
        while True:
            try:
                yield self.read_tensor()
            except _tpipd.Drained:
                return

    # ---- futures and asyncio -------------------------------------------------------------

    def _submit_to(self, which, fn, *args, **kw):
        with self._lock:
            ex = self._executors.get(which)
            if ex is None:
                ex = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"tpipd-chan-{which}")
                self._executors[which] = ex
        return ex.submit(fn, *args, **kw)

    def write_async(self, item, *, timeout=None, contiguous=False, typed=False):
        """write() (write_tensor() when typed) on a handle-owned thread: a
        concurrent.futures.Future of None, in call order; ``item`` is borrowed until it is
        done."""
        fn = self.write_tensor if typed else self.write
        return self._submit_to("write", fn, item, timeout=timeout, contiguous=contiguous)

    def read_async(self, timeout=None, *, typed=False):
        """read() (read_tensor() when typed) on a handle-owned thread: a Future of the item,
        in call order (Drained once the channel is drained)."""
        return self._submit_to("read", self.read_tensor if typed else self.read, timeout)

    def write_msg_async(self, *args, **kw):
        """write_msg() on a handle-owned thread (the writes' own, in call order): a Future of
        None; the message is borrowed until it is done."""
        return self._submit_to("write", self.write_msg, *args, **kw)

    def read_msg_async(self, *args, **kw):
        """read_msg() on a handle-owned thread (the reads' own, in call order): a Future of
        the Message."""
        return self._submit_to("read", self.read_msg, *args, **kw)

    async def awrite_msg(self, *args, **kw):
        """write_msg() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.write_msg_async(*args, **kw))

    async def aread_msg(self, *args, **kw):
        """read_msg() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.read_msg_async(*args, **kw))

    async def awrite(self, item, *, timeout=None, contiguous=False, typed=False):
        """write() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.write_async(item, timeout=timeout,
                                                          contiguous=contiguous, typed=typed))

    async def aread(self, timeout=None, *, typed=False):
        """read() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.read_async(timeout, typed=typed))

    async def __aiter__(self):
        """Items (bytes) until the channel is drained: ``async for item in chan:``."""
        while True:
            try:
                yield await self.aread()
            except _tpipd.Drained:
                return

    # ---- lifetime ------------------------------------------------------------------------

    def close(self):
        """Close the channel for every handle in every process: writes raise PipeClosed,
        readers get what is left, then Drained; waiting readers everywhere wake. Idempotent."""
        self._raw.close()
        self._state = "closed" if self._state == "open" else self._state

    def release(self):
        """Drop this handle (not a close); pending futures end with Closed. Idempotent."""
        self._raw.release()
        for ex in self._executors.values():
            ex.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"<tpipd.Channel {self.name!r} {self.state}>"


def unlink_channel(name, *, owner_uid=None, context=None):
    """Remove the name of persistent channel ``name`` (of ``owner_uid``, default the
    caller's; only its owner or root may). Open handles keep the channel until released."""
    if context is None:
        from . import default_context
        context = default_context()
    getattr(context, "_raw", context).unlink_channel(name, -1 if owner_uid is None else owner_uid)

