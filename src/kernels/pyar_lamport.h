// Pushed data that is its own flag (the "Lamport" protocol of TensorRT-LLM's
// small all-reduces): every rank stores its input into every rank's receive
// slot, and a rank reads only its own slot, polling until no word of a pack
// holds the empty value.  No rank ever reads a peer's memory, so no barrier
// orders a peer's reads before this rank reuses its input, and the call has
// neither a start barrier before its data moves nor an exit barrier:
// allreduce_rmsnorm.cu's `lamport` kernel states why each is safe to leave
// out (rule 1).
//
// Each rank owns a receive region (the host places it after the two-shot
// scratch, Communicator._lamport_offset):
//   uint32_t calls[kMaxBlocks]        Lamport calls so far, equal in every
//                                     entry between calls (see LamportSlots)
//   Pack16 slot[2][W][segment]        slot s, source rank r: r's pushed rows
// Every word of both slots holds kEmptyWord between the calls that use it:
// the host fills them once, and a reader stores kEmptyWord back over every
// pack it consumed.
#pragma once

#include "pyar_protocol.h"

namespace pyar {

// The lagging reader of the test builds (PYAR_TEST_READER_DELAY_NS): in every
// call the last rank's blocks wait that long after their pushes before they
// take anything, so its peers finish the call and start the next one
// meanwhile -- the load under which one generation (LL) or one slot
// (lamport) must fail and the shipped kernels must not (the GPU's LL
// control: tests/gpu/conftest.py; the host's: tests/test_ll_host.py,
// tests/test_lamport_host.py).
PYAR_DEVICE void reader_delay(bool lagging) {
#if defined(PYAR_TEST_READER_DELAY_NS)
  if (lagging) busy_wait_ns(PYAR_TEST_READER_DELAY_NS);
#else
  (void)lagging;
#endif
}

// float32 -0.0; for 16-bit types the pair (+0.0, -0.0).  A 16-byte store may
// reach a reader in pieces, but each aligned 32-bit word as a whole (PTX
// vector accesses, AMD dword accesses), so emptiness is judged word by word.
constexpr uint32_t kEmptyWord = 0x80000000u;
constexpr int kLamportHeaderBytes = kMaxBlocks * 4;
constexpr int kLamportSlots = 2;
static_assert(kLamportHeaderBytes % 16 == 0, "the slots must stay 16-byte aligned");

// A pack as pushed: a word equal to kEmptyWord becomes +0.0 (float32 -0.0,
// or the high element -0.0 of a 16-bit pair), the only change the protocol
// makes to the data.  A sum differs only where every rank's element is -0.0:
// +0.0 instead of -0.0.
PYAR_DEVICE Pack16 pushable(Pack16 v) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (v.w[j] == kEmptyWord) v.w[j] = 0u;
  return v;
}

PYAR_DEVICE bool written(const Pack16 &v) {
  return v.w[0] != kEmptyWord && v.w[1] != kEmptyWord && v.w[2] != kEmptyWord &&
         v.w[3] != kEmptyWord;
}

PYAR_DEVICE Pack16 empty_pack() { return Pack16{{kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord}}; }

// The slot of this call and the counters behind it.  Every block of a rank
// reads its own entry at the start; after the call, block b stores the next
// count into entries b, b + G, b + 2G, .. (G blocks), so every entry holds
// the same count again whatever grid the next call launches, and no entry
// is stored to while another block of the call may still read it.  All
// ranks make the same calls, so a call's count -- and slot -- is the same
// on every rank.
struct LamportSlots {
  uint32_t *calls;  // this rank's region
  uint32_t count;   // this call's

  PYAR_DEVICE LamportSlots(void *region) : calls(static_cast<uint32_t *>(region)) {
    count = calls[blockIdx.x];
  }
  PYAR_DEVICE uint32_t slot() const {
#if defined(PYAR_TEST_LAMPORT_ONE_SLOT)  // the host build's control: every call in slot 0
    if (PYAR_TEST_LAMPORT_ONE_SLOT) return 0;
#endif
    return count & (kLamportSlots - 1);
  }
  PYAR_DEVICE void advance() const {
    const uint32_t entry = blockIdx.x + threadIdx.x * gridDim.x;
    if (entry < kMaxBlocks) calls[entry] = count + 1;
  }
};

// The start flag of a call that waits at no barrier: stored before the
// block pushes anything, so that it is usually visible by the time its data
// is; the mid and end slots are kept current as every kernel's start
// barrier keeps the phases it never waits at.  Returns false when an earlier
// call of the block failed: the block then does nothing.
//
// The flag publishes nothing of this call, yet it is released as a barrier
// releases one, after the block's synchronization (on AMD each wave's own
// accesses complete first): rule 6's shape, which tests/machine_code.py
// reads at every release alike.
template <int W>
PYAR_DEVICE bool announce(uint32_t epoch) {
  const BlockState &block = block_state();
  if (block.failed) return false;
  Signal *const theirs = threadIdx.x < W ? block.signals[threadIdx.x] : nullptr;
  sync_block_before_release();
  if (threadIdx.x < W) {
    store_release_system(&theirs->flags[kStart][blockIdx.x][block.rank],
                         flag_word(epoch, signature_checked() ? block.digest : 0));
    keep_idle_slots_current<kIdleMid | kIdleEnd>(theirs, block.rank, epoch);
  }
  return true;
}

