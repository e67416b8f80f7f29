// FenceEngine: the fence passes (docs/design.md, "Stream rules" rules 3, 4 and 6, and "Fences: batching
// and pipelining"). Batches are closed with one event per stream; completed fences are popped
// oldest-first per stream and release their pending blocks, and settle the owned free blocks of their
// stream.
//
// Rule 6 on the fence path: a stream that captures a graph gets no fence and is not queried (an event
// recorded on it would be a node of the graph). The fence path asks only the streams it would record on
// or query whether they capture, and runs in relaxed capture mode, so that querying events recorded
// outside a capture neither breaks a capture on another stream nor has to wait for its end. A pass never
// asks every stream the cache knows: its cost would grow with the streams a process has ever used.
#include "fence_engine.hpp"

#include <optional>

#include "invariant.hpp"
#include "logging.hpp"
#include "size_policy.hpp"

namespace streamalloc {

bool FenceEngine::close_batch(Shard& shard) {
  // Uses from a capture that has ended leave their batches before a fence is recorded for them.
  if (has_capture_uses()) drop_ended_capture_uses();
  if (!shard.fences.close_batch(backend_, events_, device_, now())) return false;
  parts_.ledger.count(&DeviceStats::fences_recorded);
  if (parts_.aids != nullptr) parts_.aids->on_fence_recorded(shard.fences.in_flight().back().event, shard.stream());
  return true;
}

// Other uses: the block waits for a fence on every stream it was used on. It joins the open batch of
// each used stream; a pass over those streams' fences runs at most once per batch window.
void FenceEngine::make_pending(Block* block) {
  block->state = BlockState::kPending;
  block->settle_seq = parts_.shards.get(block->stream).fences.join_as_owner();
  block->fences_left = static_cast<std::uint32_t>(block->recorded_streams.size());
  parts_.ledger.increase(&DeviceStats::pending_blocks, 1);
  parts_.ledger.increase(&DeviceStats::pending_bytes, static_cast<std::int64_t>(block->size));
  for (Stream used : block->recorded_streams) parts_.shards.get(used).fences.join_as_user(block);
  if (parts_.aids != nullptr)
    note_pending_changed(block->since, block->recorded_streams.data(), block->recorded_streams.size());
  if (!start_free_pass(block->since)) return;
  fence_after_free(block);
}

// Pipelined batching after a free with uses: each used stream keeps at most one fence in flight. The
// pass polls that fence (one query); once it has completed, the open batch is closed at once with a new
// event, so pending blocks are released about one fence latency after their free. While a fence is in
// flight, later frees join the open batch and share the next event. make_pending() runs this pass at
// most once per batch window, so a tight loop of frees shares events even when the GPU keeps up.
// A used stream that captures keeps the free in its open batch (`frees_deferred_capture`), fenced by a
// poll after the capture.
void FenceEngine::fence_after_free(const Block* block) {
  const HotReleases to_hot(*this);
  // This pass polls the pending blocks of the streams it visits: the allocation path's poll need not
  // repeat it in the same tick. (The free's time, taken on the pacing's clock.)
  note_pending_poll(block->since);
  bool deferred = false;
  // The free has happened; a device error in this opportunistic pass must not report it as failed.
  // The batch stays open and the next allocation that misses the cache fences it.
  try {
    const RelaxedCaptureScope relaxed(backend_);
    for (Stream used : block->recorded_streams) {
      Shard& shard = parts_.shards.get(used);
      std::uint64_t queries = 0;
      Fence fence;
      while (shard.fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(shard, fence);
      parts_.ledger.count(&DeviceStats::fences_polled, static_cast<std::int64_t>(queries));
      if (!shard.fences.in_flight().empty()) continue;
      if (backend_.is_capturing(device_, used)) {
        deferred = true;
      } else {
        close_batch(shard);
      }
    }
  } catch (const Error& e) {
    log().warn("device {}: fencing after a free failed, retried at the next allocation: {}", device_, e.what());
  }
  if (deferred) parts_.ledger.count(&DeviceStats::frees_deferred_capture);
}

void FenceEngine::note_pending_changed(Clock::time_point when, const Stream* streams, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    parts_.aids->on_pending_changed(when, streams[i], parts_.shards.get(streams[i]).fences.pending_stats());
  }
}

// The blocks a fence releases were all released when it was seen complete: one clock read for all of
// them, whatever their number.
void FenceEngine::finish_fence(Shard& shard, Fence& fence) {
  const Clock::time_point at = fence.pending.empty() ? Clock::time_point{} : now();
  DebugAids* aids = parts_.aids.get();
  for (Block* block : fence.pending) {
    shard.fences.note_pending_released(block);
    if (aids != nullptr && block->fences_left == 1) aids->on_fenced_free_completed(*block, shard.stream(), &fence);
    if (--block->fences_left == 0) parts_.release(block, at);
  }
  if (aids != nullptr && !fence.pending.empty()) {
    const Stream stream = shard.stream();
    note_pending_changed(at, &stream, 1);
  }
  if (fence.event != nullptr) events_.release(fence.event);  // none for a batch completed idle
  // This stream's owned free blocks settle up to the completed sequence number.
  parts_.free.settle_completed(shard);
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
void FenceEngine::close_batches_and_poll(Shard* missed, HotLists flush, std::optional<SizeClass> only) {
  // Hot blocks join the free lists, where they can merge and settle.
  if (missed == nullptr) {
    parts_.free.flush_all_hot();
  } else if (flush == HotLists::kEveryStream) {
    parts_.free.flush_all_hot(only);
  } else {
    parts_.free.flush_thread_hot(this_thread_token(), only, missed);
  }
  poll(/*close_batches=*/true, missed);
}

// A miss fences what may serve it: batches with pending blocks (once their used stream passes the
// fence, the blocks return to their allocation stream) and other streams' batches of owned free blocks
// (settled, they serve any stream). The missing stream's own batch of owned free blocks is no use to
// it: its owned blocks serve it already, and closing that batch at every miss would record an event for
// nearly every miss of a loop that alternates streams. So a miss fences its own batch only when the
// stream's newest fence is older than kOwnBatchInterval; other streams' misses, process_fences(),
// empty_cache() and the OOM path close it. A batch that holds pending blocks is never deferred.
bool FenceEngine::defers_own_batch(const Shard& shard, const Shard* missed, Clock::time_point at) const {
  return &shard == missed && shard.fences.open_pending().empty() &&
         at - shard.fences.last_recorded_at() < kOwnBatchInterval;
}

void FenceEngine::poll(bool close_batches, const Shard* missed) {
  const RelaxedCaptureScope relaxed(backend_);
  // Uses from a capture that has ended leave their batches first (an idle batch completes without
  // close_batch, which would drop them otherwise).
  if (has_capture_uses()) drop_ended_capture_uses();
  const auto at = now();
  for (auto& [stream, shard] : parts_.shards) {
    FenceQueue& fences = shard->fences;
    // A stream with nothing in flight, pending or in its open batch is passed over without its lock: a
    // long-running process knows many streams, most of them idle.
    if (fences.in_flight().empty() && fences.open_pending().empty() && (!close_batches || !fences.has_open_batch())) {
      continue;
    }
    parts_.shards.lock(*shard);  // (in_flight and open_pending are the device lock's; the sequence numbers are not)
    Fence fence;
    std::uint64_t queries = 0;
    bool oldest_incomplete = false;  // then no newer fence of the stream can have completed either
    const bool has_pending = !fences.open_pending().empty();
    if (has_pending && !fences.in_flight().empty()) {
      while (fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(*shard, fence);
      oldest_incomplete = !fences.in_flight().empty();
    }
    std::optional<bool> capturing;  // asked once, only of a stream the pass would query or record on
    const auto captures = [&, stream = stream] {
      if (!capturing) capturing = backend_.is_capturing(device_, stream);
      return *capturing;
    };
    bool idle = false;
    if (has_pending && fences.in_flight().empty() && !captures()) {
      ++queries;
      // Only a shortcut: a failed query means "not known idle", and the batch is fenced as usual.
      try {
        idle = backend_.query_stream(device_, stream);
      } catch (const Error& e) {
        log().warn("device {}: asking whether stream {:#x} is idle failed: {}", device_, stream, e.what());
      }
    }
    if (idle && fences.complete_open_batch(&fence, at)) {
      parts_.ledger.count(&DeviceStats::fences_skipped_idle);
      finish_fence(*shard, fence);
    } else if (close_batches && fences.has_open_batch() && !defers_own_batch(*shard, missed, at) && !captures()) {
      close_batch(*shard);
    }
    if (!oldest_incomplete) {
      while (fences.pop_completed(backend_, device_, &fence, &queries)) finish_fence(*shard, fence);
    }
    parts_.ledger.count(&DeviceStats::fences_polled, static_cast<std::int64_t>(queries));
    if (parts_.aids != nullptr && !fences.in_flight().empty()) {
      parts_.aids->on_fence_in_flight(stream, fences.in_flight().front(), at);
    }
  }
}

// Host-wait for every fence (the OOM path, empty_cache, a lower memory fraction). Afterwards nothing
// is pending.
void FenceEngine::synchronize_all(bool for_memory) {
  parts_.free.flush_all_hot();
  if (parts_.shards.any_capturing()) return;
  std::size_t fences = 0;
  const auto pending_before = parts_.ledger.stats().pending_bytes.current;
  for (auto& [stream, shard] : parts_.shards) {
    parts_.shards.lock(*shard);
    close_batch(*shard);
    Fence fence;
    while (shard->fences.synchronize_oldest(backend_, device_, &fence)) {
      finish_fence(*shard, fence);
      ++fences;
    }
  }
  parts_.ledger.count(&DeviceStats::fences_synced_host, static_cast<std::int64_t>(fences));
  parts_.ledger.count(&DeviceStats::num_sync_all_streams);
  if (for_memory && fences > 0 && parts_.aids != nullptr) {
    parts_.aids->on_host_sync_for_memory(
        fences, static_cast<std::size_t>(pending_before - parts_.ledger.stats().pending_bytes.current));
  }
}

// Streams may already be destroyed by now (a program tears down its streams, then the allocator), and
// a CUDA call on a destroyed stream can crash the driver, so this touches events only. Blocks whose
// fences were never recorded keep their segments reserved until the process exits.
void FenceEngine::wait_recorded() {
  for (auto& [stream, shard] : parts_.shards) {
    parts_.shards.lock(*shard);
    Fence fence;
    try {
      while (shard->fences.synchronize_oldest(backend_, device_, &fence)) finish_fence(*shard, fence);
    } catch (const Error& e) {
      log().debug("device {}: fence wait at teardown failed: {}", device_, e.what());
    }
  }
}

// Adds a dependency between the streams, no host sync.
Block* FenceEngine::take_after_gpu_wait(MemoryPool& pool, SizeClass size_class, std::size_t size, Stream stream) {
  if (parts_.shards.any_capturing()) return nullptr;
  Block* best = nullptr;
  for (const auto& [other, shard] : parts_.shards) {
    if (other == stream) continue;
    Block* candidate = pool.free.best_owned(size_class, other, size);
    if (candidate == nullptr || !size_policy::may_serve(candidate->size, size, parts_.options)) continue;
    if (best == nullptr || candidate->size < best->size) best = candidate;
  }
  if (best == nullptr) return nullptr;
  Shard& owner = parts_.shards.get(best->stream);
  if (best->settle_seq > owner.fences.closed_seq()) close_batch(owner);
  const Fence* fence = owner.fences.find(best->settle_seq);
  if (fence == nullptr) return nullptr;  // completed meanwhile: the block is settled by the next poll
  backend_.stream_wait_event(device_, stream, fence->event);
  if (parts_.aids != nullptr) parts_.aids->on_gpu_wait(fence->event, stream);
  parts_.ledger.count(&DeviceStats::fences_waited_gpu);
  parts_.ledger.count(&DeviceStats::cross_stream_reuse_waited);
  return best;
}

void FenceEngine::add_use(Block* block, Stream stream, NewUse how, bool routes) {
  if (parts_.aids != nullptr && parts_.aids->on_new_use(*block, stream, how)) {
    parts_.ledger.count(&DeviceStats::missing_wait_warnings);
  }
  block->recorded_streams.push_back(stream);
  // A use on a capturing stream without a route is kept, and fenced after the capture like any other:
  // later than needed, never too early.
  if (routes && backend_.is_capturing(device_, stream)) {
    capture_uses_[block].push_back(stream);
    parts_.capture_uses_changed();
  }
}

void FenceEngine::drop_ended_capture_uses() {
  std::vector<Block*> released;
  for (auto it = capture_uses_.begin(); it != capture_uses_.end();) {
    Block* block = it->first;
    std::vector<Stream>& streams = it->second;
    for (auto s = streams.begin(); s != streams.end();) {
      const Stream used = *s;
      if (backend_.is_capturing(device_, used)) {
        ++s;
        continue;
      }
      s = streams.erase(s);
      parts_.shards.get(block->stream);  // a live block is its shard's: lock it before changing its uses
      auto& uses = block->recorded_streams;
      auto use = std::find(uses.begin(), uses.end(), used);
      if (use != uses.end()) uses.erase(use);
      if (block->state == BlockState::kPending) {
        // No fence was recorded while the stream captured, so the block still waits in its open batch.
        parts_.shards.get(used).fences.leave_as_user(block);
        if (parts_.aids != nullptr) note_pending_changed(now(), &used, 1);
        if (--block->fences_left == 0) released.push_back(block);
      }
    }
    it = streams.empty() ? capture_uses_.erase(it) : std::next(it);
  }
  parts_.capture_uses_changed();
  const Clock::time_point at = released.empty() ? Clock::time_point{} : now();
  for (Block* block : released) {
    capture_reuse_.forget(block);
    if (parts_.aids != nullptr) parts_.aids->on_fenced_free_completed(*block, 0, nullptr);
    parts_.release(block, at);
  }
}

void FenceEngine::reuse_capture_frees(Stream stream) {
  const std::vector<Block*> reusable = capture_reuse_.take_reusable(backend_, device_, stream);
  if (reusable.empty()) return;
  const Clock::time_point at = now();
  for (Block* block : reusable) {
    // The graph orders every use before the stream's next work: the block leaves the batches it waits
    // in without a fence, as a use dropped at the capture's end does.
    for (const Stream used : block->recorded_streams) {
      parts_.shards.get(used).fences.leave_as_user(block);
      if (parts_.aids != nullptr) note_pending_changed(at, &used, 1);
    }
    block->fences_left = 0;
    capture_uses_.erase(block);
    if (parts_.aids != nullptr) parts_.aids->on_fenced_free_completed(*block, 0, nullptr);
    parts_.release(block, at);
  }
  parts_.capture_uses_changed();
}

void FenceEngine::validate() const {
  using invariant::broken;
  capture_reuse_.for_each_block([&](const Block* block) {
    if (block->state != BlockState::kPending) {
      broken(device_, "block " + invariant::hex(block->address) +
                          " waits for its streams to join in a capture but is not pending");
    }
  });
  for (const auto& [block, streams] : capture_uses_) {
    if (block->state == BlockState::kFree) broken(device_, "a free block still has uses recorded during a capture");
    for (Stream used : streams) {
      const auto& uses = block->recorded_streams;
      if (std::find(uses.begin(), uses.end(), used) == uses.end()) {
        broken(device_,
               "a use recorded during a capture is not among block " + invariant::hex(block->address) + "'s uses");
      }
    }
  }
}

}  // namespace streamalloc
