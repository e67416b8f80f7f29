#include "streamalloc/types.hpp"

#include <cstdio>

namespace streamalloc {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kConfig: return "configuration error";
    case ErrorCode::kBackend: return "device error";
    case ErrorCode::kShutdown: return "shut down";
  }
  return "unknown error";
}

std::string format_bytes(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

// PyTorch's units, boundaries included: up to 1024 is "N bytes", up to 1 MiB KiB, up to 1 GiB MiB, then
// GiB (no TiB), two decimals.
std::string format_size(std::size_t bytes) {
  char buf[48];
  const auto value = static_cast<double>(bytes);
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  } else if (bytes <= MiB) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", value / static_cast<double>(KiB));
  } else if (bytes <= GiB) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", value / static_cast<double>(MiB));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", value / static_cast<double>(GiB));
  }
  return buf;
}

}  // namespace streamalloc
