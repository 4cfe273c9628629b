"""CuPy and PyTorch arrays in and out of pyar, zero-copy, through DLPack and
the CUDA array interface; and stream ordering across the boundary: a
producer's writes queued behind a long delay on its own stream must be seen
by a consumer reading right away on another stream.
"""
import gc
import os

import ml_dtypes
import numpy as np
import pytest

import pyar
import pyar._hip as hip
from tests.gpu.random_data import assert_bitwise_equal

pytestmark = pytest.mark.gpu

REQUIRE_GPU = os.environ.get("PYAR_REQUIRE_GPU") == "1"
DELAY_US = 50_000  # the producer's head start of pending work: 50 ms

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.uint8]
CUPY_DTYPES = [np.float32, np.float16, np.int32, np.uint8]  # CuPy has no bfloat16


def dtype_id(dtype):
    return np.dtype(dtype).name


def optional_import(name):
    """The module, or a skip; on the GPU runner (PYAR_REQUIRE_GPU=1) nothing
    skips, so a missing module fails the test there."""
    if REQUIRE_GPU:
        return __import__(name)
    return pytest.importorskip(name)


@pytest.fixture(scope="module")
def cupy():
    return optional_import("cupy")


@pytest.fixture(scope="module")
def torch():
    torch = optional_import("torch")
    if not torch.cuda.is_available():
        if REQUIRE_GPU:
            pytest.fail("torch.cuda.is_available() is False on the GPU runner")
        pytest.skip("PyTorch without CUDA")
    return torch


def random_values(rng, dtype, n):
    """Finite random values (float payloads stay ordinary numbers)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return (rng.standard_normal(n) * 100).astype(dtype)


def torch_dtype(torch, dtype):
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
            np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.int32): torch.int32,
            np.dtype(np.uint8): torch.uint8}[np.dtype(dtype)]


def torch_from_host(torch, host):
    if host.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(host.view(np.int16).copy()).cuda().view(torch.bfloat16)
    return torch.from_numpy(host.copy()).cuda()


def torch_to_host(torch, tensor):
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return tensor.cpu().numpy()


def device_bytes(ptr, nbytes):
    out = np.empty(nbytes, np.uint8)
    hip.memcpy_dtoh(out, ptr)
    return out


class InterfaceOnly:
    """Shows only another object's __cuda_array_interface__ (no DLPack)."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def __cuda_array_interface__(self):
        return self.inner.__cuda_array_interface__


def write_through_pyar(kernels, x, rng):
    """memset all of x's bytes to one value, then a kernel writes a 32-bit
    pattern over the whole words; returns the bytes x must hold afterwards."""
    value = int(rng.integers(0, 256))
    pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
    words = x.nbytes // 4
    stream = hip.Stream()
    hip.memset(x.ptr, value, x.nbytes, stream=stream)
    kernels.fill_u32(x.ptr, pattern, words, stream=stream)
    stream.synchronize()
    expected = np.full(x.nbytes, value, np.uint8)
    expected[:words * 4] = np.full(words, pattern, np.uint32).view(np.uint8)
    return expected


# --- CuPy and PyTorch arrays into pyar ------------------------------------------------

@pytest.mark.parametrize("via", ["dlpack", "interface"])
@pytest.mark.parametrize("dtype", CUPY_DTYPES, ids=dtype_id)
def test_cupy_into_pyar(dtype, via, cupy, rng, kernels):
    n = int(rng.integers(1, 100_000))
    host = random_values(rng, dtype, n).reshape(1, n)
    c = cupy.asarray(host)
    cupy.cuda.Device().synchronize()
    x = pyar.asarray(c if via == "dlpack" else InterfaceOnly(c))
    assert x.ptr == c.data.ptr, "not zero-copy"
    assert x.shape == (1, n) and x.dtype == np.dtype(dtype)
    assert x.device == c.device.id
    assert_bitwise_equal(x.get(), host)
    expected = write_through_pyar(kernels, x, rng)
    assert_bitwise_equal(cupy.asnumpy(c).reshape(-1).view(np.uint8), expected, "CuPy sees")
    # The view keeps CuPy's memory: a new CuPy array does not land on it.
    nbytes = c.nbytes
    del c
    gc.collect()
    other = cupy.full(nbytes, 0x5A, cupy.uint8)  # the pool's block of c's size, if free
    cupy.cuda.Device().synchronize()
    assert_bitwise_equal(x.get().reshape(-1).view(np.uint8), expected, "after del")
    del other


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_torch_into_pyar(dtype, torch, rng, kernels):
    n = int(rng.integers(1, 100_000))
    host = random_values(rng, dtype, n)
    t = torch_from_host(torch, host)
    torch.cuda.synchronize()
    x = pyar.asarray(t)
    assert x.ptr == t.data_ptr(), "not zero-copy"
    assert x.shape == (n,) and x.dtype == np.dtype(dtype)
    assert x.device == t.device.index
    assert_bitwise_equal(x.get(), host)
    expected = write_through_pyar(kernels, x, rng)
    assert_bitwise_equal(torch_to_host(torch, t).view(np.uint8), expected, "PyTorch sees")
    nbytes = t.nbytes
    del t
    gc.collect()
    # The caching allocator would hand t's block to the next tensor of its
    # size if the view had not kept it.
    reuse = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    assert_bitwise_equal(x.get().view(np.uint8), expected, "after del")
    del reuse


