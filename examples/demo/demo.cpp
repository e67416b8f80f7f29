// streamalloc_demo: the prefetch pipeline (../docs/record-stream.md) run through streamalloc, then
// a per-block stream report. A prefetch stream fills each batch, the compute stream waits on an event and
// reads it, the batch is record_stream'ed on the compute stream and freed at once, as a training loop does
// when the Python reference is overwritten. Runs on the GPU when one is present, else on the simulated
// device, and says which. --snapshot PATH also writes a snapshot when the report is printed, for
// streamalloc_report; --timeline PATH records the pending bytes per stream (pending_history) and writes
// them at the end, with the streams' names and the kind of device, for
// `python -m streamalloc.report PATH --timeline OUT.png`.
#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo_device.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/report.hpp"

using namespace streamalloc;

namespace {

void write_json(const std::string& json, const std::string& path, const char* what) {
  std::ofstream out(path);
  out << json << '\n';
  out.close();
  if (!out) throw std::runtime_error(std::string("cannot write the ") + what + " to " + path);
}

// Enough for every change of the default 300 iterations (about three per iteration) many times over.
constexpr const char* kDemoPendingHistory = "1000000";

void print_stats(const DeviceStats& st, int iterations, bool check_sync) {
  std::printf("\nStream statistics after %d iterations:\n", iterations);
  std::printf("  allocations                 %lld (peak live %lld)\n",
              static_cast<long long>(st.allocation[0].allocated), static_cast<long long>(st.allocation[0].peak));
  std::printf("  record_stream calls         %lld (on the allocation stream: %lld, duplicates: %lld, not live: %lld)\n",
              static_cast<long long>(st.record_stream_calls), static_cast<long long>(st.record_stream_on_alloc_stream),
              static_cast<long long>(st.record_stream_duplicate), static_cast<long long>(st.record_stream_unknown_ptr));
  std::printf("  frees that became pending   %lld (peak pending %s in %lld blocks)\n",
              static_cast<long long>(st.pending_blocks.allocated),
              format_bytes(static_cast<std::size_t>(st.pending_bytes.peak)).c_str(),
              static_cast<long long>(st.pending_blocks.peak));
  const double per_fence =
      st.fences_recorded ? static_cast<double>(st.pending_blocks.allocated) / static_cast<double>(st.fences_recorded)
                         : 0.0;
  std::printf("  fences (events) recorded    %lld (%.1f pending frees per fence; PyTorch records one per free)\n",
              static_cast<long long>(st.fences_recorded), per_fence);
  std::printf("  fence queries               %lld; host syncs on fences %lld; GPU-side waits %lld\n",
              static_cast<long long>(st.fences_polled), static_cast<long long>(st.fences_synced_host),
              static_cast<long long>(st.fences_waited_gpu));
  std::printf("  cross-stream reuse          %lld settled, %lld after a GPU wait\n",
              static_cast<long long>(st.cross_stream_reuse_settled),
              static_cast<long long>(st.cross_stream_reuse_waited));
  if (check_sync) {
    std::printf("  missing-wait warnings       %lld (check_sync:1)\n",
                static_cast<long long>(st.missing_wait_warnings));
  } else {
    std::printf("  missing-wait warnings       not checked (check_sync is off; --conf check_sync:1 turns it on)\n");
  }
  std::printf("  reserved                    %s now, %s peak; allocated peak %s; device allocs %lld\n",
              format_bytes(static_cast<std::size_t>(st.reserved_bytes[0].current)).c_str(),
              format_bytes(static_cast<std::size_t>(st.reserved_bytes[0].peak)).c_str(),
              format_bytes(static_cast<std::size_t>(st.allocated_bytes[0].peak)).c_str(),
              static_cast<long long>(st.num_device_alloc));
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 300;
  std::string conf;
  std::string backend = "auto";
  std::size_t rows = 24;
  std::string variant = "fixed";
  std::string snapshot_path;
  std::string timeline_path;
  // getopt_long rather than CLI11: the GPU machine's image has no CLI11 and no network to fetch it.
  static const option kOptions[] = {{"iterations", required_argument, nullptr, 'i'},
                                    {"conf", required_argument, nullptr, 'c'},
                                    {"backend", required_argument, nullptr, 'b'},
                                    {"rows", required_argument, nullptr, 'r'},
                                    {"variant", required_argument, nullptr, 'v'},
                                    {"snapshot", required_argument, nullptr, 's'},
                                    {"timeline", required_argument, nullptr, 't'},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  for (int opt; (opt = getopt_long(argc, argv, "i:c:b:r:v:s:t:h", kOptions, nullptr)) != -1;) {
    switch (opt) {
      case 'i': iterations = std::atoi(optarg); break;
      case 'c': conf = optarg; break;
      case 'b': backend = optarg; break;
      case 'r': rows = static_cast<std::size_t>(std::atoll(optarg)); break;
      case 'v': variant = optarg; break;
      case 's': snapshot_path = optarg; break;
      case 't': timeline_path = optarg; break;
      default:
        std::fprintf(stderr,
                     "usage: %s [--iterations N] [--conf STREAMALLOC_CONF] [--backend auto|cuda|sim] [--rows N]\n"
                     "          [--variant fixed|missing-wait|missing-record-stream] [--snapshot PATH]\n"
                     "          [--timeline PATH]\n"
                     "Runs a multi-stream prefetch pipeline through streamalloc and prints a per-block\n"
                     "stream report and the stream statistics. --snapshot also writes a snapshot (JSON) when the\n"
                     "report is printed; streamalloc_report PATH prints its table. --timeline records the pending\n"
                     "bytes per stream (pending_history) and writes them (JSON) at the end; python -m\n"
                     "streamalloc.report PATH --timeline OUT.png draws them.\n",
                     argv[0]);
        return opt == 'h' ? 0 : 2;
    }
  }
  const bool wait_event = variant != "missing-wait";
  const bool record_stream = variant != "missing-record-stream";
  if (variant != "fixed" && wait_event && record_stream) {
    std::fprintf(stderr, "streamalloc_demo: --variant must be fixed, missing-wait or missing-record-stream\n");
    return 2;
  }
  if (iterations < 1) {
    std::fprintf(stderr, "streamalloc_demo: --iterations must be a positive number\n");
    return 2;
  }

  try {
    Options options = Options::parse(conf);
    if (backend != "auto") options.set("backend", backend);
    if (!timeline_path.empty() && options.pending_history == 0) options.set("pending_history", kDemoPendingHistory);
    std::unique_ptr<DemoDevice> device = make_demo_device(options);
    // The allocator lives in this inner scope so that it is gone before the streams are destroyed.
    int status = 0;
    {
      Allocator allocator(options, device->backend());
      std::printf("streamalloc demo on %s\n", device->description().c_str());
      // Every option (STREAMALLOC_CONF syntax), a few to a line.
      std::string line = "options: ";
      const std::string all = options.to_conf_string();
      for (std::size_t start = 0; start < all.size();) {
        std::size_t end = all.find(',', start);
        end = end == std::string::npos ? all.size() : end + 1;
        const std::string item = all.substr(start, end - start);
        if (line.size() + item.size() > 100) {
          std::printf("%s\n", line.c_str());
          line = "         ";
        }
        line += item;
        start = end;
      }
      std::printf("%s\n", line.c_str());
      std::printf("pipeline: %s (wait_event %s, record_stream %s)\n", variant.c_str(), wait_event ? "on" : "OFF",
                  record_stream ? "on" : "OFF");

      const Stream prefetch = device->create_stream();
      const Stream compute = device->create_stream();
      const std::map<Stream, std::string> names = {{prefetch, "prefetch"}, {compute, "compute"}, {0, "default"}};
      Event ready = device->backend()->create_event(0);
      void* out = allocator.allocate(4096, 0, compute);  // the mismatch flag the compute stream writes
      device->fill(out, 4096, 0, compute);

      std::mt19937 rng(42);
      std::uniform_int_distribution<int> batch_kib(256, 4096);
      std::size_t checked = 0;
      std::size_t wrong = 0;
      for (int i = 0; i < iterations; ++i) {
        const std::size_t bytes = static_cast<std::size_t>(batch_kib(rng)) * KiB;
        void* batch = allocator.allocate(bytes, 0, prefetch);
        const auto value = static_cast<unsigned char>(i % 250 + 1);
        device->fill(batch, bytes, value, prefetch);          // the H2D copy of the next batch
        device->backend()->record_event(0, ready, prefetch);  // producer done
        allocator.note_event_record(reinterpret_cast<std::uintptr_t>(ready), prefetch);  // for check_sync
        if (wait_event) {  // fix 1: consumer waits (wait_event)
          device->backend()->stream_wait_event(0, compute, ready);
          allocator.note_event_wait(reinterpret_cast<std::uintptr_t>(ready), compute);
        }
        device->consume(batch, bytes, value, out, compute);          // the forward pass reads the batch
        if (record_stream) allocator.record_stream(batch, compute);  // fix 2: protect it from early reuse
        allocator.deallocate(batch, bytes, 0, prefetch);             // the Python reference goes away
        device->step(prefetch, compute);
        if (i == iterations - 3) {
          // Mid-flight: the compute stream still has work queued, so recent batches are pending.
          std::printf("\n%s", format_block_table(allocator.segments(-1), rows, names).c_str());
          if (!snapshot_path.empty()) write_json(allocator.snapshot_json(), snapshot_path, "snapshot");
        }
        if (i % 50 == 49) {
          device->synchronize();
          checked += 1;
          wrong += device->read_mismatch(out) ? 1 : 0;
        }
      }
      device->synchronize();
      allocator.process_fences();
      print_stats(allocator.stats(0), iterations, options.check_sync);
      if (!timeline_path.empty()) {
        const PendingHistory history = allocator.pending_history(0);
        // The report labels the timeline with these: the streams by name, the device by kind.
        nlohmann::json out = nlohmann::json::parse(history.to_json(0));
        for (const auto& [stream, name] : names) out["stream_names"][std::to_string(stream)] = name;
        out["device_kind"] = device->backend()->name() == "sim" ? "simulated device" : "GPU";
        write_json(out.dump(), timeline_path, "pending history");
        std::printf("\npending bytes per stream over time: %s (%zu changes)\n", timeline_path.c_str(),
                    history.samples.size());
      }
      std::printf("\nconsumer checks: %zu, checks that saw wrong bytes: %zu (%s)\n", checked, wrong,
                  wrong == 0 ? "no corruption observed" : "CORRUPTION: the consumer read bytes it did not expect");
      allocator.deallocate(out, 4096, 0, compute);
      allocator.validate();
      device->backend()->destroy_event(0, ready);
      // The broken variants are demonstrations: corruption there is the expected outcome.
      status = wrong == 0 || variant != "fixed" ? 0 : 1;
    }
    device->destroy_streams();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_demo: %s\n", e.what());
    return 2;
  }
}
