// The C ABI on the simulated device: the hooks PyTorch calls, the JSON reports, and error reporting
// without exceptions. ctest runs each test in its own process, so the process-wide allocator is fresh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "streamalloc/streamalloc.h"

namespace {

struct CApi : ::testing::Test {
  void SetUp() override {
    streamalloc_shutdown();
    ASSERT_EQ(streamalloc_configure("backend:sim,sim_memory_mb:256,log_level:off"), 0) << streamalloc_last_error();
  }
  void TearDown() override { streamalloc_shutdown(); }
  static streamalloc_stream_t stream(std::uintptr_t id) { return reinterpret_cast<streamalloc_stream_t>(id); }
  static nlohmann::json take_json(char* s) {
    EXPECT_NE(s, nullptr) << streamalloc_last_error();
    nlohmann::json j = nlohmann::json::parse(s ? s : "{}");
    streamalloc_free_string(s);
    return j;
  }
};

TEST_F(CApi, MallocFreeRecordStream) {
  void* p = streamalloc_malloc(1000, 0, stream(0));
  ASSERT_NE(p, nullptr) << streamalloc_last_error();
  EXPECT_EQ(streamalloc_backend_is_cuda(), 0);
  streamalloc_record_stream(p, stream(0x1234));
  streamalloc_free(p, 1000, 0, stream(0));
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_OK) << streamalloc_last_error();
  EXPECT_EQ(streamalloc_validate(), 0) << streamalloc_last_error();
  const auto stats = take_json(streamalloc_stats_json(0));
  EXPECT_EQ(stats["stream_stats"]["record_stream_calls"], 1);
  EXPECT_EQ(stats["memory_stats"]["allocation.all.allocated"], 1);
}

TEST_F(CApi, ErrorsAreReportedNotThrown) {
  void* p = streamalloc_malloc(1000, 0, stream(0));
  streamalloc_free(p, 1000, 0, stream(0));
  streamalloc_free(p, 1000, 0, stream(0));
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(streamalloc_last_error()).find("double free"), std::string::npos);
  EXPECT_EQ(streamalloc_malloc(std::size_t{1} << 40, 0, stream(0)), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(streamalloc_last_error()).find("larger than the device"), std::string::npos);
  EXPECT_NE(streamalloc_malloc(64, 0, stream(0)), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_OK) << "a successful call clears the last error";
  EXPECT_EQ(streamalloc_malloc(0, 0, stream(0)), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_OK) << "size 0 is not an error";
}

TEST_F(CApi, ConfigureRejectsBadOptionsAndLateChanges) {
  streamalloc_shutdown();
  EXPECT_EQ(streamalloc_configure("no_such_key:1"), -1);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_CONFIG);
  EXPECT_NE(std::string(streamalloc_last_error()).find("no_such_key"), std::string::npos);
  ASSERT_EQ(streamalloc_configure("backend:sim,log_level:off"), 0);
  void* p = streamalloc_malloc(10, 0, stream(0));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(streamalloc_configure("backend:sim,log_level:off"), 0) << "same options: accepted";
  EXPECT_EQ(streamalloc_configure("backend:sim,cross_stream_reuse:never"), -1);
  EXPECT_NE(std::string(streamalloc_last_error()).find("already configured with other options"), std::string::npos);
  EXPECT_NE(std::string(streamalloc_last_error()).find("cross_stream_reuse: 'settled' in use, 'never' asked"),
            std::string::npos)
      << streamalloc_last_error();
  streamalloc_free(p, 10, 0, stream(0));
}

// Options set for first use are fixed as well: a second configure() before any allocation may repeat
// them but not change them (the rule of every entry point), until a shutdown drops them.
TEST_F(CApi, ConfigureBeforeFirstUseFixesTheOptions) {
  EXPECT_EQ(streamalloc_backend_is_cuda(), -1) << "no allocator yet";
  EXPECT_EQ(streamalloc_configure("backend:sim , sim_memory_mb:256,log_level:off"), 0) << "same options";
  EXPECT_EQ(streamalloc_configure("backend:sim,sim_memory_mb:512,log_level:off"), -1);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_CONFIG);
  EXPECT_NE(std::string(streamalloc_last_error()).find("sim_memory_mb: '256' in use, '512' asked"), std::string::npos)
      << streamalloc_last_error();
  streamalloc_shutdown();
  ASSERT_EQ(streamalloc_configure("backend:sim,sim_memory_mb:512,log_level:off"), 0) << streamalloc_last_error();
  const auto options = take_json(streamalloc_options_json());
  EXPECT_EQ(options["sim_memory_mb"], "512");
}

