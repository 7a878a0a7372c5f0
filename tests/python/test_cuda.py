# SPDX-License-Identifier: BSD-3-Clause
"""CUDA tensors through the Python module, between two processes, on the CUDA driver the test
runs with (the fakecuda stand-in under `meson test -C build --setup fakecuda --suite hw`; run.py
skips with the reason where no driver answers). Device memory comes from cudev.py (ctypes in
the tests only): arrays exposing __cuda_array_interface__ (with a stream) and DLPack producers
on a CUDA device are written and read back byte-exact by another process, into objects its
cuda_alloc= makes, into destinations it passes (DLPack and CAI), and into host memory; the
writer's stream is waited for; 0-d and empty device arrays travel; a non-contiguous device
array is refused; channel message items and work queue message questions and answers carry device arrays
the same way (read into cuda_alloc= objects, destinations and host memory; a submit waits for
the array's stream); tpipd.CudaArray wraps raw device memory for consumers; and the daemon's
mapping of an allocation (tpipd --cuda-cache-mappings yes) is released once the Python object
that was written from, or read into, is garbage, and at once by Context.cuda_release().
Collectives take the same device arrays (staged by libtpclient on their stream)."""
import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import cudev
import tpipd
from conftest import start_daemon

WORKER = os.path.join(os.path.dirname(__file__), "cuda_worker.py")
T = 30  # seconds: every wait's deadline

if cudev.why_not():
    pytest.skip(cudev.why_not(), allow_module_level=True)


@pytest.fixture(scope="module")
def cdaemon():
    """A daemon as configured by default: a mapping lives for its transfer only."""
    yield from start_daemon()


@pytest.fixture(scope="module")
def cached():
    """A daemon that keeps mappings for the session until released (tp_cuda_release())."""
    yield from start_daemon("--cuda-cache-mappings", "yes")


@pytest.fixture(scope="module")
def drv():
    return cudev.Driver(0)


