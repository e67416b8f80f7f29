// DeviceCache: the block cache of one device, and the policy of the stream rules (docs/design.md,
// "Stream rules"). Segments from a SegmentSource are split into blocks; free blocks sit in the
// FreeLists of the segment's MemoryPool (the default pool, or a private pool that allocations are
// routed to), owned by a stream or settled; blocks freed after use on other streams wait as pending for
// batched fences, kept per stream in a Shard. Debugging aids hang off one hook pointer
// (debug_aid.hpp).
//
// Locking (docs/design.md, "Locking"): each stream's Shard has its own lock. The common path, an allocation
// served from the stream's hot list and a free of a block without other uses back to it, takes that shard
// lock alone (shard.cpp). Everything else takes the device lock and then the lock of every
// shard it touches, held until it returns (DeviceLock, ShardSet::get). Order: device lock, then shard locks;
// a fast path holds one shard lock and never waits for the device lock while holding it. The stats the fast
// path changes are split between the device and the shards (shard_stats.hpp): it writes only its shard.
//
// The state is the components' (docs/design.md, "Components", says which owns what); DeviceCache ties
// them together, one concept per file, device_cache_<concept>.cpp, and the private methods below are
// grouped the same way.
#pragma once

#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "block.hpp"
#include "cache_report.hpp"
#include "cycle_clock.hpp"
#include "debug_aid.hpp"
#include "expandable_segments.hpp"
#include "fence_engine.hpp"
#include "fence_queue.hpp"
#include "free_blocks.hpp"
#include "free_lists.hpp"
#include "live_map.hpp"
#include "memory_cap.hpp"
#include "memory_pool.hpp"
#include "pool_set.hpp"
#include "segment_source.hpp"
#include "shard_stats.hpp"
#include "shard_set.hpp"
#include "spin_lock.hpp"
#include "stats_ledger.hpp"
#include "shard.hpp"
#include "size_policy.hpp"
#include "trace_events.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/blocks.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc {

class DeviceCache {
 public:
  // `aids`: the debugging aids the options turn on (make_debug_aids), nullptr when none is.
  DeviceCache(int device, const Options& options, Backend& backend, std::unique_ptr<DebugAids> aids);
  ~DeviceCache();
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // Inline (below): the common case is the stream's shard alone; the rest is out of line.
  void* allocate(std::size_t requested, Stream stream);
  // Frees a live block of this device; false (nothing changed) when `ptr` is not live here. `stream`:
  // the free's stream, 0 when unknown; then `look_first` names the stream whose shard is tried first.
  bool deallocate(void* ptr, std::size_t size_hint, Stream stream, Stream look_first = 0);
  // The common cases alone (the stream's shard, shard.cpp): nullptr / false when the
  // call needs allocate / deallocate, with nothing changed. Never throw: nothing on them allocates.
  void* allocate_cached(std::size_t requested, Stream stream) noexcept;
  bool deallocate_cached(void* ptr, std::size_t size_hint, Stream stream, Stream look_first = 0) noexcept;
  // allocate and deallocate without the common case, for a caller whose allocate_cached /
  // deallocate_cached has just missed (device_cache_allocate.cpp, device_cache_free.cpp).
  void* allocate_locked(std::size_t requested, Stream stream);
  bool deallocate_locked(std::uintptr_t address, std::size_t size_hint, Stream stream_hint);
  // Counts a rejected free and throws the error that says which mistake it was; with `only_if_inside`,
  // only when `ptr` lies inside a segment of this device (else it returns, counting nothing).
  void reject_free(const void* ptr, bool only_if_inside = false);
  // Adds `stream` to a live block's uses; false (nothing changed, nothing counted) when `ptr` is not
  // live here.
  bool record_stream(void* ptr, Stream stream);
  // Counts and audits a record_stream on a pointer that is live on no device.
  void record_stream_not_live(const void* ptr, Stream stream);
  bool owns_live(const void* ptr) const;
  // Whether a call on this device has used `stream` (lock-free: the free path's device lookup).
  bool knows_stream(Stream stream) const { return shards_.find_published(stream) != nullptr; }

