// check_sync as a debugging aid: feeds the cache's own event records and waits to the happens-before
// checker, and checks each new use of a block against it (docs/record-stream.md).
#include "audit.hpp"
#include "debug_aid.hpp"
#include "sync_checker.hpp"

namespace streamalloc {
namespace {

class SyncCheckAid final : public DebugAid {
 public:
  SyncCheckAid(int device, Audit& audit, SyncChecker& sync) : device_(device), audit_(audit), sync_(sync) {}

  void on_allocate(Block& block) override { block.alloc_tick = sync_.tick(block.stream); }
  // A stream the block is handed to should already be ordered after the allocation stream's work that
  // followed the allocation (a wait_event, or a host synchronize). Checked when the use is declared,
  // where the bug shows: the consumer got the tensor without waiting for the producer.
  bool on_new_use(const Block& block, Stream stream, NewUse) override {
    if (sync_.ordered_after(stream, block.stream, block.alloc_tick)) return false;
    audit_.missing_wait(device_, block.address, block.size, block.stream, stream);
    return true;
  }
  void on_fence_recorded(Event event, Stream stream) override {
    sync_.on_event_record(reinterpret_cast<std::uintptr_t>(event), stream);
  }
  void on_gpu_wait(Event event, Stream waiter) override {
    sync_.on_event_wait(reinterpret_cast<std::uintptr_t>(event), waiter);
  }

 private:
  const int device_;
  Audit& audit_;
  SyncChecker& sync_;
};

}  // namespace

std::unique_ptr<DebugAid> make_sync_check_aid(int device, Audit& audit, SyncChecker* sync) {
  if (sync == nullptr) return nullptr;
  return std::make_unique<SyncCheckAid>(device, audit, *sync);
}

}  // namespace streamalloc
