// Greedy generation through the whole stack (`duet stack up`: supervisor, frontend, gpu_svc,
// npu_svc, solver_svc) equals llama.cpp's greedy continuation of the same prompt on the same F16
// file (tests/data/llamacpp/greedy-*.json, made by tools/llamacpp-oracle), for every
// architecture duet reads: tiny-fortune (llama, SentencePiece), and mkmodel's llama (Llama 3's
// vocab and llama3 rope_freqs), qwen2 (Qwen2's vocab, q/k/v biases, NEOX rope), internlm2 and
// gemma (GeGLU, embeddings x sqrt(n_embd), tied output, head_dim 256, one KV head).
// Token for token up to the first step whose llama.cpp top-1 margin is within llama.cpp's own
// noise (tests/support/llamacpp_tolerance.h): from there a different choice is a near-tie.
// Two plans: auto (the solver's split of every matmul between the two devices) and npu-only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"
#include "tests/core/model/llamacpp_data.h"
#include "tests/support/llamacpp_tolerance.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::run_duet;

class StackGreedyAgainstLlamaCpp : public test_support::StackFixture {
 protected:
  StackGreedyAgainstLlamaCpp() : StackFixture("g_", 12) {}
};

TEST_F(StackGreedyAgainstLlamaCpp, EveryArchitectureGeneratesLlamaCppsTokensOnF16) {
  int compared = 0;
  for (const auto& entry : fs::directory_iterator(testdata::llamacpp_dir())) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("greedy-")) continue;
    const auto answer = testdata::load_json(entry.path().string());
    const auto logits = testdata::load_json(testdata::llamacpp_dir() + "logits-" + name.substr(7));
    const double tol = test_support::llamacpp_tolerance(logits);
    const auto want = answer.at("generated").get<std::vector<int32_t>>();
    const auto margins = answer.at("margins").get<std::vector<double>>();
    size_t clear = 0;  // steps before the first near-tie
    while (clear < want.size() && margins[clear] > tol) ++clear;
    ASSERT_GT(clear, 0u) << name;
    for (const std::string plan : {"tensor", "npu-only"}) {
      SCOPED_TRACE(name + " plan " + plan);
      const auto up = run_duet("stack up --stack " + id_ + " --model '" +
                               testdata::answer_model_path(answer.at("model").get<std::string>()) +
                               "' --plan " + plan + " --timeout 60");
      ASSERT_EQ(up.rc, 0) << up.out;
      client::Client c(client::stack_endpoint(id_));
      client::GenerateRequest req;
      req.prompt_ids = answer.at("prompt_ids").get<std::vector<int32_t>>();
      req.max_tokens = static_cast<int>(clear);
      req.ignore_eos = true;  // llama.cpp's continuation runs its full length
      const client::GenerateResult r = c.generate(req, {}, 60s);
      EXPECT_EQ(r.stats.plan, plan);
      EXPECT_EQ(r.ids, std::vector<int32_t>(want.begin(), want.begin() + clear));
      std::printf("%s, plan %s: %zu tokens equal to llama.cpp's (of %zu before a near-tie)\n",
                  name.c_str(), plan.c_str(), r.ids.size(), clear);
      ASSERT_EQ(run_duet("stack down --stack " + id_).rc, 0);
      ++compared;
    }
  }
  EXPECT_GE(compared, 10);  // fortune, llama, qwen2, internlm2, gemma x two plans
}

}  // namespace
}  // namespace duet
