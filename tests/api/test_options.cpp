// Options: parsing of STREAMALLOC_CONF, validation messages, describe() and the to_conf_string round
// trip. Every key has good and bad values below; a key added to the table without tests here fails
// OptionsTable.EveryKeyHasGoodAndBadCases.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "streamalloc/options.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {
namespace {

// The message of the Error(kConfig) that `fn` throws; fails the test when it throws nothing else.
std::string config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected Error(kConfig), nothing was thrown";
  return {};
}

void expect_same(const Options& a, const Options& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.cross_stream_reuse, b.cross_stream_reuse);
  EXPECT_EQ(a.max_split_size_bytes, b.max_split_size_bytes);
  EXPECT_EQ(a.roundup_power2_divisions, b.roundup_power2_divisions);
  EXPECT_EQ(a.memory_fraction, b.memory_fraction);  // exact: to_conf_string must not lose digits
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.audit, b.audit);
  EXPECT_EQ(a.audit_file, b.audit_file);
  EXPECT_EQ(a.pending_warn_ms, b.pending_warn_ms);
  EXPECT_EQ(a.poison, b.poison);
  EXPECT_EQ(a.quarantine_bytes, b.quarantine_bytes);
  EXPECT_EQ(a.check_sync, b.check_sync);
  EXPECT_EQ(a.pending_history, b.pending_history);
  EXPECT_EQ(a.expandable_segments, b.expandable_segments);
  EXPECT_EQ(a.expandable_ipc, b.expandable_ipc);
  EXPECT_EQ(a.hot_list_bytes, b.hot_list_bytes);
  EXPECT_EQ(a.sim_memory_bytes, b.sim_memory_bytes);
  EXPECT_EQ(a.sim_devices, b.sim_devices);
}

// ---- good values ----

struct GoodCase {
  const char* key;
  const char* value;
  std::function<bool(const Options&)> holds;
};

void PrintTo(const GoodCase& c, std::ostream* os) { *os << c.key << ':' << c.value; }

class OptionsGoodValue : public ::testing::TestWithParam<GoodCase> {};

TEST_P(OptionsGoodValue, ParseSetsTheField) {
  const GoodCase& c = GetParam();
  const Options parsed = Options::parse(std::string(c.key) + ":" + c.value);
  EXPECT_TRUE(c.holds(parsed)) << c.key << ':' << c.value << "\n" << parsed.describe();
}

TEST_P(OptionsGoodValue, SetSetsTheFieldAndRoundTrips) {
  const GoodCase& c = GetParam();
  Options options;
  options.set(c.key, c.value);
  EXPECT_TRUE(c.holds(options));
  expect_same(Options::parse(options.to_conf_string()), options);
}

