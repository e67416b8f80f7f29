// The seed's prefetch pipeline on the simulated device (../shared/seeds/000): a producer stream fills a
// batch, a consumer stream reads it, the batch is freed and the next one allocated. Manual mode lets the
// test put the producer ahead of the consumer, the timing under which the seed's author saw random NaNs.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

struct PipelineOptions {
  bool wait_event = true;      // consumer waits for the producer's event
  bool record_stream = true;   // batch recorded on the consumer before it is freed
  bool consumer_first = false; // run the consumer's queued work before the producer's each step
  int consumer_lag = 4;        // the consumer runs only every N iterations (it is slow)
};

// Returns how many iterations the consumer saw the wrong bytes.
int run_pipeline(const std::string& conf, const PipelineOptions& o, int iterations, std::size_t batch_bytes) {
  SimSetup s(conf);
  SimBackend& sim = *s.sim;
  const Stream producer = sim.create_stream();
  const Stream consumer = sim.create_stream();
  const Event produced = sim.create_event(0);
  auto wrong = std::make_shared<int>(0);
  for (int i = 0; i < iterations; ++i) {
    auto* batch = static_cast<unsigned char*>(s.a().allocate(batch_bytes, 0, producer));
    const auto value = static_cast<unsigned char>(i % 251 + 1);
    sim.enqueue(0, producer, [=] { std::memset(batch, value, batch_bytes); });  // the H2D copy
    sim.record_event(0, produced, producer);
    if (o.wait_event) sim.stream_wait_event(0, consumer, produced);
    sim.enqueue(0, consumer, [=] {  // the model's forward reads the whole batch
      for (std::size_t k = 0; k < batch_bytes; k += 64) {
        if (batch[k] != value) {
          ++*wrong;
          return;
        }
      }
    });
    if (o.record_stream) s.a().record_stream(batch, consumer);
    s.a().deallocate(batch, batch_bytes, 0, producer);  // the Python reference is overwritten
    const bool consumer_turn = (i % o.consumer_lag) == o.consumer_lag - 1;
    if (o.consumer_first && consumer_turn) sim.advance(0, consumer, SIZE_MAX);
    sim.advance(0, producer, SIZE_MAX);  // the producer runs ahead
    if (!o.consumer_first && consumer_turn) sim.advance(0, consumer, SIZE_MAX);
    if (i % 64 == 0) s.a().validate();
  }
  sim.synchronize_all();
  s.a().synchronize_fences();
  s.a().validate();
  sim.destroy_event(0, produced);
  return *wrong;
}

class SeedPipeline : public ::testing::TestWithParam<CrossStreamReuse> {
 protected:
  std::string conf() const { return policy_conf(GetParam()); }
};

TEST_P(SeedPipeline, MissingRecordStreamGetsTheBlockReusedWhileTheConsumerReads) {
  PipelineOptions o;
  o.record_stream = false;
  EXPECT_GT(run_pipeline(conf(), o, 200, 64 * KiB), 0)
      << "without record_stream the allocator cannot know the consumer still reads the batch";
}

TEST_P(SeedPipeline, MissingWaitEventReadsBeforeTheProducerWrote) {
  PipelineOptions o;
  o.wait_event = false;
  o.consumer_first = true;
  EXPECT_GT(run_pipeline(conf(), o, 200, 64 * KiB), 0)
      << "record_stream protects memory, it does not order the consumer after the producer";
}

TEST_P(SeedPipeline, FixedPipelineNeverReadsWrongBytes) {
  PipelineOptions o;  // wait_event + record_stream
  EXPECT_EQ(run_pipeline(conf(), o, 1000, 64 * KiB), 0);
  o.consumer_first = true;
  EXPECT_EQ(run_pipeline(conf(), o, 1000, 3 * MiB), 0);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, SeedPipeline,
                         ::testing::Values(CrossStreamReuse::kNever, CrossStreamReuse::kSettled,
                                           CrossStreamReuse::kWait),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace streamalloc::testing
