// DeviceCache: the allocation history's sink (streamalloc/trace.hpp). The events themselves are sent
// from their sites in the other device_cache_*.cpp files, each behind one test of trace_.
#include "device_cache.hpp"

namespace streamalloc {

void DeviceCache::set_trace_sink(TraceSink* sink) {
  DeviceLock lock(*this);
  trace_ = sink;
  update_fast_path();
}

}  // namespace streamalloc
