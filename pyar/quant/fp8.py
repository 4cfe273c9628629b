"""FP8 (E4M3) quantization with one float32 scale per token or per group: numpy reference.

Definition, for each group ``g`` of consecutive elements along the last axis (a whole row
for per-token quantization)::

    amax  = max |y[g]|                                     (exact)
    scale = max(float32(amax / FP8_MAX), FP8_MIN_SCALE)    (FP8_MAX = finfo(fp8).max)
    q[g]  = fp8(clip(y[g] / scale, -FP8_MAX, FP8_MAX))     (round to nearest, ties to even)

``amax / FP8_MAX`` is computed in float64 and rounded once to float32; for float16, bfloat16
or float32 input that is exactly the correctly rounded float32 division a kernel does.
The quotient ``y / scale`` is computed in float64 (one rounding) and then rounded to FP8 with
saturation: values beyond +-FP8_MAX (possible only by the rounding of the scale) become
+-FP8_MAX, never NaN. A kernel that multiplies by a float32 reciprocal instead may round a
near-tie differently: compare kernels after dequantization, within ``rounding_bound``.

``FP8_MIN_SCALE`` = 2**-126 (float32's smallest normal) is the floor of the scale: an all-zero
group gets exactly this scale and all-zero codes, and a group so small that amax / FP8_MAX is
subnormal or zero in float32 never yields a subnormal or zero scale (safe under
flush-to-zero, no division by zero). Zeros keep their sign where the format has one: -0.0
encodes as the negative zero 0x80 in e4m3fn; e4m3fnuz has no negative zero (0x80 is its NaN)
and encodes it as +0 (0x00).

FP8_MAX is 448 for float8_e4m3fn (NVIDIA, gfx950) and 240 for float8_e4m3fnuz (gfx942).
Non-finite input is rejected with ValueError.
"""
import numpy as np
import ml_dtypes

from pyar.quant._common import as_float_array, check_divisible, check_finite, half_ulp

FP8_DTYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz))
FP8_MIN_SCALE = np.float32(2.0 ** -126)


def _check_fp8_dtype(fp8_dtype, where):
    try:
        dt = np.dtype(fp8_dtype)
    except TypeError:
        dt = None
    if dt not in FP8_DTYPES:
        raise TypeError(f"{where}: fp8_dtype {fp8_dtype!r} is not supported; expected "
                        "ml_dtypes.float8_e4m3fn or ml_dtypes.float8_e4m3fnuz")
    return dt


