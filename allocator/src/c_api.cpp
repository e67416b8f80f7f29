// The C ABI (streamalloc.h): one process-wide Allocator behind extern "C" hooks. Errors never escape
// a hook: they are stored per thread (streamalloc_last_error) and logged.
#include "streamalloc/streamalloc.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "logging.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/report.hpp"

namespace {

using streamalloc::Allocator;
using streamalloc::Error;
using streamalloc::ErrorCode;

// The allocator every hook uses, null until the first call creates it. At namespace scope, constant
// initialised and trivially destroyed: each hook reads it with one load, where a function-local static
// adds a guard test and a call. The allocator itself is never destroyed: PyTorch frees tensors during
// static destruction at exit, after which a destroyed allocator would be a use-after-free.
std::atomic<Allocator*> g_allocator{nullptr};

// What creating, configuring and shutting down the allocator share, under `mutex`. Never destroyed,
// like the allocator.
struct Global {
  std::mutex mutex;
  // Set by streamalloc_configure() for the next allocator; unset: STREAMALLOC_CONF at first use.
  std::optional<streamalloc::Options> configured;
};

Global& global() {
  static Global* g = new Global;
  return *g;
}

thread_local std::string t_last_error;
// Read by every hook: the initial-exec model turns the read into one load instead of a call to
// __tls_get_addr (a few bytes of the static TLS that dlopen'ed libraries may use).
thread_local int t_last_code __attribute__((tls_model("initial-exec"))) = 0;

// The numbers are the header's (streamalloc_error_code); this maps the C++ codes onto them.
streamalloc_error_code code_number(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOutOfMemory: return STREAMALLOC_ERROR_OUT_OF_MEMORY;
    case ErrorCode::kInvalidArgument: return STREAMALLOC_ERROR_INVALID_ARGUMENT;
    case ErrorCode::kConfig: return STREAMALLOC_ERROR_CONFIG;
    case ErrorCode::kBackend: return STREAMALLOC_ERROR_BACKEND;
    case ErrorCode::kShutdown: return STREAMALLOC_ERROR_SHUTDOWN;
  }
  return STREAMALLOC_ERROR_BACKEND;
}

void set_error(streamalloc_error_code code, const std::string& message) {
  t_last_code = code;
  t_last_error = message;
  streamalloc::log().error("{}", streamalloc::without_prefix(message));
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
      t_last_code = STREAMALLOC_ERROR_OUT_OF_MEMORY;
      t_last_error = e.what();
      streamalloc::log().info("{}", streamalloc::without_prefix(e.what()));
    } else {
      set_error(code_number(e.code()), e.what());
    }
  } catch (const std::exception& e) {
    set_error(STREAMALLOC_ERROR_BACKEND, std::string("streamalloc: internal error: ") + e.what());
  } catch (...) {
    set_error(STREAMALLOC_ERROR_BACKEND, "streamalloc: internal error (unknown exception)");
  }
  return false;
}

// The first call of the process: creates the allocator, under the global mutex.
[[gnu::noinline, gnu::cold]] Allocator& create_instance() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mutex);
  Allocator* a = g_allocator.load(std::memory_order_relaxed);
  if (a != nullptr) return *a;  // another thread created it meanwhile
  // The C ABI's one read of the environment, at the top of the stack, never by policy code.
  const streamalloc::Options options =
      g.configured ? *g.configured
                   : streamalloc::Options::parse(streamalloc::conf_from_environment(), streamalloc::kConfVariable);
  a = new Allocator(options, streamalloc::make_backend(options));
  g_allocator.store(a, std::memory_order_release);
  g.configured.reset();
  return *a;
}

// Every hook's first step: one load once the allocator exists, the rest out of line.
Allocator& instance() {
  Allocator* a = g_allocator.load(std::memory_order_acquire);
  return a != nullptr ? *a : create_instance();
}

streamalloc::Stream to_stream(streamalloc_stream_t stream) { return reinterpret_cast<streamalloc::Stream>(stream); }

