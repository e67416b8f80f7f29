// Runs the same work on T threads at once, for the programs that measure how the allocator scales
// (threads_core.cpp, devices.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace streamalloc::bench {

// Runs `work(t)` on T threads at once; returns the wall seconds, and each thread's own in `each`.
template <typename F>
double run_threads(int threads, F&& work, std::vector<double>* each = nullptr) {
  using Seconds = std::chrono::duration<double>;
  std::vector<double> times(static_cast<std::size_t>(threads));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto mine = std::chrono::steady_clock::now();
      work(t);
      times[static_cast<std::size_t>(t)] = Seconds(std::chrono::steady_clock::now() - mine).count();
    });
  }
  for (std::thread& thread : pool) thread.join();
  if (each != nullptr) *each = times;
  return Seconds(std::chrono::steady_clock::now() - start).count();
}

}  // namespace streamalloc::bench
