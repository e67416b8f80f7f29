// Statistics: plain structs, PyTorch's field names, each field documented as a COUNT or a SUM of bytes.
// The field lists below are the single source for the structs, the JSON output and
// torch.cuda.memory_stats() in the plugin. validate() recomputes every `current` from the block table.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "streamalloc/pools.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

// One quantity over time.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total increases
  std::int64_t freed = 0;      // total decreases

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_accumulated() { allocated = freed = 0; }
  void reset_peak() { peak = current; }
};

using StatArray = std::array<Stat, kSizeClasses>;

// name, COUNT|SUM, meaning (PyTorch's names; served as torch.cuda.memory_stats() keys)
#define STREAMALLOC_POOL_STATS(X)                                                    \
  X(allocation, COUNT, "live blocks handed to callers")                              \
  X(segment, COUNT, "segments reserved from the device")                             \
  X(active, COUNT, "blocks allocated or pending free (still in use on some stream)") \
  X(inactive_split, COUNT, "free blocks inside segments that are not entirely free") \
  X(allocated_bytes, SUM, "bytes of live blocks")                                    \
  X(reserved_bytes, SUM, "bytes of segments reserved from the device")               \
  X(active_bytes, SUM, "bytes of active blocks")                                     \
  X(inactive_split_bytes, SUM, "bytes of free blocks inside partly used segments")   \
  X(requested_bytes, SUM, "bytes callers asked for (before rounding) of live blocks")

// name, meaning (plain event counts, PyTorch's names)
#define STREAMALLOC_EVENT_COUNTS(X)                                                  \
  X(num_alloc_retries, "allocations that had to flush caches and retry")             \
  X(num_ooms, "allocations that failed with out-of-memory")                          \
  X(num_sync_all_streams, "host synchronizations of every pending fence (OOM path)") \
  X(num_device_alloc, "device reservations (cudaMalloc)")                            \
  X(num_device_free, "device releases (cudaFree)")

// name, meaning (stream stats no other allocator keeps)
#define STREAMALLOC_STREAM_COUNTS(X)                                                                             \
  X(record_stream_calls, "record_stream calls")                                                                  \
  X(record_stream_on_alloc_stream, "record_stream on the block's allocation stream (no-op)")                     \
  X(record_stream_duplicate, "record_stream repeating a stream already recorded")                                \
  X(record_stream_unknown_ptr, "record_stream on a pointer that is not live")                                    \
  X(fences_recorded, "fence events recorded (each covers a batch of frees on one stream)")                       \
  X(fences_polled, "fence queries (events, and streams asked whether they are idle)")                            \
  X(fences_waited_gpu, "GPU-side waits on a fence (cross_stream_reuse:wait)")                                    \
  X(fences_synced_host, "host synchronizations on a fence")                                                      \
  X(fences_skipped_idle, "batches of pending frees released without an event (stream idle)")                     \
  X(cross_stream_reuse_settled, "allocations served by a settled block of another stream")                       \
  X(cross_stream_reuse_waited, "allocations served after a GPU-side wait on a fence")                            \
  X(frees_deferred_capture, "frees whose fences waited for a graph capture to end")                              \
  X(invalid_frees, "free calls rejected (double free, foreign pointer, wrong size/device)")                      \
  X(allocations_cached, "allocations served by the stream's shard alone (the fast path)")                        \
  X(allocations_device_locked, "allocations that took the device lock (not served by the stream's shard alone)") \
  X(frees_cached, "frees served by the block's shard alone (the fast path)")                                     \
  X(frees_device_locked, "frees that took the device lock (not served by the block's shard alone)")              \
  X(device_lock_acquisitions, "calls that took the device lock (allocations, frees, fences, stats, ...)")        \
  X(device_lock_wait_ns, "nanoseconds calls waited to take the device lock, summed over threads")                \
  X(device_lock_held_ns, "nanoseconds calls held the device lock")                                               \
  X(headroom_gathers, "device-locked calls that took stats headroom back from the shards")                       \
  X(hot_list_flushes, "shard lists whose blocks (all or the oldest) were moved into the free lists")             \
  X(missing_wait_warnings, "check_sync: uses declared on a stream not ordered after the producer")

