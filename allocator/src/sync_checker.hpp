// SyncChecker: the happens-before check behind `check_sync:1` (docs/record-stream.md).
//
// Each stream has a vector clock: for every stream, the newest of its event records this stream is
// known to be ordered after. An event record on stream s ticks s's own entry and stamps the event
// with s's clock; a wait on the event merges that stamp into the waiter's clock; a host
// synchronization with a stream (or the device) orders all later work after everything enqueued so
// far. The allocator feeds its own fences and waits; under PyTorch the plugin feeds the GPU trace
// callbacks (event record/wait, stream and device synchronize).
//
// A block handed out on stream P at P's tick t is safe for a consumer stream S only when S's clock
// for P has reached t + 1, i.e. S waited on a record of P made after the allocation (the producer's
// writes follow the allocation). Otherwise the consumer may read before the producer finished: the
// missing wait_event.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "streamalloc/types.hpp"

namespace streamalloc {

class SyncChecker {
 public:
  using Tick = std::uint64_t;

  // All methods are thread-safe: the checker is shared by every device's cache and the plugin's hooks.
  void on_event_record(std::uintptr_t event, Stream stream);
  void on_event_wait(std::uintptr_t event, Stream waiter);
  void on_stream_synchronize(Stream stream);
  void on_device_synchronize();

  // The producer's current tick, taken when a block is handed out on it.
  Tick tick(Stream producer);
  // Whether `consumer` is ordered after `producer`'s work that followed tick `allocated_at`.
  bool ordered_after(Stream consumer, Stream producer, Tick allocated_at) const;

 private:
  using VectorClock = std::unordered_map<Stream, Tick>;
  static void merge(VectorClock& into, const VectorClock& from);
  mutable std::mutex mutex_;
  std::unordered_map<Stream, VectorClock> clocks_;
  std::unordered_map<std::uintptr_t, VectorClock> events_;
  VectorClock host_;  // what every stream is ordered after because the host waited for it
};

}  // namespace streamalloc
