// Deterministic multi-threaded stress: 8 threads, each with its own stream (per device), allocate,
// free and record their blocks on the other threads' streams, 20k operations each, with fixed seeds,
// in phases: between phases the threads stop with their blocks live, and the allocator must validate()
// (a quiescent point). The sizes vary, and many recur (a server's request sizes), so that the hot
// lists serve sizes freed before, across threads.
// Each thread tags its blocks and checks the tag before freeing, so memory handed to two threads at
// once shows up as a wrong tag here and as a data race under -fsanitize=thread. Afterwards the
// allocator must validate() and its stats must add up to what the threads did.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

constexpr int kThreads = 8;
constexpr int kOpsPerThread = 20000;
constexpr std::size_t kMaxLivePerThread = 64;
constexpr int kPhases = 4;  // validate() after each

// What one thread did, per device, to compare with the allocator's stats afterwards.
struct ThreadLog {
  std::vector<std::int64_t> allocations;   // successful non-null allocations
  std::vector<std::int64_t> record_calls;  // record_stream calls that reached the device
  std::vector<std::int64_t> ooms;          // allocations that failed with kOutOfMemory
  std::int64_t cross_device_rejects = 0;
  std::string failure;  // first unexpected outcome
};

struct LiveBlock {
  std::uint8_t* ptr;
  std::size_t size;
  int device;
  Stream stream;
  std::uint8_t tag;
};

// What one thread carries from phase to phase.
struct ThreadState {
  explicit ThreadState(int thread)
      : rng(0x5eed0000u + static_cast<unsigned>(thread)), next_tag(static_cast<std::uint64_t>(thread) * 37) {}
  std::mt19937_64 rng;
  std::vector<LiveBlock> live;
  std::uint64_t next_tag;
};

struct StressCase {
  const char* name;
  int devices;
  CrossStreamReuse policy;
};

void PrintTo(const StressCase& c, std::ostream* os) { *os << c.name; }

class Stress : public ::testing::TestWithParam<StressCase> {
 protected:
  void SetUp() override {
    const StressCase& c = GetParam();
    SimBackend::Config config;
    config.device_count = c.devices;
    config.mode = SimBackend::Mode::kEager;
    config.memory_per_device = 1 * GiB;
    sim_ = std::make_shared<SimBackend>(config);
    streams_.resize(static_cast<std::size_t>(c.devices));
    for (int d = 0; d < c.devices; ++d) {
      for (int t = 0; t < kThreads; ++t) streams_[d].push_back(sim_->create_stream(d));
    }
    Options options;
    options.backend = BackendKind::kSim;
    options.cross_stream_reuse = c.policy;
    options.log_level = "error";
    allocator_ = std::make_unique<Allocator>(options, sim_);
  }

  // `ops` more operations of `thread`; with `finish`, then frees its blocks.
  void run_thread(int thread, ThreadState& state, ThreadLog& log, int ops, bool finish);

  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> allocator_;
  std::vector<std::vector<Stream>> streams_;  // [device][thread]; written before the threads start
  std::atomic<std::int64_t> tag_failures_{0};
};

// Sizes that recur, as a server's do, small and large.
constexpr std::size_t kRecurring[] = {512,     1024,    4096,    8192,    65536,  262144,
                                      1 * MiB, 2 * MiB, 2359296, 3211264, 4 * MiB};

std::size_t random_size(std::mt19937_64& rng) {
  const std::uint64_t kind = rng() % 100;
  if (kind < 40) return kRecurring[rng() % (sizeof kRecurring / sizeof kRecurring[0])];
  if (kind < 80) {  // small, log-uniform 1 B .. 256 KiB
    const unsigned bits = 1 + static_cast<unsigned>(rng() % 18);
    const std::size_t low = std::size_t{1} << (bits - 1);
    return low + rng() % (low + 1);
  }
  if (kind < 98) return MiB + rng() % (3 * MiB);  // mid-size
  return 12 * MiB;                                // own segment
}

