// DeviceCache: the allocation path (docs/design.md §3 rule 5, §4).
//
// An allocation tries, in order: the best fit among its own stream's free blocks and settled blocks;
// the same after closing open batches and polling fences; a new segment from the device; (policy
// `wait`) a block of another stream made safe by a GPU-side wait on its fence; then the OOM path:
// host-synchronize every fence, retry, release cached segments, retry; then a clear OOM report.
#include <algorithm>
#include <cstdint>

#include <spdlog/fmt/fmt.h>

#include "audit.hpp"
#include "device_cache.hpp"
#include "logging.hpp"
#include "size_policy.hpp"
#include "sync_checker.hpp"

namespace streamalloc {

namespace {
// Larger than any device: rejects absurd sizes before rounding could overflow.
constexpr std::size_t kMaxRequest = std::size_t{1} << 56;
}  // namespace

void* DeviceCache::allocate(std::size_t requested, Stream stream) {
  Lock lock(mutex_);
  if (device_total_ == 0) device_total_ = backend_.memory_info(device_).total_bytes;
  if (requested > kMaxRequest || requested > device_total_) {
    ++stats_.num_ooms;
    const std::string msg = fmt::format(
        "streamalloc: cannot allocate {} ({} bytes) on device {}: larger than the device's total memory of {}. "
        "Check the size computation of this tensor.",
        format_bytes(requested), requested, device_, format_bytes(device_total_));
    audit_.out_of_memory(device_, msg);
    throw Error(ErrorCode::kOutOfMemory, msg);
  }
  FenceQueue& own = queue(stream);  // first sight of a stream checks that it belongs to this device
  const std::size_t size = size_policy::round_size(requested, options_);
  if (Block* hot = take_hot(own, size)) return reinterpret_cast<void*>(hand_out(hot, requested, stream)->address);
  const PoolKind pool = size_policy::pool_for(size);
  // A large-pool size the hot list cannot serve: the parked blocks join the free lists first, merged
  // with their neighbours, so the best fit below sees the free memory it would see without the hot
  // list. Parked blocks left out of the best fit fragmented the large pool (ResNet-50 trace: 0.994x ->
  // 1.037x native's peak reserved); small-pool blocks stay parked, since their 2 MiB segments bound
  // what fragmentation can cost and code cycling through a few small sizes keeps hitting the list.
  if (pool == PoolKind::kLarge) flush_hot(own, 0);

  Block* block = find_free(pool, size, stream);
  if (block == nullptr) {
    close_batches_and_poll();
    block = find_free(pool, size, stream);
  }
  if (block == nullptr) block = reserve_segment(pool, size, stream);
  if (block == nullptr && options_.cross_stream_reuse == CrossStreamReuse::kWait) {
    block = find_free_after_gpu_wait(pool, size, stream);
  }
  if (block == nullptr) {
    ++stats_.num_alloc_retries;
    flush_quarantine();
    synchronize_all_fences(/*for_memory=*/true);
    block = find_free(pool, size, stream);
    if (block == nullptr) {
      release_free_segments(SIZE_MAX);
      block = reserve_segment(pool, size, stream);
    }
  }
  if (block == nullptr) throw_out_of_memory(requested, size, stream);
  return reinterpret_cast<void*>(take(block, size, requested, stream)->address);
}

Block* DeviceCache::find_free(PoolKind pool, std::size_t size, Stream stream) {
  const int p = pool_index(pool);
  Block* own = unsettled_[p].best_fit(stream, size);
  if (own != nullptr && !size_policy::may_serve(own->size, size, options_)) own = nullptr;
  const Stream key = options_.cross_stream_reuse == CrossStreamReuse::kNever ? stream : 0;
  Block* settled = settled_[p].best_fit(key, size);
  if (settled != nullptr && !size_policy::may_serve(settled->size, size, options_)) settled = nullptr;
  if (own != nullptr && (settled == nullptr || own->size <= settled->size)) return own;
  if (settled != nullptr && settled->stream != stream) ++stats_.cross_stream_reuse_settled;
  return settled;
}

// Policy `wait`: take the best-fitting unsettled block of another stream and make `stream` wait on
// the GPU for the fence that settles it. Adds a dependency between the streams, no host sync.
Block* DeviceCache::find_free_after_gpu_wait(PoolKind pool, std::size_t size, Stream stream) {
  if (backend_.is_capturing(device_, stream)) return nullptr;
  const int p = pool_index(pool);
  Block* best = nullptr;
  for (const auto& [other, q] : queues_) {
    if (other == stream) continue;
    Block* candidate = unsettled_[p].best_fit(other, size);
    if (candidate == nullptr || !size_policy::may_serve(candidate->size, size, options_)) continue;
    if (best == nullptr || candidate->size < best->size) best = candidate;
  }
  if (best == nullptr) return nullptr;
  FenceQueue& owner = queue(best->stream);
  if (best->settle_seq > owner.closed_seq()) {
    close_batch(owner);
  }
  const Fence* fence = owner.find(best->settle_seq);
  if (fence == nullptr) return nullptr;  // completed meanwhile: the block is settled by the next poll
  backend_.stream_wait_event(device_, stream, fence->event);
  if (sync_ != nullptr) sync_->on_event_wait(reinterpret_cast<std::uintptr_t>(fence->event), stream);
  ++stats_.fences_waited_gpu;
  ++stats_.cross_stream_reuse_waited;
  return best;
}

std::size_t DeviceCache::memory_cap() const {
  return static_cast<std::size_t>(memory_fraction_ * static_cast<double>(device_total_));
}

Block* DeviceCache::reserve_segment(PoolKind pool, std::size_t size, Stream stream) {
  const std::size_t segment_size = size_policy::segment_size_for(size);
  if (reserved_ + segment_size > memory_cap()) return nullptr;
  void* memory = backend_.reserve(device_, segment_size);
  if (memory == nullptr) return nullptr;
  ++stats_.num_device_alloc;
  auto segment = std::make_unique<Segment>();
  segment->address = reinterpret_cast<std::uintptr_t>(memory);
  segment->size = segment_size;
  segment->pool = pool;
  segment->stream = stream;
  auto* block = new Block;
  block->address = segment->address;
  block->size = segment_size;
  block->segment = segment.get();
  block->state = BlockState::kFree;
  block->settled = true;  // fresh memory: no stream has touched it
  block->stream = stream;
  block->since = Clock::now();
  segment->head = block;
  segments_.emplace(segment->address, std::move(segment));
  reserved_ += segment_size;
  stat_increase(&DeviceStats::segment, pool, 1);
  stat_increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(segment_size));
  if (options_.max_split_size_bytes != 0 && segment_size >= options_.max_split_size_bytes) {
    stats_.oversize_segments.increase(1);
  }
  insert_free(block);
  return block;
}

