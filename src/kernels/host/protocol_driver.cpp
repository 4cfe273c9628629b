// The collective kernels of src/kernels, built for the host
// (-DPYAR_HOST_BUILD, see pyar_device_host.h), driven through the call
// sequence of pyar/comm/communicator.py by WORLD ranks that are threads of
// this process.  tests/test_protocol_host.py builds it (with and without
// ThreadSanitizer, and with barriers left out) and runs it.
//
// Every rank owns what a Communicator allocates: one buffer holding the
// Signal area, the staging scratch and the partial region (the two-shot
// scratch, and the gather buffer every rank's two-stage blocks push their
// reduced packs into), zeroed, the peers' copies ordinary memory of the
// process; a CommState naming every rank's buffer, the staged input table
// and the error record.  Each rank's thread is its stream: per call it may
// be delayed (the GPU tests' spin kernel), passes each chunk for the kernel
// to stage into its scratch (or copies it there itself, as the host does for
// an input that is not 16-byte aligned, or passes the registered table),
// launches the kernel (host_grid.h: returns when every block has), checks
// the result exactly, and at once
// overwrites its input with the next call's -- the seeds' write-after-read
// pattern.  Inputs are integers in [-8, 8], so every sum is exact in every
// dtype and any order.  The fused kernels launch with the geometry of
// pyar/comm/rmsnorm.py row_launch, at the host's thread counts
// (kHostRowThreads).
//
// Prints one line of JSON; exits 0 when every result was exact, no call
// timed out and a --disagree call was recorded by every rank and touched no
// output, 1 otherwise, 2 on bad usage.
//
// The usage text and the options: driver_options.h, above parse().
#include <stdint.h>

namespace pyar {
namespace host {
// The barrier phase a mutation run leaves out (--skip), when the driver is
// built with -DPYAR_TEST_SKIP_PHASE=host::skipped_phase: one build serves
// the clean runs and every mutation of the table.
inline int skipped_phase = -1;
// Whether barriers compare epochs without regard to the wrap (--reached
// unsigned), with -DPYAR_TEST_REACHED_UNSIGNED=host::unsigned_reached.
inline bool unsigned_reached = false;
// Whether the start barrier ignores the call signatures (--signature-check
// off), with -DPYAR_TEST_IGNORE_SIGNATURE=host::ignore_signature.
inline bool ignore_signature = false;
// Whether start barriers leave the slots of their kernel's idle phases as
// they are (--idle-fill off), with -DPYAR_TEST_NO_IDLE_FILL=host::no_idle_fill.
inline bool no_idle_fill = false;
// How staged kernels copy their input (--stage: pyar::StageMutation), with
// -DPYAR_TEST_STAGE_MUTATION=host::stage_mutation.
inline int stage_mutation = 0;
// The LL kernel's mutation (--ll-mutation: pyar::LLMutation) and its count
// bits (--ll-count-bits, 0: the kernel's), with
// -DPYAR_TEST_LL_MUTATION=host::ll_mutation -DPYAR_TEST_LL_COUNT_BITS=host::ll_count_bits.
inline int ll_mutation = 0;
inline uint32_t ll_count_bits = 0;
// How long the last rank's LL and lamport blocks wait between their pushes
// and their takes (--reader-delay-us), with
// -DPYAR_TEST_READER_DELAY_NS=host::reader_delay_ns.
inline uint64_t reader_delay_ns = 0;
// The lamport kernel's controls (--lamport-mutation), with
// -DPYAR_TEST_LAMPORT_KEEP_DATA=host::lamport_keep_data
// -DPYAR_TEST_LAMPORT_ONE_SLOT=host::lamport_one_slot.
inline bool lamport_keep_data = false;
inline bool lamport_one_slot = false;
}  // namespace host
}  // namespace pyar

#include "allreduce.cu"
#include "allreduce_rmsnorm.cu"
#include "shards.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace host = pyar::host;
using pyar::CommState;
using pyar::InputTable;
using pyar::Pack16;

[[noreturn]] void usage(const std::string &why) {
  std::fprintf(stderr, "protocol_driver: %s\n", why.c_str());
  std::exit(2);
}

}  // namespace

#include "driver_kernels.h"
#include "driver_options.h"
#include "driver_data.h"

namespace {

// --- one rank's stream ---------------------------------------------------------

struct Run {
  Options o;
  std::vector<Rank> ranks;
  uint64_t timeout_ns;

