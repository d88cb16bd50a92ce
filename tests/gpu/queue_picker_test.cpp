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
  // Then the faster one (narrow at 300 us), but for the re-measurement every 64th step.
  EXPECT_EQ(run_steps(p, 1, 128, 600, 300), 126);
  // The other way round for another shape: a big model's decode is faster wide.
  EXPECT_EQ(run_steps(p, 4, 6, 14000, 17000), 3);
  EXPECT_EQ(run_steps(p, 4, 64, 14000, 17000), 1);
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
