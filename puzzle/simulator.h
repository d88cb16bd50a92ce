#pragma once
// Puzzle's runtime simulator (section 4.3) for LLM requests on the modelled SoC: several models,
// in periodic model groups, each request a chain of stages (a prefill step, then one decode step
// per further output token, each step the model's subgraphs in order), scheduled on the GPU and
// the NPU without preemption at subgraph boundaries, the ready stage of the highest-priority model
// first (then the one ready first).
//
// What a stage costs comes from its subgraph-level profile (puzzle/subgraph_profile.h); on top:
//   - a hand-off between consecutive stages on different processors: one fast sync
//     (SolverOptions::sync_us; memory is shared, so nothing is copied);
//   - an NPU stage's own GPU work (its norms, RoPE, attention, adds) is charged to the GPU, which
//     runs it between its other kernels: the GPU's next stage starts that much later;
//   - memory contention: where stages on the two devices overlap and draw more than the SoC's
//     dual bandwidth, the later-placed stage absorbs overlap * (1 - dual / sum of demands), the
//     one-pass rule of core/timeline.h;
//   - a Proc::both stage (duet's per-op plan) holds both devices for its span.
// A model serves its requests one at a time: request j starts when released (j * the group's
// period) and its request j-1 has finished.
#include <cstdint>
#include <vector>

#include "puzzle/subgraph_profile.h"

namespace duet::puzzle {

struct SimModel {
  int group = 0;
  int priority = 0;  // lower runs first; equal priorities run in ready order
  // steps[s] = the stages of step s (prefill first) of every request of this model.
  std::vector<std::vector<StageCost>> steps;
};

struct SimOptions {
  int requests = 8;      // requests per group (J)
  double sync_us = 30;   // one cross-device hand-off
  double dual_gbps = 0;  // the SoC's shared bandwidth; 0: no contention
};

struct SimResult {
  // makespan_us[g][j]: group g's request j, from its release to its last model's finish.
  std::vector<std::vector<double>> makespan_us;
  // latency_us[m][j]: model m's request j alone, from its release to its finish (where the
  // models' priorities show: a group's makespan is its slowest model's).
  std::vector<std::vector<double>> latency_us;
  double end_us = 0;
  double gpu_busy_us = 0, npu_busy_us = 0;
  // How long each device is taken: busy, except that a both stage takes both for its span.
  double gpu_held_us = 0, npu_held_us = 0;
  int handoffs = 0;
};

// periods_us[g]: group g's period. Throws Error(invalid_argument) for a model of an unknown
// group, a model with no steps or an empty step, or a non-positive period.
SimResult simulate(const std::vector<SimModel>& models, const std::vector<double>& periods_us,
                   const SimOptions& options);

// Puzzle's objectives: for each group, the mean and the 90th percentile (nearest rank) makespan,
// in ms: {mean_0, p90_0, mean_1, p90_1, ...}.
std::vector<double> objectives_ms(const SimResult& r);

// XRBench's score as Puzzle section 6.2 adapts it: per group, the mean real-time score
// 1 / (1 + exp(k (makespan - period))) (times in ms, k = 15, as XRBench) times the QoE score (the
// share of requests with makespan <= period); the scenario's score is the mean over groups.
double xrbench_score(const SimResult& r, const std::vector<double>& periods_us, double k = 15);

}  // namespace duet::puzzle
