# SPDX-License-Identifier: BSD-3-Clause
"""tpipd.Channel against a real daemon: producer and consumers in other processes, a close
waking a reader blocked in another process, Ctrl-C during a blocking read, every dtype of
numpy and torch round-tripping byte-exact (raw and typed items), each error as its exception,
the GIL released while a read waits, release and Context.close() ending another thread's read,
and no leak over 10 000 writes and reads (tracemalloc, RSS, gc objects, reference counts)."""
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import tpipd
from tpipd import _tensor

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "chan_worker.py")


def uniq(request, tag=""):
    name = f"c.{request.node.name[:40]}.{tag}.{os.getpid()}"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def worker(*args, **kw):
    return subprocess.Popen([sys.executable, WORKER] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def result(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    assert p.returncode == 0, f"worker failed ({p.returncode}): {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def wait_reader(daemon, name, deadline_s=20):
    """Until the daemon shows a reader waiting on @name (tpipctl channels --json)."""
    ctl = os.environ.get("TPIPCTL_BIN")
    if not ctl:
        pytest.skip("TPIPCTL_BIN not set (run through meson test)")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        out = subprocess.run([ctl, "--socket", daemon, "--json", "channels"],
                             capture_output=True, text=True, check=True).stdout
        chans = [c for c in json.loads(out)["channels"] if c["name"] == name]
        if chans and chans[0]["readers_waiting"] > 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"no reader waiting on {name} after {deadline_s} s")


@pytest.fixture
def ctx(daemon):
    c = tpipd.Context(daemon)
    yield c
    c.close()


def test_producer_and_two_consumers_in_other_processes(ctx, request):
    name = uniq(request)
    ch = ctx.channel(name, create=True, capacity=16)  # backpressure: the producer waits
    consumers = [worker("consume", name) for _ in range(2)]
    producer = worker("produce", name, 1000)
    assert result(producer) == {"written": 1000}
    got = [result(c) for c in consumers]
    assert sum(g["count"] for g in got) == 1000
    expect = sum(float((np.arange(i % 50, dtype=np.float32) + i).sum()) + i % 50
                 for i in range(1000))
    assert sum(g["sum"] for g in got) == pytest.approx(expect)
    assert all(g["state"] == "drained" for g in got)
    assert ch.state == "open"  # this handle has not read since
    with pytest.raises(tpipd.Drained):
        ch.read(timeout=0)
    assert ch.state == "drained"


def test_close_wakes_a_reader_blocked_in_another_process(ctx, daemon, request):
    name, ready = uniq(request), uniq(request, "ready")
    ch = ctx.channel(name, create=True)
    rd = ctx.channel(ready, create=True)
    p = worker("block", name, ready)
    assert rd.read(timeout=30) == b"ready"
    wait_reader(daemon, name)
    t0 = time.monotonic()
    ch.close()
    assert result(p) == {"ended": "drained", "state": "drained"}
    assert time.monotonic() - t0 < 10


def test_ctrl_c_interrupts_a_blocking_read(ctx, daemon, request):
    name, ready = uniq(request), uniq(request, "ready")
    ch = ctx.channel(name, create=True)
    rd = ctx.channel(ready, create=True)
    p = worker("block", name, ready)
    assert rd.read(timeout=30) == b"ready"
    wait_reader(daemon, name)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    assert result(p) == {"ended": "interrupted", "after": "after"}
    assert time.monotonic() - t0 < 10
    with pytest.raises(tpipd.Timeout):
        ch.read(timeout=0)


def test_ctrl_c_in_this_thread_raises_keyboard_interrupt(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ch.read(timeout=30)
    timer.join()
    assert time.monotonic() - t0 < 5
    ch.write(b"still usable")
    assert ch.read(timeout=5) == b"still usable"


def all_dtypes():
    out = []
    for name in (n for n, _, _ in _tensor.DTYPES.values()):
        if name != "bfloat16":
            out.append(("numpy", name))
        out.append(("torch", name))
    return out


def sample(kind, name, shape=(3, 5)):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * 16, dtype=np.uint8)
    if name == "bool":
        raw = raw % 2
    if kind == "numpy":
        return np.frombuffer(raw.tobytes(), dtype=name, count=int(np.prod(shape))).reshape(shape)
    torch = _tensor.torch_module()
    if torch is None:
        pytest.skip("torch is not installed")
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=getattr(torch, name)).element_size()
    base = torch.from_numpy(raw[:nbytes].copy())
    return base.view(getattr(torch, name)).reshape(shape)


