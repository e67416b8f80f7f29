// Shard: what a device cache keeps per stream it has seen, its *shard*: the stream's fences, its
// hot list, its live blocks, and the settle list of the free blocks it owns. The shard has its own
// lock, so that the common path (an allocation served from the stream's hot list, a free of a block
// without other uses back to it) takes that lock alone and never the device lock (docs/design.md,
// "Locking").
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>

#include "block.hpp"
#include "cache_line_allocator.hpp"
#include "fence_queue.hpp"
#include "hot_list.hpp"
#include "live_map.hpp"
#include "shard_stats.hpp"
#include "size_policy.hpp"
#include "streamalloc/options.hpp"
#include "spin_lock.hpp"

namespace streamalloc {

// The calling thread, as a value no other live thread has: the address of a thread-local byte (the
// initial-exec model makes it one instruction, also in the shared library).
inline std::uintptr_t this_thread_token() {
  __attribute__((tls_model("initial-exec"))) static thread_local char marker;
  return reinterpret_cast<std::uintptr_t>(&marker);
}

// The free blocks a stream owns (unsettled), in settle_seq order: a completed fence settles a prefix.
// Intrusive, through Block::settle_prev/settle_next.
class SettleList {
 public:
  void insert(Block* block);
  void remove(Block* block);
  Block* head() const { return head_; }

 private:
  Block* head_ = nullptr;
  Block* tail_ = nullptr;
};

struct MemoryPool;

// What Shard::validate counts, for the cache's cross-checks against the block table.
struct ShardTally {
  std::map<const Block*, std::uint32_t> fence_refs;  // how many fences (open or in flight) list each block
  std::size_t hot = 0;                               // blocks in the hot lists
  std::size_t live = 0;                              // blocks in the live tables
};

// Which lock guards what (docs/design.md, "Locking"): `lock` guards `hot`, `live` and the blocks in
// them, and the fence queue's open-batch sequence numbers (the fast path joins the open batch);
// the device lock guards the rest. Whatever the fast path reads is written only under both locks, so
// either lock suffices to read it. Cache-line aligned: each stream's fast path writes only its own
// shard, and no other shard's fields may share a line with it.
struct alignas(kCacheLine) Shard {
  explicit Shard(Stream stream) : fences(stream) {}
  Stream stream() const { return fences.stream(); }

