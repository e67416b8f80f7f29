// Vocabulary types shared by every layer of streamalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace streamalloc {

// A stream, as an opaque value. Under CUDA it is the cudaStream_t cast to an integer (0 is the legacy
// default stream); under the simulated device it is whatever handle SimBackend handed out. The core
// never interprets it beyond equality and ordering.
using Stream = std::uintptr_t;

// An event, as an opaque handle owned by a Backend (cudaEvent_t under CUDA).
using Event = void*;

// The size classes of blocks and segments, indexed as PyTorch's StatType: 0 = aggregate ("all", stats
// only), 1 = small (blocks up to 1 MiB, from 2 MiB segments), 2 = large. The stats keys keep PyTorch's
// names ("small_pool", "large_pool").
enum class SizeClass : int { kAggregate = 0, kSmall = 1, kLarge = 2 };
inline constexpr int kSizeClasses = 3;
// The former names, kept for existing callers.
using PoolKind = SizeClass;
inline constexpr int kPoolKinds = kSizeClasses;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;

// What went wrong, so that callers (the C ABI, the torch plugin) can map errors to their own kinds,
// e.g. kOutOfMemory -> torch.cuda.OutOfMemoryError.
enum class ErrorCode {
  kOutOfMemory,      // the device (or the memory-fraction cap) cannot satisfy the request
  kInvalidArgument,  // caller misuse: double free, foreign pointer, wrong size/device, bad stream
  kConfig,           // unknown option key or bad value
  kBackend,          // the device runtime reported an error
  kShutdown,         // the allocator was used after shutdown()
};

const char* to_string(ErrorCode code);

// The one exception type of the library. Messages say what was wrong and what to do about it.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Human-readable byte count ("1.50 MiB") for messages and reports.
std::string format_bytes(std::size_t bytes);
// A byte count exactly as PyTorch's CUDA allocator prints it ("512 bytes", "1024.00 KiB", "20.00 MiB",
// "79.19 GiB"), for the out-of-memory sentences that mirror PyTorch's.
std::string format_size(std::size_t bytes);

}  // namespace streamalloc
