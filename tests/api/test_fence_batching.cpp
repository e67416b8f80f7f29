// When batches of frees are fenced (docs/design.md, "Fences: batching and pipelining"), on the
// simulated device in manual mode: every event recorded on a stream stays queued there until the test
// advances the stream, so a stream's queue counts the fences recorded on it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

// The small pool's largest size: two blocks fill a 2 MiB segment.
constexpr std::size_t kMegabyte = 1 * MiB;

// The prefetch pipeline's pair: allocated on `producer`, used on `consumer`, freed; then the consumer's
// work is done.
void cross_stream_pair(SimSetup& s, Stream producer, Stream consumer) {
  void* p = s.a().allocate(kMegabyte, 0, producer);
  s.a().record_stream(p, consumer);
  s.a().deallocate(p, kMegabyte, 0, producer);
  s.sim->synchronize_stream(0, consumer);
}

// Both blocks of the segment are pending on the consumer at every second allocation, which misses.
// The miss gets them back (the consumer is idle), and needs no fence on the producer: the blocks it
// settles already serve the producer. Fencing the producer's own batch at every miss cost an event
// every second pair. And the poll that gets the blocks back puts them in the producer's hot list, so
// the allocation after the miss takes its block on the stream's shard alone: about one allocation in
// two takes the device lock (every one did when released blocks went to the free lists).
TEST(FenceBatching, ACrossStreamLoopOfMegabyteBlocksDoesNotFenceTheProducerAtEveryMiss) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  constexpr int kPairs = 200;
  for (int i = 0; i < kPairs; ++i) cross_stream_pair(s, producer, consumer);
  const std::size_t producer_fences = s.sim->queued_items(0, producer);  // the producer never runs
  EXPECT_LE(producer_fences, static_cast<std::size_t>(kPairs / 10))
      << "fences recorded on the producer in " << kPairs << " pairs";
  EXPECT_EQ(s.stats().segment[0].current, 1) << "no segment beyond the first";
  EXPECT_LE(s.stats().allocations_device_locked, kPairs * 6 / 10) << "released blocks made hot for the producer";
  s.a().validate();
}

// The host's coarse clock, as the fence pacing reads it.
std::int64_t coarse_tick_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A free's fence pass that finds an earlier free's fence completed puts the block it releases in its
// allocation stream's hot list: the stream's next allocation of its size takes it without the device
// lock, and the stats stay exact (validate checks every peak against the currents and the headroom).
TEST(FenceBatching, AFreesFencePassMakesTheBlocksHotItReleasesForTheirAllocationStream) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  void* p = s.a().allocate(4 * KiB, 0, producer);
  s.a().record_stream(p, consumer);
  s.a().deallocate(p, 4 * KiB, 0, producer);  // pending; its fence is recorded on the consumer
  ASSERT_EQ(s.sim->queued_items(0, consumer), 1u);
  void* q = s.a().allocate(4 * KiB, 0, producer);
  ASSERT_NE(q, p) << "p waits for its fence";
  s.a().record_stream(q, consumer);
  s.sim->synchronize_stream(0, consumer);
  std::this_thread::sleep_for(std::chrono::microseconds(100));  // past the 20 us window: the free polls
  const std::int64_t tick = coarse_tick_now();
  s.a().deallocate(q, 4 * KiB, 0, producer);
  const std::int64_t locked = s.stats().allocations_device_locked;
  void* again = s.a().allocate(4 * KiB, 0, producer);
  EXPECT_EQ(again, p);
  // The free's pass polled in this tick, so the allocation needs no poll of its own: it takes p on the
  // fast path. In a later tick it polls first, under the device lock (rule 3's pending poll).
  if (coarse_tick_now() == tick) {
    EXPECT_EQ(s.stats().allocations_device_locked, locked) << "p was kept in the producer's hot list";
  }
  EXPECT_EQ(s.stats().pending_blocks.current, 1) << "q waits for its own fence";
  s.a().validate();
  s.a().deallocate(again, 4 * KiB, 0, producer);
  s.sim->synchronize_stream(0, consumer);
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().validate();
}

