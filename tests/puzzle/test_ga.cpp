// The GA's operators, NSGA-III selection on a hand-made front, and the search's reproducibility.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "puzzle/ga.h"

namespace duet::puzzle {
namespace {

bool is_permutation_of_ranks(std::vector<int> p) {
  std::sort(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int>(i)) return false;
  return true;
}

Genome genome(std::vector<uint8_t> cuts, std::vector<uint8_t> maps, std::vector<int> priority) {
  return {{std::move(cuts)}, {std::move(maps)}, std::move(priority)};
}

size_t count_cuts(const Genome& g, size_t m) {
  return static_cast<size_t>(std::count(g.cuts[m].begin(), g.cuts[m].end(), 1));
}

TEST(PuzzleGa, MajorityVoteDecidesASubgraphsDevice) {
  // Puzzle's Fig. 7: a subgraph of three units voting NPU, NPU, GPU runs on the NPU; a tie goes
  // to the subgraph's first unit.
  const Genome g = genome({0, 0, 1, 0, 1}, {1, 1, 0, 0, 1, 0}, {0});
  const std::vector<Subgraph> s = decode_subgraphs(g, 0);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (Subgraph{0, 2, Proc::npu}));
  EXPECT_EQ(s[1], (Subgraph{3, 4, Proc::gpu}));  // votes GPU, NPU: the first unit's
  EXPECT_EQ(s[2], (Subgraph{5, 5, Proc::gpu}));
}

TEST(PuzzleGa, ThreeChoicesVoteByPlurality) {
  // Votes GPU, both, both, NPU: both wins; GPU, NPU, both: a three-way tie goes to the first.
  const Genome g = genome({0, 0, 0, 1, 0, 0}, {0, 2, 2, 1, 1, 0, 2}, {0});
  const std::vector<Subgraph> s = decode_subgraphs(g, 0);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (Subgraph{0, 3, Proc::both}));
  EXPECT_EQ(s[1], (Subgraph{4, 6, Proc::npu}));
}

TEST(PuzzleGa, OnePointCrossoverSwapsTails) {
  Rng rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<uint8_t> a(9, 0), b(9, 1);
    one_point_crossover(a, b, rng);
    ASSERT_EQ(a.size(), 9u);
    const size_t point = static_cast<size_t>(std::find(a.begin(), a.end(), 1) - a.begin());
    EXPECT_GE(point, 1u);
    EXPECT_LE(point, 8u);
    for (size_t i = 0; i < 9; ++i) {
      EXPECT_EQ(a[i], i < point ? 0 : 1);
      EXPECT_EQ(b[i], i < point ? 1 : 0);
    }
  }
}

TEST(PuzzleGa, UpmxKeepsPermutations) {
  Rng rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> a(6), b(6);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 0);
    for (size_t i = 6; i > 1; --i) std::swap(b[i - 1], b[rng.below(i)]);
    upmx_crossover(a, b, 0.5, rng);
    EXPECT_TRUE(is_permutation_of_ranks(a));
    EXPECT_TRUE(is_permutation_of_ranks(b));
  }
  // DEAP's docstring example: mask [0, 1, 0, 0, 1].
  std::vector<int> a{0, 1, 2, 3, 4}, b{1, 2, 3, 4, 0};
  upmx_crossover_at(a, b, {false, true, false, false, true});
  EXPECT_EQ(a, (std::vector<int>{4, 2, 1, 3, 0}));
  EXPECT_EQ(b, (std::vector<int>{2, 1, 3, 0, 4}));
  // indpb 0 leaves both alone.
  upmx_crossover(a, b, 0.0, rng);
  EXPECT_EQ(a, (std::vector<int>{4, 2, 1, 3, 0}));
}

TEST(PuzzleGa, MutationStaysInBounds) {
  Rng rng(3);
  Genome g{{std::vector<uint8_t>(12, 0), std::vector<uint8_t>(4, 1)},
           {std::vector<uint8_t>(13, 0), std::vector<uint8_t>(5, 1)},
           {1, 0}};
  bool changed = false;
  for (int trial = 0; trial < 300; ++trial) {
    const Genome before = g;
    mutate(g, 3, 0.5, 0.5, rng);
    changed = changed || !(g == before);
    check_genome(g, {13, 5}, 3);  // lengths, gene values and the permutation
    for (const auto& c : g.cuts)
      for (uint8_t v : c) EXPECT_LE(v, 1);
    for (const auto& c : g.maps)
      for (uint8_t v : c) EXPECT_LE(v, 2);
  }
  EXPECT_TRUE(changed);
}

TEST(PuzzleGa, MergeRemovesOneCut) {
  Rng rng(5);
  Genome g = genome({1, 0, 1, 1, 0}, {0, 0, 1, 1, 0, 1}, {0});
  ASSERT_TRUE(merge_neighbours(g, 0, rng));
  EXPECT_EQ(count_cuts(g, 0), 2u);
  EXPECT_EQ(decode_subgraphs(g, 0).size(), 3u);
  Genome whole = genome({0, 0}, {1, 1, 1}, {0});
  EXPECT_FALSE(merge_neighbours(whole, 0, rng));
}

