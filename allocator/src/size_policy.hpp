// Size classes and the split rules: PyTorch's proven numbers (docs/design.md, "Size classes").
#pragma once

#include <cstddef>

#include "streamalloc/options.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc::size_policy {

inline constexpr std::size_t kMinBlockSize = 512;         // every size rounds up to this
inline constexpr std::size_t kSmallSize = 1 * MiB;        // largest request served by small segments
inline constexpr std::size_t kSmallSegment = 2 * MiB;     // segment size for small requests
inline constexpr std::size_t kLargeSegment = 20 * MiB;    // segment size for requests below kMinLargeAlloc
inline constexpr std::size_t kMinLargeAlloc = 10 * MiB;   // from here requests get their own segment
inline constexpr std::size_t kSegmentRounding = 2 * MiB;  // own segments round up to this
inline constexpr std::size_t kLargeBuffer = 20 * MiB;     // slack tolerated above max_split_size
// PyTorch refuses requests of 1 EiB and more before anything else ("more than 1EB"); below that,
// rounding cannot overflow.
inline constexpr std::size_t kMaxRequest = (std::size_t{1} << 60) - 1;

// Blocks and segments of at least max_split_size are oversize: never split, never carved into smaller
// requests, counted in oversize_allocations/oversize_segments. The one place that says what oversize is.
inline bool is_oversize(std::size_t size, const Options& options) {
  return options.max_split_size_bytes != 0 && size >= options.max_split_size_bytes;
}

// `value` rounded up to a multiple of `multiple` (> 0).
inline std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// round_size with power-of-two divisions, for requests above kMinBlockSize.
std::size_t round_size_in_divisions(std::size_t requested, std::size_t divisions);

// The size a request occupies: 512-byte multiples, or PyTorch's power-of-two divisions when enabled.
// Inline, with size_class_for: every cached allocation asks.
inline std::size_t round_size(std::size_t requested, const Options& options) {
  if (requested < kMinBlockSize) return kMinBlockSize;
  if (options.roundup_power2_divisions > 1 && requested > kMinBlockSize) {
    return round_size_in_divisions(requested, options.roundup_power2_divisions);
  }
  return round_up(requested, kMinBlockSize);
}
inline SizeClass size_class_for(std::size_t rounded) {
  return rounded <= kSmallSize ? SizeClass::kSmall : SizeClass::kLarge;
}
// Bytes to reserve from the device for a block of `rounded` bytes.
std::size_t segment_size_for(std::size_t rounded);
// Whether a free block of `block_size` may serve a request of `rounded` bytes (max_split_size rules).
bool may_serve(std::size_t block_size, std::size_t rounded, const Options& options);
// Whether the remainder after carving `rounded` bytes out of `block_size` is worth a block of its own.
bool should_split(std::size_t block_size, std::size_t rounded, SizeClass pool, const Options& options);

}  // namespace streamalloc::size_policy
