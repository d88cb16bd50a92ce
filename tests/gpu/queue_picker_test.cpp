// QueuePicker (services/gpu_svc/queue_picker.h): which PoCL queue runs a step, by measurement.
// Synthetic step times stand in for the machine so every rule is checked exactly.
#include <gtest/gtest.h>

#include <string>

#include "core/base/error.h"
#include "services/gpu_svc/queue_picker.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

// Runs `steps` steps of one shape, each taking wide_us or narrow_us on its queue; returns how
// many ran narrow.
int run_steps(QueuePicker& p, uint32_t tokens, int steps, double wide_us, double narrow_us,
              uint32_t context = 16) {
  int narrow = 0;
  for (int i = 0; i < steps; ++i) {
    const StepQueue q = p.pick(1, tokens, context);
    narrow += q == StepQueue::narrow;
    p.observe(1, tokens, context, q, q == StepQueue::narrow ? narrow_us : wide_us);
  }
  return narrow;
}

TEST(QueuePicker, MeasuresBothQueuesThenKeepsTheFasterOne) {
  QueuePicker p;
  // The first steps alternate, wide first, until each queue has three times.
  EXPECT_EQ(p.pick(1, 1, 16), StepQueue::wide);
  p.observe(1, 1, 16, StepQueue::wide, 600);
  EXPECT_EQ(p.pick(1, 1, 16), StepQueue::narrow);
  p.observe(1, 1, 16, StepQueue::narrow, 300);
  EXPECT_EQ(run_steps(p, 1, 4, 600, 300), 2);
  // Then the faster one (narrow at 300 us), but for a re-measurement of wide: every 200th step
  // at wide's 2x (a probe costs a whole narrow step more: 200 of them keep it to 0.5%).
  EXPECT_EQ(run_steps(p, 1, 199, 600, 300), 199);
  EXPECT_EQ(run_steps(p, 1, 1, 600, 300), 0);
  // The other way round for another shape: a big model's decode is faster wide; at 1.21x the
  // interval is the least, reprobe_every (64).
  EXPECT_EQ(run_steps(p, 4, 6, 14000, 17000), 3);
  EXPECT_EQ(run_steps(p, 4, 64, 14000, 17000), 1);
}

