// Memory pools: the default pool every allocation comes from, and private pools that a CUDA graph (or
// PyTorch's MemPool) owns. A private pool has its own segments and free lists: a block never moves
// between pools, so memory a graph's replays write into is never handed to another caller. Allocations
// are routed to a private pool while a route for it is open and its filter accepts the allocating
// stream (docs/design.md, "Pools").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "streamalloc/types.hpp"

namespace streamalloc {

// A pool's id, as PyTorch's MempoolId_t: {0, 0} is the default pool; PyTorch numbers graph pools
// {id, 0} and user MemPools {0, id}.
struct PoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;

  bool is_default() const { return first == 0 && second == 0; }
  friend bool operator==(PoolId a, PoolId b) { return a.first == b.first && a.second == b.second; }
  friend bool operator!=(PoolId a, PoolId b) { return !(a == b); }
  friend bool operator<(PoolId a, PoolId b) { return a.first != b.first ? a.first < b.first : a.second < b.second; }
};

// Decides, on the allocating thread, whether an allocation on `stream` goes to the route's pool.
using PoolFilter = std::function<bool(Stream)>;

// Where a private pool's segments come from instead of the backend (PyTorch's MemPool(allocator=...)):
// `reserve` returns `bytes` of device memory on `device`, or nullptr when it has none; `release` gives
// back exactly what `reserve` returned. Both run with the device cache's lock held, and must not call
// back into this allocator.
struct SegmentAllocator {
  std::function<void*(int device, std::size_t bytes)> reserve;
  std::function<void(int device, void* ptr, std::size_t bytes)> release;
};

// One pool of one device, as stats and reports show it.
struct PoolInfo {
  PoolId id;
  int use_count = 0;    // owners (graphs, MemPools, open routes); 0: freeable (private pools)
  bool routed = false;  // a route to the pool is open
  bool use_on_oom = false;
  bool no_split = false;
  std::size_t segments = 0;
  std::size_t reserved_bytes = 0;
  std::size_t allocated_bytes = 0;  // live blocks
  std::size_t active_bytes = 0;     // live and pending blocks
  std::size_t live_blocks = 0;
};

// A private pool's block layout, saved so that a later restore recreates it (torch.compile's CUDA graph
// trees checkpoint a pool after recording a graph and restore it before recording the next one).
struct BlockLayout {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // allocated blocks: the size the caller asked for
  bool allocated = false;     // live when saved (pending blocks count as freed)
  Stream stream = 0;          // allocated blocks: their allocation stream
};
struct SegmentLayout {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::vector<BlockLayout> blocks;  // in address order, covering the segment
};
struct PoolCheckpoint {
  int device = 0;
  PoolId pool;
  std::vector<SegmentLayout> segments;
};
// What a restore changed: every block of the pool that was live before it (all are freed first), and
// the blocks the checkpoint marks allocated, live again now, in the checkpoint's order. A pointer can be
// in both lists.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

}  // namespace streamalloc
