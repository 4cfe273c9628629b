"""The kernels' FP8 / MXFP4 encoders against the numpy references (tier a, no GPU).

The fused kernels encode with the device functions of ``src/kernels/pyar_quant.h``
(``encode_e4m3``, ``fp8_scale``, ``encode_e2m1``, ``mx_shared_exponent``); the GPU tests
compare the kernels' output with the references in :mod:`pyar.quant`. Both must agree
exactly, code for code and scale bit for scale bit, or every GPU comparison would have to
allow for a second, unexplained rounding. The header is written in plain float arithmetic,
so it can be checked here exhaustively on the host: it is compiled with the host C++
compiler against a small shim ``pyar_device.h`` (``PYAR_DEVICE`` = ``static inline`` and
host versions of the CUDA intrinsics it uses), with IEEE float arithmetic (no
``-ffast-math``, no contraction into FMA), and its results are compared with the references
over every finite float16 and bfloat16 value, exact ties and their neighbours, and random
float32 values.
"""
import functools
import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from pyar.quant import mxfp4 as mx_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "src", "kernels", "pyar_quant.h")
CXX = shutil.which("g++") or shutil.which("c++")

pytestmark = pytest.mark.skipif(
    CXX is None, reason="no host C++ compiler (g++ or c++ on PATH): the encoders of "
    "src/kernels/pyar_quant.h cannot be built for the host")

E4M3FN, E4M3FNUZ = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz
F32 = np.float32

# Host stand-in for src/kernels/pyar_device.h: only what pyar_quant.h uses.
SHIM = r"""
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <stdint.h>

#define PYAR_DEVICE static inline

static inline uint32_t __float_as_uint(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
static inline float __uint_as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
static inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE, round to nearest
static inline int max(int a, int b) { return a > b ? a : b; }
"""

# Reads float32 values from argv[1]; writes to argv[2], as six consecutive 4-byte arrays of
# one entry per value: encode_e4m3(v, false), encode_e4m3(v, true), encode_e2m1(v) (uint32),
# mx_shared_exponent(v) (int32), fp8_scale(v, false), fp8_scale(v, true) (float32).
HARNESS = r"""
#include <cstdio>
#include <vector>
#include "pyar_quant.h"

#if defined(__FAST_MATH__)
#error "the encoders must be checked with IEEE float arithmetic: no -ffast-math"
#endif

template <class T> static bool put(FILE *f, const std::vector<T> &v) {
  return std::fwrite(v.data(), sizeof(T), v.size(), f) == v.size();
}

int main(int argc, char **argv) {
  if (argc != 3) { std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]); return 2; }
  FILE *in = std::fopen(argv[1], "rb");
  if (!in) { std::perror(argv[1]); return 1; }
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
  std::fclose(in);
  const size_t n = x.size();
  std::vector<uint32_t> fn(n), fnuz(n), e2m1(n);
  std::vector<int32_t> mx(n);
  std::vector<float> scale_fn(n), scale_fnuz(n);
  for (size_t i = 0; i < n; ++i) {
    fn[i] = pyar::encode_e4m3(x[i], false);
    fnuz[i] = pyar::encode_e4m3(x[i], true);
    e2m1[i] = pyar::encode_e2m1(x[i]);
    mx[i] = pyar::mx_shared_exponent(x[i]);
    scale_fn[i] = pyar::fp8_scale(x[i], false);
    scale_fnuz[i] = pyar::fp8_scale(x[i], true);
  }
  FILE *out = std::fopen(argv[2], "wb");
  if (!out) { std::perror(argv[2]); return 1; }
  const bool ok = put(out, fn) && put(out, fnuz) && put(out, e2m1) && put(out, mx) &&
                  put(out, scale_fn) && put(out, scale_fnuz);
  return (std::fclose(out) == 0 && ok) ? 0 : 1;
}
"""

