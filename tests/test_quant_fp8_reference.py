"""Tier (a) tests of pyar.quant's FP8 per-token and per-group quantizers:
codes checked against a brute-force nearest-value search over every code of
the format, scales against float32 scale arithmetic, saturation, zeros and
signs, group independence, validation and dequantization.

Host numpy and ml_dtypes only: they run on any machine, no GPU involved.
"""
import zlib

import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from tests.quant_independent_references import (
    INPUT_DTYPES, _fp8_grid, _fp8_reference_codes, _half_spacing, _rng, _sample,
)

E4M3 = (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz)


def test_fp8_max():
    assert quant.fp8_max(ml_dtypes.float8_e4m3fn) == 448.0
    assert quant.fp8_max(ml_dtypes.float8_e4m3fnuz) == 240.0
    with pytest.raises(TypeError, match="float8_e5m2"):
        quant.fp8_max(ml_dtypes.float8_e5m2)


def _expected_fp8_scales(y, group_size, fmax):
    """Scales as a float32 kernel computes them: float32 amax / float32 FP8_MAX, floored."""
    tokens, hidden = y.shape
    amax = np.abs(y.astype(np.float32)).reshape(tokens, -1, group_size).max(axis=-1)
    with np.errstate(under="ignore"):
        s = amax / np.float32(fmax)
    assert s.dtype == np.float32
    return np.maximum(s, np.float32(2.0 ** -126))


@pytest.mark.parametrize("fp8", E4M3)
@pytest.mark.parametrize("in_dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("group_size", [None, 32, 128, 512])
def test_fp8_codes_scales_and_round_trip(fp8, in_dtype, group_size):
    key = f"{np.dtype(fp8).name}/{np.dtype(in_dtype).name}/{group_size}"
    rng = _rng(zlib.crc32(key.encode()))
    y = _sample(rng, (6, 1024), in_dtype)
    if group_size is None:
        q, scales = quant.quantize_fp8_per_token(y, fp8_dtype=fp8)
        gs = 1024
    else:
        q, scales = quant.quantize_fp8_per_group(y, group_size=group_size, fp8_dtype=fp8)
        gs = group_size
    fmax = ml_dtypes.finfo(fp8).max.item()
    assert q.dtype == np.dtype(fp8) and q.shape == y.shape
    assert scales.dtype == np.float32 and scales.shape == (6, 1024 // gs)
    # scales exactly as defined, computed independently in float32 arithmetic
    np.testing.assert_array_equal(scales, _expected_fp8_scales(y, gs, fmax))
    # codes exactly: round to nearest even (with saturation) of y / scale
    v = (y.astype(np.float64).reshape(6, -1, gs) / scales.astype(np.float64)[..., None])
    np.testing.assert_array_equal(q.view(np.uint8).ravel(), _fp8_reference_codes(v, fp8))
    # every group's largest element lands on (or saturates to) +-FP8_MAX
    qmax = np.abs(q.astype(np.float64)).reshape(6, -1, gs).max(axis=-1)
    np.testing.assert_array_equal(qmax, fmax)
    # round trip within half a spacing of the format at each element's scaled magnitude
    deq = quant.dequantize(q, scales, "fp8_per_token" if group_size is None else
                           "fp8_per_group", out_dtype=np.float64)
    err = np.abs(deq - y.astype(np.float64))
    _, vals = _fp8_grid(fp8)
    s_full = np.repeat(scales.astype(np.float64), gs, axis=1)
    v_full = np.abs(v.reshape(6, 1024))
    indep = _half_spacing(v_full, vals) * s_full + np.maximum(v_full - fmax, 0) * s_full
    assert np.all(err <= indep * (1 + 1e-12))
    bound = quant.rounding_bound(y, scales, "fp8_per_group", fp8_dtype=fp8)
    assert np.all(err <= bound)
    assert np.all(bound <= 2 * indep * (1 + 1e-12))   # 2x only at a binade's first value
    # relative error per element at most 2**-(mantissa bits + 1) for normal-range values
    normal = v_full >= ml_dtypes.finfo(fp8).tiny
    rel = err[normal] / np.abs(y.astype(np.float64))[normal]
    assert rel.max() <= 2.0 ** -4 * (1 + 1e-9)
    # float32 dequantization is the float64 one rounded once
    deq32 = quant.dequantize(q, scales, "fp8_per_group")
    assert deq32.dtype == np.float32
    np.testing.assert_array_equal(deq32, deq.astype(np.float32))


@pytest.mark.parametrize("fp8", E4M3)
def test_fp8_every_midpoint_rounds_to_even(fp8):
    """Scale 1 exactly (each row holds FP8_MAX), the other elements every midpoint between
    neighbouring FP8 values and points just beside them: codes must be round-to-nearest-even."""
    codes, vals = _fp8_grid(fp8)
    fmax = vals.max()
    grid = np.unique(vals)
    mids = (grid[1:] + grid[:-1]) / 2
    pts = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), grid,
                          [-1e-30, 1e-30, -0.0]])
    pad = (-(pts.size + 1)) % 64
    row = np.concatenate([[fmax], pts, np.zeros(pad)])
    y = row.reshape(1, -1)
    q, scales = quant.quantize_fp8_per_token(y, fp8_dtype=fp8)
    assert scales[0, 0] == 1.0
    np.testing.assert_array_equal(q.view(np.uint8).ravel(), _fp8_reference_codes(row, fp8))
    # a tie between two values picks the even code (mantissa LSB 0)
    on_tie = np.isin(row, mids)
    assert np.all(q.view(np.uint8).ravel()[on_tie] % 2 == 0)


