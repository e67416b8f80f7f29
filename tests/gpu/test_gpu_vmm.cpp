// Virtual memory on a real device: the CUDA backend's address ranges and mappings (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree) against the
// Backend contract the simulated device models (tests/api/test_sim_vmm.cpp): one physical allocation per
// map, unmapped only whole, mapped memory is usable, memory_info drops by the mapped bytes and comes
// back on unmap, a map beyond the free memory returns false and leaks nothing, misuse (cutting a
// mapping included) is a clear error, mapping and unmap_unused_pages work during a graph capture and
// unmap_pages does not. Kernel-free: the memory is checked with cudaMemset and cudaMemcpy.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_vm_test.hpp"

namespace streamalloc::gpu_test {
namespace {

class GpuVmm : public GpuVmTest {
 protected:
  void SetUp() override {
    GpuVmTest::SetUp();
    if (IsSkipped()) return;
    page_ = backend_->vm_granularity(0);
  }
  Backend& backend() { return *backend_; }
  std::size_t page() const { return page_; }

 private:
  std::size_t page_ = 0;
};

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

// Fills [ptr, ptr + bytes) with `value` and reads it back: true when every byte came back.
bool fill_and_read_back(void* ptr, std::size_t bytes, unsigned char value) {
  GPU_CHECK(cudaMemset(ptr, value, bytes));
  std::vector<unsigned char> host(bytes, static_cast<unsigned char>(~value));
  GPU_CHECK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char byte : host) {
    if (byte != value) return false;
  }
  return true;
}

template <typename Call>
void expect_backend_error(Call call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected Error(kBackend) containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackend) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(GpuVmm, GranularityIsAPowerOfTwo) {
  std::printf("[ streamalloc ] vm_granularity(0) = %zu bytes\n", page());
  EXPECT_GE(page(), 64 * KiB);
  EXPECT_EQ(page() & (page() - 1), 0u) << page();
}

TEST_F(GpuVmm, MappingsAreUsableAndUnmapWhole) {
  const std::size_t range_bytes = 16 * page();
  void* base = backend().reserve_address_range(0, range_bytes);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % page(), 0u);
  // Two maps side by side (two physical allocations) form one usable run.
  ASSERT_TRUE(backend().map_pages(0, at(base, page()), 2 * page()));
  ASSERT_TRUE(backend().map_pages(0, at(base, 3 * page()), page()));
  cudaPointerAttributes attributes{};
  GPU_CHECK(cudaPointerGetAttributes(&attributes, at(base, page())));
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  EXPECT_TRUE(fill_and_read_back(at(base, page()), 3 * page(), 0xAB));

  // Part of the first mapping cannot go: refused before any driver call, and both stay usable.
  expect_backend_error([&] { backend().unmap_pages(0, at(base, 2 * page()), page()); }, "cut the mapping at");
  expect_backend_error([&] { backend().unmap_pages(0, at(base, 2 * page()), 2 * page()); }, "cut the mapping at");
  EXPECT_TRUE(fill_and_read_back(at(base, page()), 3 * page(), 0x11));
  // The second mapping, whole: the first stays usable.
  backend().unmap_pages(0, at(base, 3 * page()), page());
  EXPECT_TRUE(fill_and_read_back(at(base, page()), 2 * page(), 0x22));
  ASSERT_TRUE(backend().map_pages(0, at(base, 3 * page()), page())) << "an unmapped page maps again";
  EXPECT_TRUE(fill_and_read_back(at(base, page()), 3 * page(), 0x33));