# argv: FORMAT (bfloat16 or float16), FNUZ (0 or 1), QUOTIENT (fp8_quotient, or product: the
# uncorrected v * inverse, the positive control).  For every non-negative amax of the format,
# infinity included (a group that overflowed), and every finite v of the format with
# |v| <= amax, compares the FP8 code of QUOTIENT with that of __fdiv_rn(v, scale), scale =
# fp8_scale(amax, FNUZ).  Prints "pairs N differ M" and the first differences.
QUOTIENT_HARNESS = r"""
#include <cstdio>
#include <cstring>
#include "pyar_quant.h"

#if defined(__FAST_MATH__)
#error "the quotient must be checked with IEEE float arithmetic: no -ffast-math"
#endif

static float from_bits(uint16_t bits, bool bfloat16) {
  if (bfloat16) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return float(h);
}

int main(int argc, char **argv) {
  if (argc != 4) { std::fprintf(stderr, "usage: %s FORMAT FNUZ QUOTIENT\n", argv[0]); return 2; }
  const bool bfloat16 = std::strcmp(argv[1], "bfloat16") == 0;
  const bool fnuz = std::strcmp(argv[2], "1") == 0;
  const bool corrected = std::strcmp(argv[3], "fp8_quotient") == 0;
  const uint16_t infinity = bfloat16 ? 0x7F80 : 0x7C00;  // 0..infinity: every positive value
  unsigned long long pairs = 0, differ = 0;
  for (uint32_t m = 0; m <= infinity; ++m) {
    const float scale = pyar::fp8_scale(from_bits(uint16_t(m), bfloat16), fnuz);
    const pyar::Fp8Divisor divisor = pyar::fp8_divisor(scale);
    const float inverse = __fdiv_rn(1.0f, scale);
    for (uint32_t b = 0; b <= m && b < infinity; ++b) {  // finite v: inf / inf is NaN
      const float value = from_bits(uint16_t(b), bfloat16), signs[2] = {value, -value};
      for (const float v : signs) {
        const float got = corrected ? pyar::fp8_quotient(v, divisor) : v * inverse;
        const float want = __fdiv_rn(v, scale);
        ++pairs;
        if (std::memcmp(&got, &want, sizeof got) != 0 &&
            pyar::encode_e4m3(got, fnuz) != pyar::encode_e4m3(want, fnuz) && ++differ <= 5)
          std::printf("v %a scale %a: got %a, want %a\n", v, scale, got, want);
      }
    }
  }
  std::printf("pairs %llu differ %llu\n", pairs, differ);
  return 0;
}
"""

CXXFLAGS = ["-O2", "-std=c++17", "-fno-fast-math", "-ffp-contract=off", "-Wall"]


