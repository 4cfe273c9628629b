"""DeviceArray: a C-contiguous n-d array in GPU memory, and its exports
through ``__cuda_array_interface__`` and DLPack."""
import contextlib
import math
import operator

import numpy as np

from pyar._hip import (
    DeviceMemory, IpcMapping, PoolMemory, get_device, memcpy_dtod, memcpy_dtoh, memcpy_htod,
    memset, platform, pointer_device, set_device,
)
from pyar.array import _dlpack, streams
from pyar.array.dtypes import as_dtype, to_dlpack


@contextlib.contextmanager
def on_device(ordinal):
    """Make ``ordinal`` current for the block, then restore the caller's device."""
    current = get_device()
    if current == ordinal:
        yield
        return
    set_device(ordinal)
    try:
        yield
    finally:
        set_device(current)


def normalize_shape(shape):
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative ints."""
    if isinstance(shape, (tuple, list)):
        dims = shape
    else:
        try:
            dims = (operator.index(shape),)
        except TypeError:
            raise TypeError(f"shape must be an int or a tuple of ints, not "
                            f"{type(shape).__name__}") from None
    try:
        result = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"shape must contain only ints, got {tuple(dims)!r}") from None
    if any(d < 0 for d in result):
        raise ValueError(f"negative dimension in shape {result}")
    return result


def _resolve_reshape(shape, size):
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1:
        raise ValueError(f"can only infer one dimension of {shape}")
    if any(d < -1 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    if not unknown:
        if math.prod(shape) != size:
            raise ValueError(f"cannot reshape {size} elements into shape {shape}")
        return shape
    known = math.prod(d for d in shape if d != -1)
    if known == 0 or size % known:
        raise ValueError(f"cannot reshape {size} elements into shape {shape}")
    return tuple(size // known if d == -1 else d for d in shape)


def _host_bytes(array):
    # Plain bytes for the runtime's copies: numpy refuses to export
    # ml_dtypes' types to a buffer consumer that asks for the format.
    return array.reshape(-1).view(np.uint8)


class DeviceArray:
    """A C-contiguous n-d array in GPU memory.

    Made by ``pyar.empty``, ``pyar.zeros``, ``pyar.asarray`` (a host copy or a
    zero-copy view of a CuPy/PyTorch/JAX/... array), or
    ``DeviceArray.from_pointer``.  It keeps what owns its memory alive: the
    ``DeviceMemory`` pyar allocated, or the foreign producer it views.

    ``stream`` is the stream the array's work is queued on (None: the legacy
    null stream).  The exports announce it, ``get``/``set``/``copy``/``fill``
    default to it, and consumers given the array through DLPack or the CUDA
    array interface wait for it.
    """

    __slots__ = ("_ptr", "_shape", "_dtype", "_owner", "_device", "_stream", "_readonly",
                 "_dl_device_type", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError("DeviceArray is not constructed directly: use pyar.empty, pyar.zeros, "
                        "pyar.asarray or DeviceArray.from_pointer")

    @classmethod
    def _make(cls, ptr, shape, dtype, owner, device, stream, readonly, dl_device_type=None):
        # No validation: the callers checked, or derive from a checked array.
        self = object.__new__(cls)
        self._ptr = ptr
        self._shape = shape
        self._dtype = dtype
        self._owner = owner
        self._device = device
        self._stream = stream
        self._readonly = readonly
        self._dl_device_type = dl_device_type
        return self

    @classmethod
    def from_pointer(cls, ptr, shape, dtype, *, owner=None, device=None, stream=None,
                     readonly=False):
        """View ``shape`` C-contiguous ``dtype`` elements at device address ``ptr``.

        pyar never frees ``ptr``; ``owner`` (any object) is kept alive as long
        as the array or an export of it lives.  ``device`` is the ordinal of
        the GPU holding the memory; None looks it up from the pointer when
        first asked.  ``stream`` is where work on the memory is queued.
        """
        if not isinstance(ptr, int) or isinstance(ptr, bool):
            raise TypeError(f"ptr must be an int device address, not {type(ptr).__name__}")
        if ptr < 0:
            raise ValueError(f"a device address cannot be negative: {ptr}")
        shape = normalize_shape(shape)
        dtype = as_dtype(dtype)
        if ptr == 0 and math.prod(shape):
            raise ValueError(f"null pointer for a non-empty array of shape {shape}")
        if device is not None:
            device = operator.index(device)
            if device < 0:
                raise ValueError(f"device ordinal must be >= 0, got {device}")
        return cls._make(ptr, shape, dtype, owner, device, streams.normalize(stream),
                         bool(readonly))

    def _view(self, shape, dtype):
        return DeviceArray._make(self._ptr, shape, dtype, self._owner, self._device,
                                 self._stream, self._readonly, self._dl_device_type)

    # --- attributes ---------------------------------------------------------------

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def size(self):
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def itemsize(self):
        return self._dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self._dtype.itemsize

    @property
    def ptr(self):
        """The device address of the first element (an int)."""
        if isinstance(self._owner, (DeviceMemory, PoolMemory, IpcMapping)) and self._owner.closed:
            raise ValueError("the device memory of this array was freed (its "
                             f"{type(self._owner).__name__} is closed)")
        return self._ptr

    @property
    def device(self):
        """Ordinal of the GPU holding the data."""
        if self._device is None:
            # Foreign memory: ask the runtime once, on first use, so that
            # making a view costs no GPU call.
            self._device = pointer_device(self.ptr) if self._ptr else get_device()
        return self._device

    @property
    def stream(self):
        """The pyar Stream work on this array is queued on; None for the null stream."""
        return self._stream

    @property
    def readonly(self):
        """Whether pyar must not write the memory (a view of an export its
        producer marked read-only, or of a JAX array): ``set``, ``fill`` and
        the collectives' outputs refuse it."""
        return self._readonly

    @property
    def stream_ordered(self):
        """Whether the memory comes from the stream-ordered pool (``pyar.empty``
        and friends without ``ipc=True``): freed without synchronizing, but not
        shareable with other processes."""
        owner = self._owner
        while isinstance(owner, DeviceArray):  # a view of a pyar array
            owner = owner._owner
        return isinstance(owner, PoolMemory)

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __repr__(self):
        device = "?" if self._device is None else self._device
        flags = ", read-only" if self._readonly else ""
        return (f"<pyar.DeviceArray shape={self._shape} dtype={self._dtype.name} "
                f"device={device}{flags}>")

    # --- data movement --------------------------------------------------------------

    def _work_stream(self, stream):
        return self._stream if stream is None else streams.normalize(stream)

    def _check_writable(self):
        if self._readonly:
            raise ValueError("this DeviceArray is read-only")

    def get(self, stream=None):
        """A numpy copy of the data.  The copy is queued on ``stream`` (default:
        the array's stream) and waited for."""
        out = np.empty(self._shape, self._dtype)
        if out.nbytes:
            stream = self._work_stream(stream)
            memcpy_dtoh(_host_bytes(out), self.ptr, stream)
            if stream is not None:
                stream.synchronize()
        return out

    def set(self, host, stream=None):
        """Copy the host array ``host`` (same shape and dtype) into this array,
        queued on ``stream`` (default: the array's stream)."""
        self._check_writable()
        host = np.asarray(host)
        if host.dtype != self._dtype:
            raise TypeError(f"dtype mismatch: the DeviceArray holds {self._dtype.name}, the "
                            f"host data is {host.dtype.name} (convert it with .astype first)")
        if host.shape != self._shape:
            raise ValueError(f"shape mismatch: the DeviceArray has shape {self._shape}, the "
                             f"host data {host.shape}")
        if host.nbytes:
            memcpy_htod(self.ptr, _host_bytes(np.ascontiguousarray(host)),
                        self._work_stream(stream))

    def copy(self):
        """A new DeviceArray on the same device with a copy of the data,
        queued on the array's stream."""
        with on_device(self.device):
            memory = DeviceMemory(self.nbytes)
        out = DeviceArray._make(memory.ptr, self._shape, self._dtype, memory, memory.device,
                                self._stream, False)
        if self.nbytes:
            memcpy_dtod(memory.ptr, self.ptr, self.nbytes, self._stream)
        return out

    def fill(self, value):
        """Set every element to ``value`` (cast like numpy's ``fill``), queued
        on the array's stream."""
        self._check_writable()
        element = np.array(value, dtype=self._dtype)
        if not self.nbytes:
            return
        pattern = element.tobytes()
        if pattern == pattern[:1] * len(pattern):
            memset(self.ptr, pattern[0], self.nbytes, self._stream)
        else:
            memcpy_htod(self.ptr, _host_bytes(np.full(self._shape, element)), self._stream)

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("numpy cannot view device memory; np.asarray(x) copies it to "
                             "the host (copy=False is impossible)")
        out = self.get()
        return out if dtype is None else out.astype(dtype, copy=False)

    # --- views ----------------------------------------------------------------------

    def reshape(self, *shape):
        """A view with another shape of the same size; one dimension may be -1."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]
        try:
            shape = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must contain only ints, got {shape!r}") from None
        return self._view(_resolve_reshape(shape, self.size), self._dtype)

    def ravel(self):
        """A 1-d view of all elements."""
        return self._view((self.size,), self._dtype)

    def view(self, dtype):
        """The same bytes as ``dtype``; with another itemsize the last
        dimension is rescaled, as in numpy."""
        dtype = as_dtype(dtype)
        if dtype.itemsize == self.itemsize:
            return self._view(self._shape, dtype)
        if not self._shape:
            raise ValueError(f"a 0-d {self._dtype.name} array cannot be viewed as "
                             f"{dtype.name}: the itemsizes differ")
        last = self._shape[-1] * self.itemsize
        if last % dtype.itemsize:
            raise ValueError(f"cannot view shape {self._shape} of {self._dtype.name} as "
                             f"{dtype.name}: the last dimension spans {last} bytes, not a "
                             f"multiple of {dtype.itemsize}")
        return self._view(self._shape[:-1] + (last // dtype.itemsize,), dtype)

    # --- CUDA array interface -----------------------------------------------------

    @property
    def __cuda_array_interface__(self):
        """Version 3 of the CUDA array interface.  bfloat16 and float8 have no
        typestr of their own; like numpy, pyar names them ``V2``/``V1`` (use
        DLPack to carry them with their type)."""
        typestr = self._dtype.str
        return {
            "shape": self._shape,
            "typestr": typestr,
            "descr": [("", typestr)],
            "data": (self.ptr, self._readonly),
            "strides": None,
            "version": 3,
            # The interface forbids 0; 1 names the legacy default stream.
            "stream": 1 if self._stream is None else self._stream.handle,
        }

    # --- DLPack ---------------------------------------------------------------------

    def __dlpack_device__(self):
        """``(kDLCUDA, ordinal)`` on NVIDIA, ``(kDLROCM, ordinal)`` on AMD."""
        if self._dl_device_type is None:
            self._dl_device_type = _dlpack.kDLROCM if platform() == "hip" else _dlpack.kDLCUDA
        return self._dl_device_type, self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule viewing this array (a copy if ``copy=True``).

        ``stream`` is the consumer's stream as an int (None: the legacy
        default; -1: no synchronization); it is made to wait for the array's
        stream.  A ``max_version`` of (1, x) or later gets a versioned
        capsule, which can mark the data read-only.
        """
        # None: the legacy default stream; -1: the consumer orders the work itself.
        synchronize = stream != -1
        consumer = None if stream in (None, -1) else streams.from_protocol(stream)
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"pyar cannot export to DLPack device {tuple(dl_device)}; the "
                              f"array is on {self.__dlpack_device__()}")
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        if self._readonly and not copy and not versioned:
            raise BufferError("a read-only DeviceArray exports only as a versioned DLPack "
                              "capsule (max_version >= (1, 0)); a legacy capsule cannot "
                              "mark it read-only")
        source = self.copy() if copy else self
        if synchronize:
            streams.wait(consumer, source._stream)
        device_type, device = source.__dlpack_device__()
        code, bits, _ = to_dlpack(source._dtype)
        return _dlpack.export(source, source.ptr, source._shape, code, bits, device_type,
                              device, versioned=versioned, readonly=source._readonly,
                              copied=bool(copy))
