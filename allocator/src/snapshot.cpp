// The snapshot format, both ways. Allocator::snapshot_json() writes the dict shape of
// torch.cuda.memory._snapshot(), so PyTorch's memory_viz can read it, plus streamalloc's per-block stream
// fields; segments_from_snapshot_json() (streamalloc/report.hpp) reads it back.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "streamalloc/allocator.hpp"
#include "streamalloc/report.hpp"

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

// PyTorch's trace entry keys, plus streamalloc's stream facts where the entry has them.
nlohmann::json trace_json(const TraceEntry& e) {
  nlohmann::json entry = {
      {"action", to_string(e.action)},
      {e.action == TraceAction::kOom ? "device_free" : "addr", e.address},
      {"size", e.size},
      {"stream", e.stream},
      {"time_us", e.time_us},
      {"pool_id", nlohmann::json::array({e.pool.first, e.pool.second})},
      {"frames", nlohmann::json::array()},
  };
  if (!e.pending_streams.empty()) entry["pending_streams"] = e.pending_streams;
  if (e.fenced) {
    entry["fence_stream"] = e.fence_stream;
    entry["fence_recorded_us"] = e.fence_recorded_us;
    entry["held_us"] = e.held_us;
  }
  return entry;
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
        {"segment_pool_id", nlohmann::json::array({s.pool.first, s.pool.second})},
        {"is_expandable", s.expandable},
        // streamalloc's own: an expandable segment's reserved address range (0 for a fixed segment)
        {"reserved_address_bytes", s.reserved_address_bytes},
        {"frames", nlohmann::json::array()},
        {"blocks", blocks},
    });
  }
  nlohmann::json traces = nlohmann::json::array();
  for (int d = 0; d < device_count(); ++d) {
    nlohmann::json trace = nlohmann::json::array();
    for (const TraceEntry& e : history(d)) trace.push_back(trace_json(e));
    traces.push_back(std::move(trace));
  }
  nlohmann::json snapshot = {
      {"segments", segments},
      {"device_traces", traces},
      {"allocator_settings", {{"streamalloc_conf", options_.to_conf_string()}}},
      {"streamalloc", {{"backend", backend_->name()}, {"devices", device_count()}}},
  };
  return snapshot.dump();
}

namespace {

using nlohmann::json;

[[noreturn]] void malformed(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("streamalloc: malformed snapshot: {}: {}", where, what));
}

// A value as it stands in the text, shortened, for messages.
std::string quote(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

// One JSON object being read and where it is ("segments[2].blocks[5]"), so that every message says
// which field of which block is wrong.
class Fields {
 public:
  Fields(const json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object_.is_object()) malformed(where_, "expected an object, got " + quote(object_));
  }
  std::string path(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }

  // nullptr when the field is absent and optional.
  const json* find(const char* key, bool required) const {
    auto it = object_.find(key);
    if (it != object_.end()) return &*it;
    if (required) malformed(where_, fmt::format("the field '{}' is missing", key));
    return nullptr;
  }
  std::uint64_t unsigned_field(const char* key, bool required = false,
                               std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    const json* value = find(key, required);
    return value == nullptr ? 0 : checked_unsigned(*value, path(key), max);
  }
  static std::uint64_t checked_unsigned(const json& value, const std::string& where, std::uint64_t max) {
    if (!value.is_number_unsigned()) malformed(where, "expected a non-negative integer, got " + quote(value));
    const auto number = value.get<std::uint64_t>();
    if (number > max) malformed(where, fmt::format("{} is out of range (at most {})", number, max));
    return number;
  }
  std::string string_field(const char* key, bool required) const {
    const json* value = find(key, required);
    if (value == nullptr) return "";
    if (!value->is_string()) malformed(path(key), "expected a string, got " + quote(*value));
    return value->get<std::string>();
  }
  bool bool_field(const char* key) const {
    const json* value = find(key, false);
    if (value == nullptr) return false;
    if (!value->is_boolean()) malformed(path(key), "expected true or false, got " + quote(*value));
    return value->get<bool>();
  }
  double number_field(const char* key) const {
    const json* value = find(key, false);
    if (value == nullptr) return 0;
    if (!value->is_number()) malformed(path(key), "expected a number, got " + quote(*value));
    return value->get<double>();
  }
  // The array under `key` (an empty one when absent and optional).
  const json& array_field(const char* key, bool required) const {
    static const json kEmpty = json::array();
    const json* value = find(key, required);
    if (value == nullptr) return kEmpty;
    if (!value->is_array()) malformed(path(key), "expected a list, got " + quote(*value));
    return *value;
  }

 private:
  const json& object_;
  std::string where_;
};

