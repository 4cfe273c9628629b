#pragma once
// The driver's command line: Options, the helpers that read its values, and
// parse(argc, argv), with the usage text above it.  protocol_driver.cpp
// includes it after the kernel sources, its aliases, usage() and
// driver_kernels.h (kHostRowThreads bounds a lamport row).
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct Options {
  std::string kernel, dtype = "f32", variant = "staged", out = "same";
  uint32_t world = 0;
  bool in_place = false;
  uint32_t calls = 40;
  uint64_t elements = 3001, tokens = 12;
  uint32_t hidden = 200;
  uint64_t max_size = 1 << 20;
  uint32_t blocks = 3;
  bool set_epoch = false;
  uint32_t epoch_start = 0;
  uint64_t seed = 1;
  uint32_t jitter = 0, sleep_us = 0, delay_us = 0;
  uint32_t absent_rank = ~0u;
  uint64_t absent_call = 0;
  uint64_t timeout_ms = 60000;
  int skip = -1;
  bool unsigned_reached = false;
  uint32_t disagree_rank = ~0u;
  uint64_t disagree_call = ~0ull;
  bool ignore_signature = false;
  bool failed_word = true;
  int stale = -1;
  bool no_idle_fill = false;
  int stage_mutation = 0;
  int ll_mutation = 0;
  uint32_t ll_count_bits = 0;
  uint64_t reader_delay_us = 0;
  std::string lamport_mutation;
  uint64_t large_every = 1;
  uint32_t late_rank = ~0u, late_us = 0;

  std::vector<std::string> kernels;  // call c runs kernels[c % size]

  static bool fused(const std::string &k) {
    return k == "onestage" || k == "twostage" || k == "split" || k == "lamport";
  }
  static bool sharded(const std::string &k) { return k == "reducescatter" || k == "allgather"; }
  static bool ll(const std::string &k) { return k == "ll" || k == "ll_twoshot"; }
  bool any_fused() const { return std::any_of(kernels.begin(), kernels.end(), fused); }
  bool lamport() const { return std::count(kernels.begin(), kernels.end(), "lamport") > 0; }
  const std::string &kernel_of(uint64_t call) const { return kernels[call % kernels.size()]; }
  uint64_t elements_of(uint64_t call) const {
    if (fused(kernel_of(call))) return tokens * hidden;
    return call % large_every == 0 ? elements : elements / 8;
  }
  bool registered() const { return variant == "registered"; }
  bool disagrees(uint32_t rank, uint64_t call) const {
    return rank == disagree_rank && call == disagree_call;
  }
};

// RANK.CALL of --absent and --disagree (RANK.US of --late).
std::pair<uint32_t, uint64_t> rank_and_call(const std::string &key, const std::string &value) {
  const size_t dot = value.find('.');
  if (dot == std::string::npos) usage(key + " is RANK.CALL");
  return {uint32_t(std::stoul(value.substr(0, dot))), std::stoull(value.substr(dot + 1))};
}

int phase(const std::string &name) {
  if (name == "start") return pyar::kStart;
  if (name == "mid") return pyar::kMid;
  if (name == "exit") return pyar::kEnd;
  usage("--skip is start, mid or exit, not " + name);
}

int ll_mutation(const std::string &name) {
  if (name == "one-generation") return pyar::kLLOneGeneration;
  if (name == "no-count") return pyar::kLLNoCount;
  if (name == "split-store") return pyar::kLLSplitStore;
  if (name == "no-refresh") return pyar::kLLNoRefresh;
  usage("--ll-mutation is one-generation, no-count, split-store or no-refresh, not " + name);
}

int stage_mutation(const std::string &name) {
  if (name == "after-start") return pyar::kStageAfterStart;
  if (name == "other-block") return pyar::kStageOtherBlock;
  usage("--stage is after-start or other-block, not " + name);
}