@pytest.mark.parametrize("fp8", E4M3)
def test_round_to_fp8_saturates(fp8):
    """Beyond FP8_MAX + half a spacing a plain cast gives NaN; round_to_fp8 saturates."""
    fmax = quant.fp8_max(fp8)
    v = np.array([fmax * 1.03, fmax * 1.1, 1e30, -fmax * 1.06, -1e300, fmax, -fmax])
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(v[:5].astype(fp8).astype(np.float64)).any()
    got = quant.round_to_fp8(v, fp8)
    assert got.dtype == np.dtype(fp8)
    np.testing.assert_array_equal(got.astype(np.float64), np.sign(v) * fmax)
    r = _rng(13).standard_normal(5000) * 2.0 ** _rng(14).integers(-14, 12, 5000)
    np.testing.assert_array_equal(quant.round_to_fp8(r, fp8).view(np.uint8),
                                  _fp8_reference_codes(r, fp8))
    with pytest.raises(ValueError, match="NaN"):
        quant.round_to_fp8([np.nan], fp8)


@pytest.mark.parametrize("fp8", E4M3)
def test_fp8_saturates_instead_of_nan(fp8):
    """A scale rounded down makes amax / scale exceed FP8_MAX; the code saturates."""
    fmax = ml_dtypes.finfo(fp8).max.item()
    rng = _rng(7)
    amax = rng.uniform(1, 2, 4096).astype(np.float32)
    scale = (amax / np.float32(fmax)).astype(np.float32)
    over = amax.astype(np.float64) / scale.astype(np.float64) > fmax
    assert over.sum() > 100                   # the case is common: it must be handled
    y = np.zeros((int(over.sum()), 32), np.float32)
    y[:, 0] = amax[over]
    y[:, 1] = -amax[over]
    q, s = quant.quantize_fp8_per_token(y, fp8_dtype=fp8)
    qv = q.astype(np.float64)
    assert np.all(np.isfinite(qv))
    np.testing.assert_array_equal(qv[:, 0], fmax)
    np.testing.assert_array_equal(qv[:, 1], -fmax)
    err = np.abs(quant.dequantize(q, s, "fp8_per_token", out_dtype=np.float64) - y)
    assert np.all(err <= quant.rounding_bound(y, s, "fp8_per_token", fp8_dtype=fp8))


@pytest.mark.parametrize("fp8", E4M3)
def test_fp8_zero_tiny_and_negative_zero(fp8):
    y = np.zeros((4, 256), np.float32)
    y[1] = -0.0                                # a row of negative zeros
    y[2, 5] = 1e-44                            # float32 subnormal: amax / FP8_MAX underflows
    y[3] = 1.0
    y[3, 7] = -0.0                             # a negative zero in a normal row
    y[3, 8] = -1e-6                            # rounds to zero: sign kept where it can be
    q, scales = quant.quantize_fp8_per_group(y, group_size=128, fp8_dtype=fp8)
    assert np.all(scales[:3] == quant.FP8_MIN_SCALE) and quant.FP8_MIN_SCALE == 2.0 ** -126
    assert scales[3, 0] == np.float32(1.0) / np.float32(quant.fp8_max(fp8))
    b = q.view(np.uint8)
    neg_zero = 0x80 if fp8 is ml_dtypes.float8_e4m3fn else 0x00   # fnuz: 0x80 is NaN
    assert np.all(b[0] == 0) and np.all(b[1] == neg_zero)
    assert b[2, 5] == 0
    assert b[3, 7] == neg_zero and b[3, 8] == neg_zero
    deq = quant.dequantize(q, scales, "fp8_per_group")
    assert np.all(np.isfinite(deq))
    assert np.all(deq[:3] == 0)
    if fp8 is ml_dtypes.float8_e4m3fn:
        assert np.all(np.signbit(deq[1])) and np.signbit(deq[3, 7])


