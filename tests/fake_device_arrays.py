"""Fake GPU arrays for the tier (a) tests of pyar.array (tests/test_array_*_cpu.py).

Device arrays are faked the way mpi4py's test suite fakes them: host numpy
memory exposed through ``__cuda_array_interface__``, or through DLPack
capsules built with ctypes that claim to live on a GPU.  Nothing dereferences
the pointers on a device, so every view, export and capsule round trip runs
on any machine; calls that need a GPU are only checked to fail cleanly
(``NO_GPU``, ``GPU_ERRORS``, ``assert_no_gpu``).
"""
import collections
import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from pyar.array import DeviceArray, dtypes
from tests.conftest import gpu_count

NO_GPU = pytest.mark.skipif(gpu_count() > 0, reason="a GPU is visible: the GPU tier covers "
                                                    "these calls")

kDLCUDA, kDLROCM, kDLCUDAManaged = 2, 10, 13

# --- CUDA array interface fakes --------------------------------------------------------


class FakeDeviceMemory:
    """Host memory posing as device memory through __cuda_array_interface__;
    ``overrides`` replace (or, as None with ``drop``, remove) interface keys."""

    def __init__(self, host, readonly=False, drop=(), **overrides):
        self.host = host
        self.readonly = readonly
        self.drop = drop
        self.overrides = overrides

    @property
    def ptr(self):
        return self.host.ctypes.data

    @property
    def __cuda_array_interface__(self):
        interface = {"shape": self.host.shape, "typestr": self.host.dtype.str,
                     "data": (self.ptr, self.readonly), "strides": None, "version": 3,
                     "stream": None}
        interface.update(self.overrides)
        for key in self.drop:
            del interface[key]
        return interface


class InterfaceOf:
    """Offers another array's __cuda_array_interface__, and nothing else."""

    def __init__(self, target):
        self.target = target
        self.__cuda_array_interface__ = target.__cuda_array_interface__


class DLPackOf:
    """Offers another array through DLPack, and nothing else."""

    def __init__(self, target):
        self.target = target

    def __dlpack__(self, **kwargs):
        return self.target.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.target.__dlpack_device__()


# --- DLPack through ctypes -----------------------------------------------------------


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLManagedTensorVersioned(ctypes.Structure):
    pass


