// DeviceCache::validate(): every invariant of docs/design.md ("Invariants"). Each component checks its own
// state (Shard, PoolSet, FenceEngine, ExpandableSegments, StatsLedger, the debugging aids); what is left
// here are the relations between them, checked from the block table: every block in exactly the index
// its state says, every segment tiled and owned, every stat's current recomputed.
// Expensive (walks everything); tests and the fuzzer call it after every step.
#include <algorithm>
#include <map>
#include <string>

#include "device_cache.hpp"
#include "invariant.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void DeviceCache::validate() const {
  using invariant::broken;
  using invariant::check_stat;
  using invariant::hex;
  DeviceLock lock(*this);
  shards_.lock_all();  // every shard's hot list and live blocks hold still
  struct Totals {
    std::int64_t allocation = 0, segment = 0, active = 0, inactive_split = 0;
    std::int64_t allocated_bytes = 0, reserved_bytes = 0, active_bytes = 0, inactive_split_bytes = 0,
                 requested_bytes = 0;
  };
  Totals by_class[kSizeClasses];
  std::int64_t pending_blocks = 0, pending_bytes = 0, oversize_allocations = 0, oversize_segments = 0;
  auto oversize = [&](std::size_t size) { return size_policy::is_oversize(size, options_); };
  std::size_t free_blocks[2] = {0, 0};  // unsettled, settled
  std::size_t live_blocks = 0, shard_indexed = 0;
  std::size_t held = 0, held_bytes = 0, hot_blocks = 0;
  std::size_t reserved = 0;

  // Each shard's own invariants; what they count is checked against the block table below.
  ShardTally tally;
  for (const auto& [stream, shard] : shards_) shard->validate(device_, !ledger_.accumulated_reset(), tally);
  const std::map<const Block*, std::uint32_t>& fence_refs = tally.fence_refs;
  pools_.validate();
  fences_.validate();

  // Pools: every segment belongs to a pool the cache knows, and each pool counts its segments.
  std::map<const MemoryPool*, std::size_t> pool_segments{{&pools_.default_pool(), 0}};
  for (const auto& [id, pool] : pools_.private_pools()) pool_segments[pool.get()] = 0;

  std::uintptr_t previous_end = 0;
  for (const Segment* segment : segments_.all()) {
    auto owner = pool_segments.find(segment->owner);
    if (owner == pool_segments.end()) broken(device_, "segment " + hex(segment->address) + " belongs to no known pool");
    ++owner->second;
    const std::uintptr_t address = segment->address;
    if (address < previous_end) broken(device_, "segments overlap at " + hex(address));
    previous_end = address + segment->span();
    std::size_t covered = 0;
    reserved += segment->size;
    if (oversize(segment->size) && !segment->expandable()) ++oversize_segments;  // its size is mapped pages
    expandable_.validate(segment, device_);
    Totals& t = by_class[class_index(segment->size_class)];
    t.segment += 1;
    t.reserved_bytes += static_cast<std::int64_t>(segment->size);
    std::uintptr_t expected_address = address;
    const Block* prev = nullptr;
    for (const Block* b = segment->head; b != nullptr; prev = b, b = b->next) {
      if (b->segment != segment) broken(device_, "block " + hex(b->address) + " points to the wrong segment");
      if (b->prev != prev) broken(device_, "block " + hex(b->address) + " has a wrong prev link");
      // Blocks tile a fixed segment; in an expandable one only unmapped whole pages may lie between them.
      if (b->address != expected_address && !(segment->expandable() && b->address > expected_address &&
                                              (expected_address - address) % expandable_.page_bytes() == 0 &&
                                              (b->address - address) % expandable_.page_bytes() == 0)) {
        broken(device_, "segment " + hex(address) + " is not tiled by its blocks at " + hex(expected_address) +
                            " (a gap or an overlap)");
      }
      if (b->size == 0 || b->size % 512 != 0) broken(device_, "block " + hex(b->address) + " has a bad size");
      expected_address = b->address + b->size;
      covered += b->size;
      const auto size = static_cast<std::int64_t>(b->size);
      const bool in_unsettled = segment->owner->holds_owned(b);
      const bool in_settled = segment->owner->holds_settled(b);
      const Shard* shard = shards_.find(b->stream);
      const Block* live = shard == nullptr ? nullptr : shard->find_live(b->address);
      const bool belongs_in_shard = b->state == BlockState::kAllocated || (b->state == BlockState::kFree && b->hot);
      if (b->in_shard != belongs_in_shard) {
        broken(device_, "block " + hex(b->address) +
                            (b->in_shard ? " is marked as in a shard but is neither live nor hot"
                                         : " is live or hot but not marked as in its shard"));
      }
      if (b->in_shard && b->split_in_shard != b->is_split()) {
        broken(device_, "block " + hex(b->address) + " of a shard has a stale split flag");
      }
      if ((shards_.indexed(b->address) == b) != b->in_shard) {
        broken(device_, "block " + hex(b->address) +
                            (b->in_shard ? " is in a shard but not in the index of shard blocks"
                                         : " is in the index of shard blocks but in no shard"));
      }
      if (b->in_shard) ++shard_indexed;
      switch (b->state) {
        case BlockState::kAllocated:
          if (live != b) broken(device_, "allocated block " + hex(b->address) + " is not in the live table");
          if (in_unsettled || in_settled) broken(device_, "allocated block " + hex(b->address) + " is in a free index");
          ++live_blocks;
          if (oversize(b->size)) ++oversize_allocations;
          t.allocation += 1;
          t.allocated_bytes += size;
          t.requested_bytes += static_cast<std::int64_t>(b->requested);
          t.active += 1;
          t.active_bytes += size;
          break;
        case BlockState::kPending: {
          if (live != nullptr) broken(device_, "pending block " + hex(b->address) + " is still in the live table");
          if (in_unsettled || in_settled) broken(device_, "pending block " + hex(b->address) + " is in a free index");
          auto refs = fence_refs.find(b);
          const std::uint32_t waiting = refs == fence_refs.end() ? 0 : refs->second;
          if (b->fences_left == 0 || waiting != b->fences_left) {
            broken(device_, "pending block " + hex(b->address) + " waits for " + std::to_string(b->fences_left) +
                                " fences but " + std::to_string(waiting) + " fences list it (a fence was skipped)");
          }
          pending_blocks += 1;
          pending_bytes += size;
          t.requested_bytes += static_cast<std::int64_t>(b->requested);  // counted until inactive
          t.active += 1;
          t.active_bytes += size;
          break;
        }
        case BlockState::kFree:
          if (live != nullptr) broken(device_, "free block " + hex(b->address) + " is in the live table");
          if (b->hot) {
            if (!pools_.is_default(segment->owner))
              broken(device_, "hot block " + hex(b->address) + " of a private pool");
            if (in_unsettled || in_settled || b->in_settle_list || b->settled) {
              broken(device_, "hot block " + hex(b->address) + " is also in a free index or settled");
            }
            ++hot_blocks;
            if (b->counted_inactive_split != b->is_split())
              broken(device_, "inactive_split accounting of block " + hex(b->address));
            if (b->is_split()) {
              t.inactive_split += 1;
              t.inactive_split_bytes += size;
            }
            break;
          }
          if (b->held) {
            if (in_unsettled || in_settled || b->in_settle_list)
              broken(device_, "held block " + hex(b->address) + " is reusable");
            ++held;
            held_bytes += b->size;
            if (b->counted_inactive_split != b->is_split())
              broken(device_, "inactive_split accounting of block " + hex(b->address));
            if (b->is_split()) {
              t.inactive_split += 1;
              t.inactive_split_bytes += size;
            }
            break;
          }
          if (b->settled ? (!in_settled || in_unsettled) : (!in_unsettled || in_settled)) {
            broken(device_, "free block " + hex(b->address) + " is not in exactly the index of its stream state");
          }
          if (!b->settled && !b->in_settle_list)
            broken(device_, "unsettled block " + hex(b->address) + " is not in its stream's settle list");
          if (b->settled && b->in_settle_list)
            broken(device_, "settled block " + hex(b->address) + " is still in a settle list");
          ++free_blocks[b->settled ? 1 : 0];
          if (b->is_split()) {
            t.inactive_split += 1;
            t.inactive_split_bytes += size;
          }
          if (b->counted_inactive_split != b->is_split())
            broken(device_, "inactive_split accounting of block " + hex(b->address));
          if (FreeLists::mergeable(b, b->next)) {
            broken(device_, "adjacent free blocks " + hex(b->address) + " and " + hex(b->next->address) +
                                " that may merge were left unmerged");
          }
          break;
      }
    }
    if (covered != segment->size || expected_address != address + segment->span()) {
      broken(device_, "segment " + hex(address) + " blocks do not add up to its size");
    }
    if (segment->tail != prev) broken(device_, "segment " + hex(address) + " does not know its last block");
  }
  // Each (stream, size class) grows a segment of its own, which is still there.
  const std::vector<Segment*> all_segments = segments_.all();
  for (const auto& [key, segment] : expandable_.all_growing()) {
    if (std::find(all_segments.begin(), all_segments.end(), segment) == all_segments.end() || !segment->expandable() ||
        segment->stream != key.first || segment->size_class != key.second) {
      broken(device_, "the expandable segment a stream grows is not one of its segments");
    }
  }
  if (hot_blocks != tally.hot) broken(device_, "a block is marked hot but is in no stream's hot list");
  if (held != 0 && (aids_ == nullptr || !aids_->holds_blocks()))
    broken(device_, "a block is held but no aid holds blocks");
  if (reserved != segments_.reserved_bytes()) broken(device_, "reserved byte count disagrees with the segments");
  if (live_blocks != tally.live) broken(device_, "the live table holds blocks that are not in any segment");
  if (shard_indexed != shards_.indexed_count()) broken(device_, "the index of shard blocks holds blocks of no segment");
  std::size_t indexed[2] = {0, 0};
  for (const auto& [pool, segments] : pool_segments) {
    if (pool->segment_count() != segments) broken(device_, "a pool's segment count disagrees with its segments");
    indexed[0] += pool->owned_count();
    indexed[1] += pool->settled_count();
  }
  if (indexed[0] != free_blocks[0] || indexed[1] != free_blocks[1]) broken(device_, "a free index holds stale blocks");

  Totals all;
  for (int p = 1; p < kSizeClasses; ++p) {
#define STREAMALLOC_SUM(name, kind, help) all.name += by_class[p].name;
    STREAMALLOC_POOL_STATS(STREAMALLOC_SUM)
#undef STREAMALLOC_SUM
  }
  by_class[0] = all;
  static const char* const kClassKeys[] = {"all", "small_pool", "large_pool"};
  const DeviceStats stats = ledger_.validate(device_, shards_);
  for (int p = 0; p < kSizeClasses; ++p) {
#define STREAMALLOC_CHECK(name, kind, help)                                                              \
  check_stat(device_, (std::string(#name ".") + kClassKeys[p]).c_str(), stats.name[p], by_class[p].name, \
             !ledger_.accumulated_reset());
    STREAMALLOC_POOL_STATS(STREAMALLOC_CHECK)
#undef STREAMALLOC_CHECK
  }
  check_stat(device_, "pending_blocks", ledger_.stats().pending_blocks, pending_blocks, !ledger_.accumulated_reset());
  check_stat(device_, "pending_bytes", ledger_.stats().pending_bytes, pending_bytes, !ledger_.accumulated_reset());
  check_stat(device_, "oversize_allocations", ledger_.stats().oversize_allocations, oversize_allocations,
             !ledger_.accumulated_reset());
  check_stat(device_, "oversize_segments", ledger_.stats().oversize_segments, oversize_segments,
             !ledger_.accumulated_reset());

  // The aids check their own state: the quarantine against the held blocks, the pending history
  // against each stream's pending stats.
  if (aids_ != nullptr) {
    AidCheck check;
    check.device = device_;
    check.held_blocks = held;
    check.held_bytes = held_bytes;
    check.pending_of = [this](Stream stream) -> const StreamPending* {
      const Shard* shard = shards_.find(stream);
      return shard == nullptr ? nullptr : &shard->pending_stats();
    };
    aids_->validate(check);
  }
}

}  // namespace streamalloc
