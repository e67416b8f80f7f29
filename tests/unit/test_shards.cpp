// Per-stream shards (docs/design.md, "Locking"): threads on their own streams churn through their hot
// lists while others hand blocks across streams, record uses, read stats, poll fences and empty the
// cache. Between rounds every thread stops (a quiescent point): validate() must hold, including the
// shards' own invariants, and every current stat must equal what the threads hold. Peaks must be at
// least every current any thread observed, at most the sum of what each thread could have had live at
// once, and exactly the recomputed peak when one stream runs alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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

constexpr int kThreads = 8;
constexpr int kRounds = 4;
constexpr int kOpsPerRound = 2500;
constexpr std::size_t kMaxHeld = 24;

struct Held {
  std::uint8_t* ptr;
  std::size_t size;  // requested
  Stream alloc_stream;
  int allocated_by;  // the thread whose live-bytes bound counts it
  std::uint8_t tag;
};

// Sizes the hot list serves over and over (the fast path), and now and then one that misses it.
// Small-pool sizes only when `large` is false (their blocks are exactly the rounded size).
std::size_t churn_size(std::mt19937_64& rng, bool large = true) {
  static constexpr std::size_t kHot[] = {512, 4 * KiB, 64 * KiB, 200 * KiB};
  if (rng() % 10 != 0) return kHot[rng() % 4];
  return large && rng() % 8 == 0 ? 1 * MiB + 512 * (rng() % 2048) : 1 + rng() % (256 * KiB);
}

class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int t = 0; t < kThreads; ++t) streams_.push_back(sim_->create_stream(0));
  }

  std::size_t rounded(std::size_t requested) const {
    return size_policy::Rounding(options_.roundup_power2_divisions).round(requested);
  }
  // The most a request's block can hold: a large-pool block is not split when less than a small
  // segment's worth would remain.
  std::int64_t most_bytes(std::size_t requested) const {
    const std::size_t size = rounded(requested);
    return static_cast<std::int64_t>(
        size_policy::size_class_for(size) == SizeClass::kLarge ? size + size_policy::kSmallSize : size);
  }

  // The simulated device in eager mode (work runs as it is enqueued), room for every thread's blocks.
  testing::SimSetup setup_{"backend:sim,log_level:error", SimBackend::Mode::kEager, 4 * GiB};
  const std::shared_ptr<SimBackend>& sim_ = setup_.sim;
  const std::unique_ptr<Allocator>& allocator_ = setup_.allocator;
  const Options& options_ = allocator_->options();
  std::vector<Stream> streams_;
};

// What the threads hold between rounds, and what they did, to compare with the stats.
struct World {
  std::vector<std::vector<Held>> held;     // [thread]
  std::vector<std::vector<Held>> mailbox;  // [thread]: blocks handed to it by another thread
  std::vector<std::mutex> mailbox_lock;
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> frees{0};
  std::atomic<std::int64_t> record_calls{0};
  std::atomic<std::int64_t> observed_max{0};  // the largest allocated_bytes.all.current any read saw
  std::atomic<std::int64_t> tag_failures{0};
  // Per allocating thread: bytes (most_bytes) it allocated that nobody has freed yet, raised before the
  // allocation and lowered after the free, so their sum bounds the device's allocated bytes at every
  // instant; and the largest value each reached.
  std::vector<std::atomic<std::int64_t>> live_bytes;
  std::vector<std::int64_t> live_bytes_max;  // written by its own thread only
  std::vector<std::string> failure;
  explicit World(int threads)
      : held(threads),
        mailbox(threads),
        mailbox_lock(threads),
        live_bytes(threads),
        live_bytes_max(threads, 0),
        failure(threads) {}
};

