# SPDX-License-Identifier: BSD-3-Clause
"""sd_notify protocol of tpipd, checked without systemd: this script plays the service manager.

It binds a datagram socket, starts tpipd with NOTIFY_SOCKET pointing at it and a 400 ms watchdog
(WATCHDOG_USEC, no WATCHDOG_PID), and checks: READY=1 with a STATUS= naming the control socket;
at least two WATCHDOG=1 within 2 s; SIGHUP gives RELOADING=1 and then READY=1; SIGTERM gives
STOPPING=1 and exit status 0. Run by notify.sh; exits 0 pass, 1 fail, 77 skip.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NAME = "notify"


def say(msg):
    print(f"{NAME}: {msg}", flush=True)


class Fail(Exception):
    pass


class Manager:
    """The notify socket: receives datagrams and remembers them with their arrival time."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.seen = []  # (monotonic time, {key: value}, raw text)

    def recv(self, timeout):
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return None
        text = data.decode(errors="replace")
        fields = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
        self.seen.append((time.monotonic(), fields, text))
        return fields

    def expect(self, what, pred, timeout):
        """Reads datagrams until one satisfies @pred; returns it. Raises Fail at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail(f"no {what} within {timeout} s")
            msg = self.recv(left)
            if msg is not None and pred(msg):
                return msg


def check(msg):
    say(f"check: {msg}")


def run(tmp, tpipd):
    sock_path = os.path.join(tmp, "s.sock")
    log_path = os.path.join(tmp, "tpipd.log")
    conf = os.path.join(tmp, "tpipd.conf")
    open(conf, "w").close()
    mgr = Manager(os.path.join(tmp, "notify"))

    env = dict(os.environ)
    for k in ("WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "JOURNAL_STREAM"):
        env.pop(k, None)
    env["NOTIFY_SOCKET"] = os.path.join(tmp, "notify")
    env["WATCHDOG_USEC"] = "400000"
    say(f"starting {tpipd} --socket {sock_path} with NOTIFY_SOCKET and WATCHDOG_USEC=400000")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([tpipd, "--socket", sock_path, "--config", conf,
                                 "--peer-listen", "off"],
                                env=env, stderr=log, stdin=subprocess.DEVNULL)
    try:
        steps(mgr, proc, sock_path, log_path)
    except Fail:
        with open(log_path) as f:
            sys.stderr.write("---- tpipd log ----\n" + f.read())
        sys.stderr.write("---- datagrams ----\n")
        for t, _, text in mgr.seen:
            sys.stderr.write(f"{t:.3f} {text!r}\n")
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def steps(mgr, proc, sock_path, log_path):
    check("READY=1 arrives with STATUS= naming the socket")
    ready = mgr.expect("READY=1", lambda m: m.get("READY") == "1", 10)
    status = ready.get("STATUS", "")
    if sock_path not in status:
        raise Fail(f"READY=1 came with STATUS={status!r}, which does not name {sock_path}")
    say(f"  STATUS={status}")

    check("WATCHDOG=1 at least twice within 2 s")
    t0, n = time.monotonic(), 0
    while n < 2 and time.monotonic() - t0 < 2.0:
        m = mgr.recv(2.0 - (time.monotonic() - t0))
        if m is not None and m.get("WATCHDOG") == "1":
            n += 1
    if n < 2:
        raise Fail(f"{n} WATCHDOG=1 in 2 s with WATCHDOG_USEC=400000")
    say(f"  {n} pings after {time.monotonic() - t0:.2f} s")
    with open(log_path) as f:
        if "watchdog on" not in f.read():
            raise Fail("the ready line of the log does not say 'watchdog on'")

    check("SIGHUP: RELOADING=1, then READY=1")
    proc.send_signal(signal.SIGHUP)
    mgr.expect("RELOADING=1", lambda m: m.get("RELOADING") == "1", 5)
    mgr.expect("READY=1 after RELOADING=1", lambda m: m.get("READY") == "1", 5)
    if proc.poll() is not None:
        raise Fail(f"tpipd exited with {proc.returncode} after SIGHUP")

    check("SIGTERM: STOPPING=1, then exit status 0")
    proc.send_signal(signal.SIGTERM)
    mgr.expect("STOPPING=1", lambda m: m.get("STOPPING") == "1", 5)
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        raise Fail("tpipd did not exit within 10 s of SIGTERM")
    if rc != 0:
        raise Fail(f"tpipd exited with status {rc}")
    if os.path.exists(sock_path):
        raise Fail(f"{sock_path} was not removed at stop")


def main():
    tpipd = os.environ.get("TPIPD_BIN")
    if not tpipd:
        say("FAIL: TPIPD_BIN is not set (run through meson test)")
        return 1
    # meson's timeout sends SIGTERM: unwind so that the daemon is killed and tmp removed.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(1))
    tmp = tempfile.mkdtemp(prefix="tpsvc.")
    try:
        run(tmp, tpipd)
    except Fail as e:
        say(f"FAIL: {e}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
