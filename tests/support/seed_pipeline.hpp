// The prefetch pipeline on the simulated device, shared by the tests: a producer stream fills a
// batch, a consumer stream reads it, the batch is freed and the next one allocated. Manual mode lets
// the test put the producer ahead of the consumer, the timing under which a pipeline missing its
// wait_event or record_stream reads wrong data (random NaNs and loss spikes on a GPU).
#pragma once

#include <cstring>
#include <memory>
#include <string>

#include "sim_fixture.hpp"

namespace streamalloc::testing {

struct PipelineOptions {
  bool wait_event = true;        // consumer waits for the producer's event
  bool record_stream = true;     // batch recorded on the consumer before it is freed
  bool consumer_first = false;   // run the consumer's queued work before the producer's each step
  int consumer_lag = 4;          // the consumer runs only every N iterations (it is slow)
  bool double_buffered = false;  // double-buffered: one event per buffer, consumer one batch behind
};

struct PipelineResult {
  int wrong = 0;     // consumer reads that saw bytes other than the batch's value
  int poisoned = 0;  // of those, reads that saw the 0xFF poison
  DeviceStats stats;
  PendingHistory pending_history;  // empty unless the conf sets pending_history
};

// Runs the pipeline; with check_sync on, the test's own event records and waits are reported to the
// allocator as PyTorch's GPU trace callbacks would.
inline PipelineResult run_pipeline(const std::string& conf, const PipelineOptions& o, int iterations,
                                   std::size_t batch_bytes) {
  SimSetup s(conf);
  SimBackend& sim = *s.sim;
  const Stream producer = sim.create_stream();
  const Stream consumer = sim.create_stream();
  const Event events[2] = {sim.create_event(0), sim.create_event(0)};
  auto result = std::make_shared<PipelineResult>();
  unsigned char* pending_batch = nullptr;  // double-buffered: the batch the consumer reads next
  unsigned char pending_value = 0;
  auto record = [&](Event e, Stream st) {
    sim.record_event(0, e, st);
    s.a().note_event_record(reinterpret_cast<std::uintptr_t>(e), st);
  };
  auto wait = [&](Stream st, Event e) {
    sim.stream_wait_event(0, st, e);
    s.a().note_event_wait(reinterpret_cast<std::uintptr_t>(e), st);
  };
  auto consume = [&](unsigned char* batch, unsigned char value) {
    sim.enqueue(0, consumer, [=] {  // the model's forward reads the whole batch
      for (std::size_t k = 0; k < batch_bytes; k += 64) {
        if (batch[k] != value) {
          ++result->wrong;
          if (batch[k] == 0xFF) ++result->poisoned;
          return;
        }
      }
    });
    if (o.record_stream) s.a().record_stream(batch, consumer);
    s.a().deallocate(batch, batch_bytes, 0, producer);  // the Python reference is overwritten
  };
  for (int i = 0; i < iterations; ++i) {
    const Event produced = events[o.double_buffered ? i % 2 : 0];
    auto* batch = static_cast<unsigned char*>(s.a().allocate(batch_bytes, 0, producer));
    const auto value = static_cast<unsigned char>(i % 251 + 1);
    sim.enqueue(0, producer, [=] { std::memset(batch, value, batch_bytes); });  // the H2D copy
    record(produced, producer);
    if (o.double_buffered) {
      // Consume the previous batch while this one is in flight.
      if (pending_batch != nullptr) consume(pending_batch, pending_value);
      if (o.wait_event) wait(consumer, produced);
      pending_batch = batch;
      pending_value = value;
    } else {
      if (o.wait_event) wait(consumer, produced);
      consume(batch, value);
    }
    const bool consumer_turn = (i % o.consumer_lag) == o.consumer_lag - 1;
    if (o.consumer_first && consumer_turn) sim.advance(0, consumer, SIZE_MAX);
    sim.advance(0, producer, SIZE_MAX);  // the producer runs ahead
    if (!o.consumer_first && consumer_turn) sim.advance(0, consumer, SIZE_MAX);
    if (i % 64 == 0) s.a().validate();
  }
  if (pending_batch != nullptr) consume(pending_batch, pending_value);
  sim.synchronize_all();
  s.a().synchronize_fences();
  s.a().validate();
  for (Event e : events) sim.destroy_event(0, e);
  result->stats = s.stats();
  result->pending_history = s.a().pending_history(0);
  return *result;
}

}  // namespace streamalloc::testing
