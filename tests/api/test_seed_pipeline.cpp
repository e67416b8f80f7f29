// The prefetch pipeline on the simulated device, under every reuse policy: each failure mode
// of the broken pipelines is observable, and the fixed pipeline never reads wrong bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "seed_pipeline.hpp"

namespace streamalloc::testing {
namespace {

class SeedPipeline : public ::testing::TestWithParam<CrossStreamReuse> {
 protected:
  std::string conf() const { return policy_conf(GetParam()); }
};

TEST_P(SeedPipeline, MissingRecordStreamGetsTheBlockReusedWhileTheConsumerReads) {
  PipelineOptions o;
  o.record_stream = false;
  EXPECT_GT(run_pipeline(conf(), o, 200, 64 * KiB).wrong, 0)
      << "without record_stream the allocator cannot know the consumer still reads the batch";
}

TEST_P(SeedPipeline, MissingWaitEventReadsBeforeTheProducerWrote) {
  PipelineOptions o;
  o.wait_event = false;
  o.consumer_first = true;
  EXPECT_GT(run_pipeline(conf(), o, 200, 64 * KiB).wrong, 0)
      << "record_stream protects memory, it does not order the consumer after the producer";
}

TEST_P(SeedPipeline, FixedPipelineNeverReadsWrongBytes) {
  PipelineOptions o;  // wait_event + record_stream
  EXPECT_EQ(run_pipeline(conf(), o, 1000, 64 * KiB).wrong, 0);
  o.consumer_first = true;
  EXPECT_EQ(run_pipeline(conf(), o, 1000, 3 * MiB).wrong, 0);
}

TEST_P(SeedPipeline, DoubleBufferedPipelineNeverReadsWrongBytes) {
  PipelineOptions o;
  o.double_buffered = true;
  EXPECT_EQ(run_pipeline(conf(), o, 1000, 64 * KiB).wrong, 0);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, SeedPipeline,
                         ::testing::Values(CrossStreamReuse::kNever, CrossStreamReuse::kSettled,
                                           CrossStreamReuse::kWait),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace streamalloc::testing
