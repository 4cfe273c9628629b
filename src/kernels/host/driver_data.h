#pragma once
// What the ranks hold and compute: the input pattern every rank can
// recompute for its peers, the launch signature, element conversions, and
// the Memory, RowGeometry and Rank structs.  protocol_driver.cpp includes it
// after the kernel sources and its aliases.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

// An integer in [-8, 8] for (rank, call, element): every rank can compute
// every peer's input, so each checks its own result without reading theirs.
int pattern(uint64_t seed, uint32_t rank, uint64_t call, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t(rank) << 56) + (call << 36) + i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return int((z ^ (z >> 31)) % 17) - 8;
}

// layout.signature: what a launch is (element count, operation, dtype, input
// mode), as every rank's start barrier compares it.
uint64_t signature(const std::string &kernel, uint64_t count, const std::string &dtype,
                   bool registered, uint32_t variant) {
  static const std::map<std::string, uint64_t> operations = {
      {"oneshot", 1}, {"twoshot", 2}, {"onestage", 3}, {"twostage", 4}, {"split", 5},
      {"reducescatter", 6}, {"allgather", 7}, {"lamport", 8}, {"ll", 9}, {"ll_twoshot", 10}};
  const uint64_t dtype_code = dtype == "f32" ? 1 : dtype == "f16" ? 2 : 3;
  return count | operations.at(kernel) << 40 | dtype_code << 48 | uint64_t(registered) << 52 |
         uint64_t(variant) << 53;
}

template <typename T>
T element(float v) { return pyar::Element<T>::from_float(v); }
template <typename T>
float value(T e) { return pyar::Element<T>::to_float(e); }

// 16-byte aligned, zeroed memory of `bytes` (rounded up to whole packs).
struct Memory {
  std::vector<Pack16> packs;
  explicit Memory(uint64_t bytes = 0) : packs((bytes + 15) / 16, Pack16{}) {}
  template <typename T>
  T *as() { return reinterpret_cast<T *>(packs.data()); }
  Pack16 *data() { return packs.data(); }
};

// A row kernel's launch (rmsnorm.RowLaunch).
struct RowGeometry {
  uint32_t per_thread = 0, threads = 0, blocks = 0;
};

struct Rank {
  uint32_t rank = 0;
  // Signal area | staging scratch | partial region (two-shot, two-stage gather) |
  // LL receive region | lamport receive region (runs of lamport only)
  Memory buffer;
  CommState state{};
  InputTable staged{}, registered{};
  uint32_t error[pyar::kErrorWords] = {};
  Memory x, out, residual, y, weight;
  uint32_t call = 0;  // the host's sequence number (Communicator._next_call)
  uint64_t mismatches = 0, timeouts = 0, chunks = 0;
  uint64_t disagreements = 0;  // calls whose error record says the ranks disagreed
  uint64_t bad_records = 0;    // ... with a call number or signatures that are not the call's
  uint64_t touched = 0;        // output bytes a call that disagreed wrote
  uint32_t missing = 0;  // bit r: rank r never arrived, by the error record
  uint32_t timed_out_call = 0;
  RowGeometry geometry;  // the first fused launch's
  std::string first_mismatch;

  pyar::Signal *signal() { return reinterpret_cast<pyar::Signal *>(buffer.data()); }
  Pack16 *scratch() { return buffer.data() + sizeof(pyar::Signal) / 16; }
  void *ll_region(uint64_t max_size) { return scratch() + 2 * max_size / 16; }
};

}  // namespace
