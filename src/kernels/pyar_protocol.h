// The cross-process protocol every pyar collective follows: the signal
// area, the per-block epochs and the barriers.  allreduce.cu and
// allreduce_rmsnorm.cu build their kernels on it; the sums they reduce with
// are in pyar_sums.h, and the start barrier of a kernel that stages its
// input in pyar_staging.h.
//
// Every rank owns one IPC-exported allocation holding a Signal area and two
// scratch regions (staged input, reduced shards of the two-shot kernels), and a local
// CommState describing every rank's allocation as mapped in its own process.
// Each call launches the same grid on every rank; block b of each rank meets
// block b of every peer at the barriers below.
//
// Barriers (docs/design.md, "The synchronization protocol"):
//   start  all ranks entered the call, so their inputs are complete;
//   mid    (two-shot, two-stage) every rank's reduced shard is written;
//   end    no peer still reads this rank's buffers: after it, the caller may
//          overwrite its input or the next call may restage the scratch.
// The start barrier also checks that every rank makes the same call: each
// rank's start flag carries a 32-bit digest of its call's signature (kind,
// element count, dtype, input mode: pyar/comm/layout.py encodes it) beside
// the epoch, so the one acquire load that sees a peer arrive also brings
// what it called, and the check costs no second round trip (call_digest
// says which disagreements it can miss: about one in 2^32).  Every rank's
// block b sees the same W digests, so on a disagreement every rank's block b
// records it and skips the call without touching a peer's memory (nor waits
// at its later barriers: none of its peers does either).  Only a failed
// start barrier stores the rank's full signature into its peers' Signals,
// for the error record: no call that agrees stores one.
// Leaving out `end` is the seed bug: a fast rank returns, reuses its input,
// and a slow peer still summing that input reads the new data.
//
// Flags are per block and per phase, 64-bit words: the epoch in the low
// half, and at the start barrier the call's digest in the high half (zero at
// the other phases).  Each rank keeps a per-block epoch in its own Signal (in
// device memory, so replayed graphs keep counting); a barrier stores its word
// into every peer's slot for (block, this rank) with a system-scope release
// and spins with acquire loads until its own slots for (block, peer) have
// reached the epoch.  A peer can never be a whole phase
// ahead (it would have to pass a barrier this rank has not reached -- for the
// start flag of the next call, this call's exit barrier), so with the exit
// barrier a slot holds exactly this epoch; the wrap-safe "reached" comparison
// keeps a barrier from missing an epoch that was overwritten by a later one,
// so that a kernel built without the exit barrier (the positive control)
// shows the seeds' bug as wrong sums rather than as a lost flag and a
// timeout.  The comparison is sound only while every slot holds an epoch less
// than 2^31 calls old, so each kernel's start barrier also stores the epoch
// into the slots of the phases it never waits at (keep_idle_slots_current):
// every slot is then at most one call old.  Spins are bounded: on expiry the
// block records which peers never arrived in host-visible memory and returns.
#pragma once

#include "pyar_device.h"

