// SimBackend: a faithful model of a CUDA device, for CPU-only tests, the CPU demo and trace replay.
//
// - Memory is real host memory (aligned to 512 B) under a per-device limit, so poisoning and data
//   races can be observed and OOM paths run.
// - A stream is a FIFO queue of work items: user work (a host function standing in for a kernel or a
//   copy), event records, waits on events, memsets. Items run only when the stream is advanced, in
//   queue order. In Mode::kEager every enqueue drains the stream at once (a device that is always
//   idle); in Mode::kManual tests advance streams explicitly, so they can put a consumer ahead of a
//   producer and watch the wrong bytes being read.
// - An event completes when its stream runs the record item. query_event is true when the *last*
//   record has run (or the event was never recorded), as in CUDA.
// - stream_wait_event makes the waiting stream stop at that point until the event's record (the one
//   that was last when wait was called) has run; advancing a stream never runs work of another stream.
//   Host-side synchronize_event (and synchronize_stream) run whatever is needed, on any stream, for the
//   awaited point to be reached, as a real host wait would let the device do.
// - Streams are identified by the Stream values create_stream() hands out, plus the default stream 0
//   on every device. A stream value the backend has never seen is adopted on first use as a stream of
//   the device it is used with, so handles coming through the C ABI work too.
// - set_capturing() marks a stream as capturing a graph. While any stream of the device captures,
//   query_event, synchronize_event and release fail as CUDA's do in global capture mode, and
//   record_event on the capturing stream fails (on CUDA it would become a graph node, not a fence);
//   each is also counted as a capture violation. reserve() works (relaxed-mode cudaMalloc).
//
// Work functions run on the thread that advances the stream, with no backend lock held; they must
// not call back into the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "streamalloc/backend.hpp"

namespace streamalloc {

class SimBackend final : public Backend {
 public:
  enum class Mode { kEager, kManual };

  struct Config {
    int device_count = 1;
    std::size_t memory_per_device = 1 * GiB;  // the device "total"; reserve fails beyond it
    Mode mode = Mode::kEager;
  };

  struct Counters {  // COUNT of backend calls, for tests that check batching and host syncs
    std::uint64_t reserve_calls = 0;
    std::uint64_t release_calls = 0;
    std::uint64_t events_created = 0;
    std::uint64_t events_destroyed = 0;
    std::uint64_t event_records = 0;
    std::uint64_t event_queries = 0;
    std::uint64_t event_synchronizes = 0;
    std::uint64_t stream_waits = 0;
    std::uint64_t memsets = 0;
    std::uint64_t capture_violations = 0;  // event query/sync while a stream of the device captures
  };

  SimBackend();
  explicit SimBackend(Config config);
  ~SimBackend() override;

  // ---- Backend ----
  std::string name() const override;
  int device_count() const override;
  void* reserve(int device, std::size_t bytes) override;
  void release(int device, void* ptr, std::size_t bytes) override;
  Event create_event(int device) override;
  void destroy_event(int device, Event event) override;
  void record_event(int device, Event event, Stream stream) override;
  bool query_event(int device, Event event) override;
  void synchronize_event(int device, Event event) override;
  void stream_wait_event(int device, Stream stream, Event event) override;
  bool is_capturing(int device, Stream stream) override;
  void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) override;
  DeviceMemoryInfo memory_info(int device) override;
  int stream_device(Stream stream) override;

  // ---- simulation control (tests, demo, replay) ----
  Stream create_stream(int device = 0);
  // Enqueue user work (a "kernel") on a stream.
  void enqueue(int device, Stream stream, std::function<void()> work);
  // Run up to `items` items of `stream` in order; stops early at an unsatisfied wait or an empty
  // queue. Returns the number of items run.
  std::size_t advance(int device, Stream stream, std::size_t items = 1);
  // Run `stream` until it is empty, running other streams as needed to satisfy its waits.
  void synchronize_stream(int device, Stream stream);
  // Run every stream of every device until all are empty.
  void synchronize_all();
  std::size_t queued_items(int device, Stream stream) const;

  void set_capturing(int device, Stream stream, bool capturing);
  // Change the device memory limit (OOM tests).
  void set_memory_limit(int device, std::size_t bytes);
  std::size_t reserved_bytes(int device) const;
  Counters counters() const;
  Mode mode() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace streamalloc
