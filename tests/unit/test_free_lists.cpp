// FreeLists on its own: which free blocks an allocation stream may take, and the merge rule that
// validate() holds the cache to (docs/design.md, "Invariants"). A pool with its own segments keeps its
// own FreeLists, so the rules must hold without a DeviceCache around them.
#include <gtest/gtest.h>

#include "block.hpp"
#include "cache_parts.hpp"
#include "free_lists.hpp"

namespace streamalloc {
namespace {

constexpr Stream kA = 0x10;
constexpr Stream kB = 0x20;

// One segment at 0x100000 tiled by free blocks of the given sizes; owner 0 means settled (last used by kA).
struct Tiling {
  explicit Tiling(std::initializer_list<std::pair<std::size_t, Stream>> blocks)
      : segment(parts.tiled(SizeClass::kLarge, 0x100000, blocks, kA)) {}
  Block* at(int i) const { return test::CacheParts::at(segment, i); }
  test::CacheParts parts;
  Segment& segment;
};

TEST(FreeLists, OwnedBlocksServeOnlyTheirStreamSettledBlocksServeAny) {
  Tiling t({{4096, kA}, {8192, 0}});
  FreeLists lists(CrossStreamReuse::kSettled);
  lists.insert(t.at(0));
  lists.insert(t.at(1));
  EXPECT_EQ(lists.best_owned(SizeClass::kLarge, kA, 4096), t.at(0));
  EXPECT_EQ(lists.best_owned(SizeClass::kLarge, kB, 4096), nullptr);
  EXPECT_EQ(lists.best_settled(SizeClass::kLarge, kB, 4096), t.at(1));
  EXPECT_EQ(lists.best_settled(SizeClass::kLarge, kA, 8193), nullptr);
  EXPECT_EQ(lists.owned_count(), 1u);
  EXPECT_EQ(lists.settled_count(), 1u);
  lists.erase(t.at(0));
  lists.erase(t.at(1));
  EXPECT_EQ(lists.owned_count() + lists.settled_count(), 0u);
}

TEST(FreeLists, NeverPolicyKeepsSettledBlocksWithTheirStream) {
  Tiling t({{4096, 0}});  // settled, last owned by kA
  FreeLists lists(CrossStreamReuse::kNever);
  lists.insert(t.at(0));
  EXPECT_EQ(lists.best_settled(SizeClass::kLarge, kA, 4096), t.at(0));
  EXPECT_EQ(lists.best_settled(SizeClass::kLarge, kB, 4096), nullptr);
  lists.erase(t.at(0));
}

TEST(FreeLists, MergeRule) {
  Tiling t({{512, 0}, {512, 0}, {512, kA}, {512, kA}, {512, kB}});
  EXPECT_TRUE(FreeLists::mergeable(t.at(0), t.at(1))) << "two settled blocks";
  EXPECT_TRUE(FreeLists::mergeable(t.at(1), t.at(2))) << "settled next to owned";
  EXPECT_TRUE(FreeLists::mergeable(t.at(2), t.at(3))) << "owned by one stream";
  EXPECT_FALSE(FreeLists::mergeable(t.at(3), t.at(4))) << "owned by two streams";
  EXPECT_FALSE(FreeLists::mergeable(t.at(4), nullptr));
  t.at(3)->hot = true;
  EXPECT_FALSE(FreeLists::mergeable(t.at(2), t.at(3))) << "kept in a hot list";
  t.at(3)->hot = false;
  t.at(3)->held = true;
  EXPECT_FALSE(FreeLists::mergeable(t.at(2), t.at(3))) << "held back by an aid";
  t.at(3)->held = false;
  t.at(3)->state = BlockState::kPending;
  EXPECT_FALSE(FreeLists::mergeable(t.at(2), t.at(3))) << "not free";
}

TEST(FreeLists, MergedSettledAndOwnedBlockStaysOwnedAndSettlesWithTheLaterBatch) {
  Tiling t({{512, 0}, {1024, kB}, {512, 0}});
  t.at(0)->settle_seq = 9;  // a settled block's old sequence number does not count
  t.at(1)->settle_seq = 4;
  Block* high = t.at(1);
  Block* merged = FreeLists::merge(high, t.at(0));  // argument order does not matter
  EXPECT_EQ(merged, t.segment.head) << "the lower address survives";
  EXPECT_EQ(merged->size, 1536u);
  EXPECT_FALSE(merged->settled);
  EXPECT_EQ(merged->stream, kB);
  EXPECT_EQ(merged->settle_seq, 4u);
  EXPECT_EQ(merged->next, t.at(1));
  EXPECT_EQ(merged->next->prev, merged);
}

}  // namespace
}  // namespace streamalloc