  void empty_cache();  // the default pool and every freeable private pool
  void empty_cache(PoolId pool);
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  // PyTorch's settings at runtime (Allocator::set_roundup_power2_divisions and the calls after it):
  // the rounding of later requests, whether new segments of the default pool are expandable, and
  // whether a capture reuses a block freed with uses once its streams have joined.
  void set_roundup_power2_divisions(const size_policy::Rounding::Table& table) { rounding_.set(table); }
  size_policy::Rounding::Table roundup_power2_divisions() const { return rounding_.table(); }
  void set_expandable_segments(bool on);
  bool expandable_segments() const;
  void set_graph_capture_record_stream_reuse(bool on);
  bool graph_capture_record_stream_reuse() const;
  void process_fences();
  void synchronize_fences();
  void release_all();  // teardown and shutdown: every segment without live blocks goes back

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  std::vector<SegmentInfo> segments() const;
  std::size_t requested_size_of(const void* ptr) const;
  void cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const;
  void* segment_base(const void* ptr, std::size_t* size) const;
  // Allocator::share_pieces on this device; false (nothing changed) when `ptr` is not live here.
  bool share_pieces(const void* ptr, SharedPieces* out);
  PendingHistory pending_history() const;
  void validate() const;

  // Memory pools (streamalloc/pools.hpp; device_cache_pools.cpp, device_cache_checkpoint.cpp).
  void create_or_incref_pool(PoolId pool);
  void release_pool(PoolId pool);
  void begin_allocate_to_pool(PoolId pool, PoolFilter filter);
  void end_allocate_to_pool(PoolId pool);
  int pool_use_count(PoolId pool) const;
  void set_pool_use_on_oom(PoolId pool, bool use_on_oom);
  void set_pool_no_split(PoolId pool);
  void set_pool_segment_allocator(PoolId pool, SegmentAllocator segments);
  std::vector<PoolInfo> pools() const;
  PoolCheckpoint checkpoint_pool(PoolId pool) const;
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
  bool pool_live_blocks_are(PoolId pool, const std::vector<const void*>& expected) const;

  // Allocation history (streamalloc/trace.hpp): events go to `sink` from now on; nullptr stops them.
  void set_trace_sink(TraceSink* sink);

 private:
  // The device lock of one public call, and the shard locks the call took on the way (lock_shard),
  // released together when it returns. It times how long the call waited for the lock and held it.
  class DeviceLock {
   public:
    explicit DeviceLock(const DeviceCache& cache)
        : cache_(cache), lock_(cache.shards_.device_mutex(), std::try_to_lock) {
      // Timed only when taken: an uncontended call reads the clock twice (here and when it returns).
      if (!lock_.owns_lock()) {
        const std::uint64_t asked = cycle_clock::now();
        lock_.lock();
        cache_.ledger_.add_lock_wait(cycle_clock::now() - asked);
      }
      taken_ = cycle_clock::now();
      cache_.ledger_.add_lock_acquisition();
      cache_.shards_.note_device_lock_taken();
    }
    ~DeviceLock() {
      cache_.fences_.publish_pending_poll(cache_.ledger_.stats().pending_blocks.current > 0);
      cache_.ledger_.add_lock_held(cycle_clock::now() - taken_);
      cache_.shards_.note_device_lock_released();
    }
    DeviceLock(const DeviceLock&) = delete;
    DeviceLock& operator=(const DeviceLock&) = delete;

   private:
    const DeviceCache& cache_;
    std::unique_lock<std::mutex> lock_;
    std::uint64_t taken_ = 0;
  };

  // ---- shards (shard_set.hpp; the fast path is the Shard's, shard.cpp)
  // Whether the fast path may run: no debugging aid (the allocation history is one: it records under
  // the device lock), no open route, no use recorded during a capture. Recomputed under the device lock
  // whenever one of these changes.
  void update_fast_path() {
    fast_path_.store(aids_ == nullptr && !pools_.has_routes() && !fences_.has_capture_uses(),
                     std::memory_order_relaxed);
  }

  // ---- allocation path (device_cache_allocate.cpp)
  // The first best fit of an allocation; in an expandable segment a fit that would carve a larger block
  // while blocks are pending looks again after a poll (device_cache_allocate.cpp says why).
  Block* find_free_packed(MemoryPool& pool, SizeClass kind, std::size_t size, Stream stream);
  // A new segment, or more pages of an expandable one, holding a free block of at least `size` bytes.
  Block* reserve_segment(MemoryPool& pool, SizeClass kind, std::size_t size, Stream stream);
  Block* hand_out(Block* block, std::size_t requested, Stream stream);  // mark allocated, account
  void* hand_out_hot(Shard& own, Block* hot, std::size_t requested);    // taken from own's hot list
  // Counts it (but a request past any device), tells the aids, throws (CacheReport::out_of_memory).
  [[noreturn]] void throw_out_of_memory(std::size_t requested, Stream stream);

