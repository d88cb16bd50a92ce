#pragma once
// Puzzle's evaluation (section 6) for LLMs on the modelled SoC: random scenarios of periodic model
// groups, the saturation multiplier, and the methods compared: NPU-only, Best Mapping (each model
// wholly on one processor; the Pareto set over all 2^M mappings), duet's per-op HeteroInfer
// solver applied model by model (core/solver.h's tensor plan per phase), and the GA, both as
// Puzzle has it (subgraphs on the GPU or the NPU) and with the tensor plan as a third choice;
// and, beyond Puzzle, the GA and Best Mapping with a placement per phase (prefill, decode).
//
// Periods (6.1): a group's base period is the sum over its models of the model's request time on
// its fastest processor alone, times the number of groups N, times 1 + 0.1; a period multiplier
// alpha scales it. The saturation multiplier is the least alpha on a grid (steps of 0.05) whose
// XRBench score reaches 1.0, taken as >= 0.99 here (the score's logistic term is never exactly
// 1); where a method has several (Pareto) solutions, the median of their scores counts (6.2).
// Makespans are measured from a request's release (its period's start), so queueing counts.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "puzzle/ga.h"
#include "puzzle/simulator.h"
#include "puzzle/subgraph_profile.h"

namespace duet::puzzle {

struct ModelSpec {
  std::string shape;   // a core/shapes name
  int64_t prompt = 0;  // prompt tokens of each of its requests
  int64_t output = 0;  // output tokens (the first comes from the prefill)
  int group = 0;
};

struct Scenario {
  int id = 0;
  int groups = 1;
  std::vector<ModelSpec> models;
};

// `count` scenarios from `seed`: the first half one group of three models, the second half two
// groups of two, models drawn from llama3.2-1b, llama3.2-3b, internlm-1.8b, gemma-2b and
// llama3-8b, prompts of 32-512 tokens, 4-24 output tokens. models > 0: Puzzle's shapes instead
// (section 6.1: one group of six, two groups of three, for models = 6): the first half one group
// of `models`, the second half two groups of models / 2 (the first group takes an odd one).
std::vector<Scenario> make_scenarios(uint64_t seed, int count = 10, int models = 0);
nlohmann::json scenario_to_json(const Scenario& s);

class ScenarioModel {
 public:
  ScenarioModel(Scenario scenario, const SocProfile& soc, int requests = 8);

  const Scenario& scenario() const { return scenario_; }
  std::vector<int> units() const;
  const std::vector<double>& base_periods_us() const { return base_us_; }
  // Model m's request alone, wholly on one device.
  double request_us(size_t m, Proc d);

  // Model m's request steps (prefill, then each decode step) under a subgraph placement.
  std::vector<std::vector<StageCost>> steps(size_t m, const std::vector<Subgraph>& subgraphs);
  // The same with a placement for the prefill and another for the decode steps.
  std::vector<std::vector<StageCost>> steps(size_t m, const std::vector<Subgraph>& prefill,
                                            const std::vector<Subgraph>& decode);
  // Every model of a genome (its placements and priorities). A genome of 2M models is a
  // per-phase genome (see run_puzzle): entry m places model m's prefill, entry M + m its decode
  // steps, and model m's rank is the order of entry m among the first M entries' ranks.
  std::vector<SimModel> sim_models(const Genome& g);
  SimResult run(const std::vector<SimModel>& models, double alpha) const;
  double score(const std::vector<SimModel>& models, double alpha) const;
  ModelCoster& coster(size_t m);
  SimOptions sim_options() const { return options_; }
  uint64_t profile_misses() const;
  uint64_t profile_hits() const;

 private:
  Scenario scenario_;
  const SocProfile& soc_;
  SimOptions options_;
  std::map<std::string, std::unique_ptr<ModelCoster>> costers_;  // one per shape
  std::vector<double> base_us_;
};

// One method's solutions for a scenario and how they score.
struct MethodResult {
  std::string method;
  std::vector<std::vector<SimModel>> solutions;
  std::vector<std::vector<double>> objectives;  // at alpha = 1
  // The solutions' genomes, where the method has them (Best Mapping's: each model one subgraph,
  // ranked in model order, where its solutions run in ready order; the GA's Pareto genomes).
  std::vector<Genome> genomes;
  double saturation = 0;       // the saturation multiplier, median rule (grid max + 1: none)
  double saturation_best = 0;  // the least of the solutions' own saturation multipliers
  double search_s = 0;         // wall time to find the solutions
  nlohmann::json detail;
};

struct SaturationGrid {
  double from = 0.1, to = 6.0, step = 0.05;
  double threshold = 0.99;
};
// The least alpha whose median score over `solutions` reaches the threshold; grid.to + grid.step
// when none does.
double saturation_multiplier(const ScenarioModel& sm,
                             const std::vector<std::vector<SimModel>>& solutions,
                             const SaturationGrid& grid = {});

MethodResult run_npu_only(ScenarioModel& sm);
MethodResult run_best_mapping(ScenarioModel& sm);
MethodResult run_per_op_solver(ScenarioModel& sm);
// The GA scores candidates at periods search_alpha x the base (Puzzle searches at 1.0); its
// objectives in the result are at that alpha.
//
// per_phase: the genome places each model's prefill and its decode steps apart (2M models'
// chromosomes: an LLM's two phases prefer opposite processors on the modelled SoC, e.g.
// llama3.2-1b prefill on the NPU, decode on the GPU, where one placement for both is a
// compromise); the result's methods are "...+phases".
MethodResult run_puzzle(ScenarioModel& sm, const SearchOptions& options, double search_alpha = 1.0,
                        bool per_phase = false);

// What the GA minimises. makespans: Puzzle's, each group's mean and p90 makespan at
// search_alpha. saturation (beyond Puzzle, to see what placements can reach): a genome's own
// saturation multiplier (a bisection on the grid) and its groups' mean makespan there.
enum class SearchObjective { makespans, saturation };

struct PuzzleRun {
  double search_alpha = 1.0;
  bool per_phase = false;
  // Join the initial population after the whole-model seeds (beyond Puzzle, whose initial
  // population is random: e.g. Best Mapping's Pareto genomes, MethodResult::genomes); each must
  // be a genome of this scenario (per phase: 2M models' chromosomes).
  std::vector<Genome> extra_seeds;
  SearchObjective objective = SearchObjective::makespans;
};
// The method's name gains "+seeded" with extra seeds and "+saturation" for that objective.
MethodResult run_puzzle(ScenarioModel& sm, const SearchOptions& options, const PuzzleRun& run);

// A genome placing every model entry whole: entry m's units on procs[m] (per phase, 2M entries:
// the prefills', then the decodes'), ranked in entry order.
Genome whole_model_genome(const std::vector<int>& units, const std::vector<uint8_t>& procs);
// Best Mapping with a processor per phase: every model's prefill and decode each wholly on the
// GPU or the NPU (4^M mappings), the Pareto set kept: the baseline for the per-phase GA.
MethodResult run_best_mapping_per_phase(ScenarioModel& sm);

// A genome's placements and priorities: {"priority": [...], "models": [subgraph plan...]}.
nlohmann::json solution_to_json(const ScenarioModel& sm, const Genome& g);

// Each model's rank (0 runs first), as the simulator and `stack up --model-priority` take it:
// the order of priority[m] among the first n_models entries. A genome's priority is a
// permutation; a per-phase genome's ranks 2M entries, and a model's rank is its prefill entry's.
std::vector<int> model_ranks(const std::vector<int>& priority, size_t n_models);

}  // namespace duet::puzzle
