// SimBackend: the simulated device every CPU test stands on. These tests pin down the CUDA semantics it
// models (stream order, last-record events, waits, host syncs), its memory limit, its errors and its
// thread safety; in particular that the prefetch pipeline's missing-wait bug is observable on it.
#include "streamalloc/sim_backend.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"

namespace streamalloc {
namespace {

SimBackend::Config manual_config(int devices = 1, std::size_t memory = 64 * MiB) {
  SimBackend::Config config;
  config.device_count = devices;
  config.memory_per_device = memory;
  config.mode = SimBackend::Mode::kManual;
  return config;
}

SimBackend::Config eager_config() {
  SimBackend::Config config = manual_config();
  config.mode = SimBackend::Mode::kEager;
  return config;
}

using testing::expect_backend_error;

TEST(SimBackendMemory, ReserveReleaseAndMemoryInfo) {
  SimBackend sim(manual_config(2, 10 * MiB));
  EXPECT_EQ(sim.name(), "sim");
  EXPECT_EQ(sim.device_count(), 2);
  void* a = sim.reserve(0, 4 * MiB);
  void* b = sim.reserve(0, 4 * MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(sim.reserve(0, 4 * MiB), nullptr) << "12 MiB would exceed the 10 MiB device";
  EXPECT_EQ(sim.reserved_bytes(0), 8 * MiB);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 2 * MiB);
  EXPECT_EQ(sim.memory_info(0).total_bytes, 10 * MiB);
  EXPECT_EQ(sim.memory_info(1).free_bytes, 10 * MiB) << "devices have separate limits";

  std::memset(a, 0x5A, 4 * MiB);  // real, writable host memory
  sim.release(0, a, 4 * MiB);
  EXPECT_EQ(sim.reserved_bytes(0), 4 * MiB);
  EXPECT_NE(sim.reserve(0, 6 * MiB), nullptr) << "released memory is available again";
  EXPECT_EQ(sim.counters().reserve_calls, 4u);
  EXPECT_EQ(sim.counters().release_calls, 1u);
  // b and the 6 MiB block are deliberately left reserved: the destructor frees them (ASan checks).
}

TEST(SimBackendMemory, ReservationsAre512ByteAligned) {
  SimBackend sim(manual_config());
  for (std::size_t bytes : {std::size_t{1}, std::size_t{511}, std::size_t{513}, std::size_t{4096} + 7, 2 * MiB}) {
    void* ptr = sim.reserve(0, bytes);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 512, 0u) << bytes << " bytes";
    std::memset(ptr, 0, bytes);
  }
}

TEST(SimBackendMemory, LoweredLimitRefusesAndReportsNoFreeMemory) {
  SimBackend sim(manual_config(1, 8 * MiB));
  void* ptr = sim.reserve(0, 6 * MiB);
  ASSERT_NE(ptr, nullptr);
  sim.set_memory_limit(0, 4 * MiB);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 0u);
  EXPECT_EQ(sim.memory_info(0).total_bytes, 4 * MiB);
  EXPECT_EQ(sim.reserve(0, 512), nullptr);
  sim.release(0, ptr, 6 * MiB);
  EXPECT_NE(sim.reserve(0, 4 * MiB), nullptr);
}

TEST(SimBackendEvents, NeverRecordedEventIsComplete) {
  SimBackend sim(manual_config());
  Event event = sim.create_event(0);
  EXPECT_TRUE(sim.query_event(0, event));
  sim.synchronize_event(0, event);  // returns at once
  sim.destroy_event(0, event);
  EXPECT_EQ(sim.counters().events_created, 1u);
  EXPECT_EQ(sim.counters().events_destroyed, 1u);
}

