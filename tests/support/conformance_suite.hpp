// The conformance suite: behaviour every backend must give, under every reuse policy. Included by one
// file per test binary, which instantiates it for its backend: test_conformance_sim.cpp (simulated
// device, CPU suite) and gpu/test_conformance_cuda.cpp (CUDA, GPU suite).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "streamalloc/allocator.hpp"

namespace streamalloc::testing {

// What the suite needs from a device beyond the Backend seam: streams and a device-wide wait.
class ConformanceEnv {
 public:
  virtual ~ConformanceEnv() = default;
  virtual std::shared_ptr<Backend> backend() = 0;
  virtual Stream new_stream() = 0;                  // lives until the env is destroyed
  virtual void synchronize() = 0;                   // the device has finished all enqueued work
  virtual std::string skip_reason() { return ""; }  // non-empty: the backend is not available here
};

struct ConformanceParam {
  std::string backend_name;
  std::function<std::unique_ptr<ConformanceEnv>()> make_env;
  CrossStreamReuse policy;
  bool expandable_segments = false;  // the default pool grows expandable segments where the device can
};

class Conformance : public ::testing::TestWithParam<ConformanceParam> {
 protected:
  void SetUp() override {
    env_ = GetParam().make_env();
    const std::string reason = env_->skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    Options options;
    options.cross_stream_reuse = GetParam().policy;
    options.expandable_segments = GetParam().expandable_segments;
    options.log_level = "off";
    allocator_ = std::make_unique<Allocator>(options, env_->backend());
    a_ = env_->new_stream();
    b_ = env_->new_stream();
  }
  void TearDown() override {
    if (allocator_) {
      allocator_->validate();
      env_->synchronize();
      allocator_.reset();  // before the env destroys its streams
    }
  }
  Allocator& al() { return *allocator_; }
  DeviceStats stats() { return allocator_->stats(0); }

  std::unique_ptr<ConformanceEnv> env_;
  std::unique_ptr<Allocator> allocator_;
  Stream a_ = 0;
  Stream b_ = 0;
};

TEST_P(Conformance, AllocationsAreAlignedDistinctAndAccounted) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t size : {1ul, 511ul, 512ul, 4096ul, 1000000ul, 1048576ul, 3000000ul, 12000000ul, 25000000ul}) {
    for (Stream s : {a_, b_}) {
      void* p = al().allocate(size, 0, s);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
      for (const auto& [q, n] : live) {
        const auto x = reinterpret_cast<std::uintptr_t>(p), y = reinterpret_cast<std::uintptr_t>(q);
        EXPECT_TRUE(x + size <= y || y + n <= x) << "live blocks overlap";
      }
      live.emplace_back(p, size);
      EXPECT_EQ(al().requested_size_of(p), size);
    }
  }
  al().validate();
  EXPECT_EQ(stats().allocation[0].current, static_cast<std::int64_t>(live.size()));
  for (const auto& [p, n] : live) al().deallocate(p, n, 0, 0);
  al().validate();
  EXPECT_EQ(stats().allocation[0].current, 0);
  EXPECT_EQ(stats().requested_bytes[0].current, 0);
}

TEST_P(Conformance, SameStreamReuseIsImmediate) {
  void* p = al().allocate(64 * MiB, 0, a_);
  al().deallocate(p, 0, 0, a_);
  EXPECT_EQ(al().allocate(64 * MiB, 0, a_), p);
  EXPECT_EQ(stats().segment[0].current, 1);
}

TEST_P(Conformance, SettledBlocksCrossStreamsUnlessThePolicyIsNever) {
  void* p = al().allocate(64 * MiB, 0, a_);
  al().deallocate(p, 0, 0, a_);
  al().process_fences();
  env_->synchronize();
  void* q = al().allocate(64 * MiB, 0, b_);
  if (GetParam().policy == CrossStreamReuse::kNever) {
    EXPECT_NE(q, p);
  } else {
    EXPECT_EQ(q, p);
    EXPECT_EQ(stats().cross_stream_reuse_settled, 1);
  }
}

TEST_P(Conformance, RecordedBlocksComeBackAfterTheirStreamsFinish) {
  void* p = al().allocate(64 * MiB, 0, a_);
  al().record_stream(p, b_);
  al().deallocate(p, 0, 0, a_);
  env_->synchronize();
  al().process_fences();
  EXPECT_EQ(stats().pending_blocks.current, 0);
  EXPECT_EQ(al().allocate(64 * MiB, 0, a_), p);
}

