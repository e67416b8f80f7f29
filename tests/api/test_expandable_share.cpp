// Expandable segments (docs/design.md, "Expandable segments"), sharing a block with another process:
// with expandable_ipc, share_pieces gives the pieces (one page each) that hold the block's bytes, in address order,
// each exported once (the same descriptor on every call, closed when the piece is unmapped), and the block's offset
// into the first; a fixed segment's block has none (segment_base shares it); bad input and a backend that cannot export
// are errors that change nothing. A shared block is live, so a trim keeps its pieces. Without expandable_ipc a growth
// is one piece of any size, and sharing is refused.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "expandable_support.hpp"
#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

// What a share_pieces call must not change.
struct CacheView {
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
  std::int64_t active = 0;
  std::size_t mappings = 0;
  bool operator==(const CacheView& other) const {
    return allocated == other.allocated && reserved == other.reserved && active == other.active &&
           mappings == other.mappings;
  }
};
CacheView view(SimSetup& s) {
  const DeviceStats st = s.stats();
  return {st.allocated_bytes[0].current, st.reserved_bytes[0].current, st.active_bytes[0].current, s.sim->mappings(0)};
}

TEST(ExpandableShare, ThePiecesUnderABlockInAddressOrderEachExportedOnce) {
  SimSetup s(kShareable);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);  // [0, 3) MiB of the segment: pages 0 and 1
  void* q = s.a().allocate(4 * MiB, 0, a);  // [3, 7): pages 1, 2 and 3
  const std::uintptr_t base = addr(p);
  ASSERT_EQ(addr(q), base + 3 * MiB);
  check(s);
  const CacheView before = view(s);

  const SharedPieces of_q = s.a().share_pieces(q);
  ASSERT_EQ(of_q.pieces.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(of_q.pieces[i].address, base + (i + 1) * kPage);
    EXPECT_EQ(of_q.pieces[i].bytes, kPage);
    EXPECT_GE(of_q.pieces[i].fd, 0);
  }
  EXPECT_NE(of_q.pieces[0].fd, of_q.pieces[1].fd);
  EXPECT_NE(of_q.pieces[1].fd, of_q.pieces[2].fd);
  EXPECT_EQ(of_q.offset, 1 * MiB) << "q starts 1 MiB into its first piece";

  const SharedPieces of_p = s.a().share_pieces(p);
  ASSERT_EQ(of_p.pieces.size(), 2u);
  EXPECT_EQ(of_p.pieces[0].address, base);
  EXPECT_EQ(of_p.offset, 0u);
  EXPECT_EQ(of_p.pieces[1].fd, of_q.pieces[0].fd) << "the page p and q share: one descriptor";

  const SharedPieces again = s.a().share_pieces(q);
  ASSERT_EQ(again.pieces.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(again.pieces[i].fd, of_q.pieces[i].fd) << "stable across calls";
  EXPECT_EQ(s.sim->counters().pieces_exported, 4u) << "one per page, never more";
  EXPECT_EQ(view(s), before) << "sharing changes nothing of the cache";
  check(s);

  s.a().deallocate(q, 0, 0, a);
  s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->mappings(0), 0u);
  EXPECT_EQ(s.sim->counters().exports_closed, 4u) << "each descriptor closed with its piece";
}

// A block in the small class lies inside one page, wherever it is in it.
TEST(ExpandableShare, ASmallBlockIsOnePiece) {
  SimSetup s(kShareable);
  const Stream a = s.sim->create_stream();
  void* first = s.a().allocate(1000, 0, a);
  void* second = s.a().allocate(1000, 0, a);
  const SharedPieces shared = s.a().share_pieces(second);
  ASSERT_EQ(shared.pieces.size(), 1u);
  EXPECT_EQ(shared.pieces[0].address + shared.offset, addr(second));
  EXPECT_EQ(shared.pieces[0].fd, s.a().share_pieces(first).pieces[0].fd);
  s.a().deallocate(first, 0, 0, a);
  s.a().deallocate(second, 0, 0, a);
  check(s);
}

TEST(ExpandableShare, AFixedSegmentsBlockHasNoPieces) {
  SimSetup s("expandable_segments:false");
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  const SharedPieces shared = s.a().share_pieces(p);
  EXPECT_TRUE(shared.pieces.empty());
  std::size_t size = 0;
  EXPECT_EQ(s.a().segment_base(p, &size), p) << "segment_base shares it";
  EXPECT_EQ(s.sim->counters().pieces_exported, 0u);
  s.a().deallocate(p, 0, 0, a);
}

