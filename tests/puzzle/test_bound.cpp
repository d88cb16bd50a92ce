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
  // The bound is the latest of its rules, each at or above its exact alpha; the contention rule
  // holds the throughput rule's weights, so it is never below it, and its weights are valid.
  EXPECT_DOUBLE_EQ(b.saturation, std::max({b.critical_path_saturation, b.throughput_saturation,
                                           b.contention_saturation}));
  EXPECT_DOUBLE_EQ(b.saturation_without_contention,
                   std::max(b.critical_path_saturation, b.throughput_saturation));
  EXPECT_GE(b.critical_path_saturation, b.critical_path_alpha - 1e-9);
  EXPECT_GE(b.throughput_saturation, b.throughput_alpha - 1e-9);
  EXPECT_GE(b.contention_saturation, b.contention_alpha - 1e-9);
  EXPECT_GE(b.contention_alpha, b.throughput_alpha);
  EXPECT_TRUE(contention_weights_valid(b.contention_weights, sm.sim_options().dual_gbps));
  ASSERT_EQ(b.contention_busy_us.size(), 3u);
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
  double contention_load = 0;  // the same at the contention rule's weights
  for (double w : b.contention_busy_us) contention_load += w;
  const int requests = sm.sim_options().requests;
  const double dual = sm.sim_options().dual_gbps;
  ASSERT_GT(dual, 0);  // contention on
  // The contention rule's weights to hold every run to: the bound's own, and each pair of
  // thresholds' sharpest point (p, p) and two more of its triangle.
  std::vector<ContentionWeights> weights{b.contention_weights};
  for (double tg : {25.0, 32.0, 38.0, 44.0})
    for (double tn : {25.0, 32.0, 38.0, 44.0}) {
      const double h = contention_share(dual, tg, tn);
      if (h <= 0) continue;
      const double p = 1 / (2 - h);
      for (const auto& [g, n] : std::vector<std::pair<double, double>>{
               {p, p}, {(1 + p) / 2, p / 2}, {p / 2, (1 + p) / 2}}) {
        weights.push_back({tg, tn, g, n});
        ASSERT_TRUE(contention_weights_valid(weights.back(), dual));
      }
    }
  int checked = 0, stretched = 0;
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
            // The whole run is one window [0, end] of every request: its weighted nominal work
            // (an NPU stage's GPU work counted where a later stage of its request uses the GPU,
            // which waits for it) is at most end, and at least the relaxation's.
            double nominal = 0;
            for (size_t v = 0; v < weights.size(); ++v) {
              double work = 0;
              for (const SimModel& m : models) {
                std::vector<StageCost> stages;
                for (const auto& step : m.steps)
                  stages.insert(stages.end(), step.begin(), step.end());
                for (size_t i = 0; i < stages.size(); ++i) {
                  bool charges = false;
                  for (size_t k = i + 1; k < stages.size(); ++k)
                    charges |= stages[k].proc != Proc::npu;
                  work += weights[v].work(stages[i], charges);
                  if (v == 0 && stages[i].proc != Proc::both) nominal += stages[i].span_us;
                }
              }
              work *= requests;
              EXPECT_LE(work, r.end_us * (1 + 1e-9)) << v;
              if (v == 0) {
                EXPECT_GE(work, requests * contention_load * (1 - 1e-9));
              }
            }
            // Whether contention stretched any stage: GPU and NPU stages' busy beyond their spans.
            double gpu_work = 0;
            for (const SimModel& m : models)
              for (const auto& step : m.steps)
                for (const StageCost& st : step) gpu_work += st.proc == Proc::npu ? st.gpu_us : 0.0;
            double both = 0;
            for (const SimModel& m : models)
              for (const auto& step : m.steps)
                for (const StageCost& st : step)
                  both += st.proc == Proc::both ? st.gpu_us + st.npu_us : 0.0;
            stretched += r.gpu_busy_us + r.npu_busy_us - requests * (nominal + gpu_work + both) >
                         1e-6 * r.end_us;
          }
          EXPECT_GE(saturation_multiplier(sm, {models}), b.saturation - 1e-9);
          ++checked;
          return objectives_ms(sm.run(models, 1.0));
        },
        o);
  }
  EXPECT_GE(checked, 4 * o.population);
  EXPECT_GE(stretched, 2 * checked);  // not vacuous: contention stretched stages in most runs
}

