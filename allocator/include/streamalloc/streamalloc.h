/* streamalloc C ABI.
 *
 * The first seven functions have exactly the signatures torch.cuda.memory.CUDAPluggableAllocator
 * expects, so libstreamalloc.so plugs into PyTorch with nothing but its Python API
 * (docs/pytorch.md). The rest give configuration, statistics and snapshots as JSON, and the
 * per-block stream table as text.
 *
 * No function aborts the process or throws: on failure streamalloc_malloc returns NULL, the others
 * do nothing, and streamalloc_last_error() tells what was wrong on this thread and what to do.
 * The first call configures the allocator from the STREAMALLOC_CONF environment variable unless
 * streamalloc_configure() was called before.
 */
#ifndef STREAMALLOC_STREAMALLOC_H
#define STREAMALLOC_STREAMALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as cudaStream_t, declared without the CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st* streamalloc_stream_t;

#if defined(__GNUC__)
#define STREAMALLOC_API __attribute__((visibility("default")))
#else
#define STREAMALLOC_API
#endif

/* ---- CUDAPluggableAllocator hooks ---- */
/* Memory for `size` bytes, safe for work enqueued on `stream` from now on; NULL on failure
 * (out of memory, bad device, after shutdown) or for size 0. */
STREAMALLOC_API void* streamalloc_malloc(size_t size, int device, streamalloc_stream_t stream);
/* `size` is the requested size (or 0), `stream` the allocation stream. Bad calls (double free,
 * foreign pointer, wrong size or device) change nothing and set the last error. */
STREAMALLOC_API void streamalloc_free(void* ptr, size_t size, int device, streamalloc_stream_t stream);
/* Protect the block at `ptr` from reuse until work already enqueued on `stream` at free time is done. */
STREAMALLOC_API void streamalloc_record_stream(void* ptr, streamalloc_stream_t stream);
STREAMALLOC_API void streamalloc_empty_cache(void);
STREAMALLOC_API void streamalloc_set_memory_fraction(double fraction, int device);
STREAMALLOC_API void streamalloc_init(int device_count);
/* Base address of the segment holding `ptr`; *size receives the segment size. */
STREAMALLOC_API void* streamalloc_base_alloc(void* ptr, size_t* size);

/* ---- configuration and state ---- */
/* Configure from a "key:value,..." string before first use (or after streamalloc_shutdown()). Once
 * configured, the options are fixed: configuring again with the same options is fine, with other
 * options it fails naming each key that differs, until streamalloc_shutdown().
 * Returns 0 on success, -1 with the last error set (unknown key, bad value, other options fixed). */
STREAMALLOC_API int streamalloc_configure(const char* conf);
/* The options `conf` sets on top of `base` (both "key:value,..." strings; NULL or "" = the defaults;
 * keys of `conf` win over those of `base`), resolved by the library's own parser without configuring
 * anything: {"conf": the options as one conf string, "options": {key: value, ...}}. NULL with the last
 * error when a string is bad; the message says the items came from `source` (e.g. "STREAMALLOC_CONF";
 * NULL: "the conf string"). */
STREAMALLOC_API char* streamalloc_resolve_conf(const char* base, const char* conf, const char* source);
/* Release cached memory and refuse later calls with a clear error. Before first use it drops the
 * options streamalloc_configure() set. */
STREAMALLOC_API void streamalloc_shutdown(void);
/* 1 when the allocator is configured and running on the CUDA backend, 0 on the simulated device,
 * -1 before first use. */
STREAMALLOC_API int streamalloc_backend_is_cuda(void);

/* check_sync: synchronization made outside the allocator (the torch plugin forwards PyTorch's GPU
 * trace callbacks here). No-ops unless the allocator runs with check_sync:1. */
STREAMALLOC_API void streamalloc_note_event_record(void* event, streamalloc_stream_t stream);
STREAMALLOC_API void streamalloc_note_event_wait(void* event, streamalloc_stream_t stream);
STREAMALLOC_API void streamalloc_note_stream_synchronize(streamalloc_stream_t stream);
STREAMALLOC_API void streamalloc_note_device_synchronize(void);

/* The strings below are owned by the caller: release them with streamalloc_free_string(). They are
 * NULL on failure, with the last error set. */
STREAMALLOC_API char* streamalloc_stats_json(int device);
/* What streamalloc_stats_json() gives for a device that has served nothing: the same keys, every number
 * zero. Creates nothing (no allocator, no device work), so it can answer before first use. */
STREAMALLOC_API char* streamalloc_zero_stats_json(void);
STREAMALLOC_API char* streamalloc_snapshot_json(void);
/* The last changes of pending bytes per stream of `device` (option pending_history:N), as
 * {"device", "capacity", "recorded", "time_us": [...], "stream": [...], "pending_bytes": [...],
 * "pending_blocks": [...]}; the lists are empty when the option is 0 (the default). */
STREAMALLOC_API char* streamalloc_pending_history_json(int device);
STREAMALLOC_API char* streamalloc_options_json(void);
/* Text for people: the per-block stream table of every device (at most `max_rows` rows, every row when
 * negative), then the pending bytes per allocation stream; what the streamalloc_report tool prints for
 * a saved snapshot. */
STREAMALLOC_API char* streamalloc_block_table(int max_rows);
STREAMALLOC_API void streamalloc_free_string(char* s);
STREAMALLOC_API void streamalloc_reset_peak_stats(int device);
/* Check every invariant; returns 0, or -1 with the last error naming the broken invariant. */
STREAMALLOC_API int streamalloc_validate(void);

/* The last error on the calling thread ("" when the last call succeeded). Valid until the next call
 * on this thread. */
STREAMALLOC_API const char* streamalloc_last_error(void);
/* What streamalloc_last_error_code() returns: the one list of the error numbers. */
typedef enum streamalloc_error_code {
  STREAMALLOC_OK = 0,
  STREAMALLOC_ERROR_OUT_OF_MEMORY = 1,
  STREAMALLOC_ERROR_INVALID_ARGUMENT = 2,
  STREAMALLOC_ERROR_CONFIG = 3, /* unknown option, bad value, other options already fixed */
  STREAMALLOC_ERROR_BACKEND = 4,
  STREAMALLOC_ERROR_SHUTDOWN = 5
} streamalloc_error_code;
STREAMALLOC_API int streamalloc_last_error_code(void);
/* The name of an error code, the enumerator without its prefix in lower case ("ok", "out_of_memory",
 * "invalid_argument", "config", "backend", "shutdown"), for bindings that do not read this header;
 * NULL for a number that is not a code. */
STREAMALLOC_API const char* streamalloc_error_name(int code);

#ifdef __cplusplus
}
#endif

#endif /* STREAMALLOC_STREAMALLOC_H */
