// DeviceCache: read-only reports (segments, blocks, cache info, pending history) and the diagnosis of
// a bad free.
#include <algorithm>
#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"

namespace streamalloc {

BlockInfo DeviceCache::describe(const Block* block, Clock::time_point now) const {
  BlockInfo info;
  info.address = block->address;
  info.segment_address = block->segment->address;
  info.size = block->size;
  info.requested_size = block->requested;
  switch (block->state) {
    case BlockState::kAllocated: info.state = BlockInfo::State::kAllocated; break;
    case BlockState::kPending: info.state = BlockInfo::State::kPendingFree; break;
    case BlockState::kFree: info.state = BlockInfo::State::kFree; break;
  }
  info.settled = block->state == BlockState::kFree && block->settled;
  info.allocation_stream = block->stream;
  info.recorded_streams = block->recorded_streams;
  info.record_stream_calls = block->record_stream_calls;
  info.pending_fences = block->state == BlockState::kPending ? block->fences_left : 0;
  info.age_ms = std::chrono::duration<double, std::milli>(now - block->since).count();
  return info;
}

std::vector<SegmentInfo> DeviceCache::segments() const {
  DeviceLock lock(*this);
  shards_.lock_all();
  if (aids_ != nullptr)
    aids_->on_snapshot(static_cast<std::size_t>(ledger_.with_shards(shards_).active_bytes[0].current));
  const auto now = Clock::now();
  std::vector<SegmentInfo> out;
  out.reserve(segments_.count());
  // An expandable segment is reported as PyTorch's is, one segment per run of mapped pages, so that
  // the blocks of every reported segment tile it.
  segments_.for_each([&](const Segment* segment) {
    SegmentInfo info;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b == segment->head || b->address != b->prev->address + b->prev->size) {
        if (b != segment->head) out.push_back(std::move(info));
        info = SegmentInfo{};
        info.device = device_;
        info.address = b->address;
        info.is_large = segment->size_class == SizeClass::kLarge;
        info.stream = segment->stream;
        info.pool = segment->owner->id;
        info.expandable = segment->expandable();
        info.reserved_address_bytes = segment->address_range;
      }
      info.total_size += b->size;
      if (b->state == BlockState::kAllocated) info.allocated_size += b->size;
      info.requested_size += b->requested;  // allocated and pending blocks (free ones have none)
      if (b->state != BlockState::kFree) info.active_size += b->size;
      info.blocks.push_back(describe(b, now));
    }
    out.push_back(std::move(info));
  });
  return out;
}

std::size_t DeviceCache::requested_size_of(const void* ptr) const {
  DeviceLock lock(*this);
  const Block* block = const_cast<ShardSet&>(shards_).find_live(reinterpret_cast<std::uintptr_t>(ptr));
  return block == nullptr ? 0 : block->requested;
}

void DeviceCache::cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const {
  DeviceLock lock(*this);
  std::size_t largest = 0;
  std::size_t total = 0;
  pools_.default_pool().free.for_each([&](const Block* b) {  // what an allocation outside routes can take
    largest = std::max(largest, b->size);
    total += b->size;
  });
  if (largest_free_block) *largest_free_block = largest;
  if (total_cached) *total_cached = total;
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

// Called with the lock held, for a pointer that is not a live block: say which mistake it is.
void DeviceCache::throw_bad_free(const void* ptr, const char* what) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::string prefix = fmt::format("streamalloc: {}({}) on device {}: ", what, ptr, device_);
  const Segment* segment = segments_.containing(address);
  shards_.lock_all();  // the segment's other blocks may be any stream's
  if (segment == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                prefix +
                    "the pointer was not allocated by streamalloc on this device (foreign pointer, or the wrong "
                    "device index). Nothing was freed. Free it with the allocator that returned it.");
  }
  for (const Block* b = segment->head; b != nullptr; b = b->next) {
    if (b->address == address) {
      throw Error(
          ErrorCode::kInvalidArgument,
          prefix + fmt::format("double free: the block of {} at this address is already {}. Nothing was "
                               "changed. Check for two owners of one tensor, or a free after a free.",
                               format_bytes(b->size),
                               b->state == BlockState::kPending ? "freed and waiting for its stream fences" : "free"));
    }
    if (address > b->address && address < b->address + b->size) {
      throw Error(ErrorCode::kInvalidArgument,
                  prefix + fmt::format("the pointer is {} bytes inside the block at {:#x}; only the address returned "
                                       "by malloc can be freed. Nothing was freed.",
                                       address - b->address, b->address));
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              prefix + "the pointer is inside a streamalloc segment but matches no block. Nothing was freed.");
}

}  // namespace streamalloc