// Free-to-reusable latency histogram of pending blocks: bucket i counts blocks whose time from the free
// to the completion of their last fence (reusable again on their allocation stream) was below
// kLatencyBucketUs[i] microseconds (last bucket: the rest).
inline constexpr std::array<std::int64_t, 8> kLatencyBucketUs = {10,     100,     1000,     10000,
                                                                 100000, 1000000, 10000000, INT64_MAX};

struct StreamPending {  // per stream
  Stat pending_blocks;  // COUNT of pending blocks waiting on a fence of this stream
  Stat pending_bytes;   // SUM of their bytes
};

// name, meaning (per stream: which path its calls took; every field a COUNT)
#define STREAMALLOC_SHARD_COUNTS(X)                                                                     \
  X(allocations_cached, "allocations on this stream served by its shard alone (fast-path hits)")        \
  X(allocations_device_locked, "allocations on this stream that took the device lock (misses)")         \
  X(frees_cached, "frees of this stream's blocks served by its shard alone")                            \
  X(frees_device_locked, "frees of this stream's blocks that took the device lock")                     \
  X(hot_list_flushes, "times this stream's shard list was moved (all or its oldest) to the free lists") \
  X(headroom_given, "times a device-locked call took stats headroom from this stream's shard")

struct StreamCounts {  // per stream
#define STREAMALLOC_DECLARE_SHARD_COUNT(name, help) std::int64_t name = 0;
  STREAMALLOC_SHARD_COUNTS(STREAMALLOC_DECLARE_SHARD_COUNT)
#undef STREAMALLOC_DECLARE_SHARD_COUNT
};

struct DeviceStats {
#define STREAMALLOC_DECLARE_POOL_STAT(name, kind, help) StatArray name;
  STREAMALLOC_POOL_STATS(STREAMALLOC_DECLARE_POOL_STAT)
#undef STREAMALLOC_DECLARE_POOL_STAT
#define STREAMALLOC_DECLARE_COUNT(name, help) std::int64_t name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_DECLARE_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_DECLARE_COUNT)
#undef STREAMALLOC_DECLARE_COUNT
  Stat pending_blocks;              // COUNT of blocks freed but waiting on fences
  Stat pending_bytes;               // SUM of their bytes
  Stat oversize_allocations;        // COUNT of live blocks of at least max_split_size
  Stat oversize_segments;           // COUNT of segments of at least max_split_size
  std::int64_t max_split_size = 0;  // bytes; -1 when unlimited (PyTorch's convention)
  std::array<std::int64_t, kLatencyBucketUs.size()> free_to_reusable_us{};
  std::map<Stream, StreamPending> per_stream;
  std::map<Stream, StreamCounts> per_stream_counts;  // every stream the device has seen

  // Serialized as JSON with PyTorch's flat key names ("allocated_bytes.all.current", ...) under
  // "memory_stats", plus the stream stats and one entry per memory pool (`pools`, the default pool
  // first); see docs/design.md, "Stats". The default: zeros for the default pool alone.
  std::string to_json(const std::vector<PoolInfo>& pools = {PoolInfo{}}) const;
  // PyTorch's flat keys and values only (what torch.cuda.memory_stats() returns), for the plugin.
  std::map<std::string, std::int64_t> flat() const;
};

// One change of one stream's pending bytes (StreamPending above): a free that made blocks wait for the
// stream's next fence, or a fence of the stream that completed and let its blocks go.
struct PendingSample {
  std::int64_t time_us = 0;         // steady clock, microseconds: one clock for every device of the process
  Stream stream = 0;                // the stream whose fences the bytes wait for
  std::int64_t pending_bytes = 0;   // after the change
  std::int64_t pending_blocks = 0;  // after the change
};

// The last `capacity` samples of one device (option pending_history:N), for a timeline of pending bytes
// per stream (python -m streamalloc.report --timeline). Empty when the option is 0, the default.
struct PendingHistory {
  std::size_t capacity = 0;
  std::uint64_t recorded = 0;          // ever recorded; recorded - samples.size() were overwritten
  std::vector<PendingSample> samples;  // oldest first

  // {"device", "capacity", "recorded", "time_us": [...], "stream": [...], "pending_bytes": [...],
  // "pending_blocks": [...]}: one list per field, so that long histories stay compact.
  std::string to_json(int device) const;
};

}  // namespace streamalloc
