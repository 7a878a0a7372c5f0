#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Figures for the tpipd Python module (numbers only, nothing passes or fails):
  pipe:       round trip of a small message (write, the echo's reply) and throughput of a
              torch tensor of each size (write it, read a small acknowledgement), against an
              echo process; both sides use shared buffers (tpipd.empty) as a user who cares
              about speed would. Lines:
                rtt impl=tpipd-py median_us=T iters=I
                tput impl=tpipd-py size=S median_us=T GBps=G iters=I
  allreduce:  N processes all-reduce float32 (sum) through tpipd.all_reduce; the time of an
              iteration is the slowest rank's (after a barrier). Line as bench/allreduce_gloo.py,
              with C the CPU time per iteration (barrier and call) of the rank that used the
              most, as bench_allreduce prints it:
                allreduce impl=tpipd-py n=N size=S median_us=T busbw_GBps=B iters=I cpu_us=C
Needs a running tpipd ($TPIPD_SOCKET). Usage: bench_tpipd.py pipe|allreduce [-n N]
[-s SIZES] [-t SECONDS]"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

import tpipd


def parse_sizes(s):
    out = []
    for v in s.split(","):
        mult = {"K": 1 << 10, "M": 1 << 20}.get(v[-1:].upper(), 1)
        out.append(int(v[:-1] if mult > 1 else v) * mult)
    return out


def echo(name, sizes):
    with tpipd.Context() as c:
        lst = c.listen(name)
        p = lst.accept()
        dst = {s: c.empty(s // 4, "float32", like="torch") for s in sizes}
        while True:
            try:
                d = p._raw.read_descriptor(None)
            except tpipd.Error:
                return
            md = d.metadata
            ts = d.tensors
            bufs = [_buf(dst[ts[0][0]])] if ts else []
            p._raw.read(d, [], bufs, None)
            p._raw.write(md, [], [], None)


def _buf(t):
    return t.numpy()


def budget_iters(fn, budget, lo=5, hi=100000):
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    return max(lo, min(hi, int(budget / max(one, 1e-7))))


def pipe_bench(args):
    name = f"bench.echo.{os.getpid()}"
    child = subprocess.Popen([sys.executable, __file__, "echo", "--name", name, "-s",
                              args.sizes])
    with tpipd.Context() as c:
        p = c.connect(name, timeout=30)

        def rtt():
            p.write(b"x")
            p.read()
        for _ in range(200):
            rtt()
        n = budget_iters(rtt, args.secs, hi=20000)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            rtt()
            ts.append(time.perf_counter() - t0)
        print(f"rtt impl=tpipd-py median_us={statistics.median(ts) * 1e6:.1f} iters={n}",
              flush=True)
        for size in parse_sizes(args.sizes):
            t = c.empty(size // 4, "float32", like="torch")
            t.fill_(1.0)

            def send():
                p.write(b"t", (), [t])
                p.read()
            send()
            n = budget_iters(send, args.secs, hi=2000)
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                send()
                ts.append(time.perf_counter() - t0)
            med = statistics.median(ts)
            print(f"tput impl=tpipd-py size={size} median_us={med * 1e6:.1f} "
                  f"GBps={size / med / 1e9:.3f} iters={n}", flush=True)
        p.close()
    child.wait(30)


def _cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def allreduce_member(args, rank):
    torch.set_num_threads(1)
    g = tpipd.init_group(args.group, args.n, rank)
    for size in parse_sizes(args.sizes):
        t = torch.zeros(size // 4, dtype=torch.float32)
        g.all_reduce(t)

        def one():
            g.barrier()
            t0 = time.perf_counter()
            g.all_reduce(t)
            return time.perf_counter() - t0
        first = torch.tensor([one()], dtype=torch.float64)
        g.all_reduce(first, op="max")
        iters = max(5, min(200, int(args.secs / max(first.item(), 1e-9))))
        cpu0 = _cpu_s()
        times = torch.tensor([one() for _ in range(iters)], dtype=torch.float64)
        cpu = torch.tensor([(_cpu_s() - cpu0) / iters], dtype=torch.float64)
        g.all_reduce(times, op="max")
        g.all_reduce(cpu, op="max")
        if g.rank == 0:
            med = statistics.median(times.tolist())
            n = args.n
            print(f"allreduce impl=tpipd-py n={n} size={size} median_us={med * 1e6:.1f} "
                  f"busbw_GBps={2 * (n - 1) / n * size / med / 1e9:.3f} iters={iters} "
                  f"cpu_us={cpu.item() * 1e6:.1f}", flush=True)
    g.leave()


def chan_bench(args):
    """Items per second through one channel: a writer thread and a reader on two handles of
    this process (the GIL is released while either waits), 4 KiB and 64 KiB items."""
    import threading
    with tpipd.Context() as ctx:
        for size in (4096, 65536):
            name = f"bench.chan.{os.getpid()}.{size}"
            w = ctx.channel(name, create=True, capacity=256)
            r = ctx.channel(name)
            item, n = b"x" * size, [0]

            def writer():
                end = time.perf_counter() + args.secs
                while time.perf_counter() < end:
                    w.write(item)
                    n[0] += 1
                w.close()
            t = threading.Thread(target=writer)
            t0 = time.perf_counter()
            t.start()
            got = sum(1 for _ in r)
            dt = time.perf_counter() - t0
            t.join()
            print(f"chan impl=tpipd-py size={size} items_per_s={got / dt:.0f} "
                  f"GBps={got * size / dt / 1e9:.3f} items={got}", flush=True)
            w.release()
            r.release()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["pipe", "allreduce", "echo", "member", "chan"])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("-s", "--sizes", default="1M,16M,64M")
    ap.add_argument("-t", "--secs", type=float, default=1.0)
    ap.add_argument("--name")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--group", default=f"bench.ar.{os.getpid()}")
    args = ap.parse_args()
    if args.mode == "echo":
        echo(args.name, parse_sizes(args.sizes))
    elif args.mode == "pipe":
        pipe_bench(args)
    elif args.mode == "chan":
        chan_bench(args)
    elif args.mode == "member":
        allreduce_member(args, args.rank)
    else:
        procs = [subprocess.Popen([sys.executable, __file__, "member", "-n", str(args.n), "-s",
                                   args.sizes, "-t", str(args.secs), "--rank", str(r),
                                   "--group", args.group]) for r in range(args.n)]
        sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
