// The row code that the fused kernels of allreduce_rmsnorm.cu (one_stage,
// lamport, two_stage, split) and its single-GPU row steps (add_rmsnorm,
// quantize) share: a call's row arguments (RowArgs), the columns a thread
// owns, the block-wide sums and maxima, the quantization of a row, the
// residual add and norm of a row (finish_row), the row sources (one array,
// every rank's input) and the loop over a block's rows (norm_rows).  It is
// apart from the kernels because every one of them handles its rows with it,
// so every variant and every single-GPU step gives the same bits.
//
// A block holds one row at a time: thread t owns packs
// t, t + B, .., t + (P-1)B of every row (B = blockDim.x, chosen by the host
// as packs / P rounded up to a multiple of 64; P packs per thread is a
// template parameter, like the quantization kind), so a thread's columns
// and weight packs are fixed for the whole kernel and kept in registers.
// Rows are grid-strided: block b holds rows b, b + G, b + 2G, ...  While a
// row is normed, the next row's packs (and its residual) are already loaded
// (one pack per thread; wider rows have their P packs in flight instead); a
// row costs one block-wide synchronization for its sum of squares (and one
// more for a per-token FP8 amax).  Threads past the row's end load a clamped
// copy of its last pack and contribute nothing.
#pragma once

#include "pyar_protocol.h"
#include "pyar_quant.h"
#include "pyar_sums.h"

namespace pyar {

constexpr int kMaxHidden = 16384;
constexpr int kMaxRowThreads = 1024;  // threads of a row block (packs / P, rounded up)
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
  uint32_t quant;     // QuantKind | kFnuzFlag (the kind also selects the kernel)
  uint32_t group;     // FP8 elements per scale (hidden: one scale per token)
};

constexpr uint32_t kFnuzFlag = 0x10;

template <typename T>
constexpr int kLaneShift = sizeof(T) == 4 ? 2 : 3;  // log2 of the elements per pack

PYAR_DEVICE uint32_t lane_id() { return threadIdx.x & (kWarpSize - 1); }

// The packs thread t owns in every row: pack t + p * B, clamped to the row's
// last pack past its end (a valid address whose values are masked out).
template <int P>
struct Columns {
  uint32_t packs;  // per row
  uint32_t col[P];
  uint32_t valid;  // bit p: col[p] is the thread's own pack, not a clamped copy

  PYAR_DEVICE explicit Columns(uint32_t packs_) : packs(packs_), valid(0) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const uint32_t c = threadIdx.x + uint32_t(p) * blockDim.x;
      valid |= uint32_t(c < packs) << p;
      col[p] = min(c, packs - 1);
    }
  }
  PYAR_DEVICE bool holds(int p) const { return (valid >> p) & 1u; }
  PYAR_DEVICE uint64_t at(uint64_t row, int p) const { return row * packs + col[p]; }
};

template <typename T>
PYAR_DEVICE void unpack(const Pack16 &pack, float (&v)[Lanes<T>::kCount]) {
  const T *e = reinterpret_cast<const T *>(&pack);
#pragma unroll
  for (int j = 0; j < Lanes<T>::kCount; ++j) v[j] = Element<T>::to_float(e[j]);
}

// Rounds v to T in place and returns the rounded pack.
template <typename T>
PYAR_DEVICE Pack16 round_pack(float (&v)[Lanes<T>::kCount]) {
  Pack16 out;
  T *o = reinterpret_cast<T *>(&out);
#pragma unroll
  for (int j = 0; j < Lanes<T>::kCount; ++j) {
    o[j] = Element<T>::from_float(v[j]);
    v[j] = Element<T>::to_float(o[j]);
  }
  return out;
}

