// streamalloc_soak: the prefetch pipeline with random sizes on several stream pairs for a time
// (or an iteration count), with every byte every consumer reads checked (soak_workload.hpp says what
// runs). Ends by freeing everything and checking that nothing leaked and validate() passes. Runs on the
// GPU when one is present, else on the simulated device, and says which.
//
// Exit status: 0 when every check read its own bytes, nothing leaked and validate() passed; 1 when not
// (or the run failed); 2 for bad arguments.
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "demo_device.hpp"
#include "soak_workload.hpp"
#include "streamalloc/allocator.hpp"

using namespace streamalloc;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  double seconds = 10;
  std::uint64_t iterations = 0;  // 0 = no bound
  SoakConfig workload;
  std::string conf;
  std::string backend = "auto";
  std::string json_path;
};

constexpr const char* kUsage =
    "usage: %s [--seconds S] [--iterations N] [--streams K] [--seed N] [--max-size BYTES]\n"
    "          [--conf STREAMALLOC_CONF] [--backend auto|cuda|sim] [--json PATH]\n"
    "Runs the prefetch pipeline with random sizes (log-uniform, 512 B to --max-size, default 64M)\n"
    "on K prefetch/compute stream pairs (default 4, at most 256) until S seconds (default 10; 0 = no\n"
    "bound) or N iterations (default 0 = no bound) have passed, checking every byte every consumer\n"
    "reads; then frees everything and checks for leaks. BYTES is at least 512 and takes a K, M or G\n"
    "suffix. Exit status 0: all checks right, 1: a wrong check, a leak or a failure, 2: bad arguments.\n";

bool parse_uint(const char* text, std::uint64_t* out) {
  char* end = nullptr;
  if (*text < '0' || *text > '9') return false;
  *out = std::strtoull(text, &end, 10);
  return *end == '\0';
}

bool parse_bytes(const char* text, std::size_t* out) {
  char* end = nullptr;
  if (*text < '0' || *text > '9') return false;
  unsigned long long value = std::strtoull(text, &end, 10);
  const std::string suffix = end;
  if (suffix == "K")
    value *= KiB;
  else if (suffix == "M")
    value *= MiB;
  else if (suffix == "G")
    value *= GiB;
  else if (!suffix.empty())
    return false;
  *out = static_cast<std::size_t>(value);
  return true;
}

