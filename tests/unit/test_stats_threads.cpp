// Stats under threads (docs/design.md, "Locking", "Stats stay exact"): each shard keeps its part of the
// stats its fast path changes, and a stats read sums them; the peaks stay exact through the headroom
// the shards hold (shard_stats.hpp).
//
// Totals: each shard keeps the totals its fast path adds, and a stats read sums them. Threads on two streams each churn
// pairs (most on the fast path, some on the device-locked path, some across streams); once they have stopped, every
// total is exactly what they did, per size class and in all, and a reset of the accumulated stats
// restarts them from zero on every shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fault_backend.hpp"
#include "size_policy.hpp"
#include "streamalloc/allocator.hpp"
#include "sim_fixture.hpp"
#include "threads.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

using testing_support::Barrier;

constexpr int kThreads = 4;

constexpr int kStreamsPerThread = 2;
constexpr int kPairs = 20000;

// What one thread did, to compare with the totals.
struct Done {
  std::array<std::int64_t, kSizeClasses> allocations{};
  std::array<std::int64_t, kSizeClasses> requested{};
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
            const std::size_t rounded = size_policy::Rounding(options_.roundup_power2_divisions).round(size);
            for (const int p : {0, static_cast<int>(size_policy::size_class_for(rounded))}) {
              ++mine.allocations[static_cast<std::size_t>(p)];
              mine.requested[static_cast<std::size_t>(p)] += static_cast<std::int64_t>(size);
            }
            const std::uint64_t r = rng() % 32;
            if (r == 0) allocator_->record_stream(ptr, on == a ? b : a);
            allocator_->deallocate(ptr, rng() % 2 == 0 ? size : 0, rng() % 4 == 0 ? -1 : 0,
                                   r == 1 ? (on == a ? b : a) : on);
          }
        } catch (const std::exception& e) {
          mine.failure = e.what();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    return done;
  }

  void check_peaks_in_rounds(int rounds, const std::function<std::vector<std::size_t>(int, int)>& sizes_held);

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
    for (std::size_t p = 0; p < kSizeClasses; ++p) {
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

// Peaks: threads on their own streams hold the blocks `sizes_held(t, r)` in rounds that line up at a
// barrier, so the aggregate's largest value is known: the largest sum of a round. The fast paths spend
// and return the headroom among themselves; each peak must still be that sum exactly (a sum of
// per-stream peaks would be larger), and restart from the current value after reset_peak_stats, which
// runs with nothing live before round rounds / 2.
void StatsUnderThreads::check_peaks_in_rounds(int rounds,
                                              const std::function<std::vector<std::size_t>(int, int)>& sizes_held) {
  std::vector<std::int64_t> peak_bytes(static_cast<std::size_t>(rounds)), peak_blocks(static_cast<std::size_t>(rounds));
  std::int64_t bytes_max = 0, blocks_max = 0;
  for (int r = 0; r < rounds; ++r) {
    if (r == rounds / 2) bytes_max = blocks_max = 0;
    std::int64_t bytes = 0, blocks = 0;
    for (int t = 0; t < kThreads; ++t) {
      for (const std::size_t size : sizes_held(t, r)) {
        bytes += static_cast<std::int64_t>(size);
        ++blocks;
      }
    }
    bytes_max = std::max(bytes_max, bytes);
    blocks_max = std::max(blocks_max, blocks);
    peak_bytes[static_cast<std::size_t>(r)] = bytes_max;
    peak_blocks[static_cast<std::size_t>(r)] = blocks_max;
  }

  Barrier sync(kThreads + 1);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Stream stream = streams_[static_cast<std::size_t>(t)];
      for (int r = 0; r < rounds; ++r) {
        const std::vector<std::size_t> sizes = sizes_held(t, r);
        std::vector<void*> held;
        try {
          for (const std::size_t size : sizes) held.push_back(allocator_->allocate(size, 0, stream));
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(t)] = e.what();
        }
        sync.arrive_and_wait();  // every thread holds its blocks
        for (std::size_t i = 0; i < held.size(); ++i) allocator_->deallocate(held[i], sizes[i], 0, stream);
        sync.arrive_and_wait();  // every block is back; the main thread checks
        sync.arrive_and_wait();  // the main thread is done
      }
    });
  }
  for (int r = 0; r < rounds; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    ASSERT_NO_THROW(allocator_->validate());
    const DeviceStats stats = allocator_->stats(0);
    const std::int64_t bytes = peak_bytes[static_cast<std::size_t>(r)];
    EXPECT_EQ(stats.allocated_bytes[0].current, 0);
    EXPECT_EQ(stats.allocated_bytes[0].peak, bytes);
    EXPECT_EQ(stats.allocated_bytes[1].peak, bytes) << "the small pool's peak";
    EXPECT_EQ(stats.requested_bytes[0].peak, bytes);
    EXPECT_EQ(stats.active_bytes[0].peak, bytes);
    EXPECT_EQ(stats.allocation[0].peak, peak_blocks[static_cast<std::size_t>(r)]);
    if (r == rounds / 2 - 1) allocator_->reset_peak_stats(0);
    sync.arrive_and_wait();
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& failure : failures) EXPECT_EQ(failure, "");
}

// Each thread holds a different number of blocks of one size in every round, at most the hot list's 8,
// so after the first rounds the hot lists serve every allocation.
TEST_F(StatsUnderThreads, PeakIsExactWhenThreadsPeakTogether) {
  static constexpr std::size_t kBlock = 64 * KiB;  // small pool: blocks are exactly this size
  check_peaks_in_rounds(24, [](int t, int r) {
    return std::vector<std::size_t>(static_cast<std::size_t>(1 + (t * 3 + r * 5) % 8), kBlock);
  });
}

