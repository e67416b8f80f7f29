// CacheReport: what a device cache says about itself, read from its components and changing nothing:
// the segments and their blocks, the pools, the cached free bytes, a pool's checkpoint and live blocks,
// the diagnosis of a bad free and the out-of-memory message. Every method runs under the device lock;
// those that read blocks of every stream lock every shard first (ShardSet::lock_all).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "block.hpp"
#include "memory_pool.hpp"
#include "pool_set.hpp"
#include "segment_source.hpp"
#include "shard_set.hpp"
#include "stats_ledger.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/blocks.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"

namespace streamalloc {

class CacheReport {
 public:
  CacheReport(int device, const Options& options, const Backend& backend, const SegmentSource& segments,
              const PoolSet& pools, const ShardSet& shards, const StatsLedger& ledger)
      : device_(device),
        options_(options),
        backend_(backend),
        segments_(segments),
        pools_(pools),
        shards_(shards),
        ledger_(ledger) {}

  // Every segment with its blocks, ages measured at `now`; an expandable segment is reported as
  // PyTorch's is, one segment per run of mapped pages, so that the blocks of every reported segment tile it.
  std::vector<SegmentInfo> segments(Clock::time_point now) const;
  std::vector<PoolInfo> pools() const;  // the default pool first, then the private pools by id
  // The largest free block and the free bytes of the default pool (what an allocation outside routes
  // can take).
  void cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const;
  PoolCheckpoint checkpoint(PoolId id, const MemoryPool& pool) const;
  // Whether the live blocks of `pool` are exactly `expected`.
  bool live_blocks_are(const MemoryPool& pool, const std::vector<const void*>& expected) const;
  // For a pointer that is not a live block: the error that says which mistake it is.
  [[noreturn]] void throw_bad_free(const void* ptr, const char* what) const;
  // The out-of-memory message for `requested` bytes on `stream` (`size` rounded; 0 past any device):
  // PyTorch's sentences first, in its units, then what the cache holds, the largest pending holders and
  // what to do. `device_total`: the device's memory; `fraction` and `cap`: the memory-fraction cap.
  std::string out_of_memory(std::size_t requested, std::size_t size, Stream stream, const DeviceMemoryInfo& info,
                            double fraction, std::size_t cap, std::size_t device_total) const;

 private:
  static BlockInfo describe(const Block* block, Clock::time_point now);

  const int device_;
  const Options& options_;
  const Backend& backend_;
  const SegmentSource& segments_;
  const PoolSet& pools_;
  const ShardSet& shards_;
  const StatsLedger& ledger_;
};

}  // namespace streamalloc
