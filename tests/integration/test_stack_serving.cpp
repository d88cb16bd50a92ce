// The whole stack as a user starts it (`duet stack up`: supervisor, frontend, gpu_svc, npu_svc,
// solver_svc as processes), serving on ProgramEngine:
//   - the NPU graph modes as stack plans (npu-only:online-prepare, npu-only:pipe; npu-only is
//     padding) give the reference's tokens: every greedy token the stack returns is the
//     reference's top-1 after the same prefix wherever the reference's margin exceeds 0.05;
//   - 16 clients at once, with different prompts, each get exactly what they get alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "services/frontend/stack_engines.h"
#include "tests/frontend/frontend_fixture.h"
#include "tests/support/stack_support.h"

namespace duet::frontend {
namespace {

using namespace std::chrono_literals;
using test_support::run_duet;
using namespace duet::frontend::testing;

class StackServing : public test_support::StackFixture {
 protected:
  StackServing() : StackFixture("s_", 20) {}

  void up(const std::string& plan) {
    const auto r = run_duet("stack up --stack " + id_ + " --model " + kModelPath + " --plan " +
                            plan + " --timeout 60");
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  void down() {
    const auto r = run_duet("stack down --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
  }

  client::GenerateResult generate(const std::vector<int32_t>& prompt, int max_tokens,
                                  bool ignore_eos = false) {
    client::Client c(client::stack_endpoint(id_));
    client::GenerateRequest req;
    req.prompt_ids = prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = ignore_eos;
    return c.generate(req, {}, 60s);
  }
};

// Teacher-forced on the stack's own output: after prompt + out[0..i), the reference's top-1 is
// out[i] (EOS when the stack stopped early) wherever its margin is clear. Returns {clear, agree}.
std::pair<int, int> agreement_with_reference(const std::vector<int32_t>& prompt,
                                             const std::vector<int32_t>& out, bool ended_at_eos) {
  ReferenceForward f(tiny_model());
  std::vector<float> logits = f.forward(prompt, false);
  int clear = 0, agree = 0;
  for (size_t i = 0; i <= out.size(); ++i) {
    if (i == out.size() && !ended_at_eos) break;
    const int32_t got = i < out.size() ? out[i] : tiny_tokenizer().eos();
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 0.05f) {
      ++clear;
      const auto top = std::max_element(logits.begin(), logits.end()) - logits.begin();
      if (top == got) ++agree;
    }
    if (i < out.size()) logits = f.forward(std::vector<int32_t>{out[i]}, false);
  }
  return {clear, agree};
}

TEST_F(StackServing, NpuGraphModePlansGiveTheReferenceTokens) {
  // Prompt lengths with no standard NPU graph (5, 11, 23, 37 tokens): padding, online-prepare and
  // pipe each take their own path through the NPU.
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {5, 11, 23, 37}) {
    std::vector<int32_t> p = tiny_tokenizer().encode("Q: Why is the sky so", true);
    for (int i = 0; static_cast<int>(p.size()) < n; ++i) p.push_back(300 + (i * 37) % 1500);
    p.resize(static_cast<size_t>(n));
    prompts.push_back(p);
  }
  for (const std::string plan : {"npu-only:online-prepare", "npu-only:pipe"}) {
    SCOPED_TRACE(plan);
    up(plan);
    int clear = 0, agree = 0;
    for (const auto& p : prompts) {
      const client::GenerateResult r = generate(p, 16);
      EXPECT_EQ(r.stats.plan, plan);
      const auto [c, a] = agreement_with_reference(p, r.ids, r.stats.finish_reason == "eos");
      clear += c;
      agree += a;
    }
    EXPECT_GT(clear, 20);
    EXPECT_EQ(agree, clear);
    client::Client c(client::stack_endpoint(id_));
    EXPECT_EQ(c.status()["engine"]["plan"], plan);
    down();
  }
}

TEST_F(StackServing, AnUnknownPlanIsRefusedAndTheGraphModesAreKnownPlans) {
  const auto r = run_duet("stack up --stack " + id_ + " --model " + kModelPath +
                          " --plan npu-only:bogus --timeout 10");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("npu-only:bogus"), std::string::npos) << r.out;
  EXPECT_TRUE(is_stack_plan("npu-only:pipe"));
  EXPECT_TRUE(is_stack_plan("npu-only:online-prepare"));
  EXPECT_FALSE(is_stack_plan("npu-only:padding"));  // that is npu-only itself
  EXPECT_NE(stack_plan_list().find("npu-only:pipe"), std::string::npos);
}

TEST_F(StackServing, SixteenConcurrentClientsEachGetWhatTheyGetAlone) {
  // npu-only: every step runs on both device processes (matmuls on npu_svc, the rest on gpu_svc).
  up("npu-only");
  constexpr int kClients = 16, kTokens = 10;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kClients; ++i) {
    std::vector<int32_t> p = tiny_tokenizer().encode("Q: " + std::to_string(i * 7919), true);
    for (int k = 0; k < i % 5; ++k) p.push_back(400 + i * 13 + k);
    prompts.push_back(p);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) alone.push_back(generate(p, kTokens).ids);
  client::Client c(client::stack_endpoint(id_));
  const double steps_before = c.status()["metrics"]["steps"].get<double>();
  std::vector<std::future<client::GenerateResult>> running;
  for (const auto& p : prompts)
    running.push_back(std::async(std::launch::async, [&, p] { return generate(p, kTokens); }));
  int distinct = 0;
  for (int i = 0; i < kClients; ++i) {
    const client::GenerateResult r = running[i].get();
    EXPECT_EQ(r.ids, alone[i]) << "client " << i;
    if (i > 0 && alone[i] != alone[i - 1]) ++distinct;
  }
  EXPECT_GT(distinct, 4) << "the prompts should not all give the same tokens";
  // They were batched: one request at a time takes a step per token (a prefill and
  // kTokens - 1 decodes each), so fewer steps means steps carried several sequences.
  const nlohmann::json s = c.status();
  EXPECT_LT(s["metrics"]["steps"].get<double>() - steps_before, kClients * kTokens) << s.dump();
  EXPECT_EQ(s["engine"]["open_sequences"], 0);
  down();
}

