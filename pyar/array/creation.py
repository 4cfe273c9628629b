"""Making DeviceArrays: new allocations, and ``asarray`` for anything else."""
import math

import numpy as np

from pyar._hip import DeviceMemory, memset, stream_ordered_memory
from pyar.array import streams
from pyar.array.device_array import DeviceArray, normalize_shape, on_device
from pyar.array.dtypes import as_dtype
from pyar.array.interop import (
    GPU_DEVICE_TYPES, HOST_DEVICE_TYPES, from_cuda_array_interface, from_dlpack,
)


def _memory(nbytes, stream, ipc):
    # hipMalloc where other processes must map it; else the stream-ordered
    # pool, whose frees queue on the stream instead of waiting for the device.
    return DeviceMemory(nbytes) if ipc else stream_ordered_memory(nbytes, stream)


def _allocate(shape, dtype, stream, device=None, ipc=False):
    shape = normalize_shape(shape)
    dtype = as_dtype(dtype)
    stream = streams.normalize(stream)
    nbytes = math.prod(shape) * dtype.itemsize
    if device is None:
        memory = _memory(nbytes, stream, ipc)
    else:
        with on_device(device):
            memory = _memory(nbytes, stream, ipc)
    return DeviceArray._make(memory.ptr, shape, dtype, memory, memory.device, stream, False)


def _clear(array):
    if array.nbytes:
        memset(array.ptr, 0, array.nbytes, array.stream)
    return array


def empty(shape, dtype=np.float32, stream=None, *, ipc=False):
    """A new array on the current device, contents undefined.  ``stream``
    becomes the array's stream.

    The memory comes from the device's stream-ordered pool, allocated on
    ``stream`` and given back on it when the last reference goes, without
    waiting for the device (without a stream, the free waits for the device).
    ``ipc=True`` allocates with hipMalloc instead, for buffers other
    processes map (``Communicator.register``)."""
    return _allocate(shape, dtype, stream, ipc=ipc)


def zeros(shape, dtype=np.float32, stream=None, *, ipc=False):
    """A new zero-filled array on the current device (see ``empty``); the
    fill is queued on ``stream`` (synchronous on the null stream when None)."""
    return _clear(_allocate(shape, dtype, stream, ipc=ipc))


def _like(a, dtype):
    if isinstance(a, DeviceArray):
        return a.shape, a.dtype if dtype is None else dtype, a.stream, a.device
    # Any array-like with shape and dtype (numpy, CuPy, ...): current device.
    return a.shape, a.dtype if dtype is None else dtype, None, None


def empty_like(a, dtype=None, *, ipc=False):
    """A new array with ``a``'s shape (and dtype, unless given); for a
    DeviceArray, on its device and stream.  ``ipc`` as for ``empty``."""
    shape, dtype, stream, device = _like(a, dtype)
    return _allocate(shape, dtype, stream, device, ipc)


def zeros_like(a, dtype=None, *, ipc=False):
    """Like ``empty_like``, zero-filled."""
    shape, dtype, stream, device = _like(a, dtype)
    return _clear(_allocate(shape, dtype, stream, device, ipc))


def asarray(obj, dtype=None, stream=None, *, ipc=False):
    """A DeviceArray for ``obj``.

    - a DeviceArray: itself (its dtype must match ``dtype`` if given);
    - a GPU array with ``__dlpack__`` or ``__cuda_array_interface__`` (CuPy,
      PyTorch, JAX, Numba, ...): a zero-copy view that keeps the producer
      alive; ``stream`` (where the view will be used; None: the legacy
      default stream) is made to wait for the producer's pending work;
    - anything else numpy accepts: a copy on the current device, converted to
      ``dtype`` on the host first if given, queued on ``stream``, in memory
      allocated like ``empty``'s (``ipc`` likewise).

    Device memory must be C-contiguous: views never copy, so strided
    producers raise ValueError.  A view of memory its producer marks
    read-only (DLPack 1.x's READ_ONLY flag, the array interface's read-only
    bit) or of a JAX array (immutable) is ``readonly``: pyar never writes it
    (``set``, ``fill`` and collectives' ``out`` refuse it).
    """
    if isinstance(obj, DeviceArray):
        if dtype is not None and as_dtype(dtype) != obj.dtype:
            raise TypeError(f"the DeviceArray holds {obj.dtype.name}, not "
                            f"{np.dtype(dtype).name}; asarray does not convert on the device "
                            "(reinterpret the bytes with .view(dtype), or convert on the "
                            "host: pyar.asarray(x.get().astype(dtype)))")
        return obj
    device_type = _dlpack_device_type(obj)
    if device_type in GPU_DEVICE_TYPES:
        return from_dlpack(obj, dtype, stream)
    if device_type not in HOST_DEVICE_TYPES:
        if hasattr(obj, "__cuda_array_interface__"):
            return from_cuda_array_interface(obj, dtype, stream)
        if device_type is not None:
            raise TypeError(f"{type(obj).__name__} lives on DLPack device type {device_type}; "
                            "pyar takes GPU (CUDA, ROCm) and host arrays")
    host = np.ascontiguousarray(np.asarray(obj, dtype=None if dtype is None else as_dtype(dtype)))
    out = _allocate(host.shape, host.dtype, stream, ipc=ipc)
    out.set(host)
    return out


def _dlpack_device_type(obj):
    # None when ``obj`` does not speak DLPack.
    if not hasattr(obj, "__dlpack__"):
        return None
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    return None if dlpack_device is None else dlpack_device()[0]
