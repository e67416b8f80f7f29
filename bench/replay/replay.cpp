// streamalloc_replay: replay an allocation trace (trace.hpp) on streamalloc and, where present, its
// peers; report time per operation and peak memory next to the native allocator's peaks recorded with
// the trace.
//
//   streamalloc_replay TRACE [--backend sim|cuda] [--conf CONF] [--peers all|NAME,...] [--repeats N]
//                            [--json OUT|-]
//
// Each repeat opens the peer afresh with an empty cache and replays the whole trace, timed as one
// block; time per op is the median over repeats. Peaks are those of the first repeat (a cold start,
// as in the recording). Blocks the trace never frees (a truncated recording) are freed after timing.
// No kernels run: a block's fences complete as soon as they are recorded, so pending blocks wait less
// than in the recorded run (docs/benchmarking.md, "Trace replay").
//
// torch_expandable (PyTorch's allocator with expandable segments) needs a process of its own, as PyTorch
// reads PYTORCH_CUDA_ALLOC_CONF once: the tool runs itself again with that setting, --peers torch_native
// and --json - (the JSON on stdout, no table), and reports the child's row under torch_expandable.
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
#include "run_self.hpp"
#include "split_list.hpp"
#include "streamalloc/types.hpp"
#include "trace.hpp"

namespace streamalloc::bench {
namespace {

struct Args {
  std::string trace;
  PeerSelection peers;
  bool all_peers = false;
  int repeats = 5;
  std::string json_out;  // "-": the JSON on stdout instead of the table

  bool json_on_stdout() const { return json_out == "-"; }
};

struct Result {
  PeerKind kind;
  std::vector<double> ns_per_op;
  MemoryPeaks peaks;
  std::string error;
  std::string not_run;      // the peer's reason for not running in this build: a row, not a failure
  std::string environment;  // "VARIABLE=value" the row's child process ran with; "" in this process

