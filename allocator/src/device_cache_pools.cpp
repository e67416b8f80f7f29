// DeviceCache: memory pools and the routes into them (docs/design.md, "Pools"). A private pool lives
// while it has uses (each owner and each open route holds one); at none it is freeable, and
// empty_cache() gives its free segments back and erases it once it holds none. Routes are consulted
// newest first; their filters run on the allocating thread, under the cache's lock.
#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"

namespace streamalloc {

void DeviceCache::create_or_incref_pool(PoolId pool) {
  DeviceLock lock(*this);
  if (pool.is_default()) {
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: the default memory pool (0, 0) cannot be created");
  }
  pools_.add_use(pool);
}

void DeviceCache::release_pool(PoolId pool) {
  DeviceLock lock(*this);
  pools_.release_use(pool);
}

void DeviceCache::begin_allocate_to_pool(PoolId pool, PoolFilter filter) {
  DeviceLock lock(*this);
  pools_.open_route(pool, std::move(filter));
  update_fast_path();
}

void DeviceCache::end_allocate_to_pool(PoolId pool) {
  DeviceLock lock(*this);
  pools_.close_route(pool);
  update_fast_path();
  // The capture that opened the route has usually just ended: its uses leave their batches now.
  if (fences_.has_capture_uses()) fences_.drop_ended_capture_uses();
}

int DeviceCache::pool_use_count(PoolId pool) const {
  DeviceLock lock(*this);
  return pools_.use_count(pool);
}

void DeviceCache::set_pool_use_on_oom(PoolId pool, bool use_on_oom) {
  DeviceLock lock(*this);
  pools_.set_use_on_oom(pool, use_on_oom);
}

void DeviceCache::set_pool_no_split(PoolId pool) {
  DeviceLock lock(*this);
  pools_.set_no_split(pool);
}

void DeviceCache::set_pool_segment_allocator(PoolId pool, SegmentAllocator segments) {
  if (!segments.reserve || !segments.release) {
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: set_pool_segment_allocator needs both a reserve and a release function");
  }
  DeviceLock lock(*this);
  pools_.set_segment_allocator(pool, std::move(segments));
}

std::vector<PoolInfo> DeviceCache::pools() const {
  DeviceLock lock(*this);
  shards_.lock_all();
  return report_.pools();
}

}  // namespace streamalloc
