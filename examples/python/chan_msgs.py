#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Samples as channel message items: a loader process and a pool of worker processes share one
named channel of samples and one of results, as a data-loading pipeline would.

    loader --"<prefix>.samples"--> worker x W --"<prefix>.results"--> parent

Each sample is one message item: JSON metadata (its id and label), a payload (its name as
bytes) and two tensors (a float32 image and an int64 mask; torch tensors with --torch,
numpy arrays otherwise), written in batches with write_msgs(). Workers take samples with
read_msg(), which returns the arrays or tensors the loader sent (fresh memory, same dtype and
shape), until the channel is drained, and write a result message (the id, the masked sum as
a float64 0-d tensor). The loader's close ends the workers' loops; the parent closes the
results channel once every worker has exited and reads it until drained. Needs a running
tpipd ($TPIPD_SOCKET or libtpclient's default socket).

    /usr/bin/python3 examples/python/chan_msgs.py [N] [WORKERS] [--torch]
"""
import json
import multiprocessing as mp
import os
import sys

import numpy as np

import tpipd


def sample(i, use_torch):
    image = np.arange(64, dtype=np.float32).reshape(8, 8) + i
    mask = (np.arange(64, dtype=np.int64) % 2).reshape(8, 8)
    if use_torch:
        import torch
        image, mask = torch.from_numpy(image), torch.from_numpy(mask)
    meta = json.dumps({"id": i, "label": i % 10}).encode()
    return meta, [b"sample-%d" % i], [image, mask]


def loader(prefix, n, use_torch):
    with tpipd.Channel(prefix + ".samples") as out:
        for start in range(0, n, 8):  # batches of 8: atomic and contiguous in the channel
            out.write_msgs([sample(i, use_torch) for i in range(start, min(n, start + 8))])
        out.close()  # the end of the stream


def worker(prefix):
    with tpipd.Channel(prefix + ".samples") as inp, tpipd.Channel(prefix + ".results") as out:
        for m in inp.msgs():  # ends when "samples" is closed and empty
            meta = json.loads(m.metadata)
            image, mask = m.tensors  # numpy arrays or torch tensors, as the loader sent
            total = float((image * mask).sum())
            out.write_msg(json.dumps({"id": meta["id"], "name": m.payloads[0].decode()})
                          .encode(), tensors=[np.float64(total)])


def expected(n):
    image = np.arange(64, dtype=np.float64)
    mask = np.arange(64) % 2
    return sum(float(((image + i) * mask).sum()) for i in range(n))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    use_torch = "--torch" in sys.argv
    n = int(args[0]) if args else 200
    workers = int(args[1]) if len(args) > 1 else 3
    prefix = f"samples.{os.getpid()}"
    # The parent creates both channels (bounded: a fast loader waits for the workers) and
    # holds them open until every process has opened its handles.
    samples = tpipd.Channel(prefix + ".samples", create=True, capacity=32)
    results = tpipd.Channel(prefix + ".results", create=True, capacity=1024)
    mp.set_start_method("spawn")
    procs = [mp.Process(target=loader, args=(prefix, n, use_torch))]
    procs += [mp.Process(target=worker, args=(prefix,)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results.close()  # every worker is done: the parent's loop below ends when it is drained
    ids, total = set(), 0.0
    for m in results.msgs():
        meta = json.loads(m.metadata)
        assert meta["name"] == f"sample-{meta['id']}"
        ids.add(meta["id"])
        total += float(m.tensors[0])
    samples.release()
    results.release()
    ok = ids == set(range(n)) and total == expected(n) and all(p.exitcode == 0 for p in procs)
    print(f"{len(ids)} samples by {workers} workers, total {total:.0f}, expected "
          f"{expected(n):.0f}: {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