  explicit Run(const Options &options) : o(options), ranks(options.world) {
    static_assert(sizeof(pyar::Signal) % 16 == 0, "the scratch follows the Signal area");
    timeout_ns = o.timeout_ms * 1000000ull;
    for (uint32_t r = 0; r < o.world; ++r) {
      Rank &k = ranks[r];
      k.rank = r;
      k.buffer = Memory(sizeof(pyar::Signal) + 2 * o.max_size + ll_region_bytes() +
                        lamport_region_bytes());
      // layout.lamport_region: zero counters, every word of both slots empty
      if (o.lamport()) {
        uint32_t *slots = reinterpret_cast<uint32_t *>(lamport_region(k)) +
                          pyar::kLamportHeaderBytes / 4;
        std::fill(slots, slots + (lamport_region_bytes() - pyar::kLamportHeaderBytes) / 4,
                  pyar::kEmptyWord);
      }
      if (o.set_epoch) start_epochs(k.signal(), o.epoch_start, o.stale);
    }
    for (uint32_t r = 0; r < o.world; ++r) {
      Rank &k = ranks[r];
      for (uint32_t p = 0; p < o.world; ++p) {
        Rank &peer = ranks[p];
        k.state.signals[p] = peer.signal();
        k.state.partial[p] = peer.scratch() + o.max_size / 16;
        k.staged.ptr[p] = peer.scratch();
      }
      k.state.error = k.error;
      k.state.rank = r;
      k.state.world = o.world;
    }
  }

  // The LL region: its header, then two generations of a segment per rank,
  // each of max_size / 4 packets (a call of max_size bytes at most).
  uint64_t ll_capacity() const { return o.max_size / 4; }
  uint64_t ll_region_bytes() const {
    return pyar::kLLHeaderBytes + pyar::kLLGenerations * o.world * ll_capacity() * 8;
  }

  // The lamport region: its counters, then two slots of a segment per rank,
  // each of max_size / 16 packs (a call of max_size bytes at most).
  uint64_t lamport_segment() const { return o.max_size / 16; }
  uint64_t lamport_region_bytes() const {
    if (!o.lamport()) return 0;
    return pyar::kLamportHeaderBytes + pyar::kLamportSlots * o.world * o.max_size;
  }
  // past the LL region: the same offset from the partial region on every rank
  void *lamport_region(Rank &k) const {
    return static_cast<char *>(k.ll_region(o.max_size)) + ll_region_bytes();
  }

  // The test hook of epoch wrap: as if this many calls had run already, the
  // last 2^31 of them (--stale) without storing into phase `stale`'s slots.
  static void start_epochs(pyar::Signal *s, uint32_t epoch, int stale) {
    for (int b = 0; b < pyar::kMaxBlocks; ++b) {
      s->epoch[b] = epoch;
      for (int p = 0; p < pyar::kPhases; ++p)
        for (int r = 0; r < pyar::kMaxRanks; ++r)
          s->flags[p][b][r] = p == stale ? epoch - (1u << 31) : epoch;
    }
  }

  void delay(const Rank &k, std::mt19937_64 &random) {
    if (k.rank == o.late_rank) host::sleep_us(o.late_us);
    if (o.delay_us && random() % 3 == 0) host::sleep_us(uint32_t(random() % o.delay_us));
  }

  // Communicator._chunk_input: (table, pack offset, input to stage) of one
  // chunk: the registered table in place; or the staged table (this rank's
  // scratch on every rank), the kernel copying the chunk there itself; or
  // (copied) the same table after the host's own copy.
  struct ChunkInput {
    const InputTable *table;
    uint64_t in_offset;
    const Pack16 *stage_from;
  };
  ChunkInput chunk_input(Rank &k, uint64_t offset, uint64_t nbytes) {
    if (o.registered()) return {&k.registered, offset / 16, nullptr};
    const Pack16 *chunk = reinterpret_cast<const Pack16 *>(k.x.as<char>() + offset);
    if (o.variant == "staged") return {&k.staged, 0, chunk};
    std::memcpy(k.scratch(), chunk, nbytes);
    return {&k.staged, 0, nullptr};
  }

  // Communicator._check_timeout: the error record the kernel left.  A
  // disagreement names the call (one of its chunks, first_chunk on) and
  // every rank's signature for that chunk: `expected(rank, chunk index)`.
  template <typename Expected>
  bool record_failure(Rank &k, uint32_t first_chunk, const Expected &expected) {
    if (!k.error[0]) return false;
    const uint32_t number = k.error[1 + pyar::kMaxRanks];
    if (k.error[2 + pyar::kMaxRanks]) {
      ++k.disagreements;
      bool right = number >= first_chunk && number < k.call;
      for (uint32_t r = 0; right && r < o.world; ++r) {
        const uint32_t *half = &k.error[3 + pyar::kMaxRanks + 2 * r];
        right = (half[0] | uint64_t(half[1]) << 32) == expected(r, number - first_chunk);
      }
      k.bad_records += !right;
      return true;
    }
    ++k.timeouts;
    for (uint32_t r = 0; r < o.world; ++r) k.missing |= (k.error[1 + r] ? 1u : 0u) << r;
    k.timed_out_call = number;
    return true;
  }