TEST_F(Shards, RoundsOfChurnHandoffsAndRecordsKeepEveryStatExact) {
  World world(kThreads);
  auto run = [&](int thread, int round) {
    std::mt19937_64 rng(0x5a4d0000u + static_cast<unsigned>(thread * 131 + round));
    const Stream own = streams_[static_cast<std::size_t>(thread)];
    std::vector<Held>& held = world.held[static_cast<std::size_t>(thread)];
    auto fail = [&](const std::string& what) {
      if (world.failure[static_cast<std::size_t>(thread)].empty()) {
        world.failure[static_cast<std::size_t>(thread)] = "thread " + std::to_string(thread) + ": " + what;
      }
    };
    auto check_tag = [&](const Held& b, Stream on) {
      sim_->enqueue(0, on, [&world, b] {
        if (b.ptr[0] != b.tag || b.ptr[b.size - 1] != b.tag) world.tag_failures.fetch_add(1);
      });
    };
    // Frees on `on`: the allocation stream (the fast path, when nothing else used it) or another.
    auto free_held = [&](const Held& b, Stream on) {
      check_tag(b, on);
      allocator_->deallocate(b.ptr, rng() % 2 == 0 ? b.size : 0, rng() % 4 == 0 ? -1 : 0, on);
      world.frees.fetch_add(1);
      world.live_bytes[static_cast<std::size_t>(b.allocated_by)].fetch_sub(most_bytes(b.size));
    };
    for (int op = 0; op < kOpsPerRound; ++op) {
      const std::uint64_t r = rng() % 1000;
      try {
        if (r < 700) {  // churn: allocate, and free right away most of the time (the hot list)
          const std::size_t size = churn_size(rng);
          auto& mine = world.live_bytes[static_cast<std::size_t>(thread)];
          const std::int64_t now = mine.fetch_add(most_bytes(size)) + most_bytes(size);
          auto& most = world.live_bytes_max[static_cast<std::size_t>(thread)];
          most = std::max(most, now);
          auto* ptr = static_cast<std::uint8_t*>(allocator_->allocate(size, 0, own));
          world.allocations.fetch_add(1);
          const Held b{ptr, size, own, thread, static_cast<std::uint8_t>(1 + rng() % 254)};
          sim_->enqueue(0, own, [b] {
            b.ptr[0] = b.tag;
            b.ptr[b.size - 1] = b.tag;
          });
          if (rng() % 4 != 0 || held.size() >= kMaxHeld) {
            free_held(b, own);
          } else {
            held.push_back(b);
          }
        } else if (r < 800 && !held.empty()) {  // free a held block on its allocation stream
          const std::size_t i = rng() % held.size();
          const Held b = held[i];
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
          free_held(b, b.alloc_stream);
        } else if (r < 860 && !held.empty()) {  // hand a held block to another thread
          const std::size_t i = rng() % held.size();
          const Held b = held[i];
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
          const auto to = static_cast<std::size_t>((thread + 1 + static_cast<int>(rng() % (kThreads - 1))) % kThreads);
          std::lock_guard<std::mutex> guard(world.mailbox_lock[to]);
          world.mailbox[to].push_back(b);
        } else if (r < 940) {  // take a handed block: record this stream's use, then free it here or keep it
          Held b{};
          {
            std::lock_guard<std::mutex> guard(world.mailbox_lock[static_cast<std::size_t>(thread)]);
            auto& box = world.mailbox[static_cast<std::size_t>(thread)];
            if (box.empty()) continue;
            b = box.back();
            box.pop_back();
          }
          check_tag(b, own);
          if (rng() % 2 == 0) {
            allocator_->record_stream(b.ptr, own);
            world.record_calls.fetch_add(1);
          }
          if (rng() % 2 == 0 && held.size() < kMaxHeld) {
            held.push_back(b);
          } else {
            free_held(b, rng() % 2 == 0 ? own : b.alloc_stream);  // a free on another stream is one more use
          }
        } else if (r < 980) {  // a stats read while everything moves
          const DeviceStats stats = allocator_->stats(0);
          const std::int64_t current = stats.allocated_bytes[0].current;
          if (current < 0 || stats.allocated_bytes[0].peak < current || stats.allocation[0].current < 0) {
            fail("a stats read saw a negative current or a peak below it");
          }
          std::int64_t seen = world.observed_max.load();
          while (current > seen && !world.observed_max.compare_exchange_weak(seen, current)) {
          }
        } else if (r < 995) {
          allocator_->process_fences();
        } else if (thread == 0) {
          allocator_->empty_cache();
        }
      } catch (const std::exception& e) {
        fail("op " + std::to_string(op) + ": " + e.what());
        return;
      }
    }
  };

  std::int64_t bound = 0;  // the sum of per-thread maxima: no instant had more allocated bytes
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t, round);
    for (std::thread& thread : threads) thread.join();
    for (const std::string& failure : world.failure) ASSERT_TRUE(failure.empty()) << failure;
    SCOPED_TRACE("after round " + std::to_string(round));

    // A quiescent point: the block table, the shards and the stats agree, and the stats are what the
    // threads hold.
    ASSERT_NO_THROW(allocator_->validate());
    std::map<std::uintptr_t, std::size_t> allocated;  // the block table's allocated blocks: address -> size
    for (const BlockInfo& block : allocator_->blocks(0)) {
      if (block.state == BlockInfo::State::kAllocated) allocated[block.address] = block.size;
    }
    std::int64_t live = 0, bytes = 0, requested = 0;
    // Pending blocks' requested bytes stay counted until their fences complete.
    for (const BlockInfo& block : allocator_->blocks(0)) {
      if (block.state == BlockInfo::State::kPendingFree) requested += static_cast<std::int64_t>(block.requested_size);
    }
    for (const auto* lists : {&world.held, &world.mailbox}) {
      for (const std::vector<Held>& list : *lists) {
        for (const Held& b : list) {
          ++live;
          const auto block = allocated.find(reinterpret_cast<std::uintptr_t>(b.ptr));
          ASSERT_NE(block, allocated.end()) << "a block a thread holds is not allocated";
          bytes += static_cast<std::int64_t>(block->second);
          requested += static_cast<std::int64_t>(b.size);
        }
      }
    }
    EXPECT_EQ(static_cast<std::int64_t>(allocated.size()), live) << "allocated blocks nobody holds";
    const DeviceStats stats = allocator_->stats(0);
    EXPECT_EQ(world.allocations.load() - world.frees.load(), live);
    EXPECT_EQ(stats.allocation[0].current, live);
    EXPECT_EQ(stats.allocation[0].allocated, world.allocations.load());
    EXPECT_EQ(stats.allocation[0].freed, world.frees.load());
    EXPECT_EQ(stats.allocated_bytes[0].current, bytes);
    EXPECT_EQ(stats.requested_bytes[0].current, requested);
    EXPECT_EQ(stats.allocation[1].current + stats.allocation[2].current, live);
    EXPECT_EQ(stats.record_stream_calls, world.record_calls.load());
    EXPECT_EQ(stats.invalid_frees, 0);
    EXPECT_EQ(stats.num_ooms, 0);
    bound = 0;
    for (const std::int64_t most : world.live_bytes_max) bound += most;
    EXPECT_GE(stats.allocated_bytes[0].peak, world.observed_max.load());
    EXPECT_GE(stats.allocated_bytes[0].peak, bytes);
    EXPECT_LE(stats.allocated_bytes[0].peak, bound);
  }
  EXPECT_EQ(world.tag_failures.load(), 0) << "a block's bytes changed while a thread owned it";
  EXPECT_GT(world.record_calls.load(), 0);

  // Everything back: nothing live, nothing pending, every segment released.
  for (auto* lists : {&world.held, &world.mailbox}) {
    for (std::vector<Held>& list : *lists) {
      for (const Held& b : list) allocator_->deallocate(b.ptr, b.size, 0, b.alloc_stream);
      list.clear();
    }
  }
  allocator_->synchronize_fences();
  allocator_->empty_cache();
  ASSERT_NO_THROW(allocator_->validate());
  const DeviceStats stats = allocator_->stats(0);
  EXPECT_EQ(stats.allocation[0].current, 0);
  EXPECT_EQ(stats.allocated_bytes[0].current, 0);
  EXPECT_EQ(stats.active[0].current, 0);
  EXPECT_EQ(stats.pending_blocks.current, 0);
  EXPECT_EQ(stats.reserved_bytes[0].current, 0);
  EXPECT_EQ(sim_->reserved_bytes(0), 0u);
}

