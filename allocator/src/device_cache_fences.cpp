// DeviceCache: the fence calls of the public interface, and what becomes of a pending block once its
// fences have completed (the passes themselves are the FenceEngine's, fence_engine.cpp).
#include "device_cache.hpp"

namespace streamalloc {

void DeviceCache::process_fences() {
  DeviceLock lock(*this);
  fences_.close_batches_and_poll();
}

void DeviceCache::synchronize_fences() {
  DeviceLock lock(*this);
  fences_.synchronize_all();
}

// A pending block whose fences have all completed is safe for its allocation stream, like a block
// freed there without other uses, and that stream is the one likely to ask for its size next (a
// cross-stream loop allocates on the producer, uses on the consumer, frees). So during a free's fence
// pass and an allocation's polls (FenceEngine::releases_to_hot), the block is kept in its owner's hot
// list, where the next allocation of its size takes it back on the stream's shard lock alone, without
// the merge into the free lists and the split out of them. Only where the allocation path keeps
// hot blocks anyway: small blocks of fixed segments of the default pool, no aid, a block its
// owner's fence has not settled yet (a settled block serves every stream from the free lists), and
// room in the list (a fence may release many frees at once; the rest are merged).
void DeviceCache::release_pending(Block* block, Clock::time_point now) {
  fences_.forget_capture_free(block);
  ledger_.decrease(&DeviceStats::pending_blocks, 1);
  ledger_.decrease(&DeviceStats::pending_bytes, static_cast<std::int64_t>(block->size));
  Shard& owner = shards_.get(block->stream);
  ledger_.account_inactive(block, &owner);
  // An aid's work on the block (poison) is new work on the allocation stream, so the block is safe for
  // other streams only after a fence recorded behind it: it rejoins the owner's open batch (its old
  // batch may have completed already).
  if (aids_ != nullptr && aids_->on_reusable(*block)) {
    block->settle_seq = owner.join_open_batch();
  }
  ledger_.note_free_to_reusable(std::chrono::duration_cast<std::chrono::microseconds>(now - block->since));
  block->state = BlockState::kFree;
  block->settled = false;
  block->recorded_streams.clear();
  if (fences_.releases_to_hot() && (aids_ == nullptr || !aids_->beyond_history()) &&
      pools_.is_default(block->segment->owner) && block->segment->size_class == SizeClass::kSmall &&
      !expandable_.grows(pools_.default_pool()) && owner.hot_has_room(block->size) && !owner.fence_completed(block)) {
    free_.make_hot(owner, block);
    return;
  }
  free_.make_available(block, aids_.get());
}

}  // namespace streamalloc
