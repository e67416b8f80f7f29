// HotList: the free blocks a stream keeps hot, unmerged, in its shard (shard.hpp), so that its next
// allocations of sizes it freed before take one back under the shard lock alone (docs/design.md, "The
// hot list"). Exact sizes, whole blocks only: a block is never split or merged while it is here, so its
// address neighbours' links stay the device lock's, and an allocation it serves counts what the free
// lists would have counted.
//
// Bins by size, a few per power of two, hold the blocks newest first; a second list holds them all,
// oldest first, for the flushes (the oldest leave first). Both are intrusive, through the Block's hot
// links. What the list may hold is bounded by bytes and by blocks (has_room): the device-locked free
// that makes a block hot past the bound flushes the oldest (FreeBlocks::flush_hot). The caller holds the shard lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "block.hpp"

namespace streamalloc {

class HotList {
 public:
  static constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
  static constexpr std::size_t kMaxBlocks = 256;

  HotList() = default;
  HotList(const HotList&) = delete;
  HotList& operator=(const HotList&) = delete;

  std::size_t size() const { return count_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }
  // Whether a block of `size` bytes may join without passing the bounds.
  bool has_room(std::size_t size) const { return count_ < kMaxBlocks && bytes_ + size <= kMaxBytes; }
  // Whether the list is past its bounds (after a device-locked park).
  bool over() const { return count_ > kMaxBlocks || bytes_ > kMaxBytes; }

  // The newest block of exactly `size` bytes; nullptr when none. Stays in the list. Inline: every
  // cached allocation; the newest block first (a loop that frees and reallocates one size).
  Block* find(std::size_t size) const {
    if (newest_ != nullptr && newest_->size == size) return newest_;
    for (Block* b = bins_[bin_of(size)]; b != nullptr; b = b->hot_bin_next) {
      if (b->size == size) return b;
    }
    return nullptr;
  }

  void push(Block* block);    // as the newest
  void remove(Block* block);  // wherever it is
  Block* oldest() const { return oldest_; }
  Block* newest() const { return newest_; }

  // Every block, oldest first.
  template <typename F>
  void for_each(F&& f) const {
    for (const Block* b = oldest_; b != nullptr; b = b->hot_newer) f(b);
  }

  // For validate(): what is wrong with the links, counts and bins (empty when nothing is).
  const char* broken() const;

  // The bin of a block of `size` bytes: kSubBins per power of two from kMinBlockSize on.
  static std::size_t bin_of(std::size_t size) {
    if (size < kFirstSize) return 0;
    const int log = 63 - __builtin_clzll(size);
    const std::size_t sub = (size >> (log - kSubBinBits)) & (kSubBins - 1);
    const std::size_t bin = static_cast<std::size_t>(log - kFirstLog) * kSubBins + sub;
    return bin < kBins ? bin : kBins - 1;
  }

 private:
  static constexpr int kSubBinBits = 3;
  static constexpr std::size_t kSubBins = std::size_t{1} << kSubBinBits;
  static constexpr int kFirstLog = 9;  // 512 bytes, the smallest block
  static constexpr std::size_t kFirstSize = std::size_t{1} << kFirstLog;
  static constexpr std::size_t kBins = (48 - kFirstLog) * kSubBins;  // up to 256 TiB, the last open-ended

  std::array<Block*, kBins> bins_{};  // newest first, through hot_bin_prev/hot_bin_next
  Block* oldest_ = nullptr;           // the age list, through hot_older/hot_newer
  Block* newest_ = nullptr;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

inline void HotList::push(Block* block) {
  block->hot_bin = static_cast<std::uint16_t>(bin_of(block->size));
  Block*& head = bins_[block->hot_bin];
  block->hot_bin_prev = nullptr;
  block->hot_bin_next = head;
  if (head != nullptr) head->hot_bin_prev = block;
  head = block;
  block->hot_older = newest_;
  block->hot_newer = nullptr;
  if (newest_ != nullptr) {
    newest_->hot_newer = block;
  } else {
    oldest_ = block;
  }
  newest_ = block;
  ++count_;
  bytes_ += block->size;
}

inline void HotList::remove(Block* block) {
  if (block->hot_bin_prev != nullptr) {
    block->hot_bin_prev->hot_bin_next = block->hot_bin_next;
  } else {
    bins_[block->hot_bin] = block->hot_bin_next;
  }
  if (block->hot_bin_next != nullptr) block->hot_bin_next->hot_bin_prev = block->hot_bin_prev;
  if (block->hot_older != nullptr) {
    block->hot_older->hot_newer = block->hot_newer;
  } else {
    oldest_ = block->hot_newer;
  }
  if (block->hot_newer != nullptr) {
    block->hot_newer->hot_older = block->hot_older;
  } else {
    newest_ = block->hot_older;
  }
  --count_;
  bytes_ -= block->size;
}

inline const char* HotList::broken() const {
  std::size_t count = 0;
  std::size_t bytes = 0;
  const Block* older = nullptr;
  for (const Block* b = oldest_; b != nullptr; b = b->hot_newer) {
    if (b->hot_older != older) return "the age list's links disagree";
    older = b;
    ++count;
    bytes += b->size;
    if (count > count_) return "the age list is longer than its count";
  }
  if (older != newest_) return "the age list's newest is not its last block";
  if (count != count_ || bytes != bytes_) return "the count or the bytes disagree with the age list";
  std::size_t binned = 0;
  for (std::size_t i = 0; i < kBins; ++i) {
    const Block* prev = nullptr;
    for (const Block* b = bins_[i]; b != nullptr; b = b->hot_bin_next) {
      if (b->hot_bin_prev != prev) return "a bin's links disagree";
      if (bin_of(b->size) != i || b->hot_bin != i) return "a block is in the wrong bin";
      prev = b;
      if (++binned > count_) return "the bins hold more blocks than the count";
    }
  }
  if (binned != count_) return "the bins hold fewer blocks than the count";
  return "";
}

}  // namespace streamalloc
