// Accumulated stats under threads (docs/design.md, "Locking", "Stats stay exact"): each shard keeps the
// totals its fast path adds, and a stats read sums them. Threads on two streams each churn pairs (most
// on the fast path, some on the device-locked path, some across streams); once they have stopped, every
// total is exactly what they did, per size class and in all, and a reset of the accumulated stats
// restarts them from zero on every shard.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "size_policy.hpp"
#include "streamalloc/allocator.hpp"
#include "sim_fixture.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

constexpr int kThreads = 4;
constexpr int kStreamsPerThread = 2;
constexpr int kPairs = 20000;

// What one thread did, to compare with the totals.
struct Done {
  std::array<std::int64_t, kPoolKinds> allocations{};
  std::array<std::int64_t, kPoolKinds> requested{};
  std::string failure;
};

class StatsUnderThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < kThreads * kStreamsPerThread; ++s) streams_.push_back(sim_->create_stream(0));
  }

  // Each thread: pairs on its own two streams (the hot list serves most), now and then a size the hot
  // list misses, a free on the other stream (one more use) or a record_stream.
  std::vector<Done> run_round(unsigned seed) {
    std::vector<Done> done(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(seed * 1000 + static_cast<unsigned>(t));
        Done& mine = done[static_cast<std::size_t>(t)];
        const Stream a = streams_[static_cast<std::size_t>(t * kStreamsPerThread)];
        const Stream b = streams_[static_cast<std::size_t>(t * kStreamsPerThread + 1)];
        try {
          for (int i = 0; i < kPairs; ++i) {
            static constexpr std::size_t kHot[] = {512, 4 * KiB, 100 * KiB, 2 * MiB};
            const std::size_t size = rng() % 16 != 0 ? kHot[rng() % 4] : 1 + rng() % (3 * MiB);
            const Stream on = rng() % 2 == 0 ? a : b;
            void* ptr = allocator_->allocate(size, 0, on);
            const std::size_t rounded = size_policy::round_size(size, options_);
            for (const int p : {0, static_cast<int>(size_policy::pool_for(rounded))}) {
              ++mine.allocations[static_cast<std::size_t>(p)];
              mine.requested[static_cast<std::size_t>(p)] += static_cast<std::int64_t>(size);
            }
            const std::uint64_t r = rng() % 32;
            if (r == 0) allocator_->record_stream(ptr, on == a ? b : a);
            allocator_->deallocate(ptr, rng() % 2 == 0 ? size : 0, rng() % 4 == 0 ? -1 : 0, r == 1 ? (on == a ? b : a) : on);
          }
        } catch (const std::exception& e) {
          mine.failure = e.what();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    return done;
  }

  // The simulated device in eager mode (work runs as it is enqueued), room for every thread's blocks.
  testing::SimSetup setup_{"backend:sim,log_level:error", SimBackend::Mode::kEager, 4 * GiB};
  const std::shared_ptr<SimBackend>& sim_ = setup_.sim;
  const std::unique_ptr<Allocator>& allocator_ = setup_.allocator;
  const Options& options_ = allocator_->options();
  std::vector<Stream> streams_;
};

TEST_F(StatsUnderThreads, AccumulatedTotalsAreExactOnceTheThreadsStop) {
  for (unsigned round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (round == 2) allocator_->reset_accumulated_stats(0);
    const DeviceStats before = allocator_->stats(0);
    const std::vector<Done> done = run_round(round);
    for (const Done& d : done) ASSERT_EQ(d.failure, "");
    allocator_->synchronize_fences();  // nothing pending: every freed block is inactive again
    ASSERT_NO_THROW(allocator_->validate());
    const DeviceStats after = allocator_->stats(0);
    for (std::size_t p = 0; p < kPoolKinds; ++p) {
      std::int64_t allocations = 0, requested = 0;
      for (const Done& d : done) {
        allocations += d.allocations[p];
        requested += d.requested[p];
      }
      SCOPED_TRACE("pool index " + std::to_string(p));
      EXPECT_EQ(after.allocation[p].allocated - before.allocation[p].allocated, allocations);
      EXPECT_EQ(after.allocation[p].freed - before.allocation[p].freed, allocations);
      EXPECT_EQ(after.active[p].allocated - before.active[p].allocated, allocations);
      EXPECT_EQ(after.active[p].freed - before.active[p].freed, allocations);
      EXPECT_EQ(after.requested_bytes[p].allocated - before.requested_bytes[p].allocated, requested);
      EXPECT_EQ(after.requested_bytes[p].freed - before.requested_bytes[p].freed, requested);
      // Every block went back: what was allocated was freed, byte for byte.
      EXPECT_EQ(after.allocated_bytes[p].allocated - before.allocated_bytes[p].allocated,
                after.allocated_bytes[p].freed - before.allocated_bytes[p].freed);
      EXPECT_EQ(after.active_bytes[p].allocated - before.active_bytes[p].allocated,
                after.active_bytes[p].freed - before.active_bytes[p].freed);
      EXPECT_EQ(after.allocation[p].current, 0);
      EXPECT_EQ(after.allocated_bytes[p].current, 0);
      EXPECT_EQ(after.active[p].current, 0);
      EXPECT_EQ(after.requested_bytes[p].current, 0);
      // validate() checked allocated - freed == current for every stat, shard totals included; after
      // a reset it cannot, so check the inactive splits' balance here.
      EXPECT_EQ(after.inactive_split[p].allocated - after.inactive_split[p].freed -
                    (before.inactive_split[p].allocated - before.inactive_split[p].freed),
                after.inactive_split[p].current - before.inactive_split[p].current);
    }
    EXPECT_GT(after.allocated_bytes[0].allocated - before.allocated_bytes[0].allocated,
              static_cast<std::int64_t>(kThreads) * kPairs * 512);
  }
  // The reset zeroed every shard's totals too: round 2's totals start from zero.
  const DeviceStats last = allocator_->stats(0);
  EXPECT_EQ(last.allocation[0].allocated, static_cast<std::int64_t>(kThreads) * kPairs);
}

}  // namespace
}  // namespace streamalloc