TEST(PuzzleGa, MoveShiftsOneBoundaryByOneUnit) {
  Rng rng(9);
  for (int trial = 0; trial < 40; ++trial) {
    // [0-2 NPU] [3-5 GPU] [6-7 NPU]
    Genome g = genome({0, 0, 1, 0, 0, 1, 0}, {1, 1, 1, 0, 0, 0, 1, 1}, {0});
    const std::vector<Subgraph> before = decode_subgraphs(g, 0);
    ASSERT_TRUE(move_adjacent(g, 0, rng));
    const std::vector<Subgraph> after = decode_subgraphs(g, 0);
    ASSERT_EQ(after.size(), before.size());
    EXPECT_EQ(count_cuts(g, 0), 2u);
    int moved = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      const int d = after[i].last - before[i].last;
      EXPECT_LE(std::abs(d), 1);
      moved += d != 0;
      // The subgraph that gained a unit keeps its device (the unit votes with it).
      if (after[i].last - after[i].first > before[i].last - before[i].first) {
        EXPECT_EQ(after[i].device, before[i].device);
      }
    }
    EXPECT_EQ(moved, 1);
  }
  Genome none = genome({0, 0}, {0, 0, 0}, {0});
  EXPECT_FALSE(move_adjacent(none, 0, rng));
}

TEST(PuzzleGa, FrontsAndDominance) {
  const std::vector<std::vector<double>> objs{{1, 5}, {2, 2}, {5, 1}, {3, 3}, {6, 6}, {2, 2}};
  EXPECT_TRUE(dominates(objs[1], objs[3]));
  EXPECT_FALSE(dominates(objs[1], objs[5]));  // equal is not better
  EXPECT_FALSE(dominates(objs[0], objs[2]));
  const auto fronts = nondominated_fronts(objs);
  ASSERT_EQ(fronts.size(), 3u);
  EXPECT_EQ(fronts[0], (std::vector<size_t>{0, 1, 2, 5}));
  EXPECT_EQ(fronts[1], (std::vector<size_t>{3}));
  EXPECT_EQ(fronts[2], (std::vector<size_t>{4}));
}

TEST(PuzzleGa, ReferencePointsCoverTheSimplex) {
  const auto two = reference_points(2, 12);
  EXPECT_EQ(two.size(), 13u);
  const auto four = reference_points(4, 4);
  EXPECT_EQ(four.size(), 35u);  // C(4 + 4 - 1, 4 - 1)
  for (const auto& p : four) EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
}

TEST(PuzzleGa, Nsga3KeepsTheFrontsAndSpreadsTheLastOne) {
  // Five non-dominated points along x + y = 1 and two dominated ones; keep 3 with the reference
  // points (0,1), (.5,.5), (1,0): each niche takes its nearest point, so the ends and the middle.
  const std::vector<std::vector<double>> objs{{0.25, 0.75}, {0, 1}, {0.5, 0.5}, {2, 2},
                                              {0.75, 0.25}, {1, 0}, {3, 3}};
  const auto refs = reference_points(2, 2);
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    Rng rng(seed);
    std::vector<size_t> keep = nsga3_select(objs, 3, refs, rng);
    std::sort(keep.begin(), keep.end());
    EXPECT_EQ(keep, (std::vector<size_t>{1, 2, 5}));
  }
  // Room for the whole first front and one more: the better dominated point joins.
  Rng rng(1);
  std::vector<size_t> keep = nsga3_select(objs, 6, refs, rng);
  std::sort(keep.begin(), keep.end());
  EXPECT_EQ(keep, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// A toy problem with a known optimum: fewer NPU votes and fewer cuts are both better, and the
// priority of model 0 first halves the first objective.
std::vector<double> toy(const Genome& g) {
  double npu = 0, cuts = 0;
  for (const auto& m : g.maps) npu += std::accumulate(m.begin(), m.end(), 0.0);
  for (const auto& c : g.cuts) cuts += std::accumulate(c.begin(), c.end(), 0.0);
  return {npu * (g.priority[0] == 0 ? 0.5 : 1.0) + cuts, cuts + 0.1 * npu};
}

TEST(PuzzleGa, SearchIsReproducibleFromItsSeed) {
  SearchOptions o;
  o.population = 16;
  o.max_generations = 30;
  o.seed = 42;
  const std::vector<int> units{9, 5};
  const SearchResult a = ga_search(units, toy, o);
  const SearchResult b = ga_search(units, toy, o);
  EXPECT_EQ(a.pareto, b.pareto);
  EXPECT_EQ(a.pareto_objectives, b.pareto_objectives);
  EXPECT_EQ(a.evaluations, b.evaluations);
  EXPECT_EQ(a.mean_objective, b.mean_objective);
  o.seed = 43;
  const SearchResult c = ga_search(units, toy, o);
  EXPECT_NE(a.mean_objective, c.mean_objective);
  // It improves on its random start, and its front is mutually non-dominated.
  ASSERT_FALSE(a.mean_objective.empty());
  EXPECT_LT(a.mean_objective.back(), a.mean_objective.front());
  for (const auto& x : a.pareto_objectives)
    for (const auto& y : a.pareto_objectives) EXPECT_FALSE(dominates(x, y));
}

TEST(PuzzleGa, SearchStopsWhenThePopulationStopsImproving) {
  SearchOptions o;
  o.population = 8;
  o.max_generations = 500;
  o.patience = 3;
  // A flat objective never improves: the search ends after `patience` generations.
  const SearchResult r = ga_search(
      {4},
      [](const Genome&) {
        return std::vector<double>{1, 1};
      },
      o);
  EXPECT_EQ(r.generations, 3);
}

}  // namespace
}  // namespace duet::puzzle
