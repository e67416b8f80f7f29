// Shared fixture: an Allocator on a SimBackend the test can drive.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc::testing {

struct SimSetup {
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> allocator;

  // The simulated device's configuration the constructor below starts from.
  static SimBackend::Config device(SimBackend::Mode mode = SimBackend::Mode::kManual, std::size_t memory = 256 * MiB,
                                   int devices = 1) {
    SimBackend::Config config;
    config.device_count = devices;
    config.memory_per_device = memory;
    config.mode = mode;
    return config;
  }
  explicit SimSetup(const std::string& conf, SimBackend::Mode mode = SimBackend::Mode::kManual,
                    std::size_t memory = 256 * MiB, int devices = 1)
      : SimSetup(conf, device(mode, memory, devices)) {}
  SimSetup(const std::string& conf, const SimBackend::Config& config)
      : sim(std::make_shared<SimBackend>(config)), allocator(std::make_unique<Allocator>(Options::parse(conf), sim)) {}
  Allocator& a() { return *allocator; }
  DeviceStats stats(int device = 0) { return allocator->stats(device); }
};

inline std::string policy_conf(CrossStreamReuse policy) {
  return std::string("cross_stream_reuse:") + to_string(policy);
}

// Write `value` to every byte of [ptr, ptr+n) when `stream` reaches this point.
inline void enqueue_fill(SimBackend& sim, Stream stream, void* ptr, std::size_t n, unsigned char value) {
  sim.enqueue(0, stream, [=] { std::memset(ptr, value, n); });
}

}  // namespace streamalloc::testing
