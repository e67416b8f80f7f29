// DeviceCache: giving memory back. empty_cache, the memory-fraction cap, and teardown all come down to
// release_free_segments(): segments that are one settled free block go back to the device.
#include "device_cache.hpp"
#include "logging.hpp"
#include "size_policy.hpp"

namespace streamalloc {

// Segments that are one settled free block go back, in address order, and so do the whole pages inside
// the free blocks of expandable segments (ExpandableSegments::trim). cudaFree and unmapping are not allowed while a
// graph captures, so nothing goes back then; the next call after the capture does it. Teardown
// (`ask_streams` false) asks no stream: they may be destroyed by then, and no capture can be running.
std::size_t DeviceCache::release_free_segments(std::size_t target_bytes, const MemoryPool* only, bool ask_streams) {
  if (ask_streams && shards_.any_capturing()) return 0;
  std::size_t released = 0;
  for (Segment* segment : segments_.all()) {
    if (released >= target_bytes) break;
    MemoryPool* owner = segment->owner;
    if (only != nullptr && owner != only) continue;
    if (!pools_.is_default(owner) && !owner->freeable()) continue;
    if (segment->expandable()) {
      released += expandable_.trim(segment);
      continue;
    }
    Block* head = segment->head;
    if (head->in_shard || head->state != BlockState::kFree || !head->settled || head->held || head->next != nullptr)
      continue;
    free_.remove(head);
    owner->note_segment(-1);
    const SizeClass size_class = segment->size_class;
    const std::size_t size = segment->size;
    if (aids_ != nullptr) aids_->on_segment(TraceAction::kSegmentFree, *segment);
    segments_.release(segment);
    ledger_.count(&DeviceStats::num_device_free);
    released += size;
    ledger_.decrease(&DeviceStats::segment, size_class, 1);
    ledger_.decrease(&DeviceStats::reserved_bytes, size_class, static_cast<std::int64_t>(size));
    if (size_policy::is_oversize(size, options_)) ledger_.decrease(&DeviceStats::oversize_segments, 1);
  }
  pools_.erase_empty_freeable();
  return released;
}

void DeviceCache::empty_cache() {
  DeviceLock lock(*this);
  free_.release_held(aids_.get());
  fences_.synchronize_all();
  release_free_segments(SIZE_MAX);
}

// A private pool's memory goes back only once the pool is freeable; until then its free segments stay
// with it (its graphs still replay into them).
void DeviceCache::empty_cache(PoolId pool) {
  if (pool.is_default()) {
    empty_cache();
    return;
  }
  DeviceLock lock(*this);
  MemoryPool* target = pools_.find(pool);
  if (target == nullptr || !target->freeable()) return;
  free_.release_held(aids_.get());
  fences_.synchronize_all();
  release_free_segments(SIZE_MAX, target);
}

void DeviceCache::set_memory_fraction(double fraction) {
  DeviceLock lock(*this);
  memory_.note_total(backend_, device_);
  memory_.set_fraction(fraction);
  if (segments_.reserved_bytes() > memory_.cap()) {
    free_.release_held(aids_.get());
    fences_.synchronize_all();
    release_free_segments(segments_.reserved_bytes() - memory_.cap());
  }
}

double DeviceCache::memory_fraction() const {
  DeviceLock lock(*this);
  return memory_.fraction();
}

// Teardown and shutdown: the fences already recorded are waited for (FenceEngine::wait_recorded asks no
// stream) and what they settle goes back.
void DeviceCache::release_all() {
  DeviceLock lock(*this);
  free_.flush_all_hot();
  free_.release_held(aids_.get());
  fences_.wait_recorded();
  release_free_segments(SIZE_MAX, nullptr, /*ask_streams=*/false);
  if (const std::size_t live = shards_.live_count(); live != 0) {
    log().debug("device {}: {} block(s) still allocated at teardown stay reserved", device_, live);
  }
}

}  // namespace streamalloc
