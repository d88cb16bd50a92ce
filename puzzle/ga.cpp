#include "puzzle/ga.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/base/error.h"

namespace duet::puzzle {

uint64_t Rng::next() {  // splitmix64
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t Rng::below(uint64_t n) {      // rejection keeps it unbiased
  const uint64_t limit = (0 - n) % n;  // 2^64 mod n: draws below it would favour small values
  for (;;) {
    const uint64_t x = next();
    if (x >= limit) return x % n;
  }
}
double Rng::unit() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

std::vector<Subgraph> decode_subgraphs(const Genome& g, size_t model) {
  const std::vector<uint8_t>& cuts = g.cuts[model];
  const std::vector<uint8_t>& maps = g.maps[model];
  std::vector<Subgraph> out;
  const int units = static_cast<int>(maps.size());
  int first = 0;
  for (int u = 0; u < units; ++u) {
    if (u + 1 < units && !cuts[static_cast<size_t>(u)]) continue;
    int votes[kProcs] = {0, 0, 0};
    for (int i = first; i <= u; ++i)
      ++votes[std::min<int>(maps[static_cast<size_t>(i)], kProcs - 1)];
    // The most votes; a tie goes to the first unit's vote when it is among the tied, else to
    // the lowest (GPU before NPU before both).
    const int first_vote = std::min<int>(maps[static_cast<size_t>(first)], kProcs - 1);
    int pick = first_vote;
    for (int p = 0; p < kProcs; ++p)
      if (votes[p] > votes[pick]) pick = p;
    out.push_back({first, u, static_cast<Proc>(pick)});
    first = u + 1;
  }
  return out;
}

void check_genome(const Genome& g, const std::vector<int>& units, int choices) {
  const size_t n = units.size();
  if (g.cuts.size() != n || g.maps.size() != n || g.priority.size() != n)
    throw Error(Errc::internal, "puzzle genome: chromosome count != model count");
  for (size_t m = 0; m < n; ++m)
    if (static_cast<int>(g.maps[m].size()) != units[m] ||
        static_cast<int>(g.cuts[m].size()) != units[m] - 1)
      throw Error(Errc::internal, "puzzle genome: model " + std::to_string(m) +
                                      "'s chromosomes do not match its units");
  for (const auto& maps : g.maps)
    for (uint8_t v : maps)
      if (v >= choices)
        throw Error(Errc::internal, "puzzle genome: a mapping gene is out of range");
  std::vector<int> p = g.priority;
  std::sort(p.begin(), p.end());
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<int>(i))
      throw Error(Errc::internal, "puzzle genome: priority is not a permutation");
}

void one_point_crossover(std::vector<uint8_t>& a, std::vector<uint8_t>& b, Rng& rng) {
  const size_t n = std::min(a.size(), b.size());
  if (n < 2) return;
  const size_t point = 1 + rng.below(n - 1);  // tails [point, n) swap
  for (size_t i = point; i < n; ++i) std::swap(a[i], b[i]);
}

// DEAP's cxUniformPartialyMatched: at each position, with probability indpb, the two values
// there are swapped in each parent, each parent fixing the displaced value by a swap so it stays
// a permutation.
void upmx_crossover_at(std::vector<int>& a, std::vector<int>& b, const std::vector<bool>& mask) {
  const size_t n = std::min({a.size(), b.size(), mask.size()});
  std::vector<size_t> pa(n), pb(n);
  for (size_t i = 0; i < n; ++i) {
    pa[static_cast<size_t>(a[i])] = i;
    pb[static_cast<size_t>(b[i])] = i;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!mask[i]) continue;
    const int t1 = a[i], t2 = b[i];
    const size_t u1 = static_cast<size_t>(t1), u2 = static_cast<size_t>(t2);
    a[i] = t2;
    a[pa[u2]] = t1;
    b[i] = t1;
    b[pb[u1]] = t2;
    std::swap(pa[u1], pa[u2]);
    std::swap(pb[u1], pb[u2]);
  }
}

