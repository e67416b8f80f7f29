// StatsLedger on its own (stats_ledger.hpp): counts, the device-locked stats, and the headroom rule of
// the fast path's stats (shard_stats.hpp): peak == current + every headroom, the peak rising only by
// what no headroom covers, and a shard's headroom spent before the device's.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "block.hpp"
#include "cache_parts.hpp"
#include "stats_ledger.hpp"

namespace streamalloc {
namespace {

// Shards as the ledger sees them: headroom it may gather, each asked in turn.
struct Donors : HeadroomDonors {
  std::vector<ShardStats*> shards;
  int asked = 0;
  void gather_headroom(FastStat s, int p, std::int64_t needed, std::int64_t& device, SharedHeadroom& shared,
                       const ShardStats* /*keep*/) override {
    for (ShardStats* shard : shards) {
      ++asked;
      std::int64_t& part = shard->headroom[static_cast<std::size_t>(s)][static_cast<std::size_t>(p)];
      const std::int64_t take = std::min(part, std::max<std::int64_t>(needed - device, 0));
      device += take;
      shared.give(s, p, part - take);
      part = 0;
    }
  }
};

struct OneBlock {
  OneBlock(std::size_t size, SizeClass size_class) {
    segment.size_class = size_class;
    segment.size = size;
    block.segment = &segment;
    block.size = size;
    segment.head = &block;
  }
  Segment segment;
  Block block;
};

constexpr int kSmall = 1;

TEST(StatsLedger, CountsAndDeviceLockedStatsMoveTheAggregateAndTheSizeClass) {
  Donors donors;
  StatsLedger ledger(donors);
  ledger.count(&DeviceStats::num_ooms);
  ledger.count(&DeviceStats::fences_polled, 3);
  ledger.increase(&DeviceStats::reserved_bytes, SizeClass::kLarge, 100);
  ledger.decrease(&DeviceStats::reserved_bytes, SizeClass::kLarge, 40);
  EXPECT_EQ(ledger.stats().num_ooms, 1);
  EXPECT_EQ(ledger.stats().fences_polled, 3);
  EXPECT_EQ(ledger.stats().reserved_bytes[0].current, 60);
  EXPECT_EQ(ledger.stats().reserved_bytes[2].current, 60);
  EXPECT_EQ(ledger.stats().reserved_bytes[2].peak, 100);
  EXPECT_EQ(ledger.stats().reserved_bytes[1].current, 0);
  ledger.note_free_to_reusable(std::chrono::microseconds(50));
  EXPECT_EQ(ledger.stats().free_to_reusable_us[1], 1) << "50 us falls in the bucket below 100 us";
}

TEST(StatsLedger, AnIncreaseWithoutHeadroomRaisesThePeakByExactlyWhatIsMissing) {
  Donors donors;
  StatsLedger ledger(donors);
  ledger.fast_increase(kAllocatedBytes, SizeClass::kSmall, 512);
  EXPECT_EQ(ledger.stats().allocated_bytes[0].peak, 512);
  EXPECT_EQ(ledger.stats().allocated_bytes[kSmall].current, 512);
  ledger.fast_decrease(kAllocatedBytes, SizeClass::kSmall, 512);
  EXPECT_EQ(ledger.device_headroom(kAllocatedBytes, 0), 512) << "a decrease returns headroom to the device";
  ledger.fast_increase(kAllocatedBytes, SizeClass::kSmall, 256);
  EXPECT_EQ(ledger.stats().allocated_bytes[0].peak, 512) << "covered by headroom: the peak stays";
  EXPECT_EQ(ledger.device_headroom(kAllocatedBytes, 0), 256);
  EXPECT_EQ(ledger.stats().allocated_bytes[0].current + ledger.device_headroom(kAllocatedBytes, 0),
            ledger.stats().allocated_bytes[0].peak);
}

TEST(StatsLedger, TheSharedHeadroomServesBeforeAGatherAndAGatherSharesWhatTheDeviceDoesNotNeed) {
  Donors donors;
  ShardStats a;
  donors.shards = {&a};
  StatsLedger ledger(donors);
  ledger.fast_increase(kAllocatedBytes, SizeClass::kSmall, 1000);
  ledger.fast_decrease(kAllocatedBytes, SizeClass::kSmall, 1000, &a);  // the headroom is the shard's
  ledger.shared_headroom().give(kAllocatedBytes, 0, 300);
  ledger.shared_headroom().give(kAllocatedBytes, kSmall, 300);
  a.headroom[kAllocatedBytes][0] -= 300;  // as if a gather had shared 300 of it
  a.headroom[kAllocatedBytes][kSmall] -= 300;
  const int asked = donors.asked;
  ledger.fast_increase(kAllocatedBytes, SizeClass::kSmall, 100);
  EXPECT_EQ(donors.asked, asked) << "the shared headroom covered it";
  EXPECT_EQ(ledger.device_headroom(kAllocatedBytes, 0), 100) << "twice what it lacked, less the increase";
  EXPECT_EQ(ledger.shared_headroom().held(kAllocatedBytes, 0), 100);
  ledger.fast_increase(kAllocatedBytes, SizeClass::kSmall, 500);
  EXPECT_GT(donors.asked, asked) << "then the shard gave all it had";
  EXPECT_EQ(a.headroom[kAllocatedBytes][0], 0);
  EXPECT_EQ(ledger.stats().allocated_bytes[0].peak, 1000) << "no new peak: the headroom was all there";
  EXPECT_EQ(ledger.stats().allocated_bytes[0].current + ledger.device_headroom(kAllocatedBytes, 0) +
                ledger.shared_headroom().held(kAllocatedBytes, 0),
            ledger.stats().allocated_bytes[0].peak);
}

TEST(StatsLedger, ShardHeadroomIsSpentFirstAndGatheredBeforeThePeakRises) {
  Donors donors;
  ShardStats a;
  ShardStats b;
  donors.shards = {&a, &b};
  StatsLedger ledger(donors);
  ledger.fast_increase(kActive, SizeClass::kSmall, 2);
  ledger.fast_decrease(kActive, SizeClass::kSmall, 2, &b);  // b holds the headroom now
  EXPECT_EQ(b.headroom[kActive][0], 2);
  EXPECT_EQ(ledger.device_headroom(kActive, 0), 0);
  donors.asked = 0;
  ledger.fast_increase(kActive, SizeClass::kSmall, 1, &b);
  EXPECT_EQ(b.headroom[kActive][0], 1) << "the shard's own headroom is spent first";
  EXPECT_EQ(donors.asked, 0);
  ledger.fast_increase(kActive, SizeClass::kSmall, 1, &a);  // a has none: the device gathers b's
  EXPECT_GT(donors.asked, 0);
  EXPECT_EQ(b.headroom[kActive][0], 0);
  EXPECT_EQ(ledger.stats().active[0].peak, 2) << "gathered headroom covered it";
  ledger.fast_increase(kActive, SizeClass::kSmall, 1);
  EXPECT_EQ(ledger.stats().active[0].peak, 3) << "nothing left anywhere: the peak rises";
}

// A device-locked call serving a stream: the changes it makes without naming a shard (the free lists'
// inactive splits) spend that shard's headroom first and return theirs to it; after the call, the
// device's again.
TEST(StatsLedger, TheServedShardKeepsTheHeadroomOfUnnamedChanges) {
  Donors donors;
  ShardStats a;
  ShardStats b;
  donors.shards = {&a, &b};
  StatsLedger ledger(donors);
  OneBlock one(2048, SizeClass::kSmall);
  {
    const StatsLedger::Serving serving(ledger, a);
    ledger.count_inactive_split(&one.block, true);  // a new peak: nothing to spend yet
    ledger.uncount_inactive_split(&one.block);
    EXPECT_EQ(a.headroom[kInactiveSplitBytes][0], 2048) << "returned to the shard served";
    EXPECT_EQ(ledger.device_headroom(kInactiveSplitBytes, 0), 0);
    donors.asked = 0;
    ledger.count_inactive_split(&one.block, true);
    EXPECT_EQ(a.headroom[kInactiveSplitBytes][0], 0) << "spent from the shard served";
    EXPECT_EQ(donors.asked, 0);
    EXPECT_EQ(ledger.stats().inactive_split_bytes[0].peak, 2048);
    ledger.fast_decrease(kInactiveSplitBytes, SizeClass::kSmall, 2048, &b);  // a named shard wins
    one.block.counted_inactive_split = false;
    EXPECT_EQ(b.headroom[kInactiveSplitBytes][0], 2048);
    EXPECT_EQ(a.headroom[kInactiveSplitBytes][0], 0);
  }
  ledger.count_inactive_split(&one.block, true);  // no shard served: the device gathers b's
  EXPECT_GT(donors.asked, 0);
  EXPECT_EQ(b.headroom[kInactiveSplitBytes][0], 0);
  ledger.uncount_inactive_split(&one.block);
  EXPECT_EQ(ledger.device_headroom(kInactiveSplitBytes, 0), 2048) << "no shard served: back to the device";
  EXPECT_EQ(ledger.stats().inactive_split_bytes[0].peak, 2048) << "never above the largest current";
}

TEST(StatsLedger, InactiveSplitsAreCountedOnceAndAccountingRoundTrips) {
  Donors donors;
  StatsLedger ledger(donors);
  OneBlock one(1024, SizeClass::kSmall);
  ledger.count_inactive_split(&one.block, true);
  ledger.count_inactive_split(&one.block, true);
  EXPECT_EQ(ledger.stats().inactive_split[0].current, 1) << "the block's flag makes counting idempotent";
  ledger.uncount_inactive_split(&one.block);
  EXPECT_EQ(ledger.stats().inactive_split_bytes[0].current, 0);
  Shard shard(0x10);
  ledger.account_allocated(shard, &one.block, 1000);
  EXPECT_EQ(ledger.stats().requested_bytes[0].current, 1000);
  one.block.requested = 1000;
  ledger.account_freed(&one.block, &shard);
  ledger.account_inactive(&one.block, &shard);
  EXPECT_EQ(ledger.stats().allocated_bytes[0].current, 0);
  EXPECT_EQ(ledger.stats().requested_bytes[0].current, 0);
  EXPECT_EQ(one.block.requested, 0u);
  EXPECT_EQ(shard.stats.headroom[kAllocatedBytes][0], 1024) << "a free with a shard returns its headroom there";
}

TEST(StatsLedger, ResetsFoldShardPartsAndClearTotals) {
  Donors donors;
  StatsLedger ledger(donors);
  ShardStats shard;
  shard.allocated[kAllocation][0] = 5;
  shard.freed[kAllocation][0] = 2;
  ledger.count(&DeviceStats::num_ooms);
  ledger.add_lock_wait(7);
  DeviceStats sum = ledger.stats();
  StatsLedger::add_shard_part(sum, shard);
  EXPECT_EQ(sum.allocation[0].current, 3);
  ledger.fold_shard_part(shard);
  EXPECT_EQ(ledger.stats().allocation[0].current, 3);
  EXPECT_EQ(shard.current(kAllocation, 0), 0);
  EXPECT_FALSE(ledger.accumulated_reset());
  ledger.reset_accumulated();
  EXPECT_TRUE(ledger.accumulated_reset());
  EXPECT_EQ(ledger.stats().num_ooms, 0);
  EXPECT_EQ(ledger.lock_wait_ticks(), 0u);
  EXPECT_EQ(ledger.stats().allocation[0].current, 3) << "current survives a reset of the totals";
  ledger.reset_peaks(ledger.stats());
  EXPECT_EQ(ledger.stats().allocation[0].peak, 3);
}

}  // namespace
}  // namespace streamalloc

