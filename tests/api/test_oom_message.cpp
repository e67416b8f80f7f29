// Out-of-memory errors and the memory-fraction range, as PyTorch's CUDA allocator words and bounds them
// (c10/cuda/CUDACachingAllocator.cpp): the same first sentences in the same units, then streamalloc's
// own report. On the simulated device, whose headline says so; under the CUDA backend it is PyTorch's
// "CUDA out of memory.".
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

std::string oom_message(Allocator& allocator, std::size_t bytes, Stream stream) {
  try {
    allocator.allocate(bytes, 0, stream);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    return e.what();
  }
  ADD_FAILURE() << "expected out of memory for " << bytes << " bytes";
  return "";
}

bool matches(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern));
}

TEST(OomMessage, FormatSizeUsesPyTorchsUnitsAndBoundaries) {
  EXPECT_EQ(format_size(0), "0 bytes");
  EXPECT_EQ(format_size(512), "512 bytes");
  EXPECT_EQ(format_size(1024), "1024 bytes");
  EXPECT_EQ(format_size(1025), "1.00 KiB");
  EXPECT_EQ(format_size(1536), "1.50 KiB");
  EXPECT_EQ(format_size(MiB), "1024.00 KiB");
  EXPECT_EQ(format_size(MiB + 1), "1.00 MiB");
  EXPECT_EQ(format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(format_size(GiB), "1024.00 MiB");
  EXPECT_EQ(format_size(GiB + 10 * MiB), "1.01 GiB");
  EXPECT_EQ(format_size(4096 * GiB), "4096.00 GiB") << "no TiB, as in PyTorch";
  EXPECT_EQ(format_size(800000000 * GiB), "800000000.00 GiB");
  // streamalloc's report unit stays as it was: the two differ at the boundaries.
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(MiB), "1.00 MiB");
}

TEST(OomMessage, StartsWithPyTorchsSentencesThenStreamallocsReport) {
  SimSetup s("", SimBackend::Mode::kManual, 100 * MiB);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(64 * MiB, 0, a);
  const std::string msg = oom_message(s.a(), 64 * MiB, a);
  EXPECT_TRUE(
      matches(msg,
              "^Simulated device out of memory\\. Tried to allocate 64\\.00 MiB\\. GPU 0 has a total "
              "capacity of 100\\.00 MiB of which 36\\.00 MiB is free\\. Of the allocated memory 64\\.00 MiB "
              "is allocated by streamalloc, and 0 bytes is reserved by streamalloc but unallocated\\. "
              "streamalloc \\(sim\\): request of 64\\.00 MiB \\(64\\.00 MiB rounded\\) on stream 0x[0-9a-f]+; "))
      << msg;
  EXPECT_TRUE(matches(msg, " What to do: .*max_split_size_mb")) << msg;
  EXPECT_FALSE(matches(msg, " allowed; ")) << "no cap, no cap sentence: " << msg;
  EXPECT_EQ(s.stats().num_ooms, 1);
  s.a().deallocate(p, 64 * MiB, 0, a);
  s.a().validate();
}

TEST(OomMessage, ReservedButUnallocatedIsReservedMinusAllocated) {
  SimSetup s("", SimBackend::Mode::kManual, 64 * MiB);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(4 * MiB, 0, a);  // from a 20 MiB segment: 16 MiB of it is free
  const std::string msg = oom_message(s.a(), 60 * MiB, a);
  EXPECT_TRUE(matches(msg,
                      "Tried to allocate 60\\.00 MiB\\. GPU 0 has a total capacity of 64\\.00 MiB of which "
                      "44\\.00 MiB is free\\. Of the allocated memory 4\\.00 MiB is allocated by streamalloc, "
                      "and 16\\.00 MiB is reserved by streamalloc but unallocated\\."))
      << msg;
  s.a().deallocate(p, 4 * MiB, 0, a);
}

// PyTorch reports the device allocation that failed: a small request asks for a 2 MiB segment.
TEST(OomMessage, TriedToAllocateIsTheSegmentAndTheCapSaysAllowed) {
  SimSetup s("memory_fraction:0.5", SimBackend::Mode::kManual, 100 * MiB);
  const Stream a = s.sim->create_stream();
  // A 50 MiB segment, the whole cap; the 1 MiB left is too small to split off, so the block is 50 MiB.
  void* p = s.a().allocate(49 * MiB, 0, a);
  const std::string msg = oom_message(s.a(), 100, a);
  EXPECT_TRUE(matches(msg,
                      "out of memory\\. Tried to allocate 2\\.00 MiB\\. GPU 0 has a total capacity of "
                      "100\\.00 MiB of which 50\\.00 MiB is free\\. 50\\.00 MiB allowed; Of the allocated "
                      "memory 50\\.00 MiB is allocated by streamalloc, and 0 bytes is reserved"))
      << msg;
  EXPECT_TRUE(matches(msg, "request of 100 bytes \\(512 bytes rounded\\)")) << msg;
  EXPECT_TRUE(matches(msg, "memory fraction cap 0\\.5 = 50\\.00 MiB")) << msg;
  s.a().deallocate(p, 49 * MiB, 0, a);
}

