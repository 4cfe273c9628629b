"""Tier (a) tests of pyar.quant.add_rmsnorm_reference, the CPU reference of
residual add + RMSNorm, checked against an independent loop (Python's
math.fsum over float64 values), with residual rounding and argument checks.

Host numpy and ml_dtypes only: they run on any machine, no GPU involved.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from tests.quant_independent_references import _rng, _sample


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
