// All-reduce fused with residual add, RMSNorm and optional quantization: the
// end of every tensor-parallel attention and MLP block.  For x and residual of
// shape (tokens, hidden):
//
//   s = sum over ranks of x        (fp32, rank order 0..W-1, rounded to T)
//   r = s + residual               (rounded to T; written to residual_out)
//   y = r / sqrt(mean(r^2) + eps) * weight        (rounded to T)
//   q, scales = quantize(y)        (FP8 per token / per group, or MXFP4)
//
// Rows are whole packs (hidden is a multiple of 16 bytes) and one block owns
// a row at a time; a thread keeps its packs of the row in registers between
// the sum, the norm and the quantization.
//
// one_stage   every rank reads every peer's rows and computes all of them
//             (latency: one read of the inputs, one kernel).  Peers read this
//             rank's input until they finish, so the exit barrier is what
//             makes the input reusable -- the barrier the seeds' one-stage
//             fused kernels left out.
// two_stage   rank r reduces the r-th slice of every row into its scratch
//             (reduce-scatter), then after `mid` every rank reads the whole
//             reduced rows back from their owners and norms them with its own
//             residual and weight (all-gather of s fused into the norm).  The
//             input is read only before `mid`, so `mid` is the barrier that
//             makes it reusable; the exit barrier is kept all the same (rule
//             1), and the scratch is rewritten only after the next call's
//             start barrier.  Block b handles the same rows in both phases, so
//             a per-block `mid` orders every scratch write before its reads.
//
// add_rmsnorm and quantize are the same steps as single-rank kernels: a world
// of one, and the unfused baseline of the benchmark.
#include "pyar_protocol.h"
#include "pyar_quant.h"

