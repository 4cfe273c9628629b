#pragma once
// The collective kernels by their GPU names (hipModuleGetFunction): the
// entry types the driver casts them to, the table of every instantiation the
// host build compiles, and the row block bounds of the host's fused launches.
// protocol_driver.cpp includes it after the kernel sources, its aliases and
// usage().
#include <cstdint>
#include <map>
#include <string>

namespace {

// The collective kernels take the input to stage (null: read the table as it
// is) after the table and its offset.
using AllreduceEntry = void (*)(const InputTable *, uint64_t, const Pack16 *, Pack16 *,
                                const CommState *, uint64_t, uint64_t, uint64_t, uint32_t);
// The LL one-shot: x, out, state, this rank's region, the regions' offset past
// the partial scratch, packets per source segment, n, timeout, signature, call.
using LLEntry = void (*)(const void *, void *, const CommState *, void *, uint64_t, uint64_t,
                         uint64_t, uint64_t, uint64_t, uint32_t);
using FusedEntry = void (*)(const InputTable *, uint64_t, const Pack16 *, uint64_t,
                            const Pack16 *, const Pack16 *, Pack16 *, Pack16 *, uint8_t *, void *,
                            uint32_t, float, uint32_t, uint32_t, const CommState *, uint64_t,
                            uint64_t, uint32_t);
// The lamport one-stage: x read in place, its row arguments, state, this rank's
// region, the regions' offset past the partial scratch, packs per source
// segment, timeout, signature, call.
using LamportEntry = void (*)(const Pack16 *, uint64_t, const Pack16 *, const Pack16 *, Pack16 *,
                              Pack16 *, uint8_t *, void *, uint32_t, float, uint32_t, uint32_t,
                              const CommState *, void *, uint64_t, uint64_t, uint64_t, uint64_t,
                              uint32_t);
using SplitEntry = void (*)(const InputTable *, uint64_t, const Pack16 *, uint64_t, uint32_t,
                            const CommState *, uint64_t, uint64_t, uint32_t);
using LocalEntry = void (*)(const Pack16 *, uint64_t, const Pack16 *, const Pack16 *, Pack16 *,
                            Pack16 *, uint8_t *, void *, uint32_t, float, uint32_t, uint32_t,
                            const uint32_t *);
// reduce_scatter and all_gather (`out` is the element type's pointer).
using ShardEntry = void (*)(const InputTable *, uint64_t, uint64_t, void *, const CommState *,
                            uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint32_t);

// The most threads of a row block here (the GPU's is kMaxRowThreads): rows
// of up to 128 packs run one pack per thread, wider ones 2 or 4, so small
// hidden sizes reach every packs-per-thread variant at few lanes.
constexpr uint32_t kHostRowThreads = 2 * pyar::kThreads;
constexpr uint32_t kRowThreadQuantum = 64;  // rmsnorm.ROW_THREAD_QUANTUM
static_assert(kHostRowThreads % kRowThreadQuantum == 0 &&
                  kHostRowThreads <= uint32_t(pyar::kMaxRowThreads),
              "a host row block is whole quanta within the kernels' bound");

#define PYAR_NAMED(entry) {#entry, reinterpret_cast<void *>(&entry)}
#define PYAR_NAMED_WORLDS(prefix)                                                            \
  PYAR_NAMED(prefix##_w2), PYAR_NAMED(prefix##_w3), PYAR_NAMED(prefix##_w4),                  \
      PYAR_NAMED(prefix##_w5), PYAR_NAMED(prefix##_w6), PYAR_NAMED(prefix##_w7),              \
      PYAR_NAMED(prefix##_w8)
#define PYAR_NAMED_TYPES(prefix) \
  PYAR_NAMED_WORLDS(prefix##_f32), PYAR_NAMED_WORLDS(prefix##_f16), PYAR_NAMED_WORLDS(prefix##_bf16)
// The fused kernels without quantization (the protocol is the same for every
// kind), at every packs-per-thread count the sources build.
#define PYAR_NAMED_ROWS(prefix)                                                               \
  PYAR_NAMED_WORLDS(prefix##_f32_plain_p1), PYAR_NAMED_WORLDS(prefix##_f32_plain_p2),         \
      PYAR_NAMED_WORLDS(prefix##_f32_plain_p4), PYAR_NAMED_WORLDS(prefix##_f16_plain_p1),     \
      PYAR_NAMED_WORLDS(prefix##_f16_plain_p2), PYAR_NAMED_WORLDS(prefix##_bf16_plain_p1),    \
      PYAR_NAMED_WORLDS(prefix##_bf16_plain_p2)
// Split's kernel A (no quantization kind) and kernel B (this rank's rows alone).
#define PYAR_NAMED_SPLIT(prefix)                                                              \
  PYAR_NAMED_WORLDS(prefix##_f32_p1), PYAR_NAMED_WORLDS(prefix##_f32_p2),                     \
      PYAR_NAMED_WORLDS(prefix##_f32_p4), PYAR_NAMED_WORLDS(prefix##_f16_p1),                 \
      PYAR_NAMED_WORLDS(prefix##_f16_p2), PYAR_NAMED_WORLDS(prefix##_bf16_p1),                \
      PYAR_NAMED_WORLDS(prefix##_bf16_p2)
#define PYAR_NAMED_LOCAL(prefix)                                                              \
  PYAR_NAMED(prefix##_f32_plain_p1), PYAR_NAMED(prefix##_f32_plain_p2),                       \
      PYAR_NAMED(prefix##_f32_plain_p4), PYAR_NAMED(prefix##_f16_plain_p1),                   \
      PYAR_NAMED(prefix##_f16_plain_p2), PYAR_NAMED(prefix##_bf16_plain_p1),                  \
      PYAR_NAMED(prefix##_bf16_plain_p2)

const std::map<std::string, void *> &entries() {
  static const std::map<std::string, void *> table = {
      PYAR_NAMED_TYPES(pyar_allreduce_one_shot),
      PYAR_NAMED_TYPES(pyar_allreduce_two_shot),
      PYAR_NAMED_TYPES(pyar_allreduce_ll),
      PYAR_NAMED_TYPES(pyar_allreduce_ll_two_shot),
      PYAR_NAMED_ROWS(pyar_allreduce_rmsnorm_one_stage),
      PYAR_NAMED_ROWS(pyar_allreduce_rmsnorm_two_stage),
      PYAR_NAMED_SPLIT(pyar_allreduce_rmsnorm_split),
      PYAR_NAMED_WORLDS(pyar_allreduce_rmsnorm_lamport_f32_plain_p1),
      PYAR_NAMED_WORLDS(pyar_allreduce_rmsnorm_lamport_f16_plain_p1),
      PYAR_NAMED_WORLDS(pyar_allreduce_rmsnorm_lamport_bf16_plain_p1),
      PYAR_NAMED_LOCAL(pyar_add_rmsnorm),
      PYAR_NAMED_WORLDS(pyar_reduce_scatter_f32_f32),
      PYAR_NAMED_WORLDS(pyar_reduce_scatter_f16_f16),
      PYAR_NAMED_WORLDS(pyar_reduce_scatter_f16_f32),
      PYAR_NAMED_WORLDS(pyar_reduce_scatter_bf16_bf16),
      PYAR_NAMED_WORLDS(pyar_reduce_scatter_bf16_f32),
      PYAR_NAMED_TYPES(pyar_all_gather),
  };
  return table;
}

void *entry(const std::string &name) {
  auto found = entries().find(name);
  if (found == entries().end()) usage("no kernel named " + name);
  return found->second;
}

}  // namespace
