// pyar's all-reduce kernels: one-shot and two-shot, on the protocol of
// pyar_protocol.h (barriers, epochs, why each barrier exists), and the
// barrier-free LL one-shot of pyar_ll.h.
#include <stddef.h>

#include "pyar_ll.h"
#include "pyar_protocol.h"
#include "pyar_staging.h"
#include "pyar_sums.h"

namespace pyar {

// The elements past the last whole pack (fewer than one pack): thread `lane`
// of block 0 sums element `first + lane` from every rank.
template <typename T, int W>
PYAR_DEVICE bool reduce_tail(const Pack16 *const (&src)[W], uint64_t first, uint64_t n, T *result) {
  const uint64_t i = first + threadIdx.x;
  if (blockIdx.x != 0 || i >= n) return false;
  *result = Element<T>::from_float(sum_element<T, W>(src, i));
  return true;
}

// The staged tail (elements past the whole packs): block 0 reads it from
// every rank (reduce_tail), so block 0 copies it, element by element.
template <typename T>
PYAR_DEVICE void stage_tail(uint32_t block, const Pack16 *from, Pack16 *to, uint64_t first,
                            uint64_t n) {
  const uint64_t i = first + threadIdx.x;
  if (block == 0 && i < n) reinterpret_cast<T *>(to)[i] = reinterpret_cast<const T *>(from)[i];
}

// One-shot: every rank reads every peer's whole input.  Latency-bound sizes.
// The host never selects it when `out` is a registered input (peers still
// read that input while this rank would overwrite it).
//
// Staged: block b of every rank reads packs b * B + t + j * G * B (thread t,
// j = 0, 1, ..; G blocks of B threads) of every rank's scratch, the same
// packs on every rank, and block 0 the tail; so block b copies those packs
// (and block 0 the tail) of this rank's input: thread t exactly the packs it
// reads itself, and in place (out is x) it overwrites them only after.
template <typename T, int W>
PYAR_DEVICE void one_shot(const InputTable *in, uint64_t in_offset, const Pack16 *stage_from,
                          Pack16 *out, const CommState *state, uint64_t n,
                          const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s, info);
  const uint64_t packs = n / Lanes<T>::kCount;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const auto copy = [&](uint32_t block, const Pack16 *from, Pack16 *to) {
    for (uint64_t i = block * uint64_t(blockDim.x) + threadIdx.x; i < packs;
         i += kStageInFlight * stride) {
      // Straight-line code, so the packs stay in registers: past the end,
      // pack i again (its own value stored again).
      uint64_t at[kStageInFlight];
#pragma unroll
      for (int u = 0; u < kStageInFlight; ++u) at[u] = i + u * stride < packs ? i + u * stride : i;
      copy_packs(from, to, at);
    }
    stage_tail<T>(block, from, to, packs * Lanes<T>::kCount, n);
  };
  if (staged_start_barrier<W, kIdleMid>(s, epoch, info, in, in_offset, stage_from, copy)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < packs; i += stride)
      store_pack(out + i, load_and_reduce<T, W>(src, i));
    T tail;
    if (reduce_tail<T, W>(src, packs * Lanes<T>::kCount, n, &tail))
      reinterpret_cast<T *>(out)[packs * Lanes<T>::kCount + threadIdx.x] = tail;
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit();
}

// Two-shot: rank r reduces shard r into its partial scratch (reduce-scatter),
// then every rank copies every shard (all-gather).  Bandwidth-bound sizes.
// Peers read this rank's input only before `mid`, and `out` is written only
// after it, so `out` may be the rank's own registered input.  The shard of a
// pack index is the same on every rank and block b touches the same indices in
// both phases, so the per-block `mid` barrier orders each write before its
// reads.
//
// Staged: rank r's block b reads packs r * shard + k, k = b * B + t + j * G * B
// < shard (thread t, j = 0, 1, ..), of every rank's scratch, and block 0 the
// tail.  Over all ranks r that is p * shard + k for every p, so block b of
// every rank copies packs p * shard + k of its input for every p and its k
// (up to kStageInFlight at a time), and block 0 the tail; no other block's
// readers need them.  In place (out is x), block b overwrites exactly these
// packs, after `mid`.
template <typename T, int W>
PYAR_DEVICE void two_shot(const InputTable *in, uint64_t in_offset, const Pack16 *stage_from,
                          Pack16 *out, const CommState *state, uint64_t n,
                          const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s, info);
  const uint64_t packs = n / Lanes<T>::kCount;
  const uint64_t shard = (packs + W - 1) / W;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  constexpr int kGroup = W < kStageInFlight ? W : kStageInFlight;
  const auto copy = [&](uint32_t block, const Pack16 *from, Pack16 *to) {
    for (uint64_t k = block * uint64_t(blockDim.x) + threadIdx.x; k < shard; k += stride) {
#pragma unroll
      for (int first = 0; first < W; first += kGroup) {
        // Straight-line, as in one_shot: past the end (or past rank W - 1),
        // pack k again (k < shard <= packs, the pack of p = 0).
        uint64_t at[kGroup];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const uint64_t j = (first + u) * shard + k;
          at[u] = first + u < W && j < packs ? j : k;
        }
        copy_packs(from, to, at);
      }
    }
    stage_tail<T>(block, from, to, packs * Lanes<T>::kCount, n);
  };
  if (staged_start_barrier<W, kNoIdlePhase>(s, epoch, info, in, in_offset, stage_from, copy)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    const uint64_t first = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;

    Pack16 *partial = s.partial[s.rank];
    const uint64_t mine = s.rank * shard;
    for (uint64_t k = first; k < shard && mine + k < packs; k += stride)
      store_pack(partial + mine + k, load_and_reduce<T, W>(src, mine + k));
    T tail;
    const bool has_tail = reduce_tail<T, W>(src, packs * Lanes<T>::kCount, n, &tail);

    if (barrier<W>(s, kMid, epoch, info)) {
#pragma unroll
      for (int p = 0; p < W; ++p) {
        const Pack16 *theirs = s.partial[p];
        const uint64_t base = p * shard;
        for (uint64_t k = first; k < shard && base + k < packs; k += stride)
          store_pack(out + base + k, load_peer(theirs + base + k));
      }
      if (has_tail) reinterpret_cast<T *>(out)[packs * Lanes<T>::kCount + threadIdx.x] = tail;
      // Not needed for the input (peers finished reading it before `mid`) nor
      // for `partial` (rewritten only after the next call's start barrier);
      // kept so that every kernel obeys rule 1 without a special case.
      exit_barrier<W>(s, epoch, info);
    }
  }
  BlockEpoch::commit();
}

}  // namespace pyar

