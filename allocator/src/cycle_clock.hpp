// cycle_clock: timestamps cheap enough to take on every device-locked call (the device lock's wait
// and hold times, stats `device_lock_wait_ns` and `device_lock_held_ns`). On x86 the time-stamp
// counter (cheap to read; constant-rate on the processors CUDA runs on), converted to
// nanoseconds only when the stats are read; elsewhere the steady clock's nanoseconds.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace streamalloc::cycle_clock {

inline std::uint64_t now() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

// Ticks of now() in nanoseconds. The counter's rate is measured once per process against the steady
// clock, over about a millisecond, at the first call (a stats read, after it has let the device lock
// go).
std::int64_t to_ns(std::uint64_t ticks);
// The ticks of now() in `ns` nanoseconds (the same measurement).
std::uint64_t from_ns(std::int64_t ns);

}  // namespace streamalloc::cycle_clock
