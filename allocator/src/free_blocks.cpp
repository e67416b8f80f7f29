// FreeBlocks: the free lists' rules (free_blocks.hpp).
#include "free_blocks.hpp"

#include <algorithm>
#include <tuple>

#include "size_policy.hpp"

namespace streamalloc {

void FreeBlocks::insert(Block* block) {
  block->segment->owner->free.insert(block);
  if (!block->settled) shards_.get(block->stream).settle_list.insert(block);
  ledger_.count_inactive_split(block);
}

void FreeBlocks::remove(Block* block) {
  block->segment->owner->free.erase(block);
  if (!block->settled) shards_.get(block->stream).settle_list.remove(block);
  ledger_.uncount_inactive_split(block);
}

Block* FreeBlocks::merge_neighbours(Block* block) {
  for (Block* neighbour : {block->prev, block->next}) {
    if (!FreeLists::mergeable(block, neighbour)) continue;
    remove(neighbour);
    block = FreeLists::merge(block, neighbour);
  }
  return block;
}

Block* FreeBlocks::enter(Block* block) {
  if (shards_.get(block->stream).fences.completed_seq() >= block->settle_seq) block->settled = true;
  Block* merged = merge_neighbours(block);
  insert(merged);
  return merged;
}

// The owner stream's fence for each of these blocks has completed: no stream can still touch them.
void FreeBlocks::settle_completed(Shard& shard) {
  while (Block* head = shard.settle_list.head()) {
    if (head->settle_seq > shard.fences.completed_seq()) break;
    remove(head);
    head->settled = true;
    insert(merge_neighbours(head));
  }
}

void FreeBlocks::make_available(Block* block, DebugAids* aids) {
  if (aids == nullptr || !aids->holds_blocks()) {
    enter(block);
    return;
  }
  // The aid holds the block back from reuse, and may let go of older ones.
  block->held = true;
  ledger_.count_inactive_split(block);
  std::vector<Block*> released;
  aids->hold(block, &released);
  enter_after_hold(released);
}

void FreeBlocks::release_held(DebugAids* aids) {
  if (aids == nullptr || !aids->holds_blocks()) return;
  std::vector<Block*> released;
  aids->release_all(&released);
  enter_after_hold(released);
}

// One at a time: a block still marked held is not merged, so none is merged away before its turn.
void FreeBlocks::enter_after_hold(const std::vector<Block*>& released) {
  for (Block* b : released) {
    b->held = false;
    ledger_.uncount_inactive_split(b);
    enter(b);
  }
}

void FreeBlocks::make_hot(Shard& owner, Block* block) {
  shards_.enter(block);
  // From the owner's headroom first: its fast path's hot reuse returned it there.
  ledger_.count_inactive_split(block, block->is_split(), &owner.stats);
  owner.push_hot(block);
}

void FreeBlocks::flush_hot(Shard& shard, std::optional<SizeClass> only) {
  bool flushed = false;
  for (Block* block = shard.hot.oldest(); block != nullptr;) {
    // The next block is taken before this one enters the lists: it is still hot, so the merge below
    // leaves it alone.
    Block* newer = block->hot_newer;
    if (!only || block->segment->size_class == *only) {
      leave_hot(shard, block);
      flushed = true;
    }
    block = newer;
  }
  if (flushed) count_flush(shard);
}

bool FreeBlocks::flush_hot_until(Shard& shard, SizeClass size_class, std::size_t size) {
  bool flushed = false;
  for (Block* block = shard.hot.oldest(); block != nullptr;) {
    Block* newer = block->hot_newer;  // still hot: the merge below leaves it alone
    if (block->segment->size_class == size_class) {
      flushed = true;
      if (leave_hot(shard, block)->size >= size) break;
    }
    block = newer;
  }
  if (flushed) count_flush(shard);
  return flushed;
}

void FreeBlocks::trim_hot(Shard& shard) {
  if (!shard.hot.over()) return;
  count_flush(shard);
  while (shard.hot.size() > HotList::kMaxBlocks / 4 * 3 || shard.hot.bytes() > HotList::kMaxBytes / 4 * 3) {
    leave_hot(shard, shard.hot.oldest());
  }
}

// One block at a time: a block still marked hot is not merged, so no hot block is merged away (and
// deleted) before its own turn.
Block* FreeBlocks::leave_hot(Shard& shard, Block* block) {
  shard.remove_hot(block);
  block->hot = false;
  shards_.leave(block);
  ledger_.uncount_inactive_split(block);
  return enter(block);
}

void FreeBlocks::count_flush(Shard& shard) {
  ++shard.counts.hot_list_flushes;
  ledger_.count(&DeviceStats::hot_list_flushes);
}

void FreeBlocks::flush_all_hot(std::optional<SizeClass> only) {
  for (auto& [stream, shard] : shards_) {
    if (!shard->has_hot()) continue;
    shards_.lock(*shard);
    flush_hot(*shard, only);
  }
}

void FreeBlocks::flush_thread_hot(std::uintptr_t thread, std::optional<SizeClass> only, const Shard* except) {
  for (auto& [stream, shard] : shards_) {
    // has_hot() rather than the list itself: the list is the shard lock's, taken only where it flushes.
    if (shard->thread != thread || shard.get() == except || !shard->has_hot()) continue;
    shards_.lock(*shard);
    flush_hot(*shard, only);
  }
}

Block* FreeBlocks::best_fit(MemoryPool& pool, SizeClass size_class, std::size_t size, Stream stream,
                            bool expandable) const {
  if (size_class == SizeClass::kLarge && expandable) return best_fit_expandable_large(pool, size, stream);
  Block* own = pool.free.best_owned(size_class, stream, size);
  if (own != nullptr && !size_policy::may_serve(own->size, size, options_)) own = nullptr;
  Block* settled = pool.free.best_settled(size_class, stream, size);
  if (settled != nullptr && !size_policy::may_serve(settled->size, size, options_)) settled = nullptr;
  if (own != nullptr && (settled == nullptr || own->size <= settled->size)) return own;
  return settled;
}

// The large class of expandable segments (docs/design.md, "Expandable segments", "Packing"): an exact
// fit first, as the plain best fit takes it; else, among the blocks that fit,
//  1. not the free last block of another stream's expandable segment: that is where its owner grows
//     next (its growth extends the block, mapping only what is missing), and a rest carved there by
//     this stream leaves its owner a smaller end and a hole between live blocks of two streams;
//  2. a block this stream last used (owned, or settled and freed by this stream) before blocks freed
//     by other streams: each stream keeps reusing the holes it left, so the holes in another stream's
//     region stay whole for the sizes that stream asks for next;
//  3. then the smallest, then owned before settled, then the lowest address, as best_fit orders them.
// A fit the first two rules leave out is still taken when nothing else fits. Both indexes are walked
// smallest first and each walk stops at the first block that no later block of that index can beat
// (rank 0 or 4 below), so a walk visits few blocks.
Block* FreeBlocks::best_fit_expandable_large(MemoryPool& pool, std::size_t size, Stream stream) const {
  constexpr SizeClass kLarge = SizeClass::kLarge;
  // Rank: 0 best. Exact fits rank below every carving fit, whatever their other properties.
  auto rank = [&](const Block* b) {
    const bool others_end = b->next == nullptr && b->segment->expandable() && b->segment->stream != stream;
    return (b->size == size ? 0 : 4) + (others_end ? 2 : 0) + (b->stream == stream ? 0 : 1);
  };
  Block* best = nullptr;
  int best_rank = 8;
  auto consider = [&](Block* b) {
    // may_serve fails for every larger block once it fails for one (oversize blocks sort last).
    if (!size_policy::may_serve(b->size, size, options_)) return false;
    const int r = rank(b);
    // Then as the plain best fit orders: the smaller block, an owned one before a settled one of its
    // size, the lower address (so one stream's allocations are placed exactly as the best fit places them).
    const bool better = best == nullptr || std::make_tuple(r, b->size, b->settled, b->address) <
                                               std::make_tuple(best_rank, best->size, best->settled, best->address);
    if (better) {
      best = b;
      best_rank = r;
    }
    // Later blocks are no smaller: none beats an exact same-stream fit, nor a carving one of rank 4
    // (a later block of rank 4 is larger, and ranks below 4 are exact fits, which come first).
    return r != 0 && r != 4;
  };
  pool.free.for_each_owned_fit(kLarge, stream, size, consider);
  pool.free.for_each_settled_fit(kLarge, stream, size, consider);
  return best;
}

Block* FreeBlocks::count_reuse(Block* block, Stream stream) {
  if (block != nullptr && block->settled && block->stream != stream)
    ledger_.count(&DeviceStats::cross_stream_reuse_settled);
  return block;
}

Block* FreeBlocks::take(Block* block, std::size_t size) {
  remove(block);
  const SizeClass size_class = block->segment->size_class;
  // In an expandable segment every rest of the smallest block size or more splits off, as in PyTorch's:
  // free pages go back wherever they are, so a rest strands no segment.
  const bool split = block->segment->expandable() ? block->size - size >= size_policy::kMinBlockSize
                                                  : size_policy::should_split(block->size, size, size_class, options_);
  if (!block->segment->owner->no_split && split) insert(split_block(block, size));
  return block;
}

}  // namespace streamalloc
