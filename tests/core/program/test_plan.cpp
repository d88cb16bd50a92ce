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

}  // namespace
}  // namespace duet
