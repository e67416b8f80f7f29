// DeviceCache: the allocation history's sink (streamalloc/trace.hpp). The history is one more debugging
// aid (history_aid.cpp): the events reach it through the aids' hooks, each site behind one test of aids_.
#include "device_cache.hpp"

namespace streamalloc {

void DeviceCache::set_trace_sink(TraceSink* sink) {
  DeviceLock lock(*this);
  if (sink == nullptr) {
    if (aids_ == nullptr) return;
    aids_->set_history(nullptr);
    if (aids_->empty()) aids_.reset();
  } else {
    if (aids_ == nullptr) aids_ = std::make_unique<DebugAids>(std::vector<std::unique_ptr<DebugAid>>{});
    aids_->set_history(make_history_aid(device_, *sink));
  }
  update_fast_path();
}

}  // namespace streamalloc
