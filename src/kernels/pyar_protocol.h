// The cross-process protocol every pyar collective follows: the signal
// area, the per-block epochs and the barriers.  allreduce.cu and
// allreduce_rmsnorm.cu build their kernels on it.
//
// Every rank owns one IPC-exported allocation holding a Signal area and two
// scratch regions (staged input, reduced shards of the two-shot kernels), and a local
// CommState describing every rank's allocation as mapped in its own process.
// Each call launches the same grid on every rank; block b of each rank meets
// block b of every peer at the barriers below.
//
// Barriers (DESIGN.md, "The synchronization rules"):
//   start  all ranks entered the call, so their inputs are complete;
//   mid    (two-shot, two-stage) every rank's reduced shard is written;
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
#pragma once

#include "pyar_device.h"

namespace pyar {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 256;
#ifndef PYAR_THREADS  // the host build (pyar_device_host.h) runs fewer
#define PYAR_THREADS 512
#endif
constexpr int kThreads = PYAR_THREADS;
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
#if defined(PYAR_TEST_REACHED_UNSIGNED)  // the epoch-wrap tests' positive control
  if (PYAR_TEST_REACHED_UNSIGNED) return value >= epoch;
#endif
  return int32_t(value - epoch) >= 0;
}

// Positive controls: a test-only build defines PYAR_TEST_SKIP_PHASE as kStart,
// kMid or kEnd to leave that barrier out of every kernel it compiles (the
// host build's mutation table, tests/test_protocol_host.py, and the GPU
// controls); PYAR_TEST_SKIP_EXIT_BARRIER is the older name of kEnd.
#if defined(PYAR_TEST_SKIP_EXIT_BARRIER) && !defined(PYAR_TEST_SKIP_PHASE)
#define PYAR_TEST_SKIP_PHASE kEnd
#endif

template <int W>
PYAR_DEVICE bool barrier(const CommState &s, Phase phase, uint32_t epoch, const CallInfo &info) {
#if defined(PYAR_TEST_SKIP_PHASE)
  if (phase == PYAR_TEST_SKIP_PHASE) return true;
#endif
  sync_block_before_release();  // the block's earlier reads and writes precede the release
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
  barrier<W>(s, kEnd, epoch, info);
}

}  // namespace pyar
