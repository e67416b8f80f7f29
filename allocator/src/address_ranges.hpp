// AddressRanges: the reserved virtual address ranges of one device and the mappings inside them, with
// the checks of the Backend's virtual-memory contract (backend.hpp). Both backends keep one per device:
// the simulated device because this is its whole model of the address space, the CUDA backend because
// unmapping needs the physical handle of each mapping and because a misuse caught here gets a message
// that says what was wrong instead of the driver's CUDA_ERROR_INVALID_VALUE.
//
// A mapping is what one map_pages call made: one physical allocation of whole pages (`page_bytes`, the
// device's granularity) at a page-aligned address inside a range, carrying the backend's handle of its
// memory (0 in the simulation), and the descriptor it was exported as (Backend::export_piece; -1 until
// it is), which the backend closes when the mapping goes. Mappings are unmapped whole only, alone or
// several side by side.
// Mappings are kept sparsely, by address, so a range as large as the device's address space costs
// nothing until memory is mapped into it.
//
// Not thread-safe: the owning backend holds its lock around every call. Misuse throws
// Error(kBackend) whose message starts with the caller's `call` text, and changes nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <string>

#include "streamalloc/types.hpp"

namespace streamalloc {

class AddressRanges {
 public:
  using Handle = std::uint64_t;

  struct Mapping {
    std::size_t bytes = 0;
    Handle handle = 0;
    int exported = -1;  // the descriptor export_piece made for it, or -1
  };

  explicit AddressRanges(std::size_t page_bytes) : page_bytes_(page_bytes) {}

  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t reserved_bytes() const { return reserved_bytes_; }  // SUM of the ranges' sizes
  std::size_t mapped_bytes() const { return mapped_bytes_; }      // SUM of the mappings' sizes, every range
  std::size_t mapping_count() const { return mapping_count_; }    // COUNT of mappings, every range
  std::size_t range_count() const { return ranges_.size(); }      // COUNT

  static std::string hex(std::uintptr_t value) {
    char buf[2 + 2 * sizeof value + 1];
    std::snprintf(buf, sizeof buf, "0x%jx", static_cast<std::uintmax_t>(value));
    return buf;
  }

  // A size for reserve_address_range or map_pages: a positive multiple of the page size.
  void check_size(std::size_t bytes, const std::string& call) const {
    if (bytes == 0 || bytes % page_bytes_ != 0) {
      fail(call, "the size must be a positive multiple of the granularity (" + std::to_string(page_bytes_) +
                     " bytes); round it up with vm_granularity()");
    }
  }

  // Records a range the backend has just reserved (page-aligned, disjoint from every other range).
  void add_range(std::uintptr_t base, std::size_t bytes) {
    ranges_.emplace(base, Range{bytes, {}});
    reserved_bytes_ += bytes;
  }

  // A release_address_range: exactly a reserved range, with nothing mapped in it.
  void check_release(std::uintptr_t base, std::size_t bytes, const std::string& call) const {
    const auto it = ranges_.find(base);
    if (it == ranges_.end()) {
      fail(call,
           "the address is not the base of a range reserved on this device (double release, or a pointer "
           "reserve_address_range did not return)");
    }
    if (it->second.bytes != bytes) {
      fail(call, "the range has " + std::to_string(it->second.bytes) + " bytes; pass the reserved size");
    }
    if (!it->second.mappings.empty()) {
      fail(call, std::to_string(it->second.mappings.size()) +
                     " mapping(s) of the range are still mapped (the first at " +
                     hex(it->second.mappings.begin()->first) + "); unmap_pages them first");
    }
  }

  void remove_range(std::uintptr_t base) {
    const auto it = ranges_.find(base);
    reserved_bytes_ -= it->second.bytes;
    ranges_.erase(it);
  }