LEGACY_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", LEGACY_DELETER)]
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
    ("deleter", VERSIONED_DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Private handles on the C API, so that no argtypes set here leak into
# ctypes.pythonapi; _raw takes the dying capsule's address in destructors.
_api = ctypes.PyDLL(None)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_raw = ctypes.PyDLL(None)
_raw.PyCapsule_IsValid.restype = ctypes.c_int
_raw.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_raw.PyCapsule_GetPointer.restype = ctypes.c_void_p
_raw.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# Capsule names are referenced, not copied: these constants outlive every capsule.
LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"
USED = {LEGACY: b"used_dltensor", VERSIONED: b"used_dltensor_versioned"}
STRUCT = {LEGACY: DLManagedTensor, VERSIONED: DLManagedTensorVersioned}

# Deleter calls per managed-tensor address.  Fake tensors are never freed
# (_KEEP), so addresses are never reused and a count cannot leak across tests.
_DELETES = collections.Counter()
_KEEP = []


@LEGACY_DELETER
def _legacy_deleter(managed):
    _DELETES[ctypes.addressof(managed.contents)] += 1


@VERSIONED_DELETER
def _versioned_deleter(managed):
    _DELETES[ctypes.addressof(managed.contents)] += 1


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # What a DLPack producer does: an unconsumed capsule still owns its tensor.
    for name, struct in STRUCT.items():
        if _raw.PyCapsule_IsValid(capsule, name):
            managed = ctypes.cast(_raw.PyCapsule_GetPointer(capsule, name),
                                  ctypes.POINTER(struct))
            managed.contents.deleter(managed)


class FakeDLPackProducer:
    """A "GPU" array that exports host memory as DLPack capsules claiming
    ``device``; counts the deleter calls of the tensors it handed out."""

    def __init__(self, host, versioned=True, device=(kDLCUDA, 0), readonly=False,
                 strides="compact", dltype=None, version=(1, 1), byte_offset=0):
        self.host = host
        self.versioned = versioned
        self.device = device
        self.readonly = readonly
        self.strides = strides
        self.dltype = dltype or dtypes.to_dlpack(host.dtype)
        self.version = version
        self.byte_offset = byte_offset
        self.requests = []
        self.capsules = []
        self.addresses = []

    @property
    def deleted(self):
        return sum(_DELETES[address] for address in self.addresses)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.requests.append({"stream": stream, "max_version": max_version})
        return self._capsule()

    def _capsule(self):
        host = self.host
        shape = (ctypes.c_int64 * max(host.ndim, 1))(*host.shape)
        if self.strides == "compact":
            strides = (ctypes.c_int64 * max(host.ndim, 1))(
                *(s // host.itemsize for s in host.strides))
        elif self.strides is None:
            strides = None
        else:
            strides = (ctypes.c_int64 * len(self.strides))(*self.strides)
        tensor = DLTensor(host.ctypes.data - self.byte_offset, DLDevice(*self.device), host.ndim,
                          DLDataType(*self.dltype), shape,
                          None if strides is None else strides, self.byte_offset)
        if self.versioned:
            flags = 1 if self.readonly else 0
            managed = DLManagedTensorVersioned(DLPackVersion(*self.version), None,
                                               _versioned_deleter, flags, tensor)
        else:
            managed = DLManagedTensor(tensor, None, _legacy_deleter)
        _KEEP.append((managed, shape, strides, host))
        self.addresses.append(ctypes.addressof(managed))
        capsule = _api.PyCapsule_New(ctypes.addressof(managed),
                                     VERSIONED if self.versioned else LEGACY,
                                     _capsule_destructor)
        self.capsules.append(capsule)
        return capsule


class OldDLPackProducer(FakeDLPackProducer):
    """A producer from before DLPack 1.0: no max_version, legacy capsules."""

    def __init__(self, host, **kwargs):
        super().__init__(host, versioned=False, **kwargs)

    def __dlpack__(self, stream=None):
        self.requests.append({"stream": stream})
        return self._capsule()


def open_capsule(capsule):
    """(name, pointer to the managed tensor) of a capsule pyar produced."""
    name = _api.PyCapsule_GetName(capsule)
    managed = _api.PyCapsule_GetPointer(capsule, name)
    return name, ctypes.cast(managed, ctypes.POINTER(STRUCT[name]))


def take_capsule(capsule):
    """Consume a capsule as a DLPack consumer does; returns the managed tensor."""
    name, managed = open_capsule(capsule)
    assert _api.PyCapsule_SetName(capsule, USED[name]) == 0
    return managed


def capsule_name(capsule):
    return _api.PyCapsule_GetName(capsule)


def platform_device_type():
    return kDLROCM if hip.platform() == "hip" else kDLCUDA


def fake_array(host, device=0, readonly=False, owner=None):
    """A DeviceArray over host memory, claiming GPU ``device``."""
    owner = FakeDeviceMemory(host) if owner is None else owner
    return DeviceArray.from_pointer(host.ctypes.data, host.shape, host.dtype, owner=owner,
                                    device=device, readonly=readonly)


def assert_no_gpu(excinfo):
    """The error pyar raises for a GPU call on this machine: HIP's no-device
    statuses (Debian's libamdhip64 loads without a GPU), or no runtime at all."""
    if isinstance(excinfo.value, hip.HipError):
        assert excinfo.value.status in (100, 101), excinfo.value  # NoDevice, InvalidDevice
    else:
        assert isinstance(excinfo.value, hip.RuntimeNotFoundError)


GPU_ERRORS = (hip.HipError, hip.RuntimeNotFoundError)

# Every supported dtype with its DLPack (code, bits, lanes), per dlpack.h.
EXPECTED_DLPACK = {
    np.dtype(t): triple for t, triple in [
        (np.bool_, (6, 8, 1)),
        (np.int8, (0, 8, 1)), (np.int16, (0, 16, 1)), (np.int32, (0, 32, 1)),
        (np.int64, (0, 64, 1)),
        (np.uint8, (1, 8, 1)), (np.uint16, (1, 16, 1)), (np.uint32, (1, 32, 1)),
        (np.uint64, (1, 64, 1)),
        (np.float16, (2, 16, 1)), (np.float32, (2, 32, 1)), (np.float64, (2, 64, 1)),
        (np.complex64, (5, 64, 1)), (np.complex128, (5, 128, 1)),
    ]
}
# ml_dtypes' types, where the installed release has them (pyar offers the same set).
EXPECTED_DLPACK.update({
    np.dtype(getattr(ml_dtypes, name)): triple for name, triple in [
        ("bfloat16", (4, 16, 1)),
        ("float8_e3m4", (7, 8, 1)),
        ("float8_e4m3", (8, 8, 1)),
        ("float8_e4m3b11fnuz", (9, 8, 1)),
        ("float8_e4m3fn", (10, 8, 1)),
        ("float8_e4m3fnuz", (11, 8, 1)),
        ("float8_e5m2", (12, 8, 1)),
        ("float8_e5m2fnuz", (13, 8, 1)),
        ("float8_e8m0fnu", (14, 8, 1)),
    ] if hasattr(ml_dtypes, name)
})
ALL_DTYPES = list(EXPECTED_DLPACK)


def sample(dtype, shape=(2, 3)):
    return np.arange(np.prod(shape)).astype(np.float32).astype(dtype).reshape(shape)
