// DeviceCache: the block cache of one device, and the policy of the stream rules (docs/design.md,
// "Stream rules"). Segments from a SegmentSource are split into blocks; free blocks sit in the
// FreeLists of the segment's MemoryPool (the default pool, or a private pool that allocations are
// routed to), owned by a stream or settled; blocks freed after use on other streams wait as pending for
// batched fences, kept per stream in a StreamState. Debugging aids hang off one hook pointer
// (debug_aid.hpp).
//
// Locking (docs/design.md, "Locking"): each stream's StreamState is a shard with its own lock. The
// common path, an allocation served from the stream's hot list and a free of a block without other
// uses back to it, takes that shard lock alone (device_cache_shards.cpp). Everything else takes the
// device lock (mutex_) and then the lock of every shard it touches, held until it returns (DeviceLock,
// lock_shard). Order: device lock, then shard locks; a fast path holds one shard lock and never waits
// for the device lock while holding it. The stats the fast path changes are split between the device
// and the shards (shard_stats.hpp), so the fast path writes nothing outside its shard.
//
// The methods are defined one concept per file, device_cache_<concept>.cpp; docs/design.md ("Layers")
// says which file owns which concept, and the private methods below are grouped the same way.
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
#include "cycle_clock.hpp"
#include "debug_aid.hpp"
#include "fence_queue.hpp"
#include "free_lists.hpp"
#include "live_map.hpp"
#include "memory_pool.hpp"
#include "segment_source.hpp"
#include "shard_stats.hpp"
#include "shard_table.hpp"
#include "spin_lock.hpp"
#include "stream_state.hpp"
#include "trace_events.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/blocks.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc {

#ifndef NDEBUG
// Debug builds check the lock order: how many shard locks this thread holds on a fast path (the
// device lock must not be taken then), and which thread holds each cache's device lock (only it may
// take shard locks through lock_shard).
inline thread_local int t_fast_path_shard_locks = 0;
#endif

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
  // The common cases alone (the stream's shard, device_cache_shards.cpp): nullptr / false when the
  // call needs allocate / deallocate, with nothing changed. Never throw: nothing on them allocates.
  void* allocate_cached(std::size_t requested, Stream stream) noexcept;
  bool deallocate_cached(void* ptr, std::size_t size_hint, Stream stream, Stream look_first = 0) noexcept;
  // Counts a rejected free and throws the error that says which mistake it was.
  [[noreturn]] void reject_free(const void* ptr);
  // Adds `stream` to a live block's uses; false (nothing changed, nothing counted) when `ptr` is not
  // live here.
  bool record_stream(void* ptr, Stream stream);
  // Counts and audits a record_stream on a pointer that is live on no device.
  void record_stream_not_live(const void* ptr, Stream stream);
  bool owns_live(const void* ptr) const;
  // Whether a call on this device has used `stream` (lock-free: the free path's device lookup).
  bool knows_stream(Stream stream) const { return shards_.find(stream) != nullptr; }
  bool owns_address(const void* ptr) const;  // inside any segment of this device

  void empty_cache();  // the default pool and every freeable private pool
  void empty_cache(PoolId pool);
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

  // Memory pools (streamalloc/pools.hpp; device_cache_pools.cpp, device_cache_checkpoint.cpp).
  void create_or_incref_pool(PoolId pool);
  void release_pool(PoolId pool);
  void begin_allocate_to_pool(PoolId pool, PoolFilter filter);
  void end_allocate_to_pool(PoolId pool);
  int pool_use_count(PoolId pool) const;
  void set_pool_use_on_oom(PoolId pool, bool use_on_oom);
  void set_pool_no_split(PoolId pool);
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
    explicit DeviceLock(const DeviceCache& cache) : cache_(cache), lock_(cache.mutex_, std::try_to_lock) {
      // Timed only when taken: an uncontended call reads the clock twice (here and when it returns).
      if (!lock_.owns_lock()) {
        const std::uint64_t asked = cycle_clock::now();
        lock_.lock();
        cache_.lock_wait_ticks_ += cycle_clock::now() - asked;
      }
      taken_ = cycle_clock::now();
#ifndef NDEBUG
      assert(t_fast_path_shard_locks == 0 && "lock order: the device lock is taken before shard locks, never after");
      cache_.device_lock_owner_ = std::this_thread::get_id();
#endif
    }
    ~DeviceLock() {
      cache_.lock_held_ticks_ += cycle_clock::now() - taken_;
      cache_.unlock_shards();
#ifndef NDEBUG
      cache_.device_lock_owner_ = std::thread::id();
#endif
    }
    DeviceLock(const DeviceLock&) = delete;
    DeviceLock& operator=(const DeviceLock&) = delete;

   private:
    const DeviceCache& cache_;
    std::unique_lock<std::mutex> lock_;
    std::uint64_t taken_ = 0;
  };

  // ---- shards: the per-stream state and its lock (device_cache.cpp, device_cache_shards.cpp)
  // Device-locked code: the stream's shard, created on first sight, locked for the rest of the call.
  StreamState& stream_state(Stream stream) {
    StreamState* state = last_stream_;
    if (state == nullptr || state->stream() != stream) state = &find_or_add_stream(stream);
    lock_shard(*state);
    return *state;
  }
  StreamState& find_or_add_stream(Stream stream);
  void lock_shard(StreamState& state) const {
#ifndef NDEBUG
    assert(device_lock_owner_ == std::this_thread::get_id() && "lock order: shard locks after the device lock");
#endif
    if (state.locked_by_device) return;
    state.lock.lock();
    state.locked_by_device = true;
    locked_shards_.push_back(&state);
  }
  void lock_all_shards() const;  // for the calls that read blocks of every stream (reports, validate)
  void unlock_shards() const;
  // A fast path's hold of one shard lock (counted in debug builds, for the lock-order checks).
  class ShardGuard {
   public:
    explicit ShardGuard(StreamState& shard) : shard_(shard) {
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
    StreamState& shard_;
  };
  // Fast paths: nullptr / false when the call needs the device-locked path (which then decides).
  void* allocate_parked(StreamState& shard, std::size_t requested);
  bool free_to_shard(StreamState& shard, std::uintptr_t address, std::size_t size_hint);
  // The device-locked paths of allocate and deallocate (device_cache_allocate.cpp, device_cache_free.cpp),
  // apart from the inline fast paths so that these do not pay the big functions' frames.
  void* allocate_locked(std::size_t requested, Stream stream);
  bool deallocate_locked(std::uintptr_t address, std::size_t size_hint, Stream stream_hint);
  // Hand out a block parked in `shard`'s hot list (its lock held); shared by both paths.
  void hand_out_parked(StreamState& shard, Block* block, std::size_t requested);
  // A block enters or leaves its stream's shard (allocated, or parked in its hot list): device-locked
  // code only, with the shard locked, keeping in_shard and the index of shard blocks in step.
  void enter_shard(Block* block);
  void leave_shard(Block* block);
  // A live block of this device, its shard locked; nullptr when none. One lookup in the index of shard
  // blocks, one shard lock, whatever the number of streams.
  Block* find_live(std::uintptr_t address);
  std::size_t live_count() const;
  // Whether the fast path may run: no debugging aid, no trace sink (allocation history records under the
  // device lock), no open route, no use recorded during a capture. Recomputed under the device lock
  // whenever one of these changes.
  void update_fast_path() {
    fast_path_.store(aids_ == nullptr && trace_ == nullptr && routes_.empty() && capture_uses_.empty(),
                     std::memory_order_relaxed);
  }

  // ---- memory pools (device_cache_pools.cpp)
  // The pool an allocation on `stream` comes from: the newest open route whose filter accepts the
  // stream, else the default pool. Inline: without routes it is one test.
  MemoryPool& pool_for(Stream stream) { return routes_.empty() ? default_pool_ : routed_pool(stream); }
  MemoryPool& routed_pool(Stream stream);
  MemoryPool* find_pool(PoolId pool);
  const MemoryPool* find_pool(PoolId pool) const;
  MemoryPool& private_pool(PoolId pool, const char* operation);  // refuses unknown and default pools
  MemoryPool& add_pool_use(PoolId pool);  // a private pool, created with no use if new, gains one
  Block* find_free_in_use_on_oom_pools(PoolKind kind, std::size_t size, Stream stream);
  void erase_empty_freeable_pools();

  // ---- allocation path (device_cache_allocate.cpp)
  Block* find_free(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  // find_free's choice without counting it (cross_stream_reuse_settled counts only what is taken).
  Block* best_free(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  // best_free's choice for a large block where the default pool grows expandable segments
  // (device_cache_allocate.cpp says how it differs).
  Block* best_free_expandable_large(MemoryPool& pool, std::size_t size, Stream stream);
  // Counts the choice of a find: a settled block of another stream is a cross-stream reuse.
  Block* count_reuse(Block* block, Stream stream);
  // The first best fit of an allocation; in an expandable segment a fit that would carve a larger block
  // while blocks are pending looks again after a poll (device_cache_allocate.cpp says why).
  Block* find_free_packed(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  Block* find_free_after_gpu_wait(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  // A new segment, or more pages of an expandable one, holding a free block of at least `size` bytes.
  Block* reserve_segment(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  Block* reserve_fixed_segment(MemoryPool& pool, PoolKind kind, std::size_t size, Stream stream);
  Block* take(Block* block, std::size_t size, std::size_t requested, Stream stream);
  Block* hand_out(Block* block, std::size_t requested, Stream stream);  // mark allocated, account
  void* hand_out_hot(StreamState& own, Block* hot, std::size_t requested);  // taken from own's hot list
  Block* take_parked_by_poll(StreamState& own, const MemoryPool& pool, std::size_t size);
  [[noreturn]] void throw_larger_than_device(std::size_t requested, Stream stream);
  [[noreturn]] void throw_out_of_memory(std::size_t requested, std::size_t size, Stream stream);

  // ---- free path (device_cache_free.cpp)
  void free_live(Block* block);  // a live block, checked: to its owner stream, or pending
  void add_use(Block* block, Stream stream, NewUse how);
  // Capture rule: uses recorded on a stream while it captured a graph are dropped once that capture
  // has ended (the graph's own order covers them); pending blocks left without uses are released.
  void drop_ended_capture_uses();
  void free_to_owner(Block* block);
  void make_pending(Block* block);
  void park_hot(StreamState& owner, Block* block);  // free, in its owner's open batch: into the hot list
  // A released pending block is parked in its owner's hot list instead of merged, while park_released_
  // is set and the list has room (docs/design.md, "Fences: batching and pipelining").
  bool park_released(StreamState& owner, Block* block);

  // ---- free lists (device_cache_free_lists.cpp)
  void insert_free(Block* block);  // into the free lists and, when owned, the owner's settle list
  void remove_free(Block* block);
  Block* merge_free_neighbours(Block* block);  // `block` is out of the lists; returns the merged block
  void make_available(Block* block);           // into the free lists, unless an aid holds it back
  void enter_free_lists(Block* block);         // settle if its fence completed, merge, index
  void settle(Block* block);                   // an owned block whose fence completed
  // An exact-size hot block, out of the list (still hot); both paths, `state`'s lock held.
  static Block* take_hot(StreamState& state, std::size_t size) { return state.take_hot(size); }
  void flush_hot(StreamState& state, std::size_t keep);   // all but the `keep` newest into the free lists
  void flush_all_hot();
  void flush_thread_hot(std::uintptr_t thread);  // the hot lists of the streams that `thread` used last
  void hold_back(Block* block);  // an aid takes it; blocks the aid lets go of enter the free lists
  void release_held();           // every held block enters the free lists
  void enter_free_lists_after_hold(const std::vector<Block*>& released);
  // A free block inside a segment that is not entirely free counts as an inactive split (PyTorch's
  // definition); the flag makes counting idempotent. Inline: every cached alloc and free passes here.
  // `split`: the block's is_split() (a shard's block passes split_in_shard). `shard`: whose headroom
  // is spent first (fast_stat_increase).
  void count_inactive_split(Block* block, bool split, StreamState* shard = nullptr) {
    if (block->counted_inactive_split || !split) return;
    block->counted_inactive_split = true;
    fast_stat_increase(kInactiveSplit, block->segment->pool, 1, shard);
    fast_stat_increase(kInactiveSplitBytes, block->segment->pool, static_cast<std::int64_t>(block->size), shard);
  }
  void count_inactive_split(Block* block) { count_inactive_split(block, block->is_split()); }
  void uncount_inactive_split(Block* block) {
    if (!block->counted_inactive_split) return;
    block->counted_inactive_split = false;
    fast_stat_decrease(kInactiveSplit, block->segment->pool, 1);
    fast_stat_decrease(kInactiveSplitBytes, block->segment->pool, static_cast<std::int64_t>(block->size));
  }

  // ---- fences (device_cache_fences.cpp)
  bool close_batch(StreamState& state);  // record a fence for the open batch; false if it was empty
  void fence_after_free(const Block* block);
  void release_pending(Block* block, Clock::time_point now);
  void finish_fence(StreamState& state, Fence& fence);
  // `missed`: the stream whose allocation missed the cache, whose own batch may wait
  // (defers_own_batch); nullptr closes every batch (process_fences).
  // `flush`: whose hot lists join the free lists: every stream's, or only the missing stream's and
  // those of the streams whose last device-locked call came from the calling thread (StreamState::thread).
  enum class HotLists { kEveryStream, kThisThreads };
  void close_batches_and_poll(StreamState* missed = nullptr, HotLists flush = HotLists::kEveryStream);
  void poll_fences(bool close_batches, const StreamState* missed = nullptr);
  bool defers_own_batch(const StreamState& state, const StreamState* missed, Clock::time_point now) const;
  void synchronize_all_fences(bool for_memory = false);
  bool any_stream_capturing();
  // For the aids: the pending stats of `count` streams changed at `when`. Out of line and cold.
  [[gnu::noinline, gnu::cold]] void note_pending_changed(Clock::time_point when, const Stream* streams,
                                                         std::size_t count);

  // ---- lifecycle (device_cache_lifecycle.cpp)
  // Give back entirely free, settled segments of the default pool and of freeable private pools (of
  // `only` alone when given) until `target_bytes` are released. Nothing while a graph captures.
  std::size_t release_free_segments(std::size_t target_bytes, const MemoryPool* only = nullptr,
                                    bool ask_streams = true);
  std::size_t memory_cap() const;
  void note_device_total() {
    if (device_total_.load(std::memory_order_relaxed) == 0) {
      device_total_.store(backend_.memory_info(device_).total_bytes, std::memory_order_relaxed);
    }
  }

  // ---- expandable segments (device_cache_expandable.cpp; docs/design.md, "Expandable segments")
  // Decides once, at construction, whether the default pool grows expandable segments.
  void set_up_expandable_segments();
  // Whether an allocation from `pool` that no cached block serves grows an expandable segment.
  bool grows_expandable(const MemoryPool& pool) const {
    return expandable_page_bytes_ != 0 && &pool == &default_pool_;
  }
  // Grows the segment of (stream, kind) at its end by whole pages, mapped as one physical allocation
  // (near the cap: in pieces of up to 20 MiB, large, or one page, small), or starts one, so that a
  // free block of at least `size` bytes that `stream` may take is in the free lists; returns it, or
  // nullptr when the memory cap or the device refuses (nothing stays mapped for it then).
  Block* grow_expandable(PoolKind kind, std::size_t size, Stream stream);
  // Whether a growth of `growth` bytes takes the mapped bytes past half of memory_cap(): then it maps
  // in pieces that the OOM path can give back one by one, else as one physical allocation.
  bool near_cap(std::size_t growth) const;
  // Unmaps the whole pieces (physical allocations) inside the free blocks of an expandable segment;
  // releases the segment when none stays mapped. Returns the bytes given back.
  std::size_t trim_expandable(Segment* segment);
  std::size_t release_expandable(Segment* segment);  // its one block is free and settled
  void refresh_split(Block* block);                  // after a neighbour of it came or went
  void validate_expandable(const Segment* segment) const;

  // ---- stats (device_cache_stats.cpp; the fast path's part in device_cache_shards.cpp)
  template <typename F>
  void for_each_stat(F&& visit);
  // The aggregate and the block's pool move together (inline: every device-locked pair calls these).
  // Device-locked code only, and never for the stats the fast path changes (below).
  void stat_increase(StatArray DeviceStats::*field, PoolKind pool, std::int64_t amount) {
    (stats_.*field)[0].increase(amount);
    (stats_.*field)[pool_index(pool)].increase(amount);
  }
  void stat_decrease(StatArray DeviceStats::*field, PoolKind pool, std::int64_t amount) {
    (stats_.*field)[0].decrease(amount);
    (stats_.*field)[pool_index(pool)].decrease(amount);
  }
  // The stats the fast path changes too (shard_stats.hpp), changed by device-locked code: the device's
  // part of `current`, its headroom, and, when every shard's headroom falls short, the peak. Inline for
  // the common case, the device's headroom covering the increase in total and in the pool; drawing it
  // from the shards or a new peak is out of line, so that the common case saves no registers.
  // `shard` (locked), when given: its headroom is spent before the device's, and a decrease returns it
  // there. A free with uses returns its headroom to its allocation stream's shard (account_freed),
  // where that stream's next allocation, fast path or device-locked, looks for it.
  void fast_stat_increase(FastStat s, PoolKind pool, std::int64_t amount, StreamState* shard = nullptr) {
    const auto i = static_cast<std::size_t>(s);
    const auto q = static_cast<std::size_t>(pool_index(pool));
    const auto covers = [&](const std::array<std::int64_t, kPoolKinds>& r) { return r[0] >= amount && r[q] >= amount; };
    std::array<std::int64_t, kPoolKinds>& room =
        shard != nullptr && covers(shard->stats.headroom[i]) ? shard->stats.headroom[i] : headroom_[i];
    if (__builtin_expect(covers(room), 1)) {
      room[0] -= amount;
      room[q] -= amount;
    } else {
      draw_headroom_for_increase(s, static_cast<int>(q), amount);
    }
    StatArray& stat = stats_.*kFastStatFields[i];
    stat[0].current += amount;
    stat[0].allocated += amount;
    stat[q].current += amount;
    stat[q].allocated += amount;
  }
  void fast_stat_decrease(FastStat s, PoolKind pool, std::int64_t amount, StreamState* shard = nullptr) {
    const auto i = static_cast<std::size_t>(s);
    const auto q = static_cast<std::size_t>(pool_index(pool));
    std::array<std::int64_t, kPoolKinds>& room = shard != nullptr ? shard->stats.headroom[i] : headroom_[i];
    room[0] += amount;
    room[q] += amount;
    StatArray& stat = stats_.*kFastStatFields[i];
    stat[0].current -= amount;
    stat[0].freed += amount;
    stat[q].current -= amount;
    stat[q].freed += amount;
  }
  // fast_stat_increase's draw of `amount` of headroom in total and at pool index `q` when the device's
  // own falls short of either.
  [[gnu::noinline]] void draw_headroom_for_increase(FastStat s, int q, std::int64_t amount) {
    draw_headroom(s, 0, amount);
    draw_headroom(s, q, amount);
  }
  // Moves shards' headroom of `s` at pool index `p` to the device's until it holds `needed` or every
  // shard (each locked until the call returns) has given all; returns the device's headroom after it.
  std::int64_t gather_headroom(FastStat s, int p, std::int64_t needed);
  // Takes `amount` of the device's headroom of `s` at pool index `p`: gathered from the shards where it
  // falls short, and what they lack too raises the peak.
  void draw_headroom(FastStat s, int p, std::int64_t amount);
  // Device-locked: gives `shard` enough headroom to take `block` from its hot list for `requested`
  // bytes (hand_out_parked's accounting), from the device's headroom, every shard's, or by raising the
  // peak.
  void give_headroom_for_unpark(StreamState& shard, const Block* block, std::size_t requested);
  void account_allocated(StreamState& shard, const Block* block, std::size_t requested);  // handed out (and active)
  // No longer allocated / no longer active (its requested bytes leave the stats). The headroom they
  // return goes to `shard` (locked) when given, else to the device's.
  void account_freed(const Block* block, StreamState* shard);
  void account_inactive(Block* block, StreamState* shard);
  // (A block taken from or parked in a hot list changes only its shard's stats: device_cache_shards.cpp.)
  // The device's stats with every shard's part added: the device lock and every shard lock held.
  DeviceStats stats_with_shards() const;
  std::int64_t allocated_bytes_now() const;  // device-locked; locks every shard

  // ---- reports (device_cache_report.cpp)
  BlockInfo describe(const Block* block, Clock::time_point now) const;
  [[noreturn]] void throw_bad_free(const void* ptr, const char* what) const;

  const int device_;
  const Options& options_;
  Backend& backend_;
  // What every stream's fast path reads and nothing writes on it: on cache lines of their own, away
  // from the device lock and the fields device-locked calls write.
  // The fast path's switch (update_fast_path) and its lock-free view of the shards.
  alignas(kCacheLine) std::atomic<bool> fast_path_{false};
  // Cached from the backend on first need; read by the fast path (which leaves a request larger than
  // the device to the device-locked path, which then reports it).
  std::atomic<std::size_t> device_total_{0};
  ShardTable shards_;
  alignas(kCacheLine) mutable std::mutex mutex_;  // the device lock
  // cycle_clock ticks the device-locked calls waited for mutex_ and held it (DeviceLock), written
  // under it; stats() reports them in nanoseconds.
  mutable std::uint64_t lock_wait_ticks_ = 0;
  mutable std::uint64_t lock_held_ticks_ = 0;
  mutable std::vector<StreamState*> locked_shards_;  // by the device-locked call now running
#ifndef NDEBUG
  mutable std::thread::id device_lock_owner_;  // written under the device lock
#endif

  double memory_fraction_;

  SegmentSource segments_;
  MemoryPool default_pool_;    // free blocks of the default pool's segments, owned or settled
  std::map<PoolId, std::unique_ptr<MemoryPool>> private_pools_;
  struct Route {
    MemoryPool* pool;
    PoolFilter filter;
  };
  std::vector<Route> routes_;  // open routes, oldest first
  // Live or pending blocks with uses recorded on a stream while it captured (the capture rule).
  std::map<Block*, std::vector<Stream>> capture_uses_;
  std::map<Stream, std::unique_ptr<StreamState>> streams_;  // the shards; grows only, under the device lock
  // Every block in a shard (allocated or parked), by address: where device-locked code finds a block
  // without asking every shard. The fast path moves blocks only within their shard, so it never
  // changes this; in_shard and this index change together, under the device lock.
  LiveMap shard_blocks_;
  StreamState* last_stream_ = nullptr;  // one-entry cache in front of streams_ for device-locked calls
  EventPool events_;
  // The device's stats; for the stats the fast path changes, the device-locked part of current and the
  // totals, and the peak (shard_stats.hpp).
  DeviceStats stats_;
  // The device's headroom under each of those peaks, per stat and pool index (shard_stats.hpp).
  std::array<std::array<std::int64_t, kPoolKinds>, kFastStats> headroom_{};
  bool accumulated_reset_ = false;  // validate() then cannot check allocated - freed == current
  // Frees with uses poll and record fences at most once per window (docs/design.md, "Fences: batching
  // and pipelining").
  static constexpr std::chrono::microseconds kFenceBatchWindow{20};
  // A miss fences its own stream's batch of owned free blocks at most once per interval: those blocks
  // serve the stream without a fence (docs/design.md, "Fences: batching and pipelining").
  static constexpr std::chrono::milliseconds kOwnBatchInterval{1};
  Clock::time_point last_fence_pass_{};
  Clock::time_point last_pending_poll_{};  // coarse clock: the allocation path's poll of pending blocks
  // Set while a free's fence pass or an allocation's poll runs (park_released): where the blocks a
  // fence releases are likely to be asked for next by the stream that allocated them.
  bool park_released_ = false;
  struct ParkingReleased {
    explicit ParkingReleased(bool& flag) : flag_(flag) { flag_ = true; }
    ~ParkingReleased() { flag_ = false; }
    ParkingReleased(const ParkingReleased&) = delete;
    ParkingReleased& operator=(const ParkingReleased&) = delete;
    bool& flag_;
  };
  // Expandable segments: the page size they map in (0 while the default pool uses fixed segments),
  // and the segment each (stream, size class) grows; older ones, full, still give free pages back.
  std::size_t expandable_page_bytes_ = 0;
  std::map<std::pair<Stream, PoolKind>, Segment*> growing_;
  // The allocation history's sink, null while it is off: each event site tests it, like aids_.
  TraceSink* trace_ = nullptr;
  // Last: the debugging aids, out of the way of the fields the hot path reads. Null when all are off.
  std::unique_ptr<DebugAids> aids_;
};

inline void* DeviceCache::allocate_cached(std::size_t requested, Stream stream) noexcept {
  // The stream's own hot list, under its shard lock alone.
  if (fast_path_.load(std::memory_order_relaxed)) {
    if (StreamState* shard = shards_.find(stream)) return allocate_parked(*shard, requested);
  }
  return nullptr;
}

inline bool DeviceCache::deallocate_cached(void* ptr, std::size_t size_hint, Stream stream_hint,
                                           Stream look_first) noexcept {
  // A free without a stream adds no use, so the block may go back to whichever shard holds it: a block
  // of that shard's stream without other uses goes back to its hot list, under the shard lock alone.
  const Stream shard_stream = stream_hint != 0 ? stream_hint : look_first;
  if (fast_path_.load(std::memory_order_relaxed)) {
    if (StreamState* shard = shards_.find(shard_stream)) {
      return free_to_shard(*shard, reinterpret_cast<std::uintptr_t>(ptr), size_hint);
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
