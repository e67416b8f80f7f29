#include "streamalloc_planner/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"
#include "streamalloc_planner/torch_model.hpp"

namespace streamalloc::planner {
namespace {

using nlohmann::json;

// Without a cap the simulated device is this large; it reserves host address space only.
constexpr std::size_t kUncappedDevice = std::size_t{1} << 42;
// The replay clock's reading at the list's time 0 (a `t` line's microseconds count from here).
constexpr std::int64_t kReplayEpochNs = 1'000'000'000;

struct Failure {
  std::size_t event = 0;
  std::size_t alloc = 0;  // 0-based index among the allocations
  std::size_t size = 0;
  std::uint32_t stream = 0;
  std::size_t reserved = 0;
};

struct RunResult {
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  std::size_t device_allocs = 0;
  std::size_t alloc_retries = 0;    // allocations that released cached memory and retried
  std::size_t fence_queries = 0;    // streamalloc: event and stream queries of its fence polls
  std::vector<std::size_t> series;  // max reserved per bucket of `every` events
  std::size_t every = 1;
  bool failed = false;
  Failure failure;
  std::vector<SegmentEvent> segment_events;
};

// Keeps the largest reserved value per bucket of `every` events.
class Series {
 public:
  Series(std::size_t events, std::size_t points) {
    every_ = points == 0 ? events + 1 : std::max<std::size_t>(1, (events + points - 1) / points);
  }
  void add(std::size_t index, std::size_t value) {
    if (every_ > 0 && index / every_ >= values_.size()) values_.push_back(0);
    values_.back() = std::max(values_.back(), value);
  }
  std::size_t every() const { return every_; }
  std::vector<std::size_t> take() { return std::move(values_); }

