#include "puzzle/subgraph_program.h"

namespace duet::puzzle {

std::vector<Plan> subgraph_layer_plans(const SubgraphPlan& plan, int n_layer, const Plan& tensor,
                                       Phase phase) {
  validate_subgraph_plan(plan, 2 * n_layer + 1);
  std::vector<Proc> unit(static_cast<size_t>(plan.units));
  for (const Subgraph& s : plan.of(phase))
    for (int u = s.first; u <= s.last; ++u) unit[static_cast<size_t>(u)] = s.device;
  auto place = [&](Plan& p, MatmulRole role, Proc proc) {
    p.at(role) = proc == Proc::gpu   ? Plan::gpu_only().at(role)
                 : proc == Proc::npu ? Plan::npu_only().at(role)
                                     : tensor.at(role);
    // A layer with a tensor-placed role runs the tensor plan's NPU graph mode.
    if (proc == Proc::both) p.npu_mode = tensor.npu_mode;
  };
  std::vector<Plan> out;
  for (int l = 0; l <= n_layer; ++l) {
    Plan p;
    p.name = plan.model + (l < n_layer ? ":layer" + std::to_string(l) : ":head");
    if (l < n_layer) {
      for (MatmulRole r : {MatmulRole::q, MatmulRole::k, MatmulRole::v, MatmulRole::o})
        place(p, r, unit[static_cast<size_t>(2 * l)]);
      for (MatmulRole r : {MatmulRole::gate, MatmulRole::up, MatmulRole::down})
        place(p, r, unit[static_cast<size_t>(2 * l + 1)]);
    } else {
      place(p, MatmulRole::logits, unit.back());
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace duet::puzzle
