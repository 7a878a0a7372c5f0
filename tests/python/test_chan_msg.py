# SPDX-License-Identifier: BSD-3-Clause
"""tpipd.Channel message items (write_msg(), write_msgs(), read_msg(), msgs()) against a real
daemon: numpy arrays of every dtype in several shapes and torch tensors of every dtype come
back as the same kind, dtype, shape and bytes; 0-element arrays, 0-d arrays, metadata-only and
empty messages; several payloads and tensors at sizes that ride inline, by reference and
staged, into fresh memory, into the caller's destinations and into shared buffers; a batch
stays atomic and contiguous against another writer; readers in several threads take every
message once; close then drain; a reader and a writer in another process; byte items read as
messages of one payload and message items refusing the byte reads while staying first; each
error as its exception (non-contiguous tensors, mismatched destinations, released handle,
closed context, limits); futures and asyncio; no leak over 2000 round trips; and
examples/python/chan_msgs.py (numpy and torch)."""
import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import tpipd
from tpipd import _tensor
from test_chan import all_dtypes, as_bytes, result, sample, uniq, worker

T = 30  # seconds: every wait's deadline


@pytest.fixture
def ctx(daemon):
    c = tpipd.Context(daemon)
    yield c
    c.close()


def torch_or_skip():
    torch = _tensor.torch_module()
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


def same(x, y):
    """``y`` is ``x`` again: the same kind (numpy or torch), dtype, shape and bytes."""
    assert type(y) is type(x), (type(x), type(y))
    assert str(y.dtype) == str(x.dtype) and tuple(y.shape) == tuple(x.shape)
    assert as_bytes(y) == as_bytes(x)


SHAPES = [(), (0,), (7,), (3, 5), (2, 0, 3), (2, 3, 4)]


@pytest.mark.parametrize("name", [n for k, n in all_dtypes() if k == "numpy"])
def test_numpy_arrays_of_every_dtype_and_shape_round_trip(ctx, request, name):
    ch = ctx.channel(uniq(request), create=True)
    xs = [sample("numpy", name, shape) for shape in SHAPES]
    for x in xs:
        ch.write_msg(b"np", tensors=[x])
    for x in xs:
        m = ch.read_msg(timeout=T)
        assert m.metadata == b"np" and m.payloads == []
        same(x, m.tensors[0])
        assert m.tensors[0].flags.writeable and m.tensors[0].flags.c_contiguous


@pytest.mark.parametrize("name", [n for k, n in all_dtypes() if k == "torch"])
def test_torch_tensors_of_every_dtype_round_trip(ctx, request, name):
    torch = torch_or_skip()
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    ch = ctx.channel(uniq(request), create=True)
    xs = [sample("torch", name, shape) for shape in ((3, 5), (), (4, 1, 2))]
    xs.append(torch.empty((0, 2), dtype=getattr(torch, name)))
    ch.write_msg(b"t", tensors=xs)  # one message of several tensors
    m = ch.read_msg(timeout=T)
    assert len(m.tensors) == len(xs)
    for x, y in zip(xs, m.tensors):
        same(x, y)


def test_zero_element_metadata_only_and_empty_messages(ctx, request):
    torch = torch_or_skip()
    ch = ctx.channel(uniq(request), create=True)
    ch.write_msg(b"only metadata")
    ch.write_msg()
    ch.write_msg(b"", [b"", b""], [np.zeros((0, 3), np.int32), torch.empty(0, 4),
                                  np.float64(2.5)])
    assert ch.read_msg(timeout=T) == (b"only metadata", [], [])
    assert ch.read_msg(timeout=T) == (b"", [], [])
    m = ch.read_msg(timeout=T)
    assert m.metadata == b"" and m.payloads == [bytearray(), bytearray()]
    a, t, s = m.tensors
    assert isinstance(a, np.ndarray) and a.shape == (0, 3) and a.dtype == np.int32
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (0, 4)
    assert s.shape == () and s == 2.5
    with pytest.raises(tpipd.Timeout):
        ch.read_msg(timeout=0)


