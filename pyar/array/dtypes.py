"""The element types a DeviceArray may hold, as numpy dtypes, and their
DLPack ``(code, bits, lanes)`` names.

bfloat16 and the float8 formats are ml_dtypes' numpy types.  Sub-byte
formats (float4, float6, int4) are left out: ml_dtypes stores one per byte,
DLPack packs them, so no view could be zero-copy in both worlds.
"""
import ml_dtypes
import numpy as np

# dlpack.h DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6
kDLFloat8_e3m4 = 7
kDLFloat8_e4m3 = 8
kDLFloat8_e4m3b11fnuz = 9
kDLFloat8_e4m3fn = 10
kDLFloat8_e4m3fnuz = 11
kDLFloat8_e5m2 = 12
kDLFloat8_e5m2fnuz = 13
kDLFloat8_e8m0fnu = 14

_NUMPY_TYPES = [
    (np.bool_, kDLBool),
    (np.int8, kDLInt), (np.int16, kDLInt), (np.int32, kDLInt), (np.int64, kDLInt),
    (np.uint8, kDLUInt), (np.uint16, kDLUInt), (np.uint32, kDLUInt), (np.uint64, kDLUInt),
    (np.float16, kDLFloat), (np.float32, kDLFloat), (np.float64, kDLFloat),
    (np.complex64, kDLComplex), (np.complex128, kDLComplex),
]

_ML_DTYPES_TYPES = [
    ("bfloat16", kDLBfloat),
    ("float8_e3m4", kDLFloat8_e3m4),
    ("float8_e4m3", kDLFloat8_e4m3),
    ("float8_e4m3b11fnuz", kDLFloat8_e4m3b11fnuz),
    ("float8_e4m3fn", kDLFloat8_e4m3fn),
    ("float8_e4m3fnuz", kDLFloat8_e4m3fnuz),
    ("float8_e5m2", kDLFloat8_e5m2),
    ("float8_e5m2fnuz", kDLFloat8_e5m2fnuz),
    ("float8_e8m0fnu", kDLFloat8_e8m0fnu),
]


def _build_tables():
    pairs = [(np.dtype(t), code) for t, code in _NUMPY_TYPES]
    # Older ml_dtypes releases lack some float8 formats; offer what is there.
    pairs += [(np.dtype(getattr(ml_dtypes, name)), code)
              for name, code in _ML_DTYPES_TYPES if hasattr(ml_dtypes, name)]
    to_dlpack = {dt: (code, dt.itemsize * 8, 1) for dt, code in pairs}
    from_dlpack = {triple: dt for dt, triple in to_dlpack.items()}
    return to_dlpack, from_dlpack


_TO_DLPACK, _FROM_DLPACK = _build_tables()

SUPPORTED_DTYPES = tuple(_TO_DLPACK)
"""Every dtype a DeviceArray can hold."""


def _supported_names():
    return ", ".join(dt.name for dt in SUPPORTED_DTYPES)


def as_dtype(dtype):
    """``dtype`` as a supported numpy dtype; TypeError naming it otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"{dtype!r} is not a dtype ({error})") from None
    if not dt.isnative:
        raise TypeError(f"dtype {dt.str} has non-native byte order; GPUs use the host's "
                        f"(convert with .astype({dt.newbyteorder('=').name!r}) on the host)")
    if dt not in _TO_DLPACK:
        raise TypeError(f"unsupported dtype {dt.name}; pyar arrays hold {_supported_names()}")
    return dt


def to_dlpack(dtype):
    """DLPack ``(code, bits, lanes)`` of a supported dtype."""
    return _TO_DLPACK[as_dtype(dtype)]


def from_dlpack(code, bits, lanes):
    """The numpy dtype for a DLPack ``(code, bits, lanes)``; TypeError if pyar has none."""
    dt = _FROM_DLPACK.get((code, bits, lanes))
    if dt is None:
        raise TypeError(f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}); "
                        f"pyar arrays hold {_supported_names()}")
    return dt
