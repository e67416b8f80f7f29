// DeviceCache: how free blocks enter and leave the free lists. An owned block is also in its owner's
// settle list; a block joins the lists merged with its free neighbours (FreeLists::mergeable), and
// settled once its owner's fence has completed. Two places keep free blocks out of the lists on
// purpose: a stream's hot list (just freed, unmerged, for an exact-size reuse) and an aid that holds
// blocks back (quarantine).
#include "device_cache.hpp"

#include <algorithm>
#include <array>

namespace streamalloc {

void DeviceCache::insert_free(Block* block) {
  block->segment->owner->free.insert(block);
  if (!block->settled) shards_.get(block->stream).settle_list.insert(block);
  ledger_.count_inactive_split(block);
}

void DeviceCache::remove_free(Block* block) {
  block->segment->owner->free.erase(block);
  if (!block->settled) shards_.get(block->stream).settle_list.remove(block);
  ledger_.uncount_inactive_split(block);
}

Block* DeviceCache::merge_free_neighbours(Block* block) {
  for (Block* neighbour : {block->prev, block->next}) {
    if (!FreeLists::mergeable(block, neighbour)) continue;
    remove_free(neighbour);
    block = FreeLists::merge(block, neighbour);
  }
  return block;
}

void DeviceCache::make_available(Block* block) {
  if (aids_ != nullptr && aids_->holds_blocks()) {
    hold_back(block);
    return;
  }
  enter_free_lists(block);
}

void DeviceCache::enter_free_lists(Block* block) {
  if (shards_.get(block->stream).fences.completed_seq() >= block->settle_seq) block->settled = true;
  insert_free(merge_free_neighbours(block));
}

// The owner stream's fence for `block` has completed: no stream can still touch it.
void DeviceCache::settle(Block* block) {
  remove_free(block);
  block->settled = true;
  insert_free(merge_free_neighbours(block));
}

void DeviceCache::flush_hot(Shard& state, std::size_t keep) {
  auto& hot = state.hot;
  // The oldest blocks leave the list first, on the stack (a flush allocates nothing): the list never
  // holds more than one block past kHotBlocks (free_to_owner flushes it then), so one round does.
  std::array<Block*, Shard::kHotBlocks + 1> oldest;
  while (hot.size() > keep) {
    const std::size_t flush = std::min(hot.size() - keep, oldest.size());
    std::copy_n(hot.begin(), flush, oldest.begin());
    hot.erase(hot.begin(), hot.begin() + static_cast<std::ptrdiff_t>(flush));
    state.publish_hot();
    // One at a time: a block still marked hot is not merged, so no block in `oldest` is merged away
    // (and deleted) before its own turn.
    for (std::size_t k = 0; k < flush; ++k) {
      Block* block = oldest[k];
      block->hot = false;
      shards_.leave(block);
      ledger_.uncount_inactive_split(block);
      enter_free_lists(block);
    }
  }
}

void DeviceCache::flush_all_hot() {
  for (auto& [stream, state] : shards_) {
    shards_.lock(*state);
    flush_hot(*state, 0);
  }
}

void DeviceCache::flush_thread_hot(std::uintptr_t thread) {
  for (auto& [stream, state] : shards_) {
    // `hot_count` rather than the list itself: the list is the shard lock's, taken only where it flushes.
    if (state->thread != thread || state->hot_count.load(std::memory_order_relaxed) == 0) continue;
    shards_.lock(*state);
    flush_hot(*state, 0);
  }
}

// An aid holds the block back from reuse, and may let go of older ones.
void DeviceCache::hold_back(Block* block) {
  block->held = true;
  ledger_.count_inactive_split(block);
  std::vector<Block*> released;
  aids_->hold(block, &released);
  enter_free_lists_after_hold(released);
}

void DeviceCache::release_held() {
  if (aids_ == nullptr || !aids_->holds_blocks()) return;
  std::vector<Block*> released;
  aids_->release_all(&released);
  enter_free_lists_after_hold(released);
}

// One at a time: a block still marked held is not merged, so none is merged away before its turn.
void DeviceCache::enter_free_lists_after_hold(const std::vector<Block*>& released) {
  for (Block* b : released) {
    b->held = false;
    ledger_.uncount_inactive_split(b);
    enter_free_lists(b);
  }
}

}  // namespace streamalloc
