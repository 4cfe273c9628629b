// The LL ("low latency") push all-reduce: every rank stores its input, in
// 8-byte packets of 4 bytes of data and a 4-byte flag, into its own segment
// of every rank's receive slot, then polls the W segments of its own slot
// and sums them.  No rank reads a peer's memory, and the call has neither a
// start barrier before its data moves nor an exit barrier (rule 1; the proof
// is at `ll` below).  The start flag of pyar_lamport.h (announce, confirm)
// carries the call's full digest for the error record.
//
// Each rank owns a receive region (the host places it after the lamport
// region; pyar/comm/connection.py):
//   uint32_t calls[kMaxBlocks]        LL calls so far, equal in every entry
//                                     between calls (LamportSlots)
//   uint64_t packet[2][W][capacity]   generation g, source rank r: r's packets
// Zeroed by the host once; no flag is ever 0.
//
// Rules:
//  1. A packet is stored by one 64-bit store and read by one 64-bit load
//     (store_packet, load_packet in pyar_device.h say why each is atomic), so
//     a reader that sees a packet's flag sees its data.
//  2. Call c uses generation c & 1 on every rank (every rank makes the same
//     calls, so the count in the region is the same on every rank).
//  3. The flag (ll_flag) holds, from the low bit up: the count's low
//     kLLCountBits bits, a bit that is always set (no flag is 0, the zeroed
//     memory), and the low bits of the call's digest.  A reader takes a
//     packet whose flag is its own call's; one whose count bits are its
//     call's but whose digest bits differ comes from a peer making another
//     call (it stops and the start flags' check records the disagreement);
//     any other packet is older (not there yet).
//  4. Count bits are enough only while no packet a reader may take is
//     2^kLLCountBits calls old, and a packet past the end of the small calls
//     since it was stored could be any age: so once every 2^(kLLCountBits -
//     2) calls (the refresh calls, two in a row: one per generation) each
//     reader stores 0 over every packet of its slot once it has taken its
//     own.  A packet a reader polls is then from the same generation's
//     calls since the last refresh, fewer than 2^(kLLCountBits - 2) + 2
//     calls old, so its count bits differ from the reader's call's unless
//     it is that call's.
//  5. Every poll is bounded by the call's timeout, gives up once the call is
//     abandoned (after kGiveUpCheckNs), and records the ranks that never
//     pushed (record_timeout).
#pragma once

#include "pyar_lamport.h"

