// Float -> FP8 E4M3 and MXFP4 (E2M1 elements, E8M0 scales) encoders for the
// fused kernels.  The definitions, and every rounding and edge-case choice,
// are those of the numpy references in pyar/quant (fp8.py, mxfp4.py): round to
// nearest even, saturate instead of producing NaN, zero keeps its sign where
// the format has a negative zero.  Written with plain float arithmetic so that
// one source serves NVIDIA and AMD, with or without FP8 hardware.
#pragma once

#include "pyar_device.h"

namespace pyar {

// An exact power of two as a float: ldexpf covers the subnormal ones too.
PYAR_DEVICE float pow2(int e) { return ldexpf(1.0f, e); }

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

PYAR_DEVICE float fp8_max(bool fnuz) { return fnuz ? 240.0f : 448.0f; }

// The scale of an FP8 group: amax / FP8_MAX rounded once to float32, floored
// at float32's smallest normal (never zero, never subnormal).
PYAR_DEVICE float fp8_scale(float amax, bool fnuz) {
  return fmaxf(__fdiv_rn(amax, fp8_max(fnuz)), pow2(-126));
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