// The sizes of a server's requests (b * 2 KiB and b * 8 KiB, b in 1..64), one to five, different in
// every round and thread: each thread's largest holding comes in a round of its own, so the headroom
// its fast paths need sits in other threads' shards and is gathered back and forth.
TEST_F(StatsUnderThreads, PeakIsExactWithVariedSizesAcrossThreads) {
  check_peaks_in_rounds(40, [](int t, int r) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(t * 1000 + r));
    std::vector<std::size_t> sizes(1 + rng() % 5);
    for (std::size_t& size : sizes) size = (1 + rng() % 64) * (rng() % 2 == 0 ? 2 * KiB : 8 * KiB);
    return sizes;
  });
}

// One thread, many streams, random order: the device's peak of allocated bytes and blocks is the
// recomputed running maximum after every call, whichever stream's fast path or the device-locked path
// served it, while headroom moves between the streams (frees on one stream, allocations on another,
// some frees on another stream, record_stream, a peak reset halfway). validate() checks that every
// peak is its current plus all headroom.
TEST_F(StatsUnderThreads, PeakIsTheRunningMaximumAcrossStreams) {
  std::mt19937_64 rng(11);
  struct Live {
    void* ptr;
    std::size_t size;
    Stream stream;
  };
  std::vector<Live> live;
  std::int64_t bytes = 0, blocks = 0, peak_bytes = 0, peak_blocks = 0;
  for (int op = 0; op < 6000; ++op) {
    const Stream stream = streams_[rng() % streams_.size()];
    if (live.size() < 40 && rng() % 2 == 0) {
      static constexpr std::size_t kSizes[] = {512, 4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB};
      const std::size_t size = kSizes[rng() % 5];
      live.push_back({allocator_->allocate(size, 0, stream), size, stream});
      bytes += static_cast<std::int64_t>(size_policy::Rounding(options_.roundup_power2_divisions).round(size));
      ++blocks;
      if (rng() % 16 == 0) allocator_->record_stream(live.back().ptr, streams_[rng() % streams_.size()]);
    } else if (!live.empty()) {
      const std::size_t i = rng() % live.size();
      const Live b = live[i];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      allocator_->deallocate(b.ptr, b.size, 0, rng() % 8 == 0 ? stream : b.stream);
      bytes -= static_cast<std::int64_t>(size_policy::Rounding(options_.roundup_power2_divisions).round(b.size));
      --blocks;
    }
    if (op == 3000) {
      allocator_->reset_peak_stats(0);
      peak_bytes = bytes;
      peak_blocks = blocks;
    }
    peak_bytes = std::max(peak_bytes, bytes);
    peak_blocks = std::max(peak_blocks, blocks);
    const DeviceStats stats = allocator_->stats(0);
    ASSERT_EQ(stats.allocated_bytes[0].current, bytes) << "op " << op;
    ASSERT_EQ(stats.allocated_bytes[0].peak, peak_bytes) << "op " << op;
    ASSERT_EQ(stats.allocation[0].peak, peak_blocks) << "op " << op;
    if (op % 100 == 0) {
      ASSERT_NO_THROW(allocator_->validate()) << "op " << op;
    }
  }
  for (const Live& b : live) allocator_->deallocate(b.ptr, b.size, 0, b.stream);
  allocator_->synchronize_fences();
  ASSERT_NO_THROW(allocator_->validate());
}

// device_lock_wait_ns and device_lock_held_ns time the device lock: one thread holds it for 30 ms (a
// segment reservation the backend stalls), a second asks for it meanwhile and waits; both show in the
// stats, and a reset of the accumulated stats starts them again from zero.
TEST(DeviceLockTimes, AWaitForTheDeviceLockAndItsHoldAreTimed) {
  using namespace std::chrono_literals;
  SimBackend::Config config;
  config.memory_per_device = 64 * MiB;
  auto sim = std::make_shared<SimBackend>(config);
  auto faults = std::make_shared<testing::FaultBackend>(sim);
  Allocator alloc(Options::parse("log_level:off"), faults);
  const Stream a = sim->create_stream(), b = sim->create_stream();
  std::atomic<bool> holding{false}, asking{false};
  faults->during_reserve([&] {
    holding = true;
    while (!asking) std::this_thread::yield();
    std::this_thread::sleep_for(30ms);
  });
  std::thread holder([&] { alloc.deallocate(alloc.allocate(4 * KiB, 0, a), 4 * KiB, 0, a); });
  while (!holding) std::this_thread::yield();
  asking = true;
  (void)alloc.stats(0);  // waits for the holder's reservation (its own wait counts from the next read)
  holder.join();
  faults->during_reserve(nullptr);
  const DeviceStats timed = alloc.stats(0);
  EXPECT_GE(timed.device_lock_held_ns, 30'000'000) << "the holder's call held the lock through its 30 ms";
  EXPECT_GE(timed.device_lock_wait_ns, 10'000'000) << "the stats read asked while the holder slept";

  alloc.reset_accumulated_stats(0);
  alloc.deallocate(alloc.allocate(4 * KiB, 0, b), 4 * KiB, 0, b);
  const DeviceStats after_reset = alloc.stats(0);
  EXPECT_LT(after_reset.device_lock_wait_ns, 10'000'000);
  EXPECT_LT(after_reset.device_lock_held_ns, 30'000'000);
  ASSERT_NO_THROW(alloc.validate());
}

}  // namespace
}  // namespace streamalloc
