// The library's spdlog logger ("streamalloc", stderr). Never printf.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace streamalloc {

spdlog::logger& log();
// Set the level by name (Options::log_level); unknown names were rejected by Options already.
void set_log_level(const std::string& level);

}  // namespace streamalloc
