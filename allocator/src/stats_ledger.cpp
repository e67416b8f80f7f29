// StatsLedger: the out-of-line part of the device's stats (stats_ledger.hpp).
#include "stats_ledger.hpp"

#include <string>

#include "invariant.hpp"

namespace streamalloc {

// Spends the device's headroom; when it falls short, the shared headroom's, then the shards' (a
// gather); what is still missing raises the peak, to exactly the device's current after the increase
// (every shard is locked then).
void StatsLedger::draw_headroom(FastStat s, int p, std::int64_t amount, const ShardStats* keep) {
  std::int64_t& headroom = headroom_[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
  // From the shared headroom the device takes twice what it lacks, so that the device-locked increases
  // that follow (a stream's turn of allocations) find some in the device's own.
  if (headroom < amount) headroom += shared_.take_up_to(s, p, kSharedDraw * amount - headroom);
  if (headroom < amount) {
    ++stats_.headroom_gathers;
    donors_.gather_headroom(s, p, amount, headroom, shared_, keep);
    // Every shard is locked once the gather falls short: no fast path moves shared headroom now, and
    // what one left there while the gather went round is counted before the peak rises.
    if (headroom < amount) headroom += shared_.take_up_to(s, p, amount - headroom);
  }
  if (headroom < amount) {
    (stats_.*kFastStatFields[static_cast<std::size_t>(s)])[static_cast<std::size_t>(p)].peak += amount - headroom;
    headroom = amount;
  }
  headroom -= amount;
}

// The shard's fast path found a hot block but not the headroom to take it (a new peak, or headroom
// that frees on the device-locked path or on other streams left elsewhere). What the shard lacks comes
// from the device's headroom, the shared headroom, then every shard's, then a higher peak; only what
// it lacks, so that headroom does not pile up where no allocation will use it. The cells given first
// must still be there when the last is drawn: the gathers leave this shard's alone.
void StatsLedger::give_headroom_for_hot_reuse(Shard& shard, const Block* block, std::size_t requested) {
  const int size_class = class_index(block->segment->size_class);
  const auto give = [&](FastStat s, std::int64_t amount) {
    for (const int p : {0, size_class}) {
      std::int64_t& own = shard.stats.headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
      if (own >= amount) continue;
      // The shard's own headroom is set aside meanwhile, so that the gathering does not count it twice.
      const std::int64_t lacking = amount - own;
      own = 0;
      draw_headroom(s, p, lacking, &shard.stats);
      own = amount;
    }
  };
  for_each_hot_reuse_raise(static_cast<std::int64_t>(block->size), static_cast<std::int64_t>(requested), give);
}

// A device-locked allocation spends its stream's shard's headroom first (`shard`, locked), where a
// free with uses returned it (account_freed), then the device's and the other shards'.
void StatsLedger::account_allocated(Shard& shard, const Block* block, std::size_t requested) {
  const SizeClass size_class = block->segment->size_class;
  const auto size = static_cast<std::int64_t>(block->size);
  fast_increase(kAllocation, size_class, 1, &shard.stats);
  fast_increase(kAllocatedBytes, size_class, size, &shard.stats);
  fast_increase(kRequestedBytes, size_class, static_cast<std::int64_t>(requested), &shard.stats);
  fast_increase(kActive, size_class, 1, &shard.stats);
  fast_increase(kActiveBytes, size_class, size, &shard.stats);
}

// Which headroom a free returns: its allocation stream's (`shard`), where that stream's next allocation
// looks for it: a free with uses comes back to its allocation stream after its fences, kept in that
// stream's hot list where it can (DeviceCache::release_pending), and a free without uses is hot there at
// once. A shard given headroom it does not use keeps it only until a gather takes it back.
void StatsLedger::account_freed(const Block* block, Shard* shard) {
  const SizeClass size_class = block->segment->size_class;
  ShardStats* part = shard == nullptr ? nullptr : &shard->stats;
  fast_decrease(kAllocation, size_class, 1, part);
  fast_decrease(kAllocatedBytes, size_class, static_cast<std::int64_t>(block->size), part);
}

// Requested bytes stay counted while a freed block is pending, as PyTorch counts them until the
// block's events complete (requested_bytes follows active blocks, not allocated ones).
void StatsLedger::account_inactive(Block* block, Shard* shard) {
  const SizeClass size_class = block->segment->size_class;
  ShardStats* part = shard == nullptr ? nullptr : &shard->stats;
  fast_decrease(kActive, size_class, 1, part);
  fast_decrease(kActiveBytes, size_class, static_cast<std::int64_t>(block->size), part);
  fast_decrease(kRequestedBytes, size_class, static_cast<std::int64_t>(block->requested), part);
  block->requested = 0;
}

void StatsLedger::add_shard_part(DeviceStats& sum, const ShardStats& part) {
  for (int s = 0; s < kFastStats; ++s) {
    StatArray& total = sum.*kFastStatFields[static_cast<std::size_t>(s)];
    for (std::size_t p = 0; p < total.size(); ++p) {
      const auto i = static_cast<std::size_t>(s);
      total[p].current += part.current(i, p);
      total[p].allocated += part.allocated[i][p];
      total[p].freed += part.freed[i][p];
    }
  }
}

// Every Stat the ledger keeps, for the two resets.
template <typename F>
void StatsLedger::for_each_stat(F&& visit) {
#define STREAMALLOC_VISIT(name, kind, help) \
  for (Stat & s : stats_.name) visit(s);
  STREAMALLOC_POOL_STATS(STREAMALLOC_VISIT)
#undef STREAMALLOC_VISIT
  for (Stat* s :
       {&stats_.pending_blocks, &stats_.pending_bytes, &stats_.oversize_allocations, &stats_.oversize_segments}) {
    visit(*s);
  }
}

void StatsLedger::reset_peaks(const DeviceStats& now) {
  for_each_stat([](Stat& s) { s.reset_peak(); });
  for (int s = 0; s < kFastStats; ++s) {
    StatArray& stat = stats_.*kFastStatFields[static_cast<std::size_t>(s)];
    const StatArray& current = now.*kFastStatFields[static_cast<std::size_t>(s)];
    for (std::size_t p = 0; p < stat.size(); ++p) stat[p].peak = current[p].current;
    headroom_[static_cast<std::size_t>(s)].fill(0);
  }
}

void StatsLedger::fold_shard_part(ShardStats& part) {
  for (int s = 0; s < kFastStats; ++s) {
    StatArray& stat = stats_.*kFastStatFields[static_cast<std::size_t>(s)];
    for (std::size_t p = 0; p < stat.size(); ++p) {
      const auto i = static_cast<std::size_t>(s);
      stat[p].current += part.current(i, p);
      part.allocated[i][p] = part.freed[i][p] = 0;
    }
  }
}

void StatsLedger::reset_accumulated() {
  for_each_stat([](Stat& s) { s.reset_accumulated(); });
#define STREAMALLOC_RESET_COUNT(name, help) stats_.name = 0;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_RESET_COUNT)
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_RESET_COUNT)
#undef STREAMALLOC_RESET_COUNT
  stats_.free_to_reusable_us.fill(0);
  lock_wait_ticks_ = lock_held_ticks_ = 0;
  lock_acquisitions_ = 0;
  accumulated_reset_ = true;
}

}  // namespace streamalloc

