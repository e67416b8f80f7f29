// The allocation history as a debugging aid (streamalloc/trace.hpp; docs/design.md, "Allocation
// history"): each event the cache reports to its aids becomes a trace entry sent to the sink. The cache
// adds it when a sink is set and removes it when the sink is cleared (DeviceCache::set_trace_sink).
#include "debug_aid.hpp"
#include "trace_events.hpp"

namespace streamalloc {

namespace {

class HistoryAid final : public DebugAid {
 public:
  HistoryAid(int device, TraceSink& sink) : device_(device), sink_(sink) {}

  void on_allocate(Block& block) override { trace_events::alloc(sink_, device_, block); }
  void on_free(const Block& block) override { trace_events::free_requested(sink_, device_, block); }
  void on_record_stream(const Block& block, Stream stream) override {
    trace_events::record_stream(sink_, device_, block, stream);
  }
  void on_fenced_free_completed(const Block& block, Stream fence_stream, const Fence* fence) override {
    trace_events::fenced_free_completed(sink_, device_, block, fence_stream, fence);
  }
  void on_segment(TraceAction action, const Segment& segment) override {
    trace_events::segment(sink_, action, device_, segment);
  }
  void on_segment_pages(TraceAction action, const Segment& segment, std::uintptr_t address,
                        std::size_t bytes) override {
    trace_events::segment_pages(sink_, action, device_, segment, address, bytes);
  }
  void on_out_of_memory_request(std::size_t device_free, std::size_t size, Stream stream, PoolId pool) override {
    trace_events::out_of_memory(sink_, device_, device_free, size, stream, pool);
  }
  void on_snapshot(std::size_t active_bytes) override { trace_events::snapshot(sink_, device_, active_bytes); }

 private:
  const int device_;
  TraceSink& sink_;
};

}  // namespace

std::unique_ptr<DebugAid> make_history_aid(int device, TraceSink& sink) {
  return std::make_unique<HistoryAid>(device, sink);
}

}  // namespace streamalloc
