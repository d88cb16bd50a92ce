// The saturation multiplier's lower bound: its interval DP, its two relaxations against what the
// simulator makes of random placements, and no method of puzzle_bench under it.
#include <gtest/gtest.h>

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
  EXPECT_DOUBLE_EQ(cheapest_partition({{3, 9, 10}, {x, 5, 4}, {x, x, 6}}), 7);
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
