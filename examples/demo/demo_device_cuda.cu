// The demo and the soak on a real GPU: cudaMemsetAsync stands in for the host-to-device copy, and a
// kernel that checks every byte stands in for the forward pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo_device.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc {
namespace {

__global__ void check_bytes(const unsigned char* p, std::size_t n, unsigned char value, unsigned char* flag) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    if (p[i] != value) *flag = 1;
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

cudaStream_t as_cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

class CudaDemoDevice final : public DemoDevice {
 public:
  CudaDemoDevice() : backend_(make_cuda_backend()) {}
  std::shared_ptr<Backend> backend() override { return backend_; }
  std::string description() override {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    return std::string("the GPU: ") + prop.name + " (CUDA backend)";
  }
  Stream create_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    streams_.push_back(s);
    return reinterpret_cast<Stream>(s);
  }
  void destroy_streams() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    streams_.clear();
  }
  void fill(void* ptr, std::size_t bytes, unsigned char value, Stream stream) override {
    check(cudaMemsetAsync(ptr, value, bytes, as_cuda(stream)), "cudaMemsetAsync");
  }
  void consume(const void* ptr, std::size_t bytes, unsigned char value, void* out, Stream stream) override {
    check_bytes<<<256, 256, 0, as_cuda(stream)>>>(static_cast<const unsigned char*>(ptr), bytes, value,
                                                  static_cast<unsigned char*>(out));
    check(cudaGetLastError(), "check_bytes launch");
  }
  void step(Stream, Stream) override {}  // the GPU runs on its own
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  std::size_t take_mismatches(void* flags, std::size_t count) override {
    std::vector<unsigned char> host(count);
    check(cudaMemcpy(host.data(), flags, count, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemset(flags, 0, count), "cudaMemset");
    // cudaMemset may return before the flags are cleared, and the streams here are non-blocking (not
    // ordered after the legacy default stream): without this wait a check enqueued next could set its
    // flag before the clear lands, and the mismatch would be lost.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return static_cast<std::size_t>(std::count_if(host.begin(), host.end(), [](unsigned char f) { return f != 0; }));
  }

 private:
  std::shared_ptr<Backend> backend_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace

std::unique_ptr<DemoDevice> make_cuda_demo_device() {
  if (!cuda_device_available()) return nullptr;
  return std::make_unique<CudaDemoDevice>();
}

}  // namespace streamalloc
