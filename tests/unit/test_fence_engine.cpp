// FenceEngine on its own (fence_engine.hpp), over the parts of a cache (tests/support/cache_parts.hpp):
// fences are recorded with the pool's events, a pending block goes back through the release callback
// once its fences have completed, a capture's uses are dropped only once their stream stops capturing,
// and the fence passes are paced.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cache_parts.hpp"
#include "fence_engine.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

SimBackend::Config manual() {
  SimBackend::Config config;
  config.mode = SimBackend::Mode::kManual;
  return config;
}

using test::CacheParts;
using test::DeviceCall;

void ignore_release(Block*, Clock::time_point) {}

TEST(FenceEngine, ClosingABatchRecordsOneEventAndReleasedEventsAreReused) {
  CacheParts parts(manual(), Options{});
  FenceEngine engine(parts.sim, 0, parts.fence_parts(ignore_release));
  const Stream s = parts.sim.create_stream(0);
  DeviceCall call(parts.shards);
  Shard& shard = parts.shards.get(s);
  EXPECT_FALSE(engine.close_batch(shard)) << "an empty batch records nothing";
  shard.fences.join_as_owner();
  ASSERT_TRUE(engine.close_batch(shard));
  EXPECT_EQ(parts.sim.counters().event_records, 1u);
  EXPECT_EQ(parts.ledger.stats().fences_recorded, 1);
  const Event first = shard.fences.in_flight().back().event;
  parts.sim.synchronize_all();
  engine.poll(/*close_batches=*/false);
  EXPECT_TRUE(shard.fences.in_flight().empty()) << "the poll popped the completed fence";
  shard.fences.join_as_owner();
  ASSERT_TRUE(engine.close_batch(shard));
  EXPECT_EQ(shard.fences.in_flight().back().event, first) << "the released event is recorded again";
  EXPECT_EQ(parts.sim.counters().events_created, 1u);
}

TEST(FenceEngine, APendingBlockGoesBackThroughTheReleaseCallbackOnceEveryFenceCompleted) {
  CacheParts parts(manual(), Options{});
  std::vector<Block*> released;
  FenceEngine engine(parts.sim, 0, parts.fence_parts([&](Block* b, Clock::time_point) { released.push_back(b); }));
  const Stream producer = parts.sim.create_stream(0);
  const Stream consumer = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, producer}});
  Block* block = segment.head;
  block->state = BlockState::kAllocated;
  block->since = engine.now();
  DeviceCall call(parts.shards);
  block->recorded_streams = {consumer};
  engine.make_pending(block);
  EXPECT_EQ(block->state, BlockState::kPending);
  EXPECT_EQ(block->fences_left, 1u);
  EXPECT_EQ(parts.ledger.stats().pending_blocks.current, 1);
  EXPECT_EQ(parts.shards.get(consumer).fences.pending_stats().pending_blocks.current, 1);
  engine.close_batches_and_poll();
  EXPECT_TRUE(released.empty()) << "the consumer's fence has not completed";
  parts.sim.synchronize_all();
  engine.poll(/*close_batches=*/false);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0], block);
  EXPECT_EQ(block->fences_left, 0u);
  EXPECT_EQ(parts.shards.get(consumer).fences.pending_stats().pending_blocks.current, 0);
}

TEST(FenceEngine, CaptureUsesAreDroppedOnlyAfterTheirCaptureEnds) {
  CacheParts parts(manual(), Options{});
  int changes = 0;
  FenceEngine engine(parts.sim, 0, parts.fence_parts(ignore_release, [&] { ++changes; }));
  const Stream alloc = parts.sim.create_stream(0);
  const Stream capturing = parts.sim.create_stream(0);
  const Stream other = parts.sim.create_stream(0);
  Segment& segment = parts.tiled(SizeClass::kSmall, 0x200000, {{4096, alloc}, {4096, alloc}});
  Block* a = CacheParts::at(segment, 0);
  Block* b = CacheParts::at(segment, 1);
  a->state = b->state = BlockState::kAllocated;
  DeviceCall call(parts.shards);
  engine.add_use(a, other, NewUse::kRecordStream, /*routes=*/false);
  EXPECT_FALSE(engine.has_capture_uses()) << "without a route nobody asks whether the stream captures";
  parts.sim.set_capturing(0, capturing, true);
  parts.sim.set_capturing(0, other, true);
  engine.add_use(a, capturing, NewUse::kRecordStream, /*routes=*/true);
  engine.add_use(b, other, NewUse::kRecordStream, /*routes=*/true);
  EXPECT_EQ(changes, 2);
  parts.sim.set_capturing(0, other, false);
  engine.drop_ended_capture_uses();
  EXPECT_EQ(b->recorded_streams, std::vector<Stream>{}) << "its capture has ended";
  EXPECT_EQ(a->recorded_streams, (std::vector<Stream>{other, capturing}));
  EXPECT_TRUE(engine.has_capture_uses());
  EXPECT_EQ(engine.capture_uses().count(a), 1u);
  EXPECT_NO_THROW(engine.validate());
  a->recorded_streams = {other};
  EXPECT_THROW(engine.validate(), std::logic_error) << "a capture use that is not among the block's uses";
  a->recorded_streams = {other, capturing};
  parts.sim.set_capturing(0, capturing, false);
  engine.drop_ended_capture_uses();
  EXPECT_EQ(a->recorded_streams, std::vector<Stream>{other}) << "the use recorded outside a capture stays";
  EXPECT_FALSE(engine.has_capture_uses());
}

