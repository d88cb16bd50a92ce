#pragma once
// Functional NPU matmul on host threads with the NPU's numerics:
//   activations are rounded to fp16 on the way in and the results to fp16 on the way out,
//   products accumulate in fp32, and the weights (any core/model/dtype.h type: W4A16 for Q4_0,
//   Q4_1, Q4_K, W5/W6A16 for Q5_*, Q6_K, W8A16 for Q8_0, W16A16 for F16/BF16) are dequantised on
//   the fly: in registers for decode, one tile of rows at a time into a bounded per-thread buffer
//   for prefill (never a full dequantised copy), then multiplied by the dot products of npu_dot.h,
//   which give a token the same bits whatever the token count.
// Results equal ops::matmul within fp16 tolerance (|rel err| ~ 1e-3).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/base/thread_pool.h"
#include "core/model/ops.h"

namespace duet::npu {

class NpuGemm {
 public:
  // n_threads <= 0: hardware concurrency.
  explicit NpuGemm(int n_threads = 0);

  int threads() const { return pool_->size(); }

  // y[t * y_stride + r] = fp16(sum_k W[r][k] * fp16(x[t * x_stride + k])) for t in [0, n_tokens),
  // r in [row_begin, row_end) (row_end < 0: all rows). Throws invalid_argument on a bad shape.
  void matmul(const ops::Matrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
              int64_t y_stride, int64_t row_begin = 0, int64_t row_end = -1);

  // Rows of W dequantised per tile (bounded so a tile stays in L2-ish memory).
  static int64_t tile_rows(int64_t k);

 private:
  std::unique_ptr<ThreadPool> pool_;
  std::vector<float> x16_;  // the fp16-rounded activations of the current call
};

}  // namespace duet::npu
