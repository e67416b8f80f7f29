// CacheReport on its own (cache_report.hpp): the segments, pools and cached free bytes as the blocks
// say, the diagnosis of a bad free, and the out-of-memory message, read from the components alone.
#include <gtest/gtest.h>

#include <string>

#include "cache_parts.hpp"
#include "cache_report.hpp"
#include "pool_set.hpp"
#include "segment_source.hpp"

namespace streamalloc {
namespace {

using test::CacheParts;
using test::DeviceCall;

struct ReportParts : CacheParts {
  ReportParts() : segments(sim, 0), pools(0, options.cross_stream_reuse) {}
  ~ReportParts() {
    for (Segment* segment : segments.all()) {
      while (segment->head->next != nullptr) segment->head = FreeLists::merge(segment->head, segment->head->next);
      segment->head->state = BlockState::kFree;
      segments.release(segment);
    }
  }
  CacheReport report() const { return CacheReport(0, options, sim, segments, pools, shards, ledger); }
  SegmentSource segments;
  PoolSet pools;
};

TEST(CacheReport, SegmentsPoolsAndCachedBytesFollowTheBlocks) {
  ReportParts parts;
  const Stream s = parts.sim.create_stream(0);
  Segment* segment = parts.segments.reserve(SizeClass::kSmall, &parts.pools.default_pool(), 2 * MiB, s);
  ASSERT_NE(segment, nullptr);
  Block* live = segment->head;
  Block* rest = split_block(live, 4096);
  live->state = BlockState::kAllocated;
  live->requested = 4000;
  live->stream = s;
  parts.pools.default_pool().free.insert(rest);
  DeviceCall call(parts.shards);
  const CacheReport report = parts.report();

  const std::vector<SegmentInfo> segments = report.segments(Clock::now());
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].total_size, 2 * MiB);
  EXPECT_EQ(segments[0].allocated_size, 4096u);
  EXPECT_EQ(segments[0].requested_size, 4000u);
  ASSERT_EQ(segments[0].blocks.size(), 2u);
  EXPECT_EQ(segments[0].blocks[0].state, BlockInfo::State::kAllocated);

  const std::vector<PoolInfo> pools = report.pools();
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_TRUE(pools[0].id.is_default());
  EXPECT_EQ(pools[0].segments, 1u);
  EXPECT_EQ(pools[0].live_blocks, 1u);
  EXPECT_EQ(pools[0].reserved_bytes, 2 * MiB);

  std::size_t largest = 0;
  std::size_t total = 0;
  report.cache_info(&largest, &total);
  EXPECT_EQ(largest, 2 * MiB - 4096);
  EXPECT_EQ(total, 2 * MiB - 4096);
  parts.pools.default_pool().free.erase(rest);

  try {
    report.throw_bad_free(reinterpret_cast<void*>(rest->address), "free");
    FAIL() << "a free block is a double free";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  try {
    report.throw_bad_free(reinterpret_cast<void*>(live->address + 512), "free");
    FAIL() << "an interior pointer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("512 bytes inside"), std::string::npos) << e.what();
  }
  EXPECT_THROW(report.throw_bad_free(reinterpret_cast<void*>(0x10), "free"), Error) << "a foreign pointer";
}

TEST(CacheReport, TheOutOfMemoryMessageSaysWhatTheCacheHoldsAndWhatToDo) {
  ReportParts parts;
  DeviceCall call(parts.shards);
  const CacheReport report = parts.report();
  DeviceMemoryInfo info;
  info.total_bytes = 8 * MiB;
  info.free_bytes = 1 * MiB;
  const std::string oom = report.out_of_memory(4 * MiB, 4 * MiB, 0x10, info, 0.5, 4 * MiB, 8 * MiB);
  EXPECT_EQ(oom.rfind("Simulated device out of memory. Tried to allocate", 0), 0u) << oom;
  EXPECT_NE(oom.find("memory fraction cap 0.5"), std::string::npos) << oom;
  EXPECT_NE(oom.find("What to do"), std::string::npos) << oom;
  const std::string larger = report.out_of_memory(16 * MiB, 16 * MiB, 0x10, info, 1.0, 8 * MiB, 8 * MiB);
  EXPECT_NE(larger.find("larger than the device's total memory"), std::string::npos) << larger;
  const std::string beyond = report.out_of_memory(std::size_t{1} << 61, 0, 0x10, info, 1.0, 8 * MiB, 8 * MiB);
  EXPECT_NE(beyond.find("more than 1EB"), std::string::npos) << beyond;
}

}  // namespace
}  // namespace streamalloc