void Stress::run_thread(int thread, ThreadState& state, ThreadLog& log, int ops, bool finish) {
  const int devices = static_cast<int>(streams_.size());
  log.allocations.resize(static_cast<std::size_t>(devices), 0);
  log.record_calls.resize(static_cast<std::size_t>(devices), 0);
  log.ooms.resize(static_cast<std::size_t>(devices), 0);
  std::mt19937_64& rng = state.rng;
  std::vector<LiveBlock>& live = state.live;
  std::uint64_t& next_tag = state.next_tag;
  auto fail = [&](const std::string& what) {
    if (log.failure.empty()) log.failure = "thread " + std::to_string(thread) + ": " + what;
  };

  // In eager mode an enqueued item has run when enqueue() returns (possibly on another thread that
  // was draining the stream; the backend's lock orders it before our return).
  auto check_tag = [&](const LiveBlock& b, Stream on) {
    sim_->enqueue(b.device, on, [this, b] {
      if (b.ptr[0] != b.tag || b.ptr[b.size - 1] != b.tag) tag_failures_.fetch_add(1);
    });
  };
  auto free_block = [&](std::size_t index) {
    const LiveBlock b = live[index];
    live[index] = live.back();
    live.pop_back();
    check_tag(b, b.stream);
    const bool exact = rng() % 2 == 0;
    allocator_->deallocate(b.ptr, exact ? b.size : 0, exact ? b.device : -1, b.stream);
  };

  for (int op = 0; op < ops && log.failure.empty(); ++op) {
    const std::uint64_t r = rng() % 100;
    try {
      if (r < 40 && live.size() < kMaxLivePerThread) {
        const int device = static_cast<int>(rng() % static_cast<std::uint64_t>(devices));
        const Stream stream = streams_[device][thread];
        const std::size_t size = random_size(rng);
        void* ptr = nullptr;
        try {
          ptr = allocator_->allocate(size, device, stream);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kOutOfMemory) throw;
          ++log.ooms[static_cast<std::size_t>(
              device)];  // possible under pressure from all threads; the thread frees and goes on
          if (!live.empty()) free_block(0);
          continue;
        }
        if (ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % 512 != 0) {
          fail("allocate(" + std::to_string(size) + ") returned a null or unaligned pointer");
          break;
        }
        const LiveBlock b{static_cast<std::uint8_t*>(ptr), size, device, stream,
                          static_cast<std::uint8_t>(1 + next_tag++ % 254)};
        sim_->enqueue(device, stream, [b] {
          b.ptr[0] = b.tag;
          b.ptr[b.size - 1] = b.tag;
        });
        live.push_back(b);
        ++log.allocations[static_cast<std::size_t>(device)];
      } else if (r < 75 && !live.empty()) {
        free_block(rng() % live.size());
      } else if (r < 95 && !live.empty()) {
        // Another thread's stream reads the block: record it there.
        const LiveBlock& b = live[rng() % live.size()];
        int other = static_cast<int>(rng() % (kThreads - 1));
        if (other >= thread) ++other;
        const Stream stream = streams_[b.device][other];
        check_tag(b, stream);
        allocator_->record_stream(b.ptr, stream);
        ++log.record_calls[static_cast<std::size_t>(b.device)];
      } else if (r < 97 && devices > 1 && !live.empty()) {
        // A stream of another device is caller misuse: rejected, and nothing changes.
        const LiveBlock& b = live[rng() % live.size()];
        const Stream foreign = streams_[(b.device + 1) % devices][thread];
        try {
          allocator_->record_stream(b.ptr, foreign);
          fail("record_stream with a stream of another device was accepted");
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kInvalidArgument) throw;
          ++log.cross_device_rejects;
        }
      } else if (r < 99) {
        allocator_->process_fences();
      } else {
        allocator_->empty_cache();
      }
    } catch (const std::exception& e) {
      fail("op " + std::to_string(op) + ": unexpected exception: " + e.what());
    }
  }
  if (!finish) return;
  try {
    while (!live.empty()) free_block(live.size() - 1);
  } catch (const std::exception& e) {
    fail(std::string("final frees: unexpected exception: ") + e.what());
  }
}