TEST(SimBackendEvents, ManualRecordCompletesOnlyWhenAdvancedPastIt) {
  SimBackend sim(manual_config());
  Stream stream = sim.create_stream(0);
  Event event = sim.create_event(0);
  int ran = 0;
  sim.enqueue(0, stream, [&] { ++ran; });
  sim.record_event(0, event, stream);
  EXPECT_FALSE(sim.query_event(0, event));
  EXPECT_EQ(sim.queued_items(0, stream), 2u);
  EXPECT_EQ(sim.advance(0, stream), 1u);
  EXPECT_EQ(ran, 1);
  EXPECT_FALSE(sim.query_event(0, event)) << "the work ran, the record has not";
  EXPECT_EQ(sim.advance(0, stream), 1u);
  EXPECT_TRUE(sim.query_event(0, event));
  EXPECT_EQ(sim.advance(0, stream), 0u) << "empty queue";
  EXPECT_EQ(sim.queued_items(0, stream), 0u);
}

TEST(SimBackendEvents, QueryReflectsTheLastRecordOnly) {
  SimBackend sim(manual_config());
  Stream stream = sim.create_stream(0);
  Event event = sim.create_event(0);
  sim.record_event(0, event, stream);
  sim.enqueue(0, stream, [] {});
  sim.record_event(0, event, stream);
  EXPECT_EQ(sim.advance(0, stream, 2), 2u);  // the first record and the work
  EXPECT_FALSE(sim.query_event(0, event)) << "the second record has not run";
  sim.advance(0, stream);
  EXPECT_TRUE(sim.query_event(0, event));
}

TEST(SimBackendEvents, WaitKeepsTheRecordThatWasLastWhenItWasEnqueued) {
  // A wait refers to the record that was last at wait time; re-recording the event on another stream
  // that then runs first must not release it.
  SimBackend sim(manual_config());
  Stream a = sim.create_stream(0);
  Stream b = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  Event event = sim.create_event(0);
  sim.record_event(0, event, a);
  sim.stream_wait_event(0, consumer, event);
  bool consumed = false;
  sim.enqueue(0, consumer, [&] { consumed = true; });
  sim.record_event(0, event, b);
  sim.advance(0, b);
  EXPECT_TRUE(sim.query_event(0, event)) << "the last record (on b) has run";
  EXPECT_EQ(sim.advance(0, consumer, 2), 0u) << "still waiting for the record on a";
  EXPECT_FALSE(consumed);
  sim.advance(0, a);
  EXPECT_EQ(sim.advance(0, consumer, 2), 2u);
  EXPECT_TRUE(consumed);
}

TEST(SimBackendEvents, DestroyingAnEventWithAQueuedRecordIsSafe) {
  SimBackend sim(manual_config());
  Stream producer = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  Event event = sim.create_event(0);
  sim.record_event(0, event, producer);
  sim.stream_wait_event(0, consumer, event);
  sim.destroy_event(0, event);  // allowed by CUDA; the queued record and wait still work
  EXPECT_EQ(sim.advance(0, consumer), 0u);
  sim.synchronize_stream(0, consumer);
  EXPECT_EQ(sim.queued_items(0, producer), 0u);
  expect_backend_error([&] { sim.query_event(0, event); }, {"query_event", "unknown event"});
}

TEST(SimBackendStreams, WaitHoldsBackConsumerUntilProducerPassesTheRecord) {
  SimBackend sim(manual_config());
  Stream producer = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  Event event = sim.create_event(0);
  std::vector<std::string> order;
  sim.enqueue(0, producer, [&] { order.push_back("produce"); });
  sim.record_event(0, event, producer);
  sim.stream_wait_event(0, consumer, event);
  sim.enqueue(0, consumer, [&] { order.push_back("consume"); });

  EXPECT_EQ(sim.advance(0, consumer, 10), 0u) << "advance never runs another stream's work";
  EXPECT_TRUE(order.empty());
  sim.advance(0, producer);  // the work, not yet the record
  EXPECT_EQ(sim.advance(0, consumer, 10), 0u);
  sim.advance(0, producer);  // the record
  EXPECT_EQ(sim.advance(0, consumer, 10), 2u) << "the wait item and the work";
  EXPECT_EQ(order, (std::vector<std::string>{"produce", "consume"}));
  EXPECT_EQ(sim.counters().stream_waits, 1u);
}