def _compile_harness(work, harness):
    """``harness`` built in ``work`` against the header and the shim; the executable."""
    (work / "pyar_device.h").write_text(SHIM)
    shutil.copyfile(HEADER, work / "pyar_quant.h")
    (work / "main.cpp").write_text(harness)
    exe = work / "harness"
    cmd = [CXX, *CXXFLAGS, "-I", str(work), str(work / "main.cpp"), "-o", str(exe)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, " ".join(cmd) + "\n" + result.stdout + result.stderr
    return exe


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """Compiles the harness once; returns ``run(values) -> dict`` of the header's results."""
    work = tmp_path_factory.mktemp("quant_encoders")
    exe = _compile_harness(work, HARNESS)

    def run(values):
        values = np.ascontiguousarray(values, dtype=F32)
        src, dst = work / "in.bin", work / "out.bin"
        values.tofile(src)
        result = subprocess.run([str(exe), str(src), str(dst)], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        raw = np.fromfile(dst, dtype=np.uint32)
        assert raw.size == 6 * values.size
        fn, fnuz, e2m1, mx, s_fn, s_fnuz = raw.reshape(6, values.size)
        return {"e4m3fn": fn, "e4m3fnuz": fnuz, "e2m1": e2m1, "mx": mx.view(np.int32),
                "scale_e4m3fn": s_fn.view(F32), "scale_e4m3fnuz": s_fnuz.view(F32)}

    return run


@pytest.fixture(scope="module")
def quotient_check(tmp_path_factory):
    """Compiles QUOTIENT_HARNESS once; returns ``run(format, fnuz, quotient) -> (pairs,
    differ, output)``."""
    exe = _compile_harness(tmp_path_factory.mktemp("fp8_quotient"), QUOTIENT_HARNESS)

    def run(fmt, fnuz, quotient):
        result = subprocess.run([str(exe), fmt, str(int(fnuz)), quotient], capture_output=True,
                                text=True, timeout=600, check=False)
        assert result.returncode == 0, result.stderr
        last = result.stdout.splitlines()[-1].split()
        assert last[0] == "pairs" and last[2] == "differ", result.stdout
        return int(last[1]), int(last[3]), result.stdout

    return run


def _show(a, i):
    """Element i of a for a failure message: a float32 with its bits, a code in hex, an
    exponent (signed) in decimal."""
    if a.dtype == F32:
        return f"{float(a[i])!r} (bits {int(a.view(np.uint32)[i]):#010x})"
    return f"{int(a[i]):#x}" if a.dtype.kind == "u" else str(int(a[i]))


def assert_same(what, x, got, expected):
    """got == expected elementwise (integers, or float32 compared bit for bit); on failure,
    lists the inputs that differ with both results."""
    x = np.asarray(x, dtype=F32)
    got = np.asarray(got)
    expected = np.asarray(expected).astype(got.dtype)
    assert got.shape == expected.shape == x.shape
    if got.dtype == F32:
        differ = got.view(np.uint32) != expected.view(np.uint32)
    else:
        differ = got != expected
    bad = np.flatnonzero(differ)
    if bad.size:
        rows = [f"  v={_show(x, i)}: got {_show(got, i)}, expected {_show(expected, i)}"
                for i in bad[:25]]
        pytest.fail(f"{what}: {bad.size} of {x.size} inputs differ; the first:\n"
                    + "\n".join(rows))


# ------------------------------------------------------------------------------------------
# inputs (float32, deterministic)
# ------------------------------------------------------------------------------------------
def _finite(x):
    x = np.asarray(x, dtype=F32)
    return x[np.isfinite(x)]


def _with_neighbours(x):
    """x, -x and the float32 neighbours of both on each side."""
    x = np.asarray(x, dtype=F32)
    x = np.concatenate([x, -x])
    with np.errstate(over="ignore"):      # the neighbours of +-FLT_MAX are +-inf
        return np.concatenate([x, np.nextafter(x, F32(np.inf)),
                               np.nextafter(x, F32(-np.inf))])


def _grid_ties(dt):
    """Every finite value of an FP8 dtype, the midpoints of adjacent ones (subnormal range
    included) and the midpoint past the largest (which must saturate)."""
    vals = np.unique(np.abs(_finite(np.arange(256, dtype=np.uint8).view(dt)).astype(np.float64)))
    mids = (vals[1:] + vals[:-1]) / 2
    beyond = vals[-1] + (vals[-1] - vals[-2]) / 2
    out = np.concatenate([vals, mids, [beyond]])
    assert np.array_equal(out.astype(F32).astype(np.float64), out)  # ties are exact in float32
    return out.astype(F32)


@functools.cache
def e4m3_inputs(name):
    if name == "float16":        # every finite float16 value, subnormals and +-0 included
        return _finite(np.arange(1 << 16, dtype=np.uint16).view(np.float16))
    if name == "bfloat16":       # every finite bfloat16 value: float32 subnormals, huge values
        return _finite(np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16))
    if name == "ties":
        extremes = [0.0, np.finfo(F32).smallest_subnormal, np.finfo(F32).tiny,
                    np.finfo(F32).max, np.inf]
        return _with_neighbours(np.concatenate([_grid_ties(E4M3FN), _grid_ties(E4M3FNUZ),
                                                np.asarray(extremes, dtype=F32)]))
    if name == "random":         # float32 magnitudes in [2**-12, 500], log- and linear-uniform
        rng = np.random.default_rng(20261203)
        log_mag = 2.0 ** rng.uniform(-12, np.log2(500), 200_000)
        lin_mag = rng.uniform(2.0 ** -12, 500, 100_000)
        mag = np.concatenate([log_mag, lin_mag]).astype(F32)
        return np.where(rng.integers(0, 2, mag.size) == 1, -mag, mag).astype(F32)
    raise ValueError(name)


def e2m1_inputs():
    half = _finite(np.arange(1 << 16, dtype=np.uint16).view(np.float16))
    half = half[np.abs(half) <= 8]                    # every float16 in [-8, 8], +-0 included
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0], dtype=F32)  # 7: past 6
    grid = quant.E2M1_VALUES[:8]
    saturating = np.array([8.0, 100.0, 1e30, np.finfo(F32).max], dtype=F32)
    rng = np.random.default_rng(20261204)
    random = np.concatenate([2.0 ** rng.uniform(-12, 3.5, 100_000),
                             rng.uniform(0, 8, 100_000)]).astype(F32)
    random = np.where(rng.integers(0, 2, random.size) == 1, -random, random).astype(F32)
    special = _with_neighbours(np.concatenate([ties, grid, saturating]))
    return np.concatenate([half, special, np.array([-0.0], F32), random])


