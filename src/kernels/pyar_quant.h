// Float -> FP8 E4M3 and MXFP4 (E2M1 elements, E8M0 scales) encoders for the
// fused kernels.  The definitions, and every rounding and edge-case choice,
// are those of the numpy references in pyar/quant (fp8.py, mxfp4.py): round to
// nearest even, saturate instead of producing NaN, zero keeps its sign where
// the format has a negative zero.  Written with plain float arithmetic so that
// one source serves NVIDIA and AMD, with or without FP8 hardware.
#pragma once

#include "pyar_device.h"

namespace pyar {

// 2**e for a normal exponent e in [-126, 127], the range of every caller,
// built from its bits: NVIDIA's ldexpf spends a dozen instructions per call on
// ranges these callers never reach, and the encoders call it per element.
PYAR_DEVICE float pow2(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }

// floor(log2(a)) of a normal positive float; -127 for zero and subnormals,
// which every caller treats as "below the formats' smallest normal".
PYAR_DEVICE int float_exponent(float a) {
  return int((__float_as_uint(a) >> 23) & 0xffu) - 127;
}

// E4M3 with 3 mantissa bits: `fnuz` selects float8_e4m3fnuz (bias 8, max 240,
// no negative zero, AMD gfx942) over float8_e4m3fn (bias 7, max 448).
PYAR_DEVICE uint32_t encode_e4m3(float v, bool fnuz) {
  const int bias = fnuz ? 8 : 7;
  const int emin = 1 - bias;  // exponent of the smallest normal
  const float a = fminf(fabsf(v), fnuz ? 240.0f : 448.0f);
  const int e = float_exponent(a);
  uint32_t code;
  if (e < emin) {
    // Subnormal range: count in units of the subnormal spacing 2**(emin-3);
    // 8 units is the smallest normal, whose code is also 8.
    code = uint32_t(rintf(a * pow2(3 - emin)));
  } else {
    // Mantissa with its leading one, in [8, 16]; 16 carries into the exponent.
    const uint32_t m = uint32_t(rintf(a * pow2(3 - e)));
    code = (uint32_t(e + bias) << 3) + m - 8u;
  }
  const uint32_t sign = __float_as_uint(v) >> 31;
  if (fnuz && code == 0) return 0;  // 0x80 is e4m3fnuz's NaN
  return code | (sign << 7);
}

// The E4M3 codes of two values, a's in the low byte.  sm_89 and later
// convert an E4M3FN pair in one instruction (round to nearest even,
// saturating to the largest finite value): encode_e4m3's definition, which
// tests/gpu/test_fp8_conversion_gpu.py checks for every float32 on the GPU.
PYAR_DEVICE uint32_t encode_e4m3_pair(float a, float b, bool fnuz) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!fnuz) {
    uint16_t codes;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(b), "f"(a));
    return codes;
  }
#endif
  return encode_e4m3(a, fnuz) | (encode_e4m3(b, fnuz) << 8);
}

PYAR_DEVICE float fp8_max(bool fnuz) { return fnuz ? 240.0f : 448.0f; }

// The scale of an FP8 group: amax / FP8_MAX rounded once to float32, floored
// at float32's smallest normal (never zero, never subnormal).
PYAR_DEVICE float fp8_scale(float amax, bool fnuz) {
  return fmaxf(__fdiv_rn(amax, fp8_max(fnuz)), pow2(-126));
}

// Division by an FP8 scale as the fused kernels do it for float16 and
// bfloat16 rows: __fdiv_rn spends a reciprocal, four FMAs and a range check
// with a branch on every element; fp8_quotient spends a product by the
// scale's rounded reciprocal and one FMA correction of its remainder
// (Markstein).  The remainder must stay in float32's normal range, so a scale
// below 2**-60 (a group whose amax is below 2**-51) and v are both lifted by
// 2**64 first, exactly.  The correction of -0 adds +0; the quotient always
// has v's sign.  tests/test_quant_encoders.py checks that the FP8 codes of
// fp8_quotient and of __fdiv_rn agree for every 16-bit v and amax >= |v|;
// float32 rows divide.
struct Fp8Divisor {
  float scale, inverse, lift;
};

PYAR_DEVICE Fp8Divisor fp8_divisor(float scale) {
  const float lift = scale < pow2(-60) ? pow2(64) : 1.0f;
  const float lifted = scale * lift;
  // A group that overflowed to infinity has inverse 0; its correction must be
  // 0 too (not 0 * inf = NaN), so that finite values give +-0 as __fdiv_rn does.
  const float infinity = __uint_as_float(0x7f800000u);
  return {lifted == infinity ? 0.0f : lifted, __fdiv_rn(1.0f, lifted), lift};
}

PYAR_DEVICE float fp8_quotient(float v, const Fp8Divisor &d) {
  const float x = v * d.lift;
  const float q = x * d.inverse;
  return copysignf(fmaf(fmaf(-q, d.scale, x), d.inverse, q), v);
}

// E2M1 code (sign bit 3) of v: grid 0, 0.5, 1, 1.5, 2, 3, 4, 6, saturating.
PYAR_DEVICE uint32_t encode_e2m1(float v) {
  const float a = fminf(fabsf(v), 6.0f);
  uint32_t code;
  if (a < 1.0f) {
    code = uint32_t(rintf(a * 2.0f));  // 0, 0.5, 1.0 are codes 0, 1, 2
  } else {
    const int e = float_exponent(a);  // 0, 1 or 2
    const uint32_t m = uint32_t(rintf(a * pow2(1 - e)));  // in [2, 4]
    code = (uint32_t(e + 1) << 1) + m - 2u;
  }
  return code | ((__float_as_uint(v) >> 31) << 3);
}

// Unbiased MX shared exponent of a block whose largest magnitude is `amax`:
// floor(log2 amax) - 2 (E2M1's largest exponent), at least -127.
PYAR_DEVICE int mx_shared_exponent(float amax) {
  return max(float_exponent(amax) - 2, -127);
}

}  // namespace pyar
