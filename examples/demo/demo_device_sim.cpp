// The demo and the soak on the simulated device: manual mode, with the compute stream kept a few items
// behind the prefetch stream so that, as on a busy GPU, recently freed batches are still pending.
#include <algorithm>
#include <cstring>

#include "demo_device.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

constexpr std::size_t kComputeLagItems = 6;  // about two iterations of compute work

// Compared in chunks against a buffer of the expected byte: memcmp is vectorized, so checking a 64 MiB
// batch takes milliseconds and a soak run on this device does thousands of iterations, where a byte
// loop would spend most of the run here.
bool all_bytes_are(const unsigned char* p, std::size_t bytes, unsigned char value) {
  unsigned char expected[4096];
  std::memset(expected, value, std::min(bytes, sizeof expected));
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t chunk = std::min(bytes - done, sizeof expected);
    if (std::memcmp(p + done, expected, chunk) != 0) return false;
    done += chunk;
  }
  return true;
}

class SimDemoDevice final : public DemoDevice {
 public:
  explicit SimDemoDevice(const Options& options) {
    SimBackend::Config config;
    config.device_count = options.sim_devices;
    config.memory_per_device = options.sim_memory_bytes;
    config.mode = SimBackend::Mode::kManual;
    sim_ = std::make_shared<SimBackend>(config);
  }
  std::shared_ptr<Backend> backend() override { return sim_; }
  std::string description() override {
    return "the simulated device (SimBackend, " + format_bytes(sim_->memory_info(0).total_bytes) +
           "; no GPU in use: the compute stream lags the prefetch stream by a few items)";
  }
  Stream create_stream() override { return sim_->create_stream(0); }
  void destroy_streams() override {}
  void fill(void* ptr, std::size_t bytes, unsigned char value, Stream stream) override {
    sim_->enqueue(0, stream, [=] { std::memset(ptr, value, bytes); });
  }
  void consume(const void* ptr, std::size_t bytes, unsigned char value, void* out, Stream stream) override {
    sim_->enqueue(0, stream, [=] {
      if (!all_bytes_are(static_cast<const unsigned char*>(ptr), bytes, value)) *static_cast<unsigned char*>(out) = 1;
    });
  }
  void step(Stream fast, Stream slow) override {
    sim_->advance(0, fast, SIZE_MAX);
    const std::size_t queued = sim_->queued_items(0, slow);
    if (queued > kComputeLagItems) sim_->advance(0, slow, queued - kComputeLagItems);
  }
  void synchronize() override { sim_->synchronize_all(); }
  std::size_t take_mismatches(void* flags, std::size_t count) override {
    auto* flag = static_cast<unsigned char*>(flags);
    const auto set = std::count_if(flag, flag + count, [](unsigned char f) { return f != 0; });
    std::memset(flag, 0, count);
    return static_cast<std::size_t>(set);
  }

 private:
  std::shared_ptr<SimBackend> sim_;
};

}  // namespace

std::unique_ptr<DemoDevice> make_demo_device(const Options& options) {
#ifdef STREAMALLOC_DEMO_CUDA
  if (options.backend != BackendKind::kSim) {
    if (auto gpu = make_cuda_demo_device()) return gpu;
    if (options.backend == BackendKind::kCuda) {
      throw Error(ErrorCode::kConfig, "backend:cuda was requested but no GPU is present; use backend:sim");
    }
  }
#else
  if (options.backend == BackendKind::kCuda) {
    throw Error(ErrorCode::kConfig, "this demo was built without CUDA; use backend:sim or rebuild with the toolkit");
  }
#endif
  return std::make_unique<SimDemoDevice>(options);
}

}  // namespace streamalloc
