// FreeLists: the free blocks of one set of segments, and the rule for merging free neighbours.
//
// A free block is either *owned* (unsettled: safe only for its owner stream, by stream order) or
// *settled* (its owner's fence completed: no stream can still touch it). Owned blocks are indexed by
// their owner stream; settled blocks under one shared key, so any stream may take them, except under
// cross_stream_reuse:never, where settled blocks stay with their stream as in PyTorch's allocator.
// Each MemoryPool keeps one FreeLists for its own segments (memory_pool.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "block.hpp"
#include "free_index.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc {

class FreeLists {
 public:
  explicit FreeLists(CrossStreamReuse policy) : settled_per_stream_(policy == CrossStreamReuse::kNever) {}

  // Index a free block by its state (settled or owned by block->stream).
  void insert(Block* block) {
    const int c = class_index(block->segment->size_class);
    if (block->settled) {
      settled_[c].insert(block, settled_key(block->stream));
    } else {
      owned_[c].insert(block, block->stream);
    }
  }
  void erase(Block* block) {
    const int c = class_index(block->segment->size_class);
    if (block->settled) {
      settled_[c].erase(block);
    } else {
      owned_[c].erase(block);
    }
  }

  // The smallest block of at least `size` bytes owned by `stream`, or nullptr.
  Block* best_owned(SizeClass size_class, Stream stream, std::size_t size) const {
    return owned_[class_index(size_class)].best_fit(stream, size);
  }
  // The smallest settled block of at least `size` bytes that `stream` may take, or nullptr.
  Block* best_settled(SizeClass size_class, Stream stream, std::size_t size) const {
    return settled_[class_index(size_class)].best_fit(settled_key(stream), size);
  }

  // The owned (of `stream`) or settled (that `stream` may take) blocks of at least `size` bytes,
  // smallest first, until `visit` returns false.
  template <typename F>
  void for_each_owned_fit(SizeClass size_class, Stream stream, std::size_t size, F&& visit) const {
    owned_[class_index(size_class)].for_each_fit(stream, size, visit);
  }
  template <typename F>
  void for_each_settled_fit(SizeClass size_class, Stream stream, std::size_t size, F&& visit) const {
    settled_[class_index(size_class)].for_each_fit(settled_key(stream), size, visit);
  }

  // Merge rule: two address neighbours merge when both are free and indexed (not kept in a hot list,
  // not held back), touch (no unmapped pages between them) and either settled, or owned by one stream, or one settled
  // and one owned: settled memory is safe for the owner too, so the merged block stays owned and settles with the
  // owner's fence (keeping them apart strands settled memory next to every owned block).
  static bool mergeable(const Block* a, const Block* b) {
    if (a == nullptr || b == nullptr) return false;
    if (a->in_shard || b->in_shard) return false;  // first: a shard's blocks are read under its lock only
    if (a->held || b->held || a->hot || b->hot) return false;
    if (a->state != BlockState::kFree || b->state != BlockState::kFree) return false;
    // Linked blocks of an expandable segment may have unmapped pages between them.
    const Block* low = a->address < b->address ? a : b;
    if (low->address + low->size != (low == a ? b : a)->address) return false;
    if (a->settled && b->settled) return true;
    if (!a->settled && !b->settled) return a->stream == b->stream;
    return true;
  }
  // Merge two mergeable address neighbours, both out of the index, into the lower one (so that
  // segment->head stays valid); deletes the higher one and returns the survivor. Inline: a cached
  // alloc/free pair of a mid-size block merges once.
  static Block* merge(Block* a, Block* b) {
    Block* low = a->address < b->address ? a : b;
    Block* high = low == a ? b : a;
    if (low->settled != high->settled) {
      // The merged block keeps the owned block's state (stream, fence sequence) and settles with it.
      const Block* owner = low->settled ? high : low;
      low->stream = owner->stream;
      low->settle_seq = owner->settle_seq;
      low->settled = false;
      high->settle_seq = owner->settle_seq;
    }
    low->size += high->size;
    low->next = high->next;
    if (low->next) {
      low->next->prev = low;
    } else {
      low->segment->tail = low;
    }
    // An owned merge settles only when the later of the two batches has been fenced.
    low->settle_seq = std::max(low->settle_seq, high->settle_seq);
    low->since = std::max(low->since, high->since);
    delete high;
    return low;
  }

  bool contains_owned(Block* block) const { return owned_[class_index(block->segment->size_class)].contains(block); }
  bool contains_settled(Block* block) const {
    return settled_[class_index(block->segment->size_class)].contains(block);
  }
  std::size_t owned_count() const;
  std::size_t settled_count() const;
  template <typename F>
  void for_each(F&& visit) const {
    for (const auto* indexes : {&owned_, &settled_}) {
      for (const FreeIndex& index : *indexes) index.for_each(visit);
    }
  }

 private:
  Stream settled_key(Stream owner) const { return settled_per_stream_ ? owner : 0; }

  bool settled_per_stream_;
  std::array<FreeIndex, kSizeClasses> owned_;    // [class index], keyed by owner stream
  std::array<FreeIndex, kSizeClasses> settled_;  // [class index], keyed by settled_key()
};

}  // namespace streamalloc
