// pyar's all-reduce kernels: the whole cross-process protocol in one file.
//
// Every rank owns one IPC-exported allocation holding a Signal area and two
// scratch regions (staged input, two-shot partial results), and a local
// CommState describing every rank's allocation as mapped in its own process.
// Each call launches the same grid on every rank; block b of each rank meets
// block b of every peer at the barriers below.
//
// Barriers (DESIGN.md, "The synchronization rules"):
//   start  all ranks entered the call, so their inputs are complete;
//   mid    (two-shot) every rank's reduced shard is written;
//   end    no peer still reads this rank's buffers: after it, the caller may
//          overwrite its input or the next call may restage the scratch.
// Leaving out `end` is the seed bug: a fast rank returns, reuses its input,
// and a slow peer still summing that input reads the new data.
//
// Flags are per block and per phase.  Each rank keeps a per-block epoch in
// its own Signal (in device memory, so replayed graphs keep counting); a
// barrier stores the epoch into every peer's slot for (block, this rank) with
// a system-scope release and spins with acquire loads until its own slots for
// (block, peer) have reached the epoch.  A peer can never be a whole phase
// ahead (it would have to pass a barrier this rank has not reached -- for the
// start flag of the next call, this call's exit barrier), so with the exit
// barrier a slot holds exactly this epoch; the wrap-safe "reached" comparison
// keeps a barrier from missing an epoch that was overwritten by a later one,
// so that a kernel built without the exit barrier (the positive control)
// shows the seeds' bug as wrong sums rather than as a lost flag and a
// timeout.  Spins are bounded: on expiry the block records which peers never
// arrived in host-visible memory and returns.
#include "pyar_device.h"

namespace pyar {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 256;
constexpr int kThreads = 512;
constexpr uint64_t kGiveUpCheckNs = 1000000;  // waits shorter than this never read host memory

enum Phase { kStart = 0, kMid = 1, kEnd = 2, kPhases = 3 };

struct Signal {
  uint32_t flags[kPhases][kMaxBlocks][kMaxRanks];
  uint32_t epoch[kMaxBlocks];
};

// The host writes this (pyar/comm/layout.py packs the same fields).
struct CommState {
  Signal *signals[kMaxRanks];  // every rank's Signal, as mapped here
  Pack16 *partial[kMaxRanks];  // every rank's two-shot scratch
  uint32_t *error;             // host memory: [0] timed out, [1 + r] rank r missing, [9] call
  uint32_t rank;
  uint32_t world;
};

struct InputTable {
  const Pack16 *ptr[kMaxRanks];  // every rank's input for this call
};

// What a call passes besides the data pointers.
struct CallInfo {
  uint64_t timeout_ns;
  uint32_t call;  // the host's sequence number, reported on timeout
};

// Whether a flag holding `value` has reached `epoch`, across the 32-bit wrap.
PYAR_DEVICE bool reached(uint32_t value, uint32_t epoch) {
  return int32_t(value - epoch) >= 0;
}

template <int W>
PYAR_DEVICE bool barrier(const CommState &s, Phase phase, uint32_t epoch, const CallInfo &info) {
  __syncthreads();  // the block's earlier reads and writes precede the release
  int arrived = 1;
  if (threadIdx.x < W) {
    const uint32_t peer = threadIdx.x;
    store_release_system(&s.signals[peer]->flags[phase][blockIdx.x][s.rank], epoch);
    const uint32_t *mine = &s.signals[s.rank]->flags[phase][blockIdx.x][peer];
    if (!reached(load_acquire_system(mine), epoch)) {
      const uint64_t since = now_ns();
      while (!reached(load_acquire_system(mine), epoch)) {
        const uint64_t waited = now_ns() - since;
        if (waited > info.timeout_ns) {
          store_volatile(&s.error[1 + peer], 1u);
          store_volatile(&s.error[1 + kMaxRanks], info.call);
          store_volatile(&s.error[0], 1u);
          arrived = 0;
          break;
        }
        // After a timeout the host refuses new calls, but calls already
        // queued behind it would each wait a whole timeout for peers that
        // gave up: they stop as soon as they see the error record.
        if (waited > kGiveUpCheckNs && load_volatile(&s.error[0])) {
          arrived = 0;
          break;
        }
      }
    }
  }
  return __syncthreads_and(arrived);  // and the acquire precedes the block's later accesses
}

template <typename T>
struct Lanes {
  static constexpr int kCount = 16 / sizeof(T);
};

// Sums one pack from every rank in rank order 0..W-1 in fp32, so every rank
// (and both algorithms) produce bitwise-identical results.
template <typename T, int W>
PYAR_DEVICE Pack16 reduce_pack(const Pack16 (&v)[W]) {
  constexpr int L = Lanes<T>::kCount;
  float acc[L];
  const T *first = reinterpret_cast<const T *>(&v[0]);
#pragma unroll
  for (int j = 0; j < L; ++j) acc[j] = Element<T>::to_float(first[j]);
#pragma unroll
  for (int r = 1; r < W; ++r) {
    const T *x = reinterpret_cast<const T *>(&v[r]);
#pragma unroll
    for (int j = 0; j < L; ++j) acc[j] += Element<T>::to_float(x[j]);
  }
  Pack16 out;
  T *o = reinterpret_cast<T *>(&out);
#pragma unroll
  for (int j = 0; j < L; ++j) o[j] = Element<T>::from_float(acc[j]);
  return out;
}

template <typename T, int W>
PYAR_DEVICE Pack16 load_and_reduce(const Pack16 *const (&src)[W], uint64_t i) {
  Pack16 v[W];
#pragma unroll
  for (int r = 0; r < W; ++r) v[r] = load_peer(src[r] + i);  // all loads in flight first
  return reduce_pack<T, W>(v);
}

// The elements past the last whole pack (fewer than one pack): thread `lane`
// of block 0 sums element `first + lane` from every rank.
template <typename T, int W>
PYAR_DEVICE bool reduce_tail(const Pack16 *const (&src)[W], uint64_t first, uint64_t n, T *result) {
  const uint64_t i = first + threadIdx.x;
  if (blockIdx.x != 0 || i >= n) return false;
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < W; ++r) {
    const T *x = reinterpret_cast<const T *>(src[r]);
    acc = r == 0 ? Element<T>::to_float(x[i]) : acc + Element<T>::to_float(x[i]);
  }
  *result = Element<T>::from_float(acc);
  return true;
}

