// SpinLock: the lock of short critical sections, taken on every cached allocation and free (a
// stream's shard; device_cache.hpp). One atomic exchange to take it and a plain store to release it,
// fewer locked instructions than a std::mutex; a waiter spins on a plain load (so the line stays
// shared until the holder releases) and yields the CPU after a while, so that more threads than cores
// cannot spin away a preempted holder's time slice.
#pragma once

#include <atomic>
#include <thread>

namespace streamalloc {

class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < kSpinsBeforeYield) {
          relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  static constexpr int kSpinsBeforeYield = 64;
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<bool> locked_{false};
};

}  // namespace streamalloc
