// Expandable segments on a real device (docs/design.md, "Expandable segments"): blocks carved from a
// segment that grew by mapped pieces hold what kernels write into them, the segment grows in place,
// memory_info follows the mapped bytes as the segment grows (a 100 MiB growth: exactly) and as
// empty_cache() unmaps its free end, a block freed while another stream still works on it is neither
// reused nor unmapped early, and with expandable_ipc a block's pieces (one page each) are exported as POSIX file
// descriptors for another process, open while the block is live and closed when they are unmapped.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "gpu/gpu_vm_test.hpp"
#include "gpu/kernels.hpp"

namespace streamalloc::gpu_test {
namespace {

class GpuExpandable : public GpuVmTest {
 protected:
  void SetUp() override {
    GpuVmTest::SetUp();
    if (IsSkipped()) return;
    allocator_ = std::make_unique<Allocator>(Options::parse("expandable_segments:true,log_level:warn"), backend_);
    sum_ = std::make_unique<DeviceArray<std::uint64_t>>(1);
  }
  void TearDown() override {
    if (allocator_) {
      allocator_->validate();
      allocator_.reset();
    }
    GpuTest::TearDown();
  }
  Allocator& al() { return *allocator_; }
  std::int64_t reserved() { return al().stats(0).reserved_bytes[0].current; }

  // Fills `words` words at `ptr` with `value` on `stream` and checks their sum on the device.
  void write_and_check(void* ptr, std::size_t words, std::uint32_t value, cudaStream_t stream) {
    fill_u32(as_words(ptr), words, value, stream);
    checksum_u32(as_words(ptr), words, sum_->data(), stream);
    GPU_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(sum_->at(0), expected_checksum(words, value)) << "block at " << ptr;
  }

  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<DeviceArray<std::uint64_t>> sum_;  // a checksum's result, outside the allocator
};

TEST_F(GpuExpandable, BlocksOfAGrownSegmentHoldWhatIsWrittenIntoThem) {
  TestStream stream;
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) {
    void* p = al().allocate(3 * MiB, 0, stream.id());
    if (!blocks.empty()) {
      EXPECT_EQ(static_cast<char*>(p), static_cast<char*>(blocks.back()) + 3 * MiB) << "the segment grew in place";
    }
    blocks.push_back(p);
  }
  al().validate();
  const std::vector<SegmentInfo> segments = al().segments(0);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_TRUE(segments[0].expandable);
  EXPECT_EQ(segments[0].total_size, static_cast<std::size_t>(reserved()));
  EXPECT_EQ(reserved() % (2 * MiB), 0);
  // Every block, the ones that straddle pages mapped by different growths included.
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    write_and_check(blocks[i], 3 * MiB / 4, static_cast<std::uint32_t>(i + 1), stream);
  }
  // Small blocks grow a segment of their own.
  void* small = al().allocate(1000, 0, stream.id());
  write_and_check(small, 250, 7, stream);
  for (void* p : blocks) al().deallocate(p, 0, 0, stream.id());
  al().deallocate(small, 0, 0, stream.id());
}

TEST_F(GpuExpandable, MemoryInfoFollowsTheMappedBytes) {
  TestStream stream;
  const std::size_t before = free_bytes();
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(al().allocate(64 * MiB, 0, stream.id()));
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(256 * MiB));
  const std::size_t grown = free_bytes();
  EXPECT_GE(before - grown, 256 * MiB - kSlack);
  EXPECT_LE(before - grown, 256 * MiB + kSlack);
  // Freeing the last two and emptying the cache unmaps their pages.
  al().deallocate(blocks[3], 0, 0, stream.id());
  al().deallocate(blocks[2], 0, 0, stream.id());
  al().empty_cache();
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(128 * MiB));
  EXPECT_GE(free_bytes() - grown, 128 * MiB - kSlack);
  write_and_check(blocks[1], 64 * MiB / 4, 3, stream);  // the pages still mapped still work
  al().deallocate(blocks[1], 0, 0, stream.id());
  al().deallocate(blocks[0], 0, 0, stream.id());
  al().empty_cache();
  EXPECT_EQ(reserved(), 0);
  EXPECT_TRUE(al().segments(0).empty());
  EXPECT_LE(before > free_bytes() ? before - free_bytes() : 0, kSlack) << "every page went back";
}

