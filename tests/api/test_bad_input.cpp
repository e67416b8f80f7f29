// The bad-input catalogue: every misuse gets a clear error and changes nothing.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

// The error message must contain `needle` and the allocator must still validate with the same stats.
void expect_rejected(SimSetup& s, const std::function<void()>& call, ErrorCode code, const std::string& needle) {
  const DeviceStats before = s.stats();
  try {
    call();
    FAIL() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  s.a().validate();
  const DeviceStats after = s.stats();
  EXPECT_EQ(after.allocation[0].current, before.allocation[0].current);
  EXPECT_EQ(after.allocated_bytes[0].current, before.allocated_bytes[0].current);
  EXPECT_EQ(after.pending_blocks.current, before.pending_blocks.current);
}

TEST(BadInput, DoubleFree) {
  SimSetup s("");
  void* p = s.a().allocate(4096, 0, 0);
  s.a().deallocate(p, 4096, 0, 0);
  expect_rejected(
      s, [&] { s.a().deallocate(p, 4096, 0, 0); }, ErrorCode::kInvalidArgument, "double free");
  EXPECT_EQ(s.stats().invalid_frees, 1);
}

TEST(BadInput, DoubleFreeOfAPendingBlock) {
  SimSetup s("");
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(4096, 0, 0);
  s.a().record_stream(p, u);
  s.a().deallocate(p, 4096, 0, 0);
  expect_rejected(
      s, [&] { s.a().deallocate(p, 4096, 0, 0); }, ErrorCode::kInvalidArgument, "waiting for its stream fences");
}

TEST(BadInput, ForeignPointer) {
  SimSetup s("");
  int on_stack = 0;
  expect_rejected(
      s, [&] { s.a().deallocate(&on_stack, 4, 0, 0); }, ErrorCode::kInvalidArgument, "not allocated by streamalloc");
}

TEST(BadInput, InteriorPointer) {
  SimSetup s("");
  auto* p = static_cast<char*>(s.a().allocate(4096, 0, 0));
  expect_rejected(
      s, [&] { s.a().deallocate(p + 512, 0, 0, 0); }, ErrorCode::kInvalidArgument, "inside the block");
  s.a().deallocate(p, 4096, 0, 0);
}

TEST(BadInput, WrongSize) {
  SimSetup s("");
  void* p = s.a().allocate(4096, 0, 0);
  expect_rejected(
      s, [&] { s.a().deallocate(p, 100, 0, 0); }, ErrorCode::kInvalidArgument, "allocated with size 4096");
  s.a().deallocate(p, 4096, 0, 0);  // still live, and the right call works
  s.a().validate();
}

TEST(BadInput, WrongDevice) {
  SimSetup s("", SimBackend::Mode::kManual, 256 * MiB, 2);
  void* p = s.a().allocate(4096, 1, 0);
  expect_rejected(
      s, [&] { s.a().deallocate(p, 4096, 0, 0); }, ErrorCode::kInvalidArgument, "lives on device 1");
  s.a().deallocate(p, 4096, 1, 0);
  s.a().validate();
}

TEST(BadInput, DeviceOutOfRange) {
  SimSetup s("");
  expect_rejected(
      s, [&] { s.a().allocate(10, 3, 0); }, ErrorCode::kInvalidArgument, "device 3 does not exist");
  expect_rejected(
      s, [&] { s.a().allocate(10, -1, 0); }, ErrorCode::kInvalidArgument, "does not exist");
}

TEST(BadInput, StreamOfAnotherDevice) {
  SimSetup s("", SimBackend::Mode::kManual, 256 * MiB, 2);
  const Stream on_device1 = s.sim->create_stream(1);
  expect_rejected(
      s, [&] { s.a().allocate(10, 0, on_device1); }, ErrorCode::kInvalidArgument, "belongs to device 1");
  void* p = s.a().allocate(4096, 0, 0);
  expect_rejected(
      s, [&] { s.a().record_stream(p, on_device1); }, ErrorCode::kInvalidArgument, "belongs to device 1");
  s.a().deallocate(p, 4096, 0, 0);
}

TEST(BadInput, RecordStreamOnFreedPointerIsCountedNotFatal) {
  SimSetup s("");
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(4096, 0, 0);
  s.a().deallocate(p, 4096, 0, 0);
  EXPECT_NO_THROW(s.a().record_stream(p, u));
  EXPECT_EQ(s.stats().record_stream_unknown_ptr, 1);
  s.a().validate();
}

TEST(BadInput, FreeOfNullIsANoOp) {
  SimSetup s("");
  EXPECT_NO_THROW(s.a().deallocate(nullptr, 0, 0, 0));
  EXPECT_EQ(s.stats().invalid_frees, 0);
}

TEST(BadInput, CallsAfterShutdown) {
  SimSetup s("");
  void* live = s.a().allocate(4096, 0, 0);
  s.a().shutdown();
  EXPECT_TRUE(s.a().is_shut_down());
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { s.a().allocate(10, 0, 0); },
           [&] { s.a().deallocate(live, 4096, 0, 0); },
           [&] { s.a().empty_cache(); },
           [&] { s.a().record_stream(live, 0); },
       }) {
    try {
      call();
      FAIL() << "expected kShutdown";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kShutdown);
      EXPECT_NE(std::string(e.what()).find("after shutdown"), std::string::npos);
    }
  }
  EXPECT_EQ(s.stats().allocation[0].current, 1) << "reports still work after shutdown";
  s.a().shutdown();  // twice is fine
}

TEST(BadInput, BadConfigurationNamesTheKey) {
  try {
    Options::parse("cross_stream_reuse:sometimes");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConfig);
    EXPECT_NE(std::string(e.what()).find("cross_stream_reuse"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("never|settled|wait"), std::string::npos) << e.what();
  }
}

TEST(BadInput, NullBackendIsAConfigError) { EXPECT_THROW(Allocator(Options{}, nullptr), Error); }

}  // namespace
}  // namespace streamalloc::testing