  backend().unmap_pages(0, at(base, page()), 3 * page());  // both mappings in one call
  backend().release_address_range(0, base, range_bytes);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// 100 MiB mapped as five 20 MiB allocations (what a large growth of the cache does): usable across the
// joins, memory_info falls by the mapped bytes, and any whole ones of them unmap in one call.
TEST_F(GpuVmm, PiecesOfTwentyMiBSideBySide) {
  const std::size_t piece = (20 * MiB + page() - 1) / page() * page();
  void* base = backend().reserve_address_range(0, 5 * piece);
  ASSERT_NE(base, nullptr);
  const std::size_t before = free_bytes();
  for (std::size_t i = 0; i < 5; ++i) ASSERT_TRUE(backend().map_pages(0, at(base, i * piece), piece));
  const std::size_t mapped = free_bytes();
  std::printf("[ streamalloc ] 5 maps of %zu bytes: free fell by %zu bytes\n", piece, before - mapped);
  EXPECT_GE(before - mapped, 5 * piece);
  EXPECT_LE(before - mapped, 5 * piece + kSlack);
  EXPECT_TRUE(fill_and_read_back(base, 5 * piece, 0x6E));
  backend().unmap_pages(0, at(base, piece), 3 * piece);  // the middle three
  EXPECT_TRUE(fill_and_read_back(base, piece, 0x1F));
  EXPECT_TRUE(fill_and_read_back(at(base, 4 * piece), piece, 0x2F));
  backend().unmap_pages(0, base, piece);
  backend().unmap_pages(0, at(base, 4 * piece), piece);
  EXPECT_GE(free_bytes() + kSlack, before) << "unmapping gave the memory back";
  backend().release_address_range(0, base, 5 * piece);
}

// map_pieces: one physical allocation per piece, usable as one run, each unmapped alone; each exports as
// a POSIX file descriptor, the same on every call, closed when the piece is unmapped.
TEST_F(GpuVmm, MapPiecesAreEqualMappingsEachExportable) {
  void* base = backend().reserve_address_range(0, 8 * page());
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(backend().map_pieces(0, base, 4 * page(), page()));
  EXPECT_TRUE(fill_and_read_back(base, 4 * page(), 0x3C));
  std::vector<int> fds;
  for (std::size_t i = 0; i < 4; ++i) {
    const int fd = backend().export_piece(0, at(base, i * page()));
    EXPECT_GE(fd, 0);
    EXPECT_NE(fcntl(fd, F_GETFD), -1);
    EXPECT_EQ(backend().export_piece(0, at(base, i * page())), fd) << "the same descriptor on every call";
    fds.push_back(fd);
  }
  expect_backend_error([&] { backend().export_piece(0, at(base, page() / 2)); }, "no mapping starts there");
  backend().unmap_pages(0, at(base, page()), page());  // one piece alone
  EXPECT_EQ(fcntl(fds[1], F_GETFD), -1) << "closed with its piece";
  EXPECT_TRUE(fill_and_read_back(at(base, 2 * page()), 2 * page(), 0x5A));
  backend().unmap_pages(0, base, page());
  backend().unmap_pages(0, at(base, 2 * page()), 2 * page());
  backend().release_address_range(0, base, 8 * page());
}

TEST_F(GpuVmm, MemoryInfoDropsByTheMappedBytesAndUnmapGivesThemBack) {
  const std::size_t bytes = 1 * GiB;
  const std::size_t at_start = free_bytes();
  void* base = backend().reserve_address_range(0, bytes);
  ASSERT_NE(base, nullptr);
  const std::size_t before = free_bytes();
  EXPECT_GE(before + kSlack, at_start) << "reserving address space costs no memory";
  ASSERT_TRUE(backend().map_pages(0, base, bytes));
  const std::size_t mapped = free_bytes();
  EXPECT_GE(before - mapped, bytes) << "free fell by " << format_bytes(before - mapped);
  EXPECT_LE(before - mapped, bytes + kSlack) << "free fell by " << format_bytes(before - mapped);
  EXPECT_TRUE(fill_and_read_back(base, bytes, 0x5A));
  backend().unmap_pages(0, base, bytes);
  EXPECT_GE(free_bytes() + kSlack, before) << "unmapping gave the memory back";
  backend().release_address_range(0, base, bytes);
}

TEST_F(GpuVmm, MapBeyondTheFreeMemoryReturnsFalseAndLeaksNothing) {
  // Leave about 512 MiB free, then ask for 2 GiB in one physical allocation: it cannot be created,
  // and nothing of it may stay behind.
  const std::size_t free_at_start = free_bytes();
  ASSERT_GT(free_at_start, 2 * GiB);
  const std::size_t hog_bytes = free_at_start - 512 * MiB;
  void* hog = backend().reserve(0, hog_bytes);
  ASSERT_NE(hog, nullptr);
  const std::size_t range_bytes = 2 * GiB;
  void* base = backend().reserve_address_range(0, range_bytes);
  ASSERT_NE(base, nullptr);

  const std::size_t before = free_bytes();
  EXPECT_FALSE(backend().map_pages(0, base, range_bytes));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::size_t after = free_bytes();
  EXPECT_GE(after + page(), before) << "the failed map kept " << format_bytes(before - after);
  // Nothing of it stayed mapped (map_pages would call it "already mapped"), and the memory is there to
  // be mapped.
  ASSERT_TRUE(backend().map_pages(0, base, 128 * MiB));
  EXPECT_TRUE(fill_and_read_back(base, 128 * MiB, 0x77));
  backend().unmap_pages(0, base, 128 * MiB);
  backend().release_address_range(0, base, range_bytes);
  backend().release(0, hog, hog_bytes);
  EXPECT_GE(free_bytes() + kSlack, free_at_start);
}

TEST_F(GpuVmm, AnAddressRangeLargerThanTheAddressSpaceIsNullptr) {
  // 1 PiB: past the address space a process gets (running out of it is CUDA_ERROR_OUT_OF_MEMORY).
  const std::size_t absurd = std::size_t{1} << 50;
  EXPECT_EQ(backend().reserve_address_range(0, absurd), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* base = backend().reserve_address_range(0, 4 * page());
  ASSERT_NE(base, nullptr) << "a normal range still works";
  backend().release_address_range(0, base, 4 * page());
}

TEST_F(GpuVmm, MisuseIsAClearErrorAndTheRuntimeStaysUsable) {
  void* base = backend().reserve_address_range(0, 8 * page());
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(backend().map_pages(0, base, page()));
  expect_backend_error([&] { backend().map_pages(0, at(base, 4096), page()); }, "not aligned");
  expect_backend_error([&] { backend().map_pages(0, at(base, page()), page() / 2); }, "multiple of the granularity");
  expect_backend_error([&] { backend().map_pages(0, at(base, 7 * page()), 2 * page()); }, "not inside one range");
  expect_backend_error([&] { backend().map_pages(0, base, page()); }, "already mapped");
  expect_backend_error([&] { backend().unmap_pages(0, at(base, page()), page()); }, "is not mapped");
  ASSERT_TRUE(backend().map_pages(0, at(base, 2 * page()), 2 * page()));
  expect_backend_error([&] { backend().unmap_pages(0, at(base, 3 * page()), page()); }, "cut the mapping at");
  expect_backend_error([&] { backend().unmap_unused_pages(0, at(base, 2 * page()), page()); }, "cut the mapping at");
  EXPECT_TRUE(fill_and_read_back(at(base, 2 * page()), 2 * page(), 0x43)) << "the refused unmaps left it mapped";
  backend().unmap_pages(0, at(base, 2 * page()), 2 * page());
  expect_backend_error([&] { backend().release_address_range(0, base, 8 * page()); }, "still mapped");
  expect_backend_error([&] { backend().release_address_range(0, base, 4 * page()); }, "pass the reserved size");
  expect_backend_error([&] { backend().map_pages(backend().device_count(), base, page()); }, "does not exist");
  EXPECT_TRUE(fill_and_read_back(base, page(), 0x42)) << "the mapped page is untouched";
  backend().unmap_pages(0, base, page());
  backend().release_address_range(0, base, 8 * page());
  expect_backend_error([&] { backend().release_address_range(0, base, 8 * page()); }, "not the base of a range");
}

TEST_F(GpuVmm, ReservingAndMappingDuringAGlobalCaptureKeepTheCaptureValid) {
  TestStream capture;
  void* base = nullptr;
  void* empty = nullptr;
  bool mapped = false;
  std::string failure;
  GPU_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  try {  // whatever happens, the capture is ended below
    base = backend().reserve_address_range(0, 4 * page());
    mapped = base != nullptr && backend().map_pages(0, base, page());
    if (mapped) GPU_CHECK(cudaMemsetAsync(base, 0x3C, page(), capture));  // a node of the graph
    empty = backend().reserve_address_range(0, 4 * page());
    // A growth that mapped part of what it needed takes it back during the capture: no device sync.
    if (empty != nullptr && backend().map_pages(0, empty, 2 * page())) {
      backend().unmap_unused_pages(0, empty, 2 * page());
    }
    if (empty != nullptr) backend().release_address_range(0, empty, 4 * page());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(capture, &graph);
  (void)cudaGetLastError();
  ASSERT_EQ(failure, "") << "a call failed during the capture";
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(mapped);
  ASSERT_NE(empty, nullptr);
  ASSERT_EQ(ended, cudaSuccess) << "the capture was invalidated: " << cudaGetErrorName(ended);

  cudaGraphExec_t exec = nullptr;
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  GPU_CHECK(cudaMemset(base, 0, page()));
  GPU_CHECK(cudaGraphLaunch(exec, capture));
  capture.synchronize();
  std::vector<unsigned char> host(page());
  GPU_CHECK(cudaMemcpy(host.data(), base, page(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host.front(), 0x3C);
  EXPECT_EQ(host.back(), 0x3C);
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  backend().unmap_pages(0, base, page());
  backend().release_address_range(0, base, 4 * page());
}

TEST_F(GpuVmm, UnmappingDuringACaptureIsRefused) {
  void* base = backend().reserve_address_range(0, 4 * page());
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(backend().map_pages(0, base, page()));
  TestStream capture;
  GPU_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  // unmap_pages synchronizes the device first, which a capture does not allow.
  expect_backend_error([&] { backend().unmap_pages(0, base, page()); }, "cudaDeviceSynchronize failed on device 0");
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(capture, &graph);  // invalidated or not: the capture is over
  (void)cudaGetLastError();
  if (graph != nullptr) GPU_CHECK(cudaGraphDestroy(graph));
  EXPECT_TRUE(fill_and_read_back(base, page(), 0x61)) << "the refused unmap left the page mapped";
  backend().unmap_pages(0, base, page());
  backend().release_address_range(0, base, 4 * page());
}

// Threads that never touched the runtime map and unmap pages of their own ranges: the backend binds
// the device's context for the driver calls, and its per-device lock keeps the bookkeeping whole.
TEST_F(GpuVmm, ThreadsMapAndUnmapTheirOwnRanges) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 25;
  const std::size_t before = free_bytes();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        void* base = backend().reserve_address_range(0, 8 * page());
        if (base == nullptr) throw std::runtime_error("no address range");
        for (int round = 0; round < kRounds; ++round) {
          const std::size_t first = static_cast<std::size_t>((round + t) % 6);
          if (!backend().map_pages(0, at(base, first * page()), 2 * page())) throw std::runtime_error("map refused");
          if (!fill_and_read_back(at(base, first * page()), 2 * page(), static_cast<unsigned char>(t + 1))) {
            ++failures;
          }
          backend().unmap_pages(0, at(base, first * page()), 2 * page());
        }
        backend().release_address_range(0, base, 8 * page());
      } catch (const std::exception& e) {
        std::printf("thread %d: %s\n", t, e.what());
        ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(free_bytes() + kSlack, before);
}

}  // namespace
}  // namespace streamalloc::gpu_test