def start_reader(sock, request):
    """(writer Context, Pipe to a cuda_worker.py process, the process) on daemon ``sock``."""
    name = "".join(c if c.isalnum() else "." for c in f"{request.node.name}.{os.getpid()}")
    proc = subprocess.Popen([sys.executable, WORKER, sock, name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    ctx = tpipd.Context(sock)
    return ctx, ctx.connect(name, timeout=T), proc


def stop_reader(ctx, pipe, proc):
    try:
        pipe.write(b"end")
        assert proc.wait(T) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctx.close()


@pytest.fixture
def reader(cdaemon, request):
    """(writer Context, Pipe to a cuda_worker.py process) on the default daemon."""
    ctx, pipe, proc = start_reader(cdaemon, request)
    yield ctx, pipe
    stop_reader(ctx, pipe, proc)


@pytest.fixture
def creader(cached, request):
    """The same on the daemon that caches mappings; the reader releases what it holds (its
    releases reach the daemon before its answer) before it exits."""
    ctx, pipe, proc = start_reader(cached, request)
    yield ctx, pipe
    pipe.write(b"drop")
    assert pipe.read(timeout=T).metadata == b"dropped"
    stop_reader(ctx, pipe, proc)


def ask(pipe, mode, tensors):
    """Send ``mode`` then ``tensors``; return (kinds, bytes) the reader received."""
    pipe.write(mode.encode())
    pipe.write(b"data", tensors=tensors, timeout=T)
    m = pipe.read(timeout=T)
    return json.loads(m.metadata), [bytes(p) for p in m.payloads]


def sources(drv):
    a = cudev.CaiArray(drv, (1000,), "float32")
    want_a = np.arange(1000, dtype=np.float32).tobytes()
    drv.htod(a.mem.ptr, want_a)
    b = cudev.DLArray(drv, (3, 5), "int16")
    want_b = (np.arange(15, dtype=np.int16) - 7).tobytes()
    drv.htod(b.mem.ptr, want_b)
    c = np.linspace(0, 1, 4)
    return [a, b, c], [want_a, want_b, c.tobytes()]


@pytest.mark.parametrize("mode, kinds", [
    ("alloc", ["CaiArray", "CaiArray", "ndarray"]),
    ("dest", ["DLArray", "CaiArray", "ndarray"]),
    ("host", ["ndarray", "ndarray", "ndarray"]),
    ("raw", ["CudaArray", "CudaArray", "ndarray"]),
])
def test_cuda_arrays_travel_byte_exact(reader, drv, mode, kinds):
    ctx, pipe = reader
    src, want = sources(drv)
    got_kinds, got = ask(pipe, mode, src)
    assert got_kinds == kinds
    assert got == want
    assert src[1].streams == [1]  # DLPack producers are asked for the legacy default stream


def test_write_waits_for_the_arrays_stream(reader, drv):
    """The daemon reads the array after the work queued on its CAI stream: a memset held
    behind a host function that waits for the test."""
    ctx, pipe = reader
    a = cudev.CaiArray(drv, (4096,), "uint8")
    drv.htod(a.mem.ptr, bytes(4096))
    s = drv.stream()
    gate = threading.Event()
    cb = drv.host_func(s, lambda: gate.wait(T))
    drv.memset_async(a.mem.ptr, 0x5A, 4096, s)
    a.stream = s
    pipe.write(b"host")
    fut = pipe.write_async(b"data", tensors=[a], timeout=T)
    # A write that ignored the stream would have read the zeros by now (not synchronisation:
    # the passing path waits for the gate, whatever this lasts).
    done_early = fut.done() or (time.sleep(0.3) or fut.done())
    gate.set()
    fut.result(T)
    m = pipe.read(timeout=T)
    drv.sync(s)
    del cb
    assert not done_early, "the write completed while its stream's work was held"
    assert bytes(m.payloads[0]) == b"\x5a" * 4096


def test_non_contiguous_device_array_is_refused(reader, drv):
    ctx, pipe = reader
    a = cudev.CaiArray(drv, (4, 4), "float32", strides=(4, 16))  # a transposed view
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        pipe.write(b"data", tensors=[a])


def test_channel_refuses_device_arrays(cdaemon, drv):
    with tpipd.Context(cdaemon) as ctx:
        ch = ctx.channel(f"cuda.ch.{os.getpid()}", create=True)
        for a in (cudev.CaiArray(drv, (4,), "float32"), cudev.DLArray(drv, (4,), "float32")):
            with pytest.raises(tpipd.NotSupported):
                ch.write(a)
            with pytest.raises(tpipd.NotSupported):
                ch.write_tensor(a)


def test_channel_message_items_carry_device_arrays(cdaemon, drv):
    """write_msg() takes device arrays as Pipe.write() does (the library copies them to host
    memory after their stream's work); read_msg() fills what cuda_alloc= makes, a device
    destination given, or host memory without either; the reader sees the writer's device."""
    with tpipd.Context(cdaemon) as ctx:
        ch = ctx.channel(f"cuda.msg.{os.getpid()}", create=True)
        for _ in range(3):
            src, want = sources(drv)
            ch.write_msg(b"dev", [b"p"], src, timeout=T)
        m = ch.read_msg(timeout=T, cuda_alloc=lambda shape, dtype, dev:
                        cudev.CaiArray(drv, shape, dtype))
        assert [type(t).__name__ for t in m.tensors] == ["CaiArray", "CaiArray", "ndarray"]
        assert [t.to_host() if hasattr(t, "to_host") else t.tobytes()
                for t in m.tensors] == want
        dst = cudev.DLArray(drv, (3, 5), "int16")
        m = ch.read_msg([None, dst, None], timeout=T, cuda_alloc=lambda shape, dtype, dev:
                        cudev.CaiArray(drv, shape, dtype))
        assert m.tensors[1] is dst and dst.to_host() == want[1]
        m = ch.read_msg(timeout=T)  # no torch CUDA here: host memory
        assert [type(t).__name__ for t in m.tensors] == ["ndarray"] * 3
        assert [t.tobytes() for t in m.tensors] == want
        bad = cudev.CaiArray(drv, (4, 4), "float32", strides=(4, 16))
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            ch.write_msg(b"", tensors=[bad])


def test_work_queue_messages_carry_device_arrays(cdaemon, drv):
    """WorkQueue.submit_msg() and reply_msg() take device arrays as Channel.write_msg() does
    (copied to host memory after their stream's work); take_msg(), read_msg() and
    answer_msg() fill what cuda_alloc= makes, a device destination given, or host memory;
    the descriptor names the writer's device."""
    alloc = lambda shape, dtype, dev: cudev.CaiArray(drv, shape, dtype)  # noqa: E731
    with tpipd.Context(cdaemon) as ctx:
        q = ctx.work_queue(f"cuda.wq.{os.getpid()}", create=True)
        w = ctx.work_queue(q.name)
        ids = []
        for _ in range(3):
            src, want = sources(drv)
            ids.append(q.submit_msg(b"dev", [b"p"], src))
        tid, m = w.take_msg(timeout=T, cuda_alloc=alloc)
        assert tid == ids[0]
        assert [type(t).__name__ for t in m.tensors] == ["CaiArray", "CaiArray", "ndarray"]
        assert [t.to_host() if hasattr(t, "to_host") else t.tobytes()
                for t in m.tensors] == want
        w.reply_msg(tid, b"ans", tensors=m.tensors[:2])  # device arrays answer back
        tid, d = w.take_descriptor(timeout=T)
        assert [(t.device, t.dtype, t.shape) for t in d.tensors] == [
            ("cuda:0", "float32", (1000,)), ("cuda:0", "int16", (3, 5)), ("cpu", "float64", (4,))]
        dst = cudev.DLArray(drv, (3, 5), "int16")
        m = w.read_msg(d, [None, dst, None], cuda_alloc=alloc)
        assert m.tensors[1] is dst and dst.to_host() == want[1]
        w.reply_msg(tid, b"")
        tid, m = w.take_msg(timeout=T)  # no torch CUDA here: host memory
        assert [type(t).__name__ for t in m.tensors] == ["ndarray"] * 3
        assert [t.tobytes() for t in m.tensors] == want
        w.reply_msg(tid, b"")
        adst = cudev.CaiArray(drv, (1000,), "float32")
        aid, a = q.answer_msg([adst, None], timeout=T, cuda_alloc=alloc)
        assert aid == ids[0] and a.tensors[0] is adst and a.metadata == b"ans"
        assert [t.to_host() for t in a.tensors] == want[:2]
        bad = cudev.CaiArray(drv, (4, 4), "float32", strides=(4, 16))
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            q.submit_msg(b"", tensors=[bad])


def test_work_queue_submit_waits_for_the_arrays_stream(cdaemon, drv):
    """submit_msg() copies a device array after the work queued on its CAI stream."""
    with tpipd.Context(cdaemon) as ctx:
        q = ctx.work_queue(f"cuda.wqs.{os.getpid()}", create=True)
        w = ctx.work_queue(q.name)
        a = cudev.CaiArray(drv, (4096,), "uint8")
        drv.htod(a.mem.ptr, bytes(4096))
        s = drv.stream()
        gate = threading.Event()
        cb = drv.host_func(s, lambda: gate.wait(T))
        drv.memset_async(a.mem.ptr, 0x5A, 4096, s)
        a.stream = s
        done = []
        t = threading.Thread(target=lambda: done.append(q.submit_msg(b"", tensors=[a])))
        t.start()
        # A submit that ignored the stream would have copied the zeros by now (not
        # synchronisation: the passing path waits for the gate, whatever this lasts).
        t.join(0.3)
        done_early = bool(done)
        gate.set()
        t.join(T)
        drv.sync(s)
        del cb
        assert not done_early, "the submit completed while its stream's work was held"
        tid, m = w.take_msg(timeout=T)
        assert tid == done[0] and m.tensors[0].tobytes() == b"\x5a" * 4096


# ---- release of the daemon's mappings ---------------------------------------------------------

def mappings(sock):
    out = subprocess.run([os.environ["TPIPCTL_BIN"], "--socket", sock, "status", "--json"],
                         check=True, capture_output=True, text=True, timeout=T).stdout
    return json.loads(out)["cuda_mappings"]


def wait_mappings(sock, want):
    """The daemon's mapping count once it is ``want`` (a deadline, not a sleep)."""
    deadline = time.monotonic() + T
    n = mappings(sock)
    while n != want and time.monotonic() < deadline:
        time.sleep(0.02)
        n = mappings(sock)
    return n


def test_written_array_is_released_when_garbage(creader, drv, cached):
    ctx, pipe = creader
    cdaemon = cached
    a = cudev.CaiArray(drv, (1 << 16,), "float32")
    before = mappings(cdaemon)
    ask(pipe, "host", [a])  # warms the writer's event pool: its mappings stay
    with_a = mappings(cdaemon)
    assert with_a > before
    b = cudev.CaiArray(drv, (1 << 16,), "float32")
    ask(pipe, "host", [b])
    assert wait_mappings(cdaemon, with_a + 1) == with_a + 1, "b's allocation is mapped"
    del b
    gc.collect()
    assert wait_mappings(cdaemon, with_a) == with_a, \
        "the daemon still maps the allocation of an array that is garbage"
    ctx.cuda_release(a)  # at once, while a lives
    assert wait_mappings(cdaemon, with_a - 1) == with_a - 1
    assert tpipd._cuda.tracked(ctx._raw) == 0


def test_destination_is_released_when_garbage(creader, drv, cached):
    """The reader's cuda_alloc= arrays (the writer's array stays alive and mapped)."""
    ctx, pipe = creader
    cdaemon = cached
    a = cudev.CaiArray(drv, (1 << 16,), "float32")
    ask(pipe, "alloc", [a])  # the first mapping of each side, and their events
    pipe.write(b"drop")
    assert pipe.read(timeout=T).metadata == b"dropped"
    base = mappings(cdaemon)
    ask(pipe, "alloc", [a])
    assert wait_mappings(cdaemon, base + 1) == base + 1, \
        "the destination is not mapped anew (its earlier mapping was never released?)"
    pipe.write(b"drop")
    assert pipe.read(timeout=T).metadata == b"dropped"
    assert wait_mappings(cdaemon, base) == base, \
        "the daemon still maps a destination that is garbage"


# ---- collectives on device memory ---------------------------------------------------------------

def test_collectives_on_device_arrays(cdaemon, drv):
    """Two members (threads of this process, each with its own Context) all-reduce, broadcast
    and all-gather CUDA arrays (CAI and DLPack), blocking and async; a CPU call after a CUDA
    one runs on the CPU again. libtpclient stages through host memory on the arrays' stream."""
    name = f"cuda.coll.{os.getpid()}"
    out, errs = {}, []

    def member(rank):
        try:
            drv.current()
            with tpipd.Context(cdaemon) as ctx:
                g = tpipd.init_group(name, 2, rank, context=ctx, join_timeout=T, op_timeout=T)
                a = cudev.CaiArray(drv, (1000,), "float32")
                drv.htod(a.mem.ptr, (np.arange(1000, dtype=np.float32) * (rank + 1)).tobytes())
                g.all_reduce(a)
                b = cudev.DLArray(drv, (64,), "int64")
                drv.htod(b.mem.ptr, np.full(64, 10 + rank, dtype=np.int64).tobytes())
                g.all_reduce(b, op="max", async_op=True).wait()
                c = cudev.CaiArray(drv, (8,), "float64")
                drv.htod(c.mem.ptr, np.full(8, rank + 0.5).tobytes())
                g.broadcast(c, src=1)
                gat = cudev.CaiArray(drv, (2, 4), "float32")
                mine = cudev.CaiArray(drv, (4,), "float32")
                drv.htod(mine.mem.ptr, np.full(4, rank, dtype=np.float32).tobytes())
                g.all_gather(gat, mine)
                cpu = np.ones(4)
                g.all_reduce(cpu)
                out[rank] = (np.frombuffer(a.to_host(), np.float32),
                             np.frombuffer(b.to_host(), np.int64),
                             np.frombuffer(c.to_host(), np.float64),
                             np.frombuffer(gat.to_host(), np.float32), cpu)
                g.leave()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errs.append(e)
    ts = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(2 * T)
    assert not errs, errs
    for rank in range(2):
        a, b, c, gat, cpu = out[rank]
        assert (a == np.arange(1000, dtype=np.float32) * 3).all()
        assert (b == 11).all()
        assert (c == 1.5).all()
        assert gat.tolist() == [0.0] * 4 + [1.0] * 4
        assert (cpu == 2).all()


def test_collective_waits_for_the_arrays_stream(cdaemon, drv):
    """A CUDA array goes to libtpclient as device memory with its stream: the all-reduce
    copies the input out after the work queued on that stream (here held behind a host
    function until the gate opens) and returns only after it. Read as CPU memory, it would
    return at once, with the gate still closed."""
    with tpipd.Context(cdaemon) as ctx:
        g = tpipd.init_group(f"cuda.one.{os.getpid()}", 1, 0, context=ctx, join_timeout=T)
        s = drv.stream()
        a = cudev.CaiArray(drv, (4096,), "uint8", stream=s)
        drv.htod(a.mem.ptr, bytes(4096))
        gate = threading.Event()
        cb = drv.host_func(s, lambda: gate.wait(T))
        drv.memset_async(a.mem.ptr, 7, 4096, s)
        opener = threading.Timer(0.3, gate.set)
        opener.start()
        g.all_reduce(a)
        returned_after_gate = gate.is_set()
        opener.join()
        drv.sync(s)
        del cb
        assert returned_after_gate, "the all-reduce did not wait for the array's stream"
        assert a.to_host() == b"\x07" * 4096
        g.leave()


def test_cuda_array_wraps_device_memory_for_consumers(drv, cdaemon, reader):
    """tpipd.CudaArray over memory from any allocator: its CAI and DLPack views name the same
    device memory, it travels as a CUDA tensor, and its DLPack capsule keeps its owner."""
    ctx, pipe = reader
    mem = cudev.DevAlloc(drv, 4 * 256)
    drv.htod(mem.ptr, np.arange(256, dtype=np.float32).tobytes())
    a = tpipd.CudaArray(mem.ptr, (16, 16), "float32", owner=mem)
    assert a.__cuda_array_interface__["typestr"] == "<f4"
    assert cudev.dlpack_info(a) == (mem.ptr, (2, 0), (16, 16), (2, 32))
    kinds, got = ask(pipe, "host", [a])
    assert kinds == ["ndarray"] and got == [np.arange(256, dtype=np.float32).tobytes()]
    cap = a.__dlpack__()
    alive = weakref.ref(mem)
    del a, mem
    gc.collect()
    assert alive() is not None, "the capsule does not keep the memory's owner"
    del cap
    gc.collect()
    assert alive() is None, "the owner outlives every view of it"


def test_no_leak_over_1000_fresh_device_arrays(creader, drv, cached):
    """A fresh device array object per message (as a training loop makes them): each is
    released when it dies, so neither the daemon's mappings nor the module's finalizers nor
    Python's memory grow."""
    import tracemalloc
    ctx, pipe = creader
    cdaemon = cached

    def one():
        a = cudev.CaiArray(drv, (1024,), "float32")
        ask(pipe, "host", [a])
    for _ in range(20):
        one()
    gc.collect()
    base = wait_mappings(cdaemon, mappings(cdaemon))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(1000):
        one()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert tpipd._cuda.tracked(ctx._raw) == 0
    assert wait_mappings(cdaemon, base) == base
    assert grown < 64 * 1024, f"Python allocations grew by {grown} bytes"


def test_zero_d_and_empty_device_arrays(reader, drv):
    ctx, pipe = reader
    src = [cudev.CaiArray(drv, (0,), "float32"), cudev.CaiArray(drv, (), "float32"),
           cudev.CaiArray(drv, (3, 0), "int16")]
    drv.htod(src[1].mem.ptr, np.float32(2.5).tobytes())
    kinds, got = ask(pipe, "alloc", src)
    assert kinds == ["CaiArray"] * 3
    assert got == [b"", np.float32(2.5).tobytes(), b""]
