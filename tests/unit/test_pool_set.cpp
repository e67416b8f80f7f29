// PoolSet on its own (pool_set.hpp): the default pool serves every stream no route claims, the newest
// route whose filter accepts a stream wins, and refused operations change nothing.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "block.hpp"
#include "pool_set.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {
namespace {

constexpr PoolId kGraph{1, 1};
constexpr PoolId kMemPool{2, 7};

TEST(PoolSet, RoutesSendAcceptedStreamsToTheNewestRoutedPool) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  EXPECT_FALSE(pools.has_routes());
  EXPECT_TRUE(pools.is_default(&pools.pool_for(0x10)));
  pools.open_route(kGraph, [](Stream s) { return s == 0x10; });
  pools.open_route(kMemPool, [](Stream) { return true; });
  EXPECT_EQ(pools.pool_for(0x10).id, kMemPool) << "newest route first";
  pools.close_route(kMemPool);
  EXPECT_EQ(pools.pool_for(0x10).id, kGraph);
  EXPECT_TRUE(pools.is_default(&pools.pool_for(0x20))) << "a stream no filter accepts";
  EXPECT_EQ(pools.find(kGraph)->use_count, 1) << "the route's use";
  EXPECT_EQ(pools.find(kMemPool)->use_count, 1) << "closing a route leaves its use to the owner";
}

TEST(PoolSet, RefusedOperationsChangeNothing) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  EXPECT_THROW(pools.open_route(PoolId{}, [](Stream) { return true; }), Error);
  EXPECT_THROW(pools.open_route(kGraph, PoolFilter{}), Error);
  EXPECT_FALSE(pools.has_routes());
  EXPECT_EQ(pools.find(kGraph), nullptr);
  pools.open_route(kGraph, [](Stream) { return true; });
  EXPECT_THROW(pools.open_route(kGraph, [](Stream) { return true; }), Error);
  EXPECT_EQ(pools.routes().size(), 1u);
  EXPECT_THROW(pools.close_route(kMemPool), Error);
  EXPECT_THROW(pools.private_pool(PoolId{}, "test"), Error);
  EXPECT_THROW(pools.private_pool(kMemPool, "test"), Error);
}

TEST(PoolSet, APoolWithoutUsesOrSegmentsIsErased) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  MemoryPool& pool = pools.add_use(kMemPool);
  pool.segments = 1;
  --pool.use_count;
  pools.erase_empty_freeable();
  ASSERT_NE(pools.find(kMemPool), nullptr) << "it still holds a segment";
  pools.find(kMemPool)->segments = 0;
  pools.erase_empty_freeable();
  EXPECT_EQ(pools.find(kMemPool), nullptr);
  EXPECT_EQ(pools.find(PoolId{}), &pools.default_pool());
}

}  // namespace
}  // namespace streamalloc

namespace streamalloc {
namespace {

TEST(PoolSet, OwnersUsesFlagsAndTheReportOfAPool) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  pools.add_use(kGraph);
  EXPECT_EQ(pools.use_count(kGraph), 1);
  EXPECT_EQ(pools.use_count(PoolId{}), 0) << "the default pool has no owners";
  EXPECT_EQ(pools.use_count(kMemPool), 0) << "an unknown pool";
  pools.set_use_on_oom(kGraph, true);
  pools.set_no_split(kGraph);
  pools.open_route(kGraph, [](Stream) { return true; });
  PoolInfo info = pools.info(*pools.find(kGraph));
  EXPECT_EQ(info.id, kGraph);
  EXPECT_EQ(info.use_count, 2) << "the owner's and the route's";
  EXPECT_TRUE(info.use_on_oom);
  EXPECT_TRUE(info.no_split);
  EXPECT_TRUE(info.routed);
  EXPECT_FALSE(pools.info(pools.default_pool()).routed);
  pools.close_route(kGraph);
  pools.release_use(kGraph);
  pools.release_use(kGraph);
  EXPECT_THROW(pools.release_use(kGraph), Error) << "no uses left";
  EXPECT_EQ(pools.use_count(kGraph), 0);
  EXPECT_THROW(pools.set_no_split(PoolId{}), Error);
}

TEST(PoolSet, ASegmentAllocatorOnlyForAPoolWithoutSegmentsAndOomPoolsOnlyWhenAllowed) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  pools.add_use(kGraph);
  pools.add_use(kMemPool);
  const SegmentAllocator allocator{[](int, std::size_t) -> void* { return nullptr; }, [](int, void*, std::size_t) {}};
  pools.find(kGraph)->segments = 1;
  EXPECT_THROW(pools.set_segment_allocator(kGraph, allocator), Error);
  EXPECT_EQ(pools.find(kGraph)->segment_allocator, nullptr) << "refused: nothing changed";
  pools.find(kGraph)->segments = 0;
  pools.set_segment_allocator(kGraph, allocator);
  EXPECT_NE(pools.find(kGraph)->segment_allocator, nullptr);

  Block block;
  std::vector<PoolId> asked;
  const auto find = [&](MemoryPool& pool) -> Block* {
    asked.push_back(pool.id);
    return pool.id == kMemPool ? &block : nullptr;
  };
  EXPECT_EQ(pools.find_in_use_on_oom(find), nullptr) << "no pool allowed it";
  pools.set_use_on_oom(kGraph, true);
  pools.set_use_on_oom(kMemPool, true);
  EXPECT_EQ(pools.find_in_use_on_oom(find), &block);
  EXPECT_EQ(asked, (std::vector<PoolId>{kGraph, kMemPool}));
}

TEST(PoolSet, ValidateFindsARoutedPoolWithoutAUse) {
  PoolSet pools(0, CrossStreamReuse::kSettled);
  pools.open_route(kGraph, [](Stream) { return true; });
  EXPECT_NO_THROW(pools.validate());
  MemoryPool& graph = pools.private_pool(kGraph, "test");
  --graph.use_count;
  EXPECT_THROW(pools.validate(), std::logic_error) << "a routed pool without a use";
  ++graph.use_count;
  EXPECT_NO_THROW(pools.validate());
}

}  // namespace
}  // namespace streamalloc
