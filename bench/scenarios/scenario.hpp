// How a scenario file plugs into streamalloc_bench: it defines a registration function that adds one
// Google Benchmark per peer, and registers that function with a static Scenario object. main() opens
// nothing itself; it decides which peers exist and calls every scenario's function.
//
// Conventions every scenario keeps, so that bench/report.py can read any of them:
//  - name "<scenario>/<peer>@<device>/<arg name>:<value>...", label = the device ("sim" or "cuda");
//  - items processed = allocator operations (an alloc+free pair counts as one item, see each file), so
//    1e9 / items_per_second is nanoseconds per item;
//  - memory counters in bytes: peak_reserved, peak_allocated (and scenario-specific ones).
#pragma once

#include <benchmark/benchmark.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "peer.hpp"

namespace streamalloc::bench {

struct RunConfig {
  bool short_mode = false;  // --short: fewer arguments and a short minimum time per benchmark
  double min_time = 0;      // minimum seconds per benchmark (--min_time); 0 = Google Benchmark's default
};

using RegisterFn = void (*)(const std::vector<PeerKind>& peers, const RunConfig& run);

struct Scenario {
  Scenario(const char* name, RegisterFn fn);
  // In registration order; file-scope Scenario objects of the scenario files fill it before main().
  static std::vector<std::pair<std::string, RegisterFn>>& all();
};

// Report a peer's peak memory as counters (bytes).
void report_peaks(benchmark::State& state, Peer& peer);

// Report which path the peer's calls took (where it counts them: streamalloc) as counters, given its
// counts before the timed loop: cached_share (allocations served by the stream's shard alone, of all),
// device_locks_per_alloc (device-lock acquisitions per allocation), lock_wait_ns and lock_held_ns
// (device lock, per allocation), headroom_gathers, hot_list_flushes, fences_recorded and
// fences_polled (per 1000 allocations).
void report_path_counts(benchmark::State& state, Peer& peer, const std::optional<PathCounts>& before);

// Register `scenario/<peer id>` running `body(state, peer)` on a freshly opened peer. Failures (the
// peer cannot be opened, an allocation throws) skip the benchmark with the error message instead of
// aborting the whole run. Returns the benchmark for the caller to add arguments.
template <typename Body>
benchmark::internal::Benchmark* register_peer_benchmark(const std::string& scenario, const PeerKind& kind,
                                                        const RunConfig& run, Body body) {
  auto* b = benchmark::RegisterBenchmark((scenario + "/" + kind.id()).c_str(), [kind, body](benchmark::State& state) {
    state.SetLabel(kind.device);
    try {
      std::unique_ptr<Peer> peer = kind.open();
      body(state, *peer);
      peer->synchronize();  // surfaces errors the peer only notices at a synchronization
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  });
  b->Unit(benchmark::kNanosecond);
  if (run.min_time > 0) b->MinTime(run.min_time);
  return b;
}

}  // namespace streamalloc::bench
