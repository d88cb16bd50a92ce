#include "puzzle/scenarios.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/base/error.h"
#include "core/planner/profiler.h"

namespace duet::puzzle {
namespace {

const std::vector<std::string>& model_pool() {
  static const std::vector<std::string> pool{"llama3.2-1b", "llama3.2-3b", "internlm-1.8b",
                                             "gemma-2b", "llama3-8b"};
  return pool;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The Pareto set of candidate solutions by their objectives.
void keep_pareto(MethodResult& r) {
  const std::vector<size_t> front = nondominated_fronts(r.objectives)[0];
  std::vector<std::vector<SimModel>> sols;
  std::vector<std::vector<double>> objs;
  std::vector<Genome> genomes;
  nlohmann::json detail = nlohmann::json::array();
  for (size_t i : front) {
    sols.push_back(r.solutions[i]);
    objs.push_back(r.objectives[i]);
    if (i < r.genomes.size()) genomes.push_back(r.genomes[i]);
    if (r.detail.is_array() && i < r.detail.size()) detail.push_back(r.detail[i]);
  }
  r.solutions = std::move(sols);
  r.objectives = std::move(objs);
  r.genomes = std::move(genomes);
  if (r.detail.is_array()) r.detail = std::move(detail);
}

}  // namespace

std::vector<Scenario> make_scenarios(uint64_t seed, int count, int models) {
  Rng rng(seed);
  std::vector<Scenario> out;
  for (int i = 0; i < count; ++i) {
    Scenario s;
    s.id = i;
    const bool two_groups = i >= count / 2;
    s.groups = two_groups ? 2 : 1;
    const int n_models = models > 0 ? models : two_groups ? 4 : 3;
    const int first_group = (n_models + 1) / 2;  // the two-group scenarios' first group
    for (int m = 0; m < n_models; ++m) {
      ModelSpec spec;
      spec.shape = model_pool()[rng.below(model_pool().size())];
      spec.prompt = 32 + static_cast<int64_t>(rng.below(481));
      spec.output = 4 + static_cast<int64_t>(rng.below(21));
      spec.group = two_groups && m >= first_group ? 1 : 0;
      s.models.push_back(spec);
    }
    out.push_back(std::move(s));
  }
  return out;
}

nlohmann::json scenario_to_json(const Scenario& s) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelSpec& m : s.models)
    models.push_back(
        {{"shape", m.shape}, {"prompt", m.prompt}, {"output", m.output}, {"group", m.group}});
  return {{"id", s.id}, {"groups", s.groups}, {"models", models}};
}

ScenarioModel::ScenarioModel(Scenario scenario, const SocProfile& soc, int requests)
    : scenario_(std::move(scenario)), soc_(soc) {
  if (scenario_.models.empty() || scenario_.groups < 1)
    throw Error(Errc::invalid_argument, "puzzle scenario: no models or groups");
  for (const ModelSpec& m : scenario_.models) {
    if (m.group < 0 || m.group >= scenario_.groups || m.prompt < 1 || m.output < 1)
      throw Error(Errc::invalid_argument,
                  "puzzle scenario: model '" + m.shape + "' has a bad group or length");
    if (!costers_.count(m.shape))
      costers_.emplace(m.shape, std::make_unique<ModelCoster>(model_shape(m.shape), soc));
  }
  const SolverOptions so = solver_options_for(soc);
  options_.requests = requests;
  options_.sync_us = so.sync_us;
  options_.dual_gbps = soc.mem.dual_gbps;
  base_us_.assign(static_cast<size_t>(scenario_.groups), 0);
  for (size_t m = 0; m < scenario_.models.size(); ++m)
    base_us_[static_cast<size_t>(scenario_.models[m].group)] +=
        std::min(request_us(m, Proc::gpu), request_us(m, Proc::npu));
  for (double& b : base_us_) b *= scenario_.groups * 1.1;
}

ModelCoster& ScenarioModel::coster(size_t m) {
  return *costers_.at(scenario_.models.at(m).shape);
}

std::vector<int> ScenarioModel::units() const {
  std::vector<int> u;
  for (const ModelSpec& m : scenario_.models) u.push_back(costers_.at(m.shape)->units());
  return u;
}

std::vector<std::vector<StageCost>> ScenarioModel::steps(size_t m,
                                                         const std::vector<Subgraph>& subgraphs) {
  return steps(m, subgraphs, subgraphs);
}

