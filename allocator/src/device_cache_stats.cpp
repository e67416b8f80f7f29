// DeviceCache: the stats, copied out and reset, and the device-locked side of the stats the fast path
// changes too (shard_stats.hpp): their device part, the device's headroom, gathering every shard's
// headroom, and the peaks.
#include <algorithm>

#include "device_cache.hpp"

namespace streamalloc {

// Under every lock: the device lock keeps the device-locked fields still, the shard locks each shard's
// part, so the copy is one consistent point of the device's history (every fast path before or after it).
// The device lock's times are converted after the lock is let go (the first conversion in a process
// measures the clock's rate).
DeviceStats DeviceCache::stats() const {
  DeviceStats copy;
  std::uint64_t wait_ticks = 0;
  std::uint64_t held_ticks = 0;
  {
    DeviceLock lock(*this);
    lock_all_shards();
    copy = stats_with_shards();
    wait_ticks = lock_wait_ticks_;
    held_ticks = lock_held_ticks_;
    for (const auto& [stream, state] : streams_) {
      const StreamPending& p = state->fences.pending_stats();
      if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
    }
  }
  copy.device_lock_wait_ns = cycle_clock::to_ns(wait_ticks);
  copy.device_lock_held_ns = cycle_clock::to_ns(held_ticks);
  return copy;
}

DeviceStats DeviceCache::stats_with_shards() const {
  DeviceStats sum = stats_;
  for (const auto& [stream, state] : streams_) {
    for (int s = 0; s < kFastStats; ++s) {
      StatArray& total = sum.*kFastStatFields[static_cast<std::size_t>(s)];
      for (std::size_t p = 0; p < total.size(); ++p) {
        const ShardStats& part = state->stats;
        const auto i = static_cast<std::size_t>(s);
        total[p].current += part.current(i, p);
        total[p].allocated += part.allocated[i][p];
        total[p].freed += part.freed[i][p];
      }
    }
  }
  return sum;
}

// Shard by shard, each locked until the call returns, only what is missing: the shards not visited
// keep running their fast paths, and those visited keep what was not needed. Only when every shard has
// given all it has is the device's current known with nothing moving, and a peak may rise.
std::int64_t DeviceCache::gather_headroom(FastStat s, int p, std::int64_t needed) {
  std::int64_t& device = headroom_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
  for (const auto& [stream, state] : streams_) {
    if (device >= needed) break;
    lock_shard(*state);
    std::int64_t& part = state->stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    const std::int64_t take = std::min(part, needed - device);
    device += take;
    part -= take;
  }
  return device;
}

// Spends the device's headroom; when it falls short, the shards'; what is still missing raises the
// peak, to exactly the device's current after the increase (every shard is locked then).
void DeviceCache::draw_headroom(FastStat s, int p, std::int64_t amount) {
  std::int64_t& headroom = headroom_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
  if (headroom < amount && gather_headroom(s, p, amount) < amount) {
    (stats_.*kFastStatFields[static_cast<std::size_t>(s)])[static_cast<std::size_t>(p)].peak += amount - headroom;
    headroom = amount;
  }
  headroom -= amount;
}

// The shard's fast path found a hot block but not the headroom to take it (a new peak, or headroom
// that frees on the device-locked path or on other streams left elsewhere). What the shard lacks comes
// from the device's headroom, then every shard's, then a higher peak; only what it lacks, so that
// headroom does not pile up where no allocation will use it.
void DeviceCache::give_headroom_for_unpark(StreamState& shard, const Block* block, std::size_t requested) {
  const int pool = pool_index(block->segment->pool);
  const auto give = [&](FastStat s, std::int64_t amount) {
    for (const int p : {0, pool}) {
      std::int64_t& own = shard.stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
      if (own >= amount) continue;
      // The shard's own headroom is set aside meanwhile, so that the gathering does not count it twice.
      const std::int64_t lacking = amount - own;
      own = 0;
      draw_headroom(s, p, lacking);
      own = amount;
    }
  };
  for_each_unpark_raise(static_cast<std::int64_t>(block->size), static_cast<std::int64_t>(requested), give);
}

// Every Stat the cache keeps, for the two resets.
template <typename F>
void DeviceCache::for_each_stat(F&& visit) {
#define STREAMALLOC_VISIT(name, kind, help) \
  for (Stat & s : stats_.name) visit(s);
  STREAMALLOC_POOL_STATS(STREAMALLOC_VISIT)
#undef STREAMALLOC_VISIT
  for (Stat* s : {&stats_.pending_blocks, &stats_.pending_bytes, &stats_.oversize_allocations,
                  &stats_.oversize_segments}) {
    visit(*s);
  }
  for (auto& [stream, state] : streams_) {
    visit(state->fences.pending_stats().pending_blocks);
    visit(state->fences.pending_stats().pending_bytes);
  }
}

// The peaks of the fast path's stats restart at the device's current (every shard's part added), and
// all headroom is gone: the next increase anywhere raises the peak.
void DeviceCache::reset_peak_stats() {
  DeviceLock lock(*this);
  lock_all_shards();
  for_each_stat([](Stat& s) { s.reset_peak(); });
  const DeviceStats now = stats_with_shards();
  for (int s = 0; s < kFastStats; ++s) {
    StatArray& stat = stats_.*kFastStatFields[static_cast<std::size_t>(s)];
    for (std::size_t p = 0; p < stat.size(); ++p) stat[p].peak = (now.*kFastStatFields[static_cast<std::size_t>(s)])[p].current;
    headroom_[static_cast<std::size_t>(s)].fill(0);
    for (const auto& [stream, state] : streams_) {
      state->stats.headroom[static_cast<std::size_t>(s)].fill(0);
    }
  }
}

void DeviceCache::reset_accumulated_stats() {
  DeviceLock lock(*this);
  lock_all_shards();
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
  // A shard's part of current is its allocated - freed: it moves to the device's part first.
  for (auto& [stream, state] : streams_) {
    for (int s = 0; s < kFastStats; ++s) {
      StatArray& stat = stats_.*kFastStatFields[static_cast<std::size_t>(s)];
      for (std::size_t p = 0; p < stat.size(); ++p) {
        ShardStats& part = state->stats;
        const auto i = static_cast<std::size_t>(s);
        stat[p].current += part.current(i, p);
        part.allocated[i][p] = part.freed[i][p] = 0;
      }
    }
  }
#define STREAMALLOC_RESET_COUNT(name, help) stats_.name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_RESET_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_RESET_COUNT)
#undef STREAMALLOC_RESET_COUNT
  stats_.free_to_reusable_us.fill(0);
  lock_wait_ticks_ = lock_held_ticks_ = 0;
  accumulated_reset_ = true;
}

std::int64_t DeviceCache::allocated_bytes_now() const {
  lock_all_shards();
  return stats_with_shards().allocated_bytes[0].current;
}

// A device-locked allocation spends its stream's shard's headroom first (`shard`, locked), where a
// free with uses returned it (account_freed), then the device's and the other shards'.
void DeviceCache::account_allocated(StreamState& shard, const Block* block, std::size_t requested) {
  const PoolKind pool = block->segment->pool;
  const auto size = static_cast<std::int64_t>(block->size);
  fast_stat_increase(kAllocation, pool, 1, &shard);
  fast_stat_increase(kAllocatedBytes, pool, size, &shard);
  fast_stat_increase(kRequestedBytes, pool, static_cast<std::int64_t>(requested), &shard);
  fast_stat_increase(kActive, pool, 1, &shard);
  fast_stat_increase(kActiveBytes, pool, size, &shard);
}

// Which headroom a free returns: a block freed with uses (the frees of a cross-stream loop) comes
// back to its allocation stream after its fences, parked in that stream's hot list where it can
// (park_released), and the stream's next allocation takes it on the fast path; so its free and its
// release give their headroom to the stream's shard, which that allocation draws. Other device-locked
// frees give it to the device (`shard` null): a shard keeps what its own fast path returns, and
// headroom given to shards whose streams allocate on the device-locked path would have to be gathered
// back from every shard, at a cost that grows with the number of streams.
void DeviceCache::account_freed(const Block* block, StreamState* shard) {
  const PoolKind pool = block->segment->pool;
  fast_stat_decrease(kAllocation, pool, 1, shard);
  fast_stat_decrease(kAllocatedBytes, pool, static_cast<std::int64_t>(block->size), shard);
}

// Requested bytes stay counted while a freed block is pending, as PyTorch counts them until the
// block's events complete (requested_bytes follows active blocks, not allocated ones).
void DeviceCache::account_inactive(Block* block, StreamState* shard) {
  const PoolKind pool = block->segment->pool;
  fast_stat_decrease(kActive, pool, 1, shard);
  fast_stat_decrease(kActiveBytes, pool, static_cast<std::int64_t>(block->size), shard);
  fast_stat_decrease(kRequestedBytes, pool, static_cast<std::int64_t>(block->requested), shard);
  block->requested = 0;
}

}  // namespace streamalloc
