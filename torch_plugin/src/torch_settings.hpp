// PyTorch's allocator settings that streamalloc follows (docs/pytorch.md, "PyTorch's allocator
// settings"): roundup_power2_divisions, expandable_segments and graph_capture_record_stream_reuse, as
// PyTorch parsed them from PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF or from
// torch.cuda.memory._set_allocator_settings (c10::CachingAllocator::setAllocatorSettings).
//
// PyTorch parses and validates a settings string itself, into c10's AcceleratorAllocatorConfig and
// CUDAAllocatorConfig, and then calls its device config parser hook. streamalloc wraps that hook:
// PyTorch's parsers run first, so a string PyTorch refuses throws PyTorch's own error before
// streamalloc sees it, and changes nothing of streamalloc's; a string PyTorch accepts is then read back
// from PyTorch's accessors, so both allocators hold the same values.
#pragma once

#include <optional>
#include <string>

#include "streamalloc/allocator.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc::torch {

// The settings streamalloc takes from one of PyTorch's settings strings; a field left empty keeps
// streamalloc's value (its own option).
struct PyTorchSettings {
  std::optional<RoundupDivisions> roundup_power2_divisions;
  std::optional<bool> expandable_segments;
  std::optional<bool> graph_capture_record_stream_reuse;
};

// When PyTorch parsed `settings`: at process start (PYTORCH_ALLOC_CONF), or at runtime
// (setAllocatorSettings), where PyTorch resets roundup_power2_divisions to its default unless the
// string names it.
enum class SettingsSource { kEnvironment, kRuntime };

// What PyTorch's parsed configuration holds, after it took `settings`, for the keys streamalloc
// follows: expandable_segments only when `settings` names it (streamalloc's option stands
// otherwise), roundup_power2_divisions when it names it or at runtime, and
// graph_capture_record_stream_reuse always (streamalloc has no option of its own for it).
PyTorchSettings pytorch_settings(const std::string& settings, SettingsSource source);
// The settings of PyTorch's last settings string (the environment's, or the last runtime call's).
PyTorchSettings current_pytorch_settings();
void apply(Allocator& allocator, const PyTorchSettings& settings);

// Wraps PyTorch's device config parser hook, once per process: from then on every settings string
// PyTorch accepts is applied to the allocator serving PyTorch (TorchAllocator's current one), when it
// exists; an allocator made later reads current_pytorch_settings() when it is created.
void follow_pytorch_settings();

}  // namespace streamalloc::torch
