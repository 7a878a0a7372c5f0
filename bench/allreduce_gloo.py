#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
#
# Baseline for bench_allreduce: torch.distributed's all_reduce (float32, sum; --dtype f16 or bf16
# for binary16 or bfloat16, the line then ending in dtype=f16 or dtype=bf16) with the gloo
# backend (Debian's python3-torch; run it with /usr/bin/python3). N processes (forked here, after
# torch is imported, or started one per rank by the caller with --rank) meet through a file://
# or tcp:// rendezvous on this host. Each iteration starts after a barrier; every rank times its
# own call and an iteration's time is that of its slowest rank (a MAX all-reduce of the times
# once the size is done). Rank 0 prints, per size, the line bench/run_allreduce.sh collects:
#   allreduce impl=gloo n=N size=BYTES median_us=T busbw_GBps=B iters=I
# with busbw = 2(N-1)/N x size / median. The result is checked once per size. Numbers only.
#
# Usage: allreduce_gloo.py -n N [-s SIZES] [-i ITERS] [-t SECONDS] [--init file|tcp]
#                          [--dtype f32|f16|bf16]
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
DTYPES = {'f32': (torch.float32, 4), 'f16': (torch.float16, 2), 'bf16': (torch.bfloat16, 2)}


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
    dtype, es = DTYPES[args.dtype]
    tag = '' if args.dtype == 'f32' else f' dtype={args.dtype}'
    for size in args.sizes:
        count = size // es
        t = torch.full((count,), float(rank + 1), dtype=dtype)
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
                  f'busbw_GBps={2 * (n - 1) / n * size / med / 1e9:.3f} iters={iters}{tag}',
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()


def gloo_sums(dtype):
    """Whether this torch's gloo sums @dtype (1.13's has no bfloat16: "Invalid scalar type"),
    asked of a group of one in this process, before any rank starts; a failed collective
    would leave the real group unusable."""
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group('gloo', init_method=f'file://{d}/probe', rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(1, dtype=dtype), op=dist.ReduceOp.SUM)
            return None
        except RuntimeError as e:
            return str(e)
        finally:
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
    p.add_argument('--dtype', choices=sorted(DTYPES), default='f32')
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.s.split(',')]
    why = gloo_sums(DTYPES[args.dtype][0])
    if why:
        print(f'allreduce_gloo: {args.dtype} skipped: {why}', file=sys.stderr)
        return 0
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