namespace pyar {

constexpr int kMaxHidden = 16384;
constexpr int kMxBlock = 32;

enum QuantKind : uint32_t { kNoQuant = 0, kFp8 = 1, kMxfp4 = 2 };

// What a call reads besides the collective's input and writes.
struct RowArgs {
  const Pack16 *residual;
  const Pack16 *weight;
  Pack16 *residual_out;
  Pack16 *y;          // may be null: only the quantized output is wanted
  uint8_t *q;         // FP8 codes (tokens, hidden) or packed E2M1 (tokens, hidden / 2)
  void *scales;       // float32 (tokens, hidden / group) or E8M0 codes (tokens, hidden / 32)
  uint32_t hidden;
  float eps;
  uint32_t quant;     // QuantKind | kFnuzFlag
  uint32_t group;     // FP8 elements per scale (hidden: one scale per token)
};

constexpr uint32_t kFnuzFlag = 0x10;

template <typename T>
struct Row {
  static constexpr int L = Lanes<T>::kCount;
  static constexpr int kPacks = kMaxHidden / L / kThreads;  // a thread's packs of a row
  float v[kPacks][L];
};

PYAR_DEVICE int lane_id() { return threadIdx.x % kWarpSize; }

// The sum (or max) over the block, the same value and bits in every thread.
template <bool kMax>
PYAR_DEVICE float block_reduce(float v) {
  __shared__ float per_warp[kThreads / kWarpSize];
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
    const float other = shuffle_xor(v, mask);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if (lane_id() == 0) per_warp[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float total = per_warp[0];
#pragma unroll
  for (int w = 1; w < kThreads / kWarpSize; ++w)
    total = kMax ? fmaxf(total, per_warp[w]) : total + per_warp[w];
  __syncthreads();  // per_warp is reused by the next reduction
  return total;
}

// The max over `lanes` adjacent lanes (a power of two up to the warp size);
// every lane of the warp calls it.
PYAR_DEVICE float group_max(float v, int lanes) {
  for (int mask = 1; mask < lanes; mask *= 2) v = fmaxf(v, shuffle_xor(v, mask));
  return v;
}

template <int kBytes> struct Word;
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint64_t; };

// The pack index of a thread's k-th pack of a row.
PYAR_DEVICE uint32_t pack_of(int k) { return threadIdx.x + uint32_t(k) * kThreads; }

// Quantizes row t (y rounded to T, held in `row`) into a.q and a.scales.
template <typename T>
PYAR_DEVICE void quantize_row(const Row<T> &row, uint64_t t, uint32_t packs, const RowArgs &a) {
  constexpr int L = Row<T>::L;
  const uint32_t kind = a.quant & 0xf;
  if (kind == kNoQuant) return;
  float amax[Row<T>::kPacks];
#pragma unroll
  for (int k = 0; k < Row<T>::kPacks; ++k) {
    amax[k] = 0.f;
    if (pack_of(k) < packs)
#pragma unroll
      for (int j = 0; j < L; ++j) amax[k] = fmaxf(amax[k], fabsf(row.v[k][j]));
  }
  if (kind == kFp8) {
    const bool fnuz = a.quant & kFnuzFlag;
    const uint32_t groups = a.hidden / a.group;
    float *scales = static_cast<float *>(a.scales) + t * groups;
    const int group_packs = a.group / L;
    float token_amax = 0.f;
    if (groups == 1) {
#pragma unroll
      for (int k = 0; k < Row<T>::kPacks; ++k) token_amax = fmaxf(token_amax, amax[k]);
      token_amax = block_reduce<true>(token_amax);
    }
#pragma unroll
    for (int k = 0; k < Row<T>::kPacks; ++k) {
      if (k * kThreads >= packs) continue;  // uniform across the block
      // Every lane shuffles, including those past the row's end.
      const float gmax = groups == 1 ? token_amax : group_max(amax[k], group_packs);
      const uint32_t p = pack_of(k);
      if (p < packs) {
        const float scale = fp8_scale(gmax, fnuz);
        if (p % group_packs == 0) scales[p / group_packs] = scale;
        typename Word<L>::type word = 0;
#pragma unroll
        for (int j = 0; j < L; ++j)
          word |= typename Word<L>::type(encode_e4m3(__fdiv_rn(row.v[k][j], scale), fnuz))
                  << (8 * j);
        reinterpret_cast<typename Word<L>::type *>(a.q + t * a.hidden)[p] = word;
      }
    }
  } else {
    constexpr int block_packs = kMxBlock / L;
    uint8_t *scales = static_cast<uint8_t *>(a.scales) + t * (a.hidden / kMxBlock);
#pragma unroll
    for (int k = 0; k < Row<T>::kPacks; ++k) {
      if (k * kThreads >= packs) continue;
      const int shared = mx_shared_exponent(group_max(amax[k], block_packs));
      const uint32_t p = pack_of(k);
      if (p < packs) {
        if (p % block_packs == 0) scales[p / block_packs] = uint8_t(shared + 127);
        typename Word<L / 2>::type word = 0;
#pragma unroll
        for (int j = 0; j < L; ++j)
          word |= typename Word<L / 2>::type(encode_e2m1(ldexpf(row.v[k][j], -shared)))
                  << (4 * j);
        reinterpret_cast<typename Word<L / 2>::type *>(a.q + t * (a.hidden / 2))[p] = word;
      }
    }
  }
}

// Residual add, RMSNorm and quantization of row t, whose sum s the thread
// holds in `row` (already rounded to T).  Leaves y (rounded to T) in `row`.
template <typename T>
PYAR_DEVICE void finish_row(Row<T> &row, uint64_t t, const RowArgs &a) {
  constexpr int L = Row<T>::L;
  const uint32_t packs = a.hidden / L;
  const uint64_t base = t * packs;
  float squares = 0.f;
#pragma unroll
  for (int k = 0; k < Row<T>::kPacks; ++k) {
    const uint32_t p = pack_of(k);
    if (p >= packs) continue;
    const Pack16 res = a.residual[base + p];
    const T *rv = reinterpret_cast<const T *>(&res);
    Pack16 r;
    T *ro = reinterpret_cast<T *>(&r);
#pragma unroll
    for (int j = 0; j < L; ++j) {
      ro[j] = Element<T>::from_float(row.v[k][j] + Element<T>::to_float(rv[j]));
      row.v[k][j] = Element<T>::to_float(ro[j]);  // y is the norm of the stored residual
      squares += row.v[k][j] * row.v[k][j];
    }
    a.residual_out[base + p] = r;
  }
  const float inv_rms = 1.0f / sqrtf(block_reduce<false>(squares) / float(a.hidden) + a.eps);
#pragma unroll
  for (int k = 0; k < Row<T>::kPacks; ++k) {
    const uint32_t p = pack_of(k);
    if (p >= packs) continue;
    const Pack16 w = a.weight[p];
    const T *wv = reinterpret_cast<const T *>(&w);
    Pack16 y;
    T *yo = reinterpret_cast<T *>(&y);
#pragma unroll
    for (int j = 0; j < L; ++j) {
      yo[j] = Element<T>::from_float(row.v[k][j] * inv_rms * Element<T>::to_float(wv[j]));
      row.v[k][j] = Element<T>::to_float(yo[j]);  // quantize what the caller would see
    }
    if (a.y) a.y[base + p] = y;
  }
  quantize_row<T>(row, t, packs, a);
}

template <typename T>
PYAR_DEVICE void unpack(Row<T> &row, int k, const Pack16 &pack) {
  const T *e = reinterpret_cast<const T *>(&pack);
#pragma unroll
  for (int j = 0; j < Row<T>::L; ++j) row.v[k][j] = Element<T>::to_float(e[j]);
}

template <int W>
PYAR_DEVICE bool mid_barrier(const CommState &s, uint32_t epoch, const CallInfo &info) {
#ifdef PYAR_TEST_SKIP_MID_BARRIER
  return true;
#else
  return barrier<W>(s, kMid, epoch, info);
#endif
}

template <typename T, int W>
PYAR_DEVICE void one_stage(const InputTable *in, uint64_t in_offset, uint64_t tokens,
                           const RowArgs &a, const CommState *state, const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s);
  if (barrier<W>(s, kStart, epoch, info)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    const uint32_t packs = a.hidden / Row<T>::L;
    for (uint64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
      Row<T> row;
#pragma unroll
      for (int k = 0; k < Row<T>::kPacks; ++k)
        if (pack_of(k) < packs) unpack<T>(row, k, load_and_reduce<T, W>(src, t * packs + pack_of(k)));
      finish_row<T>(row, t, a);
    }
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit(s, epoch);
}

template <typename T, int W>
PYAR_DEVICE void two_stage(const InputTable *in, uint64_t in_offset, uint64_t tokens,
                           const RowArgs &a, const CommState *state, const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s);
  if (barrier<W>(s, kStart, epoch, info)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    const uint32_t packs = a.hidden / Row<T>::L;
    const uint32_t slice = (packs + W - 1) / W;
    const uint32_t mine = s.rank * slice;
    const uint32_t my_packs = mine < packs ? min(slice, packs - mine) : 0;
    const uint64_t rows = tokens > blockIdx.x ? (tokens - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    Pack16 *partial = s.partial[s.rank];
    for (uint64_t i = threadIdx.x; i < rows * slice; i += kThreads) {
      const uint64_t t = blockIdx.x + (i / slice) * gridDim.x;
      const uint32_t k = i % slice;
      if (k < my_packs) {
        const uint64_t index = t * packs + mine + k;
        store_pack(partial + index, load_and_reduce<T, W>(src, index));
      }
    }
    if (mid_barrier<W>(s, epoch, info)) {
      for (uint64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        Row<T> row;
#pragma unroll
        for (int k = 0; k < Row<T>::kPacks; ++k) {
          const uint32_t p = pack_of(k);
          if (p < packs) unpack<T>(row, k, load_peer(s.partial[p / slice] + t * packs + p));
        }
        finish_row<T>(row, t, a);
      }
      exit_barrier<W>(s, epoch, info);
    }
  }
  BlockEpoch::commit(s, epoch);
}

template <typename T>
PYAR_DEVICE void add_rmsnorm(const Pack16 *x, uint64_t tokens, const RowArgs &a) {
  const uint32_t packs = a.hidden / Row<T>::L;
  for (uint64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    Row<T> row;
#pragma unroll
    for (int k = 0; k < Row<T>::kPacks; ++k)
      if (pack_of(k) < packs) unpack<T>(row, k, x[t * packs + pack_of(k)]);
    finish_row<T>(row, t, a);
  }
}

template <typename T>
PYAR_DEVICE void quantize(const Pack16 *y, uint64_t tokens, const RowArgs &a) {
  const uint32_t packs = a.hidden / Row<T>::L;
  for (uint64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    Row<T> row;
#pragma unroll
    for (int k = 0; k < Row<T>::kPacks; ++k)
      if (pack_of(k) < packs) unpack<T>(row, k, y[t * packs + pack_of(k)]);
    quantize_row<T>(row, t, packs, a);
  }
}

}  // namespace pyar

