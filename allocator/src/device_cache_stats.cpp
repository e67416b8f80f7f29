// DeviceCache: the stats, copied out (the ledger's part and every shard's) and reset, and the shards'
// headroom gathered for the ledger (stats_ledger.hpp) when the device's falls short; the device's part
// and the peaks are the ledger's.
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
    shards_.lock_all();
    copy = stats_with_shards();
    wait_ticks = ledger_.lock_wait_ticks();
    held_ticks = ledger_.lock_held_ticks();
    for (const auto& [stream, state] : shards_) {
      const StreamPending& p = state->fences.pending_stats();
      if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
    }
  }
  copy.device_lock_wait_ns = cycle_clock::to_ns(wait_ticks);
  copy.device_lock_held_ns = cycle_clock::to_ns(held_ticks);
  return copy;
}

DeviceStats DeviceCache::stats_with_shards() const {
  DeviceStats sum = ledger_.stats();
  for (const auto& [stream, state] : shards_) StatsLedger::add_shard_part(sum, state->stats);
  return sum;
}

// Shard by shard, each locked until the call returns, only what is missing: the shards not visited
// keep running their fast paths, and those visited keep what was not needed. Only when every shard has
// given all it has is the device's current known with nothing moving, and a peak may rise.
void DeviceCache::gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device) {
  for (const auto& [stream, state] : shards_) {
    if (device >= needed) break;
    shards_.lock(*state);
    std::int64_t& part = state->stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    const std::int64_t take = std::min(part, needed - device);
    device += take;
    part -= take;
  }
}

// The peaks of the fast path's stats restart at the device's current (every shard's part added), and
// all headroom is gone: the next increase anywhere raises the peak.
void DeviceCache::reset_peak_stats() {
  DeviceLock lock(*this);
  shards_.lock_all();
  ledger_.reset_peaks(stats_with_shards());
  for (const auto& [stream, state] : shards_) {
    state->fences.pending_stats().pending_blocks.reset_peak();
    state->fences.pending_stats().pending_bytes.reset_peak();
    for (auto& room : state->stats.headroom) room.fill(0);
  }
}

void DeviceCache::reset_accumulated_stats() {
  DeviceLock lock(*this);
  shards_.lock_all();
  // A shard's part of current is its allocated - freed: it moves to the device's part first.
  for (auto& [stream, state] : shards_) {
    state->fences.pending_stats().pending_blocks.reset_accumulated();
    state->fences.pending_stats().pending_bytes.reset_accumulated();
    ledger_.fold_shard_part(state->stats);
  }
  ledger_.reset_accumulated();
}

std::int64_t DeviceCache::allocated_bytes_now() const {
  shards_.lock_all();
  return stats_with_shards().allocated_bytes[0].current;
}

}  // namespace streamalloc