std::vector<std::vector<StageCost>> ScenarioModel::steps(size_t m,
                                                         const std::vector<Subgraph>& prefill,
                                                         const std::vector<Subgraph>& decode) {
  const ModelSpec& spec = scenario_.models.at(m);
  ModelCoster& c = coster(m);
  std::vector<std::vector<StageCost>> out;
  for (int64_t s = 0; s < spec.output; ++s) {
    const int64_t n = s == 0 ? spec.prompt : 1;
    const int64_t context = s == 0 ? 0 : spec.prompt + s - 1;
    std::vector<StageCost> step;
    for (const Subgraph& g : s == 0 ? prefill : decode)
      step.push_back(c.subgraph(g.first, g.last, g.device, n, context));
    out.push_back(std::move(step));
  }
  return out;
}

double ScenarioModel::request_us(size_t m, Proc d) {
  double total = 0;
  for (const auto& step : steps(m, {{0, coster(m).units() - 1, d}}))
    for (const StageCost& s : step) total += s.span_us;
  return total;
}

std::vector<SimModel> ScenarioModel::sim_models(const Genome& g) {
  std::vector<SimModel> out;
  const size_t n = scenario_.models.size();
  if (g.cuts.size() == 2 * n) {
    const std::vector<int> rank = model_ranks(g.priority, n);
    for (size_t m = 0; m < n; ++m)
      out.push_back({scenario_.models[m].group, rank[m],
                     steps(m, decode_subgraphs(g, m), decode_subgraphs(g, n + m))});
    return out;
  }
  for (size_t m = 0; m < n; ++m)
    out.push_back({scenario_.models[m].group, g.priority[m], steps(m, decode_subgraphs(g, m))});
  return out;
}

SimResult ScenarioModel::run(const std::vector<SimModel>& models, double alpha) const {
  std::vector<double> periods = base_us_;
  for (double& p : periods) p *= alpha;
  return simulate(models, periods, options_);
}

double ScenarioModel::score(const std::vector<SimModel>& models, double alpha) const {
  std::vector<double> periods = base_us_;
  for (double& p : periods) p *= alpha;
  return xrbench_score(simulate(models, periods, options_), periods);
}

uint64_t ScenarioModel::profile_misses() const {
  uint64_t n = 0;
  for (const auto& [name, c] : costers_) n += c->stats().misses;
  return n;
}
uint64_t ScenarioModel::profile_hits() const {
  uint64_t n = 0;
  for (const auto& [name, c] : costers_) n += c->stats().hits;
  return n;
}

double saturation_multiplier(const ScenarioModel& sm,
                             const std::vector<std::vector<SimModel>>& solutions,
                             const SaturationGrid& grid) {
  if (solutions.empty()) throw Error(Errc::invalid_argument, "saturation_multiplier: no solutions");
  const int steps = static_cast<int>(std::lround((grid.to - grid.from) / grid.step));
  for (int i = 0; i <= steps; ++i) {
    const double alpha = grid.from + i * grid.step;
    std::vector<double> scores;
    for (const auto& s : solutions) scores.push_back(sm.score(s, alpha));
    if (median(scores) >= grid.threshold) return alpha;
  }
  return grid.to + grid.step;
}

namespace {
void score_saturation(const ScenarioModel& sm, MethodResult& r) {
  r.saturation = saturation_multiplier(sm, r.solutions);
  r.saturation_best = std::numeric_limits<double>::infinity();
  for (const auto& s : r.solutions)
    r.saturation_best = std::min(r.saturation_best, saturation_multiplier(sm, {s}));
}

// Method `name`: `search` fills in its solutions, objectives and detail; the result carries the
// search's time and the saturation of what it found.
template <class Search>
MethodResult timed_method(ScenarioModel& sm, std::string name, Search&& search) {
  const auto t0 = std::chrono::steady_clock::now();
  MethodResult r;
  r.method = std::move(name);
  search(r);
  r.search_s = seconds_since(t0);
  score_saturation(sm, r);
  return r;
}

// Every model of the scenario as one subgraph: its prefill on the processor prefill(m) says, its
// decode steps on decode(m)'s.
template <class PrefillOf, class DecodeOf>
std::vector<SimModel> whole_models(ScenarioModel& sm, PrefillOf&& prefill, DecodeOf&& decode) {
  std::vector<SimModel> sol;
  for (size_t m = 0; m < sm.scenario().models.size(); ++m) {
    const int last = sm.coster(m).units() - 1;
    sol.push_back({sm.scenario().models[m].group, 0,
                   sm.steps(m, {{0, last, prefill(m)}}, {{0, last, decode(m)}})});
  }
  return sol;
}
template <class ProcOf>
std::vector<SimModel> whole_models(ScenarioModel& sm, ProcOf&& proc) {
  return whole_models(sm, proc, proc);
}

// A method's one solution.
void add_solution(ScenarioModel& sm, MethodResult& r, std::vector<SimModel> sol) {
  r.objectives.push_back(objectives_ms(sm.run(sol, 1.0)));
  r.solutions.push_back(std::move(sol));
}

}  // namespace

