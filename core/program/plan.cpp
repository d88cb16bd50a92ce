#include "core/program/plan.h"

#include <string>

#include "core/base/enum_names.h"
#include "core/base/error.h"

namespace duet {

namespace {

constexpr std::string_view kMatmulRoleNames[] = {"q",    "k",  "v",    "o",
                                                 "gate", "up", "down", "logits"};
static_assert(std::size(kMatmulRoleNames) == kMatmulRoles, "a name for every MatmulRole");
constexpr std::string_view kStrategyNames[] = {"gpu-only",   "npu-only", "weight",
                                               "activation", "hybrid",   "padding"};
static_assert(std::size(kStrategyNames) == static_cast<size_t>(Strategy::padding) + 1,
              "a name for every Strategy, in order");
constexpr std::string_view kNpuGraphModeNames[] = {"exact", "padding", "online-prepare", "pipe"};
static_assert(std::size(kNpuGraphModeNames) == static_cast<size_t>(NpuGraphMode::pipe) + 1,
              "a name for every NpuGraphMode, in order");

}  // namespace

std::string_view matmul_role_name(MatmulRole r) {
  return enum_name(kMatmulRoleNames, r, "?");
}

std::string_view strategy_name(Strategy s) {
  return enum_name(kStrategyNames, s, "?");
}

Strategy strategy_from_name(std::string_view name) {
  if (const auto s = enum_value<Strategy>(kStrategyNames, name)) return *s;
  throw Error(Errc::invalid_argument, "unknown strategy '" + std::string(name) + "'");
}

std::string_view npu_graph_mode_name(NpuGraphMode m) {
  return enum_name(kNpuGraphModeNames, m, "?");
}

bool Plan::uses_npu() const {
  for (const Placement& p : matmul)
    if (p.strategy != Strategy::gpu_only) return true;
  return false;
}

Plan Plan::gpu_only() {
  Plan p;
  p.name = "gpu-only";
  return p;
}

Plan Plan::npu_only() {
  Plan p;
  p.name = "npu-only";
  for (Placement& m : p.matmul) m.strategy = Strategy::npu_only;
  return p;
}

Plan Plan::fixed(const std::string& name) {
  if (name == "gpu-only") return gpu_only();
  if (name == "npu-only" || name == "layer" || name == "npu-only:online-prepare" ||
      name == "npu-only:pipe") {
    Plan p = npu_only();
    p.name = name;
    if (name == "npu-only:online-prepare") p.npu_mode = NpuGraphMode::online_prepare;
    if (name == "npu-only:pipe") p.npu_mode = NpuGraphMode::pipe;
    return p;
  }
  throw Error(Errc::invalid_argument, "plan '" + name + "' needs the solver (no plan_for given)");
}

}  // namespace duet
