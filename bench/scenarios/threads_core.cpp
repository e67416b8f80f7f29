// How the core's per-stream fast path scales with threads, apart from the machine: T threads (each with
// its own stream of the simulated device) make the same number of alloc+free pairs, and beside each
// run a control loop of pure arithmetic per thread shows how the machine itself scales.
//
//   streamalloc_threads_core [--pairs N] [--threads 1,2,4,8,16] [--sizes mixed|same] [--rounds R]
//
// --sizes mixed: each thread cycles through 512 B, 4 KiB, 64 KiB and 1 MiB, as the `threads` scenario
// of streamalloc_bench does; its streams peak at different moments, so the device's exact peak stays
// below the sum of the streams' own peaks and they borrow headroom from each other through the device
// lock (docs/design.md, "Stats stay exact"). --sizes same: every pair is 4 KiB, so after the first
// rounds no stream borrows and the fast path runs alone. Prints, per thread count, the aggregate pairs
// per second (all threads' pairs over the wall time), the slowest and fastest thread, and the control.
// --rounds R times R rounds one after the other on the same allocator (one line each, with the device's
// allocated_bytes peak after it, the share of the round's calls that took the device lock, how much of
// the round the device lock was held and how long a device-locked call waited for it, and the control
// run again right after the round): how the rate moves as a long-running process's peaks settle, and
// whether a slow round was the allocator's or the machine's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "run_threads.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"

namespace {

using streamalloc::Allocator;
using streamalloc::DeviceStats;
using streamalloc::Stream;
using streamalloc::bench::run_threads;

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "streamalloc_threads_core: %s\nusage: streamalloc_threads_core [--pairs N] [--threads 1,2,4,...] "
               "[--sizes mixed|same] [--rounds R]\n",
               problem.c_str());
  std::exit(2);
}

std::vector<int> parse_threads(const std::string& list) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const int n = std::atoi(list.substr(start, comma - start).c_str());
    if (n < 1 || n > 256) usage("--threads wants counts from 1 to 256, got '" + list + "'");
    out.push_back(n);
    start = comma + 1;
  }
  return out;
}

// Arithmetic on a cache line of the thread's own: what T threads do when they share nothing.
struct alignas(64) Counter {
  unsigned long value = 1;
};

}  // namespace

int main(int argc, char** argv) {
  long pairs = 2000000;
  std::vector<int> thread_counts = {1, 2, 4, 8, 16};
  bool same = false;
  int rounds = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--pairs") {
      pairs = std::atol(value().c_str());
      if (pairs < 1) usage("--pairs wants a positive count");
    } else if (arg == "--rounds") {
      rounds = std::atoi(value().c_str());
      if (rounds < 1) usage("--rounds wants a positive count");
    } else if (arg == "--threads") {
      thread_counts = parse_threads(value());
    } else if (arg == "--sizes") {
      const std::string sizes = value();
      if (sizes != "mixed" && sizes != "same") usage("--sizes is mixed or same, got '" + sizes + "'");
      same = sizes == "same";
    } else {
      usage("unknown argument '" + arg + "'");
    }
  }
  constexpr std::size_t kSizes[] = {512, 4096, 64 * 1024, 1024 * 1024};
  std::printf("sizes %s, %ld pairs per thread\n%7s %12s %16s %14s %14s\n",
              same ? "same (4 KiB)" : "mixed (512 B..1 MiB)", pairs, "threads", "control s", "M pairs/s", "fastest s",
              "slowest s");
  for (const int threads : thread_counts) {
    std::vector<Counter> counters(static_cast<std::size_t>(threads));
    const auto control_loop = [&] {
      return run_threads(threads, [&](int t) {
        Counter& c = counters[static_cast<std::size_t>(t)];
        for (long i = 0; i < pairs * 20; ++i) {
          c.value = c.value * 6364136223846793005ull + 1442695040888963407ull;
          asm volatile("" : : "r"(c.value) : "memory");
        }
      });
    };
    // With rounds, the control runs after each round instead (below).
    double control = rounds > 1 ? 0.0 : control_loop();

    streamalloc::SimBackend::Config config;
    config.memory_per_device = std::size_t{4} << 30;
    config.mode = streamalloc::SimBackend::Mode::kEager;
    auto sim = std::make_shared<streamalloc::SimBackend>(config);
    Allocator allocator(streamalloc::Options::parse("backend:sim,log_level:error"), sim);
    std::vector<Stream> streams;
    for (int t = 0; t < threads; ++t) streams.push_back(sim->create_stream(0));
    for (const Stream stream : streams) {  // warm-up: each stream's blocks, as streamalloc_bench does
      for (const std::size_t size : kSizes) allocator.deallocate(allocator.allocate(size, 0, stream), size, 0, stream);
    }
    for (int round = 0; round < rounds; ++round) {
      const DeviceStats before = allocator.stats(0);
      std::vector<double> each;
      const double wall = run_threads(
          threads,
          [&](int t) {
            const Stream stream = streams[static_cast<std::size_t>(t)];
            for (long i = 0; i < pairs; ++i) {
              const std::size_t size = same ? 4096 : kSizes[static_cast<std::size_t>(i) % 4];
              allocator.deallocate(allocator.allocate(size, 0, stream), size, 0, stream);
            }
          },
          &each);
      const DeviceStats after = allocator.stats(0);
      allocator.validate();
      // With rounds, the control runs after each round on threads of their own, as the round's were: a
      // round that is slow while its control is not is the allocator's doing, not the machine's.
      if (rounds > 1) control = control_loop();
      const double calls = static_cast<double>(pairs) * threads;  // allocations, and as many frees
      std::printf("%7d %12.3f %16.1f %14.3f %14.3f", threads, control, calls / wall / 1e6,
                  *std::min_element(each.begin(), each.end()), *std::max_element(each.begin(), each.end()));
      if (rounds > 1) {
        const auto delta = [&](std::int64_t DeviceStats::*count) {
          return static_cast<double>(after.*count - before.*count);
        };
        const double locked = delta(&DeviceStats::allocations_device_locked) + delta(&DeviceStats::frees_device_locked);
        std::printf(
            "  round %d, allocated_bytes peak %.2f MiB, device-locked %.3f%% of allocations, %.3f%% of frees, "
            "device lock held %.0f%% of the round, %.2f us waited per device-locked call",
            round + 1, static_cast<double>(after.allocated_bytes[0].peak) / (1 << 20),
            100.0 * delta(&DeviceStats::allocations_device_locked) / calls,
            100.0 * delta(&DeviceStats::frees_device_locked) / calls,
            100.0 * delta(&DeviceStats::device_lock_held_ns) / (wall * 1e9),
            locked > 0 ? delta(&DeviceStats::device_lock_wait_ns) / locked / 1e3 : 0.0);
      }
      std::printf("\n");
    }
  }
  return 0;
}
