// FreeBlocks on its own (free_blocks.hpp): a free block enters its pool's free lists merged with its
// free neighbours and settled once its owner's fence has completed; an owned block is in its owner's
// settle list until then; hot blocks join the lists oldest first; the best fit and the split rule.
#include <gtest/gtest.h>

#include "cache_parts.hpp"
#include "free_blocks.hpp"

namespace streamalloc {
namespace {

using test::CacheParts;
using test::DeviceCall;

std::int64_t inactive_splits(const StatsLedger& ledger) { return ledger.stats().inactive_split[0].current; }

TEST(FreeBlocks, InsertIndexesAnOwnedBlockWithItsOwnerAndCountsItsSplit) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, a}, {4096, a}});
  Block* first = CacheParts::at(segment, 0);
  first->settle_seq = 1;  // its owner's fence has not completed
  DeviceCall call(parts.shards);
  free.insert(first);
  EXPECT_TRUE(parts.pool.free.contains_owned(first));
  EXPECT_EQ(parts.shards.get(a).settle_list.head(), first);
  EXPECT_EQ(inactive_splits(parts.ledger), 1) << "a free block of a split segment is an inactive split";
  free.remove(first);
  EXPECT_FALSE(parts.pool.free.contains_owned(first));
  EXPECT_EQ(parts.shards.get(a).settle_list.head(), nullptr);
  EXPECT_EQ(inactive_splits(parts.ledger), 0);
}

TEST(FreeBlocks, EnterMergesFreeNeighboursAndSettlesAFencedBlock) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, 0}, {8192, a}, {4096, 0}}, a);
  DeviceCall call(parts.shards);
  free.insert(CacheParts::at(segment, 0));
  free.insert(CacheParts::at(segment, 2));
  EXPECT_EQ(inactive_splits(parts.ledger), 2);
  free.enter(CacheParts::at(segment, 1));  // settle_seq 0: its fence has completed
  Block* merged = segment.head;
  EXPECT_EQ(merged->next, nullptr) << "the three free blocks are one";
  EXPECT_EQ(merged->size, 16384u);
  EXPECT_TRUE(merged->settled);
  EXPECT_TRUE(parts.pool.free.contains_settled(merged));
  EXPECT_EQ(parts.pool.free.settled_count(), 1u);
  EXPECT_EQ(inactive_splits(parts.ledger), 0) << "a segment that is one free block is not split";
  free.remove(merged);
}

TEST(FreeBlocks, AnOwnedBlockSettlesWhenItsOwnersFenceCompletes) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, a}, {4096, 0}}, a);
  DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  Block* owned = CacheParts::at(segment, 0);
  owned->settle_seq = shard.fences.join_as_owner();
  free.insert(CacheParts::at(segment, 1));
  free.enter(owned);
  EXPECT_EQ(segment.head->next, nullptr) << "an owned block merges with a settled neighbour";
  EXPECT_FALSE(segment.head->settled) << "and stays owned: its fence has not completed";
  EXPECT_EQ(shard.settle_list.head(), segment.head);
  Fence fence;
  ASSERT_TRUE(shard.fences.complete_open_batch(&fence, Clock::now()));
  free.settle_completed(shard);
  EXPECT_EQ(shard.settle_list.head(), nullptr);
  EXPECT_TRUE(segment.head->settled);
  free.remove(segment.head);
}

TEST(FreeBlocks, BestFitTakesTheSmallerFitAndCountsACrossStreamReuse) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  const Stream b = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{8192, a}, {4096, 0}, {4096, a}}, b);
  DeviceCall call(parts.shards);
  for (int i = 0; i < 2; ++i) CacheParts::at(segment, i)->settle_seq = 1;
  free.insert(CacheParts::at(segment, 0));
  free.insert(CacheParts::at(segment, 1));
  Block* fit = free.best_fit(parts.pool, SizeClass::kSmall, 4096, a, /*expandable=*/false);
  EXPECT_EQ(fit, CacheParts::at(segment, 1)) << "the settled 4 KiB block beats the owned 8 KiB one";
  EXPECT_EQ(free.count_reuse(fit, a), fit);
  EXPECT_EQ(parts.ledger.stats().cross_stream_reuse_settled, 1) << "settled, last used by another stream";
  EXPECT_EQ(free.best_fit(parts.pool, SizeClass::kSmall, 8192, b, false), nullptr) << "b may not take a's block";
  free.remove(CacheParts::at(segment, 0));
  free.remove(CacheParts::at(segment, 1));
}

TEST(FreeBlocks, TakeSplitsTheRestBackIntoTheLists) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{2 * MiB, 0}}, a);
  DeviceCall call(parts.shards);
  free.insert(segment.head);
  Block* taken = free.take(segment.head, 4096);
  EXPECT_EQ(taken->size, 4096u);
  EXPECT_FALSE(parts.pool.free.contains_settled(taken));
  ASSERT_NE(taken->next, nullptr);
  EXPECT_TRUE(parts.pool.free.contains_settled(taken->next));
  EXPECT_EQ(taken->next->size, 2 * MiB - 4096);
  free.remove(taken->next);
}

