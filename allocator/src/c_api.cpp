// The C ABI (streamalloc.h): one process-wide Allocator behind extern "C" hooks. Errors never escape
// a hook: they are stored per thread (streamalloc_last_error) and logged.
#include "streamalloc/streamalloc.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "logging.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/report.hpp"

namespace {

using streamalloc::Allocator;
using streamalloc::Error;
using streamalloc::ErrorCode;

struct Global {
  std::mutex mutex;
  std::atomic<Allocator*> allocator{nullptr};
  bool configured = false;  // streamalloc_configure() ran and its options wait for first use
  streamalloc::Options options;
  std::string conf;
};

// Never destroyed: PyTorch frees tensors during static destruction at exit, after which a destroyed
// allocator would be a use-after-free.
Global& global() {
  static Global* g = new Global;
  return *g;
}

thread_local std::string t_last_error;
// Read by every hook: the initial-exec model turns the read into one load instead of a call to
// __tls_get_addr (a few bytes of the static TLS that dlopen'ed libraries may use).
thread_local int t_last_code __attribute__((tls_model("initial-exec"))) = 0;

int code_number(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOutOfMemory: return 1;
    case ErrorCode::kInvalidArgument: return 2;
    case ErrorCode::kConfig: return 3;
    case ErrorCode::kBackend: return 4;
    case ErrorCode::kShutdown: return 5;
  }
  return 4;
}

void set_error(int code, const std::string& message) {
  t_last_code = code;
  t_last_error = message;
  streamalloc::log().error("{}", message);
}

void clear_error() {
  t_last_code = 0;
  t_last_error.clear();
}
// (t_last_code is set together with every t_last_error, so a zero code means the string is empty.)

// Run `body`, turning every exception into the thread's last error.
template <typename F>
bool to_last_error(F&& body) {
  try {
    if (t_last_code != 0) clear_error();  // the common case (no earlier error) touches no string
    body();
    return true;
  } catch (const Error& e) {
    // Out-of-memory is an expected outcome for callers that retry; they read the report from
    // last_error, so it is not logged as an error here.
    if (e.code() == ErrorCode::kOutOfMemory) {
      t_last_code = 1;
      t_last_error = e.what();
      streamalloc::log().info("{}", e.what());
    } else {
      set_error(code_number(e.code()), e.what());
    }
  } catch (const std::exception& e) {
    set_error(4, std::string("streamalloc: internal error: ") + e.what());
  } catch (...) {
    set_error(4, "streamalloc: internal error (unknown exception)");
  }
  return false;
}

Allocator& instance() {
  Global& g = global();
  Allocator* a = g.allocator.load(std::memory_order_acquire);
  if (a != nullptr) return *a;
  std::lock_guard<std::mutex> lock(g.mutex);
  a = g.allocator.load(std::memory_order_relaxed);
  if (a != nullptr) return *a;
  if (!g.configured) {
    // The environment is read here, at the top of the stack, never by policy code.
    const char* env = std::getenv("STREAMALLOC_CONF");
    g.conf = env ? env : "";
    g.options = streamalloc::Options::parse(g.conf);
  }
  a = new Allocator(g.options, streamalloc::make_backend(g.options));
  g.allocator.store(a, std::memory_order_release);
  g.configured = false;
  return *a;
}

streamalloc::Stream to_stream(streamalloc_stream_t stream) { return reinterpret_cast<streamalloc::Stream>(stream); }

char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// The string `make()` returns, as a malloc'ed copy for streamalloc_free_string(); NULL (and the last
// error) when it throws.
template <typename F>
char* string_or_last_error(F&& make) {
  std::string s;
  if (!to_last_error([&] { s = make(); })) return nullptr;
  return copy_string(s);
}

}  // namespace

extern "C" {

void* streamalloc_malloc(size_t size, int device, streamalloc_stream_t stream) {
  void* ptr = nullptr;
  to_last_error([&] { ptr = instance().allocate(size, device, to_stream(stream)); });
  return ptr;
}

void streamalloc_free(void* ptr, size_t size, int device, streamalloc_stream_t stream) {
  to_last_error([&] { instance().deallocate(ptr, size, device, to_stream(stream)); });
}

void streamalloc_record_stream(void* ptr, streamalloc_stream_t stream) {
  to_last_error([&] { instance().record_stream(ptr, to_stream(stream)); });
}

void streamalloc_empty_cache(void) {
  to_last_error([&] { instance().empty_cache(); });
}

void streamalloc_set_memory_fraction(double fraction, int device) {
  to_last_error([&] { instance().set_memory_fraction(fraction, device); });
}

void streamalloc_init(int device_count) {
  to_last_error([&] {
    Allocator& a = instance();
    if (device_count > a.device_count()) {
      throw Error(ErrorCode::kConfig, "streamalloc: initialised for " + std::to_string(device_count) +
                                          " devices but the " + a.backend().name() + " backend has " +
                                          std::to_string(a.device_count()));
    }
  });
}

void* streamalloc_base_alloc(void* ptr, size_t* size) {
  void* base = nullptr;
  to_last_error([&] {
    base = instance().segment_base(ptr, size);
    if (base == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "streamalloc: base_alloc: the pointer is not inside memory reserved by streamalloc");
    }
  });
  return base;
}