// The missing-wait bug: a consumer stream reads a buffer a producer stream writes, with no wait between
// them. On the simulated device the consumer can run first and read the old bytes.
TEST(SimBackendStreams, MissingWaitLetsConsumerReadStaleBytes) {
  SimBackend sim(manual_config());
  auto* buffer = static_cast<unsigned char*>(sim.reserve(0, 4096));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 0x11, 4096);
  Stream producer = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  unsigned char seen = 0;
  sim.enqueue(0, producer, [&] { std::memset(buffer, 0x22, 4096); });
  sim.enqueue(0, consumer, [&] { seen = buffer[100]; });
  sim.advance(0, consumer);  // the device is free to run it first
  sim.advance(0, producer);
  EXPECT_EQ(seen, 0x11) << "without a wait the consumer reads the old bytes";
  sim.release(0, buffer, 4096);
}

TEST(SimBackendStreams, WaitMakesConsumerReadTheProducedBytes) {
  SimBackend sim(manual_config());
  auto* buffer = static_cast<unsigned char*>(sim.reserve(0, 4096));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 0x11, 4096);
  Stream producer = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  Event ready = sim.create_event(0);
  unsigned char seen = 0;
  sim.enqueue(0, producer, [&] { std::memset(buffer, 0x22, 4096); });
  sim.record_event(0, ready, producer);
  sim.stream_wait_event(0, consumer, ready);
  sim.enqueue(0, consumer, [&] { seen = buffer[100]; });
  sim.advance(0, consumer, 2);  // the same attempt to run the consumer first now stops at the wait
  sim.advance(0, producer, 2);
  sim.advance(0, consumer, 2);
  EXPECT_EQ(seen, 0x22);
  sim.release(0, buffer, 4096);
}

TEST(SimBackendStreams, UnknownStreamValuesAreAdoptedOnFirstUse) {
  SimBackend sim(manual_config(2));
  const Stream foreign = 0xABC000;  // e.g. a cudaStream_t arriving through the C ABI
  EXPECT_EQ(sim.stream_device(foreign), -1) << "not seen yet";
  int ran = 0;
  sim.enqueue(1, foreign, [&] { ++ran; });
  EXPECT_EQ(sim.stream_device(foreign), 1);
  EXPECT_EQ(sim.advance(1, foreign), 1u);
  EXPECT_EQ(ran, 1);
  expect_backend_error([&] { sim.enqueue(0, foreign, [] {}); }, {"enqueue", "belongs to device 1", "not device 0"});
  expect_backend_error([&] { sim.queued_items(0, foreign); }, {"queued_items", "belongs to device 1"});
  EXPECT_EQ(sim.queued_items(0, 0xDEF000), 0u) << "asking about a stream never used adopts nothing";
  EXPECT_EQ(sim.stream_device(0xDEF000), -1);
}

TEST(SimBackendStreams, StreamDeviceAndFreshStreamValues) {
  SimBackend sim(manual_config(2));
  sim.enqueue(0, 1, [] {});  // adopt the value create_stream would hand out first
  Stream s0 = sim.create_stream(0);
  Stream s1 = sim.create_stream(1);
  EXPECT_NE(s0, 0u);
  EXPECT_NE(s0, 1u) << "an adopted value is never handed out again";
  EXPECT_NE(s0, s1);
  EXPECT_EQ(sim.stream_device(s0), 0);
  EXPECT_EQ(sim.stream_device(s1), 1);
  EXPECT_EQ(sim.stream_device(0), -1) << "the default stream belongs to whichever device is current";
  // Stream 0 is a separate queue on each device.
  sim.enqueue(0, 0, [] {});
  EXPECT_EQ(sim.queued_items(0, 0), 1u);
  EXPECT_EQ(sim.queued_items(1, 0), 0u);
}

TEST(SimBackendSync, SynchronizeEventRunsTheProducer) {
  SimBackend sim(manual_config());
  Stream producer = sim.create_stream(0);
  Event event = sim.create_event(0);
  int produced = 0;
  sim.enqueue(0, producer, [&] { ++produced; });
  sim.record_event(0, event, producer);
  sim.enqueue(0, producer, [&] { ++produced; });  // after the record: a host wait need not run it
  sim.synchronize_event(0, event);
  EXPECT_TRUE(sim.query_event(0, event));
  EXPECT_EQ(produced, 1);
  EXPECT_EQ(sim.queued_items(0, producer), 1u);
  EXPECT_EQ(sim.counters().event_synchronizes, 1u);
}

