// Stats: the Stat arithmetic and the two serializations (PyTorch's flat memory_stats() keys and the
// JSON with the stream stats).
#include "streamalloc/stats.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace streamalloc {
namespace {

TEST(StatsStat, IncreaseDecreaseTrackPeakAndTotals) {
  Stat stat;
  stat.increase(10);
  stat.increase(5);
  stat.decrease(12);
  stat.increase(4);
  EXPECT_EQ(stat.current, 7);
  EXPECT_EQ(stat.peak, 15);
  EXPECT_EQ(stat.allocated, 19);
  EXPECT_EQ(stat.freed, 12);
}

TEST(StatsStat, ResetPeakAndAccumulated) {
  Stat stat;
  stat.increase(100);
  stat.decrease(60);
  stat.reset_peak();
  EXPECT_EQ(stat.peak, 40) << "peak restarts from the current value";
  stat.increase(10);
  EXPECT_EQ(stat.peak, 50);
  stat.reset_accumulated();
  EXPECT_EQ(stat.allocated, 0);
  EXPECT_EQ(stat.freed, 0);
  EXPECT_EQ(stat.current, 50) << "current is not history";
  EXPECT_EQ(stat.peak, 50);
}

// The key set of torch.cuda.memory_stats() (PyTorch 2.11, torch/csrc/cuda/Module.cpp).
TEST(StatsFlat, HasPyTorchMemoryStatsKeys) {
  const auto flat = DeviceStats{}.flat();
  const char* pool_stats[] = {"allocation",      "segment",        "active",       "inactive_split",
                              "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                              "requested_bytes"};
  for (const char* name : pool_stats) {
    for (const char* pool : {"all", "small_pool", "large_pool"}) {
      for (const char* metric : {"current", "peak", "allocated", "freed"}) {
        const std::string key = std::string(name) + "." + pool + "." + metric;
        EXPECT_EQ(flat.count(key), 1u) << key;
      }
    }
  }
  for (const char* key :
       {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
        "max_split_size", "oversize_allocations.current", "oversize_allocations.peak", "oversize_allocations.allocated",
        "oversize_allocations.freed", "oversize_segments.current", "oversize_segments.peak",
        "oversize_segments.allocated", "oversize_segments.freed"}) {
    EXPECT_EQ(flat.count(key), 1u) << key;
  }
  EXPECT_EQ(flat.size(), 9u * 3u * 4u + 5u + 8u + 1u) << "no extra keys";
  EXPECT_EQ(flat.count("record_stream_calls"), 0u) << "stream stats are not memory_stats() keys";
}

TEST(StatsFlat, ValuesComeFromTheRightFields) {
  DeviceStats stats;
  stats.allocated_bytes[static_cast<int>(SizeClass::kAggregate)].increase(3 * MiB);
  stats.allocated_bytes[static_cast<int>(SizeClass::kLarge)].increase(2 * MiB);
  stats.allocated_bytes[static_cast<int>(SizeClass::kSmall)].increase(MiB);
  stats.allocated_bytes[static_cast<int>(SizeClass::kSmall)].decrease(512);
  stats.segment[static_cast<int>(SizeClass::kLarge)].increase(2);
  stats.num_ooms = 3;
  stats.num_device_free = 4;
  stats.oversize_allocations.increase(7);
  stats.oversize_allocations.decrease(1);
  stats.oversize_segments.increase(2);
  stats.max_split_size = -1;
  const auto flat = stats.flat();
  EXPECT_EQ(flat.at("allocated_bytes.all.current"), static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(flat.at("allocated_bytes.large_pool.peak"), static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(flat.at("allocated_bytes.small_pool.current"), static_cast<std::int64_t>(MiB - 512));
  EXPECT_EQ(flat.at("allocated_bytes.small_pool.freed"), 512);
  EXPECT_EQ(flat.at("segment.large_pool.allocated"), 2);
  EXPECT_EQ(flat.at("segment.small_pool.allocated"), 0);
  EXPECT_EQ(flat.at("num_ooms"), 3);
  EXPECT_EQ(flat.at("num_device_free"), 4);
  EXPECT_EQ(flat.at("oversize_allocations.current"), 6);
  EXPECT_EQ(flat.at("oversize_allocations.peak"), 7);
  EXPECT_EQ(flat.at("oversize_allocations.freed"), 1);
  EXPECT_EQ(flat.at("oversize_segments.current"), 2);
  EXPECT_EQ(flat.at("max_split_size"), -1);
}

TEST(StatsJson, HoldsMemoryStatsAndStreamStats) {
  DeviceStats stats;
  stats.reserved_bytes[0].increase(20 * MiB);
  stats.record_stream_calls = 7;
  stats.record_stream_duplicate = 2;
  stats.fences_recorded = 5;
  stats.invalid_frees = 1;
  stats.pending_blocks.increase(3);
  stats.pending_blocks.decrease(1);
  stats.pending_bytes.increase(4096);
  stats.free_to_reusable_us[0] = 11;
  stats.free_to_reusable_us[kLatencyBucketUs.size() - 1] = 2;
  const Stream big_stream = 0xFFFF'FFFF'FFFF'0000ULL;  // cudaStream_t values are pointers
  stats.per_stream[big_stream].pending_blocks.increase(2);
  stats.per_stream[big_stream].pending_bytes.increase(1024);
  stats.per_stream[0].pending_blocks.increase(1);

  const nlohmann::json json = nlohmann::json::parse(stats.to_json());
  const auto& memory = json.at("memory_stats");
  EXPECT_EQ(memory.size(), stats.flat().size());
  EXPECT_EQ(memory.at("reserved_bytes.all.current").get<std::int64_t>(), static_cast<std::int64_t>(20 * MiB));

  const auto& streams = json.at("stream_stats");
  EXPECT_EQ(streams.at("record_stream_calls").get<std::int64_t>(), 7);
  EXPECT_EQ(streams.at("record_stream_duplicate").get<std::int64_t>(), 2);
  EXPECT_EQ(streams.at("fences_recorded").get<std::int64_t>(), 5);
  EXPECT_EQ(streams.at("invalid_frees").get<std::int64_t>(), 1);
  EXPECT_EQ(streams.at("cross_stream_reuse_waited").get<std::int64_t>(), 0);
  EXPECT_EQ(streams.at("pending_blocks").at("current").get<std::int64_t>(), 2);
  EXPECT_EQ(streams.at("pending_blocks").at("peak").get<std::int64_t>(), 3);
  EXPECT_EQ(streams.at("pending_blocks").at("freed").get<std::int64_t>(), 1);
  EXPECT_EQ(streams.at("pending_bytes").at("allocated").get<std::int64_t>(), 4096);

  const auto& histogram = streams.at("free_to_reusable_us");
  ASSERT_EQ(histogram.size(), kLatencyBucketUs.size());
  EXPECT_EQ(histogram[0].at("below_us").get<std::int64_t>(), 10);
  EXPECT_EQ(histogram[0].at("count").get<std::int64_t>(), 11);
  EXPECT_TRUE(histogram.back().at("below_us").is_null()) << "the last bucket is open-ended";
  EXPECT_EQ(histogram.back().at("count").get<std::int64_t>(), 2);

  const auto& per_stream = streams.at("per_stream");
  ASSERT_EQ(per_stream.size(), 2u);
  EXPECT_EQ(per_stream[0].at("stream").get<Stream>(), 0u);
  EXPECT_EQ(per_stream[0].at("pending_blocks").at("current").get<std::int64_t>(), 1);
  EXPECT_EQ(per_stream[1].at("stream").get<Stream>(), big_stream) << "stream values survive unrounded";
  EXPECT_EQ(per_stream[1].at("pending_bytes").at("peak").get<std::int64_t>(), 1024);
}

TEST(StatsJson, EveryStreamCountIsSerialized) {
  DeviceStats stats;
  std::int64_t value = 1;
#define STREAMALLOC_TEST_SET(name, help) stats.name = value++;
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_TEST_SET)
#undef STREAMALLOC_TEST_SET
  const nlohmann::json streams = nlohmann::json::parse(stats.to_json()).at("stream_stats");
  std::int64_t expected = 1;
#define STREAMALLOC_TEST_CHECK(name, help) EXPECT_EQ(streams.at(#name).get<std::int64_t>(), expected++) << #name;
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_TEST_CHECK)
#undef STREAMALLOC_TEST_CHECK
  EXPECT_EQ(streams.size(), static_cast<std::size_t>(expected - 1) + 4u)
      << "the counts plus pending_blocks, pending_bytes, free_to_reusable_us, per_stream";
}

// A stream's path counts join its per_stream entry; a stream without pending stats gets zero ones, so
// that every entry has the same keys.
TEST(StatsJson, PerStreamCountsJoinTheStreamsEntry) {
  DeviceStats stats;
  stats.per_stream[7].pending_blocks.increase(1);
  stats.per_stream_counts[7].allocations_cached = 5;
  stats.per_stream_counts[9].allocations_device_locked = 2;
  stats.per_stream_counts[9].hot_list_flushes = 1;
  const auto per_stream = nlohmann::json::parse(stats.to_json()).at("stream_stats").at("per_stream");
  ASSERT_EQ(per_stream.size(), 2u);
  EXPECT_EQ(per_stream[0].at("stream").get<Stream>(), 7u);
  EXPECT_EQ(per_stream[0].at("pending_blocks").at("current").get<std::int64_t>(), 1);
  EXPECT_EQ(per_stream[0].at("allocations_cached").get<std::int64_t>(), 5);
  EXPECT_EQ(per_stream[1].at("stream").get<Stream>(), 9u);
  EXPECT_EQ(per_stream[1].at("pending_bytes").at("current").get<std::int64_t>(), 0);
  EXPECT_EQ(per_stream[1].at("allocations_device_locked").get<std::int64_t>(), 2);
  EXPECT_EQ(per_stream[1].at("hot_list_flushes").get<std::int64_t>(), 1);
}

}  // namespace
}  // namespace streamalloc