  // A map_pages: page-aligned, inside one range, overlapping no mapping.
  void check_map(std::uintptr_t at, std::size_t bytes, const std::string& call) const {
    const Range& range = range_of(at, bytes, call);
    auto next = range.mappings.lower_bound(at);
    if (next != range.mappings.begin()) {
      const auto before = std::prev(next);
      if (before->first + before->second.bytes > at) {
        fail(call, "the page at " + hex(at) + " is already mapped (by the mapping at " + hex(before->first) +
                       "); unmap it first or map elsewhere");
      }
    }
    if (next != range.mappings.end() && next->first - at < bytes) {
      fail(call, "the page at " + hex(next->first) + " is already mapped; unmap it first or map elsewhere");
    }
  }

  // Records the mapping the backend has just made; check_map() passed for it.
  void add_mapping(std::uintptr_t at, std::size_t bytes, Handle handle) {
    range_containing(at)->second.mappings.emplace(at, Mapping{bytes, handle, -1});
    mapped_bytes_ += bytes;
    ++mapping_count_;
  }

  // An unmap_pages: page-aligned, inside one range, exactly whole mappings side by side. Returns how many.
  std::size_t check_unmap(std::uintptr_t at, std::size_t bytes, const std::string& call) const {
    const Range& range = range_of(at, bytes, call);
    const std::uintptr_t end = at + bytes;
    auto it = range.mappings.upper_bound(at);
    if (it != range.mappings.begin()) {
      const auto before = std::prev(it);
      if (before->first < at && before->first + before->second.bytes > at) cuts(call, before->first, before->second);
      if (before->first == at) it = before;
    }
    std::size_t count = 0;
    for (std::uintptr_t expected = at; expected < end; ++it, ++count) {
      if (it == range.mappings.end() || it->first != expected) {
        fail(call, "the page at " + hex(expected) + " is not mapped (unmapped twice, or never mapped)");
      }
      const std::uintptr_t mapping_end = it->first + it->second.bytes;
      if (mapping_end > end) cuts(call, it->first, it->second);
      expected = mapping_end;
    }
    return count;
  }

  // Calls fn(address, bytes, handle) for every mapping in [at, at + bytes), which check_unmap() passed.
  template <typename Fn>
  void for_each_mapping_in(std::uintptr_t at, std::size_t bytes, Fn fn) const {
    const Range& range = range_containing(at)->second;
    for (auto it = range.mappings.find(at); it != range.mappings.end() && it->first < at + bytes; ++it) {
      fn(it->first, it->second.bytes, it->second.handle);
    }
  }

  // Forgets one mapping once the backend has unmapped it; returns what it was (its descriptor to close).
  Mapping remove_mapping(std::uintptr_t at) {
    auto& mappings = range_containing(at)->second.mappings;
    const auto it = mappings.find(at);
    const Mapping removed = it->second;
    mapped_bytes_ -= it->second.bytes;
    --mapping_count_;
    mappings.erase(it);
    return removed;
  }

  // The mapping that starts exactly at `at`; nullptr when none does.
  Mapping* mapping_at(std::uintptr_t at) {
    const auto range = range_containing(at);
    if (range == ranges_.end()) return nullptr;
    const auto it = range->second.mappings.find(at);
    return it == range->second.mappings.end() ? nullptr : &it->second;
  }

  // True when [at, at + bytes) lies inside one range: an address the device may name, mapped or not.
  bool reserved(std::uintptr_t at, std::size_t bytes) const {
    const auto it = range_containing(at);
    return it != ranges_.end() && bytes <= it->second.bytes && at - it->first <= it->second.bytes - bytes;
  }

  // True when every byte of [at, at + bytes) lies in mappings of one range: the device may touch it.
  bool mapped(std::uintptr_t at, std::size_t bytes) const {
    if (bytes == 0 || !reserved(at, bytes)) return false;
    const Range& range = range_containing(at)->second;
    auto it = range.mappings.upper_bound(at);
    if (it == range.mappings.begin()) return false;
    --it;                         // the last mapping that starts at or before `at`
    std::uintptr_t covered = at;  // every byte of [at, covered) is mapped
    for (;;) {
      if (it->first > covered) return false;  // a hole
      covered = std::max(covered, it->first + it->second.bytes);
      if (covered - at >= bytes) return true;
      if (++it == range.mappings.end()) return false;
    }
  }

