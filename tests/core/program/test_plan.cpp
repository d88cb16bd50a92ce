// The plans that need no solver, by name (Plan::fixed): what each puts where, and a clear error
// for a name that needs the solver or does not exist.
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "core/program/plan.h"

namespace duet {
namespace {

TEST(FixedPlan, EachNameNamesItsPlacementAndGraphMode) {
  const Plan gpu = Plan::fixed("gpu-only");
  EXPECT_FALSE(gpu.uses_npu());
  for (const Placement& m : gpu.matmul) EXPECT_EQ(m.strategy, Strategy::gpu_only);

  for (const char* name : {"npu-only", "layer"}) {
    const Plan p = Plan::fixed(name);
    EXPECT_EQ(p.name, name);
    EXPECT_TRUE(p.uses_npu());
    EXPECT_EQ(p.npu_mode, NpuGraphMode::padding);
    for (const Placement& m : p.matmul) EXPECT_EQ(m.strategy, Strategy::npu_only);
  }
  EXPECT_EQ(Plan::fixed("npu-only:online-prepare").npu_mode, NpuGraphMode::online_prepare);
  EXPECT_EQ(Plan::fixed("npu-only:pipe").npu_mode, NpuGraphMode::pipe);
}

TEST(FixedPlan, ASolverPlanOrAnUnknownNameIsRefusedByName) {
  for (const char* name : {"tensor", "auto", "npu-only:fast", ""}) {
    try {
      Plan::fixed(name);
      FAIL() << "accepted '" << name << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("'" + std::string(name) + "'"), std::string::npos);
    }
  }
}

// The names plans are written with (plan JSON, status, logs), each value's own, both ways.
TEST(PlanNames, EveryRoleStrategyAndGraphModeHasItsName) {
  const char* roles[] = {"q", "k", "v", "o", "gate", "up", "down", "logits"};
  for (int r = 0; r < kMatmulRoles; ++r)
    EXPECT_EQ(matmul_role_name(static_cast<MatmulRole>(r)), roles[r]);
  const std::pair<Strategy, const char*> strategies[] = {
      {Strategy::gpu_only, "gpu-only"},   {Strategy::npu_only, "npu-only"},
      {Strategy::weight_split, "weight"}, {Strategy::activation_split, "activation"},
      {Strategy::hybrid, "hybrid"},       {Strategy::padding, "padding"}};
  for (const auto& [s, name] : strategies) {
    EXPECT_EQ(strategy_name(s), name);
    EXPECT_EQ(strategy_from_name(name), s);
  }
  EXPECT_THROW(strategy_from_name("diagonal"), Error);
  EXPECT_EQ(npu_graph_mode_name(NpuGraphMode::exact), "exact");
  EXPECT_EQ(npu_graph_mode_name(NpuGraphMode::padding), "padding");
  EXPECT_EQ(npu_graph_mode_name(NpuGraphMode::online_prepare), "online-prepare");
  EXPECT_EQ(npu_graph_mode_name(NpuGraphMode::pipe), "pipe");
  EXPECT_EQ(npu_graph_mode_name(static_cast<NpuGraphMode>(4)), "?");
}

}  // namespace
}  // namespace duet
