# SPDX-License-Identifier: BSD-3-Clause
"""Work queues hosted by the daemon (docs/queues.md) in Python's idiom over _tpipd.WorkQueue:
the owner submits questions and receives answers carrying the question's id; workers take
questions and reply; items are bytes-like objects, numpy arrays or CPU torch tensors (raw
bytes, as Channel items), or typed items that come back as the array or tensor that was sent
(tensor header of _tensor.py, made over the received memory through DLPack: no copy);
iteration for workers; futures and asyncio forms of the waiting calls. Moving bytes and
waiting (sliced, GIL released, Ctrl-C) is the extension's (wq.c). Not here: channels
(_channel.py), the typed-item framing (_channel.py, _tensor.py)."""
import asyncio
import concurrent.futures
import threading

from . import _tpipd
from ._channel import _ACCESS, _item_buffer, _typed_item, _untyped

CREATE = 0x1
EXCLUSIVE = 0x2
AT_MOST_ONCE = 0x4


def _typed(block):
    """The array or tensor of a typed item held in ``block`` (a Block), made over the block's
    memory without a copy; ProtocolError for anything malformed."""
    return _untyped(memoryview(block))


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

    Who owns what, until when: submit() and reply() copy the item before they return (borrowed
    only during the call); answer(), take() and iteration return new objects the caller owns
    (typed items: an array or tensor over memory of its own). A question taken by a worker is
    that handle's until it replies: if the handle goes first (release(), the process dies)
    the daemon queues it again, once per death (or answers it with PeerDied when at_most_once).
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
        qid, block = self._raw.answer(timeout)
        return qid, bytes(block)

    def answer_tensor(self, timeout=None):
        """Owner: answer() of a typed answer (reply_tensor()): (id, array or tensor)."""
        qid, block = self._raw.answer(timeout)
        return qid, _typed(block)

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
        qid, block = self._raw.take(timeout)
        return qid, bytes(block)

    def take_tensor(self, timeout=None):
        """Worker: take() of a typed question (submit_tensor()): (id, array or tensor)."""
        qid, block = self._raw.take(timeout)
        return qid, _typed(block)

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

    def _submit_to(self, which, fn, *args):
        with self._lock:
            ex = self._executors.get(which)
            if ex is None:
                ex = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"tpipd-wq-{which}")
                self._executors[which] = ex
        return ex.submit(fn, *args)

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