void upmx_crossover(std::vector<int>& a, std::vector<int>& b, double indpb, Rng& rng) {
  std::vector<bool> mask(std::min(a.size(), b.size()));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = rng.unit() < indpb;
  upmx_crossover_at(a, b, mask);
}

// A value other than v among `choices`.
uint8_t other(uint8_t v, int choices, Rng& rng) {
  return static_cast<uint8_t>((v + 1 + rng.below(static_cast<uint64_t>(choices - 1))) %
                              static_cast<uint64_t>(choices));
}

void mutate(Genome& g, int choices, double prob_priority, double prob_flip, Rng& rng) {
  for (size_t m = 0; m < g.maps.size(); ++m) {
    const std::vector<uint8_t>::size_type nc = g.cuts[m].size(), nm = g.maps[m].size();
    for (uint8_t& v : g.cuts[m])
      if (rng.unit() < 1.0 / static_cast<double>(nc)) v ^= 1;
    for (uint8_t& v : g.maps[m])
      if (rng.unit() < 1.0 / static_cast<double>(nm)) v = other(v, choices, rng);
  }
  // A subgraph-level flip: one subgraph's units all vote for the other device. A single unit's
  // flipped vote rarely changes a subgraph's majority, so without it a placement moves slowly.
  if (!g.maps.empty() && rng.unit() < prob_flip) {
    const size_t m = rng.below(g.maps.size());
    const std::vector<Subgraph> subs = decode_subgraphs(g, m);
    const Subgraph& s = subs[rng.below(subs.size())];
    const uint8_t to = other(static_cast<uint8_t>(s.device), choices, rng);
    for (int u = s.first; u <= s.last; ++u) g.maps[m][static_cast<size_t>(u)] = to;
  }
  if (g.priority.size() >= 2 && rng.unit() < prob_priority) {
    const size_t i = rng.below(g.priority.size());
    const size_t j = (i + 1 + rng.below(g.priority.size() - 1)) % g.priority.size();
    std::swap(g.priority[i], g.priority[j]);
  }
}

namespace {
std::vector<size_t> cut_positions(const std::vector<uint8_t>& cuts) {
  std::vector<size_t> out;
  for (size_t i = 0; i < cuts.size(); ++i)
    if (cuts[i]) out.push_back(i);
  return out;
}
}  // namespace

bool merge_neighbours(Genome& g, size_t model, Rng& rng) {
  const std::vector<size_t> cuts = cut_positions(g.cuts[model]);
  if (cuts.empty()) return false;
  g.cuts[model][cuts[rng.below(cuts.size())]] = 0;
  return true;
}

bool move_adjacent(Genome& g, size_t model, Rng& rng) {
  std::vector<uint8_t>& c = g.cuts[model];
  // Candidate moves: (cut edge e, direction). Edge e sits between units e and e + 1.
  std::vector<std::pair<size_t, int>> moves;
  for (size_t e : cut_positions(c)) {
    if (e > 0 && !c[e - 1]) moves.push_back({e, -1});
    if (e + 1 < c.size() && !c[e + 1]) moves.push_back({e, +1});
  }
  if (moves.empty()) return false;
  const auto [e, dir] = moves[rng.below(moves.size())];
  const std::vector<Subgraph> before = decode_subgraphs(g, model);
  c[e] = 0;
  const size_t target = dir < 0 ? e - 1 : e + 1;
  c[target] = 1;
  // dir -1: unit e leaves its subgraph for the one after; +1: unit e + 1 joins the one before.
  const size_t moved = dir < 0 ? e : e + 1;
  const size_t joined_unit = dir < 0 ? e + 1 : e;
  for (const Subgraph& s : before)
    if (static_cast<size_t>(s.first) <= joined_unit && joined_unit <= static_cast<size_t>(s.last))
      g.maps[model][moved] = static_cast<uint8_t>(s.device);
  return true;
}

