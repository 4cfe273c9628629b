"""numpy references of the fused kernels' outputs: residual add + RMSNorm, the three
quantizers (FP8 per token, FP8 per group, MXFP4), their dequantization and rounding bounds.

CPU only (numpy and ml_dtypes); nothing here touches a GPU. The formats and every rounding
and edge-case choice are documented in :mod:`pyar.quant.fp8` and :mod:`pyar.quant.mxfp4`.

How a GPU test uses them: the quantizers are exact functions of their input, so quantizing
a kernel's own unquantized output must reproduce its scales exactly, and its codes up to the
float32-versus-float64 rounding of ``y / scale`` near ties; against the float64 reference y,
compare ``dequantize(q, scales, kind)`` within ``rounding_bound(y_ref, scales, kind)`` plus the
kernel's own accumulation error.
"""
import numpy as np
import ml_dtypes

from pyar.quant.fp8 import (dequantize_fp8, fp8_rounding_bound, quantize_fp8_per_group,
                            quantize_fp8_per_token)
from pyar.quant.mxfp4 import dequantize_mxfp4, mxfp4_rounding_bound, quantize_mxfp4
from pyar.quant.rmsnorm import add_rmsnorm_reference

KINDS = ("fp8_per_token", "fp8_per_group", "mxfp4")
_OUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_kind(kind, where):
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


def quantize(y, kind, group_size=128, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Dispatch to quantize_fp8_per_token, quantize_fp8_per_group (``group_size``) or
    quantize_mxfp4 (which ignores group_size and fp8_dtype). Returns ``(q, scales)``."""
    _check_kind(kind, "quantize")
    if kind == "fp8_per_token":
        return quantize_fp8_per_token(y, fp8_dtype=fp8_dtype)
    if kind == "fp8_per_group":
        return quantize_fp8_per_group(y, group_size=group_size, fp8_dtype=fp8_dtype)
    return quantize_mxfp4(y)


def dequantize(q, scales, kind, group_size=None, out_dtype=np.float32):
    """Values represented by quantized ``(q, scales)`` of the given kind, as out_dtype
    (float32 by default, or float64). Each value ``code * scale`` is computed exactly in
    float64 and rounded once to out_dtype.

    - "fp8_per_token": q float8_e4m3fn/float8_e4m3fnuz (tokens, hidden), scales float32
      (tokens, 1).
    - "fp8_per_group": as above with scales (tokens, hidden // group_size); ``group_size`` is
      inferred from the shapes and, when given, checked against them.
    - "mxfp4": q packed uint8 (tokens, hidden // 2), scales uint8 E8M0 (tokens, hidden // 32);
      group_size, when given, must be 32.
    """
    where = "dequantize"
    _check_kind(kind, where)
    if np.dtype(out_dtype) not in _OUT_DTYPES:
        raise TypeError(f"{where}: out_dtype must be float32 or float64, got {out_dtype!r}")
    if kind == "mxfp4":
        if group_size not in (None, 32):
            raise ValueError(f"{where}: mxfp4 blocks are 32 elements; got group_size "
                             f"{group_size}")
        return dequantize_mxfp4(q, scales, out_dtype=out_dtype, where=where)
    scales_shape = np.shape(scales)
    if kind == "fp8_per_token" and (len(scales_shape) != 2 or scales_shape[1] != 1):
        raise ValueError(f"{where}: fp8_per_token scales must have shape (tokens, 1), got "
                         f"{scales_shape}")
    return dequantize_fp8(q, scales, group_size=group_size, out_dtype=out_dtype, where=where)


def rounding_bound(y, scales, kind, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Per-element float64 bound on ``|dequantize(q, scales, kind, out_dtype=float64) - y|``
    when y (tokens, hidden) is quantized to codes with these scales by round to nearest: half
    the format's spacing at ``|y| / scale`` times the scale, plus any saturation excess.
    Holds for the quantizers here; for another quantizer (a kernel) with the same scales it is
    the bound a correctly rounding implementation meets. A float32 dequantization adds at
    most half a float32 ulp of the result."""
    _check_kind(kind, "rounding_bound")
    if kind == "mxfp4":
        return mxfp4_rounding_bound(y, scales)
    return fp8_rounding_bound(y, scales, fp8_dtype=fp8_dtype)


__all__ = ["KINDS", "add_rmsnorm_reference", "dequantize", "quantize", "quantize_fp8_per_group",
           "quantize_fp8_per_token", "quantize_mxfp4", "rounding_bound"]
