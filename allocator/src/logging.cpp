#include "logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace streamalloc {

spdlog::logger& log() {
  // Created once and never destroyed: frees can arrive during static destruction at process exit.
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("streamalloc", sink);
    l->set_pattern("[streamalloc] [%l] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

std::string_view without_prefix(std::string_view message) {
  constexpr std::string_view kPrefix = "streamalloc: ";
  return message.substr(0, kPrefix.size()) == kPrefix ? message.substr(kPrefix.size()) : message;
}

void set_log_level(const std::string& level) { log().set_level(spdlog::level::from_str(level)); }

}  // namespace streamalloc
