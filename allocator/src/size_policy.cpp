#include "size_policy.hpp"

namespace streamalloc::size_policy {
namespace {

bool is_power_of_two(std::size_t value) { return value != 0 && (value & (value - 1)) == 0; }

std::size_t floor_power_of_two(std::size_t value) {
  std::size_t power = 1;
  while (power <= value / 2) power *= 2;
  return power;
}

// PyTorch's roundup_power2_next_division: split [2^k, 2^(k+1)) into `divisions` equal steps and
// round up to the next step, so that nearby sizes share blocks and fragmentation drops.
std::size_t round_to_power2_division(std::size_t size, std::size_t divisions) {
  if (is_power_of_two(size)) return size;
  const std::size_t floor = floor_power_of_two(size);
  const std::size_t step = floor / divisions;
  if (step == 0) return floor * 2;
  return round_up(size, step);
}

}  // namespace

std::size_t round_size_in_divisions(std::size_t requested, std::size_t divisions) {
  return round_up(round_to_power2_division(requested, divisions), kMinBlockSize);
}

bool Rounding::valid(const Table& table) {
  for (const std::size_t divisions : table) {
    if (divisions != 0 && !is_power_of_two(divisions)) return false;
  }
  return true;
}

void Rounding::set(const Table& table) {
  bool any = false;
  for (std::size_t i = 0; i < kIntervals; ++i) {
    divisions_[i].store(table[i], std::memory_order_relaxed);
    any = any || table[i] > 1;
  }
  any_.store(any, std::memory_order_relaxed);
}

Rounding::Table Rounding::table() const {
  Table table;
  for (std::size_t i = 0; i < kIntervals; ++i) table[i] = divisions_[i].load(std::memory_order_relaxed);
  return table;
}

std::size_t Rounding::interval_of(std::size_t size) {
  constexpr std::size_t kFirstLog2 = 20;  // 1 MiB
  const std::size_t log2 = size == 0 ? 0 : 63 - static_cast<std::size_t>(__builtin_clzll(size));
  const std::size_t index = log2 > kFirstLog2 ? log2 - kFirstLog2 : 0;
  return index < kIntervals ? index : kIntervals - 1;
}

std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return round_up(rounded, kSegmentRounding);
}

bool may_serve(std::size_t block_size, std::size_t rounded, const Options& options) {
  // Do not carve small requests out of oversize blocks, and do not hand a much larger oversize block
  // to an oversize request: both strand memory that max_split_size was set to protect.
  if (!is_oversize(rounded, options)) return !is_oversize(block_size, options);
  return block_size < rounded + kLargeBuffer;
}

bool should_split(std::size_t block_size, std::size_t rounded, SizeClass size_class, const Options& options) {
  const std::size_t remaining = block_size - rounded;
  if (size_class == SizeClass::kSmall) return remaining >= kMinBlockSize;
  return !is_oversize(rounded, options) && remaining > kSmallSize;
}

}  // namespace streamalloc::size_policy