// With one stream running, the peak of the aggregate is the recomputed running maximum, byte for
// byte, whether the calls took the fast path or not; reset_peak_stats starts it over from current.
TEST_F(Shards, PeakIsTheRecomputedMaximumWhenOneStreamRuns) {
  std::mt19937_64 rng(7);
  const Stream stream = streams_[0];
  std::vector<std::pair<void*, std::size_t>> held;
  std::int64_t current = 0, peak = 0;
  for (int op = 0; op < 4000; ++op) {
    if (held.size() < 16 && rng() % 2 == 0) {
      const std::size_t size = churn_size(rng, /*large=*/false);
      held.emplace_back(allocator_->allocate(size, 0, stream), size);
      current += static_cast<std::int64_t>(rounded(size));
      peak = std::max(peak, current);
    } else if (!held.empty()) {
      const std::size_t i = rng() % held.size();
      allocator_->deallocate(held[i].first, held[i].second, 0, stream);
      current -= static_cast<std::int64_t>(rounded(held[i].second));
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (op == 2000) {
      allocator_->reset_peak_stats(0);
      peak = current;
    }
  }
  const DeviceStats stats = allocator_->stats(0);
  EXPECT_EQ(stats.allocated_bytes[0].current, current);
  EXPECT_EQ(stats.allocated_bytes[0].peak, peak);
  ASSERT_NO_THROW(allocator_->validate());
  for (const auto& [ptr, size] : held) allocator_->deallocate(ptr, size, 0, stream);
}

// The fast path's refusals: each case goes to the device-locked path and ends as it did before.
TEST_F(Shards, FreesTheFastPathCannotFinishEndAsBefore) {
  const Stream a = streams_[0], b = streams_[1];
  void* warm = allocator_->allocate(4 * KiB, 0, a);
  allocator_->deallocate(warm, 4 * KiB, 0, a);  // kept in a's hot list

  // A wrong size: refused, nothing changes, the block stays live and can be freed right.
  void* p = allocator_->allocate(4 * KiB, 0, a);
  EXPECT_EQ(p, warm) << "the hot list serves the same size";
  EXPECT_THROW(allocator_->deallocate(p, 8 * KiB, 0, a), Error);
  EXPECT_EQ(allocator_->stats(0).allocation[0].current, 1);
  allocator_->deallocate(p, 4 * KiB, 0, a);
  // A double free of a hot block: the error names it, nothing changes.
  try {
    allocator_->deallocate(p, 4 * KiB, 0, a);
    FAIL() << "a double free was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(allocator_->stats(0).invalid_frees, 2);
  ASSERT_NO_THROW(allocator_->validate());

  // A free on another stream than the allocation stream: one more use, so the block waits for a fence.
  void* q = allocator_->allocate(4 * KiB, 0, a);
  allocator_->deallocate(q, 4 * KiB, 0, b);
  EXPECT_EQ(allocator_->stats(0).pending_blocks.current, 1);
  ASSERT_NO_THROW(allocator_->validate());
  allocator_->synchronize_fences();
  EXPECT_EQ(allocator_->stats(0).pending_blocks.current, 0);
  ASSERT_NO_THROW(allocator_->validate());
}

// allocate_cached / deallocate_cached (what the C ABI tries first): they serve the stream's hot list
// and nothing else, and a call they decline changes nothing, for the full call to decide.
TEST_F(Shards, CachedCallsServeTheHotListAndDeclineWithoutChanges) {
  Allocator& alloc = *allocator_;
  const Stream a = streams_[0], b = streams_[1];
  EXPECT_EQ(alloc.allocate_cached(4 * KiB, 0, a), nullptr) << "a stream never seen has no hot list";
  // Two full rounds: the block is kept in a's hot list, and the shard holds the headroom to take it.
  for (int round = 0; round < 2; ++round) alloc.deallocate(alloc.allocate(4 * KiB, 0, a), 4 * KiB, 0, a);

  EXPECT_EQ(alloc.allocate_cached(8 * KiB, 0, a), nullptr) << "no hot block of that size";
  EXPECT_EQ(alloc.allocate_cached(0, 0, a), nullptr);
  EXPECT_EQ(alloc.allocate_cached(4 * KiB, 1, a), nullptr) << "no device 1";
  EXPECT_EQ(alloc.stats(0).allocation[0].current, 0);
  void* p = alloc.allocate_cached(4 * KiB, 0, a);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(alloc.stats(0).allocation[0].current, 1);
  EXPECT_EQ(alloc.stats(0).requested_bytes[0].current, static_cast<std::int64_t>(4 * KiB));
  ASSERT_NO_THROW(alloc.validate());

  EXPECT_FALSE(alloc.deallocate_cached(p, 8 * KiB, 0, a)) << "a wrong size";
  EXPECT_FALSE(alloc.deallocate_cached(p, 4 * KiB, 0, b)) << "another stream's shard";
  EXPECT_FALSE(alloc.deallocate_cached(p, 4 * KiB, -1, a)) << "no device named";
  EXPECT_FALSE(alloc.deallocate_cached(p, 4 * KiB, 1, a)) << "no device 1";
  EXPECT_FALSE(alloc.deallocate_cached(nullptr, 0, 0, a));
  EXPECT_EQ(alloc.stats(0).allocation[0].current, 1);
  EXPECT_EQ(alloc.stats(0).invalid_frees, 0) << "a declined call counts nothing";
  ASSERT_NO_THROW(alloc.validate());

  EXPECT_TRUE(alloc.deallocate_cached(p, 4 * KiB, 0, a));
  EXPECT_EQ(alloc.stats(0).allocation[0].current, 0);
  EXPECT_EQ(alloc.stats(0).allocation[0].peak, 1);
  ASSERT_NO_THROW(alloc.validate());
  EXPECT_FALSE(alloc.deallocate_cached(p, 4 * KiB, 0, a)) << "a double free is the full call's to report";
  EXPECT_THROW(alloc.deallocate(p, 4 * KiB, 0, a), Error);

  alloc.shutdown();
  EXPECT_EQ(alloc.allocate_cached(4 * KiB, 0, a), nullptr) << "after shutdown";
}

// allocations_device_locked / frees_device_locked count the calls that took the device lock, and only
// those: a pair its stream's shard serves counts nothing; a miss, and a free of a block with another
// use, count one each.
TEST_F(Shards, DeviceLockedCallsAreCountedAndShardCallsAreNot) {
  Allocator& alloc = *allocator_;
  const Stream a = streams_[0], b = streams_[1];
  // The first pair misses (no block yet) and its free raises the inactive-split peak: both take the
  // device lock. That free leaves its headroom with the stream's shard, so from then on the shard
  // holds the block and the headroom (as CachedCallsServeTheHotList...).
  for (int round = 0; round < 2; ++round) alloc.deallocate(alloc.allocate(4 * KiB, 0, a), 4 * KiB, 0, a);
  const DeviceStats before = alloc.stats(0);
  EXPECT_EQ(before.allocations_device_locked, 1);
  EXPECT_EQ(before.frees_device_locked, 1);
  for (int i = 0; i < 10; ++i) alloc.deallocate(alloc.allocate(4 * KiB, 0, a), 4 * KiB, 0, a);
  DeviceStats after = alloc.stats(0);
  EXPECT_EQ(after.allocations_device_locked, before.allocations_device_locked) << "ten pairs from the hot list";
  EXPECT_EQ(after.frees_device_locked, before.frees_device_locked);
  EXPECT_EQ(after.allocations_cached, before.allocations_cached + 10);
  EXPECT_EQ(after.frees_cached, before.frees_cached + 10);
  EXPECT_EQ(after.device_lock_acquisitions, before.device_lock_acquisitions + 1) << "the stats call alone";
  // Per stream: the same counts, on the stream's own entry; the other stream has none.
  const StreamCounts& mine = after.per_stream_counts.at(a);
  EXPECT_EQ(mine.allocations_cached, after.allocations_cached);
  EXPECT_EQ(mine.allocations_device_locked, after.allocations_device_locked);
  EXPECT_EQ(mine.frees_cached, after.frees_cached);
  EXPECT_EQ(mine.frees_device_locked, after.frees_device_locked);
  EXPECT_EQ(after.per_stream_counts.count(b), 0u);

  void* used = alloc.allocate(4 * KiB, 0, a);
  alloc.record_stream(used, b);
  alloc.deallocate(used, 4 * KiB, 0, a);  // another use: pending, through the device lock
  after = alloc.stats(0);
  EXPECT_EQ(after.allocations_device_locked, before.allocations_device_locked);
  EXPECT_EQ(after.frees_device_locked, before.frees_device_locked + 1);
  ASSERT_NO_THROW(alloc.validate());
}

// Device-locked calls find a block through the index of shard blocks, whichever of many streams holds
// it: record_stream from another stream, frees that name another stream or none, and double frees of
// blocks kept in some stream's hot list.
TEST_F(Shards, DeviceLockedCallsFindBlocksAmongManyStreams) {
  std::vector<Stream> streams;
  for (int s = 0; s < 96; ++s) streams.push_back(sim_->create_stream(0));
  std::vector<std::pair<void*, Stream>> blocks;
  for (int round = 0; round < 3; ++round) {
    for (const Stream s : streams) blocks.emplace_back(allocator_->allocate(4 * KiB, 0, s), s);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto [ptr, stream] = blocks[i];
    const Stream other = streams[(i * 7 + 1) % streams.size()];
    if (i % 3 == 0) allocator_->record_stream(ptr, other);
    if (i % 3 == 1) {
      allocator_->deallocate(ptr, 4 * KiB, -1, other);  // one more use
    } else {
      allocator_->deallocate(ptr, 0, -1, i % 2 == 0 ? stream : 0);
    }
  }
  const DeviceStats stats = allocator_->stats(0);
  EXPECT_EQ(stats.allocation[0].current, 0);
  EXPECT_EQ(stats.record_stream_unknown_ptr, 0) << "record_stream did not find a live block";
  EXPECT_EQ(stats.pending_blocks.allocated, 2 * static_cast<std::int64_t>(blocks.size() / 3)) << "uses went missing";
  ASSERT_NO_THROW(allocator_->validate());
  // Each block is freed (pending, hot or in the free lists): a second free is refused by name.
  for (const auto& [ptr, stream] : blocks) EXPECT_THROW(allocator_->deallocate(ptr, 0, -1, 0), Error);
  EXPECT_EQ(allocator_->stats(0).invalid_frees, static_cast<std::int64_t>(blocks.size()));
  ASSERT_NO_THROW(allocator_->validate());
}

}  // namespace
}  // namespace streamalloc
