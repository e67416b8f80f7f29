// Reports for people (streamalloc/report.hpp): the per-block stream table, the pending bytes per
// allocation stream, and reading a snapshot back, on the simulated device in manual mode (no fence
// completes unless a test runs the streams).
#include "streamalloc/report.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

constexpr std::size_t kBig = 64 * MiB;  // a large segment of its own

// Two devices with blocks in every state: on device 0, `producer` frees two blocks recorded on
// `consumer` (one also on `other`), `consumer` frees one recorded on `producer`, a large block goes back
// to its stream unsettled, and one block stays live; device 1 holds one pending block.
struct MixedState {
  SimSetup s{"", SimBackend::Mode::kManual, 256 * MiB, 2};
  Stream producer = s.sim->create_stream(0);
  Stream consumer = s.sim->create_stream(0);
  Stream other = s.sim->create_stream(0);
  Stream remote = s.sim->create_stream(1);
  Stream remote_user = s.sim->create_stream(1);
  StreamNames names = {{producer, "producer"}, {consumer, "consumer"}, {other, "other"}};
  void* once_recorded = nullptr;
  void* twice_recorded = nullptr;
  void* live = nullptr;

  MixedState() {
    once_recorded = free_after_use(4 * KiB, producer, {consumer});
    twice_recorded = free_after_use(8 * KiB, producer, {consumer, other});
    free_after_use(MiB, consumer, {producer});
    free_after_use(kBig, producer, {});
    live = s.a().allocate(1000, 0, other);
    void* q = s.a().allocate(16 * KiB, 1, remote);
    s.sim->enqueue(1, remote_user, [] {});
    s.a().record_stream(q, remote_user);
    s.a().deallocate(q, 16 * KiB, 1, remote);
    s.a().validate();
  }
  void* free_after_use(std::size_t size, Stream stream, std::vector<Stream> users) {
    void* p = s.a().allocate(size, 0, stream);
    for (Stream u : users) {
      s.sim->enqueue(0, u, [] {});  // the use: work that keeps u busy, so the block stays pending
      s.a().record_stream(p, u);
    }
    s.a().deallocate(p, size, 0, stream);
    return p;
  }
};

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The first line of `text` whose first word is `first`, split into words (empty when there is none).
std::vector<std::string> row(const std::string& text, const std::string& first) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> w = words(line);
    if (!w.empty() && w[0] == first) return w;
  }
  ADD_FAILURE() << "no line starts with '" << first << "' in:\n" << text;
  return {};
}

// As the table prints addresses (12 digits at least) and unnamed streams.
std::string hex(std::uintptr_t value, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(value));
  return buf;
}
std::string hex_address(const void* p) { return hex(reinterpret_cast<std::uintptr_t>(p), 12); }

// format_bytes as it stands in a row: two words.
std::vector<std::string> bytes_words(std::size_t bytes) { return words(format_bytes(bytes)); }

void expect_same_segments(const std::vector<SegmentInfo>& want, const std::vector<SegmentInfo>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("segment " + std::to_string(i));
    const SegmentInfo& w = want[i];
    const SegmentInfo& g = got[i];
    EXPECT_EQ(w.device, g.device);
    EXPECT_EQ(w.address, g.address);
    EXPECT_EQ(w.total_size, g.total_size);
    EXPECT_EQ(w.allocated_size, g.allocated_size);
    EXPECT_EQ(w.active_size, g.active_size);
    EXPECT_EQ(w.requested_size, g.requested_size);
    EXPECT_EQ(w.is_large, g.is_large);
    EXPECT_EQ(w.stream, g.stream);
    ASSERT_EQ(w.blocks.size(), g.blocks.size());
    for (std::size_t j = 0; j < w.blocks.size(); ++j) {
      SCOPED_TRACE("block " + std::to_string(j));
      const BlockInfo& wb = w.blocks[j];
      const BlockInfo& gb = g.blocks[j];
      EXPECT_EQ(wb.address, gb.address);
      EXPECT_EQ(wb.segment_address, gb.segment_address);
      EXPECT_EQ(wb.size, gb.size);
      EXPECT_EQ(wb.requested_size, gb.requested_size);
      EXPECT_EQ(wb.state, gb.state);
      EXPECT_EQ(wb.settled, gb.settled);
      EXPECT_EQ(wb.allocation_stream, gb.allocation_stream);
      EXPECT_EQ(wb.recorded_streams, gb.recorded_streams);
      EXPECT_EQ(wb.record_stream_calls, gb.record_stream_calls);
      EXPECT_EQ(wb.pending_fences, gb.pending_fences);
      // segments() and snapshot_json() read the clock at different moments.
      EXPECT_LE(wb.age_ms, gb.age_ms);
      EXPECT_LT(gb.age_ms - wb.age_ms, 10000.0);
    }
  }
}

