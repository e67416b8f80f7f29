// FreeBlocks: how free blocks enter and leave the free lists of their segment's pool (free_lists.hpp),
// and the best fit an allocation takes from them. An owned block is also in its owner's settle list
// (shard.hpp) and settles when its owner's fence completes; a block joins the lists merged with its
// free neighbours (FreeLists::mergeable), and settled once its owner's fence has completed. Two places
// keep free blocks out of the lists on purpose: a stream's hot list (just freed, unmerged, for a
// reuse of their sizes) and a debugging aid that holds blocks back (quarantine); both hand their blocks
// back here. A free block that is split counts as an inactive split (StatsLedger) while it is in the
// lists, hot or held.
//
// The free lists are the pools' and the settle lists the shards'; FreeBlocks keeps the rules that move
// blocks between them. Every method runs under the device lock; a shard whose blocks change is locked
// through ShardSet::get on the way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "block.hpp"
#include "debug_aid.hpp"
#include "memory_pool.hpp"
#include "shard_set.hpp"
#include "stats_ledger.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc {

class FreeBlocks {
 public:
  FreeBlocks(ShardSet& shards, StatsLedger& ledger, const Options& options)
      : shards_(shards), ledger_(ledger), options_(options) {}
  FreeBlocks(const FreeBlocks&) = delete;
  FreeBlocks& operator=(const FreeBlocks&) = delete;

  // ---- the lists
  void insert(Block* block);  // into its pool's free lists and, when owned, its owner's settle list
  void remove(Block* block);
  // `block` is out of the lists; its mergeable free neighbours leave them and merge into it. Returns
  // the merged block (still out of the lists).
  Block* merge_neighbours(Block* block);
  // Settled if its owner's fence has completed, merged, into the lists; returns the merged block.
  Block* enter(Block* block);
  // `shard`'s owned free blocks whose fence has completed settle (and merge with settled neighbours).
  void settle_completed(Shard& shard);
  // Into the lists, unless an aid (`aids`, may be null) holds it back; the blocks the aid lets go of
  // enter the lists.
  void make_available(Block* block, DebugAids* aids);
  void release_held(DebugAids* aids);  // every held block enters the lists

  // ---- hot blocks: `block`, free in its owner's open batch, goes to `owner`'s hot list (locked);
  // flushes move hot blocks into the lists (`only`: the blocks of that size class alone)
  void make_hot(Shard& owner, Block* block);
  void flush_hot(Shard& shard, std::optional<SizeClass> only = std::nullopt);
  // `shard`'s hot blocks of `size_class` join the lists oldest first, until one merges into a free
  // block of at least `size` bytes; false when none was left to join. The newer ones stay hot.
  bool flush_hot_until(Shard& shard, SizeClass size_class, std::size_t size);
  // A list past its bounds (a device-locked free made it so) keeps its newest blocks, within three
  // quarters of them, so that the next frees do not flush again at once.
  void trim_hot(Shard& shard);
  void flush_all_hot(std::optional<SizeClass> only = std::nullopt);
  // Of the streams whose last device-locked call was `thread`'s, but `except`.
  void flush_thread_hot(std::uintptr_t thread, std::optional<SizeClass> only = std::nullopt,
                        const Shard* except = nullptr);

  // ---- the best fit
  // The smaller of the best owned and the best settled fit of `size` bytes in `pool` that `stream`
  // may take (ties go to the own stream); `expandable`: the pool grows expandable segments (a large
  // fit then follows free_blocks.cpp's packing order). Counts nothing.
  Block* best_fit(MemoryPool& pool, SizeClass size_class, std::size_t size, Stream stream, bool expandable) const;
  // Counts the choice of a best fit: a settled block of another stream is a cross-stream reuse.
  Block* count_reuse(Block* block, Stream stream);
  // best_fit, counted.
  Block* find(MemoryPool& pool, SizeClass size_class, std::size_t size, Stream stream, bool expandable) {
    return count_reuse(best_fit(pool, size_class, size, stream, expandable), stream);
  }
  // `block`, a best fit of `size` bytes, leaves the lists; the rest splits off into them where the
  // split rule says so (size_policy::should_split; in an expandable segment every rest of at least the
  // smallest block size, as in PyTorch's; never in a no_split pool).
  Block* take(Block* block, std::size_t size);

 private:
  Block* best_fit_expandable_large(MemoryPool& pool, std::size_t size, Stream stream) const;
  Block* leave_hot(Shard& shard, Block* block);  // out of the hot list, into the lists; the merged block
  void count_flush(Shard& shard);
  void enter_after_hold(const std::vector<Block*>& released);

  ShardSet& shards_;
  StatsLedger& ledger_;
  const Options& options_;
};

}  // namespace streamalloc
