// Fault injection: each device call fails once, at several points of a workload that reaches every
// call (reserve, events, GPU waits, host syncs, memsets). After every fault the allocator reports a
// clear error or carries on, its state validates, nothing leaks, and later operations succeed.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "fault_backend.hpp"
#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

using Op = FaultBackend::Op;

struct Rig {
  std::shared_ptr<SimBackend> sim;
  std::shared_ptr<FaultBackend> faults;
  std::unique_ptr<Allocator> allocator;
  Stream a = 0, b = 0, u = 0;

  Rig() {
    SimBackend::Config config;
    config.memory_per_device = 64 * MiB;
    config.mode = SimBackend::Mode::kManual;
    sim = std::make_shared<SimBackend>(config);
    faults = std::make_shared<FaultBackend>(sim);
    allocator =
        std::make_unique<Allocator>(Options::parse("cross_stream_reuse:wait,poison:both,log_level:off"), faults);
    a = sim->create_stream();
    b = sim->create_stream();
    u = sim->create_stream();
  }
};

// Runs the workload step by step. With `tolerate_errors`, a step that throws Error is skipped (the
// fault under test); each step is followed by validate(). Returns the number of steps that threw.
int run_workload(Rig& rig, bool tolerate_errors) {
  Allocator& al = *rig.allocator;
  void* p = nullptr;
  void* q = nullptr;
  void* r = nullptr;
  void* s = nullptr;
  const std::vector<std::function<void()>> steps = {
      [&] { p = al.allocate(1 * MiB, 0, rig.a); },  // reserve, memset
      [&] { rig.sim->enqueue(0, rig.u, [] {}); },   // u is busy
      [&] {
        if (p) al.record_stream(p, rig.u);
      },
      [&] {
        if (p) al.deallocate(p, 0, 0, rig.a);
      },                                             // pending: create_event, record, query
      [&] { q = al.allocate(40 * MiB, 0, rig.b); },  // reserve
      [&] { rig.sim->enqueue(0, rig.b, [] {}); },    // b is busy: q stays unsettled
      [&] {
        if (q) al.deallocate(q, 0, 0, rig.b);
      },                                             // memset (poison)
      [&] { r = al.allocate(40 * MiB, 0, rig.a); },  // no room: GPU wait on b's fence
      [&] {
        if (r) al.deallocate(r, 0, 0, rig.a);
      },
      [&] { s = al.allocate(60 * MiB, 0, rig.a); },  // OOM path: host sync, release, reserve
      [&] {
        if (s) al.deallocate(s, 0, 0, rig.a);
      },
      [&] { al.empty_cache(); },  // host sync, release
  };
  int threw = 0;
  for (const auto& step : steps) {
    try {
      step();
    } catch (const Error& e) {
      if (!tolerate_errors) throw;
      ++threw;
      EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos)
          << "only the injected fault may fail: " << e.what();
    }
    al.validate();
  }
  return threw;
}

class FaultInjection : public ::testing::TestWithParam<std::tuple<Op, int>> {};

TEST_P(FaultInjection, StateValidatesNothingLeaksAndLaterCallsSucceed) {
  const auto [op, nth] = GetParam();
  Rig rig;
  rig.faults->fail(op, nth);
  run_workload(rig, /*tolerate_errors=*/true);
  EXPECT_EQ(rig.faults->injected(), 1) << "the workload must reach the faulted call";
  // Afterwards the allocator works as if nothing happened.
  rig.sim->synchronize_all();
  EXPECT_EQ(run_workload(rig, /*tolerate_errors=*/false), 0);
  rig.sim->synchronize_all();
  rig.allocator->synchronize_fences();
  rig.allocator->empty_cache();
  const DeviceStats st = rig.allocator->stats(0);
  EXPECT_EQ(st.allocation[0].current, 0);
  EXPECT_EQ(st.pending_blocks.current, 0);
  EXPECT_EQ(st.reserved_bytes[0].current, 0) << "no segment leaked";
  EXPECT_EQ(rig.sim->reserved_bytes(0), 0u);
  rig.allocator.reset();
  const SimBackend::Counters c = rig.sim->counters();
  EXPECT_EQ(c.events_created, c.events_destroyed) << "no event leaked";
}

std::string op_name(Op op) {
  switch (op) {
    case Op::kReserve: return "reserve";
    case Op::kCreateEvent: return "create_event";
    case Op::kRecordEvent: return "record_event";
    case Op::kQueryEvent: return "query_event";
    case Op::kQueryStream: return "query_stream";
    case Op::kSynchronizeEvent: return "synchronize_event";
    case Op::kStreamWait: return "stream_wait";
    case Op::kMemset: return "memset";
  }
  return "op";
}

// The first and the second call of each kind (the workload makes one GPU-side wait only).
INSTANTIATE_TEST_SUITE_P(EveryDeviceCall, FaultInjection,
                         ::testing::Values(std::make_tuple(Op::kReserve, 1), std::make_tuple(Op::kReserve, 2),
                                           std::make_tuple(Op::kCreateEvent, 1), std::make_tuple(Op::kCreateEvent, 2),
                                           std::make_tuple(Op::kRecordEvent, 1), std::make_tuple(Op::kRecordEvent, 2),
                                           std::make_tuple(Op::kQueryEvent, 1), std::make_tuple(Op::kQueryEvent, 2),
                                           std::make_tuple(Op::kSynchronizeEvent, 1),
                                           std::make_tuple(Op::kSynchronizeEvent, 2),
                                           std::make_tuple(Op::kStreamWait, 1), std::make_tuple(Op::kMemset, 1),
                                           std::make_tuple(Op::kMemset, 2)),
                         [](const auto& info) {
                           return op_name(std::get<0>(info.param)) + "_call" + std::to_string(std::get<1>(info.param));
                         });

TEST(FaultInjectionErrors, DeviceErrorsReachTheCallerAsBackendErrors) {
  Rig rig;
  rig.faults->fail(Op::kReserve);
  try {
    rig.allocator->allocate(MiB, 0, rig.a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackend);
  }
  EXPECT_NE(rig.allocator->allocate(MiB, 0, rig.a), nullptr);
  rig.allocator->validate();
}

}  // namespace
}  // namespace streamalloc::testing
