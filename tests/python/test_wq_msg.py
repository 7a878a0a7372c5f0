# SPDX-License-Identifier: BSD-3-Clause
"""tpipd.WorkQueue questions and answers as messages (submit_msg(), take_msg(),
take_descriptor() + read_msg(), reply_msg(), answer_msg(), msgs()) against a real daemon:
numpy arrays of every dtype and shape and torch CPU tensors of every dtype come back to the
worker and, answered, to the owner as the same kind, dtype, shape and bytes, each answer
matched to its question by id; metadata-only, empty and several-payload messages, into fresh
memory, the caller's destinations and shared buffers; 16 MiB tensors both ways; a worker that
allocates from the descriptor; a pool of worker processes until the owner's close ends their
iteration; a worker process killed with a message question taken (queued again once, intact;
PeerDied when at-most-once); drain and close; byte and message questions and answers mixing as
the C API defines; each error as its exception (closed queue, a reply to an id not taken,
wrong types, messages over the daemon's limits, just below and above wq-bytes-max and
wq-answer-bytes-max); futures and asyncio; no leak over 2000 round trips; and
examples/python/wq_msgs.py."""
import asyncio
import gc
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
from conftest import start_daemon
from test_chan import all_dtypes, as_bytes, sample
from test_wq import lines, rss_kib, torch_or_skip, under_asan, uniq, worker

T = 30  # seconds: every wait's deadline


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


def same(x, y):
    """``y`` is ``x`` again: the same kind (numpy or torch), dtype, shape and bytes."""
    assert type(y) is type(x), (type(x), type(y))
    assert str(y.dtype) == str(x.dtype) and tuple(y.shape) == tuple(x.shape)
    assert as_bytes(y) == as_bytes(x)


def echo(q, w, metadata=b"", payloads=(), tensors=(), **read):
    """Submit a message question, take it, answer it with what was taken, receive the answer:
    (question, answer) Messages, both matched to the question's id."""
    qid = q.submit_msg(metadata, payloads, tensors)
    tid, m = w.take_msg(timeout=T, **read)
    assert tid == qid
    w.reply_msg(tid, m.metadata, m.payloads, m.tensors)
    aid, a = q.answer_msg(timeout=T, **read)
    assert aid == qid
    return m, a


SHAPES = [(), (0,), (7,), (3, 5), (2, 0, 3), (2, 3, 4)]


@pytest.mark.parametrize("name", [n for k, n in all_dtypes() if k == "numpy"])
def test_numpy_arrays_of_every_dtype_and_shape_round_trip(qpair, name):
    q, w = qpair
    xs = [sample("numpy", name, shape) for shape in SHAPES]
    m, a = echo(q, w, b"np", tensors=xs)
    for got in (m, a):
        assert got.metadata == b"np" and got.payloads == []
        for x, y in zip(xs, got.tensors):
            same(x, y)
            assert y.flags.writeable and y.flags.c_contiguous


@pytest.mark.parametrize("name", [n for k, n in all_dtypes() if k == "torch"])
def test_torch_cpu_tensors_of_every_dtype_round_trip(qpair, name):
    torch = torch_or_skip()
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    q, w = qpair
    xs = [sample("torch", name, shape) for shape in ((3, 5), (), (4, 1, 2))]
    xs.append(torch.empty((0, 2), dtype=getattr(torch, name)))
    m, a = echo(q, w, b"t", tensors=xs)
    for got in (m, a):
        assert len(got.tensors) == len(xs)
        for x, y in zip(xs, got.tensors):
            same(x, y)


