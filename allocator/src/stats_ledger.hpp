// StatsLedger: the stats of one device cache, as the device keeps them: the counts, the stats only
// device-locked code changes, the device's part of the stats the fast path changes too, the device's
// headroom under their peaks (shard_stats.hpp says how headroom keeps the peaks exact), and the device
// lock's wait and hold times. Each shard keeps its own part (ShardStats); the ledger reaches the shards
// only through HeadroomDonors, when the device's headroom falls short.
//
// Every method runs under the device lock; the ShardStats passed in are locked by the caller.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

#include "block.hpp"
#include "shard_set.hpp"
#include "shard_stats.hpp"
#include "streamalloc/stats.hpp"

namespace streamalloc {

class StatsLedger {
 public:
  using Headroom = std::array<std::array<std::int64_t, kSizeClasses>, kFastStats>;

  explicit StatsLedger(HeadroomDonors& donors) : donors_(donors) {}
  StatsLedger(const StatsLedger&) = delete;
  StatsLedger& operator=(const StatsLedger&) = delete;

  // The device's part: every stat, and of the fast path's stats the device-locked part of current and
  // the totals, and the peak.
  const DeviceStats& stats() const { return stats_; }
  void set_max_split_size(std::int64_t bytes) { stats_.max_split_size = bytes; }

  // ---- counts and the stats only device-locked code changes
  void count(std::int64_t DeviceStats::*field, std::int64_t n = 1) { stats_.*field += n; }
  void increase(Stat DeviceStats::*field, std::int64_t amount) { (stats_.*field).increase(amount); }
  void decrease(Stat DeviceStats::*field, std::int64_t amount) { (stats_.*field).decrease(amount); }
  // The aggregate and the size class move together. Never for the stats the fast path changes.
  void increase(StatArray DeviceStats::*field, SizeClass size_class, std::int64_t amount) {
    (stats_.*field)[0].increase(amount);
    (stats_.*field)[class_index(size_class)].increase(amount);
  }
  void decrease(StatArray DeviceStats::*field, SizeClass size_class, std::int64_t amount) {
    (stats_.*field)[0].decrease(amount);
    (stats_.*field)[class_index(size_class)].decrease(amount);
  }
  // A pending block became reusable `waited` after its free: one more in its latency bucket.
  void note_free_to_reusable(std::chrono::microseconds waited) {
    for (std::size_t i = 0; i < kLatencyBucketUs.size(); ++i) {
      if (waited.count() < kLatencyBucketUs[i]) {
        ++stats_.free_to_reusable_us[i];
        break;
      }
    }
  }

  // ---- the stats the fast path changes too, changed by device-locked code
  // The shard of the stream that a device-locked allocation or free serves (locked by that call), for
  // as long as the Serving object lives: the changes the call makes without naming a shard (the
  // free lists' inactive splits, a free's stats) spend that shard's headroom first and return theirs
  // to it. So each stream keeps the headroom its own blocks need, and its next fast paths find it
  // there rather than in the device's (docs/design.md, "Stats stay exact").
  class Serving {
   public:
    Serving(StatsLedger& ledger, ShardStats& shard) : ledger_(ledger) { ledger_.serving_ = &shard; }
    ~Serving() { ledger_.serving_ = nullptr; }
    Serving(const Serving&) = delete;
    Serving& operator=(const Serving&) = delete;

