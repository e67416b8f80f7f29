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

// Shard by shard, each locked until the call returns: the shards not visited yet keep running their
// fast paths. Every shard gives all it has, of every stat at once (the draws for the other stats of the
// same call then find it shared): what the device lacks goes to it, the rest to the shared headroom,
// where whichever stream raises its stats next takes it without the device lock (a stream that gave
// takes it back there too). The shard the call serves (`keep`) gives only what the device lacks of this
// stat: the call may be about to spend its other headroom. Once every shard has given, the device's
// current is known with nothing moving, and a peak may rise.
void ShardSet::gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device, SharedHeadroom& shared,
                               const ShardStats* keep) {
  // What the device still lacks, out of `part`.
  const auto to_device = [&](std::int64_t& part) {
    const std::int64_t take = std::min(part, std::max<std::int64_t>(needed - device, 0));
    device += take;
    part -= take;
    return take > 0;
  };
  for (const auto& [stream, shard] : shards_) {
    lock(*shard);
    auto& headroom = shard->stats.headroom;
    bool gave = false;
    if (&shard->stats == keep) {
      gave = to_device(headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)]);
    } else {
      for (std::size_t i = 0; i < kFastStats; ++i) {
        for (std::size_t q = 0; q < kSizeClasses; ++q) {
          std::int64_t& part = headroom[i][q];
          if (part == 0) continue;
          if (i == static_cast<std::size_t>(s) && q == static_cast<std::size_t>(p)) to_device(part);
          if (part > 0) shared.give(static_cast<FastStat>(i), static_cast<int>(q), part);
          part = 0;
          gave = true;
        }
      }
    }
    if (gave) ++shard->counts.headroom_given;
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
