# SPDX-License-Identifier: BSD-3-Clause
"""pytest fixtures of the python suite: one private tpipd per test session on a temporary
socket (loopback only: --peer-listen off), stopped at the end; TPIPD_SOCKET points at it so
subprocesses (group members) find it too. Not responsible for the tests themselves."""
import os
import shutil
import subprocess
import tempfile
import time

import pytest


def start_daemon(*args):
    """A private tpipd with ``args`` added to its command line: a generator yielding its
    socket path, then stopping it (use with a fixture's ``yield from``)."""
    binary = os.environ.get("TPIPD_BIN")
    if not binary:
        pytest.skip("TPIPD_BIN not set (run through meson test)")
    tmp = tempfile.mkdtemp(prefix="tpy.")
    sock = os.path.join(tmp, "tpipd.sock")
    log = open(os.path.join(tmp, "tpipd.log"), "w")
    proc = subprocess.Popen([binary, "--socket", sock, "--peer-listen", "off", *args],
                            stderr=log)
    import tpipd
    deadline = time.monotonic() + 10
    while True:  # bounded wait for the daemon to answer
        try:
            tpipd.Context(sock).close()
            break
        except tpipd.Error:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tpipd did not start: {open(log.name).read()[-2000:]}")
            time.sleep(0.02)
    yield sock
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    if proc.returncode != 0:
        print(open(log.name).read()[-4000:])
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    gen = start_daemon()
    sock = next(gen)
    os.environ["TPIPD_SOCKET"] = sock
    yield sock
    next(gen, None)


@pytest.fixture
def pair(daemon, request):
    """(writer pipe, reader pipe, writer context, reader context) over a fresh listener."""
    import tpipd
    a = tpipd.Context(daemon)
    b = tpipd.Context(daemon)
    name = f"t.{request.node.name[:60]}.{os.getpid()}".replace("[", ".").replace("]", "")
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    lst = b.listen(name)
    fut = lst.accept_async(10)
    w = a.connect(name, timeout=10)
    yield w, fut.result(10), a, b
    a.close()
    b.close()