// Facts the host reads with hipModuleGetGlobal: the largest hidden size, the
// threads per block, the MX block size and the FNUZ flag of `quant`.
extern "C" __device__ const uint64_t pyar_rmsnorm_layout[4] = {
    pyar::kMaxHidden, pyar::kThreads, pyar::kMxBlock, pyar::kFnuzFlag};

#define PYAR_ROW_ARGS                                                                        \
  pyar::RowArgs {                                                                           \
    residual, weight, residual_out, y, q, scales, hidden, eps, quant, group                 \
  }

#define PYAR_ROW_PARAMS                                                                      \
  const pyar::Pack16 *residual, const pyar::Pack16 *weight, pyar::Pack16 *residual_out,     \
      pyar::Pack16 *y, uint8_t *q, void *scales, uint32_t hidden, float eps, uint32_t quant, \
      uint32_t group

#define PYAR_FUSED_ENTRY(algo, name, T, W)                                                   \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads)                              \
      pyar_allreduce_rmsnorm_##algo##_##name##_w##W(                                        \
          const pyar::InputTable *in, uint64_t in_offset, uint64_t tokens, PYAR_ROW_PARAMS,  \
          const pyar::CommState *state, uint64_t timeout_ns, uint32_t call) {               \
    pyar::algo<T, W>(in, in_offset, tokens, PYAR_ROW_ARGS, state,                           \
                     pyar::CallInfo{timeout_ns, call});                                     \
  }

