#include <cstdlib>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "streamalloc_planner/plan.hpp"
#include "streamalloc_planner/streamalloc_planner.h"

namespace {
char* copy_out(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out) std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}
}  // namespace

extern "C" char* streamalloc_plan_json(const char* events, const char* request_json) {
  try {
    if (events == nullptr) throw std::invalid_argument("no event list given");
    auto list = streamalloc::planner::load_events(events);
    auto request = streamalloc::planner::parse_request(request_json ? request_json : "");
    return copy_out(streamalloc::planner::plan_json(list, request));
  } catch (const std::exception& e) {
    return copy_out(nlohmann::json{{"error", e.what()}}.dump());
  } catch (...) {
    return copy_out("{\"error\": \"unknown failure\"}");
  }
}

extern "C" void streamalloc_plan_free(char* text) { std::free(text); }
