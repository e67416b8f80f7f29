#include "cycle_clock.hpp"

namespace streamalloc::cycle_clock {

namespace {
double ticks_per_ns() {
#if defined(__x86_64__) || defined(__i386__)
  static const double rate = [] {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    const std::uint64_t first = now();
    Clock::time_point end = start;
    while (end - start < std::chrono::milliseconds(1)) end = Clock::now();
    const std::uint64_t last = now();
    const double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
    return static_cast<double>(last - first) / ns;
  }();
  return rate;
#else
  return 1.0;
#endif
}
}  // namespace

std::int64_t to_ns(std::uint64_t ticks) {
  return static_cast<std::int64_t>(static_cast<double>(ticks) / ticks_per_ns());
}

std::uint64_t from_ns(std::int64_t ns) { return static_cast<std::uint64_t>(static_cast<double>(ns) * ticks_per_ns()); }

}  // namespace streamalloc::cycle_clock
