#include "puzzle/bound.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "core/base/error.h"

namespace duet::puzzle {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A model's request's distinct steps (token count, bucketed context: the profiles'
// keys, as ScenarioModel::steps costs them), how many of its steps cost alike, and each step's
// kind in order.
struct StepKind {
  int64_t n = 0, context = 0;
  int count = 0;
};
struct RequestSteps {
  std::vector<StepKind> kinds;
  std::vector<size_t> order;
};

RequestSteps request_steps(ScenarioModel& sm, size_t m) {
  const ModelSpec& spec = sm.scenario().models.at(m);
  const ModelCoster& c = sm.coster(m);
  RequestSteps r;
  for (int64_t s = 0; s < spec.output; ++s) {
    const StepKind k{s == 0 ? spec.prompt : 1, c.bucket(s == 0 ? 0 : spec.prompt + s - 1), 1};
    size_t i = 0;
    while (i < r.kinds.size() && (r.kinds[i].n != k.n || r.kinds[i].context != k.context)) ++i;
    if (i == r.kinds.size())
      r.kinds.push_back(k);
    else
      ++r.kinds[i].count;
    r.order.push_back(i);
  }
  return r;
}

// Every unit range's stage on each choice: ranges[a][b][p] for b >= a.
using RangeStages = std::vector<std::vector<std::vector<StageCost>>>;

RangeStages range_stages(ModelCoster& c, const StepKind& k, int choices) {
  const int units = c.units();
  RangeStages r(static_cast<size_t>(units), std::vector<std::vector<StageCost>>(units));
  for (int a = 0; a < units; ++a)
    for (int b = a; b < units; ++b)
      for (int p = 0; p < choices; ++p)
        r[a][b].push_back(c.subgraph(a, b, static_cast<Proc>(p), k.n, k.context));
  return r;
}

// A stage's busy time weighted l on the GPU and 1 - l on the NPU (a stage on both holds both);
// with `charges`, an NPU stage's own GPU work too.
double weighted_busy(const StageCost& s, double l, bool charges) {
  switch (s.proc) {
    case Proc::gpu:
      return l * s.span_us;
    case Proc::npu:
      return (1 - l) * s.span_us + (charges ? l * s.gpu_us : 0.0);
    case Proc::both:
      return s.span_us;
  }
  return s.span_us;
}

// The least cost of a step over its placements; `placement`, where given, gets one that costs it.
template <class Cost>
double cheapest(const RangeStages& r, Cost&& cost, std::vector<Subgraph>* placement = nullptr) {
  const size_t units = r.size();
  std::vector<std::vector<double>> range(units, std::vector<double>(units, 0.0));
  // Each range's cheapest choice (ints: GCC 12 warns falsely on a vector of a byte-sized enum).
  std::vector<std::vector<int>> proc(units, std::vector<int>(units, 0));
  for (size_t a = 0; a < units; ++a)
    for (size_t b = a; b < units; ++b) {
      double best = kInf;
      for (size_t p = 0; p < r[a][b].size(); ++p)
        if (const double v = cost(r[a][b][p]); v < best) {
          best = v;
          proc[a][b] = static_cast<int>(p);  // the choice asked for, as a plan names it
        }
      range[a][b] = best;
    }
  if (!placement) return cheapest_partition(range);
  std::vector<std::pair<int, int>> ranges;
  const double least = cheapest_partition(range, &ranges);
  placement->clear();
  for (const auto& [a, b] : ranges) placement->push_back({a, b, static_cast<Proc>(proc[a][b])});
  return least;
}

// A request's least busy time over its placements, each stage costing cost(stage, charges)
// (charges: with its NPU work's GPU time): the throughput rule's accounting of that GPU time
// (see saturation_bound), for any stage cost.
template <class Cost>
double least_request_busy(const RequestSteps& steps, const std::vector<RangeStages>& ranges,
                          Cost&& cost) {
  const size_t kinds = steps.kinds.size();
  std::vector<double> counted(kinds), free(kinds), npu(kinds);
  for (size_t k = 0; k < kinds; ++k) {
    counted[k] = cheapest(ranges[k], [&](const StageCost& s) { return cost(s, true); });
    free[k] = cheapest(ranges[k], [&](const StageCost& s) { return cost(s, false); });
    npu[k] = cheapest(
        ranges[k], [&](const StageCost& s) { return s.proc == Proc::npu ? cost(s, false) : kInf; });
  }
  double after = 0;
  for (size_t k : steps.order) after += npu[k];
  double best = after, before = 0;
  for (size_t k : steps.order) {
    after -= npu[k];
    best = std::min(best, before + free[k] + after);
    before += counted[k];
  }
  return best;
}

// The contention rule's weights for demand thresholds (gpu_gbps, npu_gbps): for each l in
// (0, 1) (l_steps steps) and each lambda in (0, 1] (lambda_steps steps), the point lambda of the
// way from the throughput rule's (l, 1 - l) to the valid region's upper edge straight above it:
// (1, 0) -> (p, p) -> (0, 1), p = 1 / (2 - h), at 1 - l of the way. The region {1 <= gpu + npu <=
// 1 + h min(gpu, npu)} is the triangle (1, 0), (0, 1), (p, p), so every point is valid.
std::vector<ContentionWeights> contention_grid(double dual, double gpu_gbps, double npu_gbps,
                                               int l_steps, int lambda_steps, double l_from = 0,
                                               double l_to = 1) {
  std::vector<ContentionWeights> out;
  const double h = contention_share(dual, gpu_gbps, npu_gbps);
  if (h <= 0) return out;
  const double p = 1 / (2 - h);
  for (int li = 1; li < l_steps; ++li) {
    const double l = static_cast<double>(li) / l_steps, u = 1 - l;
    if (l < l_from || l > l_to) continue;
    const double top_g = u <= 0.5 ? 1 + 2 * u * (p - 1) : p * (2 - 2 * u);
    const double top_n = u <= 0.5 ? 2 * u * p : p + (2 * u - 1) * (1 - p);
    for (int ki = 1; ki <= lambda_steps; ++ki) {
      const double lambda = static_cast<double>(ki) / lambda_steps;
      out.push_back({gpu_gbps, npu_gbps, (1 - lambda) * l + lambda * top_g,
                     (1 - lambda) * (1 - l) + lambda * top_n});
    }
  }
  return out;
}

}  // namespace

double cheapest_partition(const std::vector<std::vector<double>>& range_cost,
                          std::vector<std::pair<int, int>>* ranges) {
  const size_t units = range_cost.size();
  // f[b]: the least cost of units [0, b); from[b]: where its last range starts.
  std::vector<double> f(units + 1, std::numeric_limits<double>::infinity());
  std::vector<size_t> from(units + 1, 0);
  f[0] = 0;
  for (size_t b = 0; b < units; ++b) {
    if (range_cost[b].size() != units)
      throw Error(Errc::invalid_argument, "cheapest_partition: range_cost is not square");
    for (size_t a = 0; a <= b; ++a)
      if (f[a] + range_cost[a][b] < f[b + 1]) {
        f[b + 1] = f[a] + range_cost[a][b];
        from[b + 1] = a;
      }
  }
  if (ranges) {
    ranges->clear();
    for (size_t b = units; b > 0; b = from[b])
      ranges->insert(ranges->begin(), {static_cast<int>(from[b]), static_cast<int>(b - 1)});
  }
  return f[units];
}

double ContentionWeights::weight(const StageCost& s) const {
  switch (s.proc) {
    case Proc::gpu:
      return s.demand_gbps() >= gpu_gbps ? gpu : 1 - npu;
    case Proc::npu:
      return s.demand_gbps() >= npu_gbps ? npu : 1 - gpu;
    case Proc::both:
      return 1;
  }
  return 1;
}

double ContentionWeights::work(const StageCost& s, bool charges) const {
  return weight(s) * s.span_us + (charges && s.proc == Proc::npu ? (1 - npu) * s.gpu_us : 0.0);
}

double contention_share(double dual_gbps, double gpu_gbps, double npu_gbps) {
  const double sum = gpu_gbps + npu_gbps;
  if (!(dual_gbps > 0) || !(sum > dual_gbps)) return 0;
  const double c = 1 - dual_gbps / sum;
  return c / (1 + c);
}

bool contention_weights_valid(const ContentionWeights& w, double dual_gbps) {
  const double h = contention_share(dual_gbps, w.gpu_gbps, w.npu_gbps);
  constexpr double eps = 1e-12;  // rounding of the grid's points
  return w.gpu >= 0 && w.gpu <= 1 && w.npu >= 0 && w.npu <= 1 && w.gpu + w.npu >= 1 - eps &&
         w.gpu + w.npu <= 1 + h * std::min(w.gpu, w.npu) + eps;
}

std::vector<Genome> relaxation_genomes(ScenarioModel& sm, const std::vector<double>& weights,
                                       int choices) {
  if (choices < 2 || choices > kProcs)
    throw Error(Errc::invalid_argument, "relaxation_genomes: choices must be 2 or 3");
  const size_t n = sm.scenario().models.size();
  // costs[k]: the cost a genome's placements minimise: the span, then each weight's busy.
  std::vector<std::function<double(const StageCost&)>> costs{
      [](const StageCost& s) { return s.span_us; }};
  for (double l : weights) {
    if (!(l >= 0 && l <= 1))
      throw Error(Errc::invalid_argument, "relaxation_genomes: a weight is outside [0, 1]");
    costs.push_back([l](const StageCost& s) { return weighted_busy(s, l, true); });
  }
  std::vector<Genome> out(costs.size());
  std::vector<int> units = sm.units();
  units.insert(units.end(), units.begin(), units.end());
  for (Genome& g : out) g = whole_model_genome(units, std::vector<uint8_t>(2 * n, 0));
  for (size_t m = 0; m < n; ++m) {
    const RequestSteps steps = request_steps(sm, m);
    // The prefill's kind and the first decode step's (a one-token request has none: its decode
    // placement is never run, and copies the prefill's).
    const size_t phase_kind[2] = {steps.order[0], steps.order.size() > 1 ? steps.order[1] : 0};
    for (size_t phase = 0; phase < 2; ++phase) {
      const RangeStages r = range_stages(sm.coster(m), steps.kinds[phase_kind[phase]], choices);
      for (size_t k = 0; k < costs.size(); ++k) {
        std::vector<Subgraph> placement;
        cheapest(r, costs[k], &placement);
        const size_t entry = phase * n + m;
        Genome& g = out[k];
        std::fill(g.cuts[entry].begin(), g.cuts[entry].end(), uint8_t{0});
        for (const Subgraph& sg : placement) {
          if (sg.last + 1 < units[entry]) g.cuts[entry][static_cast<size_t>(sg.last)] = 1;
          for (int u = sg.first; u <= sg.last; ++u)
            g.maps[entry][static_cast<size_t>(u)] = static_cast<uint8_t>(sg.device);
        }
      }
    }
  }
  std::vector<Genome> distinct;
  for (Genome& g : out)
    if (std::find(distinct.begin(), distinct.end(), g) == distinct.end())
      distinct.push_back(std::move(g));
  return distinct;
}

SaturationBound saturation_bound(ScenarioModel& sm, const SaturationGrid& grid, int choices,
                                 int weight_steps) {
  if (choices < 2 || choices > kProcs)
    throw Error(Errc::invalid_argument, "saturation_bound: choices must be 2 or 3");
  if (weight_steps < 1) throw Error(Errc::invalid_argument, "saturation_bound: weight_steps < 1");
  const Scenario& sc = sm.scenario();
  const size_t n_models = sc.models.size();
  const size_t groups = static_cast<size_t>(sc.groups);
  const int requests = sm.sim_options().requests;
  const std::vector<double>& base = sm.base_periods_us();

  SaturationBound out;
  // busy[m][i]: model m's request's least busy time weighted l = i / weight_steps.
  std::vector<std::vector<double>> busy(n_models, std::vector<double>(weight_steps + 1, 0.0));
  // Each model's request's steps and its step kinds' range stages (the contention rule's too).
  std::vector<RequestSteps> model_steps;
  std::vector<std::vector<RangeStages>> model_ranges(n_models);
  for (size_t m = 0; m < n_models; ++m) {
    const RequestSteps& steps = model_steps.emplace_back(request_steps(sm, m));
    const std::vector<StepKind>& kinds = steps.kinds;
    // Per kind and weight: the least weighted busy time with the NPU stages' GPU work counted
    // (counted), left out (free), and with every range on the NPU, left out (npu).
    const size_t w = static_cast<size_t>(weight_steps) + 1;
    std::vector<std::vector<double>> counted(kinds.size(), std::vector<double>(w)), free = counted,
                                                                                    npu = counted;
    double latency = 0;
    for (size_t k = 0; k < kinds.size(); ++k) {
      const RangeStages& r =
          model_ranges[m].emplace_back(range_stages(sm.coster(m), kinds[k], choices));
      latency += kinds[k].count * cheapest(r, [](const StageCost& s) { return s.span_us; });
      const double npu_span =
          cheapest(r, [](const StageCost& s) { return s.proc == Proc::npu ? s.span_us : kInf; });
      for (size_t i = 0; i < w; ++i) {
        const double l = static_cast<double>(i) / weight_steps;
        counted[k][i] = cheapest(r, [l](const StageCost& s) { return weighted_busy(s, l, true); });
        free[k][i] = cheapest(r, [l](const StageCost& s) { return weighted_busy(s, l, false); });
        npu[k][i] = (1 - l) * npu_span;
      }
    }
    // The request's steps in order (each by its kind). An NPU stage's GPU work is done before a
    // later GPU or both stage of its request starts (that stage waits for the GPU, which queued
    // the work when the NPU stage began), so inside the request's window; after the request's
    // last GPU-using stage it may run past the deadline. So: the least over the step k holding
    // that last stage (or none) of counted steps before k, step k free, NPU-only steps after.
    for (size_t i = 0; i < w; ++i) {
      double after = 0;  // NPU-only steps after k
      for (size_t k : steps.order) after += npu[k][i];
      double best = after, before = 0;  // none: every step on the NPU
      for (size_t k : steps.order) {
        after -= npu[k][i];
        best = std::min(best, before + free[k][i] + after);
        before += counted[k][i];
      }
      busy[m][i] = best;
    }
    out.latency_us.push_back(latency);
    out.critical_path_alpha =
        std::max(out.critical_path_alpha, latency / base[static_cast<size_t>(sc.models[m].group)]);
  }

  // Throughput: every window from a release s to a deadline t (in units of alpha: all scale
  // with it, so which requests a window holds does not depend on alpha).
  std::vector<double> times;
  for (size_t g = 0; g < groups; ++g)
    for (int j = 0; j <= requests; ++j) times.push_back(j * base[g]);
  std::sort(times.begin(), times.end());
  struct Window {
    double length = 0;        // t - s
    std::vector<int> inside;  // per model: its requests released at or after s and due by t
  };
  std::vector<Window> windows;
  for (double s : times)
    for (double t : times) {
      if (t <= s) continue;
      Window w{t - s, std::vector<int>(n_models, 0)};
      bool any = false;
      for (size_t m = 0; m < n_models; ++m) {
        const double b = base[static_cast<size_t>(sc.models[m].group)];
        for (int j = 0; j < requests; ++j) w.inside[m] += j * b >= s && (j + 1) * b <= t;
        any = any || w.inside[m] > 0;
      }
      if (any) windows.push_back(std::move(w));
    }
  for (const Window& win : windows) {
    std::vector<double> work(static_cast<size_t>(weight_steps) + 1, 0.0);
    for (size_t m = 0; m < n_models; ++m)
      for (int i = 0; i <= weight_steps; ++i) work[i] += win.inside[m] * busy[m][i];
    const size_t at =
        static_cast<size_t>(std::max_element(work.begin(), work.end()) - work.begin());
    if (work[at] / win.length > out.throughput_alpha) {
      out.throughput_alpha = work[at] / win.length;
      out.weight = static_cast<double>(at) / weight_steps;
      out.weighted_busy_us.clear();
      for (size_t m = 0; m < n_models; ++m) out.weighted_busy_us.push_back(busy[m][at]);
    }
  }

  // The throughput rule's own placements at its weight: the largest GPU stage demand plus the
  // largest NPU stage demand (none of their stages contend where that is at most the dual).
  {
    double gpu = 0, npu = 0;
    for (size_t m = 0; m < n_models; ++m)
      for (const RangeStages& r : model_ranges[m])
        for (bool charges : {true, false}) {
          std::vector<Subgraph> placement;
          cheapest(
              r,
              [l = out.weight, charges](const StageCost& st) {
                return weighted_busy(st, l, charges);
              },
              &placement);
          for (const Subgraph& sg : placement) {
            const StageCost& st = r[static_cast<size_t>(sg.first)][static_cast<size_t>(sg.last)]
                                   [static_cast<size_t>(sg.device)];
            if (st.proc == Proc::gpu) gpu = std::max(gpu, st.demand_gbps());
            if (st.proc == Proc::npu) npu = std::max(npu, st.demand_gbps());
          }
        }
    out.relaxation_pair_gbps = gpu > 0 && npu > 0 ? gpu + npu : 0;
  }

  // Contention: the same windows, each request's least work at the contention rule's weights
  // (each window at least its throughput value: the rule's weights with gpu + npu = 1 are the
  // throughput rule's). First a coarse grid for each pair of demand thresholds (0.5, 0.55, ...,
  // 0.7 of the dual bandwidth on each device), then a finer one at the three that bound best.
  const double dual = sm.sim_options().dual_gbps;
  out.contention_alpha = out.throughput_alpha;
  out.contention_weights = {0, 0, out.weight, 1 - out.weight};
  out.contention_busy_us = out.weighted_busy_us;
  // Returns the weights that bound best among cw (at their best window).
  auto contention_windows = [&](const std::vector<ContentionWeights>& cw) {
    double best = -1;
    ContentionWeights best_at;
    std::vector<std::vector<double>> cbusy(n_models, std::vector<double>(cw.size(), 0.0));
    for (size_t m = 0; m < n_models; ++m)
      for (size_t v = 0; v < cw.size(); ++v)
        cbusy[m][v] = least_request_busy(
            model_steps[m], model_ranges[m],
            [&w = cw[v]](const StageCost& st, bool charges) { return w.work(st, charges); });
    for (const Window& win : windows) {
      std::vector<double> work(cw.size(), 0.0);
      for (size_t m = 0; m < n_models; ++m)
        for (size_t v = 0; v < cw.size(); ++v) work[v] += win.inside[m] * cbusy[m][v];
      for (size_t v = 0; v < cw.size(); ++v) {
        if (work[v] / win.length > best) {
          best = work[v] / win.length;
          best_at = cw[v];
        }
        if (work[v] / win.length > out.contention_alpha) {
          out.contention_alpha = work[v] / win.length;
          out.contention_weights = cw[v];
          out.contention_busy_us.clear();
          for (size_t m = 0; m < n_models; ++m) out.contention_busy_us.push_back(cbusy[m][v]);
        }
      }
    }
    return std::pair{best, best_at};
  };
  if (dual > 0) {
    std::vector<std::pair<double, ContentionWeights>> pairs;  // each pair's coarse best
    for (int i = 0; i <= 4; ++i)
      for (int j = 0; j <= 4; ++j) {
        const std::vector<ContentionWeights> coarse =
            contention_grid(dual, dual * (0.5 + 0.05 * i), dual * (0.5 + 0.05 * j), 10, 2);
        if (!coarse.empty()) pairs.push_back(contention_windows(coarse));
      }
    std::sort(pairs.begin(), pairs.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < std::min<size_t>(3, pairs.size()); ++i) {
      // Around the coarse best's l (where its point lies on the segment from (l, 1 - l) up).
      const ContentionWeights& w = pairs[i].second;
      const double l = std::clamp(w.gpu / (w.gpu + w.npu), 0.0, 1.0);
      contention_windows(contention_grid(dual, w.gpu_gbps, w.npu_gbps, 100, 4, l - 0.12, l + 0.12));
    }
  }

  // One miss caps the score at 1 - 1 / (J G): where that is under the threshold, a window that
  // cannot hold its requests rules the alpha out.
  const bool a_miss_fails = 1.0 - 1.0 / (requests * static_cast<double>(groups)) < grid.threshold;
  auto chain_allows = [&](double alpha) {
    // Each request's least makespan: its slowest model's least latency, plus what its previous
    // request left over past this one's release.
    SimResult least;
    least.makespan_us.assign(groups, std::vector<double>(static_cast<size_t>(requests), 0.0));
    for (size_t m = 0; m < n_models; ++m) {
      const size_t g = static_cast<size_t>(sc.models[m].group);
      double prev = 0;
      for (int j = 0; j < requests; ++j) {
        prev = out.latency_us[m] + (j ? std::max(0.0, prev - alpha * base[g]) : 0.0);
        least.makespan_us[g][j] = std::max(least.makespan_us[g][j], prev);
      }
    }
    std::vector<double> periods = base;
    for (double& p : periods) p *= alpha;
    return xrbench_score(least, periods) >= grid.threshold;
  };
  // Strictly below the load's alpha (a relative 1e-9 for rounding) the window overflows.
  auto load_allows = [&](double alpha) {
    return !a_miss_fails || alpha >= out.throughput_alpha * (1 - 1e-9);
  };
  auto contention_allows = [&](double alpha) {
    return !a_miss_fails || alpha >= out.contention_alpha * (1 - 1e-9);
  };
  const int steps = static_cast<int>(std::lround((grid.to - grid.from) / grid.step));
  const double none = grid.to + grid.step;
  out.saturation = out.critical_path_saturation = out.throughput_saturation =
      out.contention_saturation = out.saturation_without_contention = none;
  // The least alpha each allows (any method's saturation is an alpha all allow, so this holds
  // whether or not the rules are monotone in alpha).
  for (int i = 0; i <= steps; ++i) {
    const double alpha = grid.from + i * grid.step;
    const bool chain = chain_allows(alpha), load = load_allows(alpha),
               contention = contention_allows(alpha);
    if (chain && out.critical_path_saturation == none) out.critical_path_saturation = alpha;
    if (load && out.throughput_saturation == none) out.throughput_saturation = alpha;
    if (contention && out.contention_saturation == none) out.contention_saturation = alpha;
    if (chain && load && out.saturation_without_contention == none)
      out.saturation_without_contention = alpha;
    if (chain && load && contention && out.saturation == none) out.saturation = alpha;
  }
  return out;
}

}  // namespace duet::puzzle
