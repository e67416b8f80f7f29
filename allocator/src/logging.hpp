// The library's spdlog logger ("streamalloc", stderr). Never printf.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace streamalloc {

spdlog::logger& log();
// Messages of streamalloc::Error start with "streamalloc: " so that they stand alone where they are
// printed; the log's pattern names streamalloc already, so logged messages drop that prefix.
std::string_view without_prefix(std::string_view message);
// Set the level by name (Options::log_level); unknown names were rejected by Options already.
void set_log_level(const std::string& level);

}  // namespace streamalloc
