// streamalloc_inference_server: a multi-threaded LibTorch inference server loop, to see what the CUDA
// allocator costs a server's throughput (docs/benchmarking.md, "Inference server").
//
// T worker threads share one model (weights on the GPU, inference mode), each with a CUDA stream of
// its own from PyTorch's pool. A request is a random batch of 1..max_batch rows (seeded per thread),
// run through the model, then the stream is synchronized, as a server returning the result does. The
// model says how the request comes and goes (inference_models.hpp, RequestPath): copied from the
// thread's pinned host buffer and back into pinned memory with non_blocking (mlp, conv), or made on
// the GPU with torch::randn and copied back with a plain .to(kCPU) (small_mlp). Requests per second are
// counted over a fixed window after a warm-up, aggregated over the threads; each repetition is one such
// window, the medians are reported. Under streamalloc each line also carries its path counts over the
// repetitions (`path_counts`: allocations served by their stream's shard alone, device-lock
// acquisitions, the lock's wait and hold time, headroom gathers, hot-list flushes).
//
// The allocator is chosen once per process (PyTorch cannot swap it once CUDA is in use), so one run
// measures one allocator; bench/studies/inference_server.py runs every allocator and compares them.
//
//   --allocator=native|streamalloc|standin|rmm   (inference_allocators.hpp; rmm in builds with RMM)
//   --threads=1,2,4,8,16   --models=mlp,conv,small_mlp   --max-batch=64
//   --warmup=S (0.5)  --duration=S (2)  --reps=N (3)  --seed=N (1)
//   --conf=K:V,...   streamalloc's options (with --allocator=streamalloc)
//   --json=FILE      also append the JSON lines to FILE
//   --list-allocators   the allocators this build has, one per line
// Output: one JSON line per model and thread count (medians over the repetitions), then a table.
// Exit status: 0 done, 1 a request failed, 2 bad flags or no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>  // TORCH_VERSION since 2.9
#else
#include <torch/version.h>
#endif

#include "inference_allocators.hpp"
#include "inference_models.hpp"
#include "split_list.hpp"

namespace streamalloc::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr c10::DeviceIndex kDevice = 0;

struct Flags {
  std::string allocator = "native";
  std::vector<int> threads = {1, 2, 4, 8, 16};
  std::vector<std::string> models = {"mlp", "conv", "small_mlp"};
  int max_batch = 64;
  double warmup_s = 0.5;
  double duration_s = 2.0;
  int reps = 3;
  std::uint64_t seed = 1;
  std::string conf;
  std::string json_path;
  bool list_allocators = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "streamalloc_inference_server: %s\n(--help lists the flags)\n", message.c_str());
  std::exit(2);
}

double positive_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(value > 0))
    usage_error(flag + " takes a positive number, not '" + text + "'");
  return value;
}

int positive_int(const std::string& flag, const std::string& text) {
  const double value = positive_number(flag, text);
  if (value != static_cast<int>(value)) usage_error(flag + " takes a positive integer, not '" + text + "'");
  return static_cast<int>(value);
}

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    auto need_value = [&] {
      if (eq == std::string::npos || value.empty()) usage_error(key + " needs a value (" + key + "=...)");
    };
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "streamalloc_inference_server: requests/s of a multi-threaded LibTorch inference loop under one allocator.\n"
          "  --allocator=NAME     native (default), streamalloc, standin, rmm (--list-allocators: this build's)\n"
          "  --threads=N,...      worker threads, one CUDA stream each (default 1,2,4,8,16)\n"
          "  --models=NAME,...    mlp, conv, small_mlp (default all three)\n"
          "  --max-batch=N        a request is 1..N rows, uniformly (default 64)\n"
          "  --warmup=S --duration=S --reps=N   per repetition: S s of warm-up, S s counted (0.5, 2, 3)\n"
          "  --seed=N             weights and batch sizes (default 1)\n"
          "  --conf=K:V,...       streamalloc's options, with --allocator=streamalloc\n"
          "  --json=FILE          append the JSON lines to FILE too\n");
      std::exit(0);
    } else if (arg == "--list-allocators") {
      flags.list_allocators = true;
    } else if (key == "--allocator") {
      need_value();
      flags.allocator = value;
    } else if (key == "--threads") {
      need_value();
      flags.threads.clear();
      for (const std::string& t : split_list(value)) flags.threads.push_back(positive_int("--threads", t));
    } else if (key == "--models") {
      need_value();
      flags.models = split_list(value);
    } else if (key == "--max-batch") {
      need_value();
      flags.max_batch = positive_int(key, value);
    } else if (key == "--warmup") {
      need_value();
      flags.warmup_s = positive_number(key, value);
    } else if (key == "--duration") {
      need_value();
      flags.duration_s = positive_number(key, value);
    } else if (key == "--reps") {
      need_value();
      flags.reps = positive_int(key, value);
    } else if (key == "--seed") {
      need_value();
      flags.seed = static_cast<std::uint64_t>(positive_int(key, value));
    } else if (key == "--conf") {
      flags.conf = value;
    } else if (key == "--json") {
      need_value();
      flags.json_path = value;
    } else {
      usage_error("unknown flag '" + arg + "'");
    }
  }
  if (flags.threads.empty()) usage_error("--threads lists no thread count");
  const auto models = inference_model_names();
  for (const std::string& m : flags.models) {
    if (std::find(models.begin(), models.end(), m) == models.end())
      usage_error("unknown model '" + m + "': use mlp, conv or small_mlp");
  }
  return flags;
}

