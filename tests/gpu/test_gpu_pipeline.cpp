// The prefetch pipeline in raw CUDA on the Allocator: a producer stream fills a fresh batch, a consumer
// stream waits for it and sums it, the batch is record_stream'ed on the consumer and freed at once,
// and the next iteration allocates again. Every checksum of every iteration is checked, under every
// cross_stream_reuse policy, with one consumer and with four.
//
// The hazard tests show the bug the product guards against: without record_stream the allocator
// (like any stream-ordered cache) hands the batch out again while the consumer still reads it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "gpu/kernels.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::gpu_test {
namespace {

constexpr int kIterations = 10'000;
constexpr std::size_t kChunk = 1000;  // results are copied back and checked every kChunk iterations
constexpr std::uint32_t kSeed = 12345;
// Every kLagEvery iterations the consumer spins a little, so the producer runs ahead and the
// allocator has pending batches to keep from it.
constexpr int kLagEvery = 64;
constexpr std::uint64_t kLagUs = 200;

struct PipelineResult {
  int mismatches = 0;
  std::string first_mismatches;  // up to five, for the failure message
};

// Runs kIterations of the pipeline, consumers taking turns; batches of 4 KiB .. 4 MiB.
PipelineResult run_pipeline(Allocator& allocator, TestStream& producer, std::deque<TestStream>& consumers) {
  TestEvent ready;
  DeviceArray<std::uint64_t> sums(kChunk);
  std::vector<std::uint64_t> expected(kChunk);
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<std::size_t> batch_words(KiB, MiB);
  PipelineResult result;

  for (int i = 0; i < kIterations; ++i) {
    TestStream& consumer = consumers[static_cast<std::size_t>(i) % consumers.size()];
    const std::size_t words = batch_words(rng);
    const auto value = static_cast<std::uint32_t>(i) * 2654435761u + 1u;
    const std::size_t slot = static_cast<std::size_t>(i) % kChunk;

    void* batch = allocator.allocate(words * 4, 0, producer.id());
    fill_u32(as_words(batch), words, value, producer);
    ready.record(producer);
    ready.make_wait(consumer);
    if (i % kLagEvery == 0) spin(consumer, kLagUs);
    checksum_u32(as_words(batch), words, sums.data() + slot, consumer);
    allocator.record_stream(batch, consumer.id());
    allocator.deallocate(batch);
    expected[slot] = expected_checksum(words, value);

    if (slot == kChunk - 1 || i == kIterations - 1) {
      for (TestStream& c : consumers) c.synchronize();
      const std::vector<std::uint64_t> got = sums.to_host(slot + 1);
      for (std::size_t k = 0; k <= slot; ++k) {
        if (got[k] == expected[k]) continue;
        if (++result.mismatches <= 5) {
          result.first_mismatches += " iteration " + std::to_string(i - static_cast<int>(slot) + static_cast<int>(k)) +
                                     ": got " + std::to_string(got[k]) + ", expected " + std::to_string(expected[k]) +
                                     ";";
        }
      }
    }
  }
  return result;
}

class GpuPipeline : public GpuTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void run_with_consumers(std::size_t consumer_count) {
    TestStream producer;
    std::deque<TestStream> consumers(consumer_count);
    Allocator allocator(policy_options(GetParam()), make_cuda_backend());
    const auto start = std::chrono::steady_clock::now();
    const PipelineResult result = run_pipeline(allocator, producer, consumers);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(result.mismatches, 0) << "wrong checksums:" << result.first_mismatches;

    const DeviceStats stats = allocator.stats(0);
    print_summary(std::to_string(kIterations) + " iterations, " + std::to_string(consumer_count) +
                      " consumer(s), cross_stream_reuse:" + GetParam() + ", " + std::to_string(seconds) + " s",
                  stats);
    EXPECT_EQ(stats.record_stream_calls, kIterations);
    EXPECT_EQ(stats.allocation[0].current, 0);
    allocator.synchronize_fences();
    EXPECT_EQ(allocator.stats(0).pending_blocks.current, 0);
    allocator.validate();
  }
};

TEST_P(GpuPipeline, OneConsumerSeesEveryBatchIntact) { run_with_consumers(1); }

TEST_P(GpuPipeline, FourConsumersRoundRobinSeeEveryBatchIntact) { run_with_consumers(4); }

INSTANTIATE_TEST_SUITE_P(Policies, GpuPipeline, ::testing::Values("never", "settled", "wait"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// What one hazard run observed.
struct HazardRun {
  void* batch = nullptr;
  void* reallocated = nullptr;
  bool consumer_was_reading = false;
  bool consumer_read_overwritten_data = false;
};

constexpr std::size_t kHazardBytes = 64 * MiB;  // own segment: where it goes is deterministic
constexpr std::uint64_t kHazardSpinUs = 500'000;

// One iteration of the pipeline with a slow consumer (a long spin before it reads), under
// cross_stream_reuse:never, then at once the next iteration's allocation of the same size.
HazardRun run_hazard(bool record_stream) {
  TestStream producer, consumer;
  TestEvent ready, consumer_done;
  DeviceArray<std::uint64_t> sum(1);
  Allocator allocator(policy_options("never"), make_cuda_backend());
  const std::size_t words = kHazardBytes / 4;
  HazardRun run;

  run.batch = allocator.allocate(kHazardBytes, 0, producer.id());
  fill_u32(as_words(run.batch), words, 1, producer);
  ready.record(producer);
  ready.make_wait(consumer);  // the wait is there in both runs: the consumer reads the right batch
  spin(consumer, kHazardSpinUs);
  checksum_u32(as_words(run.batch), words, sum.data(), consumer);
  consumer_done.record(consumer);
  if (record_stream) allocator.record_stream(run.batch, consumer.id());
  allocator.deallocate(run.batch);

  run.reallocated = allocator.allocate(kHazardBytes, 0, producer.id());
  fill_u32(as_words(run.reallocated), words, 2, producer);  // the next iteration's batch
  run.consumer_was_reading = consumer_done.pending();
  consumer.synchronize();
  run.consumer_read_overwritten_data = sum.at(0) != expected_checksum(words, 1);
  allocator.deallocate(run.reallocated);
  allocator.synchronize_fences();
  allocator.validate();
  return run;
}

using GpuPipelineHazard = GpuTest;

// Negative control: the allocation stream's order says nothing about the consumer, so without
// record_stream the batch is handed out again while the consumer still has to read it. (Whether the
// consumer then sees the new data depends on timing, so only the address reuse is asserted.)
TEST_F(GpuPipelineHazard, WithoutRecordStreamTheBatchIsReusedWhileTheConsumerReads) {
  const HazardRun run = run_hazard(/*record_stream=*/false);
  ASSERT_TRUE(run.consumer_was_reading) << "the consumer finished before the reallocation; the control proves nothing";
  EXPECT_EQ(run.reallocated, run.batch) << "expected the unprotected batch to be handed out again at once";
  std::printf("[ streamalloc ] without record_stream the consumer %s\n",
              run.consumer_read_overwritten_data ? "read the NEXT iteration's data (the missing-wait bug)"
                                                 : "happened to read intact data this time");
}

TEST_F(GpuPipelineHazard, WithRecordStreamTheBatchIsHeldBackWhileTheConsumerReads) {
  const HazardRun run = run_hazard(/*record_stream=*/true);
  ASSERT_TRUE(run.consumer_was_reading) << "the consumer finished before the reallocation; the test proves nothing";
  EXPECT_NE(run.reallocated, run.batch);
  EXPECT_FALSE(run.consumer_read_overwritten_data);
}

}  // namespace
}  // namespace streamalloc::gpu_test
