// The current value and peak of an amount that several threads change at once (bytes held, bytes
// reserved), for peers whose allocator does not keep its own peaks.
#pragma once

#include <atomic>
#include <cstdint>

namespace streamalloc::bench {

class AtomicPeak {
 public:
  void add(std::int64_t amount) {
    const std::int64_t now = current_.fetch_add(amount, std::memory_order_relaxed) + amount;
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  // Restart the peak from the current value.
  void reset_peak() { peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed); }
  std::int64_t current() const { return current_.load(std::memory_order_relaxed); }
  std::int64_t peak() const { return peak_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> current_{0};
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace streamalloc::bench