  // How many bytes of `now` differ from `before`.
  static uint64_t changed(const std::vector<Pack16> &before, const Memory &now) {
    uint64_t bytes = 0;
    const auto *a = reinterpret_cast<const unsigned char *>(before.data());
    const auto *b = reinterpret_cast<const unsigned char *>(now.packs.data());
    for (size_t i = 0; i < before.size() * sizeof(Pack16); ++i) bytes += a[i] != b[i];
    return bytes;
  }

  // The signature rank `rank` passes for a launch of `count` elements of call c.
  uint64_t signature_of(uint32_t rank, uint64_t c, const std::string &kernel,
                        uint64_t count) const {
    return signature(kernel, count + (o.disagrees(rank, c) ? 1 : 0), o.dtype,
                     o.registered() && !Options::ll(kernel),
                     kernel == "reducescatter" && o.out == "f32");
  }

  bool absent(const Rank &k, uint64_t call) const {
    return k.rank == o.absent_rank && call >= o.absent_call;
  }

  void mismatch(Rank &k, uint64_t call, uint64_t i, float got, float want) {
    if (k.mismatches++ == 0) {
      char text[160];
      std::snprintf(text, sizeof text, "rank %u call %llu element %llu: got %.9g, want %.9g",
                    k.rank, (unsigned long long)call, (unsigned long long)i, got, want);
      k.first_mismatch = text;
    }
  }

  template <typename T>
  void fill_input(Rank &k, uint64_t call, uint64_t n) {
    T *x = k.x.as<T>();
    if (o.kernel_of(call) == "allgather") {  // the rank's shard: element j is the array's first + j
      const Shards sh = shards(n, sizeof(T));
      const uint64_t first = sh.begin(k.rank);
      for (uint64_t j = 0; j < sh.end(k.rank) - first; ++j)
        x[j] = element<T>(float(pattern(o.seed, k.rank, call, first + j)));
      return;
    }
    for (uint64_t i = 0; i < n; ++i) x[i] = element<T>(float(pattern(o.seed, k.rank, call, i)));
  }

  template <typename T>
  float exact_sum(uint64_t call, uint64_t i) {
    int total = 0;
    for (uint32_t r = 0; r < o.world; ++r) total += pattern(o.seed, r, call, i);
    return float(total);
  }

  // --- one rank's stream: its calls, each kernel's checks ---
  template <typename T>
  void rank_calls(Rank &k) {
    std::mt19937_64 random(o.seed * 7919u + k.rank);
    T *weight = k.weight.as<T>();
    for (uint64_t j = 0; j < o.hidden; ++j) weight[j] = element<T>(float(1 + j % 5) / 4.f);
    for (uint64_t c = 0; c < o.calls && !absent(k, c); ++c) {
      const std::string &kernel = o.kernel_of(c);
      delay(k, random);
      const bool done = Options::fused(kernel)     ? fused_call<T>(k, c, kernel)
                        : Options::sharded(kernel) ? shard_call<T>(k, c, kernel)
                        : Options::ll(kernel)      ? ll_call<T>(k, c, kernel)
                                                   : allreduce_call<T>(k, c, kernel);
      if (!done)
        return;  // failed: the host raises CollectiveTimeout or MismatchError
      fill_input<T>(k, c + 1, o.elements_of(c + 1));  // the caller reuses its input at once
    }
  }

