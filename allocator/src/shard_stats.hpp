// ShardStats: a shard's part of the stats the per-stream fast path changes, and the headroom under the
// device's peaks that lets it change them without writing anything another stream reads
// (docs/design.md, "Stats stay exact").
//
// For each such stat (in total and per size class) the device keeps the peak; every shard keeps the totals
// its fast paths added and took away (whose difference, its part of the current value, may be
// negative: a block allocated on the device-locked path can be freed on the fast path), and a
// `headroom` >= 0. The device holds headroom of its own. Every path keeps, for each stat,
//
//     peak == current of the device + the device's headroom + the shared headroom
//             + the headroom of every shard
//
// where the device's current is its own part plus every shard's. An increase by n on a shard spends n
// of that shard's headroom, a decrease returns n to it, so the sum does not move and the current can
// never pass the peak. A fast path whose headroom does not cover its increase takes what it lacks from
// the shared headroom (SharedHeadroom), with atomic operations and no lock; where that holds too little
// it goes to the device-locked path, which takes what is missing from the device's headroom, then from
// the shared headroom, then gathers from the shards one by one. A gather takes all each shard holds:
// what the device lacks goes to the device, the rest to the shared headroom, so that streams whose live
// bytes rise and fall in turn (threads serving requests of varied sizes) find each other's headroom
// there, without the device lock. The peak rises only by what is still missing once every shard has
// given all (each locked, so that no fast path moves headroom meanwhile): the peak moves only when the
// device's current would pass it, with every shard still, to exactly that current. So the peak is the
// largest value the aggregate took, and the fast path writes nothing outside its shard but the shared
// headroom.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "cache_line_allocator.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

// The stats the per-stream fast path changes.
#define STREAMALLOC_FAST_PATH_STATS(X) \
  X(allocation, kAllocation)           \
  X(allocated_bytes, kAllocatedBytes)  \
  X(requested_bytes, kRequestedBytes)  \
  X(active, kActive)                   \
  X(active_bytes, kActiveBytes)        \
  X(inactive_split, kInactiveSplit)    \
  X(inactive_split_bytes, kInactiveSplitBytes)

enum FastStat : int {
#define STREAMALLOC_FAST_STAT_ENUM(name, id) id,
  STREAMALLOC_FAST_PATH_STATS(STREAMALLOC_FAST_STAT_ENUM)
#undef STREAMALLOC_FAST_STAT_ENUM
      kFastStats
};

// Each FastStat's field in DeviceStats, and its name there.
inline constexpr std::array<StatArray DeviceStats::*, kFastStats> kFastStatFields = {
#define STREAMALLOC_FAST_STAT_FIELD(name, id) &DeviceStats::name,
    STREAMALLOC_FAST_PATH_STATS(STREAMALLOC_FAST_STAT_FIELD)
#undef STREAMALLOC_FAST_STAT_FIELD
};
inline constexpr std::array<const char*, kFastStats> kFastStatNames = {
#define STREAMALLOC_FAST_STAT_NAME(name, id) #name,
    STREAMALLOC_FAST_PATH_STATS(STREAMALLOC_FAST_STAT_NAME)
#undef STREAMALLOC_FAST_STAT_NAME
};

// Calls raise(stat, amount) for each stat that taking a block of `size` bytes from a hot list for
// `requested` bytes raises (an inactive split it was only falls). Each call with a constant stat, so
// that the fast path's uses compile to straight-line code.
template <typename F>
inline void for_each_hot_reuse_raise(std::int64_t size, std::int64_t requested, F&& raise) {
  raise(kAllocation, 1);
  raise(kActive, 1);
  raise(kAllocatedBytes, size);
  raise(kActiveBytes, size);
  raise(kRequestedBytes, requested);
}

// Per stat and class index (0 = all): what only the shard writes, under its lock. Its part of a stat's
// current value is allocated - freed (reset_accumulated_stats moves it to the device's part first);
// headroom is how far it may raise the stat without the device lock. One array per field: a raise or
// a lower then writes cells that are not neighbours, which the compiler updates with one add each;
// fields side by side (an array of {allocated, freed, headroom}) invite it to pair them in vector
// registers, which costs more than it saves here.
struct ShardStats {
  using Cells = std::array<std::array<std::int64_t, kSizeClasses>, kFastStats>;
  Cells allocated{};
  Cells freed{};
  Cells headroom{};

