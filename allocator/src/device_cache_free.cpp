// DeviceCache: free and record_stream. A block's uses decide where it goes when freed
// (docs/design.md, "Stream rules" rules 2 and 3): with no other uses, back to its allocation stream at
// once; with uses, pending until a fence on every used stream has completed.
#include <algorithm>

#include "device_cache.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void DeviceCache::reject_free(const void* ptr) {
  DeviceLock lock(*this);
  ledger_.count(&DeviceStats::invalid_frees);
  throw_bad_free(ptr, "free");
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
    add_use(block, stream_hint, NewUse::kFreeOnStream);
  }
  Shard& owner = shards_.get(block->stream);
  owner.thread = this_thread_token();
  ++owner.counts.frees_device_locked;
  free_live(block);
  return true;
}

// `block` is live, its shard locked: it leaves the shard (free_to_owner may park it there again).
void DeviceCache::free_live(Block* block) {
  if (fences_.has_capture_uses()) drop_ended_capture_uses();
  Shard& owner = shards_.get(block->stream);
  owner.live.erase(block->address);
  shards_.leave(block);
  // A free with uses returns its headroom to its stream's shard (account_freed says why).
  ledger_.account_freed(block, block->recorded_streams.empty() ? nullptr : &owner.stats);
  if (size_policy::is_oversize(block->size, options_)) ledger_.decrease(&DeviceStats::oversize_allocations, 1);
  if (aids_ != nullptr) aids_->on_free(*block);
  if (block->recorded_streams.empty()) {
    block->since = coarse_now();
    if (aids_ != nullptr) aids_->on_reusable(*block);  // free_to_owner fences whatever an aid enqueued
    ledger_.account_inactive(block, nullptr);
    free_to_owner(block);
  } else {
    block->since = fences_.now();  // precise: the free-to-reusable latency is measured from here
    make_pending(block);
  }
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
  add_use(block, stream, NewUse::kRecordStream);
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

void DeviceCache::add_use(Block* block, Stream stream, NewUse how) {
  if (aids_ != nullptr && aids_->on_new_use(*block, stream, how)) ledger_.count(&DeviceStats::missing_wait_warnings);
  block->recorded_streams.push_back(stream);
  // Asking whether the stream captures costs a runtime call, so it is asked only while a route is open
  // (PyTorch opens one for every capture). A use on a capturing stream without a route is kept, and
  // fenced after the capture like any other: later than needed, never too early.
  if (pools_.has_routes() && backend_.is_capturing(device_, stream)) {
    fences_.add_capture_use(block, stream);
    update_fast_path();
  }
}

void DeviceCache::drop_ended_capture_uses() {
  std::vector<Block*> released;
  fences_.drop_ended_capture_uses([&](Block* block, Stream used) {
    shards_.get(block->stream);  // a live block is its shard's: lock it before changing its uses
    auto& uses = block->recorded_streams;
    auto use = std::find(uses.begin(), uses.end(), used);
    if (use != uses.end()) uses.erase(use);
    if (block->state == BlockState::kPending) {
      // No fence was recorded while the stream captured, so the block still waits in its open batch.
      shards_.get(used).fences.leave_as_user(block);
      if (aids_ != nullptr) note_pending_changed(fences_.now(), &used, 1);
      if (--block->fences_left == 0) released.push_back(block);
    }
  });
  update_fast_path();
  const Clock::time_point now = released.empty() ? Clock::time_point{} : fences_.now();
  for (Block* block : released) {
    if (aids_ != nullptr) aids_->on_fenced_free_completed(*block, 0, nullptr);
    release_pending(block, now);
  }
}

// No other uses: stream order makes the block safe for its allocation stream at once. It joins that
// stream's open batch, whose fence will make it safe for every stream (settled). Until that batch is
// fenced it is parked in the stream's hot list, where an allocation of the same size takes it back.
void DeviceCache::free_to_owner(Block* block) {
  block->state = BlockState::kFree;
  block->settled = false;
  block->recorded_streams.clear();
  Shard& owner = shards_.get(block->stream);
  block->settle_seq = owner.fences.join_as_owner();
  // Private pools keep no hot list: their blocks go back to their own pool's free lists.
  if ((aids_ == nullptr || !aids_->holds_blocks()) && pools_.is_default(block->segment->owner) &&
      owner.fences.completed_seq() < block->settle_seq) {
    park_hot(owner, block);
    if (owner.hot.size() > Shard::kHotBlocks) free_.flush_hot(owner, Shard::kHotBlocks / 2);
    return;
  }
  free_.make_available(block, aids_.get());
}

void DeviceCache::park_hot(Shard& owner, Block* block) {
  block->hot = true;
  shards_.enter(block);
  // From the owner's headroom first: its fast path's unpark returned it there.
  ledger_.count_inactive_split(block, block->is_split(), &owner.stats);
  owner.hot.push_back(block);
  owner.publish_hot();
}

// A pending block whose fences have all completed is safe for its allocation stream, like a block
// freed there without other uses, and that stream is the one likely to ask for its size next (a
// cross-stream loop allocates on the producer, uses on the consumer, frees). So during a free's fence
// pass and an allocation's polls (FenceEngine::parks_released), the block is parked in its owner's hot
// list, where the next allocation of its size takes it back on the stream's shard lock alone, without
// the merge into the free lists and the split out of them. Only where the allocation path keeps
// hot blocks anyway: small blocks of fixed segments of the default pool, no aid, a block its
// owner's fence has not settled yet (a settled block serves every stream from the free lists), and
// room in the list (a fence may release many frees at once; the rest are merged).
bool DeviceCache::park_released(Shard& owner, Block* block) {
  if (!fences_.parks_released() || (aids_ != nullptr && aids_->beyond_history()) ||
      !pools_.is_default(block->segment->owner) || block->segment->size_class != SizeClass::kSmall ||
      grows_expandable(pools_.default_pool())) {
    return false;
  }
  if (owner.hot.size() >= Shard::kHotBlocks || owner.fences.completed_seq() >= block->settle_seq) return false;
  park_hot(owner, block);
  return true;
}

// Other uses: the block waits for a fence on every stream it was used on. It joins the open batch of
// each used stream; a pass over those streams' fences runs at most once per batch window (FenceEngine).
void DeviceCache::make_pending(Block* block) {
  block->state = BlockState::kPending;
  block->settle_seq = shards_.get(block->stream).fences.join_as_owner();
  block->fences_left = static_cast<std::uint32_t>(block->recorded_streams.size());
  ledger_.increase(&DeviceStats::pending_blocks, 1);
  ledger_.increase(&DeviceStats::pending_bytes, static_cast<std::int64_t>(block->size));
  for (Stream used : block->recorded_streams) shards_.get(used).fences.join_as_user(block);
  if (aids_ != nullptr)
    note_pending_changed(block->since, block->recorded_streams.data(), block->recorded_streams.size());
  if (!fences_.start_free_pass(block->since)) return;
  fence_after_free(block);
}

}  // namespace streamalloc
