#pragma once
// Element types of tensors. The numeric values are GGML's (ggml_type), so a GGUF tensor's type
// field converts directly; E0M4 is duet's own (core/quant_e0m4.h), numbered far outside ggml's
// range so that ggml's readers refuse it rather than misread it.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace duet {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
  E0M4 = 1024,
};

// Quantised types pack kQK elements per block (Q4_0..Q8_0) or kQK_K per super-block (the K
// types); F32/F16/BF16 are "blocks" of one element; E0M4 groups kE0M4Group = 128.
constexpr int64_t kQK = 32;
constexpr int64_t kQK_K = 256;

bool dtype_known(uint32_t raw);
std::string_view dtype_name(DType t);
int64_t dtype_block_elems(DType t);  // 1 for F32/F16/BF16, 32 for Q4_0..Q8_0, 256 for K types,
                                     // 128 for E0M4
size_t dtype_block_bytes(DType t);   // sizeof the block struct in core/model/quant.h
bool dtype_is_k_quant(DType t);      // Q4_K, Q5_K, Q6_K
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace duet
