// AddressRanges: the reserved virtual address ranges of one device and which of their pages are
// mapped, with the checks of the Backend's virtual-memory contract (backend.hpp). Both backends keep
// one per device: the simulated device because this is its whole model of the address space, the CUDA
// backend because unmapping needs the physical handle of each page and because a misuse caught here
// gets a message that says what was wrong instead of the driver's CUDA_ERROR_INVALID_VALUE.
//
// A page is `page_bytes` (the device's granularity) at a page-aligned address inside a range; each
// mapped page carries the backend's handle of its physical memory (0 in the simulation). Mapped pages
// are kept sparsely, by address, so a range as large as the device's address space costs nothing
// until pages are mapped into it.
//
// Not thread-safe: the owning backend holds its lock around every call. Misuse throws
// Error(kBackend) whose message starts with the caller's `call` text, and changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "streamalloc/types.hpp"

namespace streamalloc {

class AddressRanges {
 public:
  using Handle = std::uint64_t;

  explicit AddressRanges(std::size_t page_bytes) : page_bytes_(page_bytes) {}

  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t reserved_bytes() const { return reserved_bytes_; }  // SUM of the ranges' sizes
  std::size_t mapped_bytes() const { return mapped_pages_ * page_bytes_; }  // SUM over every range
  std::size_t range_count() const { return ranges_.size(); }  // COUNT

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

  // A release_address_range: exactly a reserved range, with every page unmapped.
  void check_release(std::uintptr_t base, std::size_t bytes, const std::string& call) const {
    const auto it = ranges_.find(base);
    if (it == ranges_.end()) {
      fail(call, "the address is not the base of a range reserved on this device (double release, or a pointer "
                 "reserve_address_range did not return)");
    }
    if (it->second.bytes != bytes) {
      fail(call, "the range has " + std::to_string(it->second.bytes) + " bytes; pass the reserved size");
    }
    if (!it->second.pages.empty()) {
      fail(call, std::to_string(it->second.pages.size()) + " page(s) of the range are still mapped (the first at " +
                     hex(it->second.pages.begin()->first) + "); unmap_pages them first");
    }
  }

  void remove_range(std::uintptr_t base) {
    const auto it = ranges_.find(base);
    reserved_bytes_ -= it->second.bytes;
    ranges_.erase(it);
  }

  // A map_pages: page-aligned, inside one range, every page unmapped.
  void check_map(std::uintptr_t at, std::size_t bytes, const std::string& call) const {
    const Range& range = range_of(at, bytes, call);
    const auto first = range.pages.lower_bound(at);
    if (first != range.pages.end() && first->first - at < bytes) {
      fail(call, "the page at " + hex(first->first) + " is already mapped; unmap it first or map elsewhere");
    }
  }

  // Records one page the backend has just mapped; check_map() passed for it.
  void add_page(std::uintptr_t page, Handle handle) {
    range_containing(page)->second.pages.emplace(page, handle);
    ++mapped_pages_;
  }

  // An unmap_pages: page-aligned, inside one range, every page mapped.
  void check_unmap(std::uintptr_t at, std::size_t bytes, const std::string& call) const {
    const Range& range = range_of(at, bytes, call);
    const std::uintptr_t hole = first_unmapped(range, at, bytes);
    if (hole != 0) fail(call, "the page at " + hex(hole) + " is not mapped (unmapped twice, or never mapped)");
  }

  // The handle of a mapped page.
  Handle handle(std::uintptr_t page) const { return range_containing(page)->second.pages.at(page); }

  // Forgets one mapped page once the backend has unmapped it.
  void remove_page(std::uintptr_t page) {
    range_containing(page)->second.pages.erase(page);
    --mapped_pages_;
  }

  // True when [at, at + bytes) lies inside one range: an address the device may name, mapped or not.
  bool reserved(std::uintptr_t at, std::size_t bytes) const {
    const auto it = range_containing(at);
    return it != ranges_.end() && bytes <= it->second.bytes && at - it->first <= it->second.bytes - bytes;
  }

  // True when every byte of [at, at + bytes) lies in mapped pages of one range: the device may touch it.
  bool mapped(std::uintptr_t at, std::size_t bytes) const {
    if (bytes == 0 || !reserved(at, bytes)) return false;
    const std::uintptr_t first_page = at - at % page_bytes_;
    const std::size_t span = (at - first_page) + bytes;
    const std::size_t whole = (span + page_bytes_ - 1) / page_bytes_ * page_bytes_;
    return first_unmapped(range_containing(at)->second, first_page, whole) == 0;
  }

  // Every invariant, recomputed: ranges are page-aligned and disjoint, pages lie aligned inside their
  // range, and the sums match. Returns what is wrong, empty when nothing is.
  std::string validate() const {
    std::size_t reserved = 0;
    std::size_t pages = 0;
    std::uintptr_t end_of_previous = 0;
    for (const auto& [base, range] : ranges_) {
      if (base % page_bytes_ != 0 || range.bytes == 0 || range.bytes % page_bytes_ != 0) {
        return "range " + hex(base) + " (" + std::to_string(range.bytes) + " bytes) is not page-aligned";
      }
      if (base < end_of_previous) return "range " + hex(base) + " overlaps the range before it";
      end_of_previous = base + range.bytes;
      for (const auto& [page, handle] : range.pages) {
        if (page % page_bytes_ != 0 || page < base || page - base >= range.bytes) {
          return "page " + hex(page) + " is not an aligned page of range " + hex(base);
        }
      }
      reserved += range.bytes;
      pages += range.pages.size();
    }
    if (reserved != reserved_bytes_) return "reserved bytes are " + std::to_string(reserved_bytes_) +
                                            ", the ranges sum to " + std::to_string(reserved);
    if (pages != mapped_pages_) return "mapped pages are counted as " + std::to_string(mapped_pages_) +
                                      ", the ranges hold " + std::to_string(pages);
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
    std::map<std::uintptr_t, Handle> pages;  // mapped pages by address
  };
  using Ranges = std::map<std::uintptr_t, Range>;

  [[noreturn]] static void fail(const std::string& call, const std::string& why) {
    throw Error(ErrorCode::kBackend, call + ": " + why);
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
      fail(call, "the pages are not inside one range reserved on this device (reserve_address_range first, and "
                 "stay inside it)");
    }
    if (at % page_bytes_ != 0) {
      fail(call, "the address is not aligned to the granularity (" + std::to_string(page_bytes_) + " bytes)");
    }
    return range_containing(at)->second;
  }

  // The first page of [first_page, first_page + bytes) (whole pages of `range`) that is not mapped, or 0.
  std::uintptr_t first_unmapped(const Range& range, std::uintptr_t first_page, std::size_t bytes) const {
    auto it = range.pages.lower_bound(first_page);
    for (std::size_t offset = 0; offset < bytes; offset += page_bytes_, ++it) {
      if (it == range.pages.end() || it->first != first_page + offset) return first_page + offset;
    }
    return 0;
  }

  std::size_t page_bytes_;
  Ranges ranges_;
  std::size_t reserved_bytes_ = 0;
  std::size_t mapped_pages_ = 0;
};

}  // namespace streamalloc
