// Choosing a backend from the options: the one place that turns Options::backend into a Backend.
#pragma once

#include <memory>

#include "streamalloc/backend.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc {

// The backend `options.backend` selects: kCuda needs the CUDA backend to be built and a device
// present (else Error(kConfig) saying so); kAuto picks CUDA when available, else the simulated device.
std::shared_ptr<Backend> make_backend(const Options& options);
// True when this build includes the CUDA backend.
bool cuda_backend_built();

}  // namespace streamalloc
