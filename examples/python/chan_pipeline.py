#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Three processes joined by two named channels, shut down by cascading closes (torch-ipc's
channel example, examples/chan_pipeline.c in Python):

    source --"<prefix>.raw"--> scale --"<prefix>.scaled"--> sink

source writes N float32 arrays (typed items) and closes "raw"; scale reads until "raw" is
drained, writes each array times 2, then closes "scaled"; sink sums until "scaled" is drained
and prints the total. Nobody sends an end marker: a close is the end. Needs a running tpipd
($TPIPD_SOCKET or libtpclient's default socket).

    /usr/bin/python3 examples/python/chan_pipeline.py [N]
"""
import multiprocessing as mp
import os
import sys

import numpy as np

import tpipd


def source(prefix, n):
    with tpipd.Channel(prefix + ".raw") as out:
        for i in range(n):
            out.write_tensor(np.full(256, i, dtype=np.float32))
        out.close()  # the end of the stream: scale's loop ends when it is drained


def scale(prefix):
    with tpipd.Channel(prefix + ".raw") as inp, tpipd.Channel(prefix + ".scaled") as out:
        for a in inp.tensors():  # ends when "raw" is closed and empty
            out.write_tensor(a * 2)
        out.close()  # cascade: sink's loop ends next


def sink(prefix, result):
    with tpipd.Channel(prefix + ".scaled") as inp:
        result.put(float(sum(float(a.sum()) for a in inp.tensors())))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    prefix = f"pipeline.{os.getpid()}"
    # The parent creates both channels (bounded: 64 items, so a fast stage waits for a slow
    # one) and holds them open until every stage has opened its handles.
    raw = tpipd.Channel(prefix + ".raw", create=True, capacity=64)
    scaled = tpipd.Channel(prefix + ".scaled", create=True, capacity=64)
    mp.set_start_method("spawn")
    result = mp.Queue()
    procs = [mp.Process(target=source, args=(prefix, n)), mp.Process(target=scale, args=(prefix,)),
             mp.Process(target=sink, args=(prefix, result))]
    for p in procs:
        p.start()
    total = result.get(timeout=120)
    for p in procs:
        p.join(60)
    raw.release()
    scaled.release()
    expect = 2.0 * 256 * n * (n - 1) / 2
    print(f"sink total {total:.0f}, expected {expect:.0f}: {'OK' if total == expect else 'WRONG'}")
    return 0 if total == expect and all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
