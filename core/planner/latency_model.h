#pragma once
// Latency functions: what the solver believes an op costs at a token count nobody profiled.
// HeteroInfer (section 4.4) profiles standard sequence lengths only and estimates the rest from
// two device characteristics:
//   GPU-1 linear performance: latency is piecewise linear in the token count, so the GPU function
//     interpolates linearly between profiled lengths (and extends the last segment past the end).
//   NPU-1 stage performance: latency rises in steps at multiples of the array tile (anything under
//     32 tokens costs what 32 do), so the NPU function first rounds the token count up to the
//     tile and then interpolates between profiled lengths: constant within a step.
// Both are fitted from profile points (core/planner/profiler.h); held_out_error() says how well a
// fit predicts points it was not given.
#include <cstdint>
#include <string>
#include <vector>

#include "core/planner/op_shape.h"

namespace duet {

// What the solver asks: the latency of one op on one device. npu_us is one static graph of
// exactly s.n tokens (padding and pipelines are the solver's business).
class LatencySource {
 public:
  virtual ~LatencySource() = default;
  virtual double gpu_us(const OpShape& s) const = 0;
  virtual double npu_us(const OpShape& s) const = 0;
};

struct LatencyPoint {
  int64_t n = 0;  // tokens
  double us = 0;  // latency
};

class GpuLatencyFn {
 public:
  // Needs at least one point; n >= 1 and finite us >= 0. Duplicate n are averaged. Throws
  // Error(invalid_argument) naming the bad point.
  static GpuLatencyFn fit(std::vector<LatencyPoint> points);
  double operator()(int64_t n) const;
  const std::vector<LatencyPoint>& points() const { return points_; }

 private:
  std::vector<LatencyPoint> points_;  // ascending n, unique
};

class NpuLatencyFn {
 public:
  static NpuLatencyFn fit(std::vector<LatencyPoint> points, int64_t tile = 32);
  double operator()(int64_t n) const;
  const std::vector<LatencyPoint>& points() const { return points_; }
  int64_t tile() const { return tile_; }

 private:
  std::vector<LatencyPoint> points_;
  int64_t tile_ = 32;
};

// Relative error |predicted - actual| / actual over held-out points.
struct FitError {
  int points = 0;
  double mean_rel = 0;
  double max_rel = 0;
  int64_t worst_n = 0;
};
FitError held_out_error(const GpuLatencyFn& fn, const std::vector<LatencyPoint>& held_out);
FitError held_out_error(const NpuLatencyFn& fn, const std::vector<LatencyPoint>& held_out);

// Sorts by n, averages duplicates and checks every point (used by both fits).
std::vector<LatencyPoint> normalize_points(std::vector<LatencyPoint> points,
                                           const std::string& what);

}  // namespace duet
