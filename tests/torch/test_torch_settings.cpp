// PyTorch's allocator settings reach streamalloc (torch_settings.hpp), through PyTorch's own parser
// (c10::CachingAllocator::setAllocatorSettings, what torch.cuda.memory._set_allocator_settings calls),
// over the simulated device.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <c10/core/AllocatorConfig.h>
#include <c10/util/Exception.h>

#include "streamalloc/sim_backend.hpp"
#include "torch_allocator.hpp"
#include "torch_settings.hpp"

namespace streamalloc::torch {
namespace {

RoundupDivisions filled(std::size_t divisions) {
  RoundupDivisions table;
  table.fill(divisions);
  return table;
}

class TorchSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c10::CachingAllocator::setAllocatorSettings("");
    follow_pytorch_settings();
    allocator_ = std::make_shared<TorchAllocator>(Options::parse("backend:sim"));
    TorchAllocator::set_current(allocator_.get());
    allocator_->init(1);
    sim_ = dynamic_cast<SimBackend*>(&core().backend());
    ASSERT_NE(sim_, nullptr);
    stream_ = sim_->create_stream(0);
  }
  void TearDown() override {
    c10::CachingAllocator::setAllocatorSettings("");
    TorchAllocator::set_current(nullptr);
  }
  Allocator& core() { return *allocator_->core(); }
  // The bytes a request of `size` occupies (active_bytes, as PyTorch's test_allocator_settings reads).
  std::int64_t occupies(std::size_t size) {
    const std::int64_t before = core().stats(0).active_bytes[0].current;
    void* p = core().allocate(size, 0, stream_);
    const std::int64_t bytes = core().stats(0).active_bytes[0].current - before;
    core().deallocate(p, 0, 0, stream_);
    return bytes;
  }

  std::shared_ptr<TorchAllocator> allocator_;
  SimBackend* sim_ = nullptr;
  Stream stream_ = 0;
};

TEST_F(TorchSettingsTest, RoundupPower2DivisionsFollowsSetAllocatorSettings) {
  const std::size_t nbytes = 4 * 21 * MiB;  // test_allocator_settings' 21 Mi floats
  EXPECT_EQ(occupies(nbytes), static_cast<std::int64_t>(nbytes));
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:4");
  EXPECT_EQ(core().roundup_power2_divisions(), filled(4));
  EXPECT_EQ(occupies(nbytes), static_cast<std::int64_t>(96 * MiB)) << "64 MiB + 2 * 16 MiB";
  // The per-interval form: [64 MiB, 128 MiB) gets 8 divisions, the intervals above it 2.
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:[64:8,256:2,>:1]");
  EXPECT_EQ(core().roundup_power2_divisions(), (RoundupDivisions{8, 8, 8, 8, 8, 8, 8, 0, 2, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(occupies(nbytes), static_cast<std::int64_t>(88 * MiB)) << "64 MiB + 3 * 8 MiB";
  EXPECT_EQ(occupies(1100 * MiB), static_cast<std::int64_t>(1100 * MiB)) << "1 division: 512-byte rounding";
  // A settings call that does not name it resets it, as PyTorch's parser does.
  c10::CachingAllocator::setAllocatorSettings("expandable_segments:False");
  EXPECT_EQ(core().roundup_power2_divisions(), RoundupDivisions{});
  core().validate();
}

TEST_F(TorchSettingsTest, ASettingPyTorchRefusesChangesNothing) {
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:4,graph_capture_record_stream_reuse:True");
  ASSERT_TRUE(core().graph_capture_record_stream_reuse());
  EXPECT_THROW(c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:3"), c10::ValueError);
  EXPECT_EQ(core().roundup_power2_divisions(), filled(4)) << "PyTorch refused it before streamalloc saw it";
  EXPECT_THROW(c10::CachingAllocator::setAllocatorSettings("expandable_segments:maybe"), c10::ValueError);
  EXPECT_FALSE(core().expandable_segments());
  EXPECT_THROW(c10::CachingAllocator::setAllocatorSettings("graph_capture_record_stream_reuse:maybe"), c10::Error)
      << "PyTorch's CUDA parser still runs inside the wrapped hook";
  EXPECT_TRUE(core().graph_capture_record_stream_reuse());
}

TEST_F(TorchSettingsTest, ExpandableSegmentsAndCaptureReuseFollowTheirKeys) {
  c10::CachingAllocator::setAllocatorSettings("expandable_segments:True");
  EXPECT_TRUE(core().expandable_segments());
  void* p = core().allocate(30 * MiB, 0, stream_);
  ASSERT_EQ(core().segments(0).size(), 1u);
  EXPECT_TRUE(core().segments(0)[0].expandable);
  c10::CachingAllocator::setAllocatorSettings("graph_capture_record_stream_reuse:True");
  EXPECT_TRUE(core().expandable_segments()) << "a call that does not name it keeps it";
  EXPECT_TRUE(core().graph_capture_record_stream_reuse());
  c10::CachingAllocator::setAllocatorSettings("expandable_segments:False,graph_capture_record_stream_reuse:False");
  EXPECT_FALSE(core().expandable_segments());
  EXPECT_FALSE(core().graph_capture_record_stream_reuse());
  core().deallocate(p);
  core().validate();
}

TEST_F(TorchSettingsTest, AnAllocatorMadeLaterReadsPyTorchsLastSettings) {
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:8,expandable_segments:True");
  auto later = std::make_shared<TorchAllocator>(Options::parse("backend:sim"));
  later->init(1);
  EXPECT_EQ(later->core()->roundup_power2_divisions(), filled(8));
  EXPECT_TRUE(later->core()->expandable_segments());
  const PyTorchSettings none =
      pytorch_settings("graph_capture_record_stream_reuse:False", SettingsSource::kEnvironment);
  EXPECT_FALSE(none.roundup_power2_divisions.has_value()) << "at start, streamalloc's option stands";
  EXPECT_FALSE(none.expandable_segments.has_value());
}

}  // namespace
}  // namespace streamalloc::torch
