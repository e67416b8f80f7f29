// streamalloc_bench: every scenario, every available peer, one process (docs/benchmarking.md).
//
// Own flags (the rest go to Google Benchmark):
//   --short              fewer arguments, 0.05 s per benchmark
//   --summary            the demo run: three scenarios, streamalloc against every peer that runs here, as a
//                        short table with the ratio and a verdict per row (no Google Benchmark table)
//   --min_time=SECONDS   minimum time per benchmark (default 0.2; --short: 0.05)
//   --device=auto|sim|cuda   where streamalloc runs (auto: CUDA when a GPU is present)
//   --conf=K:V,...       streamalloc options for both streamalloc peers (STREAMALLOC_CONF syntax)
//   --peers=a,b          only these peers (streamalloc, streamalloc_cabi, torch_native, cudaMallocAsync, cudaMalloc)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer.hpp"
#include "scenario.hpp"
#include "split_list.hpp"

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

void report_path_counts(benchmark::State& state, Peer& peer, const std::optional<PathCounts>& before) {
  const std::optional<PathCounts> after = peer.path_counts();
  if (!before || !after) return;
  const PathCounts& a = *after;
  const PathCounts& b = *before;
  const double allocs = static_cast<double>((a.allocations_cached - b.allocations_cached) +
                                            (a.allocations_device_locked - b.allocations_device_locked));
  if (allocs <= 0) return;
  auto per_alloc = [&](std::int64_t x, std::int64_t y) { return static_cast<double>(x - y) / allocs; };
  state.counters["cached_share"] = per_alloc(a.allocations_cached, b.allocations_cached);
  state.counters["device_locks_per_alloc"] = per_alloc(a.device_lock_acquisitions, b.device_lock_acquisitions);
  state.counters["lock_wait_ns"] = per_alloc(a.device_lock_wait_ns, b.device_lock_wait_ns);
  state.counters["lock_held_ns"] = per_alloc(a.device_lock_held_ns, b.device_lock_held_ns);
  state.counters["headroom_gathers"] = 1000 * per_alloc(a.headroom_gathers, b.headroom_gathers);
  state.counters["hot_list_flushes"] = 1000 * per_alloc(a.hot_list_flushes, b.hot_list_flushes);
  state.counters["fences_recorded"] = 1000 * per_alloc(a.fences_recorded, b.fences_recorded);
  state.counters["fences_polled"] = 1000 * per_alloc(a.fences_polled, b.fences_polled);
}