void expect_invalid(Allocator& allocator, const void* ptr, const std::string& why) {
  try {
    allocator.share_pieces(ptr);
    ADD_FAILURE() << why << ": expected Error(kInvalidArgument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << why << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("not the start of a live block"), std::string::npos) << e.what();
  }
}

TEST(ExpandableShare, BadInputIsAnErrorThatChangesNothing) {
  SimSetup s(kShareable);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  void* q = s.a().allocate(3 * MiB, 0, a);
  s.a().deallocate(q, 0, 0, a);
  const CacheView before = view(s);
  int local = 0;
  expect_invalid(s.a(), nullptr, "null");
  expect_invalid(s.a(), &local, "a pointer the allocator never gave");
  expect_invalid(s.a(), q, "a freed block");
  expect_invalid(s.a(), static_cast<char*>(p) + 512, "inside a live block, not its start");
  EXPECT_EQ(view(s), before);
  EXPECT_EQ(s.sim->counters().pieces_exported, 0u) << "nothing exported";
  check(s);
  s.a().deallocate(p, 0, 0, a);
}

// Without expandable_ipc a growth maps one physical allocation, which PyTorch's format (equal pieces)
// cannot describe: share_pieces refuses at the call, naming the option, exports nothing and changes
// nothing; pieces are as large as their growth.
TEST(ExpandableShare, WithoutTheOptionSharingIsRefusedAndNothingChanges) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(6 * MiB, 0, a);
  const CacheView before = view(s);
  const std::size_t exported = s.sim->counters().pieces_exported;
  try {
    s.a().share_pieces(p);
    ADD_FAILURE() << "expected Error(kInvalidArgument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("expandable_ipc:true"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(view(s) == before);
  EXPECT_EQ(s.sim->counters().pieces_exported, exported);
  EXPECT_EQ(s.sim->mappings(0), 1u) << "one growth, one physical allocation";
  s.a().validate();
  s.a().deallocate(p, 0, 0, a);
}

// A driver that refuses exportable memory: the backend's error, and the block as it was.
TEST(ExpandableShare, ABackendThatCannotExportSaysSoAndNothingChanges) {
  SimBackend::Config config = SimSetup::device();
  config.exportable_pieces = false;
  SimSetup s(std::string(kShareable) + ",log_level:off", config);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  const DeviceStats before = s.stats();
  try {
    s.a().share_pieces(p);
    ADD_FAILURE() << "expected Error(kBackend)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackend) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot be exported"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.stats().allocated_bytes[0].current, before.allocated_bytes[0].current);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, before.reserved_bytes[0].current);
  EXPECT_EQ(s.a().requested_size_of(p), 3 * MiB) << "still live";
  s.a().validate();
  s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  EXPECT_EQ(s.sim->mappings(0), 0u);
}

// While a block is shared it stays live (the producer keeps it allocated), so trimming around it keeps
// every piece the other process mapped and their descriptors open; free pages beside it still go.
TEST(ExpandableShare, TrimmingKeepsASharedBlocksPieces) {
  SimSetup s(kShareable);
  const Stream a = s.sim->create_stream();
  void* before_it = s.a().allocate(5 * MiB, 0, a);     // [0, 5)
  void* shared_block = s.a().allocate(4 * MiB, 0, a);  // [5, 9): pages 2, 3 and 4
  void* after_it = s.a().allocate(5 * MiB, 0, a);      // [9, 14)
  const std::uintptr_t base = addr(before_it);
  const SharedPieces shared = s.a().share_pieces(shared_block);
  ASSERT_EQ(shared.pieces.size(), 3u);
  EXPECT_EQ(shared.pieces[0].address, base + 2 * kPage);
  EXPECT_EQ(shared.offset, 1 * MiB);
  s.a().deallocate(before_it, 0, 0, a);
  s.a().deallocate(after_it, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->mappings(0), 3u) << "pages 0, 1 and 5, 6 went; the shared block's three stay";
  EXPECT_TRUE(s.sim->accessible(0, reinterpret_cast<void*>(shared.pieces[0].address), 3 * kPage));
  EXPECT_EQ(s.sim->counters().exports_closed, 0u);
  const SharedPieces again = s.a().share_pieces(shared_block);
  ASSERT_EQ(again.pieces.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(again.pieces[i].fd, shared.pieces[i].fd);
  s.a().deallocate(shared_block, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->counters().exports_closed, 3u);
}

}  // namespace
}  // namespace streamalloc::testing
