// Options: one table drives parsing, setting, describing and serializing every key, so a key's name,
// accepted values, help text and field appear exactly once; the simulated device's settings have a
// table of their own. Options::update() is the one place a conf string is split into items.
#include "streamalloc/options.hpp"

#include <charconv>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "streamalloc/types.hpp"

namespace streamalloc {
namespace {

// ---- enum names: the single list each to_string() and parser reads ----

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

constexpr EnumName<BackendKind> kBackendNames[] = {
    {BackendKind::kAuto, "auto"}, {BackendKind::kCuda, "cuda"}, {BackendKind::kSim, "sim"}};
constexpr EnumName<CrossStreamReuse> kReuseNames[] = {
    {CrossStreamReuse::kNever, "never"}, {CrossStreamReuse::kSettled, "settled"}, {CrossStreamReuse::kWait, "wait"}};
constexpr EnumName<AuditMode> kAuditNames[] = {
    {AuditMode::kOff, "off"}, {AuditMode::kWarn, "warn"}, {AuditMode::kTrace, "trace"}};
constexpr EnumName<PoisonMode> kPoisonNames[] = {
    {PoisonMode::kOff, "off"}, {PoisonMode::kFree, "free"}, {PoisonMode::kAlloc, "alloc"}, {PoisonMode::kBoth, "both"}};
// spdlog's level names, spelled as spdlog::level::from_str accepts them.
constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

template <typename E, std::size_t N>
const char* name_of(const EnumName<E> (&names)[N], E value) {
  for (const auto& entry : names) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

template <typename E, std::size_t N>
bool value_of(const EnumName<E> (&names)[N], std::string_view text, E* out) {
  for (const auto& entry : names) {
    if (text == entry.name) {
      *out = entry.value;
      return true;
    }
  }
  return false;
}

template <typename E, std::size_t N>
std::string join_names(const EnumName<E> (&names)[N]) {
  std::string joined;
  for (const auto& entry : names) {
    if (!joined.empty()) joined += '|';
    joined += entry.name;
  }
  return joined;
}

// ---- value parsers: strict, so a typo is an error rather than a silently different setting ----

// Unsigned decimal only: no sign, no whitespace inside, no suffix, no overflow.
// A switch in PyTorch's spellings (True/False), and 1/0 as the Python bindings spell a bool.
bool parse_switch(std::string_view text, bool* out) {
  if (text == "true" || text == "True" || text == "1") {
    *out = true;
  } else if (text == "false" || text == "False" || text == "0") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

bool parse_unsigned(std::string_view text, std::uint64_t* out) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;  // rejects '+', '-', '0x', '1e3', '10MB'
  }
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

// A count of MB (MiB, as PyTorch's *_mb keys) converted to bytes, rejecting values whose byte count
// does not fit in size_t.
bool parse_mb(std::string_view text, std::size_t* bytes) {
  std::uint64_t mb = 0;
  if (!parse_unsigned(text, &mb) || mb > std::numeric_limits<std::size_t>::max() / MiB) return false;
  *bytes = static_cast<std::size_t>(mb) * MiB;
  return true;
}

// Rounds up so that a byte count set directly in C++ never serializes to a smaller limit.
std::string mb_string(std::size_t bytes) { return std::to_string(bytes / MiB + (bytes % MiB != 0)); }

// Shortest text that parses back to the same double (std::to_chars guarantees the round trip).
std::string double_string(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

bool parse_fraction(std::string_view text, double* out) {
  if (text.empty() || text.front() == '+' || text.front() == '-') return false;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  if (!(value >= 0.0 && value <= 1.0)) return false;  // PyTorch's range; also rejects nan
  *out = value;
  return true;
}

// ---- the table ----

struct OptionSpec {
  const char* key;
  const char* help;
  std::string (*accepted)();                              // for error messages and docs
  bool (*set)(Options& options, std::string_view value);  // false: value not accepted
  std::string (*get)(const Options& options);             // the value as parse() accepts it
};

constexpr std::size_t kMaxSimDevices = 16;
// As PyTorch: the limit must exceed the 20 MiB segments that serve mid-size requests, or a free
// 20 MiB block would count as oversize and could never serve those requests again.
constexpr std::uint64_t kMinMaxSplitMb = 21;
constexpr std::uint64_t kMaxRoundupDivisions = 64;
// 2^24 samples of 32 bytes: 512 MiB per device, far more than a timeline can show.
constexpr std::uint64_t kMaxPendingHistory = std::uint64_t{1} << 24;

const OptionSpec kOptionTable[] = {
    {"backend", "device backend: auto = cuda when a device is present, else the simulated device",
     [] { return join_names(kBackendNames); },
     [](Options& o, std::string_view v) { return value_of(kBackendNames, v, &o.backend); },
     [](const Options& o) -> std::string { return to_string(o.backend); }},
    {"cross_stream_reuse",
     "which free blocks of other streams an allocation may take: never (like PyTorch), settled "
     "(fences completed), wait (also GPU-side waits on fences before growing)",
     [] { return join_names(kReuseNames); },
     [](Options& o, std::string_view v) { return value_of(kReuseNames, v, &o.cross_stream_reuse); },
     [](const Options& o) -> std::string { return to_string(o.cross_stream_reuse); }},
    {"max_split_size_mb", "blocks larger than this many MB are never split; 0 = no limit",
     []() -> std::string {
       return "0 (no limit) or an integer > " + std::to_string(kMinMaxSplitMb - 1) +
              " (MB; as in PyTorch, more than the 20 MB segments of mid-size requests)";
     },
     [](Options& o, std::string_view v) {
       std::size_t bytes = 0;
       if (!parse_mb(v, &bytes) || (bytes != 0 && bytes < kMinMaxSplitMb * MiB)) return false;
       o.max_split_size_bytes = bytes;
       return true;
     },
     [](const Options& o) { return mb_string(o.max_split_size_bytes); }},
    {"roundup_power2_divisions", "round requests up to this many divisions between powers of two; 0 or 1 = off",
     [] { return std::string("0, 1, 2, 4, 8, 16, 32 or 64"); },
     [](Options& o, std::string_view v) {
       std::uint64_t n = 0;
       if (!parse_unsigned(v, &n) || n > kMaxRoundupDivisions || (n & (n - 1)) != 0) return false;
       o.roundup_power2_divisions = static_cast<std::size_t>(n);
       return true;
     },
     [](const Options& o) { return std::to_string(o.roundup_power2_divisions); }},
    {"memory_fraction", "cap on reserved bytes per device, as a fraction of device memory",
     [] { return std::string("a number F with 0 <= F <= 1"); },
     [](Options& o, std::string_view v) { return parse_fraction(v, &o.memory_fraction); },
     [](const Options& o) { return double_string(o.memory_fraction); }},
    {"log_level", "spdlog level of streamalloc's log",
     [] {
       std::string joined;
       for (const char* level : kLogLevels) joined += (joined.empty() ? "" : "|") + std::string(level);
       return joined;
     },
     [](Options& o, std::string_view v) {
       for (const char* level : kLogLevels) {
         if (v == level) {
           o.log_level = level;
           return true;
         }
       }
       return false;
     },
     [](const Options& o) { return o.log_level; }},
    {"audit", "audit of stream usage: redundant or late record_stream, long-pending blocks, OOM holders",
     [] { return join_names(kAuditNames); },
     [](Options& o, std::string_view v) { return value_of(kAuditNames, v, &o.audit); },
     [](const Options& o) -> std::string { return to_string(o.audit); }},
    {"audit_file", "file the audit writes to; unset = stderr",
     [] { return std::string("a non-empty file path without commas (commas separate options)"); },
     [](Options& o, std::string_view v) {
       if (v.empty() || v.find(',') != std::string_view::npos) return false;
       o.audit_file = std::string(v);
       return true;
     },
     [](const Options& o) { return o.audit_file; }},
    {"pending_warn_ms", "audit: warn about blocks pending reuse for longer than this many ms",
     [] { return std::string("an unsigned integer (milliseconds)"); },
     [](Options& o, std::string_view v) {
       std::uint64_t ms = 0;
       if (!parse_unsigned(v, &ms) || ms > std::numeric_limits<std::size_t>::max()) return false;
       o.pending_warn_ms = static_cast<std::size_t>(ms);
       return true;
     },
     [](const Options& o) { return std::to_string(o.pending_warn_ms); }},
    {"poison", "fill blocks with 0xFF in stream order: once truly free (free), when handed out (alloc), or both",
     [] { return join_names(kPoisonNames); },
     [](Options& o, std::string_view v) { return value_of(kPoisonNames, v, &o.poison); },
     [](const Options& o) -> std::string { return to_string(o.poison); }},
    {"quarantine_mb", "delay reuse of this many MB of freed blocks (FIFO) to widen race windows",
     [] { return std::string("an unsigned integer (MB)"); },
     [](Options& o, std::string_view v) { return parse_mb(v, &o.quarantine_bytes); },
     [](const Options& o) { return mb_string(o.quarantine_bytes); }},
    {"check_sync", "warn when record_stream names a stream that has not synchronized with the allocation stream",
     [] { return std::string("0|1|true|false"); },
     [](Options& o, std::string_view v) {
       if (v == "1" || v == "true") {
         o.check_sync = true;
       } else if (v == "0" || v == "false") {
         o.check_sync = false;
       } else {
         return false;
       }
       return true;
     },
     [](const Options& o) -> std::string { return o.check_sync ? "1" : "0"; }},
    {"pending_history", "keep the last N changes of each stream's pending bytes per device, for a timeline (0 = off)",
     [] { return "an unsigned integer <= " + std::to_string(kMaxPendingHistory) + " (samples; 0 = off)"; },
     [](Options& o, std::string_view v) {
       std::uint64_t samples = 0;
       if (!parse_unsigned(v, &samples) || samples > kMaxPendingHistory) return false;
       o.pending_history = static_cast<std::size_t>(samples);
       return true;
     },
     [](const Options& o) { return std::to_string(o.pending_history); }},
    {"expandable_segments",
     "grow one segment per stream and size class in place by mapping pages (PyTorch's expandable_segments); "
     "fixed segments where the device has no virtual memory",
     [] { return std::string("true|false|True|False|1|0"); },
     [](Options& o, std::string_view v) { return parse_switch(v, &o.expandable_segments); },
     [](const Options& o) -> std::string { return o.expandable_segments ? "true" : "false"; }},
    {"expandable_ipc",
     "map each page of an expandable segment's growth as its own physical allocation, so that its blocks can "
     "be sent to another process (CUDA IPC)",
     [] { return std::string("true|false|True|False|1|0"); },
     [](Options& o, std::string_view v) { return parse_switch(v, &o.expandable_ipc); },
     [](const Options& o) -> std::string { return o.expandable_ipc ? "true" : "false"; }},
    {"hot_list_mb",
     "a small miss takes a new segment rather than merge back the stream's hot blocks while its hot list holds "
     "less than this many MB (0 = never)",
     [] { return std::string("an unsigned integer (MB)"); },
     [](Options& o, std::string_view v) { return parse_mb(v, &o.hot_list_bytes); },
     [](const Options& o) { return mb_string(o.hot_list_bytes); }},
};

// Settings of the simulated device: the same syntax sets them (tests, tools and benchmarks run on it),
// but they are not user options, so keys() and describe() list them apart and docs/options.md not at all.
const OptionSpec kSimOptionTable[] = {
    {"sim_memory_mb", "memory per device of the simulated device, in MB",
     [] { return std::string("an integer >= 1 (MB)"); },
     [](Options& o, std::string_view v) {
       std::size_t bytes = 0;
       if (!parse_mb(v, &bytes) || bytes == 0) return false;
       o.sim_memory_bytes = bytes;
       return true;
     },
     [](const Options& o) { return mb_string(o.sim_memory_bytes); }},
    {"sim_devices", "number of devices of the simulated device",
     [] { return "an integer from 1 to " + std::to_string(kMaxSimDevices); },
     [](Options& o, std::string_view v) {
       std::uint64_t n = 0;
       if (!parse_unsigned(v, &n) || n < 1 || n > kMaxSimDevices) return false;
       o.sim_devices = static_cast<int>(n);
       return true;
     },
     [](const Options& o) { return std::to_string(o.sim_devices); }},
};

template <std::size_t N>
const OptionSpec* find_in(const OptionSpec (&table)[N], std::string_view key) {
  for (const auto& spec : table) {
    if (key == spec.key) return &spec;
  }
  return nullptr;
}

const OptionSpec* find_option(std::string_view key) {
  const OptionSpec* spec = find_in(kOptionTable, key);
  return spec != nullptr ? spec : find_in(kSimOptionTable, key);
}

template <std::size_t N>
std::string join_keys(const OptionSpec (&table)[N]) {
  std::string joined;
  for (const auto& spec : table) {
    if (!joined.empty()) joined += ", ";
    joined += spec.key;
  }
  return joined;
}

std::string known_keys() { return join_keys(kOptionTable) + " (simulated device: " + join_keys(kSimOptionTable) + ")"; }

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  const auto first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(kSpace);
  return text.substr(first, last - first + 1);
}

// " in SOURCE" for messages; "" when there is no source (one key set from code).
std::string in_source(std::string_view source) { return source.empty() ? std::string() : " in " + std::string(source); }

void set_option(Options& options, std::string_view key, std::string_view value, std::string_view source) {
  const OptionSpec* spec = find_option(key);
  if (spec == nullptr) {
    throw Error(ErrorCode::kConfig, "streamalloc: unknown option '" + std::string(key) + "'" + in_source(source) +
                                        "; known options: " + known_keys());
  }
  Options updated = options;  // a rejected value leaves the options unchanged
  if (!spec->set(updated, value)) {
    throw Error(ErrorCode::kConfig, "streamalloc: bad value '" + std::string(value) + "' for option '" + spec->key +
                                        "'; accepted: " + spec->accepted());
  }
  options = std::move(updated);
}

template <std::size_t N>
void append_items(const OptionSpec (&table)[N], const Options& options, const Options* skip_if_equal_to,
                  std::vector<std::pair<std::string, std::string>>& out) {
  for (const auto& spec : table) {
    std::string value = spec.get(options);
    if (value.empty()) continue;  // only audit_file can be empty, and empty is its default
    if (skip_if_equal_to != nullptr && value == spec.get(*skip_if_equal_to)) continue;
    out.emplace_back(spec.key, std::move(value));
  }
}

}  // namespace

std::string conf_from_environment() {
  const char* conf = std::getenv(kConfVariable);
  return conf != nullptr ? conf : "";
}

const char* to_string(BackendKind kind) { return name_of(kBackendNames, kind); }
const char* to_string(CrossStreamReuse policy) { return name_of(kReuseNames, policy); }
const char* to_string(AuditMode mode) { return name_of(kAuditNames, mode); }
const char* to_string(PoisonMode mode) { return name_of(kPoisonNames, mode); }

Options Options::parse(std::string_view conf, std::string_view source) {
  Options options;
  options.update(conf, source);
  return options;
}

Options Options::resolve(std::string_view base, std::string_view conf, std::string_view source) {
  Options options = parse(base, source);
  options.update(conf, source);
  return options;
}

void Options::update(std::string_view conf, std::string_view source) {
  Options updated = *this;  // a rejected item leaves the options unchanged
  std::set<std::string, std::less<>> seen;
  std::size_t start = 0;
  while (start <= conf.size()) {
    auto comma = conf.find(',', start);
    if (comma == std::string_view::npos) comma = conf.size();
    const std::string_view item = trim(conf.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) continue;  // empty string, trailing or doubled comma

    const auto colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw Error(ErrorCode::kConfig, "streamalloc: malformed item '" + std::string(item) + "'" + in_source(source) +
                                          ": expected key:value, e.g. audit:warn");
    }
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = trim(item.substr(colon + 1));
    if (key.empty()) {
      throw Error(ErrorCode::kConfig, "streamalloc: malformed item '" + std::string(item) + "'" + in_source(source) +
                                          ": empty key before ':'; known options: " + known_keys());
    }
    if (!seen.insert(std::string(key)).second) {
      throw Error(ErrorCode::kConfig, "streamalloc: option '" + std::string(key) + "' given twice" + in_source(source) +
                                          "; give each option once");
    }
    set_option(updated, key, value, source);
  }
  *this = std::move(updated);
}

void Options::set(std::string_view key, std::string_view value) { set_option(*this, trim(key), trim(value), ""); }

std::string Options::describe() const {
  std::string text;
  for (const auto& spec : kOptionTable) {
    const std::string value = spec.get(*this);
    text += spec.key;
    text += ": ";
    text += value.empty() ? "\"\"" : value;
    text += "  # ";
    text += spec.help;
    text += '\n';
  }
  return text;
}

std::vector<std::pair<std::string, std::string>> Options::items() const {
  std::vector<std::pair<std::string, std::string>> result;
  append_items(kOptionTable, *this, nullptr, result);
  const Options defaults;
  append_items(kSimOptionTable, *this, &defaults, result);
  return result;
}

std::string Options::to_conf_string() const {
  std::string conf;
  for (const auto& [key, value] : items()) {
    if (!conf.empty()) conf += ',';
    conf += key;
    conf += ':';
    conf += value;
  }
  return conf;
}

std::string Options::to_json() const {
  nlohmann::json options = nlohmann::json::object();
  for (const auto& [key, value] : items()) options[key] = value;
  return nlohmann::json{{"conf", to_conf_string()}, {"options", options}}.dump();
}

std::vector<std::pair<std::string, std::string>> Options::keys(OptionGroup group) {
  std::vector<std::pair<std::string, std::string>> result;
  if (group == OptionGroup::kUser) {
    for (const auto& spec : kOptionTable) result.emplace_back(spec.key, spec.help);
  } else {
    for (const auto& spec : kSimOptionTable) result.emplace_back(spec.key, spec.help);
  }
  return result;
}

void require_same_options(const Options& fixed, const Options& asked) {
  // Every key of both groups, defaults included, so that a key left out of one string still counts.
  std::string differences;
  auto compare = [&](const OptionSpec& spec) {
    const std::string before = spec.get(fixed);
    const std::string after = spec.get(asked);
    if (before == after) return;
    if (!differences.empty()) differences += "; ";
    differences += std::string(spec.key) + ": '" + before + "' in use, '" + after + "' asked";
  };
  for (const auto& spec : kOptionTable) compare(spec);
  for (const auto& spec : kSimOptionTable) compare(spec);
  if (differences.empty()) return;
  throw Error(ErrorCode::kConfig, "streamalloc: already configured with other options (" + differences +
                                      "). The options are fixed for the life of the allocator: set them "
                                      "once, or again with the same options.");
}

}  // namespace streamalloc
