// Allocation traces: the compact text format streamalloc_replay reads (docs/benchmarking.md, "Trace
// format"). bench/replay/convert_snapshot.py writes it from a PyTorch memory snapshot;
// bench/replay/make_synthetic.py writes a synthetic one.
//
//   #streamalloc-trace v1 workload=resnet50 native_peak_reserved=123 native_peak_allocated=45 ...
//   a <id> <size> <stream>     allocate <size> bytes on <stream>; <id> names the block until freed
//   r <id> <stream>            record_stream: <stream> uses block <id>
//   f <id>                     free block <id> (on its allocation stream)
//
// The first line is the header: key=value pairs without spaces. Other lines starting with '#' and blank
// lines are ignored. Ids and streams are non-negative integers; an id may be reused once freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace streamalloc::bench {

struct TraceOp {
  enum class Kind : std::uint8_t { kAlloc, kFree, kRecordStream };
  Kind kind = Kind::kAlloc;
  std::uint32_t slot = 0;    // dense block index: at most `Trace::slots` blocks are live at once
  std::uint32_t stream = 0;  // dense index into Trace::stream_ids (kFree: the allocation stream)
  std::size_t size = 0;      // bytes (kAlloc and kFree: the block's requested size)
};

struct Trace {
  std::map<std::string, std::string> header;  // the header's key=value pairs
  std::vector<TraceOp> ops;
  std::size_t slots = 0;                 // most blocks live at once
  std::vector<std::int64_t> stream_ids;  // the trace's stream ids, in order of first use
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::size_t record_streams = 0;
  std::size_t live_at_end = 0;      // blocks never freed (a truncated recording)
  std::size_t peak_live_bytes = 0;  // most requested bytes live at once

  // A header value as an integer, or -1 when the key is absent.
  std::int64_t header_int(const std::string& key) const;
  std::string header_string(const std::string& key, const std::string& fallback) const;
};

// Read and check a trace. Throws std::runtime_error("PATH:LINE: what is wrong") for a missing or
// malformed header, an unknown op, a bad number, an alloc of a live id, a free or record_stream of an
// id that is not live.
Trace read_trace(const std::string& path);

}  // namespace streamalloc::bench
