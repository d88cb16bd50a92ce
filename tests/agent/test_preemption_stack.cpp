// Preemption on the real stack: gpu_svc and npu_svc as processes, RunStep over ZeroMQ, data in
// shared memory. A proactive prefill is preempted, reactive steps of another engine run on the
// same two services while it is parked, then it resumes: bit-identical logits, every op once,
// and a preemption latency of one op plus IPC.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "core/ipc/run_dir.h"
#include "services/frontend/program_engine.h"
#include "tests/agent/agent_engines.h"
#include "tests/support/service_process.h"

namespace duet::frontend {
namespace {

using agent_testing::model_path;
using test_support::ServiceProcess;

TEST(AgentPreemptionOnTheStack, ParkedPrefillSurvivesReactiveStepsOnTheSameServices) {
  const std::string stack = "agst" + std::to_string(getpid());
  const std::string run_dir =
      std::filesystem::temp_directory_path() / ("duet-agst-" + std::to_string(getpid()));
  make_private_dir(run_dir);
  {
    ServiceProcess gpu("gpu", stack, run_dir, model_path()),
        npu("npu", stack, run_dir, model_path());
    ASSERT_GT(gpu.pid(), 0);
    ASSERT_GT(npu.pid(), 0);
    auto engine = [&](const std::string& tag, uint32_t id_base, Plan plan) {
      ProgramEngineOptions o = agent_testing::pinned_plan_options(stack, tag, plan, 1, 64);
      o.program_id_base = id_base;
      return std::make_unique<ProgramEngine>(
          o, LlamaModel::load(o.model_path),
          make_service_link("gpu_svc", ipc_endpoint(control_socket_path(run_dir, ServiceId::gpu))),
          make_service_link("npu_svc", ipc_endpoint(control_socket_path(run_dir, ServiceId::npu))));
    };
    Plan split;
    split.name = "activation_split";
    for (Placement& pl : split.matmul) pl = {Strategy::activation_split, 0, 16};
    auto proactive = engine("pro", 100, split);
    auto reactive = engine("re", 0, Plan::gpu_only());
    ASSERT_TRUE(proactive->preemptible());

    std::vector<int32_t> prompt{1};
    for (int i = 1; i < 30; ++i) prompt.push_back(3 + (i * 71) % 1900);
    proactive->open_seq(1, 64);
    const std::vector<float> clean = *proactive->step_preemptible({{1, prompt, 0, true}}, nullptr);
    proactive->close_seq(1);

    proactive->open_seq(2, 64);
    const uint64_t ops0 = proactive->preempt_stats().ops_executed;
    std::optional<std::vector<float>> got;
    for (int round = 0; !got; ++round) {
      std::atomic<bool> done{false};
      auto run = std::async(std::launch::async, [&] {
        auto r = round == 0 ? proactive->step_preemptible({{2, prompt, 0, true}}, nullptr)
                            : proactive->resume(nullptr);
        done = true;
        return r;
      });
      std::this_thread::sleep_for(std::chrono::microseconds(1000 * round));
      while (!done && round < 5) {
        proactive->request_preempt();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      got = run.get();
      if (!got) {  // parked: a reactive request runs on the same services meanwhile
        reactive->open_seq(7, 64);
        EXPECT_EQ(reactive->step({{7, {1, 42, 43}, 0, true}}, nullptr).size(), clean.size());
        reactive->close_seq(7);
      }
    }
    const auto s = proactive->preempt_stats();
    EXPECT_GE(s.preemptions, 1u);
    EXPECT_EQ(s.ops_executed - ops0, proactive->step_ops(static_cast<uint32_t>(prompt.size())));
    ASSERT_EQ(got->size(), clean.size());
    EXPECT_EQ(std::memcmp(got->data(), clean.data(), clean.size() * sizeof(float)), 0);
    EXPECT_LT(s.max_latency_us, 200000);  // one op plus IPC; generous for a loaded machine
    std::printf("stack: %llu preemptions, max latency %.0f us\n",
                static_cast<unsigned long long>(s.preemptions), s.max_latency_us);
  }
  std::filesystem::remove_all(run_dir);
}

}  // namespace
}  // namespace duet::frontend
