// PoolSet: the memory pools of one device cache and the routes into them (docs/design.md, "Pools"):
// the default pool, the private pools by id, and the open routes, oldest first. A private pool lives
// while it has uses (each owner and each open route holds one); at none it is freeable, and the cache
// erases it once it holds no segment. Routes are consulted newest first; their filters run on the
// allocating thread, under the device lock (every method runs under it).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "memory_pool.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"

namespace streamalloc {

class PoolSet {
 public:
  struct Route {
    MemoryPool* pool;
    PoolFilter filter;
  };
  using PrivatePools = std::map<PoolId, std::unique_ptr<MemoryPool>>;

  // `device` names the device in error messages; `policy` is every pool's cross-stream reuse.
  PoolSet(int device, CrossStreamReuse policy) : device_(device), policy_(policy), default_(PoolId{}, policy) {}
  PoolSet(const PoolSet&) = delete;
  PoolSet& operator=(const PoolSet&) = delete;

  MemoryPool& default_pool() { return default_; }
  const MemoryPool& default_pool() const { return default_; }
  bool is_default(const MemoryPool* pool) const { return pool == &default_; }
  const PrivatePools& private_pools() const { return private_; }

  // The pool an allocation on `stream` comes from: the newest open route whose filter accepts the
  // stream, else the default pool. Inline: without routes it is one test.
  MemoryPool& pool_for(Stream stream) { return routes_.empty() ? default_ : routed_pool(stream); }
  bool has_routes() const { return !routes_.empty(); }
  const std::vector<Route>& routes() const { return routes_; }
  // Opens a route to private pool `pool` (created with no use if new), which gains a use; refuses the
  // default pool, a missing filter, and a pool already routed to (nothing changes then).
  void open_route(PoolId pool, PoolFilter filter);
  // Closes the route to `pool` (its use stays: the owner releases it); refuses a pool not routed to.
  void close_route(PoolId pool);

  // The set's own invariants (docs/design.md, "Invariants"): each private pool filed under its own id,
  // never the default's; each route leading to a private pool of the set that has a use for it. Throws
  // std::logic_error naming the device.
  void validate() const;
  MemoryPool* find(PoolId pool);  // the default pool too; nullptr when there is no such pool
  const MemoryPool* find(PoolId pool) const { return const_cast<PoolSet*>(this)->find(pool); }
  // A private pool that exists; refuses unknown and default pools, naming `operation`.
  MemoryPool& private_pool(PoolId pool, const char* operation);
  MemoryPool& add_use(PoolId pool);  // a private pool, created with no use if new, gains one
  void release_use(PoolId pool);     // a private pool's owner lets go; refuses a pool without uses
  int use_count(PoolId pool) const;  // 0 for the default pool and unknown pools
  void set_use_on_oom(PoolId pool, bool use_on_oom);
  void set_no_split(PoolId pool);
  // The pool's fixed segments come from `segments` from now on; refuses a pool that holds segments.
  void set_segment_allocator(PoolId pool, SegmentAllocator segments);
  void erase_empty_freeable();  // private pools without uses or segments
  // The first non-null find(pool) over the private pools whose owner allowed the default pool's
  // allocations to take their free blocks before raising OOM (use_on_oom).
  template <typename Find>
  Block* find_in_use_on_oom(Find&& find) {
    for (const auto& [id, pool] : private_) {
      if (!pool->use_on_oom) continue;
      if (Block* block = find(*pool)) return block;
    }
    return nullptr;
  }
  // What the pool report says of `pool` itself: its id, uses, flags, whether a route leads to it.
  PoolInfo info(const MemoryPool& pool) const;

 private:
  MemoryPool& routed_pool(Stream stream);

  const int device_;
  const CrossStreamReuse policy_;
  MemoryPool default_;  // free blocks of the default pool's segments, owned or settled
  PrivatePools private_;
  std::vector<Route> routes_;  // open routes, oldest first
};

}  // namespace streamalloc
