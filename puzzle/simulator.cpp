#include "puzzle/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/base/error.h"

namespace duet::puzzle {
namespace {

struct Cursor {
  int request = 0;
  size_t step = 0, stage = 0;
  double ready_us = 0;  // the previous stage's end (plus a hand-off where the processor changes)
  Proc last = Proc::gpu;
  bool started = false;
};

struct Running {
  double start = 0, end = 0, gbps = 0;
};

}  // namespace

SimResult simulate(const std::vector<SimModel>& models, const std::vector<double>& periods_us,
                   const SimOptions& o) {
  const int groups = static_cast<int>(periods_us.size());
  for (double p : periods_us)
    if (!(p > 0)) throw Error(Errc::invalid_argument, "puzzle simulate: a period is not positive");
  for (size_t m = 0; m < models.size(); ++m) {
    if (models[m].group < 0 || models[m].group >= groups)
      throw Error(Errc::invalid_argument,
                  "puzzle simulate: model " + std::to_string(m) + " is in an unknown group");
    if (models[m].steps.empty())
      throw Error(Errc::invalid_argument,
                  "puzzle simulate: model " + std::to_string(m) + " has no steps");
    for (const auto& s : models[m].steps)
      if (s.empty())
        throw Error(Errc::invalid_argument,
                    "puzzle simulate: model " + std::to_string(m) + " has an empty step");
  }
  if (o.requests < 1) throw Error(Errc::invalid_argument, "puzzle simulate: requests < 1");

  SimResult r;
  r.makespan_us.assign(static_cast<size_t>(groups), std::vector<double>(o.requests, 0.0));
  r.latency_us.assign(models.size(), std::vector<double>(o.requests, 0.0));
  std::vector<Cursor> cur(models.size());
  double free_at[2] = {0, 0};
  Running running[2];
  const double inf = std::numeric_limits<double>::infinity();
  auto release = [&](size_t m) {
    return cur[m].request * periods_us[static_cast<size_t>(models[m].group)];
  };

  for (;;) {
    int pick = -1;
    double best = inf, best_ready = inf;
    for (size_t m = 0; m < models.size(); ++m) {
      if (cur[m].request >= o.requests) continue;
      const StageCost& c = models[m].steps[cur[m].step][cur[m].stage];
      const double ready = std::max(cur[m].ready_us, release(m));
      double at = ready;
      if (c.proc != Proc::npu) at = std::max(at, free_at[0]);
      if (c.proc != Proc::gpu) at = std::max(at, free_at[1]);
      const bool better =
          pick < 0 || at < best ||
          (at == best && (models[m].priority < models[static_cast<size_t>(pick)].priority ||
                          (models[m].priority == models[static_cast<size_t>(pick)].priority &&
                           ready < best_ready)));
      if (better) {
        pick = static_cast<int>(m);
        best = at;
        best_ready = ready;
      }
    }
    if (pick < 0) break;
    const size_t m = static_cast<size_t>(pick);
    Cursor& c = cur[m];
    const StageCost& s = models[m].steps[c.step][c.stage];
    const double start = best;
    double dur = s.span_us;
    if (s.proc != Proc::both && o.dual_gbps > 0) {
      const Running& other = running[s.proc == Proc::gpu ? 1 : 0];
      const double demand = s.demand_gbps() + other.gbps;
      const double overlap = std::min(other.end, start + dur) - start;
      if (overlap > 0 && demand > o.dual_gbps) dur += overlap * (1.0 - o.dual_gbps / demand);
    }
    const double end = start + dur;
    switch (s.proc) {
      case Proc::gpu:
        free_at[0] = end;
        running[0] = {start, end, s.demand_gbps()};
        r.gpu_busy_us += dur;
        r.gpu_held_us += dur;
        break;
      case Proc::npu:
        free_at[1] = end;
        running[1] = {start, end, s.demand_gbps()};
        // Its norms, RoPE, attention and adds run on the GPU between that device's kernels.
        free_at[0] = std::max(free_at[0], start) + s.gpu_us;
        r.npu_busy_us += dur;
        r.gpu_busy_us += s.gpu_us;
        r.npu_held_us += dur;
        r.gpu_held_us += s.gpu_us;
        break;
      case Proc::both:
        free_at[0] = free_at[1] = end;
        running[0] = running[1] = {start, end, 0};
        r.gpu_busy_us += s.gpu_us;
        r.npu_busy_us += s.npu_us;
        r.gpu_held_us += dur;
        r.npu_held_us += dur;
        break;
    }
    c.started = true;
    c.last = s.proc;
    c.ready_us = end;
    r.end_us = std::max(r.end_us, end);
    // The next stage: this step's next subgraph, the next step, or the next request.
    if (++c.stage == models[m].steps[c.step].size()) {
      c.stage = 0;
      if (++c.step == models[m].steps.size()) {
        c.step = 0;
        double& ms = r.makespan_us[static_cast<size_t>(models[m].group)][c.request];
        ms = std::max(ms, end - release(m));
        r.latency_us[m][c.request] = end - release(m);
        ++c.request;
        c.started = false;
      }
    }
    if (c.started) {
      const StageCost& next = models[m].steps[c.step][c.stage];
      if (next.proc != c.last && next.proc != Proc::both && c.last != Proc::both) {
        c.ready_us += o.sync_us;
        ++r.handoffs;
      }
    }
  }
  return r;
}

std::vector<double> objectives_ms(const SimResult& r) {
  std::vector<double> out;
  for (const std::vector<double>& g : r.makespan_us) {
    std::vector<double> v = g;
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(v.size())));
    out.push_back(sum / static_cast<double>(v.size()) / 1e3);
    out.push_back(v[std::max<size_t>(rank, 1) - 1] / 1e3);
  }
  return out;
}

double xrbench_score(const SimResult& r, const std::vector<double>& periods_us, double k) {
  if (r.makespan_us.size() != periods_us.size() || periods_us.empty())
    throw Error(Errc::invalid_argument, "xrbench_score: one period per group");
  double total = 0;
  for (size_t g = 0; g < periods_us.size(); ++g) {
    double rt = 0;
    int met = 0;
    for (double ms : r.makespan_us[g]) {
      const double late_ms = (ms - periods_us[g]) / 1e3;
      rt += 1.0 / (1.0 + std::exp(std::min(k * late_ms, 700.0)));
      met += ms <= periods_us[g] ? 1 : 0;
    }
    const double n = static_cast<double>(r.makespan_us[g].size());
    total += rt / n * (met / n);
  }
  return total / static_cast<double>(periods_us.size());
}

}  // namespace duet::puzzle
