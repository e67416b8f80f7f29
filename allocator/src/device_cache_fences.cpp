// DeviceCache: fences (docs/design.md, "Stream rules" rules 3, 4 and 6, and "Fences: batching and
// pipelining"). Batches are closed with one event per stream; completed fences are popped oldest-first
// per stream and release their pending blocks, and settle the owned free blocks of their stream.
//
// Rule 6 on the fence path: a stream that captures a graph gets no fence and is not queried (an event
// recorded on it would be a node of the graph). The fence path asks only the streams it would record on
// or query whether they capture, and runs in relaxed capture mode, so that querying events recorded
// outside a capture neither breaks a capture on another stream nor has to wait for its end. A pass never
// asks every stream the cache knows: its cost would grow with the streams a process has ever used.
#include <optional>

#include "device_cache.hpp"
#include "logging.hpp"

namespace streamalloc {

bool DeviceCache::close_batch(Shard& state) {
  // Uses from a capture that has ended leave their batches before a fence is recorded for them.
  if (fences_.has_capture_uses()) drop_ended_capture_uses();
  if (!fences_.close_batch(state.fences)) return false;
  ledger_.count(&DeviceStats::fences_recorded);
  if (aids_ != nullptr) aids_->on_fence_recorded(state.fences.in_flight().back().event, state.stream());
  return true;
}

// Pipelined batching after a free with uses: each used stream keeps at most one fence in flight. The
// pass polls that fence (one query); once it has completed, the open batch is closed at once with a new
// event, so pending blocks are released about one fence latency after their free. While a fence is in
// flight, later frees join the open batch and share the next event. make_pending() runs this pass at
// most once per batch window (FenceEngine), so a tight loop of frees shares events even when the GPU keeps up.
// A used stream that captures keeps the free in its open batch (`frees_deferred_capture`), fenced by a
// poll after the capture.
void DeviceCache::fence_after_free(const Block* block) {
  const FenceEngine::Parking parking(fences_);
  bool deferred = false;
  // The free has happened; a device error in this opportunistic pass must not report it as failed.
  // The batch stays open and the next allocation that misses the cache fences it.
  try {
    const RelaxedCaptureScope relaxed(backend_);
    for (Stream used : block->recorded_streams) {
      Shard& state = shards_.get(used);
      std::uint64_t queries = 0;
      Fence fence;
      while (state.fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(state, fence);
      ledger_.count(&DeviceStats::fences_polled, static_cast<std::int64_t>(queries));
      if (!state.fences.in_flight().empty()) continue;
      if (backend_.is_capturing(device_, used)) {
        deferred = true;
      } else {
        close_batch(state);
      }
    }
  } catch (const Error& e) {
    log().warn("device {}: fencing after a free failed, retried at the next allocation: {}", device_, e.what());
  }
  if (deferred) ledger_.count(&DeviceStats::frees_deferred_capture);
}

void DeviceCache::note_pending_changed(Clock::time_point when, const Stream* streams, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    aids_->on_pending_changed(when, streams[i], shards_.get(streams[i]).fences.pending_stats());
  }
}

// Every fence of a pending block has completed (at `now`): it returns to its allocation stream's free
// list.
void DeviceCache::release_pending(Block* block, Clock::time_point now) {
  ledger_.decrease(&DeviceStats::pending_blocks, 1);
  ledger_.decrease(&DeviceStats::pending_bytes, static_cast<std::int64_t>(block->size));
  Shard& owner = shards_.get(block->stream);
  ledger_.account_inactive(block, &owner.stats);
  // An aid's work on the block (poison) is new work on the allocation stream, so the block is safe for
  // other streams only after a fence recorded behind it: it rejoins the owner's open batch (its old
  // batch may have completed already).
  if (aids_ != nullptr && aids_->on_reusable(*block)) {
    block->settle_seq = owner.fences.join_as_owner();
  }
  ledger_.note_free_to_reusable(std::chrono::duration_cast<std::chrono::microseconds>(now - block->since));
  block->state = BlockState::kFree;
  block->settled = false;
  block->recorded_streams.clear();
  if (park_released(owner, block)) return;
  free_.make_available(block, aids_.get());
}

// The blocks a fence releases were all released when it was seen complete: one clock read for all of
// them, whatever their number.
void DeviceCache::finish_fence(Shard& state, Fence& fence) {
  const Clock::time_point now = fence.pending.empty() ? Clock::time_point{} : fences_.now();
  for (Block* block : fence.pending) {
    state.fences.note_pending_released(block);
    if (aids_ != nullptr && block->fences_left == 1) aids_->on_fenced_free_completed(*block, state.stream(), &fence);
    if (--block->fences_left == 0) release_pending(block, now);
  }
  if (aids_ != nullptr && !fence.pending.empty()) {
    const Stream stream = state.stream();
    note_pending_changed(now, &stream, 1);
  }
  if (fence.event != nullptr) fences_.release_event(fence.event);  // none for a batch completed idle
  // Settle this stream's owned free blocks up to the completed sequence number.
  free_.settle_completed(state);
}

// The capture rule of the calls that wait on the host or free device memory, which no capture mode
// allows during a capture: the backend says whether a stream captures. Only streams the cache knows can
// be asked; a capture on a stream it has never seen goes unnoticed.
bool DeviceCache::any_stream_capturing() {
  for (auto& [stream, state] : shards_) {
    if (backend_.is_capturing(device_, stream)) return true;
  }
  return false;
}

// Close every open batch (one event per stream) and pop completed fences, oldest first per stream.
//
// After a host sync (stream.synchronize(), torch.cuda.synchronize(), event.synchronize()) the next
// allocation that misses should get back the blocks pending on the synchronized stream, as PyTorch's
// allocator gives them back. A batch left open until now would get an event recorded after the sync,
// which the poll right after may find incomplete, so those blocks would wait for a later miss. So a
// batch that holds pending blocks, on a stream with no fence in flight (after polling the fences
// recorded before the sync, which the sync completed), is released without an event when the stream
// is idle: all work enqueued on it has completed, the free's last use included. One stream query
// replaces the event record and query; only streams with pending blocks are asked, only here.
void DeviceCache::close_batches_and_poll(Shard* missed, HotLists flush) {
  // Hot blocks join the free lists, where they can merge and settle.
  if (flush == HotLists::kEveryStream || missed == nullptr) {
    free_.flush_all_hot();
  } else {
    free_.flush_hot(*missed, 0);
    free_.flush_thread_hot(this_thread_token());
  }
  poll_fences(/*close_batches=*/true, missed);
}

// A miss fences what may serve it: batches with pending blocks (once their used stream passes the
// fence, the blocks return to their allocation stream) and other streams' batches of owned free blocks
// (settled, they serve any stream). The missing stream's own batch of owned free blocks is no use to
// it: its owned blocks serve it already, and closing that batch at every miss would record an event for
// nearly every miss of a loop that alternates streams. So a miss fences its own batch only when the
// stream's newest fence is older than FenceEngine::kOwnBatchInterval; other streams' misses, process_fences(),
// empty_cache() and the OOM path close it. A batch that holds pending
// blocks is never deferred.
bool DeviceCache::defers_own_batch(const Shard& state, const Shard* missed, Clock::time_point now) const {
  return &state == missed && state.fences.open_pending().empty() &&
         now - state.fences.last_recorded_at() < FenceEngine::kOwnBatchInterval;
}

// Without `close_batches` nothing is recorded: fences in flight are polled and idle streams' open
// batches complete, so pending blocks whose streams are done come back without costing a new event.
void DeviceCache::poll_fences(bool close_batches, const Shard* missed) {
  const RelaxedCaptureScope relaxed(backend_);
  // Uses from a capture that has ended leave their batches first (an idle batch completes without
  // close_batch, which would drop them otherwise).
  if (fences_.has_capture_uses()) drop_ended_capture_uses();
  const auto now = fences_.now();
  for (auto& [stream, state] : shards_) {
    // A stream with nothing in flight, pending or in its open batch is passed over without its lock: a
    // long-running process knows many streams, most of them idle.
    if (state->fences.in_flight().empty() && state->fences.open_pending().empty() &&
        (!close_batches || !state->fences.has_open_batch())) {
      continue;
    }
    shards_.lock(*state);  // (in_flight and open_pending are the device lock's; the sequence numbers are not)
    Fence fence;
    std::uint64_t queries = 0;
    bool oldest_incomplete = false;  // then no newer fence of the stream can have completed either
    const bool has_pending = !state->fences.open_pending().empty();
    if (has_pending && !state->fences.in_flight().empty()) {
      while (state->fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(*state, fence);
      oldest_incomplete = !state->fences.in_flight().empty();
    }
    std::optional<bool> capturing;  // asked once, only of a stream the pass would query or record on
    const auto captures = [&] {
      if (!capturing) capturing = backend_.is_capturing(device_, stream);
      return *capturing;
    };
    bool idle = false;
    if (has_pending && state->fences.in_flight().empty() && !captures()) {
      ++queries;
      // Only a shortcut: a failed query means "not known idle", and the batch is fenced as usual.
      try {
        idle = backend_.query_stream(device_, stream);
      } catch (const Error& e) {
        log().warn("device {}: asking whether stream {:#x} is idle failed: {}", device_, stream, e.what());
      }
    }
    if (idle && state->fences.complete_open_batch(&fence, now)) {
      ledger_.count(&DeviceStats::fences_skipped_idle);
      finish_fence(*state, fence);
    } else if (close_batches && state->fences.has_open_batch() && !defers_own_batch(*state, missed, now) &&
               !captures()) {
      close_batch(*state);
    }
    if (!oldest_incomplete) {
      while (state->fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(*state, fence);
    }
    ledger_.count(&DeviceStats::fences_polled, static_cast<std::int64_t>(queries));
    if (aids_ != nullptr && !state->fences.in_flight().empty()) {
      aids_->on_fence_in_flight(stream, state->fences.in_flight().front(), now);
    }
  }
}

// Host-wait for every fence (the OOM path, empty_cache, a lower memory fraction). Afterwards nothing
// is pending. `for_memory`: the OOM path, which the aids hear about as a sign of memory pressure.
void DeviceCache::synchronize_all_fences(bool for_memory) {
  free_.flush_all_hot();
  if (any_stream_capturing()) return;
  std::size_t fences = 0;
  const auto pending_before = ledger_.stats().pending_bytes.current;
  for (auto& [stream, state] : shards_) {
    shards_.lock(*state);
    close_batch(*state);
    Fence fence;
    while (state->fences.synchronize_oldest(backend_, device_, &fence)) {
      finish_fence(*state, fence);
      ++fences;
    }
  }
  ledger_.count(&DeviceStats::fences_synced_host, static_cast<std::int64_t>(fences));
  ledger_.count(&DeviceStats::num_sync_all_streams);
  if (for_memory && fences > 0 && aids_ != nullptr) {
    aids_->on_host_sync_for_memory(fences,
                                   static_cast<std::size_t>(pending_before - ledger_.stats().pending_bytes.current));
  }
}

void DeviceCache::process_fences() {
  DeviceLock lock(*this);
  close_batches_and_poll();
}

void DeviceCache::synchronize_fences() {
  DeviceLock lock(*this);
  synchronize_all_fences();
}

}  // namespace streamalloc
