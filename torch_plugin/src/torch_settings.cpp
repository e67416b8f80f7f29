// PyTorch's allocator settings that streamalloc follows (torch_settings.hpp).
#include "torch_settings.hpp"

#include <functional>
#include <mutex>
#include <set>
#include <utility>

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>

#include "torch_allocator.hpp"

namespace streamalloc::torch {
namespace {

using c10::CachingAllocator::AcceleratorAllocatorConfig;

// The keys a settings string names. PyTorch accepted the string before, so it tokenizes; a string it
// would refuse names nothing here.
std::set<std::string> keys_named_in(const std::string& settings) {
  std::set<std::string> keys;
  try {
    const c10::CachingAllocator::ConfigTokenizer tokens(settings);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      keys.insert(tokens[i]);
      i = tokens.skipKey(i);
      if (i + 1 < tokens.size()) ++i;  // the ',' between items
    }
  } catch (const std::exception&) {
    keys.clear();
  }
  return keys;
}

RoundupDivisions pytorch_roundup_divisions() {
  RoundupDivisions table{};
  const std::vector<std::size_t>& divisions = AcceleratorAllocatorConfig::roundup_power2_divisions();
  for (std::size_t i = 0; i < table.size(); ++i) {
    // PyTorch's table has one entry per interval; a shorter or longer one gives its last entry to the
    // intervals beyond it, as PyTorch's lookup clamps the index.
    if (!divisions.empty()) table[i] = divisions[std::min(i, divisions.size() - 1)];
  }
  return table;
}

}  // namespace

PyTorchSettings pytorch_settings(const std::string& settings, SettingsSource source) {
  const std::set<std::string> keys = keys_named_in(settings);
  PyTorchSettings out;
  if (keys.count("roundup_power2_divisions") != 0 || source == SettingsSource::kRuntime) {
    out.roundup_power2_divisions = pytorch_roundup_divisions();
  }
  if (keys.count("expandable_segments") != 0) {
    out.expandable_segments = AcceleratorAllocatorConfig::use_expandable_segments();
  }
  out.graph_capture_record_stream_reuse =
      c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::graph_capture_record_stream_reuse();
  return out;
}

PyTorchSettings current_pytorch_settings() {
  return pytorch_settings(AcceleratorAllocatorConfig::last_allocator_settings(), SettingsSource::kEnvironment);
}

void apply(Allocator& allocator, const PyTorchSettings& settings) {
  if (settings.roundup_power2_divisions) allocator.set_roundup_power2_divisions(*settings.roundup_power2_divisions);
  if (settings.expandable_segments) allocator.set_expandable_segments(*settings.expandable_segments);
  if (settings.graph_capture_record_stream_reuse) {
    allocator.set_graph_capture_record_stream_reuse(*settings.graph_capture_record_stream_reuse);
  }
}

void follow_pytorch_settings() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The hook is c10's one std::function (a unique symbol of libc10, the same object from every
    // library that includes the header); PyTorch's CUDA parser sits in it from libc10_cuda's static
    // initialisation. It stays first, so that its checks run before streamalloc applies anything.
    auto& hook = AcceleratorAllocatorConfig::getConfigParserHook();
    hook = [pytorch = std::move(hook)](const std::string& settings) {
      if (pytorch) pytorch(settings);
      if (TorchAllocator* allocator = TorchAllocator::current()) {
        if (Allocator* core = allocator->core()) apply(*core, pytorch_settings(settings, SettingsSource::kRuntime));
      }
    };
  });
}

}  // namespace streamalloc::torch
