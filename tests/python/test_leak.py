# SPDX-License-Identifier: BSD-3-Clause
"""Reference counts and memory: 10 000 messages (metadata, a payload, numpy and torch tensors,
futures) leave Python's allocations (tracemalloc) and the process's RSS within a small bound,
and the objects passed to write() get their reference counts back."""
import gc
import sys
import tracemalloc

import numpy as np

import tpipd
from tpipd import _tensor

N = 10000


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def under_asan():
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def exchange(w, r, x, t, n):
    for i in range(n):
        tensors = [x] if t is None else [x, t]
        w.write(b"meta", [b"payload"], tensors)
        m = r.read()
        assert m.tensors[0].shape == x.shape


def test_no_leak_over_10k_messages(pair):
    w, r, _, _ = pair
    torch = _tensor.torch_module()
    x = np.arange(64, dtype=np.float32)
    t = torch.arange(16, dtype=torch.float32) if torch is not None else None
    exchange(w, r, x, t, 500)  # warm up caches, the ring, lazy imports
    gc.collect()
    refs = (sys.getrefcount(x), sys.getrefcount(t))
    tracemalloc.start()
    before_py = tracemalloc.get_traced_memory()[0]
    before_rss = rss_kib()
    exchange(w, r, x, t, N)
    gc.collect()
    grown_py = tracemalloc.get_traced_memory()[0] - before_py
    tracemalloc.stop()
    grown_rss = rss_kib() - before_rss
    assert (sys.getrefcount(x), sys.getrefcount(t)) == refs
    assert grown_py < 64 * 1024, f"Python allocations grew by {grown_py} bytes over {N} messages"
    if not under_asan():  # ASan's quarantine holds freed memory: RSS says nothing there
        assert grown_rss < 8 * 1024, f"RSS grew by {grown_rss} KiB over {N} messages"


def test_no_leak_with_futures_and_errors(pair):
    w, r, _, _ = pair
    x = np.ones(16)
    for _ in range(200):
        w.write_async(b"", (), [x]).result(10)
        r.read_async().result(10)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(2000):
        w.write_async(b"", (), [x]).result(10)
        r.read_async().result(10)
        try:
            r.read(timeout=0)
        except tpipd.Timeout:
            pass
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 * 1024, f"grew by {grown} bytes"


def test_no_leak_over_10k_collectives(daemon):
    """all_reduce hands torch tensors to the extension as DLPack capsules, once per call even
    in place: 10k calls (blocking, async, numpy) free every capsule and keep reference counts."""
    torch = _tensor.torch_module()
    with tpipd.Context(daemon) as ctx:
        g = tpipd.init_group(f"leak.{id(ctx)}", 1, 0, context=ctx)
        x = np.arange(256, dtype=np.float32)
        t = torch.arange(256, dtype=torch.float32) if torch is not None else x.copy()

        def run(n):
            for i in range(n):
                g.all_reduce(t)
                g.all_reduce(x, op=tpipd.ReduceOp.MAX)
                if i % 10 == 0:
                    g.all_reduce(t, async_op=True).wait()
        run(500)
        gc.collect()
        refs = (sys.getrefcount(x), sys.getrefcount(t))
        tracemalloc.start()
        before_py = tracemalloc.get_traced_memory()[0]
        before_rss = rss_kib()
        run(N)
        gc.collect()
        grown_py = tracemalloc.get_traced_memory()[0] - before_py
        tracemalloc.stop()
        grown_rss = rss_kib() - before_rss
        assert (sys.getrefcount(x), sys.getrefcount(t)) == refs
        assert grown_py < 64 * 1024, f"Python allocations grew by {grown_py} bytes"
        if not under_asan():
            assert grown_rss < 8 * 1024, f"RSS grew by {grown_rss} KiB over {N} calls"
        g.leave()