// Block-wide sums and maxima with one __syncthreads each: warp shuffles,
// then every thread combines the warps' results from shared memory in order
// (the same bits everywhere).  A sum takes one value per pack a thread owns
// and reduces each pack's values on their own: warp w's values of pack p
// are those of the row's packs from p * B + w * kWarpSize on (B a multiple
// of the warp size), so adding the slots in index order adds the row's
// warp-wide runs of packs in column order, as with one pack per thread.
// So a row's sum of squares, and its outputs, have the same bits at every
// P, and the fused kernels and the single-GPU steps may launch a row with
// different packs per thread.  The shared slots alternate between two
// halves, so the next reduction writes the other half while slow threads
// still read this one; the one after it writes this half again only after
// its own __syncthreads, which every thread reaches after reading.
template <int P>
struct BlockReduce {
  static constexpr int kMaxSlots = P * kMaxRowThreads / kWarpSize;
  float (*slots)[kMaxSlots];
  uint32_t turn;

  PYAR_DEVICE BlockReduce() : turn(0) {
    __shared__ float shared[2][kMaxSlots];
    slots = shared;
  }
  PYAR_DEVICE float sum(const float (&v)[P]) { return run<false>(v); }
  PYAR_DEVICE float maximum(float v) {
    const float one[1] = {v};
    return run<true>(one);
  }

 private:
  template <bool kMax, int N>
  PYAR_DEVICE float run(const float (&v)[N]) {
    float *slot = slots[turn++ & 1u];
    const uint32_t warps = blockDim.x / kWarpSize;
#pragma unroll
    for (int p = 0; p < N; ++p) {
      float x = v[p];
#pragma unroll
      for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
        const float other = shuffle_xor(x, mask);
        x = kMax ? fmaxf(x, other) : x + other;
      }
      if (lane_id() == 0) slot[p * warps + threadIdx.x / kWarpSize] = x;
    }
    __syncthreads();
    float total = slot[0];
    for (uint32_t w = 1; w < N * warps; ++w) total = kMax ? fmaxf(total, slot[w]) : total + slot[w];
    return total;
  }
};

// The max over `lanes` adjacent lanes (a power of two up to 32); every lane
// of the warp calls it.
PYAR_DEVICE float group_max(float v, uint32_t lanes) {
  for (uint32_t mask = 1; mask < lanes; mask *= 2) v = fmaxf(v, shuffle_xor(v, mask));
  return v;
}

template <int kBytes> struct Word;
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint64_t; };

// Where FP8 scales go, computed once per kernel: the scale of pack c lives in
// column c >> shift, written by the pack with (c & mask) == 0.  One scale per
// token is shift 31 and mask ~0 (column 0, written by pack 0).
struct ScaleGroups {
  uint32_t shift, mask, columns, packs;  // packs per group (1 per token: unused)
  bool per_token;

  template <typename T>
  PYAR_DEVICE static ScaleGroups of(const RowArgs &a) {
    ScaleGroups g;
    g.per_token = a.group == a.hidden;
    g.packs = a.group >> kLaneShift<T>;  // a power of two unless per token (0: no FP8)
    g.shift = g.per_token || g.packs == 0 ? 31u : uint32_t(__ffs(int(g.packs)) - 1);
    g.mask = g.per_token ? ~0u : g.packs - 1;
    g.columns = g.per_token ? 1u : (a.hidden >> kLaneShift<T>) >> g.shift;
    return g;
  }
};

