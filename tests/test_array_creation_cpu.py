"""pyar.DeviceArray without a GPU (tier a): construction over a device
pointer (attributes, validation, ownership, freed memory) and the views it
offers (reshape, view).

Arrays are faked by tests/fake_device_arrays.py: host numpy memory posing as
device memory (``__cuda_array_interface__`` or ctypes-built DLPack capsules),
never dereferenced on a device.
Construction and views only compute metadata, so they run on any machine.
"""
import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from pyar.array import DeviceArray
from tests.fake_device_arrays import FakeDeviceMemory, fake_array


# --- DeviceArray over a pointer ------------------------------------------------------


def test_from_pointer_attributes():
    host = np.zeros((3, 4, 5), np.float16)
    owner = FakeDeviceMemory(host)
    x = DeviceArray.from_pointer(host.ctypes.data, (3, 4, 5), np.float16, owner=owner, device=2)
    assert x.ptr == host.ctypes.data
    assert x.shape == (3, 4, 5) and x.ndim == 3 and x.size == 60 and len(x) == 3
    assert x.dtype == np.float16 and x.itemsize == 2 and x.nbytes == 120
    assert x.device == 2 and x.stream is None and x.readonly is False
    assert repr(x) == "<pyar.DeviceArray shape=(3, 4, 5) dtype=float16 device=2>"


def test_from_pointer_accepts_an_int_shape_and_a_stream():
    x = DeviceArray.from_pointer(0x1000, 7, "int32", stream=hip.Stream.from_handle(0x42),
                                 readonly=True)
    assert x.shape == (7,) and x.dtype == np.int32
    assert x.stream.handle == 0x42 and x.readonly
    assert "read-only" in repr(x) and "device=?" in repr(x)


def test_from_pointer_null_stream_is_none():
    assert DeviceArray.from_pointer(0x1000, 1, np.float32, stream=hip.Stream.null()).stream is None


@pytest.mark.parametrize("args, error, match", [
    ((-8, (2,), np.float32), ValueError, "negative"),
    ((0, (2,), np.float32), ValueError, "null pointer"),
    ((1.5, (2,), np.float32), TypeError, "int device address"),
    ((0x1000, (2, -1), np.float32), ValueError, "negative dimension"),
    ((0x1000, (2, 1.5), np.float32), TypeError, "only ints"),
    ((0x1000, "ab", np.float32), TypeError, "shape must be"),
    ((0x1000, None, np.float32), TypeError, "shape must be"),
    ((0x1000, (2,), np.object_), TypeError, "unsupported dtype object"),
])
def test_from_pointer_validates(args, error, match):
    with pytest.raises(error, match=match):
        DeviceArray.from_pointer(*args)


def test_zero_size_array_may_have_a_null_pointer():
    x = DeviceArray.from_pointer(0, (0, 4), np.float32, device=0)
    assert x.ptr == 0 and x.size == 0 and x.nbytes == 0
    out = x.get()  # nothing to copy: no GPU call
    assert out.shape == (0, 4) and out.dtype == np.float32
    x.fill(3)
    x.set(np.zeros((0, 4), np.float32))


def test_direct_construction_is_refused():
    with pytest.raises(TypeError, match="pyar.empty"):
        DeviceArray((3,), np.float32)


def test_array_keeps_its_owner_alive_and_views_share_it():
    host = np.zeros(12, np.float32)
    owner = FakeDeviceMemory(host)
    ref = weakref.ref(owner)
    x = fake_array(host, owner=owner)
    view = x.reshape(3, 4)
    del owner, x
    gc.collect()
    assert ref() is not None
    del view
    gc.collect()
    assert ref() is None


def test_freed_memory_is_reported():
    freed = hip.DeviceMemory.__new__(hip.DeviceMemory)  # never allocated: reads as closed
    assert freed.closed
    x = DeviceArray.from_pointer(0x1000, (4,), np.float32, owner=freed, device=0)
    with pytest.raises(ValueError, match="freed"):
        x.ptr
    with pytest.raises(ValueError, match="freed"):
        x.__cuda_array_interface__


def test_len_of_0d_array():
    x = DeviceArray.from_pointer(0x1000, (), np.float32, device=0)
    assert x.ndim == 0 and x.size == 1 and x.nbytes == 4
    with pytest.raises(TypeError, match="0-d"):
        len(x)


# --- views ---------------------------------------------------------------------------


def test_reshape_forms_and_inference():
    x = fake_array(np.zeros(24, np.int32), readonly=True)
    for y in (x.reshape(2, 3, 4), x.reshape((2, 3, 4)), x.reshape([2, 3, 4]),
              x.reshape(2, -1, 4), x.reshape(-1, 3, 4)):
        assert y.shape == (2, 3, 4)
        assert y.ptr == x.ptr and y.dtype == x.dtype and y.device == x.device
        assert y.readonly
    assert x.reshape(-1).shape == (24,)
    assert x.reshape(2, 3, 4).ravel().shape == (24,)


def test_reshape_of_empty_array():
    x = DeviceArray.from_pointer(0, (0, 3), np.float32, device=0)
    assert x.reshape(3, 0).shape == (3, 0)
    with pytest.raises(ValueError, match="cannot reshape"):
        x.reshape(-1, 0)


@pytest.mark.parametrize("shape, match", [
    ((5, 5), "cannot reshape 24 elements"),
    ((-1, -1), "only infer one"),
    ((-1, 5), "cannot reshape"),
    ((-2, 12), "negative dimension"),
])
def test_reshape_errors(shape, match):
    x = fake_array(np.zeros(24, np.int32))
    with pytest.raises(ValueError, match=match):
        x.reshape(*shape)


def test_view_same_itemsize():
    x = fake_array(np.zeros((2, 4), np.float32))
    y = x.view(np.int32)
    assert y.shape == (2, 4) and y.dtype == np.int32 and y.ptr == x.ptr


def test_view_changes_last_dimension_like_numpy():
    host = np.zeros((2, 4), np.float32)
    x = fake_array(host)
    for dtype in (np.uint8, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        assert x.view(dtype).shape == host.view(dtype).shape
        assert x.view(dtype).dtype == np.dtype(dtype)


def test_view_errors():
    x = fake_array(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="12 bytes"):
        x.view(np.float64)
    with pytest.raises(ValueError, match="0-d"):
        DeviceArray.from_pointer(0x1000, (), np.float32, device=0).view(np.float16)
    with pytest.raises(TypeError, match="unsupported dtype"):
        x.view(np.object_)
