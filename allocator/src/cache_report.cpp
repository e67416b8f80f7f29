// CacheReport: the read-only reports of a device cache (cache_report.hpp).
#include "cache_report.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "size_policy.hpp"

namespace streamalloc {

namespace {
// The first sentences of PyTorch's out-of-memory error (c10/cuda/CUDACachingAllocator.cpp), in its
// units (format_size), so that people and tools that read PyTorch's OOM errors read these alike.
// `tried`: the device allocation that failed, as PyTorch reports it (the segment size, not the
// request). PyTorch's per-process usage from NVML ("Process N has X memory in use.") is left out, as
// PyTorch leaves it out where NVML is missing. Under the CUDA backend the text starts with PyTorch's
// "CUDA out of memory."; the plugin turns "by streamalloc" into PyTorch's "by PyTorch".
std::string out_of_memory_head(const std::string& backend, int device, std::size_t tried, const DeviceMemoryInfo& info,
                               double fraction, std::size_t cap, std::size_t allocated, std::size_t reserved) {
  std::string head =
      fmt::format("{} out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
                  backend == "cuda" ? "CUDA" : "Simulated device", format_size(tried), device,
                  format_size(info.total_bytes), format_size(info.free_bytes));
  if (fraction < 1.0) head += format_size(cap) + " allowed; ";
  head += fmt::format(
      "Of the allocated memory {} is allocated by streamalloc, and {} is reserved by streamalloc but "
      "unallocated.",
      format_size(allocated), format_size(reserved > allocated ? reserved - allocated : 0));
  return head;
}
}  // namespace

BlockInfo CacheReport::describe(const Block* block, Clock::time_point now) {
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

std::vector<SegmentInfo> CacheReport::segments(Clock::time_point now) const {
  std::vector<SegmentInfo> out;
  out.reserve(segments_.count());
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

std::vector<PoolInfo> CacheReport::pools() const {
  std::map<const MemoryPool*, PoolInfo> by_pool;
  by_pool[&pools_.default_pool()] = pools_.info(pools_.default_pool());
  for (const auto& [id, pool] : pools_.private_pools()) by_pool[pool.get()] = pools_.info(*pool);
  segments_.for_each([&](const Segment* segment) {
    PoolInfo& info = by_pool[segment->owner];
    info.segments += 1;
    info.reserved_bytes += segment->size;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kAllocated) {
        info.allocated_bytes += b->size;
        info.live_blocks += 1;
      }
      if (b->state != BlockState::kFree) info.active_bytes += b->size;
    }
  });
  std::vector<PoolInfo> out{by_pool[&pools_.default_pool()]};
  for (const auto& [id, pool] : pools_.private_pools()) out.push_back(by_pool[pool.get()]);
  return out;
}

void CacheReport::cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const {
  std::size_t largest = 0;
  std::size_t total = 0;
  pools_.default_pool().free.for_each([&](const Block* b) {
    largest = std::max(largest, b->size);
    total += b->size;
  });
  if (largest_free_block) *largest_free_block = largest;
  if (total_cached) *total_cached = total;
}

PoolCheckpoint CacheReport::checkpoint(PoolId id, const MemoryPool& pool) const {
  PoolCheckpoint checkpoint;
  checkpoint.device = device_;
  checkpoint.pool = id;
  segments_.for_each([&](const Segment* segment) {
    if (segment->owner != &pool) return;
    SegmentLayout layout;
    layout.address = segment->address;
    layout.size = segment->size;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      BlockLayout block;
      block.address = b->address;
      block.size = b->size;
      block.allocated = b->state == BlockState::kAllocated;
      if (block.allocated) {
        block.requested = b->requested;
        block.stream = b->stream;
      }
      layout.blocks.push_back(block);
    }
    checkpoint.segments.push_back(std::move(layout));
  });
  return checkpoint;
}

bool CacheReport::live_blocks_are(const MemoryPool& pool, const std::vector<const void*>& expected) const {
  const std::set<const void*> wanted(expected.begin(), expected.end());
  std::size_t live = 0;
  bool all_expected = true;
  segments_.for_each([&](const Segment* segment) {
    if (segment->owner != &pool) return;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->state != BlockState::kAllocated) continue;
      ++live;
      all_expected = all_expected && wanted.count(reinterpret_cast<const void*>(b->address)) != 0;
    }
  });
  return all_expected && live == wanted.size();
}

void CacheReport::throw_bad_free(const void* ptr, const char* what) const {
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

std::string CacheReport::out_of_memory(std::size_t requested, std::size_t size, Stream stream,
                                       const DeviceMemoryInfo& info, double fraction, std::size_t cap,
                                       std::size_t device_total) const {
  const std::string backend = backend_.name();
  if (requested > size_policy::kMaxRequest) {
    // PyTorch's words for a size no device has.
    return fmt::format(
        "{} out of memory. Tried to allocate more than 1EB memory. streamalloc: {} bytes requested "
        "on device {}; check the size computation of this tensor.",
        backend == "cuda" ? "CUDA" : "Simulated device", requested, device_);
  }
  shards_.lock_all();
  const auto allocated = static_cast<std::size_t>(ledger_.with_shards(shards_).allocated_bytes[0].current);
  std::string msg = out_of_memory_head(backend, device_, size_policy::segment_size_for(size), info, fraction, cap,
                                       allocated, segments_.reserved_bytes());
  if (requested > device_total) {
    msg += fmt::format(
        " streamalloc ({}): the request of {} bytes is larger than the device's total memory of {}; nothing was "
        "flushed. Check the size computation of this tensor.",
        backend, requested, format_size(device_total));
    return msg;
  }
  std::size_t cached_free = 0;
  pools_.default_pool().free.for_each([&](const Block* b) { cached_free += b->size; });
  for (const auto& [id, pool] : pools_.private_pools())
    pool->free.for_each([&](const Block* b) { cached_free += b->size; });
  msg += fmt::format(
      " streamalloc ({}): request of {} ({} rounded) on stream {:#x}; {} reserved, {} cached free, {} pending in "
      "{} block(s)",
      backend, format_size(requested), format_size(size), stream, format_size(segments_.reserved_bytes()),
      format_size(cached_free), format_size(static_cast<std::size_t>(ledger_.stats().pending_bytes.current)),
      ledger_.stats().pending_blocks.current);
  if (fraction < 1.0) msg += fmt::format("; memory fraction cap {} = {}", fraction, format_size(cap));
  msg += ".";
  std::vector<std::pair<std::int64_t, Stream>> holders;
  for (const auto& [s, shard] : shards_) {
    const std::int64_t pending = shard->fences.pending_stats().pending_bytes.current;
    if (pending > 0) holders.emplace_back(pending, s);
  }
  std::sort(holders.rbegin(), holders.rend());
  if (!holders.empty()) {
    msg += " Largest pending holders (streams whose fences hold freed blocks):";
    for (std::size_t i = 0; i < holders.size() && i < 3; ++i) {
      msg += fmt::format(" stream {:#x} holds {};", holders[i].second,
                         format_size(static_cast<std::size_t>(holders[i].first)));
    }
  }
  msg +=
      " What to do: free tensors you no longer need, lower the batch size, or, if reserved but unallocated "
      "memory is large, set STREAMALLOC_CONF=max_split_size_mb:N to reduce fragmentation.";
  return msg;
}

}  // namespace streamalloc
