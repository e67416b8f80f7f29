// LiveMap: the table of allocated blocks by address, looked up by every free and record_stream.
//
// Why not std::unordered_map: each insert allocates a node and each erase frees it, and a lookup
// chases a bucket pointer; on the cached alloc+free pair that is a large share of the work. This is an
// open-addressing table with linear probing over one flat array: no allocation on insert or erase
// once it has grown, one cache line per lookup in the common case. Erase shifts later entries of the
// probe run back (no tombstones), so lookups never slow down as blocks come and go. Address 0 marks an
// empty slot: the allocator never hands out address 0. (A flat hash map library, e.g. abseil's, would
// be a new dependency for one table.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache_line_allocator.hpp"

namespace streamalloc {

struct Block;

class LiveMap {
 public:
  LiveMap() : slots_(kInitialCapacity) {}

  Block* find(std::uintptr_t address) const { return lookup(address).block; }

  // Where `address` is: its block (nullptr when absent) and its slot, so that a caller that decides
  // to erase it afterwards (erase_at) does not probe again.
  struct Found {
    Block* block;
    std::size_t slot;
  };
  Found lookup(std::uintptr_t address) const {
    for (std::size_t i = home(address);; i = next(i)) {
      const Slot& slot = slots_[i];
      if (slot.address == address) return {slot.block, i};
      if (slot.address == 0) return {nullptr, i};
    }
  }

  // Whether one more insert fits without growing the table (the fast path, which must not allocate).
  bool has_room() const { return 2 * (size_ + 1) <= slots_.size(); }

  // `address` must not be in the table (each address is live at most once).
  void insert(std::uintptr_t address, Block* block) {
    if (!has_room()) grow();  // at most half full: probe runs stay short
    place(address, block);
    ++size_;
  }

  // Removes `address`; false when it was not in the table.
  bool erase(std::uintptr_t address) {
    const Found found = lookup(address);
    if (found.block == nullptr) return false;
    erase_at(found);
    return true;
  }

  // Removes what lookup() found (with nothing inserted or erased since).
  void erase_at(const Found& found) {
    std::size_t i = found.slot;
    // Backward-shift deletion: move each later entry of the run into the hole when the hole lies
    // between that entry's home slot and its current slot, so every entry stays reachable from home.
    for (std::size_t j = next(i);; j = next(j)) {
      if (slots_[j].address == 0) break;
      const std::size_t h = home(slots_[j].address);
      const bool hole_on_path = (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
      if (hole_on_path) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }

  std::size_t size() const { return size_; }
  template <typename F>
  void for_each(F&& visit) const {  // visit(address, block), in no particular order
    for (const Slot& slot : slots_) {
      if (slot.address != 0) visit(slot.address, slot.block);
    }
  }
  bool empty() const { return size_ == 0; }

 private:
  struct Slot {
    std::uintptr_t address = 0;
    Block* block = nullptr;
  };
  using Slots = std::vector<Slot, CacheLineAllocator<Slot>>;  // the table a stream's fast path writes
  static constexpr std::size_t kInitialCapacity = 256;        // a power of two

  // Fibonacci hashing of the address without its low bits (blocks are 512-byte aligned), which spreads
  // neighbouring blocks over the table.
  std::size_t home(std::uintptr_t address) const {
    return static_cast<std::size_t>(((address >> 9) * 0x9E3779B97F4A7C15ull) >> 32) & (slots_.size() - 1);
  }
  std::size_t next(std::size_t i) const { return (i + 1) & (slots_.size() - 1); }

  void place(std::uintptr_t address, Block* block) {
    std::size_t i = home(address);
    while (slots_[i].address != 0) i = next(i);
    slots_[i] = Slot{address, block};
  }

  void grow() {
    Slots old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.address != 0) place(slot.address, slot.block);
    }
  }

  Slots slots_;
  std::size_t size_ = 0;
};

}  // namespace streamalloc
