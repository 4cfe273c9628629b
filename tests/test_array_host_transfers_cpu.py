"""pyar.array's host transfers and constructors without a GPU (tier a): the
argument checks that run before any GPU call, and the clean failure of the
calls that need one.

Arrays are faked by tests/fake_device_arrays.py: host numpy memory posing as
device memory (``__cuda_array_interface__`` or ctypes-built DLPack capsules),
never dereferenced on a device.  Calls that need a GPU are only checked to
fail cleanly (HIP's no-device statuses, or no runtime at all), and skip where
a GPU is visible: the GPU tier covers them there.
"""
import numpy as np
import pytest

import pyar
from pyar.array import asarray
from tests.fake_device_arrays import (
    GPU_ERRORS, NO_GPU, FakeDeviceMemory, assert_no_gpu, fake_array,
)


def test_set_checks_dtype_shape_and_readonly():
    x = fake_array(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="float32.*float64"):
        x.set(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        x.set(np.zeros((3, 2), np.float32))
    readonly = fake_array(np.zeros(3, np.float32), readonly=True)
    with pytest.raises(ValueError, match="read-only"):
        readonly.set(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        readonly.fill(0)


def test_fill_rejects_values_out_of_range():
    x = fake_array(np.zeros(3, np.uint8))
    with pytest.raises(OverflowError):
        x.fill(300)


def test_numpy_cannot_view_without_copy():
    x = fake_array(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="copy"):
        np.asarray(x, copy=False)


@NO_GPU
def test_gpu_calls_fail_cleanly_without_a_gpu():
    x = fake_array(np.arange(6, dtype=np.float32))
    for call in (lambda: pyar.empty((4,)), lambda: pyar.zeros(3, np.int8),
                 lambda: pyar.asarray(np.ones(3)), lambda: pyar.empty_like(np.ones(2)),
                 lambda: pyar.zeros_like(np.ones(2)), x.get, lambda: np.asarray(x),
                 lambda: x.set(np.ones(6, np.float32)), x.copy, lambda: x.fill(1.5),
                 lambda: x.fill(0)):
        with pytest.raises(GPU_ERRORS) as excinfo:
            call()
        assert_no_gpu(excinfo)


@NO_GPU
def test_lazy_device_lookup_needs_the_gpu():
    x = asarray(FakeDeviceMemory(np.zeros(3, np.float32)))
    assert "device=?" in repr(x)
    with pytest.raises(GPU_ERRORS) as excinfo:
        x.device
    assert_no_gpu(excinfo)


def test_constructors_validate_before_touching_the_gpu():
    with pytest.raises(TypeError, match="unsupported dtype"):
        pyar.empty(4, dtype=np.object_)
    with pytest.raises(ValueError, match="negative dimension"):
        pyar.zeros((2, -3))
    with pytest.raises(TypeError, match="unsupported dtype"):
        pyar.asarray(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="unsupported dtype"):
        pyar.asarray([1, 2], dtype=np.object_)
