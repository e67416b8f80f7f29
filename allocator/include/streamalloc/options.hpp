// Options: every tunable of streamalloc, parsed from one string with the syntax of
// PYTORCH_CUDA_ALLOC_CONF ("key:value,key:value"). The same keys are the keyword arguments of
// streamalloc.enable() and the fields below. Policy code receives an immutable Options and never
// reads the environment: only the entry points (the C ABI at first use, torch::install_from_env())
// call conf_from_environment().
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace streamalloc {

// The environment variable the entry points read, and its conf string ("" when unset).
inline constexpr const char* kConfVariable = "STREAMALLOC_CONF";
std::string conf_from_environment();

enum class BackendKind { kAuto, kCuda, kSim };

// PyTorch's roundup_power2_divisions table: the number of divisions for each power-of-two interval of
// request sizes, [1 MiB, 2 MiB) first (smaller requests use it too) to [32 GiB, 64 GiB) last (larger
// requests use it too). 0 or 1: 512-byte multiples. Allocator::set_roundup_power2_divisions takes it.
inline constexpr std::size_t kRoundupIntervals = 16;
using RoundupDivisions = std::array<std::size_t, kRoundupIntervals>;

// The user options (docs/options.md) and the simulated device's settings, which the same string can
// set (tests and tools use them) but which are not user options: keys() and describe() list a group.
enum class OptionGroup { kUser, kSimulator };

// Which free blocks of other streams an allocation may take (docs/design.md, "Stream rules", rule 5).
enum class CrossStreamReuse {
  kNever,    // like PyTorch's native allocator: only blocks last used on the requesting stream
  kSettled,  // also blocks whose every fence has completed: no new dependency between streams
  kWait,     // also, before growing past the device, blocks made safe by a GPU-side wait on a fence
};

enum class AuditMode { kOff, kWarn, kTrace };
enum class PoisonMode { kOff, kFree, kAlloc, kBoth };

struct Options {
  BackendKind backend = BackendKind::kAuto;
  CrossStreamReuse cross_stream_reuse = CrossStreamReuse::kSettled;
  // Blocks larger than this are never split (0 = no limit), as in PyTorch.
  std::size_t max_split_size_bytes = 0;
  // Round requests to this many divisions between powers of two (0 or 1 = off), as in PyTorch.
  std::size_t roundup_power2_divisions = 0;
  // Cap on reserved bytes per device, as a fraction of device memory.
  double memory_fraction = 1.0;
  // spdlog level name: trace, debug, info, warn, error, critical, off.
  std::string log_level = "warn";
  // Audit of stream usage (record_stream misuse, long-pending blocks, OOM holders).
  AuditMode audit = AuditMode::kOff;
  std::string audit_file;                // empty = stderr
  std::size_t pending_warn_ms = 1000;    // audit: warn about blocks pending longer than this
  PoisonMode poison = PoisonMode::kOff;  // fill with 0xFF once truly free / when handed out
  std::size_t quarantine_bytes = 0;      // delay reuse of this many freed bytes (FIFO)
  bool check_sync = false;               // happens-before check of record_stream vs waits
  std::size_t pending_history = 0;       // keep the last N changes of pending bytes per stream
  // The default pool grows one segment per (stream, size class) in place by mapping pages, as PyTorch's
  // expandable_segments:True (docs/design.md, "Expandable segments"); fixed segments where the backend
  // has no virtual memory.
  bool expandable_segments = false;
  // Expandable segments map each page of a growth as its own physical allocation, so that a block in
  // one can be sent to another process in PyTorch's format (a run of equal pieces); off, a growth is one
  // physical allocation and sharing such a block is refused at the call.
  bool expandable_ipc = false;
  // While a stream's hot list holds less than this, a small miss takes a new segment rather than merge
  // the stream's own hot blocks back into the free lists (docs/design.md, "The allocation path",
  // step 2): more memory reserved, for sizes that vary more than the cached memory holds. 0 = never.
  std::size_t hot_list_bytes = 0;
  // Simulated device (backend:sim) only: OptionGroup::kSimulator.
  std::size_t sim_memory_bytes = 4ull << 30;
  int sim_devices = 1;

  // Parse "key:value,key:value" on top of the defaults. Whitespace around keys and values is ignored;
  // an empty string gives the defaults. Throws Error(kConfig) naming the key and accepted values, and
  // `source`, where the string came from ("STREAMALLOC_CONF", "--conf", ...).
  static Options parse(std::string_view conf, std::string_view source = "the conf string");
  // The options `conf` sets on top of those `base` sets (its keys win), as the bindings resolve a conf
  // string and then keyword arguments (streamalloc_resolve_conf(), the extension's resolve_conf()).
  static Options resolve(std::string_view base, std::string_view conf, std::string_view source);
  // Apply the items of `conf` on top of these options: its keys win over the current values (a key
  // given twice within `conf` is still an error). The only splitter of conf strings in C++.
  void update(std::string_view conf, std::string_view source);
  // Apply one key/value pair.
  void set(std::string_view key, std::string_view value);
  // The resolved user options, one "key: value  # help" line each, in table order.
  std::string describe() const;
  // The resolved options as key/value pairs, as parse() accepts them: every user option in table order,
  // then the simulator settings that differ from their defaults.
  std::vector<std::pair<std::string, std::string>> items() const;
  // items() as a conf string that parse() accepts.
  std::string to_conf_string() const;
  // {"conf": to_conf_string(), "options": {key: value, ...} of items()}, for the bindings (the C ABI's
  // streamalloc_resolve_conf(), the Python extension's resolve_conf()).
  std::string to_json() const;
  // Every key of `group` with its help text, in table order.
  static std::vector<std::pair<std::string, std::string>> keys(OptionGroup group = OptionGroup::kUser);
};

// "Same options or refuse", the rule of every entry point that fixes the options of a process-wide
// allocator (streamalloc_configure(), torch::install(), and through them streamalloc.enable()):
// returns when `asked` resolves to the same options as `fixed`, else throws Error(kConfig) naming each
// key that differs.
void require_same_options(const Options& fixed, const Options& asked);

const char* to_string(BackendKind kind);
const char* to_string(CrossStreamReuse policy);
const char* to_string(AuditMode mode);
const char* to_string(PoisonMode mode);

}  // namespace streamalloc
