// Small kernels the test suites and benchmarks launch through
// hipModuleLaunchKernel: argument passing, data movement, delays and the
// "consumer overwrites its input" step of the adversarial tests.
#include "pyar_device.h"
#include "pyar_quant.h"

extern "C" {

__global__ void pyar_test_empty() {}

// Writes back every argument so the host can check the packing of each type.
struct ArgRecord {
  uint64_t pointer;
  int64_t i64;
  uint64_t u64;
  int32_t i32;
  uint32_t u32;
  float f32;
  uint32_t pad;
};

__global__ void pyar_test_store_args(ArgRecord *out, const void *pointer, int32_t i32, int64_t i64,
                                     uint32_t u32, uint64_t u64, float f32) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out->pointer = reinterpret_cast<uint64_t>(pointer);
    out->i64 = i64;
    out->u64 = u64;
    out->i32 = i32;
    out->u32 = u32;
    out->f32 = f32;
    out->pad = 0xfeedbeefu;
  }
}

// y[i] = a * y[i] + x[i]
__global__ void pyar_test_axpy_f32(float *y, const float *x, float a, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x)
    y[i] = a * y[i] + x[i];
}

// Fills n 32-bit words with a bit pattern; 0xffffffff is NaN in fp32 and, per
// 16-bit half, in fp16 and bf16.
__global__ void pyar_test_fill_u32(uint32_t *out, uint32_t pattern, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x)
    out[i] = pattern;
}

// Occupies one block for about ns nanoseconds: delays everything queued
// after it on the stream.
__global__ void pyar_test_spin(uint64_t ns) {
  if (threadIdx.x == 0) {
    uint64_t start = pyar::now_ns();
    while (pyar::now_ns() - start < ns) {
    }
  }
}

// Counts the float32 values, NaNs aside, whose E4M3FN codes from
// encode_e4m3_pair (v and -v as a pair) differ from encode_e4m3's with the
// given `fnuz` (1: the comparison's positive control), and stores one of them.
__global__ void pyar_test_e4m3fn_pair_mismatches(uint32_t fnuz, unsigned long long *count,
                                                 uint32_t *example) {
  unsigned long long found = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(uint32_t(i));
    if (v != v) continue;
    const uint32_t software = pyar::encode_e4m3(v, fnuz) | pyar::encode_e4m3(-v, fnuz) << 8;
    if (pyar::encode_e4m3_pair(v, -v, false) != software) {
      ++found;
      *example = uint32_t(i);
    }
  }
  if (found) atomicAdd(count, found);
}

// One exchange of flags among `world` ranks: the least that any collective
// which waits for its peers pays on a call (pyar.bench's signal floor).
// Thread r < world stores this exchange's number into this rank's slot at
// rank r (`peers[r]`, a system-scope release) and waits, at most
// `timeout_ns`, until rank r's number reached rank r's slot here (`mine[r]`,
// acquire).  A peer may already be one exchange ahead (it stores before it
// waits), so a wait ends at any number not below this one's.  `*count`
// numbers this rank's exchanges (read by every thread, advanced after the
// block's waits); `*gave_up` counts the waits that timed out.
__global__ void pyar_test_flag_exchange(uint64_t *const *peers, const uint64_t *mine,
                                        uint64_t *count, uint32_t world, uint64_t timeout_ns,
                                        uint32_t *gave_up) {
  const uint64_t number = *count + 1;
  pyar::sync_block_before_release();
  if (threadIdx.x < world) {
    pyar::store_release_system(peers[threadIdx.x], number);
    const uint64_t start = pyar::now_ns();
    while (pyar::load_acquire_system(&mine[threadIdx.x]) < number) {
      if (pyar::now_ns() - start > timeout_ns) {
        atomicAdd(gave_up, 1u);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *count = number;
}

}  // extern "C"