def test_several_payloads_and_tensors_at_every_size(ctx, request):
    """Sizes that ride inline (small), by reference (above 16 KiB) and staged (several MiB),
    into fresh memory, into the caller's destinations (filled in place) and into shared
    buffers (shared=)."""
    ch = ctx.channel(uniq(request), create=True)
    rng = np.random.default_rng(3)
    pays = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (0, 1, 20000, 300000)]
    tens = [rng.standard_normal(1 << 20).astype(np.float32),
            rng.integers(0, 256, (70, 1000), dtype=np.uint8), np.arange(3, dtype=np.int64)]
    for _ in range(3):
        ch.write_msg(b"big", pays, tens, timeout=T)
    m = ch.read_msg(timeout=T)
    assert [bytes(p) for p in m.payloads] == pays
    for x, y in zip(tens, m.tensors):
        same(x, y)
    dst = np.empty_like(tens[0])
    pdst = bytearray(300000)
    m = ch.read_msg([dst, None, None], [None, None, None, pdst], timeout=T)
    assert m.tensors[0] is dst and m.payloads[3] is pdst
    assert bytes(pdst) == pays[3] and as_bytes(dst) == as_bytes(tens[0])
    m = ch.read_msg(timeout=T, shared=ctx)
    for x, y in zip(tens, m.tensors):
        same(x, y)
    assert [bytes(p) for p in m.payloads] == pays


def test_a_batch_is_atomic_and_contiguous_against_another_writer(daemon, request):
    name = uniq(request)
    rounds, size = 15, 4
    with tpipd.Context(daemon) as rctx:
        ch = rctx.channel(name, create=True)

        def writer(w):
            with tpipd.Context(daemon) as wctx:
                wch = wctx.channel(name)
                for b in range(rounds):
                    wch.write_msgs([(b"%d.%d" % (w, b), [bytes([k])], [np.full(k + 1, w)])
                                    for k in range(size)], timeout=T)
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        got = [ch.read_msg(timeout=T) for _ in range(2 * rounds * size)]
        for t in threads:
            t.join(T)
        for i in range(0, len(got), size):
            group = got[i:i + size]
            assert len({m.metadata for m in group}) == 1, [m.metadata for m in group]
            assert [bytes(m.payloads[0]) for m in group] == [bytes([k]) for k in range(size)]
            assert [m.tensors[0].size for m in group] == list(range(1, size + 1))
        assert sorted({m.metadata for m in got}) == sorted(
            b"%d.%d" % (w, b) for w in range(2) for b in range(rounds))
        # all or nothing: a batch with a bad message writes none of it
        bad = np.arange(16.0).reshape(4, 4)[:, ::2]
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            ch.write_msgs([(b"ok", [], [np.ones(2)]), (b"bad", [], [bad])])
        with pytest.raises(tpipd.Timeout):
            ch.read_msg(timeout=0)