def test_metadata_only_empty_and_several_payload_messages(qpair, ctx):
    q, w = qpair
    assert echo(q, w, b"only metadata") == ((b"only metadata", [], []),) * 2
    assert echo(q, w) == ((b"", [], []),) * 2
    rng = np.random.default_rng(5)
    pays = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (0, 1, 20000, 300000)]
    tens = [rng.standard_normal(1 << 18).astype(np.float32), np.arange(3, dtype=np.int64)]
    for read in ({}, {"shared": ctx}):  # fresh memory, then shared buffers (one copy)
        m, a = echo(q, w, b"several", pays, tens, **read)
        for got in (m, a):
            assert got.metadata == b"several" and [bytes(p) for p in got.payloads] == pays
            for x, y in zip(tens, got.tensors):
                same(x, y)
    # into the caller's destinations, filled in place and returned
    qid = q.submit_msg(b"d", pays, tens)
    dst, pdst = np.empty_like(tens[0]), bytearray(300000)
    tid, m = w.take_msg([dst, None], [None, None, None, pdst], timeout=T)
    assert tid == qid and m.tensors[0] is dst and m.payloads[3] is pdst
    assert bytes(pdst) == pays[3] and as_bytes(dst) == as_bytes(tens[0])
    w.reply_msg(tid, b"", [memoryview(pdst)[:5]], [dst[:4]])
    adst = np.zeros(4, np.float32)
    aid, a = q.answer_msg([adst], timeout=T)
    assert aid == qid and a.tensors[0] is adst and a.payloads == [bytearray(pays[3][:5])]
    assert as_bytes(adst) == as_bytes(tens[0][:4])


def test_16_mib_tensors_both_ways(qpair, ctx):
    torch = torch_or_skip()
    q, w = qpair
    big = np.random.default_rng(9).integers(0, 1 << 30, (4 << 20) + 3, dtype=np.int32)
    tbig = torch.arange(4 << 20, dtype=torch.float32)  # 16 MiB
    qid = q.submit_msg(b"big", [bytes(16 << 20)], [big, tbig])
    tid, m = w.take_msg(timeout=T)
    assert tid == qid and len(m.payloads[0]) == 16 << 20 and not any(m.payloads[0][::4096])
    same(big, m.tensors[0])
    same(tbig, m.tensors[1])
    shared = ctx.empty(big.shape, "int32")  # the answer from a shared buffer: by reference
    shared[:] = m.tensors[0][::-1]
    w.reply_msg(tid, b"", [], [shared, m.tensors[1] * 2])
    aid, a = q.answer_msg(timeout=T, shared=ctx)
    assert aid == qid
    same(big[::-1].copy(), a.tensors[0])
    same(tbig * 2, a.tensors[1])


def test_answers_are_matched_to_their_questions_by_id(qpair):
    q, w = qpair
    ids = {q.submit_msg(b"%d" % i, tensors=[np.full(3, i)]): i for i in range(10)}
    taken = [w.take_msg(timeout=T) for _ in range(10)]
    assert sorted(t for t, _ in taken) == sorted(ids)
    for tid, m in reversed(taken):  # answered in the reverse order
        w.reply_msg(tid, b"a" + m.metadata, tensors=[m.tensors[0] * 10])
    for _ in range(10):
        aid, a = q.answer_msg(timeout=T)
        i = ids.pop(aid)
        assert a.metadata == b"a%d" % i and a.tensors[0].tolist() == [10 * i] * 3
    assert not ids
    q.drain(timeout=5)


def test_a_worker_allocates_from_the_descriptor(qpair, ctx):
    torch = torch_or_skip()
    q, w = qpair
    x, t = np.arange(12, dtype=np.int16).reshape(3, 4), torch.ones(2, 5, dtype=torch.float64)
    qid = q.submit_msg(b"meta", [b"abc", b""], [x, t])
    tid, d = w.take_descriptor(timeout=T)
    assert tid == qid == d.question_id and isinstance(d, tpipd.MessageDescriptor)
    assert d.metadata == b"meta" and d.payload_sizes == [3, 0]
    assert d.tensors == [tpipd.TensorInfo("numpy", "int16", (3, 4), "cpu", 24),
                         tpipd.TensorInfo("torch", "float64", (2, 5), "cpu", 80)]
    with pytest.raises(tpipd.InvalidArgument, match="destination"):
        w.read_msg(d, [np.empty((4, 3), np.int16), None])  # the descriptor stays unread
    with pytest.raises(tpipd.InvalidArgument, match="destinations given"):
        w.read_msg(d, [None])
    with pytest.raises(ValueError, match="not of this object"):
        q.read_msg(d)  # another handle's
    dst = [np.empty(i.shape, i.dtype) if i.kind == "numpy" else
           torch.empty(i.shape, dtype=getattr(torch, i.dtype)) for i in d.tensors]
    m = w.read_msg(d, dst, [bytearray(n) for n in d.payload_sizes])
    assert m.tensors[0] is dst[0] and m.tensors[1] is dst[1]
    same(x, dst[0])
    same(t, dst[1])
    assert m.payloads == [bytearray(b"abc"), bytearray()]
    with pytest.raises(tpipd.Closed):
        w.read_msg(d)  # read already
    with pytest.raises(TypeError):
        w.read_msg(b"not a descriptor")
    w.reply_msg(tid, b"ok")
    aid, ad = q.answer_descriptor(timeout=T)
    assert aid == qid and ad.metadata == b"ok" and ad.tensors == [] and "question" in repr(ad)
    assert q.read_msg(ad, shared=ctx) == (b"ok", [], [])
    with pytest.raises(tpipd.Closed):
        w.read_msg(ad)  # read already