MethodResult run_npu_only(ScenarioModel& sm) {
  return timed_method(sm, "npu-only", [&](MethodResult& r) {
    add_solution(sm, r, whole_models(sm, [](size_t) { return Proc::npu; }));
  });
}

namespace {
// Best Mapping's candidates: every whole-model mapping (per_phase: each model's prefill and its
// decode steps each on either processor), the Pareto set kept.
void best_mappings(ScenarioModel& sm, MethodResult& r, bool per_phase) {
  r.detail = nlohmann::json::array();
  const size_t n = sm.scenario().models.size();
  std::vector<int> units = sm.units();
  if (per_phase) units.insert(units.end(), units.begin(), units.end());
  for (uint32_t mask = 0; mask < (1u << (per_phase ? 2 * n : n)); ++mask) {
    // bit m: model m (its prefill) on the NPU; per phase, bit n + m: its decode steps.
    const auto prefill = [mask](size_t m) { return (mask >> m) & 1 ? Proc::npu : Proc::gpu; };
    const auto decode = [&](size_t m) { return prefill(per_phase ? n + m : m); };
    nlohmann::json map = nlohmann::json::array();
    for (size_t m = 0; m < n; ++m)
      map.push_back(per_phase ? nlohmann::json{{"prefill", proc_name(prefill(m))},
                                               {"decode", proc_name(decode(m))}}
                              : nlohmann::json(proc_name(prefill(m))));
    add_solution(sm, r, whole_models(sm, prefill, decode));
    r.detail.push_back(map);
    std::vector<uint8_t> procs;
    for (size_t m = 0; m < units.size(); ++m) procs.push_back((mask >> m) & 1);
    r.genomes.push_back(whole_model_genome(units, procs));
  }
  keep_pareto(r);
}
}  // namespace

MethodResult run_best_mapping(ScenarioModel& sm) {
  return timed_method(sm, "best-mapping", [&](MethodResult& r) { best_mappings(sm, r, false); });
}

MethodResult run_best_mapping_per_phase(ScenarioModel& sm) {
  return timed_method(sm, "best-mapping+phases",
                      [&](MethodResult& r) { best_mappings(sm, r, true); });
}

MethodResult run_per_op_solver(ScenarioModel& sm) {
  return timed_method(sm, "per-op-solver", [&](MethodResult& r) {
    // The whole model as one subgraph under the solver's tensor plan for each step.
    add_solution(sm, r, whole_models(sm, [](size_t) { return Proc::both; }));
    r.detail = nlohmann::json::array();
    for (size_t m = 0; m < sm.scenario().models.size(); ++m) {
      ModelCoster& c = sm.coster(m);
      PlanResult pre, dec;
      pre.plan = c.tensor_plan(sm.scenario().models[m].prompt);
      dec.plan = c.tensor_plan(1);
      r.detail.push_back(
          {{"prefill", plan_to_json(pre)["matmul"]}, {"decode", plan_to_json(dec)["matmul"]}});
    }
  });
}

Genome whole_model_genome(const std::vector<int>& units, const std::vector<uint8_t>& procs) {
  if (procs.size() != units.size())
    throw Error(Errc::invalid_argument, "whole_model_genome: one processor per model entry");
  Genome g;
  for (size_t m = 0; m < units.size(); ++m) {
    g.cuts.emplace_back(static_cast<size_t>(units[m] - 1), uint8_t{0});
    g.maps.emplace_back(static_cast<size_t>(units[m]), procs[m]);
    g.priority.push_back(static_cast<int>(m));
  }
  return g;
}

MethodResult run_puzzle(ScenarioModel& sm, const SearchOptions& options, double search_alpha,
                        bool per_phase) {
  PuzzleRun run;
  run.search_alpha = search_alpha;
  run.per_phase = per_phase;
  return run_puzzle(sm, options, run);
}

