// DeviceCache: the per-stream fast path (docs/design.md, "Locking"). An allocation that the stream's
// hot list serves, and a free of a block without other uses back to its stream's hot list, take the
// stream's shard lock alone: the shard is found in a table read without a lock, the block's state
// changes only between "live in the shard" and "parked in the shard", and the stats they change are
// the shard's, within the headroom it holds under the device's peaks (shard_stats.hpp). Anything else
// (a miss, a block with uses, a private pool, a debugging aid, a full hot list, too little headroom, a
// bad free) returns to the device-locked path, which decides; the fast path changes nothing
// before it knows it can finish.
#include "device_cache.hpp"
#include "size_policy.hpp"

namespace streamalloc {

namespace {

// The stats of both paths: the shard's alone (shard_stats.hpp), so that a fast path writes nothing
// that another stream's fast path reads. The increases must be covered by the shard's headroom, which
// the callers check before changing anything. File-local, so that each inlines into its one caller.

bool unpark_covered(const ShardStats& stats, int pool, std::int64_t size, std::int64_t requested) {
  bool covered = true;
  for_each_unpark_raise(size, requested,
                        [&](FastStat s, std::int64_t amount) { covered = covered && stats.covers(s, pool, amount); });
  return covered;
}

bool park_covered(const ShardStats& stats, const Block* block) {
  if (!block->split_in_shard || block->counted_inactive_split) return true;  // no inactive split to count
  const int pool = class_index(block->segment->size_class);
  return stats.covers(kInactiveSplit, pool, 1) &&
         stats.covers(kInactiveSplitBytes, pool, static_cast<std::int64_t>(block->size));
}

// account_allocated, less the inactive split it was.
void account_unparked(ShardStats& stats, Block* block, std::size_t requested) {
  const int pool = class_index(block->segment->size_class);
  const auto size = static_cast<std::int64_t>(block->size);
  if (block->counted_inactive_split) {
    block->counted_inactive_split = false;
    stats.lower(kInactiveSplit, pool, 1);
    stats.lower(kInactiveSplitBytes, pool, size);
  }
  for_each_unpark_raise(size, static_cast<std::int64_t>(requested),
                        [&](FastStat s, std::int64_t amount) { stats.raise(s, pool, amount); });
}

// account_freed and account_inactive (what taking it from the hot list raised), plus the inactive split
// it becomes.
void account_parked(ShardStats& stats, Block* block) {
  const int pool = class_index(block->segment->size_class);
  const auto size = static_cast<std::int64_t>(block->size);
  for_each_unpark_raise(size, static_cast<std::int64_t>(block->requested),
                        [&](FastStat s, std::int64_t amount) { stats.lower(s, pool, amount); });
  if (block->split_in_shard && !block->counted_inactive_split) {
    block->counted_inactive_split = true;
    stats.raise(kInactiveSplit, pool, 1);
    stats.raise(kInactiveSplitBytes, pool, size);
  }
}

}  // namespace

void* DeviceCache::allocate_hot(Shard& shard, std::size_t requested) {
  if (shard.hot_count.load(std::memory_order_relaxed) == 0) return nullptr;  // an empty hot list: not even a look
  // Unknown device size, or a request larger than the device: the device-locked path reports it.
  const std::size_t total = device_total_.load(std::memory_order_relaxed);
  if (total == 0 || requested > total) return nullptr;
  const std::size_t size = size_policy::round_size(requested, options_);
  if (size_policy::is_oversize(size, options_)) return nullptr;  // oversize counts are the device lock's
  ShardGuard guard(shard);
  // A live table that must grow: the device-locked path grows it (the fast path allocates nothing).
  if (!shard.live.has_room()) return nullptr;
  // A new peak, or headroom left elsewhere: the device-locked path gathers it.
  if (!unpark_covered(shard.stats, class_index(size_policy::size_class_for(size)), static_cast<std::int64_t>(size),
                      static_cast<std::int64_t>(requested))) {
    return nullptr;
  }
  Block* block = shard.take_hot(size);
  if (block == nullptr) return nullptr;
  reuse_hot(shard, block, requested);
  ++shard.counts.allocations_cached;
  return reinterpret_cast<void*>(block->address);
}

// What both paths do to a block taken from the hot list; the device-locked path (hand_out_hot) adds
// what the fast path has ruled out before (oversize blocks, aids, the allocation history).
void DeviceCache::reuse_hot(Shard& shard, Block* block, std::size_t requested) {
  block->hot = false;
  block->state = BlockState::kAllocated;
  block->requested = requested;
  block->record_stream_calls = 0;
  block->fences_left = 0;
  block->since = coarse_now();
  shard.live.insert(block->address, block);
  account_unparked(shard.stats, block, requested);
}

bool DeviceCache::free_to_shard(Shard& shard, std::uintptr_t address, std::size_t size_hint) {
  ShardGuard guard(shard);
  const LiveMap::Found live = shard.live.lookup(address);
  Block* block = live.block;
  if (block == nullptr) return false;  // another stream's block, or a bad free
  if (size_hint != 0 && size_hint != block->requested) return false;
  if (!block->recorded_streams.empty() || !pools_.is_default(block->segment->owner) ||
      size_policy::is_oversize(block->size, options_) || shard.hot.size() >= Shard::kHotBlocks ||
      !park_covered(shard.stats, block)) {
    return false;
  }
  shard.live.erase_at(live);
  account_parked(shard.stats, block);
  block->requested = 0;
  // `since` keeps the allocation's time: the fast path reads no clock.
  block->state = BlockState::kFree;
  block->settled = false;
  // As free_live: the block joins the stream's open batch, parked until that batch is fenced.
  block->settle_seq = shard.fences.join_as_owner();
  block->hot = true;
  shard.hot.push_back(block);
  shard.publish_hot();
  ++shard.counts.frees_cached;
  return true;
}

}  // namespace streamalloc
