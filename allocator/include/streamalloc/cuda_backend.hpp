// The CUDA backend: the Backend seam on the CUDA runtime. Built whenever the CUDA toolkit is found;
// its implementation (src/cuda_backend.cpp) is the only code in allocator/ that includes CUDA headers,
// so this header declares no CUDA types.
#pragma once

#include <memory>

#include "streamalloc/backend.hpp"

namespace streamalloc {

// True when the CUDA runtime reports at least one device. Never throws: when the runtime fails (no
// driver, no device, CUDA_VISIBLE_DEVICES empty) it clears the runtime's error state and says false.
bool cuda_device_available();

// A backend for every visible CUDA device. Stream values are cudaStream_t cast to an integer, events
// are cudaEvent_t. Throws Error(kConfig) when no device is present.
std::shared_ptr<Backend> make_cuda_backend();

}  // namespace streamalloc
