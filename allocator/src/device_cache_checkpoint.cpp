// DeviceCache: checkpoints of a private pool's block layout (streamalloc/pools.hpp). CUDA graph trees
// record several graphs into one pool; before recording the next graph they put the pool back into the
// layout it had after an earlier recording, with that recording's outputs live again. A restore frees
// every live block of the pool, waits for every fence (so each of the pool's segments is one settled
// free block), then splits the checkpoint's segments as saved and hands out the saved live blocks.
#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"

namespace streamalloc {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument,
              "streamalloc: cannot restore the memory pool's checkpoint: " + why + "; nothing was changed");
}

}  // namespace

PoolCheckpoint DeviceCache::checkpoint_pool(PoolId pool) const {
  DeviceLock lock(*this);
  shards_.lock_all();
  return report_.checkpoint(pool, const_cast<PoolSet&>(pools_).private_pool(pool, "checkpoint_pool"));
}

PoolRestore DeviceCache::restore_pool(const PoolCheckpoint& checkpoint) {
  DeviceLock lock(*this);
  shards_.lock_all();
  // Everything is checked before anything changes.
  if (checkpoint.device != device_)
    refuse(fmt::format("it was taken on device {}, not {}", checkpoint.device, device_));
  MemoryPool& pool = pools_.private_pool(checkpoint.pool, "restore_pool");
  if (pool.freeable()) refuse("the pool has no uses left (it is being freed)");
  for (const SegmentLayout& layout : checkpoint.segments) {
    const Segment* segment = segments_.containing(layout.address);
    if (segment == nullptr || segment->address != layout.address || segment->size != layout.size ||
        segment->owner != &pool) {
      refuse(fmt::format("segment {:#x} of the checkpoint is no longer a segment of the pool", layout.address));
    }
    std::uintptr_t expected = layout.address;
    for (const BlockLayout& block : layout.blocks) {
      if (block.address != expected || block.size == 0 || block.size % 512 != 0) {
        refuse(fmt::format("the layout of segment {:#x} does not tile it", layout.address));
      }
      expected += block.size;
    }
    if (expected != layout.address + layout.size) {
      refuse(fmt::format("the layout of segment {:#x} does not cover it", layout.address));
    }
  }
  for (const SegmentLayout& layout : checkpoint.segments) {
    for (const BlockLayout& block : layout.blocks) {
      if (block.allocated) shards_.get(block.stream);  // rejects a stream of another device now
    }
  }
  if (shards_.any_capturing()) refuse("a graph capture is under way on the device");

  PoolRestore result;
  std::vector<Block*> live;
  segments_.for_each([&](const Segment* segment) {
    if (segment->owner != &pool) return;
    for (Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kAllocated) live.push_back(b);
    }
  });
  for (Block* b : live) {
    result.freed.push_back(reinterpret_cast<void*>(b->address));
    free_live(b);
  }
  free_.release_held(aids_.get());
  fences_.synchronize_all();

  for (const SegmentLayout& layout : checkpoint.segments) {
    Segment* segment = const_cast<Segment*>(segments_.containing(layout.address));
    Block* rest = segment->head;
    if (rest->next != nullptr || rest->state != BlockState::kFree || !rest->settled) {
      throw std::logic_error("streamalloc: segment " + fmt::format("{:#x}", layout.address) +
                             " of a pool being restored is not one settled free block after every fence completed");
    }
    free_.remove(rest);
    // Free pieces are held back from merging until the segment is carved, then enter the free lists
    // one at a time (merging with their free neighbours, as any freed block does).
    std::vector<Block*> free_pieces;
    for (const BlockLayout& saved : layout.blocks) {
      Block* piece = rest;
      rest = rest->size > saved.size ? split_block(piece, saved.size) : nullptr;
      if (saved.allocated) {
        hand_out(piece, saved.requested, saved.stream);
        result.allocated.push_back(reinterpret_cast<void*>(piece->address));
      } else {
        piece->held = true;
        free_pieces.push_back(piece);
      }
    }
    for (Block* piece : free_pieces) {
      piece->held = false;
      free_.insert(free_.merge_neighbours(piece));
    }
  }
  return result;
}

bool DeviceCache::pool_live_blocks_are(PoolId pool, const std::vector<const void*>& expected) const {
  DeviceLock lock(*this);
  shards_.lock_all();
  const MemoryPool* target = pools_.find(pool);
  if (target == nullptr) return expected.empty();
  return report_.live_blocks_are(*target, expected);
}

}  // namespace streamalloc