def test_strided_producers_are_refused(cupy, torch):
    c = cupy.zeros((8, 8), cupy.float32)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        pyar.asarray(c)
    t = torch.zeros((8, 8), device="cuda").t()
    with pytest.raises(ValueError, match="contiguous"):
        pyar.asarray(t)


# --- pyar arrays into CuPy and PyTorch ------------------------------------------------

@pytest.mark.parametrize("dtype", CUPY_DTYPES, ids=dtype_id)
def test_pyar_into_cupy(dtype, cupy, rng):
    n = int(rng.integers(1, 100_000))
    host = random_values(rng, dtype, n).reshape(n, 1)
    x = pyar.asarray(host)
    by_interface = cupy.asarray(x)
    by_dlpack = cupy.from_dlpack(x)
    for c, how in ((by_interface, "interface"), (by_dlpack, "dlpack")):
        assert c.data.ptr == x.ptr, f"{how}: not zero-copy"
        assert c.shape == (n, 1) and c.dtype == np.dtype(dtype), how
        assert_bitwise_equal(cupy.asnumpy(c), host, how)
    fresh = random_values(rng, dtype, n).reshape(n, 1)
    by_dlpack[...] = cupy.asarray(fresh)
    cupy.cuda.Device().synchronize()
    assert_bitwise_equal(x.get(), fresh, "pyar sees CuPy's write")
    del x
    gc.collect()
    assert_bitwise_equal(cupy.asnumpy(by_dlpack), fresh, "after del")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_pyar_into_torch(dtype, torch, rng):
    n = int(rng.integers(1, 50_000))
    host = random_values(rng, dtype, 2 * n).reshape(2, n)
    x = pyar.asarray(host)
    t = torch.from_dlpack(x)
    assert t.data_ptr() == x.ptr, "DLPack: not zero-copy"
    assert t.dtype == torch_dtype(torch, dtype) and tuple(t.shape) == host.shape
    assert t.device.type == "cuda" and t.device.index == x.device
    assert_bitwise_equal(torch_to_host(torch, t), host, "DLPack")
    if np.dtype(dtype) != ml_dtypes.bfloat16:  # the interface has no bfloat16 typestr
        t2 = torch.as_tensor(x, device="cuda")
        assert t2.data_ptr() == x.ptr, "interface: not zero-copy"
        assert t2.dtype == torch_dtype(torch, dtype)
        assert_bitwise_equal(torch_to_host(torch, t2), host, "interface")
    fresh = random_values(rng, dtype, host.size).reshape(host.shape)
    t.copy_(torch_from_host(torch, fresh))
    torch.cuda.synchronize()
    assert_bitwise_equal(x.get(), fresh, "pyar sees PyTorch's write")
    del x
    gc.collect()
    assert_bitwise_equal(torch_to_host(torch, t), fresh, "after del")


def test_pyar_float8_into_torch(torch, rng):
    """float8 through DLPack 1.1 type codes, where PyTorch reads them."""
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if not hasattr(torch, name):
            continue
        host = rng.integers(0, 256, 999, dtype=np.uint8).view(getattr(ml_dtypes, name))
        x = pyar.asarray(host)
        try:
            t = torch.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError) as error:
            pytest.skip(f"this PyTorch does not import {name} through DLPack: {error}")
        assert t.dtype == getattr(torch, name) and t.data_ptr() == x.ptr
        back = t.view(torch.uint8).cpu().numpy()
        assert_bitwise_equal(back, host.view(np.uint8), name)


# --- stream ordering -------------------------------------------------------------------

def ordering_cases():
    for dtype in DTYPES:
        for consumer in ("torch-dlpack", "cupy-dlpack", "cupy-interface"):
            if consumer.startswith("cupy") and np.dtype(dtype) == ml_dtypes.bfloat16:
                continue
            yield pytest.param(dtype, consumer, id=f"{dtype_id(dtype)}-{consumer}")