// Quantizes one row, y (rounded to T) in v, into a.q and a.scales (Q is
// kFp8 or kMxfp4).
template <typename T, int P, int Q>
PYAR_DEVICE void quantize_row(const float (&v)[P][Lanes<T>::kCount], const Columns<P> &c,
                              uint64_t row, const RowArgs &a, const ScaleGroups &groups,
                              BlockReduce<P> &reduce) {
  constexpr int L = Lanes<T>::kCount;
  float amax[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    amax[p] = 0.f;
#pragma unroll
    for (int j = 0; j < L; ++j) amax[p] = fmaxf(amax[p], fabsf(v[p][j]));
    if (!c.holds(p)) amax[p] = 0.f;
  }
  if constexpr (Q == kFp8) {
    const bool fnuz = a.quant & kFnuzFlag;
    if (groups.per_token) {
      float m = amax[0];
#pragma unroll
      for (int p = 1; p < P; ++p) m = fmaxf(m, amax[p]);
      m = reduce.maximum(m);
#pragma unroll
      for (int p = 0; p < P; ++p) amax[p] = m;
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p) amax[p] = group_max(amax[p], groups.packs);
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (!c.holds(p)) continue;
      const float scale = fp8_scale(amax[p], fnuz);
      const Fp8Divisor divisor = fp8_divisor(scale);
      const uint32_t col = c.col[p];
      if ((col & groups.mask) == 0)
        static_cast<float *>(a.scales)[row * groups.columns + (col >> groups.shift)] = scale;
      float x[L];
#pragma unroll
      for (int j = 0; j < L; ++j)
        x[j] = sizeof(T) == 2 ? fp8_quotient(v[p][j], divisor) : __fdiv_rn(v[p][j], scale);
      typename Word<L>::type word = 0;
#pragma unroll
      for (int j = 0; j < L; j += 2)
        word |= typename Word<L>::type(encode_e4m3_pair(x[j], x[j + 1], fnuz)) << (8 * j);
      reinterpret_cast<typename Word<L>::type *>(a.q + row * a.hidden)[col] = word;
    }
  } else {
    constexpr uint32_t block_packs = kMxBlock / L;
    constexpr int block_shift = kLaneShift<T> == 3 ? 2 : 3;  // log2(block_packs)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int shared = mx_shared_exponent(group_max(amax[p], block_packs));
      if (!c.holds(p)) continue;
      const uint32_t col = c.col[p];
      uint8_t *scales = static_cast<uint8_t *>(a.scales) + row * (a.hidden / kMxBlock);
      if ((col & (block_packs - 1)) == 0) scales[col >> block_shift] = uint8_t(shared + 127);
      // -shared is in [-126, 127]: one rounding of the product by a normal
      // power of two is ldexpf(v, -shared).
      const float unscale = pow2(-shared);
      typename Word<L / 2>::type word = 0;
#pragma unroll
      for (int j = 0; j < L; ++j)
        word |= typename Word<L / 2>::type(encode_e2m1(v[p][j] * unscale)) << (4 * j);
      reinterpret_cast<typename Word<L / 2>::type *>(a.q + row * (a.hidden / 2))[col] = word;
    }
  }
}

// What every row of a call shares, set up once per block: the thread's
// columns, its weight packs and the quantization's scale layout.
template <typename T, int P>
struct RowContext {
  Columns<P> cols;
  Pack16 weight[P];
  ScaleGroups groups;

  PYAR_DEVICE explicit RowContext(const RowArgs &a)
      : cols(a.hidden >> kLaneShift<T>), groups(ScaleGroups::of<T>(a)) {
#pragma unroll
    for (int p = 0; p < P; ++p) weight[p] = a.weight ? a.weight[cols.col[p]] : Pack16{};
  }
};

// Residual add, RMSNorm and quantization of one row whose sum s (rounded to
// T) is in v; `res` holds the row's residual packs.
template <typename T, int P, int Q>
PYAR_DEVICE void finish_row(float (&v)[P][Lanes<T>::kCount], const Pack16 (&res)[P],
                            const RowContext<T, P> &ctx, uint64_t row, const RowArgs &a,
                            BlockReduce<P> &reduce) {
  constexpr int L = Lanes<T>::kCount;
  const Columns<P> &c = ctx.cols;
  float squares[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float rv[L];
    unpack<T>(res[p], rv);
#pragma unroll
    for (int j = 0; j < L; ++j) v[p][j] += rv[j];
    const Pack16 r = round_pack<T>(v[p]);  // y is the norm of the stored residual
    squares[p] = 0.f;
#pragma unroll
    for (int j = 0; j < L; ++j) squares[p] += v[p][j] * v[p][j];
    if (c.holds(p)) {
      a.residual_out[c.at(row, p)] = r;
    } else {
      squares[p] = 0.f;
    }
  }
  const float inv_rms = 1.0f / sqrtf(reduce.sum(squares) / float(a.hidden) + a.eps);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float wv[L];
    unpack<T>(ctx.weight[p], wv);
#pragma unroll
    for (int j = 0; j < L; ++j) v[p][j] = v[p][j] * inv_rms * wv[j];
    const Pack16 y = round_pack<T>(v[p]);  // quantize what the caller would see
    if (a.y && c.holds(p)) a.y[c.at(row, p)] = y;
  }
  if constexpr (Q != kNoQuant) quantize_row<T, P, Q>(v, c, row, a, ctx.groups, reduce);
}

