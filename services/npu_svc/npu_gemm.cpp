#include "services/npu_svc/npu_gemm.h"

#include <algorithm>
#include <string>
#include <thread>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/quant.h"
#include "services/npu_svc/npu_dot.h"

namespace duet::npu {
namespace {

// Below this many tokens rows are dotted in their stored type; from it on, a tile of rows is
// dequantised once and reused by every token. Both give the same bits (npu_dot.h), so a
// token's outputs do not depend on how many tokens share the call.
constexpr int64_t kDequantiseMinTokens = 4;

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
  pool_ = std::make_unique<ThreadPool>(n_threads);
}

int64_t NpuGemm::tile_rows(int64_t k) {
  constexpr int64_t kTileFloats = 1 << 18;  // 1 MiB of fp32 per thread: the K blocks stay in L2
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

  if (n_tokens < kDequantiseMinTokens) {
    // Decode: each weight row is read once in its stored type, a few rows at a time so their
    // dependency chains interleave.
    pool_->parallel_for(row_end - row_begin, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t r = row_begin + i0; r < row_begin + i1; r += kDotStreams) {
        const int count = static_cast<int>(std::min<int64_t>(kDotStreams, row_begin + i1 - r));
        const void* rows[kDotStreams];
        for (int s = 0; s < count; ++s) rows[s] = w.row(r + s);
        for (int64_t t = 0; t < n_tokens; ++t) {
          float out[kDotStreams];
          dot_stored_rows(w.type, rows, count, x16_.data() + t * k, k, out);
          for (int s = 0; s < count; ++s) y[t * y_stride + r + s] = round_fp16(out[s]);
        }
      }
    });
    return;
  }

  // Prefill: a tile of rows is dequantised once into the thread's buffer and multiplied with
  // every token (register tiles over K blocks).
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
      float* yt = y + r0;
      dot_dequantised(wt, k, rows, x16_.data(), k, n_tokens, k, yt, y_stride);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t r = 0; r < rows; ++r) yt[t * y_stride + r] = round_fp16(yt[t * y_stride + r]);
    }
  });
}

}  // namespace duet::npu
