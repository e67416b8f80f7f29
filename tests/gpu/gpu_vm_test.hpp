// The fixture of the GPU tests that need the device's virtual memory management (the Backend's
// reserve/map/unmap calls): a CUDA backend of their own, skipped where device 0 has no VMM.
#pragma once

#include <cstddef>
#include <memory>

#include "gpu/gpu_test_util.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::gpu_test {

class GpuVmTest : public GpuTest {
 protected:
  // Free memory moves a little for the driver's own bookkeeping (page tables, the handles themselves).
  static constexpr std::size_t kSlack = 64 * MiB;

  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    backend_ = make_cuda_backend();
    if (!backend_->supports_virtual_memory(0)) {
      GTEST_SKIP()
          << "device 0 has no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)";
    }
  }
  std::size_t free_bytes() { return backend_->memory_info(0).free_bytes; }

  std::shared_ptr<Backend> backend_;
};

}  // namespace streamalloc::gpu_test