// One worker's pinned host buffers, sized for the largest request: where requests come from and where
// results go. Allocated with cudaHostAlloc, outside PyTorch's host allocator, so that only the device
// allocator differs between runs.
class PinnedBuffers {
 public:
  PinnedBuffers(const InferenceModel& model, int max_batch) {
    std::vector<std::int64_t> in_shape = {max_batch};
    in_shape.insert(in_shape.end(), model.sample_shape.begin(), model.sample_shape.end());
    input_ = pinned(in_shape, &input_memory_);
    output_ = pinned({max_batch, model.output_features}, &output_memory_);
    input_.uniform_(-1, 1);
  }
  ~PinnedBuffers() {
    cudaFreeHost(input_memory_);
    cudaFreeHost(output_memory_);
  }
  PinnedBuffers(const PinnedBuffers&) = delete;
  PinnedBuffers& operator=(const PinnedBuffers&) = delete;

  torch::Tensor input(std::int64_t rows) const { return input_.narrow(0, 0, rows); }
  torch::Tensor output(std::int64_t rows) const { return output_.narrow(0, 0, rows); }

 private:
  static torch::Tensor pinned(const std::vector<std::int64_t>& shape, void** memory) {
    std::int64_t count = 1;
    for (std::int64_t d : shape) count *= d;
    const cudaError_t err =
        cudaHostAlloc(memory, static_cast<std::size_t>(count) * sizeof(float), cudaHostAllocDefault);
    if (err != cudaSuccess) throw std::runtime_error(std::string("cudaHostAlloc failed: ") + cudaGetErrorString(err));
    return torch::from_blob(*memory, shape, torch::TensorOptions().dtype(torch::kFloat32));
  }

  void* input_memory_ = nullptr;
  void* output_memory_ = nullptr;
  torch::Tensor input_;
  torch::Tensor output_;
};

// What one repetition measured.
struct Repetition {
  double requests_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
};

double percentile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

double median(std::vector<double> values) { return percentile(values, 0.5); }

