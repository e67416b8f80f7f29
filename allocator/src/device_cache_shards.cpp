// DeviceCache: the per-stream fast path (docs/design.md, "Locking"). An allocation that the stream's
// hot list serves, and a free of a block without other uses back to its stream's hot list, take the
// stream's shard lock alone: the shard is found in a table read without a lock, the block's state
// changes only between "live in the shard" and "parked in the shard", and the stats they change are
// guarded by stats_lock_. Anything else (a miss, a block with uses, a private pool, a debugging aid, a
// full hot list, a bad free) returns to the device-locked path, which decides as before; the fast path
// changes nothing before it knows it can finish.
#include "device_cache.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void* DeviceCache::allocate_parked(StreamState& shard, std::size_t requested) {
  if (shard.parked.load(std::memory_order_relaxed) == 0) return nullptr;  // nothing parked: not even a look
  // Unknown device size, or a request larger than the device: the device-locked path reports it.
  const std::size_t total = device_total_.load(std::memory_order_relaxed);
  if (total == 0 || requested > total) return nullptr;
  const std::size_t size = size_policy::round_size(requested, options_);
  if (size_policy::is_oversize(size, options_)) return nullptr;  // oversize counts are the device lock's
  ShardGuard guard(shard);
  Block* block = take_hot(shard, size);
  if (block == nullptr) return nullptr;
  hand_out_parked(shard, block, requested);
  return reinterpret_cast<void*>(block->address);
}

void DeviceCache::hand_out_parked(StreamState& shard, Block* block, std::size_t requested) {
  block->hot = false;
  block->state = BlockState::kAllocated;
  block->requested = requested;
  block->record_stream_calls = 0;
  block->fences_left = 0;
  block->since = coarse_now();
  shard.live.insert(block->address, block);
  account_unparked(shard, block, requested);
  if (size_policy::is_oversize(block->size, options_)) stats_.oversize_allocations.increase(1);  // device-locked only
  if (aids_ != nullptr) aids_->on_allocate(*block);
  if (trace_ != nullptr) trace_events::alloc(*trace_, device_, *block);  // device-locked only: tracing stops the fast path
}

bool DeviceCache::free_to_shard(StreamState& shard, std::uintptr_t address, std::size_t size_hint) {
  ShardGuard guard(shard);
  Block* block = shard.live.find(address);
  if (block == nullptr) return false;  // another stream's block, or a bad free
  if (size_hint != 0 && size_hint != block->requested) return false;
  if (!block->recorded_streams.empty() || block->segment->owner != &default_pool_ ||
      size_policy::is_oversize(block->size, options_) || shard.hot.size() >= StreamState::kHotBlocks) {
    return false;
  }
  shard.live.erase(address);
  account_parked(shard, block);
  block->requested = 0;
  block->since = coarse_now();
  block->state = BlockState::kFree;
  block->settled = false;
  // As free_to_owner: the block joins the stream's open batch, parked until that batch is fenced.
  block->settle_seq = shard.fences.join_as_owner();
  block->hot = true;
  shard.hot.push_back(block);
  shard.publish_hot();
  return true;
}

// Current values and peaks change in one stats_lock_ section per fast path; the accumulated totals go
// to the shard, under its lock (docs/design.md, "Locking", "Stats stay exact").
namespace {
void raise(StatArray& stat, int pool, std::int64_t amount) {
  for (Stat* s : {&stat[0], &stat[static_cast<std::size_t>(pool)]}) {
    s->current += amount;
    if (s->current > s->peak) s->peak = s->current;
  }
}
void lower(StatArray& stat, int pool, std::int64_t amount) {
  stat[0].current -= amount;
  stat[static_cast<std::size_t>(pool)].current -= amount;
}
}  // namespace

// account_allocated, less the inactive split it was.
void DeviceCache::account_unparked(StreamState& shard, Block* block, std::size_t requested) {
  const int pool = pool_index(block->segment->pool);
  const auto size = static_cast<std::int64_t>(block->size);
  const auto asked = static_cast<std::int64_t>(requested);
  const bool was_split = block->counted_inactive_split;
  block->counted_inactive_split = false;
  {
    std::lock_guard<SpinLock> guard(stats_lock_);
    if (was_split) {
      lower(stats_.inactive_split, pool, 1);
      lower(stats_.inactive_split_bytes, pool, size);
    }
    raise(stats_.allocation, pool, 1);
    raise(stats_.allocated_bytes, pool, size);
    raise(stats_.requested_bytes, pool, asked);
    raise(stats_.active, pool, 1);
    raise(stats_.active_bytes, pool, size);
  }
  ShardTotals& t = shard.totals;
  if (was_split) {
    ShardTotals::decrease(t.inactive_split, pool, 1);
    ShardTotals::decrease(t.inactive_split_bytes, pool, size);
  }
  ShardTotals::increase(t.allocation, pool, 1);
  ShardTotals::increase(t.allocated_bytes, pool, size);
  ShardTotals::increase(t.requested_bytes, pool, asked);
  ShardTotals::increase(t.active, pool, 1);
  ShardTotals::increase(t.active_bytes, pool, size);
}

// account_freed and account_inactive, plus the inactive split it becomes.
void DeviceCache::account_parked(StreamState& shard, Block* block) {
  const int pool = pool_index(block->segment->pool);
  const auto size = static_cast<std::int64_t>(block->size);
  const auto asked = static_cast<std::int64_t>(block->requested);
  const bool becomes_split = block->split_in_shard && !block->counted_inactive_split;
  if (becomes_split) block->counted_inactive_split = true;
  {
    std::lock_guard<SpinLock> guard(stats_lock_);
    lower(stats_.allocation, pool, 1);
    lower(stats_.allocated_bytes, pool, size);
    lower(stats_.requested_bytes, pool, asked);
    lower(stats_.active, pool, 1);
    lower(stats_.active_bytes, pool, size);
    if (becomes_split) {
      raise(stats_.inactive_split, pool, 1);
      raise(stats_.inactive_split_bytes, pool, size);
    }
  }
  ShardTotals& t = shard.totals;
  ShardTotals::decrease(t.allocation, pool, 1);
  ShardTotals::decrease(t.allocated_bytes, pool, size);
  ShardTotals::decrease(t.requested_bytes, pool, asked);
  ShardTotals::decrease(t.active, pool, 1);
  ShardTotals::decrease(t.active_bytes, pool, size);
  if (becomes_split) {
    ShardTotals::increase(t.inactive_split, pool, 1);
    ShardTotals::increase(t.inactive_split_bytes, pool, size);
  }
}

}  // namespace streamalloc
