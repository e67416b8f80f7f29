// The conformance suite on the CUDA backend; skipped with a reason where no GPU is present.
#include <cuda_runtime_api.h>

#include <vector>

#include "conformance_suite.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::testing {
namespace {

class CudaEnv final : public ConformanceEnv {
 public:
  CudaEnv() {
    if (cuda_device_available()) backend_ = make_cuda_backend();
  }
  ~CudaEnv() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  std::string skip_reason() override { return backend_ ? "" : "no CUDA device: GPU test skipped"; }
  std::shared_ptr<Backend> backend() override { return backend_; }
  Stream new_stream() override {
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    streams_.push_back(s);
    return reinterpret_cast<Stream>(s);
  }
  void synchronize() override { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

 private:
  std::shared_ptr<Backend> backend_;
  std::vector<cudaStream_t> streams_;
};

INSTANTIATE_TEST_SUITE_P(Cuda, Conformance,
                         ::testing::ValuesIn(conformance_params("cuda", [] { return std::make_unique<CudaEnv>(); })),
                         conformance_name);

}  // namespace
}  // namespace streamalloc::testing