TEST(SimBackendSync, SynchronizeStreamFollowsAChainOfWaits) {
  SimBackend sim(manual_config());
  Stream a = sim.create_stream(0);
  Stream b = sim.create_stream(0);
  Stream c = sim.create_stream(0);
  Event after_a = sim.create_event(0);
  Event after_b = sim.create_event(0);
  std::vector<char> order;
  sim.enqueue(0, a, [&] { order.push_back('a'); });
  sim.record_event(0, after_a, a);
  sim.stream_wait_event(0, b, after_a);
  sim.enqueue(0, b, [&] { order.push_back('b'); });
  sim.record_event(0, after_b, b);
  sim.stream_wait_event(0, c, after_b);
  sim.enqueue(0, c, [&] { order.push_back('c'); });
  sim.synchronize_stream(0, c);
  EXPECT_EQ(order, (std::vector<char>{'a', 'b', 'c'}));
  EXPECT_EQ(sim.queued_items(0, c), 0u);
  EXPECT_TRUE(sim.query_event(0, after_a));
  EXPECT_TRUE(sim.query_event(0, after_b));
}

TEST(SimBackendSync, SynchronizeAllAndReleaseDrainQueues) {
  SimBackend sim(manual_config(2));
  Stream s0 = sim.create_stream(0);
  Stream s1 = sim.create_stream(1);
  int ran = 0;
  sim.enqueue(0, s0, [&] { ++ran; });
  sim.enqueue(1, s1, [&] { ++ran; });
  sim.enqueue(1, 0, [&] { ++ran; });
  sim.synchronize_all();
  EXPECT_EQ(ran, 3);

  // release() synchronizes its device first, as cudaFree does: queued work on the memory runs first.
  void* ptr = sim.reserve(0, 4096);
  ASSERT_NE(ptr, nullptr);
  sim.memset_async(0, ptr, 0x7F, 4096, s0);
  sim.enqueue(1, s1, [&] { ++ran; });
  sim.release(0, ptr, 4096);
  EXPECT_EQ(sim.queued_items(0, s0), 0u);
  EXPECT_EQ(sim.queued_items(1, s1), 1u) << "other devices are not synchronized";
}

TEST(SimBackendEager, WorkRunsAtEnqueueAndEventsCompleteAtRecord) {
  SimBackend sim(eager_config());
  EXPECT_EQ(sim.mode(), SimBackend::Mode::kEager);
  Stream producer = sim.create_stream(0);
  Stream consumer = sim.create_stream(0);
  Event event = sim.create_event(0);
  int ran = 0;
  sim.enqueue(0, producer, [&] { ++ran; });
  EXPECT_EQ(ran, 1);
  sim.record_event(0, event, producer);
  EXPECT_TRUE(sim.query_event(0, event));
  sim.stream_wait_event(0, consumer, event);
  sim.enqueue(0, consumer, [&] { ++ran; });
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(sim.queued_items(0, producer), 0u);
  EXPECT_EQ(sim.queued_items(0, consumer), 0u);
  const SimBackend::Counters counters = sim.counters();
  EXPECT_EQ(counters.event_records, 1u);
  EXPECT_EQ(counters.event_queries, 1u);
  EXPECT_EQ(counters.stream_waits, 1u);
}

