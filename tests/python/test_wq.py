# SPDX-License-Identifier: BSD-3-Clause
"""tpipd.WorkQueue against a real daemon: a pool of 3 worker processes answering 50 questions
(numpy and torch items, examples/python/wq_pool.py), a worker killed with a question taken
(queued again exactly once; answered with PeerDied when at-most-once), the owner's close ending
the iteration of workers in other processes and waking a blocked take, the owner's death ending
workers, each error as its exception (and InDoubt for a request the daemon did not answer),
the GIL released while a take waits, futures and asyncio, no leak over many submits
(tracemalloc, RSS, reference counts), and DLPack: every dtype in and out without a copy on our
side, other DLPack producers accepted, non-contiguous ones refused unless contiguous=True."""
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np
import pytest

import tpipd
from tpipd import _tensor, _tpipd

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "wq_worker.py")


def uniq(request, tag=""):
    name = f"q.{request.node.name[:40]}.{tag}.{os.getpid()}"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def worker(*args, **kw):
    return subprocess.Popen([sys.executable, WORKER] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def lines(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return [json.loads(x) for x in out.strip().splitlines() if x], err


def torch_or_skip():
    torch = _tensor.torch_module()
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


@pytest.fixture
def ctx(daemon):
    c = tpipd.Context(daemon)
    yield c
    c.close()


@pytest.fixture
def qpair(ctx, request):
    """(owner, worker) handles on a fresh queue of this process."""
    q = tpipd.WorkQueue(uniq(request), context=ctx, create=True, exclusive=True)
    w = ctx.work_queue(q.name)
    yield q, w
    w.release()
    q.release()


# ---- workers in other processes ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_pool_of_three_workers_answers_50_questions(daemon, kind):
    if kind == "torch":
        torch_or_skip()
    ex = os.path.join(os.environ.get("TPY_EXAMPLES", ""), "wq_pool.py")
    args = [sys.executable, ex, "--workers", "3", "--questions", "50"]
    p = subprocess.run(args + (["--torch"] if kind == "torch" else []), capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0 and "50 answers from 3 workers, 0 wrong" in p.stdout, \
        p.stdout + p.stderr
    counts = [int(x.split()[-1]) for x in p.stdout.splitlines() if x.startswith("worker ")]
    assert len(counts) == 3 and sum(counts) == 50


def killed_worker(name):
    p = worker("take_and_die", name)
    out, err = lines(p)
    assert p.returncode == -signal.SIGKILL, err
    return out[0]["qid"]


def test_a_killed_workers_question_is_queued_again_exactly_once(qpair):
    q, w = qpair
    ids = [q.submit(b"question %d" % i) for i in range(5)]
    dead = killed_worker(q.name)
    assert dead in ids
    taken = {}
    for _ in range(5):  # the dead worker's question comes back once the daemon saw it die
        qid, item = w.take(timeout=20)
        assert qid not in taken
        taken[qid] = item
    assert sorted(taken) == sorted(ids) and taken[dead] == b"question %d" % ids.index(dead)
    with pytest.raises(tpipd.Timeout):
        w.take(timeout=0)  # not queued a second time
    for qid in ids:
        w.reply(qid, b"answer %d" % qid)
    got = dict(q.answer(timeout=10) for _ in ids)
    assert got == {qid: b"answer %d" % qid for qid in ids}
    q.drain(timeout=5)


def test_at_most_once_answers_a_killed_workers_question_with_peer_died(ctx, request):
    with tpipd.WorkQueue(uniq(request), context=ctx, create=True, at_most_once=True) as q, \
            tpipd.WorkQueue(uniq(request), context=ctx) as w:
        ids = [q.submit(b"x"), q.submit(b"y")]
        dead = killed_worker(q.name)
        with pytest.raises(tpipd.PeerDied) as e:
            q.answer(timeout=20)
        assert e.value.question_id == dead and isinstance(e.value, ConnectionResetError)
        (other,) = set(ids) - {dead}
        qid, _ = w.take(timeout=5)
        assert qid == other
        with pytest.raises(tpipd.Timeout):
            w.take(timeout=0)
        w.reply(qid, b"done")
        assert q.answer(timeout=5) == (other, b"done")


def test_owner_close_ends_the_iteration_of_workers_in_other_processes(qpair):
    q, _ = qpair
    sent = {q.submit_tensor(np.full(8, i, dtype=np.float32)): i for i in range(20)}
    procs = [worker("iterate", q.name) for _ in range(2)]
    for _ in range(20):
        qid, y = q.answer_tensor(timeout=60)
        assert isinstance(y, np.ndarray) and (y == sent.pop(qid) + 1).all()
    q.close()
    outs = [lines(p)[0][0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(o["count"] for o in outs) == 20 and {o["ended"] for o in outs} == {"PipeClosed"}


def test_close_wakes_a_take_blocked_in_another_thread(qpair):
    q, w = qpair
    got = {}

    def taker():
        try:
            got["item"] = w.take()
        except tpipd.Error as e:
            got["e"] = e
    t = threading.Thread(target=taker)
    t.start()
    q.close()  # blocked or not yet: take ends with PipeClosed either way (nothing queued)
    t.join(10)
    assert not t.is_alive() and isinstance(got.get("e"), tpipd.PipeClosed), got
    assert list(w) == []
    with pytest.raises(tpipd.PipeClosed):
        q.submit(b"late")


def test_drain_waits_for_taken_questions(qpair):
    q, w = qpair
    q.drain(timeout=0)  # nothing submitted
    qid = q.submit(b"q")
    qid_taken, _ = w.take(timeout=5)
    with pytest.raises(tpipd.Timeout):
        q.drain(timeout=0)
    with pytest.raises(tpipd.Timeout):
        q.drain(timeout=0.3)  # sliced: still taken at the deadline
    fut = q.drain_async(10)
    w.reply(qid_taken, b"a")
    fut.result(10)  # answered: drained, though the answer still waits to be received
    assert q.answer(timeout=5) == (qid, b"a")


def test_the_owners_death_ends_the_workers(daemon, request):
    name = uniq(request)
    own = worker("own", name, stdin=subprocess.PIPE)
    assert json.loads(own.stdout.readline()) == {"ready": True}
    with tpipd.Context(daemon) as c, tpipd.WorkQueue(name, context=c) as w:
        assert not w.owner
        done = []
        t = threading.Thread(target=lambda: done.append(list(w)))
        t.start()
        own.kill()
        own.wait(10)
        t.join(20)
        assert done == [[]]
        with pytest.raises(tpipd.PipeClosed):
            w.reply(1, b"x")


def test_ctrl_c_ends_a_blocked_take_and_the_handle_goes_on(qpair):
    q, _ = qpair
    p = worker("block", q.name)
    assert json.loads(p.stdout.readline()) == {"ready": True}
    p.send_signal(signal.SIGINT)  # in take() or just before: KeyboardInterrupt either way
    assert json.loads(p.stdout.readline()) == {"ended": "interrupted"}
    qid = q.submit(b"after")
    out, err = lines(p)
    assert p.returncode == 0 and out == [{"after": "after"}], err
    assert q.answer(timeout=10) == (qid, b"after answered")


# ---- errors ------------------------------------------------------------------------------

def test_errors_each_as_its_exception(ctx, qpair, request):
    q, w = qpair
    with pytest.raises(tpipd.NoListener) as e:
        tpipd.WorkQueue(uniq(request, "none"), context=ctx)
    assert isinstance(e.value, FileNotFoundError) and e.value.errno == 2
    with pytest.raises(tpipd.NameInUse):
        tpipd.WorkQueue(q.name, context=ctx, create=True, exclusive=True)
    with pytest.raises(tpipd.InvalidArgument) as e:
        tpipd.WorkQueue("bad name!", context=ctx, create=True)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError):
        tpipd.WorkQueue(q.name, context=ctx, mode="world")
    with pytest.raises(tpipd.InvalidArgument):
        q.submit(b"")
    with pytest.raises(tpipd.LimitExceeded, match="inline"):
        q.submit(b"x" * (8 << 20))
    with pytest.raises(tpipd.AccessDenied):
        w.submit(b"workers do not submit")
    with pytest.raises(tpipd.NothingOutstanding) as e:
        q.answer(timeout=5)  # nothing submitted: the wait could never end
    assert e.value.errno == 42 and isinstance(e.value, tpipd.Error)
    with pytest.raises(tpipd.Timeout, match="no question"):
        w.take(timeout=0)
    t0 = time.monotonic()
    with pytest.raises(tpipd.Timeout, match="timed out"):
        w.take(timeout=0.3)
    assert time.monotonic() - t0 >= 0.29
    qid = q.submit(b"q")
    with pytest.raises(tpipd.NoListener, match="did not take"):
        w.reply(qid, b"not taken")
    assert w.take(timeout=5) == (qid, b"q")
    with pytest.raises(tpipd.Timeout, match="no answer"):
        q.answer(timeout=0)
    w.reply(qid, b"a")
    with pytest.raises(tpipd.NoListener):
        w.reply(qid, b"twice")
    assert q.answer(timeout=5) == (qid, b"a")
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        q.submit(np.arange(12.0).reshape(3, 4).T)
    q.release()
    with pytest.raises(tpipd.Closed):
        q.submit(b"after release")
    with pytest.raises(tpipd.PipeClosed):
        w.take(timeout=5)  # the owner's handle was the queue


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
def test_another_uid_is_refused_unless_the_mode_lets_it(daemon, ctx, request):
    os.chmod(os.path.dirname(daemon), 0o755)
    os.chmod(daemon, 0o777)
    with tpipd.WorkQueue(uniq(request, "own"), context=ctx, create=True):
        out, _ = lines(worker("open_as", 4242, uniq(request, "own")))
        assert out[0]["error"] == "NoListener", out  # refused by the mode: no such queue
    with tpipd.WorkQueue(uniq(request, "any"), context=ctx, create=True, mode="anyone"):
        out, _ = lines(worker("open_as", 4242, uniq(request, "any")))
        assert out[0]["error"] is None, out


def stopped_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_requests_the_daemon_leaves_unanswered_raise_in_doubt(tmp_path, request):
    binary = os.environ.get("TPIPD_BIN")
    if not binary:
        pytest.skip("TPIPD_BIN not set (run through meson test)")
    sock = str(tmp_path / "s")
    d = subprocess.Popen([binary, "--socket", sock, "--peer-listen", "off"],
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                c = tpipd.Context(sock, reply_timeout=0.3)
                break
            except tpipd.Error:
                assert time.monotonic() < deadline and d.poll() is None
                time.sleep(0.02)
        q = tpipd.WorkQueue("doubt", context=c, create=True)
        ch = c.channel("doubt", create=True, capacity=1)
        ch.write(b"full")
        d.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while stopped_state(d.pid) != "T":  # stopped for sure before the requests go out
                assert time.monotonic() < deadline
                time.sleep(0.005)
            with pytest.raises(tpipd.InDoubt, match="may be queued yet") as e:
                q.submit(b"q")
            assert e.value.errno == 115 and not isinstance(e.value, tpipd.Timeout)
            with pytest.raises(tpipd.InDoubt):
                ch.write(b"more", timeout=0.1)
        finally:
            d.send_signal(signal.SIGCONT)
        c.close()
    finally:
        d.terminate()
        d.wait(10)


# ---- threads, futures, asyncio -------------------------------------------------------------

def test_a_blocked_take_leaves_other_threads_running(qpair):
    _, w = qpair
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    with pytest.raises(tpipd.Timeout):
        w.take(timeout=0.5)
    stop.set()
    t.join()
    assert len(ticks) > 50  # the spinning thread held the GIL over 50 times meanwhile


def test_release_and_context_close_end_another_threads_take(daemon, request):
    c = tpipd.Context(daemon)
    q = c.work_queue(uniq(request), create=True)
    for how in ("release", "context"):
        w = c.work_queue(q.name)
        got = {}

        def taker():
            try:
                w.take()
            except tpipd.Error as e:
                got["e"] = e
        t = threading.Thread(target=taker)
        t.start()
        w.release() if how == "release" else c.close()
        t.join(10)
        assert not t.is_alive() and isinstance(got["e"], tpipd.Closed), (how, got)
        assert w.released
    assert q.released  # Context.close() released the owner's handle too


def test_futures_and_asyncio(qpair):
    q, w = qpair
    fut = w.take_async(timeout=10, typed=True)
    qid = q.submit_tensor(np.arange(4, dtype=np.int64))
    got_id, x = fut.result(10)
    assert got_id == qid and x.tolist() == [0, 1, 2, 3]
    w.reply_tensor(qid, x * 10)
    assert q.answer_async(10, typed=True).result(10)[1].tolist() == [0, 10, 20, 30]

    async def main():
        i = q.submit(b"async")
        j, item = await w.atake(10)
        w.reply(j, item.upper())
        a = await q.aanswer(10)
        await q.adrain(10)
        return i, a
    i, a = asyncio.run(main())
    assert a == (i, b"ASYNC")
    q.drain_async(5).result(10)


# ---- reference counts and memory -----------------------------------------------------------

def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def under_asan():
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def cycle(q, w, items, n):
    for _ in range(n):
        for it in items:
            if isinstance(it, bytes) or _tensor.is_torch(it) and it.numel() > 64:
                qid = q.submit(it)
                tid, x = w.take(timeout=10)
                w.reply(tid, x)
                assert q.answer(timeout=10)[0] == qid
            else:
                qid = q.submit_tensor(it)
                tid, x = w.take_tensor(timeout=10)
                w.reply_tensor(tid, x)
                aid, y = q.answer_tensor(timeout=10)
                assert aid == qid and y.shape == it.shape


def test_no_leak_over_many_submits(qpair):
    q, w = qpair
    torch = _tensor.torch_module()
    x = np.arange(1024, dtype=np.float32)  # 4 KiB items: a lost Block shows in RSS
    items = [b"p" * 4096, x]
    if torch is not None:  # typed, and raw (read by the extension through __dlpack__)
        items += [torch.arange(64, dtype=torch.int32), torch.arange(1024, dtype=torch.int32)]
    cycle(q, w, items, 300)  # warm up caches, lazy imports, the ring
    gc.collect()
    refs = [sys.getrefcount(i) for i in items]
    tracemalloc.start()
    before_py = tracemalloc.get_traced_memory()[0]
    before_rss = rss_kib()
    n = 3000
    cycle(q, w, items, n)
    gc.collect()
    grown_py = tracemalloc.get_traced_memory()[0] - before_py
    tracemalloc.stop()
    grown_rss = rss_kib() - before_rss
    assert [sys.getrefcount(i) for i in items] == refs
    assert grown_py < 64 * 1024, f"Python allocations grew by {grown_py} bytes"
    if not under_asan():
        assert grown_rss < 8 * 1024, f"RSS grew by {grown_rss} KiB over {n * len(items)} items"


# ---- DLPack ------------------------------------------------------------------------------

def all_dtypes():
    out = []
    for name in (n for n, _, _ in _tensor.DTYPES.values()):
        if name != "bfloat16":
            out.append(("numpy", name))
        out.append(("torch", name))
    return out


def sample(kind, name, shape=(3, 5)):
    raw = np.random.default_rng(11).integers(0, 256, size=int(np.prod(shape)) * 16,
                                             dtype=np.uint8)
    if name == "bool":
        raw = raw % 2
    if kind == "numpy":
        return np.frombuffer(raw.tobytes(), dtype=name, count=int(np.prod(shape))).reshape(shape)
    torch = torch_or_skip()
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=getattr(torch, name)).element_size()
    return torch.from_numpy(raw[:nbytes].copy()).view(getattr(torch, name)).reshape(shape)


def raw(x):
    return _tensor.raw_bytes(_tensor.wire_buffer(x))


@pytest.mark.parametrize("kind,name", all_dtypes())
def test_dlpack_every_dtype_round_trips_through_a_queue(qpair, kind, name):
    q, w = qpair
    x = sample(kind, name)
    qid = q.submit_tensor(x)
    tid, y = w.take_tensor(timeout=10)
    assert tid == qid and type(y) is type(x) and y.dtype == x.dtype and y.shape == x.shape
    assert raw(y) == raw(x) and (kind == "torch" or y.flags.writeable)  # the caller's own
    w.reply_tensor(tid, y)  # a received tensor travels on as it is
    aid, z = q.answer_tensor(timeout=10)
    assert aid == qid and z.dtype == x.dtype and raw(z) == raw(x)
    q.submit(x)  # raw bytes of the same tensor (torch: read by the extension via __dlpack__)
    assert w.take(timeout=10)[1] == raw(x)


@pytest.mark.parametrize("kind,name", all_dtypes())
def test_dlpack_results_live_over_our_memory_without_a_copy(kind, name):
    if kind == "torch":
        torch_or_skip()
    x = sample(kind, name, (2, 3))
    hdr_len = 8 + 8 * 2
    buf = bytearray(hdr_len) + bytearray(raw(x))
    code = _tensor._CODE_OF[name]
    y = _tensor.from_memory(buf, hdr_len, 1 if kind == "torch" else 0, code, (2, 3))
    assert y.dtype == x.dtype and raw(y) == raw(x)
    buf[hdr_len] ^= 1  # the result sees a change of the memory: it is that memory
    assert raw(y)[0] == raw(x)[0] ^ 1
    with pytest.raises(ValueError, match="overrun"):
        _tpipd.dlpack_view(buf, hdr_len + 1, code, (2, 3))
    del buf  # the result keeps the memory alive
    gc.collect()
    assert raw(y)[1:] == raw(x)[1:]


def test_dlpack_shared_buffer_tensors_are_the_shared_memory(ctx):
    torch = torch_or_skip()
    for name in ("bfloat16", "bool", "float32", "complex128"):
        t = ctx.zeros((4, 5), name, like="torch")
        assert t.dtype == getattr(torch, name) and t.shape == (4, 5) and bool((t == 0).all())
        t2 = t.view(-1)
        t2[3] = 1
        assert t[0, 3] == 1


class Producer:
    """A DLPack producer that is neither numpy nor torch and has no buffer protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_other_producers_are_accepted_and_non_contiguous_refused(qpair, pair):
    q, w = qpair
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    qid = q.submit_tensor(Producer(a))
    assert w.take_tensor(timeout=10)[1].tolist() == a.tolist()
    q.submit(Producer(a))
    assert w.take(timeout=10)[1] == a.tobytes()
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        q.submit(Producer(a.T))
    q.submit(Producer(a.T), contiguous=True)
    assert w.take(timeout=10)[1] == np.ascontiguousarray(a.T).tobytes()
    pw, pr, _, _ = pair
    pw.write(b"", (), [Producer(a)])
    assert pr.read(timeout=10).tensors[0].tolist() == a.tolist()
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        pw.write(b"", (), [Producer(a.T)])
    torch = _tensor.torch_module()
    if torch is not None:  # torch reaches the extension through DLPack: its check refuses too
        ch = tpipd.Channel(q.name + ".c", create=True)
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            ch._raw.write([torch.arange(12.0).reshape(3, 4).t()], None)
        ch._raw.write([torch.arange(12.0).reshape(3, 4)], None)
        assert ch.read(timeout=5) == np.arange(12, dtype=np.float32).tobytes()
        ch._raw.write([torch.arange(12.0)[5:]], None)  # a view at an offset of its storage
        assert ch.read(timeout=5) == np.arange(5, 12, dtype=np.float32).tobytes()
        ch.release()
    w.reply(qid, b"ok")
