// Shard on its own (shard.hpp): the stream's own blocks. The fast path takes a hot block back and puts
// a freed block of the default pool without other uses in the hot list, under the shard lock alone, and
// leaves everything else (an empty list, an unknown device size, other uses, a private pool, a full
// list, too little headroom) to the device-locked path with nothing changed.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cache_parts.hpp"
#include "shard.hpp"

namespace streamalloc {
namespace {

using test::CacheParts;

constexpr std::size_t kTotal = std::size_t{1} << 34;

// A live block of `shard`'s stream in the default pool, and headroom enough for the fast path.
Block* live_block(CacheParts& parts, Shard& shard, std::uintptr_t address) {
  Segment& segment = parts.tiled(SizeClass::kSmall, address, {{4096, shard.stream()}, {4096, shard.stream()}});
  Block* block = segment.head;
  block->state = BlockState::kAllocated;
  block->requested = 4000;
  block->in_shard = true;
  shard.add_live(block);
  for (auto& room : shard.stats.headroom) room.fill(1 << 20);
  return block;
}

// A shard, the shared headroom and what the fast path is given, for the tests that call it.
struct FastPath : ::testing::Test {
  CacheParts parts;
  Shard shard{parts.sim.create_stream(0)};
  SharedHeadroom shared;
  const std::atomic<std::size_t> total{kTotal};
  const size_policy::Rounding rounding{parts.options.roundup_power2_divisions};
};

TEST_F(FastPath, PutsAFreedBlockInTheHotListAndTakesItBack) {
  Block* block = live_block(parts, shard, 0x200000);
  EXPECT_EQ(shard.allocate_hot(4000, rounding, parts.options, total, shared), nullptr) << "an empty hot list";
  EXPECT_FALSE(shard.free_to_hot(block->address, 4096, parts.options, &parts.pool, shared)) << "the wrong size";
  ASSERT_TRUE(shard.free_to_hot(block->address, 0, parts.options, &parts.pool, shared));
  EXPECT_TRUE(block->hot);
  EXPECT_EQ(block->state, BlockState::kFree);
  EXPECT_TRUE(shard.has_hot());
  EXPECT_EQ(shard.live.find(block->address), nullptr);
  EXPECT_EQ(shard.counts.frees_cached, 1);

  const std::atomic<std::size_t> unknown{0};
  EXPECT_EQ(shard.allocate_hot(4000, rounding, parts.options, unknown, shared), nullptr)
      << "the device's size is not known yet";
  EXPECT_EQ(shard.allocate_hot(8192, rounding, parts.options, total, shared), nullptr) << "no hot block of that size";
  EXPECT_EQ(shard.allocate_hot(4000, rounding, parts.options, total, shared), reinterpret_cast<void*>(block->address));
  EXPECT_FALSE(block->hot);
  EXPECT_EQ(block->state, BlockState::kAllocated);
  EXPECT_EQ(block->requested, 4000u);
  EXPECT_EQ(shard.live.find(block->address), block);
  EXPECT_FALSE(shard.has_hot());
  EXPECT_EQ(shard.counts.allocations_cached, 1);
  shard.erase_live(block);
}

TEST_F(FastPath, TakesTheHeadroomItLacksFromTheSharedHeadroom) {
  Block* block = live_block(parts, shard, 0x200000);
  const auto bytes = static_cast<std::size_t>(kAllocatedBytes);
  const int small = class_index(SizeClass::kSmall);
  ASSERT_TRUE(shard.free_to_hot(block->address, 0, parts.options, &parts.pool, shared));
  // Without headroom of its own the shard takes what it lacks from the shared headroom, without the
  // device lock, and only that.
  for (auto& room : shard.stats.headroom) room.fill(0);
  for (std::size_t s = 0; s < kFastStats; ++s) {
    shared.give(static_cast<FastStat>(s), 0, 1 << 20);
    shared.give(static_cast<FastStat>(s), small, 1 << 20);
  }
  EXPECT_EQ(shard.allocate_hot(4000, rounding, parts.options, total, shared), reinterpret_cast<void*>(block->address));
  EXPECT_EQ(shard.stats.headroom[bytes][0], 0);
  EXPECT_EQ(shared.held(bytes, 0), (1 << 20) - 4096);
  // With too little shared either, the device-locked path decides; what was taken stays the shard's.
  ASSERT_TRUE(shard.free_to_hot(block->address, 0, parts.options, &parts.pool, shared));
  for (auto& room : shard.stats.headroom) room.fill(0);
  shared.clear();
  shared.give(kAllocation, 0, 1);
  shared.give(kAllocation, small, 1);
  EXPECT_EQ(shard.allocate_hot(4000, rounding, parts.options, total, shared), nullptr);
  EXPECT_TRUE(block->hot) << "nothing changed but the headroom";
  EXPECT_EQ(shard.stats.headroom[static_cast<std::size_t>(kAllocation)][0], 1);
  EXPECT_EQ(shared.held(static_cast<std::size_t>(kAllocation), 0), 0);
  shard.remove_hot(block);
}

TEST(Shard, TheFastPathLeavesOtherUsesPrivatePoolsAndAFullListToTheDeviceLock) {
  CacheParts parts;
  Shard shard(parts.sim.create_stream(0));
  SharedHeadroom shared;
  Block* block = live_block(parts, shard, 0x200000);
  block->recorded_streams = {0x99};
  EXPECT_FALSE(shard.free_to_hot(block->address, 0, parts.options, &parts.pool, shared)) << "a block with other uses";
  block->recorded_streams.clear();
  MemoryPool other(PoolId{1, 1}, CrossStreamReuse::kSettled);
  EXPECT_FALSE(shard.free_to_hot(block->address, 0, parts.options, &other, shared)) << "not the default pool's block";
  EXPECT_EQ(shard.live.find(block->address), block) << "nothing changed";
  EXPECT_FALSE(block->hot);

  std::vector<std::pair<std::size_t, Stream>> layout(HotList::kMaxBlocks, {512, 0});
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x400000, layout);
  for (Block* b = segment.head; b != nullptr; b = b->next) shard.push_hot(b);
  EXPECT_FALSE(shard.free_to_hot(block->address, 0, parts.options, &parts.pool, shared)) << "a hot list at its bounds";
  EXPECT_EQ(shard.live.find(block->address), block);
  while (shard.has_hot()) shard.remove_hot(shard.hot.oldest());
  shard.erase_live(block);
}

TEST(Shard, ValidateCountsItsBlocksAndFindsABlockInTheWrongState) {
  CacheParts parts;
  Shard shard(parts.sim.create_stream(0));
  SharedHeadroom shared;
  Block* block = live_block(parts, shard, 0x200000);
  Block* other = block->next;
  other->in_shard = true;
  shard.push_hot(other);
  ShardTally tally;
  shard.validate(0, true, tally);
  EXPECT_EQ(tally.live, 1u);
  EXPECT_EQ(tally.hot, 1u);
  EXPECT_TRUE(tally.fence_refs.empty());
  block->state = BlockState::kFree;
  EXPECT_THROW(shard.validate(0, true, tally), std::logic_error) << "a free block in the live table";
  block->state = BlockState::kAllocated;
  shard.stats.headroom[kActive][0] = -1;
  EXPECT_THROW(shard.validate(0, true, tally), std::logic_error) << "negative headroom";
  shard.stats.headroom[kActive][0] = 0;
  shard.remove_hot(other);
  shard.erase_live(block);
}

}  // namespace
}  // namespace streamalloc
