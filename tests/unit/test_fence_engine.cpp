// FenceEngine on its own (fence_engine.hpp): fences are recorded with the pool's events, a capture's
// uses are dropped only once their stream stops capturing, and the fence passes are paced.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "fence_engine.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

SimBackend::Config manual() {
  SimBackend::Config config;
  config.mode = SimBackend::Mode::kManual;
  return config;
}

TEST(FenceEngine, ClosingABatchRecordsOneEventAndReleasedEventsAreReused) {
  SimBackend sim(manual());
  FenceEngine engine(sim, 0);
  const Stream s = sim.create_stream(0);
  FenceQueue fences(s);
  EXPECT_FALSE(engine.close_batch(fences)) << "an empty batch records nothing";
  fences.join_as_owner();
  ASSERT_TRUE(engine.close_batch(fences));
  EXPECT_EQ(sim.counters().event_records, 1u);
  const Event first = fences.in_flight().back().event;
  sim.synchronize_all();
  Fence done;
  std::uint64_t queries = 0;
  ASSERT_TRUE(fences.pop_completed(sim, 0, &done, &queries));
  engine.release_event(done.event);
  fences.join_as_owner();
  ASSERT_TRUE(engine.close_batch(fences));
  EXPECT_EQ(fences.in_flight().back().event, first) << "the released event is recorded again";
  EXPECT_EQ(sim.counters().events_created, 1u);
}

TEST(FenceEngine, CaptureUsesAreDroppedOnlyAfterTheirCaptureEnds) {
  SimBackend sim(manual());
  FenceEngine engine(sim, 0);
  const Stream capturing = sim.create_stream(0);
  const Stream other = sim.create_stream(0);
  Block a;
  Block b;
  sim.set_capturing(0, capturing, true);
  engine.add_capture_use(&a, capturing);
  engine.add_capture_use(&b, other);  // its capture has ended already
  std::vector<std::pair<Block*, Stream>> dropped;
  const auto drop = [&](Block* block, Stream stream) { dropped.emplace_back(block, stream); };
  engine.drop_ended_capture_uses(drop);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0], std::make_pair(&b, other));
  EXPECT_TRUE(engine.has_capture_uses());
  EXPECT_EQ(engine.capture_uses().count(&a), 1u);
  sim.set_capturing(0, capturing, false);
  engine.drop_ended_capture_uses(drop);
  EXPECT_EQ(dropped.size(), 2u);
  EXPECT_FALSE(engine.has_capture_uses());
}

TEST(FenceEngine, PassesArePacedAndParkingHoldsForTheirDuration) {
  SimBackend sim;
  FenceEngine engine(sim, 0);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(engine.start_free_pass(t0));
  EXPECT_FALSE(engine.start_free_pass(t0 + std::chrono::microseconds(1))) << "inside the batch window";
  EXPECT_TRUE(engine.start_free_pass(t0 + std::chrono::seconds(1)));
  EXPECT_TRUE(engine.start_pending_poll(t0));
  EXPECT_FALSE(engine.start_pending_poll(t0)) << "one poll per tick of the coarse clock";
  EXPECT_FALSE(engine.parks_released());
  {
    const FenceEngine::Parking parking(engine);
    EXPECT_TRUE(engine.parks_released());
  }
  EXPECT_FALSE(engine.parks_released());
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
  SimBackend sim(config);
  FenceEngine engine(sim, 0);
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
  FenceQueue fences(s);
  fences.join_as_owner();
  ASSERT_TRUE(engine.close_batch(fences));
  EXPECT_EQ(fences.last_recorded_at(), at(11'000'000'000));

  SimBackend host(manual());
  FenceEngine host_engine(host, 0);
  const Clock::time_point before = Clock::now();
  EXPECT_GE(host_engine.now(), before) << "without a replay clock the engine reads the host's";
}

}  // namespace
}  // namespace streamalloc
