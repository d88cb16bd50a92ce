#include "core/program/plan.h"

#include <string>

#include "core/base/error.h"

namespace duet {

std::string_view matmul_role_name(MatmulRole r) {
  switch (r) {
    case MatmulRole::q:
      return "q";
    case MatmulRole::k:
      return "k";
    case MatmulRole::v:
      return "v";
    case MatmulRole::o:
      return "o";
    case MatmulRole::gate:
      return "gate";
    case MatmulRole::up:
      return "up";
    case MatmulRole::down:
      return "down";
    case MatmulRole::logits:
      return "logits";
  }
  return "?";
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::gpu_only:
      return "gpu-only";
    case Strategy::npu_only:
      return "npu-only";
    case Strategy::weight_split:
      return "weight";
    case Strategy::activation_split:
      return "activation";
    case Strategy::hybrid:
      return "hybrid";
    case Strategy::padding:
      return "padding";
  }
  return "?";
}

Strategy strategy_from_name(std::string_view name) {
  for (Strategy s : {Strategy::gpu_only, Strategy::npu_only, Strategy::weight_split,
                     Strategy::activation_split, Strategy::hybrid, Strategy::padding})
    if (strategy_name(s) == name) return s;
  throw Error(Errc::invalid_argument, "unknown strategy '" + std::string(name) + "'");
}

std::string_view npu_graph_mode_name(NpuGraphMode m) {
  switch (m) {
    case NpuGraphMode::exact:
      return "exact";
    case NpuGraphMode::padding:
      return "padding";
    case NpuGraphMode::online_prepare:
      return "online-prepare";
    case NpuGraphMode::pipe:
      return "pipe";
  }
  return "?";
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
