#pragma once
// Puzzle's genetic search (section 4.2-4.3), written here: Debian packages no C++ GA library that
// has NSGA-III (Puzzle itself uses Python's DEAP; ParadisEO is not in Debian and pagmo2's
// NSGA-II/MOEA-D are not the algorithm), and the operators are a few dozen lines each.
//
// A genome has three chromosomes:
//   cuts[m]     model m's edges between consecutive units: 1 = cut (a subgraph boundary)
//   maps[m]     model m's per-unit preferred processor (0 GPU, 1 NPU, and with choices = 3,
//               2 both under duet's tensor plan); a subgraph runs where most of its units vote
//               (a tie goes to its first unit's vote if tied, else the lowest value)
//   priority    a permutation: priority[m] is model m's rank (0 runs first)
// Each generation every genome is a parent (Puzzle: against premature convergence): pairs get
// one-point crossover on each model's cuts and maps and UPMX on the priorities, then mutation,
// then with some probability a local search (merge two neighbouring subgraphs; move a unit across
// a boundary) kept only where it dominates; parents and children are then cut back to the
// population size by NSGA-III (non-dominated fronts, the last one filled by reference-point
// niching). The search stops when the population's mean objective has not improved for
// `patience` generations (Puzzle: 3). Every random draw comes from one seeded splitmix64
// stream, so a seed gives the same search on any platform.
#include <cstdint>
#include <functional>
#include <vector>

#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), n >= 1
  double unit();               // uniform in [0, 1)

 private:
  uint64_t state_;
};

struct Genome {
  std::vector<std::vector<uint8_t>> cuts;  // [model][edge], units - 1 edges
  std::vector<std::vector<uint8_t>> maps;  // [model][unit]
  std::vector<int> priority;               // [model] -> rank
  bool operator==(const Genome&) const = default;
};

// The subgraphs a genome's model m decodes to (cuts, then a majority vote per subgraph).
std::vector<Subgraph> decode_subgraphs(const Genome& g, size_t model);
// Throws Error(internal) when a chromosome has the wrong length or priority is no permutation.
void check_genome(const Genome& g, const std::vector<int>& units, int choices = 2);

// Operators (each leaves lengths alone; UPMX and mutation keep priority a permutation).
void one_point_crossover(std::vector<uint8_t>& a, std::vector<uint8_t>& b, Rng& rng);
// UPMX (Cicirello and Smith 2000, DEAP's cxUniformPartialyMatched): at each position the mask
// picks, the two values there are swapped in each parent, each fixing the value it displaced by
// a swap so it stays a permutation. upmx_crossover draws the mask with probability indpb.
void upmx_crossover_at(std::vector<int>& a, std::vector<int>& b, const std::vector<bool>& mask);
void upmx_crossover(std::vector<int>& a, std::vector<int>& b, double indpb, Rng& rng);
// Flips each cut gene and changes each map gene (to another of `choices` values) with
// probability 1/length; with prob_flip moves one random subgraph to another processor (all its
// votes changed); swaps two ranks with prob_priority.
void mutate(Genome& g, int choices, double prob_priority, double prob_flip, Rng& rng);
// Local-search moves on model m, in place; false when there is nothing to do (no cut).
// merge: removes one cut (its two subgraphs become one). move: shifts one cut by one unit onto a
// unit that is not a cut, the moved unit voting for the subgraph it joins.
bool merge_neighbours(Genome& g, size_t model, Rng& rng);
bool move_adjacent(Genome& g, size_t model, Rng& rng);

// a dominates b: no objective worse, one better (all minimised).
bool dominates(const std::vector<double>& a, const std::vector<double>& b);
std::vector<std::vector<size_t>> nondominated_fronts(const std::vector<std::vector<double>>& objs);
// Das and Dennis's points on the unit simplex: `divisions` steps per objective.
std::vector<std::vector<double>> reference_points(size_t objectives, int divisions);
// NSGA-III environmental selection of `keep` indices of objs.
std::vector<size_t> nsga3_select(const std::vector<std::vector<double>>& objs, size_t keep,
                                 const std::vector<std::vector<double>>& refs, Rng& rng);

struct SearchOptions {
  int population = 24;  // even
  int max_generations = 60;
  int patience = 3;               // generations without improvement before stopping
  double min_improvement = 1e-3;  // relative drop of the population's mean objective
  double crossover = 0.9;
  double mutate_priority = 0.3;
  double mutate_flip = 0.3;
  double local_search = 0.25;
  double upmx_indpb = 0.5;
  double cut_density = 0.1;  // initial genomes: the chance that an edge is cut
  uint64_t seed = 1;
  int choices = 2;  // processors a subgraph may map to: 2 = Puzzle's GPU/NPU, 3 adds Proc::both
};

struct SearchResult {
  std::vector<Genome> pareto;  // the final population's first front, duplicates removed
  std::vector<std::vector<double>> pareto_objectives;
  int generations = 0;
  int64_t evaluations = 0;
  std::vector<double> mean_objective;  // per generation
};

// units[m]: model m's unit count. `seeds` join the initial population (the rest is random).
using Evaluate = std::function<std::vector<double>(const Genome&)>;
SearchResult ga_search(const std::vector<int>& units, const Evaluate& evaluate,
                       const SearchOptions& options, const std::vector<Genome>& seeds = {});

}  // namespace duet::puzzle
