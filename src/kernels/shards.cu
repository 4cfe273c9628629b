// reduce_scatter and all_gather: the two halves of a two-shot all-reduce as
// collectives of their own, on the protocol of pyar_protocol.h.
//
// Shards (pyar/comm/shards.py): rank q owns elements [q * shard, (q + 1) *
// shard) of an n-element array, cut at n; shard is a multiple of the
// elements of a pack (L), so only the array's last element run can end in a
// part of a pack.  One launch covers a chunk of every shard: elements
// [q * shard + first, q * shard + first + len_q) with
// len_q = clamp(min(n, (q + 1) * shard) - (q * shard + first), 0, count);
// first and count are multiples of L.
//
// Both kernels read peers' buffers (inputs, registered or staged into each
// rank's scratch) between the start barrier and the exit barrier; the exit
// barrier is what lets a rank reuse its input (or restage its scratch) once
// it returns.  The start barrier also compares the ranks' call signatures.
#include "pyar_protocol.h"
#include "pyar_sums.h"

namespace pyar {

// The elements of shard q in this launch.
PYAR_DEVICE uint64_t chunk_length(uint32_t q, uint64_t n, uint64_t shard, uint64_t first,
                                  uint64_t count) {
  const uint64_t begin = q * shard + first, end = (q + 1) * shard < n ? (q + 1) * shard : n;
  return end <= begin ? 0 : end - begin < count ? end - begin : count;
}

// Where sums go: out of the input's type (rounded), or float32 (as summed).
template <typename T, typename OutT>
struct Sums {
  static PYAR_DEVICE void store_pack(OutT *out, uint64_t i, const float (&acc)[Lanes<T>::kCount]) {
    pyar::store_pack(reinterpret_cast<Pack16 *>(out) + i, round_sums<T>(acc));
  }
  static PYAR_DEVICE OutT element(float sum) { return Element<T>::from_float(sum); }
};

template <typename T>
struct Sums<T, float> {
  static constexpr int L = Lanes<T>::kCount;
  static PYAR_DEVICE void store_pack(float *out, uint64_t i, const float (&acc)[L]) {
    Pack16 *o = reinterpret_cast<Pack16 *>(out + i * L);
#pragma unroll
    for (int k = 0; k < L / 4; ++k)
      pyar::store_pack(o + k, Pack16{{__float_as_uint(acc[4 * k]), __float_as_uint(acc[4 * k + 1]),
                                      __float_as_uint(acc[4 * k + 2]),
                                      __float_as_uint(acc[4 * k + 3])}});
  }
  static PYAR_DEVICE float element(float sum) { return sum; }
};

// This rank's chunk of its shard, summed over every rank in rank order:
// element j from every rank's buffer at in_offset + rank * in_stride + j.
template <typename T, typename OutT, int W>
PYAR_DEVICE void reduce_scatter(const InputTable *in, uint64_t in_offset, uint64_t in_stride,
                                OutT *out, const CommState *state, uint64_t n, uint64_t shard,
                                uint64_t first, uint64_t count, const CallInfo &info) {
  constexpr int L = Lanes<T>::kCount;
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s, info);
  if (start_barrier<W, kIdleMid>(s, epoch, info)) {
    const uint64_t length = chunk_length(s.rank, n, shard, first, count);
    const uint64_t base = in_offset + s.rank * in_stride;  // a multiple of L
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + base / L;
    const uint64_t packs = length / L;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < packs; i += stride) {
      float acc[L];
      load_and_sum<T, W>(src, i, acc);
      Sums<T, OutT>::store_pack(out, i, acc);
    }
    const uint64_t j = packs * L + threadIdx.x;  // the last shard's part of a pack
    if (blockIdx.x == 0 && j < length) out[j] = Sums<T, OutT>::element(sum_element<T, W>(src, j));
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit();
}

// Every rank's chunk of its shard, copied into place: peer q's element j,
// at in_offset + j of its buffer, goes to out[q * shard + first + j].  The
// peers go in groups of up to four, pack i of each loaded before any is
// stored (64 bytes in flight per thread, as in sum_ranks of pyar_rows.h:
// more would hold the larger worlds' registers past two blocks per
// multiprocessor).
template <typename T, int W>
PYAR_DEVICE void all_gather(const InputTable *in, uint64_t in_offset, T *out,
                            const CommState *state, uint64_t n, uint64_t shard, uint64_t first,
                            uint64_t count, const CallInfo &info) {
  constexpr int L = Lanes<T>::kCount;
  constexpr int kGroup = W < 4 ? W : 4;
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s, info);
  if (start_barrier<W, kIdleMid>(s, epoch, info)) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