// Packs of one row from a single array (the gathered sums, or x on one GPU);
// `peer` selects loads that bypass the per-multiprocessor cache, for data
// other ranks wrote during this kernel.
template <typename T, int P, bool kPeer>
struct ArrayRows {
  static constexpr bool kRawAhead = true;  // loads only: see PeerRows
  const Pack16 *base;
  struct Raw {
    Pack16 pack[P];
  };
  PYAR_DEVICE Raw load(const Columns<P> &c, uint64_t row) const {
    Raw raw;
#pragma unroll
    for (int p = 0; p < P; ++p) raw.pack[p] = kPeer ? load_peer(base + c.at(row, p))
                                                    : base[c.at(row, p)];
    return raw;
  }
  PYAR_DEVICE void sum(const Raw &raw, float (&v)[P][Lanes<T>::kCount]) const {
#pragma unroll
    for (int p = 0; p < P; ++p) unpack<T>(raw.pack[p], v[p]);
  }
};

// Every rank's base pointer (an input, or a gather buffer) in shared memory,
// read again at each use: kept in registers through the row loops, W 64-bit
// pointers (two tables in two-stage) push the larger worlds past 64
// registers; a broadcast shared load per use is cheaper than the spills.
template <int W>
struct RankTable {
#if PYAR_AMD
  // A generic volatile load compiles to a flat load with glc, a system-coherent
  // access paid at every use; AMD's register file holds the table instead.
  Pack16 **entry;
#else
  Pack16 *volatile *entry;
#endif
  PYAR_DEVICE Pack16 *operator[](int r) const { return entry[r]; }
  // Threads < W fill it; the caller's next __syncthreads publishes it.
  // kTable tells a kernel's tables apart (each instantiation has its own
  // shared array).  An input table is only ever loaded from.
  template <int kTable>
  PYAR_DEVICE static RankTable fill(const Pack16 *const *bases, uint64_t offset) {
    __shared__ Pack16 *table[kMaxRanks];
    if (threadIdx.x < W) table[threadIdx.x] = const_cast<Pack16 *>(bases[threadIdx.x]) + offset;
    return RankTable{table};
  }
};

// Ranks first, first + 1, .. (below W) of a row's pack, from v, added into
// acc in rank order in fp32 (rank 0's values start it): every variant sums
// a pack this way, so every variant gives the same bits.
template <typename T, int W, int N>
PYAR_DEVICE void add_in_rank_order(float (&acc)[Lanes<T>::kCount], const Pack16 (&v)[N],
                                   int first) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (first + r >= W) continue;
    float x[Lanes<T>::kCount];
    unpack<T>(v[r], x);
#pragma unroll
    for (int j = 0; j < Lanes<T>::kCount; ++j) acc[j] = first + r == 0 ? x[j] : acc[j] + x[j];
  }
}

// The sum of one pack over every rank, in rank order in fp32 and rounded to
// T: the bits of reduce_pack.  The loads go out in groups of up to four
// ranks (64 bytes in flight per thread), which holds the registers of the
// larger worlds within two 512-thread blocks per multiprocessor.
template <typename T, int W>
PYAR_DEVICE Pack16 sum_ranks(const RankTable<W> &src, uint64_t i) {
  constexpr int kGroup = W < 4 ? W : 4;
  float acc[Lanes<T>::kCount];
#pragma unroll
  for (int first = 0; first < W; first += kGroup) {
    Pack16 v[kGroup];
#pragma unroll
    for (int r = 0; r < kGroup; ++r)
      if (first + r < W) v[r] = load_peer(src[first + r] + i);
    add_in_rank_order<T, W>(acc, v, first);
  }
  return round_pack<T>(acc);
}

