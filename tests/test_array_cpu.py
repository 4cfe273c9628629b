"""pyar.array without a GPU (tier a).

Device arrays are faked the way mpi4py's test suite fakes them: host numpy
memory exposed through ``__cuda_array_interface__``, or through DLPack
capsules built with ctypes that claim to live on a GPU.  Nothing here
dereferences the pointers on a device, so every view, export and capsule
round trip runs on any machine; calls that need a GPU are only checked to
fail cleanly.
"""
import collections
import ctypes
import gc
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest

import pyar
import pyar._hip as hip
from pyar.array import SUPPORTED_DTYPES, DeviceArray, asarray, dtypes
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


# --- dtypes --------------------------------------------------------------------------


def test_supported_dtypes_are_exactly_the_expected_set():
    assert set(SUPPORTED_DTYPES) == set(ALL_DTYPES)
    # The formats an all-reduce needs must be there whatever ml_dtypes offers.
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                 "float8_e5m2fnuz"):
        assert np.dtype(getattr(ml_dtypes, name)) in SUPPORTED_DTYPES


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dtype_maps_to_dlpack_and_back(dtype):
    triple = EXPECTED_DLPACK[dtype]
    assert dtypes.to_dlpack(dtype) == triple
    assert dtypes.from_dlpack(*triple) == dtype


@pytest.mark.parametrize("dtype", [np.object_, "U4", "M8[s]", ml_dtypes.int4,
                                   np.dtype([("a", np.float32)])], ids=str)
def test_unsupported_dtype_is_named_with_the_supported_list(dtype):
    with pytest.raises(TypeError) as excinfo:
        dtypes.as_dtype(dtype)
    message = str(excinfo.value)
    assert np.dtype(dtype).name in message
    assert "float32" in message and "bfloat16" in message and "float8_e4m3fn" in message


def test_non_native_byte_order_is_refused():
    with pytest.raises(TypeError, match="byte order"):
        dtypes.as_dtype(">f4" if np.little_endian else "<f4")


def test_unknown_dlpack_dtype_is_refused():
    with pytest.raises(TypeError, match=r"code=2, bits=32, lanes=4"):
        dtypes.from_dlpack(2, 32, 4)
    with pytest.raises(TypeError, match="code=17"):
        dtypes.from_dlpack(17, 4, 1)  # float4: sub-byte, not supported


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


# --- host transfers: argument checks before any GPU call -----------------------------


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


# --- consuming DLPack ------------------------------------------------------------------


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


# --- exporting DLPack ----------------------------------------------------------------


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
