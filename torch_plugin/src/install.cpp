// streamalloc::torch::install(): choose streamalloc as PyTorch's CUDA allocator, once per process.
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "streamalloc/torch.hpp"
#include "streamalloc/types.hpp"
#include "torch_allocator.hpp"
#include "torch_settings.hpp"

namespace streamalloc::torch {
namespace {

struct Installed {
  std::mutex mutex;
  std::shared_ptr<TorchAllocator> allocator;  // never released: tensors may be freed at exit
};

// Never destroyed, for the same reason: PyTorch frees tensors during static destruction.
Installed& installed() {
  static auto* state = new Installed;
  return *state;
}

}  // namespace

void install(const Options& options) {
  if (options.backend == BackendKind::kSim) {
    throw Error(ErrorCode::kConfig,
                "streamalloc: backend:sim simulates a device in host memory and cannot serve PyTorch's CUDA "
                "tensors; use backend:cuda or backend:auto with PyTorch");
  }
  if (!cuda_backend_built()) {
    throw Error(ErrorCode::kConfig,
                "streamalloc: this build has no CUDA backend (the CUDA Toolkit was not found when it was "
                "built), so it cannot serve PyTorch; rebuild with the toolkit installed");
  }
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.allocator) {
    require_same_options(state.allocator->options(), options);
    return;
  }
  // PyTorch refuses to swap an allocator that CUDA initialisation has set up; say why and what to do
  // rather than let its generic check fire.
  c10::cuda::CUDACachingAllocator::CUDAAllocator* current = c10::cuda::CUDACachingAllocator::get();
  if (current != nullptr && current->initialized()) {
    throw Error(ErrorCode::kConfig,
                "streamalloc: CUDA is already initialised in this process (a CUDA tensor, stream or call came "
                "first), and PyTorch cannot swap its CUDA allocator once it is in use. Install streamalloc "
                "before the first CUDA operation; from Python, call streamalloc.enable() first or run under "
                "`python -m streamalloc script.py`.");
  }
  follow_pytorch_settings();
  auto allocator = std::make_shared<TorchAllocator>(options);
  // The deleter's target is set first, so no tensor can exist whose deleter finds none.
  TorchAllocator::set_current(allocator.get());
  try {
    ::torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  } catch (const std::exception& error) {
    TorchAllocator::set_current(nullptr);
    throw Error(ErrorCode::kConfig, std::string("streamalloc: PyTorch refused the allocator: ") + error.what());
  }
  // changeCurrentAllocator swaps what torch.cuda and c10::cuda::CUDACachingAllocator::get() reach, but
  // not c10's per-device-type registry, through which the device-generic torch.accelerator API
  // (memory_stats, memory_allocated, empty_cache, ...) finds the CUDA allocator: without this it would
  // report the idle native allocator. Highest priority: the native allocator registered itself at
  // static initialisation, with a priority this cannot know.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), std::numeric_limits<std::uint8_t>::max());
  state.allocator = std::move(allocator);
}

void install(const std::string& conf) {
  install(Options::parse(conf, "the string passed to streamalloc::torch::install()"));
}

void install_from_env() {
  // The LibTorch entry point's one read of the environment, never by policy code.
  install(Options::parse(conf_from_environment(), kConfVariable));
}

bool is_installed() {
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.allocator != nullptr;
}

Allocator* allocator() {
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.allocator ? state.allocator->core() : nullptr;
}

}  // namespace streamalloc::torch