void expect_invalid(const std::string& json, const std::vector<std::string>& message_parts) {
  try {
    segments_from_snapshot_json(json);
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    for (const std::string& part : message_parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
  }
}

TEST(Report, SnapshotReadsBackAsTheSegments) {
  MixedState m;
  const std::vector<SegmentInfo> want = m.s.a().segments(-1);
  const std::string json = m.s.a().snapshot_json();
  const std::vector<SegmentInfo> got = segments_from_snapshot_json(json);
  expect_same_segments(want, got);
  // The ages are the snapshot's own, to the bit.
  const auto doc = nlohmann::json::parse(json);
  EXPECT_EQ(got.at(0).blocks.at(0).age_ms, doc["segments"][0]["blocks"][0]["age_ms"].get<double>());
  EXPECT_EQ(got.back().device, 1);
}

TEST(Report, ReadsAFileWrittenByStreamallocDump) {
  MixedState m;
  const std::vector<SegmentInfo> want = m.s.a().segments(-1);
  // streamalloc.dump(): {"conf", "path", "stats": {device: stats}, "snapshot"}, indented.
  const nlohmann::json dump = {{"conf", "backend:sim"},
                               {"path", "c-abi"},
                               {"stats", {{"0", nlohmann::json::parse(m.s.a().stats_json(0))}}},
                               {"snapshot", nlohmann::json::parse(m.s.a().snapshot_json())}};
  expect_same_segments(want, segments_from_snapshot_json(dump.dump(1)));
}

TEST(Report, ReadsSnapshotsWithoutStreamallocsFields) {
  // PyTorch's own snapshot of an idle cache (no allocation stream, recorded streams, fences, age), and
  // the Python package's snapshot() before CUDA is initialised.
  const auto segments = segments_from_snapshot_json(
      R"({"segments": [{"device": 0, "address": 4096, "total_size": 2097152, "segment_type": "small",
          "blocks": [{"address": 4096, "size": 2097152, "state": "inactive", "frames": []}]}]})");
  ASSERT_EQ(segments.size(), 1u);
  ASSERT_EQ(segments[0].blocks.size(), 1u);
  EXPECT_EQ(segments[0].blocks[0].state, BlockInfo::State::kFree);
  EXPECT_EQ(segments[0].blocks[0].segment_address, 4096u);
  EXPECT_TRUE(segments[0].blocks[0].recorded_streams.empty());
  EXPECT_TRUE(
      segments_from_snapshot_json(R"({"segments": [], "device_traces": [], "allocator_settings": {}})").empty());
}

TEST(Report, MalformedSnapshotsNameTheProblem) {
  expect_invalid("{\"segments\": [", {"not valid JSON"});
  expect_invalid("[1, 2]", {"'segments' list", "streamalloc.dump()"});
  expect_invalid(R"({"stats": {}})", {"'segments' list"});
  expect_invalid(R"({"segments": {}})", {"segments: expected a list, got object"});
  expect_invalid(R"({"segments": [7]})", {"segments[0]: expected an object, got number 7"});
  expect_invalid(R"({"segments": [{"address": 4096, "total_size": 512}]})",
                 {"segments[0]: the field 'blocks' is missing"});
  const std::string segment = R"({"address": 4096, "total_size": 1024, "blocks": [)";
  const std::string good_block = R"({"address": 4096, "size": 512, "state": "inactive"})";
  expect_invalid(R"({"segments": [)" + segment + good_block + R"(, {"address": 4608, "size": "512",
                 "state": "inactive"}]}]})",
                 {"segments[0].blocks[1].size: expected a non-negative integer, got string \"512\""});
  expect_invalid(R"({"segments": [)" + segment + R"({"address": 4096, "size": -1, "state": "inactive"}]}]})",
                 {"segments[0].blocks[0].size", "got number -1"});
  expect_invalid(R"({"segments": [)" + segment + R"({"address": 4096, "size": 512, "state": "busy"}]}]})",
                 {"segments[0].blocks[0].state: unknown block state \"busy\"", "active_pending_free"});
  expect_invalid(R"({"segments": [)" + segment + R"({"size": 512, "state": "inactive"}]}]})",
                 {"segments[0].blocks[0]: the field 'address' is missing"});
  expect_invalid(R"({"segments": [)" + segment + R"({"address": 4096, "size": 512, "state": "inactive",
                 "recorded_streams": [3, true]}]}]})",
                 {"segments[0].blocks[0].recorded_streams[1]: expected a non-negative integer, got boolean"});
  expect_invalid(R"({"segments": [)" + segment + R"({"address": 4096, "size": 512, "state": "inactive",
                 "pending_fences": 4294967296}]}]})",
                 {"segments[0].blocks[0].pending_fences: 4294967296 is out of range"});
  expect_invalid(R"({"snapshot": {"segments": [{"address": 1, "total_size": 2, "blocks": [],
                 "segment_type": "huge"}]}})",
                 {"snapshot.segments[0].segment_type: unknown segment type \"huge\""});
}