def amax_inputs():
    """Block / row maxima (>= 0): zero, float32 subnormals, every power of two and its
    neighbours, the neighbourhood of the FP8 scale floor, random magnitudes and random bit
    patterns over the whole finite float32 range."""
    f32 = np.finfo(F32)
    pow2 = np.ldexp(1.0, np.arange(-149, 128)).astype(F32)
    subnormals = np.arange(1, 64, dtype=np.uint32).view(F32)
    floors = np.concatenate([fmax * 2.0 ** -126 * (1 + np.arange(-64, 65) * 2.0 ** -20)
                             for fmax in (448.0, 240.0)]).astype(F32)
    rng = np.random.default_rng(20261205)
    log_uniform = (2.0 ** rng.uniform(-149, 128, 20_000)).astype(F32)
    bits = rng.integers(0, 0x7F7FFFFF, 20_000, dtype=np.uint32, endpoint=True).view(F32)
    special = np.array([0.0, f32.tiny - f32.smallest_subnormal, f32.tiny, 1e30, f32.max], F32)
    x = np.concatenate([pow2, np.nextafter(pow2, F32(0)), np.nextafter(pow2, F32(np.inf)),
                        subnormals, floors, log_uniform, bits, special]).astype(F32)
    x = np.abs(x[np.isfinite(x)])
    assert x.min() == 0 and x.max() == f32.max
    return x


def _rows_with_amax(amax, width, seed):
    """float32 rows (len(amax), width) whose largest magnitude is exactly amax, at a random
    position and with a random sign; the other entries are smaller in magnitude."""
    rng = np.random.default_rng(seed)
    n = amax.size
    rows = (amax.astype(np.float64)[:, None] * rng.uniform(-1, 1, (n, width))).astype(F32)
    rows = np.where(np.abs(rows) > amax[:, None], 0, rows).astype(F32)
    signed = np.where(rng.integers(0, 2, n) == 1, -amax, amax).astype(F32)
    rows[np.arange(n), rng.integers(0, width, n)] = signed
    assert np.array_equal(np.abs(rows).max(axis=1), amax)
    return rows


# ------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inputs", ["float16", "bfloat16", "ties", "random"])
@pytest.mark.parametrize("fp8", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "e4m3fnuz"])
def test_encode_e4m3_matches_round_to_fp8(encoders, fp8, inputs):
    x = e4m3_inputs(inputs)
    name = np.dtype(fp8).name.replace("float8_", "")
    got = encoders(x)[name]
    expected = quant.round_to_fp8(x, fp8).view(np.uint8)
    assert_same(f"encode_e4m3(v, fnuz={fp8 is E4M3FNUZ}) on {inputs}", x, got, expected)


