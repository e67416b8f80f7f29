// The allocation history for PyTorch (torch.cuda.memory._record_memory_history): what to gather on the
// calling thread before a call into the core, and the translation of the core's trace entries into
// c10's TraceEntry for _snapshot()'s device_traces (docs/pytorch.md, "Allocation history").
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "streamalloc/allocator.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc::torch {

using RecordContext = c10::cuda::CUDACachingAllocator::RecordContext;

// What PyTorch knows about a call: its stack (the context recorder's), and the user's metadata
// (torch.cuda.memory._set_memory_metadata) at the time of the call.
struct TorchTraceContext final : TraceContext {
  std::shared_ptr<c10::GatheredContext> stack;
  std::string user_metadata;
  std::string compile_context;  // the innermost torch.compile region open at the call, or ""
};

// PyTorch's side of the history settings: whether and what to gather, and the user's metadata.
class TorchHistory {
 public:
  // recordHistory's arguments as PyTorch passes them; applies them to `core`. Refuses (c10::Error,
  // nothing changed) a `when` other than NEVER without a recorder, and an unknown skip action.
  void configure(streamalloc::Allocator& core, bool enabled,
                 c10::cuda::CUDACachingAllocator::CreateContextFn context_recorder, std::size_t max_entries,
                 RecordContext when, bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // The context of a call that needs `level` to gather its stack (STATE at allocation, ALL at a free),
  // or nullptr when there is nothing to record. Gathers before the core takes its lock. Inline: with
  // the history off it is one load and one test.
  std::shared_ptr<const TorchTraceContext> context_for(RecordContext level) {
    if (!enabled_.load(std::memory_order_relaxed)) return nullptr;
    return gather(level);
  }

  // Whether trace entries show stacks (context "alloc" and "all").
  bool trace_stacks() const;
  void set_user_metadata(const std::string& metadata);
  std::string user_metadata() const;
  // The user's metadata in effect at `time_us` (microseconds since the epoch, the trace's clock): what
  // PyTorch's allocator puts in an entry recorded then, whoever's call recorded it.
  std::string user_metadata_at(std::int64_t time_us) const;
  // torch.compile's regions, innermost last; as PyTorch's allocator, kept only while the history is on.
  void push_compile_context(const std::string& name);
  void pop_compile_context();

 private:
  std::shared_ptr<const TorchTraceContext> gather(RecordContext level);

  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  RecordContext when_ = RecordContext::NEVER;
  bool trace_stacks_ = false;
  c10::cuda::CUDACachingAllocator::CreateContextFn recorder_ = nullptr;
  std::string user_metadata_;
  std::vector<std::string> compile_contexts_;
  // Each change of the user's metadata and when it happened, oldest first, bounded (the oldest
  // changes only matter to entries older than any ring keeps in practice).
  std::deque<std::pair<std::int64_t, std::string>> metadata_changes_;
};

// The action name PyTorch's skip_actions uses for `action`, parsed back; nullopt for an unknown name.
std::optional<TraceAction> trace_action_named(const std::string& name);

// The core's entries of one device as c10 TraceEntries: contexts and user metadata from the
// TorchTraceContext, streamalloc's stream facts in user_metadata_ where the user set none. record_stream entries
// (no PyTorch action) are left out: their stream shows in the free_requested that follows.
// `with_stacks`: keep the stacks (PyTorch's context "alloc" and "all"; with "state" only blocks show them).
// `metadata_at` (may be empty): the user's metadata at a time, for the entries no call of the user
// recorded (a fence that completed, a segment given back while another call ran). An entry's
// user_metadata is the user's metadata alone when there is one (PyTorch's contract: exactly the
// metadata in effect); the stream facts fill it only where the user set none.
std::vector<c10::CachingDeviceAllocator::TraceEntry> to_torch_trace(
    const std::vector<TraceEntry>& entries, bool with_stacks,
    const std::function<std::string(std::int64_t)>& metadata_at = nullptr);

// The stream facts of an entry as the text memory_viz shows with it ("" when it has none).
std::string stream_facts(const TraceEntry& entry);

// The stack of a context the core kept (LiveContexts), or nullptr.
std::shared_ptr<c10::GatheredContext> stack_of(const TraceContextPtr& context);

}  // namespace streamalloc::torch
