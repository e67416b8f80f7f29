// HistoryRecorder: the TraceSink of one device while the allocation history is on. A ring of the newest
// entries (docs/design.md, "Allocation history"), plus the contexts live blocks and segments were
// allocated under, which snapshots attach to their blocks as PyTorch's context_when_allocated.
//
// record() runs under the device lock; readers take the recorder's own lock, so reading the history
// never waits for the device.
#pragma once

#include <array>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "streamalloc/trace.hpp"

namespace streamalloc {

class HistoryRecorder final : public TraceSink {
 public:
  // Applies `settings` (enabled or not: the cache detaches a recorder that is off).
  void configure(const HistorySettings& settings);
  bool enabled() const;

  void record(TraceEntry&& entry, bool caller_context) override;

  std::vector<TraceEntry> entries() const;  // oldest first
  LiveContexts live_contexts() const;
  // Throws std::logic_error when the ring's bookkeeping is broken.
  void validate() const;

 private:
  void keep_live_context(const TraceEntry& entry, const TraceContextPtr& context);

  mutable std::mutex mutex_;
  bool enabled_ = false;
  bool contexts_in_trace_ = true;
  std::array<bool, kTraceActions> skip_{};
  std::size_t max_entries_ = 1;
  std::vector<TraceEntry> ring_;  // up to max_entries_; next_ is the slot to overwrite once full
  std::size_t next_ = 0;
  LiveContexts live_;
  // Sizes of the segments in live_.segments: an allocation that splits a segment's first block drops
  // the segment's context, as PyTorch's allocator loses it when it splits a segment's head block.
  std::unordered_map<std::uintptr_t, std::size_t> segment_bytes_;
};

}  // namespace streamalloc
