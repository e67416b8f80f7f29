// SegmentPieces: the physical allocations mapped into an expandable segment's address range, by
// address (docs/design.md, "Expandable segments"): each one page, as PyTorch's format for sharing them
// with another process needs (a run of equal pieces). A piece goes back only whole (the backend cannot
// give back part of one). The pieces tile exactly the bytes the segment's blocks cover
// (ExpandableSegments::validate checks it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

namespace streamalloc {

class SegmentPieces {
 public:
  // Whole pieces side by side: [address, address + bytes).
  struct Run {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };

  std::size_t count() const { return pieces_.size(); }  // COUNT
  std::size_t bytes() const { return bytes_; }          // SUM of their sizes
  bool empty() const { return pieces_.empty(); }

  // Records a piece just mapped where no piece lies.
  void add(std::uintptr_t address, std::size_t bytes) {
    pieces_.emplace(address, bytes);
    bytes_ += bytes;
  }

  // The pieces that lie entirely inside [begin, end), which is mapped (no hole in it): they are side by
  // side. Empty (bytes 0) when no piece does.
  Run whole_inside(std::uintptr_t begin, std::uintptr_t end) const {
    Run run;
    for (auto it = pieces_.lower_bound(begin); it != pieces_.end(); ++it) {
      const auto [address, bytes] = *it;
      if (address >= end || bytes > end - address) break;               // past the end, or across it
      if (run.bytes != 0 && address != run.address + run.bytes) break;  // a hole: stop before it
      if (run.bytes == 0) run.address = address;
      run.bytes += bytes;
    }
    return run;
  }

  // Forgets the pieces of `run`, which must be exactly whole pieces side by side (the backend has just
  // unmapped them); anything else is a broken invariant and changes nothing. Returns how many.
  std::size_t remove(Run run) {
    const auto first = pieces_.find(run.address);
    auto last = first;
    for (std::uintptr_t at = run.address; at != run.address + run.bytes; ++last) {
      if (last == pieces_.end() || last->first != at || last->second > run.address + run.bytes - at) {
        throw std::logic_error("streamalloc invariant broken: " + std::to_string(run.bytes) + " bytes at " +
                               std::to_string(run.address) + " are not whole pieces of an expandable segment");
      }
      at += last->second;
    }
    bytes_ -= run.bytes;
    std::size_t removed = 0;
    for (auto it = first; it != last; ++removed) it = pieces_.erase(it);
    return removed;
  }

  // Calls fn(address, bytes) for every piece that holds a byte of [begin, end), in address order.
  template <typename Fn>
  void for_each_holding(std::uintptr_t begin, std::uintptr_t end, Fn fn) const {
    auto it = pieces_.upper_bound(begin);
    if (it != pieces_.begin() && std::prev(it)->first + std::prev(it)->second > begin) --it;
    for (; it != pieces_.end() && it->first < end; ++it) fn(it->first, it->second);
  }

  // Calls fn(address, bytes) for every piece, in address order.
  template <typename Fn>
  void for_each(Fn fn) const {
    for (const auto& [address, bytes] : pieces_) fn(address, bytes);
  }

 private:
  std::map<std::uintptr_t, std::size_t> pieces_;  // address -> bytes
  std::size_t bytes_ = 0;
};

}  // namespace streamalloc