TEST(Report, TableShowsAPendingBlockWithItsStreamsAndFences) {
  MixedState m;
  const std::string table = format_block_table(m.s.a().segments(-1), 100, m.names);
  EXPECT_EQ(table.rfind("Per-block stream report", 0), 0u) << table;
  const auto header = row(table, "block");
  EXPECT_EQ(header, (std::vector<std::string>{"block", "size", "state", "alloc", "on", "recorded", "on", "fences",
                                              "age", "ms"}));
  // address, size (2 words), state, allocation stream, recorded streams, fences, age
  const auto once = row(table, hex_address(m.once_recorded));
  ASSERT_EQ(once.size(), 8u) << table;
  EXPECT_EQ(std::vector<std::string>(once.begin() + 1, once.begin() + 7),
            (std::vector<std::string>{"4.00", "KiB", "active_pending_free", "producer", "consumer", "1"}));
  const auto twice = row(table, hex_address(m.twice_recorded));
  ASSERT_EQ(twice.size(), 8u) << table;
  EXPECT_EQ(std::vector<std::string>(twice.begin() + 3, twice.begin() + 7),
            (std::vector<std::string>{"active_pending_free", "producer", "consumer,other", "2"}));
  const auto live = row(table, hex_address(m.live));
  ASSERT_EQ(live.size(), 8u) << table;
  EXPECT_EQ(live[3], "active_allocated");
  EXPECT_EQ(live[5], "-");
  EXPECT_NE(table.find("inactive (own stream) producer"), std::string::npos) << table;
  EXPECT_NE(table.find("  device 1:\n"), std::string::npos) << "two devices: rows are grouped by device\n" << table;
  EXPECT_NE(table.find(" " + hex(m.remote, 1) + " "), std::string::npos) << "unnamed streams print in hex\n" << table;
}

TEST(Report, TableStopsAtTheRowLimit) {
  MixedState m;
  std::size_t blocks = 0;
  for (const SegmentInfo& s : m.s.a().segments(-1)) blocks += s.blocks.size();
  const std::string table = format_block_table(m.s.a().segments(-1), 2, m.names);
  EXPECT_NE(table.find("... " + std::to_string(blocks - 2) + " more block(s) not shown"), std::string::npos) << table;
  EXPECT_EQ(table.find("device 1"), std::string::npos) << "no rows of device 1, so no heading\n" << table;
}

