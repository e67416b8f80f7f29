// FenceEngine: what a device cache keeps about fences beyond each shard's FenceQueue (docs/design.md,
// "Fences: batching and pipelining", and "Stream rules" rule 6): the pool of events fences are recorded
// with, the uses recorded on streams while they captured a graph (the capture rule), and the pacing of
// fence passes: frees with uses pass over their streams' fences at most once per kFenceBatchWindow, the
// allocation path polls pending blocks at most once per tick of the coarse clock, and while a pass or
// a poll runs the blocks it releases are kept in their owners' hot lists (releases_to_hot). The
// pacing, the fences' times and the free times of pending blocks read the engine's clock (now(),
// coarse_now()): the host's, or the backend's replay clock (Backend::replay_clock), which a replay of a
// recorded job sets to the job's time so that passes and polls fall where the job's did.
//
// The engine runs the passes too: a free's pass over its used streams' fences, the polls of a miss and
// of the allocation path, the host waits of the OOM path and teardown, and the capture rule. It works
// on the cache's other components (Parts) and hands each pending block whose fences have all completed
// back to the cache through one callback (Parts::release). Every method runs under the device lock.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "block.hpp"
#include "capture_reuse.hpp"
#include "cycle_clock.hpp"
#include "debug_aid.hpp"
#include "fence_queue.hpp"
#include "free_blocks.hpp"
#include "memory_pool.hpp"
#include "shard_set.hpp"
#include "stats_ledger.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc {

class FenceEngine {
 public:
  // A miss fences its own stream's batch of owned free blocks at most once per interval: those blocks
  // serve the stream without a fence (defers_own_batch).
  static constexpr std::chrono::milliseconds kOwnBatchInterval{1};
  // Live or pending blocks, each with the streams that used it while they captured.
  using CaptureUses = std::map<Block*, std::vector<Stream>>;

  // What the passes work on: the cache's other components, and what they hand back to the cache.
  struct Parts {
    ShardSet& shards;
    StatsLedger& ledger;
    FreeBlocks& free;
    const std::unique_ptr<DebugAids>& aids;  // null while every aid is off
    const Options& options;
    // Every fence of a pending block has completed (at `now`): the cache makes it free again.
    std::function<void(Block* block, Clock::time_point now)> release;
    // Uses recorded during captures came or went (the cache's fast path runs only while there are none).
    std::function<void()> capture_uses_changed;
  };

  FenceEngine(Backend& backend, int device, Parts parts)
      : backend_(backend),
        device_(device),
        parts_(std::move(parts)),
        events_(backend, device),
        replay_clock_(backend.replay_clock()) {}
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

  // ---- the passes (fence_engine.cpp)
  // Records a fence for the shard's open batch (the shard locked); false if the batch was empty.
  bool close_batch(Shard& shard);
  // A freed block with uses (recorded_streams) becomes pending: it joins its owner's open batch and
  // that of each used stream, and a free's pass runs when the pacing allows.
  void make_pending(Block* block);
  // A miss's pass: hot lists join the free lists (every stream's, or those of the other streams whose
  // last device-locked call came from this thread; with `missed`, `only` limits that to the blocks of
  // one size class), every open batch closes (`missed`'s own may wait, defers_own_batch) and every
  // fence queue is polled. nullptr: every hot list joins and every batch closes (process_fences).
  enum class HotLists { kEveryStream, kThisThreadsOthers };
  void close_batches_and_poll(Shard* missed = nullptr, HotLists flush = HotLists::kEveryStream,
                              std::optional<SizeClass> only = std::nullopt);
  // Without `close_batches` nothing is recorded: fences in flight are polled and idle streams' open
  // batches complete.
  void poll(bool close_batches, const Shard* missed = nullptr);
  // Host-waits for every fence (nothing while a stream captures). `for_memory`: the OOM path, which the
  // aids hear about.
  void synchronize_all(bool for_memory = false);
  // Teardown: waits for the fences already recorded, touching no stream (they may be destroyed).
  void wait_recorded();
  // Policy `wait`: the best-fitting owned block of another stream than `stream` in `pool`, made safe by
  // a GPU-side wait of `stream` on the fence that settles it; nullptr when there is none.
  Block* take_after_gpu_wait(MemoryPool& pool, SizeClass size_class, std::size_t size, Stream stream);

  // ---- the capture rule: uses recorded on a stream while it captured a graph are dropped once that
  // capture has ended (the graph's own order covers them)
  // `stream` is one more use of live `block` (record_stream, or a free on another stream). Asking
  // whether it captures costs a runtime call, so it is asked only while a route is open (`routes`).
  void add_use(Block* block, Stream stream, NewUse how, bool routes);
  // The engine's own invariants (docs/design.md, "Invariants"): a block kept for reuse inside a capture
  // is pending; a use recorded during a capture belongs to a block still in use and is among its uses.
  // Throws std::logic_error naming the device.
  void validate() const;
  bool has_capture_uses() const { return !capture_uses_.empty(); }
  const CaptureUses& capture_uses() const { return capture_uses_; }
  // Uses whose stream no longer captures leave their blocks, and their batches; a pending block left
  // without uses is released.
  void drop_ended_capture_uses();
  // graph_capture_record_stream_reuse (capture_reuse.hpp): a pending block just freed during a capture
  // keeps the graph nodes its streams had reached, when the option is on and all of them capture;
  // reuse_capture_frees hands back those of `stream` whose streams have joined it since, as a
  // completed fence would (Parts::release).
  void set_capture_reuse(bool on) { capture_reuse_.set(on); }
  const CaptureReuse& capture_reuse() const { return capture_reuse_; }
  void keep_for_capture_reuse(Block* block) {
    if (capture_reuse_.on()) capture_reuse_.add(backend_, device_, block);
  }
  bool has_capture_frees() const { return capture_reuse_.on() && !capture_reuse_.empty(); }
  // A pending block kept for reuse inside a capture is released by another way (a fence, the end of
  // its capture): it is no longer kept.
  void forget_capture_free(const Block* block) {
    if (!capture_reuse_.empty()) capture_reuse_.forget(block);
  }
  void reuse_capture_frees(Stream stream);