// One repetition: `threads` workers serve requests for warm-up + duration; the requests that start
// and finish inside the counted window are counted.
Repetition run_repetition(const InferenceModel& model, int threads, const Flags& flags, std::uint64_t rep_seed) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;
  Clock::time_point window_start;
  Clock::time_point window_end;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(threads), 0);
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(threads));

  auto worker = [&](int index) {
    try {
      c10::InferenceMode inference;
      torch::nn::Sequential net = model.net;  // a handle on the shared weights (forward is not const)
      c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, kDevice);
      c10::cuda::CUDAStreamGuard guard(stream);
      std::unique_ptr<PinnedBuffers> buffers;
      if (model.path == RequestPath::kPinned) buffers = std::make_unique<PinnedBuffers>(model, flags.max_batch);
      const auto on_gpu = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA, kDevice);
      std::mt19937_64 rng(rep_seed * 1000003u + static_cast<std::uint64_t>(index));
      std::uniform_int_distribution<std::int64_t> batch(1, flags.max_batch);
      auto& my_latencies = latencies[static_cast<std::size_t>(index)];
      my_latencies.reserve(1 << 16);
      std::int64_t count = 0;

      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!failed.load(std::memory_order_relaxed)) {
        const Clock::time_point start = Clock::now();
        if (start >= window_end) break;
        const std::int64_t rows = batch(rng);
        if (buffers != nullptr) {
          torch::Tensor input = buffers->input(rows).to(torch::Device(torch::kCUDA, kDevice), /*non_blocking=*/true);
          torch::Tensor output = net->forward(input);
          buffers->output(rows).copy_(output, /*non_blocking=*/true);
        } else {
          std::vector<std::int64_t> shape = {rows};
          shape.insert(shape.end(), model.sample_shape.begin(), model.sample_shape.end());
          torch::Tensor output = net->forward(torch::randn(shape, on_gpu));
          const torch::Tensor result = output.to(torch::kCPU);  // pageable and synchronous
          (void)result;
        }  // the request's device tensors are freed here, on this thread's stream
        stream.synchronize();
        const Clock::time_point end = Clock::now();
        if (start >= window_start && end <= window_end) {
          ++count;
          my_latencies.push_back(std::chrono::duration<double, std::micro>(end - start).count());
        }
      }
      stream.synchronize();
      counts[static_cast<std::size_t>(index)] = count;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.empty()) error = "worker " + std::to_string(index) + ": " + e.what();
      failed.store(true);
      ready.fetch_add(1);  // never leave the start gate waiting for this worker
    }
  };

  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i);
  while (ready.load() < threads) std::this_thread::yield();
  const auto warmup = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(flags.warmup_s));
  const auto duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(flags.duration_s));
  window_start = Clock::now() + warmup;
  window_end = window_start + duration;
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  if (failed.load()) throw std::runtime_error(error);

  Repetition rep;
  std::int64_t total = 0;
  std::vector<double> all;
  for (int i = 0; i < threads; ++i) {
    total += counts[static_cast<std::size_t>(i)];
    all.insert(all.end(), latencies[static_cast<std::size_t>(i)].begin(), latencies[static_cast<std::size_t>(i)].end());
  }
  rep.requests_per_s = static_cast<double>(total) / flags.duration_s;
  rep.p50_us = percentile(all, 0.50);
  rep.p99_us = percentile(all, 0.99);
  return rep;
}

// PyTorch's allocator's peak reserved bytes since the last reset, or -1 where the allocator keeps no
// statistics (CUDAPluggableAllocator's default refuses).
std::int64_t peak_reserved() {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(kDevice);
    return stats.reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  } catch (const std::exception&) {
    return -1;
  }
}

void reset_peak_reserved() {
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(kDevice);
  } catch (const std::exception&) {
  }
}

// streamalloc's path counts between two of its stats, as a JSON object; "null" under another allocator.
std::string path_counts_json(const std::optional<streamalloc::DeviceStats>& before,
                             const std::optional<streamalloc::DeviceStats>& after) {
  if (!before || !after) return "null";
  std::string out;
  auto add = [&](const char* name, std::int64_t streamalloc::DeviceStats::*field) {
    out += (out.empty() ? "{" : ", ") + std::string("\"") + name +
           "\": " + std::to_string((*after).*field - (*before).*field);
  };
  add("allocations_cached", &streamalloc::DeviceStats::allocations_cached);
  add("allocations_device_locked", &streamalloc::DeviceStats::allocations_device_locked);
  add("frees_cached", &streamalloc::DeviceStats::frees_cached);
  add("frees_device_locked", &streamalloc::DeviceStats::frees_device_locked);
  add("device_lock_acquisitions", &streamalloc::DeviceStats::device_lock_acquisitions);
  add("device_lock_wait_ns", &streamalloc::DeviceStats::device_lock_wait_ns);
  add("device_lock_held_ns", &streamalloc::DeviceStats::device_lock_held_ns);
  add("headroom_gathers", &streamalloc::DeviceStats::headroom_gathers);
  add("hot_list_flushes", &streamalloc::DeviceStats::hot_list_flushes);
  add("fences_recorded", &streamalloc::DeviceStats::fences_recorded);
  add("fences_polled", &streamalloc::DeviceStats::fences_polled);
  return out + "}";
}

struct Row {
  std::string model;
  int threads = 0;
  double requests_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::int64_t peak_reserved = -1;
  std::string path_counts = "null";  // JSON (path_counts_json)
};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

