# SPDX-License-Identifier: BSD-3-Clause
"""tpipd: move numpy arrays and torch tensors between processes through the local tpipd
daemon (libtpclient), with pipes (Context, Listener, Pipe) and groups (init_group, all_reduce,
broadcast, barrier, all_gather, reduce_scatter). See docs/python.md.

Channels (Channel, unlink_channel) are in tpipd/_channel.py, work queues (WorkQueue) in
tpipd/_wq.py. CPU torch tensors go in and come out through DLPack (no copy on our side).
"""
try:
    from . import _tpipd  # installed: the extension inside the package
except ImportError:  # the build tree: _tpipd beside the package on sys.path
    import _tpipd
    import sys
    sys.modules[__name__ + "._tpipd"] = _tpipd

from ._tpipd import (  # noqa: F401
    Error, PeerDied, PipeClosed, NoListener, NoDaemon, Timeout, AccessDenied, Cancelled,
    Aborted, LimitExceeded, NameInUse, Mismatch, InvalidArgument, NotSupported, Closed,
    ProtocolError, SharedBuffer, strerror, Drained, InDoubt, NothingOutstanding)
from ._pipe import Context, Listener, Pipe, Message  # noqa: F401
from ._channel import Channel, unlink_channel  # noqa: F401
from ._set import PipeSet, Fanout  # noqa: F401
from ._wq import WorkQueue, MessageDescriptor, TensorInfo  # noqa: F401
from ._cuda import CudaArray  # noqa: F401
from ._group import (  # noqa: F401
    Group, Work, ReduceOp, init_group, all_reduce, broadcast, barrier, all_gather,
    reduce_scatter, destroy_group)

TimeoutError = Timeout
PermissionError = AccessDenied

__version__ = "0.1.0"

_default_context = None


def default_context():
    """A Context shared by empty() and zeros() (opened on first use)."""
    global _default_context
    if _default_context is None or _default_context.closed:
        _default_context = Context()
    return _default_context


def empty(shape, dtype="float32", *, like="numpy", context=None):
    """An uninitialised array / tensor in a shared buffer of ``context`` (default_context())."""
    return (context or default_context()).empty(shape, dtype, like=like)


def zeros(shape, dtype="float32", *, like="numpy", context=None):
    """empty() filled with zeros."""
    return (context or default_context()).zeros(shape, dtype, like=like)
