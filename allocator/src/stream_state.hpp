// StreamState: what a device cache keeps per stream it has seen: the stream's fences, its hot list,
// and the settle list of the free blocks it owns. Each concept is local to the stream, so a cache
// sharded by stream could lock a stream's state on its own.
#pragma once

#include <cstddef>
#include <vector>

#include "block.hpp"
#include "fence_queue.hpp"

namespace streamalloc {

// The free blocks a stream owns (unsettled), in settle_seq order: a completed fence settles a prefix.
// Intrusive, through Block::settle_prev/settle_next.
class SettleList {
 public:
  void insert(Block* block);
  void remove(Block* block);
  Block* head() const { return head_; }

 private:
  Block* head_ = nullptr;
  Block* tail_ = nullptr;
};

struct StreamState {
  explicit StreamState(Stream stream) : fences(stream) {}
  Stream stream() const { return fences.stream(); }

  FenceQueue fences;
  // Blocks just freed on this stream, kept unmerged so that the next allocation of the same size takes
  // one back without splitting or merging (the common alloc/free loop). Oldest first.
  static constexpr std::size_t kHotBlocks = 8;
  std::vector<Block*> hot;
  SettleList settle_list;
};

}  // namespace streamalloc
