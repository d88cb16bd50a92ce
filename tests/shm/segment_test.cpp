// Segments: named per stack, O_EXCL, mode 0600, shared between real processes, removed only on
// purpose, reclaimable after their creator was killed.
#include "shm/segment.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstring>

#include "core/base/error.h"
#include "tests/shm/child_process.h"
#include "tests/support/error_code.h"

namespace duet::shm {
namespace {

class SegmentTest : public ::testing::Test {
 protected:
  void SetUp() override { remove_stack_segments(stack); }
  void TearDown() override { remove_stack_segments(stack); }
  std::string name(const std::string& what) const { return segment_name(stack, what); }
  const std::string stack = testing::test_stack_id();
};

using test_support::error_code_of;

TEST_F(SegmentTest, NamesAreDuetStackWhatAndValidated) {
  EXPECT_EQ(segment_name("s1", "arena"), "/duet-s1-arena");
  EXPECT_EQ(segment_name("my-stack_2", "kv.0"), "/duet-my-stack_2-kv.0");
  for (const char* bad : {"", "a/b", "a b", "a.b", "x$", "0123456789012345678901234567890123"}) {
    EXPECT_EQ(error_code_of([&] { segment_name(bad, "arena"); }), Errc::invalid_argument) << bad;
  }
  // '-' in <what> would make "/duet-a-b-c" ambiguous between stacks "a" and "a-b".
  EXPECT_EQ(error_code_of([&] { segment_name("s1", "kv-cache"); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { segment_name("s1", ""); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { Segment::create("no-slash", 64); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { Segment::create(name("empty"), 0); }), Errc::invalid_argument);
}

TEST_F(SegmentTest, CreateOpenUnlinkAcrossProcesses) {
  Segment seg = Segment::create(name("arena"), 1 << 20);
  ASSERT_EQ(seg.size(), 1u << 20);
  EXPECT_TRUE(seg.writable());
  EXPECT_EQ(seg.data()[12345], 0) << "a new segment is zero-filled";
  std::memcpy(seg.data(), "from parent", 12);

  pid_t child = fork_child([&] {
    Segment mine = Segment::open(name("arena"));  // a mapping of its own, by name
    if (mine.size() != (1u << 20) || std::memcmp(mine.data(), "from parent", 12) != 0) return 1;
    std::memcpy(mine.data() + 4096, "from child", 11);
    return 0;
  });
  auto done = wait_child(child);
  ASSERT_TRUE(done.exited);
  ASSERT_EQ(done.code, 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(seg.data() + 4096), "from child");

  seg.unlink();
  EXPECT_EQ(error_code_of([&] { Segment::open(name("arena")); }), Errc::not_found);
  EXPECT_STREQ(reinterpret_cast<const char*>(seg.data()), "from parent") << "mapping outlives name";
  seg.unlink();  // already gone: not an error
}

TEST_F(SegmentTest, CreatingAnExistingNameIsAClearBusyError) {
  Segment first = Segment::create(name("flags"), 4096);
  try {
    Segment::create(name("flags"), 4096);
    FAIL() << "O_EXCL create of an existing name succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy);
    EXPECT_NE(std::string(e.what()).find(name("flags")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_code_of([&] { Segment::open(name("missing")); }), Errc::not_found);
}

TEST_F(SegmentTest, ModeIs0600WhateverTheUmask) {
  for (mode_t mask : {mode_t{0}, mode_t{0022}, mode_t{0277}}) {
    mode_t old = umask(mask);
    Segment seg =
        Segment::create(name("m" + std::to_string(mask)), 4096, Lifetime::unlink_on_destroy);
    umask(old);
    struct stat st {};
    ASSERT_EQ(stat((std::string(kShmDir) + seg.name()).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << "umask " << mask;
    EXPECT_EQ(st.st_uid, getuid());
  }
}

TEST_F(SegmentTest, ReadOnlyMappingCannotBeWritten) {
  Segment seg = Segment::create(name("weights"), 4096);
  seg.data()[0] = 42;
  Segment reader = Segment::open(name("weights"), Access::read_only);
  EXPECT_FALSE(reader.writable());
  EXPECT_EQ(reader.data()[0], 42);
  pid_t child = fork_child([&] {
    Segment ro = Segment::open(name("weights"), Access::read_only);
    signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into exit(1)
    ro.data()[0] = 7;          // must fault: the page is mapped PROT_READ
    return 0;
  });
  auto done = wait_child(child);
  EXPECT_EQ(done.signal, SIGSEGV);
  EXPECT_EQ(seg.data()[0], 42);
}

TEST_F(SegmentTest, LifetimeDecidesWhoUnlinksAndMovesCarryIt) {
  {
    Segment a = Segment::create(name("temp"), 64, Lifetime::unlink_on_destroy);
    Segment b = std::move(a);
    EXPECT_FALSE(a.valid());
    EXPECT_TRUE(b.valid());
  }
  EXPECT_EQ(error_code_of([&] { Segment::open(name("temp")); }), Errc::not_found);
  { Segment p = Segment::create(name("kept"), 64); }
  EXPECT_EQ(Segment::open(name("kept")).size(), 64u) << "persist segments outlive their object";
}

TEST_F(SegmentTest, RemoveStackSegmentsTakesOnlyThatStack) {
  const std::string other = stack + "-x";  // a stack whose id extends ours
  Segment a = Segment::create(name("arena"), 64);
  Segment k = Segment::create(name("kv"), 64);
  Segment o = Segment::create(segment_name(other, "arena"), 64, Lifetime::unlink_on_destroy);
  EXPECT_EQ(list_stack_segments(stack), (std::vector<std::string>{name("arena"), name("kv")}));
  EXPECT_EQ(list_stack_segments(other), std::vector<std::string>{segment_name(other, "arena")});
  EXPECT_EQ(remove_stack_segments(stack), 2u);
  EXPECT_TRUE(list_stack_segments(stack).empty());
  EXPECT_EQ(list_stack_segments(other).size(), 1u);
  EXPECT_EQ(remove_stack_segments(stack), 0u);
  EXPECT_EQ(error_code_of([&] { remove_stack_segments("../etc"); }), Errc::invalid_argument);
}

TEST_F(SegmentTest, SegmentsOfAKilledCreatorAreReclaimed) {
  pid_t child = fork_child([&] {
    Segment s = Segment::create(name("arena"), 8192);
    s.data()[0] = 1;
    kill(getpid(), SIGKILL);
    return 0;
  });
  auto done = wait_child(child);
  ASSERT_EQ(done.signal, SIGKILL);
  // The stale segment blocks a new create of the same name...
  EXPECT_EQ(error_code_of([&] { Segment::create(name("arena"), 8192); }), Errc::busy);
  // ...until the next `up` reclaims the stack's leftovers.
  EXPECT_EQ(remove_stack_segments(stack), 1u);
  Segment fresh = Segment::create(name("arena"), 8192);
  EXPECT_EQ(fresh.data()[0], 0);
}

}  // namespace
}  // namespace duet::shm
