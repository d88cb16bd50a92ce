// The arena: a planned layout of 64-byte aligned slots, bounds-checked offset access, and the
// same offsets meaning the same bytes in another process.
#include "shm/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "core/base/error.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"
#include "tests/support/error_code.h"

namespace duet::shm {
namespace {

using test_support::error_code_of;

TEST(ArenaLayout, SlotsAre64ByteAlignedInTheOrderAdded) {
  ArenaLayout layout;
  EXPECT_EQ(layout.add("tokens", 10), 0u);
  EXPECT_EQ(layout.add("hidden", 100), 64u);
  EXPECT_EQ(layout.add("attn_out", 64), 192u);
  EXPECT_EQ(layout.total_bytes(), 256u);
  EXPECT_EQ(layout.slot("hidden").bytes, 100u);
  EXPECT_EQ(layout.find("logits"), nullptr);
  EXPECT_EQ(layout.slots().size(), 3u);

  EXPECT_EQ(error_code_of([&] { layout.slot("logits"); }), Errc::not_found);
  EXPECT_EQ(error_code_of([&] { layout.add("hidden", 8); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { layout.add("zero", 0); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { layout.add("", 8); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { layout.add("huge", std::numeric_limits<uint64_t>::max()); }),
            Errc::out_of_range);
  EXPECT_EQ(error_code_of([] { ArenaLayout bad(48); }), Errc::invalid_argument);
  ArenaLayout pages(4096);
  pages.add("a", 1);
  EXPECT_EQ(pages.add("b", 1), 4096u);
}

TEST(Arena, EveryAccessIsBoundsChecked) {
  alignas(64) static uint8_t memory[256];
  Arena arena(memory, sizeof(memory));
  EXPECT_EQ(arena.at(0, 256), memory);
  EXPECT_EQ(arena.at(256, 0), memory + 256);
  EXPECT_EQ(arena.as<float>(64, 48), reinterpret_cast<float*>(memory + 64));
  EXPECT_EQ(error_code_of([&] { arena.at(1, 256); }), Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { arena.at(257, 0); }), Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { arena.at(std::numeric_limits<uint64_t>::max(), 2); }),
            Errc::out_of_range)
      << "offset + bytes must not wrap around";
  EXPECT_EQ(error_code_of([&] { arena.as<float>(2, 1); }), Errc::invalid_argument) << "misaligned";
  EXPECT_EQ(error_code_of([&] { arena.as<float>(0, uint64_t{1} << 62); }), Errc::out_of_range);

  ArenaLayout layout;
  layout.add("a", 200);
  arena.check(layout);
  layout.add("b", 1);
  EXPECT_EQ(error_code_of([&] { arena.check(layout); }), Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { arena.at(layout.slot("b")); }), Errc::out_of_range);
}

TEST(Arena, OffsetsMeanTheSameBytesInAnotherProcess) {
  const std::string stack = testing::test_stack_id();
  remove_stack_segments(stack);
  ArenaLayout layout;
  layout.add("tokens", 4 * sizeof(int32_t));
  layout.add("hidden", 64 * sizeof(float));
  const ArenaSlot hidden = layout.slot("hidden");
  Segment seg = Segment::create(segment_name(stack, "arena"), layout.total_bytes(),
                                Lifetime::unlink_on_destroy);
  Arena arena(seg);
  arena.check(layout);

  pid_t child = testing::fork_child([&] {
    Segment mine = Segment::open(segment_name(stack, "arena"));  // mapped at another address
    Arena view(mine);
    float* h = view.as<float>(hidden.offset, 64);
    for (int i = 0; i < 64; ++i) h[i] = 0.5f * static_cast<float>(i);
    return 0;
  });
  ASSERT_EQ(testing::wait_child(child).code, 0);
  const float* h = arena.as<float>(hidden.offset, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(h[i], 0.5f * static_cast<float>(i));
}

}  // namespace
}  // namespace duet::shm
