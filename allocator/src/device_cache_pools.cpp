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
  MemoryPool& target = pools_.private_pool(pool, "release_pool");
  if (target.use_count == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: release_pool: memory pool ({}, {}) on device {} has no uses left to release",
                            pool.first, pool.second, device_));
  }
  --target.use_count;
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
  const MemoryPool* found = pool.is_default() ? nullptr : pools_.find(pool);
  return found == nullptr ? 0 : found->use_count;
}

void DeviceCache::set_pool_use_on_oom(PoolId pool, bool use_on_oom) {
  DeviceLock lock(*this);
  pools_.private_pool(pool, "set_pool_use_on_oom").use_on_oom = use_on_oom;
}

void DeviceCache::set_pool_no_split(PoolId pool) {
  DeviceLock lock(*this);
  pools_.private_pool(pool, "set_pool_no_split").no_split = true;
}

void DeviceCache::set_pool_segment_allocator(PoolId pool, SegmentAllocator segments) {
  if (!segments.reserve || !segments.release) {
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: set_pool_segment_allocator needs both a reserve and a release function");
  }
  DeviceLock lock(*this);
  MemoryPool& found = pools_.private_pool(pool, "set_pool_segment_allocator");
  if (found.segments != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: set_pool_segment_allocator: memory pool ({}, {}) on device {} already "
                            "holds {} segment(s) from another source",
                            pool.first, pool.second, device_, found.segments));
  }
  found.segment_allocator = std::make_shared<const SegmentAllocator>(std::move(segments));
}

// The last resort of a default-pool allocation: a free block of a pool whose owner allowed it.
Block* DeviceCache::find_free_in_use_on_oom_pools(SizeClass kind, std::size_t size, Stream stream) {
  for (const auto& [id, pool] : pools_.private_pools()) {
    if (!pool->use_on_oom) continue;
    if (Block* block = find_free(*pool, kind, size, stream)) return block;
  }
  return nullptr;
}

std::vector<PoolInfo> DeviceCache::pools() const {
  DeviceLock lock(*this);
  shards_.lock_all();
  std::map<const MemoryPool*, PoolInfo> by_pool;
  auto info_of = [&](const MemoryPool* pool) -> PoolInfo& {
    PoolInfo& info = by_pool[pool];
    info.id = pool->id;
    info.use_count = pool->use_count;
    info.use_on_oom = pool->use_on_oom;
    info.no_split = pool->no_split;
    for (const PoolSet::Route& route : pools_.routes()) info.routed = info.routed || route.pool == pool;
    return info;
  };
  std::vector<PoolInfo> out{info_of(&pools_.default_pool())};
  for (const auto& [id, pool] : pools_.private_pools()) info_of(pool.get());
  segments_.for_each([&](const Segment* segment) {
    PoolInfo& info = by_pool[segment->owner];
    info.segments += 1;
    info.reserved_bytes += segment->size;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kAllocated) {
        info.allocated_bytes += b->size;
        info.live_blocks += 1;
      }
      if (b->state != BlockState::kFree) info.active_bytes += b->size;
    }
  });
  out[0] = by_pool[&pools_.default_pool()];
  for (const auto& [id, pool] : pools_.private_pools()) out.push_back(by_pool[pool.get()]);
  return out;
}

}  // namespace streamalloc