namespace pyar {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 256;
#ifndef PYAR_THREADS  // the host build (pyar_device_host.h) runs fewer
#define PYAR_THREADS 512
#endif
constexpr int kThreads = PYAR_THREADS;
constexpr uint64_t kGiveUpCheckNs = 1000000;  // waits shorter than this never read host memory

enum Phase { kStart = 0, kMid = 1, kEnd = 2, kPhases = 3 };

// The test builds' delays (a lagging rank, a lagging LL reader, a late
// staging copy): a busy wait of `ns` nanoseconds on now_ns's clock.
PYAR_DEVICE void busy_wait_ns(uint64_t ns) {
  const uint64_t since = now_ns();
  while (now_ns() - since < ns) {
  }
}

// The buffer's scratch follows the Signal (Communicator: at sizeof(Signal)),
// and a 16-byte pack there must be aligned.
struct alignas(16) Signal {
  // One word type for every phase: one pair of system-scope accessors, and
  // the slots of every phase indexed alike (the idle-slot filler, the epoch
  // hooks of the tests); a 64-bit aligned access costs what a 32-bit one does.
  uint64_t flags[kPhases][kMaxBlocks][kMaxRanks];
  uint32_t epoch[kMaxBlocks];
  // Nonzero once a call of the block failed (a barrier gave up or the ranks
  // disagreed): the block's later calls do nothing, so a rank that failed
  // never runs more than one call ahead of a slow peer (the communicator has
  // failed, and the host makes no new calls).
  uint32_t failed[kMaxBlocks];
  // Nonzero once any block of this rank failed a call (set with failed[b]):
  // split's kernel B, which waits for no peer, reads it from this rank's
  // own memory and writes nothing after a kernel A that failed (its sums
  // are stale); and every block's later calls do nothing, like the failed
  // block's (BlockEpoch::begin), so no block restages packs a peer that a
  // failed block gave up on may still read.  Sticky like failed[b].
  uint32_t some_block_failed;
  // [epoch & 1][block][rank]: rank's call, stored by a start barrier that
  // failed (barrier(): on a disagreement every rank's does) for the host's
  // error record; the reader waits until the slot holds the signature whose
  // digest the flag carried.  With the failure latch a block stores into
  // these slots in one call at most; the call's parity keeps the slot a
  // reader waits on apart from a later call's in builds without the latch
  // (PYAR_TEST_NO_FAILURE_LATCH).
  uint64_t signature[2][kMaxBlocks][kMaxRanks];
};

// The host writes this (pyar/comm/layout.py packs the same fields).
struct CommState {
  Signal *signals[kMaxRanks];  // every rank's Signal, as mapped here
  Pack16 *partial[kMaxRanks];  // every rank's two-shot scratch
  uint32_t *error;             // host memory, uint32 words: see barrier()
  uint32_t rank;
  uint32_t world;
};

// Words of the host error record (barrier() lists them).
constexpr int kErrorWords = 3 + 3 * kMaxRanks;

struct InputTable {
  const Pack16 *ptr[kMaxRanks];  // every rank's input for this call
};

// What a call passes besides the data pointers.
struct CallInfo {
  uint64_t timeout_ns;
  uint64_t signature;  // what the call is; every rank must pass the same
  uint32_t call;       // the host's sequence number, reported on failure
};

// Whether a flag word (the epoch in its low half) has reached `epoch`,
// across the 32-bit wrap.
PYAR_DEVICE bool reached(uint64_t word, uint32_t epoch) {
  const uint32_t value = uint32_t(word);
#if defined(PYAR_TEST_REACHED_UNSIGNED)  // the epoch-wrap tests' positive control
  if (PYAR_TEST_REACHED_UNSIGNED) return value >= epoch;
#endif
  return int32_t(value - epoch) >= 0;
}

// The 32-bit digest of a call signature that rides in the start flag's high
// half: the signature's low half (element count bits 0-31) xor murmur3's
// fmix32 of its high half (count bits 32-39, operation, dtype, input mode,
// quantization).  fmix32 is a bijection, so two calls that differ only in
// the low half, or only in the high half, always get different digests --
// above all two element counts below 2^32, the commonest mistake.  Calls
// differing in both halves collide only when the counts' xor equals the xor
// of the two mixed high halves, which fmix32's avalanche makes unrelated to
// any structure of the fields: about one pair in 2^32.  (The high halves of
// counts below 2^32 -- 7 operations, 3 dtypes, 2 input modes, 16
// quantization codes: 672 -- mix to values whose closest pair differs by
// 8101 in xor, computed when this was written: two calls whose counts are
// both below 4096 never collide.)  A collision is a disagreement the
// barrier misses: the call runs as it would without the check.
PYAR_DEVICE uint32_t call_digest(uint64_t signature) {
  uint32_t h = uint32_t(signature >> 32);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return uint32_t(signature) ^ h;
}

// The word a barrier stores: the digest in the high half (start; zero at
// the other phases), the epoch in the low half.
PYAR_DEVICE uint64_t flag_word(uint32_t epoch, uint32_t digest) {
  return uint64_t(digest) << 32 | epoch;
}

// Positive controls: a test-only build defines PYAR_TEST_SKIP_PHASE as kStart,
// kMid or kEnd to leave that barrier out of every kernel it compiles (the
// host build's mutation table, tests/test_protocol_host.py, and the GPU
// controls); PYAR_TEST_SKIP_EXIT_BARRIER is the older name of kEnd.
#if defined(PYAR_TEST_SKIP_EXIT_BARRIER) && !defined(PYAR_TEST_SKIP_PHASE)
#define PYAR_TEST_SKIP_PHASE kEnd
#endif

// The phases a kernel never waits at, one bit each (1 << phase), a
// compile-time property of the kernel: its start barrier keeps their slots
// current (keep_idle_slots_current).
constexpr uint32_t kNoIdlePhase = 0, kIdleMid = 1u << kMid, kIdleEnd = 1u << kEnd;

// Keeps this rank's slots at a peer current for the phases this kernel never
// waits at: `reached` is wrap-safe only while every slot holds an epoch less
// than 2^31 calls old, and a slot no call of a long run of, say, one-shot
// calls stored into would look reached after 2^31 of them -- the next
// two-shot call's `mid` would pass without waiting for its peers' shards.
// With these stores every slot of the block is at most one call old.  (64-bit
// epochs would also close it, but the start word's high half carries the
// call's digest; these are one or two stores a call.)
//
// Relaxed (volatile) stores of the word the phase's own barrier stores (the
// epoch, high half zero) are enough, and a filler never lets a waiting
// barrier pass early.  Rank r stores epoch e into its (phase X, block) slot
// at peer p only at the start of its call e, after its call e-1 returned; and
// r passed the start barrier of e-1 only after p's start flag of e-1, so p
// has finished call e-2.  Where can p wait on that slot?
//  - in call e: not at X; every rank runs the same kernel (a peer making
//    another call fails the start barrier's signature check and waits
//    nowhere after it);
//  - in a later call: for an epoch after e, which e has not reached;
//  - in call e-1, at X: then r passed X of e-1 itself and stored e-1 there
//    with a release before (in its previous kernel) -- the barrier's
//    condition, r arrived, holds already.  And the filler carries the
//    release's ordering: it is later in the slot's coherence order, stored
//    by r after the kernel whose release made every access before it
//    performed system-wide (the C++ release sequence before C++20; PTX's
//    release on M followed by a strong write on M; ThreadSanitizer keeps the
//    release's clock on the slot across a relaxed store).
// A block whose earlier call failed stores nothing (its start barrier
// returns first), and no later call of it waits anywhere.  The stores are
// issued just after the start flag's release: before it, the release would
// wait for them (it orders every earlier store of its thread), and nothing
// needs them sooner than the kernel's end.
template <uint32_t kIdle>
PYAR_DEVICE void keep_idle_slots_current(Signal *theirs, uint32_t rank, uint32_t epoch) {
  static_assert((kIdle & ~(kIdleMid | kIdleEnd)) == 0, "only mid and end may be idle");
#if defined(PYAR_TEST_NO_IDLE_FILL)  // the stale-slot tests' positive control
  if (PYAR_TEST_NO_IDLE_FILL) return;
#endif
  if constexpr ((kIdle & kIdleMid) != 0)
    store_volatile(&theirs->flags[kMid][blockIdx.x][rank], flag_word(epoch, 0));
  if constexpr ((kIdle & kIdleEnd) != 0)
    store_volatile(&theirs->flags[kEnd][blockIdx.x][rank], flag_word(epoch, 0));
}

// What a block's barriers need of the CommState, its call's epoch, and the
// digest of its call's signature: BlockEpoch::begin copies the first two and
// computes the third into shared memory once a call.  A barrier
// reading the state itself would load it from global memory after each of
// its release and acquire (compiler barriers) and each store through a
// Signal pointer (which may alias it): the rank, then its Signal, two
// dependent round trips before an acquire could be issued, two more before
// the epoch's store at the kernel's end (every one on the critical path of
// a latency-bound call).  From here the addresses are registers: a barrier's
// release follows the block's synchronization, its other stores and the
// acquire follow the release, nothing waits for the state.
struct BlockState {
  Signal *signals[kMaxRanks];  // CommState::signals
  uint32_t rank;
  uint32_t epoch;   // this call's
  uint32_t failed;  // Signal::failed of the block when the call began
  uint32_t digest;  // call_digest of the call's signature; 0 where !signature_checked()
};

PYAR_DEVICE BlockState &block_state() {
  __shared__ BlockState state;
  return state;
}

// Whether an earlier call of this block failed (BlockEpoch::begin reads it).
PYAR_DEVICE uint32_t block_failed() { return block_state().failed; }

// The pieces of the start barrier that benchmarks/signature_cost.py prices by
// leaving each out of a test-only build (with PYAR_TEST_NO_IDLE_FILL):
// PYAR_TEST_NO_SIGNATURE=1 -- no digest is computed: every flag carries 0,
// so no comparison disagrees (a call that agrees stores no signature either
// way);
// PYAR_TEST_NO_FAILURE_LATCH=1 -- a call
// neither reads nor sets Signal::failed (nor some_block_failed).  Neither is
// a positive control: such kernels run correct calls correctly and miss the
// failures the pieces are there for.
PYAR_DEVICE bool signature_checked() {
#if defined(PYAR_TEST_NO_SIGNATURE)
  if (PYAR_TEST_NO_SIGNATURE) return false;
#endif
  return true;
}

PYAR_DEVICE bool failure_latched() {
#if defined(PYAR_TEST_NO_FAILURE_LATCH)
  if (PYAR_TEST_NO_FAILURE_LATCH) return false;
#endif
  return true;
}

// Whether a peer's call differs from this rank's, by their digests.
PYAR_DEVICE bool disagree(uint32_t theirs, uint32_t mine) {
#if defined(PYAR_TEST_IGNORE_SIGNATURE)  // the mismatch tests' positive control
  if (PYAR_TEST_IGNORE_SIGNATURE) return false;
#endif
  return theirs != mine;
}

// Host error record (pinned memory, uint32 words), written by a failing
// block and read by the host after the call:
//   [0]                  failed (timeout or disagreement): spinning blocks
//                        of this and later calls give up when they see it
//   [1 + r]              rank r never arrived (timeout)
//   [1 + kMaxRanks]      the call's sequence number
//   [2 + kMaxRanks]      1: the ranks' signatures differ
//   [3 + kMaxRanks + 2r] and the word after: low and high half of rank r's
//                        signature (on a disagreement)
//
// What thread `peer` (< W) of a block saw of its peer's flag slot.
struct FlagWait {
  uint64_t seen = 0;  // the slot's last value
  int arrived = 1;    // it reached the epoch before the timeout
  int differs = 0;    // at the start barrier: it carries another call's digest
  int passed = 1;     // arrived and agrees
};

// The error words of a peer that never arrived (timeout).
PYAR_DEVICE void record_timeout(const CommState &s, uint32_t peer, const CallInfo &info) {
  store_volatile(&s.error[1 + peer], 1u);
  store_volatile(&s.error[1 + kMaxRanks], info.call);
  store_volatile(&s.error[0], 1u);
}

// After a failure the host refuses new calls, but calls already queued
// behind it would each wait a whole timeout for peers that gave up: they
// stop as soon as they see the error record.  So do a failed block's
// siblings in its own call, by the rank's latch (set before a disagreeing
// block waits for its peers' signatures).  Read only after kGiveUpCheckNs
// of waiting.
PYAR_DEVICE bool call_abandoned(const CommState &s, const Signal *my_signal) {
  return load_volatile(&my_signal->some_block_failed) || load_volatile(&s.error[0]);
}

// Spins with acquire loads until `mine`, this rank's slot for `peer`, has
// reached `epoch`.  A peer making the same call stores the very word this
// rank stores (`word`): a load that sees it passes with no further test, at
// the first load or in the spin, so the digest costs no instruction between
// the acquire and the block's vote.  Any other word that reached the epoch
// is classified (`judge`); one that never reaches it fails the barrier.
// `seen`: the slot's first value, loaded with an acquire by the caller (a
// load already in flight beside others: pyar_lamport.h's FlagGlance).
PYAR_DEVICE FlagWait wait_for_flag(const CommState &s, const Signal *my_signal,
                                   const uint64_t *mine, uint32_t peer, uint64_t word,
                                   uint32_t epoch, bool check, uint32_t digest,
                                   const CallInfo &info, uint64_t seen) {
  FlagWait w;
  // The word that reached the epoch is the peer's start flag of this call:
  // the same acquire brought the peer's digest in its high half.  Only a
  // build without the kernel's last barrier (a positive control), or a
  // kernel that has none (pyar_lamport.h), lets a peer pass this call and
  // store its next call's word first; the check then passes, rightly: that
  // peer passed this call's start only after seeing this rank's flag of
  // this call, so it compared the two digests itself.  (With the last
  // barrier the peer's next flag needs this rank there; after a
  // disagreement the peer's later calls store no flag.)
  const auto judge = [&] {
    if (check && uint32_t(w.seen) == epoch) w.differs = disagree(uint32_t(w.seen >> 32), digest);
    w.passed = !w.differs;
  };
  w.seen = seen;
  if (w.seen != word) {
    if (reached(w.seen, epoch)) {
      judge();
    } else {
      const uint64_t since = now_ns();
      for (;;) {
        w.seen = load_acquire_system(mine);
        if (w.seen == word) break;
        if (reached(w.seen, epoch)) {
          judge();
          break;
        }
        const uint64_t waited = now_ns() - since;
        if (waited > info.timeout_ns) {
          record_timeout(s, peer, info);
          w.arrived = w.passed = 0;
          break;
        }
        if (waited > kGiveUpCheckNs && call_abandoned(s, my_signal)) {
          w.arrived = w.passed = 0;
          break;
        }
      }
    }
  }
  return w;
}

PYAR_DEVICE FlagWait wait_for_flag(const CommState &s, const Signal *my_signal,
                                   const uint64_t *mine, uint32_t peer, uint64_t word,
                                   uint32_t epoch, bool check, uint32_t digest,
                                   const CallInfo &info) {
  return wait_for_flag(s, my_signal, mine, peer, word, epoch, check, digest, info,
                       load_acquire_system(mine));
}

// The rest of a block's call after a barrier it failed (every thread of the
// block calls it; `w` is what thread `peer` < W saw, `theirs_signal` that
// peer's Signal; `check`: it was the start barrier, whose flags carry the
// calls' digests): latch the failure, and on a disagreement record the
// ranks' calls for the host.
template <int W>
PYAR_DEVICE void fail_call(const CommState &s, uint32_t epoch, const CallInfo &info, bool check,
                           const FlagWait &w, Signal *my_signal, Signal *theirs_signal) {
  const BlockState &block = block_state();
  if (threadIdx.x == 0 && failure_latched()) {
    my_signal->failed[blockIdx.x] = 1u;
    store_volatile(&my_signal->some_block_failed, 1u);  // other blocks may store it too
  }
  // The ranks' exact calls, for the host's MismatchError.  Every block that
  // fails its start barrier stores this rank's call into every peer's Signal
  // (where its start flag went already; a peer whose flag it never saw may
  // still have seen its own): if two ranks' digests differ, every rank's
  // differs from some peer's (one that agreed with every peer would make them
  // all agree), but a block may also fail first by giving up on a rank whose
  // block skipped the call (a sibling block of that rank failed before it
  // began, or this rank's did).
  if (check && threadIdx.x < W)
    store_volatile(&theirs_signal->signature[epoch & 1][blockIdx.x][block.rank], info.signature);
  if (check && __syncthreads_or(w.differs)) {  // the slow path only: a failed call
    // Every arrived peer's, with the digest its flag carried.  The peer's
    // block fails too (it sees the flag that made this one differ, or gives
    // up waiting for it), and stores it then: within microseconds of the
    // disagreement, or once it gives up on a rank whose block skipped the
    // call (kGiveUpCheckNs into its wait), at the latest at its own timeout.
    // One that does not come within the call's timeout is left unrecorded:
    // the record's words stay 0 ("not seen") unless another block of this
    // rank saw it.
    if (threadIdx.x < W && w.arrived && uint32_t(w.seen) == epoch) {
      const uint64_t *slot = &my_signal->signature[epoch & 1][blockIdx.x][threadIdx.x];
      const uint64_t since = now_ns();
      const uint32_t digest_seen = uint32_t(w.seen >> 32);
      uint64_t theirs;
      do theirs = load_volatile(slot);
      while (call_digest(theirs) != digest_seen && now_ns() - since < info.timeout_ns);
      if (call_digest(theirs) == digest_seen) {
        store_volatile(&s.error[3 + kMaxRanks + 2 * threadIdx.x], uint32_t(theirs));
        store_volatile(&s.error[4 + kMaxRanks + 2 * threadIdx.x], uint32_t(theirs >> 32));
      }
    }
    if (threadIdx.x == 0) {
      store_volatile(&s.error[2 + kMaxRanks], 1u);
      store_volatile(&s.error[1 + kMaxRanks], info.call);
      store_volatile(&s.error[0], 1u);
    }
  }
}

// Returns whether every peer arrived (and, at the start barrier, made the
// same call); when not, the block skips the rest of the call.
// kIdle: at the start barrier, the kernel's idle phases (keep_idle_slots_current).
template <int W, uint32_t kIdle = kNoIdlePhase>
PYAR_DEVICE bool barrier(const CommState &s, Phase phase, uint32_t epoch, const CallInfo &info) {
#if defined(PYAR_TEST_SKIP_PHASE)
  if (phase == PYAR_TEST_SKIP_PHASE) return true;
#endif
  const BlockState &block = block_state();
  if (phase == kStart && block.failed) return false;
  const bool check = phase == kStart && signature_checked();
  const uint32_t peer = threadIdx.x;
  const uint32_t rank = block.rank;
  const uint32_t digest = check ? block.digest : 0;
  Signal *const my_signal = block.signals[rank];
  Signal *theirs_signal = nullptr;
  uint64_t *flag = nullptr;
  const uint64_t *mine = nullptr;
  if (peer < W) {
    // Every address first (from the block's copy of the state): after the
    // block's synchronization only the release is in flight at the flag
    // store (what the negative fixture of the machine-code check relies on).
    theirs_signal = block.signals[peer];
    flag = &theirs_signal->flags[phase][blockIdx.x][rank];
    mine = &my_signal->flags[phase][blockIdx.x][peer];
  }
  sync_block_before_release();  // the block's earlier reads and writes precede the release
  FlagWait w;
  if (peer < W) {
    const uint64_t word = flag_word(epoch, digest);
    store_release_system(flag, word);
    if (phase == kStart) keep_idle_slots_current<kIdle>(theirs_signal, rank, epoch);
    w = wait_for_flag(s, my_signal, mine, peer, word, epoch, check, digest, info);
  }
  // and the acquire precedes the block's later accesses
  if (__syncthreads_and(w.passed)) {
#if defined(PYAR_TEST_LAG_RANK)
    // The lagging builds (tests/gpu/conftest.py): rank PYAR_TEST_LAG_RANK's
    // blocks start reading PYAR_TEST_LAG_NS after every rank passed the start
    // barrier, a lag that only the exit barrier keeps from turning into reads
    // of inputs their owners already reused.  (Ranks sharing one GPU read at
    // one pace; no competing kernel reliably puts one a graph node behind.)
    if (phase == kStart && rank == PYAR_TEST_LAG_RANK) busy_wait_ns(PYAR_TEST_LAG_NS);
#endif
    return true;
  }
  fail_call<W>(s, epoch, info, check, w, my_signal, theirs_signal);
  return false;
}

struct BlockEpoch {
  // The block's copy of the state (BlockState), and this call's epoch.
  // Thread r < kMaxRanks loads rank r's Signal and the rank in one round
  // trip; thread `rank` then holds this rank's Signal and loads the epoch
  // and the failure latches (the block's, and the rank's that other blocks
  // store) side by side, before any store to shared memory (which a generic
  // load could not pass); it hashes the call's signature into its digest
  // while they are in flight, off the start barrier's critical path.
  PYAR_DEVICE static uint32_t begin(const CommState &s, const CallInfo &info) {
    BlockState &block = block_state();
    if (threadIdx.x < kMaxRanks) {
      Signal *const signal = s.signals[threadIdx.x];
      const uint32_t rank = s.rank;
      if (threadIdx.x == rank) {
        const uint32_t epoch = signal->epoch[blockIdx.x] + 1;
        const uint32_t failed =
            failure_latched()
                ? signal->failed[blockIdx.x] | load_volatile(&signal->some_block_failed)
                : 0u;
        block.rank = rank;
        block.epoch = epoch;
        block.failed = failed;
        block.digest = signature_checked() ? call_digest(info.signature) : 0u;
      }
      block.signals[threadIdx.x] = signal;
    }
    __syncthreads();
    return block.epoch;
  }
  // Stores the call's epoch (the block's copy, from begin) into this rank's
  // Signal, through the block's copy of its address.
  PYAR_DEVICE static void commit() {
    const BlockState &block = block_state();
    if (threadIdx.x == 0) block.signals[block.rank]->epoch[blockIdx.x] = block.epoch;
  }
};

// Every kernel opens with this, naming the phases it never waits at.
template <int W, uint32_t kIdle>
PYAR_DEVICE bool start_barrier(const CommState &s, uint32_t epoch, const CallInfo &info) {
  return barrier<W, kIdle>(s, kStart, epoch, info);
}

template <int W>
PYAR_DEVICE void exit_barrier(const CommState &s, uint32_t epoch, const CallInfo &info) {
  barrier<W>(s, kEnd, epoch, info);
}

}  // namespace pyar
