"""MXFP4 quantization per the OCP Microscaling Formats (MX) Specification v1.0: numpy reference.

Format (spec sections 5.1-5.3): blocks of k = 32 consecutive elements along the last axis;
each block holds one shared scale X in E8M0 and 32 private elements P_i in FP4 E2M1, and
represents the values ``X * P_i``.

- E2M1 (sign, 2 exponent bits, 1 mantissa bit, bias 1, no Inf/NaN): codes 0..7 are
  +{0, 0.5, 1, 1.5, 2, 3, 4, 6}, codes 8..15 the same with the sign bit set (8 is -0).
  Largest normal exponent emax_elem = 2 (6 = 1.5 * 2**2).
- E8M0 (8 exponent bits, no sign, no mantissa, bias 127): code c means 2**(c - 127), so
  2**-127 (code 0) to 2**127 (code 254); code 0xFF is NaN. There is no zero.

Conversion (spec section 6.3, "Algorithm 1")::

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem          # emax_elem = 2
    X          = 2**shared_exp
    P_i        = E2M1(V_i / X), round to nearest ties to even, saturating to +-6

so ``max|V_i| / X`` lies in [4, 8); above 6 it saturates (the spec clamps normals to the
element format's max normal). floor(log2 amax) is taken exactly, from the binary exponent.

Choices where the spec leaves room, matching the MX reference emulation (microsoft/
microxcaling, ``_shared_exponents``/``_quantize_mx``), which clamps shared exponents below
-127 to -127:

- A block whose amax is 0 gets ``shared_exp = -127``: scale code 0x00 (2**-127), elements
  +0 (code 0) or -0 (code 8) by the input's sign. This is also what a kernel obtains from the
  biased exponent field of a float32 amax of 0 (0 - 127 - 2, clamped to -127).
- ``shared_exp`` below -127 (amax < 2**-125, e.g. float32 subnormals) is clamped to -127;
  elements then round (mostly to zero) on that scale. Above 127 (amax >= 2**130, only
  reachable from float64 input) cannot be stored: ValueError, never a NaN scale.
- Signs are kept: a negative value that rounds to zero encodes as -0 (code 8), as an IEEE
  round-to-nearest conversion (and ml_dtypes' float4_e2m1fn) does.
- Non-finite input is rejected with ValueError.

Packing: two E2M1 codes per byte, the element of even index in the low nibble (bits 0-3) and
the next, odd index, in the high nibble (bits 4-7): ``byte = code[2j] | code[2j+1] << 4``.
The MX spec defines the element encodings but leaves the memory layout to implementations;
this is the little-endian order of PyTorch's ``float4_e2m1fn_x2`` as its tests pack it for
cuBLAS block-scaled GEMMs (``pack_uint4`` in test_matmul_cuda.py: ``d[1::2] << 4 | d[::2]``)
and of torchao's ``mx_formats``: element 0 in the least significant bits. (Some non-MX
4-bit codecs put the first element in the high nibble; their bytes are not interchangeable
with these.) Scales are stored one byte per block as the biased E8M0 code (uint8); the bytes
are also a valid ``ml_dtypes.float8_e8m0fnu``.
"""
import numpy as np

from pyar.quant._common import as_float_array, check_divisible, check_finite, half_ulp

MX_BLOCK_SIZE = 32
E2M1_MAX = 6.0
E2M1_EMAX = 2          # exponent of E2M1's largest normal (emax_elem in the spec)
E2M1_MANTISSA_BITS = 1
E2M1_EMIN = 0          # exponent of E2M1's smallest normal, 1.0 (bias 1)
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127

#: value of each of the 16 E2M1 codes (index = code), as float32; code 8 is -0.0
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
_E2M1_MAGNITUDES = E2M1_VALUES[:8].astype(np.float64)


def encode_e2m1(v):
    """E2M1 codes (uint8, 0..15) of the float values v: round to nearest, ties to the even
    code (mantissa bit 0), magnitudes above 6 saturate to 6, the sign bit is v's sign bit
    (so -0.0 and negative values rounding to zero give code 8). NaN: ValueError."""
    v = np.asarray(v, dtype=np.float64)
    if np.isnan(v).any():
        raise ValueError("encode_e2m1: NaN has no E2M1 encoding")
    a = np.minimum(np.abs(v), E2M1_MAX)
    hi = np.searchsorted(_E2M1_MAGNITUDES, a, side="left")   # first grid point >= a
    lo = np.maximum(hi - 1, 0)
    d_lo = a - _E2M1_MAGNITUDES[lo]
    d_hi = _E2M1_MAGNITUDES[hi] - a
    mag = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    return (mag | (np.signbit(v).astype(np.intp) << 3)).astype(np.uint8)


def _check_codes(codes, where):
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui":
        raise TypeError(f"{where}: codes have dtype {codes.dtype}; expected an integer dtype")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError(f"{where}: E2M1 codes must be in 0..15")
    return codes.astype(np.uint8)


def decode_e2m1(codes):
    """float32 values of E2M1 codes (integers 0..15)."""
    return E2M1_VALUES[_check_codes(codes, "decode_e2m1")]


