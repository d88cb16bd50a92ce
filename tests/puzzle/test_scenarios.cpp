// Scenarios from a seed, their periods, the baselines and the GA end to end on a small scenario.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "core/base/error.h"
#include "puzzle/scenarios.h"
#include "tests/support/soc_profiles.h"

namespace duet::puzzle {
namespace {

using test_support::sd8gen3;

TEST(PuzzleScenarios, TenScenariosFromASeed) {
  const std::vector<Scenario> a = make_scenarios(1), b = make_scenarios(1), c = make_scenarios(2);
  ASSERT_EQ(a.size(), 10u);
  EXPECT_EQ(scenario_to_json(a[3]), scenario_to_json(b[3]));
  EXPECT_NE(scenario_to_json(a[3]), scenario_to_json(c[3]));
  for (const Scenario& s : a) {
    EXPECT_EQ(s.groups, s.id < 5 ? 1 : 2);
    for (const ModelSpec& m : s.models) {
      EXPECT_NO_THROW(model_shape(m.shape));
      EXPECT_GE(m.prompt, 32);
      EXPECT_LE(m.prompt, 512);
      EXPECT_GE(m.output, 4);
      EXPECT_LE(m.output, 24);
    }
  }
}

TEST(PuzzleScenarios, PuzzlesShapesOnRequest) {
  // Default: three models in one group, then 2 + 2; --models 6: Puzzle's six, then 3 + 3.
  for (const auto& [models, one, first, second] :
       {std::tuple{0, 3, 2, 2}, std::tuple{6, 6, 3, 3}, std::tuple{5, 5, 3, 2}}) {
    SCOPED_TRACE(models);
    for (const Scenario& s : make_scenarios(1, 10, models)) {
      std::vector<int> per_group(static_cast<size_t>(s.groups), 0);
      for (const ModelSpec& m : s.models) ++per_group.at(static_cast<size_t>(m.group));
      const std::vector<int> want =
          s.groups == 1 ? std::vector<int>{one} : std::vector<int>{first, second};
      EXPECT_EQ(per_group, want);
    }
  }
}

Scenario small() {
  Scenario s;
  s.groups = 2;
  s.models = {{"llama3.2-1b", 64, 4, 0}, {"internlm-1.8b", 128, 3, 0}, {"llama3.2-1b", 32, 5, 1}};
  return s;
}

TEST(PuzzleScenarios, TheBasePeriodIsTheFastestProcessorsTimesNTimes1point1) {
  ScenarioModel sm(small(), sd8gen3(), 4);
  double g0 = 0, g1 = 0;
  for (size_t m = 0; m < 3; ++m) {
    const double best = std::min(sm.request_us(m, Proc::gpu), sm.request_us(m, Proc::npu));
    (m < 2 ? g0 : g1) += best;
  }
  ASSERT_EQ(sm.base_periods_us().size(), 2u);
  EXPECT_NEAR(sm.base_periods_us()[0], g0 * 2 * 1.1, 1e-6 * g0);
  EXPECT_NEAR(sm.base_periods_us()[1], g1 * 2 * 1.1, 1e-6 * g1);
}

TEST(PuzzleScenarios, TheSaturationMultiplierIsTheFirstAlphaThatScoresOne) {
  ScenarioModel sm(small(), sd8gen3(), 4);
  const MethodResult r = run_best_mapping(sm);
  ASSERT_FALSE(r.solutions.empty());
  const SaturationGrid grid;
  const double a = saturation_multiplier(sm, r.solutions, grid);
  ASSERT_LT(a, grid.to);
  EXPECT_DOUBLE_EQ(a, r.saturation);
  // At alpha the median score reaches the threshold; one step below it does not.
  auto median_score = [&](double alpha) {
    std::vector<double> s;
    for (const auto& sol : r.solutions) s.push_back(sm.score(sol, alpha));
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
  };
  EXPECT_GE(median_score(a), grid.threshold);
  if (a > grid.from + grid.step / 2) {
    EXPECT_LT(median_score(a - grid.step), grid.threshold);
  }
  EXPECT_LE(r.saturation_best, r.saturation);
}

TEST(PuzzleScenarios, TheGaIsReproducibleAndItsPlansValid) {
  SearchOptions o;
  o.population = 12;
  o.max_generations = 8;
  o.seed = 5;
  ScenarioModel a(small(), sd8gen3(), 4), b(small(), sd8gen3(), 4);
  const MethodResult ra = run_puzzle(a, o), rb = run_puzzle(b, o);
  EXPECT_EQ(ra.detail["solutions"], rb.detail["solutions"]);
  EXPECT_EQ(ra.objectives, rb.objectives);
  EXPECT_EQ(ra.saturation, rb.saturation);
  for (const auto& sol : ra.detail["solutions"])
    for (const auto& plan : sol["models"]) EXPECT_NO_THROW(subgraph_plan_from_json(plan));
  // The NPU-only and GPU-only placements seed the search, so its front is never dominated by
  // them.
  const MethodResult npu = run_npu_only(a);
  for (const auto& obj : ra.objectives) EXPECT_FALSE(dominates(npu.objectives[0], obj));
}

TEST(PuzzleScenarios, APerPhaseGenomePlacesThePrefillAndTheDecodeStepsApart) {
  ScenarioModel sm(small(), sd8gen3(), 4);
  const std::vector<int> units = sm.units();
  // Entries 0-2 place the prefills, 3-5 the decodes: model m's prefill on the NPU, its decode
  // steps on the GPU; the ranks of entries 0-2 (5, 1, 3) order the models 2nd, 0th, 1st.
  Genome g;
  for (size_t e = 0; e < 6; ++e) {
    const int u = units[e % 3];
    g.cuts.emplace_back(static_cast<size_t>(u - 1), uint8_t{0});
    g.maps.emplace_back(static_cast<size_t>(u), e < 3 ? uint8_t{1} : uint8_t{0});
  }
  g.priority = {5, 1, 3, 0, 2, 4};
  const std::vector<SimModel> models = sm.sim_models(g);
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].priority, 2);
  EXPECT_EQ(models[1].priority, 0);
  EXPECT_EQ(models[2].priority, 1);
  // The ranks the device check passes to `stack up --model-priority`: the same.
  EXPECT_EQ(model_ranks(g.priority, 3), (std::vector<int>{2, 0, 1}));
  for (size_t m = 0; m < 3; ++m) {
    ASSERT_EQ(models[m].steps.size(), static_cast<size_t>(small().models[m].output));
    const auto whole = [&](Proc d) { return std::vector<Subgraph>{{0, units[m] - 1, d}}; };
    // The same stages as a whole-model placement of each phase.
    const auto on_npu = sm.steps(m, whole(Proc::npu)), on_gpu = sm.steps(m, whole(Proc::gpu));
    EXPECT_EQ(models[m].steps[0][0].span_us, on_npu[0][0].span_us);
    EXPECT_EQ(models[m].steps[1][0].span_us, on_gpu[1][0].span_us);
    EXPECT_EQ(models[m].steps[0][0].proc, Proc::npu);
    EXPECT_EQ(models[m].steps.back()[0].proc, Proc::gpu);
  }
  const nlohmann::json j = solution_to_json(sm, g);
  // One version 2 plan per model: the stack's plan file.
  SubgraphPlan plan{"internlm-1.8b", units[1], {{0, units[1] - 1, Proc::npu}}};
  plan.decode_subgraphs = {{0, units[1] - 1, Proc::gpu}};
  EXPECT_EQ(j["models"][1], subgraph_plan_to_json(plan));
  EXPECT_EQ(subgraph_plan_from_json(j["models"][1]), plan);
}

