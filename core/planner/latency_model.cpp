#include "core/planner/latency_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/base/error.h"

namespace duet {
namespace {

// Linear through the two bracketing points; past either end along the nearest segment, never
// below zero (a token count under the first profiled one cannot cost less than nothing).
double interpolate(const std::vector<LatencyPoint>& p, double n) {
  if (p.size() == 1) return p[0].us;
  size_t hi = 1;
  while (hi + 1 < p.size() && static_cast<double>(p[hi].n) < n) ++hi;
  const LatencyPoint& a = p[hi - 1];
  const LatencyPoint& b = p[hi];
  const double slope = (b.us - a.us) / static_cast<double>(b.n - a.n);
  return std::max(0.0, a.us + slope * (n - static_cast<double>(a.n)));
}

template <class Fn>
FitError error_of(const Fn& fn, const std::vector<LatencyPoint>& held_out) {
  FitError e;
  double sum = 0;
  for (const LatencyPoint& p : held_out) {
    if (!(p.us > 0)) continue;
    const double rel = std::abs(fn(p.n) - p.us) / p.us;
    sum += rel;
    ++e.points;
    if (rel > e.max_rel) {
      e.max_rel = rel;
      e.worst_n = p.n;
    }
  }
  if (e.points > 0) e.mean_rel = sum / e.points;
  return e;
}

}  // namespace

std::vector<LatencyPoint> normalize_points(std::vector<LatencyPoint> points,
                                           const std::string& what) {
  if (points.empty()) throw Error(Errc::invalid_argument, what + ": no profile points to fit");
  std::map<int64_t, std::pair<double, int>> by_n;
  for (const LatencyPoint& p : points) {
    if (p.n < 1 || !std::isfinite(p.us) || p.us < 0)
      throw Error(Errc::invalid_argument, what + ": bad profile point n=" + std::to_string(p.n) +
                                              " us=" + std::to_string(p.us));
    auto& [sum, count] = by_n[p.n];
    sum += p.us;
    ++count;
  }
  std::vector<LatencyPoint> out;
  out.reserve(by_n.size());
  for (const auto& [n, acc] : by_n) out.push_back({n, acc.first / acc.second});
  return out;
}

GpuLatencyFn GpuLatencyFn::fit(std::vector<LatencyPoint> points) {
  GpuLatencyFn f;
  f.points_ = normalize_points(std::move(points), "GPU latency function");
  return f;
}

double GpuLatencyFn::operator()(int64_t n) const {
  return interpolate(points_, static_cast<double>(n));
}

NpuLatencyFn NpuLatencyFn::fit(std::vector<LatencyPoint> points, int64_t tile) {
  if (tile < 1) throw Error(Errc::invalid_argument, "NPU latency function: tile must be >= 1");
  NpuLatencyFn f;
  f.points_ = normalize_points(std::move(points), "NPU latency function");
  f.tile_ = tile;
  return f;
}

double NpuLatencyFn::operator()(int64_t n) const {
  // A profiled length is its own answer (the decode graph at n=1 is one); any other count costs
  // what its tile-rounded count does.
  for (const LatencyPoint& p : points_)
    if (p.n == n) return p.us;
  const int64_t stepped = (std::max<int64_t>(n, 1) + tile_ - 1) / tile_ * tile_;
  return interpolate(points_, static_cast<double>(stepped));
}

FitError held_out_error(const GpuLatencyFn& fn, const std::vector<LatencyPoint>& held_out) {
  return error_of(fn, held_out);
}
FitError held_out_error(const NpuLatencyFn& fn, const std::vector<LatencyPoint>& held_out) {
  return error_of(fn, held_out);
}

}  // namespace duet