namespace streamalloc {

DeviceStats StatsLedger::with_shards(const ShardSet& shards) const {
  DeviceStats sum = stats_;
  for (const auto& [stream, shard] : shards) add_shard_part(sum, shard->stats);
  return sum;
}

DeviceStats StatsLedger::report(const ShardSet& shards) const {
  DeviceStats copy = with_shards(shards);
  copy.device_lock_acquisitions = lock_acquisitions_;
  for (const auto& [stream, shard] : shards) {
    const StreamPending& p = shard->fences.pending_stats();
    if (p.pending_blocks.allocated != 0 || p.pending_blocks.current != 0) copy.per_stream[stream] = p;
    copy.per_stream_counts[stream] = shard->counts;
    copy.allocations_cached += shard->counts.allocations_cached;
    copy.frees_cached += shard->counts.frees_cached;
  }
  return copy;
}

void StatsLedger::reset_peaks(ShardSet& shards) {
  reset_peaks(with_shards(shards));
  for (const auto& [stream, shard] : shards) {
    shard->fences.pending_stats().pending_blocks.reset_peak();
    shard->fences.pending_stats().pending_bytes.reset_peak();
    for (auto& room : shard->stats.headroom) room.fill(0);
  }
  shared_.clear();
}

void StatsLedger::reset_accumulated(ShardSet& shards) {
  // A shard's part of current is its allocated - freed: it moves to the device's part first.
  for (const auto& [stream, shard] : shards) {
    shard->counts = StreamCounts{};
    shard->fences.pending_stats().pending_blocks.reset_accumulated();
    shard->fences.pending_stats().pending_bytes.reset_accumulated();
    fold_shard_part(shard->stats);
  }
  reset_accumulated();
}

DeviceStats StatsLedger::validate(int device, const ShardSet& shards) const {
  static const char* const kClassKeys[] = {"all", "small_pool", "large_pool"};
  DeviceStats stats = with_shards(shards);
  for (std::size_t s = 0; s < kFastStats; ++s) {
    for (std::size_t p = 0; p < kSizeClasses; ++p) {
      const std::string name = std::string(kFastStatNames[s]) + "." + kClassKeys[p];
      std::int64_t headroom = headroom_[s][p];
      if (headroom < 0) invariant::broken(device, name + ": the device's headroom is negative");
      if (shared_.held(s, p) < 0) invariant::broken(device, name + ": the shared headroom is negative");
      headroom += shared_.held(s, p);
      for (const auto& [stream, shard] : shards) headroom += shard->stats.headroom[s][p];
      const Stat& stat = (stats.*kFastStatFields[s])[p];
      if (stat.current + headroom != stat.peak) {
        invariant::broken(
            device, name + fmt::format(": peak {} != current {} + headroom {}", stat.peak, stat.current, headroom));
      }
    }
  }
  return stats;
}

}  // namespace streamalloc
