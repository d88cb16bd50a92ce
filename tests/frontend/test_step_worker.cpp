// StepWorker, the thread both in-process device links run steps on: a step's outcome comes back
// from finish(), what its work threw is rethrown there and counts as an early failure, a step
// that does not end by the deadline is a timeout naming the link and the step, and a new step
// forgets the last one's outcome.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/base/error.h"
#include "services/frontend/step_worker.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

bool is_negative(const int& v) {
  return v < 0;
}

TEST(StepWorker, FinishReturnsTheOutcomeOfTheWorkOnItsThread) {
  StepWorker<int> worker("gpu");
  std::atomic<std::thread::id> ran_on{};
  worker.start([&] {
    ran_on = std::this_thread::get_id();
    return 42;
  });
  EXPECT_EQ(worker.finish(1, Clock::now() + std::chrono::seconds(10)), 42);
  EXPECT_NE(ran_on.load(), std::this_thread::get_id());
  EXPECT_FALSE(worker.failed(is_negative));
  // An outcome the link reads as a failure (a StepFailed reply) is an early failure.
  worker.start([] { return -1; });
  EXPECT_EQ(worker.finish(2, Clock::now() + std::chrono::seconds(10)), -1);
  worker.start([] { return -1; });
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!worker.failed(is_negative) && Clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(worker.failed(is_negative));
}

TEST(StepWorker, WhatTheWorkThrewIsRethrownAndIsAnEarlyFailure) {
  StepWorker<int> worker("npu");
  worker.start([]() -> int { throw Error(Errc::out_of_range, "token outside the vocabulary"); });
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!worker.failed(is_negative) && Clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(worker.failed(is_negative));
  try {
    worker.finish(3, Clock::now() + std::chrono::seconds(10));
    FAIL() << "expected the work's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos);
  }
  // Not only duet::Error: whatever the work threw.
  worker.start([]() -> int { throw std::runtime_error("bad_alloc-like"); });
  EXPECT_THROW(worker.finish(4, Clock::now() + std::chrono::seconds(10)), std::runtime_error);
  // The next step starts clean.
  worker.start([] { return 7; });
  EXPECT_EQ(worker.finish(5, Clock::now() + std::chrono::seconds(10)), 7);
  EXPECT_FALSE(worker.failed(is_negative));
}

TEST(StepWorker, AStepThatDoesNotEndByTheDeadlineIsATimeoutNamingLinkAndStep) {
  StepWorker<int> worker("npu");
  std::atomic<bool> release{false};
  worker.start([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 1;
  });
  const auto t0 = Clock::now();
  try {
    worker.finish(9, Clock::now() + std::chrono::milliseconds(50));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_NE(std::string(e.what()).find("npu: step 9"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE(worker.failed(is_negative));  // still running: nothing to report yet
  release = true;
  EXPECT_EQ(worker.finish(9, Clock::now() + std::chrono::seconds(10)), 1);
}

TEST(StepWorker, BetweenStepsHoldsBackAStepStartedMeanwhile) {
  StepWorker<int> worker("gpu");
  std::atomic<bool> registering{false}, overlapped{false};
  std::thread step;
  worker.between_steps([&] {
    registering = true;
    step = std::thread([&] {  // start_step on the engine's thread, during a registration
      worker.start([&] {
        overlapped = registering.load();
        return 0;
      });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    registering = false;
  });
  step.join();
  EXPECT_EQ(worker.finish(1, Clock::now() + std::chrono::seconds(10)), 0);
  EXPECT_FALSE(overlapped) << "the step ran while between_steps held the worker";
}

}  // namespace
}  // namespace duet::frontend
