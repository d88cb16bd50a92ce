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

// Greedy tokens, the decode steps' entries marked decode as the scheduler marks them; each
// step's detail in `steps` when given.
std::vector<int32_t> greedy(frontend::Engine& e, const std::vector<int32_t>& prompt, int n_new,
                            std::vector<frontend::StepDetail>* steps = nullptr) {
  const int V = e.model().hp().n_vocab;
  e.open_seq(1, 128);
  frontend::StepStats stats;
  std::vector<float> logits = e.step({{1, prompt, 0, true}}, &stats);
  if (steps) steps->push_back(stats.detail);
  std::vector<int32_t> out;
  for (int k = 0; k < n_new; ++k) {
    out.push_back(argmax(logits.data(), V));
    logits =
        e.step({{1, {out.back()}, static_cast<int32_t>(prompt.size()) + k, true, true}}, &stats);
    if (steps) steps->push_back(stats.detail);
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

// A plan per phase: the prompt's step runs the prefill placement, every decode step the decode
// one (all on the NPU, then all on the GPU, and the reverse), and the tokens stay the reference's.
TEST(SubgraphEngine, APlanPerPhaseRunsEachStepsPhasesPlacement) {
  const std::string path = test_support::tiny_fortune_path("q8_0");
  auto m = LlamaModel::load(path);
  // One token: a prompt in the smallest bucket is still a prefill step.
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{1, 450, 12, 99, 1000, 7}, std::vector<int32_t>{1}}) {
    const std::vector<int32_t> want = greedy_reference(*m, prompt, 6);
    for (const bool prefill_on_npu : {true, false}) {
      SubgraphPlan plan{"tiny-fortune", 13, {{0, 12, prefill_on_npu ? Proc::npu : Proc::gpu}}};
      plan.decode_subgraphs = {{0, 12, prefill_on_npu ? Proc::gpu : Proc::npu}};
      frontend::ProgramEngineOptions o;
      o.model_path = path;
      o.stack_id = "sgpp" + std::to_string(getpid());
      o.plan_name = "subgraph";
      o.plan_for = [](uint32_t) { return Plan::gpu_only(); };
      const std::vector<Plan> prefill = subgraph_layer_plans(plan, m->hp().n_layer);
      const std::vector<Plan> decode =
          subgraph_layer_plans(plan, m->hp().n_layer, Plan::gpu_only(), Phase::decode);
      o.layer_plans_for = [prefill](uint32_t) { return prefill; };
      o.decode_layer_plans_for = [decode](uint32_t) { return decode; };
      o.buckets = {4, 32};
      o.max_seqs = 2;
      o.max_ctx = 128;
      frontend::ProgramEngine engine(o, LlamaModel::load(path),
                                     frontend::make_interpreter_link("gpu"),
                                     frontend::make_interpreter_link("npu"));
      std::vector<frontend::StepDetail> steps;
      EXPECT_EQ(greedy(engine, prompt, 6, &steps), want) << prompt.size() << prefill_on_npu;
      ASSERT_EQ(steps.size(), 7u);
      for (size_t i = 0; i < steps.size(); ++i) {
        const bool decoding = i > 0;
        EXPECT_EQ(steps[i].decode, decoding) << i;
        // An NPU placement runs its matmuls there; a GPU one leaves the NPU idle.
        EXPECT_EQ(steps[i].on_npu, decoding != prefill_on_npu) << i;
      }
      // Two placements, two programs; each bucket of a phase shares its phase's.
      const nlohmann::json st = engine.status();
      ASSERT_EQ(st["buckets"].size(), 4u);
      EXPECT_EQ(st["buckets"][0]["phase"], "prefill");
      EXPECT_EQ(st["buckets"][3]["phase"], "decode");
      EXPECT_EQ(st["buckets"][0]["program"], st["buckets"][1]["program"]);
      EXPECT_NE(st["buckets"][1]["program"], st["buckets"][2]["program"]);
    }
  }
}

// A plan per phase whose two placements are equal is one program, as a version 1 plan.
TEST(SubgraphEngine, EqualPlacementsPerPhaseShareOneProgram) {
  const std::string path = test_support::tiny_fortune_path("q8_0");
  auto m = LlamaModel::load(path);
  SubgraphPlan plan{"tiny-fortune", 13, {{0, 4, Proc::npu}, {5, 12, Proc::gpu}}};
  plan.decode_subgraphs = plan.subgraphs;
  frontend::ProgramEngineOptions o;
  o.model_path = path;
  o.stack_id = "sgeq" + std::to_string(getpid());
  o.plan_name = "subgraph";
  o.plan_for = [](uint32_t) { return Plan::gpu_only(); };
  const std::vector<Plan> layers = subgraph_layer_plans(plan, m->hp().n_layer);
  o.layer_plans_for = [layers](uint32_t) { return layers; };
  o.decode_layer_plans_for = [layers](uint32_t) { return layers; };
  o.buckets = {4, 32};
  o.max_seqs = 2;
  o.max_ctx = 128;
  frontend::ProgramEngine engine(o, LlamaModel::load(path), frontend::make_interpreter_link("gpu"),
                                 frontend::make_interpreter_link("npu"));
  EXPECT_EQ(engine.registration().programs, 1u);
}

TEST(SubgraphEngine, TheStackNamesSubgraphPlansByFile) {
  EXPECT_TRUE(frontend::is_stack_plan("subgraph:/tmp/plan.json"));
  EXPECT_FALSE(frontend::is_stack_plan("subgraph:"));
  EXPECT_NE(frontend::stack_plan_list().find("subgraph:<plan.json>"), std::string::npos);
}

}  // namespace
}  // namespace duet::puzzle
