// Completion flags between real processes: each waiter path (sleep, spin, futex) is woken by a
// publish in another process; deadlines return timeout; an epoch bump releases a waiter whose
// producer was kill -9'd; a futex ping-pong loses no wakeup.
#include "shm/completion_flag.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <thread>

#include "core/base/error.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"

namespace duet::shm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kFlags = 4;
constexpr size_t kPayloadOffset = 4096;  // a "tensor" next to the flags
constexpr size_t kPayloadBytes = 64 * 1024;

class CompletionFlagTest : public ::testing::Test {
 protected:
  void SetUp() override {
    remove_stack_segments(stack);
    segment = Segment::create(name, kPayloadOffset + kPayloadBytes, Lifetime::unlink_on_destroy);
    table = FlagTable::format(segment.data(), kPayloadOffset, kFlags);
  }
  void TearDown() override { remove_stack_segments(stack); }

  // What a producer process does: its own mapping, by name.
  static FlagTable attach_by_name(Segment& mine, const std::string& name) {
    mine = Segment::open(name);
    return FlagTable::attach(mine.data(), kPayloadOffset);
  }

  static WaitOptions options(std::chrono::nanoseconds deadline_in) {
    WaitOptions o;
    o.deadline = Clock::now() + deadline_in;
    return o;
  }

  const std::string stack = testing::test_stack_id();
  const std::string name = segment_name(stack, "flags");
  Segment segment;
  FlagTable table;
};

constexpr uint32_t kGo = 3;  // the parent's "I am about to wait" flag

// Waits for the parent's go, sleeps `delay`, writes a payload, then publishes flag 0: a waiter
// that sees the flag must see the whole payload. The delays are long enough that a parent
// descheduled on a busy machine still starts its wait before the publish.
int produce_after(const std::string& name, std::chrono::milliseconds delay, uint64_t seq) {
  Segment mine = Segment::open(name);
  FlagTable flags = FlagTable::attach(mine.data(), kPayloadOffset);
  WaitOptions go;
  go.deadline = Clock::now() + 10s;
  if (flags.wait(kGo, seq, go).status != WaitStatus::ready) return 1;
  std::this_thread::sleep_for(delay);
  std::memset(mine.data() + kPayloadOffset, static_cast<int>(seq), kPayloadBytes);
  flags.publish(0, seq);
  return 0;
}

bool payload_is(const Segment& s, uint8_t value) {
  for (size_t i = 0; i < kPayloadBytes; ++i) {
    if (s.data()[kPayloadOffset + i] != value) return false;
  }
  return true;
}

TEST_F(CompletionFlagTest, FlagsSitOnTheirOwnCacheLines) {
  EXPECT_EQ(table.size(), kFlags);
  for (uint32_t i = 0; i < kFlags; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(&table.flag(i)) % 64, 0u);
    if (i > 0) {
      EXPECT_EQ(reinterpret_cast<uint8_t*>(&table.flag(i)) -
                    reinterpret_cast<uint8_t*>(&table.flag(i - 1)),
                64);
    }
  }
  EXPECT_EQ(table.epoch(), 1u);
  EXPECT_EQ(FlagTable::bytes_for(kFlags), 64u * (kFlags + 1));
}

TEST_F(CompletionFlagTest, SpinPathSeesPublishFromAnotherProcess) {
  pid_t child = fork_child([&] { return produce_after(name, 100ms, 1); });
  WaitOptions o = options(10s);
  o.spin_budget_ns = 5'000'000'000;  // spin until it comes
  table.publish(kGo, 1);
  WaitResult r = table.wait(0, 1, o);
  EXPECT_EQ(r.status, WaitStatus::ready);
  EXPECT_EQ(r.path, WaitPath::spin);
  EXPECT_EQ(r.seen_seq, 1u);
  EXPECT_TRUE(payload_is(segment, 1)) << "release/acquire: payload complete when flag is seen";
  EXPECT_EQ(wait_child(child).code, 0);
}

TEST_F(CompletionFlagTest, SleepPathReturnsAfterThePredictedSleep) {
  pid_t child = fork_child([&] { return produce_after(name, 20ms, 3); });
  WaitOptions o = options(10s);
  o.predicted_ns = 300'000'000;  // the "kernel" is predicted to take 300 ms; it takes 20
  o.spin_budget_ns = 0;
  table.publish(kGo, 3);
  WaitResult r = table.wait(0, 3, o);
  EXPECT_EQ(r.status, WaitStatus::ready);
  EXPECT_EQ(r.path, WaitPath::sleep);
  EXPECT_GE(r.waited_ns, 300'000'000);
  EXPECT_TRUE(payload_is(segment, 3));
  EXPECT_EQ(wait_child(child).code, 0);
}

