"""Zero-copy views of other libraries' device arrays: through DLPack
(``__dlpack__``) or the CUDA array interface (``__cuda_array_interface__``).

A view keeps its producer alive (the DLPack tensor, whose deleter runs when
the last view goes, or the object exposing the interface) and asks the GPU
nothing until it is used: its device is looked up on first access.
"""
import math

import numpy as np

from pyar.array import _dlpack, streams
from pyar.array.device_array import DeviceArray
from pyar.array.dtypes import as_dtype, from_dlpack as dtype_from_dlpack

GPU_DEVICE_TYPES = (_dlpack.kDLCUDA, _dlpack.kDLROCM, _dlpack.kDLCUDAManaged)
HOST_DEVICE_TYPES = (_dlpack.kDLCPU, _dlpack.kDLCUDAHost, _dlpack.kDLROCMHost)

# Versions 0-2 lack only the optional "mask" (1+) and "stream" (3) keys.
_INTERFACE_VERSIONS = range(0, 4)
# JAX arrays are immutable (a consumer's writes to one are undefined
# behaviour), yet JAX's exports leave DLPack's read-only flag and the
# interface's read-only bit unset.
_IMMUTABLE_LIBRARIES = ("jax", "jaxlib")


def _immutable(obj):
    return type(obj).__module__.partition(".")[0] in _IMMUTABLE_LIBRARIES


def is_c_contiguous(shape, strides, itemsize):
    """Whether ``strides`` (in units where one element is ``itemsize``) lay
    ``shape`` out densely in row-major order.  Strides of length-1
    dimensions do not matter, nor any stride of an empty array."""
    if strides is None or 0 in shape:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _not_contiguous(source, shape, strides):
    return ValueError(f"{source} array is not C-contiguous (shape {shape}, strides "
                      f"{strides}); pyar views only dense row-major memory: make a "
                      "contiguous copy first (CuPy: cupy.ascontiguousarray, PyTorch: "
                      ".contiguous())")


def _check_requested(dtype, actual, source):
    if dtype is not None and as_dtype(dtype) != actual:
        raise TypeError(f"the {source} array holds {actual.name}, not {np.dtype(dtype).name}; "
                        "asarray does not convert on the device (reinterpret the bytes with "
                        ".view(dtype), or convert on the host)")


# --- DLPack -------------------------------------------------------------------------


def _dlpack_stream_argument(consumer, device_type):
    # The int a producer's __dlpack__ expects for the consumer's stream: the
    # legacy default is 1 on CUDA and 0 on ROCm.
    if consumer is not None:
        return consumer.handle
    return 0 if device_type == _dlpack.kDLROCM else 1


def from_dlpack(obj, dtype=None, stream=None):
    """A view of ``obj``, a GPU array exporting ``__dlpack__``.

    The producer is asked to order its pending work before ``stream`` (where
    the view's work will be queued; None: the legacy default stream).  The
    view is read-only when the producer says so (the READ_ONLY flag of a
    DLPack 1.x versioned tensor; legacy capsules cannot say it) or is JAX.
    """
    consumer = streams.normalize(stream)
    device_type, _ = obj.__dlpack_device__()
    argument = _dlpack_stream_argument(consumer, device_type)
    try:
        capsule = obj.__dlpack__(stream=argument, max_version=_dlpack.DLPACK_VERSION)
    except TypeError:
        # Producers from before DLPack 1.0 take no max_version.
        capsule = obj.__dlpack__(stream=argument)
    tensor = _dlpack.consume(capsule)
    # From here on ``tensor`` owns the producer's memory: raising drops it,
    # which calls the producer's deleter.
    if tensor.device_type not in GPU_DEVICE_TYPES:
        raise BufferError(f"DLPack tensor is on device type {tensor.device_type}, not a GPU")
    actual = dtype_from_dlpack(tensor.code, tensor.bits, tensor.lanes)
    _check_requested(dtype, actual, "DLPack")
    shape = tensor.shape
    if any(d < 0 for d in shape):
        raise BufferError(f"DLPack tensor has a negative dimension: shape {shape}")
    if not is_c_contiguous(shape, tensor.strides, 1):
        raise _not_contiguous("DLPack", shape, tensor.strides)
    size = math.prod(shape)
    if tensor.ptr == 0 and size:
        raise BufferError(f"DLPack tensor of shape {shape} has a null data pointer")
    # Managed memory reports device 0 whatever it is; ask the pointer instead.
    device = None if tensor.device_type == _dlpack.kDLCUDAManaged else tensor.device_id
    return DeviceArray._make(tensor.ptr, shape, actual, tensor, device, consumer,
                             tensor.is_readonly or _immutable(obj), tensor.device_type)