  // Peak reserved / peak allocated: how much of what the peer held was in use at its worst; 0 where a
  // peak is unknown.
  double reserved_over_allocated() const {
    if (peaks.reserved <= 0 || peaks.allocated <= 0) return 0.0;
    return static_cast<double>(peaks.reserved) / static_cast<double>(peaks.allocated);
  }

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
               "                          [--repeats N] [--json OUT|-]\n"
               "  --backend  where streamalloc runs (default: cuda when a GPU is present, else sim)\n"
               "  --conf     streamalloc options, STREAMALLOC_CONF syntax\n"
               "  --peers    streamalloc (default), all, or a list of streamalloc, streamalloc_cabi,\n"
               "             streamalloc_expandable, torch_native, torch_expandable, cudaMallocAsync,\n"
               "             cudaMalloc, rmm_pool, rmm_arena, rmm_binning, sim_malloc\n"
               "  --repeats  replays per peer; time is the median (default 5)\n"
               "  --json     also write the results as JSON (bench/report.py reads it); - writes only\n"
               "             the JSON, on stdout\n",
               problem.c_str(), problem.empty() ? "" : "\n");
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  args.peers.expandable_peers = true;  // this program runs child peers and reports not_run rows
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
        peer_names = split_list(v);
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
      case TraceOp::Kind::kAlloc: slots[op.slot] = peer.alloc(op.size, streams[op.stream]); break;
      case TraceOp::Kind::kRecordStream: peer.record_stream(slots[op.slot], streams[op.stream]); break;
      case TraceOp::Kind::kFree: peer.free(slots[op.slot], op.size, streams[op.stream]); break;
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

// The peer's row from a run of this program in a child process (PeerKind::child): the child replays
// the same trace on `runs_as` alone and writes its JSON on stdout.
Result run_child_peer(const PeerKind& kind, const Args& args) {
  Result result{kind, {}, {}, {}, {}, kind.child->variable + "=" + kind.child->value};
  try {
    const ChildOutput child =
        run_self({args.trace, "--peers", kind.child->runs_as, "--repeats", std::to_string(args.repeats), "--json", "-"},
                 kind.child->variable, kind.child->value);
    const std::string where = "the child process with " + result.environment;
    if (child.exit_status == kExecFailed) throw std::runtime_error(where + " could not start this program again");
    nlohmann::json out;
    try {
      out = nlohmann::json::parse(child.stdout_text);
    } catch (const nlohmann::json::exception&) {
      throw std::runtime_error(where + " wrote no JSON (exit status " + std::to_string(child.exit_status) +
                               "; its messages are above)");
    }
    // The child must really run with the setting: PyTorch ignores what it does not parse.
    const std::string expandable = out["context"].value("torch_expandable_segments", "");
    if (kind.name == "torch_expandable" && expandable != "yes") {
      throw std::runtime_error(where +
                               ": PyTorch's allocator there does not use expandable segments "
                               "(torch_expandable_segments: '" +
                               expandable + "')");
    }
    const nlohmann::json& rows = out["results"];
    if (!rows.is_array() || rows.size() != 1) throw std::runtime_error(where + " did not report one row");
    const nlohmann::json& row = rows[0];
    if (row.contains("error")) throw std::runtime_error(where + ": " + row["error"].get<std::string>());
    result.ns_per_op = row["ns_per_op"].get<std::vector<double>>();
    result.peaks = {row["peak_reserved"].get<std::int64_t>(), row["peak_allocated"].get<std::int64_t>()};
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

Result run_peer(const Trace& trace, const PeerKind& kind, const Args& args) {
  Result result{kind, {}, {}, {}, kind.not_run, {}};
  if (!kind.not_run.empty()) return result;
  if (kind.child) return run_child_peer(kind, args);
  const int repeats = args.repeats;
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
    if (!r.not_run.empty()) {
      std::printf("%-26s not run: %s\n", r.kind.id().c_str(), r.not_run.c_str());
      continue;
    }
    if (!r.error.empty()) {
      std::printf("%-26s failed: %s\n", r.kind.id().c_str(), r.error.c_str());
      continue;
    }
    char ratio[32] = "n/a";
    char vs_native[32] = "n/a";
    if (r.reserved_over_allocated() > 0) std::snprintf(ratio, sizeof ratio, "%.3f", r.reserved_over_allocated());
    if (r.peaks.reserved >= 0 && native_reserved > 0) {
      std::snprintf(vs_native, sizeof vs_native, "%.3f",
                    static_cast<double>(r.peaks.reserved) / static_cast<double>(native_reserved));
    }
    std::printf("%-26s %14.1f %14s %14s %10s %12s\n", r.kind.id().c_str(), r.median(),
                bytes_or_na(r.peaks.reserved).c_str(), bytes_or_na(r.peaks.allocated).c_str(), ratio, vs_native);
  }
  for (const Result& r : results) {
    if (!r.environment.empty() && r.error.empty()) {
      std::printf("(%s: run in a process of its own, started with %s)\n", r.kind.id().c_str(), r.environment.c_str());
    }
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
    if (!r.environment.empty()) row["environment"] = r.environment;
    if (!r.not_run.empty()) {
      row["skipped"] = r.not_run;
    } else if (r.error.empty()) {
      row["ns_per_op_median"] = r.median();
      row["ns_per_op"] = r.ns_per_op;
      row["peak_reserved"] = r.peaks.reserved;
      row["peak_allocated"] = r.peaks.allocated;
      // null where a peak is unknown (RMM counts no allocated bytes)
      row["reserved_over_allocated"] =
          r.reserved_over_allocated() > 0 ? nlohmann::json(r.reserved_over_allocated()) : nlohmann::json(nullptr);
    } else {
      row["error"] = r.error;
    }
    out["results"].push_back(row);
  }
  if (args.json_on_stdout()) {
    std::printf("%s\n", out.dump(2).c_str());
    return;
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
    const bool torch_native_here =
        std::any_of(kinds.begin(), kinds.end(), [](const PeerKind& k) { return k.name == "torch_native"; });
    if (torch_native_here && !args.json_on_stdout()) {
      for (const auto& [key, value] : machine_context()) {
        if (key == "torch_expandable_segments" && value == "yes") {
          std::fprintf(stderr,
                       "streamalloc_replay: PYTORCH_CUDA_ALLOC_CONF turns expandable segments on in this "
                       "process, so torch_native runs with them too\n");
        }
      }
    }
    std::vector<Result> results;
    for (const PeerKind& kind : kinds) results.push_back(run_peer(trace, kind, args));
    if (!args.json_on_stdout()) print_table(trace, args, results);
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
