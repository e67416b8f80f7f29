// What the allocation history costs the core per alloc/free pair, on the simulated device or a GPU:
//
//   streamalloc_history_cost [--backend sim|cuda] [--pairs N] [--repeats R] [--bytes B] [--json FILE]
//
// Modes, each on a fresh Allocator (one device), timed as ns per pair, the median of R blocks of N pairs
// after a warm-up block:
//   off        the history never turned on: the hot path's price of having the feature is one pointer
//              test per event site (bench/tools/icount_ab.sh compares a build without it in instructions)
//   on         record_history on, a ring of 100000 entries, no caller context (C++ callers)
//   on_context on, with a caller context set around each call (what the PyTorch plugin does, minus
//              gathering the stack: bench/studies/history_cost.py measures that end to end)
// Scenarios: `same` (alloc + free on one stream) and `cross` (alloc, record_stream on a second stream,
// free). With the history on, the per-stream fast path is off (events are recorded under the device
// lock), so `on` measures the device-locked path plus the recording.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peer_kinds.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/backend_factory.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/sim_backend.hpp"
#include "streamalloc/trace.hpp"

namespace {

using streamalloc::Allocator;
using streamalloc::Stream;

struct Args {
  std::string backend = "sim";
  long pairs = 200000;
  int repeats = 7;
  std::size_t bytes = 4096;
  std::string json;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: streamalloc_history_cost [--backend sim|cuda] [--pairs N] [--repeats R] [--bytes B] "
               "[--json FILE]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--backend") {
      args.backend = value;
      if (args.backend != "sim" && args.backend != "cuda") usage("--backend takes sim or cuda");
    } else if (arg == "--pairs") {
      args.pairs = std::atol(value);
    } else if (arg == "--repeats") {
      args.repeats = std::atoi(value);
    } else if (arg == "--bytes") {
      args.bytes = static_cast<std::size_t>(std::atoll(value));
    } else if (arg == "--json") {
      args.json = value;
    } else {
      usage(("unknown argument " + arg).c_str());
    }
  }
  if (args.pairs <= 0 || args.repeats <= 0 || args.bytes == 0) usage("--pairs, --repeats and --bytes must be positive");
  return args;
}

// A caller context as the plugin sets one (its frames are gathered before the call; here there are none).
struct FixedContext : streamalloc::TraceContext {};

double time_block(Allocator& allocator, const Args& args, bool cross, Stream s1, Stream s2, bool with_context) {
  const auto context = std::make_shared<const FixedContext>();
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < args.pairs; ++i) {
    std::unique_ptr<streamalloc::TraceContextScope> scope;
    if (with_context) scope = std::make_unique<streamalloc::TraceContextScope>(context);
    void* ptr = allocator.allocate(args.bytes, 0, s1);
    if (cross) allocator.record_stream(ptr, s2);
    allocator.deallocate(ptr, args.bytes, 0, s1);
  }
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(args.pairs);
}

// The k-th stream: the process's CUDA stream pool on a GPU, a new stream of the simulated device otherwise.
Stream make_stream(streamalloc::Backend& backend, int k) {
  if (auto* sim = dynamic_cast<streamalloc::SimBackend*>(&backend)) return sim->create_stream(0);
#ifdef STREAMALLOC_BENCH_CUDA
  return streamalloc::bench::cuda_pool_stream(k);
#else
  (void)k;
  usage("--backend cuda needs a build with the CUDA backend");
#endif
}

void synchronize(streamalloc::Backend& backend) {
  if (auto* sim = dynamic_cast<streamalloc::SimBackend*>(&backend)) {
    sim->synchronize_all();
    return;
  }
#ifdef STREAMALLOC_BENCH_CUDA
  streamalloc::bench::cuda_synchronize_device();
#endif
}

double measure(const Args& args, const std::string& mode, bool cross) {
  const auto options = streamalloc::Options::parse("backend:" + args.backend, "--backend");
  auto backend = streamalloc::make_backend(options);
  Allocator allocator(options, backend);
  if (mode != "off") {
    streamalloc::HistorySettings settings;
    settings.enabled = true;
    settings.max_entries = 100000;
    allocator.record_history(settings);
  }
  const Stream s1 = make_stream(*backend, 0);
  const Stream s2 = make_stream(*backend, 1);
  const bool with_context = mode == "on_context";
  time_block(allocator, args, cross, s1, s2, with_context);  // warm-up: segments reserved, ring filled
  std::vector<double> samples;
  for (int r = 0; r < args.repeats; ++r) samples.push_back(time_block(allocator, args, cross, s1, s2, with_context));
  synchronize(*backend);  // stream-ordered work done before the allocator goes
  if ((mode != "off") == allocator.history(0).empty()) {
    std::fprintf(stderr, "history %s: the recorder %s entries\n", mode.c_str(), mode == "off" ? "kept" : "kept no");
    std::exit(1);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("backend %s, %zu-byte pairs, median of %d blocks of %ld pairs\n", args.backend.c_str(), args.bytes,
              args.repeats, args.pairs);
  std::printf("%-8s %-11s %12s %9s\n", "scenario", "history", "ns/pair", "vs off");
  for (const bool cross : {false, true}) {
    double off = 0;
    for (const std::string mode : {"off", "on", "on_context"}) {
      const double ns = measure(args, mode, cross);
      if (mode == "off") off = ns;
      std::printf("%-8s %-11s %12.1f %8.2fx\n", cross ? "cross" : "same", mode.c_str(), ns, ns / off);
      rows.push_back({{"scenario", cross ? "cross" : "same"}, {"history", mode}, {"ns_per_pair", ns}});
    }
  }
  if (!args.json.empty()) {
    std::ofstream(args.json) << nlohmann::json{{"backend", args.backend},
                                               {"bytes", args.bytes},
                                               {"pairs", args.pairs},
                                               {"repeats", args.repeats},
                                               {"rows", rows}}
                                    .dump(2)
                             << "\n";
  }
  return 0;
}
