// The model of PyTorch's caching allocator, rule by rule, and the engine on small event lists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "streamalloc_planner/events.hpp"
#include "streamalloc_planner/plan.hpp"
#include "streamalloc_planner/torch_model.hpp"

namespace streamalloc::planner {
namespace {

constexpr std::size_t MiB = 1024 * 1024;

TEST(TorchModel, RoundsTo512Bytes) {
  TorchConfig c;
  EXPECT_EQ(torch_round_size(1, c), 512u);
  EXPECT_EQ(torch_round_size(512, c), 512u);
  EXPECT_EQ(torch_round_size(513, c), 1024u);
  EXPECT_EQ(torch_round_size(3 * MiB + 1, c), 3 * MiB + 512);
}

TEST(TorchModel, RoundsToPowerOfTwoDivisions) {
  TorchConfig c = TorchConfig::parse("roundup_power2_divisions:4");
  // 1.2 GiB-ish example: between 1 MiB and 2 MiB four divisions are 256 KiB apart.
  EXPECT_EQ(torch_round_size(MiB + 1, c), MiB + 256 * 1024);
  EXPECT_EQ(torch_round_size(MiB + 300 * 1024, c), MiB + 512 * 1024);
  EXPECT_EQ(torch_round_size(4 * MiB, c), 4 * MiB);  // a power of two stays
  EXPECT_EQ(torch_round_size(1000, c), 1024u);       // small sizes keep the 512 B rule
  TorchConfig per = TorchConfig::parse("roundup_power2_divisions:[2:1,>:8]");
  EXPECT_EQ(torch_round_size(MiB + 1, per), MiB + 512);    // below 2 MiB: off (1)
  EXPECT_EQ(torch_round_size(8 * MiB + 1, per), 9 * MiB);  // above: 8 divisions
  EXPECT_THROW(TorchConfig::parse("roundup_power2_divisions:3"), std::invalid_argument);
  EXPECT_THROW(TorchConfig::parse("roundup_power2_divisions:[3:1]"), std::invalid_argument);
  EXPECT_THROW(TorchConfig::parse("garbage_collection_threshold:0.5"), std::invalid_argument);
  EXPECT_THROW(TorchConfig::parse("expandable_segments:maybe"), std::invalid_argument);
}

TEST(TorchModel, SegmentSizesBySizeClass) {
  EXPECT_EQ(torch_segment_size(512), 2 * MiB);
  EXPECT_EQ(torch_segment_size(MiB), 2 * MiB);
  EXPECT_EQ(torch_segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(torch_segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(torch_segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(torch_segment_size(11 * MiB + 1), 12 * MiB);
}

TEST(TorchModel, SmallAndLargePoolsAreSeparate) {
  TorchModel m(TorchConfig{});
  ASSERT_TRUE(m.malloc(0, 1000, 0));
  EXPECT_EQ(m.reserved(), 2 * MiB);
  ASSERT_TRUE(m.malloc(1, 2 * MiB, 0));  // large: its own 20 MiB segment, not the small one's rest
  EXPECT_EQ(m.reserved(), 22 * MiB);
  ASSERT_TRUE(m.malloc(2, 4000, 0));  // small: fits in the first segment's remainder
  EXPECT_EQ(m.reserved(), 22 * MiB);
  EXPECT_EQ(m.device_allocs(), 2u);
}

TEST(TorchModel, SplitsOnlyWhenEnoughRemains) {
  TorchModel m(TorchConfig{});
  ASSERT_TRUE(m.malloc(0, 19 * MiB + 512, 0));  // 20 MiB segment, 511.5 KiB left: not split
  EXPECT_EQ(m.block_of(0).second, 20 * MiB);
  EXPECT_EQ(m.allocated(), 20 * MiB);
  ASSERT_TRUE(m.malloc(1, 6 * MiB, 0));  // new 20 MiB segment, 14 MiB left: split
  EXPECT_EQ(m.block_of(1).second, 6 * MiB);
  ASSERT_TRUE(m.malloc(2, 6 * MiB, 0));  // served by the remainder
  EXPECT_EQ(m.reserved(), 40 * MiB);
  EXPECT_EQ(m.block_of(2).first, m.block_of(1).first + 6 * MiB);
}

TEST(TorchModel, BestFitAndMergeOfNeighbours) {
  TorchModel m(TorchConfig{});
  ASSERT_TRUE(m.malloc(0, 4 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 4 * MiB, 0));
  ASSERT_TRUE(m.malloc(2, 4 * MiB, 0));
  m.free(0);
  m.free(1);                            // merges with block 0: 8 MiB free
  EXPECT_EQ(m.free_blocks(false), 2u);  // the merged 8 MiB and the 8 MiB tail
  ASSERT_TRUE(m.malloc(3, 8 * MiB, 0));
  EXPECT_EQ(m.block_of(3).first, m.block_of(2).first - 8 * MiB);  // lowest address of equal sizes
  EXPECT_EQ(m.reserved(), 20 * MiB);
}

TEST(TorchModel, SegmentsGoWhereTheRecordedDevicePutThem) {
  // The recorded device put the second 12 MiB segment below the first: best fit among the two equal free
  // segments then takes the second, as PyTorch did.
  TorchModel m(TorchConfig{});
  m.follow_placements({{0, 12 * MiB, 0x7f0000c00000}, {1, 12 * MiB, 0x7f0000000000}, {2, 20 * MiB, 0x7f0002000000}});
  ASSERT_TRUE(m.malloc(0, 12 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 12 * MiB, 0));
  EXPECT_EQ(m.block_of(0).first, 0x7f0000c00000u);
  EXPECT_EQ(m.block_of(1).first, 0x7f0000000000u);
  m.free(0);
  m.free(1);
  ASSERT_TRUE(m.malloc(2, 12 * MiB, 0));
  EXPECT_EQ(m.block_of(2).first, 0x7f0000000000u);
  // A size the device never placed goes above every placement; so does one whose range is taken.
  ASSERT_TRUE(m.malloc(3, 30 * MiB, 0));
  EXPECT_GT(m.block_of(3).first, 0x7f0002000000u);
}

TEST(TorchModel, APlacementOverlappingALiveSegmentIsPassedOver) {
  TorchModel m(TorchConfig{});
  m.follow_placements(
      {{0, 20 * MiB, 0x7f0000000000}, {1, 20 * MiB, 0x7f0000000000 + 10 * MiB}, {2, 20 * MiB, 0x7f0004000000}});
  ASSERT_TRUE(m.malloc(0, 20 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 20 * MiB, 0));  // the second placement overlaps the first segment: the third
  EXPECT_EQ(m.block_of(0).first, 0x7f0000000000u);
  EXPECT_EQ(m.block_of(1).first, 0x7f0004000000u);
}

TEST(TorchModel, MaxSplitSizeKeepsOversizeBlocksWhole) {
  TorchModel m(TorchConfig::parse("max_split_size_mb:40"));
  ASSERT_TRUE(m.malloc(0, 50 * MiB, 0));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 30 * MiB, 0));  // below the limit: the 50 MiB block is not used
  EXPECT_EQ(m.reserved(), 80 * MiB);
  m.free(1);
  ASSERT_TRUE(m.malloc(2, 45 * MiB, 0));  // at or above: reused, less than 20 MiB larger
  EXPECT_EQ(m.reserved(), 80 * MiB);
  EXPECT_EQ(m.block_of(2).second, 50 * MiB);  // not split
  m.free(2);
  ASSERT_TRUE(m.malloc(3, 42 * MiB, 0));
  ASSERT_TRUE(m.malloc(4, 42 * MiB, 0));  // the 30 MiB block is too small, 50 taken: new segment
  EXPECT_EQ(m.reserved(), 122 * MiB);
  TorchModel wider(TorchConfig::parse("max_split_size_mb:40,max_non_split_rounding_mb:64"));
  ASSERT_TRUE(wider.malloc(0, 100 * MiB, 0));
  wider.free(0);
  ASSERT_TRUE(wider.malloc(1, 45 * MiB, 0));  // 55 MiB larger: within 64 MiB
  EXPECT_EQ(wider.reserved(), 100 * MiB);
  EXPECT_THROW(TorchConfig::parse("max_non_split_rounding_mb:10"), std::invalid_argument);
  TorchModel unlimited(TorchConfig{});
  ASSERT_TRUE(unlimited.malloc(0, 50 * MiB, 0));
  unlimited.free(0);
  ASSERT_TRUE(unlimited.malloc(1, 30 * MiB, 0));  // without the limit it splits the 50 MiB block
  EXPECT_EQ(unlimited.reserved(), 50 * MiB);
}

TEST(TorchModel, BlocksAreReusedOnlyByTheirStream) {
  TorchModel m(TorchConfig{});
  ASSERT_TRUE(m.malloc(0, 8 * MiB, 0));
  m.free(0);
  ASSERT_TRUE(m.malloc(1, 8 * MiB, 1));
  EXPECT_EQ(m.reserved(), 40 * MiB);
  m.free(1);
  ASSERT_TRUE(m.malloc(2, 8 * MiB, 0));
  EXPECT_EQ(m.reserved(), 40 * MiB);
}

TEST(TorchModel, RecordStreamKeepsTheBlockUntilItsEventsComplete) {
  TorchModel m(TorchConfig{});
  ASSERT_TRUE(m.malloc(0, 8 * MiB, 0));
  m.record_stream(0, 1);
  m.free(0);
  EXPECT_EQ(m.pending_blocks(), 1u);
  ASSERT_TRUE(m.malloc(1, 20 * MiB, 0, /*complete_pending=*/false));  // a whole segment: needs a new one
  EXPECT_EQ(m.reserved(), 40 * MiB);
  m.complete(0);
  EXPECT_EQ(m.pending_blocks(), 0u);
  ASSERT_TRUE(m.malloc(2, 8 * MiB, 0, false));  // reuses the completed block
  EXPECT_EQ(m.reserved(), 40 * MiB);
  // Without recorded completions, the next malloc completes pending blocks first.
  TorchModel eager(TorchConfig{});
  ASSERT_TRUE(eager.malloc(0, 8 * MiB, 0));
  eager.record_stream(0, 1);
  eager.free(0);
  ASSERT_TRUE(eager.malloc(1, 8 * MiB, 0));
  EXPECT_EQ(eager.reserved(), 20 * MiB);
}

TEST(TorchModel, ExpandableSegmentsGrowOneSegmentByPages) {
  TorchModel m(TorchConfig::parse("expandable_segments:True"), 0, true);
  ASSERT_TRUE(m.malloc(0, 30 * MiB, 0));
  EXPECT_EQ(m.reserved(), 40 * MiB);      // two 20 MiB pages
  ASSERT_TRUE(m.malloc(1, 30 * MiB, 0));  // 10 MiB left mapped, 20 more mapped
  EXPECT_EQ(m.reserved(), 60 * MiB);
  EXPECT_EQ(m.block_of(1).first, m.block_of(0).first + 30 * MiB);  // the same address range
  ASSERT_TRUE(m.malloc(2, 1000, 0));                               // small size class: its own range, 2 MiB pages
  EXPECT_EQ(m.reserved(), 62 * MiB);
  ASSERT_TRUE(m.malloc(3, 30 * MiB, 1));  // another stream: another range
  EXPECT_EQ(m.reserved(), 102 * MiB);
  const auto& ev = m.segment_events();
  ASSERT_FALSE(ev.empty());
  for (const auto& e : ev) EXPECT_EQ(e.action, 'm');
}

TEST(TorchModel, CapFailsAfterReleasingCachedSegments) {
  TorchModel m(TorchConfig{}, 60 * MiB, true);
  ASSERT_TRUE(m.malloc(0, 20 * MiB, 0));
  ASSERT_TRUE(m.malloc(1, 20 * MiB, 0));
  m.free(0);
  ASSERT_TRUE(m.malloc(2, 30 * MiB, 0));  // 70 MiB would exceed: the free 20 MiB segment goes first
  EXPECT_EQ(m.reserved(), 50 * MiB);
  EXPECT_EQ(m.segment_events()[2].action, 'f');
  EXPECT_FALSE(m.malloc(3, 12 * MiB, 0));  // 62 MiB: no cached segment left to release
  EXPECT_EQ(m.reserved(), 50 * MiB);
}

TEST(Events, ParsesAndRejectsBadLines) {
  EventList list = parse_events("#streamalloc-plan v1 completions=1\na 5 100 7\nr 5 9\nf 5\nc 5\na 5 10 7\n");
  EXPECT_TRUE(list.explicit_completions);
  EXPECT_EQ(list.events.size(), 5u);
  EXPECT_EQ(list.streams, 2u);
  EXPECT_EQ(list.allocs, 2u);
  EXPECT_THROW(parse_events("hello\n"), std::runtime_error);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\nf 1\n"), std::runtime_error);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\na 1 10 0\na 1 10 0\n"), std::runtime_error);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\na 1 x 0\n"), std::runtime_error);
}

TEST(Events, DeviceLinesArePlacementsNotEvents) {
  EventList list = parse_events("#streamalloc-plan v1\nd 2097152 4096\na 1 10 0\nd 20971520 8192\nf 1\n");
  ASSERT_EQ(list.events.size(), 2u);
  ASSERT_EQ(list.placements.size(), 2u);
  EXPECT_EQ(list.placements[0].event, 0u);
  EXPECT_EQ(list.placements[0].size, 2097152u);
  EXPECT_EQ(list.placements[1].event, 1u);
  EXPECT_EQ(list.placements[1].address, 8192u);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\nd 0 4096\n"), std::runtime_error);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\nd 4096\n"), std::runtime_error);
}

