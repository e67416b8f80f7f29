// DeviceCache: memory pools and the routes into them (docs/design.md, "Pools"). A private pool lives
// while it has uses (each owner and each open route holds one); at none it is freeable, and
// empty_cache() gives its free segments back and erases it once it holds none. Routes are consulted
// newest first; their filters run on the allocating thread, under the cache's lock.
#include <spdlog/fmt/fmt.h>

#include "device_cache.hpp"

namespace streamalloc {
namespace {

std::string name(PoolId pool) { return fmt::format("({}, {})", pool.first, pool.second); }

}  // namespace

MemoryPool* DeviceCache::find_pool(PoolId pool) {
  if (pool.is_default()) return &default_pool_;
  auto it = private_pools_.find(pool);
  return it == private_pools_.end() ? nullptr : it->second.get();
}

const MemoryPool* DeviceCache::find_pool(PoolId pool) const {
  return const_cast<DeviceCache*>(this)->find_pool(pool);
}

MemoryPool& DeviceCache::private_pool(PoolId pool, const char* operation) {
  if (pool.is_default()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: {} needs a private memory pool, but {} is the default pool", operation,
                            name(pool)));
  }
  MemoryPool* found = find_pool(pool);
  if (found == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: {}: memory pool {} does not exist on device {} (create it first, or it "
                            "was released and emptied)",
                            operation, name(pool), device_));
  }
  return *found;
}

MemoryPool& DeviceCache::routed_pool(Stream stream) {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->filter(stream)) return *it->pool;
  }
  return default_pool_;
}

MemoryPool& DeviceCache::add_pool_use(PoolId pool) {
  auto& slot = private_pools_[pool];
  if (slot == nullptr) slot = std::make_unique<MemoryPool>(pool, options_.cross_stream_reuse);
  ++slot->use_count;
  return *slot;
}

void DeviceCache::create_or_incref_pool(PoolId pool) {
  DeviceLock lock(*this);
  if (pool.is_default()) {
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: the default memory pool (0, 0) cannot be created");
  }
  add_pool_use(pool);
}

void DeviceCache::release_pool(PoolId pool) {
  DeviceLock lock(*this);
  MemoryPool& target = private_pool(pool, "release_pool");
  if (target.use_count == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: release_pool: memory pool {} on device {} has no uses left to release",
                            name(pool), device_));
  }
  --target.use_count;
}

void DeviceCache::begin_allocate_to_pool(PoolId pool, PoolFilter filter) {
  DeviceLock lock(*this);
  if (pool.is_default()) {
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: allocations cannot be routed to the default pool (0, 0)");
  }
  if (!filter) throw Error(ErrorCode::kInvalidArgument, "streamalloc: begin_allocate_to_pool needs a filter");
  for (const Route& route : routes_) {
    if (route.pool->id == pool) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("streamalloc: allocations on device {} are already routed to memory pool {}; end that "
                              "route first",
                              device_, name(pool)));
    }
  }
  routes_.push_back(Route{&add_pool_use(pool), std::move(filter)});
  update_fast_path();
}

void DeviceCache::end_allocate_to_pool(PoolId pool) {
  DeviceLock lock(*this);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->pool->id != pool) continue;
    routes_.erase(it);
    update_fast_path();
    // The capture that opened the route has usually just ended: its uses leave their batches now.
    if (!capture_uses_.empty()) drop_ended_capture_uses();
    return;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("streamalloc: end_allocate_to_pool: no allocations on device {} are routed to memory pool {}",
                          device_, name(pool)));
}

int DeviceCache::pool_use_count(PoolId pool) const {
  DeviceLock lock(*this);
  const MemoryPool* found = pool.is_default() ? nullptr : find_pool(pool);
  return found == nullptr ? 0 : found->use_count;
}

void DeviceCache::set_pool_use_on_oom(PoolId pool, bool use_on_oom) {
  DeviceLock lock(*this);
  private_pool(pool, "set_pool_use_on_oom").use_on_oom = use_on_oom;
}

void DeviceCache::set_pool_no_split(PoolId pool) {
  DeviceLock lock(*this);
  private_pool(pool, "set_pool_no_split").no_split = true;
}

void DeviceCache::set_pool_segment_allocator(PoolId pool, SegmentAllocator segments) {
  if (!segments.reserve || !segments.release) {
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: set_pool_segment_allocator needs both a reserve and a release function");
  }
  DeviceLock lock(*this);
  MemoryPool& found = private_pool(pool, "set_pool_segment_allocator");
  if (found.segments != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: set_pool_segment_allocator: memory pool {} on device {} already holds "
                            "{} segment(s) from another source",
                            name(pool), device_, found.segments));
  }
  found.segment_allocator = std::make_shared<const SegmentAllocator>(std::move(segments));
}

// The last resort of a default-pool allocation: a free block of a pool whose owner allowed it.
Block* DeviceCache::find_free_in_use_on_oom_pools(PoolKind kind, std::size_t size, Stream stream) {
  for (auto& [id, pool] : private_pools_) {
    if (!pool->use_on_oom) continue;
    if (Block* block = find_free(*pool, kind, size, stream)) return block;
  }
  return nullptr;
}

void DeviceCache::erase_empty_freeable_pools() {
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    it = it->second->freeable() && it->second->segments == 0 ? private_pools_.erase(it) : std::next(it);
  }
}

std::vector<PoolInfo> DeviceCache::pools() const {
  DeviceLock lock(*this);
  lock_all_shards();
  std::map<const MemoryPool*, PoolInfo> by_pool;
  auto info_of = [&](const MemoryPool* pool) -> PoolInfo& {
    PoolInfo& info = by_pool[pool];
    info.id = pool->id;
    info.use_count = pool->use_count;
    info.use_on_oom = pool->use_on_oom;
    info.no_split = pool->no_split;
    for (const Route& route : routes_) info.routed = info.routed || route.pool == pool;
    return info;
  };
  std::vector<PoolInfo> out{info_of(&default_pool_)};
  for (const auto& [id, pool] : private_pools_) info_of(pool.get());
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
  out[0] = by_pool[&default_pool_];
  for (const auto& [id, pool] : private_pools_) out.push_back(by_pool[pool.get()]);
  return out;
}

}  // namespace streamalloc
