#include "torch_history.hpp"

#include <chrono>
#include <cstdio>
#include <utility>

#include <c10/util/Exception.h>

namespace streamalloc::torch {

void TorchHistory::configure(streamalloc::Allocator& core, bool enabled,
                             c10::cuda::CUDACachingAllocator::CreateContextFn context_recorder, std::size_t max_entries,
                             RecordContext when, bool clear, const std::vector<std::string>& skip_actions) {
  TORCH_CHECK(when == RecordContext::NEVER || context_recorder != nullptr,
              "streamalloc: recordHistory needs a context recorder to record contexts");
  HistorySettings settings;
  settings.enabled = enabled;
  settings.max_entries = max_entries;
  settings.clear = clear;
  // The core keeps each entry's context, so that the user's metadata stays with it at every level;
  // the stacks show in the trace from ALLOC on (trace_stacks()), as PyTorch's.
  settings.contexts_in_trace = true;
  for (const std::string& name : skip_actions) {
    const std::optional<TraceAction> action = trace_action_named(name);
    TORCH_CHECK(action.has_value(), "streamalloc: unknown action '", name,
                "' in skip_actions; the actions are alloc, free_requested, free_completed, segment_alloc, "
                "segment_free, oom and snapshot");
    settings.skip.push_back(*action);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    when_ = enabled ? when : RecordContext::NEVER;
    trace_stacks_ = when_ >= RecordContext::ALLOC;
    recorder_ = enabled ? std::move(context_recorder) : nullptr;
  }
  core.record_history(settings);
  enabled_.store(enabled, std::memory_order_relaxed);
}

std::shared_ptr<const TorchTraceContext> TorchHistory::gather(RecordContext level) {
  c10::cuda::CUDACachingAllocator::CreateContextFn recorder = nullptr;
  std::string metadata;
  std::string compile_context;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (when_ >= level) recorder = recorder_;
    metadata = user_metadata_;
    if (!compile_contexts_.empty()) compile_context = compile_contexts_.back();
  }
  if (recorder == nullptr && metadata.empty() && compile_context.empty()) return nullptr;
  auto context = std::make_shared<TorchTraceContext>();
  if (recorder != nullptr) context->stack = recorder();
  context->user_metadata = std::move(metadata);
  context->compile_context = std::move(compile_context);
  return context;
}

void TorchHistory::push_compile_context(const std::string& name) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  compile_contexts_.push_back(name);
}

void TorchHistory::pop_compile_context() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!compile_contexts_.empty()) compile_contexts_.pop_back();
}

bool TorchHistory::trace_stacks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trace_stacks_;
}

namespace {

std::int64_t unix_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr std::size_t kMaxMetadataChanges = 4096;

}  // namespace

void TorchHistory::set_user_metadata(const std::string& metadata) {
  std::lock_guard<std::mutex> lock(mutex_);
  user_metadata_ = metadata;
  metadata_changes_.emplace_back(unix_now_us(), metadata);
  if (metadata_changes_.size() > kMaxMetadataChanges) metadata_changes_.pop_front();
}

std::string TorchHistory::user_metadata_at(std::int64_t time_us) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // The last change at or before `time_us`; before the first one kept, nothing was set (or the
  // change is too old to matter).
  for (auto it = metadata_changes_.rbegin(); it != metadata_changes_.rend(); ++it) {
    if (it->first <= time_us) return it->second;
  }
  return {};
}

std::string TorchHistory::user_metadata() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return user_metadata_;
}

std::optional<TraceAction> trace_action_named(const std::string& name) {
  for (int i = 0; i < kTraceActions; ++i) {
    const auto action = static_cast<TraceAction>(i);
    if (action != TraceAction::kRecordStream && name == to_string(action)) return action;
  }
  return std::nullopt;
}

namespace {

std::string hex(Stream stream) {
  char text[2 + 2 * sizeof(Stream) + 1];
  std::snprintf(text, sizeof(text), "%#llx", static_cast<unsigned long long>(stream));
  return text;
}

std::string us(std::int64_t value) { return std::to_string(value) + " us"; }

}  // namespace

