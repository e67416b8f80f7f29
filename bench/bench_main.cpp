// streamalloc_bench: every scenario, every available peer, one process (docs/benchmarking.md).
//
// Own flags (the rest go to Google Benchmark):
//   --short              fewer arguments, 0.05 s per benchmark: the demo run
//   --min_time=SECONDS   minimum time per benchmark (default 0.2; --short: 0.05)
//   --device=auto|sim|cuda   where streamalloc runs (auto: CUDA when a GPU is present)
//   --conf=K:V,...       streamalloc options for both streamalloc peers (STREAMALLOC_CONF syntax)
//   --peers=a,b          only these peers (streamalloc, streamalloc_cabi, torch_native, cudaMallocAsync, cudaMalloc)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer.hpp"
#include "scenario.hpp"

namespace streamalloc::bench {

Scenario::Scenario(const char* name, RegisterFn fn) { all().emplace_back(name, fn); }

std::vector<std::pair<std::string, RegisterFn>>& Scenario::all() {
  static std::vector<std::pair<std::string, RegisterFn>> scenarios;
  return scenarios;
}

void report_peaks(benchmark::State& state, Peer& peer) {
  const MemoryPeaks peaks = peer.peaks();
  using benchmark::Counter;
  if (peaks.reserved >= 0) {
    state.counters["peak_reserved"] =
        Counter(static_cast<double>(peaks.reserved), Counter::kDefaults, Counter::kIs1024);
  }
  if (peaks.allocated >= 0) {
    state.counters["peak_allocated"] =
        Counter(static_cast<double>(peaks.allocated), Counter::kDefaults, Counter::kIs1024);
  }
}

namespace {

// Set per benchmark rather than through --benchmark_min_time, whose syntax changed in Google
// Benchmark 1.8 ("0.2" became "0.2s"). 0.2 s keeps the full sim run with 3 repetitions under 2 minutes.
constexpr double kFullMinTime = 0.2;
constexpr double kShortMinTime = 0.05;

struct Flags {
  RunConfig run;
  PeerSelection peers;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void print_usage() {
  std::printf(
      "streamalloc_bench: allocator benchmarks, streamalloc side by side with its peers.\n"
      "  --short                 fewer arguments, %.2f s per benchmark (the demo run)\n"
      "  --min_time=SECONDS      minimum time per benchmark (default %.2f)\n"
      "  --device=auto|sim|cuda  where streamalloc runs (auto: CUDA when a GPU is present)\n"
      "  --conf=KEY:VALUE,...    streamalloc options for both streamalloc peers\n"
      "  --peers=NAME,...        only these peers: streamalloc, streamalloc_cabi, torch_native,\n"
      "                          cudaMallocAsync, cudaMalloc\n"
      "Google Benchmark flags follow (--benchmark_filter=REGEX, --benchmark_out=FILE, ...).\n\n",
      kShortMinTime, kFullMinTime);
}

// Takes this program's flags out of argv, leaving Google Benchmark's.
Flags parse_own_flags(int* argc, char** argv) {
  Flags flags;
  flags.run.min_time = kFullMinTime;
  bool min_time_given = false;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    auto value_of = [&](const char* prefix) -> const char* {
      const std::size_t n = std::strlen(prefix);
      return arg.compare(0, n, prefix) == 0 ? argv[i] + n : nullptr;
    };
    if (arg == "--short") {
      flags.run.short_mode = true;
      if (!min_time_given) flags.run.min_time = kShortMinTime;
    } else if (const char* seconds = value_of("--min_time=")) {
      char* end = nullptr;
      flags.run.min_time = std::strtod(seconds, &end);
      if (end == seconds || *end != '\0' || flags.run.min_time <= 0) {
        throw std::invalid_argument(std::string("--min_time takes a positive number of seconds, not '") + seconds +
                                    "'");
      }
      min_time_given = true;
    } else if (const char* device = value_of("--device=")) {
      flags.peers.device = parse_device_choice(device);
    } else if (const char* conf = value_of("--conf=")) {
      flags.peers.streamalloc_conf = conf;
    } else if (const char* names = value_of("--peers=")) {
      flags.peers.names = split(names);
    } else {
      if (arg == "--help" || arg == "-h") print_usage();
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  return flags;
}

}  // namespace
}  // namespace streamalloc::bench

int main(int argc, char** argv) {
  using namespace streamalloc::bench;
  Flags flags;
  std::vector<PeerKind> peers;
  try {
    flags = parse_own_flags(&argc, argv);
    peers = available_peers(flags.peers);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_bench: %s\n", e.what());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  for (const auto& [key, value] : machine_context()) benchmark::AddCustomContext(key, value);
  std::string ids;
  for (const PeerKind& kind : peers) ids += (ids.empty() ? "" : ",") + kind.id();
  benchmark::AddCustomContext("peers", ids);
  benchmark::AddCustomContext("streamalloc_conf", flags.peers.streamalloc_conf);
  benchmark::AddCustomContext("mode", flags.run.short_mode ? "short" : "full");
  benchmark::AddCustomContext("min_time_s", std::to_string(flags.run.min_time));

  for (const auto& [name, register_fn] : Scenario::all()) register_fn(peers, flags.run);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
