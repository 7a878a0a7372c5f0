# SPDX-License-Identifier: BSD-3-Clause
"""PipeSet.fanout and PipeSet.last_fanout (tp_set_set_fanout(), tp_set_last_fanout()) against
real daemons: the daemon's fan-out by default (one request in the daemon's counters), the
library's (one write per pipe, no request) when asked, the daemon's bcast-pipes-max just at and
just under the set's size, the daemon mode refused (NotSupported, nothing sent) where the daemon
cannot, and bad values refused. Each reader gets every broadcast byte-exact."""
import json
import os
import subprocess

import numpy as np
import pytest

import tpipd
from conftest import start_daemon

T = 10


def bcast_requests(sock):
    """The daemon's count of fan-out requests (tpipctl status --json)."""
    ctl = os.environ.get("TPIPCTL_BIN")
    if not ctl:
        pytest.skip("TPIPCTL_BIN not set (run through meson test)")
    out = subprocess.run([ctl, "--socket", sock, "--json", "status"], check=True,
                         capture_output=True, text=True, timeout=T).stdout
    return json.loads(out)["bcast_requests"]


@pytest.fixture(scope="module")
def small():
    """A second daemon that fans out to at most 3 pipes."""
    yield from start_daemon("--bcast-pipes-max", "3")


def server_set(sock, request, n, **kw):
    """(server context, client context, PipeSet of n accepted pipes, the clients' pipes)."""
    server, client = tpipd.Context(sock), tpipd.Context(sock)
    name = f"f.{request.node.name[:40]}.{os.getpid()}"
    lst = server.listen("".join(c if c.isalnum() or c in "._-" else "_" for c in name))
    futs = [lst.accept_async(T) for _ in range(n)]
    clients = [client.connect(lst.name, timeout=T) for _ in range(n)]
    s = tpipd.PipeSet(server, **kw)
    for f in futs:
        s.add(f.result(T))
    return server, client, s, clients


def send(s, clients, meta, x):
    """Broadcast ``x`` on @s; every client reads it byte-exact."""
    assert s.broadcast(meta, tensors=[x], timeout=T) == {k: None for k in range(len(clients))}
    for c in clients:
        m = c.read(timeout=T)
        assert m.metadata == meta and m.tensors[0].tobytes() == x.tobytes()


def test_broadcast_fans_out_in_the_daemon_by_default_and_in_the_library_when_asked(daemon,
                                                                                   request):
    server, client, s, clients = server_set(daemon, request, 3)
    with server, client, s:
        assert s.fanout == "auto" and s.last_fanout is None
        x = server.empty(1000, "float64")
        x[:] = np.arange(1000)
        n0 = bcast_requests(daemon)
        send(s, clients, b"auto", x)
        assert s.last_fanout == "daemon" and bcast_requests(daemon) == n0 + 1
        s.fanout = tpipd.Fanout.LIBRARY
        assert s.fanout == "library"
        send(s, clients, b"library", x * 2)  # private memory, one write per pipe
        send(s, clients, b"library", x)
        assert s.last_fanout == "library" and bcast_requests(daemon) == n0 + 1
        s.fanout = "daemon"
        send(s, clients, b"daemon", x)
        assert s.last_fanout == "daemon" and bcast_requests(daemon) == n0 + 2
    assert s.last_fanout is None
    with pytest.raises(tpipd.Closed):
        s.fanout = "auto"


def test_fanout_mode_given_at_creation(daemon, request):
    server, client, s, clients = server_set(daemon, request, 2, fanout="library")
    with server, client, s:
        assert s.fanout == "library"
        n0 = bcast_requests(daemon)
        send(s, clients, b"m", server.zeros(10, "int32"))
        assert s.last_fanout == "library" and bcast_requests(daemon) == n0


@pytest.mark.parametrize("n,want", [(3, "daemon"), (4, "library")])
def test_bcast_pipes_max_at_and_under_the_sets_size(small, request, n, want):
    server, client, s, clients = server_set(small, request, n)
    with server, client, s:
        x = server.empty((4, 256), "float32")
        x[...] = 7
        n0 = bcast_requests(small)
        send(s, clients, b"n", x)
        assert s.last_fanout == want
        assert bcast_requests(small) == n0 + (want == "daemon")


def test_daemon_mode_where_the_daemon_cannot_raises_and_sends_nothing(small, request):
    server, client, s, clients = server_set(small, request, 4, fanout=tpipd.Fanout.DAEMON)
    with server, client, s:
        x = server.empty(64, "uint8")
        with pytest.raises(tpipd.NotSupported):
            s.broadcast(b"no", tensors=[x], timeout=T)
        assert s.last_fanout is None
        with pytest.raises(tpipd.Timeout):
            clients[0].read(timeout=0.3)
        s.fanout = "auto"  # the same set then goes on, by the library
        send(s, clients, b"yes", x)
        assert s.last_fanout == "library"


def test_bad_fanout_values_are_refused(daemon, request):
    server, client, s, _ = server_set(daemon, request, 1)
    with server, client, s:
        with pytest.raises(ValueError):
            s.fanout = "sideways"
        with pytest.raises(ValueError):
            tpipd.PipeSet(server, fanout=2)
        with pytest.raises(tpipd.InvalidArgument):
            s._raw.fanout = 7
        with pytest.raises(tpipd.InvalidArgument):
            s._raw.fanout = -1
        with pytest.raises(TypeError):
            s._raw.fanout = "2"
        with pytest.raises(AttributeError):
            s._raw.last_fanout = 1
        assert s.fanout == "auto"
