#include "streamalloc/trace.hpp"

namespace streamalloc {

namespace {
thread_local TraceContextPtr t_context;
}  // namespace

const char* to_string(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kOom: return "oom";
    case TraceAction::kSnapshot: return "snapshot";
    case TraceAction::kRecordStream: return "record_stream";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
  }
  return "unknown";
}

const TraceContextPtr& current_trace_context() { return t_context; }

TraceContextScope::TraceContextScope(TraceContextPtr context) : previous_(std::move(t_context)) {
  t_context = std::move(context);
}

TraceContextScope::~TraceContextScope() { t_context = std::move(previous_); }

}  // namespace streamalloc