// Usage: protocol_driver KERNEL WORLD [--option value ...]
//   KERNEL     oneshot | twoshot | ll | ll_twoshot | onestage | twostage | split | lamport |
//              reducescatter | allgather, or several joined by '+' that take turns call by
//              call (twoshot+twostage: two kernels sharing the partial region
//              back to back)
//   --dtype    f32 | f16 | bf16                   (f32)
//   --variant  staged | copied | registered   (staged)  staged: the kernel copies the
//              input into the scratch; copied: the host does, before the launch
//              (the shards kernels are always copied)
//   --in-place 0 | 1   out is the input (all-reduce only)   (0)
//   --out f32      reducescatter of 16-bit inputs sums into float32
//   --calls N  back-to-back calls                 (40)
//   --elements N   all-reduce, reducescatter and allgather elements per call
//                  (the whole array: shards as pyar/comm/shards.py cuts it)   (3001)
//   --tokens N --hidden N   fused rows per call    (12, 200)
//   --max-size BYTES   scratch per rank: larger calls go in chunks (1 MiB)
//   --blocks N     the grid cap (Communicator._max_blocks), in blocks of
//                  kThreads; row_launch scales it to the row blocks   (3)
//   --epoch-start E    every block's epoch starts at E (and every flag holds it)
//   --stale mid | exit   that phase's slots start 2^31 calls older than the
//                  epoch (as if the calls since its last use had not touched it)
//   --idle-fill off    start barriers leave their kernel's idle phases' slots
//                      as they are (the control of --stale)
//   --skip start | mid | exit   leave that barrier out (a mutation run)
//   --absent R.C   rank R makes no call from its call C on (the peers time out)
//   --reached unsigned   compare epochs as plain unsigned numbers (not wrap-safe)
//   --disagree R.C     rank R's call C carries another signature (its element
//                      count plus one): every rank must record the
//                      disagreement, leave its outputs untouched and stop there
//                      (the host raises MismatchError)
//   --stage after-start | other-block   staged kernels copy their input after the
//                      start barrier, or the next block's packs (a mutation run)
//   --signature-check off   the start barrier ignores the signatures
//   --ll-mutation one-generation | no-count | split-store | no-refresh
//                      the LL kernel's positive controls (pyar_ll.h, LLMutation)
//   --ll-count-bits N  the LL flags' count bits (default: the kernel's)
//   --reader-delay-us US   the last rank's LL and lamport blocks wait US
//                      between their pushes and their takes (the lagging reader)
//   --lamport-mutation keep-data | one-slot   the lamport kernel's positive
//                      controls: a reader leaves the packs it took in the slot,
//                      or every call pushes into slot 0
//   --large-every P    call c takes --elements elements when c % P == 0, an
//                      eighth of them otherwise (the LL refresh's tests)   (1)
//   --late R.US        rank R starts every call US microseconds late
//   --failed-word off  split's kernel B is given no failure word (as the
//                      single-GPU step is): it norms after a failed kernel A
//   --seed S --jitter ONE_IN --sleep-us US --delay-us US --timeout-ms MS
Options parse(int argc, char **argv) {
  if (argc < 3) usage("usage: protocol_driver KERNEL WORLD [--option value ...]");
  Options o;
  o.kernel = argv[1];
  o.world = uint32_t(std::stoul(argv[2]));
  for (size_t first = 0; first <= o.kernel.size();) {
    const size_t plus = std::min(o.kernel.find('+', first), o.kernel.size());
    o.kernels.push_back(o.kernel.substr(first, plus - first));
    const std::string &k = o.kernels.back();
    if (k != "oneshot" && k != "twoshot" && !Options::ll(k) && !Options::fused(k) &&
        !Options::sharded(k))
      usage("KERNEL is oneshot, twoshot, ll, ll_twoshot, onestage, twostage, split, lamport, "
            "reducescatter or allgather, or several joined by '+', not " + o.kernel);
    first = plus + 1;
  }
  if (o.world < 2 || o.world > uint32_t(pyar::kMaxRanks)) usage("WORLD is 2..8");
  for (int i = 3; i + 1 < argc + 1; i += 2) {
    if (i + 1 >= argc) usage(std::string("no value after ") + argv[i]);
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--dtype") o.dtype = value;
    else if (key == "--variant") o.variant = value;
    else if (key == "--in-place") o.in_place = value == "1";
    else if (key == "--out") o.out = value;
    else if (key == "--calls") o.calls = uint32_t(std::stoul(value));
    else if (key == "--elements") o.elements = std::stoull(value);
    else if (key == "--tokens") o.tokens = std::stoull(value);
    else if (key == "--hidden") o.hidden = uint32_t(std::stoul(value));
    else if (key == "--max-size") o.max_size = std::stoull(value);
    else if (key == "--blocks") o.blocks = uint32_t(std::stoul(value));
    else if (key == "--epoch-start")
      o.set_epoch = true, o.epoch_start = uint32_t(std::stoull(value, nullptr, 0));
    else if (key == "--skip") o.skip = phase(value);
    else if (key == "--stale") o.stale = phase(value);
    else if (key == "--idle-fill") o.no_idle_fill = value == "off";
    else if (key == "--stage") o.stage_mutation = stage_mutation(value);
    else if (key == "--ll-mutation") o.ll_mutation = ll_mutation(value);
    else if (key == "--ll-count-bits") o.ll_count_bits = uint32_t(std::stoul(value));
    else if (key == "--reader-delay-us") o.reader_delay_us = std::stoull(value);
    else if (key == "--lamport-mutation") o.lamport_mutation = value;
    else if (key == "--large-every") o.large_every = std::stoull(value);
    else if (key == "--late") {
      const auto [rank, us] = rank_and_call(key, value);
      o.late_rank = rank, o.late_us = uint32_t(us);
    }
    else if (key == "--absent") std::tie(o.absent_rank, o.absent_call) = rank_and_call(key, value);
    else if (key == "--disagree")
      std::tie(o.disagree_rank, o.disagree_call) = rank_and_call(key, value);
    else if (key == "--signature-check") o.ignore_signature = value == "off";
    else if (key == "--failed-word") o.failed_word = value != "off";
    else if (key == "--reached") o.unsigned_reached = value == "unsigned";
    else if (key == "--seed") o.seed = std::stoull(value);
    else if (key == "--jitter") o.jitter = uint32_t(std::stoul(value));
    else if (key == "--sleep-us") o.sleep_us = uint32_t(std::stoul(value));
    else if (key == "--delay-us") o.delay_us = uint32_t(std::stoul(value));
    else if (key == "--timeout-ms") o.timeout_ms = std::stoull(value);
    else usage("unknown option " + key);
  }
  if (o.dtype != "f32" && o.dtype != "f16" && o.dtype != "bf16")
    usage("--dtype is f32, f16 or bf16");
  if (o.variant != "staged" && o.variant != "copied" && !o.registered())
    usage("--variant is staged, copied or registered");
  const bool sharded = std::any_of(o.kernels.begin(), o.kernels.end(), Options::sharded);
  if (o.in_place && (o.any_fused() || sharded)) usage("--in-place is for the all-reduce kernels");
  if (o.out != "same" && (o.out != "f32" || o.dtype == "f32" || o.kernel != "reducescatter"))
    usage("--out f32 is for reducescatter of f16 or bf16");
  // Communicator._plan: one-shot writes its output while peers read its input.
  const bool oneshot = std::count(o.kernels.begin(), o.kernels.end(), "oneshot") > 0;
  if (o.in_place && o.registered() && oneshot)
    usage("one-shot cannot write in place over a registered input");
  if (o.max_size % sizeof(Pack16) || o.max_size == 0) usage("--max-size is a multiple of 16");
  if (o.blocks == 0 || o.blocks > uint32_t(pyar::kMaxBlocks)) usage("--blocks is 1..256");
  if (o.stale >= 0 && !o.set_epoch) usage("--stale needs --epoch-start");
  if (o.stale == pyar::kStart) usage("--stale is mid or exit: every kernel waits at start");
  if (o.large_every == 0) usage("--large-every is 1 or more");
  if (o.ll_count_bits && (o.ll_count_bits < 3 || o.ll_count_bits > 16))
    usage("--ll-count-bits is 3..16");
  if (!o.lamport_mutation.empty() && o.lamport_mutation != "keep-data" &&
      o.lamport_mutation != "one-slot")
    usage("--lamport-mutation is keep-data or one-slot, not " + o.lamport_mutation);
  if (!o.lamport_mutation.empty() && !o.lamport())
    usage("--lamport-mutation is for the lamport kernel");
  if (o.lamport()) {
    // fused_plan.lamport_refusal: rows of one pack a thread, a call in one segment
    const uint64_t itemsize = o.dtype == "f32" ? 4 : 2, row_bytes = o.hidden * itemsize;
    if (o.variant != "staged")
      usage("the lamport kernel reads its input in place: no --variant (registered, copied)");
    if (row_bytes % 16 || row_bytes / 16 > kHostRowThreads)
      usage("a lamport row is whole packs, one a thread: --hidden too large");
    if (o.tokens * row_bytes > o.max_size) usage("a lamport call must fit --max-size");
  }
  const bool ll = std::any_of(o.kernels.begin(), o.kernels.end(), Options::ll);
  if (ll && o.registered()) usage("the LL kernels read their input in place: never registered");
  if (ll && o.elements * 4 > o.max_size) {
    // plan.ll_largest: a segment of max_size / 4 packets; two-shot W halves of one
    const bool one_shot = std::count(o.kernels.begin(), o.kernels.end(), "ll") > 0;
    if (one_shot || o.elements * 4 > o.world * (o.max_size / 8) * 4)
      usage("an LL call must fit --max-size (two-shot: world / 2 times it)");
  }
  return o;
}

}  // namespace