TEST_P(Conformance, EmptyCacheReleasesEveryFreeSegment) {
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(al().allocate((i + 1) * 3 * MiB, 0, i % 2 ? a_ : b_));
  al().record_stream(blocks[0], a_);  // blocks[0] lives on b_: its free becomes pending
  for (std::size_t i = 0; i < blocks.size(); ++i) al().deallocate(blocks[i], 0, 0, i % 2 ? a_ : b_);
  al().empty_cache();
  EXPECT_EQ(stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(stats().pending_blocks.current, 0);
}

TEST_P(Conformance, OutOfMemoryIsAClearErrorAndRecoverable) {
  const double total = static_cast<double>(env_->backend()->memory_info(0).total_bytes);
  al().set_memory_fraction(std::min(1.0, 300.0 * MiB / total), 0);  // a cap of about 300 MiB
  std::vector<void*> held;
  try {
    for (int i = 0; i < 100; ++i) held.push_back(al().allocate(64 * MiB, 0, a_));
    FAIL() << "the cap was never reached";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("memory fraction cap"), std::string::npos) << e.what();
  }
  EXPECT_GE(held.size(), 3u);
  al().validate();
  for (void* p : held) al().deallocate(p, 0, 0, a_);
  EXPECT_NE(al().allocate(64 * MiB, 0, a_), nullptr);
  EXPECT_EQ(stats().num_ooms, 1);
}

TEST_P(Conformance, BadFreesChangeNothing) {
  auto* p = static_cast<char*>(al().allocate(4096, 0, a_));
  int foreign = 0;
  EXPECT_THROW(al().deallocate(&foreign, 0, 0, a_), Error);
  EXPECT_THROW(al().deallocate(p + 512, 0, 0, a_), Error);
  EXPECT_THROW(al().deallocate(p, 1, 0, a_), Error);
  al().validate();
  EXPECT_EQ(stats().allocation[0].current, 1);
  al().deallocate(p, 4096, 0, a_);
  EXPECT_THROW(al().deallocate(p, 4096, 0, a_), Error);
  EXPECT_EQ(stats().invalid_frees, 4);
}

TEST_P(Conformance, RandomWalkKeepsEveryInvariant) {
  std::mt19937_64 rng(1234);
  std::vector<std::pair<void*, Stream>> live;
  const Stream streams[] = {a_, b_};
  for (int op = 0; op < 3000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5 || live.empty()) {
      const std::size_t size = std::size_t{1} << (rng() % 25);  // 1 B .. 16 MiB
      const Stream s = streams[rng() % 2];
      live.emplace_back(al().allocate(size, 0, s), s);
    } else if (kind < 8) {
      const std::size_t i = rng() % live.size();
      al().deallocate(live[i].first, 0, 0, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (kind == 8) {
      al().record_stream(live[rng() % live.size()].first, streams[rng() % 2]);
    } else {
      al().process_fences();
    }
    if (op % 100 == 0) al().validate();
  }
  for (const auto& [p, s] : live) al().deallocate(p, 0, 0, s);
  env_->synchronize();
  al().synchronize_fences();
  al().validate();
  EXPECT_EQ(stats().allocation[0].current, 0);
  EXPECT_EQ(stats().pending_blocks.current, 0);
}

inline std::vector<ConformanceParam> conformance_params(const std::string& backend_name,
                                                        std::function<std::unique_ptr<ConformanceEnv>()> make_env) {
  std::vector<ConformanceParam> params;
  for (bool expandable : {false, true}) {
    for (CrossStreamReuse policy : {CrossStreamReuse::kNever, CrossStreamReuse::kSettled, CrossStreamReuse::kWait}) {
      params.push_back({backend_name, make_env, policy, expandable});
    }
  }
  return params;
}

inline std::string conformance_name(const ::testing::TestParamInfo<ConformanceParam>& info) {
  return info.param.backend_name + "_" + to_string(info.param.policy) +
         (info.param.expandable_segments ? "_expandable" : "");
}

// How gtest prints a parameter (test listings, failures): "backend sim, cross_stream_reuse never"
// rather than the bytes of the struct.
inline void PrintTo(const ConformanceParam& param, std::ostream* os) {
  *os << "backend " << param.backend_name << ", cross_stream_reuse " << to_string(param.policy)
      << ", expandable_segments " << (param.expandable_segments ? "true" : "false");
}

}  // namespace streamalloc::testing