TEST(SimBackendMemset, MemsetRunsInStreamOrder) {
  SimBackend sim(manual_config());
  auto* buffer = static_cast<unsigned char*>(sim.reserve(0, 1024));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 0, 1024);
  Stream stream = sim.create_stream(0);
  unsigned char before = 1;
  sim.enqueue(0, stream, [&] { before = buffer[512]; });
  sim.memset_async(0, buffer + 256, 0xFF, 512, stream);
  EXPECT_EQ(buffer[512], 0) << "nothing runs in manual mode until advanced";
  sim.synchronize_stream(0, stream);
  EXPECT_EQ(before, 0) << "work enqueued before the memset saw the old bytes";
  EXPECT_EQ(buffer[255], 0);
  EXPECT_EQ(buffer[256], 0xFF);
  EXPECT_EQ(buffer[767], 0xFF);
  EXPECT_EQ(buffer[768], 0);
  EXPECT_EQ(sim.counters().memsets, 1u);

  SimBackend eager(eager_config());
  auto* other = static_cast<unsigned char*>(eager.reserve(0, 512));
  ASSERT_NE(other, nullptr);
  eager.memset_async(0, other, 0xFF, 512, 0);
  EXPECT_EQ(other[511], 0xFF) << "eager mode runs it at once";
}

TEST(SimBackendMemset, RangeOutsideAReservationIsAnError) {
  SimBackend sim(manual_config());
  auto* buffer = static_cast<unsigned char*>(sim.reserve(0, 1024));
  ASSERT_NE(buffer, nullptr);
  expect_backend_error([&] { sim.memset_async(0, buffer + 1000, 0, 25, 0); }, {"memset_async", "not inside"});
  int local = 0;
  expect_backend_error([&] { sim.memset_async(0, &local, 0, sizeof local, 0); }, {"memset_async"});
  sim.memset_async(0, buffer + 1000, 0, 24, 0);  // the last bytes are fine
  EXPECT_EQ(sim.counters().memsets, 1u);
}

TEST(SimBackendCapture, EventQueriesSyncsAndReleasesFailDuringCapture) {
  SimBackend sim(manual_config(2));
  Stream capturing = sim.create_stream(0);
  Stream other = sim.create_stream(0);
  Event event = sim.create_event(0);
  Event event1 = sim.create_event(1);
  EXPECT_FALSE(sim.is_capturing(0, capturing));
  sim.set_capturing(0, capturing, true);
  EXPECT_TRUE(sim.is_capturing(0, capturing));
  EXPECT_FALSE(sim.is_capturing(0, other));
  sim.record_event(0, event, other);
  EXPECT_THROW(sim.query_event(0, event), Error);
  EXPECT_THROW(sim.synchronize_event(0, event), Error);
  EXPECT_THROW(sim.record_event(0, event, capturing), Error) << "a fence cannot be recorded in a graph";
  void* memory = sim.reserve(0, 4096);
  ASSERT_NE(memory, nullptr) << "reserving works during a capture (relaxed mode)";
  EXPECT_THROW(sim.release(0, memory, 4096), Error);
  EXPECT_TRUE(sim.query_event(1, event1)) << "device 1 is not capturing";
  EXPECT_EQ(sim.counters().capture_violations, 4u);
  sim.set_capturing(0, capturing, false);
  sim.set_capturing(0, capturing, false);  // idempotent
  EXPECT_FALSE(sim.query_event(0, event)) << "the record before the capture has not run";
  sim.release(0, memory, 4096);
  EXPECT_EQ(sim.counters().capture_violations, 4u);
}

// Relaxed capture mode, kept per thread: events recorded outside the capture may be queried and waited
// for, and streams that do not capture queried and recorded on; the capturing stream itself may not be
// queried, and nothing may be released, in any mode.
TEST(SimBackendCapture, RelaxedModeAllowsQueriesOfWhatTheCaptureDoesNotHold) {
  SimBackend sim(manual_config(1));
  Stream capturing = sim.create_stream(0);
  Stream other = sim.create_stream(0);
  Event event = sim.create_event(0);
  void* memory = sim.reserve(0, 4096);
  sim.record_event(0, event, other);
  sim.set_capturing(0, capturing, true);
  const int previous = sim.relax_capture_mode();
  EXPECT_FALSE(sim.query_event(0, event));
  EXPECT_FALSE(sim.query_stream(0, other)) << "the record has not run";
  sim.record_event(0, event, other);
  sim.synchronize_event(0, event);
  EXPECT_TRUE(sim.query_stream(0, other));
  EXPECT_THROW(sim.query_stream(0, capturing), Error);
  EXPECT_THROW(sim.release(0, memory, 4096), Error);
  EXPECT_THROW(sim.record_event(0, event, capturing), Error);
  EXPECT_EQ(sim.counters().capture_violations, 3u);
  std::thread([&] {
    EXPECT_THROW(sim.query_event(0, event), Error) << "another thread is still in global mode";
  }).join();
  sim.restore_capture_mode(previous);
  EXPECT_THROW(sim.query_event(0, event), Error) << "global mode again";
  EXPECT_EQ(sim.counters().capture_violations, 5u);
  sim.set_capturing(0, capturing, false);
  sim.release(0, memory, 4096);
}

