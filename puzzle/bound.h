#pragma once
// A lower bound on a scenario's saturation multiplier under the simulator's own rules
// (puzzle/simulator.h): no placement, partition, priority order or tensor plan of any method
// that puzzle/scenarios.h runs can reach a lower one. It says how much of Best Mapping's
// saturation any search could still remove.
//
// Every stage the simulator runs is some contiguous unit range [a, b] of a model, on the GPU, the
// NPU or both (the tensor plan for that step's token count), costed by ModelCoster::subgraph at the
// step's token count and context. The simulator only ever makes a stage longer than its span
// (memory contention), only ever delays its start (a hand-off, a busy device, a release), keeps
// a model's stages in order and each device's stages apart. Two relaxations follow:
//
//   critical path: a model's request takes at least the sum over its steps of the cheapest
//     partition of the step into unit ranges, each range on its fastest choice (an interval DP
//     over every range: units are the finest subgraphs a plan can express), with no contention,
//     no hand-off and no wait. A group's request j then takes at least lb_j = L + max(0,
//     lb_{j-1} - P) (its model serves one request at a time), and the XRBench score is at most
//     its value with every makespan at that least value.
//   throughput: the requests released at or after s and due by t (all met: the score rule
//     allows no miss, see below) run inside [s, t] on the two devices. For any weight l in
//     [0, 1], l x GPU busy + (1 - l) x NPU busy <= t - s, and each step's weighted busy is at
//     least its cheapest partition with a range on the GPU costing l x span, on the NPU
//     (1 - l) x span, on both span (weak LP duality of the two-machine load balance: the best l
//     gives the fractional optimum). An NPU stage's GPU work (norms, RoPE, attention) is left
//     out of the GPU's busy: the simulator may run it after the request's deadline.
//   score: a missed deadline leaves that group's QoE at (J - 1) / J at most, so the score at most
//     1 - 1 / (J G); where that is under the threshold, any infeasible window rules an alpha out.
//
// A method's saturation multiplier is a grid alpha at which one of its solutions scores at least
// the threshold, so one neither rule rules out: the bound is the least such grid alpha.
#include <vector>

#include "puzzle/scenarios.h"

namespace duet::puzzle {

struct SaturationBound {
  double saturation = 0;                // the least grid alpha neither rule rules out: the bound
  double critical_path_saturation = 0;  // the least grid alpha the critical path rule allows
  double throughput_saturation = 0;     // the least grid alpha the throughput rule allows
  // Off the grid, before the score's margin: the least alpha each rule allows.
  double critical_path_alpha = 0, throughput_alpha = 0;
  std::vector<double> latency_us;  // per model: its request's least latency (critical path)
  // The binding throughput window's weight l, and each model's request's least busy time at it
  // (l x GPU + (1 - l) x NPU).
  double weight = 0;
  std::vector<double> weighted_busy_us;
};

// choices: the processors a range may take (2: GPU and NPU, Puzzle's; 3 adds the tensor plan,
// the bound for every method puzzle_bench runs). weight_steps: the weights l tried in [0, 1]
// (any l gives a true bound; more come closer to the fractional optimum). Throws
// Error(invalid_argument) for choices outside 2-3 or weight_steps < 1.
SaturationBound saturation_bound(ScenarioModel& sm, const SaturationGrid& grid = {},
                                 int choices = 3, int weight_steps = 200);

// The least total cost of a partition of units [0, units) into contiguous ranges, range [a, b]
// costing range_cost[a][b] (b >= a): an interval DP, O(units^2). `ranges`, where given, gets
// the partition's ranges (first, last) in order.
double cheapest_partition(const std::vector<std::vector<double>>& range_cost,
                          std::vector<std::pair<int, int>>* ranges = nullptr);

// The relaxations' own placements as per-phase genomes (2M entries, ranked in model order), seeds
// for the GA: one where every model's prefill and decode steps take their least-latency
// partition (the critical path's), and one per weight l where they take their least
// l x GPU + (1 - l) x NPU busy partition (the throughput rule's). The decode placement is the
// first decode step's. Duplicates dropped. Throws Error(invalid_argument) for a weight outside
// [0, 1] or choices outside 2-3.
std::vector<Genome> relaxation_genomes(ScenarioModel& sm, const std::vector<double>& weights,
                                       int choices = 3);

}  // namespace duet::puzzle
