// The settings PyTorch changes at runtime (torch.cuda.memory._set_allocator_settings), on the simulated
// device: the rounding table of roundup_power2_divisions, expandable segments for new segments, and
// graph_capture_record_stream_reuse (a block freed in a capture with uses is reused once its streams
// have joined).
#include <gtest/gtest.h>

#include <algorithm>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

constexpr PoolId kGraphPool{9, 0};

std::int64_t allocated_now(SimSetup& s) { return s.stats().allocated_bytes[0].current; }

// The bytes a request of `size` occupies under the allocator's current rounding.
std::int64_t occupies(SimSetup& s, std::size_t size, Stream stream) {
  const std::int64_t before = allocated_now(s);
  void* p = s.a().allocate(size, 0, stream);
  const std::int64_t bytes = allocated_now(s) - before;
  s.a().deallocate(p, 0, 0, stream);
  return bytes;
}

RoundupDivisions table_of(std::initializer_list<std::size_t> entries) {
  RoundupDivisions table{};
  std::copy(entries.begin(), entries.end(), table.begin());
  return table;
}

TEST(RuntimeSettings, RoundingFollowsTheTablePerPowerOfTwoInterval) {
  SimSetup s("", SimBackend::Mode::kEager, 1 * GiB);
  const Stream a = s.sim->create_stream();
  const std::size_t kBetween1And2MiB = 1200 * KiB;   // interval 0
  const std::size_t kBetween4And8MiB = 5 * MiB + 1;  // interval 2
  EXPECT_EQ(occupies(s, kBetween1And2MiB, a), 1200 * 1024) << "512-byte multiples by default";
  EXPECT_EQ(s.a().roundup_power2_divisions(), RoundupDivisions{});

  RoundupDivisions four;
  four.fill(4);
  s.a().set_roundup_power2_divisions(four);
  EXPECT_EQ(occupies(s, kBetween1And2MiB, a), 1280 * 1024) << "steps of 256 KiB between 1 and 2 MiB";
  EXPECT_EQ(occupies(s, kBetween4And8MiB, a), 6 * 1024 * 1024) << "steps of 1 MiB between 4 and 8 MiB";

  // PyTorch's [2:8,>:1]: 8 divisions up to the interval of 2 MiB (intervals 0 and 1), 1 above it.
  s.a().set_roundup_power2_divisions(table_of({8, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(occupies(s, kBetween1And2MiB, a), 1280 * 1024) << "steps of 128 KiB";
  EXPECT_EQ(occupies(s, 2 * MiB + 1, a), static_cast<std::int64_t>(2 * MiB + 256 * KiB)) << "steps of 256 KiB";
  EXPECT_EQ(occupies(s, kBetween4And8MiB, a), static_cast<std::int64_t>(5 * MiB + 512)) << "1: 512 bytes";

  // Below kMinBlockSize * divisions a request keeps 512-byte rounding, as in PyTorch.
  s.a().set_roundup_power2_divisions(RoundupDivisions{});
  EXPECT_EQ(occupies(s, kBetween1And2MiB, a), 1200 * 1024) << "back to 512-byte multiples";
  s.a().validate();
}

TEST(RuntimeSettings, ARefusedRoundingTableChangesNothing) {
  SimSetup s("roundup_power2_divisions:4", SimBackend::Mode::kEager);
  const RoundupDivisions before = s.a().roundup_power2_divisions();
  EXPECT_EQ(before[0], 4u) << "the option gives the first table";
  try {
    s.a().set_roundup_power2_divisions(table_of({2, 3}));
    FAIL() << "3 divisions were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.a().roundup_power2_divisions(), before);
}

TEST(RuntimeSettings, ExpandableSegmentsSwitchForNewSegments) {
  SimSetup s("", SimBackend::Mode::kEager, 1 * GiB);
  const Stream a = s.sim->create_stream();
  auto expandable_count = [&] {
    int n = 0;
    for (const SegmentInfo& seg : s.a().segments(0)) n += seg.expandable ? 1 : 0;
    return n;
  };
  EXPECT_FALSE(s.a().expandable_segments());
  void* fixed = s.a().allocate(1 * MiB, 0, a);
  EXPECT_EQ(expandable_count(), 0);

  s.a().set_expandable_segments(true);
  EXPECT_TRUE(s.a().expandable_segments());
  void* grown = s.a().allocate(30 * MiB, 0, a);
  EXPECT_EQ(expandable_count(), 1) << "the next segment is expandable";
  EXPECT_EQ(s.a().segments(0).size(), 2u) << "the fixed segment stays";

  s.a().set_expandable_segments(false);
  void* later = s.a().allocate(40 * MiB, 0, a);
  EXPECT_EQ(expandable_count(), 1) << "off: the new segment is fixed, the expandable one stays";
  EXPECT_EQ(s.a().segments(0).size(), 3u);
  s.a().validate();
  for (void* p : {fixed, grown, later}) s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  EXPECT_EQ(s.a().segments(0).size(), 0u) << "segments of either kind go back";
  s.a().validate();
}

// PyTorch's test_max_split_expandable and test_garbage_collect_expandable: segments of both kinds under
// a memory cap, switched between allocations; once freed, they make room for one allocation of all.
TEST(RuntimeSettings, SegmentsOfBothKindsGiveTheirMemoryBackUnderACap) {
  SimSetup s("", SimBackend::Mode::kEager, 1 * GiB);
  const Stream a = s.sim->create_stream();
  s.a().set_memory_fraction(120.0 / 1024.0, 0);
  s.a().set_expandable_segments(false);
  void* first = s.a().allocate(40 * MiB, 0, a);
  s.a().set_expandable_segments(true);
  void* second = s.a().allocate(40 * MiB, 0, a);
  s.a().set_expandable_segments(false);
  void* third = s.a().allocate(40 * MiB, 0, a);
  EXPECT_THROW(s.a().allocate(40 * MiB, 0, a), Error) << "the cap is reached";
  for (void* p : {first, second, third}) s.a().deallocate(p, 0, 0, a);
  void* all = s.a().allocate(120 * MiB, 0, a);
  EXPECT_NE(all, nullptr);
  s.a().deallocate(all, 0, 0, a);
  s.a().validate();

  s.a().empty_cache();
  first = s.a().allocate(40 * MiB, 0, a);
  s.a().set_expandable_segments(true);
  second = s.a().allocate(40 * MiB, 0, a);
  s.a().deallocate(first, 0, 0, a);
  s.a().deallocate(second, 0, 0, a);
  void* eighty = s.a().allocate(80 * MiB, 0, a);
  EXPECT_NE(eighty, nullptr);
  s.a().deallocate(eighty, 0, 0, a);
  s.a().validate();
}

TEST(RuntimeSettings, PrivatePoolsKeepFixedSegmentsWithExpandableOn) {
  SimSetup s("", SimBackend::Mode::kEager, 1 * GiB);
  const Stream a = s.sim->create_stream();
  s.a().set_expandable_segments(true);
  s.a().create_or_incref_pool(0, kGraphPool);
  s.a().begin_allocate_to_pool(0, kGraphPool, [](Stream) { return true; });
  void* pooled = s.a().allocate(1 * MiB, 0, a);
  s.a().end_allocate_to_pool(0, kGraphPool);
  void* plain = s.a().allocate(1 * MiB, 0, a);
  int expandable = 0;
  for (const SegmentInfo& seg : s.a().segments(0)) expandable += seg.expandable ? 1 : 0;
  EXPECT_EQ(s.a().segments(0).size(), 2u);
  EXPECT_EQ(expandable, 1) << "the default pool's segment alone";
  s.a().deallocate(pooled);
  s.a().deallocate(plain);
  s.a().release_pool(0, kGraphPool);
  s.a().validate();
}

// The test of PyTorch's test_graph_capture_reclaim_2_streams, on the simulated graph: a block of the
// capture stream read on a side stream and freed is not reused before the side stream has joined the
// capture stream, and is reused after.
struct Capture {
  explicit Capture(SimSetup& setup) : s(setup), main(s.sim->create_stream()), side(s.sim->create_stream()) {
    s.a().begin_allocate_to_pool(0, kGraphPool, [this](Stream st) { return s.sim->is_capturing(0, st); });
    s.sim->set_capturing(0, main, true);
  }
  void end() {
    s.sim->set_capturing(0, main, false);
    for (const Stream st : extra) s.sim->set_capturing(0, st, false);
    s.sim->set_capturing(0, side, false);
    s.a().end_allocate_to_pool(0, kGraphPool);
  }
  void kernel(Stream st) {
    s.sim->enqueue(0, st, [] {});
  }
  SimSetup& s;
  Stream main;
  Stream side;
  std::vector<Stream> extra;
};

TEST(RuntimeSettings, CaptureReusesARecordedBlockOnceTheStreamsJoined) {
  SimSetup s("");
  s.a().set_graph_capture_record_stream_reuse(true);
  EXPECT_TRUE(s.a().graph_capture_record_stream_reuse());
  Capture c(s);
  void* sink = s.a().allocate(32, 0, c.main);
  void* data1 = s.a().allocate(32, 0, c.main);
  s.sim->join_capture(0, c.side, c.main);  // side.wait_stream(main)
  void* buf = s.a().allocate(32, 0, c.side);
  c.kernel(c.side);  // reads data1
  s.a().record_stream(data1, c.side);
  s.a().deallocate(data1);
  void* data2 = s.a().allocate(32, 0, c.main);
  EXPECT_NE(data2, data1) << "before the join the side stream may still read it";
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  s.a().validate();

  s.sim->join_capture(0, c.main, c.side);  // main.wait_stream(side)
  c.kernel(c.main);                        // sink.fill_(1.0)
  void* data3 = s.a().allocate(32, 0, c.main);
  EXPECT_EQ(data3, data1) << "after the join the graph orders the read before any later work";
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  EXPECT_EQ(s.sim->counters().capture_violations, 0u);
  EXPECT_EQ(s.sim->counters().event_records, 0u) << "no fence: the graph is the fence";
  s.a().validate();
  c.end();
  for (void* p : {sink, buf, data2, data3}) s.a().deallocate(p);
  s.a().validate();
  s.a().release_pool(0, kGraphPool);
}

TEST(RuntimeSettings, CaptureReuseWaitsForEveryStreamOfTheBlock) {
  // PyTorch's test_graph_capture_reclaim_4_streams: partial joins are not enough.
  SimSetup s("");
  s.a().set_graph_capture_record_stream_reuse(true);
  Capture c(s);
  const Stream s3 = s.sim->create_stream();
  const Stream s4 = s.sim->create_stream();
  c.extra = {s3, s4};
  void* data1 = s.a().allocate(32, 0, c.main);
  c.kernel(c.main);  // torch.ones
  void* sink1 = s.a().allocate(32, 0, c.main);
  void* sink3 = s.a().allocate(32, 0, c.main);
  std::vector<void*> bufs;
  for (const Stream st : {c.side, s3, s4}) {
    s.sim->join_capture(0, st, c.main);
    bufs.push_back(s.a().allocate(32, 0, st));
    c.kernel(st);
    s.a().record_stream(data1, st);
  }
  s.a().deallocate(data1);
  s.sim->join_capture(0, c.main, c.side);  // main joins side alone
  c.kernel(c.main);
  s.sim->join_capture(0, s3, s4);  // s3 joins s4 alone
  c.kernel(s3);
  s.a().record_stream(sink3, s3);
  void* data2 = s.a().allocate(32, 0, c.main);
  EXPECT_NE(data2, data1) << "s3 and s4 have not joined the capture stream yet";
  s.sim->join_capture(0, c.main, s3);
  c.kernel(c.main);
  void* data3 = s.a().allocate(32, 0, c.main);
  EXPECT_EQ(data3, data1);
  s.a().validate();
  c.end();
  for (void* p : {sink1, sink3, data2, data3}) s.a().deallocate(p);
  for (void* p : bufs) s.a().deallocate(p);
  s.a().validate();
  s.a().release_pool(0, kGraphPool);
}

TEST(RuntimeSettings, WithoutReuseACaptureFreeWaitsForTheCaptureEnd) {
  SimSetup s("");
  EXPECT_FALSE(s.a().graph_capture_record_stream_reuse()) << "off by default, as in PyTorch";
  Capture c(s);
  void* data1 = s.a().allocate(32, 0, c.main);
  s.sim->join_capture(0, c.side, c.main);
  c.kernel(c.side);
  s.a().record_stream(data1, c.side);
  s.a().deallocate(data1);
  s.sim->join_capture(0, c.main, c.side);
  c.kernel(c.main);
  void* data3 = s.a().allocate(32, 0, c.main);
  EXPECT_NE(data3, data1);
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  c.end();
  s.a().deallocate(data3);
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0) << "released at the capture's end";
  s.a().validate();
  s.a().release_pool(0, kGraphPool);
}

TEST(RuntimeSettings, AKeptFreeReleasedByAFenceAfterTheCaptureIsForgotten) {
  // The use on the side stream was recorded before that stream joined the capture: it is no use of the
  // capture, so the capture's end does not drop it, and a fence after the capture releases the block.
  SimSetup s("");
  s.a().set_graph_capture_record_stream_reuse(true);
  Capture c(s);
  void* data1 = s.a().allocate(32, 0, c.main);
  c.kernel(c.main);
  s.a().end_allocate_to_pool(0, kGraphPool);  // no route: the use below is not known as a capture use
  s.a().record_stream(data1, c.side);
  s.a().begin_allocate_to_pool(0, kGraphPool, [&](Stream st) { return s.sim->is_capturing(0, st); });
  s.sim->join_capture(0, c.side, c.main);
  c.kernel(c.side);
  s.a().deallocate(data1);  // kept: both streams capture
  s.a().validate();
  c.end();
  s.sim->synchronize_all();
  s.a().synchronize_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().validate();
  s.a().release_pool(0, kGraphPool);
}

TEST(RuntimeSettings, ACaptureFreeWithAUseOutsideTheCaptureIsNotReused) {
  SimSetup s("");
  s.a().set_graph_capture_record_stream_reuse(true);
  const Stream outside = s.sim->create_stream();
  Capture c(s);
  void* data1 = s.a().allocate(32, 0, c.main);
  c.kernel(c.main);
  s.a().record_stream(data1, outside);  // a stream that does not capture: only a fence can tell
  s.a().deallocate(data1);
  c.kernel(c.main);
  void* data3 = s.a().allocate(32, 0, c.main);
  EXPECT_NE(data3, data1);
  s.a().validate();
  c.end();
  s.a().deallocate(data3);
  s.sim->synchronize_all();
  s.a().synchronize_fences();
  s.a().validate();
  s.a().release_pool(0, kGraphPool);
}

}  // namespace
}  // namespace streamalloc::testing
