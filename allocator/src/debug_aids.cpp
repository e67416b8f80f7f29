#include "debug_aid.hpp"
#include "invariant.hpp"

namespace streamalloc {

void AidCheck::broken(const std::string& what) const { invariant::broken(device, what); }

DebugAids::DebugAids(std::vector<std::unique_ptr<DebugAid>> aids) : aids_(std::move(aids)) {
  for (const auto& aid : aids_) {
    if (aid->holds_blocks()) holder_ = aid.get();
  }
}

DebugAids::~DebugAids() = default;

void DebugAids::set_history(std::unique_ptr<DebugAid> history) {
  if (history_ != nullptr) aids_.pop_back();
  history_ = history.get();
  if (history != nullptr) aids_.push_back(std::move(history));
}

void DebugAids::on_record_stream(const Block& block, Stream stream) {
  for (const auto& aid : aids_) aid->on_record_stream(block, stream);
}

void DebugAids::on_fenced_free_completed(const Block& block, Stream fence_stream, const Fence* fence) {
  for (const auto& aid : aids_) aid->on_fenced_free_completed(block, fence_stream, fence);
}

void DebugAids::on_segment(TraceAction action, const Segment& segment) {
  for (const auto& aid : aids_) aid->on_segment(action, segment);
}

void DebugAids::on_segment_pages(TraceAction action, const Segment& segment, std::uintptr_t address,
                                 std::size_t bytes) {
  for (const auto& aid : aids_) aid->on_segment_pages(action, segment, address, bytes);
}

void DebugAids::on_out_of_memory_request(std::size_t device_free, std::size_t size, Stream stream, PoolId pool) {
  for (const auto& aid : aids_) aid->on_out_of_memory_request(device_free, size, stream, pool);
}

void DebugAids::on_snapshot(std::size_t active_bytes) {
  for (const auto& aid : aids_) aid->on_snapshot(active_bytes);
}

void DebugAids::on_allocate(Block& block) {
  for (const auto& aid : aids_) aid->on_allocate(block);
}

void DebugAids::on_free(const Block& block) {
  for (const auto& aid : aids_) aid->on_free(block);
}

bool DebugAids::on_new_use(const Block& block, Stream stream, NewUse how) {
  bool unordered = false;
  for (const auto& aid : aids_) unordered = aid->on_new_use(block, stream, how) || unordered;
  return unordered;
}

void DebugAids::on_ignored_record_stream(IgnoredRecordStream why, const void* ptr, Stream stream) {
  for (const auto& aid : aids_) aid->on_ignored_record_stream(why, ptr, stream);
}

bool DebugAids::on_reusable(const Block& block) {
  bool enqueued = false;
  for (const auto& aid : aids_) enqueued = aid->on_reusable(block) || enqueued;
  return enqueued;
}

void DebugAids::release_all(std::vector<Block*>* released) {
  if (holder_ != nullptr) holder_->release_all(released);
}

void DebugAids::on_fence_recorded(Event event, Stream stream) {
  for (const auto& aid : aids_) aid->on_fence_recorded(event, stream);
}

void DebugAids::on_gpu_wait(Event event, Stream waiter) {
  for (const auto& aid : aids_) aid->on_gpu_wait(event, waiter);
}

void DebugAids::on_pending_changed(Clock::time_point when, Stream stream, const StreamPending& now) {
  for (const auto& aid : aids_) aid->on_pending_changed(when, stream, now);
}

void DebugAids::on_fence_in_flight(Stream stream, const Fence& oldest, Clock::time_point now) {
  for (const auto& aid : aids_) aid->on_fence_in_flight(stream, oldest, now);
}

void DebugAids::on_host_sync_for_memory(std::size_t fences, std::size_t bytes_released) {
  for (const auto& aid : aids_) aid->on_host_sync_for_memory(fences, bytes_released);
}

void DebugAids::on_out_of_memory(const std::string& report) {
  for (const auto& aid : aids_) aid->on_out_of_memory(report);
}

bool DebugAids::pending_history(PendingHistory* out) const {
  for (const auto& aid : aids_) {
    if (aid->pending_history(out)) return true;
  }
  return false;
}

void DebugAids::validate(const AidCheck& check) const {
  for (const auto& aid : aids_) aid->validate(check);
}

std::unique_ptr<DebugAids> make_debug_aids(int device, const Options& options, Backend& backend, Audit& audit,
                                           SyncChecker* sync) {
  std::vector<std::unique_ptr<DebugAid>> aids;
  std::unique_ptr<DebugAid> candidates[] = {
      make_sync_check_aid(device, audit, sync), make_poison_aid(device, options, backend), make_quarantine_aid(options),
      make_pending_history_aid(options),        make_audit_aid(device, options, audit),
  };
  for (auto& aid : candidates) {
    if (aid) aids.push_back(std::move(aid));
  }
  if (aids.empty()) return nullptr;
  return std::make_unique<DebugAids>(std::move(aids));
}

}  // namespace streamalloc
