// The parts of a device cache that its components are built from, without a DeviceCache around them,
// for the components' unit tests (tests/unit): a simulated device, the shards and their device lock,
// the stats ledger, the free-list rules, a pool, and segments tiled by hand-made free blocks.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "block.hpp"
#include "debug_aid.hpp"
#include "fence_engine.hpp"
#include "free_blocks.hpp"
#include "memory_pool.hpp"
#include "shard_set.hpp"
#include "stats_ledger.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc::test {

// The device lock of one call, as DeviceCache::DeviceLock takes and releases it: shard locks taken
// through ShardSet::get during the call are released at its end.
class DeviceCall {
 public:
  explicit DeviceCall(ShardSet& set) : set_(set), lock_(set.device_mutex()) { set_.note_device_lock_taken(); }
  ~DeviceCall() { set_.note_device_lock_released(); }
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

 private:
  ShardSet& set_;
  std::unique_lock<std::mutex> lock_;
};

// One device's shards, ledger and default pool on a simulated device, and segments of free blocks.
struct CacheParts {
  explicit CacheParts(Options opts = Options{}) : CacheParts(SimBackend::Config{}, std::move(opts)) {}
  CacheParts(SimBackend::Config config, Options opts)
      : sim(config),
        options(std::move(opts)),
        shards(sim, 0),
        ledger(shards),
        free(shards, ledger, options),
        pool(PoolId{}, options.cross_stream_reuse) {}
  ~CacheParts() {
    for (auto& segment : segments) {
      for (Block* b = segment->head; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
    }
  }

  // A segment of `size_class` at `address`, tiled by free blocks of the given sizes, none indexed
  // anywhere yet; `owner` 0 makes a block settled (last used by `settled_stream`).
  Segment& tiled(SizeClass size_class, std::uintptr_t address,
                 std::initializer_list<std::pair<std::size_t, Stream>> blocks, Stream settled_stream = 0) {
    return tiled(size_class, address, std::vector<std::pair<std::size_t, Stream>>(blocks), settled_stream);
  }
  Segment& tiled(SizeClass size_class, std::uintptr_t address,
                 const std::vector<std::pair<std::size_t, Stream>>& blocks, Stream settled_stream = 0) {
    segments.push_back(std::make_unique<Segment>());
    Segment& segment = *segments.back();
    segment.address = address;
    segment.size_class = size_class;
    segment.owner = &pool;
    Block* prev = nullptr;
    for (const auto& [size, owner] : blocks) {
      auto* b = new Block;
      b->address = address;
      b->size = size;
      b->segment = &segment;
      b->state = BlockState::kFree;
      b->settled = owner == 0;
      b->stream = owner == 0 ? settled_stream : owner;
      b->prev = prev;
      if (prev != nullptr) prev->next = b;
      if (segment.head == nullptr) segment.head = b;
      address += size;
      segment.size += size;
      prev = b;
    }
    segment.tail = prev;
    return segment;
  }
  // What a FenceEngine works on: these parts; released blocks and capture-use changes go to the
  // given callbacks.
  FenceEngine::Parts fence_parts(
      std::function<void(Block*, Clock::time_point)> release, std::function<void()> capture_uses_changed = [] {}) {
    return FenceEngine::Parts{shards, ledger, free, aids, options, std::move(release), std::move(capture_uses_changed)};
  }
  static Block* at(const Segment& segment, int i) {
    Block* b = segment.head;
    while (i-- > 0) b = b->next;
    return b;
  }

  SimBackend sim;
  Options options;
  ShardSet shards;
  StatsLedger ledger;
  FreeBlocks free;
  std::unique_ptr<DebugAids> aids;  // none
  MemoryPool pool;
  std::vector<std::unique_ptr<Segment>> segments;
};

}  // namespace streamalloc::test
