// pyar's all-reduce kernels: one-shot and two-shot, on the protocol of
// pyar_protocol.h (barriers, epochs, why each barrier exists).
#include <stddef.h>

#include "pyar_protocol.h"

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

// One-shot: every rank reads every peer's whole input.  Latency-bound sizes.
// The host never selects it when `out` is a registered input (peers still
// read that input while this rank would overwrite it).
template <typename T, int W>
PYAR_DEVICE void one_shot(const InputTable *in, uint64_t in_offset, Pack16 *out,
                          const CommState *state, uint64_t n, const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s);
  if (start_barrier<W, kIdleMid>(s, epoch, info)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    const uint64_t packs = n / Lanes<T>::kCount;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < packs; i += stride)
      store_pack(out + i, load_and_reduce<T, W>(src, i));
    T tail;
    if (reduce_tail<T, W>(src, packs * Lanes<T>::kCount, n, &tail))
      reinterpret_cast<T *>(out)[packs * Lanes<T>::kCount + threadIdx.x] = tail;
    exit_barrier<W>(s, epoch, info);
  }
  BlockEpoch::commit(s, epoch);
}

// Two-shot: rank r reduces shard r into its partial scratch (reduce-scatter),
// then every rank copies every shard (all-gather).  Bandwidth-bound sizes.
// Peers read this rank's input only before `mid`, and `out` is written only
// after it, so `out` may be the rank's own registered input.  The shard of a
// pack index is the same on every rank and block b touches the same indices in
// both phases, so the per-block `mid` barrier orders each write before its
// reads.
template <typename T, int W>
PYAR_DEVICE void two_shot(const InputTable *in, uint64_t in_offset, Pack16 *out,
                          const CommState *state, uint64_t n, const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s);
  if (start_barrier<W, kNoIdlePhase>(s, epoch, info)) {
    const Pack16 *src[W];
#pragma unroll
    for (int r = 0; r < W; ++r) src[r] = in->ptr[r] + in_offset;
    const uint64_t packs = n / Lanes<T>::kCount;
    const uint64_t shard = (packs + W - 1) / W;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
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
  BlockEpoch::commit(s, epoch);
}

}  // namespace pyar

// Layout facts the host reads with hipModuleGetGlobal instead of repeating them.
extern "C" __device__ const uint64_t pyar_allreduce_layout[6] = {
    sizeof(pyar::Signal), pyar::kMaxBlocks, pyar::kMaxRanks, sizeof(pyar::CommState),
    pyar::kThreads, offsetof(pyar::Signal, some_block_failed)};

#define PYAR_ALLREDUCE_ENTRY(algo, name, T, W)                                              \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads)                              \
      pyar_allreduce_##algo##_##name##_w##W(                                                \
          const pyar::InputTable *in, uint64_t in_offset, pyar::Pack16 *out,                \
          const pyar::CommState *state, uint64_t n, uint64_t timeout_ns, uint64_t signature, \
          uint32_t call) {                                                                  \
    pyar::algo<T, W>(in, in_offset, out, state, n,                                          \
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
