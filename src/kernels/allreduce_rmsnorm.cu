// All-reduce fused with residual add, RMSNorm and optional quantization: the
// end of every tensor-parallel attention and MLP block.  For x and residual of
// shape (tokens, hidden):
//
//   s = sum over ranks of x        (fp32, rank order 0..W-1, rounded to T)
//   r = s + residual               (rounded to T; written to residual_out)
//   y = r / sqrt(mean(r^2) + eps) * weight        (rounded to T)
//   q, scales = quantize(y)        (FP8 per token / per group, or MXFP4)
//
// The row code (a block per row, its block-wide sums, quantization, row
// sources and the loop over a block's rows) is in pyar_rows.h, which the
// single-GPU steps share.
//
// one_stage   every rank reads every peer's rows and computes all of them
//             (latency: one read of the inputs, one kernel).  Peers read this
//             rank's input until they finish, so the exit barrier is what
//             makes the input reusable -- the barrier the seeds' one-stage
//             fused kernels left out.
// two_stage   rank r reduces the r-th slice of every row and stores the
//             reduced packs into every rank's gather buffer (its two-shot
//             scratch); after `mid` each rank norms whole rows from its own
//             gather buffer, with its own residual and weight.  The input is
//             read only before `mid`, so `mid` is the barrier that makes it
//             reusable; the exit barrier is kept all the same (rule 1).
// split       two_stage cut at `mid` into two kernels: split_reduce (phase
//             1 and `mid` on the capped grid of a spinning kernel) and
//             add_rmsnorm on the gather buffer (the norms on the whole GPU,
//             waiting for nothing).  split_reduce has no exit barrier: the
//             proof is at the kernel.  After a kernel A that failed (the
//             ranks disagreed, or a peer never came) kernel B writes
//             nothing: it reads the rank's Signal::some_block_failed first.
//
// add_rmsnorm and quantize are the same steps as single-rank kernels: a world
// of one, and the unfused baseline of the benchmark.
#include "pyar_lamport.h"
#include "pyar_protocol.h"
#include "pyar_rows.h"
#include "pyar_staging.h"
#include "pyar_sums.h"

namespace pyar {

template <int W>
PYAR_DEVICE bool mid_barrier(const CommState &s, uint32_t epoch, const CallInfo &info) {
#ifdef PYAR_TEST_SKIP_MID_BARRIER
  return true;
#else
  return barrier<W>(s, kMid, epoch, info);
#endif
}

// Staged (every fused kernel): block b of every rank reads rows b, b + G,
// .. of every rank's scratch and no other rows -- whole rows in one_stage,
// rank r's slice of them in two_stage's and split's phase 1, whose slices
// over all ranks make the whole rows -- so block b copies exactly its rows of
// this rank's input, every pack of them, kInFlight packs a thread at a time
// (whole rows when they are narrower).  A reader's thread past a row's end
// loads the row's last pack, which the same block copies.
template <int P, int kInFlight>
struct StageRows {
  static constexpr int kPacks = P < kInFlight ? P : kInFlight;  // of a row, per round
  static constexpr int kRows = kInFlight / kPacks;              // rows per round
  uint64_t tokens;
  uint32_t packs;  // per row
  PYAR_DEVICE void operator()(uint32_t block, const Pack16 *from, Pack16 *to) const {
    const uint64_t step = gridDim.x;
    for (uint64_t row = block; row < tokens; row += kRows * step) {
#pragma unroll
      for (int first = 0; first < P; first += kPacks) {
        // Straight-line, so the packs stay in registers: past the rows'
        // end, the round's first row again, and past a row's end its last
        // pack again (the same values stored again).
        uint64_t at[kRows * kPacks];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int p = 0; p < kPacks; ++p) {
            const uint32_t c = threadIdx.x + uint32_t(first + p) * blockDim.x;
            const uint64_t in_row = row + r * step < tokens ? row + r * step : row;
            at[r * kPacks + p] = in_row * packs + min(c, packs - 1);
          }
        copy_packs(from, to, at);
      }
    }
  }
};

