// Shard: the settle list, and the per-stream fast path (docs/design.md, "Locking"). An allocation that
// the stream's hot list serves, and a free of a block without other uses back to it, take the stream's
// shard lock alone: the block's state changes only between "live in the shard" and "hot in the shard",
// and the stats they change are the shard's, within the headroom it holds under the device's peaks
// (shard_stats.hpp). Anything else (a miss, a block with uses, a private pool, a hot list at its
// bounds, too little headroom, a bad free) returns to the device-locked path, which decides; the fast path changes
// nothing before it knows it can finish.
#include "shard.hpp"

#include "invariant.hpp"
#include "memory_pool.hpp"
#include "size_policy.hpp"

namespace streamalloc {

namespace {

// The stats of both paths: the shard's alone (shard_stats.hpp), so that a fast path writes nothing
// that another stream's fast path reads. The increases must be covered by the shard's headroom, which
// the callers check before changing anything. File-local, so that each inlines into its one caller.

bool hot_reuse_covered(const ShardStats& stats, int size_class, std::int64_t size, std::int64_t requested) {
  bool covered = true;
  for_each_hot_reuse_raise(size, requested, [&](FastStat s, std::int64_t amount) {
    covered = covered && stats.covers(s, size_class, amount);
  });
  return covered;
}

// What hot_reuse_covered found missing, taken from the shared headroom. Out of line: the common case
// (the shard holds the headroom) does not pay for it.
[[gnu::noinline]] bool cover_hot_reuse(ShardStats& stats, SharedHeadroom& shared, int size_class, std::int64_t size,
                                       std::int64_t requested) {
  bool covered = true;
  for_each_hot_reuse_raise(size, requested, [&](FastStat s, std::int64_t amount) {
    covered = covered && cover_from(stats, shared, s, size_class, amount);
  });
  return covered;
}

// What make_hot_covered found missing, taken from the shared headroom; out of line as cover_hot_reuse.
[[gnu::noinline]] bool cover_make_hot(ShardStats& stats, SharedHeadroom& shared, const Block* block) {
  const int size_class = class_index(block->segment->size_class);
  return cover_from(stats, shared, kInactiveSplit, size_class, 1) &&
         cover_from(stats, shared, kInactiveSplitBytes, size_class, static_cast<std::int64_t>(block->size));
}

bool make_hot_covered(const ShardStats& stats, const Block* block) {
  if (!block->split_in_shard || block->counted_inactive_split) return true;  // no inactive split to count
  const int size_class = class_index(block->segment->size_class);
  return stats.covers(kInactiveSplit, size_class, 1) &&
         stats.covers(kInactiveSplitBytes, size_class, static_cast<std::int64_t>(block->size));
}

// account_allocated, less the inactive split it was.
void account_hot_reused(ShardStats& stats, Block* block, std::size_t requested) {
  const int size_class = class_index(block->segment->size_class);
  const auto size = static_cast<std::int64_t>(block->size);
  if (block->counted_inactive_split) {
    block->counted_inactive_split = false;
    stats.lower(kInactiveSplit, size_class, 1);
    stats.lower(kInactiveSplitBytes, size_class, size);
  }
  for_each_hot_reuse_raise(size, static_cast<std::int64_t>(requested),
                           [&](FastStat s, std::int64_t amount) { stats.raise(s, size_class, amount); });
}

// account_freed and account_inactive (what taking it from the hot list raised), plus the inactive split
// it becomes.
void account_made_hot(ShardStats& stats, Block* block) {
  const int size_class = class_index(block->segment->size_class);
  const auto size = static_cast<std::int64_t>(block->size);
  for_each_hot_reuse_raise(size, static_cast<std::int64_t>(block->requested),
                           [&](FastStat s, std::int64_t amount) { stats.lower(s, size_class, amount); });
  if (block->split_in_shard && !block->counted_inactive_split) {
    block->counted_inactive_split = true;
    stats.raise(kInactiveSplit, size_class, 1);
    stats.raise(kInactiveSplitBytes, size_class, size);
  }
}

}  // namespace

void SettleList::insert(Block* block) {
  // Blocks almost always join with the newest sequence number, so search from the tail.
  Block* after = tail_;
  while (after != nullptr && after->settle_seq > block->settle_seq) after = after->settle_prev;
  block->settle_prev = after;
  block->settle_next = after ? after->settle_next : head_;
  if (block->settle_next) {
    block->settle_next->settle_prev = block;
  } else {
    tail_ = block;
  }
  if (after) {
    after->settle_next = block;
  } else {
    head_ = block;
  }
  block->in_settle_list = true;
}

void SettleList::remove(Block* block) {
  if (!block->in_settle_list) return;
  if (block->settle_prev) {
    block->settle_prev->settle_next = block->settle_next;
  } else {
    head_ = block->settle_next;
  }
  if (block->settle_next) {
    block->settle_next->settle_prev = block->settle_prev;
  } else {
    tail_ = block->settle_prev;
  }
  block->settle_prev = block->settle_next = nullptr;
  block->in_settle_list = false;
}

void* Shard::allocate_hot(std::size_t requested, const size_policy::Rounding& rounding, const Options& options,
                          const std::atomic<std::size_t>& device_total, SharedHeadroom& shared) {
  if (hot_count.load(std::memory_order_relaxed) == 0) return nullptr;  // an empty hot list: not even a look
  // Unknown device size, or a request larger than the device: the device-locked path reports it.
  const std::size_t total = device_total.load(std::memory_order_relaxed);
  if (total == 0 || requested > total) return nullptr;
  const std::size_t size = rounding.round(requested);
  if (size_policy::is_oversize(size, options)) return nullptr;  // oversize counts are the device lock's
  ShardGuard guard(*this);
  // A live table that must grow: the device-locked path grows it (the fast path allocates nothing).
  if (!live.has_room()) return nullptr;
  Block* block = hot.find(size);
  if (block == nullptr) return nullptr;
  // Headroom the shared headroom does not hold either (a new peak, or headroom other shards keep): the
  // device-locked path gathers it.
  const int size_class = class_index(size_policy::size_class_for(size));
  if (!hot_reuse_covered(stats, size_class, static_cast<std::int64_t>(size), static_cast<std::int64_t>(requested)) &&
      !cover_hot_reuse(stats, shared, size_class, static_cast<std::int64_t>(size),
                       static_cast<std::int64_t>(requested))) {
    return nullptr;
  }
  remove_hot(block);
  reuse_hot(block, requested);
  ++counts.allocations_cached;
  return reinterpret_cast<void*>(block->address);
}

// What both paths do to a block taken from the hot list; the device-locked path (DeviceCache::
// hand_out_hot) adds what the fast path has ruled out before (oversize blocks, aids, the history).
void Shard::reuse_hot(Block* block, std::size_t requested) {
  block->hot = false;
  block->state = BlockState::kAllocated;
  block->requested = requested;
  block->record_stream_calls = 0;
  block->fences_left = 0;
  block->since = coarse_now();
  live.insert(block->address, block);
  account_hot_reused(stats, block, requested);
}

bool Shard::free_to_hot(std::uintptr_t address, std::size_t size_hint, const Options& options,
                        const MemoryPool* default_pool, SharedHeadroom& shared) {
  ShardGuard guard(*this);
  const LiveMap::Found found = live.lookup(address);
  Block* block = found.block;
  if (block == nullptr) return false;  // another stream's block, or a bad free
  if (size_hint != 0 && size_hint != block->requested) return false;
  if (!block->recorded_streams.empty() || block->segment->owner != default_pool ||
      size_policy::is_oversize(block->size, options) || !hot.has_room(block->size) ||
      (!make_hot_covered(stats, block) && !cover_make_hot(stats, shared, block))) {
    return false;
  }
  live.erase_at(found);
  account_made_hot(stats, block);
  block->requested = 0;
  // `since` keeps the allocation's time: the fast path reads no clock.
  block->state = BlockState::kFree;
  block->settled = false;
  // As DeviceCache::free_live: the block joins the stream's open batch, hot until that batch is fenced.
  block->settle_seq = fences.join_as_owner();
  push_hot(block);
  ++counts.frees_cached;
  return true;
}

void Shard::validate(int device, bool totals, ShardTally& tally) const {
  using invariant::broken;
  using invariant::hex;
  const Stream stream = this->stream();
  std::int64_t pending_blocks = 0, pending_bytes = 0;
  auto count = [&](const Block* b) {
    ++tally.fence_refs[b];
    pending_blocks += 1;
    pending_bytes += static_cast<std::int64_t>(b->size);
  };
  for (const Block* b : fences.open_pending()) count(b);
  std::uint64_t last_seq = fences.completed_seq();
  for (const Fence& f : fences.in_flight()) {
    if (f.seq <= last_seq) broken(device, "fences of stream " + hex(stream) + " are not in sequence order");
    last_seq = f.seq;
    for (const Block* b : f.pending) count(b);
  }
  if (last_seq > fences.closed_seq()) broken(device, "a fence is newer than the stream's closed batch");
  // The settle list: unsettled free blocks of this stream, in sequence order, not yet fenced.
  std::uint64_t previous = 0;
  for (const Block* b = settle_list.head(); b != nullptr; b = b->settle_next) {
    if (b->state != BlockState::kFree || b->settled || b->stream != stream) {
      broken(device, "settle list of stream " + hex(stream) + " holds block " + hex(b->address) +
                         " that is not free and unsettled on that stream");
    }
    if (b->settle_seq < previous) broken(device, "settle list of stream " + hex(stream) + " is out of order");
    if (b->settle_seq <= fences.completed_seq()) {
      broken(device, "block " + hex(b->address) +
                         " stayed unsettled after its fence completed (a completed fence must release exactly its "
                         "batch)");
    }
    previous = b->settle_seq;
  }
  if (const char* why = hot.broken(); *why != '\0') broken(device, "hot list of stream " + hex(stream) + ": " + why);
  hot.for_each([&](const Block* b) {
    if (!b->hot || !b->in_shard || b->state != BlockState::kFree || b->stream != stream) {
      broken(device,
             "hot list of stream " + hex(stream) + " holds block " + hex(b->address) + " that is not hot there");
    }
    if (live.find(b->address) != nullptr) {
      broken(device, "block " + hex(b->address) + " is both live and kept in stream " + hex(stream) + "'s shard");
    }
    ++tally.hot;
  });
  // The live table: blocks allocated on this stream, each under its own address.
  live.for_each([&](std::uintptr_t address, const Block* b) {
    if (b->address != address || b->state != BlockState::kAllocated || !b->in_shard || b->stream != stream) {
      broken(device, "the live table of stream " + hex(stream) + " holds " + hex(address) +
                         ", which is not a block allocated on that stream");
    }
    ++tally.live;
  });
  const StreamPending& ps = fences.pending_stats();
  invariant::check_stat(device, "per-stream pending_blocks", ps.pending_blocks, pending_blocks, totals);
  invariant::check_stat(device, "per-stream pending_bytes", ps.pending_bytes, pending_bytes, totals);
  for (std::size_t s = 0; s < stats.headroom.size(); ++s) {
    for (const std::int64_t part : stats.headroom[s]) {
      if (part < 0)
        broken(device, std::string(kFastStatNames[s]) + ": stream " + hex(stream) + " has negative headroom");
    }
  }
}

}  // namespace streamalloc