TEST(SimBackendErrors, BadDeviceUnknownEventAndForeignPointersThrow) {
  SimBackend sim(manual_config(2));
  expect_backend_error([&] { sim.reserve(2, 512); }, {"reserve", "device 2", "2 device(s)"});
  expect_backend_error([&] { sim.create_stream(-1); }, {"create_stream", "device -1"});
  expect_backend_error([&] { sim.memory_info(5); }, {"memory_info", "device 5"});

  int not_an_event = 0;
  expect_backend_error([&] { sim.record_event(0, &not_an_event, 0); }, {"record_event", "unknown event"});
  Event event = sim.create_event(0);
  expect_backend_error([&] { sim.record_event(1, event, 0); }, {"record_event", "created on device 0"});
  sim.destroy_event(0, event);
  expect_backend_error([&] { sim.destroy_event(0, event); }, {"destroy_event", "unknown event"});

  void* ptr = sim.reserve(0, 1024);
  ASSERT_NE(ptr, nullptr);
  expect_backend_error([&] { sim.release(1, ptr, 1024); }, {"release", "not returned by reserve"});
  expect_backend_error([&] { sim.release(0, ptr, 512); }, {"release", "1024 bytes"});
  sim.release(0, ptr, 1024);
  expect_backend_error([&] { sim.release(0, ptr, 1024); }, {"release", "double release"});
  EXPECT_EQ(sim.reserved_bytes(0), 0u);
  EXPECT_THROW(SimBackend(manual_config(0)), Error);
}

TEST(SimBackendThreads, FourThreadsEachWithOwnStream) {
  for (SimBackend::Mode mode : {SimBackend::Mode::kManual, SimBackend::Mode::kEager}) {
    SimBackend::Config config = manual_config();
    config.mode = mode;
    SimBackend sim(config);
    constexpr int kThreads = 4;
    constexpr int kIterations = 10000;
    std::vector<Stream> streams;
    std::vector<Event> events;
    for (int t = 0; t < kThreads; ++t) {
      streams.push_back(sim.create_stream(0));
      events.push_back(sim.create_event(0));
    }
    std::vector<long> sums(kThreads, 0);
    std::atomic<int> wrong_answers{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kIterations; ++i) {
          sim.enqueue(0, streams[t], [&sums, t, i] { sums[t] += i; });
          sim.record_event(0, events[t], streams[t]);
          const bool expected = mode == SimBackend::Mode::kEager;
          if (sim.query_event(0, events[t]) != expected) ++wrong_answers;
          if (mode == SimBackend::Mode::kManual && sim.advance(0, streams[t], 2) != 2) ++wrong_answers;
          if (!sim.query_event(0, events[t])) ++wrong_answers;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(wrong_answers.load(), 0);
    const long expected_sum = static_cast<long>(kIterations) * (kIterations - 1) / 2;
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(sums[t], expected_sum);
      EXPECT_EQ(sim.queued_items(0, streams[t]), 0u);
    }
    const SimBackend::Counters counters = sim.counters();
    EXPECT_EQ(counters.event_records, std::uint64_t{kThreads} * kIterations);
    EXPECT_EQ(counters.event_queries, std::uint64_t{kThreads} * kIterations * 2);
  }
}

