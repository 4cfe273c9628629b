"""pyar.asarray of DLPack producers without a GPU (tier a): versioned and
legacy capsules, streams, deleters, flags, strides, devices, dtypes, and the
refusals (each of which still releases the producer's tensor).

The producers are ctypes-built DLPack capsules over host numpy memory that
claim a GPU device (tests/fake_device_arrays.py); they count their deleter
calls, and nothing dereferences their pointers.  Copying a host (kDLCPU)
array needs a GPU: that call is checked to fail cleanly, and skips where a
GPU is visible.
"""
import gc

import numpy as np
import pytest

from pyar.array import asarray
from tests.fake_device_arrays import (
    ALL_DTYPES, GPU_ERRORS, LEGACY, NO_GPU, USED, VERSIONED, FakeDLPackProducer,
    OldDLPackProducer, assert_no_gpu, capsule_name, kDLCUDA, kDLCUDAManaged, kDLROCM, sample,
)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_view(versioned):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    producer = FakeDLPackProducer(host, versioned=versioned, device=(kDLCUDA, 3))
    x = asarray(producer)
    assert x.ptr == host.ctypes.data and x.shape == (3, 4) and x.dtype == np.float32
    assert x.device == 3 and x.__dlpack_device__() == (kDLCUDA, 3)
    assert x.readonly is False and x.stream is None
    # The consumer asked for a versioned capsule and named the legacy stream.
    assert producer.requests == [{"stream": 1, "max_version": (1, 1)}]
    expected = USED[VERSIONED if versioned else LEGACY]
    assert capsule_name(producer.capsules[0]) == expected
    assert producer.deleted == 0


def test_dlpack_rocm_legacy_stream_is_zero():
    producer = FakeDLPackProducer(np.zeros(2, np.float32), device=(kDLROCM, 1))
    x = asarray(producer)
    assert producer.requests[0]["stream"] == 0
    assert x.__dlpack_device__() == (kDLROCM, 1)


def test_dlpack_consumer_stream_is_passed_and_kept():
    producer = FakeDLPackProducer(np.zeros(2, np.float32))
    x = asarray(producer, stream=0xABC)
    assert producer.requests[0]["stream"] == 0xABC
    assert x.stream.handle == 0xABC


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_deleter_runs_once_when_the_last_view_dies(versioned):
    producer = FakeDLPackProducer(np.zeros(24, np.int32), versioned=versioned)
    x = asarray(producer)
    views = [x.reshape(2, 12), x.view(np.float32)]
    del x
    gc.collect()
    assert producer.deleted == 0
    del views
    gc.collect()
    assert producer.deleted == 1
    producer.capsules.clear()  # the used capsule must not call the deleter again
    gc.collect()
    assert producer.deleted == 1


def test_unconsumed_fake_capsule_calls_its_deleter():
    producer = FakeDLPackProducer(np.zeros(2, np.float32))
    producer.__dlpack__()
    producer.capsules.clear()
    gc.collect()
    assert producer.deleted == 1


def test_dlpack_readonly_flag():
    x = asarray(FakeDLPackProducer(np.zeros(2, np.float32), readonly=True))
    assert x.readonly


def test_dlpack_old_producer_without_max_version():
    producer = OldDLPackProducer(np.arange(5, dtype=np.uint8))
    x = asarray(producer)
    assert x.ptr == producer.host.ctypes.data and x.shape == (5,) and x.dtype == np.uint8
    assert producer.requests == [{"stream": 1}]
    assert capsule_name(producer.capsules[0]) == b"used_dltensor"
    del x
    gc.collect()
    assert producer.deleted == 1


def test_dlpack_null_strides_and_byte_offset():
    host = np.arange(6, dtype=np.float64).reshape(2, 3)
    x = asarray(FakeDLPackProducer(host, strides=None, byte_offset=64))
    assert x.ptr == host.ctypes.data and x.shape == (2, 3)


def test_dlpack_size_one_dimensions_may_have_any_stride():
    host = np.zeros((3, 1), np.float32)
    x = asarray(FakeDLPackProducer(host, strides=(1, 42)))
    assert x.shape == (3, 1)


def test_dlpack_managed_memory_looks_its_device_up_lazily():
    x = asarray(FakeDLPackProducer(np.zeros(2, np.float32), device=(kDLCUDAManaged, 0)))
    assert "device=?" in repr(x)  # managed memory reports device 0 whatever it is


@pytest.mark.parametrize("kwargs, error, match", [
    ({"strides": (1, 3)}, ValueError, "not C-contiguous"),
    ({"dltype": (2, 32, 4)}, TypeError, "lanes=4"),
    ({"dltype": (5, 32, 1)}, TypeError, "code=5, bits=32"),
    ({"version": (2, 0)}, BufferError, r"version \(2, 0\)"),
])
def test_dlpack_rejects_and_still_releases(kwargs, error, match):
    producer = FakeDLPackProducer(np.zeros((3, 2), np.float32), **kwargs)
    with pytest.raises(error, match=match):
        asarray(producer)
    gc.collect()
    assert producer.deleted == 1


def test_dlpack_dtype_mismatch_is_refused_and_released():
    producer = FakeDLPackProducer(np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="holds float32, not int32"):
        asarray(producer, dtype=np.int32)
    gc.collect()
    assert producer.deleted == 1


def test_dlpack_capsule_cannot_be_consumed_twice():
    producer = FakeDLPackProducer(np.zeros(2, np.float32))
    x = asarray(producer)
    producer.__dlpack__ = lambda **kwargs: producer.capsules[0]
    with pytest.raises(BufferError, match="already consumed"):
        asarray(producer)
    del x
    gc.collect()
    assert producer.deleted == 1


def test_non_capsules_are_refused():
    class NotAProducer:
        def __dlpack__(self, **kwargs):
            return object()

        def __dlpack_device__(self):
            return (kDLCUDA, 0)
    with pytest.raises(TypeError, match="expected a DLPack capsule"):
        asarray(NotAProducer())


def test_dlpack_on_an_unsupported_device_is_refused():
    with pytest.raises(TypeError, match="DLPack device type 4"):
        asarray(FakeDLPackProducer(np.zeros(2, np.float32), device=(4, 0)))


@NO_GPU
def test_dlpack_host_arrays_are_copied():
    # numpy speaks DLPack on kDLCPU: asarray copies it to the device.
    with pytest.raises(GPU_ERRORS) as excinfo:
        asarray(np.zeros(3, np.float32))
    assert_no_gpu(excinfo)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dlpack_import_of_every_dtype(dtype):
    host = sample(dtype)
    x = asarray(FakeDLPackProducer(host))
    assert x.dtype == dtype and x.shape == host.shape and x.ptr == host.ctypes.data
