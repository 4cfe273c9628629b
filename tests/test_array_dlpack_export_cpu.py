"""pyar.DeviceArray.__dlpack__ without a GPU (tier a): the capsules it exports
(fields, versions, dtypes, flags), their deleters and the owner's lifetime,
stream and device arguments, and consuming pyar's own capsules.

The arrays are DeviceArrays over host numpy memory (tests/fake_device_arrays.py);
the exported capsules are read and consumed through ctypes as a DLPack
consumer does, without dereferencing their data.  Waiting for a stream and
copying need a GPU: those calls are checked to fail cleanly, and skip where
a GPU is visible.
"""
import gc
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from pyar.array import DeviceArray, asarray
from tests.fake_device_arrays import (
    ALL_DTYPES, EXPECTED_DLPACK, GPU_ERRORS, LEGACY, NO_GPU, USED, VERSIONED, DLPackOf,
    FakeDeviceMemory, FakeDLPackProducer, assert_no_gpu, capsule_name, fake_array, kDLCUDA,
    open_capsule, platform_device_type, take_capsule,
)


def read_capsule(capsule):
    """(name, fields) of a capsule pyar produced, read while it is alive."""
    name, managed = open_capsule(capsule)
    tensor = managed.contents.dl_tensor
    ndim = tensor.ndim
    fields = {
        "data": tensor.data or 0,
        "device": (tensor.device.device_type, tensor.device.device_id),
        "shape": tuple(tensor.shape[i] for i in range(ndim)),
        "strides": tuple(tensor.strides[i] for i in range(ndim)),
        "dtype": (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes),
        "byte_offset": tensor.byte_offset,
    }
    if name == VERSIONED:
        version = managed.contents.version
        fields["version"] = (version.major, version.minor)
        fields["flags"] = managed.contents.flags
    return name, fields


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_export_fields(versioned):
    host = np.zeros((2, 3, 4), np.float32)
    x = fake_array(host, device=1)
    name, fields = read_capsule(x.__dlpack__(max_version=(1, 0) if versioned else None))
    assert name == (VERSIONED if versioned else LEGACY)
    expected = {"data": host.ctypes.data, "device": (platform_device_type(), 1),
                "shape": (2, 3, 4), "strides": (12, 4, 1), "dtype": (2, 32, 1),
                "byte_offset": 0}
    if versioned:
        expected.update(version=(1, 1), flags=0)
    assert fields == expected


def test_dlpack_device_matches_the_platform():
    assert fake_array(np.zeros(1, np.int8), device=5).__dlpack_device__() == (
        platform_device_type(), 5)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dlpack_export_of_every_dtype(dtype):
    host = np.zeros(4, dtype)
    _, fields = read_capsule(fake_array(host).__dlpack__(max_version=(1, 1)))
    assert fields["dtype"] == EXPECTED_DLPACK[dtype]


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_deleter_releases_the_owner(versioned):
    host = np.zeros(6, np.float32)
    owner = FakeDeviceMemory(host)
    ref = weakref.ref(owner)
    x = fake_array(host, owner=owner)
    capsule = x.__dlpack__(max_version=(1, 0) if versioned else None)
    del x, owner
    gc.collect()
    assert ref() is not None
    managed = take_capsule(capsule)
    managed.contents.deleter(managed)  # ctypes drops the GIL: the deleter retakes it
    gc.collect()
    assert ref() is None
    del capsule  # renamed: its destructor must not delete again
    gc.collect()


def test_dlpack_deleter_from_another_thread():
    host = np.zeros(6, np.float32)
    owner = FakeDeviceMemory(host)
    ref = weakref.ref(owner)
    capsule = fake_array(host, owner=owner).__dlpack__(max_version=(1, 0))
    del owner
    managed = take_capsule(capsule)
    thread = threading.Thread(target=lambda: managed.contents.deleter(managed))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_unconsumed_capsule_releases_the_owner(versioned):
    host = np.zeros(6, np.float32)
    owner = FakeDeviceMemory(host)
    ref = weakref.ref(owner)
    capsule = fake_array(host, owner=owner).__dlpack__(max_version=(1, 0) if versioned else None)
    del owner
    gc.collect()
    assert ref() is not None
    del capsule
    gc.collect()
    assert ref() is None


