#pragma once
// Element types of tensors. The numeric values are GGML's (ggml_type), so a GGUF tensor's type
// field converts directly.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace duet {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
};

// Quantised types pack QK elements per block; F32/F16 are "blocks" of one element.
constexpr int64_t kQK = 32;

bool dtype_known(uint32_t raw);
std::string_view dtype_name(DType t);
int64_t dtype_block_elems(DType t);  // 1 for F32/F16, 32 for Q4_0/Q8_0
size_t dtype_block_bytes(DType t);   // 4, 2, 18, 34
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace duet