TEST(Events, TimeLinesDateTheEventsAfterThem) {
  EventList list = parse_events("#streamalloc-plan v1\na 1 10 0\nt 5\na 2 10 0\nt 5\nt 9\nf 1\n");
  EXPECT_TRUE(list.timed);
  ASSERT_EQ(list.events.size(), 3u) << "t lines are not events";
  EXPECT_EQ(list.events[0].time_us, 0u);
  EXPECT_EQ(list.events[1].time_us, 5u);
  EXPECT_EQ(list.events[2].time_us, 9u);
  EXPECT_FALSE(parse_events("#streamalloc-plan v1\na 1 10 0\n").timed);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\nt 9\nt 8\na 1 10 0\n"), std::runtime_error);
  EXPECT_THROW(parse_events("#streamalloc-plan v1\nt x\na 1 10 0\n"), std::runtime_error);
}

PlanRequest streamalloc_only() {
  PlanRequest request;
  request.settings = {{"streamalloc", "streamalloc", ""}};
  return request;
}

// A block freed with a use on another stream and completed (c) lets only the fences recorded up to
// its free complete: a block freed after it stays pending, though the miss of allocation 5 recorded its
// fence before the completion, so the second allocation after the completion needs a new segment. Both
// with the job's clock (t lines) and without.
TEST(Plan, CompletionRunsTheStreamsOnlyAsFarAsTheFree) {
  for (const std::string time : {"", "t 100\n"}) {
    const std::string size = std::to_string(12 * MiB);
    const std::string text = "#streamalloc-plan v1 completions=1\n" + time + "a 1 " + size + " 0\na 2 " + size +
                             " 0\nr 1 1\nr 2 1\nf 1\nf 2\na 5 " + size + " 0\nc 1\na 3 " + size + " 0\na 4 " + size +
                             " 0\n";
    nlohmann::json report = nlohmann::json::parse(plan_json(parse_events(text), streamalloc_only()));
    EXPECT_EQ(report["settings"][0]["peak_reserved"].get<std::size_t>(), 48 * MiB)
        << "the first free's block is reused, the second's is still pending (" << (time.empty() ? "un" : "")
        << "timed)";
  }
}

