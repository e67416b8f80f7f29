// DeviceCache: the read-only reports' calls (segments, blocks, cache info, pending history); the
// reports themselves are CacheReport's (cache_report.cpp).
#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"

namespace streamalloc {

std::vector<SegmentInfo> DeviceCache::segments() const {
  DeviceLock lock(*this);
  shards_.lock_all();
  if (aids_ != nullptr)
    aids_->on_snapshot(static_cast<std::size_t>(ledger_.with_shards(shards_).active_bytes[0].current));
  return report_.segments(Clock::now());
}

std::size_t DeviceCache::requested_size_of(const void* ptr) const {
  DeviceLock lock(*this);
  const Block* block = const_cast<ShardSet&>(shards_).find_live(reinterpret_cast<std::uintptr_t>(ptr));
  return block == nullptr ? 0 : block->requested;
}

void DeviceCache::cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const {
  DeviceLock lock(*this);
  report_.cache_info(largest_free_block, total_cached);
}

void* DeviceCache::segment_base(const void* ptr, std::size_t* size) const {
  DeviceLock lock(*this);
  const Segment* segment = segments_.containing(reinterpret_cast<std::uintptr_t>(ptr));
  if (segment == nullptr) return nullptr;
  if (segment->expandable()) {
    // The base serves sharing memory with another process (CUDA IPC), which mapped pages do not support.
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: {} is in an expandable segment, whose memory cannot be shared between "
                            "processes; use expandable_segments:false for memory you share.",
                            ptr));
  }
  if (size) *size = segment->size;
  return reinterpret_cast<void*>(segment->address);
}

PendingHistory DeviceCache::pending_history() const {
  DeviceLock lock(*this);
  PendingHistory history;
  if (aids_ != nullptr) aids_->pending_history(&history);
  return history;
}

}  // namespace streamalloc
