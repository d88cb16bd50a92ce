// Puzzle's evaluation (issue 25 item 4) on the modelled SoC: ten random scenarios of LLMs in
// periodic model groups; for each, the saturation multiplier of the GA's Pareto solutions against
// NPU-only, Best Mapping and duet's per-op solver applied model by model, and each method's
// search time. Prints a markdown table; --out writes everything as JSON.
//
//   puzzle_bench [--soc sd8gen3] [--seed 1] [--scenarios 10] [--population 24]
//                [--generations 60] [--patience 3] [--requests 8] [--search-alpha 1.0]
//                [--out results.json]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "core/base/error.h"
#include "puzzle/scenarios.h"

using namespace duet;
using namespace duet::puzzle;

namespace {
struct Args {
  std::string soc = "sd8gen3", out;
  uint64_t seed = 1;
  int scenarios = 10, population = 24, generations = 60, requests = 8, patience = 3;
  int models = 0;  // models per scenario; 0: 3 (one group) and 2 + 2 (two groups)
  double search_alpha = 1.0;
};

nlohmann::json method_json(const MethodResult& r) {
  return {{"method", r.method},
          {"saturation", r.saturation},
          {"saturation_best", r.saturation_best},
          {"search_s", r.search_s},
          {"solutions", r.solutions.size()},
          {"objectives_ms", r.objectives},
          {"detail", r.detail}};
}

struct Stat {
  double sum = 0, sq = 0;
  int n = 0;
  void add(double v) {
    sum += v;
    sq += v * v;
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
  double sd() const { return n > 1 ? std::sqrt(std::max(0.0, (sq - sum * sum / n) / (n - 1))) : 0; }
};
}  // namespace

int main(int argc, char** argv) try {
  Args a;
  CLI::App app{"puzzle_bench: Puzzle's GA against NPU-only, Best Mapping and duet's solver"};
  app.add_option("--soc", a.soc, "SoC profile");
  app.add_option("--out", a.out, "write every result as JSON here");
  app.add_option("--seed", a.seed, "the scenarios' and the search's seed");
  app.add_option("--scenarios", a.scenarios, "random scenarios");
  app.add_option("--models", a.models,
                 "models per scenario (Puzzle's 6: one group of 6, two groups of 3); default: 3 "
                 "in one group, 2 + 2 in two");
  app.add_option("--population", a.population, "GA population");
  app.add_option("--generations", a.generations, "GA generations at most");
  app.add_option("--requests", a.requests, "requests simulated per model");
  app.add_option("--patience", a.patience, "generations without improvement before the GA stops");
  app.add_option("--search-alpha", a.search_alpha,
                 "the GA scores candidates at periods search-alpha x the base");
  CLI11_PARSE(app, argc, argv);
  const SocProfile soc = load_soc_profile(a.soc);
  SearchOptions so;
  so.seed = a.seed;
  so.population = a.population;
  so.max_generations = a.generations;
  so.patience = a.patience;
  nlohmann::json out = {{"soc", soc.name},
                        {"seed", a.seed},
                        {"requests", a.requests},
                        {"population", a.population},
                        {"patience", a.patience},
                        {"search_alpha", a.search_alpha},
                        {"scenarios", nlohmann::json::array()}};
  constexpr int kMethods = 7;
  Stat sat[kMethods], best[kMethods], secs[kMethods];
  std::string names[kMethods];
  std::printf(
      "| scenario | models (shape, group, prompt/output) | NPU-only | Best Mapping | per-op solver "
      "| "
      "Puzzle GA | GA+tensor | Best Mapping per phase | Puzzle GA per phase | GA Pareto (GA, "
      "+tensor) | GA search s (GA, +tensor) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Scenario& sc : make_scenarios(a.seed, a.scenarios, a.models)) {
    ScenarioModel sm(sc, soc, a.requests);
    SearchOptions tensor = so;
    tensor.choices = 3;
    const MethodResult rs[kMethods] = {run_npu_only(sm),
                                       run_best_mapping(sm),
                                       run_per_op_solver(sm),
                                       run_puzzle(sm, so, a.search_alpha),
                                       run_puzzle(sm, tensor, a.search_alpha),
                                       run_best_mapping_per_phase(sm),
                                       run_puzzle(sm, so, a.search_alpha, true)};
    nlohmann::json js = scenario_to_json(sc);
    js["base_periods_us"] = sm.base_periods_us();
    js["methods"] = nlohmann::json::array();
    std::string models;
    for (const ModelSpec& m : sc.models)
      models += (models.empty() ? "" : ", ") + m.shape + " g" + std::to_string(m.group) + " " +
                std::to_string(m.prompt) + "/" + std::to_string(m.output);
    for (int i = 0; i < kMethods; ++i) {
      names[i] = rs[i].method;
      sat[i].add(rs[i].saturation);
      best[i].add(rs[i].saturation_best);
      secs[i].add(rs[i].search_s);
      js["methods"].push_back(method_json(rs[i]));
    }
    js["profiles"] = {{"misses", sm.profile_misses()}, {"hits", sm.profile_hits()}};
    out["scenarios"].push_back(js);
    std::printf(
        "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %zu, %zu | %.2f, %.2f |\n",
        sc.id, models.c_str(), rs[0].saturation, rs[1].saturation, rs[2].saturation,
        rs[3].saturation, rs[4].saturation, rs[5].saturation, rs[6].saturation,
        rs[3].solutions.size(), rs[4].solutions.size(), rs[3].search_s, rs[4].search_s);
    std::fflush(stdout);
  }
  nlohmann::json summary = nlohmann::json::object();
  std::printf(
      "\n| method | saturation multiplier (median rule) | best single solution | search s |\n"
      "|---|---|---|---|\n");
  for (int i = 0; i < kMethods; ++i) {
    summary[names[i]] = {{"saturation_mean", sat[i].mean()},
                         {"saturation_sd", sat[i].sd()},
                         {"saturation_best_mean", best[i].mean()},
                         {"saturation_best_sd", best[i].sd()},
                         {"search_s_mean", secs[i].mean()}};
    std::printf("| %s | %.2f +- %.2f | %.2f +- %.2f | %.2f |\n", names[i].c_str(), sat[i].mean(),
                sat[i].sd(), best[i].mean(), best[i].sd(), secs[i].mean());
  }
  out["summary"] = summary;
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    f << out.dump(1) << "\n";
    if (!f) throw Error(Errc::io, "puzzle_bench: cannot write " + a.out);
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "puzzle_bench: %s: %s\n", std::string(errc_name(e.code())).c_str(),
               e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "puzzle_bench: %s\n", e.what());
  return 2;
}