  // Every invariant, recomputed: ranges are page-aligned and disjoint, mappings are whole pages inside
  // their range and disjoint, and the sums match. Returns what is wrong, empty when nothing is.
  std::string validate() const {
    std::size_t reserved = 0;
    std::size_t mapped = 0;
    std::size_t count = 0;
    std::uintptr_t end_of_previous = 0;
    for (const auto& [base, range] : ranges_) {
      if (base % page_bytes_ != 0 || range.bytes == 0 || range.bytes % page_bytes_ != 0) {
        return "range " + hex(base) + " (" + std::to_string(range.bytes) + " bytes) is not page-aligned";
      }
      if (base < end_of_previous) return "range " + hex(base) + " overlaps the range before it";
      end_of_previous = base + range.bytes;
      std::uintptr_t end_of_mapping = base;
      for (const auto& [at, mapping] : range.mappings) {
        if (at % page_bytes_ != 0 || mapping.bytes == 0 || mapping.bytes % page_bytes_ != 0 || at < base ||
            mapping.bytes > range.bytes || at - base > range.bytes - mapping.bytes) {
          return "mapping " + hex(at) + " (" + std::to_string(mapping.bytes) + " bytes) is not whole pages of range " +
                 hex(base);
        }
        if (at < end_of_mapping) return "mapping " + hex(at) + " overlaps the mapping before it";
        end_of_mapping = at + mapping.bytes;
        mapped += mapping.bytes;
      }
      reserved += range.bytes;
      count += range.mappings.size();
    }
    if (reserved != reserved_bytes_)
      return "reserved bytes are " + std::to_string(reserved_bytes_) + ", the ranges sum to " +
             std::to_string(reserved);
    if (mapped != mapped_bytes_)
      return "mapped bytes are counted as " + std::to_string(mapped_bytes_) + ", the mappings sum to " +
             std::to_string(mapped);
    if (count != mapping_count_)
      return "mappings are counted as " + std::to_string(mapping_count_) + ", the ranges hold " + std::to_string(count);
    return {};
  }

  // Calls fn(base, bytes) for every range (the owner's teardown).
  template <typename Fn>
  void for_each_range(Fn fn) const {
    for (const auto& [base, range] : ranges_) fn(base, range.bytes);
  }

 private:
  struct Range {
    std::size_t bytes = 0;
    std::map<std::uintptr_t, Mapping> mappings;  // by address
  };
  using Ranges = std::map<std::uintptr_t, Range>;

  [[noreturn]] static void fail(const std::string& call, const std::string& why) {
    throw Error(ErrorCode::kBackend, call + ": " + why);
  }
  [[noreturn]] static void cuts(const std::string& call, std::uintptr_t at, const Mapping& mapping) {
    fail(call, "the bytes cut the mapping at " + hex(at) + " (" + std::to_string(mapping.bytes) +
                   " bytes); a mapping is unmapped whole, as map_pages made it");
  }

  // The range whose addresses include `at`, or end().
  Ranges::const_iterator range_containing(std::uintptr_t at) const {
    auto it = ranges_.upper_bound(at);
    if (it == ranges_.begin()) return ranges_.end();
    --it;
    return at - it->first < it->second.bytes ? it : ranges_.end();
  }
  Ranges::iterator range_containing(std::uintptr_t at) {
    const auto found = static_cast<const AddressRanges&>(*this).range_containing(at);
    return found == ranges_.cend() ? ranges_.end() : ranges_.erase(found, found);  // const -> mutable
  }

  // The range holding all of [at, at + bytes), which must be whole pages.
  const Range& range_of(std::uintptr_t at, std::size_t bytes, const std::string& call) const {
    check_size(bytes, call);
    if (!reserved(at, bytes)) {
      fail(call,
           "the pages are not inside one range reserved on this device (reserve_address_range first, and "
           "stay inside it)");
    }
    if (at % page_bytes_ != 0) {
      fail(call, "the address is not aligned to the granularity (" + std::to_string(page_bytes_) + " bytes)");
    }
    return range_containing(at)->second;
  }

  std::size_t page_bytes_;
  Ranges ranges_;
  std::size_t reserved_bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t mapping_count_ = 0;
};

}  // namespace streamalloc
