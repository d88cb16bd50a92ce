// A subgraph placement served by the frontend's executor (ProgramEngine over real shm segments,
// device links that interpret the programs): batched greedy tokens equal the reference's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "puzzle/subgraph_program.h"
#include "services/frontend/program_engine.h"
#include "services/frontend/stack_engines.h"
#include "tests/support/local_flags.h"

namespace duet::puzzle {
namespace {

int32_t argmax(const float* v, int n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

std::vector<int32_t> greedy(frontend::Engine& e, const std::vector<int32_t>& prompt, int n_new) {
  const int V = e.model().hp().n_vocab;
  e.open_seq(1, 128);
  std::vector<float> logits = e.step({{1, prompt, 0, true}}, nullptr);
  std::vector<int32_t> out;
  for (int k = 0; k < n_new; ++k) {
    out.push_back(argmax(logits.data(), V));
    logits = e.step({{1, {out.back()}, static_cast<int32_t>(prompt.size()) + k, true}}, nullptr);
  }
  e.close_seq(1);
  return out;
}

std::vector<int32_t> greedy_reference(const LlamaModel& m, const std::vector<int32_t>& prompt,
                                      int n_new) {
  ReferenceForward ref(m, 128);
  std::vector<float> logits = ref.forward(prompt, false);
  std::vector<int32_t> out;
  for (int k = 0; k < n_new; ++k) {
    out.push_back(argmax(logits.data(), m.hp().n_vocab));
    logits = ref.forward(std::vector<int32_t>{out.back()}, false);
  }
  return out;
}

TEST(SubgraphEngine, ASubgraphPlacementGivesTheReferencesTokens) {
  const std::string path = test_support::tiny_fortune_path("q8_0");
  auto m = LlamaModel::load(path);
  const std::vector<int32_t> prompt = {1, 450, 12, 99, 1000, 7};
  const std::vector<int32_t> want = greedy_reference(*m, prompt, 8);
  // NPU for layer 0 and layer 1's attention, GPU to layer 2's attention, NPU for the rest.
  const SubgraphPlan plan{
      "tiny-fortune", 13, {{0, 2, Proc::npu}, {3, 4, Proc::gpu}, {5, 12, Proc::npu}}};
  frontend::ProgramEngineOptions o;
  o.model_path = path;
  o.stack_id = "sgpe" + std::to_string(getpid());
  o.plan_name = "subgraph";
  o.plan_for = [](uint32_t) { return Plan::gpu_only(); };
  const std::vector<Plan> layers = subgraph_layer_plans(plan, m->hp().n_layer);
  o.layer_plans_for = [layers](uint32_t) { return layers; };
  o.buckets = {4, 32};
  o.max_seqs = 2;
  o.max_ctx = 128;
  frontend::ProgramEngine engine(o, LlamaModel::load(path), frontend::make_interpreter_link("gpu"),
                                 frontend::make_interpreter_link("npu"));
  EXPECT_EQ(greedy(engine, prompt, 8), want);
}

TEST(SubgraphEngine, TheStackNamesSubgraphPlansByFile) {
  EXPECT_TRUE(frontend::is_stack_plan("subgraph:/tmp/plan.json"));
  EXPECT_FALSE(frontend::is_stack_plan("subgraph:"));
  EXPECT_NE(frontend::stack_plan_list().find("subgraph:<plan.json>"), std::string::npos);
}

}  // namespace
}  // namespace duet::puzzle