template <typename T, int P, int Q, int W>
PYAR_DEVICE void one_stage(const InputTable *in, uint64_t in_offset, const Pack16 *stage_from,
                           uint64_t tokens, const RowArgs &a, const CommState *state,
                           const CallInfo &info) {
  const CommState &s = *state;
  const RowContext<T, P> ctx(a);
  ResidualRow<T, P> res;
  res.load(ctx.cols, a.residual, first_row(tokens));
  const PeerRows<T, P, W> rows{RankTable<W>::template fill<0>(in->ptr, in_offset)};
  const uint32_t epoch = BlockEpoch::begin(s, info);
  // One pack at a time: the weight and residual packs are live across the
  // copy (more in flight spill), and one-stage runs where a block has one
  // row or few.
  if (staged_start_barrier<W, kIdleMid>(s, epoch, info, in, in_offset, stage_from,
                                        StageRows<P, 1>{tokens, ctx.cols.packs})) {
    norm_rows<T, P, Q>(rows, tokens, a, ctx, res);
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit();
}

// Packs of one row from this rank's receive slot (lamport): each rank's
// pushed pack taken as it arrives, and summed in rank order.  A row is taken
// once (its packs are emptied), so it is never loaded ahead of a row that
// has no successor (kRawAhead false); threads past the row's end take
// nothing (the row's last pack is another thread's to take).
template <typename T, int P, int W>
struct PushedRows {
  static constexpr bool kRawAhead = false;
  const CommState *state;
  const Pack16 *slot;  // this call's slot of this rank's region
  uint64_t segment;    // packs per source rank
  const CallInfo *info;
  struct Raw {
    Pack16 pack[P];
  };
  // `arrived` is cleared when a pack did not come (the timeout, or the
  // call was abandoned).
  // Sources are taken (and summed, in rank order) kGroup at a time: at most
  // four packs in flight per thread, as sum_ranks, which holds the registers
  // within the 64 of a kMaxRowThreads block.
  static constexpr int kGroup = W < 4 / P ? W : 4 / P;
  // `glance` (the first row's take only) is loaded beside the last source
  // group's polls.
  PYAR_DEVICE Raw take(const Columns<P> &c, uint64_t row, bool &arrived,
                       FlagGlance<W> *glance = nullptr) const {
    Raw raw;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      raw.pack[p] = Pack16{};
      if (!c.holds(p)) continue;
      float acc[Lanes<T>::kCount];
#pragma unroll
      for (int first = 0; first < W; first += kGroup) {
        Pack16 v[kGroup];
        arrived &= take_packs<kGroup>(*state, slot, segment, c.at(row, p), first,
                                      W - first < kGroup ? W - first : kGroup, *info, v,
                                      first + kGroup >= W && p == 0 ? glance : nullptr);
        add_in_rank_order<T, W>(acc, v, first);
      }
      raw.pack[p] = round_pack<T>(acc);
    }
    return raw;
  }
  // The rows after a block's first, whose senders are known to run: they
  // pushed the first row, and a block pushes all its rows without waiting.
  PYAR_DEVICE Raw load(const Columns<P> &c, uint64_t row) const {
    bool arrived = true;
    return take(c, row, arrived);
  }
  PYAR_DEVICE void sum(const Raw &raw, float (&v)[P][Lanes<T>::kCount]) const {
#pragma unroll
    for (int p = 0; p < P; ++p) unpack<T>(raw.pack[p], v[p]);
  }
};

// Row `row` of this rank's input (its packs `v`), stored into slot
// `slot_offset` of every rank's region at this rank's segment (`peers`).
template <int P, int W>
PYAR_DEVICE void push_row(const Pack16 (&v)[P], uint64_t row, const Columns<P> &c,
                          const RankTable<W> &peers, uint64_t slot_offset) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (!c.holds(p)) continue;
    const Pack16 pushed = pushable(v[p]);
    const uint64_t at = slot_offset + c.at(row, p);
#pragma unroll
    for (int r = 0; r < W; ++r) push_pack(peers[r] + at, pushed);
  }
}

