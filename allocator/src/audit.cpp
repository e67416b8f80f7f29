#include "audit.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace streamalloc {

Audit::Audit(const Options& options) : mode_(options.audit) {
  if (mode_ == AuditMode::kOff && !options.check_sync) return;
  spdlog::sink_ptr sink;
  if (options.audit_file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  } else {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.audit_file, /*truncate=*/true);
    } catch (const spdlog::spdlog_ex& e) {
      throw Error(ErrorCode::kConfig, "streamalloc: cannot open audit_file '" + options.audit_file + "': " + e.what() +
                                          "; give a writable path");
    }
  }
  logger_ = std::make_shared<spdlog::logger>("streamalloc.audit", sink);
  logger_->set_pattern("[streamalloc audit] %v");
  logger_->set_level(spdlog::level::trace);
  logger_->flush_on(spdlog::level::warn);
}

Audit::~Audit() { flush(); }

void Audit::flush() {
  if (logger_) logger_->flush();
}

void Audit::record_stream_on_allocation_stream(int device, std::uintptr_t address, Stream stream) {
  if (!enabled()) return;
  logger_->warn(
      "redundant record_stream: block {:#x} (device {}) was allocated on stream {:#x}, the stream it was "
      "recorded on; stream order already protects it. Remove this record_stream call: it costs a call "
      "and protects nothing.",
      address, device, stream);
}

void Audit::record_stream_duplicate(int device, std::uintptr_t address, Stream stream) {
  if (!enabled()) return;
  logger_->warn(
      "duplicate record_stream: block {:#x} (device {}) is already recorded on stream {:#x}. One call per "
      "(tensor, consumer stream) is enough; calling it in a loop only adds bookkeeping.",
      address, device, stream);
}

void Audit::record_stream_not_live(int device, const void* ptr, Stream stream, const char* why) {
  if (!enabled()) return;
  logger_->warn(
      "record_stream on {} (device {}, stream {:#x}): {}. A record_stream after the tensor was freed "
      "protects nothing: call it while the tensor is alive, right after handing it to the consumer stream.",
      ptr, device, stream, why);
}

void Audit::pending_too_long(int device, Stream stream, std::size_t blocks, std::size_t bytes, double ms) {
  if (!enabled()) return;
  logger_->warn(
      "{} block(s), {} on device {}, have waited {:.0f} ms for stream {:#x} to reach their fence. That "
      "stream is busy or stalled; the memory cannot be reused until it catches up (check for a missing "
      "synchronize, or a consumer stream that never drains).",
      blocks, format_bytes(bytes), device, ms, stream);
}

void Audit::host_sync_for_memory(int device, std::size_t fences, std::size_t bytes_released) {
  if (!enabled()) return;
  logger_->warn(
      "device {} ran short of memory: the allocator waited on the host for {} fence(s) to release {} of "
      "pending frees. Frequent host syncs mean record_stream'd tensors outlive their use: free them "
      "earlier, or lower the number of in-flight batches.",
      device, fences, format_bytes(bytes_released));
}

void Audit::out_of_memory(int device, const std::string& report) {
  if (!enabled()) return;
  logger_->error("device {}: {}", device, report);
}

bool Audit::should_log_repeat(Stream producer, Stream consumer, std::uint64_t* count) {
  std::lock_guard<std::mutex> lock(repeats_mutex_);
  *count = ++repeats_[{producer, consumer}];
  for (std::uint64_t power = 1; power <= *count; power *= 10) {
    if (power == *count) return true;
  }
  return false;
}

void Audit::missing_wait(int device, std::uintptr_t address, std::size_t size, Stream producer, Stream consumer) {
  if (!logger_) return;
  std::uint64_t count = 0;
  if (!should_log_repeat(producer, consumer, &count)) return;
  logger_->warn(
      "missing wait (#{} for this stream pair; logged at 1, 10, 100, ...): block {:#x} ({}, device {}) was "
      "allocated on stream {:#x} and used on stream {:#x}, but "
      "stream {:#x} never waited for stream {:#x} after the allocation. The consumer may read the block before "
      "the producer finished writing it. record_stream only protects memory from reuse; order the consumer "
      "with consumer_stream.wait_event(event_recorded_on_producer) (or wait_stream) before using the tensor.",
      count, address, format_bytes(size), device, producer, consumer, consumer, producer);
}

void Audit::trace_line(int device, const char* what, std::uintptr_t address, std::size_t size, Stream stream) {
  logger_->info("{} device={} ptr={:#x} size={} stream={:#x}", what, device, address, size, stream);
}

}  // namespace streamalloc