   private:
    StatsLedger& ledger_;
  };
  // The device's part of `current`, its headroom, and, when every shard's headroom falls short, the
  // peak. Inline for the common case, the device's headroom covering the increase in total and in the
  // size class; drawing it from the shards or a new peak is out of line, so that the common case saves
  // no registers. `shard` (locked), else the shard served (Serving), when there is one: its headroom
  // is spent before the device's, and a decrease returns it there.
  void fast_increase(FastStat s, SizeClass size_class, std::int64_t amount, ShardStats* shard = nullptr) {
    const auto i = static_cast<std::size_t>(s);
    const auto q = static_cast<std::size_t>(class_index(size_class));
    const auto covers = [&](const std::array<std::int64_t, kSizeClasses>& r) {
      return r[0] >= amount && r[q] >= amount;
    };
    if (shard == nullptr) shard = serving_;
    std::array<std::int64_t, kSizeClasses>& room =
        shard != nullptr && covers(shard->headroom[i]) ? shard->headroom[i] : headroom_[i];
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
  void fast_decrease(FastStat s, SizeClass size_class, std::int64_t amount, ShardStats* shard = nullptr) {
    const auto i = static_cast<std::size_t>(s);
    const auto q = static_cast<std::size_t>(class_index(size_class));
    if (shard == nullptr) shard = serving_;
    std::array<std::int64_t, kSizeClasses>& room = shard != nullptr ? shard->headroom[i] : headroom_[i];
    room[0] += amount;
    room[q] += amount;
    StatArray& stat = stats_.*kFastStatFields[i];
    stat[0].current -= amount;
    stat[0].freed += amount;
    stat[q].current -= amount;
    stat[q].freed += amount;
  }

  // A block handed out (and active), spending `shard`'s headroom first (stats_ledger.cpp says why).
  void account_allocated(Shard& shard, const Block* block, std::size_t requested);
  // No longer allocated / no longer active (its requested bytes leave the stats). The headroom they
  // return goes to `shard` (locked) when given, else to the shard served, else to the device's.
  void account_freed(const Block* block, Shard* shard);
  void account_inactive(Block* block, Shard* shard);
  // A free block inside a segment that is not entirely free counts as an inactive split (PyTorch's
  // definition); the block's flag makes counting idempotent. Inline: every device-locked alloc and
  // free passes here. `split`: the block's is_split() (a shard's block passes split_in_shard).
  void count_inactive_split(Block* block, bool split, ShardStats* shard = nullptr) {
    if (block->counted_inactive_split || !split) return;
    block->counted_inactive_split = true;
    fast_increase(kInactiveSplit, block->segment->size_class, 1, shard);
    fast_increase(kInactiveSplitBytes, block->segment->size_class, static_cast<std::int64_t>(block->size), shard);
  }
  void count_inactive_split(Block* block) { count_inactive_split(block, block->is_split()); }
  void uncount_inactive_split(Block* block) {
    if (!block->counted_inactive_split) return;
    block->counted_inactive_split = false;
    fast_decrease(kInactiveSplit, block->segment->size_class, 1);
    fast_decrease(kInactiveSplitBytes, block->segment->size_class, static_cast<std::int64_t>(block->size));
  }
  // Gives `shard` enough headroom to take `block` from its hot list for `requested` bytes, from the
  // device's headroom, every shard's, or by raising the peak.
  void give_headroom_for_hot_reuse(Shard& shard, const Block* block, std::size_t requested);

  // ---- the whole ledger (the device lock and every shard lock held)
  // The device's stats with every shard's part added.
  DeviceStats with_shards(const ShardSet& shards) const;
  // with_shards, and each stream's pending stats where it has had any: what stats() reports (the
  // device lock's times are the caller's to convert, after the lock).
  DeviceStats report(const ShardSet& shards) const;
  // The ledger's own invariant (shard_stats.hpp): under the peak of each fast-path stat, the device's
  // headroom is never negative and with every shard's headroom and the current it makes up the peak
  // exactly. Throws std::logic_error naming `device`; returns the stats it checked (with_shards), for
  // the cache's checks against its blocks.
  DeviceStats validate(int device, const ShardSet& shards) const;
  // The peaks restart at the current values and all headroom, the device's and the shards', is gone:
  // the next increase anywhere raises the peak.
  void reset_peaks(ShardSet& shards);
  // Totals and counts restart at zero, the shards' too; a shard's part of current moves to the
  // device's first.
  void reset_accumulated(ShardSet& shards);
  // Adds a shard's part of the fast path's stats to `sum` (the device's stats, or a copy of them).
  static void add_shard_part(DeviceStats& sum, const ShardStats& part);
  // The fast path's stats' peaks restart at `now` (the device's current with every shard's part) and
  // the device's headroom is gone; every other Stat's peak restarts at its current.
  void reset_peaks(const DeviceStats& now);
  // Moves a shard's part of current into the device's, leaving the shard's totals at zero.
  void fold_shard_part(ShardStats& part);
  // Totals and counts restart at zero; from then on allocated - freed == current no longer holds.
  void reset_accumulated();
  bool accumulated_reset() const { return accumulated_reset_; }
  std::int64_t device_headroom(FastStat s, int p) const {
    return headroom_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
  }

  // The headroom no shard holds (shard_stats.hpp): the fast paths take from it and leave in it without
  // the device lock.
  SharedHeadroom& shared_headroom() { return shared_; }

  // ---- the device lock's acquisitions and times (in cycle_clock ticks); DeviceLock writes them under the lock
  void add_lock_acquisition() const { ++lock_acquisitions_; }
  std::int64_t lock_acquisitions() const { return lock_acquisitions_; }
  void add_lock_wait(std::uint64_t ticks) const { lock_wait_ticks_ += ticks; }
  void add_lock_held(std::uint64_t ticks) const { lock_held_ticks_ += ticks; }
  std::uint64_t lock_wait_ticks() const { return lock_wait_ticks_; }
  std::uint64_t lock_held_ticks() const { return lock_held_ticks_; }

 private:
  // fast_increase's draw of `amount` of headroom in total and at class index `q` when the device's own
  // falls short of either.
  [[gnu::noinline]] void draw_headroom_for_increase(FastStat s, int q, std::int64_t amount) {
    draw_headroom(s, 0, amount, serving_);
    draw_headroom(s, q, amount, serving_);
  }
  // Takes `amount` of the device's headroom of `s` at class index `p`: taken from the shared headroom,
  // then gathered from the shards, where it falls short, and what they lack too raises the peak.
  // `keep`: the shard whose other headroom the caller may be about to spend (the gather leaves it).
  void draw_headroom(FastStat s, int p, std::int64_t amount, const ShardStats* keep);
  static constexpr std::int64_t kSharedDraw = 2;
  template <typename F>
  void for_each_stat(F&& visit);

  HeadroomDonors& donors_;
  ShardStats* serving_ = nullptr;  // Serving
  DeviceStats stats_;
  Headroom headroom_{};  // the device's, per stat and class index
  SharedHeadroom shared_;
  bool accumulated_reset_ = false;
  mutable std::int64_t lock_acquisitions_ = 0;
  mutable std::uint64_t lock_wait_ticks_ = 0;
  mutable std::uint64_t lock_held_ticks_ = 0;
};

}  // namespace streamalloc
