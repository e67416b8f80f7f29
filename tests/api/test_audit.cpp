// Audit, poisoning, quarantine and the happens-before check on the simulated device: each message
// fires exactly when it should, and each debug option turns the prefetch pipeline's silent corruption loud.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <chrono>
#include <string>

#include "seed_pipeline.hpp"

namespace streamalloc::testing {
namespace {

class AuditLog {
 public:
  // The pid keeps parallel ctest processes (one per test) off each other's files.
  AuditLog()
      : path_(::testing::TempDir() + "streamalloc_audit_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter_++) + ".log") {}
  ~AuditLog() { std::remove(path_.c_str()); }
  std::string conf(const std::string& extra = "") const {
    return "audit:warn,audit_file:" + path_ + (extra.empty() ? "" : "," + extra);
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  int count(const std::string& needle) const {
    const std::string t = text();
    int n = 0;
    for (std::size_t pos = t.find(needle); pos != std::string::npos; pos = t.find(needle, pos + 1)) ++n;
    return n;
  }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(Audit, RecordStreamMisuseIsReportedOncePerCall) {
  AuditLog log;
  {
    SimSetup s(log.conf());
    const Stream a = s.sim->create_stream();
    const Stream b = s.sim->create_stream();
    void* p = s.a().allocate(4096, 0, a);
    s.a().record_stream(p, b);  // fine: no message
    s.a().record_stream(p, a);
    s.a().record_stream(p, b);
    s.a().deallocate(p, 4096, 0, a);
    s.a().record_stream(p, b);
  }
  EXPECT_EQ(log.count("redundant record_stream"), 1) << log.text();
  EXPECT_EQ(log.count("duplicate record_stream"), 1) << log.text();
  EXPECT_EQ(log.count("came too late"), 1) << log.text();
  EXPECT_NE(log.text().find("Remove this record_stream call"), std::string::npos) << "says what to do";
}

TEST(Audit, CorrectPipelineLogsNothing) {
  AuditLog log;
  PipelineOptions o;
  run_pipeline(log.conf("check_sync:1"), o, 300, 64 * KiB);
  EXPECT_EQ(log.text(), "");
}

TEST(Audit, LongPendingBlocksAreReported) {
  AuditLog log;
  {
    SimSetup s(log.conf("pending_warn_ms:100"));
    const Stream a = s.sim->create_stream();
    const Stream busy = s.sim->create_stream();
    void* p = s.a().allocate(4096, 0, a);
    s.sim->enqueue(0, busy, [] {});
    s.a().record_stream(p, busy);
    s.a().deallocate(p, 4096, 0, a);
    s.a().process_fences();
    EXPECT_EQ(log.count("have waited"), 0) << "not yet late";
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    s.a().process_fences();
    s.a().process_fences();  // reported once per fence
  }
  EXPECT_EQ(log.count("have waited"), 1) << log.text();
}

TEST(Audit, HostSyncAndOutOfMemoryAreReported) {
  AuditLog log;
  {
    SimSetup s(log.conf(), SimBackend::Mode::kManual, 72 * MiB);
    const Stream a = s.sim->create_stream();
    const Stream u = s.sim->create_stream();
    void* p = s.a().allocate(64 * MiB, 0, a);
    s.sim->enqueue(0, u, [] {});
    s.a().record_stream(p, u);
    s.a().deallocate(p, 64 * MiB, 0, a);
    void* q = s.a().allocate(64 * MiB, 0, a);  // needs a host sync on u's fence
    EXPECT_THROW(s.a().allocate(64 * MiB, 0, a), Error);
    s.a().deallocate(q, 0, 0, a);
  }
  EXPECT_EQ(log.count("waited on the host"), 1) << log.text();
  EXPECT_EQ(log.count("out of memory"), 1) << log.text();
  EXPECT_NE(log.text().find("What to do"), std::string::npos);
}

TEST(Audit, StatsCountEvenWhenTheAuditIsOff) {
  SimSetup s("audit:off");
  void* p = s.a().allocate(4096, 0, 0);
  s.a().record_stream(p, 0);
  EXPECT_EQ(s.stats().record_stream_on_alloc_stream, 1);
  s.a().deallocate(p, 0, 0, 0);
}

TEST(Poison, MissingRecordStreamReadsPoisonEveryTime) {
  PipelineOptions o;
  o.record_stream = false;
  const PipelineResult r = run_pipeline("poison:free", o, 200, 64 * KiB);
  EXPECT_GT(r.wrong, 0);
  EXPECT_EQ(r.poisoned, r.wrong) << "every wrong read sees 0xFF (NaN in floats), not plausible stale data";
}

TEST(Poison, AllocPoisonShowsAReadBeforeTheProducerWrote) {
  SimSetup s("poison:alloc");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  for (int round = 0; round < 2; ++round) {  // a fresh block, then a reused one
    auto* batch = static_cast<unsigned char*>(s.a().allocate(4096, 0, producer));
    enqueue_fill(*s.sim, producer, batch, 4096, 0x11);  // the copy
    ASSERT_EQ(s.sim->advance(0, producer, 1), 1u);      // the producer passed the malloc, not the copy
    unsigned char seen = 0;
    s.sim->enqueue(0, consumer, [&] { seen = batch[100]; });  // no wait_event
    s.sim->synchronize_stream(0, consumer);
    EXPECT_EQ(seen, 0xFF) << "the early read sees poison (NaN), not old data";
    s.sim->synchronize_all();
    EXPECT_EQ(batch[100], 0x11);
    s.a().deallocate(batch, 0, 0, producer);
  }
}

TEST(Poison, FixedPipelineNeverSeesPoison) {
  const PipelineResult r = run_pipeline("poison:both", PipelineOptions{}, 500, 64 * KiB);
  EXPECT_EQ(r.wrong, 0);
}

// The poison fill of a released pending block is new work on its allocation stream: another stream may
// take the block only after a fence behind the fill, even when the block's own batch had completed
// before its other stream's fence did (found by the soak run: C's data was overwritten with 0xFF).
TEST(Poison, FillOfAReleasedBlockCompletesBeforeAnotherStreamGetsIt) {
  SimSetup s("poison:free");
  SimBackend& sim = *s.sim;
  const Stream a = sim.create_stream(), b = sim.create_stream(), c = sim.create_stream();
  constexpr std::size_t kBytes = 1 * MiB;
  void* x = s.a().allocate(kBytes, 0, a);
  s.a().record_stream(x, b);
  s.a().deallocate(x, kBytes, 0, a);  // pending on b
  s.a().process_fences();             // fences a's and b's batches
  sim.synchronize_stream(0, a);       // a's fence completes, b's has not
  s.a().process_fences();
  sim.synchronize_stream(0, b);
  s.a().process_fences();  // the block is released: its fill is queued on a
  void* y = s.a().allocate(kBytes, 0, c);
  enqueue_fill(sim, c, y, kBytes, 7);
  sim.synchronize_all();
  EXPECT_EQ(static_cast<unsigned char*>(y)[0], 7) << "a fill queued on another stream overwrote the block";
  s.a().deallocate(y, kBytes, 0, c);
  s.a().validate();
}

TEST(Quarantine, DelaysReuseOfFreedMemory) {
  SimSetup s("quarantine_mb:1", SimBackend::Mode::kEager);
  void* p = s.a().allocate(256 * KiB, 0, 0);
  s.a().deallocate(p, 0, 0, 0);
  void* q = s.a().allocate(256 * KiB, 0, 0);
  EXPECT_NE(q, p) << "the freed block is held back";
  s.a().validate();
  void* fill[4];
  for (void*& f : fill) f = s.a().allocate(256 * KiB, 0, 0);
  for (void* f : fill) s.a().deallocate(f, 0, 0, 0);  // pushes p out of the 1 MiB quarantine
  s.a().validate();
  s.a().deallocate(q, 0, 0, 0);
  s.a().empty_cache();
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0) << "empty_cache flushes the quarantine";
  s.a().validate();
}

TEST(Quarantine, WithPoisonMissingRecordStreamAlwaysReadsPoison) {
  PipelineOptions o;
  o.record_stream = false;
  o.consumer_first = true;
  const PipelineResult r = run_pipeline("poison:free,quarantine_mb:64", o, 200, 64 * KiB);
  EXPECT_GT(r.wrong, 0);
  EXPECT_EQ(r.poisoned, r.wrong);
}

TEST(CheckSync, FlagsTheMissingWait) {
  AuditLog log;
  PipelineOptions o;
  o.wait_event = false;
  const PipelineResult r = run_pipeline(log.conf("check_sync:1"), o, 100, 64 * KiB);
  EXPECT_EQ(r.stats.missing_wait_warnings, 100) << "one per record_stream'd batch";
  EXPECT_GE(log.count("missing wait"), 1);
  EXPECT_NE(log.text().find("wait_event"), std::string::npos) << "says what to do";
}

TEST(CheckSync, SilentOnTheFixedAndDoubleBufferedPipelines) {
  PipelineOptions o;
  EXPECT_EQ(run_pipeline("check_sync:1", o, 300, 64 * KiB).stats.missing_wait_warnings, 0);
  o.double_buffered = true;
  EXPECT_EQ(run_pipeline("check_sync:1", o, 300, 64 * KiB).stats.missing_wait_warnings, 0);
}

TEST(CheckSync, HostSynchronizeCountsAsOrdering) {
  SimSetup s("check_sync:1");
  const Stream p = s.sim->create_stream();
  const Stream c = s.sim->create_stream();
  void* a = s.a().allocate(4096, 0, p);
  s.a().note_stream_synchronize(p);  // torch.cuda.current_stream().synchronize() on the producer
  s.a().record_stream(a, c);
  s.a().deallocate(a, 0, 0, p);
  void* b = s.a().allocate(4096, 0, p);
  s.a().record_stream(b, c);  // no sync since b was handed out
  EXPECT_EQ(s.stats().missing_wait_warnings, 1);
  s.a().note_stream_synchronize(p);
  s.a().deallocate(b, 0, 0, p);  // a later sync does not undo the warning, nor repeat it
  EXPECT_EQ(s.stats().missing_wait_warnings, 1);
  void* d = s.a().allocate(4096, 0, p);
  s.a().note_device_synchronize();
  s.a().record_stream(d, c);
  s.a().deallocate(d, 0, 0, p);
  EXPECT_EQ(s.stats().missing_wait_warnings, 1);
}

}  // namespace
}  // namespace streamalloc::testing
