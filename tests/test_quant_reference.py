"""Tier (a) tests of pyar.quant: the CPU references of residual add + RMSNorm and of the FP8
per-token, FP8 per-group and MXFP4 quantizers, checked against independent computations
(brute-force nearest-value search over every code of the format, float32 scale arithmetic,
Python's math.frexp/fsum, ml_dtypes' casts)."""
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from pyar.quant import fp8 as fp8_mod
from pyar.quant import mxfp4 as mx_mod

E4M3 = (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz)
INPUT_DTYPES = (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)


def _rng(seed):
    return np.random.default_rng(seed)


def _sample(rng, shape, dtype=np.float32, spread=True):
    """Normal samples with per-row magnitudes spread over several binades, rounded to dtype."""
    x = rng.standard_normal(shape)
    if spread:
        x *= 2.0 ** rng.integers(-8, 9, size=shape[:-1] + (1,))
        x *= 2.0 ** rng.uniform(-3, 3, size=shape)
    return x.astype(dtype)


# ------------------------------------------------------------------------------------------
# independent references
# ------------------------------------------------------------------------------------------
def _fp8_grid(dt):
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(dt).astype(np.float64)
    ok = np.isfinite(vals)
    return codes[ok], vals[ok]


def _nearest_code(v, codes, vals, sign_bit):
    """Round v (float64, already within range) to the nearest of (codes, vals): ties to the
    even code; among equal zeros, the one with v's sign. Brute force over every code."""
    v = np.asarray(v, dtype=np.float64).ravel()
    out = np.empty(v.shape, dtype=np.uint8)
    for start in range(0, v.size, 4096):
        chunk = v[start:start + 4096]
        d = np.abs(chunk[:, None] - vals[None, :])
        cand = d == d.min(axis=1, keepdims=True)
        code_sign = (codes & sign_bit) != 0
        score = (codes & 1).astype(np.int64)[None, :] * 2 \
            + (code_sign[None, :] != np.signbit(chunk)[:, None])
        score = np.where(cand, score, 1 << 20)
        out[start:start + chunk.size] = codes[np.argmin(score, axis=1)]
    return out


def _fp8_reference_codes(v, dt):
    codes, vals = _fp8_grid(dt)
    fmax = vals.max()
    return _nearest_code(np.clip(v, -fmax, fmax), codes, vals, 0x80)


def _e2m1_value(code):
    """E2M1 decoded from its bit fields: sign | 2 exponent bits (bias 1) | 1 mantissa bit."""
    s, e, m = code >> 3, (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -mag if s else mag


E2M1_CODES = np.arange(16, dtype=np.uint8)
E2M1_VALS = np.array([_e2m1_value(int(c)) for c in E2M1_CODES])


def _e2m1_reference_codes(v):
    return _nearest_code(np.clip(v, -6.0, 6.0), E2M1_CODES, E2M1_VALS, 0x8)


def _half_spacing(v, vals):
    """Half the gap between the grid neighbours around |v| (grid = nonnegative values)."""
    grid = np.unique(np.abs(vals))
    a = np.minimum(np.abs(v), grid.max())
    hi = np.clip(np.searchsorted(grid, a, side="left"), 1, grid.size - 1)
    return (grid[hi] - grid[hi - 1]) / 2


# ------------------------------------------------------------------------------------------
# RMSNorm
# ------------------------------------------------------------------------------------------
def _rmsnorm_loops(s, residual, weight, eps):
    tokens, hidden = s.shape
    y = np.empty((tokens, hidden))
    r_all = np.empty((tokens, hidden))
    for t in range(tokens):
        r = [float(a) + float(b) for a, b in zip(s[t], residual[t])]
        denom = math.sqrt(math.fsum(x * x for x in r) / hidden + eps)
        y[t] = [x / denom * float(w) for x, w in zip(r, weight)]
        r_all[t] = r
    return y, r_all


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("hidden", [512, 2880])
def test_rmsnorm_matches_float64_formula(dtype, hidden):
    rng = _rng(hidden)
    s = _sample(rng, (5, hidden), dtype, spread=False) * dtype(4)
    residual = _sample(rng, (5, hidden), dtype, spread=False)
    weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
    y, r = quant.add_rmsnorm_reference(s, residual, weight, eps=1e-6)
    y_ref, r_ref = _rmsnorm_loops(s, residual, weight, 1e-6)
    assert y.dtype == np.float64 and r.dtype == np.float64
    assert y.shape == r.shape == (5, hidden)
    np.testing.assert_array_equal(r, r_ref)          # the float64 sum of two such values is exact
    np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=0)


