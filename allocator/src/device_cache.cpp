// DeviceCache: construction, teardown, and the lookups of live blocks and addresses (the shards and
// their locks are the ShardSet's, shard_set.hpp).
#include "device_cache.hpp"

#include <spdlog/fmt/fmt.h>

#include "logging.hpp"

namespace streamalloc {

DeviceCache::DeviceCache(int device, const Options& options, Backend& backend, std::unique_ptr<DebugAids> aids)
    : device_(device),
      options_(options),
      backend_(backend),
      rounding_(options.roundup_power2_divisions),
      memory_(options.memory_fraction),
      shards_(backend, device),
      segments_(backend, device),
      pools_(device, options.cross_stream_reuse),
      ledger_(shards_),
      free_(shards_, ledger_, options),
      fences_(backend, device,
              FenceEngine::Parts{shards_, ledger_, free_, aids_, options,
                                 [this](Block* block, Clock::time_point now) { release_pending(block, now); },
                                 [this] { update_fast_path(); }}),
      report_(device, options, backend, segments_, pools_, shards_, ledger_),
      expandable_(ExpandableSegments::Parts{segments_, pools_.default_pool(), shards_, ledger_, free_, aids_, options,
                                            memory_.total()}),
      aids_(std::move(aids)) {
  ledger_.set_max_split_size(
      options.max_split_size_bytes == 0 ? -1 : static_cast<std::int64_t>(options.max_split_size_bytes));
  expandable_.set_up(options.expandable_segments, backend, device);
  update_fast_path();
}

// Segments still holding live blocks stay reserved (their memory may still be in use); the segment
// source deletes only their bookkeeping.
DeviceCache::~DeviceCache() {
  try {
    release_all();
  } catch (const std::exception& e) {
    log().warn("device {}: error while releasing memory at teardown: {}", device_, e.what());
  }
}

void DeviceCache::set_expandable_segments(bool on) {
  DeviceLock lock(*this);
  expandable_.set_up(on, backend_, device_);
  update_fast_path();
}

bool DeviceCache::expandable_segments() const {
  DeviceLock lock(*this);
  return expandable_.on();
}

void DeviceCache::set_graph_capture_record_stream_reuse(bool on) {
  DeviceLock lock(*this);
  fences_.set_capture_reuse(on);
}

bool DeviceCache::graph_capture_record_stream_reuse() const {
  DeviceLock lock(*this);
  return fences_.capture_reuse().on();
}

bool DeviceCache::owns_live(const void* ptr) const {
  DeviceLock lock(*this);
  return const_cast<ShardSet&>(shards_).find_live(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

}  // namespace streamalloc