#define PYAR_FUSED_WORLDS(algo, name, T) \
  PYAR_FUSED_ENTRY(algo, name, T, 2)     \
  PYAR_FUSED_ENTRY(algo, name, T, 3)     \
  PYAR_FUSED_ENTRY(algo, name, T, 4)     \
  PYAR_FUSED_ENTRY(algo, name, T, 5)     \
  PYAR_FUSED_ENTRY(algo, name, T, 6)     \
  PYAR_FUSED_ENTRY(algo, name, T, 7)     \
  PYAR_FUSED_ENTRY(algo, name, T, 8)

#define PYAR_LOCAL_ENTRIES(name, T)                                                          \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads) pyar_add_rmsnorm_##name(     \
      const pyar::Pack16 *x, uint64_t tokens, PYAR_ROW_PARAMS) {                            \
    pyar::add_rmsnorm<T>(x, tokens, PYAR_ROW_ARGS);                                         \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads) pyar_quantize_##name(        \
      const pyar::Pack16 *y, uint64_t tokens, uint32_t hidden, uint8_t *q, void *scales,    \
      uint32_t quant, uint32_t group) {                                                     \
    pyar::quantize<T>(y, tokens,                                                            \
                      pyar::RowArgs{nullptr, nullptr, nullptr, nullptr, q, scales, hidden,  \
                                    0.f, quant, group});                                    \
  }

#define PYAR_FUSED_TYPES(name, T)      \
  PYAR_FUSED_WORLDS(one_stage, name, T) \
  PYAR_FUSED_WORLDS(two_stage, name, T) \
  PYAR_LOCAL_ENTRIES(name, T)

PYAR_FUSED_TYPES(f32, float)
PYAR_FUSED_TYPES(f16, __half)
PYAR_FUSED_TYPES(bf16, pyar::bf16_bits)
