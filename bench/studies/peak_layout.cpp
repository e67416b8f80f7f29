// streamalloc_peak_layout: where a trace's reserved-but-unallocated memory sits when reserved peaks.
//
//   streamalloc_peak_layout TRACE [--conf CONF] [--blocks] [--every] [--maps FROM:TO]
//
// Replays TRACE once on streamalloc's C++ Allocator on the simulated device (sized as streamalloc_replay
// sizes it), reads the block table after every operation that raised reserved_bytes to a new peak, and
// prints the table of the last such operation (the peak): for each segment, its stream, size class and
// mapped bytes, and its free bytes by state (pending, free owned by a stream, free settled) with the free
// blocks' sizes; then the totals, what growing cost on the simulated device (growths, physical
// allocations created, unmaps) and the fence calls (events recorded, event and stream queries).
// --blocks lists every free block. It answers "which segments and streams hold the bytes that reserved
// has above allocated, and in what pieces", which the replay's one ratio does not (docs/design.md,
// "Expandable segments").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "streamalloc/allocator.hpp"
#include "streamalloc/backend_factory.hpp"
#include "streamalloc/sim_backend.hpp"
#include "trace.hpp"

namespace streamalloc::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Args {
  std::string trace;
  std::string conf;
  bool list_blocks = false;
  bool every_growth = false;
  std::size_t maps_from = 1, maps_to = 0;  // --maps FROM:TO (op indices); none by default
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(
      stderr,
      "%s%susage: streamalloc_peak_layout TRACE [--conf CONF] [--blocks] [--every] [--maps FROM:TO]\n"
      "  --conf    streamalloc options, STREAMALLOC_CONF syntax (e.g. expandable_segments:true)\n"
      "  --blocks  list every free block at the peak\n"
      "  --every   print the table after every operation that made the device give memory\n"
      "  --maps    after each operation FROM..TO (indices), every block of every segment in address\n"
      "            order: [MiB state stream], state a(llocated) p(ending) o(wned) s(ettled), free ones\n"
      "            marked _ (reading the table after every op slows the replay, which changes when fences are seen\n"
      "            complete, and so the layout)\n",
      problem.c_str(), problem.empty() ? "" : "\n");
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage("");
    if (arg == "--conf") {
      if (i + 1 >= argc) usage("--conf needs a value");
      args.conf = argv[++i];
    } else if (arg == "--maps") {
      if (i + 1 >= argc) usage("--maps needs FROM:TO");
      const std::string range = argv[++i];
      const std::size_t colon = range.find(':');
      if (colon == std::string::npos) usage("--maps takes FROM:TO, not '" + range + "'");
      args.maps_from = std::stoul(range.substr(0, colon));
      args.maps_to = std::stoul(range.substr(colon + 1));
    } else if (arg == "--every") {
      args.every_growth = true;
    } else if (arg == "--blocks") {
      args.list_blocks = true;
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option " + arg);
    } else if (args.trace.empty()) {
      args.trace = arg;
    } else {
      usage("more than one trace given");
    }
  }
  if (args.trace.empty()) usage("no trace given");
  return args;
}

std::string block_state(const BlockInfo& b) {
  if (b.state == BlockInfo::State::kAllocated) return "allocated";
  if (b.state == BlockInfo::State::kPendingFree) return "pending";
  return b.settled ? "settled" : "owned";
}

// Free block sizes as "3x2.0 1x20.0" (MiB), largest first.
std::string size_histogram(std::vector<std::size_t> sizes) {
  std::map<std::size_t, int, std::greater<>> counts;
  for (std::size_t s : sizes) ++counts[s];
  std::string out;
  for (const auto& [size, n] : counts) {
    char item[64];
    std::snprintf(item, sizeof item, "%s%dx%.2f", out.empty() ? "" : " ", n, static_cast<double>(size) / kMiB);
    out += item;
  }
  return out;
}

