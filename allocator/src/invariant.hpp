// What every validate() of the core throws when an invariant of docs/design.md ("Invariants") is broken:
// std::logic_error, naming the device, so that a test or the fuzzer stops at the first broken one.
#pragma once

#include <cstdint>
#include <spdlog/fmt/fmt.h>
#include <stdexcept>
#include <string>

#include "streamalloc/stats.hpp"

namespace streamalloc::invariant {

[[noreturn]] inline void broken(int device, const std::string& what) {
  throw std::logic_error("streamalloc invariant broken on device " + std::to_string(device) + ": " + what);
}

inline std::string hex(std::uintptr_t value) { return fmt::format("{:#x}", value); }

// `stat` counts `expected` now, never passed its peak, and (while `totals`: reset_accumulated_stats()
// has not run, after which allocated/freed restart from zero) its totals add up to it.
inline void check_stat(int device, const std::string& name, const Stat& stat, std::int64_t expected, bool totals) {
  if (stat.current != expected) {
    broken(device, name + ".current is " + std::to_string(stat.current) + " but the block table says " +
                       std::to_string(expected));
  }
  if (totals && stat.allocated - stat.freed != stat.current) broken(device, name + ": allocated - freed != current");
  if (stat.peak < stat.current) broken(device, name + ".peak is below current");
}

}  // namespace streamalloc::invariant