TEST(Report, PendingByStreamSumsToThePendingStats) {
  MixedState m;
  const std::string text = format_pending_by_stream(m.s.a().segments(-1), m.names);
  const DeviceStats d0 = m.s.stats(0);
  const DeviceStats d1 = m.s.stats(1);
  const auto pending_bytes = static_cast<std::size_t>(d0.pending_bytes.current + d1.pending_bytes.current);
  ASSERT_GT(d0.pending_bytes.current, 0);
  // total: blocks, bytes (2 words), free-not-settled bytes (2 words); no "waiting on" cell
  const auto total = row(text, "total");
  ASSERT_EQ(total.size(), 6u) << text;
  EXPECT_EQ(total[1], std::to_string(d0.pending_blocks.current + d1.pending_blocks.current));
  EXPECT_EQ(std::vector<std::string>(total.begin() + 2, total.begin() + 4), bytes_words(pending_bytes)) << text;
  // Per allocation stream: each pending block once, whatever the streams it waits on.
  const auto producer = row(text, "producer");
  ASSERT_EQ(producer.size(), 7u) << text;
  EXPECT_EQ(producer[1], "2");
  EXPECT_EQ(std::vector<std::string>(producer.begin() + 2, producer.begin() + 4), bytes_words(12 * KiB));
  EXPECT_EQ(producer[4], "consumer,other");
  EXPECT_EQ(std::vector<std::string>(producer.begin() + 5, producer.end()), bytes_words(kBig))
      << "the large block freed without uses is back with its stream, not settled";
  const auto consumer = row(text, "consumer");
  ASSERT_EQ(consumer.size(), 7u) << text;
  EXPECT_EQ(consumer[1], "1");
  EXPECT_EQ(std::vector<std::string>(consumer.begin() + 2, consumer.begin() + 4), bytes_words(MiB));
  EXPECT_EQ(consumer[4], "producer");
  EXPECT_NE(text.find("  device 1:\n"), std::string::npos) << "two devices: rows are grouped by device\n" << text;
}

TEST(Report, NothingPendingIsOneLine) {
  MixedState m;
  m.s.sim->synchronize_all();
  m.s.a().synchronize_fences();
  const std::string text = format_pending_by_stream(m.s.a().segments(-1), m.names);
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
  EXPECT_NE(text.find("none"), std::string::npos) << text;
  EXPECT_EQ(format_pending_by_stream({}),
            "Pending frees by allocation stream: none (no freed block waits for a fence).\n");
}

TEST(Report, BlockReportIsTheTableThenThePendingSummary) {
  MixedState m;
  const auto segments = m.s.a().segments(-1);
  EXPECT_EQ(format_block_report(segments, 5, m.names),
            format_block_table(segments, 5, m.names) + "\n" + format_pending_by_stream(segments, m.names));
}

BlockInfo block_at(const std::vector<BlockInfo>& blocks, const void* ptr) {
  for (const BlockInfo& b : blocks) {
    if (b.address == reinterpret_cast<std::uintptr_t>(ptr)) return b;
  }
  ADD_FAILURE() << "no block at " << ptr;
  return {};
}

// Ages run from the allocation, and from the free where the device-locked path frees; a free on the
// fast path reads no clock, so the block it makes hot keeps its allocation's time.
TEST(Report, AgesRunFromTheAllocationOrAFreeOnTheDeviceLockedPath) {
  SimSetup s{""};
  const Stream stream = s.sim->create_stream(0);
  const Stream user = s.sim->create_stream(0);
  const auto wait = [] { std::this_thread::sleep_for(std::chrono::milliseconds(60)); };
  void* p = s.a().allocate(4 * KiB, 0, stream);
  s.a().deallocate(p, 4 * KiB, 0, stream);  // puts the block in the stream's hot list
  void* q = s.a().allocate(4 * KiB, 0, stream);
  ASSERT_EQ(q, p) << "the fast path serves the hot block";
  wait();
  EXPECT_GE(block_at(s.a().blocks(0), q).age_ms, 50.0);
  s.a().deallocate(q, 4 * KiB, 0, stream);
  const BlockInfo hot = block_at(s.a().blocks(0), q);
  EXPECT_EQ(hot.state, BlockInfo::State::kFree);
  EXPECT_GE(hot.age_ms, 50.0) << "the fast path's free keeps the allocation's time";

  void* r = s.a().allocate(4 * KiB, 0, stream);
  wait();
  s.sim->enqueue(0, user, [] {});
  s.a().record_stream(r, user);
  s.a().deallocate(r, 4 * KiB, 0, stream);  // a block with another use: the device-locked path
  const BlockInfo pending = block_at(s.a().blocks(0), r);
  EXPECT_EQ(pending.state, BlockInfo::State::kPendingFree);
  EXPECT_LT(pending.age_ms, 50.0) << "timed at the free";
  s.sim->synchronize_all();
  s.a().synchronize_fences();
  s.a().validate();
}

}  // namespace
}  // namespace streamalloc::testing
