// KV pages: all-or-nothing allocation, page tables in allocation order, and recovery of the
// allocator's state (kept in the segment) after the frontend that wrote it was kill -9'd.
#include "shm/kv_pages.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>

#include "core/base/error.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"
#include "tests/support/error_code.h"

namespace duet::shm {
namespace {

using Pages = std::vector<uint32_t>;

using test_support::error_code_of;

class KvPagesTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kPages = 8;
  static constexpr uint64_t kPageBytes = 2 * 16 * 64 * sizeof(float);  // k|v, 16 tokens, dim 64
  void SetUp() override {
    remove_stack_segments(stack);
    segment =
        Segment::create(name, KvPages::bytes_for(kPages, kPageBytes), Lifetime::unlink_on_destroy);
  }
  void TearDown() override { remove_stack_segments(stack); }
  const std::string stack = testing::test_stack_id();
  const std::string name = segment_name(stack, "kv");
  Segment segment;
};

TEST_F(KvPagesTest, AllocIsAllOrNothingAndPageTablesKeepAllocationOrder) {
  KvPages kv = KvPages::format(segment, kPages, kPageBytes);
  EXPECT_EQ(kv.free_count(), kPages);
  EXPECT_EQ(kv.alloc(3, 7), (Pages{0, 1, 2}));
  EXPECT_EQ(kv.alloc(2, 9), (Pages{3, 4}));
  EXPECT_EQ(kv.free_count(), 3u);
  test_support::expect_error([&] { kv.alloc(4, 11); }, Errc::busy, "KV cache full");
  EXPECT_EQ(kv.free_count(), 3u) << "a failed alloc takes nothing";
  EXPECT_TRUE(kv.pages_of(11).empty());

  EXPECT_EQ(kv.free_owner(7), 3u);
  EXPECT_EQ(kv.alloc(4, 9), (Pages{0, 1, 2, 5}));  // the sequence grows into freed pages
  EXPECT_EQ(kv.pages_of(9), (Pages{3, 4, 0, 1, 2, 5})) << "page table = allocation order";
  EXPECT_EQ(kv.owner_of(5), 9u);
  EXPECT_EQ(kv.owner_of(6), KvPages::kFree);
  EXPECT_EQ(kv.owners(), (std::vector<uint64_t>{9}));
  EXPECT_EQ(kv.free_owner(9), 6u);
  EXPECT_EQ(kv.free_owner(9), 0u);
  EXPECT_EQ(kv.free_count(), kPages);
  EXPECT_TRUE(kv.alloc(0, 5).empty());
  EXPECT_EQ(error_code_of([&] { kv.alloc(1, KvPages::kFree); }), Errc::invalid_argument);
}

TEST_F(KvPagesTest, PagesArePageAlignedAndBoundsChecked) {
  KvPages kv = KvPages::format(segment, kPages, kPageBytes);
  EXPECT_EQ(kv.page_offset(0) % 4096, 0u);
  EXPECT_EQ(kv.page_offset(3) - kv.page_offset(2), kPageBytes);
  EXPECT_EQ(kv.page_offset(kPages - 1) + kPageBytes, segment.size());
  EXPECT_EQ(kv.page(1), segment.data() + kv.page_offset(1));
  EXPECT_EQ(error_code_of([&] { kv.page_offset(kPages); }), Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { kv.owner_of(kPages); }), Errc::out_of_range);
}

TEST_F(KvPagesTest, RestartedFrontendRecoversAndReclaimsAfterKill9) {
  KvPages::format(segment, kPages, kPageBytes);
  pid_t frontend = testing::fork_child([&] {
    Segment mine = Segment::open(name);
    KvPages kv = KvPages::attach(mine);
    kv.alloc(2, 101);
    kv.alloc(1, 102);
    kv.alloc(2, 103);
    kv.alloc(1, 102);  // request 102 grew: its table is {2, 5}
    std::memcpy(kv.page(5), "k/v of request 102", 19);
    kill(getpid(), SIGKILL);  // dies holding 6 pages
    return 0;
  });
  ASSERT_EQ(testing::wait_child(frontend).signal, SIGKILL);

  KvPages kv = KvPages::attach(segment);  // the restarted frontend
  EXPECT_EQ(kv.owners(), (std::vector<uint64_t>{101, 102, 103}));
  Segment ro = Segment::open(name, Access::read_only);  // e.g. a device service or `status`
  KvPages reader = KvPages::attach(ro);
  EXPECT_EQ(reader.pages_of(103), kv.pages_of(103));
  EXPECT_EQ(error_code_of([&] { reader.alloc(1, 104); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { reader.free_owner(103); }), Errc::invalid_argument);
  EXPECT_EQ(kv.pages_of(102), (Pages{2, 5}));
  EXPECT_STREQ(reinterpret_cast<const char*>(kv.page(5)), "k/v of request 102");
  EXPECT_EQ(kv.free_count(), 2u);
  const uint64_t live[] = {102};  // only 102 survives the restart
  EXPECT_EQ(kv.reclaim_except(live), 4u);
  EXPECT_EQ(kv.owners(), (std::vector<uint64_t>{102}));
  EXPECT_EQ(kv.free_count(), 6u);
  EXPECT_EQ(kv.alloc(1, 102), (Pages{0}));
  EXPECT_EQ(kv.pages_of(102), (Pages{2, 5, 0}));
}

TEST_F(KvPagesTest, BadGeometryAndForeignSegmentsAreErrors) {
  EXPECT_EQ(error_code_of([&] { KvPages::attach(segment); }), Errc::bad_format) << "not formatted";
  EXPECT_EQ(error_code_of([&] { KvPages::bytes_for(0, 64); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { KvPages::bytes_for(4, 100); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { KvPages::bytes_for(1u << 31, uint64_t{1} << 40); }),
            Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { KvPages::format(segment, kPages * 2, kPageBytes); }),
            Errc::out_of_range);
  KvPages::format(segment, kPages, kPageBytes);
  EXPECT_EQ(error_code_of([&] { KvPages::attach(segment.data(), segment.size() - 64); }),
            Errc::bad_format)
      << "header says more pages than the region holds";
  segment.data()[8] = 99;  // version
  EXPECT_EQ(error_code_of([&] { KvPages::attach(segment); }), Errc::bad_format);
}

}  // namespace
}  // namespace duet::shm
