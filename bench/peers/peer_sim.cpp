// sim_malloc: what cudaMalloc/cudaFree would do, on the simulated device. No cache: every alloc reserves
// device memory and every free first waits for the whole device (cudaFree synchronizes), then gives it
// back. It is the only peer that can stand beside streamalloc where no GPU is present; it shows what
// streamalloc's cache saves on the simulated device, not how either allocator behaves on a GPU.
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "peer_kinds.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc::bench {
namespace {

class SimMallocPeer final : public Peer {
 public:
  SimMallocPeer() {
    SimBackend::Config config;
    // Host memory is the limit, as it is for streamalloc's simulated device in the benchmarks.
    config.memory_per_device = std::numeric_limits<std::size_t>::max() / 4;
    sim_ = std::make_shared<SimBackend>(config);
  }

  ~SimMallocPeer() override { sim_->synchronize_all(); }

  void* alloc(std::size_t size, Stream) override {
    void* ptr = sim_->reserve(0, size);
    if (ptr == nullptr) throw std::bad_alloc();
    const std::int64_t now = live_.fetch_add(static_cast<std::int64_t>(size)) + static_cast<std::int64_t>(size);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return ptr;
  }

  void free(void* ptr, std::size_t size, Stream) override {
    sim_->synchronize_all();  // cudaFree waits for every stream of the device
    sim_->release(0, ptr, size);
    live_.fetch_sub(static_cast<std::int64_t>(size));
  }

  // cudaFree has already waited for every stream: nothing to record.
  void record_stream(void*, Stream) override {}

  Stream stream(int k) override {
    while (static_cast<int>(streams_.size()) <= k) streams_.push_back(sim_->create_stream(0));
    return streams_[static_cast<std::size_t>(k)];
  }

  void synchronize() override { sim_->synchronize_all(); }
  void reset_memory() override {
    synchronize();
    peak_.store(live_.load());
  }
  MemoryPeaks peaks() override { return {peak_.load(), peak_.load()}; }

 private:
  std::shared_ptr<SimBackend> sim_;
  std::vector<Stream> streams_;
  std::atomic<std::int64_t> live_{0};  // the threads scenario calls from several threads
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace

PeerKind sim_malloc_peer_kind() {
  return {"sim_malloc", "sim", [] { return std::make_unique<SimMallocPeer>(); }};
}

}  // namespace streamalloc::bench
