// A subgraph placement run by the program interpreter (the in-process executor, one thread per
// device with real flag waits) gives the reference forward's logits.
#include <gtest/gtest.h>

#include <cmath>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/program/program.h"
#include "puzzle/subgraph_program.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet::puzzle {
namespace {

// tiny-fortune has 6 layers: 13 units. NPU for layer 0 and layer 1's attention, GPU to layer 2's
// attention, the tensor plan (a ragged weight split) to layer 4's FFN, the NPU for the rest and
// the head.
SubgraphPlan mixed() {
  return {"tiny-fortune",
          13,
          {{0, 2, Proc::npu}, {3, 4, Proc::gpu}, {5, 9, Proc::both}, {10, 12, Proc::npu}}};
}

Plan ragged_weight_split(const LlamaModel& m) {
  Plan p;
  p.name = "weight_split";
  for (Placement& pl : p.matmul) pl = {Strategy::weight_split, m.hp().n_embd / 2 + 3, 0};
  return p;
}

TEST(SubgraphProgram, UnitsPlaceTheirLayersRoles) {
  const std::vector<Plan> plans = subgraph_layer_plans(mixed(), 6, Plan::npu_only());
  ASSERT_EQ(plans.size(), 7u);
  EXPECT_EQ(plans[1].at(MatmulRole::q).strategy, Strategy::npu_only);       // unit 2
  EXPECT_EQ(plans[1].at(MatmulRole::gate).strategy, Strategy::gpu_only);    // unit 3
  EXPECT_EQ(plans[2].at(MatmulRole::o).strategy, Strategy::gpu_only);       // unit 4
  EXPECT_EQ(plans[2].at(MatmulRole::down).strategy, Strategy::npu_only);    // unit 5: the tensor's
  EXPECT_EQ(plans[6].at(MatmulRole::logits).strategy, Strategy::npu_only);  // the head
  SubgraphPlan bad = mixed();
  bad.subgraphs.pop_back();
  EXPECT_THROW(subgraph_layer_plans(bad, 6), Error);
}

TEST(SubgraphProgram, APlanPerPhasePlacesEachPhasesRoles) {
  SubgraphPlan p{"tiny-fortune", 13, {{0, 12, Proc::npu}}};
  p.decode_subgraphs = {{0, 1, Proc::gpu}, {2, 12, Proc::npu}};
  const std::vector<Plan> prefill = subgraph_layer_plans(p, 6, Plan::gpu_only(), Phase::prefill);
  const std::vector<Plan> decode = subgraph_layer_plans(p, 6, Plan::gpu_only(), Phase::decode);
  EXPECT_EQ(prefill[0].at(MatmulRole::q).strategy, Strategy::npu_only);
  EXPECT_EQ(decode[0].at(MatmulRole::q).strategy, Strategy::gpu_only);
  EXPECT_EQ(decode[0].at(MatmulRole::down).strategy, Strategy::gpu_only);
  EXPECT_EQ(decode[1].at(MatmulRole::q).strategy, Strategy::npu_only);
  // One placement: both phases alike.
  p.decode_subgraphs.clear();
  const std::vector<Plan> both = subgraph_layer_plans(p, 6, Plan::gpu_only(), Phase::decode);
  EXPECT_EQ(both[0].at(MatmulRole::q).strategy, Strategy::npu_only);
}

TEST(SubgraphProgram, AMixedPlacementGivesTheReferenceLogits) {
  auto m = LlamaModel::load(test_support::tiny_fortune_path("q8_0"));
  ProgramSpec spec = test_support::program_spec(*m, Plan::gpu_only(), 16, 128, "subgraph");
  spec.layer_plans = subgraph_layer_plans(mixed(), m->hp().n_layer, ragged_weight_split(*m));
  const BuiltPrograms built = build_programs(spec);
  // Hand-offs both ways go through flags.
  size_t gpu_waits = 0, npu_waits = 0;
  for (const auto& op : built.gpu.ops) gpu_waits += op->wait_flags.size();
  for (const auto& op : built.npu.ops) npu_waits += op->wait_flags.size();
  EXPECT_GT(gpu_waits, 0u);
  EXPECT_GT(npu_waits, 0u);

  test_support::HostProgramMemory host(built, *m);
  validate_program(built.gpu, host.mem);
  validate_program(built.npu, host.mem);
  test_support::fill_page_table(host.arena.data(), built);
  test_support::LocalFlags flags(4096);
  ReferenceForward ref(*m, 128);
  const int V = m->hp().n_vocab;
  uint64_t seq = 0;
  auto step = [&](const std::vector<int32_t>& tokens, int pos) {
    return test_support::interpret_step(built, host, flags, ++seq, tokens, pos, V);
  };
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
  };
  const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 1892, 322, 42};
  std::vector<float> got = step(prompt, 0), want = ref.forward(prompt, true);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_diff(got, want, got.size()), 1e-3) << "prefill";
  int pos = static_cast<int>(prompt.size());
  for (int32_t tok : {100, 7, 1500}) {
    got = step({tok}, pos++);
    want = ref.forward(std::vector<int32_t>{tok}, false);
    EXPECT_LT(max_diff(got, want, static_cast<size_t>(V)), 1e-3) << "decode at " << pos;
  }
}

TEST(SubgraphProgram, TheBuilderRefusesAWrongNumberOfLayerPlans) {
  auto m = LlamaModel::load(test_support::tiny_fortune_path("q8_0"));
  ProgramSpec spec = test_support::program_spec(*m, Plan::gpu_only(), 16, 128, "subgraph");
  spec.layer_plans.assign(3, Plan::npu_only());
  EXPECT_THROW(build_programs(spec), Error);
}

}  // namespace
}  // namespace duet::puzzle