Block* DeviceCache::take(Block* block, std::size_t size, std::size_t requested, Stream stream) {
  remove_free(block);
  const PoolKind pool = block->segment->pool;
  if (size_policy::should_split(block->size, size, pool, options_)) {
    auto* rest = new Block;
    rest->address = block->address + size;
    rest->size = block->size - size;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    rest->state = BlockState::kFree;
    rest->settled = block->settled;
    rest->stream = block->stream;
    rest->settle_seq = block->settle_seq;
    rest->since = block->since;
    block->size = size;
    insert_free(rest);
  }
  return hand_out(block, requested, stream);
}

Block* DeviceCache::hand_out(Block* block, std::size_t requested, Stream stream) {
  const PoolKind pool = block->segment->pool;
  block->state = BlockState::kAllocated;
  block->settled = false;
  block->stream = stream;
  block->requested = requested;
  block->uses.clear();
  block->record_calls = 0;
  block->fences_left = 0;
  block->since = coarse_now();
  if (sync_ != nullptr) block->alloc_tick = sync_->tick(stream);
  live_.insert(block->address, block);
  stat_increase(&DeviceStats::allocation, pool, 1);
  stat_increase(&DeviceStats::allocated_bytes, pool, static_cast<std::int64_t>(block->size));
  stat_increase(&DeviceStats::requested_bytes, pool, static_cast<std::int64_t>(requested));
  stat_increase(&DeviceStats::active, pool, 1);
  stat_increase(&DeviceStats::active_bytes, pool, static_cast<std::int64_t>(block->size));
  if (options_.max_split_size_bytes != 0 && block->size >= options_.max_split_size_bytes) {
    stats_.oversize_allocations.increase(1);
  }
  if (options_.poison == PoisonMode::kAlloc || options_.poison == PoisonMode::kBoth) {
    poison(block, stream);
  }
  audit_.trace(device_, "malloc", block->address, block->size, stream);
  return block;
}

