# SPDX-License-Identifier: BSD-3-Clause
"""Pipes from Python: every dtype of numpy and torch arrives with its dtype, shape and kind;
non-contiguous input is refused unless made contiguous on request; 0-d and empty tensors;
destinations passed by the reader; shared-buffer arrays; futures and asyncio; the GIL is
released while a read blocks; the tensor header refuses hostile input; without numpy and torch
the module still moves bytes; a connect's expect_peer (TP_CONNECT_EXPECT_PEER) between two
daemons on loopback peer ports refuses a far daemon it does not name."""
import asyncio
import os
import struct
import threading
import time

import numpy as np
import pytest

import tpipd
from tpipd import _tensor

NP_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                "float32", "float64", "complex64", "complex128"]


def torch_or_skip():
    torch = _tensor.torch_module()
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_numpy_dtype_round_trips(pair, dtype):
    w, r, _, _ = pair
    x = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    w.write(b"m", (), [x])
    m = r.read()
    y = m.tensors[0]
    assert isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(x, y)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_dtype_round_trips(pair, dtype):
    torch = torch_or_skip()
    w, r, _, _ = pair
    x = (torch.arange(30) % 5).to(getattr(torch, dtype)).reshape(5, 6)
    w.write(b"", (), [x])
    y = r.read().tensors[0]
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(x, y)


def test_tensor_requiring_grad_is_sent(pair):
    torch = torch_or_skip()
    w, r, _, _ = pair
    x = torch.ones(3, requires_grad=True)
    w.write(b"", (), [x])
    assert torch.equal(r.read().tensors[0], torch.ones(3))


def test_non_contiguous_is_refused_with_a_clear_error(pair):
    w, r, _, _ = pair
    x = np.arange(12.0).reshape(3, 4).T
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous.*contiguous=True"):
        w.write(b"", (), [x])
    w.write(b"", (), [x], contiguous=True)
    assert np.array_equal(r.read().tensors[0], x)


def test_non_contiguous_torch_is_refused_or_copied(pair):
    torch = torch_or_skip()
    w, r, _, _ = pair
    x = torch.arange(12.0).reshape(3, 4)[:, ::2]
    with pytest.raises(tpipd.InvalidArgument, match="not contiguous"):
        w.write(b"", (), [x])
    w.write(b"", (), [x], contiguous=True)
    assert torch.equal(r.read().tensors[0], x)


def test_zero_d_and_empty_tensors(pair):
    w, r, _, _ = pair
    xs = [np.array(3.5), np.zeros((0,), np.int32), np.zeros((4, 0, 2), np.float64),
          np.float32(2.0)]
    w.write(b"", (), xs)
    ys = r.read().tensors
    assert [y.shape for y in ys] == [(), (0,), (4, 0, 2), ()]
    assert ys[0] == 3.5 and ys[3] == 2.0 and ys[3].dtype == np.float32


def test_zero_d_torch(pair):
    torch = torch_or_skip()
    w, r, _, _ = pair
    w.write(b"", (), [torch.tensor(7, dtype=torch.int64), torch.empty(0, 3)])
    a, b = r.read().tensors
    assert a.shape == () and a.item() == 7 and b.shape == (0, 3)


def test_metadata_and_payloads(pair):
    w, r, _, _ = pair
    # over the eager size: the write completes once the reader read it, so write_async
    f = w.write_async(b"\x00meta\xff", [b"abc", bytearray(b""), memoryview(b"x" * 100000)])
    m = r.read()
    assert f.result(10) is None
    assert m.metadata == b"\x00meta\xff"
    assert [bytes(p) for p in m.payloads] == [b"abc", b"", b"x" * 100000]
    assert m.tensors == []


def test_reader_destination_is_filled_in_place(pair):
    w, r, _, _ = pair
    x = np.arange(1 << 20, dtype=np.float32)
    dst = np.empty_like(x)
    w.write_async(b"", (), [x])
    m = r.read(tensors=[dst])
    assert m.tensors[0] is dst and np.array_equal(dst, x)


def test_reader_destination_must_match(pair):
    w, r, _, _ = pair
    w.write(b"", (), [np.zeros(4, np.float32)])
    with pytest.raises(tpipd.InvalidArgument, match="float32"):
        r.read(tensors=[np.zeros(4, np.float64)])


