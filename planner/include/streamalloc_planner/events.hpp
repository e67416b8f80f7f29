// The event list the planner replays: allocations, frees and stream uses, in trace order.
//
//   #streamalloc-plan v1 key=value ...   (the first line; "#streamalloc-trace v1" traces are read too)
//   a <id> <size> <stream>    allocate <size> requested bytes on <stream>
//   r <id> <stream>           record_stream: <stream> uses block <id>
//   f <id>                    free block <id> (requested on its allocation stream)
//   c <id>                    the events recorded for block <id>'s stream uses have completed
//   t <microseconds>          the job's clock from here on (never less than the last `t`)
//   d <size> <address>        the recorded run's device gave its allocator a segment of <size> bytes
//                             at <address> here (a snapshot's segment_alloc)
//
// With the header key completions=1 a block freed with stream uses stays pending until its `c` line
// (the position where PyTorch logged free_completed); without it, it completes at the next
// allocation (PyTorch processes completed events at every malloc). Other '#' lines and blank lines
// are ignored. Ids may be reused once freed. `d` lines are not events: they are kept apart, for the
// model of PyTorch's allocator, which places its segments where the recorded device did. With `t`
// lines (a snapshot's time_us) the replay gives streamalloc the job's time, so that its fence passes
// and polls fall where the job's did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace streamalloc::planner {

struct Event {
  enum class Kind : std::uint8_t { kAlloc, kFree, kRecordStream, kComplete };
  Kind kind = Kind::kAlloc;
  std::uint32_t slot = 0;     // dense block index
  std::uint32_t stream = 0;   // dense stream index (kRecordStream: the using stream)
  std::size_t size = 0;       // kAlloc: requested bytes
  std::uint64_t time_us = 0;  // the last `t` before the event (0 without `t` lines)
};

// Where the recorded run's device placed a segment, and before which event.
struct Placement {
  std::size_t event = 0;  // index of the next event
  std::size_t size = 0;
  std::uint64_t address = 0;
};

struct EventList {
  std::map<std::string, std::string> header;
  std::vector<Event> events;
  std::vector<Placement> placements;  // in trace order
  std::size_t slots = 0;              // dense block indices in use
  std::size_t streams = 0;            // dense stream indices in use
  std::size_t allocs = 0;
  bool explicit_completions = false;  // header completions=1
  bool timed = false;                 // the list has `t` lines
};

// Parse the text above. Throws std::runtime_error("events:LINE: what is wrong") for a missing header,
// an unknown op, a bad number, a `t` that runs back, a `d` of size 0, an alloc of a live id, a free/record/complete of
// an unknown id.
EventList parse_events(std::string_view text);
// `source` is a path, or the text itself when it starts with '#'.
EventList load_events(const std::string& source);

}  // namespace streamalloc::planner
