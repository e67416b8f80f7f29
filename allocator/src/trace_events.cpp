#include "trace_events.hpp"

#include <chrono>

#include "memory_pool.hpp"

namespace streamalloc::trace_events {
namespace {

std::int64_t unix_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A steady-clock time point (block ages, fence times) on the trace's Unix clock.
std::int64_t unix_us(Clock::time_point when, std::int64_t unix_now, Clock::time_point steady_now) {
  return unix_now - std::chrono::duration_cast<std::chrono::microseconds>(steady_now - when).count();
}

// Every entry: what happened, where, now.
TraceEntry make_entry(TraceAction action, int device, std::uintptr_t address, std::size_t size, Stream stream,
                      PoolId pool) {
  TraceEntry entry;
  entry.action = action;
  entry.device = device;
  entry.address = address;
  entry.size = size;
  entry.stream = stream;
  entry.pool = pool;
  entry.time_us = unix_now_us();
  return entry;
}

TraceEntry entry_for(TraceAction action, int device, const Block& block) {
  TraceEntry entry = make_entry(action, device, block.address, block.size, block.stream, block.segment->owner->id);
  entry.requested = block.requested;
  return entry;
}

}  // namespace

void alloc(TraceSink& sink, int device, const Block& block) {
  sink.record(entry_for(TraceAction::kAlloc, device, block), true);
}

void free_requested(TraceSink& sink, int device, const Block& block) {
  TraceEntry requested = entry_for(TraceAction::kFreeRequested, device, block);
  requested.pending_streams = block.recorded_streams;
  if (!block.recorded_streams.empty()) {
    sink.record(std::move(requested), true);
    return;
  }
  TraceEntry completed = requested;
  completed.action = TraceAction::kFreeCompleted;
  sink.record(std::move(requested), true);
  sink.record(std::move(completed), true);
}

void fenced_free_completed(TraceSink& sink, int device, const Block& block, Stream fence_stream, const Fence* fence) {
  TraceEntry entry = entry_for(TraceAction::kFreeCompleted, device, block);
  const Clock::time_point steady_now = Clock::now();
  entry.fenced = true;
  entry.fence_stream = fence_stream;
  if (fence != nullptr && fence->event != nullptr) {
    entry.fence_recorded_us = unix_us(fence->recorded_at, entry.time_us, steady_now);
  }
  entry.held_us = std::chrono::duration_cast<std::chrono::microseconds>(steady_now - block.since).count();
  sink.record(std::move(entry), false);
}

void segment(TraceSink& sink, TraceAction action, int device, const Segment& segment) {
  sink.record(make_entry(action, device, segment.address, segment.size, segment.stream, segment.owner->id), true);
}

void segment_pages(TraceSink& sink, TraceAction action, int device, const Segment& segment, std::uintptr_t address,
                   std::size_t bytes) {
  sink.record(make_entry(action, device, address, bytes, segment.stream, segment.owner->id), true);
}

void record_stream(TraceSink& sink, int device, const Block& block, Stream stream) {
  TraceEntry entry = entry_for(TraceAction::kRecordStream, device, block);
  entry.pending_streams = {stream};
  sink.record(std::move(entry), true);
}

void out_of_memory(TraceSink& sink, int device, std::size_t device_free, std::size_t size, Stream stream, PoolId pool) {
  // PyTorch's convention: an OOM entry's address is the device's free bytes.
  sink.record(make_entry(TraceAction::kOom, device, device_free, size, stream, pool), true);
}

void snapshot(TraceSink& sink, int device, std::size_t active_bytes) {
  sink.record(make_entry(TraceAction::kSnapshot, device, 0, active_bytes, 0, PoolId{}), true);
}

}  // namespace streamalloc::trace_events