bool dominates(const std::vector<double>& a, const std::vector<double>& b) {
  bool better = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i]) return false;
    if (a[i] < b[i]) better = true;
  }
  return better;
}

std::vector<std::vector<size_t>> nondominated_fronts(const std::vector<std::vector<double>>& objs) {
  const size_t n = objs.size();
  std::vector<std::vector<size_t>> dominated(n);
  std::vector<int> count(n, 0);
  std::vector<std::vector<size_t>> fronts(1);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      if (dominates(objs[i], objs[j]))
        dominated[i].push_back(j);
      else if (dominates(objs[j], objs[i]))
        ++count[i];
    }
    if (count[i] == 0) fronts[0].push_back(i);
  }
  while (!fronts.back().empty()) {
    std::vector<size_t> next;
    for (size_t i : fronts.back())
      for (size_t j : dominated[i])
        if (--count[j] == 0) next.push_back(j);
    std::sort(next.begin(), next.end());
    fronts.push_back(std::move(next));
  }
  if (fronts.size() > 1) fronts.pop_back();  // the empty one that ended the loop
  return fronts;
}

std::vector<std::vector<double>> reference_points(size_t objectives, int divisions) {
  if (objectives < 1 || divisions < 1)
    throw Error(Errc::invalid_argument, "reference_points: objectives and divisions must be >= 1");
  std::vector<std::vector<double>> out;
  std::vector<int> parts(objectives, 0);
  // Every composition of `divisions` into `objectives` non-negative parts.
  std::function<void(size_t, int)> rec = [&](size_t i, int left) {
    if (i + 1 == objectives) {
      parts[i] = left;
      std::vector<double> p;
      for (int v : parts) p.push_back(static_cast<double>(v) / divisions);
      out.push_back(std::move(p));
      return;
    }
    for (int v = left; v >= 0; --v) {
      parts[i] = v;
      rec(i + 1, left - v);
    }
  };
  rec(0, divisions);
  return out;
}