// What the two tests below do on one stream: free a block of its own (it joins the stream's open batch),
// and allocate a large block no cached block fits (a miss; each is kept, so each later one misses
// too). Neither depends on how fast the machine runs the 20 us window of cross-stream frees or the
// coarse clock's poll; only the 1 ms interval is time, and a run slower than it is skipped.
struct OwnMisses {
  SimSetup& s;
  Stream stream;
  std::vector<void*> kept;
  void free_own_block() { s.a().deallocate(s.a().allocate(4 * KiB, 0, stream), 4 * KiB, 0, stream); }
  void miss() { kept.push_back(s.a().allocate(12 * MiB, 0, stream)); }
  void finish() {
    for (void* p : kept) s.a().deallocate(p, 12 * MiB, 0, stream);
    s.sim->synchronize_stream(0, stream);
    s.a().process_fences();
    s.a().validate();
  }
};
using Since = std::chrono::steady_clock;

// The deferral is bounded: a miss fences its own stream's batch once the stream's newest fence is
// older than the interval (1 ms), so its free blocks still settle for other streams.
TEST(FenceBatching, AMissFencesItsOwnBatchOnceTheIntervalHasPassed) {
  SimSetup s("");
  OwnMisses own{s, s.sim->create_stream(), {}};
  const auto first = Since::now();
  own.free_own_block();
  own.miss();
  ASSERT_EQ(s.sim->queued_items(0, own.stream), 1u) << "the first miss fences: the stream had no fence yet";
  own.free_own_block();
  own.miss();
  if (Since::now() - first >= std::chrono::milliseconds(1)) {
    GTEST_SKIP() << "two misses took longer than the 1 ms interval on this machine";
  }
  EXPECT_EQ(s.sim->queued_items(0, own.stream), 1u) << "a miss right after it does not";
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  own.free_own_block();
  own.miss();
  EXPECT_EQ(s.sim->queued_items(0, own.stream), 2u) << "the first miss after the interval does";
  own.finish();
}

// Another stream's miss fences the batch a stream's own misses left open: its blocks settle for others.
TEST(FenceBatching, AnotherStreamsMissFencesTheDeferredBatch) {
  SimSetup s("");
  OwnMisses own{s, s.sim->create_stream(), {}};
  const Stream other = s.sim->create_stream();
  const auto first = Since::now();
  own.free_own_block();
  own.miss();  // fenced: the first
  own.free_own_block();
  own.miss();  // its batch stays open
  if (Since::now() - first >= std::chrono::milliseconds(1)) {
    GTEST_SKIP() << "two misses took longer than the 1 ms interval on this machine";
  }
  ASSERT_EQ(s.sim->queued_items(0, own.stream), 1u) << "the stream's second miss left its batch open";
  void* p = s.a().allocate(12 * MiB, 0, other);  // misses: the stream's free blocks are not settled
  EXPECT_EQ(s.sim->queued_items(0, own.stream), 2u) << "the other stream's miss fenced the open batch";
  s.a().deallocate(p, 12 * MiB, 0, other);
  own.finish();
}

// Only a batch of the missing stream's own free blocks waits: one with a block of another stream
// pending on the missing stream is fenced by the miss at once, as before, so that block comes back as
// soon as the stream passes the miss.
TEST(FenceBatching, AMissFencesItsBatchOfOtherStreamsPendingBlocks) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  const Stream c = s.sim->create_stream();
  for (int i = 0; i < 4; ++i) cross_stream_pair(s, a, b);  // a has been fenced, and has blocks of its own
  void* c0 = s.a().allocate(kMegabyte, 0, c);
  s.a().record_stream(c0, a);
  s.sim->enqueue(0, a, [] {});            // a works with c0
  s.a().deallocate(c0, kMegabyte, 0, c);  // pending in a's open batch: a fence of a is in flight
  const std::size_t a_queue = s.sim->queued_items(0, a);
  std::vector<void*> on_a;
  const std::int64_t segments = s.stats().segment[0].current;
  while (s.stats().segment[0].current == segments) on_a.push_back(s.a().allocate(kMegabyte, 0, a));  // a misses
  ASSERT_EQ(s.sim->queued_items(0, a), a_queue + 1) << "a's miss fenced the batch that holds c0";
  s.sim->enqueue(0, a, [] {});        // a works on
  s.sim->advance(0, a, a_queue + 1);  // ... having passed that fence
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0) << "c0 came back once a passed the miss";
  s.sim->synchronize_stream(0, a);
  for (void* p : on_a) s.a().deallocate(p, kMegabyte, 0, a);
  s.a().validate();
}

}  // namespace
}  // namespace streamalloc::testing
