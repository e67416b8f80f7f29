// DeviceCache: the stats copied out and reset, under every lock (the ledger, stats_ledger.hpp, keeps
// them and resets the shards' parts itself).
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
    copy = ledger_.report(shards_);
    wait_ticks = ledger_.lock_wait_ticks();
    held_ticks = ledger_.lock_held_ticks();
  }
  copy.device_lock_wait_ns = cycle_clock::to_ns(wait_ticks);
  copy.device_lock_held_ns = cycle_clock::to_ns(held_ticks);
  return copy;
}

void DeviceCache::reset_peak_stats() {
  DeviceLock lock(*this);
  shards_.lock_all();
  ledger_.reset_peaks(shards_);
}

void DeviceCache::reset_accumulated_stats() {
  DeviceLock lock(*this);
  shards_.lock_all();
  ledger_.reset_accumulated(shards_);
}

}  // namespace streamalloc