 private:
  std::size_t every_ = 1;
  std::vector<std::size_t> values_;
};

// One pass through the PyTorch model; with a cap it stops at the first failing allocation.
RunResult run_torch(const EventList& list, const TorchConfig& config, std::size_t cap, std::size_t points,
                    bool segment_events, Completion completion) {
  TorchModel model(config, cap, segment_events);
  model.follow_placements(list.placements);
  // Recorded completion points win; otherwise the request's rule (plan.hpp, Completion).
  const bool complete_at_malloc = !list.explicit_completions && completion == Completion::kNextMalloc;
  Series series(list.events.size(), points);
  RunResult out;
  std::size_t alloc_index = 0;
  for (std::size_t i = 0; i < list.events.size(); ++i) {
    const Event& e = list.events[i];
    model.set_event_index(i);
    switch (e.kind) {
      case Event::Kind::kAlloc:
        if (!model.malloc(e.slot, e.size, e.stream, complete_at_malloc)) {
          out.failed = true;
          out.failure = Failure{i, alloc_index, e.size, e.stream, model.reserved()};
        }
        ++alloc_index;
        break;
      case Event::Kind::kFree: model.free(e.slot); break;
      case Event::Kind::kRecordStream: model.record_stream(e.slot, e.stream); break;
      case Event::Kind::kComplete: model.complete(e.slot); break;
    }
    if (points) series.add(i, model.reserved());
    if (out.failed) break;
  }
  out.peak_reserved = model.peak_reserved();
  out.peak_allocated = model.peak_allocated();
  out.device_allocs = model.device_allocs();
  out.alloc_retries = model.alloc_retries();
  out.every = series.every();
  out.series = series.take();
  if (segment_events) out.segment_events = model.segment_events();
  return out;
}

// One pass through streamalloc's allocator on the simulated device.
//
// When the event list carries completion points (`c` lines: when PyTorch saw the events of a block's
// stream uses complete, which says that the GPU had got past the block's free on those streams), the
// device runs in manual mode: a record_stream enqueues work on the using stream, and at the block's
// `c` line every stream runs exactly as far as it had got when the block was freed (the fences
// streamalloc recorded up to that free complete; later ones wait for a later `c`), so the GPU is as
// far behind the host as it was in the job. Every stream, not only the block's: one GPU ran them all,
// and a stream whose blocks are never used elsewhere has no completion points of its own. Without
// them the device is eager (always idle) and pending blocks settle at the next allocation, as the
// PyTorch model does.
//
// With `t` lines the allocator runs on the job's clock (SimBackend's replay clock, set before each
// event): its fence passes and polls fall where they fell in the job, and it finds the completed
// fences itself. Without them the allocator's clock is the host's, far faster than the job, so the
// fences are processed at the `c` lines instead. Either way a plan is the same on every run.
RunResult run_streamalloc(const EventList& list, const std::string& conf, std::size_t cap, std::size_t points) {
  Options options = Options::parse(conf, "the streamalloc setting");
  options.backend = BackendKind::kSim;
  SimBackend::Config sim;
  sim.memory_per_device = cap != 0 ? cap : kUncappedDevice;
  sim.address_space_per_device = std::max<std::size_t>(sim.memory_per_device * 4, std::size_t{1} << 40);
  const bool manual = list.explicit_completions;
  sim.mode = manual ? SimBackend::Mode::kManual : SimBackend::Mode::kEager;
  sim.replay_clock = list.timed;
  sim.fixed_addresses = true;  // a plan is the same on every run
  auto backend = std::make_shared<SimBackend>(sim);
  options.sim_memory_bytes = sim.memory_per_device;
  RunResult out;
  Series series(list.events.size(), points);
  {
    Allocator allocator(options, backend);
    std::vector<Stream> streams;
    for (std::size_t s = 0; s < list.streams; ++s) streams.push_back(backend->create_stream(0));
    // In manual mode every stream always has work queued: an idle stream would let the allocator
    // release a batch without a fence whenever its poll happens to look. ran[s]: items stream s has
    // run; marks[slot]: (stream, items queued on it up to the block's free).
    std::vector<std::size_t> ran(list.streams, 0);
    std::vector<std::vector<std::pair<std::uint32_t, std::size_t>>> marks(list.slots);
    auto run_to = [&](std::uint32_t s, std::size_t mark) {
      if (mark > ran[s]) ran[s] += backend->advance(0, streams[s], mark - ran[s]);
      if (backend->queued_items(0, streams[s]) == 0) backend->enqueue(0, streams[s], [] {});
    };
    if (manual) {
      for (Stream stream : streams) backend->enqueue(0, stream, [] {});
    }
    struct Live {
      void* ptr = nullptr;
      std::size_t size = 0;
      std::uint32_t stream = 0;
      bool used_elsewhere = false;
    };
    std::vector<Live> slots(list.slots);
    std::vector<std::vector<std::uint32_t>> uses(list.slots);  // streams recorded on, until the `c` line
    bool frees_pending = false;
    std::size_t alloc_index = 0;
    for (std::size_t i = 0; i < list.events.size(); ++i) {
      const Event& e = list.events[i];
      if (list.timed) backend->set_time(kReplayEpochNs + static_cast<std::int64_t>(e.time_us) * 1000);
      switch (e.kind) {
        case Event::Kind::kAlloc:
          if (frees_pending && !manual) {
            allocator.process_fences();
            frees_pending = false;
          }
          try {
            void* ptr = allocator.allocate(std::max<std::size_t>(e.size, 1), 0, streams[e.stream]);
            slots[e.slot] = Live{ptr, std::max<std::size_t>(e.size, 1), e.stream, false};
          } catch (const Error& error) {
            if (error.code() != ErrorCode::kOutOfMemory) throw;
            out.failed = true;
            DeviceStats stats = allocator.stats(0);
            out.failure =
                Failure{i, alloc_index, e.size, e.stream, static_cast<std::size_t>(stats.reserved_bytes[0].current)};
          }
          ++alloc_index;
          break;
        case Event::Kind::kFree: {
          Live& live = slots[e.slot];
          if (live.ptr) allocator.deallocate(live.ptr, live.size, 0, streams[live.stream]);
          if (manual && !uses[e.slot].empty()) {
            // After the free: a fence the free recorded is behind the block's last use. Every stream is
            // marked: one GPU ran them all, and the completion says how far behind the host it was.
            marks[e.slot].clear();
            for (std::uint32_t s = 0; s < list.streams; ++s)
              marks[e.slot].emplace_back(s, ran[s] + backend->queued_items(0, streams[s]));
          }
          frees_pending = frees_pending || live.used_elsewhere;
          live = Live{};
          break;
        }
        case Event::Kind::kRecordStream: {
          Live& live = slots[e.slot];
          if (live.ptr && e.stream != live.stream) {
            allocator.record_stream(live.ptr, streams[e.stream]);
            live.used_elsewhere = true;
            if (manual) {
              backend->enqueue(0, streams[e.stream], [] {});  // the use: keeps the stream busy until `c`
              uses[e.slot].push_back(e.stream);
            }
          }
          break;
        }
        case Event::Kind::kComplete:
          if (manual && !uses[e.slot].empty()) {
            // The events on the using streams completed, and the allocation stream had got as far.
            for (auto [s, mark] : marks[e.slot]) run_to(s, mark);
            uses[e.slot].clear();
            marks[e.slot].clear();
            if (!list.timed) allocator.process_fences();
          }
          break;
      }
      if (points) series.add(i, static_cast<std::size_t>(allocator.stats(0).reserved_bytes[0].current));
      if (out.failed) break;
    }
    DeviceStats stats = allocator.stats(0);
    out.peak_reserved = static_cast<std::size_t>(stats.reserved_bytes[0].peak);
    out.peak_allocated = static_cast<std::size_t>(stats.allocated_bytes[0].peak);
    out.device_allocs = static_cast<std::size_t>(stats.num_device_alloc);
    out.alloc_retries = static_cast<std::size_t>(stats.num_alloc_retries);
    out.fence_queries = static_cast<std::size_t>(stats.fences_polled);
    for (Live& live : slots) {
      if (live.ptr) allocator.deallocate(live.ptr, live.size, 0, streams[live.stream]);
    }
    allocator.synchronize_fences();
    backend->synchronize_all();
  }
  out.every = series.every();
  out.series = series.take();
  return out;
}

std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string recommend(const json& results, std::size_t cap) {
  const json* best = nullptr;
  const json* baseline = nullptr;
  for (const json& r : results) {
    if (!baseline && r["allocator"] == "pytorch" && r["conf"] == "") baseline = &r;
    if (cap != 0 && !r["fits"].get<bool>()) continue;
    if (!best || r["peak_reserved"].get<std::size_t>() < (*best)["peak_reserved"].get<std::size_t>()) best = &r;
  }
  if (!best) {
    const json* smallest = nullptr;
    for (const json& r : results) {
      if (!smallest || r["peak_reserved"].get<std::size_t>() < (*smallest)["peak_reserved"].get<std::size_t>()) {
        smallest = &r;
      }
    }
    if (!smallest) return "no settings were planned";
    return "no setting fits under " + gib(cap) + "; the smallest peak reserved is " +
           gib((*smallest)["peak_reserved"].get<std::size_t>()) + " with " + (*smallest)["name"].get<std::string>();
  }
  std::string line = "use " + (*best)["name"].get<std::string>() + ": peak reserved " +
                     gib((*best)["peak_reserved"].get<std::size_t>());
  if (baseline && baseline != best) {
    double base = static_cast<double>((*baseline)["peak_reserved"].get<std::size_t>());
    double mine = static_cast<double>((*best)["peak_reserved"].get<std::size_t>());
    if (base > 0) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " (%.1f%% less than %s)", 100.0 * (base - mine) / base,
                    (*baseline)["name"].get<std::string>().c_str());
      line += buf;
    }
  }
  if (cap != 0) line += ", fits under " + gib(cap);
  return line;
}

}  // namespace