def test_batch_above_the_capacity_writes_nothing(ctx, request):
    ch = ctx.channel(uniq(request), create=True, capacity=3)
    with pytest.raises(tpipd.LimitExceeded):
        ch.write_msgs([(b"%d" % i, [], []) for i in range(4)], timeout=0)
    with pytest.raises(tpipd.Timeout):
        ch.read_msg(timeout=0)
    ch.write_msgs([(b"%d" % i, [], []) for i in range(3)], timeout=0)
    with pytest.raises(tpipd.LimitExceeded):  # full, and told not to wait
        ch.write_msg(b"3", timeout=0)
    t0 = time.monotonic()
    with pytest.raises(tpipd.Timeout):  # full until the deadline
        ch.write_msg(b"3", timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    assert [ch.read_msg(timeout=T).metadata for _ in range(3)] == [b"0", b"1", b"2"]


def test_readers_in_several_threads_take_every_message_once(daemon, request):
    name = uniq(request)
    n, got, lock = 60, [], threading.Lock()
    with tpipd.Context(daemon) as wctx:
        ch = wctx.channel(name, create=True)

        def reader():
            with tpipd.Context(daemon) as rctx:
                for m in rctx.channel(name).msgs():
                    with lock:
                        got.append(int(m.tensors[0][0]))
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(n):
            ch.write_msg(b"", tensors=[np.array([i])], timeout=T)
        ch.close()
        for t in threads:
            t.join(T)
            assert not t.is_alive()
    assert sorted(got) == list(range(n))


def test_close_then_drain_with_message_items(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    other = ctx.channel(ch.name)
    ch.write_msgs([(b"%d" % i, [b"x"], [np.arange(i)]) for i in range(3)])
    other.close()
    with pytest.raises(tpipd.PipeClosed):
        ch.write_msg(b"late")
    assert ch.state == "closed"
    assert ch.read_msg(timeout=T).metadata == b"0"
    assert [m.metadata for m in ch.msgs()] == [b"1", b"2"]
    assert ch.state == "drained"
    with pytest.raises(tpipd.Drained):
        ch.read_msg(timeout=T)
    with pytest.raises(tpipd.Drained):
        other.read_msg(timeout=0)


def test_close_wakes_a_blocked_message_reader(ctx, daemon, request):
    ch = ctx.channel(uniq(request), create=True)
    out = {}

    def reader():
        t0 = time.monotonic()
        try:
            ch.read_msg()
        except tpipd.Drained:
            out["drained"] = time.monotonic() - t0
    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.3)  # let it wait (not synchronisation: the close wakes it either way)
    with tpipd.Context(daemon) as c2:  # another session closes it
        c2.channel(ch.name).close()
    t.join(T)
    assert "drained" in out and out["drained"] < T


def expected_digest(i):
    a = np.arange(i, dtype=np.float64)
    b = np.full((2, i), i, dtype=np.int16)
    return sum(sum(x) % 1000003 for x in (b"p" * i, a.tobytes(), b.tobytes()))


def test_reader_in_another_process(ctx, request):
    torch = torch_or_skip()
    name = uniq(request)
    ch = ctx.channel(name, create=True)
    p = worker("consume_msgs", name)
    msgs = []
    for i in range(9):
        msgs.append((b"m%d" % i, [b"p" * i], [np.arange(i, dtype=np.float64),
                                               torch.full((2, i), i, dtype=torch.int16)]))
    for k in range(0, 9, 3):
        ch.write_msgs(msgs[k:k + 3], timeout=T)
    ch.close()
    out = result(p)
    assert out["state"] == "drained"
    assert [m["meta"] for m in out["msgs"]] == [f"m{i}" for i in range(9)]
    assert [m["pays"] for m in out["msgs"]] == [[i] for i in range(9)]
    assert all(m["kinds"] == ["numpy", "torch"] for m in out["msgs"])
    assert all(m["dtypes"] == ["float64", "torch.int16"] for m in out["msgs"])
    assert [m["shapes"] for m in out["msgs"]] == [[[i], [2, i]] for i in range(9)]
    assert [m["sum"] for m in out["msgs"]] == [expected_digest(i) for i in range(9)]


def test_writer_in_another_process(ctx, request):
    name = uniq(request)
    ch = ctx.channel(name, create=True)
    assert result(worker("produce_msgs", name, 7)) == {"written": 7}
    got = list(ch.msgs())
    assert [m.metadata for m in got] == [b"m%d" % i for i in range(7)]
    for i, m in enumerate(got):
        assert [bytes(p) for p in m.payloads] == [b"p" * i]
        same(np.arange(i, dtype=np.float64), m.tensors[0])
        same(np.full((2, i), i, dtype=np.int16), m.tensors[1])


def test_byte_and_message_items_mix_as_the_c_api_defines(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    ch.write(b"raw")
    ch.write_msg(b"m", [b"x"])
    ch.write_tensor(np.arange(3, dtype=np.int8))
    assert ch.read_msg(timeout=T) == (b"", [bytearray(b"raw")], [])  # one payload
    for read in (lambda: ch.read(timeout=T), lambda: ch.read_into(bytearray(64), timeout=T),
                 lambda: ch.read_tensor(timeout=T)):
        with pytest.raises(tpipd.NotSupported, match="message"):
            read()  # the message item stays first
    assert ch.read_msg(timeout=T) == (b"m", [bytearray(b"x")], [])
    y = ch.read_tensor(timeout=T)  # a byte item again: the byte reads take it
    same(np.arange(3, dtype=np.int8), y)


def test_errors_raise_the_documented_exceptions(daemon, request):
    torch = torch_or_skip()
    ctx = tpipd.Context(daemon)
    ch = ctx.channel(uniq(request), create=True)
    m = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    t = torch.arange(12).reshape(3, 4).t()
    for x in (m, t):
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            ch.write_msg(b"", tensors=[x])
        ch.write_msg(b"", tensors=[x], contiguous=True)
        same(x.contiguous() if x is t else np.ascontiguousarray(x),
             ch.read_msg(timeout=T).tensors[0])
    with pytest.raises(TypeError):
        ch.write_msg(b"", tensors=[[1, 2, 3]])
    with pytest.raises(tpipd.LimitExceeded):  # the daemon's metadata-max
        ch.write_msg(b"x" * (4 << 20))
    with pytest.raises(tpipd.LimitExceeded):  # segments-max payloads and tensors
        ch.write_msg(b"", [b"a"] * 1025)
    ch.write_msg(b"", [b"a"] * 1024)
    assert len(ch.read_msg(timeout=T).payloads) == 1024
    # a destination that does not match: InvalidArgument, and the item is dropped
    ch.write_msg(b"", tensors=[np.zeros((2, 3), np.float32)])
    with pytest.raises(tpipd.InvalidArgument, match="destination"):
        ch.read_msg([np.zeros((3, 2), np.float32)], timeout=T)
    ch.write_msg(b"", tensors=[np.zeros(2)])
    with pytest.raises(tpipd.InvalidArgument, match="destinations given"):
        ch.read_msg([None, None], timeout=T)
    gc.collect()
    with pytest.raises(tpipd.Timeout):
        ch.read_msg(timeout=0)
    t0 = time.monotonic()
    with pytest.raises(tpipd.Timeout):
        ch.read_msg(timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    other = ctx.channel(ch.name)
    ch.release()
    assert ch.state == "released"
    with pytest.raises(tpipd.Closed):
        ch.write_msg(b"after release")
    with pytest.raises(tpipd.Closed):
        ch.read_msg(timeout=0)
    other.write_msg(b"kept")
    ctx.close()
    with pytest.raises(tpipd.Closed):
        other.read_msg(timeout=0)
    with pytest.raises(tpipd.Closed):
        other.write_msg(b"after close")


def test_futures_and_asyncio_forms(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    fut = ch.read_msg_async(timeout=T)
    ch.write_msg_async(b"f", tensors=[np.ones(3)]).result(T)
    assert fut.result(T).metadata == b"f"

    async def go():
        r = asyncio.ensure_future(ch.aread_msg(timeout=T))
        await ch.awrite_msg(b"a", [b"p"])
        return await r
    m = asyncio.run(go())
    assert m == (b"a", [bytearray(b"p")], [])


def test_no_leak_over_2000_round_trips(ctx, request):
    ch = ctx.channel(uniq(request), create=True)
    x = np.arange(64, dtype=np.float32)

    def rounds(n):
        for i in range(n):  # fresh objects each time: a reference kept would keep them
            ch.write_msg(b"m" * 1024 + b"%d" % i, [bytes(1024)], [x + i])
            m = ch.read_msg(timeout=T)
            assert m.tensors[0][5] == 5.0 + i and len(m.payloads[0]) == 1024
    rounds(200)
    gc.collect()
    tracemalloc.start()
    objs = len(gc.get_objects())
    before = tracemalloc.get_traced_memory()[0]
    rounds(2000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes kept over 2000 round trips"
    assert len(gc.get_objects()) - objs < 200


@pytest.mark.parametrize("flag", ["", "--torch"])
def test_example_sample_pipeline(daemon, flag):
    if flag:
        torch_or_skip()
    ex = os.path.join(os.environ.get("TPY_EXAMPLES", ""), "chan_msgs.py")
    p = subprocess.run([sys.executable, ex, "120", "3"] + ([flag] if flag else []),
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0 and ": OK" in p.stdout, p.stdout + p.stderr
