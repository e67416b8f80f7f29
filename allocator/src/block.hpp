// Blocks and segments: the block table every other part of the cache works on.
#pragma once

#include <time.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "cache_line_allocator.hpp"
#include "segment_pieces.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

// The steady clock of block ages, fence times and pending history.
using Clock = std::chrono::steady_clock;

// A timestamp for block ages in reports: CLOCK_MONOTONIC_COARSE (the clock behind steady_clock, at
// jiffy resolution) is cheaper than a precise read, and the hot path takes one per op.
inline Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

enum class BlockState : std::uint8_t {
  kAllocated,  // handed to a caller
  kPending,    // freed, but waiting for fences on the other streams it was used on
  kFree,       // in a free index: settled (safe for any stream) or owned by one stream
};

struct Segment;
struct MemoryPool;

// Cache-line aligned: the blocks of different streams, which their threads' fast paths write, never
// share a line (docs/design.md, "Nothing shared is written on the fast path").
struct alignas(kCacheLine) Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // caller's size while allocated
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address neighbours within the segment
  Block* next = nullptr;
  BlockState state = BlockState::kFree;
  // Free blocks only: no work on any stream can still touch the block, so any stream may take it.
  bool settled = false;
  // Counted in inactive_split (a free block inside a segment that holds other blocks).
  bool counted_inactive_split = false;
  // Allocation stream while allocated/pending; owner stream while free and unsettled.
  Stream stream = 0;
  // Other streams the block was used on while allocated (record_stream, or a free on another stream);
  // usually 0-2 entries.
  std::vector<Stream> recorded_streams;
  std::uint32_t record_stream_calls = 0;
  // Pending: fences on other streams still to complete.
  std::uint32_t fences_left = 0;
  // Pending or free-unsettled: the batch sequence number on `stream` whose fence settles the block.
  std::uint64_t settle_seq = 0;
  // Key of the free index the block sits in (owner stream, or a shared key for settled blocks).
  Stream index_key = 0;
  // Allocated at (live) or freed at (pending/free), except that a free block kept in its stream's hot
  // list keeps the time it was allocated (the fast path's free reads no clock: docs/design.md, "Locking").
  Clock::time_point since{};
  // Intrusive links of the owner stream's list of unsettled blocks, in settle_seq order.
  Block* settle_prev = nullptr;
  Block* settle_next = nullptr;
  bool in_settle_list = false;
  // Free but held back from reuse by a debugging aid (quarantine): in no index, never merged.
  bool held = false;
  // Free, owned by its stream, and kept unmerged in that stream's hot list (hot_list.hpp) for a reuse
  // of its size.
  bool hot = false;
  // Allocated or hot: in its stream's shard (Shard::live or ::hot), where the per-stream fast
  // path changes it under the shard's lock alone. Written only under the device lock and the shard
  // lock, so device-locked code may read it (and address, size, segment, stream, which do not change
  // while it is set) and must leave the block's other fields alone without the shard lock.
  bool in_shard = false;
  // While in_shard: is_split(), as it was when the block entered the shard. It cannot change while the
  // block is in the shard (only a free neighbour's merge moves a link, from one block to another), and
  // the fast path reads this instead of the links, which device-locked merges may write meanwhile.
  bool split_in_shard = false;
  // While hot: the links of its hot list, its size's bin (newest first) and the age list. Written under
  // the shard lock.
  Block* hot_bin_prev = nullptr;
  Block* hot_bin_next = nullptr;
  Block* hot_older = nullptr;
  Block* hot_newer = nullptr;
  std::uint16_t hot_bin = 0;  // the bin it is in
  // check_sync: the allocation stream's tick when the block was handed out.
  std::uint64_t alloc_tick = 0;

  bool is_split() const { return prev != nullptr || next != nullptr; }

  // Blocks are made and deleted at every split and merge: each thread recycles the memory of the ones
  // it deletes (block_storage.cpp).
  static void* operator new(std::size_t size, std::align_val_t alignment);
  static void operator delete(void* ptr, std::size_t size, std::align_val_t alignment) noexcept;
};

// How many deleted Blocks' memory each thread keeps for its next ones (block_storage.cpp); 0 under
// AddressSanitizer.
std::size_t block_spares_per_thread();

struct Segment {
  std::uintptr_t address = 0;
  std::size_t size = 0;  // bytes its blocks cover (of an expandable segment: its mapped pages)
  SizeClass size_class = SizeClass::kSmall;
  MemoryPool* owner = nullptr;  // the pool that owns it: its free lists hold the segment's free blocks
  Stream stream = 0;            // stream of the allocation that reserved it
  Block* head = nullptr;
  Block* tail = nullptr;  // the last block: where an expandable segment grows and shrinks
  // Expandable segments (docs/design.md, "Expandable segments"): the bytes of the reserved address
  // range whose mapped pages the blocks cover; 0 for a fixed segment.
  std::size_t address_range = 0;
  // Of an expandable segment: the physical allocations mapped into its range, which tile exactly the
  // bytes its blocks cover and go back only whole. Empty for a fixed segment.
  SegmentPieces pieces;

  bool expandable() const { return address_range != 0; }
  // Bytes from its address to the end of its last block. Of a fixed segment: its size. An expandable
  // segment's blocks lie in mapped pages and may have unmapped pages between them (and before the
  // first), so its size (the mapped bytes) can be less.
  std::size_t span() const { return expandable() ? tail->address + tail->size - address : size; }
};

inline int class_index(SizeClass size_class) { return static_cast<int>(size_class); }

// Cut free block `block` after `size` bytes: the tail becomes a new free block in the same state (owner
// stream, settled or not, fence sequence, age) and address neighbour; `block` keeps the first `size`
// bytes. Neither is in any index afterwards. Returns the tail.
inline Block* split_block(Block* block, std::size_t size) {
  auto* rest = new Block;
  rest->address = block->address + size;
  rest->size = block->size - size;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  if (rest->next) rest->next->prev = rest;
  block->next = rest;
  if (rest->next == nullptr) block->segment->tail = rest;
  rest->state = BlockState::kFree;
  rest->settled = block->settled;
  rest->stream = block->stream;
  rest->settle_seq = block->settle_seq;
  rest->since = block->since;
  block->size = size;
  return rest;
}

}  // namespace streamalloc