namespace pyar {

constexpr int kLLGenerations = 2;
constexpr int kLLHeaderBytes = kLamportHeaderBytes;  // the call counters
constexpr uint32_t kLLCountBits = 16;

// Positive controls (tests/test_protocol_host.py), as PYAR_TEST_LL_MUTATION:
// one generation for every call; flags without the count bits; the packet
// stored as two 32-bit stores, its data by a plain store (the closest the
// host model comes to a reader seeing the flag before the data: a race
// ThreadSanitizer reports); no refresh.  PYAR_TEST_LL_COUNT_BITS shrinks the
// count bits, so that a test reaches the refresh period in a few calls.
// PYAR_TEST_READER_DELAY_NS makes the last rank a lagging reader
// (pyar_lamport.h, reader_delay).
enum LLMutation {
  kLLExact = 0,
  kLLOneGeneration = 1,
  kLLNoCount = 2,
  kLLSplitStore = 3,
  kLLNoRefresh = 4
};

PYAR_DEVICE int ll_mutation() {
#if defined(PYAR_TEST_LL_MUTATION)
  return PYAR_TEST_LL_MUTATION;
#else
  return kLLExact;
#endif
}

PYAR_DEVICE uint32_t ll_count_bits() {
#if defined(PYAR_TEST_LL_COUNT_BITS)
  if (PYAR_TEST_LL_COUNT_BITS) return PYAR_TEST_LL_COUNT_BITS;
#endif
  return kLLCountBits;
}

// The flag of call `count` with the digest of its signature (rule 3).
PYAR_DEVICE uint32_t ll_flag(uint32_t count, uint32_t digest) {
  const uint32_t bits = ll_count_bits();
  const uint32_t counted = ll_mutation() == kLLNoCount ? 0u : count & ((1u << bits) - 1u);
  return digest << (bits + 1) | 1u << bits | counted;
}

// What a reader makes of a packet it polled, for a call whose flag is `flag`.
enum PacketSeen { kNotYet = 0, kArrived = 1, kOtherCall = 2 };

// (A build that ignores the signatures, PYAR_TEST_IGNORE_SIGNATURE, takes a
// packet of another digest as this call's, as its start flags let it pass.)
PYAR_DEVICE int judge_packet(uint64_t packet, uint32_t flag) {
  const uint32_t seen = uint32_t(packet >> 32);
  if (seen == flag) return kArrived;
  const uint32_t bits = ll_count_bits();
  const uint32_t count_mask = (2u << bits) - 1u;  // the count bits and the set bit
  if ((seen & count_mask) != (flag & count_mask)) return kNotYet;
  return disagree(seen >> (bits + 1), flag >> (bits + 1)) ? kOtherCall : kArrived;
}

PYAR_DEVICE void push_packet(uint64_t *slot, uint32_t data, uint32_t flag) {
  if (ll_mutation() == kLLSplitStore) {
    reinterpret_cast<uint32_t *>(slot)[0] = data;
    store_volatile(reinterpret_cast<uint32_t *>(slot) + 1, flag);
    return;
  }
  store_packet(slot, uint64_t(flag) << 32 | data);
}

// Whether call `count` stores 0 over its slot once taken (rule 4).
PYAR_DEVICE bool refresh_call(uint32_t count) {
  if (ll_mutation() == kLLNoRefresh) return false;
  return (count & ((1u << (ll_count_bits() - 2)) - 1u)) < 2u;
}

// The 4-byte words of an input of n elements of T (the last one padded).
template <typename T>
PYAR_DEVICE uint64_t input_words(uint64_t n) {
  return (n * sizeof(T) + 3) / 4;
}

// Word i of an input of n elements of T: one float32, or two 16-bit
// elements (the second 0 past the end).
template <typename T>
PYAR_DEVICE uint32_t input_word(const void *x, uint64_t n, uint64_t i) {
  if constexpr (sizeof(T) == 4) {
    return static_cast<const uint32_t *>(x)[i];
  } else {
    const uint16_t *h = static_cast<const uint16_t *>(x);
    const uint32_t high = 2 * i + 1 < n ? h[2 * i + 1] : 0u;
    return h[2 * i] | high << 16;
  }
}

// The words of one index from every source, summed element by element in
// rank order 0..W-1 in float32 (sum_packs's order: every rank, and the
// barrier one-shot, get the same bits) and rounded to T once: a word of T.
template <typename T, int W>
PYAR_DEVICE uint32_t sum_word(const uint32_t (&v)[W]) {
  constexpr int E = 4 / sizeof(T);
  T sum[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float acc = Element<T>::to_float(reinterpret_cast<const T *>(&v[0])[e]);
#pragma unroll
    for (int r = 1; r < W; ++r) acc += Element<T>::to_float(reinterpret_cast<const T *>(&v[r])[e]);
    sum[e] = Element<T>::from_float(acc);
  }
  uint32_t word;
  __builtin_memcpy(&word, sum, 4);
  return word;
}

// Word i of the output, its elements below n written to `out`.
template <typename T>
PYAR_DEVICE void write_word(uint32_t word, void *out, uint64_t n, uint64_t i) {
  constexpr int E = 4 / sizeof(T);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint64_t j = i * E + e;
    if (j >= n) break;
    static_cast<T *>(out)[j] = reinterpret_cast<const T *>(&word)[e];
  }
}

