// streamalloc_report: the per-block stream table and the pending bytes per allocation stream of a saved
// snapshot, for programs on the C ABI or in C++ (Python has `python -m streamalloc.report`).
//
//   streamalloc_report SNAPSHOT.json [--rows N]      ("-" reads standard input)
//
// SNAPSHOT.json is what streamalloc_snapshot_json(), Allocator::snapshot_json(), streamalloc.snapshot()
// or streamalloc.dump() wrote, or `streamalloc_demo --snapshot`. Exit status: 0, 1 when the file cannot
// be read or is not a snapshot, 2 for bad arguments.
#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "streamalloc/report.hpp"

namespace {

constexpr std::size_t kDefaultRows = 50;

int usage(const char* argv0, int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: %s SNAPSHOT.json [--rows N]\n"
               "Prints the per-block stream table (at most N rows, default %zu) and the pending bytes per\n"
               "allocation stream of a streamalloc snapshot: the JSON of streamalloc_snapshot_json(),\n"
               "Allocator::snapshot_json(), streamalloc.snapshot() or streamalloc.dump(); - reads standard input.\n",
               argv0, kDefaultRows);
  return status;
}

// A whole non-negative decimal number, or false.
bool parse_rows(const char* text, std::size_t* rows) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *rows = static_cast<std::size_t>(value);
  return true;
}

// The whole of `path` ("-": standard input), or false with the reason.
bool read_all(const std::string& path, std::string* text, std::string* error) {
  std::FILE* in = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (in == nullptr) {
    *error = std::strerror(errno);
    return false;
  }
  char buffer[1 << 16];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, in)) > 0;) text->append(buffer, n);
  const bool ok = std::ferror(in) == 0;
  if (!ok) *error = std::strerror(errno);
  if (in != stdin) std::fclose(in);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t rows = kDefaultRows;
  // getopt_long rather than CLI11: the GPU machine's image has no CLI11 and no network to fetch it.
  static const option kOptions[] = {
      {"rows", required_argument, nullptr, 'r'}, {"help", no_argument, nullptr, 'h'}, {nullptr, 0, nullptr, 0}};
  for (int opt; (opt = getopt_long(argc, argv, "r:h", kOptions, nullptr)) != -1;) {
    switch (opt) {
      case 'r':
        if (!parse_rows(optarg, &rows)) {
          std::fprintf(stderr, "streamalloc_report: --rows takes a whole number of rows, not '%s'\n", optarg);
          return usage(argv[0], 2);
        }
        break;
      case 'h': return usage(argv[0], 0);
      default: return usage(argv[0], 2);
    }
  }
  if (argc - optind != 1) {
    std::fprintf(stderr, "streamalloc_report: expected one snapshot file, got %d\n", argc - optind);
    return usage(argv[0], 2);
  }
  const std::string path = argv[optind];

  std::string text;
  std::string error;
  if (!read_all(path, &text, &error)) {
    std::fprintf(stderr, "streamalloc_report: cannot read %s: %s\n", path.c_str(), error.c_str());
    return 1;
  }
  try {
    const std::string report = streamalloc::format_block_report(streamalloc::segments_from_snapshot_json(text), rows);
    std::fputs(report.c_str(), stdout);
  } catch (const streamalloc::Error& e) {
    std::fprintf(stderr, "streamalloc_report: %s: %s\n", path.c_str(), e.what());
    return 1;
  }
  return 0;
}
