// The saturation multiplier's lower bound: its interval DP, its two relaxations against what the
// simulator makes of random placements, and no method of puzzle_bench under it.
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "core/base/error.h"
#include "puzzle/bound.h"
#include "puzzle/scenarios.h"
#include "tests/support/soc_profiles.h"

namespace duet::puzzle {
namespace {

using test_support::sd8gen3;

TEST(PuzzleBound, TheCheapestPartitionSumsTheBestRanges) {
  const double x = std::numeric_limits<double>::infinity();  // below the diagonal: unused
  // Three units: [0, 2] whole costs 10, [0, 0] + [1, 2] costs 3 + 4.
  std::vector<std::pair<int, int>> ranges;
  EXPECT_DOUBLE_EQ(cheapest_partition({{3, 9, 10}, {x, 5, 4}, {x, x, 6}}, &ranges), 7);
  EXPECT_EQ(ranges, (std::vector<std::pair<int, int>>{{0, 0}, {1, 2}}));
  // Whole is cheapest where a range costs less than its parts.
  EXPECT_DOUBLE_EQ(cheapest_partition({{3, 5, 6}, {x, 5, 4}, {x, x, 6}}), 6);
  EXPECT_DOUBLE_EQ(cheapest_partition({}), 0);
  EXPECT_THROW(cheapest_partition({{1, 2}, {1}}), Error);
}

Scenario two_groups() {
  Scenario s;
  s.groups = 2;
  s.models = {{"llama3.2-1b", 200, 6, 0}, {"internlm-1.8b", 64, 4, 0}, {"llama3.2-1b", 48, 8, 1}};
  return s;
}

TEST(PuzzleBound, ALatencyIsNoMoreThanAnyWholeModelPlacements) {
  ScenarioModel sm(two_groups(), sd8gen3(), 4);
  const SaturationBound b = saturation_bound(sm);
  ASSERT_EQ(b.latency_us.size(), 3u);
  for (size_t m = 0; m < 3; ++m) {
    SCOPED_TRACE(m);
    EXPECT_GT(b.latency_us[m], 0);
    for (Proc p : {Proc::gpu, Proc::npu, Proc::both})
      EXPECT_LE(b.latency_us[m], sm.request_us(m, p));
  }
  // Fewer choices (no tensor plan) can only raise it.
  const SaturationBound two = saturation_bound(sm, {}, 2);
  for (size_t m = 0; m < 3; ++m) EXPECT_GE(two.latency_us[m], b.latency_us[m]);
  EXPECT_GE(two.saturation, b.saturation);
  // The bound is the later of its rules, each at or above its exact alpha.
  EXPECT_DOUBLE_EQ(b.saturation, std::max(b.critical_path_saturation, b.throughput_saturation));
  EXPECT_GE(b.critical_path_saturation, b.critical_path_alpha - 1e-9);
  EXPECT_GE(b.throughput_saturation, b.throughput_alpha - 1e-9);
  EXPECT_THROW(saturation_bound(sm, {}, 1), Error);
  EXPECT_THROW(saturation_bound(sm, {}, 3, 0), Error);
}

// The least cost of a model's step over every placement with at most max_cuts cuts (each
// partition, each range on each choice), by enumeration: what the bound's interval DP must not
// exceed, and with every cut allowed must equal.
template <class Cost>
double least_over_placements(ModelCoster& c, int64_t n, int64_t context, int max_cuts,
                             Cost&& cost) {
  const int units = c.units();
  double best = std::numeric_limits<double>::infinity();
  // Cut sets in increasing order of their edges: cuts[i] = the unit a range ends at.
  std::function<void(std::vector<int>&)> each = [&](std::vector<int>& cuts) {
    std::vector<std::pair<int, int>> ranges;
    int first = 0;
    for (int e : cuts) {
      ranges.push_back({first, e});
      first = e + 1;
    }
    ranges.push_back({first, units - 1});
    int combos = 1;
    for (size_t i = 0; i < ranges.size(); ++i) combos *= kProcs;
    for (int pick = 0; pick < combos; ++pick) {
      double total = 0;
      for (int i = 0, p = pick; i < static_cast<int>(ranges.size()); ++i, p /= kProcs)
        total += cost(c.subgraph(ranges[i].first, ranges[i].second, static_cast<Proc>(p % kProcs),
                                 n, context));
      best = std::min(best, total);
    }
    if (static_cast<int>(cuts.size()) == max_cuts) return;
    for (int e = cuts.empty() ? 0 : cuts.back() + 1; e < units - 1; ++e) {
      cuts.push_back(e);
      each(cuts);
      cuts.pop_back();
    }
  };
  std::vector<int> cuts;
  each(cuts);
  return best;
}

// A step's busy time weighted l on the GPU, 1 - l on the NPU (an NPU stage's GPU work counted
// or not), both for a stage on both.
auto weighted(double l, bool charges) {
  return [l, charges](const StageCost& s) {
    return s.proc == Proc::gpu   ? l * s.span_us
           : s.proc == Proc::npu ? (1 - l) * s.span_us + (charges ? l * s.gpu_us : 0.0)
                                 : s.span_us;
  };
}
const auto span = [](const StageCost& s) { return s.span_us; };

TEST(PuzzleBound, TheIntervalDpFindsTheBestOfEveryPlacement) {
  Scenario sc;
  sc.models = {{"tiny-qwen2", 64, 4, 0}};
  ScenarioModel sm(sc, sd8gen3(), 4);
  ModelCoster& c = sm.coster(0);
  ASSERT_EQ(c.units(), 5);
  const SaturationBound b = saturation_bound(sm);
  // The prefill, then 3 decode steps at contexts 64-66 (one profile bucket).
  const int64_t ctx = c.bucket(64);
  const double latency =
      least_over_placements(c, 64, 0, 4, span) + 3 * least_over_placements(c, 1, ctx, 4, span);
  EXPECT_NEAR(b.latency_us[0], latency, 1e-9 * latency);
  // One model, one group: the binding window is one request in one period, and its weighted
  // busy lies between every step's least with the NPU stages' GPU work all left out and all
  // counted (the bound counts it where a later stage must wait for it).
  const double l = b.weight;
  const double lo = least_over_placements(c, 64, 0, 4, weighted(l, false)) +
                    3 * least_over_placements(c, 1, ctx, 4, weighted(l, false));
  const double hi = least_over_placements(c, 64, 0, 4, weighted(l, true)) +
                    3 * least_over_placements(c, 1, ctx, 4, weighted(l, true));
  ASSERT_EQ(b.weighted_busy_us.size(), 1u);
  EXPECT_GE(b.weighted_busy_us[0], lo * (1 - 1e-9));
  EXPECT_LE(b.weighted_busy_us[0], hi * (1 + 1e-9));
  EXPECT_NEAR(b.throughput_alpha, b.weighted_busy_us[0] / sm.base_periods_us()[0], 1e-12);
}

// A real model (llama3.2-1b: its prefill is faster on the NPU, its decode steps on the GPU), at
// any weight: the bound never costs a request more than its best placement with two cuts.
TEST(PuzzleBound, NoPlacementWithFewCutsCostsLessThanTheBound) {
  Scenario sc;
  sc.models = {{"llama3.2-1b", 256, 3, 0}};
  ScenarioModel sm(sc, sd8gen3(), 4);
  ModelCoster& c = sm.coster(0);
  const SaturationBound b = saturation_bound(sm);
  // The prefill, then decode steps at contexts 256 and 257 (buckets 256 and 512).
  auto request = [&](auto cost) {
    return least_over_placements(c, 256, 0, 2, cost) +
           least_over_placements(c, 1, c.bucket(256), 2, cost) +
           least_over_placements(c, 1, c.bucket(257), 2, cost);
  };
  EXPECT_LE(b.latency_us[0], request(span) * (1 + 1e-9));
  EXPECT_LE(b.weighted_busy_us[0], request(weighted(b.weight, true)) * (1 + 1e-9));
  // Not vacuous: the weight balances the two devices, and one placement is within 5% of the
  // bound's busy (the prefill on the NPU, the decode steps on the GPU).
  EXPECT_GT(b.weight, 0.05);
  EXPECT_LT(b.weight, 0.95);
  EXPECT_GE(b.weighted_busy_us[0], 0.95 * request(weighted(b.weight, true)));
}

TEST(PuzzleBound, TheRelaxationsPlacementsAreGenomesThatRunAtTheirCost) {
  Scenario sc;
  sc.models = {{"tiny-qwen2", 64, 4, 0}};
  ScenarioModel sm(sc, sd8gen3(), 4);
  const SaturationBound b = saturation_bound(sm);
  // Without weights: the critical path's placement alone. Alone on the SoC its request takes the
  // bound's latency plus its hand-offs (every decode step shares one context bucket here).
  const std::vector<Genome> path = relaxation_genomes(sm, {});
  ASSERT_EQ(path.size(), 1u);
  check_genome(path[0], {5, 5}, 3);
  const SimResult r = sm.run(sm.sim_models(path[0]), 100.0);
  const double sync = sm.sim_options().sync_us * r.handoffs / sm.sim_options().requests;
  EXPECT_NEAR(r.latency_us[0][0], b.latency_us[0] + sync, 1e-6 * b.latency_us[0]);
  // With weights, GPU and NPU only where asked; duplicates dropped.
  const std::vector<Genome> two = relaxation_genomes(sm, {0.0, 0.5, 1.0}, 2);
  ASSERT_GE(two.size(), 1u);
  ASSERT_LE(two.size(), 4u);
  for (const Genome& g : two) check_genome(g, {5, 5}, 2);
  EXPECT_THROW(relaxation_genomes(sm, {1.5}), Error);
}

// Random genomes, per phase with the tensor plan as a third choice (the widest placements any
// method makes): what the simulator makes of them never beats either relaxation.
TEST(PuzzleBound, RandomPlacementsNeverBeatTheRelaxations) {
  ScenarioModel sm(two_groups(), sd8gen3(), 4);
  const SaturationBound b = saturation_bound(sm);
  std::vector<int> units = sm.units();
  units.insert(units.end(), units.begin(), units.end());
  SearchOptions o;
  o.population = 24;
  o.max_generations = 2;
  o.choices = 3;
  o.cut_density = 0.3;
  double load = 0;  // one request of every model, weighted as the binding window
  for (double w : b.weighted_busy_us) load += w;
  const int requests = sm.sim_options().requests;
  int checked = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    o.seed = seed;
    // Every genome the search evaluates: its random initial population and its children.
    ga_search(
        units,
        [&](const Genome& g) {
          const std::vector<SimModel> models = sm.sim_models(g);
          for (double alpha : {0.3, 1.0, 3.0}) {
            const SimResult r = sm.run(models, alpha);
            for (size_t m = 0; m < models.size(); ++m)
              for (double lat : r.latency_us[m]) EXPECT_GE(lat, b.latency_us[m] * (1 - 1e-9));
            EXPECT_GE(b.weight * r.gpu_held_us + (1 - b.weight) * r.npu_held_us,
                      requests * load * (1 - 1e-9));
          }
          EXPECT_GE(saturation_multiplier(sm, {models}), b.saturation - 1e-9);
          ++checked;
          return objectives_ms(sm.run(models, 1.0));
        },
        o);
  }
  EXPECT_GE(checked, 4 * o.population);
}

// puzzle_bench's methods (Puzzle's options) on ten scenarios of a seed: none saturates below the
// bound, by the median rule or by its best single solution.
class PuzzleBoundSeeds : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PuzzleBoundSeeds, NoMethodSaturatesBelowTheBound) {
  const SocProfile& soc = sd8gen3();
  SearchOptions ga;
  ga.seed = GetParam();
  SearchOptions tensor = ga;
  tensor.choices = 3;
  for (const Scenario& sc : make_scenarios(GetParam())) {
    ScenarioModel sm(sc, soc);
    const SaturationBound b = saturation_bound(sm);
    EXPECT_GE(b.saturation, 0.3);  // not vacuous: the models' work needs time
    for (const MethodResult& r :
         {run_npu_only(sm), run_best_mapping(sm), run_per_op_solver(sm), run_puzzle(sm, ga),
          run_puzzle(sm, tensor), run_best_mapping_per_phase(sm), run_puzzle(sm, ga, 1.0, true),
          run_puzzle(sm, tensor, 1.0, true)}) {
      SCOPED_TRACE(std::to_string(sc.id) + " " + r.method);
      EXPECT_GE(r.saturation, b.saturation - 1e-9);
      EXPECT_GE(r.saturation_best, b.saturation - 1e-9);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, PuzzleBoundSeeds, ::testing::Values(1u, 2u));

}  // namespace
}  // namespace duet::puzzle
