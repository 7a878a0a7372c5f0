#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
#
# Baseline for bench_allreduce: torch.distributed's all_reduce (float32, sum) with the gloo
# backend (Debian's python3-torch; run it with /usr/bin/python3). N processes (forked here, after
# torch is imported, or started one per rank by the caller with --rank) meet through a file://
# or tcp:// rendezvous on this host. Each iteration starts after a barrier; every rank times its
# own call and an iteration's time is that of its slowest rank (a MAX all-reduce of the times
# once the size is done). Rank 0 prints, per size, the line bench/run_allreduce.sh collects:
#   allreduce impl=gloo n=N size=BYTES median_us=T busbw_GBps=B iters=I
# with busbw = 2(N-1)/N x size / median. The result is checked once per size. Numbers only.
#
# Usage: allreduce_gloo.py -n N [-s SIZES] [-i ITERS] [-t SECONDS] [--init file|tcp]
#        allreduce_gloo.py -n N --rank R --init-url tcp://HOST:PORT ...  (one rank, e.g. per host)
import argparse
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist

ITERS_MIN = 5


def parse_size(s):
    mult = {'K': 1 << 10, 'M': 1 << 20}.get(s[-1:].upper(), 1)
    v = int(s[:-1] if mult > 1 else s) * mult
    if v <= 0 or v % 4:
        raise ValueError(f'bad size {s}')
    return v


def timed(t):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return time.perf_counter() - t0


def run(rank, args, url):
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=url, rank=rank, world_size=args.n)
    n = args.n
    for size in args.sizes:
        count = size // 4
        t = torch.full((count,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)  # warm-up, and the check
        want = n * (n + 1) / 2
        if not bool((t == want).all()):
            print(f'allreduce_gloo: rank {rank}: wrong sum at size {size}', file=sys.stderr)
            sys.exit(1)
        t.zero_()  # zeros stay zeros: repeated sums neither grow nor overflow
        one = torch.tensor([timed(t)], dtype=torch.float64)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        iters = max(ITERS_MIN, min(args.iters, int(args.budget / max(one.item(), 1e-9))))
        times = torch.tensor([timed(t) for _ in range(iters)], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            med = times.median().item() if iters % 2 else times.sort().values[
                iters // 2 - 1:iters // 2 + 1].mean().item()
            print(f'allreduce impl={args.label} n={n} size={size} median_us={med * 1e6:.1f} '
                  f'busbw_GBps={2 * (n - 1) / n * size / med / 1e9:.3f} iters={iters}',
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('-n', type=int, required=True)
    p.add_argument('-s', default='4K,64K,1M,16M,64M')
    p.add_argument('-i', dest='iters', type=int, default=200)
    p.add_argument('-t', dest='budget', type=float, default=2.0)
    p.add_argument('-l', dest='label', default='gloo')
    p.add_argument('--init', choices=['file', 'tcp'], default='tcp')
    p.add_argument('--init-url')
    p.add_argument('--rank', type=int)
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.s.split(',')]
    if args.rank is not None:
        run(args.rank, args, args.init_url)
        return 0
    with tempfile.TemporaryDirectory() as d:
        url = f'file://{d}/rendezvous' if args.init == 'file' else \
            f'tcp://127.0.0.1:{free_port()}'
        ctx = mp.get_context('fork')
        procs = [ctx.Process(target=run, args=(r, args, url)) for r in range(args.n)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
        return max(abs(pr.exitcode or 0) for pr in procs)


if __name__ == '__main__':
    sys.exit(main())