// Waits until word i of every source's segment (`from`) holds a packet of
// this call (`flag`) and takes its data into v.  Returns false if a source's
// packet did not come within the timeout (its rank is recorded as one that
// never arrived), the call was abandoned, or a source makes another call
// (`other` set: its packet carries another digest, or its start flag does).
// `glance` (may be null: pyar_lamport.h) is loaded after every round of
// loads is issued.
template <int W>
PYAR_DEVICE bool take_word(const CommState &s, const uint64_t *const (&from)[W], uint64_t i,
                           uint32_t flag, const CallInfo &info, uint32_t (&v)[W], bool &other,
                           FlagGlance<W> *glance = nullptr) {
  uint64_t packet[W];
  uint32_t missing = 0;
#pragma unroll
  for (int r = 0; r < W; ++r) packet[r] = load_packet(from[r] + i);
  if (glance) glance->load();
#pragma unroll
  for (int r = 0; r < W; ++r) {
    const int seen = judge_packet(packet[r], flag);
    other |= seen == kOtherCall;
    missing |= uint32_t(seen != kArrived) << r;
    v[r] = uint32_t(packet[r]);
  }
  if (other) return false;
  if (missing) {
    const uint64_t since = now_ns();
    const BlockState &block = block_state();
    while (missing) {
#pragma unroll
      for (int r = 0; r < W; ++r)
        if ((missing >> r) & 1u) packet[r] = load_packet(from[r] + i);
      if (glance) glance->load();
#pragma unroll
      for (int r = 0; r < W; ++r) {
        if (!((missing >> r) & 1u)) continue;
        const int seen = judge_packet(packet[r], flag);
        if (seen == kOtherCall) {
          other = true;
          return false;
        }
        if (seen == kArrived) missing &= ~(1u << r), v[r] = uint32_t(packet[r]);
      }
      const uint64_t waited = now_ns() - since;
      if (missing && waited > info.timeout_ns) {
#pragma unroll
        for (int r = 0; r < W; ++r)
          if ((missing >> r) & 1u) record_timeout(s, r, info);
        return false;
      }
      if (missing && waited > kGiveUpCheckNs) {
        const bool abandoned = call_abandoned(s, block.signals[block.rank]);
        if (abandoned || makes_another_call(missing)) {
          other = !abandoned;
          return false;
        }
      }
    }
  }
  return true;
}

// One LL call as a thread of a block sees it: the state, the call counters
// and the block's epoch (begun at construction, committed by `end`), the
// thread's first word and the grid's stride; once the block announced the
// call (`begin`), its flag (count and digest), this rank's segment of the
// call's generation at every rank (`to`), and every source's segment of it
// in this rank's region (`from`), `capacity` packets each.
template <int W>
struct LLCall {
  const CommState &s;
  const LamportSlots counts;
  const uint32_t epoch;
  const uint64_t first, stride;
  uint32_t flag = 0;
  uint64_t *to[W] = {};
  const uint64_t *from[W] = {};

  PYAR_DEVICE LLCall(const CommState *state, void *region, const CallInfo &info)
      : s(*state), counts(region), epoch(BlockEpoch::begin(s, info)),
        first(blockIdx.x * uint64_t(blockDim.x) + threadIdx.x),
        stride(uint64_t(gridDim.x) * blockDim.x) {}

  PYAR_DEVICE void begin(const BlockState &block, void *region, uint64_t region_offset,
                         uint64_t capacity) {
    const uint64_t generation =
        ll_mutation() == kLLOneGeneration ? 0 : counts.count & (kLLGenerations - 1);
    flag = ll_flag(counts.count, block.digest);
#pragma unroll
    for (int r = 0; r < W; ++r) {
      char *base = reinterpret_cast<char *>(s.partial[r]) + region_offset + kLLHeaderBytes;
      to[r] = reinterpret_cast<uint64_t *>(base) + (generation * W + block.rank) * capacity;
      from[r] = reinterpret_cast<const uint64_t *>(static_cast<const char *>(region) +
                                                   kLLHeaderBytes) +
                (generation * W + r) * capacity;
    }
  }

  PYAR_DEVICE void end() {
    BlockEpoch::commit();
    counts.advance();
  }
};