TEST(PuzzleScenarios, ThePerPhaseGaIsSeededByEveryPairOfProcessors) {
  SearchOptions o;
  o.population = 12;
  o.max_generations = 8;
  o.seed = 5;
  ScenarioModel sm(small(), sd8gen3(), 4);
  const MethodResult ga = run_puzzle(sm, o, 1.0, true);
  EXPECT_EQ(ga.method, "puzzle-ga+phases");
  for (const auto& sol : ga.detail["solutions"])
    for (const auto& plan : sol["models"]) EXPECT_TRUE(subgraph_plan_from_json(plan).per_phase());
  // Its seeds, every model's prefill on one processor and its decode steps on one, never
  // dominate its front.
  const std::vector<int> units = sm.units();
  for (Proc pre : {Proc::gpu, Proc::npu})
    for (Proc dec : {Proc::gpu, Proc::npu}) {
      std::vector<SimModel> seed;
      for (size_t m = 0; m < units.size(); ++m)
        seed.push_back({small().models[m].group, static_cast<int>(m),
                        sm.steps(m, {{0, units[m] - 1, pre}}, {{0, units[m] - 1, dec}})});
      const std::vector<double> seed_obj = objectives_ms(sm.run(seed, 1.0));
      for (const auto& obj : ga.objectives) EXPECT_FALSE(dominates(seed_obj, obj));
    }
  // Best Mapping per phase keeps a Pareto set of the 4^3 whole-model per-phase mappings.
  const MethodResult bm = run_best_mapping_per_phase(sm);
  EXPECT_EQ(bm.method, "best-mapping+phases");
  ASSERT_FALSE(bm.solutions.empty());
  for (const auto& a : bm.objectives)
    for (const auto& b : bm.objectives) EXPECT_FALSE(dominates(a, b));
}

