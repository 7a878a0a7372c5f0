# SPDX-License-Identifier: BSD-3-Clause
"""Each libtpclient error arrives as its tpipd exception, which is also the built-in one that
fits (NoListener is a FileNotFoundError, PeerDied a ConnectionResetError, ...), carrying the
library's or daemon's message: no listener, timeouts (accept, connect waiting for a listener,
read), name in use, the other end closed, the other end's process died, access refused (a
process of another uid), cancelled by a close from another thread, use after close, no daemon,
an administrator closing the session (tpipctl close-session)."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tpipd


def test_no_listener(daemon):
    with tpipd.Context(daemon) as c:
        with pytest.raises(tpipd.NoListener, match="nope") as e:
            c.connect("nope")
        assert isinstance(e.value, FileNotFoundError) and e.value.errno == 2


def test_connect_timeout_waits_for_the_listener(daemon):
    with tpipd.Context(daemon) as a, tpipd.Context(daemon) as b:
        with pytest.raises(tpipd.Timeout) as e:
            a.connect("later.x", timeout=0.2)
        assert isinstance(e.value, TimeoutError) and tpipd.TimeoutError is tpipd.Timeout
        got = {}
        t = threading.Thread(target=lambda: got.update(p=a.connect("later.y", timeout=10)))
        t.start()
        lst = b.listen("later.y")  # registered after the connect started
        p = lst.accept(10)
        t.join(10)
        assert got["p"].remote_name == "later.y"
        p.close()


def test_accept_and_read_timeouts(pair, daemon):
    w, r, a, b = pair
    with b.listen("acc.to") as lst:
        with pytest.raises(tpipd.Timeout):
            lst.accept(0.1)
    with pytest.raises(tpipd.Timeout, match="timed out"):
        r.read(timeout=0.1)
    w.write(b"after")  # the pipe is still usable
    assert r.read(timeout=5).metadata == b"after"


def test_name_in_use(daemon):
    with tpipd.Context(daemon) as a, tpipd.Context(daemon) as b:
        keep = a.listen("taken.x")  # noqa: F841 (alive while b tries)
        with pytest.raises(tpipd.NameInUse):
            b.listen("taken.x")


def test_other_end_closed(pair):
    w, r, _, _ = pair
    r.close()
    with pytest.raises(tpipd.PipeClosed) as e:
        w.read(timeout=5)
    assert isinstance(e.value, BrokenPipeError)


CHILD = r"""
import os, sys, tpipd
c = tpipd.Context(sys.argv[1])
p = c.connect(sys.argv[2], timeout=10)
if len(sys.argv) > 3:
    os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
    try:
        c2 = tpipd.Context(sys.argv[1])
        c2.connect(sys.argv[2] + ".owner", timeout=5)
        print("connected")
    except tpipd.AccessDenied as e:
        print("AccessDenied", isinstance(e, PermissionError), e)
    sys.stdout.flush()
    os._exit(0)
