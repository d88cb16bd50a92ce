// Step doorbells (shm/doorbell.h): a ring reaches a listener in another thread or process, the
// report comes back before the deferred done flag, failures carry their code and message, a
// listener never serves a ring from before it started, an abandoned ring is skipped for the
// newest, another engine's region is refused, every report wait ends at its deadline or on an
// epoch change, and a listener whose engine is gone ends itself.
#include "shm/doorbell.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"

namespace duet::shm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kFlags = 4;  // 0: ring, 1: report, 2: the step's done flag, 3: spare
constexpr uint32_t kRing = 0, kReport = 1, kDone = 2;

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    remove_stack_segments(stack);
    region_offset = (FlagTable::bytes_for(kFlags) + 63) / 64 * 64;
    segment = Segment::create(name, region_offset + DoorbellRegion::bytes_for(1),
                              Lifetime::unlink_on_destroy);
    table = FlagTable::format(segment.data(), region_offset, kFlags);
    ref = DoorbellRef{kRing, kReport, region_offset, 0, new_doorbell_instance()};
    region = DoorbellRegion::format(segment.data() + region_offset, segment.size() - region_offset,
                                    1, ref.instance);
    bell = DoorbellBell(table, region, ref);
  }
  void TearDown() override { remove_stack_segments(stack); }

  static DoorbellRequest request(uint64_t seq) {
    DoorbellRequest r;
    r.program_id = 7;
    r.seq = seq;
    r.n_tokens = 3;
    r.n_seqs = 2;
    r.tokens_offset = 4096;
    r.page_tables_offset = 8192;
    r.page_table_cols = 32;
    r.first_op = 5;
    r.preempt_flag = 3;
    r.preempt_token = 11;
    r.epoch = 1;
    r.deadline_ms = 1234;
    return r;
  }

  // Echoes the request into the report and asks for the done flag after it.
  static DoorbellReport echo(const DoorbellRequest& r, DoorbellListener::Deferred& after) {
    DoorbellReport rep;
    rep.measured_us = r.n_tokens * 100.0 + r.n_seqs;
    rep.modeled_us = static_cast<double>(r.tokens_offset + r.page_tables_offset);
    rep.wait_us = r.page_table_cols + r.first_op * 1000.0;
    rep.next_op = static_cast<uint32_t>(r.preempt_flag);
    rep.ops_run = static_cast<uint32_t>(r.preempt_token + r.epoch + r.deadline_ms + r.program_id);
    rep.preempted = true;
    after.emplace_back(kDone, r.seq);
    return rep;
  }

  const std::string stack = testing::test_stack_id();
  const std::string name = segment_name(stack, "flags");
  size_t region_offset = 0;
  Segment segment;
  FlagTable table;
  DoorbellRegion region;
  DoorbellRef ref;
  DoorbellBell bell;
};

TEST_F(DoorbellTest, RingCarriesEveryFieldAndTheReportPrecedesTheDoneFlag) {
  DoorbellListener listener(name, ref, echo);
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    const uint64_t ring = bell.ring(request(seq));
    EXPECT_EQ(ring, seq);
    // The frontend's order: the done flag first, then the report, which must already be there.
    WaitOptions o;
    o.deadline = Clock::now() + 10s;
    ASSERT_EQ(table.wait(kDone, seq, o).status, WaitStatus::ready);
    const std::optional<DoorbellReport> rep = bell.report(ring);
    ASSERT_TRUE(rep.has_value()) << "done flag published before the report";
    EXPECT_EQ(rep->ring, ring);
    EXPECT_EQ(rep->seq, seq);
    EXPECT_EQ(rep->code, 0);
    EXPECT_DOUBLE_EQ(rep->measured_us, 302.0);
    EXPECT_DOUBLE_EQ(rep->modeled_us, 4096.0 + 8192.0);
    EXPECT_DOUBLE_EQ(rep->wait_us, 32.0 + 5000.0);
    EXPECT_EQ(rep->next_op, 3u);
    EXPECT_EQ(rep->ops_run, 11u + 1 + 1234 + 7);
    EXPECT_TRUE(rep->preempted);
  }
  EXPECT_EQ(listener.served(), 50u);
}

TEST_F(DoorbellTest, AFailureCarriesItsCodeAndMessage) {
  DoorbellListener listener(name, ref, [](const DoorbellRequest& r, DoorbellListener::Deferred&) {
    throw Error(Errc::not_found, "no program " + std::to_string(r.program_id));
    return DoorbellReport{};
  });
  const uint64_t ring = bell.ring(request(1));
  const auto rep = bell.wait_report(ring, Clock::now() + 10s, 0);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->code, static_cast<int32_t>(Errc::not_found));
  EXPECT_EQ(rep->message, "no program 7");
  EXPECT_EQ(table.load(kDone), 0u);  // nothing deferred: no done flag
}

TEST_F(DoorbellTest, ARingFromBeforeTheListenerStartedIsNeverServed) {
  const uint64_t stale = bell.ring(request(1));  // rung while no device listened (it restarted)
  std::atomic<int> calls{0};
  std::vector<uint64_t> seqs;
  DoorbellListener listener(name, ref,
                            [&](const DoorbellRequest& r, DoorbellListener::Deferred& a) {
                              seqs.push_back(r.seq);
                              ++calls;
                              return echo(r, a);
                            });
  bool epoch_changed = true;
  EXPECT_FALSE(bell.wait_report(stale, Clock::now() + 100ms, 0, &epoch_changed).has_value());
  EXPECT_FALSE(epoch_changed);
  const uint64_t fresh = bell.ring(request(2));
  ASSERT_TRUE(bell.wait_report(fresh, Clock::now() + 10s, 0).has_value());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seqs, std::vector<uint64_t>{2});
}

