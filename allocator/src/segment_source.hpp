// SegmentSource: the device memory a cache carves its blocks from. It reserves segments from the
// backend and gives them back, and knows every segment by address. A segment starts as one free,
// settled block (fresh memory: no stream has touched it); splitting and merging blocks inside it is
// the cache's business. Segments that grow in place would plug in here.
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
  Segment* reserve(PoolKind pool, MemoryPool* owner, std::size_t bytes, Stream stream);
  // Give `segment` back to the device. It must hold exactly one block, which is deleted with it.
  void release(Segment* segment);

  // The segment whose memory contains `address`, or nullptr.
  const Segment* containing(std::uintptr_t address) const;
  std::size_t reserved_bytes() const { return reserved_; }
  std::size_t count() const { return segments_.size(); }
  // Every segment, in address order.
  template <typename F>
  void for_each(F&& visit) const {
    for (const auto& [address, segment] : segments_) visit(segment.get());
  }
  std::vector<Segment*> all() const;

 private:
  Backend& backend_;
  const int device_;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments_;  // by address
  std::size_t reserved_ = 0;
};

}  // namespace streamalloc