// With t lines the allocator runs on the job's clock: while a block is pending, the allocation path
// polls its fences once per tick of the coarse clock that has not polled yet, so allocations a second
// apart each poll, and allocations in the tick of the free (whose fence pass polled) do not.
TEST(Plan, TimeLinesPaceTheAllocatorsPolls) {
  const auto queries = [](bool spread) {
    std::string text = "#streamalloc-plan v1 completions=1\nt 0\na 0 512 0\na 1 4096 0\nr 1 1\nf 1\n";
    for (int i = 0; i < 5; ++i) {
      if (spread) text += "t " + std::to_string((i + 1) * 1'000'000) + "\n";
      text += "a " + std::to_string(10 + i) + " 1024 0\n";
    }
    nlohmann::json report = nlohmann::json::parse(plan_json(parse_events(text), streamalloc_only()));
    return report["settings"][0]["fence_queries"].get<std::size_t>();
  };
  const std::size_t flat = queries(false);
  const std::size_t spread = queries(true);
  EXPECT_EQ(flat, 0u) << "the free's fence pass polled in this tick";
  EXPECT_EQ(spread - flat, 5u) << "each of the five allocations, a second apart, polls once";
}

TEST(Plan, ReportsEverySettingAndTheCapFailurePoint) {
  std::string text = "#streamalloc-plan v1\n";
  for (int i = 0; i < 20; ++i) text += "a " + std::to_string(i) + " " + std::to_string(30 * MiB) + " 0\n";
  EventList list = parse_events(text);
  PlanRequest request;
  request.cap_bytes = 300 * MiB;
  nlohmann::json report = nlohmann::json::parse(plan_json(list, request));
  ASSERT_EQ(report["settings"].size(), 4u);
  const auto& torch = report["settings"][0];
  EXPECT_EQ(torch["peak_reserved"].get<std::size_t>(), 600 * MiB);
  EXPECT_FALSE(torch["fits"].get<bool>());
  EXPECT_EQ(torch["first_failure"]["alloc"].get<std::size_t>(), 10u);  // the 11th 30 MiB block
  EXPECT_FALSE(report["recommendation"].get<std::string>().empty());
  request.settings = {{"bad", "pytorch", "max_split_size_mb:x"}};
  EXPECT_THROW(plan_json(list, request), std::invalid_argument);
}

}  // namespace
}  // namespace streamalloc::planner