// Returns 0 with `args` filled, 2 for bad arguments, -1 for --help.
int parse_args(int argc, char** argv, Args* args) {
  // getopt_long rather than CLI11: the GPU machine's image has no CLI11 and no network to fetch it.
  static const option kOptions[] = {
      {"seconds", required_argument, nullptr, 's'},  {"iterations", required_argument, nullptr, 'i'},
      {"streams", required_argument, nullptr, 'k'},  {"seed", required_argument, nullptr, 'r'},
      {"max-size", required_argument, nullptr, 'm'}, {"conf", required_argument, nullptr, 'c'},
      {"backend", required_argument, nullptr, 'b'},  {"json", required_argument, nullptr, 'j'},
      {"help", no_argument, nullptr, 'h'},           {nullptr, 0, nullptr, 0}};
  std::uint64_t pairs = static_cast<std::uint64_t>(args->workload.pairs);
  for (int opt; (opt = getopt_long(argc, argv, "s:i:k:r:m:c:b:j:h", kOptions, nullptr)) != -1;) {
    bool ok = true;
    char* end = nullptr;
    switch (opt) {
      case 's':
        args->seconds = std::strtod(optarg, &end);
        ok = *optarg != '\0' && *end == '\0' && args->seconds >= 0;
        break;
      case 'i': ok = parse_uint(optarg, &args->iterations); break;
      case 'k': ok = parse_uint(optarg, &pairs) && pairs >= 1 && pairs <= 256; break;
      case 'r': ok = parse_uint(optarg, &args->workload.seed); break;
      case 'm':
        ok = parse_bytes(optarg, &args->workload.max_size) && args->workload.max_size >= args->workload.min_size;
        break;
      case 'c': args->conf = optarg; break;
      case 'b': args->backend = optarg; break;
      case 'j': args->json_path = optarg; break;
      case 'h': std::printf(kUsage, argv[0]); return -1;
      default: std::fprintf(stderr, kUsage, argv[0]); return 2;
    }
    if (!ok) {
      const option* o = kOptions;
      while (o->val != opt) ++o;
      std::fprintf(stderr, "streamalloc_soak: bad value '%s' for --%s (see --help)\n", optarg, o->name);
      return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "streamalloc_soak: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (args->seconds == 0 && args->iterations == 0) {
    std::fprintf(stderr, "streamalloc_soak: --seconds 0 needs an --iterations bound\n");
    return 2;
  }
  args->workload.pairs = static_cast<int>(pairs);
  return 0;
}

std::string bytes_string(std::int64_t bytes) { return format_bytes(static_cast<std::size_t>(bytes < 0 ? 0 : bytes)); }

void print_summary(const std::string& device, double seconds, const SoakCounts& c, const DeviceStats& st,
                   const SoakEndState& end, bool pass) {
  std::printf("\nsoak summary\n");
  std::printf("  device                    %s\n", device.c_str());
  std::printf("  seconds run               %.1f\n", seconds);
  std::printf("  iterations                %llu\n", static_cast<unsigned long long>(c.iterations));
  std::printf("  allocations               %llu (%llu kept across iterations, %llu of them freed on another stream)\n",
              static_cast<unsigned long long>(c.allocations), static_cast<unsigned long long>(c.kept_blocks),
              static_cast<unsigned long long>(c.kept_freed_on_other_stream));
  std::printf("  bytes allocated total     %s requested, %s after rounding\n",
              bytes_string(static_cast<std::int64_t>(c.bytes_requested)).c_str(),
              bytes_string(st.allocated_bytes[0].allocated).c_str());
  std::printf("  peak reserved             %s (peak allocated %s, peak pending %s)\n",
              bytes_string(st.reserved_bytes[0].peak).c_str(), bytes_string(st.allocated_bytes[0].peak).c_str(),
              bytes_string(st.pending_bytes.peak).c_str());
  std::printf("  fences recorded           %lld for %lld pending frees; %lld host syncs on fences\n",
              static_cast<long long>(st.fences_recorded), static_cast<long long>(st.pending_blocks.allocated),
              static_cast<long long>(st.fences_synced_host));
  std::printf("  cross-stream reuses       %lld settled, %lld after a GPU wait\n",
              static_cast<long long>(st.cross_stream_reuse_settled),
              static_cast<long long>(st.cross_stream_reuse_waited));
  std::printf("  third-stream consumers    %llu\n", static_cast<unsigned long long>(c.third_stream_consumers));
  std::printf("  device reserves/releases  %lld/%lld; empty_cache %llu; validate %llu; OOM retries %lld\n",
              static_cast<long long>(st.num_device_alloc), static_cast<long long>(st.num_device_free),
              static_cast<unsigned long long>(c.empty_cache_calls), static_cast<unsigned long long>(c.validate_calls),
              static_cast<long long>(st.num_alloc_retries));
  std::printf("  missing-wait warnings     %lld (check_sync:1; 0 when it is off)\n",
              static_cast<long long>(st.missing_wait_warnings));
  std::printf("  checks done               %llu (in %llu host syncs)\n", static_cast<unsigned long long>(c.checks),
              static_cast<unsigned long long>(c.syncs));
  std::printf("  checks wrong              %llu\n", static_cast<unsigned long long>(c.checks_wrong));
  std::printf("  after freeing everything  allocated %s, pending %s; after empty_cache reserved %s\n",
              bytes_string(end.allocated_bytes).c_str(), bytes_string(end.pending_bytes).c_str(),
              bytes_string(end.reserved_bytes).c_str());
  std::printf("  validate()                %s\n", end.validate_error.empty() ? "passed" : end.validate_error.c_str());
  std::printf("result: %s\n", pass ? "PASS (every check read its own bytes; no leak)"
                                   : "FAIL (wrong checks, a leak or a broken invariant; see above)");
}

nlohmann::ordered_json summary_json(const Args& args, const std::string& device, const std::string& backend,
                                    const Options& options, double seconds, const SoakCounts& c,
                                    const SoakEndState& end, const std::string& stats_json, bool pass) {
  return {{"device", device},
          {"backend", backend},
          {"options", options.to_conf_string()},
          {"stream_pairs", args.workload.pairs},
          {"seed", args.workload.seed},
          {"min_size", args.workload.min_size},
          {"max_size", args.workload.max_size},
          {"seconds_bound", args.seconds},
          {"iterations_bound", args.iterations},
          {"seconds", seconds},
          {"iterations", c.iterations},
          {"allocations", c.allocations},
          {"bytes_requested", c.bytes_requested},
          {"kept_blocks", c.kept_blocks},
          {"kept_freed_on_other_stream", c.kept_freed_on_other_stream},
          {"third_stream_consumers", c.third_stream_consumers},
          {"empty_cache_calls", c.empty_cache_calls},
          {"validate_calls", c.validate_calls},
          {"syncs", c.syncs},
          {"checks", c.checks},
          {"checks_wrong", c.checks_wrong},
          {"end",
           {{"allocated_bytes", end.allocated_bytes},
            {"pending_bytes", end.pending_bytes},
            {"reserved_bytes_after_empty_cache", end.reserved_bytes},
            {"validate_error", end.validate_error}}},
          {"pass", pass},
          {"stats", nlohmann::ordered_json::parse(stats_json)}};
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int rc = parse_args(argc, argv, &args); rc != 0) return rc < 0 ? 0 : rc;

  Options options;
  std::unique_ptr<DemoDevice> device;
  try {
    options = Options::parse(args.conf);
    if (args.backend != "auto") options.set("backend", args.backend);
    device = make_demo_device(options);
  } catch (const Error& e) {
    std::fprintf(stderr, "streamalloc_soak: %s\n", e.what());
    return e.code() == ErrorCode::kConfig ? 2 : 1;
  } catch (const std::exception& e) {  // the GPU's runtime failing while the device is set up
    std::fprintf(stderr, "streamalloc_soak: %s\n", e.what());
    return 1;
  }

  int status = 1;
  try {
    // The allocator lives in this inner scope so that it is gone before the streams are destroyed.
    Allocator allocator(options, device->backend());
    const std::string description = device->description();
    std::printf("streamalloc soak on %s\n", description.c_str());
    std::printf("options: %s\n", options.to_conf_string().c_str());
    const std::string iteration_bound = args.iterations ? " or " + std::to_string(args.iterations) + " iterations" : "";
    std::printf("workload: %d stream pairs, sizes log-uniform %s to %s, seed %llu; bound: %.0f s%s\n",
                args.workload.pairs, format_bytes(args.workload.min_size).c_str(),
                format_bytes(args.workload.max_size).c_str(), static_cast<unsigned long long>(args.workload.seed),
                args.seconds, iteration_bound.c_str());
    std::fflush(stdout);

    SoakWorkload soak(args.workload, allocator, *device);
    const Clock::time_point start = Clock::now();
    const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    // A progress line about every tenth of the run (at least 10 s apart), so a 10-minute run shows life.
    const double progress_every = std::max(10.0, args.seconds / 10);
    double next_progress = progress_every;
    while ((args.iterations == 0 || soak.counts().iterations < args.iterations) &&
           (args.seconds == 0 || elapsed() < args.seconds)) {
      soak.iterate();
      if (elapsed() >= next_progress && (args.seconds == 0 || next_progress < args.seconds)) {
        const SoakCounts& c = soak.counts();
        std::printf("  %6.0f s: %llu iterations, %llu checks, %llu wrong, reserved %s\n", elapsed(),
                    static_cast<unsigned long long>(c.iterations), static_cast<unsigned long long>(c.checks),
                    static_cast<unsigned long long>(c.checks_wrong),
                    bytes_string(allocator.stats(0).reserved_bytes[0].current).c_str());
        std::fflush(stdout);
        next_progress += progress_every;
      }
    }
    const double seconds = elapsed();
    const SoakEndState end = soak.finish();
    const SoakCounts& counts = soak.counts();
    const bool pass = counts.checks_wrong == 0 && end.clean();
    print_summary(description, seconds, counts, allocator.stats(0), end, pass);
    if (!args.json_path.empty()) {
      std::ofstream out(args.json_path);
      out << summary_json(args, description, device->backend()->name(), options, seconds, counts, end,
                          allocator.stats_json(0), pass)
                 .dump(2)
          << "\n";
      if (!out) throw std::runtime_error("cannot write " + args.json_path);
    }
    status = pass ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_soak: FAIL: %s\n", e.what());
    status = 1;
  }
  device->destroy_streams();
  return status;
}