def test_shared_buffer_arrays_travel_and_outlive_their_context(daemon, pair):
    torch = _tensor.torch_module()
    w, r, a, b = pair
    x = a.zeros((256, 256), "float32")
    assert x.sum() == 0 and x.shape == (256, 256)
    x += 2
    f = w.write_async(b"", (), [x])
    y = r.read(shared=b).tensors[0]
    f.result(10)
    assert np.array_equal(y, x)
    c = tpipd.Context(daemon)
    z = c.empty(10, "int64")
    c.close()
    z[:] = 5  # the mapping lives as long as the array
    assert z.sum() == 50
    del z
    if torch is not None:
        t = tpipd.zeros((3, 3), "bfloat16", like="torch", context=a)
        t += 1
        w.write(b"", (), [t])
        assert torch.equal(r.read().tensors[0], t)


def test_write_async_and_read_async_keep_order(pair):
    w, r, _, _ = pair
    futs = [w.write_async(str(i).encode(), (), [np.full(1000, i)]) for i in range(20)]
    reads = [r.read_async() for _ in range(20)]
    for f in futs:
        assert f.result(10) is None
    for i, f in enumerate(reads):
        m = f.result(10)
        assert m.metadata == str(i).encode() and m.tensors[0][0] == i


def test_asyncio_awaitables(pair):
    w, r, _, _ = pair

    async def main():
        x = np.arange(10)
        await asyncio.gather(w.awrite(b"a", (), [x]))
        m = await r.aread()
        return m

    m = asyncio.run(main())
    assert m.metadata == b"a" and np.array_equal(m.tensors[0], np.arange(10))


def test_gil_is_released_while_a_read_blocks(pair):
    w, r, _, _ = pair
    got = {}
    t = threading.Thread(target=lambda: got.update(m=r.read(timeout=20)))
    t.start()
    n = 0
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # Python code keeps running meanwhile
        n += 1
    assert t.is_alive() and n > 10000
    w.write(b"done")
    t.join(10)
    assert got["m"].metadata == b"done"


def test_context_manager_closes(daemon):
    with tpipd.Context(daemon) as c:
        with c.listen("cm.x") as lst:
            assert lst.name == "cm.x"
    assert c.closed
    with pytest.raises(tpipd.Closed):
        c.listen("cm.y")


def header(kind=0, code=12, shape=(2,), flags=0, magic=b"TPT\x01", ndim=None):
    nd = len(shape) if ndim is None else ndim
    return magic + bytes((kind, code, nd, flags)) + struct.pack(f"<{len(shape)}Q", *shape)


@pytest.mark.parametrize("meta,length,why", [
    (b"", 0, "at least 8"),
    (header(magic=b"XXX\x01"), 8, "magic"),
    (header(magic=b"TPT\x02"), 8, "version"),
    (header(kind=2), 8, "kind"),
    (header(code=0), 8, "dtype"),
    (header(code=16), 8, "dtype"),
    (header(flags=1), 8, "flags"),
    (header(shape=(1,) * 33), 4, "dimensions"),
    (header(shape=(2,), ndim=3), 8, "bytes for"),
    (header(shape=(2,)) + b"x", 8, "bytes for"),
    (header(shape=(2,)), 4, "is not 4 bytes"),
    (header(shape=(2,)), 12, "is not"),
    (header(shape=((1 << 48) + 1,)), 8, "over"),
    (header(shape=(1 << 48, 1 << 48, 1 << 48)), 8, "is not"),
])
def test_header_refuses_hostile_input(meta, length, why):
    with pytest.raises(tpipd.ProtocolError, match=why):
        _tensor.unpack_header(meta, length)


def test_header_limits_just_below_and_above():
    assert _tensor.unpack_header(header(shape=(1,) * 32, code=3), 1)[2] == (1,) * 32
    with pytest.raises(tpipd.ProtocolError):
        _tensor.unpack_header(header(shape=(1,) * 33, code=3), 1)
    assert _tensor.unpack_header(header(shape=(1 << 48, 0)), 0)[2] == (1 << 48, 0)


def test_random_headers_raise_only_protocol_error():
    rnd = np.random.default_rng(1)
    for _ in range(3000):
        n = int(rnd.integers(0, 64))
        meta = bytes(rnd.integers(0, 256, n, dtype=np.uint8))
        if n >= 4 and rnd.integers(0, 2):
            meta = b"TPT\x01" + meta[4:]
        try:
            _tensor.unpack_header(meta, int(rnd.integers(0, 64)))
        except tpipd.ProtocolError:
            pass


def test_hostile_header_on_the_wire_raises_protocol_error(pair):
    w, r, _, _ = pair
    w._raw.write(b"", [], [(bytearray(8), header(shape=(3,)))])  # 3 floats are not 8 bytes
    with pytest.raises(tpipd.ProtocolError, match="not 8 bytes"):
        r.read()
    w.write(b"next", (), [np.ones(2)])  # the pipe is still usable
    assert r.read().metadata == b"next"


