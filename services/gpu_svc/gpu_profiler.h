#pragma once
// Measures one op shape on the device: random weights of the requested type (quantised as a
// model file would hold them) and random activations in device buffers, the op's kernel run
// `reps` times after one warm-up, each timed by its OpenCL profiling event. Used by ProfileOp
// (the solver's profiler) and bench/gpu.
#include <cstdint>
#include <vector>

#include "core/planner/op_shape.h"
#include "services/gpu_svc/gpu_kernels.h"

namespace duet::gpu {

struct OpMeasurement {
  double median_us = 0;
  double min_us = 0;
  uint32_t reps = 0;
};

// Supported: MatMul and Logits (m x k weight, n tokens), RmsNorm, Add, SwiGlu (n tokens of m
// features), Rope (m = heads * 64), Embed (m rows of k). Throws unsupported for the others and
// invalid_argument / out_of_range for shapes that do not fit the device.
OpMeasurement measure_op(GpuKernels& kernels, const OpShape& shape, uint32_t reps);

}  // namespace duet::gpu