TEST(SimBackendThreads, ThreadsDrainingOneStreamKeepItsOrder) {
  SimBackend sim(manual_config());
  Stream stream = sim.create_stream(0);
  constexpr int kItems = 20000;
  std::vector<int> order;
  order.reserve(kItems);
  for (int i = 0; i < kItems; ++i) sim.enqueue(0, stream, [&order, i] { order.push_back(i); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (sim.advance(0, stream, 3) != 0) {
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kItems));
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(SimBackendThreads, HostWaitsAcrossThreadsUnblockWaitingStreams) {
  // Consumers on several threads synchronize streams that wait on a producer another thread advances.
  SimBackend sim(manual_config());
  Stream producer = sim.create_stream(0);
  Event ready = sim.create_event(0);
  std::atomic<int> produced{0};
  sim.enqueue(0, producer, [&] { produced = 1; });
  sim.record_event(0, ready, producer);
  std::vector<Stream> consumers;
  std::vector<int> seen(4, -1);
  for (int t = 0; t < 4; ++t) {
    consumers.push_back(sim.create_stream(0));
    sim.stream_wait_event(0, consumers.back(), ready);
    sim.enqueue(0, consumers.back(), [&, t] { seen[static_cast<std::size_t>(t)] = produced.load(); });
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { sim.synchronize_stream(0, consumers[t]); });
  threads.emplace_back([&] { sim.synchronize_stream(0, producer); });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1, 1}));
}

// ---- fixed addresses: the same on every run, lowest first, no host memory behind them ----

SimBackend::Config fixed_config() {
  SimBackend::Config config = eager_config();
  config.fixed_addresses = true;
  return config;
}

TEST(SimBackendFixedAddresses, EveryBackendHandsOutTheSameAddresses) {
  std::vector<std::uintptr_t> seen[2];
  for (auto& addresses : seen) {
    std::vector<void*> junk;  // the host's heap differs between the two runs
    for (int i = 0; i < 50; ++i)
      junk.push_back(std::malloc(static_cast<std::size_t>(4096 * (i + 1) * (&addresses - seen + 1))));
    SimBackend sim(fixed_config());
    void* a = sim.reserve(0, 3 * MiB);
    void* b = sim.reserve(0, 1000);
    void* range = sim.reserve_address_range(0, 8 * MiB);
    for (void* p : {a, b, range}) addresses.push_back(reinterpret_cast<std::uintptr_t>(p));
    sim.release_address_range(0, range, 8 * MiB);
    sim.release(0, b, 1000);
    sim.release(0, a, 3 * MiB);
    for (void* p : junk) std::free(p);
  }
  EXPECT_EQ(seen[0], seen[1]);
}

TEST(SimBackendFixedAddresses, LowestFreeAddressFirstAndReleasedAddressesReused) {
  SimBackend sim(fixed_config());
  auto* a = static_cast<char*>(sim.reserve(0, 1 * MiB));
  auto* b = static_cast<char*>(sim.reserve(0, 1 * MiB));
  auto* c = static_cast<char*>(sim.reserve(0, 1 * MiB));
  EXPECT_EQ(b, a + MiB);
  EXPECT_EQ(c, b + MiB);
  sim.release(0, a, 1 * MiB);
  sim.release(0, b, 1 * MiB);
  EXPECT_EQ(sim.reserve(0, 2 * MiB), a);  // the two freed neighbours merged
  EXPECT_EQ(sim.reserve(0, 512), c + MiB);
}

TEST(SimBackendFixedAddresses, MemsetIsRefusedWithTheReason) {
  SimBackend sim(fixed_config());
  void* a = sim.reserve(0, 4096);
  expect_backend_error([&] { sim.memset_async(0, a, 0, 4096, 0); }, {"no host memory behind them"});
  sim.release(0, a, 4096);
}

TEST(SimBackendFixedAddresses, MemoryLimitStillHolds) {
  SimBackend sim(fixed_config());  // 64 MiB
  void* a = sim.reserve(0, 60 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sim.reserve(0, 8 * MiB), nullptr);
  sim.release(0, a, 60 * MiB);
  EXPECT_NE(sim.reserve(0, 8 * MiB), nullptr);
}

}  // namespace
}  // namespace streamalloc
