// Staging: the start barrier of a kernel that copies its own input into its
// scratch first (staged_start_barrier), the copy it runs (copy_packs), and
// why the copy is exact and safe.  It is apart from the protocol
// (pyar_protocol.h), which it builds on, because only the staged kernels of
// allreduce.cu and allreduce_rmsnorm.cu copy; the barriers are everyone's.
#pragma once

#include "pyar_protocol.h"

namespace pyar {

// --- Staging ----------------------------------------------------------------
// A staged call's input is not mapped by the peers: each rank's kernel copies
// it into its own scratch (its entry of the staged input table), and the
// peers read it there after the start barrier.  One launch, no separate copy.
//
// Which packs a block copies.  The start barrier is per block: block b's
// release orders only block b's stores (sync_block_before_release: every
// thread's stores, each AMD wave waiting for its own, precede the release),
// and only block b of a peer acquires it.  So block b copies exactly the
// packs that block b of any rank reads from this rank's scratch, and a peer
// never reads a pack another block copied; each kernel works out that set
// (`copy` below) and states why it is exact.
//
// Why overwriting the scratch at the start of call k + 1 is safe.  The
// copy runs after this rank's kernel of call k has returned (stream order),
// so every block of this rank has passed call k's last barrier: its exit
// barrier, or for split's kernel A `mid`, after which no peer reads the
// input (the proof at split_reduce).  Block b passes it only once block b of
// every peer has arrived there, after its reads; and every rank runs the
// same grid, so every block that read this rank's scratch in call k has
// finished, whatever the grid or the block's packs in call k + 1.  (The
// shards kernels, staged by the host's copy, end with their exit barrier
// too.)  After any block of this rank failed a call, no block copies (nor
// stores a flag): a peer that the failed block gave up on at its exit
// barrier passed that barrier (the block had stored its flag) and may still
// be reading, and a later call on another grid would restage its packs from
// other blocks.
//
// Positive controls (tests/test_protocol_host.py): PYAR_TEST_STAGE_MUTATION
// as kStageAfterStart copies after the start barrier (peers may read first),
// as kStageOtherBlock copies the packs of the next block (read by peers that
// met only that block).  In the GPU's control of kStageAfterStart the last
// rank also waits PYAR_TEST_STAGE_DELAY_NS before its late copy
// (tests/gpu/conftest.py), while its peers copy and read at once: the last
// rank to arrive passes the barrier first, so without the wait its copy often
// lands before a peer has seen its start flag, and a delay on every rank
// would delay the peers' reads as much (each block reads after its own copy).
enum StageMutation { kStageExact = 0, kStageAfterStart = 1, kStageOtherBlock = 2 };

// Packs a thread copies per round trip when it stages: the copy runs on the
// collective's capped grid, so one pack at a time would take as long as the
// reduction's reads of W packs at a time; four (sum_ranks's) hold the
// registers within two 512-thread blocks per multiprocessor.
constexpr int kStageInFlight = 4;

// Copies packs at[0], .., at[N - 1] of `from` to the same places of `to`,
// every load in flight before the first store.  On AMD word by word: a
// 16-byte struct copy there makes clang 19 keep the packs in scratch memory
// (and it merges the words into 16-byte accesses itself); nvcc keeps words
// as 4-byte accesses, so NVIDIA copies whole packs.
template <int N>
PYAR_DEVICE void copy_packs(const Pack16 *from, Pack16 *to, const uint64_t (&at)[N]) {
#if PYAR_AMD
  uint32_t v[N][4];
#pragma unroll
  for (int u = 0; u < N; ++u)
#pragma unroll
    for (int j = 0; j < 4; ++j) v[u][j] = from[at[u]].w[j];
#pragma unroll
  for (int u = 0; u < N; ++u)
#pragma unroll
    for (int j = 0; j < 4; ++j) to[at[u]].w[j] = v[u][j];
#else
  Pack16 v[N];
#pragma unroll
  for (int u = 0; u < N; ++u) v[u] = from[at[u]];
#pragma unroll
  for (int u = 0; u < N; ++u) to[at[u]] = v[u];
#endif
}

// The start barrier of a kernel that stages its input: when `from` (this
// rank's input, 16-byte aligned) is not null, copy(block, from, to) first
// copies block `block`'s packs of it into `to`, this rank's scratch (null
// `from`: registered, or already staged by the host; peers read the table's
// buffers as they are).
template <int W, uint32_t kIdle, typename Copy>
PYAR_DEVICE bool staged_start_barrier(const CommState &s, uint32_t epoch, const CallInfo &info,
                                      const InputTable *in, uint64_t in_offset,
                                      const Pack16 *from, const Copy &copy) {
#if defined(PYAR_TEST_STAGE_MUTATION)
  const int mutation = PYAR_TEST_STAGE_MUTATION;
#else
  constexpr int mutation = kStageExact;
#endif
  const bool staging = from != nullptr && !block_failed();
  Pack16 *const to =
      staging ? const_cast<Pack16 *>(in->ptr[block_state().rank]) + in_offset : nullptr;
  const uint32_t block =
      mutation == kStageOtherBlock ? (blockIdx.x + 1) % gridDim.x : uint32_t(blockIdx.x);
  if (staging && mutation != kStageAfterStart) copy(block, from, to);
  const bool passed = start_barrier<W, kIdle>(s, epoch, info);
  if (staging && mutation == kStageAfterStart && passed) {
#if defined(PYAR_TEST_STAGE_DELAY_NS)
    if (block_state().rank == W - 1) busy_wait_ns(PYAR_TEST_STAGE_DELAY_NS);
#endif
    copy(block, from, to);
  }
  return passed;
}

}  // namespace pyar
