#pragma once
// Dot products of weight rows with fp32 activations, the inner loop of ops::matmul.
// Two forms that give bit-identical results, so prefill (many tokens) and decode (one token)
// agree exactly:
//   dot_rows      reads rows in their stored type (decode: each weight byte is read once);
//   unpack_row + dot_unpacked  converts a row once to floats (quantised values unscaled, plus
//                 one scale per block) and reuses it for every token (prefill).
// Both take up to kMaxStreams independent (row, x) pairs at once: their dependency chains
// interleave, which is most of the speed; each pair's arithmetic is the same as alone.
#include <cstdint>

#include "core/model/dtype.h"

namespace duet::ops {

constexpr int kMaxStreams = 4;

// out[s] = row[s] . x[s] for s < count (count in 1..kMaxStreams).
void dot_rows(DType type, const void* const* rows, const float* const* xs, int count, int64_t n,
              float* out);
float dot_row(DType type, const void* row, const float* x, int64_t n);

// q gets n floats; scales gets n/32 floats for Q4_0/Q8_0 (q unscaled). Every other type
// unpacks to its dequantised values (scales untouched) and dots as F32.
void unpack_row(DType type, const void* row, float* q, float* scales, int64_t n);
// out[s] = unpacked row . xs[s] for s < count (count in 1..kMaxStreams).
void dot_unpacked(DType type, const float* q, const float* scales, const float* const* xs,
                  int count, int64_t n, float* out);

}  // namespace duet::ops