TEST_F(DoorbellTest, AnAbandonedRingIsSkippedForTheNewest) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex mu;
  std::vector<uint64_t> seqs;
  DoorbellListener listener(name, ref,
                            [&](const DoorbellRequest& r, DoorbellListener::Deferred& a) {
                              {
                                std::lock_guard lock(mu);
                                seqs.push_back(r.seq);
                              }
                              if (r.seq == 1)
                                released.wait_for(10s);  // a long step the frontend gives up on
                              return echo(r, a);
                            });
  const uint64_t first = bell.ring(request(1));
  // Give the listener time to take ring 1, then ring twice more (the frontend gave up on each).
  for (auto until = Clock::now() + 5s; Clock::now() < until;) {
    std::lock_guard lock(mu);
    if (!seqs.empty()) break;
  }
  EXPECT_FALSE(bell.wait_report(first, Clock::now() + 20ms, 0).has_value());
  bell.ring(request(2));
  const uint64_t newest = bell.ring(request(3));
  release.set_value();
  const auto rep = bell.wait_report(newest, Clock::now() + 10s, 0);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->seq, 3u);
  std::lock_guard lock(mu);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 3}));
}

TEST_F(DoorbellTest, AnotherEnginesRegionIsRefused) {
  DoorbellRef other = ref;
  other.instance = ref.instance + 1;
  try {
    DoorbellListener listener(name, other, echo);
    FAIL() << "attached to another engine's doorbell";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_format);
  }
  DoorbellRef bad_slot = ref;
  bad_slot.slot = 1;
  EXPECT_THROW(DoorbellListener(name, bad_slot, echo), Error);
  DoorbellRef bad_flag = ref;
  bad_flag.report_flag = kFlags;
  EXPECT_THROW(DoorbellListener(name, bad_flag, echo), Error);
}

TEST_F(DoorbellTest, AReportWaitEndsAtItsDeadlineOrOnAnEpochChange) {
  const uint64_t ring = bell.ring(request(1));  // nobody listens
  bool epoch_changed = true;
  auto t0 = Clock::now();
  EXPECT_FALSE(bell.wait_report(ring, t0 + 50ms, 0, &epoch_changed).has_value());
  EXPECT_FALSE(epoch_changed);
  EXPECT_GE(Clock::now() - t0, 50ms);

  std::thread bump([&] {
    std::this_thread::sleep_for(50ms);
    table.bump_epoch();  // the supervisor saw the device die
  });
  t0 = Clock::now();
  EXPECT_FALSE(bell.wait_report(ring, t0 + 20s, table.epoch(), &epoch_changed).has_value());
  bump.join();
  EXPECT_TRUE(epoch_changed);
  EXPECT_LT(Clock::now() - t0, 10s);
}

// The engine goes (its frontend removes the flags segment): the listener's thread ends by itself
// within a few idle slices instead of waking for as long as the service lives; while the segment
// is there it keeps serving however long it stays idle.
TEST_F(DoorbellTest, AListenerWhoseSegmentIsRemovedEndsItself) {
  DoorbellListener listener(name, ref, echo);
  const auto check_ms = DoorbellListener::kIdleSliceMs * DoorbellListener::kOrphanCheckSlices;
  std::this_thread::sleep_for(std::chrono::milliseconds(check_ms * 2));
  EXPECT_FALSE(listener.orphaned()) << "the segment is still there";
  const uint64_t ring = bell.ring(request(1));
  ASSERT_TRUE(bell.wait_report(ring, Clock::now() + 10s, 0).has_value());
  segment.unlink();
  const auto deadline = Clock::now() + std::chrono::milliseconds(check_ms * 10);
  while (!listener.orphaned() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(listener.orphaned());
  EXPECT_EQ(listener.served(), 1u);
}

// The device in another process: rings wake it through the shared futex, reports come back; a
// device kill -9'd mid-step never reports and the epoch bump ends the frontend's wait.
TEST_F(DoorbellTest, AListenerInAnotherProcessServesRingsAndItsDeathIsNoticed) {
  const DoorbellRef r = ref;
  const std::string n = name;
  const pid_t child = fork_child([r, n] {
    DoorbellListener listener(n, r, [](const DoorbellRequest& q, DoorbellListener::Deferred& a) {
      if (q.seq == 1000) std::this_thread::sleep_for(60s);  // killed in here
      return echo(q, a);
    });
    std::this_thread::sleep_for(60s);
    return 0;
  });
  ASSERT_GT(child, 0);
  std::this_thread::sleep_for(50ms);  // the child's listener starts after ring 0
  for (uint64_t seq = 1; seq <= 200; ++seq) {
    const uint64_t ring = bell.ring(request(seq));
    const auto rep = bell.wait_report(ring, Clock::now() + 10s, 0);
    ASSERT_TRUE(rep.has_value()) << "ring " << ring;
    EXPECT_EQ(rep->seq, seq);
    WaitOptions o;  // the done flag follows the report
    o.deadline = Clock::now() + 10s;
    EXPECT_EQ(table.wait(kDone, seq, o).status, WaitStatus::ready);
  }
  const uint64_t ring = bell.ring(request(1000));
  std::this_thread::sleep_for(50ms);
  kill(child, SIGKILL);
  const testing::ChildExit exit = wait_child(child, 5s);
  EXPECT_EQ(exit.signal, SIGKILL);
  table.bump_epoch();  // what the supervisor does when it reaps a dead service
  bool epoch_changed = false;
  const auto t0 = Clock::now();
  EXPECT_FALSE(bell.wait_report(ring, t0 + 20s, 1, &epoch_changed).has_value());
  EXPECT_TRUE(epoch_changed);
  EXPECT_LT(Clock::now() - t0, 5s);
}

}  // namespace
}  // namespace duet::shm
