#include "torch_convert.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "torch_history.hpp"

namespace streamalloc::torch {
namespace {

void copy_stat(const Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_stats(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  static_assert(std::tuple_size_v<StatArray> == std::tuple_size_v<c10::CachingAllocator::StatArray>,
                "streamalloc's pools must match PyTorch's StatType (all, small, large)");
  for (std::size_t i = 0; i < from.size(); ++i) copy_stat(from[i], to[i]);
}

}  // namespace

// torch.cuda.memory_stats() turns every field of c10's DeviceStats into keys, so every field must come
// from streamalloc's numbers. The fields counted here are the ones filled below: nine pool stat arrays,
// two single stats and six integers (five event counts and max_split_size). A PyTorch that adds a field
// fails this assertion instead of serving a zero under a new key.
static_assert(sizeof(c10::CachingDeviceAllocator::DeviceStats) == 9 * sizeof(c10::CachingAllocator::StatArray) +
                                                                      2 * sizeof(c10::CachingAllocator::Stat) +
                                                                      6 * sizeof(std::int64_t),
              "c10's DeviceStats changed: fill its new fields in to_torch_stats");

c10::CachingDeviceAllocator::DeviceStats to_torch_stats(const DeviceStats& stats) {
  c10::CachingDeviceAllocator::DeviceStats out;
  // The field lists in stats.hpp carry PyTorch's names, so one line per list covers every field and
  // a field added there without a PyTorch counterpart fails to compile here.
#define STREAMALLOC_COPY_POOL_STAT(name, kind, help) copy_stats(stats.name, out.name);
  STREAMALLOC_POOL_STATS(STREAMALLOC_COPY_POOL_STAT)
#undef STREAMALLOC_COPY_POOL_STAT
#define STREAMALLOC_COPY_COUNT(name, help) out.name = stats.name;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_COPY_COUNT)
#undef STREAMALLOC_COPY_COUNT
  copy_stat(stats.oversize_allocations, out.oversize_allocations);
  copy_stat(stats.oversize_segments, out.oversize_segments);
  out.max_split_size = stats.max_split_size;
  return out;
}

c10::cuda::CUDACachingAllocator::SnapshotInfo to_torch_snapshot(const std::vector<SegmentInfo>& segments,
                                                                int device_count, const Options& options,
                                                                const std::vector<LiveContexts>* contexts) {
  c10::cuda::CUDACachingAllocator::SnapshotInfo out{};
  out.segments.reserve(segments.size());
  for (const SegmentInfo& segment : segments) {
    const LiveContexts* live =
        contexts != nullptr && segment.device >= 0 && static_cast<std::size_t>(segment.device) < contexts->size()
            ? &(*contexts)[static_cast<std::size_t>(segment.device)]
            : nullptr;
    c10::CachingDeviceAllocator::SegmentInfo s;
    s.device = static_cast<c10::DeviceIndex>(segment.device);
    s.address = segment.address;
    s.total_size = segment.total_size;
    s.requested_size = segment.requested_size;
    s.allocated_size = segment.allocated_size;
    s.active_size = segment.active_size;
    s.stream = reinterpret_cast<void*>(segment.stream);
    s.is_large = segment.is_large;
    s.is_expandable = segment.expandable;
    // PyTorch's snapshot calls it segment_pool_id; cudagraph trees find their pool's blocks by it.
    s.owner_private_pool_id = {static_cast<c10::CaptureId_t>(segment.pool.first),
                               static_cast<c10::CaptureId_t>(segment.pool.second)};
    if (live != nullptr) {
      auto found = live->segments.find(segment.address);
      if (found != live->segments.end()) s.context_when_allocated = stack_of(found->second);
    }
    s.blocks.reserve(segment.blocks.size());
    // PyTorch derives each block's address from the segment's address and the sizes before it, so
    // the blocks must cover the segment in address order, as Allocator::segments() lists them.
    for (const BlockInfo& block : segment.blocks) {
      c10::CachingDeviceAllocator::BlockInfo b;
      b.size = block.size;
      b.requested_size = block.requested_size;
      b.allocated = block.state == BlockInfo::State::kAllocated;
      b.active = block.state != BlockInfo::State::kFree;  // pending free: "active_pending_free"
      if (live != nullptr && b.allocated) {
        auto found = live->blocks.find(block.address);
        if (found != live->blocks.end()) b.context_when_allocated = stack_of(found->second);
      }
      s.blocks.push_back(std::move(b));
    }
    out.segments.push_back(std::move(s));
  }
  out.device_traces.resize(static_cast<std::size_t>(device_count));
  auto& config = out.config_metadata;
  config.garbage_collection_threshold = 0.0;
  config.max_split_size =
      options.max_split_size_bytes == 0 ? std::numeric_limits<std::size_t>::max() : options.max_split_size_bytes;
  config.pinned_num_register_threads = 0;
  config.expandable_segments = options.expandable_segments;
  config.release_lock_on_malloc = false;
  config.pinned_use_host_register = false;
  config.graph_capture_record_stream_reuse = false;
  config.last_allocator_settings = options.to_conf_string();
  return out;
}

}  // namespace streamalloc::torch