TEST(PuzzleScenarios, BestMappingsGenomesPlaceItsSolutions) {
  ScenarioModel sm(small(), sd8gen3(), 4);
  for (bool per_phase : {false, true}) {
    SCOPED_TRACE(per_phase);
    const MethodResult bm = per_phase ? run_best_mapping_per_phase(sm) : run_best_mapping(sm);
    ASSERT_EQ(bm.genomes.size(), bm.solutions.size());
    for (size_t i = 0; i < bm.genomes.size(); ++i) {
      // The same stages (the genome ranks the models in order; Best Mapping runs them in ready
      // order, so only the placements are compared).
      const std::vector<SimModel> placed = sm.sim_models(bm.genomes[i]);
      ASSERT_EQ(placed.size(), bm.solutions[i].size());
      for (size_t m = 0; m < placed.size(); ++m)
        for (size_t s = 0; s < placed[m].steps.size(); ++s) {
          EXPECT_EQ(placed[m].steps[s][0].proc, bm.solutions[i][m].steps[s][0].proc);
          EXPECT_EQ(placed[m].steps[s][0].span_us, bm.solutions[i][m].steps[s][0].span_us);
        }
    }
  }
  EXPECT_THROW(whole_model_genome({3, 4}, {0}), Error);
}

TEST(PuzzleScenarios, BestMappingSeedsTheGaWhereAsked) {
  SearchOptions o;
  o.population = 12;
  o.max_generations = 6;
  o.seed = 3;
  ScenarioModel sm(small(), sd8gen3(), 4);
  const MethodResult bm = run_best_mapping_per_phase(sm);
  PuzzleRun run;
  run.per_phase = true;
  run.extra_seeds = bm.genomes;
  const MethodResult ga = run_puzzle(sm, o, run);
  EXPECT_EQ(ga.method, "puzzle-ga+phases+seeded");
  // Each seed was in the initial population, so none dominates the final front.
  for (const Genome& g : bm.genomes) {
    const std::vector<double> seed_obj = objectives_ms(sm.run(sm.sim_models(g), 1.0));
    for (const auto& obj : ga.objectives) EXPECT_FALSE(dominates(seed_obj, obj));
  }
  // A seed of another scenario's shape is refused.
  run.extra_seeds = {whole_model_genome({3, 4, 5, 3, 4, 5}, {0, 0, 0, 0, 0, 0})};
  EXPECT_THROW(run_puzzle(sm, o, run), Error);
}

TEST(PuzzleScenarios, TheSaturationObjectiveIsEachGenomesOwnSaturation) {
  SearchOptions o;
  o.population = 12;
  o.max_generations = 6;
  o.seed = 3;
  o.choices = 3;
  ScenarioModel sm(small(), sd8gen3(), 4);
  PuzzleRun run;
  run.per_phase = true;
  run.objective = SearchObjective::saturation;
  const MethodResult ga = run_puzzle(sm, o, run);
  EXPECT_EQ(ga.method, "puzzle-ga+tensor+phases+saturation");
  ASSERT_EQ(ga.objectives.size(), ga.solutions.size());
  for (size_t i = 0; i < ga.solutions.size(); ++i) {
    // Its first objective: the saturation multiplier saturation_multiplier's scan finds (the
    // bisection agrees with it here), its second the makespans' share of the period there.
    EXPECT_NEAR(ga.objectives[i][0], saturation_multiplier(sm, {ga.solutions[i]}), 1e-9);
    EXPECT_GT(ga.objectives[i][1], 0);
    EXPECT_LE(ga.objectives[i][1], 1 + 1e-9);
  }
}

TEST(PuzzleScenarios, ThePerOpSolverHoldsBothDevices) {
  ScenarioModel sm(small(), sd8gen3(), 4);
  const MethodResult r = run_per_op_solver(sm);
  ASSERT_EQ(r.solutions.size(), 1u);
  bool both = false;
  for (const SimModel& m : r.solutions[0])
    for (const auto& step : m.steps) both = both || step[0].proc == Proc::both;
  EXPECT_TRUE(both);  // the tensor plan splits some matmul across GPU and NPU
}

}  // namespace
}  // namespace duet::puzzle
