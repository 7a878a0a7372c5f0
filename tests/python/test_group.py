# SPDX-License-Identifier: BSD-3-Clause
"""Groups from Python: 4 processes all-reduce torch tensors (the sum), and run max, broadcast,
all_gather, reduce_scatter, an async bfloat16 all-reduce and a barrier; members calling
different collectives get Mismatch; a member that dies fails the others with PeerDied; the
Slurm bootstrap takes rank and size from Slurm's variables (a one-node step); without them, or
without peer authentication for a coordinator, libtpclient's refusal comes through."""
import json
import os
import subprocess
import sys

import pytest

import tpipd
from tpipd import _tensor

if _tensor.torch_module() is None:
    pytest.skip("torch is not installed", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "group_worker.py")


def run_members(daemon, scenario, n, name, env=None):
    procs = [subprocess.Popen([sys.executable, WORKER, scenario, name, str(n), str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=None if env is None else dict(os.environ, **env(r)))
             for r in range(n)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        outs.append((p.returncode, o, e))
    return outs


def results(outs, expect_rc=0):
    res = []
    for rc, o, e in outs:
        if rc == expect_rc and o.strip():
            res.append(json.loads(o.strip().splitlines()[-1]))
        else:
            assert rc == 5, f"member exited {rc}: {e[-2000:]}"
    return res


def test_four_processes_all_reduce_torch_tensors_to_the_sum(daemon):
    res = results(run_members(daemon, "collectives", 4, f"g.sum.{os.getpid()}"))
    assert sorted(r["rank"] for r in res) == [0, 1, 2, 3]
    for r in res:
        assert r == {"rank": r["rank"], "sum_ok": True, "max_ok": True, "bcast_ok": True,
                     "gather_ok": True, "rs_ok": True, "async_ok": True}, r


def test_different_collectives_raise_mismatch(daemon):
    res = results(run_members(daemon, "mismatch", 2, f"g.mis.{os.getpid()}"))
    assert [r["error"] for r in res] == ["Mismatch", "Mismatch"]


def test_a_member_that_dies_fails_the_others_with_peer_died(daemon):
    res = results(run_members(daemon, "die", 3, f"g.die.{os.getpid()}"))
    assert len(res) == 2
    assert all(r["error"] == "PeerDied" and r["is_reset"] for r in res), res


@pytest.mark.parametrize("boot", ["slurm", "coordinator"])
def test_other_bootstraps_pass_through(daemon, boot):
    with pytest.raises(tpipd.Error) as e:
        tpipd.init_group(f"g.boot.{boot}", 2, 0, bootstrap=boot,
                         coordinator="tpip://127.0.0.1:1" if boot == "coordinator" else None)
    # slurm: no Slurm variables here (NoListener: ENOENT); coordinator: this test daemon has
    # no peer authentication (AccessDenied)
    assert isinstance(e.value, (tpipd.NotSupported, tpipd.InvalidArgument,
                                tpipd.AccessDenied, tpipd.NoListener)), e.value


@pytest.mark.parametrize("remote,exc", [("bogus", ValueError), ([], ValueError),
                                        (["psk"] * 33, ValueError), (5, TypeError),
                                        ([b"psk"], TypeError)])
def test_remote_access_is_checked_before_the_join(daemon, remote, exc):
    """remote=: "none", "any-peer" or 1..32 peer identities (str), else refused at once."""
    with pytest.raises(exc):
        tpipd.init_group("g.remote.bad", 1, 0, bootstrap="local", remote=remote)


def test_remote_access_any_peer_or_peers_joins_a_local_group(daemon):
    """A group on one host takes a remote access as well (its members' setting)."""
    for remote in ("any-peer", ["psk", "cert:gn02"], "none"):
        g = tpipd.init_group(f"g.remote.{os.getpid()}", 1, 0, bootstrap="local",
                             remote=remote)
        g.leave()


@pytest.mark.parametrize("boot", ["slurm", "auto"])
def test_slurm_bootstrap_takes_rank_and_size_from_slurms_variables(daemon, boot):
    """A one-node step of 3 tasks, as srun describes it: init_group(name) without world_size
    or rank joins NAME@slurm:JOB.STEP on the local daemon (bootstrap "slurm", or "auto" in a
    Slurm task), each task at its SLURM_PROCID."""
    job = str(os.getpid())

    def env(r):
        return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "1" if boot == "auto" else "0",
                "SLURM_PROCID": str(2 - r), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(2 - r),
                "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "node1",
                "SLURM_STEP_TASKS_PER_NODE": "3", "WORLD_SIZE": "", "RANK": ""}
    outs = run_members(daemon, "slurm-" + boot, 3, "g.slurm", env)
    res = results(outs)
    assert sorted(r["rank"] for r in res) == [0, 1, 2]
    assert all(r["size"] == 3 and r["sum_ok"] for r in res), res


def test_single_member_group_and_module_functions(daemon):
    import torch
    g = tpipd.init_group(f"g.one.{os.getpid()}", 1, 0)
    t = torch.arange(4, dtype=torch.int64)
    tpipd.all_reduce(t)
    assert t.tolist() == [0, 1, 2, 3]
    with pytest.raises(tpipd.InvalidArgument, match="no reduction"):
        tpipd.all_reduce(torch.ones(2, dtype=torch.int16))
    tpipd.barrier()
    tpipd.destroy_group()
    with pytest.raises(RuntimeError):
        tpipd.barrier()
    with pytest.raises(tpipd.Closed):
        g.barrier()