// The LL one-shot all-reduce of n elements of T: `x` this rank's input,
// `out` its output (x itself in place), `region` this rank's receive region
// and `region_offset` where a rank's region starts past its two-shot scratch
// (CommState::partial, the same on every rank), `capacity` packets of a
// source's segment (the most words a call takes).  Thread t of block b
// handles words b * B + t + k * G * B (k = 0, 1, ..) on every rank.
//
// Why it needs neither a start barrier before its data moves nor an exit
// barrier (rule 1):
// - The input.  No peer reads this rank's memory: a rank reads only x, its
//   own input, and its own receive region.  So the seeds' write-after-read
//   race on inputs (a fast rank returns and reuses its input while a slow
//   peer still reads it) cannot happen by construction: the caller may
//   overwrite x as soon as the kernel returned, and in place each thread
//   pushes every word it handles before it writes any output word (it
//   writes only its own words).
// - A generation, between the calls that use it.  Rank q stores into rank
//   p's generation g only in calls c with c & 1 == g (rule 2); the
//   generation's previous use was call c - 2, in which p took every packet.
//   q's call c starts after q's call c - 1 returned (stream order); some
//   block of that call waited, with an acquire (confirm), for p's start flag
//   of call c - 1, which p released after its call c - 2 had returned.  So
//   p's reads (and a refresh's stores) of generation g in call c - 2 happen
//   before q's stores into it in call c: q never stores into a generation p
//   still reads.  The message that orders them is p's start flag of c - 1.
//   With one generation (kLLOneGeneration) q's call c + 1 stores into the
//   slot p still reads in call c: its packets of c are overwritten before p
//   took them.
// - The generation of the call in flight.  Each packet is stored once per
//   call, by its source, and read only by its owner: q's thread that
//   handles word i stores it into every rank; p's thread that handles word i
//   (the same grid on every rank) takes it.  Its count bits tell it from the
//   older packets left there (rules 3 and 4), so no clearing pass runs
//   between the calls.  Without the count bits (kLLNoCount) a reader takes
//   the packet of call c - 2 as this call's.
// - The flags.  Each block stores its start flag before it pushes anything
//   (announce) and checks every peer's, arrival and full digest, once its
//   first words came and before it writes any output (confirm): a call that
//   disagrees writes nothing, on every rank (the start flags carry the
//   digest both ways).  A packet with this call's count bits and another
//   digest, or after kGiveUpCheckNs a peer's start flag of this epoch with
//   another digest, ends the wait at once: confirm then records the
//   disagreement instead of a timeout.
// - Later words.  Once confirm passed, every peer makes this call and
//   pushes every word without waiting for anything; their polls stay
//   bounded, and a block that gives up latches the failure.
template <typename T, int W>
PYAR_DEVICE void ll(const void *x, void *out, const CommState *state, void *region,
                    uint64_t region_offset, uint64_t capacity, uint64_t n, const CallInfo &info) {
  LLCall<W> c(state, region, info);
  const uint64_t words = input_words<T>(n);
  if (announce<W>(c.epoch)) {
    const BlockState &block = block_state();
    c.begin(block, region, region_offset, capacity);
    for (uint64_t i = c.first; i < words; i += c.stride) {
      const uint32_t data = input_word<T>(x, n, i);
#pragma unroll
      for (int r = 0; r < W; ++r) push_packet(c.to[r] + i, data, c.flag);
    }
    reader_delay(block.rank == W - 1);
    uint32_t v[W] = {};
    bool other = false, arrived = true;
    FlagGlance<W> glance(c.epoch);
    if (c.first < words)
      arrived = take_word<W>(c.s, c.from, c.first, c.flag, info, v, other, &glance);
    if (confirm<W>(c.s, c.epoch, info, arrived, glance)) {
      bool ok = true;
      for (uint64_t i = c.first; i < words && ok; i += c.stride) {
        if (i != c.first) ok = take_word<W>(c.s, c.from, i, c.flag, info, v, other);
        if (ok) write_word<T>(sum_word<T, W>(v), out, n, i);
      }
      if (!__syncthreads_and(ok)) {
        fail_call<W>(c.s, c.epoch, info, false, FlagWait{}, block.signals[block.rank], nullptr);
      } else if (refresh_call(c.counts.count)) {
        // Every packet of this rank's generation: those of this thread's
        // words (taken), and past the call's words (no one's this call).
        uint64_t *mine = const_cast<uint64_t *>(c.from[0]);
        for (uint64_t i = c.first; i < capacity; i += c.stride)
#pragma unroll
          for (int r = 0; r < W; ++r) store_packet(mine + r * capacity + i, 0);
      }
    }
  }
  c.end();
}

