// MemoryPool: one pool of a device cache. The default pool serves every allocation no route claims;
// a private pool (a CUDA graph's, or a PyTorch MemPool) serves the allocations routed to it. Each pool
// owns its segments' free lists, so a block never moves between pools and merging never crosses a
// segment (docs/design.md, "Pools").
#pragma once

#include <cstddef>
#include <memory>

#include "free_lists.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"

namespace streamalloc {

struct MemoryPool {
  MemoryPool(PoolId pool_id, CrossStreamReuse policy) : id(pool_id), free(policy) {}
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  bool is_default() const { return id.is_default(); }
  // A private pool nobody uses any more: empty_cache() gives its free segments back, and erases the
  // pool once it holds none. The default pool is never freeable.
  bool freeable() const { return !is_default() && use_count == 0; }
  void note_segment(int change) { segments = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(segments) + change); }
  std::size_t segment_count() const { return segments; }
  // The free lists, read-only (validate): whether `block` is in the owned index / settled, and how many are.
  bool holds_owned(const Block* block) const { return free.contains_owned(const_cast<Block*>(block)); }
  bool holds_settled(const Block* block) const { return free.contains_settled(const_cast<Block*>(block)); }
  std::size_t owned_count() const { return free.owned_count(); }
  std::size_t settled_count() const { return free.settled_count(); }

  const PoolId id;
  FreeLists free;
  int use_count = 0;        // private pools: owners (graphs, MemPools, open routes)
  bool use_on_oom = false;  // the default pool may take its free blocks before raising OOM
  bool no_split = false;    // blocks are handed out whole
  std::size_t segments = 0;
  // Set: the pool's segments come from it instead of the backend (shared: a segment's release needs it).
  std::shared_ptr<const SegmentAllocator> segment_allocator;
};

}  // namespace streamalloc