  // --- all-reduce: Communicator._allreduce_steps ---
  // --- the LL all-reduce (ll or ll_twoshot): plan.ll, one launch reading x in place ---
  template <typename T>
  bool ll_call(Rank &k, uint64_t c, const std::string &name) {
    const uint64_t n = o.elements_of(c);
    const bool two_shot = name == "ll_twoshot";
    const auto kernel = reinterpret_cast<LLEntry>(
        entry((two_shot ? "pyar_allreduce_ll_two_shot_" : "pyar_allreduce_ll_") + o.dtype +
              "_w" + std::to_string(o.world)));
    T *out = o.in_place ? k.x.as<T>() : k.out.as<T>();
    const bool skipped = c == o.disagree_call;  // as in allreduce_call
    if (skipped && !o.in_place) std::memset(k.out.data(), 0xff, k.out.packs.size() * 16);
    const std::vector<Pack16> before = (o.in_place ? k.x : k.out).packs;
    uint64_t words = pyar::input_words<T>(n);
    if (two_shot) words = (words + o.world - 1) / o.world;  // a shard's
    const uint64_t wanted = std::max<uint64_t>(1, (words + pyar::kThreads - 1) / pyar::kThreads);
    const uint32_t blocks = uint32_t(std::min<uint64_t>(o.blocks, wanted));
    const uint32_t first_chunk = k.call;
    const uint32_t call = k.call++;
    const uint64_t sig = signature_of(k.rank, c, name, n);
    host::launch(blocks, pyar::kThreads, [&] {
      kernel(k.x.data(), out, &k.state, k.ll_region(o.max_size), o.max_size, ll_capacity(), n,
             timeout_ns, sig, call);
    });
    ++k.chunks;
    return allreduce_result<T>(k, c, first_chunk, skipped, before, out, n,
                               [&](uint32_t rank, uint64_t) {
                                 return signature_of(rank, c, name, n);
                               });
  }

  // The end of an all-reduce call: a call every rank skips left its output
  // as it was; the error record (`expected(rank, chunk index)`: the
  // signatures); the exact sums.
  template <typename T, typename Expected>
  bool allreduce_result(Rank &k, uint64_t c, uint32_t first_chunk, bool skipped,
                        const std::vector<Pack16> &before, const T *out, uint64_t n,
                        const Expected &expected) {
    if (skipped) k.touched += changed(before, o.in_place ? k.x : k.out);
    if (record_failure(k, first_chunk, expected)) return false;
    if (skipped) return false;  // nobody noticed: the control build
    for (uint64_t i = 0; i < n; ++i) {
      const float want = exact_sum<T>(c, i);
      if (value<T>(out[i]) != want) mismatch(k, c, i, value<T>(out[i]), want);
    }
    return true;
  }

  template <typename T>
  bool allreduce_call(Rank &k, uint64_t c, const std::string &name) {
    const uint64_t n = o.elements;
    const auto kernel = reinterpret_cast<AllreduceEntry>(entry(allreduce_name(name)));
    const uint64_t lanes = 16 / sizeof(T), chunk = o.max_size / sizeof(T);
    T *x = k.x.as<T>();
    T *out = o.in_place ? x : k.out.as<T>();
    // The call every rank skips: its output, poisoned, must stay as it is.
    const bool skipped = c == o.disagree_call;
    if (skipped && !o.in_place) std::memset(k.out.data(), 0xff, k.out.packs.size() * 16);
    const std::vector<Pack16> before = (o.in_place ? k.x : k.out).packs;
    const uint32_t first_chunk = k.call;
    for (uint64_t first = 0; first < n; first += chunk) {
      const uint64_t count = std::min(chunk, n - first);
      const auto [table, in_offset, stage_from] =
          chunk_input(k, first * sizeof(T), count * sizeof(T));
      const uint64_t packs = count / lanes;
      const uint64_t work = name == "oneshot" ? packs : (packs + o.world - 1) / o.world;
      const uint64_t wanted = std::max<uint64_t>(1, (work + pyar::kThreads - 1) / pyar::kThreads);
      const uint32_t blocks = uint32_t(std::min<uint64_t>(o.blocks, wanted));
      const uint32_t call = k.call++;
      Pack16 *dst = reinterpret_cast<Pack16 *>(out + first);
      const uint64_t sig = signature_of(k.rank, c, name, count);
      host::launch(blocks, pyar::kThreads, [&] {
        kernel(table, in_offset, stage_from, dst, &k.state, count, timeout_ns, sig, call);
      });
      ++k.chunks;
    }
    return allreduce_result<T>(k, c, first_chunk, skipped, before, out, n,
                               [&](uint32_t rank, uint64_t index) {
                                 return signature_of(rank, c, name,
                                                     std::min(chunk, n - index * chunk));
                               });
  }