namespace {

// Set per benchmark rather than through --benchmark_min_time, whose syntax changed in Google
// Benchmark 1.8 ("0.2" became "0.2s"). 0.2 s keeps the full sim run with 3 repetitions under 2 minutes.
constexpr double kFullMinTime = 0.2;
constexpr double kShortMinTime = 0.05;

struct Flags {
  RunConfig run;
  PeerSelection peers;
  bool summary = false;
};

// The rows of --summary: the cached path, the prefetch pipeline's cross-stream pattern, and a churn of sizes.
const char* const kSummaryFilter =
    "^(same_stream/[^/]*/bytes:1048576|cross_stream/[^/]*/bytes:1048576|mixed_sizes/[^/]*/max_live:64)(/|$)";

std::string summary_label(const std::string& scenario) {
  if (scenario == "same_stream") return "alloc+free, one stream, 1 MiB";
  if (scenario == "cross_stream") return "alloc+record_stream+free, 1 MiB";
  if (scenario == "mixed_sizes") return "random sizes 1 KiB-4 MiB, 64 live";
  return scenario;
}

std::string format_ns(double ns) {
  char text[32];
  if (ns < 1e3) {
    std::snprintf(text, sizeof text, "%.0f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(text, sizeof text, "%.1f us", ns / 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.1f ms", ns / 1e6);
  }
  return text;
}

std::string verdict(double ratio) {
  char text[96];
  if (ratio >= 1.1) {
    std::snprintf(text, sizeof text, "streamalloc %.1fx faster", ratio);
  } else if (ratio <= 1 / 1.1) {
    std::snprintf(text, sizeof text, "streamalloc %.1fx slower", 1 / ratio);
  } else {
    std::snprintf(text, sizeof text, "about the same (within 10%%)");
  }
  return text;
}

// --summary's display: nothing while the benchmarks run, then one row per scenario and peer:
// streamalloc's time per operation, the peer's, their ratio and a verdict.
class SummaryReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration) continue;
      // "<scenario>/<peer>@<device>/<args>": the peer is the second part.
      const std::string name = run.benchmark_name();
      const std::size_t a = name.find('/');
      const std::size_t b = name.find('/', a + 1);
      if (a == std::string::npos) continue;
      const std::string scenario = name.substr(0, a);
      const std::string peer = name.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
      if (order_.empty() || order_.back() != scenario) order_.push_back(scenario);
      auto items = run.counters.find("items_per_second");
      // A benchmark that failed has no rate: it shows as "failed".
      times_[scenario][peer] =
          items == run.counters.end() || items->second.value <= 0 ? -1.0 : 1e9 / items->second.value;
    }
  }

  void Finalize() override {
    const std::string where = device_ == "cuda" ? "the GPU" : "the simulated device (no GPU here)";
    std::printf(
        "Allocator speed on %s: time per operation, lower is better\n"
        "(a short run: a busy machine adds noise)\n\n",
        where.c_str());
    std::printf("  %-35s %12s  %-16s %12s %7s  %s\n", "scenario", "streamalloc", "peer", "peer", "ratio", "verdict");
    for (const std::string& scenario : order_) {
      const auto& peers = times_[scenario];
      auto mine = peers.find("streamalloc@" + device_);
      const double ours = mine == peers.end() ? -1.0 : mine->second;
      bool any = false;
      for (const auto& [peer, theirs] : peers) {
        if (peer.rfind("streamalloc", 0) == 0) continue;
        any = true;
        const std::string peer_name = peer.substr(0, peer.find('@'));
        if (ours <= 0 || theirs <= 0) {
          std::printf("  %-35s %12s  %-16s %12s %7s  %s\n", summary_label(scenario).c_str(),
                      ours > 0 ? format_ns(ours).c_str() : "failed", peer_name.c_str(),
                      theirs > 0 ? format_ns(theirs).c_str() : "failed", "-",
                      "no comparison: a run failed (make bench shows why)");
          continue;
        }
        char ratio[16];
        std::snprintf(ratio, sizeof ratio, "%.2f", theirs / ours);
        std::printf("  %-35s %12s  %-16s %12s %7s  %s\n", summary_label(scenario).c_str(), format_ns(ours).c_str(),
                    peer_name.c_str(), format_ns(theirs).c_str(), ratio, verdict(theirs / ours).c_str());
      }
      if (!any) {
        std::printf("  %-35s %12s  %-16s %12s %7s  %s\n", summary_label(scenario).c_str(),
                    ours > 0 ? format_ns(ours).c_str() : "failed", "(none)", "-", "-", "no peer runs here");
      }
    }
    std::printf("\n  ratio = peer time / streamalloc time.\n");
    if (device_ == "sim") {
      std::printf(
          "  sim_malloc does what cudaMalloc would on the same simulated device: no cache, every free waits\n"
          "  for the device. Times on the simulated device are CPU cost: they show what streamalloc's cache\n"
          "  saves, not how streamalloc compares with the real peers on a GPU.\n");
    }
    for (const auto& [key, value] : machine_context()) {
      if (key != "peers_missing" || value == "none") continue;
      std::printf("  Not run here:\n");
      std::size_t start = 0;
      while (start < value.size()) {  // "name: reason; name: reason"
        std::size_t end = value.find("; ", start);
        if (end == std::string::npos) end = value.size();
        std::printf("    %s\n", value.substr(start, end - start).c_str());
        start = end + 2;
      }
    }
    std::printf("  Every scenario and size, as Google Benchmark's table: make bench (docs/benchmarking.md).\n");
    std::fflush(stdout);
  }

  void set_device(const std::string& device) { device_ = device; }

 private:
  std::string device_ = "sim";
  std::vector<std::string> order_;
  std::map<std::string, std::map<std::string, double>> times_;
};

void print_usage() {
  std::printf(
      "streamalloc_bench: allocator benchmarks, streamalloc side by side with its peers.\n"
      "  --short                 fewer arguments, %.2f s per benchmark\n"
      "  --summary               the demo run: a short table of streamalloc against each peer that runs here\n"
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
    if (arg == "--short" || arg == "--summary") {
      flags.run.short_mode = true;
      if (!min_time_given) flags.run.min_time = kShortMinTime;
      if (arg == "--summary") {
        flags.summary = true;
        flags.peers.sim_baseline = true;
      }
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
      flags.peers.names = split_list(names);
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
    if (flags.summary) {
      // streamalloc through its C ABI is streamalloc again, not a peer.
      std::vector<PeerKind> others;
      for (PeerKind& kind : peers) {
        if (kind.name != "streamalloc_cabi") others.push_back(std::move(kind));
      }
      peers = std::move(others);
    }
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
  if (flags.summary) {
    SummaryReporter summary;
    summary.set_device(peers.empty() ? "sim" : peers.front().device);
    benchmark::RunSpecifiedBenchmarks(&summary, kSummaryFilter);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}