// Block b's rows from `start` on (start, start + G, ..) of this rank's input
// x, pushed (push_row): kBatch rows' packs loaded before any is stored.
template <int P, int W>
PYAR_DEVICE void push_rows(const Pack16 *x, uint64_t tokens, const Columns<P> &c,
                           const RankTable<W> &peers, uint64_t slot_offset, uint64_t start) {
  constexpr int kBatch = P < 4 ? 4 / P : 1;
  const uint64_t step = gridDim.x;
  for (uint64_t first = start; first < tokens; first += kBatch * step) {
    Pack16 v[kBatch][P];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
#pragma unroll
      for (int p = 0; p < P; ++p)
        v[k][p] = first + k * step < tokens ? x[c.at(first + k * step, p)] : Pack16{};
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (first + k * step >= tokens) break;
      push_row<P, W>(v[k], first + k * step, c, peers, slot_offset);
    }
  }
}

// The block's first row of x (`head`) and of the residual (`res`), loaded
// before the block begins its epoch: they travel with the epoch's own loads
// instead of adding a round trip to memory between the call's announcement
// and its first push, where a small call spends most of its time.  (The
// announcement's release then waits for them on AMD, as it waits for the
// epoch's loads they travel with.)
template <typename T, int P>
struct FirstRow {
  ResidualRow<T, P> res;
  Pack16 head[P];
  PYAR_DEVICE void load(const Pack16 *x, uint64_t tokens, const Columns<P> &c,
                        const Pack16 *residual) {
    res.load(c, residual, first_row(tokens));
#pragma unroll
    for (int p = 0; p < P; ++p) head[p] = x[c.at(first_row(tokens), p)];
  }
};

// One-stage with pushed rows (pyar_lamport.h): every rank stores its rows
// into every rank's receive slot, then norms whole rows from its own slot.
// `region`: this rank's receive region; `region_offset`: where a region
// starts past a rank's two-shot scratch (CommState::partial), the same on
// every rank; `segment`: packs of a source's rows in a slot.
//
// Why it needs neither a start barrier before its data moves nor an exit
// barrier (rule 1):
// - The input.  No peer reads this rank's memory except through what this
//   rank stored into theirs: x is read by this rank's own blocks only, before
//   the kernel returns.  The caller may overwrite it as soon as the kernel
//   has returned -- the seeds' bug has nothing to read.
// - A slot, between the calls that use it.  Rank q stores into rank p's slot
//   s only in a call whose count c has c & 1 == s; the slot's previous use
//   was the call of count c - 2, in which p's blocks took every pack q
//   stored and emptied it again.  q's call c starts after q's call c - 1
//   returned (stream order), every block of which waited for p's start flag
//   of call c - 1 (confirm); p stored it after its call c - 2 had returned.
//   So p has taken and emptied the slot before q stores into it again; the
//   kernel boundary orders p's emptying stores before its later flag.
// - The slot of the call in flight.  Each pack is stored once per call, by
//   its source, and read (then emptied) only by its owner's block that
//   handles the row: each rank's block b pushes exactly the rows block b of
//   every rank takes (the grid is the same on every rank).
// - The flags.  The start flag is stored before the first push and checked
//   (arrival and digest, as at a start barrier) once the block's first row
//   has come, before anything is written: a disagreeing call writes nothing.
//   A peer may then be one call ahead; its next flag is judged as a start
//   barrier judges one (wait_for_flag).  Once a peer's block pushed a block's
//   first row, it pushes all of them: a block stores its rows without
//   waiting on anything.
// The slots' counters live in the region (LamportSlots); every rank's block
// b of one call reads the same count.
template <typename T, int P, int Q, int W>
PYAR_DEVICE void lamport(const Pack16 *x, uint64_t tokens, const RowArgs &a,
                         const CommState *state, void *region, uint64_t region_offset,
                         uint64_t segment, const CallInfo &info) {
  const CommState &s = *state;
  const RowContext<T, P> ctx(a);
  FirstRow<T, P> mine;
  mine.load(x, tokens, ctx.cols, a.residual);
  const LamportSlots slots(region);
  const RankTable<W> peers = RankTable<W>::template fill<0>(
      s.partial, (region_offset + kLamportHeaderBytes) / sizeof(Pack16) + s.rank * segment);
  const uint32_t epoch = BlockEpoch::begin(s, info);
  if (announce<W>(epoch)) {
    const uint64_t slot_offset = uint64_t(slots.slot()) * W * segment;
    if (blockIdx.x < tokens) push_row<P, W>(mine.head, blockIdx.x, ctx.cols, peers, slot_offset);
    push_rows<P, W>(x, tokens, ctx.cols, peers, slot_offset, blockIdx.x + gridDim.x);
    reader_delay(s.rank == W - 1);
    ResidualRow<T, P> &res = mine.res;
    const PushedRows<T, P, W> rows{
        &s,
        reinterpret_cast<const Pack16 *>(static_cast<const char *>(region) +
                                         kLamportHeaderBytes) + slot_offset,
        segment, &info};
    bool arrived = true;
    typename PushedRows<T, P, W>::Raw first{};
    FlagGlance<W> glance(epoch);
    if (blockIdx.x < tokens) first = rows.take(ctx.cols, blockIdx.x, arrived, &glance);
    if (confirm<W>(s, epoch, info, arrived, glance) && blockIdx.x < tokens)
      norm_rows<T, P, Q>(rows, tokens, a, ctx, res, first);
  }
  BlockEpoch::commit();
  slots.advance();
}