// One line per segment: its blocks in address order, as [_MiB state stream] (free ones start with _).
void print_block_map(const std::vector<SegmentInfo>& segments, const std::map<Stream, int>& trace_stream) {
  for (const SegmentInfo& s : segments) {
    const auto owner = trace_stream.find(s.stream);
    std::printf("  %s segment of stream %d:", s.is_large ? "large" : "small",
                owner == trace_stream.end() ? -1 : owner->second);
    for (const BlockInfo& b : s.blocks) {
      const auto stream = trace_stream.find(b.allocation_stream);
      std::printf(" [%s%.2f %c%d]", b.state == BlockInfo::State::kAllocated ? "" : "_",
                  static_cast<double>(b.size) / kMiB, block_state(b)[0],
                  stream == trace_stream.end() ? -1 : stream->second);
    }
    std::printf("\n");
  }
}

void print_layout(const std::vector<SegmentInfo>& segments, const std::map<Stream, int>& trace_stream,
                  bool list_blocks) {
  std::map<std::string, std::size_t> totals;  // free bytes by state
  std::printf("%-6s %-5s %-4s %10s %10s %10s %10s %10s  %s\n", "stream", "class", "exp", "mapped", "allocated",
              "pending", "owned", "settled", "free blocks (count x MiB; owned/settled/pending)");
  for (const SegmentInfo& s : segments) {
    std::map<std::string, std::size_t> bytes;
    std::vector<std::size_t> free_sizes;
    for (const BlockInfo& b : s.blocks) {
      const std::string state = block_state(b);
      bytes[state] += b.size;
      if (state != "allocated") {
        free_sizes.push_back(b.size);
        totals[state] += b.size;
      }
    }
    const auto stream = trace_stream.find(s.stream);
    std::printf("%-6d %-5s %-4s %10.2f %10.2f %10.2f %10.2f %10.2f  %s\n",
                stream == trace_stream.end() ? -1 : stream->second, s.is_large ? "large" : "small",
                s.expandable ? "yes" : "no", static_cast<double>(s.total_size) / kMiB,
                static_cast<double>(bytes["allocated"]) / kMiB, static_cast<double>(bytes["pending"]) / kMiB,
                static_cast<double>(bytes["owned"]) / kMiB, static_cast<double>(bytes["settled"]) / kMiB,
                size_histogram(free_sizes).c_str());
    if (list_blocks) {
      for (const BlockInfo& b : s.blocks) {
        if (b.state == BlockInfo::State::kAllocated) continue;
        const auto owner = trace_stream.find(b.allocation_stream);
        std::printf("    free %-8s %10.2f MiB at +%.2f MiB, stream %d\n", block_state(b).c_str(),
                    static_cast<double>(b.size) / kMiB, static_cast<double>(b.address - s.address) / kMiB,
                    owner == trace_stream.end() ? -1 : owner->second);
      }
    }
  }
  std::printf("free at the peak: pending %.2f MiB, owned %.2f MiB, settled %.2f MiB\n",
              static_cast<double>(totals["pending"]) / kMiB, static_cast<double>(totals["owned"]) / kMiB,
              static_cast<double>(totals["settled"]) / kMiB);
}

// The simulated device streamalloc_replay gives a trace: twice what it needs, at least 4 GiB.
std::string with_sim_memory(const Trace& trace, const std::string& conf) {
  if (conf.find("sim_memory_mb") != std::string::npos) return conf;
  const std::int64_t needed =
      std::max(trace.header_int("native_peak_reserved"), static_cast<std::int64_t>(trace.peak_live_bytes));
  const std::int64_t mb = std::max<std::int64_t>(4096, 2 * needed / (1 << 20) + 1);
  return (conf.empty() ? "" : conf + ",") + "sim_memory_mb:" + std::to_string(mb) + ",backend:sim";
}

