// The audit as a debugging aid: says in the audit sink what the cache saw (audit:warn|trace).
#include <map>

#include "audit.hpp"
#include "debug_aid.hpp"

namespace streamalloc {
namespace {

class AuditAid final : public DebugAid {
 public:
  AuditAid(int device, const Options& options, Audit& audit)
      : device_(device), pending_warn_ms_(static_cast<double>(options.pending_warn_ms)), audit_(audit) {}

  void on_allocate(Block& block) override { audit_.trace(device_, "malloc", block.address, block.size, block.stream); }
  void on_free(const Block& block) override { audit_.trace(device_, "free", block.address, block.size, block.stream); }
  bool on_new_use(const Block& block, Stream stream, NewUse how) override {
    if (how == NewUse::kRecordStream) audit_.trace(device_, "record_stream", block.address, block.size, stream);
    return false;
  }
  void on_ignored_record_stream(IgnoredRecordStream why, const void* ptr, Stream stream) override {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    switch (why) {
      case IgnoredRecordStream::kAllocationStream:
        audit_.record_stream_on_allocation_stream(device_, address, stream);
        break;
      case IgnoredRecordStream::kDuplicate: audit_.record_stream_duplicate(device_, address, stream); break;
      case IgnoredRecordStream::kAlreadyFreed:
        audit_.record_stream_not_live(device_, ptr, stream, "the block is already freed (record_stream came too late)");
        break;
      case IgnoredRecordStream::kForeignPointer:
        audit_.record_stream_not_live(device_, ptr, stream, "the pointer was not allocated by streamalloc");
        break;
    }
  }
  // Each fence is reported at most once, the first time a poll finds it pending for too long.
  void on_fence_in_flight(Stream stream, const Fence& oldest, Clock::time_point now) override {
    if (oldest.pending.empty()) return;
    std::uint64_t& reported = reported_seq_[stream];
    if (reported >= oldest.seq) return;
    const double ms = std::chrono::duration<double, std::milli>(now - oldest.recorded_at).count();
    if (ms <= pending_warn_ms_) return;
    std::size_t bytes = 0;
    for (const Block* b : oldest.pending) bytes += b->size;
    audit_.pending_too_long(device_, stream, oldest.pending.size(), bytes, ms);
    reported = oldest.seq;
  }
  void on_host_sync_for_memory(std::size_t fences, std::size_t bytes_released) override {
    audit_.host_sync_for_memory(device_, fences, bytes_released);
  }
  void on_out_of_memory(const std::string& report) override { audit_.out_of_memory(device_, report); }

 private:
  const int device_;
  const double pending_warn_ms_;
  Audit& audit_;
  std::map<Stream, std::uint64_t> reported_seq_;  // per stream: the newest fence reported as late
};

}  // namespace

std::unique_ptr<DebugAid> make_audit_aid(int device, const Options& options, Audit& audit) {
  if (!audit.enabled()) return nullptr;
  return std::make_unique<AuditAid>(device, options, audit);
}

}  // namespace streamalloc