@pytest.mark.parametrize("dtype,consumer", list(ordering_cases()))
def test_pyar_producer_orders_foreign_consumer(dtype, consumer, rng, kernels, request):
    """pyar array on stream P: (50 ms delay) then a kernel writes it.  The
    consumer takes it at once on its own stream C and copies it there; the
    copy must hold the written data, so the export made C wait for P."""
    n = 4 * int(rng.integers(1000, 50_000))  # whole 32-bit words
    producer = hip.Stream()
    x = pyar.zeros(n, dtype, stream=producer)
    producer.synchronize()
    pattern = int(rng.integers(1, 2**32, dtype=np.uint64))
    expected = np.full(x.nbytes // 4, pattern, np.uint32).view(np.uint8)
    kernels.spin(DELAY_US, stream=producer)
    kernels.fill_u32(x.ptr, pattern, x.nbytes // 4, stream=producer)
    if consumer == "torch-dlpack":
        torch = request.getfixturevalue("torch")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.from_dlpack(x)
            copy = t.clone()
        side.synchronize()
        assert t.data_ptr() == x.ptr
        got = torch_to_host(torch, copy).view(np.uint8)
    else:
        cupy = request.getfixturevalue("cupy")
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            c = cupy.from_dlpack(x) if consumer == "cupy-dlpack" else cupy.asarray(x)
            copy = c.copy()
        side.synchronize()
        assert c.data.ptr == x.ptr
        got = cupy.asnumpy(copy).view(np.uint8)
    stale = np.count_nonzero(got != expected)
    assert stale == 0, f"{stale} of {got.size} bytes read before the producer wrote them"
    producer.synchronize()


def foreign_producer_cases():
    for dtype in DTYPES:
        for producer in ("torch", "cupy"):
            if producer == "cupy" and np.dtype(dtype) == ml_dtypes.bfloat16:
                continue
            yield pytest.param(dtype, producer, id=f"{dtype_id(dtype)}-{producer}")


@pytest.mark.parametrize("dtype,producer", list(foreign_producer_cases()))
def test_foreign_producer_orders_pyar_consumer(dtype, producer, rng, kernels, request):
    """The producer's array is written on its current stream behind a 50 ms
    delay; pyar.asarray(..., stream=S) must make S wait for it, so a copy on S
    right away reads the new data."""
    n = int(rng.integers(1000, 100_000))
    host = random_values(rng, dtype, n)
    consumer = hip.Stream()
    if producer == "torch":
        torch = request.getfixturevalue("torch")
        target = torch.zeros(n, dtype=torch_dtype(torch, dtype), device="cuda")
        source = torch_from_host(torch, host)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            kernels.spin(DELAY_US, stream=side.cuda_stream)
            target.copy_(source)
            x = pyar.asarray(target, stream=consumer)
        ptr = target.data_ptr()
    else:
        cupy = request.getfixturevalue("cupy")
        target = cupy.zeros(n, dtype)
        source = cupy.asarray(host)
        cupy.cuda.Device().synchronize()
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            kernels.spin(DELAY_US, stream=side.ptr)
            target[...] = source
            x = pyar.asarray(target, stream=consumer)
        ptr = target.data.ptr
    assert x.ptr == ptr and x.stream == consumer
    got = x.get()  # queued on the consumer stream, then waited for
    assert_bitwise_equal(got, host, f"{producer} -> pyar on another stream")
    side.synchronize()


@pytest.mark.parametrize("producer", ["cupy", "torch"])
@pytest.mark.parametrize("ordered", [True, False], ids=["checked", "control-without-stream"])
def test_collective_orders_a_foreign_producer_before_its_stream(producer, ordered, rng, kernels,
                                                                request, monkeypatch):
    """``comm.allreduce(x, out=y, stream=S)`` in a world of one (a copy on
    S), x and y CuPy or PyTorch arrays whose library works on its stream P:
    behind a 50 ms delay on P, x is written and y copied to z.  The call's
    checks view x and y for S, so the copy on S waits for P: y gets the new
    x and z the old y.  The control views them for no stream (the legacy
    default, which S does not wait for): the copy runs at once, and y and z
    both miss their values."""
    from mpi4py import MPI
    from pyar.comm import arguments
    if not ordered:
        view = arguments.asarray
        monkeypatch.setattr(arguments, "asarray", lambda obj, stream=None: view(obj))
    n = 1 << 16
    new = rng.standard_normal(n).astype(np.float32)
    old = rng.standard_normal(n).astype(np.float32)
    call_stream = hip.Stream()
    with pyar.Communicator(MPI.COMM_WORLD) as comm:
        if comm.world != 1:
            pytest.skip("this process is one of several MPI ranks")
        if producer == "cupy":
            cupy = request.getfixturevalue("cupy")
            x, source, y = cupy.zeros(n, cupy.float32), cupy.asarray(new), cupy.asarray(old)
            z = cupy.zeros_like(y)
            cupy.cuda.Device().synchronize()
            side = cupy.cuda.Stream(non_blocking=True)
            with side:
                kernels.spin(DELAY_US, stream=side.ptr)
                x[...] = source
                z[...] = y
                comm.allreduce(x, out=y, stream=call_stream)
            to_host = cupy.asnumpy
        else:
            torch = request.getfixturevalue("torch")
            x, source, y = (torch.zeros(n, device="cuda"), torch_from_host(torch, new),
                            torch_from_host(torch, old))
            z = torch.zeros_like(y)
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                kernels.spin(DELAY_US, stream=side.cuda_stream)
                x.copy_(source)
                z.copy_(y)
                comm.allreduce(x, out=y, stream=call_stream)
            to_host = lambda t: torch_to_host(torch, t)
        call_stream.synchronize()
        side.synchronize()
        got_y, got_z = to_host(y), to_host(z)
    if ordered:
        assert_bitwise_equal(got_y, new, f"{producer} input written before the call")
        assert_bitwise_equal(got_z, old, f"{producer} output read before the call")
    else:
        assert not np.array_equal(got_y, new) and not np.array_equal(got_z, old), \
            "the control ordered the call after the producer: the test cannot fail"
