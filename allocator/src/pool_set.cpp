// PoolSet: the memory pools of one device cache and the routes into them (pool_set.hpp).
#include "pool_set.hpp"

#include <spdlog/fmt/fmt.h>

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

}  // namespace streamalloc