def test_cuda_tensors(pair):
    torch = torch_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False)")
    w, r, _, _ = pair
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    w.write(b"", (), [x])
    y = r.read().tensors[0]
    assert y.is_cuda and torch.equal(x, y)


NO_NUMPY_NO_TORCH = r'''
import sys
class Refuse:  # numpy and torch are not installed, as far as this process can tell
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numpy", "torch"):
            raise ImportError(f"No module named {name!r} (refused by the test)")
sys.meta_path.insert(0, Refuse())
import threading, tpipd
with tpipd.Context() as a, tpipd.Context() as b:
    lst = b.listen(sys.argv[1])
    fut = lst.accept_async(10)
    w = a.connect(sys.argv[1], timeout=10)
    r = fut.result(10)
    w.write(b"meta", payloads=[b"bytes", bytearray(3)])
    m = r.read(timeout=10)
    assert m.metadata == b"meta" and [bytes(p) for p in m.payloads] == [b"bytes", bytes(3)]
    ch = a.channel(sys.argv[1], create=True)
    ch.write(b"item")
    assert ch.read(timeout=10) == b"item"
    try:
        w.write(b"", tensors=[memoryview(b"x")])
    except ImportError as e:
        assert "tensors need numpy" in str(e), e
    else:
        raise AssertionError("a tensor without numpy was accepted")
assert "numpy" not in sys.modules and "torch" not in sys.modules
print("ok")
'''


def test_module_works_without_numpy_and_torch(daemon):
    """numpy and torch are optional at import time: pipes and channels move bytes without
    them; a tensor then raises an ImportError naming numpy."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", NO_NUMPY_NO_TORCH, f"nonp.{os.getpid()}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_cuda_release_follows_a_torch_views_base():
    """The daemon's mapping of a CUDA allocation is released when the tensor that owns the
    memory is garbage: for a view (a temporary slice written once), its base tensor."""
    torch = torch_or_skip()
    from tpipd import _cuda
    x = torch.zeros(10)
    assert _cuda.owner(x[2:5]) is x and _cuda.owner(x[2:5][1:]) is x and _cuda.owner(x) is x
    a = np.zeros(3)
    assert _cuda.owner(a) is a


def free_ports(n):
    """n distinct loopback ports, free a moment ago (all bound at once: one port closed before
    the next bind could come back as the next)."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def peered(tmp_path_factory):
    """(local socket, far peer port): two daemons on loopback peer ports sharing a pre-shared
    key, so each link authenticates as psk:tpipd; the far one has no listener."""
    import base64
    from conftest import start_daemon
    key = str(tmp_path_factory.mktemp("key") / "peer.key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, base64.b64encode(os.urandom(32)) + b"\n")
    os.close(fd)
    ports = free_ports(2)
    gens = [start_daemon("--peer-listen", f"127.0.0.1:{p}", "--peer-key-file", key,
                         "--peer-force-cross-host") for p in ports]
    socks = [next(g) for g in gens]
    yield socks[0], ports[1]
    for g in gens:
        next(g, None)


def test_connect_expect_peer_refuses_a_daemon_it_does_not_name(peered):
    """expect_peer (TP_CONNECT_EXPECT_PEER): the far daemon authenticated as psk:tpipd is not
    cert:far.example, so the connect is refused with AccessDenied naming what was found; with
    "psk" or "any-peer" the check passes and the connect reaches the far daemon, which has no
    such listener (NoListener)."""
    sock, port = peered
    with tpipd.Context(sock) as ctx:
        addr = f"tpip://127.0.0.1:{port}/nobody.here"
        with pytest.raises(tpipd.AccessDenied, match="psk"):
            ctx.connect(addr, expect_peer=["cert:far.example"])
        for allowed in (["psk"], ["cert:far.example", "psk"], "any-peer"):
            with pytest.raises(tpipd.NoListener):
                ctx.connect(addr, expect_peer=allowed)
        with pytest.raises(tpipd.NoListener):
            ctx.connect(addr)


def test_connect_expect_peer_arguments(daemon):
    """expect_peer takes None, "any-peer" or 1..32 identities (as str), and only a tpip://
    address: anything else is refused before the daemon sees it."""
    with tpipd.Context(daemon) as ctx:
        for bad in ("none", "psk", [], ["p%d" % i for i in range(33)]):
            with pytest.raises(ValueError):
                ctx.connect("tpip://127.0.0.1:1/x", expect_peer=bad)
        with pytest.raises(TypeError):
            ctx.connect("tpip://127.0.0.1:1/x", expect_peer=[1])
        with pytest.raises(tpipd.InvalidArgument, match="tpip://"):
            ctx.connect("local.name", expect_peer="any-peer")