# --- CUDA array interface -----------------------------------------------------------


def _interface_shape(interface):
    shape = interface.get("shape")
    if not isinstance(shape, tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"__cuda_array_interface__ shape must be a tuple of ints, got "
                         f"{shape!r}")
    if any(d < 0 for d in shape):
        raise ValueError(f"__cuda_array_interface__ has a negative dimension: shape {shape}")
    return shape


def _interface_dtype(interface, dtype):
    typestr = interface.get("typestr")
    if not isinstance(typestr, str):
        raise ValueError(f"__cuda_array_interface__ typestr must be a str, got {typestr!r}")
    try:
        declared = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"__cuda_array_interface__ typestr {typestr!r} is not a numpy "
                        "type string") from None
    if declared.kind == "V" and declared.names is None and dtype is not None:
        # bfloat16 and float8 travel as anonymous bytes ("<V2", "|V1"); the
        # caller's dtype names them, provided the item size agrees.
        requested = as_dtype(dtype)
        if requested.itemsize != declared.itemsize:
            raise TypeError(f"dtype {requested.name} has {requested.itemsize}-byte items; "
                            f"the interface's typestr {typestr!r} has {declared.itemsize}")
        return requested
    try:
        actual = as_dtype(declared)
    except TypeError as error:
        raise TypeError(f"__cuda_array_interface__ typestr {typestr!r}: {error}"
                        + (" (pass dtype= to name anonymous bytes)"
                           if declared.kind == "V" else "")) from None
    _check_requested(dtype, actual, "__cuda_array_interface__")
    return actual


def _interface_data(interface, shape):
    data = interface.get("data")
    size = math.prod(shape)
    if data is None and not size:
        return 0, False
    if (not isinstance(data, tuple) or len(data) != 2 or not isinstance(data[0], int)
            or isinstance(data[0], bool) or not isinstance(data[1], bool)):
        raise ValueError(f"__cuda_array_interface__ data must be (int pointer, bool "
                         f"read-only), got {data!r}")
    ptr, readonly = data
    if ptr < 0:
        raise ValueError(f"__cuda_array_interface__ pointer is negative: {ptr}")
    if ptr == 0 and size:
        raise ValueError(f"__cuda_array_interface__ has a null pointer for shape {shape}")
    return ptr, readonly


def _interface_stream(interface, version):
    producer = interface.get("stream") if version >= 3 else None
    if producer is None:
        return None
    if producer == 0:
        raise ValueError("__cuda_array_interface__ stream 0 is forbidden by the interface "
                         "(1 names the legacy default stream, None means no synchronization)")
    return streams.from_protocol(producer)


def from_cuda_array_interface(obj, dtype=None, stream=None):
    """A view of ``obj``, which exposes ``__cuda_array_interface__``.

    If the interface names a stream, ``stream`` (where the view's work will
    be queued; None: the legacy default stream) is made to wait for it.
    ``dtype`` names the element type of anonymous-bytes typestrs (bfloat16
    and float8 arrive as ``<V2``/``|V1``).  The view is read-only when the
    interface's ``data`` tuple says so or the producer is JAX.
    """
    interface = obj.__cuda_array_interface__
    if not isinstance(interface, dict):
        raise TypeError(f"__cuda_array_interface__ must be a dict, got "
                        f"{type(interface).__name__}")
    version = interface.get("version")
    if (not isinstance(version, int) or isinstance(version, bool)
            or version not in _INTERFACE_VERSIONS):
        raise ValueError(f"unsupported __cuda_array_interface__ version {version!r}; pyar "
                         f"reads versions {_INTERFACE_VERSIONS[0]} to {_INTERFACE_VERSIONS[-1]}")
    shape = _interface_shape(interface)
    actual = _interface_dtype(interface, dtype)
    ptr, readonly = _interface_data(interface, shape)
    strides = interface.get("strides")
    if strides is not None and (not isinstance(strides, tuple) or len(strides) != len(shape)):
        raise ValueError(f"__cuda_array_interface__ strides must be None or a tuple of "
                         f"{len(shape)} ints, got {strides!r}")
    if not is_c_contiguous(shape, strides, actual.itemsize):
        raise _not_contiguous("__cuda_array_interface__", shape, strides)
    if interface.get("mask") is not None:
        raise ValueError("__cuda_array_interface__ has a mask; pyar does not take masked "
                         "arrays")
    consumer = streams.normalize(stream)
    streams.wait(consumer, _interface_stream(interface, version))
    return DeviceArray._make(ptr, shape, actual, obj, None, consumer,
                             readonly or _immutable(obj))
