// Preemption on the real device services (gpu_svc on OpenCL/PoCL, npu_svc's emulator), their
// service objects in this process driven with the stack's control messages: a preempted and
// resumed prefill gives the uninterrupted run's logits bit for bit and runs every op once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "services/frontend/program_engine.h"
#include "tests/support/in_process_services.h"
#include "tests/support/local_flags.h"

namespace duet::frontend {
namespace {

TEST(AgentPreemptionOnServices, ResumedPrefillMatchesAndRunsEveryOpOnce) {
  ProgramEngineOptions o;
  o.model_path = test_support::tiny_fortune_path("q8_0");
  o.stack_id = "agentsvc" + std::to_string(getpid());
  o.segment_tag = "pro";
  o.plan_name = "activation_split";
  o.plan_for = [](uint32_t) { return test_support::activation_split_plan(16); };
  o.buckets = {4, 32};
  o.max_seqs = 1;
  o.max_ctx = 64;
  test_support::InProcessServices services(o);
  ProgramEngine& e = services.engine;
  ASSERT_TRUE(e.preemptible());
  std::vector<int32_t> prompt{1};
  for (int i = 1; i < 30; ++i) prompt.push_back(3 + (i * 53) % 1900);
  const size_t ops = e.step_ops(static_cast<uint32_t>(prompt.size()));

  e.open_seq(1, 64);
  const std::vector<float> clean = *e.step_preemptible({{1, prompt, 0, true}}, nullptr);
  e.close_seq(1);

  e.open_seq(2, 64);
  const uint64_t ops0 = e.preempt_stats().ops_executed;
  std::optional<std::vector<float>> got;
  for (int round = 0; !got; ++round) {
    std::atomic<bool> done{false};
    auto run = std::async(std::launch::async, [&] {
      auto r = round == 0 ? e.step_preemptible({{2, prompt, 0, true}}, nullptr) : e.resume(nullptr);
      done = true;
      return r;
    });
    std::this_thread::sleep_for(std::chrono::microseconds(500 * round));
    while (!done && round < 6) {
      e.request_preempt();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    got = run.get();
  }
  EXPECT_GE(e.preempt_stats().preemptions, 1u);
  EXPECT_EQ(e.preempt_stats().ops_executed - ops0, ops) << "an op ran twice or not at all";
  ASSERT_EQ(got->size(), clean.size());
  EXPECT_EQ(std::memcmp(got->data(), clean.data(), clean.size() * sizeof(float)), 0);
  std::printf("services: %llu preemptions, max latency %.0f us\n",
              static_cast<unsigned long long>(e.preempt_stats().preemptions),
              e.preempt_stats().max_latency_us);
}

}  // namespace
}  // namespace duet::frontend