  // ---- pacing
  // Whether a free at `since` runs a fence pass (at most one per window); if so, the pass starts now.
  bool start_free_pass(Clock::time_point since) {
    if (since - last_fence_pass_ < kFenceBatchWindow) return false;
    last_fence_pass_ = since;
    return true;
  }
  // Whether the allocation path polls pending blocks at coarse time `now`: not in a tick that has
  // polled already (here, or in a free's fence pass).
  bool start_pending_poll(Clock::time_point now) {
    if (now <= last_pending_poll_) return false;
    note_pending_poll(now);
    return true;
  }
  // While blocks are pending, an allocation a coarse tick or more after their newest poll leaves the
  // fast path for the device-locked one, which polls first: PyTorch's allocator polls its events on
  // every allocation, so after a host sync its next allocation sees the blocks the sync released; this
  // keeps that at one device-locked allocation per tick. Every device-locked call publishes as it ends
  // (DeviceCache::DeviceLock) when the fast path should next leave, writing only a change: on the host's
  // clock a time-stamp-counter deadline, which the fast path reads without a clock call; on a replay
  // clock the tick of the newest poll.
  void publish_pending_poll(bool blocks_pending) const {
    const std::uint64_t after = blocks_pending ? poll_deadline_ : kNoPendingPoll;
    if (poll_after_.load(std::memory_order_relaxed) != after) poll_after_.store(after, std::memory_order_relaxed);
  }
  // Lock-free: the fast path's question.
  bool pending_poll_due() const {
    const std::uint64_t after = poll_after_.load(std::memory_order_relaxed);
    if (after == kNoPendingPoll) return false;
    return replay_clock_ == nullptr ? cycle_clock::now() > after : replay_tick_passed(after);
  }
  // While one lives, a fence pass or poll runs: the blocks it releases are likely to be asked for next
  // by the stream that allocated them, so the cache puts them in that stream's hot list (Parts::release).
  class HotReleases {
   public:
    explicit HotReleases(FenceEngine& engine) : flag_(engine.release_to_hot_) { flag_ = true; }
    ~HotReleases() { flag_ = false; }
    HotReleases(const HotReleases&) = delete;
    HotReleases& operator=(const HotReleases&) = delete;

   private:
    bool& flag_;
  };
  bool releases_to_hot() const { return release_to_hot_; }

 private:
  // Frees with uses poll and record fences at most once per window.
  static constexpr std::chrono::microseconds kFenceBatchWindow{20};

  [[gnu::noinline]] bool replay_tick_passed(std::uint64_t after) const {
    return static_cast<std::uint64_t>(coarse_now().time_since_epoch().count()) > after;
  }
  // A poll of pending blocks at time `now` (on the pacing's clock; a coarse tick or later within it).
  void note_pending_poll(Clock::time_point now) {
    last_pending_poll_ = std::max(last_pending_poll_, now);
    poll_deadline_ = replay_clock_ != nullptr
                         ? static_cast<std::uint64_t>(last_pending_poll_.time_since_epoch().count())
                         : cycle_clock::now() + tick_cycles();
  }
  // A coarse tick in time-stamp-counter ticks (measured once per process, at the first poll).
  static std::uint64_t tick_cycles() {
    static const std::uint64_t cycles =
        cycle_clock::from_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(coarse_tick()).count());
    return cycles;
  }
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

  void fence_after_free(const Block* block);
  void finish_fence(Shard& shard, Fence& fence);
  bool defers_own_batch(const Shard& shard, const Shard* missed, Clock::time_point now) const;
  // For the aids: the pending stats of `count` streams changed at `when`. Out of line and cold.
  [[gnu::noinline, gnu::cold]] void note_pending_changed(Clock::time_point when, const Stream* streams,
                                                         std::size_t count);

  Backend& backend_;
  const int device_;
  Parts parts_;
  EventPool events_;
  const std::atomic<std::int64_t>* const replay_clock_;  // nullptr: the host's clock
  CaptureUses capture_uses_;
  CaptureReuse capture_reuse_;
  Clock::time_point last_fence_pass_{};
  Clock::time_point last_pending_poll_{};  // the pacing's clock: a coarse tick, or a free's time within one
  // When the fast path should next leave while blocks are pending, as publish_pending_poll publishes it:
  // a cycle_clock deadline one coarse tick after the newest poll, or on a replay clock that poll's time.
  std::uint64_t poll_deadline_ = 0;
  bool release_to_hot_ = false;
  // What publish_pending_poll publishes (the deadline, or on a replay clock the newest poll's time;
  // kNoPendingPoll while no block is pending): on a cache line of its own, which the fast path reads and
  // only a change writes.
  static constexpr std::uint64_t kNoPendingPoll = std::numeric_limits<std::uint64_t>::max();
  alignas(kCacheLine) mutable std::atomic<std::uint64_t> poll_after_{kNoPendingPoll};
  char poll_after_line_[kCacheLine - sizeof(std::atomic<std::uint64_t>)] = {};
};

}  // namespace streamalloc
