// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), written from its
// documented and observable behaviour, for replaying a recorded trace without a GPU. It keeps only
// the bookkeeping: block sizes, addresses, pools, streams; no memory is touched.
//
// What is modelled (docs/planning.md, "The model of PyTorch's allocator"):
//  - rounding: at least 512 B, multiples of 512 B; with roundup_power2_divisions:N, sizes above
//    N * 512 B round up to the next of N divisions between powers of two;
//  - size classes: <= 1 MiB small (2 MiB segments), else large (20 MiB segments below 10 MiB,
//    else rounded up to 2 MiB);
//  - best fit per size class by (stream, size, address): a block is reused only by its allocation
//    stream; max_split_size_mb: blocks at or above it are never split, serve no smaller request, and
//    serve a request at or above it only when less than max_non_split_rounding_mb (20) larger;
//  - splitting: small class when at least 512 B remain, large class when more than 1 MiB remains
//    (and the request is below max_split_size); expandable segments split whenever 512 B remain;
//  - merging of free neighbours at free;
//  - record_stream: a block freed after a use on another stream waits for its events; they complete
//    at the event list's `c` line, or at the next allocation when the list has none;
//  - the out-of-memory path under a cap: release oversize free segments (with max_split_size), then
//    wait for every pending event and release every entirely free segment, then retry once;
//  - addresses: a segment goes where the recorded run's device put the same-sized segment (the
//    event list's `d` lines, taken in order while that range is free here), else above them all;
//    best fit breaks ties between equal sizes by address, so the addresses steer which block is reused;
//  - expandable_segments: one growing address range per (stream, size class), mapped in 2 MiB
//    (small) or 20 MiB (large) pages; the out-of-memory path unmaps the free pages.
// Not modelled: CUDA graph private pools, garbage_collection_threshold, free-memory callbacks,
// empty_cache() calls (they are not in the trace), pinned/host memory and multiple devices.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "streamalloc_planner/events.hpp"

namespace streamalloc::planner {

struct TorchConfig {
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();
  std::size_t max_split_size = kUnlimited;  // bytes
  // A block at or above max_split_size serves a request at or above it when at most this much larger.
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  // Divisions per power-of-two interval from 1 MiB upwards (index 0: sizes below 2 MiB), 0 = off.
  std::array<std::size_t, 16> roundup_power2_divisions{};
  bool expandable_segments = false;

  // PYTORCH_CUDA_ALLOC_CONF syntax: "expandable_segments:True,max_split_size_mb:128,
  // roundup_power2_divisions:4" or "roundup_power2_divisions:[256:1,512:2,>:4]". Throws
  // std::invalid_argument naming the key for an unknown key or a bad value.
  static TorchConfig parse(std::string_view conf);
};

// PyTorch's request rounding under `config`.
std::size_t torch_round_size(std::size_t size, const TorchConfig& config);
// The segment size a request of `rounded` bytes gets without expandable segments.
std::size_t torch_segment_size(std::size_t rounded);

struct SegmentEvent {
  std::size_t event = 0;  // index of the event (in the event list) during which it happened
  char action = 'a';      // 'a' segment_alloc, 'f' segment_free, 'm' segment_map, 'u' segment_unmap
  std::size_t size = 0;
  std::uint32_t stream = 0;
};

class TorchModel {
 public:
  // cap: reserved bytes may not exceed it (0 = no cap).
  TorchModel(TorchConfig config, std::size_t cap = 0, bool keep_segment_events = false);
  ~TorchModel();
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  void set_event_index(std::size_t index) { event_index_ = index; }
  // The recorded device's segment addresses (EventList::placements), for the segments to come.
  void follow_placements(std::vector<Placement> placements);
  // Allocate `size` requested bytes on `stream` for `slot`. False: out of memory under the cap
  // (cached memory was released on the way, as PyTorch does; the slot stays empty).
  bool malloc(std::uint32_t slot, std::size_t size, std::uint32_t stream, bool complete_pending = true);
  void record_stream(std::uint32_t slot, std::uint32_t stream);
  void free(std::uint32_t slot);
  // The events of the pending block of `slot` completed: it becomes free. No-op when not pending.
  void complete(std::uint32_t slot);

  std::size_t reserved() const { return reserved_; }
  std::size_t peak_reserved() const { return peak_reserved_; }
  std::size_t allocated() const { return allocated_; }
  std::size_t peak_allocated() const { return peak_allocated_; }
  std::size_t device_allocs() const { return device_allocs_; }
  std::size_t device_frees() const { return device_frees_; }
  std::size_t pending_blocks() const { return pending_.size(); }
  // Allocations that went through the out-of-memory path (released cached memory and retried).
  std::size_t alloc_retries() const { return alloc_retries_; }
  // Address offset and size of the block of a live slot (tests); size 0 when the slot is empty.
  std::pair<std::uint64_t, std::size_t> block_of(std::uint32_t slot) const;
  // Number of cached free blocks (mapped) in the small / large size class.
  std::size_t free_blocks(bool small) const;
  const std::vector<SegmentEvent>& segment_events() const { return segment_events_; }

  struct Block;
  struct Pool;

 private:
  struct Params;
  bool get_free_block(Params& p);
  bool alloc_block(Params& p);
  Block* try_allocate_expandable(Params& p);
  Block* find_expandable_block(Params& p);
  bool map_block(Block* block, std::size_t size);
  void unmap_block(Block* block);
  bool release_available_cached_blocks(Params& p);
  void release_cached_blocks();
  void release_blocks(Pool& pool);
  void release_block(Block* block);
  void free_block(Block* block);
  std::size_t try_merge(Block* dst, Block* src);
  void complete_all_pending();
  void note(char action, std::size_t size, std::uint32_t stream);
  void grow_reserved(std::size_t bytes);
  std::uint64_t place_segment(std::size_t size);
  Block* make_block(const Block& from);
  void drop(Block* block);

  TorchConfig config_;
  std::size_t cap_;
  bool keep_events_;
  Pool* small_;
  Pool* large_;
  std::vector<Block*> slots_;
  std::vector<Block*> pending_;
  std::vector<std::uint32_t> pending_slot_;  // the slot each pending block was freed from
  std::uint64_t next_address_ = 1ull << 52;  // above any address a device hands out
  std::vector<Placement> placements_;
  std::vector<bool> placement_taken_;
  std::size_t first_open_placement_ = 0;
  std::map<std::uint64_t, std::size_t> segments_;  // base -> size of each segment not expandable
  std::size_t event_index_ = 0;
  std::size_t reserved_ = 0, peak_reserved_ = 0, allocated_ = 0, peak_allocated_ = 0;
  std::size_t device_allocs_ = 0, device_frees_ = 0, alloc_retries_ = 0;
  std::vector<SegmentEvent> segment_events_;
  std::unordered_set<Block*> all_;  // every block, for the destructor
};

}  // namespace streamalloc::planner