void streamalloc_note_event_record(void* event, streamalloc_stream_t stream) {
  to_last_error([&] { instance().note_event_record(reinterpret_cast<std::uintptr_t>(event), to_stream(stream)); });
}

void streamalloc_note_event_wait(void* event, streamalloc_stream_t stream) {
  to_last_error([&] { instance().note_event_wait(reinterpret_cast<std::uintptr_t>(event), to_stream(stream)); });
}

void streamalloc_note_stream_synchronize(streamalloc_stream_t stream) {
  to_last_error([&] { instance().note_stream_synchronize(to_stream(stream)); });
}

void streamalloc_note_device_synchronize(void) {
  to_last_error([&] { instance().note_device_synchronize(); });
}

int streamalloc_configure(const char* conf) {
  const bool ok = to_last_error([&] {
    Global& g = global();
    std::lock_guard<std::mutex> lock(g.mutex);
    streamalloc::Options options = streamalloc::Options::parse(conf ? conf : "");
    Allocator* current = g.allocator.load(std::memory_order_acquire);
    if (current != nullptr && !current->is_shut_down()) {
      if (options.to_conf_string() == current->options().to_conf_string()) return;  // same settings: fine
      throw Error(ErrorCode::kConfig,
                  "streamalloc: already in use with options '" + current->options().to_conf_string() +
                      "'; configure before the first allocation (or call streamalloc_shutdown() first).");
    }
    // After a shutdown the old allocator stays alive (its live blocks may still be freed, and are
    // refused with a clear error); a new one serves new calls.
    g.options = options;
    g.conf = conf ? conf : "";
    g.configured = true;
    g.allocator.store(nullptr, std::memory_order_release);
  });
  return ok ? 0 : -1;
}

void streamalloc_shutdown(void) {
  to_last_error([&] {
    Allocator* a = global().allocator.load(std::memory_order_acquire);
    if (a != nullptr) a->shutdown();
  });
}

int streamalloc_backend_is_cuda(void) {
  Allocator* a = global().allocator.load(std::memory_order_acquire);
  if (a == nullptr) return -1;
  return a->backend().name() == "cuda" ? 1 : 0;
}

char* streamalloc_stats_json(int device) {
  return string_or_last_error([&] { return instance().stats_json(device); });
}

char* streamalloc_snapshot_json(void) {
  return string_or_last_error([&] { return instance().snapshot_json(); });
}

char* streamalloc_pending_history_json(int device) {
  return string_or_last_error([&] { return instance().pending_history_json(device); });
}

char* streamalloc_block_table(int max_rows) {
  return string_or_last_error([&] {
    const std::size_t rows =
        max_rows < 0 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(max_rows);
    return streamalloc::format_block_report(instance().segments(-1), rows);
  });
}

char* streamalloc_options_json(void) {
  return string_or_last_error([&] {
    nlohmann::json out = nlohmann::json::object();
    const std::string conf = instance().options().to_conf_string();
    std::size_t start = 0;
    while (start < conf.size()) {
      std::size_t end = conf.find(',', start);
      if (end == std::string::npos) end = conf.size();
      const std::string item = conf.substr(start, end - start);
      const std::size_t colon = item.find(':');
      if (colon != std::string::npos) out[item.substr(0, colon)] = item.substr(colon + 1);
      start = end + 1;
    }
    out["backend_in_use"] = instance().backend().name();
    return out.dump();
  });
}

void streamalloc_free_string(char* s) { std::free(s); }

void streamalloc_reset_peak_stats(int device) {
  to_last_error([&] { instance().reset_peak_stats(device); });
}

int streamalloc_validate(void) {
  bool ok = to_last_error([&] {
    try {
      instance().validate();
    } catch (const std::logic_error& e) {
      throw Error(ErrorCode::kBackend, e.what());
    }
  });
  return ok ? 0 : -1;
}

const char* streamalloc_last_error(void) { return t_last_error.c_str(); }

int streamalloc_last_error_code(void) { return t_last_code; }

}  // extern "C"
