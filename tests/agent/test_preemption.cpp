// Agent.xpu preemption (issue 9): a proactive prefill on its own engine is stopped at op
// boundaries by request_preempt(), parked while reactive work runs on another engine, and
// resumed where each device stopped: the logits and the greedy continuation are bit-identical to
// an uninterrupted run, no op runs twice, no KV page moves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"
#include "tests/agent/agent_engines.h"
#include "tests/support/local_flags.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

using namespace agent_testing;

std::unique_ptr<ProgramEngine> make_engine(const std::string& tag, Plan plan) {
  return interpreted_engine(
      pinned_plan_options("agent" + std::to_string(getpid()), tag, plan, 2, 128));
}

int32_t argmax(const std::vector<float>& v) {
  return agent_testing::argmax(v.data(), v.size());
}

std::vector<int32_t> greedy_decode(ProgramEngine& e, uint64_t seq, std::vector<float> logits,
                                   int pos, int n) {
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) {
    out.push_back(argmax(logits));
    logits = e.step({{seq, {out.back()}, pos + k, true}}, nullptr);
  }
  return out;
}

// Runs `start` on a worker thread and keeps asking the engine to preempt it until it returns.
std::optional<std::vector<float>> run_preempting(
    ProgramEngine& e, std::chrono::microseconds first_delay,
    std::function<std::optional<std::vector<float>>()> start) {
  std::atomic<bool> done{false};
  auto result = std::async(std::launch::async, [&] {
    auto r = start();
    done = true;
    return r;
  });
  std::this_thread::sleep_for(first_delay);
  while (!done) {
    e.request_preempt();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return result.get();
}

TEST(AgentPreemption, ResumedPrefillIsBitIdenticalAndRecomputesNothing) {
  auto proactive = make_engine("pro", test_support::activation_split_plan(16));
  auto reactive = make_engine("re", Plan::gpu_only());
  ASSERT_TRUE(proactive->preemptible());
  const std::vector<int32_t> prompt = prompt_of(30, 1);
  const size_t prefill_ops = proactive->step_ops(static_cast<uint32_t>(prompt.size()));

  // Uninterrupted: sequence 1.
  proactive->open_seq(1, 128);
  const uint64_t ops0 = proactive->preempt_stats().ops_executed;
  std::optional<std::vector<float>> clean =
      proactive->step_preemptible({{1, prompt, 0, true}}, nullptr);
  ASSERT_TRUE(clean.has_value());
  EXPECT_EQ(proactive->preempt_stats().ops_executed - ops0, prefill_ops);
  const std::vector<int32_t> clean_tokens = greedy_decode(*proactive, 1, *clean, 30, 6);
  proactive->close_seq(1);

  // Preempted again and again: sequence 2, with reactive requests served while it is parked.
  proactive->open_seq(2, 128);
  const uint64_t ops1 = proactive->preempt_stats().ops_executed;
  std::optional<std::vector<float>> got =
      run_preempting(*proactive, std::chrono::microseconds(0), [&] {
        return proactive->step_preemptible({{2, prompt, 0, true}}, nullptr);
      });
  // The step's pages are taken before it first runs; parking and resuming take or move none.
  const int free_pages = proactive->status()["kv_pages_free"];
  int resumes = 0;
  while (!got) {
    ASSERT_TRUE(proactive->parked());
    EXPECT_THROW(proactive->step({{2, {5}, 0, true}}, nullptr), Error);  // busy while parked
    reactive->open_seq(7, 128);
    const std::vector<float> r = reactive->step({{7, prompt_of(9, resumes), 0, true}}, nullptr);
    EXPECT_EQ(r.size(), static_cast<size_t>(reactive->model().hp().n_vocab));
    reactive->close_seq(7);
    ++resumes;
    if (resumes < 6)
      got = run_preempting(*proactive, std::chrono::microseconds(300 * resumes),
                           [&] { return proactive->resume(nullptr); });
    else
      got = proactive->resume(nullptr);
  }
  EXPECT_GE(proactive->preempt_stats().preemptions, 1u);
  EXPECT_EQ(proactive->preempt_stats().ops_executed - ops1, prefill_ops)
      << "an op ran twice or not at all";
  EXPECT_EQ(static_cast<int>(proactive->status()["kv_pages_free"]), free_pages) << "KV pages moved";
  ASSERT_EQ(got->size(), clean->size());
  EXPECT_EQ(std::memcmp(got->data(), clean->data(), got->size() * sizeof(float)), 0);
  EXPECT_EQ(greedy_decode(*proactive, 2, *got, 30, 6), clean_tokens);
  proactive->close_seq(2);
  std::printf("preemptions %llu over %d resumes, max preempt latency %.0f us\n",
              static_cast<unsigned long long>(proactive->preempt_stats().preemptions), resumes,
              proactive->preempt_stats().max_latency_us);
}

TEST(AgentPreemption, LatencyIsBoundedByTheLongestOpPlusIpc) {
  auto proactive = make_engine("lat", test_support::activation_split_plan(16));
  const std::vector<int32_t> prompt = prompt_of(32, 2);
  proactive->open_seq(1, 128);
  StepStats whole;
  ASSERT_TRUE(proactive->step_preemptible({{1, prompt, 0, true}}, &whole).has_value());
  proactive->close_seq(1);
  // The slowest op is at most the whole step; the bound is its average op (the ops are similar
  // in size) times a generous factor, plus the IPC and polling slices.
  const double mean_op_us = whole.measured_us / static_cast<double>(proactive->step_ops(32));
  for (int trial = 0; trial < 5; ++trial) {
    proactive->open_seq(2, 128);
    auto got = run_preempting(*proactive, std::chrono::microseconds(500 + 700 * trial), [&] {
      return proactive->step_preemptible({{2, prompt, 0, true}}, nullptr);
    });
    while (!got) got = proactive->resume(nullptr);
    proactive->close_seq(2);
  }
  const auto s = proactive->preempt_stats();
  ASSERT_GE(s.preemptions, 1u);
  std::printf("step %.0f us, mean op %.0f us, max preempt latency %.0f us\n", whole.measured_us,
              mean_op_us, s.max_latency_us);
  EXPECT_LT(s.max_latency_us, 20 * mean_op_us + 20000);
}

TEST(AgentPreemption, RequestsOutsideAStepAndBadResumesAreHarmless) {
  auto proactive = make_engine("idle", Plan::gpu_only());
  proactive->request_preempt();  // nothing runs: no effect on the next step
  proactive->open_seq(1, 128);
  EXPECT_TRUE(proactive->step_preemptible({{1, prompt_of(8, 3), 0, true}}, nullptr).has_value());
  EXPECT_FALSE(proactive->parked());
  EXPECT_THROW(proactive->resume(nullptr), Error);
}

}  // namespace
}  // namespace duet::frontend
