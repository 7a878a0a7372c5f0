# SPDX-License-Identifier: BSD-3-Clause
"""Data-parallel training over tpipd: N processes each train the same small torch model on
their own slice of a synthetic batch and all-reduce the gradients through tpipd every step
(sum, then divide by N), so every rank takes the same step as one process training on the
concatenated batches.

    python3 train_ddp.py --nprocs 4 --steps 20          # starts 4 ranks, prints their loss
    python3 train_ddp.py --nprocs 4 --steps 20 --check  # and compares with one process

The daemon socket follows libtpclient's rules ($TPIPD_SOCKET, ...).
"""
import argparse
import os
import subprocess
import sys

import torch

import tpipd

IN, HIDDEN, OUT, PER_RANK = 16, 32, 4, 8


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT))


def batch(step, nprocs):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(nprocs * PER_RANK, IN, generator=g, dtype=torch.float64).float()
    y = torch.randn(nprocs * PER_RANK, OUT, generator=g, dtype=torch.float64).float()
    return x, y


def train(steps, nprocs, rank=None, group=None):
    """Trains; rank None is the single-process reference on the whole batch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = None
    for step in range(steps):
        x, y = batch(step, nprocs)
        if rank is not None:
            x, y = x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
        opt.zero_grad()
        # mean over the whole batch: each rank's share is sum over its rows / total rows
        loss = ((model(x) - y) ** 2).sum() / (nprocs * PER_RANK)
        loss.backward()
        if group is not None:
            works = [group.all_reduce(p.grad, async_op=True) for p in model.parameters()]
            for w in works:
                w.wait()
        opt.step()
    return model, float(loss)


def member(args):
    g = tpipd.init_group(args.group, args.nprocs, args.rank)
    model, loss = train(args.steps, args.nprocs, g.rank, g)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.save(flat, os.path.join(args.out, f"rank{g.rank}.pt")) if args.out else None
    print(f"rank {g.rank}: loss {loss:.6f}", flush=True)
    g.leave()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rank", type=int, default=None, help="run one member (internal)")
    ap.add_argument("--group", default=f"train.{os.getpid()}")
    ap.add_argument("--out", default=None, help="directory for each rank's parameters")
    ap.add_argument("--check", action="store_true", help="compare with one process")
    args = ap.parse_args()
    if args.rank is not None:
        return member(args)
    import tempfile
    out = args.out or tempfile.mkdtemp(prefix="tpy-train.")
    procs = [subprocess.Popen([sys.executable, __file__, "--nprocs", str(args.nprocs), "--steps",
                               str(args.steps), "--rank", str(r), "--group", args.group,
                               "--out", out]) for r in range(args.nprocs)]
    if any(p.wait() != 0 for p in procs):
        sys.exit("a rank failed")
    if args.check:
        ref, loss = train(args.steps, args.nprocs)
        want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        for r in range(args.nprocs):
            got = torch.load(os.path.join(out, f"rank{r}.pt"))
            err = float((got - want).abs().max())
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                sys.exit(f"rank {r}: parameters differ from one process by {err}")
            print(f"rank {r}: parameters equal one process's (max difference {err:.2e})")
        print(f"one process: loss {loss:.6f}")


if __name__ == "__main__":
    main()
