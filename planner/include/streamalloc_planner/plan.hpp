// The planner's one engine: replay an event list under each setting (PyTorch's allocator modelled by
// TorchModel, streamalloc's own Allocator on the simulated device) and report peaks, device
// allocations and, under a cap, the first event that would fail. Both front ends (the C ABI in
// streamalloc_planner.h, used by `python -m streamalloc.plan`, and the streamalloc_plan tool) call
// plan_json().
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "streamalloc_planner/events.hpp"

namespace streamalloc::planner {

struct Setting {
  std::string name;       // shown in the report
  std::string allocator;  // "pytorch" or "streamalloc"
  std::string conf;       // PYTORCH_CUDA_ALLOC_CONF syntax, or streamalloc's conf string
};

// When the events of a block freed after a use on another stream complete, in the PyTorch model, for
// event lists without recorded completion points (`c` lines; snapshots have them, streamalloc_replay
// traces do not). The two rules bracket what the GPU did: kNextMalloc (the GPU kept up with the host)
// gives the least memory, kOutOfMemory (pending until the out-of-memory path waits for them) the most.
enum class Completion { kNextMalloc, kOutOfMemory };

struct PlanRequest {
  std::vector<Setting> settings;                    // empty: default_settings()
  std::size_t cap_bytes = 0;                        // 0: no cap
  std::size_t series_points = 400;                  // reserved bytes over the trace, at most this many points
  bool segment_events = false;                      // include the PyTorch model's segment events (validation)
  Completion completion = Completion::kNextMalloc;  // "completion": "next_malloc" | "out_of_memory"
};

// PyTorch's allocator and streamalloc, each with default options and with expandable segments, plus
// the same with `torch_conf` / `streamalloc_conf` when they are not empty.
std::vector<Setting> default_settings(const std::string& torch_conf = "", const std::string& streamalloc_conf = "");

// {"cap_bytes": N, "series_points": N, "segment_events": bool,
//  "completion": "next_malloc" | "out_of_memory", "settings": [{"name", "allocator", "conf"}...]}; every key
// optional. Throws std::invalid_argument.
PlanRequest parse_request(const std::string& json);

// The report as JSON: {"events": N, "allocs": N, "streams": N, "cap_bytes": N, "settings": [{"name",
// "allocator", "conf", "peak_reserved", "peak_allocated", "reserved_per_allocated", "device_allocs",
// "fits", "first_failure": {"event", "alloc", "size", "stream", "reserved"} | null, "alloc_retries_under_cap"
// (allocations that released cached memory and retried, under the cap), "series": {"every",
// "reserved": [...]}, "segment_events": [[event, action, size, stream], ...]}...], "recommendation"}.
// Throws std::invalid_argument for a bad setting (its conf names the key).
std::string plan_json(const EventList& events, const PlanRequest& request);

}  // namespace streamalloc::planner
