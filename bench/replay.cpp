// streamalloc_replay: replay an allocation trace (trace.hpp) on streamalloc and, where present, its
// peers; report time per operation and peak memory next to the native allocator's peaks recorded with
// the trace.
//
//   streamalloc_replay TRACE [--backend sim|cuda] [--conf CONF] [--peers all|NAME,...] [--repeats N]
//                            [--json OUT]
//
// Each repeat opens the peer afresh with an empty cache and replays the whole trace, timed as one
// block; time per op is the median over repeats. Peaks are those of the first repeat (a cold start,
// as in the recording). Blocks the trace never frees (a truncated recording) are freed after timing.
// No kernels run: a block's fences complete as soon as they are recorded, so pending blocks wait less
// than in the recorded run (docs/benchmarking.md, "Trace replay").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peer.hpp"
#include "streamalloc/types.hpp"
#include "trace.hpp"

namespace streamalloc::bench {
namespace {

struct Args {
  std::string trace;
  PeerSelection peers;
  bool all_peers = false;
  int repeats = 5;
  std::string json_out;
};

struct Result {
  PeerKind kind;
  std::vector<double> ns_per_op;
  MemoryPeaks peaks;
  std::string error;

  double median() const {
    std::vector<double> sorted = ns_per_op;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t n = sorted.size();
    return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  }
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "%s%s"
               "usage: streamalloc_replay TRACE [--backend sim|cuda] [--conf CONF] [--peers all|NAME,...]\n"
               "                          [--repeats N] [--json OUT]\n"
               "  --backend  where streamalloc runs (default: cuda when a GPU is present, else sim)\n"
               "  --conf     streamalloc options, STREAMALLOC_CONF syntax\n"
               "  --peers    streamalloc (default), all, or a list of streamalloc, streamalloc_cabi,\n"
               "             torch_native, cudaMallocAsync, cudaMalloc\n"
               "  --repeats  replays per peer; time is the median (default 5)\n"
               "  --json     also write the results as JSON (bench/report.py reads it)\n",
               problem.c_str(), problem.empty() ? "" : "\n");
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  std::vector<std::string> peer_names = {"streamalloc"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      usage("");
    } else if (arg == "--backend") {
      const std::string v = value();
      if (v != "sim" && v != "cuda") usage("--backend takes sim or cuda, not '" + v + "'");
      args.peers.device = parse_device_choice(v);
    } else if (arg == "--conf") {
      args.peers.streamalloc_conf = value();
    } else if (arg == "--peers") {
      const std::string v = value();
      peer_names.clear();
      if (v == "all") {
        args.all_peers = true;
      } else {
        std::size_t start = 0;
        while (start <= v.size()) {
          std::size_t end = v.find(',', start);
          if (end == std::string::npos) end = v.size();
          if (end > start) peer_names.push_back(v.substr(start, end - start));
          start = end + 1;
        }
      }
    } else if (arg == "--repeats") {
      args.repeats = std::atoi(value().c_str());
      if (args.repeats < 1) usage("--repeats must be at least 1");
    } else if (arg == "--json") {
      args.json_out = value();
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option " + arg);
    } else if (args.trace.empty()) {
      args.trace = arg;
    } else {
      usage("more than one trace given ('" + args.trace + "' and '" + arg + "')");
    }
  }
  if (args.trace.empty()) usage("no trace given");
  if (!args.all_peers) args.peers.names = peer_names;
  return args;
}

// One timed replay; returns nanoseconds per op. `peaks` receives the peer's peaks when non-null.
double replay_once(const Trace& trace, Peer& peer, MemoryPeaks* peaks) {
  peer.reset_memory();
  std::vector<Stream> streams;
  for (std::size_t k = 0; k < trace.stream_ids.size(); ++k) streams.push_back(peer.stream(static_cast<int>(k)));
  std::vector<void*> slots(trace.slots, nullptr);

  const auto start = std::chrono::steady_clock::now();
  for (const TraceOp& op : trace.ops) {
    switch (op.kind) {
      case TraceOp::Kind::kAlloc:
        slots[op.slot] = peer.alloc(op.size, streams[op.stream]);
        break;
      case TraceOp::Kind::kRecordStream:
        peer.record_stream(slots[op.slot], streams[op.stream]);
        break;
      case TraceOp::Kind::kFree:
        peer.free(slots[op.slot], op.size, streams[op.stream]);
        break;
    }
  }
  const auto stop = std::chrono::steady_clock::now();

  peer.synchronize();
  if (peaks != nullptr) *peaks = peer.peaks();
  // Free what a truncated trace left live: replay the liveness to find those blocks and their streams.
  std::vector<const TraceOp*> holder(trace.slots, nullptr);
  for (const TraceOp& op : trace.ops) {
    if (op.kind == TraceOp::Kind::kAlloc) holder[op.slot] = &op;
    if (op.kind == TraceOp::Kind::kFree) holder[op.slot] = nullptr;
  }
  for (std::size_t s = 0; s < holder.size(); ++s) {
    if (holder[s] != nullptr) peer.free(slots[s], holder[s]->size, streams[holder[s]->stream]);
  }
  peer.synchronize();
  const double ns = std::chrono::duration<double, std::nano>(stop - start).count();
  return trace.ops.empty() ? 0.0 : ns / static_cast<double>(trace.ops.size());
}

