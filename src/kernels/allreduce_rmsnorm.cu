// All-reduce fused with residual add, RMSNorm and optional quantization: the
// end of every tensor-parallel attention and MLP block.  For x and residual of
// shape (tokens, hidden):
//
//   s = sum over ranks of x        (fp32, rank order 0..W-1, rounded to T)
//   r = s + residual               (rounded to T; written to residual_out)
//   y = r / sqrt(mean(r^2) + eps) * weight        (rounded to T)
//   q, scales = quantize(y)        (FP8 per token / per group, or MXFP4)
//
// Rows are whole packs (hidden is a multiple of 16 bytes).  A thread has
// registers for its packs of the widest row (kMaxHidden); a block fills them
// with as many rows of its own as fit (a pass, RowPass), so that narrow rows
// keep several rows' loads in flight and share one block reduction.  A thread
// keeps its packs in registers between the sum, the norm and the quantization.
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

// A thread's packs of one pass: slot k holds pack RowPass::pack(k) of row
// RowPass::row(k).
template <typename T>
struct Row {
  static constexpr int L = Lanes<T>::kCount;
  static constexpr int kPacks = kMaxHidden / L / kThreads;
  float v[kPacks][L];
};

// The rows a block holds at once: a row takes `per_row` slots (its packs
// spread over the block's threads), a pass `rows` consecutive rows.
template <typename T>
struct RowPass {
  uint32_t packs;    // per row
  uint32_t per_row;  // slots per row
  uint32_t rows;     // rows per pass
  uint64_t first;    // this pass's first row
  uint64_t tokens;

  PYAR_DEVICE RowPass(uint32_t hidden, uint64_t tokens_)
      : packs(hidden / Row<T>::L),
        per_row((packs + kThreads - 1) / kThreads),
        rows(Row<T>::kPacks / per_row),
        first(0),
        tokens(tokens_) {}

  PYAR_DEVICE uint64_t row(int k) const { return first + uint32_t(k) / per_row; }
  PYAR_DEVICE uint32_t pack(int k) const { return threadIdx.x + (uint32_t(k) % per_row) * kThreads; }
  // Whether the block uses slot k this pass: the same answer in every thread,
  // so warp shuffles and block reductions stay uniform.
  PYAR_DEVICE bool used(int k) const {
    return uint32_t(k) / per_row < rows && row(k) < tokens &&
           (uint32_t(k) % per_row) * kThreads < packs;
  }
  PYAR_DEVICE bool holds(int k) const { return used(k) && pack(k) < packs; }
  // Passes of this block: rows [first, first + rows), blocks taking turns.
  PYAR_DEVICE bool begin() { first = uint64_t(blockIdx.x) * rows; return first < tokens; }
  PYAR_DEVICE bool next() { first += uint64_t(gridDim.x) * rows; return first < tokens; }
};

PYAR_DEVICE int lane_id() { return threadIdx.x % kWarpSize; }

// Each slot's sum (or max) over the block, then over the slots of its row in
// slot order: the same value and bits in every thread, and a row's result
// does not depend on which other rows share its pass.
template <bool kMax, typename T>
PYAR_DEVICE void row_reduce(float (&v)[Row<T>::kPacks], const RowPass<T> &pass) {
  constexpr int N = Row<T>::kPacks;
  __shared__ float per_warp[N][kThreads / kWarpSize];
#pragma unroll
  for (int k = 0; k < N; ++k) {
#pragma unroll
    for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
      const float other = shuffle_xor(v[k], mask);
      v[k] = kMax ? fmaxf(v[k], other) : v[k] + other;
    }
    if (lane_id() == 0) per_warp[k][threadIdx.x / kWarpSize] = v[k];
  }
  __syncthreads();
  float slot[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    slot[k] = per_warp[k][0];
#pragma unroll
    for (int w = 1; w < kThreads / kWarpSize; ++w)
      slot[k] = kMax ? fmaxf(slot[k], per_warp[k][w]) : slot[k] + per_warp[k][w];
  }
  __syncthreads();  // per_warp is reused by the next reduction
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float total = 0.f;  // both reduce non-negative values
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (uint32_t(j) / pass.per_row == uint32_t(k) / pass.per_row)
        total = kMax ? fmaxf(total, slot[j]) : total + slot[j];
    v[k] = total;
  }
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

