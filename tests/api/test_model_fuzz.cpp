// Model-based random testing of Allocator: fixed-seed operation sequences on a manual SimBackend,
// checked against the reference model after every step (tests/support/fuzz_ops.hpp says what is checked).
//
// The default run is at least 10^6 operations over all cases; STREAMALLOC_FUZZ_OPS=N sets the
// operations per case (e.g. 2000 for a quick run, 10000000 for a soak), and STREAMALLOC_FUZZ_SEED=K
// adds K to every case's seed, so a soak can explore new sequences. A failure names the case,
// the seed and the op index, and lists the operations that led there.
//
// Replaying: the seed fixes the operations, but the allocator's best-fit choices also depend on the
// host addresses the simulated device hands out, which depend on what the process allocated before.
// ctest runs every case in a process of its own, so running the one case alone reproduces a ctest
// failure exactly: --gtest_filter='ModelFuzz/ModelFuzz.*/wait_seed2', optionally with
// STREAMALLOC_FUZZ_OPS=<failing op + 1> to stop right there (a shorter run repeats the same prefix).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_ops.hpp"

namespace streamalloc::testing {
namespace {

constexpr std::uint64_t kDefaultOpsPerCase = 150000;  // x 11 cases = 1.65 x 10^6

// An unsigned integer from the environment, or `fallback` when unset.
std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || text[0] == '-') {
    ADD_FAILURE() << name << " must be an unsigned integer, got '" << text << "'";
    return fallback;
  }
  return value;
}

struct FuzzCase {
  const char* name;
  CrossStreamReuse policy;
  std::uint64_t seed;
  int streams;
  std::size_t memory_limit;
  bool expandable_segments = false;
  bool expandable_ipc = false;
};

void PrintTo(const FuzzCase& c, std::ostream* os) { *os << c.name; }

class ModelFuzz : public ::testing::TestWithParam<FuzzCase> {};

TEST_P(ModelFuzz, RandomOperationsKeepEveryInvariant) {
  const FuzzCase& c = GetParam();
  FuzzConfig config;
  config.policy = c.policy;
  config.streams = c.streams;
  config.memory_limit = c.memory_limit;
  config.expandable_segments = c.expandable_segments;
  config.expandable_ipc = c.expandable_ipc;

  const std::uint64_t ops = env_number("STREAMALLOC_FUZZ_OPS", kDefaultOpsPerCase);
  if (ops == 0) GTEST_SKIP() << "STREAMALLOC_FUZZ_OPS=0: no operations to run";
  const std::uint64_t seed = c.seed + env_number("STREAMALLOC_FUZZ_SEED", 0);
  RandomSource source(seed);
  OpRunner runner(config);
  for (std::uint64_t i = 0; i < ops; ++i) {
    if (!runner.step(decode_op(source, config))) break;
  }
  runner.finish();
  ASSERT_TRUE(runner.failure().empty()) << "case " << c.name << " (cross_stream_reuse:" << to_string(c.policy)
                                        << (c.expandable_segments ? ", expandable_segments" : "") << ", seed " << seed
                                        << ", " << c.streams << " streams, " << c.memory_limit / MiB
                                        << " MiB): " << runner.failure() << "\nlast operations:\n"
                                        << runner.trace();
  EXPECT_EQ(runner.ops(), ops);

  // The run must have exercised what it claims to check: reads that could see a reused block, and
  // (in long runs) the out-of-memory path, allocations routed to a capture's pool, and restored
  // checkpoints.
  EXPECT_GT(runner.tag_checks(), ops / 10);
  if (ops >= 20000) {
    EXPECT_GT(runner.ooms(), 0u);
    EXPECT_GT(runner.pool_allocations(), 0u);
    EXPECT_GT(runner.restores(), 0u);
  }
  RecordProperty("ops", static_cast<int>(runner.ops()));
  RecordProperty("tag_checks", static_cast<int>(runner.tag_checks()));
  RecordProperty("ooms", static_cast<int>(runner.ooms()));
  RecordProperty("must_fit_allocations", static_cast<int>(runner.must_fit_allocations()));
  RecordProperty("pool_allocations", static_cast<int>(runner.pool_allocations()));
  RecordProperty("restores", static_cast<int>(runner.restores()));
}

INSTANTIATE_TEST_SUITE_P(
    ModelFuzz, ModelFuzz,
    ::testing::Values(FuzzCase{"settled_seed1", CrossStreamReuse::kSettled, 1, 2, 64 * MiB},
                      FuzzCase{"settled_seed2", CrossStreamReuse::kSettled, 2, 3, 128 * MiB},
                      FuzzCase{"settled_seed3", CrossStreamReuse::kSettled, 3, 4, 256 * MiB},
                      FuzzCase{"wait_seed1", CrossStreamReuse::kWait, 1, 2, 64 * MiB},
                      FuzzCase{"wait_seed2", CrossStreamReuse::kWait, 2, 3, 128 * MiB},
                      FuzzCase{"wait_seed3", CrossStreamReuse::kWait, 3, 4, 256 * MiB},
                      FuzzCase{"never_seed1", CrossStreamReuse::kNever, 1, 3, 128 * MiB},
                      FuzzCase{"expandable_settled_seed1", CrossStreamReuse::kSettled, 1, 2, 64 * MiB, true},
                      FuzzCase{"expandable_settled_seed3", CrossStreamReuse::kSettled, 3, 4, 256 * MiB, true},
                      FuzzCase{"expandable_wait_seed2", CrossStreamReuse::kWait, 2, 3, 128 * MiB, true},
                      FuzzCase{"expandable_never_seed1", CrossStreamReuse::kNever, 1, 3, 128 * MiB, true},
                      FuzzCase{"expandable_ipc_settled_seed2", CrossStreamReuse::kSettled, 2, 3, 128 * MiB, true,
                               true}),
    [](const ::testing::TestParamInfo<FuzzCase>& info) { return std::string(info.param.name); });

// The same seed must give the same operations on every platform, or a reported seed is useless.
TEST(ModelFuzzDecoding, SeedsReplayAndBytesDecodeDeterministically) {
  FuzzConfig config;
  RandomSource a(42), b(42);
  for (int i = 0; i < 1000; ++i) {
    const Op x = decode_op(a, config);
    const Op y = decode_op(b, config);
    ASSERT_EQ(x.kind, y.kind);
    ASSERT_EQ(x.size, y.size);
    ASSERT_EQ(x.pick, y.pick);
    ASSERT_EQ(x.stream, y.stream);
  }
  const std::uint8_t bytes[] = {0x10, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06};
  ByteSource source(bytes, sizeof bytes);
  EXPECT_EQ(source.below(1000), 0x0010u);  // two little-endian bytes, mod 1000
  EXPECT_EQ(source.below(256), 0x01u);
  EXPECT_FALSE(source.exhausted());
  EXPECT_EQ(source.below(UINT32_MAX), 0x05040302u);  // four bytes
  EXPECT_FALSE(source.exhausted());
  EXPECT_EQ(source.below(256), 0x06u);
  EXPECT_TRUE(source.exhausted());
  EXPECT_EQ(source.below(1000), 0u);  // exhausted input reads as zeros
}

}  // namespace
}  // namespace streamalloc::testing
