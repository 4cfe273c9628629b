// Portability layer for pyar's kernels: the few device operations whose
// spelling differs between HIP on AMD and CUDA on NVIDIA.  Everything else in
// the kernels is plain single-source C++.
#pragma once

#if defined(PYAR_HOST_BUILD)  // the kernels as CPU code, for ThreadSanitizer
#include "host/pyar_device_host.h"
#else

#include <stdint.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#define PYAR_AMD 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#else
#define PYAR_AMD 0
#include <cuda_fp16.h>
#endif

#define PYAR_DEVICE __device__ __forceinline__

namespace pyar {

// --- System-scope flags ------------------------------------------------------
// A release store makes every write (and read) this thread ordered before it
// visible to a peer process that observes the value with an acquire load.
// Flags are 64-bit words (pyar_protocol.h: the epoch, and at the start
// barrier the call's digest beside it), naturally aligned, so a flag is one
// single-copy-atomic access on both platforms: one acquire load brings both
// halves as the peer stored them.

PYAR_DEVICE void store_release_system(uint64_t *flag, uint64_t value) {
#if PYAR_AMD
  // On gfx9 the system-scope release is `buffer_wbl2` (write the L2 back to
  // memory) and a wait for it; LLVM before early 2026 (llvm-project PR
  // 178316) can drop that wait, and a peer then sees the flag before the data.
  // So: the fence, an explicit wait, then a relaxed store.  CI reads the
  // machine code of every shipped kernel for it (tests/test_machine_code.py);
  // PYAR_TEST_NO_RELEASE_WAIT builds its negative fixture, the release store
  // as it was (clang-19 emits it without the wait).
#ifdef PYAR_TEST_NO_RELEASE_WAIT
  __hip_atomic_store(flag, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "");
#ifdef __GFX9__
  asm volatile("s_waitcnt vmcnt(0)" ::: "memory");
#endif
  __hip_atomic_store(flag, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
#else
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
#endif
}

PYAR_DEVICE uint64_t load_acquire_system(const uint64_t *flag) {
#if PYAR_AMD
  return __hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
#endif
}

// The block-wide synchronization before one thread releases what the whole
// block wrote.  On AMD gfx90a/gfx94x the workgroup barrier does not wait for
// a wave's outstanding stores (the barrier backs off, and a workgroup-scope
// release emits no vmcnt wait), and a release in one wave cannot wait for
// another wave's stores: the releasing wave's L2 write-back could miss data
// still on its way to the L2 (the transitivity gap LLVM closed for gfx10+
// CU mode in llvm-project PR 160501).  So each wave waits for its own first.
PYAR_DEVICE void sync_block_before_release() {
#if PYAR_AMD
  asm volatile("s_waitcnt vmcnt(0)" ::: "memory");
#endif
  __syncthreads();
}

// Orders this thread's earlier stores, to any GPU's memory, before its later
// ones for every observer in the system.  A barrier's release store orders
// only what its own thread did (and on AMD waits only for its own wave's
// stores), so threads that stored into a peer's memory fence before it.
PYAR_DEVICE void fence_system() { __threadfence_system(); }

// Host-visible error words: written once, read by the host after the kernel.
PYAR_DEVICE void store_volatile(uint32_t *word, uint32_t value) {
  *reinterpret_cast<volatile uint32_t *>(word) = value;
}

// A flag slot of a phase the kernel never waits at (pyar_protocol.h,
// keep_idle_slots_current): relaxed, one aligned 64-bit access.
PYAR_DEVICE void store_volatile(uint64_t *word, uint64_t value) {
  *reinterpret_cast<volatile uint64_t *>(word) = value;
}

// The error words, and on the slow path of a failed call a peer's signature.
template <typename Word>
PYAR_DEVICE Word load_volatile(const Word *word) {
#if PYAR_AMD
  // An acquire, like every system-coherent load on AMD: the machine-code
  // check can then hold each of them to the acquire sequence (only slow
  // paths read these words).
  return __hip_atomic_load(word, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return *reinterpret_cast<const volatile Word *>(word);
#endif
}

// --- LL packets (pyar_ll.h) ---------------------------------------------------
// An 8-byte packet, 4 bytes of data and a 4-byte flag, naturally aligned, is
// stored by one 64-bit store and read by one 64-bit load, both strong at
// system scope, so a reader that sees the flag sees the data stored with it.
// Relaxed: a packet orders nothing but itself.
//   NVIDIA  st/ld.relaxed.sys.global.b64: one scalar 64-bit strong access,
//           single-copy atomic in the PTX memory model.  Not volatile
//           .v2.u32: PTX treats a vector access as one access per element,
//           so a reader could see the flag without its data.
//   AMD     a relaxed system-scope 64-bit atomic: one naturally aligned
//           dwordx2 access, which the ISA performs as one 64-bit access,
//           with the system scope's cache bits (gfx942: sc0 sc1 on both;
//           gfx90a: glc on the load, none on the store); the receive
//           region is in the uncached IPC allocation, so the poll reads
//           memory, not a stale line.  (tests/machine_code.py checks both.)
PYAR_DEVICE void store_packet(uint64_t *slot, uint64_t packet) {
#if PYAR_AMD
  __hip_atomic_store(slot, packet, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(slot), "l"(packet) : "memory");
#endif
}

PYAR_DEVICE uint64_t load_packet(const uint64_t *slot) {
#if PYAR_AMD
  return __hip_atomic_load(slot, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint64_t packet;
  asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(packet) : "l"(slot) : "memory");
  return packet;
#endif
}

// --- Time, for bounded spins -------------------------------------------------

// Nanoseconds from a clock that runs at a fixed rate whatever the SM clock.
PYAR_DEVICE uint64_t now_ns() {
#if PYAR_AMD
  // s_memrealtime counts at a constant 100 MHz on gfx90a/gfx94x/gfx950.
  return static_cast<uint64_t>(wall_clock64()) * 10u;
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// --- 16-byte accesses --------------------------------------------------------

struct alignas(16) Pack16 {
  uint32_t w[4];
};

// Loads data a peer wrote (possibly during this kernel, before a barrier):
// bypass the non-coherent per-multiprocessor cache.
PYAR_DEVICE Pack16 load_peer(const Pack16 *p) {
  Pack16 v;
#if PYAR_AMD
  const uint32_t *q = reinterpret_cast<const uint32_t *>(p);
  v.w[0] = __builtin_nontemporal_load(q + 0);
  v.w[1] = __builtin_nontemporal_load(q + 1);
  v.w[2] = __builtin_nontemporal_load(q + 2);
  v.w[3] = __builtin_nontemporal_load(q + 3);
#else
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
#endif
  return v;
}

PYAR_DEVICE void store_pack(Pack16 *p, const Pack16 &v) { *p = v; }

// A store into a lamport receive slot (pyar_lamport.h): a source's push into
// a peer's slot, or the owner's emptying of what it took.  A 16-byte store
// whose 32-bit words are each single-copy atomic -- all the reader needs, as
// it checks every word for kEmptyWord on its own.
PYAR_DEVICE void push_pack(Pack16 *p, const Pack16 &v) { store_pack(p, v); }

// A fresh look at a pack peers push into: load_peer (past the
// per-multiprocessor cache; the region is uncached memory on AMD), issued
// anew at every call -- the compiler barrier keeps a spin from reusing an
// earlier load (AMD's nontemporal load is not volatile).
PYAR_DEVICE Pack16 poll_pack(const Pack16 *p) {
  asm volatile("" ::: "memory");
  return load_peer(p);
}

// --- Warp-level reductions ----------------------------------------------------

constexpr int kWarpSize = PYAR_AMD ? 64 : 32;

// Every lane of the warp must call it (the masks stay within one warp).
PYAR_DEVICE float shuffle_xor(float v, int mask) {
#if PYAR_AMD
  return __shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

// --- Element conversions (fp32 accumulation) ---------------------------------

struct bf16_bits {
  uint16_t bits;
};

template <typename T>
struct Element;

template <>
struct Element<float> {
  static PYAR_DEVICE float to_float(float x) { return x; }
  static PYAR_DEVICE float from_float(float x) { return x; }
};

template <>
struct Element<__half> {
  static PYAR_DEVICE float to_float(__half x) { return __half2float(x); }
  static PYAR_DEVICE __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Element<bf16_bits> {
  static PYAR_DEVICE float to_float(bf16_bits x) {
    return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
  }
  // Round to nearest even; NaN stays a quiet NaN.
  static PYAR_DEVICE bf16_bits from_float(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_bits{static_cast<uint16_t>((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16_bits{static_cast<uint16_t>(u >> 16)};
  }
};

}  // namespace pyar

#endif  // PYAR_HOST_BUILD