// Give back segments that are one settled free block, until `target_bytes` are released.
std::size_t DeviceCache::release_free_segments(std::size_t target_bytes) {
  std::size_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end() && released < target_bytes;) {
    Segment* segment = it->second.get();
    Block* head = segment->head;
    if (head->state != BlockState::kFree || !head->settled || head->quarantined || head->next != nullptr) {
      ++it;
      continue;
    }
    remove_free(head);
    backend_.release(device_, reinterpret_cast<void*>(segment->address), segment->size);
    ++stats_.num_device_free;
    reserved_ -= segment->size;
    released += segment->size;
    stat_decrease(&DeviceStats::segment, segment->pool, 1);
    stat_decrease(&DeviceStats::reserved_bytes, segment->pool, static_cast<std::int64_t>(segment->size));
    if (options_.max_split_size_bytes != 0 && segment->size >= options_.max_split_size_bytes) {
      stats_.oversize_segments.decrease(1);
    }
    delete head;
    it = segments_.erase(it);
  }
  return released;
}

void DeviceCache::throw_out_of_memory(std::size_t requested, std::size_t size, Stream stream) {
  ++stats_.num_ooms;
  const DeviceMemoryInfo info = backend_.memory_info(device_);
  std::size_t cached_free = 0;
  for (const auto& index : {std::cref(unsettled_), std::cref(settled_)}) {
    for (const FreeIndex& pool_index_ : index.get()) pool_index_.for_each([&](Block* b) { cached_free += b->size; });
  }
  std::string msg = fmt::format(
      "streamalloc: out of memory on device {} ({}): tried to allocate {} ({} rounded) on stream {:#x}. Device: {} "
      "total, {} free. streamalloc: {} reserved, {} allocated, {} cached free, {} pending in {} block(s)",
      device_, backend_.name(), format_bytes(requested), format_bytes(size), stream, format_bytes(info.total_bytes),
      format_bytes(info.free_bytes), format_bytes(reserved_),
      format_bytes(static_cast<std::size_t>(stats_.allocated_bytes[0].current)), format_bytes(cached_free),
      format_bytes(static_cast<std::size_t>(stats_.pending_bytes.current)), stats_.pending_blocks.current);
  if (memory_fraction_ < 1.0) {
    msg += fmt::format("; memory fraction cap {} = {}", memory_fraction_, format_bytes(memory_cap()));
  }
  msg += ".";
  std::vector<std::pair<std::int64_t, Stream>> holders;
  for (const auto& [s, q] : queues_) {
    if (q->pending_stats().pending_bytes.current > 0) holders.emplace_back(q->pending_stats().pending_bytes.current, s);
  }
  std::sort(holders.rbegin(), holders.rend());
  if (!holders.empty()) {
    msg += " Largest pending holders (streams whose fences hold freed blocks):";
    for (std::size_t i = 0; i < holders.size() && i < 3; ++i) {
      msg += fmt::format(" stream {:#x} holds {};", holders[i].second,
                         format_bytes(static_cast<std::size_t>(holders[i].first)));
    }
  }
  msg += " What to do: free tensors you no longer need, lower the batch size, or set max_split_size_mb to "
         "reduce fragmentation if cached free memory is large.";
  audit_.out_of_memory(device_, msg);
  log().debug("{}", msg);
  throw Error(ErrorCode::kOutOfMemory, msg);
}

void DeviceCache::empty_cache() {
  Lock lock(mutex_);
  flush_quarantine();
  synchronize_all_fences();
  release_free_segments(SIZE_MAX);
}

void DeviceCache::set_memory_fraction(double fraction) {
  Lock lock(mutex_);
  if (device_total_ == 0) device_total_ = backend_.memory_info(device_).total_bytes;
  memory_fraction_ = fraction;
  if (reserved_ > memory_cap()) {
    flush_quarantine();
    synchronize_all_fences();
    release_free_segments(reserved_ - memory_cap());
  }
}

double DeviceCache::memory_fraction() const {
  Lock lock(mutex_);
  return memory_fraction_;
}

// Teardown and shutdown. Streams may already be destroyed by now (a program tears down its streams,
// then the allocator), and a CUDA call on a destroyed stream can crash the driver, so this touches
// events only: it waits for the fences already recorded and releases what they settle. Blocks whose
// fences were never recorded keep their segments reserved until the process exits.
void DeviceCache::release_all() {
  Lock lock(mutex_);
  flush_all_hot();
  flush_quarantine();
  for (auto& [stream, q] : queues_) {
    Fence fence;
    try {
      while (q->synchronize_oldest(backend_, device_, &fence)) finish_fence(*q, fence);
    } catch (const Error& e) {
      log().debug("device {}: fence wait at teardown failed: {}", device_, e.what());
    }
  }
  release_free_segments(SIZE_MAX);
  if (!live_.empty()) {
    log().debug("device {}: {} block(s) still allocated at teardown stay reserved", device_, live_.size());
  }
}

}  // namespace streamalloc