TEST_F(CApi, ConfigureErrorsNameTheirSourceWithOnePrefix) {
  streamalloc_shutdown();
  EXPECT_EQ(streamalloc_configure("foo:1"), -1);
  const std::string message = streamalloc_last_error();
  EXPECT_EQ(message.rfind("streamalloc: unknown option 'foo' in the string passed to streamalloc_configure();", 0), 0u)
      << message;
}

TEST(CApiLog, LoggedErrorsCarryOnePrefix) {
  // The log level is the default one only in a process whose allocator was never created.
  if (streamalloc_backend_is_cuda() != -1) GTEST_SKIP() << "the allocator already exists in this process";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(streamalloc_configure("foo:1"), -1);
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("[streamalloc] [error] unknown option 'foo'"), std::string::npos) << logged;
  EXPECT_EQ(logged.find("streamalloc: "), std::string::npos) << logged;
}

TEST(CApiResolve, ResolvesWithoutConfiguring) {
  const int state_before = streamalloc_backend_is_cuda();
  char* text = streamalloc_resolve_conf("audit:off,poison:free", "audit:warn", "the test");
  ASSERT_NE(text, nullptr) << streamalloc_last_error();
  const auto resolved = nlohmann::json::parse(text);
  streamalloc_free_string(text);
  EXPECT_EQ(resolved["options"]["audit"], "warn");  // conf's keys win over base's
  EXPECT_EQ(resolved["options"]["poison"], "free");
  EXPECT_EQ(resolved["options"]["cross_stream_reuse"], "settled");  // defaults filled in
  const std::string conf = resolved["conf"];
  EXPECT_NE(conf.find("audit:warn"), std::string::npos) << conf;
  EXPECT_EQ(streamalloc_backend_is_cuda(), state_before) << "resolving creates no allocator";

  char* defaults = streamalloc_resolve_conf(nullptr, nullptr, nullptr);
  ASSERT_NE(defaults, nullptr) << streamalloc_last_error();
  EXPECT_EQ(nlohmann::json::parse(defaults)["options"]["audit"], "off");
  streamalloc_free_string(defaults);

  EXPECT_EQ(streamalloc_resolve_conf("", "audit", "--conf"), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_CONFIG);
  EXPECT_NE(std::string(streamalloc_last_error()).find("malformed item 'audit' in --conf"), std::string::npos)
      << streamalloc_last_error();
  EXPECT_EQ(streamalloc_resolve_conf("", "nope:1", nullptr), nullptr);
  EXPECT_NE(std::string(streamalloc_last_error()).find("in the conf string"), std::string::npos)
      << streamalloc_last_error();
}

TEST(CApiErrors, NamesOfTheHeadersCodes) {
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_OK), "ok");
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_ERROR_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_ERROR_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_ERROR_CONFIG), "config");
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_ERROR_BACKEND), "backend");
  EXPECT_STREQ(streamalloc_error_name(STREAMALLOC_ERROR_SHUTDOWN), "shutdown");
  EXPECT_EQ(streamalloc_error_name(STREAMALLOC_ERROR_SHUTDOWN + 1), nullptr);
  EXPECT_EQ(streamalloc_error_name(-1), nullptr);
}

// The key paths of a JSON object: "a.b" for nested objects; lists count as leaves.
void collect_keys(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    out.push_back(path);
    if (it->is_object()) collect_keys(*it, path, out);
  }
}

TEST_F(CApi, ZeroStatsHaveTheKeysOfADeviceInUse) {
  char* zero_text = streamalloc_zero_stats_json();
  ASSERT_NE(zero_text, nullptr) << streamalloc_last_error();
  const auto zero = nlohmann::json::parse(zero_text);
  streamalloc_free_string(zero_text);
  EXPECT_EQ(streamalloc_backend_is_cuda(), -1) << "zero stats create no allocator";
  void* p = streamalloc_malloc(1000, 0, stream(0));
  streamalloc_free(p, 1000, 0, stream(0));
  const auto used = take_json(streamalloc_stats_json(0));
  std::vector<std::string> zero_keys, used_keys;
  collect_keys(zero, "", zero_keys);
  collect_keys(used, "", used_keys);
  EXPECT_EQ(zero_keys, used_keys);
  ASSERT_TRUE(zero.contains("memory_stats"));
  for (const auto& [key, value] : zero["memory_stats"].items()) {
    if (value.is_number() && key != "max_split_size") {
      EXPECT_EQ(value, 0) << key;
    }
  }
  EXPECT_EQ(zero["stream_stats"]["record_stream_calls"], 0);
}

TEST_F(CApi, ShutdownRefusesLaterCalls) {
  void* p = streamalloc_malloc(10, 0, stream(0));
  streamalloc_shutdown();
  EXPECT_EQ(streamalloc_malloc(10, 0, stream(0)), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_SHUTDOWN);
  streamalloc_free(p, 10, 0, stream(0));
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_SHUTDOWN);
}