struct BlockEpoch {
  uint32_t value;
  PYAR_DEVICE static uint32_t begin(const CommState &s) {
    __shared__ uint32_t epoch;
    if (threadIdx.x == 0) epoch = s.signals[s.rank]->epoch[blockIdx.x] + 1;
    __syncthreads();
    return epoch;
  }
  PYAR_DEVICE static void commit(const CommState &s, uint32_t epoch) {
    if (threadIdx.x == 0) s.signals[s.rank]->epoch[blockIdx.x] = epoch;
  }
};

template <int W>
PYAR_DEVICE void exit_barrier(const CommState &s, uint32_t epoch, const CallInfo &info) {
#ifndef PYAR_TEST_SKIP_EXIT_BARRIER
  barrier<W>(s, kEnd, epoch, info);
#endif
}

// One-shot: every rank reads every peer's whole input.  Latency-bound sizes.
// The host never selects it when `out` is a registered input (peers still
// read that input while this rank would overwrite it).
template <typename T, int W>
PYAR_DEVICE void one_shot(const InputTable *in, uint64_t in_offset, Pack16 *out,
                          const CommState *state, uint64_t n, const CallInfo &info) {
  const CommState &s = *state;
  const uint32_t epoch = BlockEpoch::begin(s);
  if (barrier<W>(s, kStart, epoch, info)) {
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
  if (barrier<W>(s, kStart, epoch, info)) {
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
extern "C" __device__ const uint64_t pyar_allreduce_layout[5] = {
    sizeof(pyar::Signal), pyar::kMaxBlocks, pyar::kMaxRanks, sizeof(pyar::CommState),
    pyar::kThreads};

#define PYAR_ALLREDUCE_ENTRY(algo, name, T, W)                                              \
  extern "C" __global__ void __launch_bounds__(pyar::kThreads)                              \
      pyar_allreduce_##algo##_##name##_w##W(                                                \
          const pyar::InputTable *in, uint64_t in_offset, pyar::Pack16 *out,                \
          const pyar::CommState *state, uint64_t n, uint64_t timeout_ns, uint32_t call) {   \
    pyar::algo<T, W>(in, in_offset, out, state, n, pyar::CallInfo{timeout_ns, call});       \
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