// Phase 1 of two_stage: this rank's slice of each of the block's rows,
// summed and stored into every rank's gather buffer at the row's own place.
// Item q of the block (thread t's p-th, q = t + p * B) is pack q % slice of
// the slice in rows j = q / slice, j + R, j + 2R, .. of the block's rows
// (R = B * P / slice rows at once); both divisions happen once per item.
template <typename T, int P, int W>
PYAR_DEVICE void reduce_scatter_rows(const RankTable<W> &src, const RankTable<W> &gather,
                                     uint64_t tokens, uint32_t packs, const CommState &s) {
  if (blockIdx.x >= tokens) return;
  const uint32_t slice = (packs + W - 1) / W;
  const uint32_t mine = s.rank * slice;
  const uint32_t items = blockDim.x * uint32_t(P);
  const uint32_t at_once = items / slice;  // >= 1: B * P >= packs >= slice
  const uint64_t my_rows = (tokens - 1 - blockIdx.x) / gridDim.x + 1;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const uint32_t q = threadIdx.x + uint32_t(p) * blockDim.x;
    const uint32_t first = q / slice;
    const uint32_t col = mine + (q - first * slice);
    if (first >= at_once || col >= packs) continue;
    for (uint64_t j = first; j < my_rows; j += at_once) {
      const uint64_t index = (blockIdx.x + j * gridDim.x) * packs + col;
      const Pack16 sum = sum_ranks<T, W>(src, index);
#pragma unroll
      for (int r = 0; r < W; ++r) store_pack(gather[r] + index, sum);
    }
  }
}

template <typename T, int P, int Q, int W>
PYAR_DEVICE void two_stage(const InputTable *in, uint64_t in_offset, const Pack16 *stage_from,
                           uint64_t tokens, const RowArgs &a, const CommState *state,
                           const CallInfo &info) {
  const CommState &s = *state;
  const RankTable<W> src = RankTable<W>::template fill<0>(in->ptr, in_offset);
  const RankTable<W> gather = RankTable<W>::template fill<1>(s.partial, 0);
  const uint32_t epoch = BlockEpoch::begin(s, info);
  if (staged_start_barrier<W, kNoIdlePhase>(
          s, epoch, info, in, in_offset, stage_from,
          StageRows<P, kStageInFlight>{tokens, a.hidden >> kLaneShift<T>})) {
    reduce_scatter_rows<T, P, W>(src, gather, tokens, a.hidden >> kLaneShift<T>, s);
    // Ordering.  Block b of every rank stores the sums of block b's rows
    // (rows b, b + G, ..: the rows norm_rows gives block b) and nothing
    // else, so after the per-block `mid` barrier, block b reads exactly what
    // block b of every rank stored.  The stores go to peers' memory: each
    // thread fences its own stores at system scope before the barrier, so
    // that they are visible once a peer's acquire sees the barrier's flag
    // (the barrier's release alone is issued by other threads).  The gather
    // buffer is stored to again only by the next call's blocks after its
    // start barrier, which a peer's block reaches only once that peer's
    // previous kernel has finished (stream order): nothing still reads it.
    fence_system();
    // The weight and the first residual row, this rank's own data, load
    // while the block waits at `mid` (not before phase 1: their registers
    // would be held through it).
    const RowContext<T, P> ctx(a);
    ResidualRow<T, P> res;
    res.load(ctx.cols, a.residual, first_row(tokens));
    if (mid_barrier<W>(s, epoch, info)) {
      const ArrayRows<T, P, true> rows{s.partial[s.rank]};
      norm_rows<T, P, Q>(rows, tokens, a, ctx, res);
      exit_barrier<W>(s, epoch, info);
    }
  }
  BlockEpoch::commit();
}