  std::int64_t current(std::size_t s, std::size_t p) const { return allocated[s][p] - freed[s][p]; }
  // Whether the headroom covers raising `s` by `amount`, in total and in `size_class`.
  bool covers(FastStat s, int size_class, std::int64_t amount) const {
    const auto& room = headroom[static_cast<std::size_t>(s)];
    return room[0] >= amount && room[static_cast<std::size_t>(size_class)] >= amount;
  }
  // Only after covers() said yes.
  void raise(FastStat s, int size_class, std::int64_t amount) {
    const auto i = static_cast<std::size_t>(s);
    const auto p = static_cast<std::size_t>(size_class);
    allocated[i][0] += amount;
    headroom[i][0] -= amount;
    allocated[i][p] += amount;
    headroom[i][p] -= amount;
  }
  void lower(FastStat s, int size_class, std::int64_t amount) {
    const auto i = static_cast<std::size_t>(s);
    const auto p = static_cast<std::size_t>(size_class);
    freed[i][0] += amount;
    headroom[i][0] += amount;
    freed[i][p] += amount;
    headroom[i][p] += amount;
  }
};

// Headroom that no shard holds and any may take, per stat and class index: moved in and out with atomic
// operations, by fast paths under their shard lock and by device-locked calls. With every shard locked
// nothing moves it (each move happens under some shard's lock or the device lock).
class alignas(kCacheLine) SharedHeadroom {
 public:
  // Takes `amount` if it is there, else nothing.
  bool take(FastStat s, int p, std::int64_t amount) {
    std::atomic<std::int64_t>& cell = cells_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    std::int64_t have = cell.load(std::memory_order_relaxed);
    while (have >= amount) {
      if (cell.compare_exchange_weak(have, have - amount, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  // Takes what is there, up to `amount`; returns what it took.
  std::int64_t take_up_to(FastStat s, int p, std::int64_t amount) {
    std::atomic<std::int64_t>& cell = cells_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    std::int64_t have = cell.load(std::memory_order_relaxed);
    while (have > 0) {
      const std::int64_t take = have < amount ? have : amount;
      if (cell.compare_exchange_weak(have, have - take, std::memory_order_relaxed)) return take;
    }
    return 0;
  }
  void give(FastStat s, int p, std::int64_t amount) {
    cells_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)].fetch_add(amount, std::memory_order_relaxed);
  }
  std::int64_t held(std::size_t s, std::size_t p) const { return cells_[s][p].load(std::memory_order_relaxed); }
  void clear() {
    for (auto& row : cells_) {
      for (auto& cell : row) cell.store(0, std::memory_order_relaxed);
    }
  }

 private:
  std::array<std::array<std::atomic<std::int64_t>, kSizeClasses>, kFastStats> cells_{};
};

// The shard's headroom of `s` covers raising it by `amount` in total and in `size_class` once what it
// lacks is taken from `shared`; false when `shared` holds too little (what was taken stays the shard's).
inline bool cover_from(ShardStats& stats, SharedHeadroom& shared, FastStat s, int size_class, std::int64_t amount) {
  for (const int p : {0, size_class}) {
    std::int64_t& own = stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
    if (own >= amount) continue;
    if (!shared.take(s, p, amount - own)) return false;
    own = amount;
  }
  return true;
}

// Where the ledger (stats_ledger.hpp) finds headroom when the device's own falls short: the shards
// (ShardSet), each locked (until the device-locked call returns) as it is asked.
class HeadroomDonors {
 public:
  // Moves every donor's headroom out: of `s` at class index `p` into `device` until it holds `needed`,
  // the rest, and every other stat's, into `shared`, where every shard's fast path finds it. From
  // `keep` (the shard the calling operation is serving, whose other headroom it may be about to spend;
  // may be null) only `s` at `p`, and only what `device` lacks.
  virtual void gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device, SharedHeadroom& shared,
                               const ShardStats* keep) = 0;

 protected:
  ~HeadroomDonors() = default;
};

}  // namespace streamalloc
