# SPDX-License-Identifier: BSD-3-Clause
"""init_group() across two hosts: two network namespaces joined by a veth pair, each with its
daemon (authenticated peer links, --peer-force-cross-host), and four members, ranks 0 and 3 on
host a and 1 and 2 on host b, joining through the coordinator tpip://<a>:7420 (bootstrap
"coordinator"). Every member learns its rank, the size and its host's local rank and size, and
all-reduces (small, with the call's check, and 1.2 MiB, chunked between the hosts' leaders),
max-reduces, broadcasts and barriers equal to what one process computes; the daemons show the
group over 2 hosts. Skips where network namespaces or veth pairs cannot be made (as
tests/service/lib.sh does)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import tpipd
from tpipd import _tensor

if _tensor.torch_module() is None:
    pytest.skip("torch is not installed", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "group_worker.py")
T = 60


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=T,
                          check=check)


@pytest.fixture(scope="module")
def hosts():
    """{"a": (socket, address), "b": (socket, address)}: two namespaces, each with a tpipd
    listening for peers on its end of the veth pair, sharing a peer key. Removed afterwards."""
    for var in ("TPIPD_BIN", "TPIPCTL_BIN"):
        if not os.environ.get(var):
            pytest.skip(f"{var} not set (run through meson test)")
    if shutil.which("ip") is None:
        pytest.skip("ip (iproute2) is not installed")
    pid = os.getpid()
    ns = {"a": f"tpy-a-{pid}", "b": f"tpy-b-{pid}"}
    net = f"10.203.{pid % 250}."
    addr = {"a": net + "1", "b": net + "2"}
    tmp = tempfile.mkdtemp(prefix="tpy.x.")
    made, procs, logs = [], [], {}
    try:
        for h in "ab":
            if ip("netns", "add", ns[h], check=False).returncode != 0:
                pytest.skip("cannot create network namespaces here (ip netns add)")
            made.append(ns[h])
        if ip("link", "add", f"tpya{pid}", "netns", ns["a"], "type", "veth", "peer", "name",
              f"tpyb{pid}", "netns", ns["b"], check=False).returncode != 0:
            pytest.skip("cannot create a veth pair here")
        for h in "ab":
            dev = f"tpy{h}{pid}"
            ip("-n", ns[h], "addr", "add", addr[h] + "/24", "dev", dev)
            ip("-n", ns[h], "link", "set", "lo", "up")
            ip("-n", ns[h], "link", "set", dev, "up")
        key = os.path.join(tmp, "peer.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, __import__("base64").b64encode(os.urandom(32)) + b"\n")
        os.close(fd)
        socks = {}
        for h in "ab":
            socks[h] = os.path.join(tmp, f"{h}.sock")
            logs[h] = open(os.path.join(tmp, f"{h}.log"), "w")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns[h], os.environ["TPIPD_BIN"], "--socket", socks[h],
                 "--config", "/dev/null", "--peer-listen", addr[h] + ":7420",
                 "--peer-force-cross-host", "--peer-timeout", "3000",
                 "--peer-connect-timeout", "3000", "--peer-key-file", key],
                stderr=logs[h]))
        for h, p in zip("ab", procs):
            deadline = time.monotonic() + 10
            while True:  # bounded wait for the daemon to answer
                try:
                    tpipd.Context(socks[h]).close()
                    break
                except tpipd.Error:
                    if p.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"tpipd {h} did not start: "
                                           f"{open(logs[h].name).read()[-2000:]}")
                    time.sleep(0.02)
        yield {h: (socks[h], addr[h]) for h in "ab"}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for n in made:
            ip("netns", "del", n, check=False)
        for f in logs.values():
            f.close()
        shutil.rmtree(tmp, ignore_errors=True)


def groups(sock):
    out = subprocess.run([os.environ["TPIPCTL_BIN"], "--socket", sock, "--json", "groups"],
                         check=True, capture_output=True, text=True, timeout=T).stdout
    return json.loads(out).get("groups", [])


def test_four_members_on_two_hosts_join_through_the_coordinator_and_all_reduce(hosts):
    coord = f"tpip://{hosts['a'][1]}:7420"
    on = {0: "a", 1: "b", 2: "b", 3: "a"}
    name = f"g.xhost.{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, WORKER, "xhost", name, "4", str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, TPIPD_SOCKET=hosts[on[r]][0],
                                       TPY_COORD=coord))
             for r in range(4)]
    res = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=2 * T)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, f"member failed ({p.returncode}): {e[-3000:]}"
        res.append(json.loads(o.strip().splitlines()[-1]))
    assert [r["rank"] for r in res] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["local_size"] == 2 and r["sum_ok"] for r in res), res
    assert [r["local_rank"] for r in res] == [0, 0, 1, 1], res  # 0, 3 on a; 1, 2 on b
    # the group goes once its members left (a deadline, not a sleep)
    deadline = time.monotonic() + 10
    for h in "ab":
        while [g for g in groups(hosts[h][0]) if g.get("name") == name]:
            assert time.monotonic() < deadline, f"group {name} still on {h}"
            time.sleep(0.05)


def test_a_coordinator_that_refuses_fails_the_join_with_its_cause(hosts):
    """A coordinator address nobody listens on: the join fails at once, naming it."""
    with tpipd.Context(hosts["b"][0]) as ctx:
        t0 = time.monotonic()
        with pytest.raises(tpipd.Error) as e:
            tpipd.init_group(f"g.down.{os.getpid()}", 2, 0, context=ctx,
                             bootstrap="coordinator", join_timeout=20,
                             coordinator=f"tpip://{hosts['a'][1]}:7421")
        assert time.monotonic() - t0 < 10
        assert isinstance(e.value, ConnectionRefusedError) and "7421" in str(e.value), e.value
