#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A pool of worker processes answering questions through a named work queue (torch-ipc's
workqueue example in Python; examples/wq.c in C):

    owner --submit_tensor--> "<name>" --take_tensor--> worker 1..W --reply_tensor--> owner

The owner creates the queue, starts W workers (spawned processes that open it by name), submits
N questions (float32 arrays, or torch tensors with --torch), receives every answer by question
id, checks each one (the answer to x is x * x + 1), then closes the queue: each worker's
``for qid, q in wq.tensors():`` loop ends once the queue is closed and empty, so no end marker
is sent. A worker that dies with a question taken loses nothing: the daemon queues that
question again. Needs a running tpipd ($TPIPD_SOCKET or libtpclient's default socket).

    /usr/bin/python3 examples/python/wq_pool.py [--workers W] [--questions N] [--torch]
"""
import argparse
import multiprocessing as mp
import os
import sys

import numpy as np

import tpipd


def worker(name, ready):
    answered = 0
    with tpipd.WorkQueue(name) as wq:  # a worker: the queue exists, we did not create it
        ready.put(os.getpid())
        for qid, x in wq.tensors():  # ends when the owner closed the queue and it is empty
            wq.reply_tensor(qid, x * x + 1)
            answered += 1
    # one write(2) per line: the workers share the parent's stdout
    os.write(1, f"worker {os.getpid()}: answered {answered}\n".encode())


def question(i, use_torch):
    x = np.arange(16, dtype=np.float32) + i
    if use_torch:
        import torch
        return torch.from_numpy(x)
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of numpy")
    ap.add_argument("--name", default=f"wq_pool.{os.getpid()}")
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
        sent = {wq.submit_tensor(question(i, args.torch)): i for i in range(args.questions)}
        bad = 0
        for _ in range(args.questions):
            qid, y = wq.answer_tensor(timeout=60)
            x = question(sent.pop(qid), args.torch)
            bad += not bool((y == x * x + 1).all()) or type(y) is not type(x)
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
