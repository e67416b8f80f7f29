// Size classes and the split rules: PyTorch's proven numbers (docs/design.md, "Size classes").
#pragma once

#include <array>
#include <atomic>
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

// PyTorch's roundup_power2_divisions table (RoundupDivisions, streamalloc/options.hpp). The table may
// change while other threads round (PyTorch's
// settings at runtime): each entry is read and written alone, so a round during a change uses the old
// or the new number of its interval.
class Rounding {
 public:
  static constexpr std::size_t kIntervals = kRoundupIntervals;
  using Table = RoundupDivisions;

  explicit Rounding(std::size_t divisions) { set(filled(divisions)); }
  static Table filled(std::size_t divisions) {
    Table table;
    table.fill(divisions);
    return table;
  }
  // Whether every entry is 0 or a power of two, as PyTorch's parser requires.
  static bool valid(const Table& table);
  void set(const Table& table);
  Table table() const;
  // The index of `size`'s interval in the table.
  static std::size_t interval_of(std::size_t size);

  // The size a request occupies: 512-byte multiples, or the divisions of its interval above
  // kMinBlockSize * divisions, as PyTorch's round_size. Inline: every cached allocation asks.
  std::size_t round(std::size_t requested) const {
    if (requested < kMinBlockSize) return kMinBlockSize;
    if (any_.load(std::memory_order_relaxed)) {
      const std::size_t divisions = divisions_[interval_of(requested)].load(std::memory_order_relaxed);
      if (divisions > 1 && requested > kMinBlockSize * divisions) return round_size_in_divisions(requested, divisions);
    }
    return round_up(requested, kMinBlockSize);
  }

 private:
  std::array<std::atomic<std::size_t>, kIntervals> divisions_{};
  std::atomic<bool> any_{false};  // some entry above 1: the common case skips the table
};

inline SizeClass size_class_for(std::size_t rounded) {
  return rounded <= kSmallSize ? SizeClass::kSmall : SizeClass::kLarge;
}
// Bytes to reserve from the device for a block of `rounded` bytes.
std::size_t segment_size_for(std::size_t rounded);
// Whether a free block of `block_size` may serve a request of `rounded` bytes (max_split_size rules).
bool may_serve(std::size_t block_size, std::size_t rounded, const Options& options);
// Whether the remainder after carving `rounded` bytes out of `block_size` is worth a block of its own.
bool should_split(std::size_t block_size, std::size_t rounded, SizeClass size_class, const Options& options);

}  // namespace streamalloc::size_policy
