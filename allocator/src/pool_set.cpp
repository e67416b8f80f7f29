// PoolSet: the memory pools of one device cache and the routes into them (pool_set.hpp).
#include "pool_set.hpp"

#include <spdlog/fmt/fmt.h>

#include "invariant.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {
namespace {

std::string name(PoolId pool) { return fmt::format("({}, {})", pool.first, pool.second); }

}  // namespace

MemoryPool* PoolSet::find(PoolId pool) {
  if (pool.is_default()) return &default_;
  auto it = private_.find(pool);
  return it == private_.end() ? nullptr : it->second.get();
}

MemoryPool& PoolSet::private_pool(PoolId pool, const char* operation) {
  if (pool.is_default()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("streamalloc: {} needs a private memory pool, but {} is the default pool", operation, name(pool)));
  }
  MemoryPool* found = find(pool);
  if (found == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: {}: memory pool {} does not exist on device {} (create it first, or it "
                            "was released and emptied)",
                            operation, name(pool), device_));
  }
  return *found;
}

MemoryPool& PoolSet::routed_pool(Stream stream) {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->filter(stream)) return *it->pool;
  }
  return default_;
}

MemoryPool& PoolSet::add_use(PoolId pool) {
  auto& slot = private_[pool];
  if (slot == nullptr) slot = std::make_unique<MemoryPool>(pool, policy_);
  ++slot->use_count;
  return *slot;
}

void PoolSet::open_route(PoolId pool, PoolFilter filter) {
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
  routes_.push_back(Route{&add_use(pool), std::move(filter)});
}

void PoolSet::close_route(PoolId pool) {
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->pool->id != pool) continue;
    routes_.erase(it);
    return;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("streamalloc: end_allocate_to_pool: no allocations on device {} are routed to memory pool {}",
                          device_, name(pool)));
}

void PoolSet::erase_empty_freeable() {
  for (auto it = private_.begin(); it != private_.end();) {
    it = it->second->freeable() && it->second->segments == 0 ? private_.erase(it) : std::next(it);
  }
}

void PoolSet::release_use(PoolId pool) {
  MemoryPool& target = private_pool(pool, "release_pool");
  if (target.use_count == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: release_pool: memory pool ({}, {}) on device {} has no uses left to release",
                            pool.first, pool.second, device_));
  }
  --target.use_count;
}

int PoolSet::use_count(PoolId pool) const {
  const MemoryPool* found = pool.is_default() ? nullptr : find(pool);
  return found == nullptr ? 0 : found->use_count;
}

void PoolSet::set_use_on_oom(PoolId pool, bool use_on_oom) {
  private_pool(pool, "set_pool_use_on_oom").use_on_oom = use_on_oom;
}

void PoolSet::set_no_split(PoolId pool) { private_pool(pool, "set_pool_no_split").no_split = true; }

void PoolSet::set_segment_allocator(PoolId pool, SegmentAllocator segments) {
  MemoryPool& found = private_pool(pool, "set_pool_segment_allocator");
  if (found.segments != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: set_pool_segment_allocator: memory pool ({}, {}) on device {} already "
                            "holds {} segment(s) from another source",
                            pool.first, pool.second, device_, found.segments));
  }
  found.segment_allocator = std::make_shared<const SegmentAllocator>(std::move(segments));
}

PoolInfo PoolSet::info(const MemoryPool& pool) const {
  PoolInfo info;
  info.id = pool.id;
  info.use_count = pool.use_count;
  info.use_on_oom = pool.use_on_oom;
  info.no_split = pool.no_split;
  for (const Route& route : routes_) info.routed = info.routed || route.pool == &pool;
  return info;
}

void PoolSet::validate() const {
  for (const auto& [id, pool] : private_) {
    if (pool->id != id || id.is_default()) invariant::broken(device_, "a private pool is filed under the wrong id");
  }
  for (const Route& route : routes_) {
    const auto owner = private_.find(route.pool->id);
    if (owner == private_.end() || owner->second.get() != route.pool) {
      invariant::broken(device_, "a route leads to a pool the cache does not hold");
    }
    if (route.pool->use_count < 1) invariant::broken(device_, "a routed pool has no use for its route");
  }
}

}  // namespace streamalloc
