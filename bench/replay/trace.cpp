// Trace reader: turns trace ids into dense slots (so replay keeps pointers in a plain vector) and
// checks that the trace is a valid sequence of operations before anything is timed.
#include "trace.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <unordered_map>

namespace streamalloc::bench {
namespace {

constexpr std::string_view kMagic = "#streamalloc-trace v1";

class LineError {
 public:
  LineError(const std::string& path, std::size_t line) : where_(path + ":" + std::to_string(line) + ": ") {}
  [[noreturn]] void operator()(const std::string& what) const { throw std::runtime_error(where_ + what); }

 private:
  std::string where_;
};

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

std::uint64_t number(std::string_view text, const char* what, const LineError& fail) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    fail(std::string(what) + " '" + std::string(text) + "' is not a non-negative integer");
  }
  return value;
}

}  // namespace

std::int64_t Trace::header_int(const std::string& key) const {
  auto it = header.find(key);
  if (it == header.end()) return -1;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    return -1;
  }
}

std::string Trace::header_string(const std::string& key, const std::string& fallback) const {
  auto it = header.find(key);
  return it == header.end() ? fallback : it->second;
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the trace file");
  Trace trace;
  std::unordered_map<std::uint64_t, std::uint32_t> live;    // trace id -> slot
  std::unordered_map<std::int64_t, std::uint32_t> streams;  // trace stream -> dense index
  std::vector<std::uint32_t> idle_slots;
  std::size_t live_bytes = 0;
  std::vector<std::size_t> slot_size;
  std::vector<std::uint32_t> slot_stream;

  auto stream_index = [&](std::int64_t id) {
    auto [it, inserted] = streams.try_emplace(id, static_cast<std::uint32_t>(trace.stream_ids.size()));
    if (inserted) trace.stream_ids.push_back(id);
    return it->second;
  };

  std::string line;
  std::size_t number_of_line = 0;
  while (std::getline(in, line)) {
    ++number_of_line;
    const LineError fail(path, number_of_line);
    if (number_of_line == 1) {
      if (line.compare(0, kMagic.size(), kMagic) != 0) {
        fail("not a streamalloc trace: the first line must start with '" + std::string(kMagic) + "'");
      }
      for (std::string_view item : fields(std::string_view(line).substr(kMagic.size()))) {
        const std::size_t eq = item.find('=');
        if (eq == std::string_view::npos || eq == 0) fail("header item '" + std::string(item) + "' is not key=value");
        trace.header[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
      }
      continue;
    }
    const auto f = fields(line);
    if (f.empty() || f[0][0] == '#') continue;
    const std::string_view op = f[0];
    const std::size_t expected = op == "a" ? 4 : op == "r" ? 3 : op == "f" ? 2 : 0;
    if (expected == 0) fail("unknown operation '" + std::string(op) + "' (expected a, f or r)");
    if (f.size() != expected) {
      fail("'" + std::string(op) + "' takes " + std::to_string(expected - 1) + " fields, this line has " +
           std::to_string(f.size() - 1));
    }
    const std::uint64_t id = number(f[1], "block id", fail);
    TraceOp entry;
    if (op == "a") {
      entry.kind = TraceOp::Kind::kAlloc;
      entry.size = number(f[2], "size", fail);
      if (entry.size == 0) fail("size 0 (allocators return no block for it; leave such calls out)");
      entry.stream = stream_index(static_cast<std::int64_t>(number(f[3], "stream", fail)));
      if (live.count(id) != 0) fail("block " + std::to_string(id) + " is allocated while still live");
      if (idle_slots.empty()) {
        idle_slots.push_back(static_cast<std::uint32_t>(slot_size.size()));
        slot_size.push_back(0);
        slot_stream.push_back(0);
      }
      entry.slot = idle_slots.back();
      idle_slots.pop_back();
      slot_size[entry.slot] = entry.size;
      slot_stream[entry.slot] = entry.stream;
      live.emplace(id, entry.slot);
      live_bytes += entry.size;
      trace.peak_live_bytes = std::max(trace.peak_live_bytes, live_bytes);
      ++trace.allocs;
    } else {
      auto it = live.find(id);
      if (it == live.end()) fail("block " + std::to_string(id) + " is not live (never allocated, or freed already)");
      entry.slot = it->second;
      entry.size = slot_size[entry.slot];
      if (op == "r") {
        entry.kind = TraceOp::Kind::kRecordStream;
        entry.stream = stream_index(static_cast<std::int64_t>(number(f[2], "stream", fail)));
        ++trace.record_streams;
      } else {
        entry.kind = TraceOp::Kind::kFree;
        entry.stream = slot_stream[entry.slot];
        idle_slots.push_back(entry.slot);
        live.erase(it);
        live_bytes -= entry.size;
        ++trace.frees;
      }
    }
    trace.ops.push_back(entry);
  }
  if (number_of_line == 0) throw std::runtime_error(path + ": empty file, not a streamalloc trace");
  trace.slots = slot_size.size();
  trace.live_at_end = live.size();
  return trace;
}

}  // namespace streamalloc::bench
