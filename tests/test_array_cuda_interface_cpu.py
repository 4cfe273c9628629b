"""pyar.array and ``__cuda_array_interface__`` without a GPU (tier a):
consuming a producer's interface (validation, lifetime, streams, dtypes) and
exporting one, round trips included.

The producer is host numpy memory posing as device memory through the
interface (tests/fake_device_arrays.py); nothing dereferences its pointer.
Only waiting for a producer's foreign stream needs a GPU: that call is
checked to fail cleanly, and skips where a GPU is visible.
"""
import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from pyar.array import DeviceArray, asarray
from tests.fake_device_arrays import (
    ALL_DTYPES, GPU_ERRORS, NO_GPU, FakeDeviceMemory, InterfaceOf, assert_no_gpu, fake_array,
)


# --- consuming __cuda_array_interface__ ------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_,
                                   np.complex64], ids=str)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 4), ()], ids=str)
def test_cai_view(dtype, shape):
    host = np.zeros(shape, dtype)
    fake = FakeDeviceMemory(host)
    x = asarray(fake)
    assert isinstance(x, DeviceArray)
    assert x.ptr == host.ctypes.data and x.shape == shape and x.dtype == dtype
    assert x.readonly is False and x.stream is None


def test_cai_view_is_readonly_when_the_producer_says_so():
    assert asarray(FakeDeviceMemory(np.zeros(3, np.float32), readonly=True)).readonly


def test_cai_view_keeps_the_producer_alive():
    fake = FakeDeviceMemory(np.zeros(8, np.float32))
    ref = weakref.ref(fake)
    x = asarray(fake)
    del fake
    gc.collect()
    assert ref() is not None
    del x
    gc.collect()
    assert ref() is None


def test_asarray_of_a_device_array_is_itself():
    x = asarray(FakeDeviceMemory(np.zeros(3, np.float32)))
    assert asarray(x) is x and asarray(x, dtype=np.float32) is x
    with pytest.raises(TypeError, match="does not convert"):
        asarray(x, dtype=np.float64)


@pytest.mark.parametrize("overrides, error, match", [
    ({"strides": (4, 8)}, ValueError, "not C-contiguous"),
    ({"strides": (24, 8)}, ValueError, "not C-contiguous"),
    ({"strides": (4,)}, ValueError, "strides must be"),
    ({"mask": 123}, ValueError, "mask"),
    ({"typestr": "<z4"}, TypeError, "not a numpy type string"),
    ({"typestr": "|O8"}, TypeError, "unsupported dtype object"),
    ({"typestr": ">f4" if np.little_endian else "<f4"}, TypeError, "byte order"),
    ({"typestr": 4}, ValueError, "typestr must be a str"),
    ({"version": 4}, ValueError, "unsupported __cuda_array_interface__ version 4"),
    ({"version": "3"}, ValueError, "version '3'"),
    ({"shape": (2, -3)}, ValueError, "negative dimension"),
    ({"shape": [2, 3]}, ValueError, "tuple of ints"),
    ({"data": (0, False)}, ValueError, "null pointer"),
    ({"data": (-16, False)}, ValueError, "negative"),
    ({"data": 1234}, ValueError, r"\(int pointer, bool read-only\)"),
    ({"stream": 0}, ValueError, "stream 0 is forbidden"),
    ({"stream": -3}, ValueError, "invalid stream"),
])
def test_cai_rejects_bad_interfaces(overrides, error, match):
    fake = FakeDeviceMemory(np.zeros((2, 3), np.float32), **overrides)
    with pytest.raises(error, match=match):
        asarray(fake)


def test_cai_missing_version_is_refused():
    with pytest.raises(ValueError, match="version None"):
        asarray(FakeDeviceMemory(np.zeros(2, np.float32), drop=("version",)))


def test_cai_interface_must_be_a_dict():
    class Bad:
        __cuda_array_interface__ = [("shape", (2,))]
    with pytest.raises(TypeError, match="must be a dict"):
        asarray(Bad())


def test_cai_accepts_contiguous_strides_and_older_versions():
    host = np.zeros((2, 1, 3), np.float32)
    for overrides in ({"strides": (12, 12, 4)}, {"strides": (12, 999, 4)}, {"version": 2},
                      {"version": 0}, {"mask": None}):
        x = asarray(FakeDeviceMemory(host, **overrides))
        assert x.shape == (2, 1, 3) and x.ptr == host.ctypes.data
    x = asarray(FakeDeviceMemory(host, drop=("strides", "stream")))
    assert x.shape == (2, 1, 3)


def test_cai_zero_size_arrays():
    empty = np.zeros((0, 3), np.float32)
    for data in ((0, False), None):
        x = asarray(FakeDeviceMemory(empty, data=data, strides=(7, 5)))
        assert x.ptr == 0 and x.shape == (0, 3) and x.size == 0


def test_cai_anonymous_bytes_need_a_dtype():
    host = np.zeros((2, 2), ml_dtypes.bfloat16)
    assert host.dtype.str == "<V2"
    with pytest.raises(TypeError, match="dtype="):
        asarray(FakeDeviceMemory(host))
    x = asarray(FakeDeviceMemory(host), dtype=ml_dtypes.bfloat16)
    assert x.dtype == ml_dtypes.bfloat16 and x.shape == (2, 2)
    with pytest.raises(TypeError, match="1-byte items"):
        asarray(FakeDeviceMemory(host), dtype=ml_dtypes.float8_e5m2)


def test_cai_dtype_mismatch_is_refused():
    with pytest.raises(TypeError, match="holds float32, not float64"):
        asarray(FakeDeviceMemory(np.zeros(2, np.float32)), dtype=np.float64)


def test_cai_legacy_stream_needs_no_synchronization():
    # Producer and consumer both on the legacy default stream: no GPU call.
    x = asarray(FakeDeviceMemory(np.zeros(2, np.float32), stream=1))
    assert x.stream is None


def test_cai_view_takes_the_consumer_stream():
    stream = hip.Stream.from_handle(0x1234)
    x = asarray(FakeDeviceMemory(np.zeros(2, np.float32), stream=0x1234), stream=stream)
    assert x.stream is stream
    assert x.__cuda_array_interface__["stream"] == 0x1234


@NO_GPU
def test_cai_foreign_stream_is_waited_for():
    with pytest.raises(GPU_ERRORS) as excinfo:
        asarray(FakeDeviceMemory(np.zeros(2, np.float32), stream=0x77))
    assert_no_gpu(excinfo)


# --- exporting __cuda_array_interface__ ----------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cai_export(dtype):
    host = np.zeros((3, 2), dtype)
    x = fake_array(host)
    interface = x.__cuda_array_interface__
    assert interface == {"shape": (3, 2), "typestr": host.dtype.str,
                         "descr": [("", host.dtype.str)], "data": (host.ctypes.data, False),
                         "strides": None, "version": 3, "stream": 1}


def test_cai_round_trip():
    host = np.arange(6, dtype=np.int16).reshape(2, 3)
    x = asarray(FakeDeviceMemory(host, readonly=True))
    y = asarray(InterfaceOf(x))
    assert (y.ptr, y.shape, y.dtype, y.readonly) == (host.ctypes.data, (2, 3), np.int16, True)
    assert y.__cuda_array_interface__["data"] == (host.ctypes.data, True)


def test_cai_round_trip_of_bfloat16_names_the_dtype():
    host = np.zeros(4, ml_dtypes.bfloat16)
    x = fake_array(host)
    y = asarray(InterfaceOf(x), dtype=ml_dtypes.bfloat16)
    assert y.dtype == ml_dtypes.bfloat16 and y.ptr == host.ctypes.data