def test_dlpack_export_of_readonly_arrays():
    x = fake_array(np.zeros(3, np.float32), readonly=True)
    _, fields = read_capsule(x.__dlpack__(max_version=(1, 0)))
    assert fields["flags"] == 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    with pytest.raises(BufferError, match="read-only"):
        x.__dlpack__()


def test_dlpack_export_of_an_empty_array_has_a_null_pointer():
    host = np.zeros((4, 0), np.float32)
    x = DeviceArray.from_pointer(host.ctypes.data, (4, 0), np.float32, device=0)
    _, fields = read_capsule(x.__dlpack__(max_version=(1, 0)))
    assert fields["data"] == 0 and fields["shape"] == (4, 0) and fields["strides"] == (0, 1)


def test_dlpack_export_of_a_0d_array():
    host = np.zeros((), np.int64)
    _, fields = read_capsule(fake_array(host).__dlpack__())
    assert fields["shape"] == () and fields["data"] == host.ctypes.data


def test_dlpack_export_to_another_device_is_refused():
    x = fake_array(np.zeros(3, np.float32), device=0)
    assert x.__dlpack__(dl_device=x.__dlpack_device__()) is not None
    with pytest.raises(BufferError, match="another|cannot export"):
        x.__dlpack__(dl_device=(1, 0))


def test_dlpack_export_stream_arguments_needing_no_gpu():
    x = fake_array(np.zeros(3, np.float32))
    for stream in (None, -1, 0, 1):  # all the legacy default stream, or "no sync"
        assert x.__dlpack__(stream=stream) is not None
    with pytest.raises(TypeError, match="int"):
        x.__dlpack__(stream="1")


@NO_GPU
def test_dlpack_export_waits_for_the_array_stream():
    host = np.zeros(3, np.float32)
    x = DeviceArray.from_pointer(host.ctypes.data, (3,), np.float32, device=0,
                                 stream=hip.Stream.from_handle(0x99))
    assert x.__dlpack__(stream=0x99) is not None  # the same stream: nothing to order
    assert x.__dlpack__(stream=-1) is not None
    with pytest.raises(GPU_ERRORS) as excinfo:
        x.__dlpack__(stream=1)
    assert_no_gpu(excinfo)


@NO_GPU
def test_dlpack_export_copy_needs_the_gpu():
    with pytest.raises(GPU_ERRORS) as excinfo:
        fake_array(np.zeros(3, np.float32)).__dlpack__(copy=True)
    assert_no_gpu(excinfo)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_consuming_a_pyar_capsule(versioned):
    host = np.arange(8, dtype=ml_dtypes.bfloat16)
    owner = FakeDeviceMemory(host)
    ref = weakref.ref(owner)
    x = fake_array(host, device=2, owner=owner)

    class Producer:
        capsules = []

        def __dlpack__(self, stream=None, max_version=None):
            capsule = x.__dlpack__(stream=stream,
                                   max_version=max_version if versioned else None)
            self.capsules.append(capsule)
            return capsule

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    producer = Producer()
    y = asarray(producer)
    assert (y.ptr, y.shape, y.dtype, y.device) == (x.ptr, (8,), ml_dtypes.bfloat16, 2)
    assert y.__dlpack_device__() == x.__dlpack_device__()
    assert capsule_name(producer.capsules[0]) == USED[VERSIONED if versioned else LEGACY]
    del x, owner
    producer.capsules.clear()
    gc.collect()
    assert ref() is not None
    z = y.reshape(2, 4)
    del y
    gc.collect()
    assert ref() is not None
    del z
    gc.collect()
    assert ref() is None


def test_consuming_a_pyar_capsule_keeps_readonly():
    x = fake_array(np.zeros(3, np.float32), readonly=True)
    assert asarray(DLPackOf(x)).readonly


def test_dlpack_round_trip_through_a_dlpack_view():
    # A view made from a DLPack capsule re-exports with the producer's device.
    producer = FakeDLPackProducer(np.zeros((2, 2), np.int8), device=(kDLCUDA, 4))
    x = asarray(producer)
    _, fields = read_capsule(x.__dlpack__(max_version=(1, 0)))
    assert fields["device"] == (kDLCUDA, 4)
