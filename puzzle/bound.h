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
// a model's stages in order and each device's stages apart. Three relaxations follow:
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
//   contention: the same windows, with the simulator's memory contention (SimOptions::dual_gbps
//     D > 0). Take demand thresholds tg, tn with tg + tn > D, c0 = 1 - D / (tg + tn), h = c0 /
//     (1 + c0), and weights g, n with 1 <= g + n <= 1 + h min(g, n). A GPU stage of demand
//     (bytes / span) >= tg is heavy and weighs g, a lighter one 1 - n; an NPU stage of demand
//     >= tn weighs n, a lighter one 1 - g; an NPU stage's own GPU work 1 - n; a both stage 1.
//     Then the window's requests' weighted nominal work (weight x span, the GPU work as the
//     throughput rule counts it) is at most t - s. Why:
//     - Stages are placed in non-decreasing start order (each pick is the least start over the
//       models; after it, device free times and every model's ready time only grow), so where
//       a stage Y overlaps a stage X of the other device placed before it, X is that device's
//       running stage when Y is placed (one placed there in between starts at or after X's end
//       and at or before Y's start). So the simulator stretched Y by e_Y = c o_Y, c = 1 - D /
//       (d_X + d_Y) where positive, o_Y = min(X's end, Y's start + Y's span) - Y's start, and
//       X and Y overlap for at most o_Y + e_Y = (1 + 1 / c) e_Y. X is never moved again; each Y
//       has one such X. The NPU stages' GPU work and both stages are in no such pair.
//     - At each instant of [s, t] the weights of the window's stages and counted GPU work
//       running there (all inside [s, t]) sum to at most 1: every weight is at most 1, a both
//       stage holds both devices, and a light stage or GPU work beside anything gives (1 - n) +
//       n, g + (1 - g) or (1 - n) + (1 - g) <= 1. Only under a heavy pair (a heavy GPU stage and
//       a heavy NPU stage of the window) is it more: g + n <= 1 + h min(g, n). That pair has
//       d_X + d_Y >= tg + tn, so c >= c0 and h (1 + 1 / c) <= 1: its excess over their overlap
//       is at most h min(g, n) (1 + 1 / c) e_Y <= weight(Y) e_Y.
//     - So the integral over [s, t] of the running weights, at most (t - s) + sum weight(Y)
//       e_Y over heavy pairs, is the weighted nominal work plus every stage's weight x stretch:
//       the weighted nominal work is at most t - s.
//     g + n = 1 is the throughput rule (weight l = g). The least weighted work of a request is the
//     same interval DP; saturation_bound tries thresholds 0.5, 0.55, ..., 0.7 x D on each device
//     and a grid of (g, n) in the triangle (1, 0), (0, 1), (p, p), p = 1 / (2 - h), that this
//     region is, refined around the three pairs of thresholds that bound best.
//   score: a missed deadline leaves that group's QoE at (J - 1) / J at most, so the score at most
//     1 - 1 / (J G); where that is under the threshold, any infeasible window rules an alpha out.
//
// A method's saturation multiplier is a grid alpha at which one of its solutions scores at least
// the threshold, so one no rule rules out: the bound is the least such grid alpha.
#include <vector>

#include "puzzle/scenarios.h"

namespace duet::puzzle {

// The contention rule's weights: a GPU stage of demand >= gpu_gbps (heavy) weighs `gpu`, a
// lighter one 1 - npu; an NPU stage of demand >= npu_gbps weighs `npu`, a lighter one 1 - gpu;
// an NPU stage's own GPU work 1 - npu; a both stage 1 (each times its span, its GPU work's time).
struct ContentionWeights {
  double gpu_gbps = 0, npu_gbps = 0;
  double gpu = 1, npu = 0;
  double weight(const StageCost& s) const;
  // weight x span, plus (with charges) an NPU stage's GPU work at 1 - npu.
  double work(const StageCost& s, bool charges) const;
};
// The least share h of a heavy pair's overlap that its later stage's stretch pays:
// c / (1 + c) for c = 1 - dual / (gpu_gbps + npu_gbps), 0 where that is not positive or dual_gbps
// is 0 (no contention).
double contention_share(double dual_gbps, double gpu_gbps, double npu_gbps);
// Whether the weights make a true bound on a SoC of that dual bandwidth: gpu and npu in [0, 1],
// 1 <= gpu + npu <= 1 + h min(gpu, npu).
bool contention_weights_valid(const ContentionWeights& w, double dual_gbps);

struct SaturationBound {
  double saturation = 0;                // the least grid alpha no rule rules out: the bound
  double critical_path_saturation = 0;  // the least grid alpha the critical path rule allows
  double throughput_saturation = 0;     // the least grid alpha the throughput rule allows
  // Off the grid, before the score's margin: the least alpha each rule allows.
  double critical_path_alpha = 0, throughput_alpha = 0;
  std::vector<double> latency_us;  // per model: its request's least latency (critical path)
  // The binding throughput window's weight l, and each model's request's least busy time at it
  // (l x GPU + (1 - l) x NPU).
  double weight = 0;
  std::vector<double> weighted_busy_us;
  // The contention rule (see above): the least grid alpha it allows, its alpha off the grid, the
  // binding window's weights and each model's request's least weighted work at them.
  double contention_saturation = 0, contention_alpha = 0;
  double saturation_without_contention = 0;  // the least grid alpha the other two rules allow
  ContentionWeights contention_weights;
  std::vector<double> contention_busy_us;
  // The throughput rule's own least-busy placements at its weight (every model's step kinds): the
  // largest demand of one of their GPU stages plus that of one of their NPU stages (0 where a
  // device has none). At most the dual bandwidth, no two of their stages contend.
  double relaxation_pair_gbps = 0;
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
