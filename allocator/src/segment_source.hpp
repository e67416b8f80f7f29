// SegmentSource: the device memory a cache carves its blocks from. It reserves segments from the
// backend and gives them back, and knows every segment by address. A segment starts as one free,
// settled block (fresh memory: no stream has touched it); splitting and merging blocks inside it is
// the cache's business.
//
// Two kinds of segment: a fixed one is one reserve() of the backend; an expandable one is a reserved
// address range into which physical memory is mapped in pieces (each one physical allocation of whole
// pages of the backend's granularity), which grows at its end and gives whole free pieces back anywhere
// (docs/design.md, "Expandable segments"). Which segment grows when, in pieces of what size, and which
// free pieces go back, is the cache's policy; this class does the mapping and keeps the blocks covering
// exactly the mapped pieces, and the segment's record of its pieces (Segment::pieces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "block.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class SegmentSource {
 public:
  SegmentSource(Backend& backend, int device) : backend_(backend), device_(device) {}
  // Deletes the bookkeeping only: segments still here may hold live blocks, so their memory stays
  // reserved.
  ~SegmentSource();
  SegmentSource(const SegmentSource&) = delete;
  SegmentSource& operator=(const SegmentSource&) = delete;

  // A new segment of `bytes` of size class `pool` for memory pool `owner`, reserved for `stream`,
  // holding one free settled block; nullptr when the device has not enough free memory.
  Segment* reserve(SizeClass pool, MemoryPool* owner, std::size_t bytes, Stream stream);
  // Give `segment` back to the device (an expandable one: its pieces unmapped, its range released). It
  // must hold exactly one block (of an expandable segment: all its pieces), which is deleted with it. A
  // backend error changes nothing, except one releasing the range of pages already unmapped: logged,
  // and the segment goes with its addresses still reserved.
  void release(Segment* segment);

  // ---- expandable segments: `bytes` are whole pages of the backend's granularity ----
  // `piece_bytes` (whole pages too) is the most one physical allocation of a growth maps: `bytes` is
  // mapped as pieces of `piece_bytes`, the last one what remains.
  enum class Refusal { kNone, kNoAddressSpace, kNoMemory };
  // A new expandable segment: `range_bytes` of addresses, of which the first `bytes` are mapped and
  // hold one free settled block. nullptr, with nothing left reserved or mapped, when the address
  // space or the memory cannot be had (`why` says which).
  Segment* reserve_expandable(SizeClass pool, MemoryPool* owner, std::size_t range_bytes, std::size_t bytes,
                              std::size_t piece_bytes, Stream stream, Refusal* why);
  // Maps `bytes` more after the segment's last block (the range must have room). The new memory is a
  // new free settled block after the last one, in no index, returned; nullptr, nothing mapped, when
  // the device is full (also when it fills after some of the pieces are mapped: they go back).
  Block* grow(Segment* segment, std::size_t bytes, std::size_t piece_bytes);
  // Unmaps `run`, whole pieces of the segment inside `block`, a free block in no index that is not all
  // of its segment. What stays of the block before the run is `block` (deleted when nothing stays),
  // what stays after is a new block in the same state after it; both in no index, nullptr where
  // nothing.
  struct Remains {
    Block* before = nullptr;
    Block* after = nullptr;
  };
  Remains unmap(Segment* segment, Block* block, SegmentPieces::Run run);

  // The segment whose span contains `address`, or nullptr.
  const Segment* containing(std::uintptr_t address) const;
  // Bytes behind every segment: fixed segments' sizes plus expandable segments' mapped pages.
  std::size_t reserved_bytes() const { return reserved_; }
  std::size_t count() const { return segments_.size(); }
  // Every segment, in address order.
  template <typename F>
  void for_each(F&& visit) const {
    for (const auto& [address, segment] : segments_) visit(segment.get());
  }
  std::vector<Segment*> all() const;

 private:
  // Maps [at, at + bytes) in pieces of at most `piece_bytes` and records them in `pieces`. On a refusal returns
  // false, and on an error throws, with nothing left mapped.
  bool map_pieces(std::uintptr_t at, std::size_t bytes, std::size_t piece_bytes, SegmentPieces* pieces);
  Segment* add(std::uintptr_t address, std::size_t bytes, SizeClass pool, MemoryPool* owner, Stream stream);

  Backend& backend_;
  const int device_;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments_;  // by address
  std::size_t reserved_ = 0;
};

}  // namespace streamalloc
