// DeviceCache: construction, the free path, record_stream and fence processing.
// The allocation path is in device_cache_alloc.cpp, validate() in device_cache_validate.cpp.
#include "device_cache.hpp"

#include <algorithm>
#include <spdlog/fmt/fmt.h>

#include "audit.hpp"
#include "logging.hpp"
#include "sync_checker.hpp"

namespace streamalloc {

DeviceCache::DeviceCache(int device, const Options& options, Backend& backend, Audit& audit, SyncChecker* sync)
    : device_(device),
      options_(options),
      backend_(backend),
      audit_(audit),
      sync_(sync),
      memory_fraction_(options.memory_fraction),
      events_(backend, device),
      pending_history_(options.pending_history) {
  stats_.max_split_size =
      options.max_split_size_bytes == 0 ? -1 : static_cast<std::int64_t>(options.max_split_size_bytes);
}

DeviceCache::~DeviceCache() {
  try {
    release_all();
  } catch (const std::exception& e) {
    log().warn("device {}: error while releasing memory at teardown: {}", device_, e.what());
  }
  // Segments still holding live blocks stay reserved (their memory may still be in use); only the
  // bookkeeping goes.
  for (auto& [address, segment] : segments_) {
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

// Streams are checked once, when the cache first sees them, so the hot path pays only a lookup.
FenceQueue& DeviceCache::find_or_add_queue(Stream stream) {
  auto it = queues_.find(stream);
  if (it == queues_.end()) {
    const int owner = backend_.stream_device(stream);
    if (owner >= 0 && owner != device_) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("streamalloc: stream {:#x} belongs to device {} but was used with memory of device {}; "
                              "pass a stream of the device you allocate on (blocks can only be used on streams of "
                              "their device).",
                              stream, owner, device_));
    }
    it = queues_.emplace(stream, std::make_unique<FenceQueue>(stream)).first;
  }
  last_queue_ = it->second.get();
  return *last_queue_;
}

// ---------------------------------------------------------------- stats helpers

// ---------------------------------------------------------------- free indexes

Stream DeviceCache::settled_key(const Block* block) const {
  // Under `never`, settled blocks still belong to their stream, as in PyTorch's native allocator.
  return options_.cross_stream_reuse == CrossStreamReuse::kNever ? block->stream : 0;
}

void DeviceCache::insert_free(Block* block) {
  const int pool = pool_index(block->segment->pool);
  if (block->settled) {
    settled_[pool].insert(block, settled_key(block));
  } else {
    unsettled_[pool].insert(block, block->stream);
    queue(block->stream).settle_list_insert(block);
  }
  count_inactive_split(block);
}

void DeviceCache::remove_free(Block* block) {
  const int pool = pool_index(block->segment->pool);
  if (block->settled) {
    settled_[pool].erase(block);
  } else {
    unsettled_[pool].erase(block);
    queue(block->stream).settle_list_remove(block);
  }
  uncount_inactive_split(block);
}

bool DeviceCache::mergeable(const Block* a, const Block* b) const {
  if (a == nullptr || b == nullptr) return false;
  if (a->quarantined || b->quarantined || a->hot || b->hot) return false;
  if (a->state != BlockState::kFree || b->state != BlockState::kFree) return false;
  if (a->settled && b->settled) return true;
  if (!a->settled && !b->settled) return a->stream == b->stream;
  return true;  // settled + unsettled: the merged block is unsettled, owned by the unsettled one's stream
}

// Merge `block` (already out of the indexes) with the free neighbours it may merge with (mergeable());
// returns the surviving block, which the caller inserts. The lower address survives so segment->head stays valid.
Block* DeviceCache::merge_free_neighbours(Block* block) {
  for (Block* neighbour : {block->prev, block->next}) {
    if (!mergeable(block, neighbour)) continue;
    remove_free(neighbour);
    Block* low = neighbour->address < block->address ? neighbour : block;
    Block* high = low == block ? neighbour : block;
    if (low->settled != high->settled) {
      // Settled memory is safe for every stream, the owner's too: the merged block keeps the owner's
      // state (stream, fence sequence) and settles with it.
      const Block* owner = low->settled ? high : low;
      low->stream = owner->stream;
      low->settle_seq = owner->settle_seq;
      low->settled = false;
      high->settle_seq = owner->settle_seq;
    }
    low->size += high->size;
    low->next = high->next;
    if (low->next) low->next->prev = low;
    // An unsettled merge settles only when the later of the two batches has been fenced.
    low->settle_seq = std::max(low->settle_seq, high->settle_seq);
    low->since = std::max(low->since, high->since);
    delete high;
    block = low;
  }
  return block;
}

// ---------------------------------------------------------------- free path

bool DeviceCache::owns_live(const void* ptr) const {
  Lock lock(mutex_);
  return live_.find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

bool DeviceCache::owns_address(const void* ptr) const {
  Lock lock(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return false;
  --it;
  return address < it->first + it->second->size;
}

void DeviceCache::reject_free(const void* ptr) {
  Lock lock(mutex_);
  ++stats_.invalid_frees;
  throw_bad_free(ptr, "free");
}

bool DeviceCache::deallocate(void* ptr, std::size_t size_hint, Stream stream_hint) {
  Lock lock(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  Block* block = live_.find(address);
  if (block == nullptr) return false;
  if (size_hint != 0 && size_hint != block->requested) {
    ++stats_.invalid_frees;
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: free(" + std::to_string(address) + ") on device " + std::to_string(device_) +
                    " passed size " + std::to_string(size_hint) + " but the block was allocated with size " +
                    std::to_string(block->requested) +
                    "; nothing was freed. Pass the size given to malloc (or 0 if unknown).");
  }
  // A free issued on another stream than the allocation stream may still be using the block there.
  if (stream_hint != block->stream && stream_hint != 0 &&
      std::find(block->uses.begin(), block->uses.end(), stream_hint) == block->uses.end()) {
    queue(stream_hint);  // rejects a stream of another device before anything changes
    check_consumer_waited(block, stream_hint);
    block->uses.push_back(stream_hint);
  }
  live_.erase(address);
  const PoolKind pool = block->segment->pool;
  stat_decrease(&DeviceStats::allocation, pool, 1);
  stat_decrease(&DeviceStats::allocated_bytes, pool, static_cast<std::int64_t>(block->size));
  stat_decrease(&DeviceStats::requested_bytes, pool, static_cast<std::int64_t>(block->requested));
  if (options_.max_split_size_bytes != 0 && block->size >= options_.max_split_size_bytes) {
    stats_.oversize_allocations.decrease(1);
  }
  audit_.trace(device_, "free", block->address, block->size, block->stream);
  block->requested = 0;
  if (block->uses.empty()) {
    block->since = coarse_now();
    if (options_.poison == PoisonMode::kFree || options_.poison == PoisonMode::kBoth) poison(block, block->stream);
    stat_decrease(&DeviceStats::active, pool, 1);
    stat_decrease(&DeviceStats::active_bytes, pool, static_cast<std::int64_t>(block->size));
    free_to_owner(block);
  } else {
    block->since = Clock::now();  // precise: the free-to-reusable latency is measured from here
    make_pending(block);
  }
  return true;
}

// check_sync: a stream the block is handed to should already be ordered after the allocation
// stream's work that followed the allocation (a wait_event, or a host synchronize). Checked when the
// use is declared (record_stream, or a free on another stream), where the seed's bug shows: the
// consumer got the tensor without waiting for the producer.
void DeviceCache::check_consumer_waited(const Block* block, Stream consumer) {
  if (sync_ == nullptr || sync_->ordered_after(consumer, block->stream, block->alloc_tick)) return;
  ++stats_.missing_wait_warnings;
  audit_.missing_wait(device_, block->address, block->size, block->stream, consumer);
}

// Rule 3, no other uses: stream order makes the block safe for its allocation stream at once. It
// joins that stream's open batch, whose fence will make it safe for every stream (settled).
void DeviceCache::free_to_owner(Block* block) {
  block->state = BlockState::kFree;
  block->settled = false;
  block->uses.clear();
  FenceQueue& owner = queue(block->stream);
  block->settle_seq = owner.join_as_owner();
  if (options_.quarantine_bytes == 0 && owner.completed_seq() < block->settle_seq) {
    block->hot = true;
    count_inactive_split(block);
    owner.hot().push_back(block);
    if (owner.hot().size() > FenceQueue::kHotBlocks) flush_hot(owner, FenceQueue::kHotBlocks / 2);
    return;
  }
  make_available(block);
}

Block* DeviceCache::take_hot(FenceQueue& q, std::size_t size) {
  std::vector<Block*>& hot = q.hot();
  for (std::size_t i = hot.size(); i-- > 0;) {
    Block* block = hot[i];
    if (block->size != size) continue;
    hot.erase(hot.begin() + static_cast<std::ptrdiff_t>(i));
    block->hot = false;
    uncount_inactive_split(block);
    return block;
  }
  return nullptr;
}

void DeviceCache::flush_hot(FenceQueue& q, std::size_t keep) {
  std::vector<Block*>& hot = q.hot();
  if (hot.size() <= keep) return;
  const std::size_t flush = hot.size() - keep;
  std::vector<Block*> oldest(hot.begin(), hot.begin() + static_cast<std::ptrdiff_t>(flush));
  hot.erase(hot.begin(), hot.begin() + static_cast<std::ptrdiff_t>(flush));
  // One at a time: a block still marked hot is not merged, so no block in `oldest` is merged away
  // (and deleted) before its own turn.
  for (Block* block : oldest) {
    block->hot = false;
    uncount_inactive_split(block);
    enter_free_lists(block);
  }
}

void DeviceCache::flush_all_hot() {
  for (auto& [stream, q] : queues_) flush_hot(*q, 0);
}

void DeviceCache::make_available(Block* block) {
  if (options_.quarantine_bytes == 0) {
    enter_free_lists(block);
    return;
  }
  block->quarantined = true;
  count_inactive_split(block);
  quarantine_.push_back(block);
  quarantine_bytes_ += block->size;
  while (quarantine_bytes_ > options_.quarantine_bytes) release_oldest_quarantined();
}

void DeviceCache::enter_free_lists(Block* block) {
  if (queue(block->stream).completed_seq() >= block->settle_seq) mark_settled(block);
  insert_free(merge_free_neighbours(block));
}

void DeviceCache::release_oldest_quarantined() {
  Block* block = quarantine_.front();
  quarantine_.pop_front();
  quarantine_bytes_ -= block->size;
  block->quarantined = false;
  uncount_inactive_split(block);
  enter_free_lists(block);
}

void DeviceCache::flush_quarantine() {
  while (!quarantine_.empty()) release_oldest_quarantined();
}

bool DeviceCache::close_batch(FenceQueue& q) {
  if (!q.close_batch(backend_, events_, device_)) return false;
  ++stats_.fences_recorded;
  if (sync_ != nullptr) sync_->on_event_record(reinterpret_cast<std::uintptr_t>(q.in_flight().back().event), q.stream());
  return true;
}

// Rule 3, other uses: the block waits for a fence on every stream it was used on.
//
// Pipelined batching: each used stream keeps at most one fence in flight. A free polls that fence (one
// query); once it has completed, the open batch is closed at once with a new event, so pending blocks
// are released about one fence latency after their free. While a fence is in flight, later frees join
// the open batch and share the next event. Polling and recording happen at most once per
// kFenceBatchWindow, so a tight loop of frees shares events even when the GPU keeps up.
void DeviceCache::make_pending(Block* block) {
  block->state = BlockState::kPending;
  block->settle_seq = queue(block->stream).join_as_owner();
  block->fences_left = static_cast<std::uint32_t>(block->uses.size());
  stats_.pending_blocks.increase(1);
  stats_.pending_bytes.increase(static_cast<std::int64_t>(block->size));
  for (Stream used : block->uses) queue(used).join_as_user(block);
  if (pending_history_.enabled()) record_pending_history(block->since, block->uses.data(), block->uses.size());
  // Rule 6: while any stream captures a graph no event is queried; the batch is fenced after capture.
  // Asking the device about every stream costs two runtime calls per stream, so it is asked only when
  // a fence pass is due.
  if (block->since - last_fence_pass_ < kFenceBatchWindow) return;
  if (any_stream_capturing()) {
    ++stats_.frees_deferred_capture;
    return;
  }
  last_fence_pass_ = block->since;
  // The free has happened; a device error in this opportunistic pass must not report it as failed.
  // The batch stays open and the next allocation that misses the cache fences it.
  try {
    for (Stream used : block->uses) {
      FenceQueue& q = queue(used);
      std::uint64_t queries = 0;
      Fence fence;
      while (q.pop_completed(backend_, device_, &fence, &queries)) finish_fence(q, fence);
      stats_.fences_polled += static_cast<std::int64_t>(queries);
      if (q.in_flight().empty()) close_batch(q);
    }
  } catch (const Error& e) {
    log().warn("device {}: fencing after a free failed, retried at the next allocation: {}", device_, e.what());
  }
}

// Out of line and cold: a debugging aid that must not change how the free path is compiled when off.
void DeviceCache::record_pending_history(Clock::time_point when, const Stream* streams, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) pending_history_.record(when, streams[i], queue(streams[i]).pending_stats());
}

// Every fence of a pending block has completed: it returns to its allocation stream's free list.
void DeviceCache::release_pending(Block* block) {
  stats_.pending_blocks.decrease(1);
  stats_.pending_bytes.decrease(static_cast<std::int64_t>(block->size));
  const PoolKind pool = block->segment->pool;
  stat_decrease(&DeviceStats::active, pool, 1);
  stat_decrease(&DeviceStats::active_bytes, pool, static_cast<std::int64_t>(block->size));
  if (options_.poison == PoisonMode::kFree || options_.poison == PoisonMode::kBoth) {
    // In the allocation stream's order, after the fences: the block is truly free now. The fill is
    // new work on that stream, so the block is safe for other streams only after a fence recorded
    // behind it: it rejoins the owner's open batch (its old batch may have completed already, which
    // let another stream take the block while the fill was still queued; found by the soak run).
    poison(block, block->stream);
    block->settle_seq = queue(block->stream).join_as_owner();
  }
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - block->since).count();
  for (std::size_t i = 0; i < kLatencyBucketUs.size(); ++i) {
    if (waited < kLatencyBucketUs[i]) {
      ++stats_.free_to_reusable_us[i];
      break;
    }
  }
  block->state = BlockState::kFree;
  block->settled = false;
  block->uses.clear();
  make_available(block);
}

// The owner stream's fence for `block` has completed: no stream can still touch it.
void DeviceCache::settle(Block* block) {
  remove_free(block);
  mark_settled(block);
  insert_free(merge_free_neighbours(block));
}

void DeviceCache::mark_settled(Block* block) { block->settled = true; }

// Poisoning is a debugging aid: a device error while filling a block is reported, never allowed to
// interrupt the bookkeeping change around it.
void DeviceCache::poison(const Block* block, Stream stream) {
  try {
    backend_.memset_async(device_, reinterpret_cast<void*>(block->address), 0xFF, block->size, stream);
  } catch (const Error& e) {
    log().error("device {}: poisoning block {:#x} failed (the block is not poisoned): {}", device_, block->address,
                e.what());
  }
}

void DeviceCache::finish_fence(FenceQueue& queue, Fence& fence) {
  for (Block* block : fence.pending) {
    queue.note_pending_released(block);
    if (--block->fences_left == 0) release_pending(block);
  }
  if (pending_history_.enabled() && !fence.pending.empty()) {
    const Stream stream = queue.stream();
    record_pending_history(Clock::now(), &stream, 1);
  }
  events_.release(fence.event);
  // Settle this stream's unsettled free blocks up to the completed sequence number.
  while (Block* head = queue.settle_list_head()) {
    if (head->settle_seq > queue.completed_seq()) break;
    settle(head);
  }
}

bool DeviceCache::any_stream_capturing() {
  for (auto& [stream, q] : queues_) {
    if (backend_.is_capturing(device_, stream)) return true;
  }
  return false;
}

// Close every open batch (one event per stream) and pop completed fences, oldest first per stream.
// While any stream captures a graph, nothing is recorded or queried (rule 6).
void DeviceCache::close_batches_and_poll() {
  flush_all_hot();  // parked blocks join the free lists, where they can merge and settle
  if (any_stream_capturing()) return;
  const auto now = Clock::now();
  for (auto& [stream, q] : queues_) {
    close_batch(*q);
    Fence fence;
    std::uint64_t queries = 0;
    while (q->pop_completed(backend_, device_, &fence, &queries)) finish_fence(*q, fence);
    stats_.fences_polled += static_cast<std::int64_t>(queries);
    if (audit_.enabled() && !q->in_flight().empty()) {
      const Fence& oldest = q->in_flight().front();
      const double ms = std::chrono::duration<double, std::milli>(now - oldest.recorded_at).count();
      if (!oldest.audited_late && !oldest.pending.empty() && ms > static_cast<double>(options_.pending_warn_ms)) {
        std::size_t bytes = 0;
        for (Block* b : oldest.pending) bytes += b->size;
        audit_.pending_too_long(device_, stream, oldest.pending.size(), bytes, ms);
        const_cast<Fence&>(oldest).audited_late = true;
      }
    }
  }
}

// Host-wait for every fence (the OOM path, empty_cache, teardown). Afterwards nothing is pending.
// `for_memory`: the OOM path, where the audit reports the host sync as a sign of memory pressure.
void DeviceCache::synchronize_all_fences(bool for_memory) {
  flush_all_hot();
  if (any_stream_capturing()) return;
  std::size_t fences = 0;
  const auto pending_before = stats_.pending_bytes.current;
  for (auto& [stream, q] : queues_) {
    close_batch(*q);
    Fence fence;
    while (q->synchronize_oldest(backend_, device_, &fence)) {
      finish_fence(*q, fence);
      ++fences;
    }
  }
  stats_.fences_synced_host += static_cast<std::int64_t>(fences);
  ++stats_.num_sync_all_streams;
  if (for_memory && fences > 0) {
    audit_.host_sync_for_memory(device_, fences,
                                static_cast<std::size_t>(pending_before - stats_.pending_bytes.current));
  }
}

void DeviceCache::process_fences() {
  Lock lock(mutex_);
  close_batches_and_poll();
}

void DeviceCache::synchronize_fences() {
  Lock lock(mutex_);
  synchronize_all_fences();
}

// ---------------------------------------------------------------- record_stream

void DeviceCache::record_stream_not_live(const void* ptr, Stream stream) {
  {
    Lock lock(mutex_);
    ++stats_.record_stream_calls;
    ++stats_.record_stream_unknown_ptr;
  }
  const bool ours = owns_address(ptr);
  audit_.record_stream_not_live(device_, ptr, stream,
                                ours ? "the block is already freed (record_stream came too late)"
                                     : "the pointer was not allocated by streamalloc");
}

bool DeviceCache::record_stream(void* ptr, Stream stream) {
  Lock lock(mutex_);
  Block* block = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return false;
  ++stats_.record_stream_calls;
  if (stream == block->stream) {
    ++stats_.record_stream_on_alloc_stream;
    audit_.record_stream_on_allocation_stream(device_, block->address, stream);
    return true;
  }
  if (std::find(block->uses.begin(), block->uses.end(), stream) != block->uses.end()) {
    ++stats_.record_stream_duplicate;
    audit_.record_stream_duplicate(device_, block->address, stream);
    return true;
  }
  check_consumer_waited(block, stream);
  block->uses.push_back(stream);
  ++block->record_calls;
  audit_.trace(device_, "record_stream", block->address, block->size, stream);
  return true;
}

// ---------------------------------------------------------------- stats

DeviceStats DeviceCache::stats() const {
  Lock lock(mutex_);
  DeviceStats copy = stats_;
  for (const auto& [stream, q] : queues_) {
    const StreamPending& p = q->pending_stats();
    if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
  }
  return copy;
}

// Every Stat the cache keeps, for the two resets.
template <typename F>
void DeviceCache::for_each_stat(F&& visit) {
#define STREAMALLOC_VISIT(name, kind, help) \
  for (Stat & s : stats_.name) visit(s);
  STREAMALLOC_POOL_STATS(STREAMALLOC_VISIT)
#undef STREAMALLOC_VISIT
  for (Stat* s : {&stats_.pending_blocks, &stats_.pending_bytes, &stats_.oversize_allocations,
                  &stats_.oversize_segments}) {
    visit(*s);
  }
  for (auto& [stream, q] : queues_) {
    visit(q->pending_stats().pending_blocks);
    visit(q->pending_stats().pending_bytes);
  }
}

void DeviceCache::reset_peak_stats() {
  Lock lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_peak(); });
}

void DeviceCache::reset_accumulated_stats() {
  Lock lock(mutex_);
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
#define STREAMALLOC_RESET_COUNT(name, help) stats_.name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_RESET_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_RESET_COUNT)
#undef STREAMALLOC_RESET_COUNT
  stats_.free_to_reusable_us.fill(0);
  accumulated_reset_ = true;
}

}  // namespace streamalloc
