// Audit: human-readable reports of stream misuse (docs/record-stream.md). The cache counts every
// event in its stats whether or not it is logged; Audit only decides whether and how to say it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "streamalloc/options.hpp"
#include "streamalloc/types.hpp"

namespace spdlog {
class logger;
}

namespace streamalloc {

class Audit {
 public:
  explicit Audit(const Options& options);
  ~Audit();
  // Whether anything is logged: audit:warn|trace, or check_sync:1 (its warnings go to the same sink).
  bool enabled() const { return logger_ != nullptr && mode_ != AuditMode::kOff; }

  void record_stream_on_allocation_stream(int device, std::uintptr_t address, Stream stream);
  void record_stream_duplicate(int device, std::uintptr_t address, Stream stream);
  void record_stream_not_live(int device, const void* ptr, Stream stream, const char* why);
  void pending_too_long(int device, Stream stream, std::size_t blocks, std::size_t bytes, double ms);
  void host_sync_for_memory(int device, std::size_t fences, std::size_t bytes_released);
  void out_of_memory(int device, const std::string& report);
  // check_sync: `consumer` used a block of `producer` without being ordered after the producer.
  void missing_wait(int device, std::uintptr_t address, std::size_t size, Stream producer, Stream consumer);
  // Trace mode: one line per allocation event. Inline, so the hot path pays one compare when off.
  void trace(int device, const char* what, std::uintptr_t address, std::size_t size, Stream stream) {
    if (mode_ == AuditMode::kTrace) trace_line(device, what, address, size, stream);
  }
  void flush();

 private:
  // Repeated findings are logged the 1st, 10th, 100th... time per (producer, consumer) pair, so a bug
  // in a training loop reads as one message with a count, not a flood. Stats count every one.
  void trace_line(int device, const char* what, std::uintptr_t address, std::size_t size, Stream stream);
  bool should_log_repeat(Stream producer, Stream consumer, std::uint64_t* count);

  AuditMode mode_;
  std::shared_ptr<spdlog::logger> logger_;
  std::mutex repeats_mutex_;
  std::map<std::pair<Stream, Stream>, std::uint64_t> repeats_;
};

}  // namespace streamalloc