const GoodCase kGoodCases[] = {
    {"backend", "auto", [](const Options& o) { return o.backend == BackendKind::kAuto; }},
    {"backend", "cuda", [](const Options& o) { return o.backend == BackendKind::kCuda; }},
    {"backend", "sim", [](const Options& o) { return o.backend == BackendKind::kSim; }},
    {"cross_stream_reuse", "never", [](const Options& o) { return o.cross_stream_reuse == CrossStreamReuse::kNever; }},
    {"cross_stream_reuse", "settled",
     [](const Options& o) { return o.cross_stream_reuse == CrossStreamReuse::kSettled; }},
    {"cross_stream_reuse", "wait", [](const Options& o) { return o.cross_stream_reuse == CrossStreamReuse::kWait; }},
    {"max_split_size_mb", "0", [](const Options& o) { return o.max_split_size_bytes == 0; }},
    {"max_split_size_mb", "21", [](const Options& o) { return o.max_split_size_bytes == 21 * MiB; }},
    {"max_split_size_mb", "512", [](const Options& o) { return o.max_split_size_bytes == 512 * MiB; }},
    {"roundup_power2_divisions", "0", [](const Options& o) { return o.roundup_power2_divisions == 0; }},
    {"roundup_power2_divisions", "1", [](const Options& o) { return o.roundup_power2_divisions == 1; }},
    {"roundup_power2_divisions", "4", [](const Options& o) { return o.roundup_power2_divisions == 4; }},
    {"roundup_power2_divisions", "64", [](const Options& o) { return o.roundup_power2_divisions == 64; }},
    {"memory_fraction", "1", [](const Options& o) { return o.memory_fraction == 1.0; }},
    {"memory_fraction", "0.5", [](const Options& o) { return o.memory_fraction == 0.5; }},
    {"memory_fraction", "0.1", [](const Options& o) { return o.memory_fraction == 0.1; }},
    {"memory_fraction", ".25", [](const Options& o) { return o.memory_fraction == 0.25; }},
    {"memory_fraction", "1e-3", [](const Options& o) { return o.memory_fraction == 1e-3; }},
    {"memory_fraction", "0", [](const Options& o) { return o.memory_fraction == 0.0; }},
    {"memory_fraction", "0.0", [](const Options& o) { return o.memory_fraction == 0.0; }},
    {"log_level", "trace", [](const Options& o) { return o.log_level == "trace"; }},
    {"log_level", "debug", [](const Options& o) { return o.log_level == "debug"; }},
    {"log_level", "info", [](const Options& o) { return o.log_level == "info"; }},
    {"log_level", "warn", [](const Options& o) { return o.log_level == "warn"; }},
    {"log_level", "error", [](const Options& o) { return o.log_level == "error"; }},
    {"log_level", "critical", [](const Options& o) { return o.log_level == "critical"; }},
    {"log_level", "off", [](const Options& o) { return o.log_level == "off"; }},
    {"audit", "off", [](const Options& o) { return o.audit == AuditMode::kOff; }},
    {"audit", "warn", [](const Options& o) { return o.audit == AuditMode::kWarn; }},
    {"audit", "trace", [](const Options& o) { return o.audit == AuditMode::kTrace; }},
    {"audit_file", "/tmp/audit.log", [](const Options& o) { return o.audit_file == "/tmp/audit.log"; }},
    // Only the first ':' separates key and value, so paths with colons (and Windows drives) work.
    {"audit_file", "C:/logs/a:b.txt", [](const Options& o) { return o.audit_file == "C:/logs/a:b.txt"; }},
    {"pending_warn_ms", "0", [](const Options& o) { return o.pending_warn_ms == 0; }},
    {"pending_warn_ms", "250", [](const Options& o) { return o.pending_warn_ms == 250; }},
    {"poison", "off", [](const Options& o) { return o.poison == PoisonMode::kOff; }},
    {"poison", "free", [](const Options& o) { return o.poison == PoisonMode::kFree; }},
    {"poison", "alloc", [](const Options& o) { return o.poison == PoisonMode::kAlloc; }},
    {"poison", "both", [](const Options& o) { return o.poison == PoisonMode::kBoth; }},
    {"quarantine_mb", "0", [](const Options& o) { return o.quarantine_bytes == 0; }},
    {"quarantine_mb", "64", [](const Options& o) { return o.quarantine_bytes == 64 * MiB; }},
    {"check_sync", "1", [](const Options& o) { return o.check_sync; }},
    {"check_sync", "true", [](const Options& o) { return o.check_sync; }},
    {"check_sync", "0", [](const Options& o) { return !o.check_sync; }},
    {"check_sync", "false", [](const Options& o) { return !o.check_sync; }},
    {"pending_history", "0", [](const Options& o) { return o.pending_history == 0; }},
    {"pending_history", "16777216", [](const Options& o) { return o.pending_history == 16777216; }},
    {"expandable_segments", "true", [](const Options& o) { return o.expandable_segments; }},
    {"expandable_segments", "True", [](const Options& o) { return o.expandable_segments; }},
    {"expandable_segments", "1", [](const Options& o) { return o.expandable_segments; }},
    {"expandable_segments", "false", [](const Options& o) { return !o.expandable_segments; }},
    {"expandable_segments", "False", [](const Options& o) { return !o.expandable_segments; }},
    {"expandable_segments", "0", [](const Options& o) { return !o.expandable_segments; }},
    {"expandable_ipc", "true", [](const Options& o) { return o.expandable_ipc; }},
    {"expandable_ipc", "True", [](const Options& o) { return o.expandable_ipc; }},
    {"expandable_ipc", "0", [](const Options& o) { return !o.expandable_ipc; }},
    {"hot_list_mb", "0", [](const Options& o) { return o.hot_list_bytes == 0; }},
    {"hot_list_mb", "32", [](const Options& o) { return o.hot_list_bytes == 32 * MiB; }},
    {"sim_memory_mb", "1", [](const Options& o) { return o.sim_memory_bytes == 1 * MiB; }},
    {"sim_memory_mb", "81920", [](const Options& o) { return o.sim_memory_bytes == 80 * GiB; }},
    {"sim_devices", "1", [](const Options& o) { return o.sim_devices == 1; }},
    {"sim_devices", "16", [](const Options& o) { return o.sim_devices == 16; }},
};

