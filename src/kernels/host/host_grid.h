// The execution model of a GPU grid on the host, for the host build of the
// kernels (pyar_device_host.h): every block is one OS thread, and the block's
// GPU threads ("lanes") are user-level fibers (ucontext) of it that switch
// only where GPU threads meet -- __syncthreads and warp shuffles -- and where
// a lane spins on a flag or is delayed on purpose.  So a block's lanes share
// its `__shared__` variables (thread_local statics of the block's OS thread),
// blocks and ranks run truly concurrently, and ThreadSanitizer sees every
// access between blocks and ranks that the protocol does not order.
//
// For ThreadSanitizer a block is one thread: its lanes run one at a time on
// it, so everything a lane did before a switch precedes what the next lane
// does after it -- at least the ordering the GPU gives a block's threads.
// This build checks the protocol between blocks and ranks, not races inside
// a block.  The switches are not announced to TSan as fibers: with every
// lane a TSan fiber, each switch cost a vector-clock merge over all of them
// (six times slower overall), and bought nothing but per-lane stacks in
// reports.
#pragma once

#include <ucontext.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace pyar {
namespace host {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// How often and how long lanes and blocks are held back at random, to vary
// the interleavings (the host's stand-in for the GPU's scheduling noise).
struct Jitter {
  uint32_t one_in = 0;        // a delay point fires once in this many (0: never)
  uint32_t max_sleep_us = 0;  // a fired delay sleeps up to this long (0: switches lane)
  uint64_t seed = 0;
};

inline Jitter &jitter_settings() {
  static Jitter settings;
  return settings;
}

enum class LaneState { kRunnable, kAtBarrier, kAtShuffle, kDone };

constexpr size_t kLaneStackBytes = 256 << 10;
constexpr uint32_t kHostWarpSize = 32;

struct Lane {
  ucontext_t context;
  Dim3 index;
  LaneState state = LaneState::kRunnable;
  int vote = 0;       // __syncthreads_and: the lane's argument, then the block's AND
  float value = 0.f;  // shuffle: the lane's value, then its partner's
  int mask = 0;
  std::unique_ptr<char[]> stack;
};

struct Block {
  Dim3 index, dim, grid;
  std::vector<Lane> lanes;
  ucontext_t scheduler;
  Lane *current = nullptr;
  const std::function<void()> *body = nullptr;
  std::mt19937_64 random;
};

inline Block *&this_block() {
  static thread_local Block *block = nullptr;
  return block;
}

inline Lane &this_lane() { return *this_block()->current; }

// Back to the block's scheduler; returns when the scheduler resumes this lane.
inline void switch_to_scheduler() {
  Block &b = *this_block();
  Lane &lane = *b.current;
  swapcontext(&lane.context, &b.scheduler);
}

inline void resume(Block &b, Lane &lane) {
  b.current = &lane;
  swapcontext(&b.scheduler, &lane.context);
  b.current = nullptr;
}

inline void run_lane() {
  Block &b = *this_block();
  (*b.body)();
  b.current->state = LaneState::kDone;
  switch_to_scheduler();  // never resumed
  std::abort();
}

[[noreturn]] inline void fail(const char *what) {
  Block &b = *this_block();
  std::fprintf(stderr, "host grid: block %u: %s\n", b.index.x, what);
  std::abort();
}

// Completes the warps whose lanes all wait at a shuffle, then the block
// barrier once every lane waits there (lanes that returned count as
// arrived).  Returns whether any lane became runnable.
inline bool meet(Block &b) {
  bool released = false;
  const size_t n = b.lanes.size();
  for (size_t first = 0; first < n; first += kHostWarpSize) {
    const size_t end = first + kHostWarpSize < n ? first + kHostWarpSize : n;
    bool all = true;
    for (size_t i = first; i < end; ++i) all &= b.lanes[i].state == LaneState::kAtShuffle;
    if (!all) continue;
    float values[kHostWarpSize];
    for (size_t i = first; i < end; ++i) values[i - first] = b.lanes[i].value;
    for (size_t i = first; i < end; ++i) {
      const size_t partner = (i - first) ^ size_t(b.lanes[i].mask);
      if (b.lanes[i].mask != b.lanes[first].mask || first + partner >= end)
        fail("a warp shuffles with different or out-of-warp masks");
      b.lanes[i].value = values[partner];
      b.lanes[i].state = LaneState::kRunnable;
    }
    released = true;
  }
  bool all_at_barrier = true, any_at_barrier = false;
  int vote = 1;
  for (Lane &lane : b.lanes) {
    if (lane.state == LaneState::kAtBarrier) {
      any_at_barrier = true;
      vote &= lane.vote != 0;
    } else if (lane.state != LaneState::kDone) {
      all_at_barrier = false;
    }
  }
  if (any_at_barrier && all_at_barrier) {
    for (Lane &lane : b.lanes) {
      if (lane.state != LaneState::kAtBarrier) continue;
      lane.vote = vote;
      lane.state = LaneState::kRunnable;
    }
    released = true;
  }
  return released;
}

inline void sleep_us(uint32_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

// Runs the block's lanes until all have returned.  A round resumes every
// runnable lane once; a round in which lanes only spun yields the CPU to the
// other blocks (and sleeps now and then: 2 cores may run 8 ranks' blocks).
inline void schedule(Block &b) {
  uint32_t idle = 0;
  for (;;) {
    bool ran = false, progress = false, done = true;
    for (Lane &lane : b.lanes) {
      if (lane.state != LaneState::kRunnable) continue;
      ran = true;
      resume(b, lane);
      progress |= lane.state != LaneState::kRunnable;
    }
    progress |= meet(b);
    for (Lane &lane : b.lanes) done &= lane.state == LaneState::kDone;
    if (done) return;
    if (!ran && !progress) fail("lanes wait at different meeting points (divergent __syncthreads)");
    if (progress) {
      idle = 0;
    } else if (++idle % 64 == 0) {
      sleep_us(50);
    } else {
      std::this_thread::yield();
    }
  }
}

// A block's OS thread, kept for the launches of one stream: its lanes'
// stacks are allocated once.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void start(Dim3 index, Dim3 dim, Dim3 grid, const std::function<void()> &body) {
    std::lock_guard<std::mutex> lock(mutex_);
    block_.index = index;
    block_.dim = dim;
    block_.grid = grid;
    block_.body = &body;
    done_ = false;
    wake_.notify_all();
  }

  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [this] { return done_; });
  }

 private:
  void loop() {
    Block &b = block_;
    this_block() = &b;
    b.random.seed(jitter_settings().seed * 1000003u +
                  std::hash<std::thread::id>()(std::this_thread::get_id()));
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this, &b] { return stop_ || b.body != nullptr; });
        if (stop_) break;
      }
      prepare_lanes(b);
      schedule(b);
      std::lock_guard<std::mutex> lock(mutex_);
      b.body = nullptr;
      done_ = true;
      wake_.notify_all();
    }
    this_block() = nullptr;
  }

  static void prepare_lanes(Block &b) {
    const size_t had = b.lanes.size();
    if (had < b.dim.x) b.lanes.resize(b.dim.x);
    for (size_t t = 0; t < b.lanes.size(); ++t) {
      Lane &lane = b.lanes[t];
      if (t >= had) {
        lane.stack.reset(new char[kLaneStackBytes]);
      }
      lane.index.x = uint32_t(t);
      lane.state = t < b.dim.x ? LaneState::kRunnable : LaneState::kDone;
      getcontext(&lane.context);
      lane.context.uc_stack.ss_sp = lane.stack.get();
      lane.context.uc_stack.ss_size = kLaneStackBytes;
      lane.context.uc_link = nullptr;
      makecontext(&lane.context, run_lane, 0);
    }
  }

  Block block_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = true, stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// A kernel launch from the calling thread (a rank's stream): `body` runs once