namespace {
// One solution's saturation multiplier by bisection on the grid (the score is taken to rise
// with alpha; the reported saturation is saturation_multiplier's scan) and its groups' mean
// makespan there as a share of the period: what SearchObjective::saturation minimises.
std::vector<double> saturation_objectives(const ScenarioModel& sm,
                                          const std::vector<SimModel>& models) {
  const SaturationGrid grid;
  const int steps = static_cast<int>(std::lround((grid.to - grid.from) / grid.step));
  int lo = 0, hi = steps + 1;  // the first grid index that scores, in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sm.score(models, grid.from + mid * grid.step) >= grid.threshold)
      hi = mid;
    else
      lo = mid + 1;
  }
  // Where two genomes saturate alike, the one with more slack there is closer to the next step.
  const double alpha = grid.from + std::min(lo, steps) * grid.step;
  const std::vector<double> at = objectives_ms(sm.run(models, alpha));
  const std::vector<double>& base = sm.base_periods_us();
  double share = 0;  // the groups' mean makespan as a share of their period
  for (size_t g = 0; g < base.size(); ++g) share += at[2 * g] * 1e3 / (alpha * base[g]);
  return {grid.from + lo * grid.step, share / static_cast<double>(base.size())};
}
}  // namespace

MethodResult run_puzzle(ScenarioModel& sm, const SearchOptions& options, const PuzzleRun& run) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool per_phase = run.per_phase;
  const double search_alpha = run.search_alpha;
  MethodResult r;
  r.method = std::string(options.choices == 2 ? "puzzle-ga" : "puzzle-ga+tensor") +
             (per_phase ? "+phases" : "") + (run.extra_seeds.empty() ? "" : "+seeded") +
             (run.objective == SearchObjective::saturation ? "+saturation" : "");
  std::vector<int> units = sm.units();
  const size_t n = units.size();
  if (per_phase) units.insert(units.end(), units.begin(), units.end());
  // Seeds beside the random genomes: each processor for everything (one subgraph per model,
  // models in order); per phase, each pair of processors for the prefills and the decodes.
  std::vector<Genome> seeds;
  for (uint8_t dev = 0; dev < options.choices; ++dev)
    for (uint8_t dec = 0; dec < options.choices; ++dec) {
      if (!per_phase && dec != dev) continue;
      std::vector<uint8_t> procs(units.size(), dev);
      std::fill(procs.begin() + static_cast<std::ptrdiff_t>(n), procs.end(), dec);
      seeds.push_back(whole_model_genome(units, procs));
    }
  for (const Genome& g : run.extra_seeds)
    if (std::find(seeds.begin(), seeds.end(), g) == seeds.end()) seeds.push_back(g);
  const SearchResult s = ga_search(
      units,
      [&](const Genome& g) {
        return run.objective == SearchObjective::saturation
                   ? saturation_objectives(sm, sm.sim_models(g))
                   : objectives_ms(sm.run(sm.sim_models(g), search_alpha));
      },
      options, seeds);
  r.search_s = seconds_since(t0);
  r.detail = nlohmann::json::array();
  for (size_t i = 0; i < s.pareto.size(); ++i) {
    r.solutions.push_back(sm.sim_models(s.pareto[i]));
    r.genomes.push_back(s.pareto[i]);
    r.objectives.push_back(s.pareto_objectives[i]);
    r.detail.push_back(solution_to_json(sm, s.pareto[i]));
  }
  score_saturation(sm, r);
  r.detail = {
      {"solutions", r.detail},
      {"search_alpha", search_alpha},
      {"objective", run.objective == SearchObjective::saturation ? "saturation" : "makespans"},
      {"generations", s.generations},
      {"evaluations", s.evaluations},
      {"mean_objective", s.mean_objective}};
  return r;
}

std::vector<int> model_ranks(const std::vector<int>& priority, size_t n_models) {
  std::vector<int> rank(n_models, 0);
  for (size_t m = 0; m < n_models; ++m)
    for (size_t o = 0; o < n_models; ++o) rank[m] += priority.at(o) < priority.at(m);
  return rank;
}

nlohmann::json solution_to_json(const ScenarioModel& sm, const Genome& g) {
  nlohmann::json models = nlohmann::json::array();
  const std::vector<int> units = sm.units();
  // A per-phase genome's model: one version 2 plan (its prefill and its decode placement), the
  // file `stack up --model-plan NAME=subgraph:FILE` runs.
  const bool per_phase = g.cuts.size() == 2 * units.size();
  for (size_t m = 0; m < units.size(); ++m) {
    SubgraphPlan p{sm.scenario().models[m].shape, units[m], decode_subgraphs(g, m)};
    if (per_phase) p.decode_subgraphs = decode_subgraphs(g, units.size() + m);
    validate_subgraph_plan(p, units[m]);
    models.push_back(subgraph_plan_to_json(p));
  }
  return {{"priority", g.priority}, {"models", models}};
}

}  // namespace duet::puzzle