def test_rmsnorm_eps_and_mixed_dtypes():
    rng = _rng(1)
    s = rng.standard_normal((3, 512)).astype(ml_dtypes.bfloat16)
    residual = rng.standard_normal((3, 512)).astype(np.float32)
    weight = rng.standard_normal(512)
    residual[1] = -s[1].astype(np.float32)          # r = 0 exactly: y = 0, no division by 0
    for eps in (1e-30, 1e-6, 1e-2):
        y, r = quant.add_rmsnorm_reference(s, residual, weight, eps=eps)
        y_ref, r_ref = _rmsnorm_loops(s, residual, weight, eps)
        np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=0)
        assert np.all(y[1] == 0)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_rmsnorm_round_residual_to(dtype):
    rng = _rng(2)
    s = (rng.standard_normal((4, 1024)) * 3).astype(np.float32)   # a float32 all-reduce sum
    residual = rng.standard_normal((4, 1024)).astype(dtype)
    weight = rng.standard_normal(1024).astype(dtype)
    y, r = quant.add_rmsnorm_reference(s, residual, weight, round_residual_to=dtype)
    exact = s.astype(np.float64) + residual.astype(np.float64)
    np.testing.assert_array_equal(r, exact.astype(dtype).astype(np.float64))
    assert np.array_equal(r.astype(dtype).astype(np.float64), r)   # representable in dtype
    assert not np.array_equal(r, exact)                            # and the rounding happened
    y_ref, _ = _rmsnorm_loops(r, np.zeros_like(r), weight, 1e-6)   # y is normalized from r
    np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=0)
    y_unrounded, r_unrounded = quant.add_rmsnorm_reference(s, residual, weight)
    np.testing.assert_array_equal(r_unrounded, exact)
    assert not np.array_equal(y, y_unrounded)


def test_rmsnorm_validation():
    s = np.zeros((2, 64), np.float32)
    w = np.ones(64, np.float32)
    f = quant.add_rmsnorm_reference
    with pytest.raises(ValueError, match=r"residual has shape \(2, 32\)"):
        f(s, np.zeros((2, 32), np.float32), w)
    with pytest.raises(ValueError, match=r"weight has shape \(32,\); expected \(64,\)"):
        f(s, s, np.ones(32, np.float32))
    with pytest.raises(ValueError, match="must be 2-D"):
        f(s[0], s[0], w)
    with pytest.raises(TypeError, match="dtype int32"):
        f(s.astype(np.int32), s, w)
    with pytest.raises(TypeError, match="weight has dtype"):
        f(s, s, w.astype(np.complex64))
    with pytest.raises(ValueError, match="eps"):
        f(s, s, w, eps=-1.0)
    with pytest.raises(TypeError, match="round_residual_to"):
        f(s, s, w, round_residual_to=np.int16)


# ------------------------------------------------------------------------------------------
# FP8 per token / per group
# ------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kind", quant.KINDS)
def test_non_finite_input_rejected(bad, kind):
    y = np.ones((3, 256), np.float32)
    y[2, 17] = bad
    with pytest.raises(ValueError, match=r"non-finite value\(s\).*index \(2, 17\)"):
        quant.quantize(y, kind)


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


# ------------------------------------------------------------------------------------------
# MXFP4
# ------------------------------------------------------------------------------------------
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


def test_quantize_dispatch_and_kinds():
    y = _sample(_rng(12), (3, 256))
    assert quant.KINDS == ("fp8_per_token", "fp8_per_group", "mxfp4")
    for kind in quant.KINDS:
        q, s = quant.quantize(y, kind, group_size=64, fp8_dtype=ml_dtypes.float8_e4m3fnuz)
        err = np.abs(quant.dequantize(q, s, kind, out_dtype=np.float64) - y)
        assert np.all(err <= quant.rounding_bound(y, s, kind,
                                                  fp8_dtype=ml_dtypes.float8_e4m3fnuz))
    _, s = quant.quantize(y, "fp8_per_group", group_size=64)
    assert s.shape == (3, 4)
    with pytest.raises(ValueError, match="unknown kind"):
        quant.quantize(y, "int8")


def test_module_imports_no_gpu_code():
    import sys
    import subprocess
    code = ("import sys, pyar.quant.reference as r\n"
            "bad = [m for m in sys.modules if m.startswith(('pyar.comm', 'cupy', 'torch'))]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
    # the package's own modules import only numpy and ml_dtypes
    for mod in (fp8_mod, mx_mod):
        src = open(mod.__file__).read()
        assert "pyar._hip" not in src and "pyar.comm" not in src
