# SPDX-License-Identifier: BSD-3-Clause
"""One member of the groups test (test_group.py starts N of them): runs the scenario named on
the command line and prints one JSON line of results. Not a test by itself."""
import json
import os
import sys

import torch

import tpipd


def main():
    scenario, name, n, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = {}
    if scenario.startswith("slurm-"):  # rank and size from Slurm's variables (the test's)
        g = tpipd.init_group(name, bootstrap=scenario[6:], join_timeout=30, op_timeout=30)
    elif scenario == "xhost":  # through the coordinator daemon the test names
        g = tpipd.init_group(name, n, rank, bootstrap="coordinator", join_timeout=30,
                             op_timeout=30, coordinator=os.environ["TPY_COORD"],
                             remote=["psk"])  # the daemons prove the pre-shared key
    else:
        g = tpipd.init_group(name, n, rank, join_timeout=30, op_timeout=30)
    r = g.rank
    if scenario == "collectives":
        t = torch.arange(1000, dtype=torch.float32) * (r + 1)
        tpipd.all_reduce(t)
        out["sum_ok"] = bool(torch.equal(t, torch.arange(1000, dtype=torch.float32) *
                                         (n * (n + 1) / 2)))
        m = torch.full((7,), float(r), dtype=torch.float64)
        g.all_reduce(m, op=tpipd.ReduceOp.MAX)
        out["max_ok"] = bool((m == n - 1).all())
        b = torch.full((5,), r, dtype=torch.int64)
        g.broadcast(b, src=n - 1)
        out["bcast_ok"] = bool((b == n - 1).all())
        lst = [torch.empty(3, dtype=torch.int32) for _ in range(n)]
        g.all_gather(lst, torch.full((3,), r, dtype=torch.int32))
        out["gather_ok"] = all(bool((x == i).all()) for i, x in enumerate(lst))
        rs = torch.empty(4, dtype=torch.float32)
        g.reduce_scatter(rs, [torch.full((4,), float(i + r), dtype=torch.float32)
                              for i in range(n)])
        out["rs_ok"] = bool((rs == sum(r2 + r for r2 in range(n))).all())
        h = torch.ones(1 << 16, dtype=torch.bfloat16)
        w = g.all_reduce(h, async_op=True)
        w.wait()
        f = torch.ones(8, dtype=torch.float64)
        fut = g.all_reduce(f, async_op=True).get_future()
        out["async_ok"] = bool((h == n).all()) and fut.result(30) and bool((f == n).all())
        g.barrier()
    elif scenario.startswith("slurm-"):
        t = torch.ones(16) * (r + 1)
        tpipd.all_reduce(t)
        out["size"] = g.size
        out["sum_ok"] = bool((t == n * (n + 1) / 2).all())
    elif scenario == "xhost":
        out.update(size=g.size, local_rank=g.local_rank, local_size=g.local_size)
        ok = []
        for count in (1000, 300000):  # with the call's check; chunked between the leaders
            t = torch.arange(count, dtype=torch.float32) * (r + 1)
            tpipd.all_reduce(t)
            ok.append(bool(torch.equal(t, torch.arange(count, dtype=torch.float32) *
                                       (n * (n + 1) / 2))))
        m = torch.full((5,), float(r), dtype=torch.float64)
        g.all_reduce(m, op="max")
        ok.append(bool((m == n - 1).all()))
        b = torch.full((9,), r, dtype=torch.int64)
        g.broadcast(b, src=n - 1)
        ok.append(bool((b == n - 1).all()))
        g.barrier()
        out["sum_ok"] = all(ok)
    elif scenario == "mismatch":
        t = torch.ones(4)
        try:
            if r == 0:
                g.broadcast(t, src=0)
            else:
                g.all_reduce(t)
            out["error"] = "none"
        except tpipd.Error as e:
            out["error"] = type(e).__name__
    elif scenario == "die":
        if r == n - 1:
            os._exit(5)
        try:
            g.all_reduce(torch.ones(4))
            out["error"] = "none"
        except tpipd.Error as e:
            out["error"] = type(e).__name__
            out["is_reset"] = isinstance(e, ConnectionResetError)
    out["rank"] = r
    print(json.dumps(out), flush=True)
    os._exit(0) if scenario == "die" else g.leave()


if __name__ == "__main__":
    main()