// The LL two-shot all-reduce: as `ll`, with rank q owning shard q, `shard`
// words of the input (words past the input's end are pushed as 0 and never
// written).  Each source segment splits in two halves of `capacity / 2`
// packets: the shards pushed to their owner (the reduce-scatter), then the
// owners' sums pushed to every rank (the all-gather).  Thread t of block b
// handles shard word j = b * B + t + k * G * B (k = 0, 1, ..) on every rank:
// it pushes word q * shard + j of its input into rank q's first half, takes
// word j of its own shard from every source, sums it (sum_word: the bits of
// the one-shot) and pushes the sum into every rank's second half, then takes
// every rank's sum of word j and writes output word r * shard + j.  The host
// gives it inputs of at most W halves (shard <= capacity / 2, capacity even).
//
// Why it needs no barrier: as `ll`.  Each packet, in either half, is stored
// once per call by its source and read only by its owner's thread of the
// same j; q stores into p's generation g (either half) only in calls c with
// c & 1 == g, which start after q's call c - 1 waited for p's start flag of
// call c - 1, released after p's reads of call c - 2 (both halves) returned.
// The second half's packets are sums q computed from packets it took in
// this call after confirm.  (Alone, the two-shot would not need the second
// generation: q pushes call c + 1's shards only after it took every owner's
// sums of call c, pushed after the owners took every shard of call c, and
// its sums of call c + 1 only after it took p's shards of call c + 1, pushed
// after p's call c returned.  Calls that take turns with the one-shot, whose
// pushes wait for nothing, need it.)  In place, a thread writes only the output words
// r * shard + j of its own j, after it pushed the input words q * shard + j
// (the same words) in the first loop, and no other thread reads them.
template <typename T, int W>
PYAR_DEVICE void ll_twoshot(const void *x, void *out, const CommState *state, void *region,
                            uint64_t region_offset, uint64_t capacity, uint64_t n,
                            const CallInfo &info) {
  LLCall<W> c(state, region, info);
  const uint64_t words = input_words<T>(n);
  const uint64_t shard = (words + W - 1) / W;
  const uint64_t half = capacity / 2;
  if (announce<W>(c.epoch)) {
    const BlockState &block = block_state();
    c.begin(block, region, region_offset, capacity);
    for (uint64_t j = c.first; j < shard; j += c.stride) {
#pragma unroll
      for (int q = 0; q < W; ++q) {
        const uint64_t i = q * shard + j;
        push_packet(c.to[q] + j, i < words ? input_word<T>(x, n, i) : 0u, c.flag);
      }
    }
    reader_delay(block.rank == W - 1);
    uint32_t v[W] = {};
    bool other = false, arrived = true;
    FlagGlance<W> glance(c.epoch);
    if (c.first < shard)
      arrived = take_word<W>(c.s, c.from, c.first, c.flag, info, v, other, &glance);
    if (confirm<W>(c.s, c.epoch, info, arrived, glance)) {
      bool ok = true;
      for (uint64_t j = c.first; j < shard && ok; j += c.stride) {
        if (j != c.first) ok = take_word<W>(c.s, c.from, j, c.flag, info, v, other);
        if (!ok) break;
        const uint32_t sum = sum_word<T, W>(v);
#pragma unroll
        for (int q = 0; q < W; ++q) push_packet(c.to[q] + half + j, sum, c.flag);
      }
      for (uint64_t j = c.first; j < shard && ok; j += c.stride) {
        ok = take_word<W>(c.s, c.from, half + j, c.flag, info, v, other);
        if (!ok) break;
#pragma unroll
        for (int r = 0; r < W; ++r)
          if (r * shard + j < words) write_word<T>(v[r], out, n, r * shard + j);
      }
      if (!__syncthreads_and(ok)) {
        fail_call<W>(c.s, c.epoch, info, false, FlagWait{}, block.signals[block.rank], nullptr);
      } else if (refresh_call(c.counts.count)) {
        // Both halves of every source's segment, by the thread that takes
        // their packets (the same j).
        uint64_t *mine = const_cast<uint64_t *>(c.from[0]);
        for (uint64_t j = c.first; j < half; j += c.stride)
#pragma unroll
          for (int r = 0; r < W; ++r) {
            store_packet(mine + r * capacity + j, 0);
            store_packet(mine + r * capacity + half + j, 0);
          }
      }
    }
  }
  c.end();
}

}  // namespace pyar
