// DeviceCache: construction, teardown, and the state kept per stream (its shard) as device-locked code
// finds and locks it.
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
  set_up_expandable_segments();
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

// Streams are checked once, when the cache first sees them, so the hot path pays only a lookup.
StreamState& DeviceCache::find_or_add_stream(Stream stream) {
  // The shard table first: one hashed probe where the map walks a tree (calls that touch two streams
  // alternate between them and miss last_stream_ every time).
  if (StreamState* shard = shards_.find(stream)) {
    last_stream_ = shard;
    return *shard;
  }
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
    // Published for the fast path once complete; a full table leaves the stream to this path.
    shards_.insert(stream, it->second.get());
  }
  last_stream_ = it->second.get();
  return *last_stream_;
}

void DeviceCache::lock_all_shards() const {
  for (const auto& [stream, state] : streams_) lock_shard(*state);
}

void DeviceCache::unlock_shards() const {
  for (StreamState* state : locked_shards_) {
    state->locked_by_device = false;
    state->lock.unlock();
  }
  locked_shards_.clear();
}

// Out of device_cache_shards.cpp, so that the fast path's own live-table insert stays inlined there.
void DeviceCache::enter_shard(Block* block) {
  block->in_shard = true;
  block->split_in_shard = block->is_split();
  shard_blocks_.insert(block->address, block);
}

void DeviceCache::leave_shard(Block* block) {
  block->in_shard = false;
  shard_blocks_.erase(block->address);
}

Block* DeviceCache::find_live(std::uintptr_t address) {
  Block* block = shard_blocks_.find(address);
  if (block == nullptr) return nullptr;
  stream_state(block->stream);  // its shard, locked: the fast path may have parked it meanwhile
  return block->state == BlockState::kAllocated ? block : nullptr;
}

std::size_t DeviceCache::live_count() const {
  std::size_t live = 0;
  for (const auto& [stream, state] : streams_) {
    lock_shard(*state);
    live += state->live.size();
  }
  return live;
}

bool DeviceCache::owns_live(const void* ptr) const {
  DeviceLock lock(*this);
  return const_cast<DeviceCache*>(this)->find_live(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

bool DeviceCache::owns_address(const void* ptr) const {
  DeviceLock lock(*this);
  return segments_.containing(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

}  // namespace streamalloc
