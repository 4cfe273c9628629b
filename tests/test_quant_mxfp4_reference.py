"""Tier (a) tests of pyar.quant's MXFP4 quantizer: E2M1 codes checked against
their bit fields, ml_dtypes' float4 and a brute-force nearest-value search,
E8M0 shared exponents against Python's math.frexp, nibble packing, power-of-two
boundaries, zeros and signs, validation and dequantization.

Host numpy and ml_dtypes only: they run on any machine, no GPU involved.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from tests.quant_independent_references import (
    E2M1_VALS, INPUT_DTYPES, _e2m1_reference_codes, _half_spacing, _rng, _sample,
)


def test_e2m1_all_16_codes():
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    np.testing.assert_array_equal(E2M1_VALS, expected)                    # from the bit fields
    got = quant.decode_e2m1(np.arange(16))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.arange(16) >= 8)   # code 8 is -0
    np.testing.assert_array_equal(                                        # ml_dtypes agrees
        got, np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    np.testing.assert_array_equal(quant.encode_e2m1(got), np.arange(16))  # codes round-trip
    with pytest.raises(ValueError, match="0..15"):
        quant.decode_e2m1([16])


def test_e2m1_rounding_exhaustive():
    """Every multiple of 1/64 in [-9, 9] (all ties included) and random values."""
    v = np.concatenate([np.arange(-9 * 64, 9 * 64 + 1) / 64.0,
                        _rng(8).uniform(-10, 10, 20000), [-0.0, 1e-300, -1e-300, 1e300]])
    codes = quant.encode_e2m1(v)
    np.testing.assert_array_equal(codes, _e2m1_reference_codes(v))
    with np.errstate(over="ignore"):                  # 1e300 -> float4 saturates (and warns)
        np.testing.assert_array_equal(codes, v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    ties = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6, 7.0: 7, 100.0: 7,
            -0.25: 8, -0.1: 8, -5.0: 14, -7.0: 15}
    np.testing.assert_array_equal(quant.encode_e2m1(list(ties)), list(ties.values()))
    with pytest.raises(ValueError, match="NaN"):
        quant.encode_e2m1([np.nan])


def test_e8m0_decode():
    codes = np.arange(256, dtype=np.uint8)
    vals = quant.e8m0_to_float(codes)
    np.testing.assert_array_equal(vals[:255], [2.0 ** (c - 127) for c in range(255)])
    assert np.isnan(vals[255])
    np.testing.assert_array_equal(vals, codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64))
    np.testing.assert_array_equal(quant.e8m0_to_float(codes.view(ml_dtypes.float8_e8m0fnu)), vals)


def test_fp4_packing_order():
    codes = np.array([[1, 2, 3, 4, 15, 0]], np.uint8)
    packed = quant.pack_fp4(codes)
    np.testing.assert_array_equal(packed, [[0x21, 0x43, 0x0F]])   # even index in low nibble
    np.testing.assert_array_equal(quant.unpack_fp4(packed), codes)
    rnd = _rng(9).integers(0, 16, (5, 64)).astype(np.uint8)
    np.testing.assert_array_equal(quant.unpack_fp4(quant.pack_fp4(rnd)), rnd)
    with pytest.raises(ValueError, match="even length"):
        quant.pack_fp4(np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="0..15"):
        quant.pack_fp4(np.array([16, 0]))
    with pytest.raises(TypeError, match="uint8"):
        quant.unpack_fp4(np.zeros(4, np.int32))
    # through the quantizer: a block [1, 6, 0, -0.5, ...] with X = 1 (amax 6)
    y = np.zeros((1, 32), np.float32)
    y[0, :4] = [1.0, 6.0, 0.0, -0.5]
    q, s = quant.quantize_mxfp4(y)
    assert s[0, 0] == 127                                           # X = 2**0
    assert q[0, 0] == (0x2 | 0x7 << 4) and q[0, 1] == (0x0 | 0x9 << 4)


def _expected_mx_scales(y):
    """Shared exponents with Python's math.frexp, block by block."""
    tokens, hidden = y.shape
    out = np.empty((tokens, hidden // 32), np.uint8)
    for t in range(tokens):
        for b in range(hidden // 32):
            amax = max(abs(float(x)) for x in y[t, 32 * b:32 * b + 32])
            if amax == 0:
                e = -127
            else:
                e = max(math.frexp(amax)[1] - 1 - 2, -127)
            out[t, b] = e + 127
    return out


@pytest.mark.parametrize("in_dtype", INPUT_DTYPES)
def test_mxfp4_codes_scales_and_round_trip(in_dtype):
    rng = _rng(10 + INPUT_DTYPES.index(in_dtype))
    y = _sample(rng, (6, 1024), in_dtype)
    y[0, :32] *= 2.0 ** -100 if in_dtype in (np.float32, np.float64) else 1
    q, scales = quant.quantize_mxfp4(y)
    assert q.dtype == np.uint8 and q.shape == (6, 512)
    assert scales.dtype == np.uint8 and scales.shape == (6, 32)
    np.testing.assert_array_equal(scales, _expected_mx_scales(y))
    x = quant.e8m0_to_float(scales)
    # scale = 2**(floor(log2 amax) - 2): amax / X in [4, 8)
    amax = np.abs(y.astype(np.float64)).reshape(6, 32, 32).max(axis=-1)
    ratio = amax / x
    assert np.all((ratio >= 4) & (ratio < 8))
    # element codes: nearest-even E2M1 of y / X, saturated
    v = y.astype(np.float64).reshape(6, 32, 32) / x[..., None]
    codes = quant.unpack_fp4(q)
    np.testing.assert_array_equal(codes.ravel(), _e2m1_reference_codes(v))
    # every block's largest element becomes 4 or 6 (code 6 or 7, either sign)
    mags = (codes.reshape(6, 32, 32) & 7).max(axis=-1)
    assert np.all((mags == 6) | (mags == 7))
    # round trip: half an E2M1 spacing at |y| / X, times X, plus the saturation excess
    deq = quant.dequantize(q, scales, "mxfp4", out_dtype=np.float64)
    err = np.abs(deq - y.astype(np.float64))
    v_full = np.abs(v).reshape(6, 1024)
    x_full = np.repeat(x, 32, axis=1)
    indep = (_half_spacing(v_full, E2M1_VALS) + np.maximum(v_full - 6, 0)) * x_full
    assert np.all(err <= indep)
    bound = quant.rounding_bound(y, scales, "mxfp4")
    assert np.all(err <= bound)
    assert np.all(bound <= 2 * indep)                  # 2x only at a binade's first value
    # float32 dequantization: the exact products, rounded once
    np.testing.assert_array_equal(quant.dequantize(q, scales, "mxfp4"), deq.astype(np.float32))


def test_mxfp4_power_of_two_boundaries_and_saturation():
    y = np.zeros((1, 128), np.float64)
    y[0, 0] = 4.0                      # block 0: amax 4 -> X = 1, code 4 -> 6 (value 4)
    y[0, 32] = 8.0                     # block 1: amax 8 -> X = 2
    y[0, 64] = np.nextafter(8.0, 0)    # block 2: amax just below 8 -> X = 1, saturates to 6
    y[0, 65] = -7.0                    #          -7 / 1 -> -6
    y[0, 96] = 2.0 ** 129.5            # block 3: largest float64 block that fits: X = 2**127
    q, s = quant.quantize_mxfp4(y)
    np.testing.assert_array_equal(s[0], [127, 128, 127, 254])
    deq = quant.dequantize(q, s, "mxfp4", out_dtype=np.float64)
    assert deq[0, 0] == 4.0 and deq[0, 32] == 8.0
    assert deq[0, 64] == 6.0 and deq[0, 65] == -6.0
    assert deq[0, 96] == 6 * 2.0 ** 127             # 2**129.5 / 2**127 = 5.66 -> 6
    with np.errstate(over="ignore"):
        assert np.isinf(quant.dequantize(q, s, "mxfp4")[0, 96])   # float32 overflow, doc'd
    with pytest.raises(ValueError, match="E8M0"):
        quant.quantize_mxfp4(np.full((1, 32), 2.0 ** 130))


def test_mxfp4_zero_tiny_and_negative_zero_blocks():
    y = np.ones((1, 160), np.float32)
    y[0, :32] = 0.0
    y[0, 32:64] = -0.0
    y[0, 64:96] = 0.0
    y[0, 70] = 2.0 ** -130                  # amax below 2**-125: shared exponent clamped
    y[0, 71] = -2.0 ** -128
    y[0, 100] = -0.0                        # a negative zero in a normal block
    y[0, 101] = -0.01                       # rounds to zero, keeps its sign
    q, s = quant.quantize_mxfp4(y)
    np.testing.assert_array_equal(s[0], [0, 0, 0, 127 - 2 + 0, 125])
    codes = quant.unpack_fp4(q)[0]
    assert np.all(codes[:32] == 0) and np.all(q[0, :16] == 0x00)
    assert np.all(codes[32:64] == 8) and np.all(q[0, 16:32] == 0x88)
    assert codes[70] == 0 and codes[71] == 9       # -2**-128 / 2**-127 = -0.5 -> code 8|1
    assert codes[100] == 8 and codes[101] == 8
    deq = quant.dequantize(q, s, "mxfp4")
    assert np.all(deq[0, :64] == 0) and np.all(np.signbit(deq[0, 32:64]))
    assert deq[0, 71] == np.float32(-2.0 ** -128)
    assert deq[0, 70] == 0                  # 2**-3 of X: below E2M1's 0.25 tie, to zero


def test_mxfp4_validation():
    y = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="hidden size 48 .* not divisible by the MX block size 32"):
        quant.quantize_mxfp4(np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="must be 2-D"):
        quant.quantize_mxfp4(y[0])
    with pytest.raises(TypeError, match="dtype int64"):
        quant.quantize_mxfp4(y.astype(np.int64))
    q, s = quant.quantize_mxfp4(y)
    dq = quant.dequantize
    with pytest.raises(TypeError, match="packed has dtype int8"):
        dq(q.view(np.int8), s, "mxfp4")
    with pytest.raises(TypeError, match="scales have dtype float32"):
        dq(q, s.astype(np.float32), "mxfp4")
    with pytest.raises(ValueError, match=r"scales have shape \(2, 1\); expected \(2, 2\)"):
        dq(q, s[:, :1], "mxfp4")
    with pytest.raises(ValueError, match="not divisible by the MX block size"):
        dq(q[:, :8], s, "mxfp4")
    with pytest.raises(ValueError, match="blocks are 32"):
        dq(q, s, "mxfp4", group_size=16)
    np.testing.assert_array_equal(dq(q, s.view(ml_dtypes.float8_e8m0fnu), "mxfp4"), y)
    nan_scale = s.copy()
    nan_scale[1, 0] = 0xFF                   # E8M0 NaN: the whole block is NaN
    deq = dq(q, nan_scale, "mxfp4")
    assert np.all(np.isnan(deq[1, :32])) and np.all(deq[1, 32:] == 1) and np.all(deq[0] == 1)
