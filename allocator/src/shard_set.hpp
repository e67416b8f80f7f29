// ShardSet: the shards of one device cache and their locks (docs/design.md, "Locking"): every stream's
// Shard, created on first sight and kept for the cache's life; the lock-free table the fast path finds
// its shard in; the index of every block in a shard (allocated or hot), where device-locked code finds
// a block without asking every shard; the device lock; and the shard locks the device-locked call now
// running has taken, released together when it returns.
//
// Order: device lock, then shard locks; a fast path holds one shard lock (ShardGuard) and never waits
// for the device lock while holding it. Debug builds check the order.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "block.hpp"
#include "cache_line_allocator.hpp"
#include "live_map.hpp"
#include "shard.hpp"
#include "shard_stats.hpp"
#include "shard_table.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class ShardSet final : public HeadroomDonors {
 public:
  using Map = std::map<Stream, std::unique_ptr<Shard>>;

  // `backend` says which device a stream belongs to; a stream of another device is refused.
  ShardSet(Backend& backend, int device) : backend_(backend), device_(device) {}
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  // Lock-free (the fast path): the stream's shard, nullptr when the table does not hold it.
  Shard* find_published(Stream stream) const { return table_.find(stream); }

  // ---- the device lock, held by one call at a time (DeviceCache::DeviceLock)
  std::mutex& device_mutex() const { return mutex_; }
  void note_device_lock_taken() const {
#ifndef NDEBUG
    assert(t_fast_path_shard_locks == 0 && "lock order: the device lock is taken before shard locks, never after");
    device_lock_owner_ = std::this_thread::get_id();
#endif
  }
  // Releases every shard lock the call took; then the device lock goes.
  void note_device_lock_released() const {
    unlock_all();
#ifndef NDEBUG
    device_lock_owner_ = std::thread::id();
#endif
  }

  // ---- under the device lock
  // The stream's shard, created on first sight, locked for the rest of the call.
  Shard& get(Stream stream) {
    Shard* shard = last_;
    if (shard == nullptr || shard->stream() != stream) shard = &find_or_add(stream);
    lock(*shard);
    return *shard;
  }
  void lock(Shard& shard) const {
#ifndef NDEBUG
    assert(device_lock_owner_ == std::this_thread::get_id() && "lock order: shard locks after the device lock");
#endif
    if (shard.locked_by_device) return;
    shard.lock.lock();
    shard.locked_by_device = true;
    locked_.push_back(&shard);
  }
  void lock_all() const;  // for the calls that read blocks of every stream (reports, validate)
  // Every shard, by stream (not locked by the walk).
  Map::const_iterator begin() const { return shards_.begin(); }
  Map::const_iterator end() const { return shards_.end(); }
  // The stream's shard, nullptr when the cache has not seen it (not locked).
  Shard* find(Stream stream) const;

  // A block enters or leaves its stream's shard (allocated, or kept in its hot list), with the shard
  // locked, keeping in_shard and the index of shard blocks in step.
  void enter(Block* block) {
    block->in_shard = true;
    block->split_in_shard = block->is_split();
    blocks_.insert(block->address, block);
  }
  void leave(Block* block) {
    block->in_shard = false;
    blocks_.erase(block->address);
  }
  // A live block, its shard locked; nullptr when none. One lookup in the index of shard blocks, one
  // shard lock, whatever the number of streams.
  Block* find_live(std::uintptr_t address);
  // The index of shard blocks, for validate(): the block at `address`, and how many there are.
  const Block* indexed(std::uintptr_t address) const { return blocks_.find(address); }
  std::size_t indexed_count() const { return blocks_.size(); }
  std::size_t live_count() const;  // locks every shard
  // Whether any stream the cache knows captures a graph, as the backend says (rule 6: no host wait and
  // no release of device memory meanwhile). A capture on a stream the cache has never seen goes unnoticed.
  bool any_capturing() const;
  // Moves every shard's headroom (each locked until the call returns) to the device, up to what it
  // lacks of `s` at class index `p`, and the rest to `shared` (HeadroomDonors says which, with `keep`).
  void gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device, SharedHeadroom& shared,
                       const ShardStats* keep) override;

 private:
  Shard& find_or_add(Stream stream);
  void unlock_all() const;

  Backend& backend_;
  const int device_;
  ShardTable table_;                              // what the fast path reads; written under the device lock
  alignas(kCacheLine) mutable std::mutex mutex_;  // the device lock
  mutable std::vector<Shard*> locked_;            // by the device-locked call now running
#ifndef NDEBUG
  mutable std::thread::id device_lock_owner_;  // written under the device lock
#endif
  Map shards_;  // grows only, under the device lock
  // Every block in a shard (allocated or hot), by address. The fast path moves blocks only within
  // their shard, so it never changes this; in_shard and this index change together.
  LiveMap blocks_;
  Shard* last_ = nullptr;  // one-entry cache in front of shards_ for device-locked calls
};

}  // namespace streamalloc
