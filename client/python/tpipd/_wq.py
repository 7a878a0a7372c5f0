# SPDX-License-Identifier: BSD-3-Clause
"""Work queues hosted by the daemon (docs/queues.md) in Python's idiom over _tpipd.WorkQueue:
the owner submits questions and receives answers carrying the question's id; workers take
questions and reply; items are bytes-like objects, numpy arrays or CPU torch tensors (raw
bytes, as Channel items), or typed items that come back as the array or tensor that was sent
(tensor header of _tensor.py, made over the received memory through DLPack: no copy), or
messages (metadata, payloads, CPU and CUDA tensors: the pipe's Message, sent and received as a
Channel's message items are, with the pipe's wire form and allocation of _pipe.py);
iteration for workers; futures and asyncio forms of the waiting calls. Moving bytes and
waiting (sliced, GIL released, Ctrl-C) is the extension's (wq.c). Not here: channels
(_channel.py), the typed-item framing (_channel.py, _tensor.py), message framing (_pipe.py,
_tensor.py)."""
import asyncio
import collections
import concurrent.futures
import threading

from . import _pipe, _tensor, _tpipd
from ._channel import _ACCESS, _item_buffer, _typed_item, _untyped

CREATE = 0x1
EXCLUSIVE = 0x2
AT_MOST_ONCE = 0x4


def _typed(block):
    """The array or tensor of a typed item held in ``block`` (a Block), made over the block's
    memory without a copy; ProtocolError for anything malformed."""
    return _untyped(memoryview(block))


TensorInfo = collections.namedtuple("TensorInfo", "kind dtype shape device nbytes")
TensorInfo.__doc__ = """A tensor of a described message: kind ("numpy" or "torch", what the
writer sent), dtype (its name, e.g. "float32"), shape (a tuple), device ("cpu", or "cuda:N"
for a tensor sent from that CUDA device of the writer) and nbytes."""


class MessageDescriptor:
    """A question (take_descriptor()) or an answer (answer_descriptor()) taken as a message
    whose bytes have not moved yet: ``question_id``, ``metadata`` (bytes), ``payload_sizes``
    (a list of ints) and ``tensors`` (a list of TensorInfo; ProtocolError for a tensor whose
    header was not written by tpipd's module). Read it once with WorkQueue.read_msg(), into
    destinations allocated from what it says. Dropping it unread drops an answer (it leaves
    the queue) and leaves a question taken (reply to it, or release the handle to queue it
    again)."""

    __slots__ = ("question_id", "_raw", "_tensors")

    def __init__(self, qid, raw):
        self.question_id = qid
        self._raw = raw
        self._tensors = None

    @property
    def metadata(self):
        return self._raw.metadata

    @property
    def payload_sizes(self):
        return [length for length, _ in self._raw.payloads]

    @property
    def tensors(self):
        if self._tensors is None:
            infos = []
            for length, meta, dev_type, dev_index in self._raw.tensors:
                kind, code, shape = _tensor.unpack_header(meta, length)
                infos.append(TensorInfo("torch" if kind == _tensor.KIND_TORCH else "numpy",
                                        _tensor.DTYPES[code][0], shape,
                                        f"cuda:{dev_index}" if dev_type == 1 else "cpu",
                                        length))
            self._tensors = infos
        return self._tensors

    def __repr__(self):
        return (f"<tpipd.MessageDescriptor question {self.question_id}: "
                f"{len(self._raw.metadata)} bytes of metadata, "
                f"{len(self._raw.payloads)} payloads, {len(self._raw.tensors)} tensors>")


def _message_hint(e, call):
    """NotSupported ``e`` of a byte call that met a message, naming the Python call to use."""
    return _tpipd.NotSupported(e.errno, f"{e.strerror}: use WorkQueue.{call}()")


