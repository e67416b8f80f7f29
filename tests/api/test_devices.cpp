// Frees across devices (allocator.hpp, Allocator::deallocate): a free that names its device goes
// straight to that device's cache; one that names none (PyTorch's DataPtr deleter knows only the
// pointer) is looked up, first where the freeing thread allocated last, then on every other device.
// Either way the block comes back to its own device and stream, and misuse is refused with nothing
// changed.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"

namespace streamalloc {
namespace {

using testing::SimSetup;

class Devices : public ::testing::Test {
 protected:
  Devices() : setup_("backend:sim,log_level:error", SimBackend::Mode::kEager, 256 * MiB, /*devices=*/3) {
    for (int d = 0; d < 3; ++d) streams_.push_back(setup_.sim->create_stream(d));
  }
  Allocator& a() { return setup_.a(); }
  std::int64_t live(int device) { return setup_.stats(device).allocation[0].current; }

  SimSetup setup_;
  std::vector<Stream> streams_;  // one per device
};

TEST_F(Devices, AFreeWithoutADeviceReachesTheBlocksDeviceAndStream) {
  // Each block is freed without a device, with and without its stream, while this thread's last
  // allocation was on another device: the lookup finds the right cache whatever the first guess.
  std::vector<std::pair<void*, int>> blocks;
  for (int round = 0; round < 4; ++round) {
    for (int d = 0; d < 3; ++d) blocks.emplace_back(a().allocate(4 * KiB, d, streams_[static_cast<std::size_t>(d)]), d);
  }
  for (int d = 0; d < 3; ++d) EXPECT_EQ(live(d), 4);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto [ptr, device] = blocks[i];
    const Stream stream = i % 2 == 0 ? 0 : streams_[static_cast<std::size_t>(device)];
    a().deallocate(ptr, 4 * KiB, -1, stream);
    EXPECT_EQ(a().device_of(ptr), -1) << "block " << i << " is still live";
  }
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(live(d), 0) << "device " << d;
    EXPECT_EQ(setup_.stats(d).pending_blocks.current, 0) << "a free with its own stream or none adds no use";
    EXPECT_EQ(setup_.stats(d).invalid_frees, 0);
  }
  ASSERT_NO_THROW(a().validate());

  // Freed back to their own stream: the next allocation of the size on that stream gets one back.
  for (int d = 0; d < 3; ++d) {
    void* again = a().allocate(4 * KiB, d, streams_[static_cast<std::size_t>(d)]);
    EXPECT_EQ(a().device_of(again), d);
    bool reused = false;
    for (const auto& [ptr, device] : blocks) reused |= ptr == again && device == d;
    EXPECT_TRUE(reused) << "device " << d << " handed out a new block instead of the freed one";
    a().deallocate(again);
  }
  ASSERT_NO_THROW(a().validate());
}

TEST_F(Devices, AFreeWithoutADeviceFromAnotherThreadIsFound) {
  // The freeing thread allocated last on device 0; the blocks are device 2's.
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i)
    blocks.push_back(a().allocate(64 * KiB + 512 * static_cast<std::size_t>(i), 2, streams_[2]));
  std::string error;
  std::thread other([&] {
    try {
      a().deallocate(a().allocate(512, 0, streams_[0]));
      for (void* ptr : blocks) a().deallocate(ptr);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  other.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(live(2), 0);
  EXPECT_EQ(live(0), 0);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(Devices, AFreeOnAnotherStreamOfTheDeviceIsOneMoreUse) {
  const Stream side = setup_.sim->create_stream(1);
  void* ptr = a().allocate(4 * KiB, 1, streams_[1]);
  a().deallocate(ptr, 4 * KiB, -1, side);
  EXPECT_EQ(live(1), 0);
  EXPECT_EQ(setup_.stats(1).pending_blocks.allocated, 1) << "the free on the side stream did not wait for it";
  ASSERT_NO_THROW(a().validate());
}

// record_stream finds the stream's device in the caches' stream tables (each checked the stream when
// it first used it), so a stream a device has used costs no backend query; one of another device is
// still refused.
TEST_F(Devices, RecordStreamOnAStreamTheDeviceHasUsedAsksTheBackendNothing) {
  const Stream side = setup_.sim->create_stream(2);
  void* first = a().allocate(4 * KiB, 2, streams_[2]);
  a().record_stream(first, side);
  a().deallocate(first, 4 * KiB, 2, streams_[2]);  // pending on `side`: device 2 has used it
  void* second = a().allocate(4 * KiB, 2, streams_[2]);
  const std::uint64_t before = setup_.sim->counters().stream_device_queries;
  a().record_stream(second, side);
  EXPECT_EQ(setup_.sim->counters().stream_device_queries, before);
  try {
    a().record_stream(second, streams_[0]);
    FAIL() << "a stream of device 0 was recorded on a block of device 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to device 0"), std::string::npos) << e.what();
  }
  a().deallocate(second, 4 * KiB, 2, streams_[2]);
  setup_.sim->synchronize_all();
  a().process_fences();
  EXPECT_EQ(live(2), 0);
  EXPECT_EQ(setup_.stats(2).pending_blocks.current, 0);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(Devices, MisnamedDevicesAndDoubleFreesAreRefusedAndChangeNothing) {
  void* ptr = a().allocate(4 * KiB, 1, streams_[1]);
  try {
    a().deallocate(ptr, 4 * KiB, 0, streams_[1]);
    FAIL() << "a free naming the wrong device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lives on device 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(live(1), 1);
  EXPECT_EQ(a().device_of(ptr), 1);
  ASSERT_NO_THROW(a().validate());

  a().deallocate(ptr, 4 * KiB, -1, 0);
  EXPECT_EQ(live(1), 0);
  // A second free without a device: the device whose memory holds the address diagnoses it.
  a().deallocate(a().allocate(512, 0, streams_[0]), 512, 0, streams_[0]);  // this thread's last allocation: device 0
  try {
    a().deallocate(ptr, 4 * KiB, -1, 0);
    FAIL() << "a double free was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(setup_.stats(1).invalid_frees, 1);
  EXPECT_EQ(setup_.stats(0).invalid_frees, 0);
  ASSERT_NO_THROW(a().validate());
}

}  // namespace
}  // namespace streamalloc