// `tried_cached`: the caller's allocate_cached / deallocate_cached missed, and is not tried again.
[[gnu::noinline]] void* malloc_with_errors(size_t size, int device, streamalloc_stream_t stream, bool tried_cached) {
  void* ptr = nullptr;
  to_last_error([&] {
    Allocator& a = instance();
    ptr = tried_cached ? a.allocate_after_miss(size, device, to_stream(stream))
                       : a.allocate(size, device, to_stream(stream));
  });
  return ptr;
}

[[gnu::noinline]] void free_with_errors(void* ptr, size_t size, int device, streamalloc_stream_t stream,
                                        bool tried_cached) {
  to_last_error([&] {
    Allocator& a = instance();
    if (tried_cached) {
      a.deallocate_after_miss(ptr, size, device, to_stream(stream));
    } else {
      a.deallocate(ptr, size, device, to_stream(stream));
    }
  });
}

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

// The common case of malloc and free needs no frame for exceptions: with no earlier error to clear,
// a block from (or back to) the stream's hot list is the whole call, and the Allocator's cached path
// never throws. Everything else goes the full way, errors caught.
void* streamalloc_malloc(size_t size, int device, streamalloc_stream_t stream) {
  Allocator* a = g_allocator.load(std::memory_order_acquire);
  const bool tried_cached = a != nullptr && t_last_code == 0;
  if (tried_cached) {
    if (void* ptr = a->allocate_cached(size, device, to_stream(stream))) return ptr;
  }
  return malloc_with_errors(size, device, stream, tried_cached);
}

void streamalloc_free(void* ptr, size_t size, int device, streamalloc_stream_t stream) {
  Allocator* a = g_allocator.load(std::memory_order_acquire);
  const bool tried_cached = a != nullptr && t_last_code == 0;
  if (tried_cached && a->deallocate_cached(ptr, size, device, to_stream(stream))) return;
  free_with_errors(ptr, size, device, stream, tried_cached);
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
    const streamalloc::Options options =
        streamalloc::Options::parse(conf ? conf : "", "the string passed to streamalloc_configure()");
    // Options in use, or set by an earlier call and waiting for first use, are fixed until a shutdown.
    Allocator* current = g_allocator.load(std::memory_order_acquire);
    if (current != nullptr && !current->is_shut_down()) {
      streamalloc::require_same_options(current->options(), options);
      return;
    }
    if (current == nullptr && g.configured) {
      streamalloc::require_same_options(*g.configured, options);
      return;
    }
    // After a shutdown the old allocator stays alive (its live blocks may still be freed, and are
    // refused with a clear error); a new one serves new calls.
    g.configured = options;
    g_allocator.store(nullptr, std::memory_order_release);
  });
  return ok ? 0 : -1;
}

char* streamalloc_resolve_conf(const char* base, const char* conf, const char* source) {
  return string_or_last_error([&] {
    return streamalloc::Options::resolve(base ? base : "", conf ? conf : "", source ? source : "the conf string")
        .to_json();
  });
}

void streamalloc_shutdown(void) {
  to_last_error([&] {
    Global& g = global();
    std::lock_guard<std::mutex> lock(g.mutex);
    Allocator* a = g_allocator.load(std::memory_order_acquire);
    if (a != nullptr) a->shutdown();
    g.configured.reset();
  });
}

int streamalloc_backend_is_cuda(void) {
  Allocator* a = g_allocator.load(std::memory_order_acquire);
  if (a == nullptr) return -1;
  return a->backend().name() == "cuda" ? 1 : 0;
}

char* streamalloc_stats_json(int device) {
  return string_or_last_error([&] { return instance().stats_json(device); });
}

char* streamalloc_zero_stats_json(void) {
  return string_or_last_error([] { return streamalloc::DeviceStats{}.to_json(); });
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
    for (const auto& [key, value] : instance().options().items()) out[key] = value;
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

const char* streamalloc_error_name(int code) {
  switch (code) {
    case STREAMALLOC_OK: return "ok";
    case STREAMALLOC_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    case STREAMALLOC_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case STREAMALLOC_ERROR_CONFIG: return "config";
    case STREAMALLOC_ERROR_BACKEND: return "backend";
    case STREAMALLOC_ERROR_SHUTDOWN: return "shutdown";
    default: return nullptr;
  }
}

}  // extern "C"
