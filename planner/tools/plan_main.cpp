// streamalloc_plan: the planner's command-line front end. Plans an event list (written by
// `python -m streamalloc.plan SNAPSHOT --write-events FILE`, or a streamalloc_replay trace) under
// PyTorch's allocator and streamalloc, and prints one row per setting (or the JSON report).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "streamalloc_planner/plan.hpp"

namespace {

const char* kUsage =
    "usage: streamalloc_plan EVENTS [--cap GiB] [--torch-conf CONF] [--conf CONF] [--json]\n"
    "  EVENTS        an event list (#streamalloc-plan v1) or a streamalloc_replay trace\n"
    "  --cap GiB     say whether each setting fits under this many GiB, and where it first fails\n"
    "  --torch-conf  one more PyTorch setting (PYTORCH_CUDA_ALLOC_CONF syntax)\n"
    "  --conf        one more streamalloc setting (STREAMALLOC_CONF syntax)\n"
    "  --json        print the JSON report\n";

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string events_path, torch_conf, conf;
  double cap_gib = 0;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "streamalloc_plan: " << arg << " needs a value\n" << kUsage;
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--cap") {
      std::string v = value();
      char* end = nullptr;
      cap_gib = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || cap_gib <= 0) {
        std::cerr << "streamalloc_plan: --cap expects a positive number of GiB, got '" << v << "'\n";
        return 2;
      }
    } else if (arg == "--torch-conf") {
      torch_conf = value();
    } else if (arg == "--conf") {
      conf = value();
    } else if (arg == "--json") {
      as_json = true;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "streamalloc_plan: unknown option " << arg << "\n" << kUsage;
      return 2;
    } else if (events_path.empty()) {
      events_path = arg;
    } else {
      std::cerr << "streamalloc_plan: more than one event list given\n" << kUsage;
      return 2;
    }
  }
  if (events_path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  try {
    using namespace streamalloc::planner;
    EventList list = load_events(events_path);
    PlanRequest request;
    request.settings = default_settings(torch_conf, conf);
    request.cap_bytes = static_cast<std::size_t>(cap_gib * 1024.0 * 1024.0 * 1024.0);
    request.series_points = as_json ? 400 : 0;
    nlohmann::json report = nlohmann::json::parse(plan_json(list, request));
    if (as_json) {
      std::cout << report.dump(1) << "\n";
      return 0;
    }
    std::printf("%zu events, %zu allocations, %zu streams\n", list.events.size(), list.allocs, list.streams);
    std::printf("%-34s %14s %14s %9s %13s %s\n", "setting", "reserved GiB", "allocated GiB", "res/alloc",
                "device allocs", cap_gib > 0 ? "fits" : "");
    for (const auto& r : report["settings"]) {
      std::string fits;
      if (cap_gib > 0) {
        fits =
            r["fits"].get<bool>() ? "yes" : "no, at event " + std::to_string(r["first_failure"]["event"].get<long>());
      }
      std::printf("%-34s %14s %14s %9.3f %13zu %s\n", r["name"].get<std::string>().c_str(),
                  gib(r["peak_reserved"].get<double>()).c_str(), gib(r["peak_allocated"].get<double>()).c_str(),
                  r["reserved_per_allocated"].get<double>(), r["device_allocs"].get<std::size_t>(), fits.c_str());
    }
    std::printf("recommendation: %s\n", report["recommendation"].get<std::string>().c_str());
  } catch (const std::exception& e) {
    std::cerr << "streamalloc_plan: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