namespace streamalloc {
namespace {

// The whole ledger with real shards (ShardSet): the report adds every shard's part, and the resets
// reach the shards' parts and headroom.
TEST(StatsLedger, WithShardsAddsEveryShardsPartAndTheResetsReachTheShards) {
  test::CacheParts parts;
  const Stream a = parts.sim.create_stream(0);
  test::DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  shard.stats.headroom[kAllocation][0] = shard.stats.headroom[kAllocation][kSmall] = 4;
  shard.stats.raise(kAllocation, kSmall, 3);
  parts.ledger.fast_increase(kAllocation, SizeClass::kSmall, 2);
  EXPECT_EQ(parts.ledger.with_shards(parts.shards).allocation[0].current, 5);
  EXPECT_EQ(parts.ledger.stats().allocation[0].current, 2) << "the device's part alone";
  EXPECT_EQ(parts.ledger.report(parts.shards).allocation[kSmall].current, 5);

  parts.ledger.reset_peaks(parts.shards);
  EXPECT_EQ(shard.stats.headroom[kAllocation][0], 0) << "the shards' headroom is gone with the peaks";
  EXPECT_EQ(parts.ledger.with_shards(parts.shards).allocation[0].peak, 5);

  parts.ledger.reset_accumulated(parts.shards);
  EXPECT_EQ(shard.stats.allocated[kAllocation][0], 0) << "the shard's part moved to the device's";
  const DeviceStats after = parts.ledger.with_shards(parts.shards);
  EXPECT_EQ(after.allocation[0].current, 5);
  EXPECT_EQ(after.allocation[0].allocated, 0);
  EXPECT_TRUE(parts.ledger.accumulated_reset());
}

TEST(StatsLedger, ValidateHoldsThePeakToTheCurrentAndEveryHeadroom) {
  test::CacheParts parts;
  const Stream a = parts.sim.create_stream(0);
  test::DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  parts.ledger.fast_increase(kActive, SizeClass::kSmall, 8);
  parts.ledger.fast_decrease(kActive, SizeClass::kSmall, 3, &shard.stats);  // the shard holds 3 under the peak
  EXPECT_NO_THROW(parts.ledger.validate(0, parts.shards));
  shard.stats.headroom[kActive][0] += 1;
  EXPECT_THROW(parts.ledger.validate(0, parts.shards), std::logic_error) << "headroom that no peak covers";
  shard.stats.headroom[kActive][0] -= 1;
  EXPECT_NO_THROW(parts.ledger.validate(0, parts.shards));
}

}  // namespace
}  // namespace streamalloc
