// ShardSet: the shards of one device cache and their locks (shard_set.hpp).
#include "shard_set.hpp"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "streamalloc/types.hpp"

namespace streamalloc {

// Streams are checked once, when the cache first sees them, so the hot path pays only a lookup.
Shard& ShardSet::find_or_add(Stream stream) {
  // The shard table first: one hashed probe where the map walks a tree (calls that touch two streams
  // alternate between them and miss last_ every time).
  if (Shard* shard = table_.find(stream)) {
    last_ = shard;
    return *shard;
  }
  auto it = shards_.find(stream);
  if (it == shards_.end()) {
    const int owner = backend_.stream_device(stream);
    if (owner >= 0 && owner != device_) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("streamalloc: stream {:#x} belongs to device {} but was used with memory of device {}; "
                              "pass a stream of the device you allocate on (blocks can only be used on streams of "
                              "their device).",
                              stream, owner, device_));
    }
    it = shards_.emplace(stream, std::make_unique<Shard>(stream)).first;
    // Published for the fast path once complete; a full table leaves the stream to the device lock.
    table_.insert(stream, it->second.get());
  }
  last_ = it->second.get();
  return *last_;
}

Shard* ShardSet::find(Stream stream) const {
  const auto it = shards_.find(stream);
  return it == shards_.end() ? nullptr : it->second.get();
}

void ShardSet::lock_all() const {
  for (const auto& [stream, shard] : shards_) lock(*shard);
}

void ShardSet::unlock_all() const {
  for (Shard* shard : locked_) {
    shard->locked_by_device = false;
    shard->lock.unlock();
  }
  locked_.clear();
}

Block* ShardSet::find_live(std::uintptr_t address) {
  Block* block = blocks_.find(address);
  if (block == nullptr) return nullptr;
  get(block->stream);  // its shard, locked: the fast path may have made it hot meanwhile
  return block->state == BlockState::kAllocated ? block : nullptr;
}

// Shard by shard, each locked until the call returns: the shards not visited keep running their fast
// paths. A shard with live blocks gives only what is missing and keeps the rest for its stream's next
// allocations; a shard with none, a stream between its requests or done, gives all it has, so that
// the device's headroom covers the allocations that follow without a gather each (streams taking
// turns). Only when every shard has given all it has is the device's current known with nothing
// moving, and a peak may rise.
void ShardSet::gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device) {
  for (const auto& [stream, shard] : shards_) {
    if (device >= needed) break;
    lock(*shard);
    std::int64_t& part = shard->stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    const std::int64_t take = shard->live.size() == 0 ? part : std::min(part, needed - device);
    device += take;
    part -= take;
    if (take > 0) ++shard->counts.headroom_given;
  }
}

bool ShardSet::any_capturing() const {
  for (const auto& [stream, shard] : shards_) {
    if (backend_.is_capturing(device_, stream)) return true;
  }
  return false;
}

std::size_t ShardSet::live_count() const {
  std::size_t live = 0;
  for (const auto& [stream, shard] : shards_) {
    lock(*shard);
    live += shard->live.size();
  }
  return live;
}

}  // namespace streamalloc
