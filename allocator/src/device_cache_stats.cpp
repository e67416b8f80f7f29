// DeviceCache: the stats, copied out and reset. They are updated where blocks change state.
#include "device_cache.hpp"

namespace streamalloc {

DeviceStats DeviceCache::stats() const {
  Lock lock(mutex_);
  DeviceStats copy = stats_;
  for (const auto& [stream, state] : streams_) {
    const StreamPending& p = state->fences.pending_stats();
    if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
  }
  return copy;
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
  Lock lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_peak(); });
}

void DeviceCache::reset_accumulated_stats() {
  Lock lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
#define STREAMALLOC_RESET_COUNT(name, help) stats_.name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_RESET_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_RESET_COUNT)
#undef STREAMALLOC_RESET_COUNT
  stats_.free_to_reusable_us.fill(0);
  accumulated_reset_ = true;
}

}  // namespace streamalloc
