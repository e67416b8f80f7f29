// DeviceCache: free and record_stream. A block's uses decide where it goes when freed
// (docs/design.md, "Stream rules" rules 2 and 3): with no other uses, back to its allocation stream at
// once; with uses, pending until a fence on every used stream has completed.
#include <algorithm>

#include "device_cache.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void DeviceCache::reject_free(const void* ptr, bool only_if_inside) {
  DeviceLock lock(*this);
  if (only_if_inside && segments_.containing(reinterpret_cast<std::uintptr_t>(ptr)) == nullptr) return;
  ledger_.count(&DeviceStats::invalid_frees);
  report_.throw_bad_free(ptr, "free");
}

bool DeviceCache::deallocate_locked(std::uintptr_t address, std::size_t size_hint, Stream stream_hint) {
  DeviceLock lock(*this);
  ledger_.count(&DeviceStats::frees_device_locked);
  Block* block = shards_.find_live(address);
  if (block == nullptr) return false;
  if (size_hint != 0 && size_hint != block->requested) {
    ledger_.count(&DeviceStats::invalid_frees);
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: free(" + std::to_string(address) + ") on device " + std::to_string(device_) +
                    " passed size " + std::to_string(size_hint) + " but the block was allocated with size " +
                    std::to_string(block->requested) +
                    "; nothing was freed. Pass the size given to malloc (or 0 if unknown).");
  }
  // A free issued on another stream than the allocation stream may still be using the block there.
  if (stream_hint != block->stream && stream_hint != 0 &&
      std::find(block->recorded_streams.begin(), block->recorded_streams.end(), stream_hint) ==
          block->recorded_streams.end()) {
    shards_.get(stream_hint);  // rejects a stream of another device before anything changes
    fences_.add_use(block, stream_hint, NewUse::kFreeOnStream, pools_.has_routes());
  }
  Shard& owner = shards_.get(block->stream);
  owner.note_thread();
  owner.count(&StreamCounts::frees_device_locked);
  const StatsLedger::Serving serving(ledger_, owner.stats_part());
  free_live(block);
  return true;
}

// `block` is live, its shard locked: it leaves the shard (and may come back as a hot block).
void DeviceCache::free_live(Block* block) {
  if (fences_.has_capture_uses()) fences_.drop_ended_capture_uses();
  Shard& owner = shards_.get(block->stream);
  owner.erase_live(block);
  shards_.leave(block);
  // A free returns its headroom to its stream's shard (account_freed says why).
  ledger_.account_freed(block, &owner);
  if (size_policy::is_oversize(block->size, options_)) ledger_.decrease(&DeviceStats::oversize_allocations, 1);
  if (aids_ != nullptr) aids_->on_free(*block);
  if (!block->recorded_streams.empty()) {
    block->since = fences_.now();  // precise: the free-to-reusable latency is measured from here
    fences_.make_pending(block);
    // PyTorch opens a route for every capture: without one no capture is under way here.
    if (pools_.has_routes()) fences_.keep_for_capture_reuse(block);
    return;
  }
  block->since = coarse_now();
  if (aids_ != nullptr) aids_->on_reusable(*block);  // the owner's batch fences whatever an aid enqueued
  ledger_.account_inactive(block, &owner);
  // No other uses: stream order makes the block safe for its allocation stream at once. It joins that
  // stream's open batch, whose fence will make it safe for every stream (settled). Until that batch is
  // fenced it is kept in the stream's hot list, where an allocation of its size takes it back.
  block->state = BlockState::kFree;
  block->settled = false;
  block->settle_seq = owner.join_open_batch();
  // Private pools keep no hot list: their blocks go back to their own pool's free lists.
  if ((aids_ == nullptr || !aids_->holds_blocks()) && pools_.is_default(block->segment->owner) &&
      !owner.fence_completed(block)) {
    free_.make_hot(owner, block);
    free_.trim_hot(owner);
    return;
  }
  free_.make_available(block, aids_.get());
}

bool DeviceCache::record_stream(void* ptr, Stream stream) {
  DeviceLock lock(*this);
  Block* block = shards_.find_live(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return false;
  ledger_.count(&DeviceStats::record_stream_calls);
  if (stream == block->stream) {
    ledger_.count(&DeviceStats::record_stream_on_alloc_stream);
    if (aids_ != nullptr) aids_->on_ignored_record_stream(IgnoredRecordStream::kAllocationStream, ptr, stream);
    return true;
  }
  if (std::find(block->recorded_streams.begin(), block->recorded_streams.end(), stream) !=
      block->recorded_streams.end()) {
    ledger_.count(&DeviceStats::record_stream_duplicate);
    if (aids_ != nullptr) aids_->on_ignored_record_stream(IgnoredRecordStream::kDuplicate, ptr, stream);
    return true;
  }
  fences_.add_use(block, stream, NewUse::kRecordStream, pools_.has_routes());
  ++block->record_stream_calls;
  if (aids_ != nullptr) aids_->on_record_stream(*block, stream);
  return true;
}

void DeviceCache::record_stream_not_live(const void* ptr, Stream stream) {
  DeviceLock lock(*this);
  ledger_.count(&DeviceStats::record_stream_calls);
  ledger_.count(&DeviceStats::record_stream_unknown_ptr);
  if (aids_ == nullptr) return;
  const bool ours = segments_.containing(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
  aids_->on_ignored_record_stream(ours ? IgnoredRecordStream::kAlreadyFreed : IgnoredRecordStream::kForeignPointer, ptr,
                                  stream);
}

}  // namespace streamalloc
