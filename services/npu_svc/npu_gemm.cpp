#include "services/npu_svc/npu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/fp16.h"
#include "core/ops_dot.h"
#include "core/quant.h"

namespace duet::npu {
namespace {

// Below this many tokens rows are dotted directly instead of dequantised into a tile for sgemm.
constexpr int64_t kDotMaxTokens = 4;

float round_fp16(float v) {
  return fp16_to_fp32(fp32_to_fp16(v));
}

// The dequantised tile buffer of the calling thread: grows to the largest tile it has needed.
std::vector<float>& tile_buffer() {
  thread_local std::vector<float> buf;
  return buf;
}

}  // namespace

NpuGemm::NpuGemm(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(1);
  pool_ = std::make_unique<ThreadPool>(n_threads);
}

int64_t NpuGemm::tile_rows(int64_t k) {
  constexpr int64_t kTileFloats = 1 << 20;  // 4 MiB of fp32 per thread
  return std::clamp<int64_t>(kTileFloats / std::max<int64_t>(k, 1), 8, 256);
}

void NpuGemm::matmul(const ops::Matrix& w, const float* x, int64_t x_stride, int64_t n_tokens,
                     float* y, int64_t y_stride, int64_t row_begin, int64_t row_end) {
  if (row_end < 0) row_end = w.rows;
  auto fail = [&](const std::string& what) {
    throw Error(Errc::invalid_argument, "npu matmul [" + std::to_string(w.rows) + "x" +
                                            std::to_string(w.cols) + "]: " + what);
  };
  if (!w.data || w.rows <= 0 || w.cols <= 0) fail("empty weight");
  if (w.cols % dtype_block_elems(w.type) != 0) fail("cols not a multiple of the block size");
  if (row_begin < 0 || row_begin > row_end || row_end > w.rows)
    fail("row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
         ") outside the weight");
  if (n_tokens < 0 || x_stride < w.cols || y_stride < row_end) fail("bad token count or strides");
  if (n_tokens == 0 || row_begin == row_end) return;
  const int64_t k = w.cols;

  // Activations enter the NPU as fp16.
  x16_.resize(static_cast<size_t>(n_tokens * k));
  pool_->parallel_for(n_tokens, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < k; ++i) x16_[t * k + i] = round_fp16(x[t * x_stride + i]);
  });

  if (n_tokens < kDotMaxTokens) {
    // Decode: each weight row is read once in its stored type and dotted with the few tokens
    // (dequantised on the fly inside the dot product, fp32 accumulation); a GEMM call per
    // tile would only add the cost of writing the dequantised tile.
    pool_->parallel_for(row_end - row_begin, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t r = row_begin + i0; r < row_begin + i1; ++r)
        for (int64_t t = 0; t < n_tokens; ++t)
          y[t * y_stride + r] = round_fp16(ops::dot_row(w.type, w.row(r), x16_.data() + t * k, k));
    });
    return;
  }

  const int64_t tile = tile_rows(k);
  const int64_t n_tiles = (row_end - row_begin + tile - 1) / tile;
  pool_->parallel_for(n_tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
    std::vector<float>& buf = tile_buffer();
    if (w.type != DType::F32 && buf.size() < static_cast<size_t>(tile * k)) buf.resize(tile * k);
    for (int64_t ti = tile_begin; ti < tile_end; ++ti) {
      const int64_t r0 = row_begin + ti * tile;
      const int64_t rows = std::min(tile, row_end - r0);
      const float* wt;
      if (w.type == DType::F32) {
        wt = reinterpret_cast<const float*>(w.row(r0));
      } else {
        for (int64_t r = 0; r < rows; ++r)
          dequantize_row(w.type, w.row(r0 + r), buf.data() + r * k, k);
        wt = buf.data();
      }
      // y[:, r0:r0+rows] = x16 . wt^T, accumulated in fp32 by sgemm, then rounded to fp16.
      float* yt = y + r0;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n_tokens),
                  static_cast<int>(rows), static_cast<int>(k), 1.0f, x16_.data(),
                  static_cast<int>(k), wt, static_cast<int>(k), 0.0f, yt,
                  static_cast<int>(y_stride));
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t r = 0; r < rows; ++r) yt[t * y_stride + r] = round_fp16(yt[t * y_stride + r]);
    }
  });
}

}  // namespace duet::npu
