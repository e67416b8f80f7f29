#include "streamalloc_planner/events.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace streamalloc::planner {
namespace {

[[noreturn]] void fail(std::size_t line, const std::string& what) {
  throw std::runtime_error("events:" + std::to_string(line) + ": " + what);
}

std::string_view next_token(std::string_view& rest) {
  std::size_t begin = rest.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) {
    rest = {};
    return {};
  }
  rest.remove_prefix(begin);
  std::size_t end = rest.find_first_of(" \t\r");
  std::string_view token = rest.substr(0, end);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return token;
}

std::uint64_t number(std::string_view& rest, std::size_t line, const char* what) {
  std::string_view token = next_token(rest);
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (token.empty() || ec != std::errc() || ptr != token.data() + token.size()) {
    fail(line, std::string("expected a non-negative integer ") + what + ", got '" + std::string(token) + "'");
  }
  return value;
}

}  // namespace

EventList parse_events(std::string_view text) {
  EventList out;
  struct Live {
    std::uint32_t slot;
    bool used_elsewhere;
    bool freed;
  };
  std::unordered_map<std::uint64_t, Live> ids;  // id -> its slot while live or pending
  std::unordered_map<std::uint64_t, std::uint32_t> streams;
  std::vector<std::uint32_t> free_slots;
  auto stream_index = [&](std::uint64_t raw) {
    auto [it, added] = streams.emplace(raw, static_cast<std::uint32_t>(streams.size()));
    return it->second;
  };
  auto release_slot = [&](std::uint64_t id) {
    free_slots.push_back(ids[id].slot);
    ids.erase(id);
  };

  std::size_t line_no = 0;
  bool have_header = false;
  std::uint64_t now_us = 0;
  while (!text.empty()) {
    std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (!have_header) {
      if (line.rfind("#streamalloc-plan v1", 0) != 0 && line.rfind("#streamalloc-trace v1", 0) != 0) {
        fail(line_no, "not a planner event list (the first line must start with '#streamalloc-plan v1')");
      }
      have_header = true;
      std::string_view rest = line;
      next_token(rest);
      next_token(rest);
      for (std::string_view kv = next_token(rest); !kv.empty(); kv = next_token(rest)) {
        std::size_t eq = kv.find('=');
        if (eq == std::string_view::npos) continue;
        out.header[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
      }
      auto it = out.header.find("completions");
      out.explicit_completions = it != out.header.end() && it->second == "1";
      continue;
    }
    std::string_view rest = line;
    std::string_view op = next_token(rest);
    if (op.empty() || op[0] == '#') continue;
    if (op == "t") {
      const std::uint64_t t = number(rest, line_no, "time in microseconds");
      if (out.timed && t < now_us) {
        fail(line_no, "time " + std::to_string(t) + " runs back (the last was " + std::to_string(now_us) + ")");
      }
      now_us = t;
      out.timed = true;
      continue;
    }
    if (op == "d") {
      Placement placement;
      placement.event = out.events.size();
      placement.size = number(rest, line_no, "segment size");
      placement.address = number(rest, line_no, "segment address");
      if (placement.size == 0) fail(line_no, "segment of size 0");
      out.placements.push_back(placement);
      continue;
    }
    Event event;
    event.time_us = now_us;
    if (op == "a") {
      std::uint64_t id = number(rest, line_no, "id");
      event.kind = Event::Kind::kAlloc;
      event.size = number(rest, line_no, "size");
      event.stream = stream_index(number(rest, line_no, "stream"));
      auto it = ids.find(id);
      if (it != ids.end()) {
        if (!it->second.freed) fail(line_no, "alloc of id " + std::to_string(id) + ", which is live");
        // A pending block whose completion never came: its slot stays with the model's pending list.
        ids.erase(it);
      }
      std::uint32_t slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<std::uint32_t>(out.slots++);
      }
      ids[id] = Live{slot, false, false};
      event.slot = slot;
      ++out.allocs;
    } else if (op == "f" || op == "r" || op == "c") {
      std::uint64_t id = number(rest, line_no, "id");
      auto it = ids.find(id);
      if (it == ids.end()) fail(line_no, std::string(op) + " of id " + std::to_string(id) + ", which is not live");
      event.slot = it->second.slot;
      if (op == "f") {
        if (it->second.freed) fail(line_no, "double free of id " + std::to_string(id));
        event.kind = Event::Kind::kFree;
        it->second.freed = true;
        if (!(it->second.used_elsewhere && out.explicit_completions)) release_slot(id);
      } else if (op == "r") {
        if (it->second.freed) fail(line_no, "record_stream on freed id " + std::to_string(id));
        event.kind = Event::Kind::kRecordStream;
        event.stream = stream_index(number(rest, line_no, "stream"));
        it->second.used_elsewhere = true;
      } else {
        if (!it->second.freed) fail(line_no, "completion of id " + std::to_string(id) + " before its free");
        event.kind = Event::Kind::kComplete;
        release_slot(id);
      }
    } else {
      fail(line_no, "unknown op '" + std::string(op) + "' (expected a, f, r, c, t or d)");
    }
    out.events.push_back(event);
  }
  if (!have_header) fail(0, "empty event list");
  out.streams = streams.size();
  return out;
}

EventList load_events(const std::string& source) {
  if (!source.empty() && source[0] == '#') return parse_events(source);
  std::ifstream in(source, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open event list '" + source + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_events(buffer.str());
}

}  // namespace streamalloc::planner
