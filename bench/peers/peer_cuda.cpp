// The CUDA runtime's own allocators as peers, and the process-wide pool of CUDA streams every GPU peer
// uses. With peer_stream_uses.hpp, peer_torch.cpp and peer_rmm.cpp, the only files of bench/ that include
// CUDA headers.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_atomic_peak.hpp"
#include "peer_kinds.hpp"
#include "peer_stream_uses.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::bench {
namespace {

constexpr int kDevice = 0;

void check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

cudaStream_t to_cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream); }

class StreamPool {
 public:
  Stream get(int k) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int>(streams_.size()) <= k) {
      cudaStream_t stream = nullptr;
      check(cudaSetDevice(kDevice), "cudaSetDevice");
      // Non-blocking: like PyTorch's side streams, they do not synchronize with the legacy default stream.
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      streams_.push_back(stream);
    }
    return reinterpret_cast<Stream>(streams_[static_cast<std::size_t>(k)]);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaStream_t> streams_;
};

StreamPool& stream_pool() {
  // Never destroyed: allocators that cached blocks on these streams may outlive static destruction.
  static StreamPool* pool = new StreamPool;
  return *pool;
}

// cudaMallocAsync on the device's default pool, its release threshold at UINT64_MAX so that freed
// memory stays cached in the pool (otherwise every synchronization would give it back).
// record_stream: the pool has no such call; what a careful user does instead is make the freeing
// stream wait for the using stream before cudaFreeAsync (StreamUses, at free time).
class CudaMallocAsyncPeer final : public Peer {
 public:
  CudaMallocAsyncPeer() {
    check(cudaSetDevice(kDevice), "cudaSetDevice");
    check(cudaDeviceGetDefaultMemPool(&pool_, kDevice), "cudaDeviceGetDefaultMemPool");
    std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolSetAttribute");
    reset_memory();
  }

  ~CudaMallocAsyncPeer() override {
    try {
      reset_memory();
    } catch (...) {
    }
  }

  void* alloc(std::size_t size, Stream stream) override {
    void* ptr = nullptr;
    check(cudaMallocAsync(&ptr, size, to_cuda(stream)), "cudaMallocAsync");
    return ptr;
  }

  void free(void* ptr, std::size_t, Stream stream) override {
    uses_.wait_before_free(ptr, stream);
    check(cudaFreeAsync(ptr, to_cuda(stream)), "cudaFreeAsync");
  }

  void record_stream(void* ptr, Stream stream) override { uses_.record(ptr, stream); }

  Stream stream(int k) override { return cuda_pool_stream(k); }
  void synchronize() override { cuda_synchronize_device(); }

  void reset_memory() override {
    synchronize();
    check(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
    // Setting a high watermark to 0 restarts it from the current value.
    std::uint64_t zero = 0;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero), "cudaMemPoolSetAttribute");
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero), "cudaMemPoolSetAttribute");
  }

  MemoryPeaks peaks() override {
    std::uint64_t reserved = 0;
    std::uint64_t used = 0;
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &reserved), "cudaMemPoolGetAttribute");
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &used), "cudaMemPoolGetAttribute");
    return {static_cast<std::int64_t>(reserved), static_cast<std::int64_t>(used)};
  }

 private:
  cudaMemPool_t pool_ = nullptr;
  StreamUses uses_;
};

// cudaMalloc/cudaFree: no cache. cudaFree waits for all work on the device, so no stream can still use
// the memory and record_stream has nothing to do. Reserved == allocated, tracked here.
class CudaMallocPeer final : public Peer {
 public:
  CudaMallocPeer() { check(cudaSetDevice(kDevice), "cudaSetDevice"); }

  void* alloc(std::size_t size, Stream) override {
    void* ptr = nullptr;
    check(cudaMalloc(&ptr, size), "cudaMalloc");
    live_.add(static_cast<std::int64_t>(size));
    return ptr;
  }

  void free(void* ptr, std::size_t size, Stream) override {
    check(cudaFree(ptr), "cudaFree");
    live_.add(-static_cast<std::int64_t>(size));
  }

  void record_stream(void*, Stream) override {}
  Stream stream(int k) override { return cuda_pool_stream(k); }
  void synchronize() override { cuda_synchronize_device(); }

  void reset_memory() override {
    synchronize();
    live_.reset_peak();
  }

  MemoryPeaks peaks() override { return {live_.peak(), live_.peak()}; }

 private:
  AtomicPeak live_;
};

}  // namespace

bool gpu_present() { return cuda_device_available(); }

Stream cuda_pool_stream(int k) { return stream_pool().get(k); }

void cuda_synchronize_device() {
  check(cudaSetDevice(kDevice), "cudaSetDevice");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

PeerKind cuda_malloc_async_peer_kind() {
  return {"cudaMallocAsync", "cuda", [] { return std::make_unique<CudaMallocAsyncPeer>(); }};
}

PeerKind cuda_malloc_peer_kind() {
  return {"cudaMalloc", "cuda", [] { return std::make_unique<CudaMallocPeer>(); }};
}

std::vector<std::pair<std::string, std::string>> cuda_context() {
  std::vector<std::pair<std::string, std::string>> out;
  int runtime = 0;
  int driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) out.emplace_back("cuda_runtime", std::to_string(runtime));
  if (cudaDriverGetVersion(&driver) == cudaSuccess) out.emplace_back("cuda_driver", std::to_string(driver));
  if (!gpu_present()) return out;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, kDevice) == cudaSuccess) {
    out.emplace_back("gpu_name", prop.name);
    out.emplace_back("gpu_memory_bytes", std::to_string(prop.totalGlobalMem));
    out.emplace_back("gpu_compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  }
  return out;
}

}  // namespace streamalloc::bench
