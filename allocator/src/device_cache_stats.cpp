// DeviceCache: the stats, copied out and reset. They are updated where blocks change state; the current
// values and peaks of those the per-stream fast path changes too under stats_lock_, its totals in each
// shard (docs/design.md, "Locking").
#include "device_cache.hpp"

namespace streamalloc {

// Under every lock: the device lock keeps the device-locked fields still, the shard locks the totals
// each fast path keeps, stats_lock_ the current values and peaks, so the copy is one consistent point of
// the device's history (every fast path before or after it).
DeviceStats DeviceCache::stats() const {
  DeviceLock lock(*this);
  lock_all_shards();
  DeviceStats copy;
  {
    std::lock_guard<SpinLock> guard(stats_lock_);
    copy = stats_with_shard_totals();
  }
  for (const auto& [stream, state] : streams_) {
    const StreamPending& p = state->fences.pending_stats();
    if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
  }
  return copy;
}

DeviceStats DeviceCache::stats_with_shard_totals() const {
  DeviceStats sum = stats_;
  for (const auto& [stream, state] : streams_) state->totals.add_to(sum);
  return sum;
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

void DeviceCache::reset_peak_stats() {
  DeviceLock lock(*this);
  std::lock_guard<SpinLock> guard(stats_lock_);
  for_each_stat([](Stat& s) { s.reset_peak(); });
}

void DeviceCache::reset_accumulated_stats() {
  DeviceLock lock(*this);
  lock_all_shards();
  std::lock_guard<SpinLock> guard(stats_lock_);
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
  for (auto& [stream, state] : streams_) state->totals = ShardTotals{};
#define STREAMALLOC_RESET_COUNT(name, help) stats_.name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_RESET_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_RESET_COUNT)
#undef STREAMALLOC_RESET_COUNT
  stats_.free_to_reusable_us.fill(0);
  accumulated_reset_ = true;
}

}  // namespace streamalloc

namespace streamalloc {

std::int64_t DeviceCache::allocated_bytes_now() const {
  std::lock_guard<SpinLock> guard(stats_lock_);
  return stats_.allocated_bytes[0].current;
}

void DeviceCache::account_allocated(const Block* block, std::size_t requested) {
  const PoolKind pool = block->segment->pool;
  const auto size = static_cast<std::int64_t>(block->size);
  std::lock_guard<SpinLock> guard(stats_lock_);
  stat_increase(&DeviceStats::allocation, pool, 1);
  stat_increase(&DeviceStats::allocated_bytes, pool, size);
  stat_increase(&DeviceStats::requested_bytes, pool, static_cast<std::int64_t>(requested));
  stat_increase(&DeviceStats::active, pool, 1);
  stat_increase(&DeviceStats::active_bytes, pool, size);
}

void DeviceCache::account_freed(const Block* block) {
  const PoolKind pool = block->segment->pool;
  std::lock_guard<SpinLock> guard(stats_lock_);
  stat_decrease(&DeviceStats::allocation, pool, 1);
  stat_decrease(&DeviceStats::allocated_bytes, pool, static_cast<std::int64_t>(block->size));
}

// Requested bytes stay counted while a freed block is pending, as PyTorch counts them until the
// block's events complete (requested_bytes follows active blocks, not allocated ones).
void DeviceCache::account_inactive(Block* block) {
  const PoolKind pool = block->segment->pool;
  std::lock_guard<SpinLock> guard(stats_lock_);
  stat_decrease(&DeviceStats::active, pool, 1);
  stat_decrease(&DeviceStats::active_bytes, pool, static_cast<std::int64_t>(block->size));
  stat_decrease(&DeviceStats::requested_bytes, pool, static_cast<std::int64_t>(block->requested));
  block->requested = 0;
}

}  // namespace streamalloc