namespace {
// Solves A x = b (A square) by Gaussian elimination with partial pivoting; false if singular.
bool solve(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>& x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    if (std::abs(a[piv][c]) < 1e-12) return false;
    std::swap(a[c], a[piv]);
    std::swap(b[c], b[piv]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  x.resize(n);
  for (size_t i = 0; i < n; ++i) x[i] = b[i] / a[i][i];
  return true;
}
}  // namespace

std::vector<size_t> nsga3_select(const std::vector<std::vector<double>>& objs, size_t keep,
                                 const std::vector<std::vector<double>>& refs, Rng& rng) {
  std::vector<size_t> chosen;
  if (keep >= objs.size()) {
    chosen.resize(objs.size());
    std::iota(chosen.begin(), chosen.end(), 0);
    return chosen;
  }
  std::vector<size_t> last;
  for (const std::vector<size_t>& f : nondominated_fronts(objs)) {
    if (chosen.size() + f.size() <= keep) {
      chosen.insert(chosen.end(), f.begin(), f.end());
      if (chosen.size() == keep) return chosen;
    } else {
      last = f;
      break;
    }
  }
  // Normalise S_t = chosen + last (Deb and Jain 2014): translate by the ideal point, find each
  // axis's extreme point by the achievement scalarising function, and scale by the intercepts
  // of the hyperplane through them (the worst value where that plane is degenerate).
  std::vector<size_t> st = chosen;
  st.insert(st.end(), last.begin(), last.end());
  const size_t m = objs[0].size();
  std::vector<double> ideal(m, std::numeric_limits<double>::infinity());
  for (size_t i : st)
    for (size_t j = 0; j < m; ++j) ideal[j] = std::min(ideal[j], objs[i][j]);
  auto shifted = [&](size_t i, size_t j) { return objs[i][j] - ideal[j]; };
  std::vector<std::vector<double>> extreme(m);
  for (size_t axis = 0; axis < m; ++axis) {
    double best = std::numeric_limits<double>::infinity();
    for (size_t i : st) {
      double asf = 0;
      for (size_t j = 0; j < m; ++j) asf = std::max(asf, shifted(i, j) / (j == axis ? 1.0 : 1e-6));
      if (asf < best) {
        best = asf;
        extreme[axis].assign(m, 0);
        for (size_t j = 0; j < m; ++j) extreme[axis][j] = shifted(i, j);
      }
    }
  }
  std::vector<double> a, intercept(m, 0);
  bool ok = solve(extreme, std::vector<double>(m, 1.0), a);
  for (size_t j = 0; ok && j < m; ++j) {
    if (!(a[j] > 1e-12))
      ok = false;
    else
      intercept[j] = 1.0 / a[j];
  }
  for (size_t j = 0; j < m; ++j) {
    if (ok && intercept[j] > 1e-9) continue;
    intercept[j] = 0;
    for (size_t i : st) intercept[j] = std::max(intercept[j], shifted(i, j));
    if (intercept[j] <= 1e-12) intercept[j] = 1;
  }
  // Associate each member with its nearest reference line.
  std::vector<size_t> niche(objs.size(), 0);
  std::vector<double> dist(objs.size(), 0);
  for (size_t i : st) {
    double best = std::numeric_limits<double>::infinity();
    for (size_t r = 0; r < refs.size(); ++r) {
      double dot = 0, norm = 0;
      for (size_t j = 0; j < m; ++j) {
        dot += shifted(i, j) / intercept[j] * refs[r][j];
        norm += refs[r][j] * refs[r][j];
      }
      double d2 = 0;
      for (size_t j = 0; j < m; ++j) {
        const double e = shifted(i, j) / intercept[j] - dot / norm * refs[r][j];
        d2 += e * e;
      }
      if (d2 < best) {
        best = d2;
        niche[i] = r;
        dist[i] = d2;
      }
    }
  }
  std::vector<int> count(refs.size(), 0);
  for (size_t i : chosen) ++count[niche[i]];
  std::vector<bool> excluded(refs.size(), false), taken(objs.size(), false);
  while (chosen.size() < keep) {
    int least = std::numeric_limits<int>::max();
    for (size_t r = 0; r < refs.size(); ++r)
      if (!excluded[r]) least = std::min(least, count[r]);
    std::vector<size_t> cands;
    for (size_t r = 0; r < refs.size(); ++r)
      if (!excluded[r] && count[r] == least) cands.push_back(r);
    if (cands.empty()) throw Error(Errc::internal, "nsga3_select: ran out of reference points");
    const size_t r = cands[rng.below(cands.size())];
    std::vector<size_t> members;
    for (size_t i : last)
      if (!taken[i] && niche[i] == r) members.push_back(i);
    if (members.empty()) {
      excluded[r] = true;
      continue;
    }
    size_t pick = members[rng.below(members.size())];
    if (count[r] == 0)
      for (size_t i : members)
        if (dist[i] < dist[pick]) pick = i;
    taken[pick] = true;
    chosen.push_back(pick);
    ++count[r];
  }
  return chosen;
}

namespace {
Genome random_genome(const std::vector<int>& units, int choices, double density, Rng& rng) {
  Genome g;
  for (int u : units) {
    std::vector<uint8_t> cuts(static_cast<size_t>(u - 1)), maps(static_cast<size_t>(u));
    for (uint8_t& c : cuts) c = rng.unit() < density ? 1 : 0;
    for (uint8_t& v : maps) v = static_cast<uint8_t>(rng.below(static_cast<uint64_t>(choices)));
    g.cuts.push_back(std::move(cuts));
    g.maps.push_back(std::move(maps));
  }
  g.priority.resize(units.size());
  std::iota(g.priority.begin(), g.priority.end(), 0);
  for (size_t i = g.priority.size(); i > 1; --i)
    std::swap(g.priority[i - 1], g.priority[rng.below(i)]);
  return g;
}

double mean_of(const std::vector<std::vector<double>>& objs, const std::vector<size_t>& idx) {
  double s = 0;
  size_t n = 0;
  for (size_t i : idx)
    for (double v : objs[i]) {
      s += v;
      ++n;
    }
  return n ? s / static_cast<double>(n) : 0;
}
}  // namespace

SearchResult ga_search(const std::vector<int>& units, const Evaluate& evaluate,
                       const SearchOptions& o, const std::vector<Genome>& seeds) {
  if (units.empty() || o.population < 2 || o.population % 2 || o.choices < 2 || o.choices > kProcs)
    throw Error(Errc::invalid_argument,
                "ga_search: needs models, an even population >= 2 and 2 or 3 choices");
  Rng rng(o.seed);
  SearchResult res;
  std::vector<Genome> pop;
  std::vector<std::vector<double>> objs;
  auto eval = [&](const Genome& g) {
    ++res.evaluations;
    return evaluate(g);
  };
  for (const Genome& g : seeds) {
    if (pop.size() == static_cast<size_t>(o.population)) break;
    check_genome(g, units, o.choices);
    pop.push_back(g);
  }
  while (pop.size() < static_cast<size_t>(o.population))
    pop.push_back(random_genome(units, o.choices, o.cut_density, rng));
  for (const Genome& g : pop) objs.push_back(eval(g));
  const size_t n_obj = objs[0].size();
  const auto refs = reference_points(n_obj, n_obj <= 2 ? 12 : n_obj <= 4 ? 4 : 2);

  std::vector<size_t> all(pop.size());
  std::iota(all.begin(), all.end(), 0);
  double best = mean_of(objs, all);
  int stall = 0;
  for (int gen = 0; gen < o.max_generations; ++gen) {
    std::vector<size_t> order(pop.size());
    std::iota(order.begin(), order.end(), 0);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    std::vector<Genome> next = pop;
    std::vector<std::vector<double>> next_objs = objs;
    for (size_t p = 0; p + 1 < order.size(); p += 2) {
      Genome a = pop[order[p]], b = pop[order[p + 1]];
      if (rng.unit() < o.crossover) {
        for (size_t m = 0; m < units.size(); ++m) {
          one_point_crossover(a.cuts[m], b.cuts[m], rng);
          one_point_crossover(a.maps[m], b.maps[m], rng);
        }
        upmx_crossover(a.priority, b.priority, o.upmx_indpb, rng);
      }
      for (Genome* child : {&a, &b}) {
        mutate(*child, o.choices, o.mutate_priority, o.mutate_flip, rng);
        std::vector<double> f = eval(*child);
        if (rng.unit() < o.local_search) {
          Genome trial = *child;
          const size_t m = rng.below(units.size());
          if (rng.below(2) == 0 ? merge_neighbours(trial, m, rng) : move_adjacent(trial, m, rng)) {
            std::vector<double> ft = eval(trial);
            if (dominates(ft, f)) {
              *child = std::move(trial);
              f = std::move(ft);
            }
          }
        }
        next.push_back(std::move(*child));
        next_objs.push_back(std::move(f));
      }
    }
    const std::vector<size_t> keep =
        nsga3_select(next_objs, static_cast<size_t>(o.population), refs, rng);
    pop.clear();
    objs.clear();
    for (size_t i : keep) {
      pop.push_back(next[i]);
      objs.push_back(next_objs[i]);
    }
    res.generations = gen + 1;
    const double mean = mean_of(objs, all);
    res.mean_objective.push_back(mean);
    if (mean < best * (1.0 - o.min_improvement)) {
      best = mean;
      stall = 0;
    } else if (++stall >= o.patience) {
      break;
    }
  }
  const std::vector<size_t> front = nondominated_fronts(objs)[0];
  for (size_t i : front) {
    if (std::find(res.pareto.begin(), res.pareto.end(), pop[i]) != res.pareto.end()) continue;
    res.pareto.push_back(pop[i]);
    res.pareto_objectives.push_back(objs[i]);
  }
  return res;
}

}  // namespace duet::puzzle