std::vector<Setting> default_settings(const std::string& torch_conf, const std::string& streamalloc_conf) {
  std::vector<Setting> out = {
      {"pytorch", "pytorch", ""},
      {"pytorch expandable", "pytorch", "expandable_segments:True"},
  };
  if (!torch_conf.empty()) out.push_back({"pytorch " + torch_conf, "pytorch", torch_conf});
  out.push_back({"streamalloc", "streamalloc", ""});
  out.push_back({"streamalloc expandable", "streamalloc", "expandable_segments:true"});
  if (!streamalloc_conf.empty()) out.push_back({"streamalloc " + streamalloc_conf, "streamalloc", streamalloc_conf});
  return out;
}

PlanRequest parse_request(const std::string& text) {
  PlanRequest request;
  if (text.empty()) {
    request.settings = default_settings();
    return request;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("plan request: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("plan request: expected a JSON object");
  try {
    request.cap_bytes = j.value("cap_bytes", std::size_t{0});
    request.series_points = j.value("series_points", request.series_points);
    request.segment_events = j.value("segment_events", false);
    std::string completion = j.value("completion", std::string("next_malloc"));
    if (completion == "next_malloc") {
      request.completion = Completion::kNextMalloc;
    } else if (completion == "out_of_memory") {
      request.completion = Completion::kOutOfMemory;
    } else {
      throw std::invalid_argument("plan request: completion '" + completion +
                                  "' (expected next_malloc or out_of_memory)");
    }
    if (j.contains("settings")) {
      for (const json& s : j["settings"]) {
        Setting setting{s.value("name", std::string()), s.value("allocator", std::string()),
                        s.value("conf", std::string())};
        if (setting.allocator != "pytorch" && setting.allocator != "streamalloc") {
          throw std::invalid_argument("plan request: setting '" + setting.name + "' has allocator '" +
                                      setting.allocator + "' (expected pytorch or streamalloc)");
        }
        if (setting.name.empty()) setting.name = setting.allocator + (setting.conf.empty() ? "" : " " + setting.conf);
        request.settings.push_back(setting);
      }
    } else {
      request.settings = default_settings();
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("plan request: ") + e.what());
  }
  return request;
}

std::string plan_json(const EventList& events, const PlanRequest& request) {
  if (events.allocs == 0) throw std::invalid_argument("the event list has no allocations");
  std::vector<Setting> settings = request.settings.empty() ? default_settings() : request.settings;
  // Check every setting before running any, so a bad one fails fast.
  std::vector<TorchConfig> torch_configs(settings.size());
  for (std::size_t k = 0; k < settings.size(); ++k) {
    if (settings[k].allocator == "pytorch") {
      torch_configs[k] = TorchConfig::parse(settings[k].conf);
    } else {
      try {
        Options::parse(settings[k].conf, "the streamalloc setting");
      } catch (const Error& e) {
        throw std::invalid_argument(e.what());
      }
    }
  }
  json results = json::array();
  for (std::size_t k = 0; k < settings.size(); ++k) {
    const Setting& s = settings[k];
    bool torch = s.allocator == "pytorch";
    RunResult full = torch ? run_torch(events, torch_configs[k], 0, request.series_points, request.segment_events,
                                       request.completion)
                           : run_streamalloc(events, s.conf, 0, request.series_points);
    json r;
    r["name"] = s.name;
    r["allocator"] = s.allocator;
    r["conf"] = s.conf;
    r["peak_reserved"] = full.peak_reserved;
    r["peak_allocated"] = full.peak_allocated;
    r["reserved_per_allocated"] =
        full.peak_allocated ? static_cast<double>(full.peak_reserved) / static_cast<double>(full.peak_allocated) : 0.0;
    r["device_allocs"] = full.device_allocs;
    if (!torch) r["fence_queries"] = full.fence_queries;
    r["first_failure"] = nullptr;
    r["alloc_retries_under_cap"] = 0;
    if (request.cap_bytes != 0) {
      bool fits = full.peak_reserved <= request.cap_bytes;
      if (!fits) {
        // Under the cap the allocator releases cached memory and retries before failing: a second
        // pass with the cap says whether and where it fails.
        RunResult capped = torch ? run_torch(events, torch_configs[k], request.cap_bytes, 0, false, request.completion)
                                 : run_streamalloc(events, s.conf, request.cap_bytes, 0);
        fits = !capped.failed;
        r["alloc_retries_under_cap"] = capped.alloc_retries;
        if (capped.failed) {
          r["first_failure"] = {{"event", capped.failure.event},
                                {"alloc", capped.failure.alloc},
                                {"size", capped.failure.size},
                                {"stream", capped.failure.stream},
                                {"reserved", capped.failure.reserved}};
        }
      }
      r["fits"] = fits;
    } else {
      r["fits"] = nullptr;
    }
    r["series"] = {{"every", full.every}, {"reserved", full.series}};
    if (request.segment_events && torch) {
      json list = json::array();
      for (const SegmentEvent& e : full.segment_events) {
        list.push_back(json::array({e.event, std::string(1, e.action), e.size, e.stream}));
      }
      r["segment_events"] = std::move(list);
    }
    results.push_back(std::move(r));
  }
  json out;
  out["events"] = events.events.size();
  out["allocs"] = events.allocs;
  out["streams"] = events.streams;
  out["cap_bytes"] = request.cap_bytes;
  out["recommendation"] = recommend(results, request.cap_bytes);
  out["settings"] = std::move(results);
  return out.dump();
}

}  // namespace streamalloc::planner
