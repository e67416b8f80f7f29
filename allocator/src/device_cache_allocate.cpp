// DeviceCache: the allocation path (docs/design.md, "Stream rules" rules 1 and 5, and "Size classes").
//
// An allocation comes from one memory pool: the pool of the newest open route whose filter accepts the
// stream, else the default pool. In that pool it tries, in order: the requesting stream's hot list
// (default pool only); the best fit among its own stream's free blocks and settled blocks; the same
// after closing open batches and polling fences; a new segment from the device; (policy `wait`) a block
// of another stream made safe by a GPU-side wait on its fence; then the OOM path: host-synchronize every
// fence, retry, release cached segments, retry, (default pool) the free blocks of pools marked
// use_on_oom; then a clear OOM report. While a graph captures, the fence and release steps do nothing
// (docs/design.md, rule 6).
#include <algorithm>
#include <cstdint>

#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"
#include "logging.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void* DeviceCache::allocate_locked(std::size_t requested, Stream stream) {
  DeviceLock lock(*this);
  ledger_.count(&DeviceStats::allocations_device_locked);
  memory_.note_total(backend_, device_);
  if (requested > size_policy::kMaxRequest || requested > memory_.total_bytes()) throw_out_of_memory(requested, stream);
  Shard& own = shards_.get(stream);  // first sight of a stream checks that it belongs to this device
  own.count(&StreamCounts::allocations_device_locked);
  const StatsLedger::Serving serving(ledger_, own.stats_part());
  MemoryPool& pool = pools_.pool_for(stream);
  if (fences_.has_capture_frees()) fences_.reuse_capture_frees(stream);
  const std::size_t size = rounding_.round(requested);
  const SizeClass kind = size_policy::size_class_for(size);
  // While blocks are pending, their fences may have completed since the last pass (a host sync, or
  // time): PyTorch's allocator polls its events on every allocation, so after a sync it hands a
  // pending block back, and counts it inactive, even when a cached block serves the allocation. The
  // cache polls first too, at most once per tick of the coarse clock (a few ms; FenceEngine::pending_poll_due sends
  // the fast path here then), and records no fence there, so that a cross-stream loop keeps its
  // batched fences. The blocks it releases go to their allocation streams' hot lists
  // (DeviceCache::release_pending): the allocating stream's may serve it below.
  if (ledger_.stats().pending_blocks.current > 0) {
    const Clock::time_point now = fences_.coarse_now();
    if (fences_.start_pending_poll(now)) {
      const FenceEngine::HotReleases to_hot(fences_);
      fences_.poll(/*close_batches=*/false);
    }
  }
  if (pools_.is_default(&pool)) {
    if (Block* hot = own.take_hot(size)) return hand_out_hot(own, hot, requested);
    // An expandable segment holds all of a stream's blocks of a size class, so hot blocks left out of
    // the best fit would fragment it: there the hot list joins the free lists first, merged with its
    // neighbours, so that the best fit below sees the free memory it would see without the hot list
    // (docs/design.md, "Expandable segments", "Packing"). In fixed segments a large miss does the same
    // with the stream's large hot blocks: one left out of the best fit makes it carve a larger free
    // run, and the pieces strand memory that a later large request needs in one run. A small miss keeps
    // the stream's hot blocks: its other sizes stay cached.
    if (expandable_.grows(pool)) {
      free_.flush_hot(own);
    } else if (kind == SizeClass::kLarge) {
      free_.flush_hot(own, SizeClass::kLarge);
    }
  }
  // A poll of the miss path below puts the blocks it releases in their allocation streams' hot lists:
  // the allocating stream's may serve it.
  const auto take_hot_after_poll = [&]() -> Block* {
    if (!pools_.is_default(&pool) || !own.has_hot()) return nullptr;
    return own.take_hot(size);
  };

  Block* block = find_free_packed(pool, kind, size, stream);
  bool reserved = false;  // a new segment was asked for (and refused, when block is still nullptr)
  if (block == nullptr) {
    // A miss: the hot blocks of the missing size class of this thread's other streams join the free
    // lists, and the fences are closed and polled (so that they settle); then, before the device is
    // asked for more, the missing stream's own, oldest first, as many as it takes. A miss of one size
    // keeps the stream's other sizes hot. Other threads' hot lists are flushed only when that does not
    // serve, and for a small block only after a new 2 MiB segment: flushing a thread's hot list sends
    // its next allocations to the device lock (docs/design.md, "The allocation path", step 2). A
    // program that allocates from one thread flushes every hot list of the class before it grows.
    {
      const FenceEngine::HotReleases to_hot(fences_);
      fences_.close_batches_and_poll(&own, FenceEngine::HotLists::kThisThreadsOthers, kind);
    }
    if (Block* hot = take_hot_after_poll()) return hand_out_hot(own, hot, requested);
    block = free_.find(pool, kind, size, stream, expandable_.grows(pool));
    // Up to hot_list_mb of the stream's hot blocks stay hot through a small miss: a new segment first.
    if (block == nullptr && kind == SizeClass::kSmall && own.hot_bytes() < options_.hot_list_bytes &&
        pools_.is_default(&pool) && !expandable_.grows(pool)) {
      block = reserve_segment(pool, kind, size, stream);
    }
    // The stream's own blocks serve it unsettled: its oldest of the class join the lists until the
    // best fit finds a block, so that the sizes it used last stay hot.
    while (block == nullptr && pools_.is_default(&pool) && free_.flush_hot_until(own, kind, size)) {
      block = free_.find(pool, kind, size, stream, expandable_.grows(pool));
    }
    if (block == nullptr && kind == SizeClass::kSmall) {
      block = reserve_segment(pool, kind, size, stream);
      reserved = true;
    }
    if (block == nullptr) {
      fences_.close_batches_and_poll(&own, FenceEngine::HotLists::kEveryStream, kind);
      block = free_.find(pool, kind, size, stream, expandable_.grows(pool));
    }
  }
  if (block == nullptr && !reserved) block = reserve_segment(pool, kind, size, stream);
  if (block == nullptr && options_.cross_stream_reuse == CrossStreamReuse::kWait) {
    block = fences_.take_after_gpu_wait(pool, kind, size, stream);
  }
  if (block == nullptr) {
    ledger_.count(&DeviceStats::num_alloc_retries);
    free_.release_held(aids_.get());
    fences_.synchronize_all(/*for_memory=*/true);
    block = free_.find(pool, kind, size, stream, expandable_.grows(pool));
    if (block == nullptr) {
      release_free_segments(SIZE_MAX);
      block = reserve_segment(pool, kind, size, stream);
    }
    // The last resort of a default-pool allocation: a free block of a pool whose owner allowed it.
    if (block == nullptr && pools_.is_default(&pool)) {
      block = pools_.find_in_use_on_oom(
          [&](MemoryPool& other) { return free_.find(other, kind, size, stream, expandable_.grows(other)); });
    }
  }
  if (block == nullptr) throw_out_of_memory(requested, stream);
  own.note_thread();
  return reinterpret_cast<void*>(hand_out(free_.take(block, size), requested, stream)->address);
}

