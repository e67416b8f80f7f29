// DeviceCache: construction, teardown, and the state kept per stream.
#include "device_cache.hpp"

#include <spdlog/fmt/fmt.h>

#include "logging.hpp"

namespace streamalloc {

DeviceCache::DeviceCache(int device, const Options& options, Backend& backend, std::unique_ptr<DebugAids> aids)
    : device_(device),
      options_(options),
      backend_(backend),
      memory_fraction_(options.memory_fraction),
      segments_(backend, device),
      default_pool_(PoolId{}, options.cross_stream_reuse),
      events_(backend, device),
      aids_(std::move(aids)) {
  stats_.max_split_size =
      options.max_split_size_bytes == 0 ? -1 : static_cast<std::int64_t>(options.max_split_size_bytes);
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

// Streams are checked once, when the cache first sees them, so the hot path pays only a lookup.
StreamState& DeviceCache::find_or_add_stream(Stream stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    const int owner = backend_.stream_device(stream);
    if (owner >= 0 && owner != device_) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("streamalloc: stream {:#x} belongs to device {} but was used with memory of device {}; "
                              "pass a stream of the device you allocate on (blocks can only be used on streams of "
                              "their device).",
                              stream, owner, device_));
    }
    it = streams_.emplace(stream, std::make_unique<StreamState>(stream)).first;
  }
  last_stream_ = it->second.get();
  return *last_stream_;
}

bool DeviceCache::owns_live(const void* ptr) const {
  Lock lock(mutex_);
  return live_.find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

bool DeviceCache::owns_address(const void* ptr) const {
  Lock lock(mutex_);
  return segments_.containing(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

}  // namespace streamalloc