#pragma unroll
    for (int group = 0; group < W; group += kGroup) {
      const Pack16 *src[kGroup];
      Pack16 *dst[kGroup];
      uint64_t length[kGroup];
#pragma unroll
      for (int r = 0; r < kGroup; ++r) {
        const uint32_t q = group + r < W ? group + r : group;
        src[r] = in->ptr[q] + in_offset / L;
        dst[r] = reinterpret_cast<Pack16 *>(out + q * shard + first);
        length[r] = group + r < W ? chunk_length(q, n, shard, first, count) : 0;
      }
      // The group's first shard is its longest: a later one is as long or cut by n.
      for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < length[0] / L;
           i += stride) {
        Pack16 v[kGroup];
#pragma unroll
        for (int r = 0; r < kGroup; ++r)
          if (i < length[r] / L) v[r] = load_peer(src[r] + i);
#pragma unroll
        for (int r = 0; r < kGroup; ++r)
          if (i < length[r] / L) store_pack(dst[r] + i, v[r]);
      }
      if (blockIdx.x == 0) {  // the last shard's part of a pack
#pragma unroll
        for (int r = 0; r < kGroup; ++r) {
          const uint64_t j = length[r] / L * L + threadIdx.x;
          if (j < length[r])
            reinterpret_cast<T *>(dst[r])[j] = reinterpret_cast<const T *>(src[r])[j];
        }
      }
    }
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit();
}

}  // namespace pyar

#define PYAR_SHARD_PARAMS                                                                    \
  const pyar::CommState *state, uint64_t n, uint64_t shard, uint64_t first, uint64_t count,  \
      uint64_t timeout_ns, uint64_t signature, uint32_t call

#define PYAR_REDUCE_SCATTER_ENTRY(name, T, OutT, W)                                          \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads)                              \
      pyar_reduce_scatter_##name##_w##W(const pyar::InputTable *in, uint64_t in_offset,     \
                                        uint64_t in_stride, OutT *out, PYAR_SHARD_PARAMS) { \
    pyar::reduce_scatter<T, OutT, W>(in, in_offset, in_stride, out, state, n, shard, first, \
                                     count, pyar::CallInfo{timeout_ns, signature, call});   \
  }

#define PYAR_ALL_GATHER_ENTRY(name, T, W)                                                    \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads)                              \
      pyar_all_gather_##name##_w##W(const pyar::InputTable *in, uint64_t in_offset,         \
                                    uint64_t in_stride, T *out, PYAR_SHARD_PARAMS) {        \
    pyar::all_gather<T, W>(in, in_offset, out, state, n, shard, first, count,               \
                           pyar::CallInfo{timeout_ns, signature, call});                    \
  }

// M(arguments.., W) for every supported world size.
#define PYAR_SHARD_WORLDS(M, ...)                                                 \
  M(__VA_ARGS__, 2) M(__VA_ARGS__, 3) M(__VA_ARGS__, 4) M(__VA_ARGS__, 5) M(__VA_ARGS__, 6) \
  M(__VA_ARGS__, 7) M(__VA_ARGS__, 8)

// <input>_<output>: 16-bit inputs also sum into float32 (not rounded).
PYAR_SHARD_WORLDS(PYAR_REDUCE_SCATTER_ENTRY, f32_f32, float, float)
PYAR_SHARD_WORLDS(PYAR_REDUCE_SCATTER_ENTRY, f16_f16, __half, __half)
PYAR_SHARD_WORLDS(PYAR_REDUCE_SCATTER_ENTRY, f16_f32, __half, float)
PYAR_SHARD_WORLDS(PYAR_REDUCE_SCATTER_ENTRY, bf16_bf16, pyar::bf16_bits, pyar::bf16_bits)
PYAR_SHARD_WORLDS(PYAR_REDUCE_SCATTER_ENTRY, bf16_f32, pyar::bf16_bits, float)

PYAR_SHARD_WORLDS(PYAR_ALL_GATHER_ENTRY, f32, float)
PYAR_SHARD_WORLDS(PYAR_ALL_GATHER_ENTRY, f16, __half)
PYAR_SHARD_WORLDS(PYAR_ALL_GATHER_ENTRY, bf16, pyar::bf16_bits)