// Kernel A of split, the two-stage kernel's first phase alone: after `mid`
// the gather buffer s.partial[rank] holds every row's sums, and kernel B,
// add_rmsnorm on that buffer queued right behind it on the same stream,
// norms them on the whole GPU, waiting for nothing.  The rows and their sums
// are two_stage's bit for bit: the same reduction, the same row code.
//
// No exit barrier (rule 1), because nothing needs it:
// - The input.  Peers read rank r's input only before `mid` (phase 1), and
//   block b passes `mid` only once block b of every rank has arrived there,
//   after its reads (the barrier syncs the block before its release).  When
//   r's kernel returns, all its blocks have passed `mid`: no peer reads r's
//   input any more, and the caller may overwrite it (or the next kernel's
//   staging copy may: staged_start_barrier).
// - The gather buffers.  Rank p's buffer is stored to, by p and its peers,
//   only by the next call's kernel A (or any collective using the scratch)
//   after that call's start barrier, which block b of p reaches only once
//   p's kernel B of this call has finished (stream order on p).  Kernel B
//   reads only p's own memory (the gather buffer, residual and weight), so
//   no peer's progress can change what it reads.
// - Visibility.  Peers' stores precede their `mid` release (each thread
//   fences them at system scope); p's acquire at `mid` and the kernel
//   boundary order them before kernel B's loads, which may go through the
//   caches: the buffer is this rank's own, uncached on AMD, and a new
//   kernel starts with clean per-multiprocessor caches.
template <typename T, int P, int W>
PYAR_DEVICE void split_reduce(const InputTable *in, uint64_t in_offset, const Pack16 *stage_from,
                              uint64_t tokens, uint32_t hidden, const CommState *state,
                              const CallInfo &info) {
  const CommState &s = *state;
  const RankTable<W> src = RankTable<W>::template fill<0>(in->ptr, in_offset);
  const RankTable<W> gather = RankTable<W>::template fill<1>(s.partial, 0);
  const uint32_t epoch = BlockEpoch::begin(s, info);
  if (staged_start_barrier<W, kIdleEnd>(
          s, epoch, info, in, in_offset, stage_from,
          StageRows<P, kStageInFlight>{tokens, hidden >> kLaneShift<T>})) {
    reduce_scatter_rows<T, P, W>(src, gather, tokens, hidden >> kLaneShift<T>, s);
    fence_system();  // as in two_stage: the stores to peers precede `mid`
    mid_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit();
}

// `failed`: for split's kernel B, this rank's Signal::some_block_failed,
// which kernel A, queued before it on the same stream, set if one of its
// blocks failed (the rows' sums are then stale, and nothing is written);
// null for the single-GPU step.  Its load is in flight with the first row's.
template <typename T, int P, int Q>
PYAR_DEVICE void add_rmsnorm(const Pack16 *x, uint64_t tokens, const RowArgs &a,
                             const uint32_t *failed) {
  const bool after_failure = failed != nullptr && *failed != 0;
  const RowContext<T, P> ctx(a);
  ResidualRow<T, P> res;
  res.load(ctx.cols, a.residual, first_row(tokens));
  if (after_failure) return;
  norm_rows<T, P, Q>(ArrayRows<T, P, false>{x}, tokens, a, ctx, res);
}

// Quantization alone: y's rows, the next row's packs loaded before the
// current row is quantized.
template <typename T, int P, int Q>
PYAR_DEVICE void quantize(const Pack16 *y, uint64_t tokens, const RowArgs &a) {
  if (blockIdx.x >= tokens) return;
  const RowContext<T, P> ctx(a);
  const ArrayRows<T, P, false> rows{y};
  BlockReduce<P> reduce;
  uint64_t row = blockIdx.x;
  auto raw = rows.load(ctx.cols, row);
  for (;;) {
    const uint64_t next = row + gridDim.x;
    const bool more = next < tokens;
    const auto raw_ahead = rows.load(ctx.cols, more ? next : row);
    float v[P][Lanes<T>::kCount];
    rows.sum(raw, v);
    quantize_row<T, P, Q>(v, ctx.cols, row, a, ctx.groups, reduce);
    if (!more) break;
    row = next;
    raw = raw_ahead;
  }
}

}  // namespace pyar