TEST_F(CApi, SnapshotHasMemoryVizShapeAndStreamFields) {
  void* p = streamalloc_malloc(4096, 0, stream(7));
  streamalloc_record_stream(p, stream(9));
  const auto snap = take_json(streamalloc_snapshot_json());
  ASSERT_EQ(snap["segments"].size(), 1u);
  const auto& seg = snap["segments"][0];
  EXPECT_EQ(seg["segment_type"], "small");
  EXPECT_EQ(seg["total_size"], 2 * 1024 * 1024);
  const auto& block = seg["blocks"][0];
  EXPECT_EQ(block["state"], "active_allocated");
  EXPECT_EQ(block["allocation_stream"], 7);
  EXPECT_EQ(block["recorded_streams"], nlohmann::json::array({9}));
  EXPECT_EQ(block["requested_size"], 4096);
  EXPECT_EQ(seg["blocks"][1]["state"], "inactive");
  streamalloc_free(p, 4096, 0, stream(7));
  const auto after = take_json(streamalloc_snapshot_json());
  EXPECT_EQ(after["segments"][0]["blocks"][0]["state"], "active_pending_free");
  EXPECT_EQ(after["segments"][0]["blocks"][0]["pending_fences"], 1);
}

TEST_F(CApi, BlockTableShowsPendingBlocksAndPendingBytes) {
  void* p = streamalloc_malloc(4096, 0, stream(7));
  streamalloc_record_stream(p, stream(9));
  streamalloc_free(p, 4096, 0, stream(7));
  char* text = streamalloc_block_table(-1);
  ASSERT_NE(text, nullptr) << streamalloc_last_error();
  const std::string table = text;
  streamalloc_free_string(text);
  EXPECT_EQ(table.rfind("Per-block stream report", 0), 0u) << table;
  EXPECT_NE(table.find("active_pending_free  0x7        0x9"), std::string::npos) << table;
  EXPECT_NE(table.find("Pending frees by allocation stream"), std::string::npos) << table;
  char* none = streamalloc_block_table(0);
  ASSERT_NE(none, nullptr) << streamalloc_last_error();
  EXPECT_NE(std::string(none).find("... 2 more block(s) not shown"), std::string::npos) << none;
  streamalloc_free_string(none);
}

// A configuration error at first use: NULL and the last error, as for the JSON reports. Needs a process
// whose allocator was never created (ctest runs each test in its own).
TEST(CApiFirstUse, BlockTableFailsWithTheLastError) {
  if (streamalloc_backend_is_cuda() != -1) GTEST_SKIP() << "the allocator already exists in this process";
  const char* saved = std::getenv("STREAMALLOC_CONF");
  const std::string previous = saved ? saved : "";
  setenv("STREAMALLOC_CONF", "backend:sim,no_such_key:1", 1);
  EXPECT_EQ(streamalloc_block_table(10), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_CONFIG);
  EXPECT_NE(std::string(streamalloc_last_error()).find("no_such_key"), std::string::npos);
  if (saved) {
    setenv("STREAMALLOC_CONF", previous.c_str(), 1);
  } else {
    unsetenv("STREAMALLOC_CONF");
  }
}

TEST_F(CApi, BaseAllocFindsTheSegment) {
  auto* p = static_cast<char*>(streamalloc_malloc(4096, 0, stream(0)));
  auto* q = static_cast<char*>(streamalloc_malloc(4096, 0, stream(0)));
  size_t size = 0;
  EXPECT_EQ(streamalloc_base_alloc(q, &size), p);
  EXPECT_EQ(size, 2u * 1024 * 1024);
  int x = 0;
  EXPECT_EQ(streamalloc_base_alloc(&x, &size), nullptr);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_INVALID_ARGUMENT);
}

TEST_F(CApi, OptionsJsonAndEmptyCache) {
  void* p = streamalloc_malloc(64 << 20, 0, stream(0));
  streamalloc_free(p, 64 << 20, 0, stream(0));
  streamalloc_empty_cache();
  auto stats = take_json(streamalloc_stats_json(0));
  EXPECT_EQ(stats["memory_stats"]["reserved_bytes.all.current"], 0);
  const auto options = take_json(streamalloc_options_json());
  EXPECT_EQ(options["backend_in_use"], "sim");
  EXPECT_EQ(options["cross_stream_reuse"], "settled");
  streamalloc_set_memory_fraction(2.0, 0);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_ERROR_INVALID_ARGUMENT);
  streamalloc_init(1);
  EXPECT_EQ(streamalloc_last_error_code(), STREAMALLOC_OK);
}

}  // namespace
