// ExpandableSegments: the decision to grow expandable segments (expandable_segments.hpp).
#include "expandable_segments.hpp"

#include <atomic>

#include "logging.hpp"

namespace streamalloc {

void ExpandableSegments::set_up(bool option, Backend& backend, int device) {
  if (!option) return;
  if (!backend.supports_virtual_memory(device)) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true)) {
      log().warn(
          "expandable_segments: the {} backend has no virtual memory on device {}; the cache uses fixed "
          "segments there (docs/options.md)",
          backend.name(), device);
    }
    return;
  }
  page_bytes_ = backend.vm_granularity(device);
}

}  // namespace streamalloc