int run(const Args& args) {
  const Trace trace = read_trace(args.trace);
  const Options options = Options::parse(with_sim_memory(trace, args.conf));
  const std::shared_ptr<Backend> backend = make_backend(options);
  const auto sim = std::dynamic_pointer_cast<SimBackend>(backend);
  Allocator allocator(options, backend);

  std::vector<Stream> streams;
  std::map<Stream, int> trace_stream;
  for (std::size_t k = 0; k < trace.stream_ids.size(); ++k) {
    streams.push_back(sim->create_stream(0));
    trace_stream[streams.back()] = static_cast<int>(k);
  }
  std::vector<void*> slots(trace.slots, nullptr);
  const auto all = static_cast<std::size_t>(PoolKind::kAggregate);
  std::int64_t peak = 0;
  std::size_t peak_op = 0;
  std::size_t peak_request = 0;
  int peak_stream = 0;
  std::vector<SegmentInfo> at_peak;
  SimBackend::Counters device_calls = sim->counters();
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    switch (op.kind) {
      case TraceOp::Kind::kAlloc: slots[op.slot] = allocator.allocate(op.size, 0, streams[op.stream]); break;
      case TraceOp::Kind::kRecordStream: allocator.record_stream(slots[op.slot], streams[op.stream]); break;
      case TraceOp::Kind::kFree: allocator.deallocate(slots[op.slot], op.size, 0, streams[op.stream]); break;
    }
    // Reserved rises only when the device gives memory (a map or a reserve); reading the stats and the
    // block table only then keeps the replay's timing, which decides when fences are polled, close to
    // streamalloc_replay's.
    if (i >= args.maps_from && i <= args.maps_to) {
      static const char kKinds[] = {'a', 'f', 'r'};  // TraceOp::Kind's order
      std::printf("op %zu: %c of %.2f MiB on stream %u\n", i, kKinds[static_cast<int>(op.kind)],
                  static_cast<double>(op.size) / kMiB, op.stream);
      print_block_map(allocator.segments(0), trace_stream);
    }
    if (op.kind != TraceOp::Kind::kAlloc) continue;
    const SimBackend::Counters now = sim->counters();
    if (now.physical_allocations_created == device_calls.physical_allocations_created &&
        now.reserve_calls == device_calls.reserve_calls) {
      continue;
    }
    device_calls = now;
    const std::int64_t reserved = allocator.stats(0).reserved_bytes[all].current;
    if (args.every_growth) {
      std::printf("op %zu: alloc of %.2f MiB on stream %u; reserved %.2f MiB\n", i, static_cast<double>(op.size) / kMiB,
                  op.stream, static_cast<double>(reserved) / kMiB);
      print_layout(allocator.segments(0), trace_stream, args.list_blocks);
    }
    if (reserved > peak) {
      peak = reserved;
      peak_op = i;
      peak_request = op.size;
      peak_stream = static_cast<int>(op.stream);
      at_peak = allocator.segments(0);
    }
  }
  sim->synchronize_all();
  const DeviceStats stats = allocator.stats(0);
  const SimBackend::Counters counters = sim->counters();
  std::printf("%s (%s)\n", args.trace.c_str(), options.to_conf_string().c_str());
  std::printf(
      "peak reserved %.2f MiB, peak allocated %.2f MiB, ratio %.3f; peak reached at op %zu "
      "(alloc of %.2f MiB on stream %d)\n",
      static_cast<double>(stats.reserved_bytes[all].peak) / kMiB,
      static_cast<double>(stats.allocated_bytes[all].peak) / kMiB,
      static_cast<double>(stats.reserved_bytes[all].peak) /
          static_cast<double>(std::max<std::int64_t>(1, stats.allocated_bytes[all].peak)),
      peak_op, static_cast<double>(peak_request) / kMiB, peak_stream);
  std::printf(
      "device growths (num_device_alloc) %lld, unmaps/frees (num_device_free) %lld, fixed reserves %llu, "
      "physical allocations created %llu, released %llu\n",
      static_cast<long long>(stats.num_device_alloc), static_cast<long long>(stats.num_device_free),
      static_cast<unsigned long long>(counters.reserve_calls),
      static_cast<unsigned long long>(counters.physical_allocations_created),
      static_cast<unsigned long long>(counters.physical_allocations_released));
  std::printf("fences: event records %llu, event queries %llu, stream queries %llu\n",
              static_cast<unsigned long long>(counters.event_records),
              static_cast<unsigned long long>(counters.event_queries),
              static_cast<unsigned long long>(counters.stream_queries));
  print_layout(at_peak, trace_stream, args.list_blocks);
  return 0;
}

}  // namespace
}  // namespace streamalloc::bench

int main(int argc, char** argv) {
  const streamalloc::bench::Args args = streamalloc::bench::parse_args(argc, argv);
  try {
    return streamalloc::bench::run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_peak_layout: %s\n", e.what());
    return 1;
  }
}
