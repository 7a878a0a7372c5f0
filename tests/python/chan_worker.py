# SPDX-License-Identifier: BSD-3-Clause
"""A process of the channel tests (test_chan.py starts it with /usr/bin/python3): runs the
scenario named on the command line against $TPIPD_SOCKET and prints one JSON line. Not a test
by itself.

    produce NAME N       write N typed items (float32 arange(i % 50) + i), in batches, then close
    consume NAME         iterate NAME's typed items until drained; print count and checksum
    block NAME READY     say "ready" on channel READY, then block in NAME.read(): print what
                         ended it (drained, item, interrupted)
    open_as UID NAME     drop to UID (and its gid), open root's channel NAME: print the error
    consume_msgs NAME    iterate NAME's message items until drained: print count, each
                         message's metadata, payload lengths, tensor kinds, dtypes, shapes
                         and a checksum of its bytes
    produce_msgs NAME N  write N messages (metadata b"m<i>", payload b"p" * i, a float64
                         arange(i) and an int16 (2, i) tensor), in batches of 3, then close
"""
import json
import os
import sys

import numpy as np

import tpipd


def produce(name, n):
    ch = tpipd.Channel(name)
    batch = []
    for i in range(n):
        batch.append(np.arange(i % 50, dtype=np.float32) + i)
        if len(batch) == 7 or i == n - 1:
            ch.write_tensors(batch, timeout=30)
            batch = []
    ch.close()
    return {"written": n}


def consume(name):
    ch = tpipd.Channel(name)
    count, total = 0, 0.0
    for a in ch.tensors():
        count += 1
        total += float(a.sum()) + a.size
    return {"count": count, "sum": total, "state": ch.state}


def block(name, ready):
    ch = tpipd.Channel(name)
    tpipd.Channel(ready).write(b"ready")
    try:
        item = ch.read()
        return {"ended": "item", "item": item.decode()}
    except tpipd.Drained:
        return {"ended": "drained", "state": ch.state}
    except KeyboardInterrupt:
        # The handle still works after the interrupt: the daemon kept nothing for it.
        ch.write(b"after")
        return {"ended": "interrupted", "after": ch.read(timeout=5).decode()}


def open_as(uid, name):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    try:
        ch = tpipd.Channel(name, owner_uid=0)
        ch.write(b"from %d" % uid)
        return {"error": None}
    except tpipd.Error as e:
        return {"error": type(e).__name__, "errno": e.errno, "msg": str(e)}


def _digest(x):
    if isinstance(x, (bytes, bytearray)):
        b = bytes(x)
    else:
        b = x.tobytes() if isinstance(x, np.ndarray) else x.numpy().tobytes()
    return sum(b) % 1000003


def consume_msgs(name):
    ch = tpipd.Channel(name)
    got = []
    for m in ch.msgs():
        got.append({"meta": m.metadata.decode(), "pays": [len(p) for p in m.payloads],
                    "kinds": [type(t).__module__.split(".")[0] for t in m.tensors],
                    "dtypes": [str(t.dtype) for t in m.tensors],
                    "shapes": [list(t.shape) for t in m.tensors],
                    "sum": sum(_digest(x) for x in list(m.payloads) + list(m.tensors))})
    return {"msgs": got, "state": ch.state}


def produce_msgs(name, n):
    ch = tpipd.Channel(name)
    batch = []
    for i in range(n):
        batch.append((b"m%d" % i, [b"p" * i],
                      [np.arange(i, dtype=np.float64), np.full((2, i), i, dtype=np.int16)]))
        if len(batch) == 3 or i == n - 1:
            ch.write_msgs(batch, timeout=30)
            batch = []
    ch.close()
    return {"written": n}


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "produce":
        out = produce(args[0], int(args[1]))
    elif what == "consume":
        out = consume(args[0])
    elif what == "block":
        out = block(args[0], args[1])
    elif what == "consume_msgs":
        out = consume_msgs(args[0])
    elif what == "produce_msgs":
        out = produce_msgs(args[0], int(args[1]))
    elif what == "open_as":
        out = open_as(int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown scenario {what}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
