// Whether devices share anything: T threads allocate and free on one allocator, either all on device 0
// (each on its own stream) or thread k on device k, against one thread on device 0. Each device has a
// cache and a lock of its own, so T threads on T devices should make T times the pairs of one; T
// threads on one device share its lock wherever a call takes it.
//
//   streamalloc_devices [--backend auto|sim|cuda] [--sim-devices N] [--pairs N] [--rounds R]
//                       [--mode same|cross]
//
// --mode same: every pair on the thread's own stream (the stream's shard alone, the fast path).
// --mode cross: every block also used on a second stream of its device (record_stream), so its free
// and the allocation after take the device lock: where a lock shared between devices would show.
// Sizes cycle through 512 B, 4 KiB, 64 KiB and 1 MiB. On a GPU machine the threads use the GPUs there
// (one GPU: only the one-device rows); without one, the simulated device with --sim-devices devices
// (default 2). Prints the aggregate M pairs/s of each row (medians of the rounds) and its ratio to
// one thread on one device, then checks every device's invariants and that nothing stayed allocated.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "run_threads.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/backend_factory.hpp"
#include "streamalloc/sim_backend.hpp"

#ifdef STREAMALLOC_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using streamalloc::Allocator;
using streamalloc::Stream;

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "streamalloc_devices: %s\nusage: streamalloc_devices [--backend auto|sim|cuda] [--sim-devices N] "
               "[--pairs N] [--rounds R] [--mode same|cross]\n",
               problem.c_str());
  std::exit(2);
}

long positive(const std::string& arg, const std::string& value) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || n < 1) usage(arg + " wants a positive count, got '" + value + "'");
  return n;
}

// Two streams per (thread, device): the thread's own, and the one its blocks are also used on.
struct Streams {
  Stream own = 0;
  Stream other = 0;
};

class Machine {
 public:
  Machine(const std::string& backend, int sim_devices) {
    auto options = streamalloc::Options::parse("log_level:error,backend:" + backend +
                                               ",sim_devices:" + std::to_string(sim_devices));
    backend_ = streamalloc::make_backend(options);
    sim_ = dynamic_cast<streamalloc::SimBackend*>(backend_.get());
    allocator_ = std::make_unique<Allocator>(options, backend_);
  }
  Allocator& allocator() { return *allocator_; }
  int devices() const { return allocator_->device_count(); }
  const char* name() const { return sim_ != nullptr ? "simulated device" : "CUDA"; }

  Stream create_stream(int device) {
    if (sim_ != nullptr) return sim_->create_stream(device);
#ifdef STREAMALLOC_BENCH_CUDA
    cudaStream_t stream = nullptr;  // kept until the process exits
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      usage("could not create a stream on device " + std::to_string(device));
    }
    return reinterpret_cast<Stream>(stream);
#else
    usage("the CUDA backend needs a build with CUDA");
#endif
  }

  void synchronize(int device) {
    if (sim_ != nullptr) {
      sim_->synchronize_all();
      return;
    }
#ifdef STREAMALLOC_BENCH_CUDA
    cudaSetDevice(device);
    cudaDeviceSynchronize();
#else
    (void)device;
#endif
  }

 private:
  std::shared_ptr<streamalloc::Backend> backend_;
  streamalloc::SimBackend* sim_ = nullptr;
  std::unique_ptr<Allocator> allocator_;
};

constexpr std::size_t kSizes[] = {512, 4096, 64 * 1024, 1024 * 1024};

void pairs_on(Allocator& allocator, int device, Streams streams, long pairs, bool cross) {
#ifdef STREAMALLOC_BENCH_CUDA
  cudaSetDevice(device);  // as a thread per device would; the allocator does not depend on it
#endif
  for (long i = 0; i < pairs; ++i) {
    const std::size_t size = kSizes[static_cast<std::size_t>(i) % std::size(kSizes)];
    void* ptr = allocator.allocate(size, device, streams.own);
    if (cross) allocator.record_stream(ptr, streams.other);
    allocator.deallocate(ptr, size, device, streams.own);
  }
}