// Layout facts the host reads with hipModuleGetGlobal instead of repeating them.
extern "C" __device__ const uint64_t pyar_allreduce_layout[6] = {
    sizeof(pyar::Signal), pyar::kMaxBlocks, pyar::kMaxRanks, sizeof(pyar::CommState),
    pyar::kThreads, offsetof(pyar::Signal, some_block_failed)};

// ptxas schedules the W peer loads of a pack by its register budget.  Under
// the one-argument bound (up to 128 registers) nvcc 13 kept the kernels small
// (32-58 registers on sm_90) and reused the registers of loads still in
// flight: at 8 ranks the loads of one-shot f32 went out in 5 round trips one
// after another, of two-shot in 4-6 (tests/machine_code.py, peer_load_waves).
// A 9cf71ec build with 3 round trips there was 0.07-0.23 us faster a 1 KiB
// call on the H200 (its start barrier differs too).  A minimum of two
// resident blocks caps the kernels at 64 registers and ptxas then uses
// them: every one-shot kernel issues its loads in one round trip, two-shot
// in at most two.  The 2- and 3-rank kernels drop from 3-4 resident blocks
// to 2, which leaves Communicator._block_cap's caps as they were (one
// block a multiprocessor over the ranks sharing a GPU binds first, and a
// rank alone takes at most one a multiprocessor).  HIP reads a second
// argument as waves per execution unit; the host build takes no bounds.
#if defined(PYAR_HOST_BUILD) || PYAR_AMD
#define PYAR_ALLREDUCE_BOUNDS __launch_bounds__(pyar::kThreads)
#else
#define PYAR_ALLREDUCE_BOUNDS __launch_bounds__(pyar::kThreads, 2)
#endif
#define PYAR_ALLREDUCE_ENTRY(algo, name, T, W)                                              \
  extern "C" __global__ void PYAR_ALLREDUCE_BOUNDS                                          \
      pyar_allreduce_##algo##_##name##_w##W(                                                \
          const pyar::InputTable *in, uint64_t in_offset, const pyar::Pack16 *stage_from,   \
          pyar::Pack16 *out, const pyar::CommState *state, uint64_t n, uint64_t timeout_ns, \
          uint64_t signature, uint32_t call) {                                              \
    pyar::algo<T, W>(in, in_offset, stage_from, out, state, n,                              \
                     pyar::CallInfo{timeout_ns, signature, call});                          \
  }

#define PYAR_ALLREDUCE_WORLDS(algo, name, T) \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 2)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 3)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 4)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 5)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 6)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 7)     \
  PYAR_ALLREDUCE_ENTRY(algo, name, T, 8)

#define PYAR_ALLREDUCE_TYPES(algo)                     \
  PYAR_ALLREDUCE_WORLDS(algo, f32, float)              \
  PYAR_ALLREDUCE_WORLDS(algo, f16, __half)             \
  PYAR_ALLREDUCE_WORLDS(algo, bf16, pyar::bf16_bits)

PYAR_ALLREDUCE_TYPES(one_shot)
PYAR_ALLREDUCE_TYPES(two_shot)

// The LL push one-shot and two-shot (pyar_ll.h: ll, ll_twoshot): this rank's
// input and output, the state, this rank's LL receive region, where a rank's
// region starts past its two-shot scratch, packets per source segment, n,
// timeout, signature, call.
#define PYAR_LL_ENTRY(kind, fn, name, T, W)                                                \
  extern "C" __global__ void PYAR_ALLREDUCE_BOUNDS pyar_allreduce_##kind##_##name##_w##W(   \
      const void *x, void *out, const pyar::CommState *state, void *region,                 \
      uint64_t region_offset, uint64_t capacity, uint64_t n, uint64_t timeout_ns,           \
      uint64_t signature, uint32_t call) {                                                  \
    pyar::fn<T, W>(x, out, state, region, region_offset, capacity, n,                       \
                   pyar::CallInfo{timeout_ns, signature, call});                            \
  }

#define PYAR_LL_WORLDS(kind, fn, name, T) \
  PYAR_LL_ENTRY(kind, fn, name, T, 2)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 3)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 4)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 5)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 6)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 7)     \
  PYAR_LL_ENTRY(kind, fn, name, T, 8)

#define PYAR_LL_TYPES(kind, fn)                \
  PYAR_LL_WORLDS(kind, fn, f32, float)         \
  PYAR_LL_WORLDS(kind, fn, f16, __half)        \
  PYAR_LL_WORLDS(kind, fn, bf16, pyar::bf16_bits)

PYAR_LL_TYPES(ll, ll)
PYAR_LL_TYPES(ll_two_shot, ll_twoshot)
