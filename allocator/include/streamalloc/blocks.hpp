// The block table as reports see it: one BlockInfo per block, one SegmentInfo per segment. Filled by
// the device cache, written to snapshots and read back from them, printed by report.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "streamalloc/pools.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

// One block as reported by blocks() and snapshots.
struct BlockInfo {
  enum class State { kAllocated, kPendingFree, kFree };
  std::uintptr_t address = 0;
  std::uintptr_t segment_address = 0;
  std::size_t size = 0;            // bytes the block occupies
  std::size_t requested_size = 0;  // bytes the caller asked for (0 when free)
  State state = State::kFree;
  bool settled = false;                  // free and safe for any stream
  Stream allocation_stream = 0;          // stream of the last allocation (owner stream when free)
  std::vector<Stream> recorded_streams;  // other streams recorded on it
  std::uint32_t record_stream_calls = 0;
  std::uint32_t pending_fences = 0;  // fences still to complete before reuse
  double age_ms = 0;                 // since allocated (live) or freed (pending/free); a free block
                                     // whose free took the fast path: since it was allocated
};

struct SegmentInfo {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;  // bytes behind it (of an expandable segment: its mapped pages)
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  bool is_large = false;
  Stream stream = 0;  // stream the segment was reserved for
  PoolId pool;        // the memory pool the segment belongs to ({0, 0}: the default pool)
  // An expandable segment (the expandable_segments option) grows and shrinks in place; as in PyTorch's
  // snapshots, each run of its mapped pages is reported as a segment of its own (total_size: the run),
  // inside a reserved address range of reserved_address_bytes (0 for a fixed segment).
  bool expandable = false;
  std::size_t reserved_address_bytes = 0;
  std::vector<BlockInfo> blocks;  // in address order
};

// How a live block of an expandable segment lies in physical memory, for sending it to another
// process (CUDA IPC as PyTorch's expandable segments do it, Allocator::share_pieces): the pieces (each
// one physical allocation of one page) that hold a byte of the block, side by side in address order,
// each with the POSIX file descriptor the backend exported it as (the backend's: open while the piece
// is mapped, which it stays while the block is live); the block starts `offset` bytes into the first.
// `pieces` is empty for a block of a fixed segment (Allocator::segment_base shares those).
struct SharedPieces {
  struct Piece {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    int fd = -1;
  };
  std::vector<Piece> pieces;
  std::size_t offset = 0;
};

const char* to_string(BlockInfo::State state);  // "active_allocated" | "active_pending_free" | "inactive"

}  // namespace streamalloc