  // ---- free path (device_cache_free.cpp)
  // A live block, checked, its shard locked: back to its owner stream (its hot list while its batch is
  // open, else the free lists), or pending when it has other uses.
  void free_live(Block* block);
  // FenceEngine::Parts::release: every fence of a pending block has completed (at `now`). It goes
  // in its owner's hot list while a fence pass or poll runs and the list has room (docs/design.md,
  // "Fences: batching and pipelining"), else it enters the free lists.
  void release_pending(Block* block, Clock::time_point now);

  // ---- lifecycle (device_cache_lifecycle.cpp)
  // Give back entirely free, settled segments of the default pool and of freeable private pools (of
  // `only` alone when given) until `target_bytes` are released. Nothing while a graph captures.
  std::size_t release_free_segments(std::size_t target_bytes, const MemoryPool* only = nullptr,
                                    bool ask_streams = true);

  const int device_;
  const Options& options_;
  Backend& backend_;
  // What every stream's fast path reads and nothing writes on it: on cache lines of their own, away
  // from the device lock and the fields device-locked calls write.
  // The fast path's switch (update_fast_path) and its lock-free view of the shards.
  alignas(kCacheLine) std::atomic<bool> fast_path_{false};
  // The request rounding: read by every allocation, changed by set_roundup_power2_divisions.
  size_policy::Rounding rounding_;
  // The device's memory (read by the fast path) and the memory fraction that caps the cache.
  MemoryCap memory_;
  // The shards: the fast path's lock-free table, then (on lines of their own) the device lock and what
  // device-locked calls write.
  ShardSet shards_;

  SegmentSource segments_;
  PoolSet pools_;
  // The device's stats and headroom, and the device lock's times (it records them under the lock).
  StatsLedger ledger_;
  FreeBlocks free_;                // the rules that move blocks into and out of the pools' free lists
  FenceEngine fences_;             // events, capture uses, the fence passes and their pacing
  const CacheReport report_;       // the read-only reports
  ExpandableSegments expandable_;  // on or off, page size, the segment each (stream, size class) grows; growth
  // Last: the debugging aids, out of the way of the fields the hot path reads. Null when all are off.
  std::unique_ptr<DebugAids> aids_;
};

inline void* DeviceCache::allocate_cached(std::size_t requested, Stream stream) noexcept {
  // The stream's own hot list, under its shard lock alone.
  if (fast_path_.load(std::memory_order_relaxed) && !fences_.pending_poll_due()) {
    if (Shard* shard = shards_.find_published(stream))
      return shard->allocate_hot(requested, rounding_, options_, memory_.total(), ledger_.shared_headroom());
  }
  return nullptr;
}

inline bool DeviceCache::deallocate_cached(void* ptr, std::size_t size_hint, Stream stream_hint,
                                           Stream look_first) noexcept {
  // A free without a stream adds no use, so the block may go back to whichever shard holds it: a block
  // of that shard's stream without other uses goes back to its hot list, under the shard lock alone.
  const Stream shard_stream = stream_hint != 0 ? stream_hint : look_first;
  if (fast_path_.load(std::memory_order_relaxed)) {
    if (Shard* shard = shards_.find_published(shard_stream)) {
      return shard->free_to_hot(reinterpret_cast<std::uintptr_t>(ptr), size_hint, options_, &pools_.default_pool(),
                                ledger_.shared_headroom());
    }
  }
  return false;
}

inline void* DeviceCache::allocate(std::size_t requested, Stream stream) {
  if (void* ptr = allocate_cached(requested, stream)) return ptr;
  return allocate_locked(requested, stream);
}

inline bool DeviceCache::deallocate(void* ptr, std::size_t size_hint, Stream stream_hint, Stream look_first) {
  if (deallocate_cached(ptr, size_hint, stream_hint, look_first)) return true;
  return deallocate_locked(reinterpret_cast<std::uintptr_t>(ptr), size_hint, stream_hint);
}

}  // namespace streamalloc
