"""The checks every collective runs on its array arguments: device arrays
on the call's device, outputs of the right shape and dtype that may be
written, and overlap between arrays."""
import numpy as np

from pyar import _hip
from pyar.array import DeviceArray, asarray, empty
from pyar.comm.kernels import PACK_BYTES


def device_array(x, what, device, stream=None, *, dtypes=None, aligned=False, foreign=None):
    """``x`` as a DeviceArray on ``device``.  A foreign (CuPy, PyTorch, ...)
    array's producer orders its pending work before ``stream``, where the
    call's kernels read and write it (the DLPack and array-interface
    contract); ``foreign`` (a pyar.array.foreign.ForeignViews) remembers the
    view for the next call's replay.  With ``dtypes``, x must have one of
    them; with ``aligned``, a non-empty x must start on a 16-byte pack."""
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what} is a host (numpy) array; copy it to the GPU with "
                        "pyar.asarray first")
    given = x
    if not isinstance(x, DeviceArray):
        x = asarray(x, stream=stream)
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{what} has dtype {x.dtype}; all-reduce supports "
                        f"{', '.join(str(d) for d in dtypes)}")
    if x.size and x.device != device:
        raise ValueError(f"{what} lives on device {x.device}, the call runs on device {device}")
    if aligned and x.size and x.ptr % PACK_BYTES:
        raise ValueError(f"{what} is not {PACK_BYTES}-byte aligned (address {x.ptr:#x})")
    if foreign is not None and given is not x:
        foreign.remember(given, x)
    return x


def checked_output(out, what, shape, dtypes, device, stream, *, like="", any_shape=False,
                   foreign=None):
    """``out`` checked to be an aligned device array on ``device`` with
    ``shape`` (with ``any_shape``: as many elements) and one of ``dtypes``,
    that may be written; a new array of ``shape`` and ``dtypes[0]`` when
    None, ordered on the call's stream (the null stream included), so that
    dropping it frees it there without waiting for the device."""
    if out is None:
        return empty(shape, dtypes[0], stream=_hip.as_stream(stream))
    out = device_array(out, what, device, stream, aligned=True, foreign=foreign)
    fits = out.size == int(np.prod(shape)) if any_shape else out.shape == shape
    if not fits or out.dtype not in dtypes:
        elements = f" ({int(np.prod(shape))} elements)" if any_shape else ""
        raise ValueError(f"{what} has shape {out.shape} and dtype {out.dtype}; expected "
                         f"{shape}{elements} and {' or '.join(map(str, dtypes))}{like}")
    if out.readonly:
        raise ValueError(f"{what} is a read-only array")
    return out


def overlaps(a, b):
    """Whether the memory of arrays ``a`` and ``b`` overlaps (never for an empty one)."""
    return bool(a.nbytes and b.nbytes) and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