# ---- worker processes ---------------------------------------------------------------------

def question(i):
    return (b"q%d" % i, [b"p" * i, bytes([i % 256])],
            [np.arange(i, dtype=np.float64), np.full((2, 3), i, dtype=np.int32)])


def check_answer(i, a, pids):
    assert a.metadata == b"re:q%d" % i
    assert [bytes(p) for p in a.payloads] == [b"p" * i, bytes([i % 256])]
    assert a.tensors[0].tolist() == (np.arange(i) + 1.0).tolist()
    assert a.tensors[1].dtype == np.int32 and (a.tensors[1] == i + 1).all()
    pids.add(int(a.tensors[2]))


def test_a_pool_of_three_worker_processes_answers_30_message_questions(qpair):
    q, _ = qpair
    procs = [worker("iterate_msgs", q.name) for _ in range(3)]
    sent = {q.submit_msg(*question(i)): i for i in range(30)}
    pids = set()
    for _ in range(30):
        aid, a = q.answer_msg(timeout=60)
        check_answer(sent.pop(aid), a, pids)
    q.close()
    outs = [lines(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    outs = [o[0][0] for o in outs]
    assert sum(o["count"] for o in outs) == 30 and {o["ended"] for o in outs} == {"PipeClosed"}
    assert pids <= {o["pid"] for o in outs}


def killed_worker(name, how="read"):
    p = worker("take_msg_and_die", name, how)
    out, err = lines(p)
    assert p.returncode == -signal.SIGKILL, err
    return out[0]


@pytest.mark.parametrize("how", ["read", "desc"])
def test_a_killed_workers_message_question_is_queued_again_intact_once(qpair, how):
    """Killed after reading the question, or holding its descriptor unread."""
    q, w = qpair
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: by reference, not inline
    ids = [q.submit_msg(b"q%d" % i, [b"x" * i], [big + i]) for i in range(4)]
    dead = killed_worker(q.name, how)
    i = ids.index(dead["qid"])
    assert dead["meta"] == "q%d" % i and dead["pays"] == [i]
    assert dead["sums"] == (None if how == "desc" else [float((big + i).sum())])
    taken = {}
    for _ in range(4):  # the dead worker's question comes back once the daemon saw it die
        tid, m = w.take_msg(timeout=20)
        assert tid not in taken
        taken[tid] = m
    assert sorted(taken) == sorted(ids)
    m = taken[dead["qid"]]
    assert m.metadata == b"q%d" % i and m.payloads == [bytearray(b"x" * i)]
    same(big + i, m.tensors[0])
    with pytest.raises(tpipd.Timeout):
        w.take_msg(timeout=0)  # not queued a second time
    for tid in ids:
        w.reply_msg(tid, b"a%d" % tid)
    got = dict(q.answer_msg(timeout=T) for _ in ids)
    assert {k: v.metadata for k, v in got.items()} == {t: b"a%d" % t for t in ids}
    q.drain(timeout=5)


def test_at_most_once_answers_a_killed_workers_message_question_with_peer_died(ctx, request):
    with tpipd.WorkQueue(uniq(request), context=ctx, create=True, at_most_once=True) as q, \
            tpipd.WorkQueue(uniq(request), context=ctx) as w:
        ids = [q.submit_msg(b"x", tensors=[np.ones(4)]), q.submit_msg(b"y")]
        dead = killed_worker(q.name)["qid"]
        with pytest.raises(tpipd.PeerDied) as e:
            q.answer_msg(timeout=20)
        assert e.value.question_id == dead and isinstance(e.value, ConnectionResetError)
        (other,) = set(ids) - {dead}
        tid, m = w.take_msg(timeout=5)
        assert tid == other and m.metadata == (b"x" if ids[0] == other else b"y")
        with pytest.raises(tpipd.Timeout):
            w.take_msg(timeout=0)
        w.reply_msg(tid, b"done")
        assert q.answer_msg(timeout=5) == (other, (b"done", [], []))


def test_a_released_workers_taken_message_question_is_queued_again(qpair, ctx):
    q, w = qpair
    x = np.arange(5) * 7 + 3  # kept alive: no fresh array can reuse its memory
    qid = q.submit_msg(b"kept", [b"p"], [x])
    w2 = ctx.work_queue(q.name)
    tid, d = w2.take_descriptor(timeout=T)  # taken, not read
    w2.release()
    del d  # dropped after the release: freed only
    gc.collect()
    tid2, m = w.take_msg(timeout=T)
    assert tid2 == tid == qid and m.metadata == b"kept" and m.payloads == [bytearray(b"p")]
    same(x, m.tensors[0])
    w.reply_msg(tid2, b"a")
    _, ad = q.answer_descriptor(timeout=T)
    del ad  # an answer dropped unread leaves the queue
    gc.collect()
    with pytest.raises(tpipd.NothingOutstanding):
        q.answer_msg(timeout=5)


# ---- drain, close, mixing -----------------------------------------------------------------

def test_drain_and_close_as_with_bytes(qpair):
    q, w = qpair
    qid = q.submit_msg(b"q", tensors=[np.ones(3)])
    tid, m = w.take_msg(timeout=T)
    with pytest.raises(tpipd.Timeout):
        q.drain(timeout=0.3)  # taken, not answered
    fut = q.drain_async(T)
    w.reply_msg(tid, b"a")
    fut.result(T)
    assert q.answer_msg(timeout=T)[0] == qid
    got = {}

    def taker():
        try:
            got["m"] = w.take_msg()
        except tpipd.Error as e:
            got["e"] = e
    t = threading.Thread(target=taker)
    t.start()
    q.submit_msg(b"last")
    q.close()  # the queued question is still taken; then the iteration ends
    t.join(T)
    assert not t.is_alive() and got["m"][1].metadata == b"last", got
    assert list(w.msgs()) == []
    with pytest.raises(tpipd.PipeClosed):
        q.submit_msg(b"late")
    w.reply_msg(got["m"][0], b"after close")  # a taken question is still answered
    assert q.answer_msg(timeout=T)[1].metadata == b"after close"


def test_bytes_and_messages_mix_as_the_c_api_defines(qpair):
    q, w = qpair
    b = q.submit(b"raw")
    m = q.submit_msg(b"m", [b"x"])
    assert w.take_msg(timeout=T) == (b, (b"", [bytearray(b"raw")], []))  # one payload
    for take in (w.take, w.take_tensor):
        with pytest.raises(tpipd.NotSupported, match="take_msg"):
            take(timeout=T)  # the message stays first
    tid, got = w.take_msg(timeout=T)
    assert tid == m and got == (b"m", [bytearray(b"x")], [])
    w.reply(b, b"byte answer")
    w.reply_msg(m, b"msg answer", tensors=[np.arange(2)])
    assert q.answer_msg(timeout=T) == (b, (b"", [bytearray(b"byte answer")], []))
    for answer in (q.answer, q.answer_tensor):
        with pytest.raises(tpipd.NotSupported, match="answer_msg"):
            answer(timeout=T)
    aid, a = q.answer_msg(timeout=T)
    assert aid == m and a.metadata == b"msg answer" and a.tensors[0].tolist() == [0, 1]


# ---- errors ------------------------------------------------------------------------------

def test_errors_each_as_its_exception(ctx, qpair):
    torch = torch_or_skip()
    q, w = qpair
    with pytest.raises(tpipd.NothingOutstanding):
        q.answer_msg(timeout=5)
    with pytest.raises(tpipd.Timeout, match="no question"):
        w.take_msg(timeout=0)
    with pytest.raises(tpipd.Timeout, match="no question"):
        w.take_descriptor(timeout=0)
    t0 = time.monotonic()
    with pytest.raises(tpipd.Timeout, match="timed out"):
        w.take_msg(timeout=0.3)
    assert time.monotonic() - t0 >= 0.29
    with pytest.raises(tpipd.AccessDenied):
        w.submit_msg(b"workers do not submit")
    for bad in (np.arange(20).reshape(4, 5)[:, ::2], torch.arange(12).reshape(3, 4).t()):
        with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
            q.submit_msg(b"", tensors=[bad])
    with pytest.raises(TypeError):
        q.submit_msg(b"", tensors=[[1, 2, 3]])
    with pytest.raises(TypeError):
        q.submit_msg("not bytes")
    with pytest.raises(ValueError, match="buffer"):
        q.submit_msg(b"", [1])
    with pytest.raises(tpipd.LimitExceeded):  # the daemon's metadata-max (1 MiB)
        q.submit_msg(b"x" * ((1 << 20) + 1))
    with pytest.raises(tpipd.LimitExceeded):  # segments-max payloads and tensors
        q.submit_msg(b"", [b"a"] * 1025)
    qid = q.submit_msg(b"", [b"a"] * 1024)
    with pytest.raises(tpipd.NoListener, match="did not take"):
        w.reply_msg(qid, b"not taken")
    tid, m = w.take_msg(timeout=T)
    assert tid == qid and len(m.payloads) == 1024
    with pytest.raises(tpipd.LimitExceeded):
        w.reply_msg(tid, b"x" * ((1 << 20) + 1))  # refused: the question stays taken
    w.reply_msg(tid, b"ok")
    with pytest.raises(tpipd.NoListener):
        w.reply_msg(tid, b"twice")
    assert q.answer_msg(timeout=T) == (qid, (b"ok", [], []))
    # a destination that does not match: InvalidArgument with the question's id
    qid = q.submit_msg(b"", tensors=[np.zeros((2, 3), np.float32)])
    with pytest.raises(tpipd.InvalidArgument, match="destination") as e:
        w.take_msg([np.zeros((3, 2), np.float32)], timeout=T)
    assert e.value.question_id == qid
    w.reply_msg(qid, b"", tensors=[np.ones(2)])  # still this handle's: answered
    with pytest.raises(tpipd.InvalidArgument, match="destinations given") as e:
        q.answer_msg([None, None], timeout=T)
    assert e.value.question_id == qid
    gc.collect()
    with pytest.raises(tpipd.NothingOutstanding):
        q.answer_msg(timeout=5)  # the mismatched answer was dropped
    q.close()
    with pytest.raises(tpipd.PipeClosed):
        q.submit_msg(b"closed")
    w.release()
    with pytest.raises(tpipd.Closed):
        w.take_msg(timeout=0)
    with pytest.raises(tpipd.Closed):
        w.reply_msg(1, b"released")
    ctx.close()
    with pytest.raises(tpipd.Closed):
        q.submit_msg(b"context closed")


@pytest.fixture(scope="module")
def small_daemon():
    """A daemon whose queues hold at most 1 MiB of questions and of answers."""
    gen = start_daemon("--wq-bytes-max", "1M", "--wq-answer-bytes-max", "1M")
    yield next(gen)
    next(gen, None)


def test_messages_just_below_and_above_the_queue_byte_limits(small_daemon):
    with tpipd.Context(small_daemon) as c:
        q = c.work_queue("limits", create=True)
        w = c.work_queue("limits")
        # a message's bytes and its packed descriptor count: find the largest that fits
        with pytest.raises(tpipd.LimitExceeded):
            q.submit_msg(b"", tensors=[np.zeros(1 << 20, np.uint8)])
        with pytest.raises(tpipd.Timeout):
            w.take_msg(timeout=0)  # nothing was queued
        n = (1 << 20) - 4096
        qid = q.submit_msg(b"", tensors=[np.zeros(n, np.uint8)])  # just below
        with pytest.raises(tpipd.LimitExceeded):
            q.submit_msg(b"", [b"y" * 8192])  # the queue is full: refused at once
        tid, m = w.take_msg(timeout=T)
        assert tid == qid and m.tensors[0].size == n
        with pytest.raises(tpipd.LimitExceeded):  # an answer above wq-answer-bytes-max
            w.reply_msg(tid, b"", tensors=[np.zeros(1 << 20, np.uint8)])
        w.reply_msg(tid, b"", tensors=[np.ones(n, np.uint8)])  # just below: taken still
        aid, a = q.answer_msg(timeout=T)
        assert aid == qid and int(a.tensors[0].sum()) == n
        # an answer held for the owner counts until read or dropped: dropping it unread (the
        # descriptor garbage, or a destination that does not match) makes room at once
        for drop in ("garbage", "mismatch"):
            qid = q.submit_msg(b"")
            tid, _ = w.take_msg(timeout=T)
            w.reply_msg(tid, b"", tensors=[np.ones(n, np.uint8)])
            if drop == "garbage":
                aid, d = q.answer_descriptor(timeout=T)
                del d
            else:
                with pytest.raises(tpipd.InvalidArgument):
                    q.answer_msg([np.empty(1, np.uint8)], timeout=T)
            gc.collect()
            qid = q.submit_msg(b"")
            tid, _ = w.take_msg(timeout=T)
            w.reply_msg(tid, b"", tensors=[np.ones(n, np.uint8)])  # room again
            assert q.answer_msg(timeout=T)[0] == qid


# ---- futures and asyncio, memory, the example ---------------------------------------------

def test_futures_and_asyncio_forms(qpair):
    q, w = qpair
    fut = w.take_msg_async(timeout=T)
    qid = q.submit_msg(b"f", tensors=[np.arange(4)])
    tid, m = fut.result(T)
    assert tid == qid and m.tensors[0].tolist() == [0, 1, 2, 3]
    w.reply_msg(tid, b"r", tensors=[m.tensors[0] * 10])
    aid, a = q.answer_msg_async(timeout=T).result(T)
    assert aid == qid and a.tensors[0].tolist() == [0, 10, 20, 30]

    async def main():
        taker = asyncio.ensure_future(w.atake_msg(timeout=T))
        i = q.submit_msg(b"async", [b"p"])
        j, got = await taker
        w.reply_msg(j, got.metadata.upper(), got.payloads)
        a = await q.aanswer_msg(timeout=T)
        await q.adrain(T)
        return i, a
    i, a = asyncio.run(main())
    assert a == (i, (b"ASYNC", [bytearray(b"p")], []))


def rounds(q, w, x, n):
    for i in range(n):  # fresh objects each time: a reference kept would keep them
        qid = q.submit_msg(b"m" * 512, [bytes(1024)], [x])
        tid, m = w.take_msg(timeout=T)
        w.reply_msg(tid, m.metadata, m.payloads, [m.tensors[0] + i])
        aid, a = q.answer_msg(timeout=T)
        assert aid == qid and a.tensors[0][5] == 5.0 + i
        if i % 10 == 0:  # the two-step forms too
            qid = q.submit_msg(b"d", tensors=[x])
            tid, d = w.take_descriptor(timeout=T)
            w.read_msg(d, [np.empty_like(x)])
            w.reply_msg(tid, b"")
            q.read_msg(q.answer_descriptor(timeout=T)[1])


def test_no_leak_over_2000_round_trips(qpair):
    q, w = qpair
    x = np.arange(1024, dtype=np.float32)  # 4 KiB: a lost buffer shows in RSS
    rounds(q, w, x, 200)
    gc.collect()
    ref = sys.getrefcount(x)
    tracemalloc.start()
    objs = len(gc.get_objects())
    before_py = tracemalloc.get_traced_memory()[0]
    before_rss = rss_kib()
    rounds(q, w, x, 2000)
    gc.collect()
    grown_py = tracemalloc.get_traced_memory()[0] - before_py
    tracemalloc.stop()
    grown_rss = rss_kib() - before_rss
    assert sys.getrefcount(x) == ref
    assert grown_py < 128 * 1024, f"{grown_py} bytes kept over 2000 round trips"
    assert len(gc.get_objects()) - objs < 200
    if not under_asan():
        assert grown_rss < 8 * 1024, f"RSS grew by {grown_rss} KiB over 2000 round trips"


@pytest.mark.parametrize("flag", ["", "--torch"])
def test_example_message_pool(daemon, flag):
    if flag:
        torch_or_skip()
    ex = os.path.join(os.environ.get("TPY_EXAMPLES", ""), "wq_msgs.py")
    p = subprocess.run([sys.executable, ex, "--workers", "3", "--questions", "40"] +
                       ([flag] if flag else []), capture_output=True, text=True, timeout=150)
    assert p.returncode == 0 and "40 answers from 3 workers, 0 wrong" in p.stdout, \
        p.stdout + p.stderr
