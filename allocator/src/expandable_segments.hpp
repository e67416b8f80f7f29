// ExpandableSegments: whether a device cache's default pool grows expandable segments, the page size
// they map in, and the segment each (stream, size class) grows (docs/design.md, "Expandable segments").
// Older segments of a (stream, size class), full, still give free pages back; only the newest grows.
// The growth itself allocates, maps and accounts, so it is the cache's (device_cache_expandable.cpp).
// Every method runs under the device lock.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <utility>

#include "block.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class ExpandableSegments {
 public:
  using Growing = std::map<std::pair<Stream, SizeClass>, Segment*>;

  // Decides once, at the cache's construction: on when the option is and the backend maps virtual
  // memory on `device` (expandable_segments.cpp warns once per process when it does not).
  void set_up(bool option, Backend& backend, int device);
  bool on() const { return page_bytes_ != 0; }
  std::size_t page_bytes() const { return page_bytes_; }  // 0 while off

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
  std::size_t page_bytes_ = 0;
  Growing growing_;
};

}  // namespace streamalloc
