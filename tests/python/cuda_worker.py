# SPDX-License-Identifier: BSD-3-Clause
"""The reading process of test_cuda.py: listens on the name given, then for each control
message reads the next message as it says and answers with what it received (metadata: a JSON
list of the received objects' kinds; payloads: their bytes, copied back to the host with
cuMemcpyDtoH for device objects). Modes: "alloc" (cuda_alloc= makes CaiArray objects), "raw"
(cuda_alloc= wraps raw device memory in tpipd.CudaArray, whose DLPack capsule is checked),
"dest" (destinations given: a DLArray, a CaiArray, None), "host" (no cuda_alloc: host memory),
"drop" (drop what it still holds and collect garbage), "end". Not a test by itself."""
import gc
import json
import sys

import cudev
import tpipd


def kind(o):
    return type(o).__name__


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def host_bytes(o):
    if isinstance(o, (cudev.CaiArray, cudev.DLArray)):
        return o.to_host()
    if isinstance(o, tpipd.CudaArray):
        return cudev.Driver(0).dtoh(o.ptr, o.nbytes)
    return o.tobytes()


def main():
    sock, name = sys.argv[1], sys.argv[2]
    drv = cudev.Driver(0)
    ctx = tpipd.Context(sock)
    lst = ctx.listen(name)
    print("ready", flush=True)
    pipe = lst.accept(timeout=30)
    held = []
    while True:
        mode = pipe.read(timeout=60).metadata.decode()
        if mode == "end":
            break
        if mode == "drop":
            held.clear()
            gc.collect()
            pipe.write(b"dropped")
            continue
        if mode == "alloc":
            msg = pipe.read(timeout=60, cuda_alloc=lambda shape, dtype, dev:
                            cudev.CaiArray(drv, shape, dtype))
        elif mode == "raw":  # raw device memory wrapped by tpipd.CudaArray
            def raw(shape, dtype, dev):
                mem = cudev.DevAlloc(drv, cudev.ITEMSIZE[dtype] * max(1, _prod(shape)))
                return tpipd.CudaArray(mem.ptr, shape, dtype, dev, owner=mem)
            msg = pipe.read(timeout=60, cuda_alloc=raw)
            for t in msg.tensors:
                if isinstance(t, tpipd.CudaArray):
                    ptr, dev, shape, _ = cudev.dlpack_info(t)
                    assert (ptr, dev, shape) == (t.ptr, (2, 0), t.shape), (ptr, dev, shape)
                    assert t.__cuda_array_interface__["data"][0] == t.ptr
        elif mode == "dest":
            dst = [cudev.DLArray(drv, (1000,), "float32"), cudev.CaiArray(drv, (3, 5), "int16"),
                   None]
            msg = pipe.read(dst, timeout=60)
            assert msg.tensors[0] is dst[0] and msg.tensors[1] is dst[1]
            assert dst[0].streams == [1], dst[0].streams  # DLPack: the legacy default stream
        else:
            msg = pipe.read(timeout=60)
        held.append(msg)
        pipe.write(json.dumps([kind(t) for t in msg.tensors]).encode(),
                   payloads=[host_bytes(t) for t in msg.tensors])
        msg = dst = None  # held alone keeps them
    ctx.close()


if __name__ == "__main__":
    main()
