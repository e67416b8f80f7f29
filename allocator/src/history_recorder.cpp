#include "history_recorder.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace streamalloc {

void HistoryRecorder::configure(const HistorySettings& settings) {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = settings.enabled;
  contexts_in_trace_ = settings.contexts_in_trace;
  skip_.fill(false);
  for (TraceAction action : settings.skip) skip_[static_cast<std::size_t>(action)] = true;
  const std::size_t max_entries = std::max<std::size_t>(settings.max_entries, 1);
  if (!settings.enabled || settings.clear) {
    ring_.clear();
    next_ = 0;
  }
  if (!settings.enabled) {  // events while off go unseen, so kept contexts would go stale
    live_ = {};
    segment_bytes_.clear();
  }
  if (max_entries != max_entries_) {
    // Keep the newest entries that fit, oldest first, so the ring restarts at slot 0.
    std::vector<TraceEntry> ordered;
    ordered.reserve(ring_.size());
    for (std::size_t i = 0; i < ring_.size(); ++i) ordered.push_back(std::move(ring_[(next_ + i) % ring_.size()]));
    if (ordered.size() > max_entries)
      ordered.erase(ordered.begin(), ordered.end() - static_cast<std::ptrdiff_t>(max_entries));
    ring_ = std::move(ordered);
    next_ = ring_.size() == max_entries ? 0 : ring_.size();
    max_entries_ = max_entries;
  }
}

bool HistoryRecorder::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enabled_;
}

void HistoryRecorder::keep_live_context(const TraceEntry& entry, const TraceContextPtr& context) {
  switch (entry.action) {
    case TraceAction::kAlloc: {
      if (context)
        live_.blocks[entry.address] = context;
      else
        live_.blocks.erase(entry.address);
      const auto segment = segment_bytes_.find(entry.address);
      if (segment != segment_bytes_.end() && entry.size < segment->second) {
        live_.segments.erase(entry.address);
        segment_bytes_.erase(segment);
      }
      break;
    }
    case TraceAction::kFreeCompleted: live_.blocks.erase(entry.address); break;
    case TraceAction::kSegmentAlloc:
      if (context) {
        live_.segments[entry.address] = context;
        segment_bytes_[entry.address] = entry.size;
      } else {
        live_.segments.erase(entry.address);
        segment_bytes_.erase(entry.address);
      }
      break;
    case TraceAction::kSegmentFree:
      live_.segments.erase(entry.address);
      segment_bytes_.erase(entry.address);
      break;
    case TraceAction::kSegmentMap:  // the context of the first map at an address, as PyTorch keeps it
      if (context) live_.segments.emplace(entry.address, context);
      break;
    case TraceAction::kSegmentUnmap: live_.segments.erase(entry.address); break;
    default: break;
  }
}

void HistoryRecorder::record(TraceEntry&& entry, bool caller_context) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled_) return;
  TraceContextPtr context = caller_context ? current_trace_context() : TraceContextPtr();
  // A free without a stack of its own (one the caller did not gather, or one completed when a fence
  // did) shows the block's allocation stack, as PyTorch's entries do; the block keeps that stack
  // until its free completes, so a pending block in a snapshot still has its frames.
  if (!context && (entry.action == TraceAction::kFreeRequested || entry.action == TraceAction::kFreeCompleted)) {
    const auto it = live_.blocks.find(entry.address);
    if (it != live_.blocks.end()) {
      context = it->second;
      entry.context_from_allocation = true;
    }
  }
  if (contexts_in_trace_ && !skip_[static_cast<std::size_t>(entry.action)]) entry.context = context;
  keep_live_context(entry, context);
  if (skip_[static_cast<std::size_t>(entry.action)]) return;
  if (ring_.size() < max_entries_) {
    ring_.push_back(std::move(entry));
    next_ = ring_.size() == max_entries_ ? 0 : ring_.size();
  } else {
    ring_[next_] = std::move(entry);
    next_ = (next_ + 1) % max_entries_;
  }
}

std::vector<TraceEntry> HistoryRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TraceEntry> out;
  out.reserve(ring_.size());
  const std::size_t start = ring_.size() < max_entries_ ? 0 : next_;
  for (std::size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(start + i) % ring_.size()]);
  return out;
}

LiveContexts HistoryRecorder::live_contexts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

void HistoryRecorder::validate() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (max_entries_ == 0 || ring_.size() > max_entries_) {
    throw std::logic_error("history: " + std::to_string(ring_.size()) + " entries in a ring of " +
                           std::to_string(max_entries_));
  }
  if (ring_.size() < max_entries_ ? next_ != ring_.size() : next_ >= max_entries_) {
    throw std::logic_error("history: next slot " + std::to_string(next_) + " does not fit " +
                           std::to_string(ring_.size()) + " entries in a ring of " + std::to_string(max_entries_));
  }
}

}  // namespace streamalloc