// Thread t < W's look at peer t's start flag of the block (this rank's
// slot for it), taken with an acquire beside the polls of the block's first
// data (take_packs, pyar_ll.h's take_word): the load that finds the data
// written has a flag load next to it, which has usually found the flag too,
// since each peer stores its flag before it pushes.  confirm() then needs
// no round trip of its own to memory; a flag not seen yet is waited for
// there.  Before any load `seen` holds the previous epoch's word, which
// confirm waits past.  (The slot's address is recomputed at each load: the
// glance lives through the polls, where the registers of the larger worlds
// are full.)
template <int W>
struct FlagGlance {
  uint64_t seen;
  PYAR_DEVICE explicit FlagGlance(uint32_t epoch) : seen(flag_word(epoch - 1, 0)) {}
  PYAR_DEVICE void load() {
    if (threadIdx.x < W) seen = load_acquire_system(slot());
  }
  PYAR_DEVICE static const uint64_t *slot() {
    const BlockState &block = block_state();
    return &block.signals[block.rank]->flags[kStart][blockIdx.x][threadIdx.x];
  }
};

// The start barrier's checks, made once the block's first data has come:
// every peer's start flag of this call has arrived and carries this call's
// digest, and every thread's data arrived (`arrived`: the thread's polls
// ended before the timeout).  A block that fails records it as a failed
// start barrier does, and writes nothing.  `glance`: the flags as the
// polls of the block's first data last saw them.
template <int W>
PYAR_DEVICE bool confirm(const CommState &s, uint32_t epoch, const CallInfo &info, bool arrived,
                         const FlagGlance<W> &glance) {
  const BlockState &block = block_state();
  const bool check = signature_checked();
  FlagWait w;
  if (threadIdx.x < W) {
    w = wait_for_flag(s, block.signals[block.rank], FlagGlance<W>::slot(), threadIdx.x,
                      flag_word(epoch, check ? block.digest : 0), epoch, check,
                      check ? block.digest : 0, info, glance.seen);
  }
  if (__syncthreads_and(w.passed && arrived)) return true;
  fail_call<W>(s, epoch, info, check, w, block.signals[block.rank],
               threadIdx.x < W ? block.signals[threadIdx.x] : nullptr);
  return false;
}

// Whether a rank whose data is missing has started another call than this
// one: its start flag carries this call's epoch and another digest.  That
// rank pushes other rows or none, and its own start barrier fails on this
// rank's flag; confirm() then records the disagreement (the slow path of a
// wait only: it spares the timeout).  A build without the signature
// (PYAR_TEST_NO_SIGNATURE) compares too: its flags all carry digest 0, so
// none disagrees, and ptxas of CUDA 13.0 fails register allocation on the LL
// kernels when this comparison is compiled out (C7600).
PYAR_DEVICE bool makes_another_call(uint32_t missing) {
#if defined(PYAR_TEST_IGNORE_SIGNATURE)  // no digest compared: no other call seen
  if (PYAR_TEST_IGNORE_SIGNATURE) return false;
#endif
  const BlockState &block = block_state();
  const Signal *mine = block.signals[block.rank];
  for (int r = 0; r < kMaxRanks; ++r) {
    if (!((missing >> r) & 1u)) continue;
    const uint64_t seen = load_acquire_system(&mine->flags[kStart][blockIdx.x][r]);
    if (uint32_t(seen) == block.epoch && disagree(uint32_t(seen >> 32), block.digest))
      return true;
  }
  return false;
}

// Waits until pack `i` of sources first .. first + count - 1 (count <= N;
// `from`: the slot, `segment` packs apart) is written, takes it into v, and stores kEmptyWord
// back over it.  Returns false if some source's pack did not come within the
// timeout (its rank is recorded as one that never arrived), or the call was
// abandoned.  `glance` (may be null) is loaded after every round of polls is
// issued (an acquire holds back the loads after it, not those before).
template <int N, int W>
PYAR_DEVICE bool take_packs(const CommState &s, const Pack16 *from, uint64_t segment,
                            uint64_t i, int first, int count, const CallInfo &info,
                            Pack16 (&v)[N], FlagGlance<W> *glance) {
  uint32_t missing = 0;
#pragma unroll
  for (int r = 0; r < N; ++r)
    if (r < count) v[r] = poll_pack(from + (first + r) * segment + i);
  if (glance) glance->load();
#pragma unroll
  for (int r = 0; r < N; ++r)
    if (r < count) missing |= uint32_t(!written(v[r])) << r;
  bool ok = true;
  if (missing) {
    const uint64_t since = now_ns();
    const BlockState &block = block_state();
    while (missing) {
#pragma unroll
      for (int r = 0; r < N; ++r)
        if ((missing >> r) & 1u) v[r] = poll_pack(from + (first + r) * segment + i);
      if (glance) glance->load();
#pragma unroll
      for (int r = 0; r < N; ++r)
        if (((missing >> r) & 1u) && written(v[r])) missing &= ~(1u << r);
      const uint64_t waited = now_ns() - since;
      if (missing && waited > info.timeout_ns) {
#pragma unroll
        for (int r = 0; r < N; ++r)
          if ((missing >> r) & 1u) record_timeout(s, first + r, info);
        ok = false;
        break;
      }
      if (missing && waited > kGiveUpCheckNs &&
          (call_abandoned(s, block.signals[block.rank]) ||
           makes_another_call(missing << first))) {
        ok = false;
        break;
      }
    }
  }
#if defined(PYAR_TEST_LAMPORT_KEEP_DATA)  // the stale-slot positive control
  if (PYAR_TEST_LAMPORT_KEEP_DATA) return ok;
#endif
  Pack16 *slot = const_cast<Pack16 *>(from);
#pragma unroll
  for (int r = 0; r < N; ++r)
    if (r < count) push_pack(slot + (first + r) * segment + i, empty_pack());
  return ok;
}

}  // namespace pyar