def as_bytes(x):
    return bytes(_tensor.cpu_buffer(x).tobytes()) if _tensor.is_torch(x) else x.tobytes()


@pytest.mark.parametrize("kind,name", all_dtypes())
def test_every_dtype_round_trips_byte_exact(ctx, request, kind, name):
    ch = ctx.channel(uniq(request), create=True)
    x = sample(kind, name)
    ch.write(x)  # raw bytes, read into a preallocated destination of the same kind
    dst = sample(kind, name) * 0 if name != "bool" else sample(kind, name) & False
    assert ch.read_into(dst, timeout=5) == len(as_bytes(x))
    assert as_bytes(dst) == as_bytes(x)
    ch.write_tensor(x)  # typed: the same kind, dtype and shape come back
    y = ch.read_tensor(timeout=5)
    assert type(y) is type(x) and str(y.dtype) == str(x.dtype)
    assert tuple(y.shape) == tuple(x.shape) and as_bytes(y) == as_bytes(x)
    ch.write_many([x, memoryview(as_bytes(x)), bytearray(b"z")])
    assert ch.read(timeout=5) == as_bytes(x) == ch.read(timeout=5)
    assert ch.read(timeout=5) == b"z"


def test_zero_d_empty_and_non_contiguous_items(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    ch.write_tensors([np.float64(2.5), np.zeros((0, 4), np.int32)])
    a, b = ch.read_tensor(timeout=5), ch.read_tensor(timeout=5)
    assert a.shape == () and a == 2.5 and b.shape == (0, 4) and b.dtype == np.int32
    m = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        ch.write(m)
    ch.write(m, contiguous=True)
    assert ch.read(timeout=5) == np.ascontiguousarray(m).tobytes()
    torch = _tensor.torch_module()
    if torch is not None:
        t = torch.arange(12).reshape(3, 4).t()
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            ch.write_tensor(t)
        ch.write_tensor(t, contiguous=True)
        assert torch.equal(ch.read_tensor(timeout=5), t)


def test_read_many_into_packs_items_and_leaves_what_does_not_fit(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    items = [bytes([i]) * n for i, n in enumerate([1, 63, 64, 65, 1000, 7], start=1)]
    ch.write_many(items)
    buf = np.zeros(64 + 64 + 64 + 128, np.uint8)  # the first four items, packed
    got = ch.read_many_into(buf, max=16, timeout=5)
    assert got == [(0, 1), (64, 63), (128, 64), (192, 65)]
    for (off, n), item in zip(got, items):
        assert buf[off:off + n].tobytes() == item
    with pytest.raises(tpipd.LimitExceeded):
        ch.read_many_into(bytearray(999), timeout=5)  # the 1000-byte item stays first
    out = bytearray(4096)
    got = ch.read_many_into(out, max=1, timeout=5)  # max: one item
    assert got == [(0, 1000)] and bytes(out[:1000]) == items[4]
    got = ch.read_many_into(out, timeout=5)
    assert got == [(0, 7)] and bytes(out[:7]) == items[5]
    with pytest.raises(tpipd.Timeout):
        ch.read_many_into(out, timeout=0)
    with pytest.raises(ValueError, match="max must be"):
        ch.read_many_into(out, max=0)
    ch.write(b"last")
    ch.close()
    assert ch.read_many_into(out, timeout=5) == [(0, 4)]
    with pytest.raises(tpipd.Drained):
        ch.read_many_into(out, timeout=5)


def test_errors_raise_the_documented_exceptions(ctx, request):
    name = uniq(request)
    with pytest.raises(tpipd.NoListener) as e:
        ctx.channel(name)  # unknown name
    assert isinstance(e.value, FileNotFoundError) and "no such channel" in str(e.value)
    with pytest.raises(ValueError, match="mode must be"):
        ctx.channel(name, create=True, mode="world")
    with pytest.raises(tpipd.InvalidArgument):
        ctx.channel("bad name!", create=True)
    ch = ctx.channel(name, create=True, capacity=2, capacity_bytes=64)
    with pytest.raises(tpipd.NameInUse):
        ctx.channel(name, create=True, exclusive=True)
    with pytest.raises(tpipd.InvalidArgument):
        ch.write(b"")  # an empty item
    with pytest.raises(tpipd.LimitExceeded):
        ch.write(b"x" * 65)  # larger than the channel
    with pytest.raises(tpipd.LimitExceeded):
        ch.write_many([b"a", b"b", b"c"])  # more items than its capacity
    ch.write_many([b"a", b"b"])
    with pytest.raises(tpipd.LimitExceeded):
        ch.write(b"c", timeout=0)  # full, no wait
    t0 = time.monotonic()
    with pytest.raises(tpipd.Timeout):
        ch.write(b"c", timeout=0.3)  # full until the deadline
    assert 0.25 <= time.monotonic() - t0 < 5
    with pytest.raises(tpipd.LimitExceeded) as e:
        ch.read_into(bytearray(0), timeout=5)  # the item does not fit: it comes with the error
    assert e.value.item == b"a"
    with pytest.raises(tpipd.ProtocolError):
        ch.read_tensor(timeout=5)  # b"b" is not a typed item
    with pytest.raises(tpipd.Timeout) as e:
        ch.read(timeout=0)
    assert isinstance(e.value, TimeoutError)
    ch.write(b"last")
    ch.close()
    ch.close()  # idempotent
    with pytest.raises(tpipd.PipeClosed) as e:
        ch.write(b"late")
    assert isinstance(e.value, BrokenPipeError) and not isinstance(e.value, tpipd.Drained)
    assert ch.read(timeout=5) == b"last" and ch.state == "closed"
    with pytest.raises(tpipd.Drained) as e:
        ch.read(timeout=5)
    assert isinstance(e.value, tpipd.PipeClosed) and isinstance(e.value, BrokenPipeError)
    assert e.value.errno == 32 and ch.state == "drained"
    assert list(ch) == []
    ch.release()
    ch.release()  # idempotent
    with pytest.raises(tpipd.Closed):
        ch.read(timeout=0)
    assert ch.state == "released"
    if _tensor.torch_module() is not None and _tensor.torch_module().cuda.is_available():
        with pytest.raises(tpipd.NotSupported):
            ch.write(_tensor.torch_module().ones(1, device="cuda"))


def test_access_mode_refuses_another_uid(ctx, daemon, request):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    os.chmod(os.path.dirname(daemon), 0o755)  # the test daemon's private directory
    owner = ctx.channel(uniq(request, "owner"), create=True)
    anyone = ctx.channel(uniq(request, "anyone"), create=True, mode="anyone")
    # refused by the mode: to uid 4242 the channel does not exist
    assert result(worker("open_as", 4242, owner.name))["error"] == "NoListener"
    assert result(worker("open_as", 4242, anyone.name)) == {"error": None}
    assert anyone.read(timeout=5) == b"from 4242"
    assert result(worker("open_as", 4242, uniq(request, "none")))["error"] == "NoListener"


def test_iteration_ends_when_drained(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    ch.write_many([b"%d" % i for i in range(100)])
    ch.close()
    assert [int(x) for x in ch] == list(range(100))
    assert ch.state == "drained"


def test_futures_and_asyncio_forms(ctx, request):
    """write_async/read_async futures in call order; awrite/aread; ``async for`` ends when
    the channel is drained; a read future waiting on an empty channel ends with Closed when
    the handle is released."""
    import asyncio
    ch = ctx.channel(uniq(request), create=True)
    futs = [ch.write_async(b"%d" % i) for i in range(20)]
    futs.append(ch.write_async(np.arange(3.0), typed=True))
    assert [f.result(10) for f in futs] == [None] * 21
    assert [int(ch.read_async().result(10)) for _ in range(20)] == list(range(20))
    assert ch.read_async(typed=True).result(10).tolist() == [0.0, 1.0, 2.0]

    async def main():
        await ch.awrite(b"a")
        await ch.awrite(torch_or_np_ones(), typed=True)
        got = [await ch.aread(), (await ch.aread(typed=True)).tolist()]
        for i in range(5):
            await ch.awrite(b"%d" % i)
        ch.close()
        return got, [x async for x in ch]
    got, rest = asyncio.run(main())
    assert got == [b"a", [1.0, 1.0]] and rest == [b"%d" % i for i in range(5)]
    assert ch.state == "drained"
    other = ctx.channel(uniq(request, "b"), create=True)
    fut = other.read_async(timeout=30)
    other.release()
    with pytest.raises(tpipd.Closed):
        fut.result(10)


def torch_or_np_ones():
    torch = _tensor.torch_module()
    return torch.ones(2) if torch is not None else np.ones(2)


def test_a_blocked_read_leaves_other_threads_running(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    with pytest.raises(tpipd.Timeout):
        ch.read(timeout=0.5)
    stop.set()
    t.join()
    assert len(ticks) > 50  # the spinning thread held the GIL over 50 times meanwhile


def test_release_and_context_close_end_another_threads_read(daemon, request):
    c = tpipd.Context(daemon)
    for how in ("release", "context"):
        ch = c.channel(uniq(request, how), create=True)
        got = {}

        def reader():
            try:
                ch.read()
            except tpipd.Error as e:
                got["e"] = e
        t = threading.Thread(target=reader)
        t.start()
        wait_reader(daemon, ch.name)
        t0 = time.monotonic()
        if how == "release":
            ch.release()
        else:
            c.close()
        t.join(10)
        assert not t.is_alive() and isinstance(got.get("e"), tpipd.Closed)
        assert time.monotonic() - t0 < 5 and ch.state == "released"


def test_persistent_channel_outlives_its_handles_until_unlinked(daemon, request):
    name = uniq(request)
    with tpipd.Context(daemon) as c:
        with c.channel(name, create=True, persistent=True) as ch:
            ch.write(b"kept")
    with tpipd.Context(daemon) as c:
        ch = c.channel(name)
        assert ch.read(timeout=5) == b"kept"
        tpipd.unlink_channel(name, context=c)
        ch.release()
        with pytest.raises(tpipd.NoListener):
            c.channel(name)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def exchange(ch, x, t, buf, n):
    for i in range(n):
        ch.write(b"item")
        assert ch.read() == b"item"
        ch.write_many([x, t] if t is not None else [x])
        assert ch.read_into(buf) == x.nbytes
        if t is not None:
            ch.read_into(buf)
        ch.write_tensor(x)
        ch.read_tensor()


def test_no_leak_over_10k_writes_and_reads(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    torch = _tensor.torch_module()
    x = np.arange(64, dtype=np.float32)
    t = torch.arange(64, dtype=torch.float32) if torch is not None else None
    buf = np.empty(64, np.float32)
    exchange(ch, x, t, buf, 500)  # warm up
    gc.collect()
    refs = (sys.getrefcount(x), sys.getrefcount(t), sys.getrefcount(buf))
    objects = len(gc.get_objects())
    tracemalloc.start()
    before_py = tracemalloc.get_traced_memory()[0]
    before_rss = rss_kib()
    exchange(ch, x, t, buf, 10000)
    gc.collect()
    grown_py = tracemalloc.get_traced_memory()[0] - before_py
    tracemalloc.stop()
    grown_rss = rss_kib() - before_rss
    assert (sys.getrefcount(x), sys.getrefcount(t), sys.getrefcount(buf)) == refs
    assert len(gc.get_objects()) - objects < 100
    assert grown_py < 64 * 1024, f"Python allocations grew by {grown_py} bytes"
    assert grown_rss < 8 * 1024, f"RSS grew by {grown_rss} KiB"


def test_pipe_set_recv_any_and_broadcast(daemon, request):
    with tpipd.Context(daemon) as server, tpipd.Context(daemon) as client:
        lst = server.listen(uniq(request))
        futs = [lst.accept_async(10) for _ in range(3)]
        clients = [client.connect(lst.name, timeout=10) for _ in range(3)]
        s = tpipd.PipeSet(server)
        for i, f in enumerate(futs):
            assert s.add(f.result(10), key=f"k{i}") == f"k{i}"
        assert len(s) == 3
        x = np.arange(1000, dtype=np.float64)
        res = s.broadcast(b"all", [b"p"], [x], timeout=10)
        assert res == {"k0": None, "k1": None, "k2": None}
        for c in clients:
            m = c.read(timeout=10)
            assert m.metadata == b"all" and bytes(m.payloads[0]) == b"p"
            assert m.tensors[0].tobytes() == x.tobytes()
        for i, c in enumerate(clients):
            c.write(b"from %d" % i, tensors=[np.full(4, i, np.int32)])
        got = {}
        for _ in range(3):
            key, m = s.recv_any(timeout=10)
            got[key] = (m.metadata, m.tensors[0].tolist())
        assert got == {f"k{i}": (b"from %d" % i, [i] * 4) for i in range(3)}
        clients[1].close()
        key, m = s.recv_any(timeout=10)
        assert (key, m) == ("k1", None) and isinstance(s.last_error, tpipd.Error)
        assert len(s) == 2
        with pytest.raises(tpipd.Timeout):
            s.recv_any(timeout=0.3)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            s.recv_any(timeout=30)
        timer.join()
        s.close()
        assert len(s) == 0


def test_example_pipeline_shuts_down_by_cascading_closes(daemon):
    ex = os.path.join(os.environ.get("TPY_EXAMPLES", ""), "chan_pipeline.py")
    p = subprocess.run([sys.executable, ex, "300"], capture_output=True, text=True, timeout=150)
    assert p.returncode == 0 and ": OK" in p.stdout, p.stdout + p.stderr
