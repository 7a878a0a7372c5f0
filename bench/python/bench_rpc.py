#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Baseline for bench_tpipd.py pipe: torch.distributed.rpc with its TensorPipe backend
(rpc_sync), 2 processes on this host. Round trip: rpc_sync of a function returning its small
argument; throughput: rpc_sync of a function taking a float32 tensor of each size and returning
a scalar (a fresh tensor each call, as a training loop makes). Lines, as bench_tpipd.py:
  rtt impl=rpc median_us=T iters=I
  tput impl=rpc size=S median_us=T GBps=G iters=I
Usage: bench_rpc.py [-s SIZES] [-t SECONDS] [--label rpc]. Numbers only."""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def echo(x):
    return x


def consume(t):
    return t.numel()


def parse_sizes(s):
    out = []
    for v in s.split(","):
        mult = {"K": 1 << 10, "M": 1 << 20}.get(v[-1:].upper(), 1)
        out.append(int(v[:-1] if mult > 1 else v) * mult)
    return out


def timeit(fn, budget, hi):
    t0 = time.perf_counter()
    fn()
    n = max(5, min(hi, int(budget / max(time.perf_counter() - t0, 1e-7))))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), n


def run(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        small = torch.zeros(1)
        for _ in range(200):
            rpc.rpc_sync("w1", echo, args=(small,))
        med, n = timeit(lambda: rpc.rpc_sync("w1", echo, args=(small,)), args.secs, 20000)
        print(f"rtt impl={args.label} median_us={med * 1e6:.1f} iters={n}", flush=True)
        for size in parse_sizes(args.sizes):
            def send():
                t = torch.ones(size // 4, dtype=torch.float32)
                rpc.rpc_sync("w1", consume, args=(t,))
            med, n = timeit(send, args.secs, 2000)
            print(f"tput impl={args.label} size={size} median_us={med * 1e6:.1f} "
                  f"GBps={size / med / 1e9:.3f} iters={n}", flush=True)
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-s", "--sizes", default="1M,16M,64M")
    ap.add_argument("-t", "--secs", type=float, default=1.0)
    ap.add_argument("--label", default="rpc")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=2, join=True)


if __name__ == "__main__":
    sys.exit(main())