print("ready", flush=True)
sys.stdin.readline()
os._exit(3)   # dies without closing anything
"""


def test_peer_died(daemon):
    with tpipd.Context(daemon) as c:
        lst = c.listen("died.x")
        child = subprocess.Popen([sys.executable, "-c", CHILD, daemon, "died.x"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        p = lst.accept(20)
        assert child.stdout.readline().strip() == "ready"
        got = {}

        def reader():
            try:
                p.read(timeout=20)
            except tpipd.Error as e:
                got["e"] = e
        t = threading.Thread(target=reader)
        t.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(20) == 3
        t.join(20)
        assert isinstance(got["e"], tpipd.PeerDied), got
        assert isinstance(got["e"], ConnectionResetError) and got["e"].strerror


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
def test_access_denied_for_another_uid(daemon):
    os.chmod(os.path.dirname(daemon), 0o755)
    os.chmod(daemon, 0o777)
    with tpipd.Context(daemon) as c:
        lst = c.listen("acl.x", access="anyone")
        owner_only = c.listen("acl.x.owner")
        child = subprocess.Popen([sys.executable, "-c", CHILD, daemon, "acl.x", "drop"],
                                 stdout=subprocess.PIPE, text=True)
        p = lst.accept(20)
        out = child.communicate(timeout=30)[0]
        assert out.startswith("AccessDenied True"), out
        p.close()
        owner_only.close()


def test_close_from_another_thread_cancels_a_blocked_read(pair):
    w, r, _, _ = pair
    got = {}

    def reader():
        try:
            r.read(timeout=20)
        except tpipd.Error as e:
            got["e"] = e
    t = threading.Thread(target=reader)
    t.start()
    while not t.is_alive():
        pass
    import time
    time.sleep(0.05)  # not synchronisation: the read fails either way (Cancelled or Closed)
    r.close()
    t.join(10)
    assert isinstance(got["e"], (tpipd.Cancelled, tpipd.Closed)), got


def test_use_after_close(pair):
    w, r, a, _ = pair
    w.close()
    with pytest.raises(tpipd.Closed):
        w.write(b"x")
    a.close()
    with pytest.raises(tpipd.Closed):
        a.connect("x")


def test_no_daemon(tmp_path):
    with pytest.raises(tpipd.Error) as e:
        tpipd.Context(str(tmp_path / "none.sock"))
    assert isinstance(e.value, (tpipd.NoListener, tpipd.NoDaemon))


def test_bad_listener_name(daemon):
    with tpipd.Context(daemon) as c:
        with pytest.raises(tpipd.InvalidArgument) as e:
            c.listen("bad name!")
        assert isinstance(e.value, ValueError)


def test_oversized_message_is_refused(pair):
    w, r, _, _ = pair
    with pytest.raises((tpipd.LimitExceeded, tpipd.InvalidArgument)):
        w.write(b"m" * (64 << 20))


def test_every_error_class_is_an_oserror_with_the_code():
    for name, err in [("PeerDied", 104), ("PipeClosed", 32), ("NoListener", 2),
                      ("Timeout", 110), ("AccessDenied", 13), ("Cancelled", 125),
                      ("Mismatch", 71), ("LimitExceeded", 105), ("InDoubt", 115),
                      ("NothingOutstanding", 42)]:
        e = getattr(tpipd, name)(err, "m")
        assert isinstance(e, tpipd.Error) and isinstance(e, OSError) and e.errno == err
    assert tpipd.strerror(104) == "peer died"


def test_admin_closing_the_session_raises_aborted(daemon, pair):
    ctl = os.environ.get("TPIPCTL_BIN")
    if not ctl:
        pytest.skip("TPIPCTL_BIN not set (run through meson test)")
    import json
    w, r, a, b = pair
    victim = tpipd.Context(daemon, name=f"victim.{os.getpid()}")
    lst = victim.listen(f"victim.{os.getpid()}")
    got = {}
    t = threading.Thread(target=lambda: got.update(p=lst.accept(10)))
    t.start()
    p = a.connect(f"victim.{os.getpid()}", timeout=10)
    t.join(10)
    sessions = json.loads(subprocess.run([ctl, "--socket", daemon, "--json", "sessions"],
                                         capture_output=True, text=True, check=True).stdout)
    sid = [s["id"] for s in sessions["sessions"] if s["name"] == f"victim.{os.getpid()}"][0]
    subprocess.run([ctl, "--socket", daemon, "close-session", str(sid)], check=True,
                   capture_output=True)
    with pytest.raises(tpipd.Aborted) as e:
        got["p"].read(timeout=10)
    assert isinstance(e.value, ConnectionAbortedError) and e.value.errno == 103
    with pytest.raises((tpipd.Aborted, tpipd.PipeClosed, tpipd.PeerDied)):
        p.read(timeout=10)  # the other end learns that its peer went
    victim.close()