TEST_F(CompletionFlagTest, FutexPathIsWokenByAPublishInAnotherProcess) {
  pid_t child = fork_child([&] { return produce_after(name, 100ms, 2); });
  WaitOptions o = options(20s);
  o.spin_budget_ns = 0;
  o.futex_slice_ns = 15'000'000'000;  // only a real FUTEX_WAKE can end the wait early
  table.publish(kGo, 2);
  WaitResult r = table.wait(0, 2, o);
  EXPECT_EQ(r.status, WaitStatus::ready);
  EXPECT_EQ(r.path, WaitPath::futex);
  EXPECT_GE(r.futex_waits, 1u);
  EXPECT_LT(r.waited_ns, 5'000'000'000);
  EXPECT_TRUE(payload_is(segment, 2));
  EXPECT_EQ(wait_child(child).code, 0);
}

TEST_F(CompletionFlagTest, DeadlineReturnsTimeoutThroughEveryPhase) {
  WaitOptions o = options(60ms);
  o.predicted_ns = 10'000'000;
  o.spin_budget_ns = 1'000'000;
  o.futex_slice_ns = 20'000'000;
  WaitResult r = table.wait(1, 1, o);
  EXPECT_EQ(r.status, WaitStatus::timeout);
  EXPECT_EQ(r.path, WaitPath::futex);
  EXPECT_GE(r.waited_ns, 60'000'000);
  EXPECT_LT(r.waited_ns, 1'000'000'000);

  o.deadline = Clock::now() - 1ms;  // already past: no sleep at all
  r = table.wait(1, 1, o);
  EXPECT_EQ(r.status, WaitStatus::timeout);
  EXPECT_EQ(r.path, WaitPath::immediate);

  o.deadline = Clock::now() + 30ms;  // predicted sleep longer than the deadline is cut short
  o.predicted_ns = 5'000'000'000;
  r = table.wait(1, 1, o);
  EXPECT_EQ(r.status, WaitStatus::timeout);
  EXPECT_LT(r.waited_ns, 1'000'000'000);
}

// A preempt request in miniature: the waiter sleeps on flag 0 with flag 2 as its interrupt word;
// another process publishes flag 2 and wakes flag 0's sleepers. The wait ends at once, as
// `interrupted`, long before its slice and deadline; a word already at its mark ends a wait
// before it sleeps; ready still wins over an interrupt.
TEST_F(CompletionFlagTest, AnInterruptWordEndsAWaitAtOnceWhenItsSetterWakesTheFlag) {
  pid_t child = fork_child([&] {
    Segment mine;
    FlagTable flags = attach_by_name(mine, name);
    WaitOptions go;
    go.deadline = Clock::now() + 10s;
    if (flags.wait(kGo, 1, go).status != WaitStatus::ready) return 1;
    std::this_thread::sleep_for(100ms);
    flags.publish(2, 7);
    flags.flag(0).wake_all();
    return 0;
  });
  WaitOptions o = options(20s);
  o.spin_budget_ns = 0;
  o.futex_slice_ns = 15'000'000'000;  // only the wake can end the wait early
  o.interrupt_word = &table.flag(2).seq;
  o.interrupt_at = 7;
  table.publish(kGo, 1);
  WaitResult r = table.wait(0, 1, o);
  EXPECT_EQ(r.status, WaitStatus::interrupted);
  EXPECT_EQ(r.path, WaitPath::futex);
  EXPECT_LT(r.waited_ns, 5'000'000'000);
  EXPECT_EQ(wait_child(child).code, 0);

  r = table.wait(0, 1, o);  // the word is already at its mark
  EXPECT_EQ(r.status, WaitStatus::interrupted);
  EXPECT_EQ(r.path, WaitPath::immediate);
  o.interrupt_at = 8;  // not yet: the wait runs to its deadline
  o.deadline = Clock::now() + 20ms;
  EXPECT_EQ(table.wait(0, 1, o).status, WaitStatus::timeout);
  table.publish(0, 1);
  o.interrupt_at = 7;
  EXPECT_EQ(table.wait(0, 1, o).status, WaitStatus::ready) << "a complete flag is complete";
  WaitStats stats;
  stats.add(r);
  EXPECT_EQ(stats.interrupts, 1u);
  EXPECT_EQ(stats.waits(), 1u);
}

TEST_F(CompletionFlagTest, EpochBumpReleasesAWaiterOfAKilledProducer) {
  pid_t producer = fork_child([&] {
    Segment mine;
    FlagTable flags = attach_by_name(mine, name);
    flags.publish(2, 1);
    for (;;) pause();  // hangs until killed, never publishing 2
    return 0;
  });
  constexpr int kReady = 10, kTimeout = 11, kEpochChanged = 12, kFutexPath = 1;
  pid_t waiter = fork_child([&] {
    Segment mine;
    FlagTable flags = attach_by_name(mine, name);
    WaitOptions o = options(60s);
    o.spin_budget_ns = 0;
    o.futex_slice_ns = 30'000'000'000;  // the bump's FUTEX_WAKE must end it, not a slice
    WaitResult r = flags.wait(2, 2, o);
    int code = r.status == WaitStatus::ready     ? kReady
               : r.status == WaitStatus::timeout ? kTimeout
                                                 : kEpochChanged;
    return code + (r.path == WaitPath::futex ? kFutexPath * 10 : 0);
  });
  WaitOptions o = options(10s);
  ASSERT_EQ(table.wait(2, 1, o).status, WaitStatus::ready) << "producer never started";
  auto deadline = Clock::now() + 10s;
  while (table.flag(2).sleepers.load() == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(table.flag(2).sleepers.load(), 1u) << "waiter never reached the futex";

  ASSERT_EQ(kill(producer, SIGKILL), 0);
  EXPECT_EQ(wait_child(producer).signal, SIGKILL);
  auto bumped = Clock::now();
  EXPECT_EQ(table.bump_epoch(), 2u);
  auto done = wait_child(waiter, 5s);
  EXPECT_LT(Clock::now() - bumped, 2s);
  ASSERT_TRUE(done.exited);
  EXPECT_EQ(done.code, kEpochChanged + 10 * kFutexPath);
  EXPECT_EQ(table.flag(2).sleepers.load(), 0u);
}

TEST_F(CompletionFlagTest, StaleEpochAndReadyPrecedence) {
  WaitOptions o = options(1s);
  o.expected_epoch = table.epoch();
  table.bump_epoch();
  WaitResult r = table.wait(0, 1, o);
  EXPECT_EQ(r.status, WaitStatus::epoch_changed);
  EXPECT_EQ(r.path, WaitPath::immediate);
  table.publish(0, 1);
  EXPECT_EQ(table.wait(0, 1, o).status, WaitStatus::ready) << "a complete tensor is complete";
}

TEST_F(CompletionFlagTest, FutexPingPongLosesNoWakeup) {
  // Both sides go straight to the futex every time; a lost wakeup would stall for a whole
  // slice (2 s) and show up in the slowest round.
  constexpr uint64_t kRounds = 3000;
  pid_t echo = fork_child([&] {
    Segment mine;
    FlagTable flags = attach_by_name(mine, name);
    for (uint64_t i = 1; i <= kRounds; ++i) {
      WaitOptions o = options(20s);
      o.spin_budget_ns = 0;
      o.futex_slice_ns = 2'000'000'000;
      if (flags.wait(0, i, o).status != WaitStatus::ready) return 1;
      flags.publish(1, i);
    }
    return 0;
  });
  int64_t slowest_ns = 0;
  WaitStats stats;
  auto start = Clock::now();
  for (uint64_t i = 1; i <= kRounds; ++i) {
    table.publish(0, i);
    WaitOptions o = options(20s);
    o.spin_budget_ns = 0;
    o.futex_slice_ns = 2'000'000'000;
    WaitResult r = table.wait(1, i, o);
    if (r.status != WaitStatus::ready || r.waited_ns > 1'500'000'000) {
      kill(echo, SIGKILL);  // fail fast instead of losing a slice per remaining round
      wait_child(echo);
      FAIL() << "round " << i << " took " << r.waited_ns << " ns: a wakeup was lost";
    }
    slowest_ns = std::max(slowest_ns, r.waited_ns);
    stats.add(r);
  }
  auto total = Clock::now() - start;
  EXPECT_EQ(wait_child(echo).code, 0);
  EXPECT_LT(slowest_ns, 1'500'000'000) << "a wakeup was lost";
  EXPECT_LT(total, 30s);
  EXPECT_EQ(stats.waits(), kRounds);
  EXPECT_EQ(stats.timeouts + stats.epoch_changes, 0u);
  EXPECT_EQ(stats.ready[static_cast<int>(WaitPath::spin)], 0u);
  EXPECT_EQ(stats.ready[static_cast<int>(WaitPath::sleep)], 0u);
  EXPECT_GT(stats.ready[static_cast<int>(WaitPath::futex)], 0u);
}

TEST_F(CompletionFlagTest, BadTablesAndMisuseAreErrors) {
  std::vector<uint8_t> zeros(4096 + 64);
  uint8_t* aligned = zeros.data() + (64 - reinterpret_cast<uintptr_t>(zeros.data()) % 64) % 64;
  auto code_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return Errc::ok;
  };
  EXPECT_EQ(code_of([&] { FlagTable::attach(aligned, 4096); }), Errc::bad_format);
  FlagTable::format(aligned, 4096, 8);
  EXPECT_EQ(code_of([&] { FlagTable::attach(aligned, 4 * 64); }), Errc::bad_format)
      << "header claims more flags than the region holds";
  EXPECT_EQ(code_of([&] { FlagTable::format(aligned + 8, 4000, 2); }), Errc::invalid_argument);
  EXPECT_EQ(code_of([&] { FlagTable::format(aligned, 128, 2); }), Errc::out_of_range);
  EXPECT_EQ(code_of([&] { table.flag(kFlags); }), Errc::out_of_range);
  table.publish(2, 10);
  table.publish(2, 10);  // republishing the same seq is harmless
  EXPECT_EQ(code_of([&] { table.publish(2, 9); }), Errc::invalid_argument);
  EXPECT_EQ(table.load(2), 10u);
  EXPECT_EQ(code_of([&] { table.wait(0, 1, WaitOptions{}); }), Errc::invalid_argument)
      << "a wait without a deadline";
  Segment ro = Segment::open(name, Access::read_only);
  EXPECT_EQ(code_of([&] { FlagTable::attach(ro); }), Errc::invalid_argument);
}

}  // namespace
}  // namespace duet::shm