TEST_P(Stress, ThreadsAllocateFreeAndRecordOnEachOthersStreams) {
  const int devices = GetParam().devices;
  std::vector<ThreadLog> logs(kThreads);
  std::vector<ThreadState> states;
  for (int t = 0; t < kThreads; ++t) states.emplace_back(t);
  for (int phase = 0; phase < kPhases; ++phase) {
    const bool last = phase == kPhases - 1;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(
          [this, t, last, &logs, &states] { run_thread(t, states[t], logs[t], kOpsPerThread / kPhases, last); });
    }
    for (auto& thread : threads) thread.join();
    for (const ThreadLog& log : logs) ASSERT_TRUE(log.failure.empty()) << log.failure;
    // A quiescent point: every thread has stopped, its blocks live, its hot lists as it left them.
    ASSERT_NO_THROW(allocator_->validate()) << "after phase " << phase;
  }

  EXPECT_EQ(tag_failures_.load(), 0) << "a block's tag changed while its thread still owned it";

  allocator_->synchronize_fences();
  ASSERT_NO_THROW(allocator_->validate());
  std::int64_t all_ooms = 0;
  for (int d = 0; d < devices; ++d) {
    std::int64_t allocations = 0, records = 0, ooms = 0;
    for (const ThreadLog& log : logs) {
      allocations += log.allocations[static_cast<std::size_t>(d)];
      records += log.record_calls[static_cast<std::size_t>(d)];
      ooms += log.ooms[static_cast<std::size_t>(d)];
    }
    all_ooms += ooms;
    const DeviceStats stats = allocator_->stats(d);
    SCOPED_TRACE("device " + std::to_string(d));
    EXPECT_GT(allocations, kThreads * kOpsPerThread / 10 / devices);
    EXPECT_EQ(stats.allocation[0].current, 0);
    EXPECT_EQ(stats.allocation[0].allocated, allocations);
    EXPECT_EQ(stats.allocation[0].freed, allocations);
    EXPECT_EQ(stats.allocated_bytes[0].current, 0);
    EXPECT_EQ(stats.requested_bytes[0].current, 0);
    EXPECT_EQ(stats.active[0].current, 0);
    EXPECT_EQ(stats.pending_blocks.current, 0);
    EXPECT_EQ(stats.pending_bytes.current, 0);
    EXPECT_EQ(stats.record_stream_calls, records);
    EXPECT_GT(stats.allocations_cached, allocations / 50) << "the hot lists served sizes that recur";
    EXPECT_EQ(stats.invalid_frees, 0);
    EXPECT_EQ(stats.num_ooms, ooms);
    EXPECT_EQ(stats.reserved_bytes[0].current, static_cast<std::int64_t>(sim_->reserved_bytes(d)));
    if (GetParam().policy == CrossStreamReuse::kNever) {
      EXPECT_EQ(stats.cross_stream_reuse_settled, 0);
    }
  }

  if (devices > 1) {
    std::int64_t rejects = 0;
    for (const ThreadLog& log : logs) rejects += log.cross_device_rejects;
    EXPECT_GT(rejects, 0) << "the cross-device misuse path never ran";
  }

  allocator_->empty_cache();
  for (int d = 0; d < devices; ++d) {
    EXPECT_EQ(allocator_->stats(d).reserved_bytes[0].current, 0) << "device " << d;
    EXPECT_EQ(sim_->reserved_bytes(d), 0u) << "device " << d;
  }
  ASSERT_NO_THROW(allocator_->validate());
  RecordProperty("ooms", static_cast<int>(all_ooms));
}

INSTANTIATE_TEST_SUITE_P(Stress, Stress,
                         ::testing::Values(StressCase{"settled", 1, CrossStreamReuse::kSettled},
                                           StressCase{"wait", 1, CrossStreamReuse::kWait},
                                           StressCase{"never", 1, CrossStreamReuse::kNever},
                                           StressCase{"two_devices", 2, CrossStreamReuse::kSettled}),
                         [](const ::testing::TestParamInfo<StressCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace streamalloc
