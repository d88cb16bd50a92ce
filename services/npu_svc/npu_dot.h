#pragma once
// The NPU emulator's dot products: one definition of the arithmetic, two ways to run it.
//
//   row . x = sum_k w[k] * x[k], where w[k] is the weight dequantised to fp32 (q * d for
//   Q4_0/Q8_0, the fp16 value for F16: exact in fp32 either way). The first n - n % 16
//   products are accumulated by fma in 16 lanes (lane l takes k = l, l + 16, ... in order),
//   the lanes are summed by a fixed tree (l + l+8, then + l+4, + l+2, + l+1), and the last
//   n % 16 products are added in order by fma.
//
//   dot_stored_rows  reads rows in their stored type and dequantises in registers (decode:
//                    each weight byte is read once);
//   dot_dequantised  takes rows already dequantised to fp32 and runs a register tile of rows x
//                    tokens over K blocks, the lanes parked in a buffer between blocks (prefill).
//
// Both give the same bits for the same (row, x): a token's outputs do not depend on how many
// tokens share a call, so a request's greedy tokens do not change with what it is batched with.
// A real NPU computes W4A16 with the weights expanded to fp16, which is what "dequantised
// first, then multiplied" models.
#include <cstdint>

#include "core/model/dtype.h"

namespace duet::npu {

constexpr int kDotStreams = 4;  // rows dotted together by dot_stored_rows

// out[s] = rows[s] . x for s < count (count in 1..kDotStreams); rows in their stored type.
void dot_stored_rows(DType type, const void* const* rows, int count, const float* x, int64_t n,
                     float* out);

// out[t * out_stride + r] = w[r] . x[t] for r < n_rows, t < n_tokens; row r of the fp32
// weights starts at w + r * w_stride, token t at x + t * x_stride. Uses a per-thread buffer of
// the lanes (bounded: one block of rows x tokens).
void dot_dequantised(const float* w, int64_t w_stride, int64_t n_rows, const float* x,
                     int64_t x_stride, int64_t n_tokens, int64_t n, float* out, int64_t out_stride);

}  // namespace duet::npu