// Facts the host reads with hipModuleGetGlobal: the largest hidden size, the
// most threads of a row block, the MX block size and the FNUZ flag of `quant`.
extern "C" __device__ const uint64_t pyar_rmsnorm_layout[4] = {
    pyar::kMaxHidden, pyar::kMaxRowThreads, pyar::kMxBlock, pyar::kFnuzFlag};

#define PYAR_ROW_ARGS                                                                        \
  pyar::RowArgs {                                                                           \
    residual, weight, residual_out, y, q, scales, hidden, eps, quant, group                 \
  }

#define PYAR_ROW_PARAMS                                                                      \
  const pyar::Pack16 *residual, const pyar::Pack16 *weight, pyar::Pack16 *residual_out,     \
      pyar::Pack16 *y, uint8_t *q, void *scales, uint32_t hidden, float eps, uint32_t quant, \
      uint32_t group

// Entry names: <kernel>_<dtype>_<quant kind>_p<packs per thread>[_w<world>].
#define PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, W)                                       \
  extern "C" __global__ void __launch_bounds__(pyar::kMaxRowThreads)                        \
      pyar_allreduce_rmsnorm_##algo##_##name##_##kind##_p##P##_w##W(                        \
          const pyar::InputTable *in, uint64_t in_offset, const pyar::Pack16 *stage_from,   \
          uint64_t tokens, PYAR_ROW_PARAMS, const pyar::CommState *state,                   \
          uint64_t timeout_ns, uint64_t signature, uint32_t call) {                         \
    pyar::algo<T, P, Q, W>(in, in_offset, stage_from, tokens, PYAR_ROW_ARGS, state,         \
                           pyar::CallInfo{timeout_ns, signature, call});                    \
  }

#define PYAR_FUSED_WORLDS(algo, name, T, kind, Q, P) \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 2)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 3)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 4)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 5)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 6)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 7)     \
  PYAR_FUSED_ENTRY(algo, name, T, kind, Q, P, 8)

// Kernel A of split: no row arguments, no quantization kind (kernel B,
// pyar_add_rmsnorm_*, has them).  With the one-argument bound ptxas (nvcc
// 13, sm_90) gives its 16-bit, two-packs-a-thread entries of 3 to 5 ranks 32
// registers and spills; a minimum of one resident block lets it use up to
// 64 (measured: 32 to 62 over all 49 entries, no spills).  The host build
// takes no bounds.
#if defined(PYAR_HOST_BUILD)
#define PYAR_SPLIT_BOUNDS
#else
#define PYAR_SPLIT_BOUNDS __launch_bounds__(pyar::kMaxRowThreads, 1)
#endif
#define PYAR_SPLIT_ENTRY(name, T, P, W)                                                      \
  extern "C" __global__ void PYAR_SPLIT_BOUNDS                                              \
      pyar_allreduce_rmsnorm_split_##name##_p##P##_w##W(                                    \
          const pyar::InputTable *in, uint64_t in_offset, const pyar::Pack16 *stage_from,   \
          uint64_t tokens, uint32_t hidden, const pyar::CommState *state,                   \
          uint64_t timeout_ns, uint64_t signature, uint32_t call) {                         \
    pyar::split_reduce<T, P, W>(in, in_offset, stage_from, tokens, hidden, state,           \
                                pyar::CallInfo{timeout_ns, signature, call});               \
  }

// M(arguments.., W) for every supported world size.
#define PYAR_EACH_WORLD(M, ...)                                                   \
  M(__VA_ARGS__, 2) M(__VA_ARGS__, 3) M(__VA_ARGS__, 4) M(__VA_ARGS__, 5) M(__VA_ARGS__, 6) \
  M(__VA_ARGS__, 7) M(__VA_ARGS__, 8)

