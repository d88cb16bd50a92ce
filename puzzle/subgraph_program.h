#pragma once
// Issue 25 item 2's execution path: a subgraph placement (puzzle/subgraph_plan.h) as the per-layer
// plans the program builder takes (ProgramSpec::layer_plans). Unit 2l (layer l's attention)
// places Q, K, V and O, unit 2l+1 (its FFN) gate, up and down, the head unit the logits; a unit
// on the GPU runs them gpu_only, on the NPU npu_only, on both as `tensor` places each role (the
// per-op solver's plan for the step). The builder then inserts the cross-device flag waits at
// every hand-off, as for any plan.
#include <vector>

#include "core/program/plan.h"
#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {

// n_layer + 1 plans (the last for the logits) for the steps of `phase` (a plan of one placement
// gives the same for both). Validates the plan against 2 * n_layer + 1 units (Error(bad_format)).
std::vector<Plan> subgraph_layer_plans(const SubgraphPlan& plan, int n_layer,
                                       const Plan& tensor = Plan::gpu_only(),
                                       Phase phase = Phase::prefill);

}  // namespace duet::puzzle