  // --- fused all-reduce + RMSNorm: Communicator._rmsnorm_steps ---
  // Inputs x and residual are integers, the weight multiples of 1/4: the
  // residual output r = sum(x) + residual is exact, and so is the sum of
  // squares of a row (integers below 2^24, exact in float32 in any order);
  // what follows is single IEEE operations in the kernel's order, so y is
  // checked for the kernel's exact bits too.
  template <typename T>
  bool fused_call(Rank &k, uint64_t c, const std::string &name) {
    const uint64_t tokens = o.tokens, hidden = o.hidden, n = tokens * hidden;
    const uint64_t row_bytes = hidden * sizeof(T), chunk = o.max_size / row_bytes;
    const float eps = 1e-6f;
    T *residual = k.residual.as<T>(), *y = k.y.as<T>(), *weight = k.weight.as<T>();
    for (uint64_t i = 0; i < n; ++i)
      residual[i] = element<T>(float(pattern(o.seed + 1, 0, c, i)));  // in place: reset
    const bool skipped = c == o.disagree_call;  // as in allreduce_call
    if (skipped) std::memset(k.y.data(), 0xff, k.y.packs.size() * 16);
    const std::vector<Pack16> residual_before = k.residual.packs, y_before = k.y.packs;
    const uint32_t first_chunk = k.call;
    for (uint64_t first = 0; first < tokens; first += chunk) {
      const uint64_t count = std::min(chunk, tokens - first);
      const auto [table, in_offset, stage_from] =
          name == "lamport" ? ChunkInput{nullptr, 0, nullptr}  // x read in place
                            : chunk_input(k, first * row_bytes, count * row_bytes);
      const RowGeometry g = row_launch(count, sizeof(T));
      if (k.geometry.blocks == 0) k.geometry = g;
      const uint32_t call = k.call++;
      Pack16 *res = reinterpret_cast<Pack16 *>(residual + first * hidden);
      Pack16 *dst = reinterpret_cast<Pack16 *>(y + first * hidden);
      const uint64_t sig = signature_of(k.rank, c, name, count * hidden);
      if (name == "split") {  // kernel A, then kernel B on this rank's gather buffer
        const auto reduce = reinterpret_cast<SplitEntry>(entry(fused_name(name, g)));
        host::launch(g.blocks, g.threads, [&] {
          reduce(table, in_offset, stage_from, count, uint32_t(hidden), &k.state, timeout_ns, sig,
                 call);
        });
        const auto norm = reinterpret_cast<LocalEntry>(entry(local_name(g)));
        host::launch(g.blocks, g.threads, [&] {
          norm(k.state.partial[k.rank], count, res, k.weight.data(), res, dst, nullptr, nullptr,
               uint32_t(hidden), eps, pyar::kNoQuant, uint32_t(hidden),
               o.failed_word ? &k.signal()->some_block_failed : nullptr);
        });
      } else if (name == "lamport") {  // fused_plan.lamport: x in place, one launch
        const auto kernel = reinterpret_cast<LamportEntry>(entry(fused_name(name, g)));
        const Pack16 *x = reinterpret_cast<const Pack16 *>(k.x.as<T>() + first * hidden);
        void *region = lamport_region(k);
        const uint64_t region_offset = uint64_t(static_cast<char *>(region) -
                                                reinterpret_cast<char *>(k.state.partial[k.rank]));
        host::launch(g.blocks, g.threads, [&] {
          kernel(x, count, res, k.weight.data(), res, dst, nullptr, nullptr, uint32_t(hidden), eps,
                 pyar::kNoQuant, uint32_t(hidden), &k.state, region, region_offset,
                 lamport_segment(), timeout_ns, sig, call);
        });
      } else {
        const auto kernel = reinterpret_cast<FusedEntry>(entry(fused_name(name, g)));
        host::launch(g.blocks, g.threads, [&] {
          kernel(table, in_offset, stage_from, count, res, k.weight.data(), res, dst, nullptr,
                 nullptr, uint32_t(hidden), eps, pyar::kNoQuant, uint32_t(hidden), &k.state,
                 timeout_ns, sig, call);
        });
      }
      ++k.chunks;
    }
    if (skipped) k.touched += changed(residual_before, k.residual) + changed(y_before, k.y);
    if (record_failure(k, first_chunk, [&](uint32_t rank, uint64_t index) {
          return signature_of(rank, c, name, std::min(chunk, tokens - index * chunk) * hidden);
        }))
      return false;
    if (skipped) return false;  // nobody noticed: the control build
    std::vector<float> r(hidden);
    for (uint64_t t = 0; t < tokens; ++t) {
      int squares = 0;
      for (uint64_t j = 0; j < hidden; ++j) {
        const uint64_t i = t * hidden + j;
        const int sum = int(exact_sum<T>(c, i)) + pattern(o.seed + 1, 0, c, i);
        r[j] = float(sum);
        squares += sum * sum;
        if (value<T>(residual[i]) != r[j]) mismatch(k, c, i, value<T>(residual[i]), r[j]);
      }
      const float inv_rms = 1.0f / std::sqrt(float(squares) / float(hidden) + eps);
      for (uint64_t j = 0; j < hidden; ++j) {
        const uint64_t i = t * hidden + j;
        const float want = value<T>(element<T>(r[j] * inv_rms * value<T>(weight[j])));
        if (value<T>(y[i]) != want) mismatch(k, c, i, value<T>(y[i]), want);
      }
    }
    return true;
  }

