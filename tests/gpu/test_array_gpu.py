"""pyar.DeviceArray on a real GPU: host round trips of every dtype, the
constructors, views, the exports (CUDA array interface, DLPack) read back by
pyar itself, and stream ordering of get/set.  Interop with CuPy and PyTorch
is in test_interop_gpu.py.
"""
import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import pyar
import pyar._hip as hip
from tests.gpu.random_data import assert_bitwise_equal, random_array

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.float64, np.int8, np.uint8, np.int16, np.uint16,
          np.int32, np.uint32, np.int64, np.uint64, np.bool_]
SIZES = [1, 7, 4095, (1 << 20) + 3]


def raw_bytes(ptr, nbytes):
    out = np.empty(nbytes, np.uint8)
    hip.memcpy_dtoh(out, ptr)
    return out


# --- round trips ------------------------------------------------------------------

@pytest.mark.parametrize("count", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_asarray(dtype, count, rng):
    host = random_array(rng, dtype, (count,))
    x = pyar.asarray(host)
    assert isinstance(x, pyar.DeviceArray)
    assert x.shape == (count,) and x.dtype == np.dtype(dtype)
    assert x.size == count and x.nbytes == host.nbytes and x.ndim == 1 and len(x) == count
    assert x.ptr != 0 and hip.pointer_device(x.ptr) == x.device == hip.get_device()
    assert not x.readonly
    assert_bitwise_equal(x.get(), host, "get()")
    assert_bitwise_equal(np.asarray(x), host, "np.asarray")
    # The device holds the bytes themselves, not a converted form.
    assert_bitwise_equal(raw_bytes(x.ptr, host.nbytes), host.view(np.uint8), "device bytes")


@pytest.mark.parametrize("count", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2,
                                   np.int64, np.uint8], ids=lambda d: np.dtype(d).name)
def test_round_trip_set_on_stream(dtype, count, rng):
    stream = hip.Stream()
    host = random_array(rng, dtype, (count,))
    x = pyar.empty(count, dtype, stream=stream)
    assert x.stream == stream
    x.set(host)
    stream.synchronize()
    assert_bitwise_equal(x.get(), host)
    other = random_array(rng, dtype, (count,))
    x.set(other, stream=hip.Stream.null())
    assert_bitwise_equal(x.get(stream=hip.Stream.null()), other)


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 1), (4096, 3), (2, 1, 1, 9)])
def test_multidimensional(shape, rng):
    host = random_array(rng, np.float32, shape)
    x = pyar.asarray(host)
    assert x.shape == shape and x.ndim == len(shape) and x.size == host.size
    assert_bitwise_equal(x.get(), host)
    flat = x.reshape(-1)
    assert flat.shape == (host.size,) and flat.ptr == x.ptr
    assert_bitwise_equal(flat.get(), host.reshape(-1))
    back = flat.reshape(shape)
    assert_bitwise_equal(back.get(), host)
    assert_bitwise_equal(x.ravel().get(), host.reshape(-1))


