// Allocation history: a trace of what the allocator did, per device, in the shape of PyTorch's
// TraceEntry (torch.cuda.memory._record_memory_history), plus the stream facts that explain
// streamalloc's delayed frees: which streams a freed block waited for, and which fence let it go.
//
// The history is off by default and costs one pointer test per event then (docs/design.md,
// "Allocation history"). Allocator::record_history() turns it on; Allocator::history(device) reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "streamalloc/pools.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

enum class TraceAction : std::uint8_t {
  kAlloc,          // a block was handed out
  kFreeRequested,  // a caller freed a block
  kFreeCompleted,  // the block became reusable: at once without other stream uses, else once fenced
  kSegmentAlloc,   // device memory was reserved
  kSegmentFree,    // device memory was given back
  kOom,            // an allocation failed; `address` holds the device's free bytes, as PyTorch's
  kSnapshot,       // the block table was read (segments()), to line snapshots up with the trace
  kRecordStream,   // streamalloc's: `stream` was added to a live block's uses (record_stream)
  kSegmentMap,     // pages were mapped into an expandable segment (`address`, `size`: the pages)
  kSegmentUnmap,   // pages of an expandable segment were unmapped and given back
};
inline constexpr int kTraceActions = 10;

// PyTorch's name of an action ("alloc", "free_requested", ...; "record_stream" for streamalloc's own).
const char* to_string(TraceAction action);

// What the caller knows about the call that caused an event (PyTorch: the Python and C++ stack). The
// core never looks inside; a caller subclasses it and reads its own type back.
class TraceContext {
 public:
  virtual ~TraceContext() = default;
};
using TraceContextPtr = std::shared_ptr<const TraceContext>;

// The context the calling thread is inside (nullptr when none), set by TraceContextScope. The caller
// gathers it BEFORE calling into the allocator: the allocator takes its device lock, and gathering (a
// Python stack needs the GIL) under that lock could deadlock.
const TraceContextPtr& current_trace_context();

// Sets the calling thread's context for its lifetime and restores the previous one after.
class TraceContextScope {
 public:
  explicit TraceContextScope(TraceContextPtr context);
  ~TraceContextScope();
  TraceContextScope(const TraceContextScope&) = delete;
  TraceContextScope& operator=(const TraceContextScope&) = delete;

 private:
  TraceContextPtr previous_;
};

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  int device = 0;
  std::uintptr_t address = 0;  // kOom: the device's free bytes; kSnapshot: 0
  std::size_t size = 0;        // block or segment bytes; kOom: the rounded request; kSnapshot: active bytes
  std::size_t requested = 0;   // block entries: the size the caller asked for (PyTorch's trace shows it)
  Stream stream = 0;           // allocation stream (segments: the stream they were reserved for)
  PoolId pool;
  std::int64_t time_us = 0;  // microseconds since the Unix epoch
  // The calling thread's context, when the settings keep contexts in the trace. Events that a fence
  // completes carry none: they happen on behalf of another call.
  TraceContextPtr context;
  // The context is the block's allocation context, shown on a free that has no stack of its own (as
  // PyTorch's entries do); what else the caller attached to its context (the user's metadata) is not
  // this entry's.
  bool context_from_allocation = false;

  // ---- stream facts (streamalloc's)
  // kFreeRequested: the other streams the block was used on; empty when it was reusable at once.
  // kRecordStream: the stream added.
  std::vector<Stream> pending_streams;
  // kFreeCompleted after a pending free: the stream whose fence completed last, when that fence was
  // recorded (0: the stream was found idle and no event was needed, or a capture's uses were dropped),
  // and how long the block was held after its free.
  Stream fence_stream = 0;
  std::int64_t fence_recorded_us = 0;
  std::int64_t held_us = 0;
  bool fenced = false;  // kFreeCompleted: the block waited for a fence (false: reusable at once)
};

struct HistorySettings {
  bool enabled = false;
  std::size_t max_entries = 0;  // the ring keeps the newest max_entries (0 keeps one, as PyTorch's)
  bool clear = false;           // drop what was recorded (turning the history off always does)
  // Attach the calling thread's context to trace entries (PyTorch's context "alloc"/"all"); blocks and
  // segments keep the context they were allocated under whenever one is set ("state" and above).
  bool contexts_in_trace = true;
  std::vector<TraceAction> skip;  // actions left out of the trace
};

// The contexts live blocks and segments were allocated under, by address, for snapshots.
struct LiveContexts {
  std::unordered_map<std::uintptr_t, TraceContextPtr> blocks;
  std::unordered_map<std::uintptr_t, TraceContextPtr> segments;
};

// Where a DeviceCache sends its events while the history is on. Called under the device lock; must not
// call back into the allocator.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  // `caller_context`: the event belongs to the calling thread's call (false: a fence completed on
  // behalf of another call), so the sink may attach current_trace_context().
  virtual void record(TraceEntry&& entry, bool caller_context) = 0;
};

}  // namespace streamalloc