// A growth of 100 MiB, then one of 60 MiB right after it: the device's free memory falls by exactly the
// mapped bytes (no overhead per physical allocation), kernels see one run across the join, and
// empty_cache() gives every byte back.
TEST_F(GpuExpandable, GrowthOf100MiBCostsExactlyTheMappedBytes) {
  TestStream stream;
  // The kernels load lazily, into device memory: load them before measuring, outside the allocator.
  DeviceArray<std::uint32_t> warm_up(1024);
  write_and_check(warm_up.data(), 1024, 1, stream);
  const std::size_t before = free_bytes();
  void* p = al().allocate(100 * MiB, 0, stream.id());
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(100 * MiB));
  const std::size_t grown = free_bytes();
  std::printf("[ streamalloc ] a 100 MiB growth: free fell by %zu bytes\n", before - grown);
  EXPECT_EQ(before - grown, 100 * MiB) << "free memory fell by other than the mapped bytes";
  write_and_check(p, 100 * MiB / 4, 5, stream);
  al().deallocate(p, 0, 0, stream.id());
  void* q = al().allocate(160 * MiB, 0, stream.id());  // p's free block grows by 60 MiB
  EXPECT_EQ(q, p);
  EXPECT_EQ(before - free_bytes(), 160 * MiB);
  write_and_check(q, 160 * MiB / 4, 6, stream);
  al().deallocate(q, 0, 0, stream.id());
  al().empty_cache();
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(free_bytes(), before) << "free memory did not come back to what it was";
}

TEST_F(GpuExpandable, ABlocksPagesAreExportedAsDescriptorsOpenWhileTheyAreMapped) {
  allocator_ = std::make_unique<Allocator>(
      Options::parse("expandable_segments:true,expandable_ipc:true,log_level:warn"), backend_);
  TestStream stream;
  const std::size_t page = backend_->vm_granularity(0);
  void* head = al().allocate(3 * MiB, 0, stream.id());
  void* shared_block = al().allocate(5 * MiB, 0, stream.id());  // from 3 MiB into the segment
  const SharedPieces shared = al().share_pieces(shared_block);
  ASSERT_FALSE(shared.pieces.empty());
  const auto block = reinterpret_cast<std::uintptr_t>(shared_block);
  EXPECT_EQ(shared.pieces.front().address + shared.offset, block);
  EXPECT_LT(shared.offset, page);
  EXPECT_GE(shared.pieces.back().address + page, block + 5 * MiB);
  for (std::size_t i = 0; i < shared.pieces.size(); ++i) {
    EXPECT_EQ(shared.pieces[i].bytes, page);
    EXPECT_EQ(shared.pieces[i].address, shared.pieces.front().address + i * page);
    EXPECT_NE(fcntl(shared.pieces[i].fd, F_GETFD), -1) << "piece " << i << ": not an open descriptor";
  }
  const SharedPieces again = al().share_pieces(shared_block);
  for (std::size_t i = 0; i < shared.pieces.size(); ++i) EXPECT_EQ(again.pieces[i].fd, shared.pieces[i].fd);
  write_and_check(shared_block, 5 * MiB / 4, 9, stream);
  al().deallocate(head, 0, 0, stream.id());
  al().empty_cache();
  for (const SharedPieces::Piece& piece : shared.pieces) {
    EXPECT_NE(fcntl(piece.fd, F_GETFD), -1) << "a live block's piece stays mapped and exported";
  }
  write_and_check(shared_block, 5 * MiB / 4, 10, stream);
  al().deallocate(shared_block, 0, 0, stream.id());
  al().empty_cache();
  EXPECT_EQ(reserved(), 0);
  for (const SharedPieces::Piece& piece : shared.pieces) {
    EXPECT_EQ(fcntl(piece.fd, F_GETFD), -1) << "closed with its piece";
  }
}

TEST_F(GpuExpandable, BlockInUseOnAnotherStreamIsNeitherReusedNorUnmappedEarly) {
  TestStream producer;
  TestStream consumer;
  void* p = al().allocate(8 * MiB, 0, producer.id());  // the segment's end
  fill_u32(as_words(p), 8 * MiB / 4, 1, producer);
  TestEvent filled;
  filled.record(producer);
  filled.make_wait(consumer);
  spin(consumer, 200000);  // the consumer is busy for 0.2 s before it reads p
  checksum_u32(as_words(p), 8 * MiB / 4, sum_->data(), consumer);
  al().record_stream(p, consumer.id());
  al().deallocate(p, 0, 0, producer.id());
  void* q = al().allocate(8 * MiB, 0, producer.id());
  EXPECT_NE(q, p) << "handed out while the consumer still reads it";
  fill_u32(as_words(q), 8 * MiB / 4, 9, producer);
  al().deallocate(q, 0, 0, producer.id());
  al().empty_cache();  // waits for the consumer's fence before unmapping p's pages
  GPU_CHECK(cudaStreamSynchronize(consumer));
  EXPECT_EQ(sum_->at(0), expected_checksum(8 * MiB / 4, 1)) << "the consumer read what the producer wrote";
  EXPECT_EQ(reserved(), 0);
}

}  // namespace
}  // namespace streamalloc::gpu_test