def fp8_max(fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Largest finite value of an FP8 E4M3 dtype: 448.0 (e4m3fn) or 240.0 (e4m3fnuz)."""
    return float(ml_dtypes.finfo(_check_fp8_dtype(fp8_dtype, "fp8_max")).max)


def fp8_format(fp8_dtype):
    """(mantissa bits, minimum normal exponent, max) of an FP8 E4M3 dtype."""
    dt = _check_fp8_dtype(fp8_dtype, "fp8_format")
    fi = ml_dtypes.finfo(dt)
    return int(fi.nmant), int(fi.minexp), float(fi.max)


def round_to_fp8(v, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Round float values to an FP8 E4M3 dtype: to nearest, ties to even, saturating to
    +-FP8_MAX (a plain cast gives NaN from FP8_MAX + half a spacing on). -0.0 stays -0.0 in
    e4m3fn and becomes +0 in e4m3fnuz. NaN: ValueError."""
    dt = _check_fp8_dtype(fp8_dtype, "round_to_fp8")
    v = np.asarray(v, dtype=np.float64)
    if np.isnan(v).any():
        raise ValueError("round_to_fp8: NaN is not rounded (the quantizers reject it)")
    fmax = float(ml_dtypes.finfo(dt).max)
    return np.clip(v, -fmax, fmax).astype(dt)


def _quantize_groups(y, group_size, fp8_dtype, where):
    dt = _check_fp8_dtype(fp8_dtype, where)
    y = as_float_array("y", where, y, ndim=2)
    tokens, hidden = y.shape
    if hidden == 0:
        raise ValueError(f"{where}: hidden size (last axis of y) is 0")
    if group_size is None:
        group_size = hidden
    elif isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or group_size < 1:
        raise ValueError(f"{where}: group_size must be a positive integer, got {group_size!r}")
    group_size = int(group_size)
    check_divisible(where, hidden, group_size, "group_size")
    y64 = y.astype(np.float64)
    check_finite("y", where, y64)
    fmax = float(ml_dtypes.finfo(dt).max)
    groups = y64.reshape(tokens, hidden // group_size, group_size)
    amax = np.abs(groups).max(axis=-1)
    with np.errstate(over="ignore"):
        scales = np.maximum((amax / fmax).astype(np.float32), FP8_MIN_SCALE)
    if not np.isfinite(scales).all():
        first = tuple(int(i) for i in np.argwhere(~np.isfinite(scales))[0])
        raise ValueError(f"{where}: group {first} has a maximum too large for a float32 scale "
                         f"(amax / {fmax:g} overflows float32)")
    q = round_to_fp8(groups / scales.astype(np.float64)[..., None], dt)
    return q.reshape(tokens, hidden), scales


def quantize_fp8_per_token(y, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Quantize y (tokens, hidden) to FP8 with one scale per token (see the module doc).

    Returns ``(q, scales)``: q of dtype ``fp8_dtype`` and shape (tokens, hidden), scales
    float32 of shape (tokens, 1), with ``y ~= q.astype(float32) * scales``.
    """
    return _quantize_groups(y, None, fp8_dtype, "quantize_fp8_per_token")


def quantize_fp8_per_group(y, group_size=128, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Quantize y (tokens, hidden) to FP8 with one scale per group of ``group_size``
    consecutive elements of a row (see the module doc); hidden must be divisible by it.

    Returns ``(q, scales)``: q of dtype ``fp8_dtype`` and shape (tokens, hidden), scales
    float32 of shape (tokens, hidden // group_size); scale ``[t, j]`` covers
    ``y[t, j*group_size:(j+1)*group_size]``.
    """
    return _quantize_groups(y, group_size, fp8_dtype, "quantize_fp8_per_group")


def dequantize_fp8(q, scales, group_size=None, out_dtype=np.float32,
                   where="dequantize_fp8"):
    """``q * scale`` per group, computed exactly in float64 and rounded once to out_dtype.

    q: float8_e4m3fn or float8_e4m3fnuz of shape (tokens, hidden); scales: float32 of shape
    (tokens, groups) with hidden divisible by groups (groups = 1 for per-token scales). The
    group size is hidden // groups; ``group_size``, when given, must agree with it.
    """
    q = np.asarray(q)
    if q.dtype not in FP8_DTYPES:
        hint = " (view raw bytes with .view(ml_dtypes.float8_e4m3fn))" \
            if q.dtype == np.uint8 else ""
        raise TypeError(f"{where}: q has dtype {q.dtype}; expected float8_e4m3fn or "
                        f"float8_e4m3fnuz{hint}")
    if q.ndim != 2 or q.shape[1] == 0:
        raise ValueError(f"{where}: q must be 2-D (tokens, hidden) with hidden > 0, "
                         f"got shape {q.shape}")
    scales = np.asarray(scales)
    if scales.dtype != np.float32:
        raise TypeError(f"{where}: scales have dtype {scales.dtype}; expected float32")
    tokens, hidden = q.shape
    if scales.ndim != 2 or scales.shape[0] != tokens or scales.shape[1] == 0 \
            or hidden % scales.shape[1]:
        raise ValueError(f"{where}: scales have shape {scales.shape}; expected ({tokens}, G) "
                         f"with G dividing hidden {hidden}")
    inferred = hidden // scales.shape[1]
    if group_size is not None and group_size != inferred:
        raise ValueError(f"{where}: group_size {group_size} does not match the shapes: q "
                         f"{q.shape} with scales {scales.shape} means groups of {inferred}")
    v = q.astype(np.float64).reshape(tokens, scales.shape[1], inferred)
    v = v * scales.astype(np.float64)[..., None]
    return v.reshape(tokens, hidden).astype(out_dtype)


def fp8_rounding_bound(y, scales, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Per-element bound (float64) on |q * scale - y| for FP8 quantization of y (tokens,
    hidden) with float32 ``scales`` (tokens, groups): half an FP8 spacing at |y| / scale, plus
    the saturation excess beyond FP8_MAX."""
    nmant, emin, fmax = fp8_format(fp8_dtype)
    y = np.asarray(y, dtype=np.float64)
    s = np.asarray(scales, dtype=np.float64)
    tokens, hidden = y.shape
    v = np.abs(y).reshape(tokens, s.shape[1], hidden // s.shape[1]) / s[..., None]
    bound = half_ulp(np.minimum(v, fmax), nmant, emin) + np.maximum(v - fmax, 0.0)
    return (bound * s[..., None]).reshape(tokens, hidden)
