// ExpandableSegments: whether a device cache's default pool grows expandable segments, the page size
// they map in, and the segment each (stream, size class) grows (docs/design.md, "Expandable segments").
// Older segments of a (stream, size class), full, still give free pages back; only the newest grows.
// It grows them (mapping pages through the SegmentSource, adding the new memory to the free lists,
// counting it) and trims them (unmapping whole pieces inside settled free blocks), working on the
// cache's other components (Parts). Every method runs under the device lock.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <utility>

#include <atomic>
#include <memory>

#include "block.hpp"
#include "debug_aid.hpp"
#include "free_blocks.hpp"
#include "memory_pool.hpp"
#include "segment_source.hpp"
#include "shard_set.hpp"
#include "stats_ledger.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class ExpandableSegments {
 public:
  using Growing = std::map<std::pair<Stream, SizeClass>, Segment*>;
  // What growing and trimming work on: the cache's other components.
  struct Parts {
    SegmentSource& segments;
    MemoryPool& default_pool;  // the only pool that grows expandable segments
    ShardSet& shards;
    StatsLedger& ledger;
    FreeBlocks& free;
    const std::unique_ptr<DebugAids>& aids;  // null while every aid is off
    const Options& options;
    const std::atomic<std::size_t>& device_total;  // the device's memory (known before any growth)
  };

  explicit ExpandableSegments(Parts parts) : p_(parts) {}
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;

  // Whether new segments of the default pool are expandable: at the cache's construction from the
  // option, later from set_expandable_segments (PyTorch's setting at runtime). On only where the
  // backend maps virtual memory on `device` (expandable_segments.cpp warns once per process when it
  // does not). Switching off changes only which segments are made next: the expandable segments
  // already made keep their blocks and still give free pages back.
  void set_up(bool option, Backend& backend, int device);
  bool on() const { return on_; }
  // The page size expandable segments map in; 0 until the option was first on with virtual memory.
  std::size_t page_bytes() const { return page_bytes_; }
  // Whether an allocation from `pool` that no cached block serves grows an expandable segment.
  bool grows(const MemoryPool& pool) const { return on() && &pool == &p_.default_pool; }

  // Grows the segment of (stream, size class) at its end by whole pages, mapped as one physical
  // allocation (near `cap`: in pieces of up to 20 MiB, large, or one page, small; with expandable_ipc,
  // one page each), or starts one, so that a free block of at least `size` bytes that `stream`
  // may take is in the free lists; returns it, or nullptr when the cap (`cap`, the memory-fraction cap)
  // or the device refuses (nothing stays mapped for it then) or, with *no_address_space set, when no
  // address range could be reserved.
  Block* grow(SizeClass size_class, std::size_t size, Stream stream, std::size_t cap, bool* no_address_space);
  // Unmaps the whole pieces (physical allocations) inside the settled free blocks of `segment`; releases
  // the segment when none stays mapped. Returns the bytes given back. Outside captures only (rule 6).
  std::size_t trim(Segment* segment);
  // The expandable-segment invariants of `segment` (docs/design.md, "Expandable segments"); throws
  // std::logic_error naming `device` when one is broken.
  void validate(const Segment* segment, int device) const;

  // The segment (stream, size class) grows; nullptr when it has none.
  Segment* growing(Stream stream, SizeClass size_class) const {
    const auto found = growing_.find(std::make_pair(stream, size_class));
    return found == growing_.end() ? nullptr : found->second;
  }
  void set_growing(Stream stream, SizeClass size_class, Segment* segment) {
    growing_[std::make_pair(stream, size_class)] = segment;
  }
  // `segment` is released: no (stream, size class) grows it any more.
  void forget(const Segment* segment) {
    for (auto it = growing_.begin(); it != growing_.end();)
      it = it->second == segment ? growing_.erase(it) : std::next(it);
  }
  const Growing& all_growing() const { return growing_; }

 private:
  std::size_t release(Segment* segment);  // its one block is free and settled
  void refresh_split(Block* block);       // after a neighbour of it came or went

  Parts p_;
  bool on_ = false;
  std::size_t page_bytes_ = 0;
  Growing growing_;
};

}  // namespace streamalloc