// Wall seconds for one thread per entry of `device_of`, thread t on device device_of[t] with its own streams.
double run(Allocator& allocator, const std::vector<int>& device_of, const std::vector<Streams>& streams, long pairs,
           bool cross) {
  return streamalloc::bench::run_threads(static_cast<int>(device_of.size()), [&](int t) {
    const auto k = static_cast<std::size_t>(t);
    pairs_on(allocator, device_of[k], streams[k], pairs, cross);
  });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int run_devices(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run_devices(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_devices: %s\n", e.what());
    return 1;
  }
}

int run_devices(int argc, char** argv) {
  std::string backend = "auto";
  std::string mode = "cross";
  long sim_devices = 2, pairs = 500000, rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--backend") {
      backend = value();
      if (backend != "auto" && backend != "sim" && backend != "cuda") usage("--backend is auto, sim or cuda");
    } else if (arg == "--sim-devices") {
      sim_devices = positive(arg, value());
      if (sim_devices > 64) usage("--sim-devices wants at most 64");
    } else if (arg == "--pairs") {
      pairs = positive(arg, value());
    } else if (arg == "--rounds") {
      rounds = positive(arg, value());
    } else if (arg == "--mode") {
      mode = value();
      if (mode != "same" && mode != "cross") usage("--mode is same or cross, got '" + mode + "'");
    } else {
      usage("unknown argument '" + arg + "'");
    }
  }
  Machine machine(backend, static_cast<int>(sim_devices));
  Allocator& allocator = machine.allocator();
  const int devices = machine.devices();
  const bool cross = mode == "cross";

  struct Row {
    std::string name;
    std::vector<int> device_of;
  };
  std::vector<Row> rows = {{"1 thread, device 0", {0}}};
  if (devices > 1) {
    rows.push_back({std::to_string(devices) + " threads, all on device 0",
                    std::vector<int>(static_cast<std::size_t>(devices), 0)});
    std::vector<int> each;
    for (int d = 0; d < devices; ++d) each.push_back(d);
    rows.push_back({std::to_string(devices) + " threads, thread k on device k", each});
  }
  std::printf("%s, %d device(s), mode %s (512 B..1 MiB), %ld pairs per thread, medians of %ld rounds\n", machine.name(),
              devices, mode.c_str(), pairs, rounds);
  if (devices < 2) std::printf("one device: the rows across devices need a second one\n");
  std::printf("%-36s %12s %10s\n", "threads", "M pairs/s", "vs 1");

  // Every thread keeps its own streams for all rounds; each row warms its streams up first.
  double one = 0.0;
  for (const Row& row : rows) {
    std::vector<Streams> streams;
    for (const int d : row.device_of) streams.push_back({machine.create_stream(d), machine.create_stream(d)});
    run(allocator, row.device_of, streams, static_cast<long>(std::size(kSizes)) * 4, cross);
    std::vector<double> rates;
    for (long r = 0; r < rounds; ++r) {
      const double seconds = run(allocator, row.device_of, streams, pairs, cross);
      rates.push_back(static_cast<double>(pairs) * static_cast<double>(row.device_of.size()) / seconds / 1e6);
    }
    const double rate = median(rates);
    if (one == 0.0) one = rate;
    std::printf("%-36s %12.2f %9.2fx\n", row.name.c_str(), rate, rate / one);
  }

  for (int d = 0; d < devices; ++d) machine.synchronize(d);
  allocator.process_fences();
  for (int d = 0; d < devices; ++d) {
    if (allocator.stats(d).allocated_bytes[0].current != 0) {
      std::fprintf(stderr, "streamalloc_devices: device %d still has allocated bytes\n", d);
      return 1;
    }
  }
  allocator.validate();
  std::printf("invariants hold on every device; nothing stays allocated\n");
  return 0;
}