  // --- reduce_scatter and all_gather: Communicator._reduce_scatter_steps
  // and _all_gather_steps, the shards of pyar/comm/shards.py ---
  struct Shards {
    uint64_t n, shard, world;
    uint64_t begin(uint64_t q) const { return std::min(n, q * shard); }
    uint64_t end(uint64_t q) const { return std::min(n, (q + 1) * shard); }
    // The elements of shard q the launch (first, count) covers.
    uint64_t run(uint64_t q, uint64_t first, uint64_t count) const {
      const uint64_t from = q * shard + first;
      return end(q) > from ? std::min(end(q) - from, count) : 0;
    }
  };
  Shards shards(uint64_t n, uint64_t itemsize) const {
    const uint64_t lanes = 16 / itemsize;
    return {n, lanes * ((n + lanes * o.world - 1) / (lanes * o.world)), o.world};
  }

  template <typename T>
  bool shard_call(Rank &k, uint64_t c, const std::string &name) {
    const bool gather = name == "allgather";
    const bool wide = o.out == "f32";  // reduce_scatter's float32 sums
    const uint64_t n = o.elements, lanes = 16 / sizeof(T);
    const Shards sh = shards(n, sizeof(T));
    const uint64_t per_rank = (gather ? o.max_size : o.max_size / o.world) / sizeof(T);
    const uint64_t most = std::min(sh.shard, per_rank / lanes * lanes);
    if (most == 0 && sh.shard) usage("--max-size holds less than a pack per rank");
    const std::string types = gather ? o.dtype : o.dtype + "_" + (wide ? "f32" : o.dtype);
    const auto kernel = reinterpret_cast<ShardEntry>(entry(
        (gather ? "pyar_all_gather_" : "pyar_reduce_scatter_") + types + "_w" +
        std::to_string(o.world)));
    const size_t out_size = wide ? sizeof(float) : sizeof(T);
    const bool skipped = c == o.disagree_call;  // as in allreduce_call
    if (skipped) std::memset(k.out.data(), 0xff, k.out.packs.size() * 16);
    const std::vector<Pack16> before = k.out.packs;
    const uint32_t first_chunk = k.call;
    const T *x = k.x.as<T>();
    for (uint64_t first = 0; first < sh.shard; first += most) {
      const uint64_t count = std::min(most, sh.shard - first);
      const InputTable *table = o.registered() ? &k.registered : &k.staged;
      uint64_t in_offset = o.registered() ? first : 0, in_stride = 0;
      if (gather) {
        if (!o.registered())
          std::memcpy(k.scratch(), x + first, sh.run(k.rank, first, count) * sizeof(T));
      } else {
        in_stride = o.registered() ? sh.shard : count;
        for (uint64_t q = 0; !o.registered() && q < o.world; ++q)
          std::memcpy(reinterpret_cast<char *>(k.scratch()) + q * count * sizeof(T),
                      x + q * sh.shard + first, sh.run(q, first, count) * sizeof(T));
      }
      const uint64_t packs = count / lanes;
      const uint64_t wanted =
          std::max<uint64_t>(1, (packs + pyar::kThreads - 1) / pyar::kThreads);
      const uint32_t blocks = uint32_t(std::min<uint64_t>(o.blocks, wanted));
      const uint32_t call = k.call++;
      char *dst = k.out.as<char>() + (gather ? 0 : first * out_size);
      const uint64_t sig = signature_of(k.rank, c, name, n);
      host::launch(blocks, pyar::kThreads, [&] {
        kernel(table, in_offset, in_stride, dst, &k.state, n, sh.shard, first, count, timeout_ns,
               sig, call);
      });
      ++k.chunks;
    }
    if (skipped) k.touched += changed(before, k.out);
    if (record_failure(k, first_chunk, [&](uint32_t rank, uint64_t) {
          return signature_of(rank, c, name, n);
        }))
      return false;
    if (skipped) return false;  // nobody noticed: the control build
    if (gather) {
      const T *out = k.out.as<T>();
      for (uint64_t q = 0; q < o.world; ++q)
        for (uint64_t i = sh.begin(q); i < sh.end(q); ++i) {
          const float want = float(pattern(o.seed, uint32_t(q), c, i));
          if (value<T>(out[i]) != want) mismatch(k, c, i, value<T>(out[i]), want);
        }
      return true;
    }
    for (uint64_t i = sh.begin(k.rank); i < sh.end(k.rank); ++i) {
      const uint64_t j = i - sh.begin(k.rank);
      const float got = wide ? k.out.as<float>()[j] : value<T>(k.out.as<T>()[j]);
      if (got != exact_sum<T>(c, i)) mismatch(k, c, i, got, exact_sum<T>(c, i));
    }
    return true;
  }