std::string stream_facts(const TraceEntry& entry) {
  if (entry.action == TraceAction::kFreeRequested && !entry.pending_streams.empty()) {
    std::string streams;
    for (Stream s : entry.pending_streams) streams += (streams.empty() ? "" : ", ") + hex(s);
    return "streamalloc: pending on stream(s) " + streams;
  }
  if (entry.action == TraceAction::kFreeCompleted && entry.fenced) {
    if (entry.fence_stream == 0) return "streamalloc: released when its graph capture ended, held " + us(entry.held_us);
    if (entry.fence_recorded_us == 0) {
      return "streamalloc: stream " + hex(entry.fence_stream) + " found idle (no fence needed), held " +
             us(entry.held_us);
    }
    return "streamalloc: fence on stream " + hex(entry.fence_stream) + " recorded at " + us(entry.fence_recorded_us) +
           ", held " + us(entry.held_us);
  }
  return {};
}

std::shared_ptr<c10::GatheredContext> stack_of(const TraceContextPtr& context) {
  const auto* torch_context = dynamic_cast<const TorchTraceContext*>(context.get());
  return torch_context != nullptr ? torch_context->stack : nullptr;
}

namespace {

c10::CachingDeviceAllocator::TraceEntry::Action to_torch_action(TraceAction action) {
  using A = c10::CachingDeviceAllocator::TraceEntry::Action;
  switch (action) {
    case TraceAction::kAlloc: return A::ALLOC;
    case TraceAction::kFreeRequested: return A::FREE_REQUESTED;
    case TraceAction::kFreeCompleted: return A::FREE_COMPLETED;
    case TraceAction::kSegmentAlloc: return A::SEGMENT_ALLOC;
    case TraceAction::kSegmentFree: return A::SEGMENT_FREE;
    case TraceAction::kOom: return A::OOM;
    case TraceAction::kSegmentMap: return A::SEGMENT_MAP;
    case TraceAction::kSegmentUnmap: return A::SEGMENT_UNMAP;
    case TraceAction::kSnapshot:
    case TraceAction::kRecordStream: break;
  }
  return A::SNAPSHOT;
}

}  // namespace

std::vector<c10::CachingDeviceAllocator::TraceEntry> to_torch_trace(
    const std::vector<TraceEntry>& entries, bool with_stacks,
    const std::function<std::string(std::int64_t)>& metadata_at) {
  std::vector<c10::CachingDeviceAllocator::TraceEntry> out;
  out.reserve(entries.size());
  for (const TraceEntry& e : entries) {
    if (e.action == TraceAction::kRecordStream) continue;
    const auto* context = dynamic_cast<const TorchTraceContext*>(e.context.get());
    std::string metadata;
    if (context != nullptr && !e.context_from_allocation) {
      metadata = context->user_metadata;  // gathered by the call that recorded the entry
    } else if (metadata_at) {
      metadata = metadata_at(e.time_us);
    }
    if (metadata.empty()) metadata = stream_facts(e);
    // As PyTorch's trace: "N/A" outside any torch.compile region.
    std::string compile_context = context != nullptr && !e.context_from_allocation && !context->compile_context.empty()
                                      ? context->compile_context
                                      : std::string("N/A");
    // An allocation's or a free's size is what the caller asked for, as in PyTorch's trace; the block's
    // size where the core no longer knows it.
    const bool block_entry = e.action == TraceAction::kAlloc || e.action == TraceAction::kFreeRequested ||
                             e.action == TraceAction::kFreeCompleted;
    const std::size_t size = block_entry && e.requested != 0 ? e.requested : e.size;
    c10::CachingDeviceAllocator::TraceEntry entry(
        to_torch_action(e.action), static_cast<c10::DeviceIndex>(e.device), e.address, size,
        reinterpret_cast<void*>(e.stream),
        {static_cast<c10::CaptureId_t>(e.pool.first), static_cast<c10::CaptureId_t>(e.pool.second)}, 0,
        context != nullptr && with_stacks ? context->stack : nullptr, std::move(compile_context), std::move(metadata));
    // _snapshot() reads time_.t_ as microseconds since the epoch (PyTorch converts its approximate
    // clock before handing entries out; the core's clock already is that).
    entry.time_.t_ = static_cast<time_t>(e.time_us);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace streamalloc::torch