#define PYAR_LOCAL_ENTRIES(name, T, kind, Q, P)                                              \
  extern "C" __global__ void __launch_bounds__(pyar::kMaxRowThreads)                        \
      pyar_add_rmsnorm_##name##_##kind##_p##P(const pyar::Pack16 *x, uint64_t tokens,       \
                                              PYAR_ROW_PARAMS, const uint32_t *failed) {    \
    pyar::add_rmsnorm<T, P, Q>(x, tokens, PYAR_ROW_ARGS, failed);                           \
  }

#define PYAR_QUANTIZE_ENTRY(name, T, kind, Q, P)                                             \
  extern "C" __global__ void __launch_bounds__(pyar::kMaxRowThreads)                        \
      pyar_quantize_##name##_##kind##_p##P(const pyar::Pack16 *y, uint64_t tokens,          \
                                           uint32_t hidden, uint8_t *q, void *scales,       \
                                           uint32_t quant, uint32_t group) {                \
    pyar::quantize<T, P, Q>(y, tokens,                                                      \
                            pyar::RowArgs{nullptr, nullptr, nullptr, nullptr, q, scales,    \
                                          hidden, 0.f, quant, group});                      \
  }

#define PYAR_LAMPORT_ENTRY(name, T, kind, Q, W)                                              \
  extern "C" __global__ void __launch_bounds__(pyar::kMaxRowThreads)                        \
      pyar_allreduce_rmsnorm_lamport_##name##_##kind##_p1_w##W(                             \
          const pyar::Pack16 *x, uint64_t tokens, PYAR_ROW_PARAMS,                          \
          const pyar::CommState *state, void *region, uint64_t region_offset,               \
          uint64_t segment, uint64_t timeout_ns, uint64_t signature, uint32_t call) {       \
    pyar::lamport<T, 1, Q, W>(x, tokens, PYAR_ROW_ARGS, state, region, region_offset,       \
                              segment, pyar::CallInfo{timeout_ns, signature, call});        \
  }

// lamport at one pack per thread only (rows up to kMaxRowThreads packs): with
// more, the polled packs of every source take registers past the 64 of a
// kMaxRowThreads block, and the kernels spill.
#define PYAR_LAMPORT_P1(name, T, kind, Q) PYAR_EACH_WORLD(PYAR_LAMPORT_ENTRY, name, T, kind, Q)
#define PYAR_LAMPORT_P2(name, T, kind, Q)
#define PYAR_LAMPORT_P4(name, T, kind, Q)

#define PYAR_ROW_KERNELS(name, T, kind, Q, P)       \
  PYAR_FUSED_WORLDS(one_stage, name, T, kind, Q, P) \
  PYAR_FUSED_WORLDS(two_stage, name, T, kind, Q, P) \
  PYAR_LAMPORT_P##P(name, T, kind, Q)               \
  PYAR_LOCAL_ENTRIES(name, T, kind, Q, P)

#define PYAR_ROW_KINDS(name, T, P)                         \
  PYAR_ROW_KERNELS(name, T, plain, pyar::kNoQuant, P)      \
  PYAR_ROW_KERNELS(name, T, fp8, pyar::kFp8, P)            \
  PYAR_ROW_KERNELS(name, T, mxfp4, pyar::kMxfp4, P)        \
  PYAR_QUANTIZE_ENTRY(name, T, fp8, pyar::kFp8, P)         \
  PYAR_QUANTIZE_ENTRY(name, T, mxfp4, pyar::kMxfp4, P)    \
  PYAR_EACH_WORLD(PYAR_SPLIT_ENTRY, name, T, P)

// Packs per thread: the host picks the fewest that keep a row within
// kMaxRowThreads threads, so 16-bit rows up to kMaxHidden need 1 or 2 and
// float32 rows 1, 2 or 4.
PYAR_ROW_KINDS(f32, float, 1)
PYAR_ROW_KINDS(f32, float, 2)
PYAR_ROW_KINDS(f32, float, 4)
PYAR_ROW_KINDS(f16, __half, 1)
PYAR_ROW_KINDS(f16, __half, 2)
PYAR_ROW_KINDS(bf16, pyar::bf16_bits, 1)
PYAR_ROW_KINDS(bf16, pyar::bf16_bits, 2)
