// MemoryCap: the device's memory as a device cache sees it: its total, asked of the backend on first
// need and from then on read by every stream's fast path without a lock (which leaves a request larger
// than the device to the device-locked path), and the memory fraction that caps what the cache may
// reserve (set_memory_fraction). Written under the device lock only.
#pragma once

#include <atomic>
#include <cstddef>

#include "streamalloc/backend.hpp"

namespace streamalloc {

class MemoryCap {
 public:
  explicit MemoryCap(double fraction) : fraction_(fraction) {}
  MemoryCap(const MemoryCap&) = delete;
  MemoryCap& operator=(const MemoryCap&) = delete;

  // The device's total memory, asked of `backend` the first time.
  void note_total(Backend& backend, int device) {
    if (total_.load(std::memory_order_relaxed) == 0) {
      total_.store(backend.memory_info(device).total_bytes, std::memory_order_relaxed);
    }
  }
  const std::atomic<std::size_t>& total() const { return total_; }  // 0 until noted
  std::size_t total_bytes() const { return total_.load(std::memory_order_relaxed); }
  // What the cache may reserve: the fraction of the device's memory.
  std::size_t cap() const { return static_cast<std::size_t>(fraction_ * static_cast<double>(total_bytes())); }
  double fraction() const { return fraction_; }
  void set_fraction(double fraction) { fraction_ = fraction; }

 private:
  std::atomic<std::size_t> total_{0};
  double fraction_;
};

}  // namespace streamalloc
