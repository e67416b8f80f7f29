// FenceEngine: what a device cache keeps about fences beyond each shard's FenceQueue (docs/design.md,
// "Fences: batching and pipelining", and "Stream rules" rule 6): the pool of events fences are recorded
// with, the uses recorded on streams while they captured a graph (the capture rule), and the pacing of
// fence passes: frees with uses pass over their streams' fences at most once per kFenceBatchWindow, the
// allocation path polls pending blocks at most once per tick of the coarse clock, and while a pass or
// a poll runs the blocks it releases are parked in their owners' hot lists (parks_released). The
// pacing, the fences' times and the free times of pending blocks read the engine's clock (now(),
// coarse_now()): the host's, or the backend's replay clock (Backend::replay_clock), which a replay of a
// recorded job sets to the job's time so that passes and polls fall where the job's did.
//
// The passes themselves walk the shards, count stats and tell the aids, so they are the cache's
// (device_cache_fences.cpp); they ask this engine when to run and record with its events. Every method
// runs under the device lock.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "block.hpp"
#include "fence_queue.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class FenceEngine {
 public:
  // A miss fences its own stream's batch of owned free blocks at most once per interval: those blocks
  // serve the stream without a fence (DeviceCache::defers_own_batch).
  static constexpr std::chrono::milliseconds kOwnBatchInterval{1};
  // Live or pending blocks, each with the streams that used it while they captured.
  using CaptureUses = std::map<Block*, std::vector<Stream>>;

  FenceEngine(Backend& backend, int device)
      : backend_(backend), device_(device), events_(backend, device), replay_clock_(backend.replay_clock()) {}
  FenceEngine(const FenceEngine&) = delete;
  FenceEngine& operator=(const FenceEngine&) = delete;

  // ---- the clock (device-locked paths only: the fast path reads the host's coarse clock)
  Clock::time_point now() const { return replay_clock_ == nullptr ? Clock::now() : replay_now(); }
  // Ticks as the host's coarse clock does (streamalloc::coarse_now).
  Clock::time_point coarse_now() const {
    if (replay_clock_ == nullptr) return streamalloc::coarse_now();
    const Clock::duration t = replay_now().time_since_epoch();
    return Clock::time_point(t - t % coarse_tick());
  }

  // ---- events
  // Records a fence for `fences`' open batch with an event of the pool; false if the batch was empty.
  bool close_batch(FenceQueue& fences) { return fences.close_batch(backend_, events_, device_, now()); }
  void release_event(Event event) { events_.release(event); }

  // ---- the capture rule: uses recorded on a stream while it captured a graph are dropped once that
  // capture has ended (the graph's own order covers them)
  bool has_capture_uses() const { return !capture_uses_.empty(); }
  const CaptureUses& capture_uses() const { return capture_uses_; }
  void add_capture_use(Block* block, Stream stream) { capture_uses_[block].push_back(stream); }
  // Calls drop(block, stream) for each use whose stream no longer captures, and forgets it.
  template <typename Drop>
  void drop_ended_capture_uses(Drop&& drop) {
    for (auto it = capture_uses_.begin(); it != capture_uses_.end();) {
      std::vector<Stream>& streams = it->second;
      for (auto s = streams.begin(); s != streams.end();) {
        if (backend_.is_capturing(device_, *s)) {
          ++s;
          continue;
        }
        drop(it->first, *s);
        s = streams.erase(s);
      }
      it = streams.empty() ? capture_uses_.erase(it) : std::next(it);
    }
  }

  // ---- pacing
  // Whether a free at `since` runs a fence pass (at most one per window); if so, the pass starts now.
  bool start_free_pass(Clock::time_point since) {
    if (since - last_fence_pass_ < kFenceBatchWindow) return false;
    last_fence_pass_ = since;
    return true;
  }
  // Whether the allocation path polls pending blocks at coarse time `now` (once per tick).
  bool start_pending_poll(Clock::time_point now) {
    if (now == last_pending_poll_) return false;
    last_pending_poll_ = now;
    return true;
  }
  // While one lives, a fence pass or poll runs: the blocks it releases are likely to be asked for next
  // by the stream that allocated them (DeviceCache::park_released).
  class Parking {
   public:
    explicit Parking(FenceEngine& engine) : flag_(engine.park_released_) { flag_ = true; }
    ~Parking() { flag_ = false; }
    Parking(const Parking&) = delete;
    Parking& operator=(const Parking&) = delete;

   private:
    bool& flag_;
  };
  bool parks_released() const { return park_released_; }

 private:
  // Frees with uses poll and record fences at most once per window.
  static constexpr std::chrono::microseconds kFenceBatchWindow{20};

  Clock::time_point replay_now() const {
    return Clock::time_point(std::chrono::nanoseconds(replay_clock_->load(std::memory_order_relaxed)));
  }
  // The host coarse clock's resolution (a jiffy).
  static Clock::duration coarse_tick() {
    static const Clock::duration tick = [] {
      timespec res{};
      clock_getres(CLOCK_MONOTONIC_COARSE, &res);
      const Clock::duration d = std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
      return d > Clock::duration::zero() ? d : Clock::duration(std::chrono::milliseconds(1));
    }();
    return tick;
  }

  Backend& backend_;
  const int device_;
  EventPool events_;
  const std::atomic<std::int64_t>* const replay_clock_;  // nullptr: the host's clock
  CaptureUses capture_uses_;
  Clock::time_point last_fence_pass_{};
  Clock::time_point last_pending_poll_{};  // coarse clock
  bool park_released_ = false;
};

}  // namespace streamalloc