def test_fp8_per_token_is_per_group_of_hidden():
    y = _sample(_rng(3), (7, 384))
    q1, s1 = quant.quantize_fp8_per_token(y)
    q2, s2 = quant.quantize_fp8_per_group(y, group_size=384)
    assert np.array_equal(q1.view(np.uint8), q2.view(np.uint8)) and np.array_equal(s1, s2)
    q3, s3 = quant.quantize(y, "fp8_per_token")
    assert np.array_equal(q1.view(np.uint8), q3.view(np.uint8)) and np.array_equal(s1, s3)


def test_fp8_groups_are_independent():
    """Changing one group changes only its own scale and codes."""
    y = _sample(_rng(4), (3, 512))
    q, s = quant.quantize_fp8_per_group(y, group_size=128)
    y2 = y.copy()
    y2[1, 256:384] *= 1000
    q2, s2 = quant.quantize_fp8_per_group(y2, group_size=128)
    changed = s2 != s
    assert changed.sum() == 1 and changed[1, 2]
    diff = q2.view(np.uint8) != q.view(np.uint8)
    assert not diff[:, :256].any() and not diff[:, 384:].any() and not diff[[0, 2]].any()


def test_fp8_empty_token_count():
    q, s = quant.quantize_fp8_per_group(np.zeros((0, 256), np.float32))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    assert quant.dequantize(q, s, "fp8_per_group").shape == (0, 256)


def test_fp8_validation():
    y = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError, match="hidden size 256 .* not divisible by the group_size 96"):
        quant.quantize_fp8_per_group(y, group_size=96)
    for bad in (0, -128, 1.5, True, "128"):
        with pytest.raises(ValueError, match="group_size must be a positive integer"):
            quant.quantize_fp8_per_group(y, group_size=bad)
    with pytest.raises(ValueError, match=r"must be 2-D, got shape \(256,\)"):
        quant.quantize_fp8_per_token(y[0])
    with pytest.raises(ValueError, match="must be 2-D"):
        quant.quantize_fp8_per_token(y[None])
    with pytest.raises(ValueError, match="hidden size .* is 0"):
        quant.quantize_fp8_per_token(np.zeros((2, 0), np.float32))
    with pytest.raises(TypeError, match="y has dtype int32"):
        quant.quantize_fp8_per_token(y.astype(np.int32))
    with pytest.raises(TypeError, match="fp8_dtype"):
        quant.quantize_fp8_per_token(y, fp8_dtype=ml_dtypes.float8_e5m2)
    with pytest.raises(TypeError, match="fp8_dtype"):
        quant.quantize_fp8_per_token(y, fp8_dtype=np.uint8)
    with pytest.raises(ValueError, match="too large for a float32 scale"):
        quant.quantize_fp8_per_token(np.full((1, 32), 1e45))     # float64 input only


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_fp8_accepts_input_dtypes(dtype):
    y = _sample(_rng(5), (2, 128), dtype)
    q, s = quant.quantize_fp8_per_token(y)
    np.testing.assert_array_equal(s[:, 0], np.maximum(
        (np.abs(y.astype(np.float64)).max(axis=1) / 448.0).astype(np.float32),
        np.float32(2.0 ** -126)))


def test_dequantize_fp8_validation():
    y = _sample(_rng(6), (2, 256))
    q, s = quant.quantize_fp8_per_group(y, group_size=128)
    dq = quant.dequantize
    with pytest.raises(TypeError, match=r"q has dtype uint8.*\.view\(ml_dtypes"):
        dq(q.view(np.uint8), s, "fp8_per_group")
    with pytest.raises(TypeError, match="scales have dtype float64"):
        dq(q, s.astype(np.float64), "fp8_per_group")
    with pytest.raises(ValueError, match=r"scales have shape \(2, 3\)"):
        dq(q, np.ones((2, 3), np.float32), "fp8_per_group")
    with pytest.raises(ValueError, match=r"scales have shape \(3, 2\)"):
        dq(q, np.ones((3, 2), np.float32), "fp8_per_group")
    with pytest.raises(ValueError, match="group_size 64 does not match"):
        dq(q, s, "fp8_per_group", group_size=64)
    assert dq(q, s, "fp8_per_group", group_size=128).shape == (2, 256)
    with pytest.raises(ValueError, match=r"fp8_per_token scales must have shape \(tokens, 1\)"):
        dq(q, s, "fp8_per_token")
    with pytest.raises(ValueError, match="unknown kind 'fp8'"):
        dq(q, s, "fp8")
    with pytest.raises(TypeError, match="out_dtype"):
        dq(q, s, "fp8_per_group", out_dtype=np.float16)
    with pytest.raises(ValueError, match="must be 2-D"):
        dq(q[0], s, "fp8_per_group")