INSTANTIATE_TEST_SUITE_P(Options, OptionsGoodValue, ::testing::ValuesIn(kGoodCases));

// ---- bad values: the message names the key, the value and what is accepted ----

struct BadCase {
  const char* key;
  const char* value;
  const char* accepted;  // must appear in the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.key << ":'" << c.value << "'"; }

class OptionsBadValue : public ::testing::TestWithParam<BadCase> {};

TEST_P(OptionsBadValue, ParseRejectsNamingKeyAndAcceptedValues) {
  const BadCase& c = GetParam();
  const std::string message = config_error([&] { Options::parse(std::string(c.key) + ":" + c.value); });
  EXPECT_NE(message.find("bad value '" + std::string(c.value) + "' for option '" + c.key + "'"), std::string::npos)
      << message;
  const auto accepted = message.find("; accepted: ");
  ASSERT_NE(accepted, std::string::npos) << message;
  EXPECT_NE(message.find(c.accepted, accepted), std::string::npos) << message;
}

TEST_P(OptionsBadValue, SetRejectsAndChangesNothing) {
  const BadCase& c = GetParam();
  Options options = Options::parse("backend:sim,sim_devices:3,audit_file:/tmp/x");
  const Options before = options;
  config_error([&] { options.set(c.key, c.value); });
  expect_same(options, before);
}

const BadCase kBadCases[] = {
    {"backend", "gpu", "auto|cuda|sim"},
    {"backend", "CUDA", "auto|cuda|sim"},
    {"backend", "", "auto|cuda|sim"},
    {"cross_stream_reuse", "sometimes", "never|settled|wait"},
    {"max_split_size_mb", "20", "0 (no limit) or an integer > 20"},
    {"max_split_size_mb", "1", "as in PyTorch, more than the 20 MB segments"},
    {"max_split_size_mb", "-1", "0 (no limit) or an integer > 20"},
    {"max_split_size_mb", "100MB", "0 (no limit) or an integer > 20"},
    // Fits in 64 bits as MB but not as bytes.
    {"max_split_size_mb", "18446744073709551615", "0 (no limit) or an integer > 20"},
    {"roundup_power2_divisions", "3", "0, 1, 2, 4, 8, 16, 32 or 64"},
    {"roundup_power2_divisions", "128", "0, 1, 2, 4, 8, 16, 32 or 64"},
    {"roundup_power2_divisions", "[256:4]", "0, 1, 2, 4, 8, 16, 32 or 64"},
    {"memory_fraction", "1.0000001", "0 <= F <= 1"},
    {"memory_fraction", "1.5", "0 <= F <= 1"},
    {"memory_fraction", "-0.5", "0 <= F <= 1"},
    {"memory_fraction", "+0.5", "0 <= F <= 1"},
    {"memory_fraction", "nan", "0 <= F <= 1"},
    {"memory_fraction", "inf", "0 <= F <= 1"},
    {"memory_fraction", "0.5x", "0 <= F <= 1"},
    {"log_level", "verbose", "trace|debug|info|warn|error|critical|off"},
    {"log_level", "warning", "trace|debug|info|warn|error|critical|off"},
    {"audit", "on", "off|warn|trace"},
    {"audit_file", "", "a non-empty file path"},
    {"pending_warn_ms", "+5", "an unsigned integer"},
    {"pending_warn_ms", "5s", "an unsigned integer"},
    {"pending_warn_ms", "1e3", "an unsigned integer"},
    {"pending_warn_ms", "0x10", "an unsigned integer"},
    {"pending_warn_ms", "99999999999999999999", "an unsigned integer"},  // > 2^64
    {"poison", "yes", "off|free|alloc|both"},
    {"quarantine_mb", "-3", "an unsigned integer (MB)"},
    {"quarantine_mb", "1 0", "an unsigned integer (MB)"},
    {"check_sync", "yes", "0|1|true|false"},
    {"check_sync", "2", "0|1|true|false"},
    {"pending_history", "16777217", "an unsigned integer <= 16777216 (samples; 0 = off)"},
    {"pending_history", "-1", "an unsigned integer <= 16777216"},
    {"expandable_segments", "TRUE", "true|false|True|False|1|0"},
    {"expandable_segments", "yes", "true|false|True|False|1|0"},
    {"expandable_ipc", "on", "true|false|True|False|1|0"},
    {"hot_list_mb", "-1", "an unsigned integer (MB)"},
    {"hot_list_mb", "lots", "an unsigned integer (MB)"},
    {"sim_memory_mb", "0", "an integer >= 1 (MB)"},
    {"sim_devices", "0", "an integer from 1 to 16"},
    {"sim_devices", "17", "an integer from 1 to 16"},
};

INSTANTIATE_TEST_SUITE_P(Options, OptionsBadValue, ::testing::ValuesIn(kBadCases));

TEST(OptionsTable, EveryKeyHasGoodAndBadCases) {
  std::set<std::string> good, bad;
  for (const auto& c : kGoodCases) good.insert(c.key);
  for (const auto& c : kBadCases) bad.insert(c.key);
  for (const OptionGroup group : {OptionGroup::kUser, OptionGroup::kSimulator}) {
    for (const auto& [key, help] : Options::keys(group)) {
      EXPECT_EQ(good.count(key), 1u) << "no good value tested for " << key;
      EXPECT_EQ(bad.count(key), 1u) << "no bad value tested for " << key;
      EXPECT_FALSE(help.empty()) << key;
    }
  }
}

std::vector<std::string> key_names(OptionGroup group) {
  std::vector<std::string> names;
  for (const auto& [key, help] : Options::keys(group)) names.push_back(key);
  return names;
}

TEST(OptionsTable, KeysAreTheDocumentedOnesInOrder) {
  EXPECT_EQ(key_names(OptionGroup::kUser),
            (std::vector<std::string>{"backend", "cross_stream_reuse", "max_split_size_mb", "roundup_power2_divisions",
                                      "memory_fraction", "log_level", "audit", "audit_file", "pending_warn_ms",
                                      "poison", "quarantine_mb", "check_sync", "pending_history", "expandable_segments",
                                      "expandable_ipc", "hot_list_mb"}));
  EXPECT_EQ(Options::keys(), Options::keys(OptionGroup::kUser)) << "the user options are the default group";
}

TEST(OptionsTable, SimulatorSettingsAreAGroupOfTheirOwn) {
  EXPECT_EQ(key_names(OptionGroup::kSimulator), (std::vector<std::string>{"sim_memory_mb", "sim_devices"}));
  // Still set through the same string (tests and tools run on the simulated device) ...
  const Options o = Options::parse("backend:sim,sim_devices:2");
  EXPECT_EQ(o.sim_devices, 2);
  // ... but not described as user options, and written out only when they differ from the defaults.
  EXPECT_EQ(o.describe().find("sim_"), std::string::npos) << o.describe();
  EXPECT_EQ(Options{}.to_conf_string().find("sim_"), std::string::npos) << Options{}.to_conf_string();
  EXPECT_NE(o.to_conf_string().find("sim_devices:2"), std::string::npos) << o.to_conf_string();
  EXPECT_EQ(o.to_conf_string().find("sim_memory_mb"), std::string::npos) << o.to_conf_string();
}

// ---- syntax ----

TEST(OptionsParse, EmptyStringGivesDefaults) {
  expect_same(Options::parse(""), Options{});
  expect_same(Options::parse("  \t "), Options{});
  expect_same(Options::parse(","), Options{});
}

TEST(OptionsParse, WhitespaceAndTrailingCommasAreIgnored) {
  const Options o = Options::parse(" backend : sim ,\tcheck_sync:true,, sim_devices: 2 ,");
  EXPECT_EQ(o.backend, BackendKind::kSim);
  EXPECT_TRUE(o.check_sync);
  EXPECT_EQ(o.sim_devices, 2);
  Options set;
  set.set("  memory_fraction ", " 0.75 ");
  EXPECT_EQ(set.memory_fraction, 0.75);
}

TEST(OptionsParse, SeveralKeysAtOnce) {
  const Options o = Options::parse(
      "backend:sim,cross_stream_reuse:wait,max_split_size_mb:128,roundup_power2_divisions:8,"
      "memory_fraction:0.8,log_level:info,audit:warn,audit_file:/tmp/a.log,pending_warn_ms:50,"
      "poison:both,quarantine_mb:16,check_sync:1,sim_memory_mb:2048,sim_devices:4");
  EXPECT_EQ(o.backend, BackendKind::kSim);
  EXPECT_EQ(o.cross_stream_reuse, CrossStreamReuse::kWait);
  EXPECT_EQ(o.max_split_size_bytes, 128 * MiB);
  EXPECT_EQ(o.roundup_power2_divisions, 8u);
  EXPECT_EQ(o.memory_fraction, 0.8);
  EXPECT_EQ(o.log_level, "info");
  EXPECT_EQ(o.audit, AuditMode::kWarn);
  EXPECT_EQ(o.audit_file, "/tmp/a.log");
  EXPECT_EQ(o.pending_warn_ms, 50u);
  EXPECT_EQ(o.poison, PoisonMode::kBoth);
  EXPECT_EQ(o.quarantine_bytes, 16 * MiB);
  EXPECT_TRUE(o.check_sync);
  EXPECT_EQ(o.sim_memory_bytes, 2 * GiB);
  EXPECT_EQ(o.sim_devices, 4);
}

TEST(OptionsParse, UnknownKeyListsEveryKnownKey) {
  const std::string message = config_error([] { Options::parse("backend:sim,foo:1"); });
  EXPECT_EQ(message.rfind("streamalloc: unknown option 'foo' in the conf string; known options: "
                          "backend, cross_stream_reuse, ",
                          0),
            0u)
      << message;
  EXPECT_EQ(message.find("streamalloc:", 1), std::string::npos) << "one prefix: " << message;
  for (const OptionGroup group : {OptionGroup::kUser, OptionGroup::kSimulator}) {
    for (const auto& [key, help] : Options::keys(group)) {
      EXPECT_NE(message.find(key), std::string::npos) << key << " missing from: " << message;
    }
  }
  EXPECT_NE(message.find("(simulated device: sim_memory_mb, sim_devices)"), std::string::npos) << message;
  // Keys are case-sensitive, as in PYTORCH_CUDA_ALLOC_CONF.
  config_error([] { Options::parse("Backend:sim"); });
}

TEST(OptionsParse, SetWithUnknownKeyDoesNotBlameTheEnvironment) {
  Options options;
  const std::string message = config_error([&] { options.set("max_split_size", "100"); });
  EXPECT_NE(message.find("unknown option 'max_split_size'; known options: "), std::string::npos) << message;
  EXPECT_EQ(message.find("STREAMALLOC_CONF"), std::string::npos) << message;
}

TEST(OptionsParse, MessagesNameTheSourceTheCallerGives) {
  EXPECT_NE(config_error([] { Options::parse("foo:1", "--conf"); }).find("unknown option 'foo' in --conf;"),
            std::string::npos);
  EXPECT_NE(
      config_error([] { Options::parse("audit", kConfVariable); }).find("malformed item 'audit' in STREAMALLOC_CONF:"),
      std::string::npos);
  EXPECT_NE(config_error([] {
              Options::parse("audit:warn,audit:off", "the test");
            }).find("option 'audit' given twice in the test;"),
            std::string::npos);
}

TEST(OptionsParse, MalformedItemSuggestsAnItemThatWorksEverywhere) {
  // backend:sim cannot serve PyTorch, so the launcher and enable() would refuse the suggestion.
  const std::string message = config_error([] { Options::parse("check_sync"); });
  EXPECT_NE(message.find("expected key:value, e.g. audit:warn"), std::string::npos) << message;
  EXPECT_EQ(message.find("backend:sim"), std::string::npos) << message;
}

TEST(OptionsParse, UpdateAppliesAStringOnTopOfTheOptions) {
  Options options = Options::parse("audit:off,poison:free");
  options.update("audit:warn, check_sync:1", "the overrides");
  EXPECT_EQ(options.audit, AuditMode::kWarn);    // the update's key wins
  EXPECT_EQ(options.poison, PoisonMode::kFree);  // keys it does not give stay
  EXPECT_TRUE(options.check_sync);
  // A key twice within one update is still an error, and a failed update changes nothing.
  const Options before = options;
  const std::string message = config_error([&] { options.update("poison:off,audit:off,audit:trace", "kwargs"); });
  EXPECT_NE(message.find("option 'audit' given twice in kwargs"), std::string::npos) << message;
  expect_same(options, before);
}

TEST(OptionsParse, ResolveIsAStringOnTopOfAnother) {
  const Options o = Options::resolve("audit:off,poison:free", "audit:warn", "the overrides");
  EXPECT_EQ(o.audit, AuditMode::kWarn);
  EXPECT_EQ(o.poison, PoisonMode::kFree);
  EXPECT_NE(config_error([] { Options::resolve("", "nope:1", "the overrides"); }).find("in the overrides;"),
            std::string::npos);
}

TEST(OptionsParse, ConfFromEnvironmentIsTheConfVariable) {
  const char* saved = std::getenv(kConfVariable);
  const std::string previous = saved ? saved : "";
  setenv(kConfVariable, "audit:warn", 1);
  EXPECT_EQ(conf_from_environment(), "audit:warn");
  unsetenv(kConfVariable);
  EXPECT_EQ(conf_from_environment(), "");
  if (saved) setenv(kConfVariable, previous.c_str(), 1);
}

TEST(OptionsSame, SameOptionsPassOtherOptionsAreRefusedNamingEachKey) {
  EXPECT_NO_THROW(require_same_options(Options::parse("audit:warn"), Options::parse(" audit : warn ,")));
  EXPECT_NO_THROW(require_same_options(Options{}, Options::parse("cross_stream_reuse:settled")))
      << "a default given explicitly is the same option";
  const std::string message = config_error([] {
    require_same_options(Options::parse("audit:warn"), Options::parse("audit:warn,poison:free,sim_devices:2"));
  });
  EXPECT_EQ(message.rfind("streamalloc: already configured with other options (", 0), 0u) << message;
  EXPECT_NE(message.find("poison: 'off' in use, 'free' asked"), std::string::npos) << message;
  EXPECT_NE(message.find("sim_devices: '1' in use, '2' asked"), std::string::npos) << message;
  EXPECT_EQ(message.find("audit:"), std::string::npos) << "keys that agree are not listed: " << message;
}

TEST(OptionsParse, BadValueMessageIsExact) {
  EXPECT_EQ(config_error([] { Options::parse("cross_stream_reuse:sometimes"); }),
            "streamalloc: bad value 'sometimes' for option 'cross_stream_reuse'; accepted: "
            "never|settled|wait");
}

TEST(OptionsParse, MalformedItemsAreErrors) {
  std::string message = config_error([] { Options::parse("backend:sim,check_sync"); });
  EXPECT_NE(message.find("malformed item 'check_sync'"), std::string::npos) << message;
  EXPECT_NE(message.find("key:value"), std::string::npos) << message;

  message = config_error([] { Options::parse(":sim"); });
  EXPECT_NE(message.find("empty key"), std::string::npos) << message;
  EXPECT_NE(message.find("known options: backend"), std::string::npos) << message;

  message = config_error([] { Options::parse(" : "); });
  EXPECT_NE(message.find("empty key"), std::string::npos) << message;

  // A missing value reaches the key's own check, which says what it accepts.
  message = config_error([] { Options::parse("backend:"); });
  EXPECT_NE(message.find("bad value '' for option 'backend'; accepted: auto|cuda|sim"), std::string::npos) << message;
}

TEST(OptionsParse, DuplicateKeyIsAnError) {
  const std::string message = config_error([] { Options::parse("backend:sim,audit:warn, backend :cuda"); });
  EXPECT_NE(message.find("option 'backend' given twice"), std::string::npos) << message;
  // set() is for one key at a time and overrides, as keyword arguments do.
  Options options = Options::parse("backend:sim");
  options.set("backend", "cuda");
  EXPECT_EQ(options.backend, BackendKind::kCuda);
}

TEST(OptionsParse, AuditFileRejectsCommasSoTheConfStringRoundTrips) {
  Options options;
  const std::string message = config_error([&] { options.set("audit_file", "/tmp/a,b.log"); });
  EXPECT_NE(message.find("without commas"), std::string::npos) << message;
  EXPECT_TRUE(options.audit_file.empty());
}

// ---- output ----

TEST(OptionsOutput, ToConfStringRoundTrips) {
  expect_same(Options::parse(Options{}.to_conf_string()), Options{});

  const Options custom = Options::parse(
      "backend:sim,cross_stream_reuse:never,max_split_size_mb:300,roundup_power2_divisions:16,"
      "memory_fraction:0.123456789012345,log_level:debug,audit:trace,audit_file:/var/log/a:b,"
      "pending_warn_ms:7,poison:alloc,quarantine_mb:3,check_sync:true,expandable_ipc:true,hot_list_mb:24,sim_memory_mb:"
      "96,"
      "sim_devices:5");
  const std::string conf = custom.to_conf_string();
  expect_same(Options::parse(conf), custom);
  EXPECT_NE(conf.find("memory_fraction:0.123456789012345"), std::string::npos) << conf;
  EXPECT_NE(conf.find("check_sync:1"), std::string::npos) << conf;

  // Thirds and other non-terminating fractions round-trip exactly too.
  Options third;
  third.memory_fraction = 1.0 / 3.0;
  expect_same(Options::parse(third.to_conf_string()), third);
}

TEST(OptionsOutput, ToConfStringNeverShrinksByteLimits) {
  // Fields set directly in C++ need not be whole MB; serializing rounds up, never down.
  Options options;
  options.quarantine_bytes = 1;
  options.sim_memory_bytes = 3 * MiB + 512;
  const Options parsed = Options::parse(options.to_conf_string());
  EXPECT_EQ(parsed.quarantine_bytes, 1 * MiB);
  EXPECT_EQ(parsed.sim_memory_bytes, 4 * MiB);
}

TEST(OptionsOutput, DescribeListsEveryKeyWithValueAndHelp) {
  const Options options = Options::parse("backend:sim,max_split_size_mb:64,check_sync:1");
  const std::string text = options.describe();
  const auto keys = Options::keys();
  std::vector<std::string> lines;
  for (std::size_t start = 0; start < text.size();) {
    const auto end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "describe() must end every line with a newline";
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  ASSERT_EQ(lines.size(), keys.size()) << text;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(lines[i].rfind(keys[i].first + ": ", 0), 0u) << lines[i];
    EXPECT_NE(lines[i].find("  # " + keys[i].second), std::string::npos) << lines[i];
  }
  EXPECT_NE(text.find("backend: sim  # "), std::string::npos) << text;
  EXPECT_NE(text.find("max_split_size_mb: 64  # "), std::string::npos) << text;
  EXPECT_NE(text.find("check_sync: 1  # "), std::string::npos) << text;
  EXPECT_NE(text.find("audit_file: \"\"  # "), std::string::npos) << text;
}

TEST(OptionsOutput, ItemsAndJsonAreTheConfString) {
  const Options options = Options::parse("audit:warn,audit_file:/tmp/a:b,sim_devices:3");
  std::string joined;
  for (const auto& [key, value] : options.items()) joined += (joined.empty() ? "" : ",") + key + ":" + value;
  EXPECT_EQ(joined, options.to_conf_string());
  const std::string json = options.to_json();
  EXPECT_NE(json.find("\"conf\":\"" + options.to_conf_string() + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"audit_file\":\"/tmp/a:b\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"sim_devices\":\"3\""), std::string::npos) << json;
}

TEST(OptionsOutput, EnumNames) {
  EXPECT_STREQ(to_string(BackendKind::kAuto), "auto");
  EXPECT_STREQ(to_string(BackendKind::kCuda), "cuda");
  EXPECT_STREQ(to_string(BackendKind::kSim), "sim");
  EXPECT_STREQ(to_string(CrossStreamReuse::kNever), "never");
  EXPECT_STREQ(to_string(CrossStreamReuse::kSettled), "settled");
  EXPECT_STREQ(to_string(CrossStreamReuse::kWait), "wait");
  EXPECT_STREQ(to_string(AuditMode::kOff), "off");
  EXPECT_STREQ(to_string(AuditMode::kWarn), "warn");
  EXPECT_STREQ(to_string(AuditMode::kTrace), "trace");
  EXPECT_STREQ(to_string(PoisonMode::kOff), "off");
  EXPECT_STREQ(to_string(PoisonMode::kFree), "free");
  EXPECT_STREQ(to_string(PoisonMode::kAlloc), "alloc");
  EXPECT_STREQ(to_string(PoisonMode::kBoth), "both");
}

}  // namespace
}  // namespace streamalloc
