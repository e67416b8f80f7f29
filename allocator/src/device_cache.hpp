// DeviceCache: the block cache of one device. Segments are split into blocks; free blocks sit in
// per-stream or settled indexes; freed blocks used on other streams wait as pending for batched
// fences. All public methods lock the cache's mutex. docs/design.md explains the rules.
#pragma once

#include <array>
#include <deque>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "block.hpp"
#include "fence_queue.hpp"
#include "free_index.hpp"
#include "live_map.hpp"
#include "pending_recorder.hpp"
#include "streamalloc/blocks.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/stats.hpp"

namespace streamalloc {

class Audit;
class SyncChecker;

class DeviceCache {
 public:
  // `sync` is the shared happens-before checker, or nullptr when check_sync is off.
  DeviceCache(int device, const Options& options, Backend& backend, Audit& audit, SyncChecker* sync);
  ~DeviceCache();
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  void* allocate(std::size_t requested, Stream stream);
  // Frees a live block of this device; false (nothing changed) when `ptr` is not live here.
  bool deallocate(void* ptr, std::size_t size_hint, Stream stream_hint);
  // Counts a rejected free and throws the error that says which mistake it was.
  [[noreturn]] void reject_free(const void* ptr);
  // Adds `stream` to a live block's uses; false (nothing changed, nothing counted) when `ptr` is not
  // live here.
  bool record_stream(void* ptr, Stream stream);
  // Counts and audits a record_stream on a pointer that is live on no device.
  void record_stream_not_live(const void* ptr, Stream stream);
  bool owns_live(const void* ptr) const;
  bool owns_address(const void* ptr) const;  // inside any segment of this device

  void empty_cache();
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
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
  PendingHistory pending_history() const;
  void validate() const;

 private:
  using Lock = std::unique_lock<std::mutex>;

  // ---- allocation path (device_cache_alloc.cpp) ----
  Block* find_free(PoolKind pool, std::size_t size, Stream stream);
  Block* find_free_after_gpu_wait(PoolKind pool, std::size_t size, Stream stream);
  Block* reserve_segment(PoolKind pool, std::size_t size, Stream stream);
  Block* take(Block* block, std::size_t size, std::size_t requested, Stream stream);
  Block* hand_out(Block* block, std::size_t requested, Stream stream);  // mark allocated, account
  std::size_t release_free_segments(std::size_t target_bytes);
  [[noreturn]] void throw_out_of_memory(std::size_t requested, std::size_t size, Stream stream);
  std::size_t memory_cap() const;

  // ---- free path and fences (device_cache.cpp) ----
  void free_to_owner(Block* block);
  void make_available(Block* block);    // into the free indexes, or first through the quarantine
  void enter_free_lists(Block* block);  // settle if its fence completed, merge, index
  void release_oldest_quarantined();
  Block* take_hot(FenceQueue& queue, std::size_t size);  // an exact-size hot block, out of the list
  void flush_hot(FenceQueue& queue, std::size_t keep);     // move all but `keep` newest into free lists
  void flush_all_hot();
  void flush_quarantine();
  bool close_batch(FenceQueue& queue);  // record a fence for the open batch; false if it was empty
  void check_consumer_waited(const Block* block, Stream consumer);
  void make_pending(Block* block);
  // pending_history: for each of `count` streams, one sample of its pending stats now.
  [[gnu::noinline, gnu::cold]] void record_pending_history(Clock::time_point when, const Stream* streams,
                                                           std::size_t count);
  void release_pending(Block* block);
  void settle(Block* block);
  void mark_settled(Block* block);
  void poison(const Block* block, Stream stream);
  void finish_fence(FenceQueue& queue, Fence& fence);
  void close_batches_and_poll();
  void synchronize_all_fences(bool for_memory = false);
  bool any_stream_capturing();
  FenceQueue& queue(Stream stream) {
    if (last_queue_ != nullptr && last_queue_->stream() == stream) return *last_queue_;
    return find_or_add_queue(stream);
  }
  FenceQueue& find_or_add_queue(Stream stream);

  // ---- free-index bookkeeping ----
  Stream settled_key(const Block* block) const;
  void insert_free(Block* block);
  void remove_free(Block* block);
  Block* merge_free_neighbours(Block* block);
  bool mergeable(const Block* a, const Block* b) const;
  // A free block inside a segment that is not entirely free counts as an inactive split (PyTorch's
  // definition); the flag makes counting idempotent. Inline: every cached alloc and free passes here.
  void count_inactive_split(Block* block) {
    if (block->counted_inactive_split || !block->is_split()) return;
    block->counted_inactive_split = true;
    stat_increase(&DeviceStats::inactive_split, block->segment->pool, 1);
    stat_increase(&DeviceStats::inactive_split_bytes, block->segment->pool, static_cast<std::int64_t>(block->size));
  }
  void uncount_inactive_split(Block* block) {
    if (!block->counted_inactive_split) return;
    block->counted_inactive_split = false;
    stat_decrease(&DeviceStats::inactive_split, block->segment->pool, 1);
    stat_decrease(&DeviceStats::inactive_split_bytes, block->segment->pool, static_cast<std::int64_t>(block->size));
  }

  // ---- stats ----
  template <typename F>
  void for_each_stat(F&& visit);
  // The aggregate and the block's pool move together (inline: a pair of calls costs ten of these).
  void stat_increase(StatArray DeviceStats::*field, PoolKind pool, std::int64_t amount) {
    (stats_.*field)[0].increase(amount);
    (stats_.*field)[pool_index(pool)].increase(amount);
  }
  void stat_decrease(StatArray DeviceStats::*field, PoolKind pool, std::int64_t amount) {
    (stats_.*field)[0].decrease(amount);
    (stats_.*field)[pool_index(pool)].decrease(amount);
  }

  // ---- reports (device_cache_report.cpp) ----
  BlockInfo describe(const Block* block, Clock::time_point now) const;
  [[noreturn]] void throw_bad_free(const void* ptr, const char* what) const;

  const int device_;
  const Options& options_;
  Backend& backend_;
  Audit& audit_;
  SyncChecker* sync_;
  mutable std::mutex mutex_;

  double memory_fraction_;
  std::size_t device_total_ = 0;  // cached from the backend on first need
  std::size_t reserved_ = 0;

  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments_;  // by address
  LiveMap live_;                                                   // allocated blocks by address
  // Free blocks: [pool] unsettled blocks by owner stream; settled blocks by settled_key().
  std::array<FreeIndex, kPoolKinds> unsettled_;
  std::array<FreeIndex, kPoolKinds> settled_;
  std::map<Stream, std::unique_ptr<FenceQueue>> queues_;
  FenceQueue* last_queue_ = nullptr;  // one-entry cache in front of queues_ for the hot path
  EventPool events_;
  DeviceStats stats_;
  bool accumulated_reset_ = false;
  std::deque<Block*> quarantine_;  // FIFO of freed blocks held back from reuse (quarantine_mb)
  std::size_t quarantine_bytes_ = 0;
  // Frees with uses poll and record fences at most once per window (docs/design.md, "Fences").
  static constexpr std::chrono::microseconds kFenceBatchWindow{20};
  Clock::time_point last_fence_pass_{};  // validate() then cannot check allocated - freed == current
  // Last: a debugging aid, kept out of the way of the fields the hot path reads.
  PendingRecorder pending_history_;  // pending_history:N (off by default)
};

}  // namespace streamalloc