// Packs of one row from every rank's input.  With few packs per row in
// flight (W * P <= 5) the raw packs are loaded a row ahead and summed when
// the row's turn comes; with more, they are summed as they arrive (W * P
// packs in flight already) and the row ahead holds only the sums.  Five, not
// six: at 6 ranks a row of raw packs ahead spills (float16, FP8: 16 bytes).
// kRawAhead: load() only issues loads, so loading a row that is never used
// costs no wait; without it load() waits for the sums.
template <typename T, int P, int W>
struct PeerRows {
  static constexpr bool kRawAhead = W * P <= 5;
  RankTable<W> src;
  struct Raw {
    Pack16 pack[P][kRawAhead ? W : 1];
  };
  PYAR_DEVICE Raw load(const Columns<P> &c, uint64_t row) const {
    Raw raw;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if constexpr (kRawAhead) {
#pragma unroll
        for (int r = 0; r < W; ++r) raw.pack[p][r] = load_peer(src[r] + c.at(row, p));
      } else {
        raw.pack[p][0] = sum_ranks<T, W>(src, c.at(row, p));
      }
    }
    return raw;
  }
  PYAR_DEVICE void sum(const Raw &raw, float (&v)[P][Lanes<T>::kCount]) const {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if constexpr (kRawAhead) {
        unpack<T>(reduce_pack<T, W>(raw.pack[p]), v[p]);
      } else {
        unpack<T>(raw.pack[p][0], v[p]);
      }
    }
  }
};

template <typename T, int P>
struct ResidualRow {
  Pack16 pack[P];
  PYAR_DEVICE void load(const Columns<P> &c, const Pack16 *residual, uint64_t row) {
#pragma unroll
    for (int p = 0; p < P; ++p) pack[p] = residual[c.at(row, p)];
  }
};

// The block's first row, clamped into the call (a block without rows loads
// row 0 and never uses it): its residual is the caller's own data, complete
// when the kernel starts, so it is loaded before any barrier.
PYAR_DEVICE uint64_t first_row(uint64_t tokens) {
  return blockIdx.x < tokens ? blockIdx.x : 0;
}

// The block's rows b, b + G, ..: residual add, RMSNorm, quantization.  With
// one pack per thread the next row's packs and residual are loaded before
// the current row is normed; with more, the row's own P packs a source are
// in flight already and a second row's would not fit 64 registers.  On its
// last row a block loads that row again instead (straight-line: a branch
// there costs registers, and the 5-rank kernels spill), except where the
// load waits for its sums: there the branch skips a second round of peer
// loads and sums (tests/test_machine_code.py: at 8 ranks the first row
// waited for memory 8 times before its first store, now 2).  The branch is
// the same for the whole block.
// `raw`: the block's first row, loaded (a block with rows only).
template <typename T, int P, int Q, typename Rows>
PYAR_DEVICE void norm_rows(const Rows &rows, uint64_t tokens, const RowArgs &a,
                           const RowContext<T, P> &ctx, ResidualRow<T, P> res,
                           typename Rows::Raw raw) {
  constexpr bool kAhead = P == 1;
  BlockReduce<P> reduce;
  uint64_t row = blockIdx.x;
  for (;;) {
    const uint64_t next = row + gridDim.x;
    const bool more = next < tokens;
    typename Rows::Raw raw_ahead;
    ResidualRow<T, P> res_ahead;
    if constexpr (kAhead) {
      if (Rows::kRawAhead || more) {
        const uint64_t ahead = more ? next : row;
        raw_ahead = rows.load(ctx.cols, ahead);
        res_ahead.load(ctx.cols, a.residual, ahead);
      }
    }
    float v[P][Lanes<T>::kCount];
    rows.sum(raw, v);
    finish_row<T, P, Q>(v, res.pack, ctx, row, a, reduce);
    if (!more) break;
    row = next;
    if constexpr (kAhead) {
      raw = raw_ahead;
      res = res_ahead;
    } else {
      raw = rows.load(ctx.cols, row);
      res.load(ctx.cols, a.residual, row);
    }
  }
}

template <typename T, int P, int Q, typename Rows>
PYAR_DEVICE void norm_rows(const Rows &rows, uint64_t tokens, const RowArgs &a,
                           const RowContext<T, P> &ctx, ResidualRow<T, P> res) {
  if (blockIdx.x >= tokens) return;
  norm_rows<T, P, Q>(rows, tokens, a, ctx, res, rows.load(ctx.cols, blockIdx.x));
}

}  // namespace pyar
