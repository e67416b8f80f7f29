// PendingRecorder: a ring of the last N changes of pending bytes per stream (option pending_history:N).
// The pending_history aid (pending_history_aid.cpp) calls record() where a stream's StreamPending
// changes: when a free makes blocks wait for the stream's next fence, and when one of its fences
// completes. Off (capacity 0) by default; then no aid is made.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "block.hpp"
#include "streamalloc/stats.hpp"

namespace streamalloc {

class PendingRecorder {
 public:
  explicit PendingRecorder(std::size_t capacity) : capacity_(capacity) {}

  bool enabled() const { return capacity_ != 0; }

  void record(Clock::time_point when, Stream stream, const StreamPending& pending) {
    const PendingSample sample{std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count(),
                               stream, pending.pending_bytes.current, pending.pending_blocks.current};
    // The ring grows to its capacity first, so an unused history costs no memory.
    if (ring_.size() < capacity_) {
      ring_.push_back(sample);
    } else {
      ring_[next_] = sample;
    }
    next_ = (next_ + 1) % capacity_;
    ++recorded_;
  }

  PendingHistory history() const {
    PendingHistory out;
    out.capacity = capacity_;
    out.recorded = recorded_;
    out.samples.reserve(ring_.size());
    // Once full, the oldest sample is the one the next record() overwrites.
    const std::size_t oldest = ring_.size() < capacity_ ? 0 : next_;
    for (std::size_t i = 0; i < ring_.size(); ++i) out.samples.push_back(ring_[(oldest + i) % ring_.size()]);
    return out;
  }

 private:
  std::size_t capacity_;
  std::vector<PendingSample> ring_;
  std::size_t next_ = 0;
  std::uint64_t recorded_ = 0;
};

}  // namespace streamalloc
