"""Independent references for the tier (a) tests of pyar.quant's CPU references
(tests/test_quant_*_reference.py): seeded samples, and brute-force
nearest-value rounding over every code of FP8 and E2M1, computed without
pyar.quant's own code.  Host numpy only: no GPU.
"""
import ml_dtypes
import numpy as np

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