def pack_fp4(codes):
    """Pack 4-bit codes two per byte along the last axis: even index in the low nibble."""
    codes = _check_codes(codes, "pack_fp4")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: the last axis must have even length, got shape "
                         f"{codes.shape}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed):
    """Inverse of pack_fp4: uint8 (..., n) -> codes uint8 (..., 2n)."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim == 0:
        raise TypeError(f"unpack_fp4: expected a uint8 array, got {packed.dtype} of shape "
                        f"{packed.shape}")
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def e8m0_to_float(codes):
    """float64 value 2**(code - 127) of E8M0 codes (uint8, or float8_e8m0fnu viewed as
    bytes); code 0xFF is NaN."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        if codes.dtype.name == "float8_e8m0fnu":
            codes = codes.view(np.uint8)
        else:
            raise TypeError(f"e8m0_to_float: codes have dtype {codes.dtype}; expected uint8 "
                            "(or ml_dtypes.float8_e8m0fnu)")
    value = np.ldexp(1.0, codes.astype(np.int32) - E8M0_BIAS)
    return np.where(codes == E8M0_NAN, np.nan, value)


def mx_shared_exponents(amax):
    """Unbiased shared exponents (int32) for block maxima ``amax`` (>= 0, finite), with the
    clamp at -127 described in the module doc (no upper clamp: the caller checks)."""
    amax = np.asarray(amax, dtype=np.float64)
    _, e = np.frexp(amax)                           # amax = m * 2**e, 0.5 <= m < 1
    shared = np.where(amax > 0, (e - 1) - E2M1_EMAX, E8M0_MIN_EXP)
    return np.maximum(shared, E8M0_MIN_EXP).astype(np.int32)


def quantize_mxfp4(y):
    """Quantize y (tokens, hidden) to MXFP4 (see the module doc); hidden divisible by 32.

    Returns ``(packed, scales)``: packed uint8 of shape (tokens, hidden // 2), two E2M1 codes a
    byte (even index in the low nibble); scales uint8 E8M0 codes (bias 127) of shape
    (tokens, hidden // 32), scale ``[t, b]`` covering ``y[t, 32*b:32*(b+1)]``.
    """
    where = "quantize_mxfp4"
    y = as_float_array("y", where, y, ndim=2)
    tokens, hidden = y.shape
    if hidden == 0:
        raise ValueError(f"{where}: hidden size (last axis of y) is 0")
    check_divisible(where, hidden, MX_BLOCK_SIZE, "MX block size")
    y64 = y.astype(np.float64)
    check_finite("y", where, y64)
    blocks = y64.reshape(tokens, hidden // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    shared = mx_shared_exponents(np.abs(blocks).max(axis=-1))
    if (shared > E8M0_MAX_EXP).any():
        first = tuple(int(i) for i in np.argwhere(shared > E8M0_MAX_EXP)[0])
        raise ValueError(f"{where}: block {first} has a maximum of magnitude >= 2**130, beyond "
                         "the range of an E8M0 scale")
    codes = encode_e2m1(blocks / np.ldexp(1.0, shared)[..., None])
    return pack_fp4(codes.reshape(tokens, hidden)), (shared + E8M0_BIAS).astype(np.uint8)


def dequantize_mxfp4(packed, scales, out_dtype=np.float32, where="dequantize_mxfp4"):
    """``X * P_i`` per element, exact in float64, rounded once to out_dtype.

    packed: uint8 (tokens, hidden // 2); scales: uint8 E8M0 codes (or float8_e8m0fnu) of shape
    (tokens, hidden // 32). A NaN scale (0xFF) gives NaN for its whole block. In float32,
    scales above 2**125 can overflow to +-Inf (never produced from float32 input).
    """
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise TypeError(f"{where}: packed has dtype {packed.dtype}; expected uint8")
    if packed.ndim != 2 or packed.shape[1] == 0:
        raise ValueError(f"{where}: packed must be 2-D (tokens, hidden // 2) with hidden > 0, "
                         f"got shape {packed.shape}")
    tokens, hidden = packed.shape[0], 2 * packed.shape[1]
    check_divisible(where, hidden, MX_BLOCK_SIZE, "MX block size")
    scales = np.asarray(scales)
    if scales.dtype != np.uint8 and scales.dtype.name != "float8_e8m0fnu":
        raise TypeError(f"{where}: scales have dtype {scales.dtype}; expected uint8 E8M0 codes")
    blocks = hidden // MX_BLOCK_SIZE
    if scales.shape != (tokens, blocks):
        raise ValueError(f"{where}: scales have shape {scales.shape}; expected ({tokens}, "
                         f"{blocks}) for packed of shape {packed.shape} (hidden {hidden})")
    v = decode_e2m1(unpack_fp4(packed)).astype(np.float64).reshape(tokens, blocks,
                                                                   MX_BLOCK_SIZE)
    v = (v * e8m0_to_float(scales)[..., None]).reshape(tokens, hidden)
    with np.errstate(over="ignore"):
        return v.astype(out_dtype)


def mxfp4_rounding_bound(y, scales):
    """Per-element bound (float64) on |X * P_i - y| for MXFP4 quantization of y with the
    given E8M0 scale codes: half an E2M1 spacing at |y| / X, plus the saturation excess."""
    y = np.asarray(y, dtype=np.float64)
    x = e8m0_to_float(scales)
    tokens, hidden = y.shape
    v = np.abs(y).reshape(tokens, hidden // MX_BLOCK_SIZE, MX_BLOCK_SIZE) / x[..., None]
    bound = half_ulp(np.minimum(v, E2M1_MAX), E2M1_MANTISSA_BITS, E2M1_EMIN) \
        + np.maximum(v - E2M1_MAX, 0.0)
    return (bound * x[..., None]).reshape(tokens, hidden)