// per GPU thread of `grid` x `block` (1-D), and launch returns when every
// block has returned -- a stream-ordered launch followed by its completion.
inline void launch(uint32_t grid, uint32_t block, const std::function<void()> &body) {
  static thread_local std::vector<std::unique_ptr<Worker>> workers;
  while (workers.size() < grid) workers.emplace_back(new Worker);
  Dim3 dim, size;
  dim.x = block;
  size.x = grid;
  for (uint32_t i = 0; i < grid; ++i) {
    Dim3 index;
    index.x = i;
    workers[i]->start(index, dim, size, body);
  }
  for (uint32_t i = 0; i < grid; ++i) workers[i]->wait();
}

// --- what the device functions of pyar_device_host.h call ---------------------

inline int sync_block(int vote) {
  Lane &lane = this_lane();
  lane.vote = vote;
  lane.state = LaneState::kAtBarrier;
  switch_to_scheduler();
  return lane.vote;
}

inline float shuffle_xor(float value, int mask) {
  Lane &lane = this_lane();
  lane.value = value;
  lane.mask = mask;
  lane.state = LaneState::kAtShuffle;
  switch_to_scheduler();
  return lane.value;
}

// Lets the block's other lanes run (a spinning lane does not hold its block).
inline void yield_lane() { switch_to_scheduler(); }

// A delay point: once in `one_in`, sleeps (holding the block back) or lets
// the other lanes run first.
inline void maybe_delay() {
  const Jitter &j = jitter_settings();
  Block *b = this_block();
  if (j.one_in == 0 || b == nullptr || b->random() % j.one_in != 0) return;
  if (j.max_sleep_us) sleep_us(uint32_t(b->random() % j.max_sleep_us));
  yield_lane();
}

}  // namespace host
}  // namespace pyar