std::string json_line(const Flags& flags, const Row& row, const std::vector<Repetition>& reps, const std::string& gpu) {
  char number[64];
  auto num = [&](double v) {
    std::snprintf(number, sizeof number, "%.6g", v);
    return std::string(number);
  };
  std::string per_rep;
  for (const Repetition& r : reps) per_rep += (per_rep.empty() ? "" : ", ") + num(r.requests_per_s);
  return "{\"allocator\": " + json_string(flags.allocator) + ", \"model\": " + json_string(row.model) +
         ", \"threads\": " + std::to_string(row.threads) + ", \"requests_per_s\": " + num(row.requests_per_s) +
         ", \"requests_per_s_reps\": [" + per_rep + "], \"p50_us\": " + num(row.p50_us) +
         ", \"p99_us\": " + num(row.p99_us) + ", \"peak_reserved_bytes\": " +
         (row.peak_reserved < 0 ? std::string("null") : std::to_string(row.peak_reserved)) +
         ", \"max_batch\": " + std::to_string(flags.max_batch) + ", \"warmup_s\": " + num(flags.warmup_s) +
         ", \"duration_s\": " + num(flags.duration_s) + ", \"reps\": " + std::to_string(flags.reps) +
         ", \"seed\": " + std::to_string(flags.seed) + ", \"streamalloc_conf\": " + json_string(flags.conf) +
         ", \"gpu\": " + json_string(gpu) + ", \"torch\": " + json_string(TORCH_VERSION) +
         ", \"hardware_threads\": " + std::to_string(std::thread::hardware_concurrency()) +
         ", \"path_counts\": " + row.path_counts + "}";
}

int run(const Flags& flags) {
  if (flags.list_allocators) {
    for (const std::string& name : inference_allocator_names()) std::printf("%s\n", name.c_str());
    return 0;
  }
  const auto names = inference_allocator_names();
  if (std::find(names.begin(), names.end(), flags.allocator) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    usage_error("unknown allocator '" + flags.allocator + "': this build has " + known);
  }
  // Asked of the CUDA runtime directly: PyTorch's CUDA initialisation would fix its allocator.
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus == 0) {
    std::fprintf(stderr,
                 "streamalloc_inference_server: no CUDA GPU here (cudaGetDeviceCount: %s); this program measures "
                 "inference on a GPU and has nothing to run without one\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 2;
  }
  install_inference_allocator(flags.allocator, flags.conf);
  const std::string gpu = at::cuda::getDeviceProperties(kDevice)->name;
  std::printf("# allocator %s (PyTorch reports '%s'), GPU %s, torch %s, %u hardware threads\n", flags.allocator.c_str(),
              c10::cuda::CUDACachingAllocator::name().c_str(), gpu.c_str(), TORCH_VERSION,
              std::thread::hardware_concurrency());
  std::fflush(stdout);

  std::ofstream json_file;
  if (!flags.json_path.empty()) {
    json_file.open(flags.json_path, std::ios::app);
    if (!json_file) usage_error("cannot open " + flags.json_path + " for writing");
  }
  std::vector<Row> rows;
  for (const std::string& model_name : flags.models) {
    const InferenceModel model = make_model(model_name, torch::Device(torch::kCUDA, kDevice), flags.seed);
    for (int threads : flags.threads) {
      reset_peak_reserved();
      const std::optional<streamalloc::DeviceStats> before = streamalloc_stats(kDevice);
      std::vector<Repetition> reps;
      for (int r = 0; r < flags.reps; ++r) {
        reps.push_back(run_repetition(model, threads, flags, flags.seed + static_cast<std::uint64_t>(r)));
      }
      Row row{model_name, threads, 0, 0, 0, peak_reserved(), path_counts_json(before, streamalloc_stats(kDevice))};
      std::vector<double> rps, p50, p99;
      for (const Repetition& r : reps) {
        rps.push_back(r.requests_per_s);
        p50.push_back(r.p50_us);
        p99.push_back(r.p99_us);
      }
      row.requests_per_s = median(rps);
      row.p50_us = median(p50);
      row.p99_us = median(p99);
      const std::string line = json_line(flags, row, reps, gpu);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (json_file) json_file << line << "\n" << std::flush;
      rows.push_back(row);
    }
  }

  std::printf("\n%-12s %-6s %7s %14s %10s %10s %14s\n", "allocator", "model", "threads", "requests/s", "p50 us",
              "p99 us", "peak reserved");
  for (const Row& row : rows) {
    char reserved[32] = "n/a";
    if (row.peak_reserved >= 0)
      std::snprintf(reserved, sizeof reserved, "%.1f MiB", static_cast<double>(row.peak_reserved) / (1 << 20));
    std::printf("%-12s %-6s %7d %14.0f %10.1f %10.1f %14s\n", flags.allocator.c_str(), row.model.c_str(), row.threads,
                row.requests_per_s, row.p50_us, row.p99_us, reserved);
  }
  std::printf("(medians of %d repetitions of %.2f s after %.2f s of warm-up; batches of 1..%d rows)\n", flags.reps,
              flags.duration_s, flags.warmup_s, flags.max_batch);
  return 0;
}

}  // namespace
}  // namespace streamalloc::bench

int main(int argc, char** argv) {
  using namespace streamalloc::bench;
  const Flags flags = parse_flags(argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streamalloc_inference_server: %s\n", e.what());
    return 1;
  }
}
