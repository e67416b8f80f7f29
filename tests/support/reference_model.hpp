// The reference model for model-based testing of Allocator: what a correct allocator must look like
// from the outside, kept in the simplest data structures that can say it. It knows nothing about
// segments, free lists or fences; it tracks only what callers see (live blocks and their streams)
// and the few bounds a correct allocator must respect.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "streamalloc/pools.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc::testing {

// One live block as the caller sees it.
struct ModelBlock {
  std::uintptr_t address = 0;
  std::size_t size = 0;                  // requested bytes
  Stream stream = 0;                     // allocation stream
  std::vector<Stream> recorded;          // streams passed to record_stream (other than `stream`), sorted
  std::uint8_t tag = 0;                  // written to the first and last byte on `stream` at allocation
  bool tagged = true;                    // false: allocated inside a graph capture, where no work runs
  PoolId pool;                           // the memory pool it must come from
  std::vector<Stream> capture_recorded;  // streams of `recorded` recorded while that stream captured
  std::uint64_t id = 0;                  // allocation number, for messages
};

class ReferenceModel {
 public:
  // PyTorch's size classes (docs/design.md, "Size classes"), used only for the conservative OOM bound below.
  static constexpr std::size_t kSmallRequest = 1 * MiB;
  static constexpr std::size_t kSmallSegment = 2 * MiB;

  // The largest segment one large-pool block can keep reserved: a block may be carved out of any free
  // large-pool segment, so it pins at most the largest one ever reserved (the largest request rounded
  // to 2 MiB, or a 20 MiB mid-size segment).
  // With expandable segments (`page`: their page size, 0 without them) free memory goes back wherever
  // it is in whole pieces (the physical allocations a growth mapped), so a block pins only the pieces
  // it touches. A small block's pieces are pages: its size rounded up to pages, plus one where it
  // straddles a page boundary. A large block's pieces are up to `large_piece` bytes: the ones inside it
  // (at most its size rounded up to pages), plus one piece on each side that it reaches into.
  explicit ReferenceModel(std::size_t largest_request, std::size_t page = 0, std::size_t large_piece = 0)
      : large_pin_(std::max<std::size_t>(20 * MiB, (largest_request + 2 * MiB - 1) / (2 * MiB) * (2 * MiB))),
        page_(page),
        large_piece_(large_piece) {}

  std::size_t live_count() const { return blocks_.size(); }
  std::size_t live_bytes() const { return live_bytes_; }
  bool empty() const { return blocks_.empty(); }
  const ModelBlock& at(std::size_t index) const { return blocks_[index]; }
  ModelBlock& at_mutable(std::size_t index) { return blocks_[index]; }
  const std::vector<ModelBlock>& blocks() const { return blocks_; }

  // Bytes the allocator may need to keep reserved for the live blocks, at most, once every cached
  // segment without a live block has been released: each live block pins at most one segment.
  std::size_t pinned_bound() const { return pinned_bound_; }

  // The live block overlapping [address, address + size), if any (size 0 is treated as 1 byte).
  const ModelBlock* overlapping(std::uintptr_t address, std::size_t size) const {
    const std::uintptr_t end = address + std::max<std::size_t>(size, 1);
    auto it = by_address_.lower_bound(end);  // first block starting at or after `end`
    if (it == by_address_.begin()) return nullptr;
    const ModelBlock& before = blocks_[std::prev(it)->second];
    return before.address + std::max<std::size_t>(before.size, 1) > address ? &before : nullptr;
  }

  const ModelBlock* find(std::uintptr_t address) const {
    auto it = by_address_.find(address);
    return it == by_address_.end() ? nullptr : &blocks_[it->second];
  }

  void add(ModelBlock block) {
    live_bytes_ += block.size;
    pinned_bound_ += pin_of(block.size);
    by_address_.emplace(block.address, blocks_.size());
    blocks_.push_back(std::move(block));
  }

  // Returns whether the stream was new for the block (the allocation stream is never "new").
  bool record(std::size_t index, Stream stream) {
    ModelBlock& block = blocks_[index];
    if (stream == block.stream) return false;
    auto it = std::lower_bound(block.recorded.begin(), block.recorded.end(), stream);
    if (it != block.recorded.end() && *it == stream) return false;
    block.recorded.insert(it, stream);
    return true;
  }

  ModelBlock remove(std::size_t index) {
    ModelBlock removed = std::move(blocks_[index]);
    by_address_.erase(removed.address);
    if (index + 1 != blocks_.size()) {  // swap-remove keeps picks O(1)
      blocks_[index] = std::move(blocks_.back());
      by_address_[blocks_[index].address] = index;
    }
    blocks_.pop_back();
    live_bytes_ -= removed.size;
    pinned_bound_ -= pin_of(removed.size);
    remember_freed(removed.address);
    return removed;
  }

  // A recently freed address that is not inside any live block now, for misuse probes (double free,
  // record_stream on a dead pointer). 0 when there is none.
  std::uintptr_t dead_address(std::uint64_t pick) const {
    for (std::size_t i = 0; i < freed_.size(); ++i) {
      const std::uintptr_t address = freed_[(pick + i) % freed_.size()];
      if (overlapping(address, 1) == nullptr) return address;
    }
    return 0;
  }

 private:
  std::size_t pin_of(std::size_t size) const {
    if (page_ != 0) {
      const std::size_t pages = (std::max<std::size_t>(size, 1) + page_ - 1) / page_ * page_;
      return size <= kSmallRequest ? pages + page_ : pages + 2 * large_piece_;
    }
    return size <= kSmallRequest ? kSmallSegment : large_pin_;
  }

  void remember_freed(std::uintptr_t address) {
    constexpr std::size_t kRemembered = 64;
    if (freed_.size() < kRemembered) {
      freed_.push_back(address);
    } else {
      freed_[next_freed_++ % kRemembered] = address;
    }
  }

  std::size_t large_pin_;
  std::size_t page_;
  std::size_t large_piece_;
  std::vector<ModelBlock> blocks_;
  std::map<std::uintptr_t, std::size_t> by_address_;  // address -> index in blocks_
  std::size_t live_bytes_ = 0;
  std::size_t pinned_bound_ = 0;
  std::vector<std::uintptr_t> freed_;
  std::size_t next_freed_ = 0;
};

}  // namespace streamalloc::testing
