// The per-block stream table and the pending bytes per allocation stream (streamalloc/report.hpp).
#include "streamalloc/report.hpp"

#include <set>
#include <utility>

#include <spdlog/fmt/fmt.h>

namespace streamalloc {
namespace {

std::string stream_name(Stream s, const StreamNames& names) {
  auto it = names.find(s);
  if (it != names.end()) return it->second;
  return s == 0 ? "default" : fmt::format("{:#x}", s);
}

template <typename Streams>
std::string stream_list(const Streams& streams, const StreamNames& names) {
  std::string out;
  for (Stream s : streams) out += (out.empty() ? "" : ",") + stream_name(s, names);
  return out.empty() ? "-" : out;
}

// "  device N:" before the first row of each device, when the rows span several devices.
class DeviceHeadings {
 public:
  explicit DeviceHeadings(const std::vector<SegmentInfo>& segments) {
    for (const SegmentInfo& s : segments) on_ = on_ || s.device != segments.front().device;
  }
  std::string before_row_of(int device) {
    if (!on_ || device == last_) return "";
    last_ = device;
    return fmt::format("  device {}:\n", device);
  }

 private:
  bool on_ = false;
  int last_ = -1;
};

std::string block_state(const BlockInfo& b) {
  std::string state = to_string(b.state);
  if (b.state == BlockInfo::State::kFree) state += b.settled ? " (settled)" : " (own stream)";
  return state;
}

// What one allocation stream (of one device) has freed but cannot hand out to every stream yet.
struct Unreleased {
  std::size_t pending_blocks = 0;
  std::size_t pending_bytes = 0;
  std::set<Stream> recorded_on;     // streams recorded on its pending blocks
  std::size_t unsettled_bytes = 0;  // free blocks it owns whose own fence has not completed
};

}  // namespace

std::string format_block_table(const std::vector<SegmentInfo>& segments, std::size_t max_rows,
                               const StreamNames& stream_names) {
  std::string out = "Per-block stream report (one row per block of every segment):\n";
  out += fmt::format("  {:<14} {:>10}  {:<20} {:<10} {:<22} {:>7} {:>9}\n", "block", "size", "state", "alloc on",
                     "recorded on", "fences", "age ms");
  DeviceHeadings headings(segments);
  // Where private memory pools (CUDA graphs, MemPools) hold segments, each run of rows says its pool.
  bool pools = false;
  for (const SegmentInfo& segment : segments) pools = pools || !segment.pool.is_default();
  const SegmentInfo* last_segment = nullptr;
  std::size_t rows = 0;
  std::size_t hidden = 0;
  for (const SegmentInfo& segment : segments) {
    for (const BlockInfo& b : segment.blocks) {
      if (rows >= max_rows) {
        ++hidden;
        continue;
      }
      out += headings.before_row_of(segment.device);
      if (pools && (last_segment == nullptr || last_segment->pool != segment.pool)) {
        out += segment.pool.is_default()
                   ? std::string("  default pool:\n")
                   : fmt::format("  memory pool ({}, {}):\n", segment.pool.first, segment.pool.second);
      }
      last_segment = &segment;
      out += fmt::format("  0x{:012x} {:>10}  {:<20} {:<10} {:<22} {:>7} {:>9.2f}\n", b.address, format_bytes(b.size),
                         block_state(b), stream_name(b.allocation_stream, stream_names),
                         stream_list(b.recorded_streams, stream_names), b.pending_fences, b.age_ms);
      ++rows;
    }
  }
  if (hidden != 0) out += fmt::format("  ... {} more block(s) not shown\n", hidden);
  return out;
}

std::string format_pending_by_stream(const std::vector<SegmentInfo>& segments, const StreamNames& stream_names) {
  std::map<std::pair<int, Stream>, Unreleased> by_stream;
  Unreleased total;
  for (const SegmentInfo& segment : segments) {
    for (const BlockInfo& b : segment.blocks) {
      const bool pending = b.state == BlockInfo::State::kPendingFree;
      const bool unsettled = b.state == BlockInfo::State::kFree && !b.settled;
      if (!pending && !unsettled) continue;
      for (Unreleased* u : {&by_stream[{segment.device, b.allocation_stream}], &total}) {
        if (pending) {
          u->pending_blocks += 1;
          u->pending_bytes += b.size;
          u->recorded_on.insert(b.recorded_streams.begin(), b.recorded_streams.end());
        } else {
          u->unsettled_bytes += b.size;
        }
      }
    }
  }
  if (total.pending_blocks == 0) {
    return fmt::format("Pending frees by allocation stream: none (no freed block waits for a fence){}.\n",
                       total.unsettled_bytes == 0 ? ""
                                                  : fmt::format("; {} free on its own stream, not settled yet",
                                                                format_bytes(total.unsettled_bytes)));
  }
  const auto columns = [](const auto&... cells) {
    return fmt::format("  {:<16} {:>14} {:>14}  {:<22} {:>17}\n", cells...);
  };
  const auto row = [&](const std::string& name, const Unreleased& u, const std::string& recorded_on) {
    return columns(name, u.pending_blocks, format_bytes(u.pending_bytes), recorded_on, format_bytes(u.unsettled_bytes));
  };
  std::string out = "Pending frees by allocation stream (waiting for fences of the streams recorded on them):\n";
  out += columns("stream", "pending blocks", "pending bytes", "recorded on", "free, not settled");
  DeviceHeadings headings(segments);
  for (const auto& [key, u] : by_stream) {
    const auto& [device, stream] = key;
    out += headings.before_row_of(device);
    out += row(stream_name(stream, stream_names), u, stream_list(u.recorded_on, stream_names));
  }
  out += row("total", total, "");
  return out;
}

std::string format_block_report(const std::vector<SegmentInfo>& segments, std::size_t max_rows,
                                const StreamNames& stream_names) {
  return format_block_table(segments, max_rows, stream_names) + "\n" + format_pending_by_stream(segments, stream_names);
}

}  // namespace streamalloc
