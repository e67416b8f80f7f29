// ShardTable: stream -> its Shard (the stream's shard), read without any lock by the per-stream
// fast path, written by one thread at a time (the holder of the device lock).
//
// Open addressing over a fixed array: an entry is written once (the stream, then the pointer with
// release order) and never moved or removed, and shards live as long as their cache, so a reader that
// sees the pointer (acquire) sees the stream and the shard it points to. Fixed capacity because
// growing would move entries under the readers; a cache that sees more than kCapacity / 2 streams keeps
// the rest in its device-locked map only, where they take the device-locked path (still correct, only
// slower). Stream 0 (the legacy default stream) is an ordinary key: a slot is empty while its pointer
// is null.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "streamalloc/types.hpp"

namespace streamalloc {

struct Shard;

class ShardTable {
 public:
  static constexpr std::size_t kCapacity = 1024;  // a power of two; holds up to kCapacity / 2 streams

  Shard* find(Stream stream) const {
    for (std::size_t i = home(stream), probes = 0; probes < kCapacity; i = next(i), ++probes) {
      Shard* shard = slots_[i].shard.load(std::memory_order_acquire);
      if (shard == nullptr) return nullptr;
      if (slots_[i].stream.load(std::memory_order_relaxed) == stream) return shard;
    }
    return nullptr;
  }

  // Writer only (one at a time). `stream` must not be in the table. False when the table is full.
  bool insert(Stream stream, Shard* shard) {
    if (2 * (size_ + 1) > kCapacity) return false;
    std::size_t i = home(stream);
    while (slots_[i].shard.load(std::memory_order_relaxed) != nullptr) i = next(i);
    slots_[i].stream.store(stream, std::memory_order_relaxed);
    slots_[i].shard.store(shard, std::memory_order_release);
    ++size_;
    return true;
  }

 private:
  struct Slot {
    std::atomic<Stream> stream{0};
    std::atomic<Shard*> shard{nullptr};
  };
  // Fibonacci hashing: stream handles are pointers (CUDA) or small counters (the simulated device).
  static std::size_t home(Stream stream) {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(stream) * 0x9E3779B97F4A7C15ull) >> 40) &
           (kCapacity - 1);
  }
  static std::size_t next(std::size_t i) { return (i + 1) & (kCapacity - 1); }

  std::array<Slot, kCapacity> slots_{};
  std::size_t size_ = 0;  // writer only
};

}  // namespace streamalloc