  // A spin lock: uncontended unless threads share the stream or a device-locked call holds it (then
  // waiters yield), and fewer locked instructions per fast path than a std::mutex.
  SpinLock lock;
  FenceQueue fences;
  // Blocks freed on this stream, kept unmerged so that the next allocations of sizes it freed before
  // take them back without splitting or merging (hot_list.hpp).
  HotList hot;
  // hot.size(), republished under the lock after every change (publish_hot) so that an allocation
  // can see without the lock that the hot list is empty, and go straight to the device-locked path. A
  // stale value only sends it the long way round or into the lock for nothing.
  std::atomic<std::uint32_t> hot_count{0};
  void publish_hot() { hot_count.store(static_cast<std::uint32_t>(hot.size()), std::memory_order_relaxed); }
  // The newest hot block of exactly `size` bytes, out of the list; nullptr when none. The block stays
  // in the shard (still hot): handing it out makes it live there.
  Block* take_hot(std::size_t size) {
    Block* block = hot.find(size);
    if (block == nullptr) return nullptr;
    remove_hot(block);
    return block;
  }
  void remove_hot(Block* block) {  // out of the hot list, still in the shard
    hot.remove(block);
    publish_hot();
  }
  // ---- the stream's own blocks
  // The fast path (shard.cpp), under `lock` alone: nullptr / false when the call needs the device-locked
  // path, with nothing changed. The caller's gate has ruled out debugging aids, routes and capture uses
  // (DeviceCache::update_fast_path); `rounding`: the cache's request rounding; `device_total`: the
  // device's memory, 0 while unknown.
  // `shared`: the headroom any shard may take (shard_stats.hpp).
  void* allocate_hot(std::size_t requested, const size_policy::Rounding& rounding, const Options& options,
                     const std::atomic<std::size_t>& device_total, SharedHeadroom& shared);
  // A free of a live block without other uses of `default_pool`, back to the hot list.
  bool free_to_hot(std::uintptr_t address, std::size_t size_hint, const Options& options,
                   const MemoryPool* default_pool, SharedHeadroom& shared);
  // Both paths, `lock` held: `block`, taken from the hot list (take_hot), becomes live here.
  void reuse_hot(Block* block, std::size_t requested);
  // Device-locked paths, `lock` held: a block enters or leaves the live table, or becomes hot.
  void add_live(Block* block) { live.insert(block->address, block); }
  void erase_live(const Block* block) { live.erase(block->address); }
  void push_hot(Block* block) {
    block->hot = true;
    hot.push(block);
    publish_hot();
  }
  std::size_t hot_bytes() const { return hot.bytes(); }
  bool hot_has_room(std::size_t size) const { return hot.has_room(size); }
  // The live block at `address`, nullptr when none.
  const Block* find_live(std::uintptr_t address) const { return live.find(address); }
  // This shard's part of the stats, for the ledger while a device-locked call serves this stream.
  ShardStats& stats_part() { return stats; }
  const StreamPending& pending_stats() const { return fences.pending_stats(); }
  // Without the lock: whether the hot list may hold a block (a stale answer only costs a look).
  bool has_hot() const { return hot_count.load(std::memory_order_relaxed) != 0; }
  // A block freed on this stream joins the open batch: the sequence number whose fence settles it.
  std::uint64_t join_open_batch() { return fences.join_as_owner(); }
  // Whether the fence that settles `block` (owned by this stream) has completed.
  bool fence_completed(const Block* block) const { return fences.completed_seq() >= block->settle_seq; }
  void count(std::int64_t StreamCounts::*field) { ++(counts.*field); }
  // This shard's own invariants (docs/design.md, "Invariants"), with `lock` and the device lock held:
  // its fences in sequence order, its settle list, hot list and live table holding blocks of this stream
  // in the state each says, its pending stats counting what its fences list (`totals`: as
  // invariant::check_stat), its headroom never negative. Adds what it counted to `tally`; throws
  // std::logic_error naming `device`.
  void validate(int device, bool totals, ShardTally& tally) const;
  // A device-locked allocation or free on this stream came from the calling thread (a miss flushes the
  // hot lists of its own thread's streams first).
  void note_thread() { thread = this_thread_token(); }

  LiveMap live;      // the blocks allocated on this stream and not freed yet, by address
  ShardStats stats;  // this shard's part of the fast path's stats, and its headroom
  // Which path this stream's calls took (DeviceStats::per_stream_counts): the fast path writes its
  // counts under `lock`, device-locked calls theirs with `lock` held too.
  StreamCounts counts;
  SettleList settle_list;  // device lock only
  // Device lock only: the device-locked operation now running holds `lock` (DeviceCache::lock_shard).
  bool locked_by_device = false;
  // Device lock only: the thread (this_thread_token) of the last device-locked allocation or free on
  // this stream. A miss flushes the hot lists of its own thread's streams before other threads' ones
  // (docs/design.md, "The allocation path").
  std::uintptr_t thread = 0;
};

#ifndef NDEBUG
// Debug builds check the lock order: how many shard locks this thread holds on a fast path (the
// device lock must not be taken then), and which thread holds each cache's device lock (only it may
// take shard locks through ShardSet::lock).
inline thread_local int t_fast_path_shard_locks = 0;
#endif

// A fast path's hold of one shard lock (counted in debug builds, for the lock-order checks).
class ShardGuard {
 public:
  explicit ShardGuard(Shard& shard) : shard_(shard) {
    shard_.lock.lock();
#ifndef NDEBUG
    ++t_fast_path_shard_locks;
#endif
  }
  ~ShardGuard() {
#ifndef NDEBUG
    --t_fast_path_shard_locks;
#endif
    shard_.lock.unlock();
  }
  ShardGuard(const ShardGuard&) = delete;
  ShardGuard& operator=(const ShardGuard&) = delete;

 private:
  Shard& shard_;
};

}  // namespace streamalloc
