# SPDX-License-Identifier: BSD-3-Clause
"""Pipe sets (docs/fanout.md) in Python's idiom over _tpipd.PipeSet: a server's accepted pipes
read as one (recv_any, torch-ipc's recvAny) and written as one (broadcast), each pipe named by a
key the caller chooses. Messages and tensors are read as Pipe.read() does (_pipe.py)."""
import time

from . import _cuda, _tensor, _tpipd


class Fanout:
    """How a PipeSet's broadcasts fan out (libtpclient's TP_FANOUT_*, docs/fanout.md)."""
    AUTO = "auto"        # the daemon's fan-out where it can, else one write per pipe
    LIBRARY = "library"  # always one write per pipe, by the set
    DAEMON = "daemon"    # only the daemon's: broadcast() raises NotSupported where it cannot


_FANOUT = ("auto", "library", "daemon")  # index: the TP_FANOUT_* value


class PipeSet:
    """PipeSet(context=None, max_pipes=64, fanout="auto"): pipes of ``context``
    (default_context()) that are read and written as one. A pipe added to the set belongs to
    it: the set closes it, and its messages come only through recv_any(). Used from one thread
    at a time (RuntimeError otherwise); close() (or a ``with`` block, or Context.close())
    closes every pipe still in. ``fanout``: see the property."""

    def __init__(self, context=None, max_pipes=64, fanout="auto"):
        if context is None:
            from . import default_context
            context = default_context()
        self._ctx = getattr(context, "_raw", context)
        self._raw = _tpipd.PipeSet(self._ctx, max_pipes)
        self._keys = {}  # raw Pipe -> (key, Pipe)
        if fanout != "auto":
            self.fanout = fanout

    @property
    def fanout(self):
        """How broadcast() fans out from now on (tp_set_set_fanout()): "auto" (default: the
        daemon sends the message on every pipe, reading the writer's memory once, where it can:
        its bcast-pipes-max at least the set's size, CPU memory, a shared buffer or CMA; else
        the set writes each pipe itself), "library" (always one write per pipe) or "daemon"
        (only the daemon's: broadcast() raises NotSupported, sending nothing, where it cannot).
        Set it to one of those names (Fanout.*); ValueError otherwise."""
        return _FANOUT[self._raw.fanout]

    @fanout.setter
    def fanout(self, how):
        if how not in _FANOUT:
            raise ValueError(f"fanout must be one of {list(_FANOUT)}, not {how!r}")
        self._raw.fanout = _FANOUT.index(how)

    @property
    def last_fanout(self):
        """How the last broadcast() fanned out (tp_set_last_fanout()): "daemon" or "library";
        None before the first (and after close())."""
        v = self._raw.last_fanout
        return _FANOUT[v] if v else None

    def __len__(self):
        return self._raw.size

    def add(self, pipe, key=None):
        """Add ``pipe`` (a tpipd.Pipe) under ``key`` (default: its position, 0, 1, ...)."""
        key = len(self._keys) if key is None else key
        self._raw.add(pipe._raw)
        self._keys[pipe._raw] = (key, pipe)
        return key

    def accept(self, listener, n, timeout=None):
        """Accept pipes on ``listener`` until the set holds ``n`` (Timeout otherwise; those
        that came stay). Returns their keys."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = []
        while len(self) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            keys.append(self.add(listener.accept(left)))
        return keys

    def recv_any(self, timeout=None, *, tensors=None, payloads=None, shared=None,
                 cuda_alloc=None):
        """The next message of whichever pipe has one, fairly (round-robin among the ready):
        (key, Message). When a pipe ended, (key, None) once: it left the set, and
        ``last_error`` holds its exception (PipeClosed, PeerDied, ...). tensors, payloads,
        shared and cuda_alloc as Pipe.read(). Raises Timeout, NoListener when no pipe is left."""
        got = self._raw.read_any(timeout)
        key, pipe = self._keys[got[0]]
        if got[1] is None:
            del self._keys[got[0]]
            self.last_error = _error(-got[2], got[3])
            pipe.close()
            return key, None
        return key, pipe._read_desc(got[1], tensors, payloads, timeout, shared, cuda_alloc)

    def __iter__(self):
        """(key, Message) until no pipe is left; ended pipes are skipped."""
        while len(self):
            key, msg = self.recv_any()
            if msg is not None:
                yield key, msg

    def broadcast(self, metadata=b"", payloads=(), tensors=(), *, timeout=None,
                  contiguous=False):
        """Write one message to every pipe, reading the caller's memory once (private memory
        is staged once into a shared buffer). Returns {key: None or the exception of that
        pipe's delivery}; a slow (not done after ``timeout``) or gone reader fails only its
        own. Borrows everything until it returns."""
        wire = [_tensor.to_wire(t, contiguous, f"tensor {i}") for i, t in enumerate(tensors)]
        _cuda.track_wire(self._ctx, wire)
        res = self._raw.broadcast(metadata, list(payloads), [(b, h) for b, h, _ in wire],
                                  timeout)
        return {self._keys[raw][0]: (None if st == 0 else _error(-st, _tpipd.strerror(st)))
                for raw, st in res}

    def close(self):
        self._raw.close()
        self._keys.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_BY_ERRNO = {104: "PeerDied", 32: "PipeClosed", 125: "Cancelled", 110: "Timeout",
             90: "LimitExceeded", 105: "LimitExceeded", 7: "LimitExceeded", 103: "Aborted",
             13: "AccessDenied", 1: "AccessDenied"}


def _error(errno, msg):
    """The exception tpipd raises for ``errno`` (positive), with ``msg``."""
    return getattr(_tpipd, _BY_ERRNO.get(errno, "Error"))(errno, msg)