void* DeviceCache::hand_out_hot(Shard& own, Block* hot, std::size_t requested) {
  ledger_.give_headroom_for_hot_reuse(own, hot, requested);
  own.reuse_hot(hot, requested);
  if (size_policy::is_oversize(hot->size, options_)) ledger_.increase(&DeviceStats::oversize_allocations, 1);
  if (aids_ != nullptr) aids_->on_allocate(*hot);
  own.note_thread();
  return reinterpret_cast<void*>(hot->address);
}

// Expandable segments pack tighter when a pending block whose fences have completed comes back before
// a larger free block is carved (docs/design.md, "Expandable segments", "Packing"). The poll before the
// best fit runs once per tick of the coarse clock, so in a burst of allocations a block whose consumer
// has passed its fence still looks pending: the best fit then splits a larger block, its rest is a
// hole that later requests of other sizes fit worse, and the segment grows at its end instead. So a
// fit that would split, while blocks are pending, polls (no event recorded: fences in flight and idle
// streams' open batches) and looks again. Exact fits, the steady state of a training loop, pay nothing.
// Fixed segments keep the per-tick poll alone: their numbers do not change with the option off.
Block* DeviceCache::find_free_packed(MemoryPool& pool, SizeClass kind, std::size_t size, Stream stream) {
  const bool expandable = expandable_.grows(pool);
  Block* block = free_.best_fit(pool, kind, size, stream, expandable);
  if (block != nullptr && block->size != size && expandable && ledger_.stats().pending_blocks.current > 0) {
    fences_.poll(/*close_batches=*/false);
    block = free_.best_fit(pool, kind, size, stream, expandable);
  }
  return free_.count_reuse(block, stream);
}

