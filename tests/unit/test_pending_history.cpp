// pending_history:N: the timeline of pending bytes per stream. A sample is taken where a stream's pending
// stats change (a free that makes blocks wait on its next fence, a fence of the stream completing), so
// the history read back must replay those stats exactly; validate() checks the newest sample per stream.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "pending_recorder.hpp"
#include "seed_pipeline.hpp"
#include "sim_fixture.hpp"

namespace streamalloc {
namespace {

using testing::SimSetup;

// A block allocated on a new producer stream, used on a new consumer stream and freed: pending on the
// consumer's next fence. Returns the consumer.
Stream free_after_use(SimSetup& s, std::size_t size) {
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  void* p = s.a().allocate(size, 0, producer);
  s.a().record_stream(p, consumer);
  s.a().deallocate(p, size, 0, producer);
  return consumer;
}

TEST(PendingHistory, OffByDefaultRecordsNothing) {
  SimSetup s("");
  free_after_use(s, 4 * KiB);
  ASSERT_EQ(s.stats().pending_bytes.current, static_cast<std::int64_t>(4 * KiB));
  const PendingHistory h = s.a().pending_history(0);
  EXPECT_EQ(h.capacity, 0u);
  EXPECT_EQ(h.recorded, 0u);
  EXPECT_TRUE(h.samples.empty());
  s.a().validate();
}

TEST(PendingHistory, AFreeAndItsFenceAreTwoSamplesOfTheUsedStream) {
  SimSetup s("pending_history:100");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  void* p = s.a().allocate(4 * KiB, 0, producer);
  void* q = s.a().allocate(8 * KiB, 0, producer);
  s.a().record_stream(p, consumer);
  s.a().deallocate(p, 4 * KiB, 0, producer);
  s.a().deallocate(q, 8 * KiB, 0, producer);  // no other use: never pending, no sample
  {
    const PendingHistory h = s.a().pending_history(0);
    ASSERT_EQ(h.samples.size(), 1u);
    EXPECT_EQ(h.samples[0].stream, consumer);
    EXPECT_EQ(h.samples[0].pending_bytes, static_cast<std::int64_t>(4 * KiB));
    EXPECT_EQ(h.samples[0].pending_blocks, 1);
    s.a().validate();
  }
  s.sim->advance(0, consumer, SIZE_MAX);  // the consumer's fence completes
  s.a().process_fences();
  const PendingHistory h = s.a().pending_history(0);
  ASSERT_EQ(h.samples.size(), 2u);
  EXPECT_EQ(h.samples[1].stream, consumer);
  EXPECT_EQ(h.samples[1].pending_bytes, 0);
  EXPECT_EQ(h.samples[1].pending_blocks, 0);
  EXPECT_LE(h.samples[0].time_us, h.samples[1].time_us);
  EXPECT_EQ(h.recorded, 2u);
  EXPECT_EQ(s.stats().pending_bytes.current, 0);
  s.a().validate();
}

TEST(PendingHistory, ABlockUsedOnTwoStreamsCountsOnEach) {
  SimSetup s("pending_history:100");
  const Stream producer = s.sim->create_stream();
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(MiB, 0, producer);
  s.a().record_stream(p, a);
  s.a().record_stream(p, b);
  s.a().deallocate(p, MiB, 0, producer);
  const PendingHistory h = s.a().pending_history(0);
  ASSERT_EQ(h.samples.size(), 2u);
  std::map<Stream, std::int64_t> bytes;
  for (const PendingSample& sample : h.samples) bytes[sample.stream] = sample.pending_bytes;
  EXPECT_EQ(bytes,
            (std::map<Stream, std::int64_t>{{a, static_cast<std::int64_t>(MiB)}, {b, static_cast<std::int64_t>(MiB)}}));
  s.a().validate();
}

TEST(PendingHistory, TheRingKeepsTheNewestSamplesOldestFirst) {
  SimSetup s("pending_history:3");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(s.a().allocate(4 * KiB, 0, producer));
  for (void* p : blocks) {  // the consumer never runs: pending bytes grow by 4 KiB per free
    s.a().record_stream(p, consumer);
    s.a().deallocate(p, 4 * KiB, 0, producer);
  }
  const PendingHistory h = s.a().pending_history(0);
  EXPECT_EQ(h.capacity, 3u);
  EXPECT_EQ(h.recorded, 5u);
  ASSERT_EQ(h.samples.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(h.samples[i].pending_blocks, static_cast<std::int64_t>(i + 3)) << i;
    EXPECT_EQ(h.samples[i].pending_bytes, static_cast<std::int64_t>((i + 3) * 4 * KiB)) << i;
  }
  s.a().validate();
}

TEST(PendingHistory, RecorderOrdersAWrappedRing) {
  PendingRecorder recorder(4);
  StreamPending pending;
  for (int i = 1; i <= 10; ++i) {
    pending.pending_bytes.increase(1);
    recorder.record(Clock::time_point(std::chrono::microseconds(i)), 7, pending);
  }
  const PendingHistory h = recorder.history();
  ASSERT_EQ(h.samples.size(), 4u);
  EXPECT_EQ(h.recorded, 10u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(h.samples[i].time_us, static_cast<std::int64_t>(7 + i));
    EXPECT_EQ(h.samples[i].pending_bytes, static_cast<std::int64_t>(7 + i));
  }
}

TEST(PendingHistory, JsonHasOneListPerField) {
  SimSetup s("pending_history:10");
  const Stream consumer = free_after_use(s, 4 * KiB);
  const auto json = nlohmann::json::parse(s.a().pending_history_json(0));
  EXPECT_EQ(json.at("device"), 0);
  EXPECT_EQ(json.at("capacity"), 10);
  EXPECT_EQ(json.at("recorded"), 1);
  for (const char* key : {"time_us", "stream", "pending_bytes", "pending_blocks"}) {
    ASSERT_EQ(json.at(key).size(), 1u) << key;
  }
  EXPECT_EQ(json.at("stream")[0].get<Stream>(), consumer);
  EXPECT_EQ(json.at("pending_bytes")[0], 4 * KiB);
  EXPECT_EQ(json.at("pending_blocks")[0], 1);
}

// On the fixed prefetch pipeline the history replays the per-stream stats: its largest value per stream is
// the stream's peak, its last is the stream's current value.
TEST(PendingHistory, SeedPipelineHistoryReplaysThePerStreamStats) {
  const auto result = testing::run_pipeline("pending_history:100000", testing::PipelineOptions{}, 200, 64 * KiB);
  const PendingHistory& history = result.pending_history;
  EXPECT_EQ(result.wrong, 0);
  ASSERT_FALSE(history.samples.empty());
  EXPECT_EQ(history.recorded, history.samples.size());
  std::map<Stream, std::int64_t> peak, last;
  for (const PendingSample& sample : history.samples) {
    peak[sample.stream] = std::max(peak[sample.stream], sample.pending_bytes);
    last[sample.stream] = sample.pending_bytes;
  }
  for (const auto& [stream, pending] : result.stats.per_stream) {
    if (pending.pending_bytes.allocated == 0) continue;
    EXPECT_EQ(peak[stream], pending.pending_bytes.peak) << stream;
    EXPECT_EQ(last[stream], pending.pending_bytes.current) << stream;
  }
}

}  // namespace
}  // namespace streamalloc
