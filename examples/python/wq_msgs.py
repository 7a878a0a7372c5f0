#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A pool of worker processes answering message questions through a named work queue, as an
inference server's batch workers would:

    owner --submit_msg--> "<name>" --take_msg / take_descriptor--> worker 1..W --reply_msg--> owner

Each question is one message: JSON metadata (the request's id and a scale), a payload (the
request's name as bytes) and two tensors (a float32 batch of inputs and an int64 mask; torch
tensors with --torch, numpy arrays otherwise). A worker takes a question either in one call
(take_msg(): the module allocates arrays or tensors of the sender's kind, dtype and shape) or,
every other time, in two steps (take_descriptor(): metadata, payload sizes and each tensor's
kind, dtype and shape; then read_msg() into arrays the worker allocated from them), and
answers with a message: JSON metadata, the masked, scaled batch (the question's kind) and a
0-d float64 sum. The owner receives every answer as a Message matched to its question by id
(answer_msg()), checks it, drains and closes the queue: each worker's loop ends once the queue
is closed and empty. A worker that dies with a question taken loses nothing: the daemon queues
that question again, intact. Needs a running tpipd ($TPIPD_SOCKET or libtpclient's default
socket).

    /usr/bin/python3 examples/python/wq_msgs.py [--workers W] [--questions N] [--torch]
"""
import argparse
import json
import multiprocessing as mp
import os
import sys

import numpy as np

import tpipd


def take(wq, two_step):
    """The next question as (id, Message), in one call or allocating from its descriptor."""
    if not two_step:
        return wq.take_msg()
    qid, d = wq.take_descriptor()
    dst = []
    for t in d.tensors:  # kind, dtype and shape of each tensor, before its bytes move
        if t.kind == "torch":
            import torch
            dst.append(torch.empty(t.shape, dtype=getattr(torch, t.dtype)))
        else:
            dst.append(np.empty(t.shape, t.dtype))
    return qid, wq.read_msg(d, dst)


def worker(name, ready):
    answered = 0
    with tpipd.WorkQueue(name) as wq:  # a worker: the queue exists, we did not create it
        ready.put(os.getpid())
        while True:
            try:
                qid, m = take(wq, answered % 2 == 1)
            except tpipd.PipeClosed:  # closed and empty: the owner is done
                break
            meta = json.loads(m.metadata)
            batch, mask = m.tensors  # numpy arrays or torch tensors, as the owner sent
            out = batch * mask * meta["scale"]
            total = np.float64(float(out.sum()))
            wq.reply_msg(qid, json.dumps({"id": meta["id"], "by": os.getpid()}).encode(),
                         tensors=[out, total])
            answered += 1
    # one write(2) per line: the workers share the parent's stdout
    os.write(1, f"worker {os.getpid()}: answered {answered}\n".encode())


def question(i, use_torch):
    batch = np.arange(32, dtype=np.float32).reshape(4, 8) + i
    mask = (np.arange(32, dtype=np.int64) % 3 == 0).astype(np.int64).reshape(4, 8)
    if use_torch:
        import torch
        batch, mask = torch.from_numpy(batch), torch.from_numpy(mask)
    meta = json.dumps({"id": i, "scale": 2}).encode()
    return meta, [b"request-%d" % i], [batch, mask]


def check(i, m, use_torch):
    _, _, (batch, mask) = question(i, use_torch)
    want = batch * mask * 2
    out, total = m.tensors
    return (json.loads(m.metadata)["id"] == i and type(out) is type(want) and
            bool((out == want).all()) and float(total) == float(want.sum()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of numpy")
    ap.add_argument("--name", default=f"wq_msgs.{os.getpid()}")
    args = ap.parse_args()

    mp.set_start_method("spawn")
    with tpipd.WorkQueue(args.name, create=True, exclusive=True) as wq:  # the owner
        ready = mp.Queue()
        procs = [mp.Process(target=worker, args=(args.name, ready))
                 for _ in range(args.workers)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        sent = {wq.submit_msg(*question(i, args.torch)): i for i in range(args.questions)}
        bad = 0
        for _ in range(args.questions):
            qid, m = wq.answer_msg(timeout=60)
            bad += not check(sent.pop(qid), m, args.torch)
        wq.drain(timeout=10)  # nothing queued or taken is left
        wq.close()  # the workers' loops end
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
    ok = bad == 0 and not sent and codes == [0] * args.workers
    print(f"{args.questions} answers from {args.workers} workers, {bad} wrong, exit codes "
          f"{codes}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
