// The rail's sum on the device (pyar/comm/hierarchical.py, inter_node="device"):
// MPI's all-gather left every domain's shard in one buffer, row d = domain d's
// shard, rows `pitch` elements apart; out[i] = rows[0][i] + rows[1][i] + ...,
// added in row (domain) order in float32 and rounded once to OutT.  These are
// the additions of pyar.comm.rail.add_in_order on the host path, in the same
// order, so both paths give the same bits (an add is never fused with
// anything, and the build flushes no subnormals).
//
// Not a collective: it reads only this rank's memory, which MPI finished
// writing before the host launched it, and waits for nobody.
//
// Each thread owns 4 elements at a time (16 bytes of float32 rows), so
// `pitch` is a multiple of 4 and the rows are 16-byte aligned (8-byte for
// 16-bit rows, a domain of one rank's own dtype); only the last group of 4
// of the output may be partial.
#include "pyar_device.h"

namespace pyar {

constexpr int kRailThreads = 256;
constexpr int kRailLanes = 4;

template <typename T>
struct Quad;  // 4 elements of T, loaded at once

template <>
struct Quad<float> {
  using Type = float4;
  static PYAR_DEVICE void widen(const float4 &v, float (&f)[kRailLanes]) {
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  }
};

template <typename T16>
struct Quad16 {
  using Type = uint2;
  static PYAR_DEVICE void widen(const uint2 &v, float (&f)[kRailLanes]) {
    const uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int k = 0; k < kRailLanes; ++k) {
      T16 e;
      const uint16_t bits = static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2)));
      memcpy(&e, &bits, sizeof(bits));
      f[k] = Element<T16>::to_float(e);
    }
  }
};

template <>
struct Quad<__half> : Quad16<__half> {};
template <>
struct Quad<bf16_bits> : Quad16<bf16_bits> {};

template <typename InT, typename OutT>
PYAR_DEVICE void rail_sum(const InT *rows, uint64_t pitch, uint64_t n, uint32_t domains,
                          OutT *out) {
  using Q = Quad<InT>;
  using Vec = typename Q::Type;
  const uint64_t quads = (n + kRailLanes - 1) / kRailLanes;
  const uint64_t row_quads = pitch / kRailLanes;
  const Vec *in = reinterpret_cast<const Vec *>(rows);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < quads; i += stride) {
    float total[kRailLanes], part[kRailLanes];
    Q::widen(in[i], total);
    const Vec *next = in + i;
    // Unrolled so that several rows' loads are in flight before their adds.
#pragma unroll 4
    for (uint32_t d = 1; d < domains; ++d) {
      next += row_quads;
      Q::widen(*next, part);
#pragma unroll
      for (int k = 0; k < kRailLanes; ++k) total[k] += part[k];
    }
    OutT *o = out + i * kRailLanes;
    const uint64_t left = n - i * kRailLanes;
#pragma unroll
    for (int k = 0; k < kRailLanes; ++k) {
      const OutT value = Element<OutT>::from_float(total[k]);
      if (uint64_t(k) < left) o[k] = value;
    }
  }
}

}  // namespace pyar

// pyar_rail_sum_<rows>_<out>: float32 rows into every dtype; a domain of one
// rank sends its own 16-bit elements, summed into the same dtype.
#define PYAR_RAIL_SUM_ENTRY(name, InT, OutT)                                                \
  extern "C" __global__ void __launch_bounds__(pyar::kRailThreads)                         \
      pyar_rail_sum_##name(const InT *rows, uint64_t pitch, uint64_t n, uint32_t domains,  \
                           OutT *out) {                                                     \
    pyar::rail_sum<InT, OutT>(rows, pitch, n, domains, out);                                \
  }

PYAR_RAIL_SUM_ENTRY(f32_f32, float, float)
PYAR_RAIL_SUM_ENTRY(f32_f16, float, __half)
PYAR_RAIL_SUM_ENTRY(f32_bf16, float, pyar::bf16_bits)
PYAR_RAIL_SUM_ENTRY(f16_f16, __half, __half)
PYAR_RAIL_SUM_ENTRY(bf16_bf16, pyar::bf16_bits, pyar::bf16_bits)