TEST(QueuePicker, ReMeasuresAtMostEvery16xReprobeEverySteps) {
  QueuePicker p;
  run_steps(p, 1, 6, 100'000, 300);  // wide 333x slower
  EXPECT_EQ(run_steps(p, 1, 1023, 100'000, 300), 1023);
  EXPECT_EQ(run_steps(p, 1, 1, 100'000, 300), 0);
}

// A decode grows into larger contexts step by step; where wide won at a smaller context it wins
// at a larger one (narrow's edge is its lower launch cost, attention grows with the context), so
// the new bucket does not pay three steps on the slower queue first.
TEST(QueuePicker, ALargerContextTakesWideFromASmallerOneWhereWideWon) {
  QueuePicker p;
  run_steps(p, 1, 6, 17000, 31000, 40);                   // bucket [0, 64): wide
  EXPECT_EQ(run_steps(p, 1, 164, 17000, 31000, 100), 0);  // [64, 128): wide from the start
  // Narrow re-measured at its neighbour's interval: 200 x (31000 / 17000 - 1), 165 steps.
  EXPECT_EQ(run_steps(p, 1, 1, 17000, 31000, 100), 1);
  EXPECT_EQ(run_steps(p, 1, 30, 17000, 31000, 600), 0);  // [512, 1024): skips the unmeasured
  // The carried answer is not a measurement: a smaller bucket than the measured one measures.
  QueuePicker q;
  run_steps(q, 1, 6, 17000, 31000, 600);
  EXPECT_EQ(run_steps(q, 1, 6, 17000, 31000, 100), 3);
}

TEST(QueuePicker, ASmallerContextTakesNarrowFromALargerOneWhereNarrowWon) {
  QueuePicker p;
  run_steps(p, 8, 6, 1050, 860, 320);                 // [256, 512): narrow
  EXPECT_EQ(run_steps(p, 8, 20, 1050, 860, 16), 20);  // [0, 64): narrow from the start
  // Not upwards: narrow winning at a smaller context says nothing of a larger one.
  EXPECT_EQ(run_steps(p, 8, 6, 1050, 860, 600), 3);
}

// Once the carried bucket's re-measurements give the other queue its samples, it decides on its
// own: here narrow, which its neighbour's answer would never have picked.
TEST(QueuePicker, ACarriedBucketDecidesOnItsOwnOnceMeasured) {
  QueuePicker p;
  run_steps(p, 1, 6, 1000, 1300, 16);  // wide by 1.3x: re-measured every 64 steps
  EXPECT_EQ(run_steps(p, 1, 3 * 64 - 1, 1000, 500, 100), 2) << "two re-measurements";
  EXPECT_EQ(run_steps(p, 1, 1, 1000, 500, 100), 1) << "the third";
  // Narrow, measured three times, until wide's re-measurement at step 200 (500 us against 1000).
  EXPECT_EQ(run_steps(p, 1, 7, 1000, 500, 100), 7);
  EXPECT_EQ(run_steps(p, 1, 1, 1000, 500, 100), 0);
}

TEST(QueuePicker, OneSlowFirstStepDoesNotDecide) {
  // PoCL compiles a kernel variant at its first launch on a driver: that step takes seconds.
  QueuePicker p;
  EXPECT_EQ(p.pick(1, 2, 16), StepQueue::wide);
  p.observe(1, 2, 16, StepQueue::wide, 700);
  EXPECT_EQ(p.pick(1, 2, 16), StepQueue::narrow);
  p.observe(1, 2, 16, StepQueue::narrow, 3'000'000);
  EXPECT_EQ(run_steps(p, 2, 4, 700, 400), 2);
  // Narrow's median of (3 s, 400, 400) is 400 us: it wins.
  EXPECT_EQ(run_steps(p, 2, 10, 700, 400), 10);
}

TEST(QueuePicker, FollowsTheMachineWhenTheWinnerSlowsDown) {
  QueuePicker p;
  run_steps(p, 1, 6, 600, 300);
  EXPECT_EQ(run_steps(p, 1, 60, 600, 300), 60);
  // Narrow now slow (another process took its core): the re-measurements move the choice.
  int narrow_after = 0;
  for (int round = 0; round < 4; ++round) narrow_after = run_steps(p, 1, 64, 600, 2000);
  EXPECT_LE(narrow_after, 2) << "still on the slowed queue";
}

// The same token count at another context is another shape: 8 decoders at 16 positions run
// faster on one core, at 320 positions faster on all (attention over every earlier position).
TEST(QueuePicker, EachContextBucketIsMeasuredOnItsOwn) {
  QueuePicker p;
  run_steps(p, 8, 6, 1050, 860, 16);
  run_steps(p, 8, 6, 2700, 3400, 320);
  EXPECT_EQ(run_steps(p, 8, 20, 1050, 860, 16), 20);
  EXPECT_EQ(run_steps(p, 8, 20, 2700, 3400, 320), 0);
  EXPECT_EQ(QueuePicker::context_bucket(0), 0u);
  EXPECT_EQ(QueuePicker::context_bucket(63), 0u);
  EXPECT_EQ(QueuePicker::context_bucket(64), 1u);
  EXPECT_EQ(QueuePicker::context_bucket(127), 1u);
  EXPECT_EQ(QueuePicker::context_bucket(128), 2u);
  EXPECT_EQ(QueuePicker::context_bucket(320), 3u);
  const nlohmann::json j = p.to_json();
  ASSERT_EQ(j["shapes"].size(), 2u) << j.dump();
  EXPECT_EQ(j["shapes"][1]["context_from"], 256);
}

TEST(QueuePicker, LargeStepsAndModesSkipMeasurement) {
  QueuePicker p;
  EXPECT_EQ(p.pick(1, 17, 16), StepQueue::wide) << "over max_tokens (16)";
  p.observe(1, 17, 16, StepQueue::wide, 100);
  EXPECT_TRUE(p.to_json()["shapes"].empty()) << p.to_json().dump();
  QueuePicker::Options on;
  on.mode = QueuePicker::Mode::on;
  QueuePicker always(on);
  EXPECT_EQ(run_steps(always, 16, 10, 100, 1000), 10);
  EXPECT_EQ(always.pick(1, 17, 16), StepQueue::wide);
  QueuePicker::Options off;
  off.mode = QueuePicker::Mode::off;
  QueuePicker never(off);
  EXPECT_EQ(run_steps(never, 1, 10, 1000, 100), 0);
}

TEST(QueuePicker, StatusNamesEachShapesStepsAndTimes) {
  QueuePicker p;
  run_steps(p, 3, 8, 900, 500);
  const nlohmann::json j = p.to_json();
  EXPECT_EQ(j["mode"], "auto");
  ASSERT_EQ(j["shapes"].size(), 1u) << j.dump();
  EXPECT_EQ(j["shapes"][0]["tokens"], 3);
  EXPECT_EQ(j["shapes"][0]["wide_steps"], 3);
  EXPECT_EQ(j["shapes"][0]["narrow_steps"], 5);
  EXPECT_DOUBLE_EQ(j["shapes"][0]["narrow_ms"].get<double>(), 0.5);
}

TEST(QueuePicker, BadEnvironmentValuesAreRefusedByName) {
  {
    const testing::ScopedEnv v("DUET_GPU_NARROW", "sometimes");
    try {
      (void)QueuePicker::from_env();
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("DUET_GPU_NARROW='sometimes'"), std::string::npos);
    }
  }
  for (const char* bad : {"0", "8.5", "x", "5000"}) {
    const testing::ScopedEnv v("DUET_GPU_NARROW_MAX_TOKENS", bad);
    EXPECT_THROW((void)QueuePicker::from_env(), Error) << bad;
  }
  const testing::ScopedEnv v("DUET_GPU_NARROW_MAX_TOKENS", "8");
  const testing::ScopedEnv m("DUET_GPU_NARROW", "off");
  EXPECT_EQ(QueuePicker::from_env().max_tokens, 8u);
  EXPECT_EQ(QueuePicker::from_env().mode, QueuePicker::Mode::off);
}

}  // namespace
}  // namespace duet::gpu