def test_asarray_converts_and_copies_host_data(rng):
    host = rng.standard_normal((33, 17))
    x = pyar.asarray(host, dtype=np.float32)
    assert x.dtype == np.float32
    assert_bitwise_equal(x.get(), host.astype(np.float32))
    strided = host[::2, 1::3]  # not contiguous
    y = pyar.asarray(strided)
    assert y.shape == strided.shape
    assert_bitwise_equal(y.get(), np.ascontiguousarray(strided))
    lists = pyar.asarray([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    assert_bitwise_equal(lists.get(), np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    # Later host changes do not reach the device copy.
    host32 = rng.integers(0, 1000, 100).astype(np.int32)
    z = pyar.asarray(host32)
    expected = host32.copy()
    host32[:] = -1
    assert_bitwise_equal(z.get(), expected)
    with pytest.raises(TypeError):
        pyar.asarray(np.zeros(4, np.dtype(">f4")))  # non-native byte order


def test_asarray_of_device_array_is_identity(rng):
    x = pyar.asarray(random_array(rng, np.int32, (100,)))
    assert pyar.asarray(x) is x
    with pytest.raises(TypeError):
        pyar.asarray(x, dtype=np.float32)


# --- constructors ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_zeros_and_like(dtype, rng):
    shape = (int(rng.integers(1, 50)), int(rng.integers(1, 50)))
    # Leave garbage in the allocator's way so zeros() has something to clear.
    junk = pyar.asarray(random_array(rng, np.uint8, (shape[0] * shape[1] * 8,)))
    del junk
    z = pyar.zeros(shape, dtype)
    assert z.shape == shape and z.dtype == np.dtype(dtype)
    assert not raw_bytes(z.ptr, z.nbytes).any()
    host = random_array(rng, dtype, shape)
    x = pyar.asarray(host)
    e = pyar.empty_like(x)
    assert e.shape == x.shape and e.dtype == x.dtype and e.ptr != x.ptr
    zl = pyar.zeros_like(x)
    assert zl.shape == x.shape and zl.dtype == x.dtype
    assert not raw_bytes(zl.ptr, zl.nbytes).any()
    as_u8 = pyar.zeros_like(host, dtype=np.uint8)  # numpy input, dtype override
    assert as_u8.shape == shape and as_u8.dtype == np.uint8
    assert not as_u8.get().any()
    e2 = pyar.empty(shape, dtype)
    assert e2.shape == shape and e2.nbytes == host.nbytes


def test_empty_arrays():
    for shape in [(0,), (3, 0), ()]:
        x = pyar.zeros(shape, np.float32)
        assert x.shape == shape
        got = x.get()
        assert got.shape == shape
        if shape == ():
            assert x.size == 1 and got == 0
        else:
            assert x.size == 0 and x.nbytes == 0
    with pytest.raises(ValueError):
        pyar.empty((-1,), np.float32)
    with pytest.raises(TypeError):
        pyar.empty(4, np.complex256 if hasattr(np, "complex256") else object)


def test_constructors_take_the_stream(rng, kernels):
    stream = hip.Stream()
    kernels.spin(20_000, stream=stream)
    n = int(rng.integers(10_000, 100_000))
    z = pyar.zeros(n, np.uint32, stream=stream)  # queued after the spin
    assert z.stream == stream
    kernels.fill_u32(z.ptr, 0xA5A5A5A5, n // 2, stream=stream)
    got = z.get()  # on z's stream: after the fill
    assert np.all(got[:n // 2] == 0xA5A5A5A5) and not got[n // 2:].any()
    like = pyar.empty_like(z)
    assert like.stream == stream and like.device == z.device


# --- copies and views --------------------------------------------------------------------

def test_copy_is_independent(rng):
    host = random_array(rng, np.float16, (int(rng.integers(1000, 100_000)),))
    x = pyar.asarray(host)
    y = x.copy()
    assert y.ptr != x.ptr and y.shape == x.shape and y.dtype == x.dtype
    hip.memset(x.ptr, 0x7F, x.nbytes)
    assert_bitwise_equal(y.get(), host)
    assert np.all(x.get().view(np.uint8) == 0x7F)


def test_view_and_reshape_share_memory(rng):
    host = random_array(rng, np.float32, (64, 6))
    x = pyar.asarray(host)
    as_u32 = x.view(np.uint32)
    assert as_u32.ptr == x.ptr and as_u32.shape == x.shape
    assert_bitwise_equal(as_u32.get(), host.view(np.uint32))
    as_u8 = x.view(np.uint8)
    assert as_u8.shape == (64, 24)
    assert_bitwise_equal(as_u8.get(), host.view(np.uint8))
    as_bf16 = x.view(ml_dtypes.bfloat16)
    assert as_bf16.shape == (64, 12)
    assert_bitwise_equal(as_bf16.get(), host.view(ml_dtypes.bfloat16))
    reshaped = x.reshape(8, 48)
    assert reshaped.ptr == x.ptr
    # Writes through one view show in the other.
    hip.memset(reshaped.ptr, 0, 4 * 48)  # row 0 of the 8x48 view
    expected = host.reshape(8, 48).copy()
    expected[0] = 0
    assert_bitwise_equal(x.get(), expected.reshape(64, 6))
    with pytest.raises(ValueError):
        x.reshape(7, 55)
    with pytest.raises(ValueError):
        x.reshape(-1, -1)
    with pytest.raises(ValueError):
        pyar.asarray(random_array(rng, np.uint8, (5,))).view(np.uint32)


def test_fill(rng):
    for dtype, value in [(np.float32, 1.5), (np.int32, -7), (np.uint8, 3),
                         (ml_dtypes.bfloat16, -2.0), (np.float16, 0.0)]:
        n = int(rng.integers(1, 10_000))
        x = pyar.asarray(random_array(rng, dtype, (n,)))
        x.fill(value)
        assert_bitwise_equal(x.get(), np.full(n, value, dtype))


def test_set_validates(rng):
    x = pyar.empty((10,), np.float32)
    with pytest.raises(ValueError):
        x.set(np.zeros(11, np.float32))
    with pytest.raises(TypeError):
        x.set(np.zeros(10, np.float64))
    with pytest.raises(ValueError):
        x.__array__(copy=False)  # numpy cannot view device memory
    host = rng.standard_normal(10).astype(np.float32)
    x.set(host)
    assert_bitwise_equal(np.asarray(x, dtype=np.float64), host.astype(np.float64))


# --- exports read back by pyar -----------------------------------------------------------

def test_cuda_array_interface(rng):
    stream = hip.Stream()
    host = random_array(rng, np.int16, (31, 3))
    x = pyar.asarray(host, stream=stream)
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (31, 3)
    assert np.dtype(cai["typestr"]) == np.int16
    assert cai["data"] == (x.ptr, False)
    assert cai["strides"] in (None, (6, 2))
    assert cai["stream"] == stream.handle
    plain = pyar.asarray(host)
    assert plain.__cuda_array_interface__["stream"] == 1  # the legacy default stream
    bf16 = pyar.zeros(4, ml_dtypes.bfloat16)
    assert np.dtype(bf16.__cuda_array_interface__["typestr"]).itemsize == 2


class InterfaceOnly:
    """A producer known only by its CUDA array interface, owning DeviceMemory."""

    def __init__(self, memory, shape, typestr, readonly=False, stream=None):
        self.memory = memory
        self._interface = {"shape": shape, "typestr": typestr, "data": (memory.ptr, readonly),
                           "strides": None, "version": 3, "stream": stream}

    @property
    def __cuda_array_interface__(self):
        return self._interface


def test_asarray_from_interface_is_zero_copy_and_keeps_producer_alive(rng, kernels):
    n = int(rng.integers(1000, 50_000))
    host = random_array(rng, np.float32, (n,))
    memory = hip.DeviceMemory(n * 4)
    hip.memcpy_htod(memory.ptr, host)
    producer = InterfaceOnly(memory, (n,), "<f4")
    alive = weakref.ref(producer)
    x = pyar.asarray(producer)
    assert x.ptr == memory.ptr and x.shape == (n,) and x.dtype == np.float32
    assert_bitwise_equal(x.get(), host)
    # pyar writes are the producer's data.
    kernels.fill_u32(x.ptr, 0x3F800000, n)  # 1.0f
    hip.device_synchronize()
    assert np.all(raw_bytes(memory.ptr, n * 4).view(np.float32) == 1.0)
    del producer, memory
    gc.collect()
    assert alive() is not None, "the view let its producer go"
    assert np.all(x.get() == 1.0)
    del x
    gc.collect()
    assert alive() is None, "the producer outlived every view"


def test_asarray_from_interface_readonly_and_bytes(rng):
    memory = hip.DeviceMemory(64)
    host = random_array(rng, ml_dtypes.bfloat16, (32,))
    hip.memcpy_htod(memory.ptr, host.view(np.uint8))
    ro = pyar.asarray(InterfaceOnly(memory, (32,), "<V2", readonly=True),
                      dtype=ml_dtypes.bfloat16)
    assert ro.readonly and ro.dtype == ml_dtypes.bfloat16
    assert_bitwise_equal(ro.get(), host)
    with pytest.raises(ValueError):
        ro.set(host)
    with pytest.raises(TypeError):
        pyar.asarray(InterfaceOnly(memory, (32,), "<V2"))  # anonymous bytes, no dtype


def test_asarray_from_interface_waits_for_its_stream(rng, kernels):
    """The producer's interface names a busy stream; a view used on another
    stream sees the producer's writes."""
    producer_stream, consumer_stream = hip.Stream(), hip.Stream()
    n = int(rng.integers(10_000, 100_000))
    memory = hip.DeviceMemory(n * 4)
    hip.memset(memory.ptr, 0, n * 4)
    pattern = int(rng.integers(1, 2**32, dtype=np.uint64))
    kernels.spin(50_000, stream=producer_stream)
    kernels.fill_u32(memory.ptr, pattern, n, stream=producer_stream)
    producer = InterfaceOnly(memory, (n,), "<u4", stream=producer_stream.handle)
    x = pyar.asarray(producer, stream=consumer_stream)
    got = x.get(stream=consumer_stream)
    assert np.all(got == pattern), f"{np.count_nonzero(got != pattern)} of {n} stale"


class DLPackOnly:
    """Delegates DLPack to a pyar array; no CUDA array interface."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dlpack_round_trip_through_pyar(dtype, rng):
    host = random_array(rng, dtype, (int(rng.integers(1, 3000)), 3))
    x = pyar.asarray(host)
    device_type, device = x.__dlpack_device__()
    assert device_type == (2 if hip.platform() == "cuda" else 10)
    assert device == hip.get_device()
    wrapper = DLPackOnly(x)
    y = pyar.asarray(wrapper)
    assert y is not x and y.ptr == x.ptr and y.shape == x.shape and y.dtype == x.dtype
    assert wrapper.calls and "stream" in wrapper.calls[0]
    assert_bitwise_equal(y.get(), host)
    del x, wrapper
    gc.collect()
    assert_bitwise_equal(y.get(), host)  # the capsule keeps the memory alive


def test_dlpack_capsules(rng):
    x = pyar.asarray(random_array(rng, np.float32, (10,)))
    legacy = x.__dlpack__(stream=None)
    versioned = x.__dlpack__(stream=None, max_version=(1, 1))
    assert type(legacy).__name__ == "PyCapsule"
    assert "dltensor" in repr(legacy) and "dltensor_versioned" not in repr(legacy)
    assert "dltensor_versioned" in repr(versioned)
    copied = x.__dlpack__(stream=None, max_version=(1, 1), copy=True)
    from pyar.array import _dlpack
    tensor = _dlpack.consume(copied)
    assert tensor.ptr != x.ptr and tensor.shape == (10,)
    with pytest.raises(BufferError):
        x.__dlpack__(stream=None, dl_device=(1, 0))


def test_dlpack_stream_argument_orders_consumer(rng, kernels):
    """A consumer passing its stream to __dlpack__ sees work queued on the array's stream."""
    producer_stream, consumer_stream = hip.Stream(), hip.Stream()
    n = int(rng.integers(10_000, 100_000))
    x = pyar.zeros(n, np.uint32, stream=producer_stream)
    producer_stream.synchronize()
    pattern = int(rng.integers(1, 2**32, dtype=np.uint64))
    kernels.spin(50_000, stream=producer_stream)
    kernels.fill_u32(x.ptr, pattern, n, stream=producer_stream)
    y = pyar.asarray(DLPackOnly(x), stream=consumer_stream)
    assert y.stream == consumer_stream
    got = y.get()  # on y's stream, the consumer's
    assert np.all(got == pattern), f"{np.count_nonzero(got != pattern)} of {n} stale"