Result run_peer(const Trace& trace, const PeerKind& kind, int repeats) {
  Result result{kind, {}, {}, {}};
  try {
    for (int r = 0; r < repeats; ++r) {
      auto peer = kind.open();
      result.ns_per_op.push_back(replay_once(trace, *peer, r == 0 ? &result.peaks : nullptr));
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

std::string bytes_or_na(std::int64_t bytes) {
  return bytes < 0 ? "n/a" : format_bytes(static_cast<std::size_t>(bytes));
}

void print_table(const Trace& trace, const Args& args, const std::vector<Result>& results) {
  const std::int64_t native_reserved = trace.header_int("native_peak_reserved");
  const std::int64_t native_allocated = trace.header_int("native_peak_allocated");
  const std::string never_freed =
      trace.live_at_end > 0 ? ", " + std::to_string(trace.live_at_end) + " blocks never freed" : "";
  std::printf("trace %s: workload %s, %zu ops (%zu allocs, %zu frees, %zu record_stream), %zu streams%s\n",
              args.trace.c_str(), trace.header_string("workload", "?").c_str(), trace.ops.size(), trace.allocs,
              trace.frees, trace.record_streams, trace.stream_ids.size(), never_freed.c_str());
  std::printf("native allocator when recorded: peak reserved %s, peak allocated %s\n\n",
              bytes_or_na(native_reserved).c_str(), bytes_or_na(native_allocated).c_str());
  std::printf("%-26s %14s %14s %14s %10s %12s\n", "peer", "ns/op (median)", "peak reserved", "peak allocated",
              "res/alloc", "res/native");
  for (const Result& r : results) {
    if (!r.error.empty()) {
      std::printf("%-26s failed: %s\n", r.kind.id().c_str(), r.error.c_str());
      continue;
    }
    char ratio[32] = "n/a";
    char vs_native[32] = "n/a";
    if (r.peaks.reserved > 0 && r.peaks.allocated > 0) {
      std::snprintf(ratio, sizeof ratio, "%.3f",
                    static_cast<double>(r.peaks.reserved) / static_cast<double>(r.peaks.allocated));
    }
    if (r.peaks.reserved >= 0 && native_reserved > 0) {
      std::snprintf(vs_native, sizeof vs_native, "%.3f",
                    static_cast<double>(r.peaks.reserved) / static_cast<double>(native_reserved));
    }
    std::printf("%-26s %14.1f %14s %14s %10s %12s\n", r.kind.id().c_str(), r.median(),
                bytes_or_na(r.peaks.reserved).c_str(), bytes_or_na(r.peaks.allocated).c_str(), ratio, vs_native);
  }
}

void write_json(const Trace& trace, const Args& args, const std::vector<Result>& results) {
  nlohmann::json out;
  out["kind"] = "streamalloc_replay";
  out["trace"] = args.trace;
  out["header"] = trace.header;
  out["ops"] = trace.ops.size();
  out["allocs"] = trace.allocs;
  out["frees"] = trace.frees;
  out["record_streams"] = trace.record_streams;
  out["streams"] = trace.stream_ids.size();
  out["live_at_end"] = trace.live_at_end;
  out["repeats"] = args.repeats;
  out["streamalloc_conf"] = args.peers.streamalloc_conf;
  out["context"] = nlohmann::json::object();
  for (const auto& [key, value] : machine_context()) out["context"][key] = value;
  out["results"] = nlohmann::json::array();
  for (const Result& r : results) {
    nlohmann::json row = {{"peer", r.kind.name}, {"device", r.kind.device}};
    if (r.error.empty()) {
      row["ns_per_op_median"] = r.median();
      row["ns_per_op"] = r.ns_per_op;
      row["peak_reserved"] = r.peaks.reserved;
      row["peak_allocated"] = r.peaks.allocated;
    } else {
      row["error"] = r.error;
    }
    out["results"].push_back(row);
  }
  std::ofstream file(args.json_out);
  file << out.dump(2) << "\n";
  if (!file) throw std::runtime_error("cannot write " + args.json_out);
}

// The simulated device's memory for replaying `trace`, unless --conf sets sim_memory_mb: twice what the
// trace needs (native's recorded peak reserved, or the trace's own peak of live bytes), and at least the
// default 4 GiB. The GPT-2 trace needs 5.6 GiB, more than the default simulated device has.
std::string with_sim_memory_for(const Trace& trace, const std::string& conf) {
  if (conf.find("sim_memory_mb") != std::string::npos) return conf;
  const std::int64_t needed =
      std::max(trace.header_int("native_peak_reserved"), static_cast<std::int64_t>(trace.peak_live_bytes));
  const std::int64_t mb = std::max<std::int64_t>(4096, 2 * needed / (1 << 20) + 1);
  return (conf.empty() ? "" : conf + ",") + "sim_memory_mb:" + std::to_string(mb);
}

}  // namespace
}  // namespace streamalloc::bench

int main(int argc, char** argv) {
  using namespace streamalloc::bench;
  Args args = parse_args(argc, argv);
  try {
    const Trace trace = read_trace(args.trace);
    std::vector<PeerKind> kinds = available_peers(args.peers);
    const bool on_sim = std::any_of(kinds.begin(), kinds.end(), [](const PeerKind& k) { return k.device == "sim"; });
    if (on_sim) {
      args.peers.streamalloc_conf = with_sim_memory_for(trace, args.peers.streamalloc_conf);
      kinds = available_peers(args.peers);
    }
    std::vector<Result> results;
    for (const PeerKind& kind : kinds) results.push_back(run_peer(trace, kind, args.repeats));
    print_table(trace, args, results);
    if (!args.json_out.empty()) write_json(trace, args, results);
    for (const Result& r : results) {
      if (!r.error.empty()) return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_replay: %s\n", e.what());
    return 1;
  }
  return 0;
}