// Quantizes the pass's rows (y rounded to T, held in `row`) into a.q and a.scales.
template <typename T>
PYAR_DEVICE void quantize_rows(const Row<T> &row, const RowPass<T> &pass, const RowArgs &a) {
  constexpr int L = Row<T>::L;
  constexpr int N = Row<T>::kPacks;
  const uint32_t kind = a.quant & 0xf;
  if (kind == kNoQuant) return;
  float amax[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    amax[k] = 0.f;
    if (pass.holds(k))
#pragma unroll
      for (int j = 0; j < L; ++j) amax[k] = fmaxf(amax[k], fabsf(row.v[k][j]));
  }
  if (kind == kFp8) {
    const bool fnuz = a.quant & kFnuzFlag;
    const uint32_t groups = a.hidden / a.group;
    const int group_packs = a.group / L;
    if (groups == 1) row_reduce<true, T>(amax, pass);  // one scale per token
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (!pass.used(k)) continue;
      // Every lane shuffles, including those past the row's end.
      const float gmax = groups == 1 ? amax[k] : group_max(amax[k], group_packs);
      const uint32_t p = pass.pack(k);
      if (p < pass.packs) {
        const uint64_t t = pass.row(k);
        const float scale = fp8_scale(gmax, fnuz);
        if (p % group_packs == 0) static_cast<float *>(a.scales)[t * groups + p / group_packs] = scale;
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
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (!pass.used(k)) continue;
      const int shared = mx_shared_exponent(group_max(amax[k], block_packs));
      const uint32_t p = pass.pack(k);
      if (p < pass.packs) {
        const uint64_t t = pass.row(k);
        uint8_t *scales = static_cast<uint8_t *>(a.scales) + t * (a.hidden / kMxBlock);
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

// Residual add, RMSNorm and quantization of the pass's rows, whose sums s the
// thread holds in `row` (already rounded to T).  Leaves y (rounded to T) in `row`.
template <typename T>
PYAR_DEVICE void finish_rows(Row<T> &row, const RowPass<T> &pass, const RowArgs &a) {
  constexpr int L = Row<T>::L;
  constexpr int N = Row<T>::kPacks;
  float squares[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    squares[k] = 0.f;
    if (!pass.holds(k)) continue;
    const uint64_t index = pass.row(k) * pass.packs + pass.pack(k);
    const Pack16 res = a.residual[index];
    const T *rv = reinterpret_cast<const T *>(&res);
    Pack16 r;
    T *ro = reinterpret_cast<T *>(&r);
#pragma unroll
    for (int j = 0; j < L; ++j) {
      ro[j] = Element<T>::from_float(row.v[k][j] + Element<T>::to_float(rv[j]));
      row.v[k][j] = Element<T>::to_float(ro[j]);  // y is the norm of the stored residual
      squares[k] += row.v[k][j] * row.v[k][j];
    }
    a.residual_out[index] = r;
  }
  row_reduce<false, T>(squares, pass);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (!pass.holds(k)) continue;
    const float inv_rms = 1.0f / sqrtf(squares[k] / float(a.hidden) + a.eps);
    const uint32_t p = pass.pack(k);
    const Pack16 w = a.weight[p];
    const T *wv = reinterpret_cast<const T *>(&w);
    Pack16 y;
    T *yo = reinterpret_cast<T *>(&y);
#pragma unroll
    for (int j = 0; j < L; ++j) {
      yo[j] = Element<T>::from_float(row.v[k][j] * inv_rms * Element<T>::to_float(wv[j]));
      row.v[k][j] = Element<T>::to_float(yo[j]);  // quantize what the caller would see
    }
    if (a.y) a.y[pass.row(k) * pass.packs + p] = y;
  }
  quantize_rows<T>(row, pass, a);
}

template <typename T>
PYAR_DEVICE void unpack(Row<T> &row, int k, const Pack16 &pack) {
  const T *e = reinterpret_cast<const T *>(&pack);
#pragma unroll
  for (int j = 0; j < Row<T>::L; ++j) row.v[k][j] = Element<T>::to_float(e[j]);
}

// Loads the pass's rows into `row`: slot k from load(index of its pack).
template <typename T, typename Load>
PYAR_DEVICE void load_rows(Row<T> &row, const RowPass<T> &pass, Load load) {
#pragma unroll
  for (int k = 0; k < Row<T>::kPacks; ++k)
    if (pass.holds(k)) unpack<T>(row, k, load(pass.row(k) * pass.packs + pass.pack(k)));
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
    RowPass<T> pass(a.hidden, tokens);
    for (bool more = pass.begin(); more; more = pass.next()) {
      Row<T> row;
      load_rows<T>(row, pass, [&](uint64_t i) { return load_and_reduce<T, W>(src, i); });
      finish_rows<T>(row, pass, a);
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
    RowPass<T> pass(a.hidden, tokens);
    const uint32_t packs = pass.packs;
    const uint32_t slice = (packs + W - 1) / W;
    const uint32_t mine = s.rank * slice;
    const uint32_t my_packs = mine < packs ? min(slice, packs - mine) : 0;
    // This block's rows are those of its passes (RowPass::begin/next), in
    // both phases: the per-block `mid` then orders the scratch writes of
    // every rank's block b before block b's reads.
    const uint64_t passes = (tokens + pass.rows - 1) / pass.rows;
    const uint64_t my_passes =
        passes > blockIdx.x ? (passes - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    Pack16 *partial = s.partial[s.rank];
    for (uint64_t i = threadIdx.x; i < my_passes * pass.rows * slice; i += kThreads) {
      const uint64_t j = i / slice;  // the block's j-th row
      const uint64_t t = (blockIdx.x + (j / pass.rows) * gridDim.x) * pass.rows + j % pass.rows;
      const uint32_t k = i % slice;
      if (t < tokens && k < my_packs) {
        const uint64_t index = t * packs + mine + k;
        store_pack(partial + index, load_and_reduce<T, W>(src, index));
      }
    }
    if (mid_barrier<W>(s, epoch, info)) {
      for (bool more = pass.begin(); more; more = pass.next()) {
        Row<T> row;
        load_rows<T>(row, pass, [&](uint64_t i) {
          return load_peer(s.partial[(i % packs) / slice] + i);
        });
        finish_rows<T>(row, pass, a);
      }
      exit_barrier<W>(s, epoch, info);
    }
  }
  BlockEpoch::commit(s, epoch);
}

template <typename T>
PYAR_DEVICE void add_rmsnorm(const Pack16 *x, uint64_t tokens, const RowArgs &a) {
  RowPass<T> pass(a.hidden, tokens);
  for (bool more = pass.begin(); more; more = pass.next()) {
    Row<T> row;
    load_rows<T>(row, pass, [&](uint64_t i) { return x[i]; });
    finish_rows<T>(row, pass, a);
  }
}

template <typename T>
PYAR_DEVICE void quantize(const Pack16 *y, uint64_t tokens, const RowArgs &a) {
  RowPass<T> pass(a.hidden, tokens);
  for (bool more = pass.begin(); more; more = pass.next()) {
    Row<T> row;
    load_rows<T>(row, pass, [&](uint64_t i) { return y[i]; });
    quantize_rows<T>(row, pass, a);
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