class WorkQueue:
    """A handle on a named work queue hosted by the local tpipd (torch-ipc's workqueue): the
    owner submits questions, workers in any process of the host take them and reply, and the
    owner receives each answer with its question's id (docs/queues.md).

    WorkQueue(name, *, context=None, create=False, exclusive=False, at_most_once=False,
    mode="owner", gid=None, owner_uid=None): create=True creates the queue and makes this
    handle its **owner** (exclusive: NameInUse if it exists; at_most_once: a question whose
    worker dies is answered with PeerDied instead of queued again); otherwise this handle is a
    **worker** of the existing queue ``name`` of the caller's uid (or of ``owner_uid``). mode
    ("owner", "group" with gid, "anyone") says, at creation, who else may open it. Raises
    NoListener (a FileNotFoundError: no such queue), NameInUse, AccessDenied, LimitExceeded
    (wqs-per-uid), InvalidArgument.

    Questions and answers may be messages instead of byte strings (submit_msg(), reply_msg(),
    take_msg(), answer_msg(), msgs()): metadata, payloads and tensors (numpy arrays, CPU and
    CUDA torch tensors, CUDA arrays), received as a Message the way Channel.read_msg()
    receives one (tensors allocated by the module, or into destinations the caller passes,
    or, after take_descriptor() / answer_descriptor(), allocated from what the descriptor
    says). Mixing: a byte question or answer received as a message is a message of one
    payload and no metadata; a message refuses take(), answer() and their tensor forms with
    NotSupported and stays first in line.

    Who owns what, until when: submit() and reply() (and their _msg forms) copy the item
    before they return (borrowed only during the call); answer(), take(), their _msg forms
    and iteration return new objects the caller owns (typed items: an array or tensor over
    memory of its own). A question taken by a worker is that handle's until it replies: if
    the handle goes first (release(), the process dies) the daemon queues it again, once per
    death, messages intact (or answers it with PeerDied when at_most_once).
    The owner's handle is the queue: its release() or death closes and frees the queue
    (workers then get PipeClosed). A ``with`` block, release() and Context.close() drop the
    handle; close() (owner) only stops submits.

    Blocking calls (take, answer, drain) release the GIL and wait in slices of at most 0.2 s:
    Ctrl-C raises KeyboardInterrupt within one, release() from another thread ends the wait
    (Closed). submit() and reply() never wait: a full queue raises LimitExceeded at once.
    Calls of several threads on one handle may overlap (the library's handle holds no
    per-call state; the daemon takes up to 64 waiting calls per handle), so an owner may
    submit while answer_async() waits."""

    def __init__(self, name, *, context=None, create=False, exclusive=False,
                 at_most_once=False, mode="owner", gid=None, owner_uid=None):
        if mode not in _ACCESS:
            raise ValueError(f"mode must be one of {sorted(_ACCESS)}")
        if context is None:
            from . import default_context
            context = default_context()
        flags = (CREATE if create else 0) | (EXCLUSIVE if exclusive else 0) | \
            (AT_MOST_ONCE if at_most_once else 0)
        raw_ctx = getattr(context, "_raw", context)
        self._raw = raw_ctx.open_queue(name, flags, _ACCESS[mode], -1 if gid is None else gid,
                                       -1 if owner_uid is None else owner_uid)
        self.name = name
        self._lock = threading.Lock()
        self._executors = {}

    @property
    def owner(self):
        """Whether this handle owns the queue (it created it)."""
        return self._raw.owner

    @property
    def released(self):
        return self._raw.released

    # ---- owner ---------------------------------------------------------------------------

    def submit(self, item, *, contiguous=False):
        """Owner: queue a question and return its id (an int; answers carry it). ``item``:
        bytes, bytearray, memoryview, a numpy array or a CPU torch tensor (its raw bytes; a
        non-contiguous one raises InvalidArgument unless contiguous=True), at least 1 byte and
        at most the daemon's inline limit. Copied before it returns; never waits. Raises
        LimitExceeded (the queue is full: receive answers first), PipeClosed (closed),
        AccessDenied (not the owner)."""
        return self._raw.submit(_item_buffer(item, contiguous, "item"))

    def submit_tensor(self, tensor, *, contiguous=False):
        """Owner: submit() a typed item (a numpy array or CPU torch tensor with its dtype and
        shape) that take_tensor() gives back as the same kind of object."""
        return self._raw.submit(_typed_item(tensor, contiguous))

    def answer(self, timeout=None):
        """Owner: the oldest answer as (question id, bytes), both the caller's. ``timeout``
        seconds (None: wait; 0: try once). Raises Timeout, NothingOutstanding (no question
        is waiting for its answer: the wait could never end), PeerDied with ``.question_id``
        (its worker died and the queue is at_most_once)."""
        qid, block = self._answer_block(timeout)
        return qid, bytes(block)

    def answer_tensor(self, timeout=None):
        """Owner: answer() of a typed answer (reply_tensor()): (id, array or tensor)."""
        qid, block = self._answer_block(timeout)
        return qid, _typed(block)

    def _answer_block(self, timeout):
        try:
            return self._raw.answer(timeout)
        except _tpipd.NotSupported as e:
            raise _message_hint(e, "answer_msg") from None

    def submit_msg(self, metadata=b"", payloads=(), tensors=(), *, contiguous=False):
        """Owner: queue a message question, as Channel.write_msg() writes a message item, and
        return its id: ``metadata`` (bytes-like), ``payloads`` (bytes-like objects) and
        ``tensors`` (numpy arrays, torch tensors, CUDA tensors and arrays; dtype and shape
        travel in each tensor's metadata; a non-contiguous one raises InvalidArgument unless
        contiguous=True). May be empty. The daemon holds a copy once it returns (a CUDA
        tensor is copied to host memory after the work queued on its stream: the call waits
        for it); never waits for room. Raises LimitExceeded (the queue is full, or over the
        daemon's metadata-max, segments-max, wq-bytes-max or frame limits), PipeClosed,
        AccessDenied (not the owner), InvalidArgument, TypeError (not a tensor), InDoubt."""
        raw, keep = _pipe.message_args(metadata, payloads, tensors, contiguous)
        qid = self._raw.submit_msg(*raw)
        del keep  # the tensors lived until here
        return qid

    def answer_msg(self, tensors=None, payloads=None, *, timeout=None, shared=None,
                   cuda_alloc=None):
        """Owner: the oldest answer as (question id, Message), received as Channel.read_msg()
        receives a message: ``tensors``, ``payloads``, ``shared`` and ``cuda_alloc`` as there
        (None: fresh numpy arrays / torch tensors). A byte answer is a message of one
        payload. Errors as answer(); a destination that does not match raises
        InvalidArgument with ``.question_id`` (the answer is dropped)."""
        qid, desc = self._raw.answer_descriptor(timeout)
        return qid, self._read(qid, desc, tensors, payloads, shared, cuda_alloc)

    def answer_descriptor(self, timeout=None):
        """Owner: the oldest answer as (question id, MessageDescriptor), its bytes not moved:
        read it with read_msg() (dropping it unread drops the answer). Errors as answer()."""
        qid, desc = self._raw.answer_descriptor(timeout)
        return qid, MessageDescriptor(qid, desc)

    def drain(self, timeout=None):
        """Owner: wait until every submitted question is answered (taken ones included; the
        answers may still wait to be received). Raises Timeout."""
        self._raw.drain(timeout)

    def close(self):
        """Owner: no more submits. Workers take what is queued, then take() raises
        PipeClosed and their iteration ends. Idempotent. The queue (and its answers) stays
        until the owner's handle is released."""
        self._raw.close()

    # ---- worker --------------------------------------------------------------------------

    def take(self, timeout=None):
        """Worker: the oldest queued question as (id, bytes); it is this handle's until
        reply(id, ...). Raises Timeout, PipeClosed (the queue is closed and empty, or its
        owner is gone)."""
        qid, block = self._take_block(timeout)
        return qid, bytes(block)

    def take_tensor(self, timeout=None):
        """Worker: take() of a typed question (submit_tensor()): (id, array or tensor)."""
        qid, block = self._take_block(timeout)
        return qid, _typed(block)

    def _take_block(self, timeout):
        try:
            return self._raw.take(timeout)
        except _tpipd.NotSupported as e:
            raise _message_hint(e, "take_msg") from None

    def take_msg(self, tensors=None, payloads=None, *, timeout=None, shared=None,
                 cuda_alloc=None):
        """Worker: the oldest queued question as (id, Message), this handle's until
        reply_msg(id, ...) or reply(id, ...); received as Channel.read_msg() receives one
        (``tensors``, ``payloads``, ``shared``, ``cuda_alloc`` as there). A byte question is
        a message of one payload. Errors as take(); a destination that does not match raises
        InvalidArgument with ``.question_id``: the question stays taken (reply, or release
        the handle to queue it again). To allocate from the question's shapes yourself,
        use take_descriptor() and read_msg()."""
        qid, desc = self._raw.take_descriptor(timeout)
        return qid, self._read(qid, desc, tensors, payloads, shared, cuda_alloc)

    def take_descriptor(self, timeout=None):
        """Worker: take the oldest queued question as (id, MessageDescriptor), its bytes not
        moved yet: read them with read_msg() into destinations made from its ``tensors`` and
        ``payload_sizes``. The question is this handle's from now on, read or not. Errors as
        take()."""
        qid, desc = self._raw.take_descriptor(timeout)
        return qid, MessageDescriptor(qid, desc)

    def read_msg(self, descriptor, tensors=None, payloads=None, *, shared=None,
                 cuda_alloc=None):
        """The Message of ``descriptor`` (a MessageDescriptor of this handle, read once):
        ``tensors`` and ``payloads`` (per part a destination of the same dtype and shape, or
        of the payload's size, or None: allocated), ``shared`` and ``cuda_alloc`` as
        Channel.read_msg(). A destination that does not match raises InvalidArgument and
        leaves ``descriptor`` unread (read it again with others); Closed for a descriptor read
        already; ValueError for one of another handle; NoListener when the question is no
        longer this handle's. Blocks until the bytes are in place."""
        if not isinstance(descriptor, MessageDescriptor):
            raise TypeError(f"a MessageDescriptor is needed, not {type(descriptor).__name__}")
        return self._read(descriptor.question_id, descriptor._raw, tensors, payloads, shared,
                          cuda_alloc)

    def _read(self, qid, desc, tensors, payloads, shared, cuda_alloc):
        try:
            return _pipe.read_message(desc, tensors, payloads, shared, cuda_alloc,
                                      lambda d, p, b: self._raw.read_msg(d, p, b))
        except (_tpipd.Error, TypeError, ValueError) as e:
            e.question_id = qid
            raise
        finally:
            del desc

    def reply_msg(self, qid, metadata=b"", payloads=(), tensors=(), *, contiguous=False):
        """Worker: answer question ``qid``, which this handle took, with a message (as
        submit_msg()). Never waits. Raises as reply(), and LimitExceeded over the daemon's
        message limits."""
        raw, keep = _pipe.message_args(metadata, payloads, tensors, contiguous)
        self._raw.reply_msg(qid, *raw)
        del keep

    def msgs(self):
        """Worker: like iterating, with take_msg(): (id, Message) until the queue is closed
        and empty (or the owner is gone)."""
        while True:
            try:
                yield self.take_msg()
            except _tpipd.PipeClosed:
                return

    def reply(self, qid, item, *, contiguous=False):
        """Worker: answer question ``qid``, which this handle took. ``item`` as submit().
        Never waits. Raises NoListener (a FileNotFoundError: this handle did not take
        ``qid``, or answered it already), LimitExceeded (the owner's answers are full: the
        question stays taken, try again), PipeClosed (the owner is gone)."""
        self._raw.reply(qid, _item_buffer(item, contiguous, "item"))

    def reply_tensor(self, qid, tensor, *, contiguous=False):
        """Worker: reply() with a typed item (answer_tensor() gives it back)."""
        self._raw.reply(qid, _typed_item(tensor, contiguous))

    def __iter__(self):
        """Worker: (id, bytes) questions until the queue is closed and empty (or the owner
        is gone): ``for qid, q in wq: wq.reply(qid, work(q))``."""
        while True:
            try:
                yield self.take()
            except _tpipd.PipeClosed:
                return

    def tensors(self):
        """Like iterating, with take_tensor(): (id, array or tensor) until closed and empty."""
        while True:
            try:
                yield self.take_tensor()
            except _tpipd.PipeClosed:
                return

    # ---- futures and asyncio -------------------------------------------------------------

    def _submit_to(self, which, fn, *args, **kw):
        with self._lock:
            ex = self._executors.get(which)
            if ex is None:
                ex = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"tpipd-wq-{which}")
                self._executors[which] = ex
        return ex.submit(fn, *args, **kw)

    def answer_async(self, timeout=None, *, typed=False):
        """answer() (answer_tensor() when typed) on a queue-owned thread: a
        concurrent.futures.Future of (id, item), in call order."""
        return self._submit_to("answer", self.answer_tensor if typed else self.answer, timeout)

    def take_async(self, timeout=None, *, typed=False):
        """take() (take_tensor() when typed) on a queue-owned thread: a Future of (id, item)."""
        return self._submit_to("take", self.take_tensor if typed else self.take, timeout)

    def drain_async(self, timeout=None):
        """drain() on a queue-owned thread: a Future of None."""
        return self._submit_to("drain", self.drain, timeout)

    def answer_msg_async(self, *args, **kw):
        """answer_msg() on the queue-owned thread of answer_async(): a Future of (id,
        Message), in call order with answer_async(); destinations are borrowed until done."""
        return self._submit_to("answer", self.answer_msg, *args, **kw)

    def take_msg_async(self, *args, **kw):
        """take_msg() on the queue-owned thread of take_async(): a Future of (id, Message)."""
        return self._submit_to("take", self.take_msg, *args, **kw)

    async def aanswer_msg(self, *args, **kw):
        """answer_msg() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.answer_msg_async(*args, **kw))

    async def atake_msg(self, *args, **kw):
        """take_msg() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.take_msg_async(*args, **kw))

    async def aanswer(self, timeout=None, *, typed=False):
        """answer() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.answer_async(timeout, typed=typed))

    async def atake(self, timeout=None, *, typed=False):
        """take() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.take_async(timeout, typed=typed))

    async def adrain(self, timeout=None):
        """drain() as an asyncio awaitable."""
        return await asyncio.wrap_future(self.drain_async(timeout))

    # ---- lifetime ------------------------------------------------------------------------

    def release(self):
        """Drop this handle: a worker's taken questions are queued again (or answered with
        PeerDied when at_most_once); the owner's release closes and frees the queue. Waits
        for other threads' calls on it to end (Closed there, within 0.2 s). Idempotent."""
        self._raw.release()
        for ex in self._executors.values():
            ex.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        role = "owner" if self.owner else "worker"
        return f"<tpipd.WorkQueue {self.name!r} {role}{' released' if self.released else ''}>"