// The default pool grows its expandable segments when the option is on (ExpandableSegments::grow),
// also while a stream captures a graph (mapping works in a capture; unmapping waits for its end);
// private pools reserve fixed segments. Growing a pool works during a graph capture too: the backend
// reserves in relaxed capture mode, and the new segment is never given back before the capture ends
// (release_free_segments waits for that).
Block* DeviceCache::reserve_segment(MemoryPool& pool, SizeClass kind, std::size_t size, Stream stream) {
  if (expandable_.grows(pool)) {
    bool no_address_space = false;
    Block* grown = expandable_.grow(kind, size, stream, memory_.cap(), &no_address_space);
    // Without address space the memory may still be there: a fixed segment, as without the option.
    if (!no_address_space) return grown;
  }
  const std::size_t segment_size = size_policy::segment_size_for(size);
  if (segments_.reserved_bytes() + segment_size > memory_.cap()) return nullptr;
  Segment* segment = segments_.reserve(kind, &pool, segment_size, stream);
  if (segment == nullptr) return nullptr;
  if (aids_ != nullptr) aids_->on_segment(TraceAction::kSegmentAlloc, *segment);
  pool.note_segment(+1);
  ledger_.count(&DeviceStats::num_device_alloc);
  ledger_.increase(&DeviceStats::segment, kind, 1);
  ledger_.increase(&DeviceStats::reserved_bytes, kind, static_cast<std::int64_t>(segment_size));
  if (size_policy::is_oversize(segment_size, options_)) ledger_.increase(&DeviceStats::oversize_segments, 1);
  free_.insert(segment->head);
  return segment->head;
}

// A block from the free lists (or a restored checkpoint) enters its stream's shard.
Block* DeviceCache::hand_out(Block* block, std::size_t requested, Stream stream) {
  block->state = BlockState::kAllocated;
  block->settled = false;
  block->stream = stream;
  block->requested = requested;
  block->recorded_streams.clear();
  block->record_stream_calls = 0;
  block->fences_left = 0;
  block->since = coarse_now();
  Shard& shard = shards_.get(stream);
  shard.add_live(block);
  shards_.enter(block);
  ledger_.account_allocated(shard, block, requested);
  if (size_policy::is_oversize(block->size, options_)) ledger_.increase(&DeviceStats::oversize_allocations, 1);
  if (aids_ != nullptr) aids_->on_allocate(*block);
  return block;
}

void DeviceCache::throw_out_of_memory(std::size_t requested, Stream stream) {
  // Past any device PyTorch's words alone, not counted in num_ooms (as PyTorch's).
  const bool beyond_any_device = requested > size_policy::kMaxRequest;
  const std::size_t size = beyond_any_device ? 0 : rounding_.round(requested);
  DeviceMemoryInfo info;
  if (!beyond_any_device) {
    ledger_.count(&DeviceStats::num_ooms);
    info = backend_.memory_info(device_);
  }
  const std::string msg =
      report_.out_of_memory(requested, size, stream, info, memory_.fraction(), memory_.cap(), memory_.total_bytes());
  if (aids_ != nullptr && !beyond_any_device) {
    aids_->on_out_of_memory_request(info.free_bytes, size, stream, pools_.pool_for(stream).id);
  }
  if (aids_ != nullptr) aids_->on_out_of_memory(msg);
  if (!beyond_any_device && requested <= memory_.total_bytes()) log().debug("{}", msg);
  throw Error(ErrorCode::kOutOfMemory, msg);
}

}  // namespace streamalloc
