// The host flavour of pyar_device.h (selected by PYAR_HOST_BUILD): the same
// device operations for a build of the kernels as ordinary C++ on the CPU,
// where ranks and blocks are threads of one process (host_grid.h).  It
// exists so that the protocol of pyar_protocol.h can be checked without a
// GPU, under ThreadSanitizer (tests/test_protocol_host.py):
//   - flag stores and loads (64-bit words) are std::atomic_ref with the GPU's orders
//     (release / acquire), so TSan sees exactly the ordering the protocol
//     claims and nothing more;
//   - peers' buffers are ordinary memory of the process and data moves with
//     plain loads and stores, so an access a barrier does not order is a
//     race TSan reports;
//   - the error record is written and read with relaxed atomics (volatile on
//     the GPU: host-visible words, written once), and so are LL packets
//     (one relaxed 64-bit atomic each, as on the GPU) and the words of the
//     lamport kernels' pushed packs (one relaxed 32-bit atomic each);
//   - spins are bounded by a host clock, and let the block's other lanes run.
#pragma once

#include <stdint.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "host_grid.h"

#define PYAR_AMD 0
#define PYAR_DEVICE inline
#define __device__
#define __global__
#define __launch_bounds__(threads)
#define __shared__ static thread_local
#define threadIdx (::pyar::host::this_lane().index)
#define blockIdx (::pyar::host::this_block()->index)
#define blockDim (::pyar::host::this_block()->dim)
#define gridDim (::pyar::host::this_block()->grid)
#define __syncthreads() ((void)::pyar::host::sync_block(1))
#define __syncthreads_and(vote) (::pyar::host::sync_block(vote))
#define __syncthreads_or(vote) (!::pyar::host::sync_block(!(vote)))

// Few threads per block keep a TSan run short; the GPU build keeps its own.
#ifndef PYAR_THREADS
#define PYAR_THREADS 64
#endif

template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }

inline uint32_t __float_as_uint(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE, round to nearest
inline int __ffs(int x) { return __builtin_ffs(x); }

struct __half {
  _Float16 value;
};
inline float __half2float(__half x) { return float(x.value); }
inline __half __float2half_rn(float x) { return __half{_Float16(x)}; }  // round to nearest even

namespace pyar {

PYAR_DEVICE void store_release_system(uint64_t *flag, uint64_t value) {
  host::maybe_delay();
  std::atomic_ref<uint64_t>(*flag).store(value, std::memory_order_release);
}

// The block's accesses precede a barrier's release: on the host the
// fiber switch of __syncthreads orders them (the GPU adds a wait on AMD).
PYAR_DEVICE void sync_block_before_release() { __syncthreads(); }

// Stores into peers' memory (the two-stage pushes) precede the barrier's
// release: on the host every lane's stores precede, in the program order of
// the block's one OS thread, the fiber switch of sync_block_before_release,
// and the release store follows it.  So a missing fence_system is a matter
// of the GPU's memory model this build cannot see; it sees a missing barrier.
PYAR_DEVICE void fence_system() {}

PYAR_DEVICE uint64_t load_acquire_system(const uint64_t *flag) {
  host::yield_lane();  // only spins load flags: let the block's other lanes run
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t *>(flag)).load(std::memory_order_acquire);
}

PYAR_DEVICE void store_volatile(uint32_t *word, uint32_t value) {
  std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_relaxed);
}

PYAR_DEVICE void store_volatile(uint64_t *word, uint64_t value) {
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_relaxed);
}

template <typename Word>
PYAR_DEVICE Word load_volatile(const Word *word) {
  return std::atomic_ref<Word>(*const_cast<Word *>(word)).load(std::memory_order_relaxed);
}

// LL packets: relaxed 64-bit atomics, as on the GPU, so ThreadSanitizer
// sees a packet as one atomic access that orders nothing else.
PYAR_DEVICE void store_packet(uint64_t *slot, uint64_t packet) {
  host::maybe_delay();
  std::atomic_ref<uint64_t>(*slot).store(packet, std::memory_order_relaxed);
}

PYAR_DEVICE uint64_t load_packet(const uint64_t *slot) {
  host::yield_lane();  // polled in spins: let the block's other lanes run
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t *>(slot)).load(std::memory_order_relaxed);
}

PYAR_DEVICE uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

struct alignas(16) Pack16 {
  uint32_t w[4];
};

PYAR_DEVICE Pack16 load_peer(const Pack16 *p) {
  host::maybe_delay();
  return *p;
}

PYAR_DEVICE void store_pack(Pack16 *p, const Pack16 &v) { *p = v; }

// A store into a lamport receive slot (a push, or the owner's emptying) and a
// poll of one: each 32-bit word a relaxed atomic, as each word of the GPU's
// 16-byte store is single-copy atomic; the reader judges every word on its
// own (pyar_lamport.h written), so nothing orders the four.
PYAR_DEVICE void push_pack(Pack16 *p, const Pack16 &v) {
  host::maybe_delay();
  for (int j = 0; j < 4; ++j)
    std::atomic_ref<uint32_t>(p->w[j]).store(v.w[j], std::memory_order_relaxed);
}

PYAR_DEVICE Pack16 poll_pack(const Pack16 *p) {
  host::maybe_delay();
  Pack16 v;
  for (int j = 0; j < 4; ++j)
    v.w[j] = std::atomic_ref<uint32_t>(const_cast<uint32_t &>(p->w[j]))
                 .load(std::memory_order_relaxed);
  return v;
}

constexpr int kWarpSize = int(host::kHostWarpSize);

PYAR_DEVICE float shuffle_xor(float v, int mask) { return host::shuffle_xor(v, mask); }

struct bf16_bits {
  uint16_t bits;
};

template <typename T>
struct Element;

template <>
struct Element<float> {
  static float to_float(float x) { return x; }
  static float from_float(float x) { return x; }
};

template <>
struct Element<__half> {
  static float to_float(__half x) { return __half2float(x); }
  static __half from_float(float x) { return __float2half_rn(x); }
};

// bfloat16 as the upper half of a float32, rounded to nearest even; the host
// driver feeds it integers, which it represents exactly.
template <>
struct Element<bf16_bits> {
  static float to_float(bf16_bits x) { return __uint_as_float(uint32_t(x.bits) << 16); }
  static bf16_bits from_float(float x) {
    const uint32_t u = __float_as_uint(x);
    if (std::isnan(x)) return bf16_bits{uint16_t((u >> 16) | 0x40u)};
    const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return bf16_bits{uint16_t(rounded >> 16)};
  }
};

}  // namespace pyar