TEST(PuzzleBound, TheContentionShareAndItsValidWeights) {
  // 40 + 40 GB/s against 60: c = 1 - 60 / 80 = 0.25, h = c / (1 + c) = 0.2.
  EXPECT_DOUBLE_EQ(contention_share(60, 40, 40), 0.2);
  EXPECT_EQ(contention_share(60, 30, 30), 0);  // no more than the dual bandwidth
  EXPECT_EQ(contention_share(0, 40, 40), 0);   // no contention modelled
  const double p = 1 / 1.8;                    // the sharpest weights: g = n = 1 / (2 - h)
  EXPECT_TRUE(contention_weights_valid({40, 40, p, p}, 60));
  EXPECT_FALSE(contention_weights_valid({40, 40, p + 1e-6, p}, 60));
  EXPECT_TRUE(contention_weights_valid({40, 40, 1, 0}, 60));  // the throughput rule's
  EXPECT_TRUE(contention_weights_valid({40, 40, 0.3, 0.7}, 0));
  EXPECT_FALSE(contention_weights_valid({40, 40, 0.6, 0.6}, 0));   // no contention: g + n <= 1
  EXPECT_FALSE(contention_weights_valid({40, 40, 0.3, 0.6}, 60));  // light ones over 1
  // Heavy at or above the thresholds; a lighter stage takes the other device's complement, an
  // NPU stage's GPU work 1 - n, a both stage 1.
  const ContentionWeights w{40, 30, 0.7, 0.4};
  auto stage = [](Proc proc, double span, double gbps, double gpu_us = 0) {
    return StageCost{proc, span, gpu_us, 0, gbps * span * 1e3};
  };
  EXPECT_DOUBLE_EQ(w.work(stage(Proc::gpu, 100, 40), true), 70);
  EXPECT_DOUBLE_EQ(w.work(stage(Proc::gpu, 100, 39), true), 60);
  EXPECT_DOUBLE_EQ(w.work(stage(Proc::npu, 100, 30, 10), true), 40 + 6);
  EXPECT_DOUBLE_EQ(w.work(stage(Proc::npu, 100, 29, 10), false), 30);
  EXPECT_DOUBLE_EQ(w.work(stage(Proc::both, 100, 50), true), 100);
}

// Two models of two stages each, a heavy GPU stage and a heavy NPU stage side by side twice: the
// later-placed stage of each pair stretches to the end of the other (x = 1.25 y), so both
// devices are busy the whole 2x; the throughput rule (any g + n = 1) sees 1.8x of work, the
// contention rule at its sharpest weights exactly 2x.
TEST(PuzzleBound, TheContentionRuleIsTightForTwoStretchedPairs) {
  const double x = 1000, y = x / 1.25;  // c = 0.25 at 40 + 40 GB/s against 60
  auto stage = [](Proc proc, double span) { return StageCost{proc, span, 0, 0, 40 * span * 1e3}; };
  const std::vector<SimModel> models{
      {0, 0, {{stage(Proc::gpu, x), stage(Proc::npu, x)}}},   // placed first in each pair
      {0, 1, {{stage(Proc::npu, y), stage(Proc::gpu, y)}}}};  // stretched by y / 4 each
  SimOptions o;
  o.requests = 1;
  o.sync_us = 0;
  o.dual_gbps = 60;
  const SimResult r = simulate(models, {1e6}, o);
  ASSERT_NEAR(r.end_us, 2 * x, 1e-9);
  ASSERT_NEAR(r.gpu_busy_us, 2 * x, 1e-9);  // both devices busy throughout
  ASSERT_NEAR(r.npu_busy_us, 2 * x, 1e-9);
  auto work = [&](const ContentionWeights& w) {
    double total = 0;
    for (const SimModel& m : models)
      for (const StageCost& s : m.steps[0]) total += w.work(s, true);
    return total;
  };
  const double p = 1 / (2 - contention_share(60, 40, 40));
  EXPECT_NEAR(work({40, 40, p, p}), 2 * x, 1e-9);  // tight
  for (double l : {0.0, 0.3, 0.5, 1.0}) EXPECT_NEAR(work({40, 40, l, 1 - l}), 1.8 * x, 1e-9);
  // Every valid weight of the triangle (and so the rule) stays at or under the run's 2x.
  for (double g = 0; g <= 1; g += 0.01)
    for (double n = 0; n <= 1; n += 0.01)
      if (contention_weights_valid({40, 40, g, n}, 60)) {
        EXPECT_LE(work({40, 40, g, n}), 2 * x + 1e-9);
      }
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
    EXPECT_GE(b.saturation, b.saturation_without_contention);
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
