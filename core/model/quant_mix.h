#pragma once
// Quantisation presets (llama.cpp's llama_ftype, stored in general.file_type) and the type each
// gives every tensor of a model, for `duet mkmodel --type` and `duet quantize --type`.
//
// The per-tensor rules are llama.cpp's llama_tensor_get_type (src/llama-quant.cpp) for the
// presets duet writes, on dense (non-MoE, non-Falcon) models without an importance matrix:
//  1. Only tensors with 2+ dims whose name ends in "weight" and not in "_norm.weight" are
//     quantised; the rest (norms, biases, rope_freqs) keep their type.
//  2. Float presets (f32, f16, bf16) and pure presets give every quantised tensor the base type.
//  3. Otherwise (quantised base, rules on):
//     - output.weight, or token_embd.weight when the file has no output.weight (tied
//       embeddings): Q8_0 if the base is Q8_0 or its row length is not a multiple of the base's
//       block, else Q6_K;
//     - attn_v.weight under q4_k_m / q5_k_m: Q6_K when use_more_bits(i, n), where i counts
//       attn_v tensors in file order, n is their number, and use_more_bits(i, n) = i < n/8 ||
//       i >= 7n/8 || (i - n/8) % 3 == 2;
//     - ffn_down.weight under q4_k_m / q5_k_m: Q6_K when use_more_bits(i, n) over ffn_down
//       tensors;
//     - everything else: the base type (q4_k_m's other tensors Q4_K, q5_k_m's Q5_K).
//  4. Fallback (applied after 2 and 3, also for pure presets): a K type for a tensor whose rows
//     are not a multiple of 256 becomes Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 if the
//     row length is not even a multiple of 32 (llama.cpp's tensor_type_fallback); duet's E0M4
//     becomes Q4_0 for rows that are not whole 128-weight groups.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/dtype.h"

namespace duet {

struct QuantPreset {
  std::string_view name;  // as typed on the command line: "q4_k_m"
  uint32_t file_type;     // llama_ftype, written as general.file_type
  DType base;
  bool rules;  // llama.cpp's per-tensor mixing rules (3 above); false: pure
};

// q4_k_m, q5_k_m, q6_k (rules); q4_k, q5_k (pure, file types Q4_K_S / Q5_K_S); q8_0, q4_0, q4_1,
// q5_0, q5_1 (rules: output.weight Q6_K as llama.cpp does); f32, f16, bf16; e0m4 (duet's FP4,
// core/quant_e0m4.h; the rules of q4_0, rows not whole groups fall back to Q4_0). Case-insensitive.
// Throws invalid_argument listing the names.
const QuantPreset& quant_preset(std::string_view name);
std::vector<std::string> quant_preset_names();

// The same preset without the mixing rules (llama-quantize --pure): every quantisable tensor
// gets the base type, still with the fallback of rule 4.
QuantPreset pure(QuantPreset p);

struct TensorDesc {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] innermost (a row)
  DType type;                 // the tensor's type now
};

// The type of each tensor (same order) under preset p; tensors in file order.
std::vector<DType> choose_tensor_types(const QuantPreset& p, const std::vector<TensorDesc>& ts);

}  // namespace duet