  // rmsnorm.row_launch for `tokens` rows of o.hidden elements at the host's
  // thread counts: block_cap (--blocks) counts blocks of the all-reduce's
  // kThreads, half a row block's most, as on the GPU.
  RowGeometry row_launch(uint64_t tokens, uint32_t itemsize) const {
    const uint32_t packs = o.hidden * itemsize / 16;
    uint32_t per_thread = 1;
    while ((packs + per_thread - 1) / per_thread > kHostRowThreads) per_thread *= 2;
    uint32_t threads = (packs + per_thread - 1) / per_thread;
    threads = (threads + kRowThreadQuantum - 1) / kRowThreadQuantum * kRowThreadQuantum;
    const uint64_t scaled = uint64_t(o.blocks) * (2 * uint32_t(pyar::kThreads) / threads) / 2;
    const uint64_t blocks = std::min({tokens, scaled, uint64_t(pyar::kMaxBlocks)});
    return {per_thread, threads, uint32_t(std::max<uint64_t>(1, blocks))};
  }

  std::string fused_name(const std::string &name, const RowGeometry &g) const {
    const std::string p = "_p" + std::to_string(g.per_thread) + "_w" + std::to_string(o.world);
    if (name == "split") return "pyar_allreduce_rmsnorm_split_" + o.dtype + p;
    if (name == "lamport") return "pyar_allreduce_rmsnorm_lamport_" + o.dtype + "_plain" + p;
    const std::string algo = name == "onestage" ? "one_stage" : "two_stage";
    return "pyar_allreduce_rmsnorm_" + algo + "_" + o.dtype + "_plain" + p;
  }

  std::string local_name(const RowGeometry &g) const {
    return "pyar_add_rmsnorm_" + o.dtype + "_plain_p" + std::to_string(g.per_thread);
  }

  std::string allreduce_name(const std::string &name) const {
    const std::string algo = name == "oneshot" ? "one_shot" : "two_shot";
    return "pyar_allreduce_" + algo + "_" + o.dtype + "_w" + std::to_string(o.world);
  }

