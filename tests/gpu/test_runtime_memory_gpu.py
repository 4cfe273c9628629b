"""The runtime layer on a real GPU: device and pinned memory, memset and the
copies between host and device and on the device, with and without a stream.

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
Marked ``gpu``: where no GPU is visible they skip (tests/conftest.py), except
under PYAR_REQUIRE_GPU=1, where that is a failure.
"""
import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from tests.gpu.random_data import assert_bitwise_equal, random_array
from tests.gpu.runtime_support import device_bytes

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.float64, np.int8, np.uint8, np.int16, np.uint16,
          np.int32, np.uint32, np.int64, np.uint64, np.bool_]
SIZES = [1, 7, 4095, (1 << 20) + 3]


@pytest.mark.parametrize("count", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_device_memory(dtype, count, rng):
    host = random_array(rng, dtype, (count,))
    mem = hip.DeviceMemory(host.nbytes)
    assert mem.size == host.nbytes
    assert hip.pointer_device(mem.ptr) == mem.device == hip.get_device()
    hip.memcpy_htod(mem.ptr, host)
    back = np.empty_like(host)
    hip.memcpy_dtoh(back, mem)  # an object with .ptr works as the address
    assert_bitwise_equal(back, host, f"{np.dtype(dtype).name}[{count}]")
    mem.free()
    mem.free()


@pytest.mark.parametrize("uncached", [False, True])
def test_device_memory_basics(uncached, rng):
    nbytes = int(rng.integers(1, 1 << 16)) * 16 + int(rng.integers(1, 16))
    mem = hip.DeviceMemory(nbytes, uncached=uncached)
    base, size = hip.address_range(mem.ptr)
    assert base == mem.ptr and size >= nbytes
    inner = mem.ptr + int(rng.integers(0, nbytes))
    assert hip.address_range(inner) == (base, size)
    host = random_array(rng, np.uint8, nbytes)
    hip.memcpy_htod(mem.ptr, host)
    assert_bitwise_equal(device_bytes(mem.ptr, nbytes), host)
    assert "bytes at" in repr(mem)
    with mem:
        pass
    assert mem.closed and "freed" in repr(mem)
    empty = hip.DeviceMemory(0)
    assert empty.ptr == 0 and empty.size == 0
    empty.free()
    with pytest.raises(ValueError):
        hip.DeviceMemory(-1)
    with pytest.raises(TypeError):
        hip.DeviceMemory(1.5)


def test_memset(rng):
    nbytes = int(rng.integers(10_000, 1 << 20))
    before = random_array(rng, np.uint8, nbytes)
    mem = hip.DeviceMemory(nbytes)
    stream = hip.Stream()
    expected = before.copy()
    hip.memcpy_htod(mem.ptr, before)
    for use_stream in (False, True, False, True):
        start = int(rng.integers(0, nbytes))
        length = int(rng.integers(0, nbytes - start + 1))
        value = int(rng.integers(0, 256))
        hip.memset(mem.ptr + start, value, length, stream=stream if use_stream else None)
        expected[start:start + length] = value
    stream.synchronize()
    hip.device_synchronize()
    assert_bitwise_equal(device_bytes(mem.ptr, nbytes), expected)
    for value in (-1, 256):
        with pytest.raises(ValueError):
            hip.memset(mem.ptr, value, 1)
    with pytest.raises(TypeError):
        hip.memset(mem.ptr, 1.0, 1)


def test_device_to_device_copies(rng):
    nbytes = int(rng.integers(100_000, 1 << 21))
    src_host = random_array(rng, np.uint8, nbytes)
    dst_host = random_array(rng, np.uint8, nbytes)
    src, dst = hip.DeviceMemory(nbytes), hip.DeviceMemory(nbytes)
    hip.memcpy_htod(src.ptr, src_host)
    hip.memcpy_htod(dst.ptr, dst_host)
    stream = hip.Stream()
    expected = dst_host.copy()
    for use_stream in (False, True, True, False):
        length = int(rng.integers(1, nbytes // 2))
        s = int(rng.integers(0, nbytes - length))
        d = int(rng.integers(0, nbytes - length))
        hip.memcpy_dtod(dst.ptr + d, src.ptr + s, length, stream=stream if use_stream else None)
        expected[d:d + length] = src_host[s:s + length]
        if use_stream:
            stream.synchronize()
    hip.memcpy_dtod(dst.ptr, src.ptr, 0)  # zero bytes: nothing happens
    assert_bitwise_equal(device_bytes(dst.ptr, nbytes), expected)
    # Whole buffer, then back to host through an async copy into pinned memory.
    hip.memcpy_dtod(dst, src, nbytes, stream=stream)
    pinned = hip.PinnedMemory(nbytes)
    view = np.frombuffer(pinned, np.uint8)
    view[:] = 0
    hip.memcpy_dtoh(view, dst.ptr, stream=stream)
    stream.synchronize()
    assert_bitwise_equal(view, src_host)


def test_pinned_memory(rng):
    nbytes = int(rng.integers(1, 1 << 16))
    pinned = hip.PinnedMemory(nbytes)
    assert pinned.size == nbytes and pinned.ptr != 0
    view = np.frombuffer(pinned, np.uint8)
    assert view.size == nbytes and view.flags.writeable
    data = random_array(rng, np.uint8, nbytes)
    view[:] = data
    assert bytes(memoryview(pinned)) == data.tobytes()
    with pytest.raises(BufferError):
        pinned.free()  # still viewed
    del view
    pinned.free()
    pinned.free()
    with pytest.raises(ValueError):
        memoryview(pinned)