BlockInfo::State read_state(const Fields& block) {
  const std::string state = block.string_field("state", true);
  for (auto candidate : {BlockInfo::State::kAllocated, BlockInfo::State::kPendingFree, BlockInfo::State::kFree}) {
    if (state == to_string(candidate)) return candidate;
  }
  malformed(
      block.path("state"),
      fmt::format("unknown block state \"{}\" (expected {}, {} or {})", state, to_string(BlockInfo::State::kAllocated),
                  to_string(BlockInfo::State::kPendingFree), to_string(BlockInfo::State::kFree)));
}

BlockInfo read_block(const Fields& block, std::uintptr_t segment_address) {
  constexpr std::uint64_t kMax32 = std::numeric_limits<std::uint32_t>::max();
  BlockInfo b;
  b.address = block.unsigned_field("address", true);
  b.segment_address = segment_address;
  b.size = block.unsigned_field("size", true);
  b.requested_size = block.unsigned_field("requested_size");
  b.state = read_state(block);
  b.settled = block.bool_field("settled");
  b.allocation_stream = block.unsigned_field("allocation_stream");
  const json& recorded = block.array_field("recorded_streams", false);
  for (std::size_t i = 0; i < recorded.size(); ++i) {
    b.recorded_streams.push_back(Fields::checked_unsigned(
        recorded[i], fmt::format("{}[{}]", block.path("recorded_streams"), i), std::numeric_limits<Stream>::max()));
  }
  b.record_stream_calls = static_cast<std::uint32_t>(block.unsigned_field("record_stream_calls", false, kMax32));
  b.pending_fences = static_cast<std::uint32_t>(block.unsigned_field("pending_fences", false, kMax32));
  b.age_ms = block.number_field("age_ms");
  return b;
}

SegmentInfo read_segment(const Fields& segment) {
  SegmentInfo s;
  s.device = static_cast<int>(segment.unsigned_field("device", false, std::numeric_limits<int>::max()));
  s.address = segment.unsigned_field("address", true);
  s.total_size = segment.unsigned_field("total_size", true);
  s.allocated_size = segment.unsigned_field("allocated_size");
  s.active_size = segment.unsigned_field("active_size");
  s.requested_size = segment.unsigned_field("requested_size");
  s.stream = segment.unsigned_field("stream");
  const std::string type = segment.string_field("segment_type", false);
  if (!type.empty() && type != "large" && type != "small") {
    malformed(segment.path("segment_type"), fmt::format("unknown segment type \"{}\" (expected large or small)", type));
  }
  s.is_large = type == "large";
  s.expandable = segment.bool_field("is_expandable");
  s.reserved_address_bytes = segment.unsigned_field("reserved_address_bytes");
  const json& pool = segment.array_field("segment_pool_id", false);  // absent in older snapshots
  if (!pool.empty()) {
    if (pool.size() != 2) malformed(segment.path("segment_pool_id"), "expected a pair of integers");
    s.pool = PoolId{Fields::checked_unsigned(pool[0], segment.path("segment_pool_id[0]"), UINT64_MAX),
                    Fields::checked_unsigned(pool[1], segment.path("segment_pool_id[1]"), UINT64_MAX)};
  }
  const json& blocks = segment.array_field("blocks", true);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    s.blocks.push_back(read_block(Fields(blocks[i], fmt::format("{}[{}]", segment.path("blocks"), i)), s.address));
  }
  return s;
}

}  // namespace

std::vector<SegmentInfo> segments_from_snapshot_json(const std::string& text) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("streamalloc: the snapshot is not valid JSON: {}", e.what()));
  }
  // A streamalloc.dump() file holds the snapshot under "snapshot", beside the conf and the stats.
  const bool is_dump = document.is_object() && !document.contains("segments") && document.contains("snapshot");
  const json& snapshot = is_dump ? document.at("snapshot") : document;
  if (!snapshot.is_object() || !snapshot.contains("segments")) {
    malformed(is_dump ? "snapshot" : "the document",
              "expected an object with a 'segments' list (a snapshot) or with a 'snapshot' object (a file written "
              "by streamalloc.dump())");
  }
  const Fields top(snapshot, is_dump ? "snapshot" : "");
  const json& segments = top.array_field("segments", true);
  std::vector<SegmentInfo> out;
  out.reserve(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    out.push_back(read_segment(Fields(segments[i], fmt::format("{}[{}]", top.path("segments"), i))));
  }
  return out;
}

}  // namespace streamalloc