TEST(FenceEngine, PassesArePacedAndHotReleasesHoldForTheirDuration) {
  CacheParts parts;
  FenceEngine engine(parts.sim, 0, parts.fence_parts(ignore_release));
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(engine.start_free_pass(t0));
  EXPECT_FALSE(engine.start_free_pass(t0 + std::chrono::microseconds(1))) << "inside the batch window";
  EXPECT_TRUE(engine.start_free_pass(t0 + std::chrono::seconds(1)));
  EXPECT_TRUE(engine.start_pending_poll(t0));
  EXPECT_FALSE(engine.start_pending_poll(t0)) << "one poll per tick of the coarse clock";
  EXPECT_FALSE(engine.releases_to_hot());
  {
    const FenceEngine::HotReleases to_hot(engine);
    EXPECT_TRUE(engine.releases_to_hot());
  }
  EXPECT_FALSE(engine.releases_to_hot());
}

TEST(SimBackendReplayClock, OnlyWhenConfiguredAndNeverRunningBack) {
  SimBackend plain;
  EXPECT_EQ(plain.replay_clock(), nullptr) << "the host's clock unless asked for";
  EXPECT_THROW(plain.set_time(5), Error);
  SimBackend::Config config = manual();
  config.replay_clock = true;
  SimBackend sim(config);
  const std::atomic<std::int64_t>* clock = sim.replay_clock();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock->load(), 0);
  sim.set_time(1'500'000);
  EXPECT_EQ(clock->load(), 1'500'000);
  sim.set_time(1'500'000);  // standing still is allowed
  try {
    sim.set_time(1'000'000);
    FAIL() << "the clock ran back";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(clock->load(), 1'500'000) << "a refused set_time changes nothing";
}

TEST(FenceEngine, PacesByTheReplayClockWhenTheBackendHasOne) {
  SimBackend::Config config = manual();
  config.replay_clock = true;
  CacheParts parts(config, Options{});
  SimBackend& sim = parts.sim;
  FenceEngine engine(sim, 0, parts.fence_parts(ignore_release));
  const auto at = [](std::int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); };
  sim.set_time(10'000'000'000);
  EXPECT_EQ(engine.now(), at(10'000'000'000));
  EXPECT_LE(engine.coarse_now(), engine.now());
  EXPECT_TRUE(engine.start_pending_poll(engine.coarse_now()));
  EXPECT_FALSE(engine.start_pending_poll(engine.coarse_now())) << "one poll per tick, however long the host took";
  sim.set_time(11'000'000'000);  // a second later: a new tick whatever the host's jiffy
  EXPECT_EQ(engine.now(), at(11'000'000'000));
  EXPECT_TRUE(engine.start_pending_poll(engine.coarse_now()));
  // The fence record time comes from the same clock.
  const Stream s = sim.create_stream(0);
  {
    DeviceCall call(parts.shards);
    Shard& shard = parts.shards.get(s);
    shard.fences.join_as_owner();
    ASSERT_TRUE(engine.close_batch(shard));
    EXPECT_EQ(shard.fences.last_recorded_at(), at(11'000'000'000));
  }

  CacheParts host(manual(), Options{});
  FenceEngine host_engine(host.sim, 0, host.fence_parts(ignore_release));
  const Clock::time_point before = Clock::now();
  EXPECT_GE(host_engine.now(), before) << "without a replay clock the engine reads the host's";
}

}  // namespace
}  // namespace streamalloc
