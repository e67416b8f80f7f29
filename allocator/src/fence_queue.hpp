// Fences: per (device, stream), a FIFO of events that each cover a batch of frees.
//
// A free joins the stream's *open batch*. Closing the batch records one event on the stream; that
// event is a valid fence for every free in the batch, because an event recorded later than a free
// only waits for a little more work. Fences complete in stream order, so they are polled oldest-first
// and polling stops at the first one that has not completed; each stream's queue is independent, so
// one slow stream never holds up another (docs/design.md, "Stream rules", rule 4).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "block.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/stats.hpp"

namespace streamalloc {

// Events are created once and reused, so the hot path never creates one when the pool has one.
class EventPool {
 public:
  EventPool(Backend& backend, int device) : backend_(backend), device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  Event acquire();
  void release(Event event) { free_.push_back(event); }

 private:
  Backend& backend_;
  int device_;
  std::vector<Event> free_;
};

struct Fence {
  std::uint64_t seq = 0;
  Event event = nullptr;
  std::vector<Block*> pending;  // pending blocks waiting on this fence
  Clock::time_point recorded_at{};
};

class FenceQueue {
 public:
  explicit FenceQueue(Stream stream) : stream_(stream) {}

  Stream stream() const { return stream_; }
  std::uint64_t completed_seq() const { return completed_seq_; }
  // Highest sequence number that has a recorded fence.
  std::uint64_t closed_seq() const { return open_seq_ - 1; }
  const std::deque<Fence>& in_flight() const { return in_flight_; }
  const std::vector<Block*>& open_pending() const { return open_pending_; }
  // Whether the open batch has members (owned frees or pending blocks): closing it records a fence.
  // Also read without the shard lock, by a poll that skips idle streams: a stale "no" only leaves a
  // batch joined at that moment to a later pass, as if its free had come just after the poll.
  bool has_open_batch() const { return open_has_members_.load(std::memory_order_relaxed); }
  // When the newest fence of the stream was recorded; the clock's epoch before the first.
  Clock::time_point last_recorded_at() const { return last_recorded_at_; }

  // A block freed on this stream (its allocation stream) joins the open batch; returns the sequence
  // number whose fence settles it.
  std::uint64_t join_as_owner() {
    open_has_members_.store(true, std::memory_order_relaxed);
    return open_seq_;
  }
  // A pending block that was used on this stream waits for the open batch's fence.
  void join_as_user(Block* block) {
    open_has_members_.store(true, std::memory_order_relaxed);
    open_pending_.push_back(block);
    pending_.pending_blocks.increase(1);
    pending_.pending_bytes.increase(static_cast<std::int64_t>(block->size));
  }

  // A pending block no longer waits for this stream (a use dropped by the capture rule): it leaves the
  // batch or fence that lists it.
  void leave_as_user(const Block* block);
  // Record one event covering the open batch, at `now` (FenceEngine's clock). No-op when the batch is
  // empty.
  bool close_batch(Backend& backend, EventPool& pool, int device, Clock::time_point now);
  // The open batch as a completed fence with no event, for a stream the caller found idle (all work
  // enqueued on it has completed, so nothing can still touch a block of the batch): `out` gets its
  // pending blocks, and the owner blocks of the batch settle. Only with no fence in flight, so
  // fences still complete in sequence order; false when that does not hold or the batch is empty.
  bool complete_open_batch(Fence* out, Clock::time_point now);
  // Pop the oldest in-flight fence if it has completed; returns false when none has.
  bool pop_completed(Backend& backend, int device, Fence* out, std::uint64_t* queries);
  // Host-wait for the oldest in-flight fence and pop it into `out`; false when none is in flight. One at
  // a time, so that a failing wait leaves every fence not yet handed out in the queue.
  bool synchronize_oldest(Backend& backend, int device, Fence* out);
  // The in-flight fence with sequence `seq`, or nullptr (used by the GPU-wait path).
  const Fence* find(std::uint64_t seq) const;
  void note_pending_released(const Block* block) {
    pending_.pending_blocks.decrease(1);
    pending_.pending_bytes.decrease(static_cast<std::int64_t>(block->size));
  }
  StreamPending& pending_stats() { return pending_; }
  const StreamPending& pending_stats() const { return pending_; }

 private:
  void mark_completed(std::uint64_t seq) {
    if (seq > completed_seq_) completed_seq_ = seq;
  }

  Stream stream_;
  std::uint64_t open_seq_ = 1;
  std::uint64_t completed_seq_ = 0;
  std::atomic<bool> open_has_members_{false};  // written under the shard lock (join_as_owner: the fast path)
  std::vector<Block*> open_pending_;
  Clock::time_point last_recorded_at_{};
  std::deque<Fence> in_flight_;
  StreamPending pending_;
};

}  // namespace streamalloc