TEST(OomMessage, LargerThanTheDeviceSaysSoAtOnceInPyTorchsWords) {
  SimSetup s("", SimBackend::Mode::kEager, 64 * MiB);
  const std::string msg = oom_message(s.a(), 800000000 * GiB, 0);
  EXPECT_TRUE(matches(msg,
                      "^Simulated device out of memory\\. Tried to allocate 800000000\\.00 GiB\\. GPU 0 has "
                      "a total capacity of 64\\.00 MiB of which 64\\.00 MiB is free\\. Of the allocated memory "
                      "0 bytes is allocated by streamalloc, and 0 bytes is reserved by streamalloc but "
                      "unallocated\\. streamalloc \\(sim\\): .*larger than the device"))
      << msg;
  EXPECT_EQ(s.stats().num_ooms, 1);
  EXPECT_EQ(s.stats().num_device_alloc, 0) << "no flush, no device call";
}

// From 1 EiB PyTorch refuses before anything else, without counting an OOM.
TEST(OomMessage, FromOneExbibyteTheRequestIsRefusedAsMoreThan1EB) {
  SimSetup s("", SimBackend::Mode::kEager, 64 * MiB);
  for (const std::size_t bytes : {std::size_t{1} << 60, std::size_t{8000000000} * GiB, SIZE_MAX}) {
    const std::string msg = oom_message(s.a(), bytes, 0);
    EXPECT_TRUE(matches(msg, "^Simulated device out of memory\\. Tried to allocate more than 1EB memory\\.")) << msg;
  }
  const std::string below = oom_message(s.a(), (std::size_t{1} << 60) - 1, 0);
  EXPECT_TRUE(matches(below, "Tried to allocate 1073741824\\.00 GiB\\. GPU 0 has a total capacity")) << below;
  EXPECT_EQ(s.stats().num_ooms, 1) << "only the request below 1 EiB counts";
}

// ---- the memory fraction: PyTorch's range [0, 1] ----

TEST(MemoryFraction, AcceptsZeroAndOneAndRejectsTheRestInPyTorchsWords) {
  SimSetup s("", SimBackend::Mode::kEager, 64 * MiB);
  for (const double ok : {0.0, 1e-9, 0.5, 1.0}) {
    EXPECT_NO_THROW(s.a().set_memory_fraction(ok, 0)) << ok;
    EXPECT_EQ(s.a().memory_fraction(0), ok);
  }
  for (const double bad :
       {-0.1, 1.5, 1.0000001, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    try {
      s.a().set_memory_fraction(bad, 0);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_TRUE(matches(e.what(), "invalid fraction:.*\\. Please set within \\[0, 1\\]\\.")) << e.what();
      if (bad == 1.5) {
        EXPECT_TRUE(matches(e.what(), "invalid fraction:1\\.5\\. Please")) << e.what();
      }
    }
    EXPECT_EQ(s.a().memory_fraction(0), 1.0) << "a rejected value changes nothing";
  }
}

// As in PyTorch: at 0 nothing new comes from the device, so every allocation the cache cannot serve is
// an out-of-memory error ("0 bytes allowed"); memory already cached in a segment that holds live blocks
// still serves, and raising the fraction again makes everything work again.
TEST(MemoryFraction, ZeroRefusesEveryNewSegment) {
  SimSetup s("", SimBackend::Mode::kEager, 256 * MiB);
  const Stream a = s.sim->create_stream();
  void* live = s.a().allocate(4096, 0, a);  // a 2 MiB small segment, mostly free
  s.a().set_memory_fraction(0.0, 0);
  EXPECT_EQ(s.a().memory_fraction(0), 0.0);
  const std::string msg = oom_message(s.a(), 8 * MiB, a);
  EXPECT_TRUE(matches(msg,
                      "Tried to allocate 20\\.00 MiB\\. GPU 0 has a total capacity of 256\\.00 MiB of which "
                      "254\\.00 MiB is free\\. 0 bytes allowed; Of the allocated memory"))
      << msg;
  void* small = s.a().allocate(4096, 0, a);  // served from the live segment's free space
  EXPECT_NE(small, nullptr);
  EXPECT_EQ(s.stats().segment[0].current, 1);
  s.a().set_memory_fraction(1.0, 0);
  void* big = s.a().allocate(8 * MiB, 0, a);
  EXPECT_NE(big, nullptr);
  s.a().deallocate(big, 0, 0, a);
  s.a().deallocate(small, 0, 0, a);
  s.a().deallocate(live, 0, 0, a);
  s.a().validate();
}

TEST(MemoryFraction, ZeroFromTheOptionsToo) {
  SimSetup s("memory_fraction:0", SimBackend::Mode::kEager, 64 * MiB);
  EXPECT_EQ(s.a().memory_fraction(0), 0.0);
  const std::string msg = oom_message(s.a(), 1, 0);
  EXPECT_TRUE(matches(msg, "Tried to allocate 2\\.00 MiB\\..* 0 bytes allowed; ")) << msg;
  EXPECT_EQ(s.stats().num_device_alloc, 0);
}

}  // namespace
}  // namespace streamalloc::testing