def test_encode_e4m3_known_codes_and_formats_differ(encoders):
    """Hand-checked codes (so a shared mistake of header and reference would show), and the
    two formats give different codes: the comparisons above are not vacuous."""
    x = np.array([1.0, -1.0, 0.0, -0.0, 448.0, 1e6, -1e6, 240.0, 2.0 ** -9, 2.0 ** -10],
                 dtype=F32)
    out = encoders(x)
    assert out["e4m3fn"].tolist() == [0x38, 0xB8, 0x00, 0x80, 0x7E, 0x7E, 0xFE, 0x77, 0x01,
                                      0x00]
    assert out["e4m3fnuz"].tolist() == [0x40, 0xC0, 0x00, 0x00, 0x7F, 0x7F, 0xFF, 0x7F, 0x02,
                                        0x01]
    x = e4m3_inputs("ties")
    out = encoders(x)
    fnuz_ref = quant.round_to_fp8(x, E4M3FNUZ).view(np.uint8)
    assert (out["e4m3fn"] != fnuz_ref).mean() > 0.5
    assert (out["e4m3fn"] != out["e4m3fnuz"]).mean() > 0.5


def test_encode_e2m1_matches_reference(encoders):
    x = e2m1_inputs()
    got = encoders(x)["e2m1"]
    assert_same("encode_e2m1", x, got, quant.encode_e2m1(x))
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, -0.0, 7.0], F32)
    assert encoders(ties)["e2m1"].tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 14, 8, 7]


def test_mx_shared_exponent_matches_quantize_mxfp4(encoders):
    amax = amax_inputs()
    got = encoders(amax)["mx"]
    assert_same("mx_shared_exponent vs mx_shared_exponents", amax, got,
                mx_mod.mx_shared_exponents(amax))
    _, scales = quant.quantize_mxfp4(_rows_with_amax(amax, quant.MX_BLOCK_SIZE, seed=7))
    assert_same("mx_shared_exponent + 127 vs quantize_mxfp4's E8M0 code", amax,
                got + 127, scales[:, 0])
    assert got.min() == -127 and got.max() == 125          # the range float32 reaches
    assert len(np.unique(got)) == 253


@pytest.mark.parametrize("fp8", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "e4m3fnuz"])
def test_fp8_scale_matches_quantize_fp8_per_token(encoders, fp8):
    amax = amax_inputs()
    name = np.dtype(fp8).name.replace("float8_", "")
    got = encoders(amax)["scale_" + name]
    _, scales = quant.quantize_fp8_per_token(_rows_with_amax(amax, 4, seed=8), fp8)
    assert scales.dtype == F32 and scales.shape == (amax.size, 1)
    assert_same(f"fp8_scale(amax, fnuz={fp8 is E4M3FNUZ})", amax, got, scales[:, 0])
    floor = F32(2.0 ** -126)
    assert got.min() == floor and (got == floor).sum() > 100     # the floor was exercised
    assert (got > floor).sum() > amax.size // 2


@pytest.mark.parametrize("fnuz", [False, True], ids=["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_fp8_quotient_is_the_division_for_every_16_bit_value(quotient_check, fmt, fnuz):
    """The fused kernels divide 16-bit rows by their FP8 scale with fp8_quotient instead of
    __fdiv_rn: the FP8 codes of the two agree for every value v and group maximum
    amax >= |v| of the format, infinity included (about 10**9 pairs), so the change keeps
    the codes of the kernels' correctly rounded float32 division (the references divide in
    float64, which differs only near ties: pyar.quant.reference)."""
    pairs, differ, output = quotient_check(fmt, fnuz, "fp8_quotient")
    assert pairs > 10**9 and differ == 0, output


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_fp8_quotient_check_finds_an_uncorrected_product(quotient_check, fmt):
    """Positive control: v * inverse without the FMA correction gives other FP8 codes for
    some pairs, and the check above finds them."""
    pairs, differ, output = quotient_check(fmt, False, "product")
    assert pairs > 10**9 and differ > 1000, output
