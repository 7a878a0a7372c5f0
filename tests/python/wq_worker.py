# SPDX-License-Identifier: BSD-3-Clause
"""A process of the work queue tests (test_wq.py starts it with /usr/bin/python3): runs the
scenario named on the command line against $TPIPD_SOCKET and prints JSON lines. Not a test by
itself.

    take_and_die NAME    take one question, print its id, then die by SIGKILL (nothing closed)
    iterate NAME         answer every question (typed: x + 1) until the iteration ends; print
                         the count and how it ended
    own NAME             create NAME (the owner), print "ready", wait on stdin (killed there)
    block NAME           print "ready", block in take(): print what ended it (a SIGINT:
                         interrupted, and whether the handle still takes a question after it)
    open_as UID NAME     drop to UID (and its gid), open root's queue NAME: print the error
    take_msg_and_die NAME [desc]
                         take one message question (its descriptor, then its bytes; with desc
                         the descriptor only), print its id and what it held, then die by
                         SIGKILL (nothing replied or closed)
    iterate_msgs NAME    answer every message question until the iteration ends: metadata
                         b"re:" + the question's, its payloads reversed, each tensor + 1 (same
                         kind and dtype), a 0-d int64 tensor of this pid; allocate from the
                         descriptor (take_descriptor, read_msg) every other question; print
                         the count and how it ended
"""
import json
import os
import signal
import sys

import tpipd


def say(obj):
    print(json.dumps(obj), flush=True)


def take_and_die(name):
    wq = tpipd.WorkQueue(name)
    qid, _ = wq.take(timeout=30)
    say({"qid": qid})
    os.kill(os.getpid(), signal.SIGKILL)


def iterate(name):
    n = 0
    with tpipd.WorkQueue(name) as wq:
        for qid, x in wq.tensors():
            wq.reply_tensor(qid, x + 1)
            n += 1
        try:
            wq.take(timeout=0)
            ended = "took after the end"
        except tpipd.PipeClosed as e:
            ended = type(e).__name__
    say({"count": n, "ended": ended})


def own(name):
    wq = tpipd.WorkQueue(name, create=True, mode="anyone")  # noqa: F841 (held until killed)
    say({"ready": True})
    sys.stdin.readline()


def block(name):
    wq = tpipd.WorkQueue(name)
    try:
        say({"ready": True})
        wq.take()
        say({"ended": "item"})
    except KeyboardInterrupt:
        say({"ended": "interrupted"})
        qid, item = wq.take(timeout=30)  # the parent submits after it saw the line above
        wq.reply(qid, item + b" answered")
        say({"after": item.decode()})


def open_as(uid, name):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    try:
        tpipd.WorkQueue(name, owner_uid=0)
        return say({"error": None})
    except tpipd.Error as e:
        return say({"error": type(e).__name__, "errno": e.errno, "msg": str(e)})


def take_msg_and_die(name, how="read"):
    wq = tpipd.WorkQueue(name)
    if how == "desc":
        qid, d = wq.take_descriptor(timeout=30)
        say({"qid": qid, "meta": d.metadata.decode(), "pays": d.payload_sizes,
             "sums": None})
    else:
        qid, m = wq.take_msg(timeout=30)
        say({"qid": qid, "meta": m.metadata.decode(), "pays": [len(p) for p in m.payloads],
             "sums": [float(t.sum()) for t in m.tensors]})
    os.kill(os.getpid(), signal.SIGKILL)


def answer_msg(wq, qid, m):
    import numpy as np
    pays = [bytes(p)[::-1] for p in m.payloads]
    wq.reply_msg(qid, b"re:" + m.metadata, pays,
                 [t + 1 for t in m.tensors] + [np.array(os.getpid(), dtype=np.int64)])


def iterate_msgs(name):
    import numpy as np
    n = 0
    with tpipd.WorkQueue(name) as wq:
        while True:
            try:
                if n % 2:  # allocate from what the descriptor says
                    qid, d = wq.take_descriptor()
                    dst = [np.empty(t.shape, t.dtype) if t.kind == "numpy" else None
                           for t in d.tensors]
                    m = wq.read_msg(d, dst, [bytearray(k) for k in d.payload_sizes])
                    assert all(x is y for x, y in zip(dst, m.tensors) if x is not None)
                else:
                    qid, m = wq.take_msg()
            except tpipd.PipeClosed:
                break
            answer_msg(wq, qid, m)
            n += 1
        try:
            wq.take_msg(timeout=0)
            ended = "took after the end"
        except tpipd.PipeClosed as e:
            ended = type(e).__name__
    say({"count": n, "ended": ended, "pid": os.getpid()})


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "take_and_die":
        take_and_die(args[0])
    elif what == "iterate":
        iterate(args[0])
    elif what == "own":
        own(args[0])
    elif what == "block":
        block(args[0])
    elif what == "take_msg_and_die":
        take_msg_and_die(*args[:2])
    elif what == "iterate_msgs":
        iterate_msgs(args[0])
    elif what == "open_as":
        open_as(int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown scenario {what}")


if __name__ == "__main__":
    main()
