// Allocator::snapshot_json(): the dict shape of torch.cuda.memory._snapshot(), so PyTorch's
// memory_viz can read it, plus streamalloc's per-block stream fields.
#include <nlohmann/json.hpp>

#include "streamalloc/allocator.hpp"

namespace streamalloc {
namespace {

nlohmann::json block_json(const BlockInfo& b) {
  nlohmann::json recorded = nlohmann::json::array();
  for (Stream s : b.recorded_streams) recorded.push_back(s);
  return {
      {"address", b.address},
      {"size", b.size},
      {"requested_size", b.requested_size},
      {"state", to_string(b.state)},
      {"frames", nlohmann::json::array()},
      // streamalloc's own fields
      {"allocation_stream", b.allocation_stream},
      {"recorded_streams", recorded},
      {"record_stream_calls", b.record_stream_calls},
      {"pending_fences", b.pending_fences},
      {"settled", b.settled},
      {"age_ms", b.age_ms},
  };
}

}  // namespace

std::string Allocator::snapshot_json() const {
  nlohmann::json segments = nlohmann::json::array();
  for (const SegmentInfo& s : this->segments(-1)) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const BlockInfo& b : s.blocks) blocks.push_back(block_json(b));
    segments.push_back({
        {"device", s.device},
        {"address", s.address},
        {"total_size", s.total_size},
        {"allocated_size", s.allocated_size},
        {"active_size", s.active_size},
        {"requested_size", s.requested_size},
        {"stream", s.stream},
        {"segment_type", s.is_large ? "large" : "small"},
        {"segment_pool_id", nlohmann::json::array({0, 0})},
        {"is_expandable", false},
        {"frames", nlohmann::json::array()},
        {"blocks", blocks},
    });
  }
  nlohmann::json traces = nlohmann::json::array();
  for (int d = 0; d < device_count(); ++d) traces.push_back(nlohmann::json::array());
  nlohmann::json snapshot = {
      {"segments", segments},
      {"device_traces", traces},
      {"allocator_settings", {{"streamalloc_conf", options_.to_conf_string()}}},
      {"streamalloc", {{"backend", backend_->name()}, {"devices", device_count()}}},
  };
  return snapshot.dump();
}

}  // namespace streamalloc