  template <typename T>
  void run() {
    const bool fused = o.any_fused();
    const uint64_t n = std::max(o.elements, fused ? o.tokens * o.hidden : 0);
    if (fused && (o.hidden * sizeof(T)) % 16) usage("a row is whole 16-byte packs");
    if (fused && o.hidden * sizeof(T) > o.max_size) usage("a row must fit --max-size");
    const uint64_t largest = 8 * o.world + 8;  // |sum(x) + residual|
    if (fused && o.hidden * largest * largest >= (1u << 24))
      usage("--hidden too large for an exact float32 sum of squares");
    for (Rank &k : ranks) {
      k.x = Memory(n * sizeof(T));
      k.out = Memory(n * sizeof(float));  // reduce_scatter may sum 16-bit inputs into float32
      k.residual = Memory(n * sizeof(T));
      k.y = Memory(n * sizeof(T));
      k.weight = Memory(o.hidden * sizeof(T));
      fill_input<T>(k, 0, o.elements_of(0));
    }
    for (uint32_t r = 0; r < o.world; ++r)
      for (uint32_t p = 0; p < o.world; ++p) ranks[r].registered.ptr[p] = ranks[p].x.data();
    std::vector<std::thread> streams;
    for (Rank &k : ranks)
      streams.emplace_back([this, &k] { rank_calls<T>(k); });
    for (std::thread &t : streams) t.join();
  }
};

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  host::Jitter &j = host::jitter_settings();
  j.one_in = o.jitter;
  j.max_sleep_us = o.sleep_us;
  j.seed = o.seed;
#if defined(PYAR_TEST_SKIP_PHASE)
  host::skipped_phase = o.skip;
#else
  if (o.skip >= 0) usage("--skip needs a build with -DPYAR_TEST_SKIP_PHASE=host::skipped_phase");
#endif
#if defined(PYAR_TEST_REACHED_UNSIGNED)
  host::unsigned_reached = o.unsigned_reached;
#else
  if (o.unsigned_reached)
    usage("--reached needs -DPYAR_TEST_REACHED_UNSIGNED=host::unsigned_reached");
#endif
#if defined(PYAR_TEST_IGNORE_SIGNATURE)
  host::ignore_signature = o.ignore_signature;
#else
  if (o.ignore_signature)
    usage("--signature-check off needs -DPYAR_TEST_IGNORE_SIGNATURE=host::ignore_signature");
#endif
#if defined(PYAR_TEST_NO_IDLE_FILL)
  host::no_idle_fill = o.no_idle_fill;
#else
  if (o.no_idle_fill) usage("--idle-fill off needs -DPYAR_TEST_NO_IDLE_FILL=host::no_idle_fill");
#endif
#if defined(PYAR_TEST_LL_MUTATION) && defined(PYAR_TEST_LL_COUNT_BITS)
  host::ll_mutation = o.ll_mutation;
  host::ll_count_bits = o.ll_count_bits;
#else
  if (o.ll_mutation || o.ll_count_bits)
    usage("--ll-mutation and --ll-count-bits need -DPYAR_TEST_LL_MUTATION=host::ll_mutation "
          "-DPYAR_TEST_LL_COUNT_BITS=host::ll_count_bits");
#endif
#if defined(PYAR_TEST_READER_DELAY_NS)
  host::reader_delay_ns = o.reader_delay_us * 1000;
#else
  if (o.reader_delay_us)
    usage("--reader-delay-us needs -DPYAR_TEST_READER_DELAY_NS=host::reader_delay_ns");
#endif
#if defined(PYAR_TEST_LAMPORT_KEEP_DATA) && defined(PYAR_TEST_LAMPORT_ONE_SLOT)
  host::lamport_keep_data = o.lamport_mutation == "keep-data";
  host::lamport_one_slot = o.lamport_mutation == "one-slot";
#else
  if (!o.lamport_mutation.empty())
    usage("--lamport-mutation needs -DPYAR_TEST_LAMPORT_KEEP_DATA=host::lamport_keep_data "
          "-DPYAR_TEST_LAMPORT_ONE_SLOT=host::lamport_one_slot");
#endif
#if defined(PYAR_TEST_STAGE_MUTATION)
  host::stage_mutation = o.stage_mutation;
#else
  if (o.stage_mutation)
    usage("--stage needs -DPYAR_TEST_STAGE_MUTATION=host::stage_mutation");
#endif
  Run run(o);
  const auto started = std::chrono::steady_clock::now();
  if (o.dtype == "f32") run.run<float>();
  else if (o.dtype == "f16") run.run<__half>();
  else run.run<pyar::bf16_bits>();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  uint64_t mismatches = 0, timeouts = 0, chunks = 0;
  uint64_t disagreements = 0, bad_records = 0, touched = 0;
  std::string first, missing, timed_out_calls;
  uint32_t never_arrived = 0;
  for (const Rank &k : run.ranks) {
    never_arrived |= k.missing;
    if (k.timeouts)
      timed_out_calls += (timed_out_calls.empty() ? "" : ", ") + std::to_string(k.timed_out_call);
    mismatches += k.mismatches;
    timeouts += k.timeouts;
    chunks += k.chunks;
    disagreements += k.disagreements;
    bad_records += k.bad_records;
    touched += k.touched;
    if (first.empty()) first = k.first_mismatch;
  }
  const RowGeometry row = run.ranks[0].geometry;  // fused only: the first launch's
  for (uint32_t r = 0; r < o.world; ++r)
    if (never_arrived >> r & 1u) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  std::printf(
      "{\"kernel\": \"%s\", \"world\": %u, \"dtype\": \"%s\", \"variant\": \"%s\", "
      "\"in_place\": %s, \"calls\": %u, \"launches\": %llu, \"mismatches\": %llu, "
      "\"timeouts\": %llu, \"missing\": [%s], \"timed_out_calls\": [%s], \"seconds\": %.2f, "
      "\"disagreements\": %llu, \"bad_records\": %llu, \"touched\": %llu, "
      "\"packs_per_thread\": %u, \"threads\": %u, \"blocks\": %u, \"first_mismatch\": \"%s\"}\n",
      o.kernel.c_str(), o.world, o.dtype.c_str(), o.variant.c_str(),
      o.in_place ? "true" : "false", o.calls, (unsigned long long)chunks,
      (unsigned long long)mismatches, (unsigned long long)timeouts, missing.c_str(),
      timed_out_calls.c_str(), seconds, (unsigned long long)disagreements,
      (unsigned long long)bad_records, (unsigned long long)touched, row.per_thread, row.threads,
      row.blocks, first.c_str());
  const uint64_t disagreed = o.disagree_call < o.calls ? o.world : 0;  // every rank records it
  const bool ok = mismatches == 0 && timeouts == 0 && disagreements == disagreed &&
                  bad_records == 0 && touched == 0;
  return ok ? 0 : 1;
}