TEST(FreeBlocks, FlushHotMovesTheHotBlocksOfAClassIntoTheLists) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, a}, {4096, a}, {4096, a}});
  CacheParts::at(segment, 2)->state = BlockState::kAllocated;  // keeps the segment split
  DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  for (int i = 0; i < 2; ++i) {
    Block* b = CacheParts::at(segment, i);
    b->hot = true;
    parts.shards.enter(b);
    shard.hot.push(b);
  }
  shard.publish_hot();
  free.flush_hot(shard, SizeClass::kLarge);
  EXPECT_EQ(shard.hot.size(), 2u) << "no hot block of the large class";
  EXPECT_EQ(shard.counts.hot_list_flushes, 0u) << "a flush that moves nothing is not counted";
  free.flush_hot(shard, SizeClass::kSmall);
  EXPECT_TRUE(shard.hot.empty());
  EXPECT_EQ(shard.hot_count.load(), 0u);
  EXPECT_EQ(shard.counts.hot_list_flushes, 1u);
  Block* merged = segment.head;
  EXPECT_FALSE(merged->hot);
  EXPECT_FALSE(merged->in_shard);
  EXPECT_EQ(merged->size, 8192u) << "the two blocks merged as they joined the lists";
  EXPECT_TRUE(merged->settled) << "its fence (sequence 0) has completed";
  EXPECT_TRUE(parts.pool.free.contains_settled(merged));
  free.remove(segment.head);
}

TEST(FreeBlocks, FlushHotUntilMovesTheOldestUntilOneMergesIntoAFit) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, a}, {4096, a}, {4096, a}, {4096, a}});
  CacheParts::at(segment, 3)->state = BlockState::kAllocated;  // keeps the segment split
  DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  for (int i = 0; i < 3; ++i) {  // the first block is the oldest
    Block* b = CacheParts::at(segment, i);
    b->hot = true;
    parts.shards.enter(b);
    shard.hot.push(b);
  }
  shard.publish_hot();
  Block* newest = shard.hot.newest();
  EXPECT_FALSE(free.flush_hot_until(shard, SizeClass::kLarge, 4096)) << "no hot block of the large class";
  EXPECT_EQ(shard.counts.hot_list_flushes, 0u);
  EXPECT_TRUE(free.flush_hot_until(shard, SizeClass::kSmall, 8192));
  EXPECT_EQ(shard.hot.size(), 1u) << "the two oldest merged into 8 KiB; the newest stays hot";
  EXPECT_EQ(shard.hot.newest(), newest);
  EXPECT_EQ(segment.head->size, 8192u);
  EXPECT_TRUE(parts.pool.free.contains_settled(segment.head));
  EXPECT_EQ(shard.counts.hot_list_flushes, 1u);
  EXPECT_TRUE(free.flush_hot_until(shard, SizeClass::kSmall, MiB)) << "no fit, but a block moved";
  EXPECT_TRUE(shard.hot.empty());
  EXPECT_EQ(segment.head->size, 12288u);
  EXPECT_FALSE(free.flush_hot_until(shard, SizeClass::kSmall, MiB)) << "nothing left to move";
  EXPECT_EQ(shard.counts.hot_list_flushes, 2u);
  free.remove(segment.head);
}

TEST(FreeBlocks, TrimHotKeepsTheNewestWithinThreeQuartersOfTheBounds) {
  CacheParts parts;
  FreeBlocks free(parts.shards, parts.ledger, parts.options);
  const Stream a = parts.sim.create_stream(0);
  const std::size_t blocks = HotList::kMaxBlocks + 1;
  std::vector<std::pair<std::size_t, Stream>> layout(blocks, {512, a});
  layout.push_back({2 * MiB - blocks * 512, a});
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, layout);
  CacheParts::at(segment, static_cast<int>(blocks))->state = BlockState::kAllocated;
  DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(a);
  for (std::size_t i = 0; i < blocks; ++i) {
    Block* b = CacheParts::at(segment, static_cast<int>(i));
    b->hot = true;
    parts.shards.enter(b);
    shard.hot.push(b);
  }
  shard.publish_hot();
  Block* newest = shard.hot.newest();
  ASSERT_TRUE(shard.hot.over());
  free.trim_hot(shard);
  EXPECT_EQ(shard.hot.size(), HotList::kMaxBlocks / 4 * 3);
  EXPECT_EQ(shard.hot.newest(), newest) << "the newest stay";
  EXPECT_EQ(shard.hot_count.load(), HotList::kMaxBlocks / 4 * 3);
  EXPECT_EQ(segment.head->size, (blocks - HotList::kMaxBlocks / 4 * 3) * 512) << "the oldest left, merged";
  EXPECT_STREQ(shard.hot.broken(), "");
  free.flush_all_hot();
  EXPECT_TRUE(shard.hot.empty());
  free.remove(segment.head);
}

}  // namespace
}  // namespace streamalloc