// gpu_svc on PoCL runs small steps on whichever of its two queues (all cores, or PoCL's
// single-threaded driver) it measured faster (services/gpu_svc/queue_picker.h). Through the
// stack: a decode gives the same tokens as a stack with the narrow queue off, and gpu_svc's
// status shows it measured both queues for the one-token steps before choosing.
TEST_F(StackServing, GpuSvcMeasuresBothQueuesForSmallStepsWithTheSameTokens) {
  const std::vector<int32_t> prompt = tiny_tokenizer().encode("A fool and his money", true);
  constexpr int kTokens = 40;
  ::setenv("DUET_GPU_NARROW", "off", 1);
  up("gpu-only");
  ::unsetenv("DUET_GPU_NARROW");
  const std::vector<int32_t> wide_only = generate(prompt, kTokens, true).ids;
  ASSERT_EQ(wide_only.size(), size_t(kTokens));
  down();
  up("gpu-only");
  msg::RequestClient c(ipc_endpoint(control_socket_path(run_dir_, ServiceId::gpu)));
  auto gpu_status = [&] {
    auto r = c.call([](uint64_t id) { return msg::make_status_request(id); }, 5s);
    return nlohmann::json::parse(r.message().body_as_StatusReply()->json()->str());
  };
  if (gpu_status()["narrow_device"].get<std::string>().empty())
    GTEST_SKIP() << "gpu_svc's device has no narrow queue";
  // The narrow queue's program is built after gpu_svc is ready (cl_device.h narrow_ready); until
  // then every step is wide. Measuring both needs it.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!gpu_status()["narrow_ready"].get<bool>() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  const std::vector<int32_t> picked = generate(prompt, kTokens, true).ids;
  EXPECT_EQ(picked, wide_only);
  const auto gpu = gpu_status();
  ASSERT_TRUE(gpu["narrow_ready"].get<bool>()) << "the narrow program was not built in 30 s";
  EXPECT_EQ(gpu["narrow"]["mode"], "auto");
  // The request's decode steps: the one-token shape with the most steps (shapes are per program
  // and context range; the warm-up at `stack up` left one decode step in others).
  nlohmann::json shape;
  const auto steps_of = [](const nlohmann::json& s) {
    return s["wide_steps"].get<int>() + s["narrow_steps"].get<int>();
  };
  for (const auto& s : gpu["narrow"]["shapes"])
    if (s["tokens"] == 1 && (shape.is_null() || steps_of(s) > steps_of(shape))) shape = s;
  ASSERT_FALSE(shape.is_null()) << gpu["narrow"].dump();
  EXPECT_GE(shape["wide_steps"].get<int>(), 3) << shape.dump();
  EXPECT_GE(shape["narrow_steps"].get<int>(), 3) << shape.dump();
  EXPECT_GE(steps_of(shape), kTokens - 1) << shape.dump();
  down();
}

}  // namespace
}  // namespace duet::frontend
