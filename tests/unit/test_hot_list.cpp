// HotList (allocator/src/hot_list.hpp): the bins by size and the age list of a stream's hot blocks,
// which blocks a request finds there (the exact size only), the bounds, and the invariants validate()
// checks. Then, through the allocator, the hot list serving the sizes a stream freed before without the
// device lock, and a miss keeping the stream's other sizes.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "hot_list.hpp"
#include "sim_fixture.hpp"
#include "streamalloc/allocator.hpp"

namespace streamalloc {
namespace {

// Blocks of the given sizes in one segment, as the hot list sees them.
struct Blocks {
  Block* add(std::size_t size) {
    auto block = std::make_unique<Block>();
    block->size = size;
    block->address = next;
    block->segment = &segment;
    next += size;
    all.push_back(std::move(block));
    return all.back().get();
  }
  Segment segment;
  std::uintptr_t next = 0x100000;
  std::vector<std::unique_ptr<Block>> all;
};

TEST(HotList, FindsTheNewestBlockOfTheExactSize) {
  Blocks blocks;
  HotList hot;
  Block* older = blocks.add(4096);
  Block* other = blocks.add(8192);
  Block* newer = blocks.add(4096);
  for (Block* b : {older, other, newer}) hot.push(b);
  EXPECT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot.bytes(), 16384u);
  EXPECT_EQ(hot.find(4096), newer);
  EXPECT_EQ(hot.find(8192), other);
  EXPECT_EQ(hot.find(2048), nullptr);
  EXPECT_EQ(hot.find(4096 + 512), nullptr);
  hot.remove(newer);
  EXPECT_EQ(hot.find(4096), older);
  EXPECT_EQ(hot.oldest(), older);
  EXPECT_EQ(hot.newest(), other);
  EXPECT_STREQ(hot.broken(), "");
  hot.remove(older);
  hot.remove(other);
  EXPECT_TRUE(hot.empty());
  EXPECT_EQ(hot.bytes(), 0u);
  EXPECT_STREQ(hot.broken(), "");
}

TEST(HotList, ServesOnlyTheExactSizeInEveryClass) {
  Blocks blocks;
  HotList hot;
  Block* b3 = blocks.add(3 * MiB);
  Block* b2 = blocks.add(2 * MiB + 256 * KiB);
  for (Block* b : {b3, b2}) hot.push(b);
  EXPECT_EQ(hot.find(2 * MiB), nullptr) << "a larger block would be split by the best fit: never here";
  EXPECT_EQ(hot.find(3 * MiB), b3) << "found in its bin, not the newest";
  EXPECT_EQ(hot.find(2 * MiB + 256 * KiB), b2);
  EXPECT_STREQ(hot.broken(), "");
}

TEST(HotList, BoundsByBytesAndBlocks) {
  Blocks blocks;
  HotList hot;
  EXPECT_TRUE(hot.has_room(HotList::kMaxBytes));
  EXPECT_FALSE(hot.has_room(HotList::kMaxBytes + 512));
  for (std::size_t i = 0; i < HotList::kMaxBlocks; ++i) hot.push(blocks.add(512));
  EXPECT_FALSE(hot.has_room(512)) << "a full count";
  EXPECT_FALSE(hot.over());
  hot.push(blocks.add(512));
  EXPECT_TRUE(hot.over());
  EXPECT_STREQ(hot.broken(), "");
}

TEST(HotList, BinsGrowWithSize) {
  std::size_t last = 0;
  for (std::size_t size = 512; size < (std::size_t{1} << 46); size += size / 7 / 512 * 512 + 512) {
    const std::size_t bin = HotList::bin_of(size);
    EXPECT_GE(bin, last) << size;
    last = bin;
  }
  EXPECT_NE(HotList::bin_of(512), HotList::bin_of(1024));
  EXPECT_NE(HotList::bin_of(2 * MiB), HotList::bin_of(2 * MiB + 256 * KiB));
}

// Through the allocator: a stream's hot list serves the sizes it freed before, on its shard alone.
class HotLists : public ::testing::Test {
 protected:
  void SetUp() override {
    setup_ = std::make_unique<testing::SimSetup>("backend:sim,log_level:error", SimBackend::Mode::kEager, 1 * GiB);
    s_ = setup_->sim->create_stream(0);
  }
  Allocator& a() { return setup_->a(); }
  DeviceStats stats() { return setup_->stats(); }

  std::unique_ptr<testing::SimSetup> setup_;
  Stream s_ = 0;
};

TEST_F(HotLists, ServeEverySizeFreedBeforeWithoutTheDeviceLock) {
  const std::size_t sizes[] = {512, 1024, 4096, 65536, 1 * MiB, 2 * MiB, 3211264};
  // Two rounds: the first makes one block of each size hot, the second takes them back (and the shard
  // gathers its headroom); the third must not take the device lock.
  for (int round = 0; round < 3; ++round) {
    const DeviceStats before = stats();
    std::vector<void*> held;
    for (std::size_t size : sizes) held.push_back(a().allocate(size, 0, s_));
    for (std::size_t i = 0; i < held.size(); ++i) a().deallocate(held[i], sizes[i], 0, s_);
    if (round == 2) {
      EXPECT_EQ(stats().allocations_device_locked, before.allocations_device_locked);
      EXPECT_EQ(stats().frees_device_locked, before.frees_device_locked);
      EXPECT_EQ(stats().hot_list_flushes, before.hot_list_flushes);
    }
    ASSERT_NO_THROW(a().validate());
  }
}

// A large request the hot list does not serve merges the stream's large hot blocks into the free lists
// before the best fit, which then splits the merged free memory as PyTorch's allocator would (its best
// fit sees every free block): the 6 MiB block and the rest of its 20 MiB segment serve 5 MiB from the
// segment's start, and no new segment is reserved.
TEST_F(HotLists, ALargeMissMergesTheStreamsLargeHotBlocksBeforeTheBestFit) {
  void* big = a().allocate(6 * MiB, 0, s_);
  a().deallocate(big, 6 * MiB, 0, s_);  // hot
  const DeviceStats before = stats();
  void* p = a().allocate(5 * MiB + 1, 0, s_);
  EXPECT_EQ(p, big) << "the merged free memory is split at the segment's start";
  EXPECT_EQ(stats().allocated_bytes[0].current, static_cast<std::int64_t>(5 * MiB + 512));
  EXPECT_EQ(stats().segment[0].current, before.segment[0].current) << "no new segment";
  EXPECT_EQ(stats().hot_list_flushes, before.hot_list_flushes + 1);
  ASSERT_NO_THROW(a().validate());
  a().deallocate(p, 5 * MiB + 1, 0, s_);
  void* q = a().allocate(6 * MiB, 0, s_);
  EXPECT_EQ(q, big);
  EXPECT_EQ(stats().segment[0].current, before.segment[0].current);
  a().deallocate(q, 6 * MiB, 0, s_);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(HotLists, ASmallMissKeepsTheStreamsOtherSizesParked) {
  void* p = a().allocate(4096, 0, s_);
  a().deallocate(p, 4096, 0, s_);
  const std::int64_t flushes = stats().hot_list_flushes;
  void* q = a().allocate(8192, 0, s_);  // a miss the segment's rest serves
  EXPECT_EQ(stats().hot_list_flushes, flushes) << "nothing flushed";
  void* r = a().allocate(4096, 0, s_);
  EXPECT_EQ(r, p) << "the hot block is still there";
  a().deallocate(q, 8192, 0, s_);
  a().deallocate(r, 4096, 0, s_);
  ASSERT_NO_THROW(a().validate());
}

}  // namespace
}  // namespace streamalloc
