// make_backend(): the one place that turns Options::backend into a Backend.
#include "streamalloc/backend_factory.hpp"
#include "streamalloc/sim_backend.hpp"

#ifdef STREAMALLOC_WITH_CUDA
#include "streamalloc/cuda_backend.hpp"
#endif

namespace streamalloc {

bool cuda_backend_built() {
#ifdef STREAMALLOC_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

std::shared_ptr<Backend> make_sim_backend(const Options& options) {
  SimBackend::Config config;
  config.device_count = options.sim_devices;
  config.memory_per_device = options.sim_memory_bytes;
  config.mode = SimBackend::Mode::kEager;  // a device that keeps up: work completes as it is enqueued
  return std::make_shared<SimBackend>(config);
}

}  // namespace

std::shared_ptr<Backend> make_backend(const Options& options) {
  switch (options.backend) {
    case BackendKind::kSim: return make_sim_backend(options);
    case BackendKind::kCuda:
#ifdef STREAMALLOC_WITH_CUDA
      return make_cuda_backend();
#else
      throw Error(ErrorCode::kConfig,
                  "streamalloc: backend:cuda was requested but this build has no CUDA backend (the CUDA Toolkit "
                  "was not found at build time). Rebuild with the toolkit installed, or use backend:sim.");
#endif
    case BackendKind::kAuto:
#ifdef STREAMALLOC_WITH_CUDA
      if (cuda_device_available()) return make_cuda_backend();
#endif
      return make_sim_backend(options);
  }
  return make_sim_backend(options);
}

}  // namespace streamalloc
