// Portability layer for pyar's kernels: the few device operations whose
// spelling differs between HIP on AMD and CUDA on NVIDIA.  Everything else in
// the kernels is plain single-source C++.
#pragma once

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

PYAR_DEVICE void store_release_system(uint32_t *flag, uint32_t value) {
#if PYAR_AMD
  __hip_atomic_store(flag, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
#endif
}

PYAR_DEVICE uint32_t load_acquire_system(const uint32_t *flag) {
#if PYAR_AMD
  return __hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
#endif
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

PYAR_DEVICE uint32_t load_volatile(const uint32_t *word) {
  return *reinterpret_cast<const volatile uint32_t *>(word);
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
