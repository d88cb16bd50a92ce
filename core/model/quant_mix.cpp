#include "core/model/quant_mix.h"

#include <algorithm>
#include <cctype>

#include "core/base/error.h"

namespace duet {
namespace {

// llama_ftype values (llama.h).
constexpr QuantPreset kPresets[] = {
    {"q4_k_m", 15, DType::Q4_K, true},
    {"q5_k_m", 17, DType::Q5_K, true},
    {"q6_k", 18, DType::Q6_K, true},
    {"q4_k", 14, DType::Q4_K, false},
    {"q5_k", 16, DType::Q5_K, false},
    {"q8_0", 7, DType::Q8_0, true},
    {"q4_0", 2, DType::Q4_0, true},
    {"q4_1", 3, DType::Q4_1, true},
    {"q5_0", 8, DType::Q5_0, true},
    {"q5_1", 9, DType::Q5_1, true},
    {"f32", 0, DType::F32, false},
    {"f16", 1, DType::F16, false},
    {"bf16", 32, DType::BF16, false},
    // duet's own (core/quant_e0m4.h): no llama_ftype; 1024 as its tensor type id.
    {"e0m4", 1024, DType::E0M4, true},
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool quantisable(const TensorDesc& t) {
  return t.dims.size() >= 2 && ends_with(t.name, "weight") &&
         t.name.find("_norm.weight") == std::string::npos;
}

bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

DType fallback(DType t, int64_t row) {
  if (row % dtype_block_elems(t) == 0) return t;
  DType f = t;
  switch (t) {
    case DType::Q4_K:
      f = DType::Q5_0;
      break;
    case DType::Q5_K:
      f = DType::Q5_1;
      break;
    case DType::Q6_K:
      f = DType::Q8_0;
      break;
    case DType::E0M4:  // rows not whole 128-weight groups: the 4-bit type of 32-weight blocks
      f = DType::Q4_0;
      break;
    default:
      break;
  }
  return row % dtype_block_elems(f) == 0 ? f : DType::F16;
}

}  // namespace

const QuantPreset& quant_preset(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const QuantPreset& p : kPresets)
    if (p.name == lower) return p;
  std::string known;
  for (const std::string& n : quant_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(Errc::invalid_argument,
              "unknown quantisation type '" + std::string(name) + "' (" + known + ")");
}

std::vector<std::string> quant_preset_names() {
  std::vector<std::string> names;
  for (const QuantPreset& p : kPresets) names.emplace_back(p.name);
  return names;
}

QuantPreset pure(QuantPreset p) {
  p.rules = false;
  return p;
}

std::vector<DType> choose_tensor_types(const QuantPreset& p, const std::vector<TensorDesc>& ts) {
  const bool tied = std::none_of(ts.begin(), ts.end(),
                                 [](const TensorDesc& t) { return t.name == "output.weight"; });
  int n_attn_v = 0, n_ffn_down = 0;
  for (const TensorDesc& t : ts) {
    n_attn_v += t.name.find("attn_v.weight") != std::string::npos;
    n_ffn_down += t.name.find("ffn_down") != std::string::npos;
  }
  const bool k_mix = p.file_type == 15 || p.file_type == 17;  // q4_k_m, q5_k_m
  int i_attn_v = 0, i_ffn_down = 0;
  std::vector<DType> out;
  out.reserve(ts.size());
  for (const TensorDesc& t : ts) {
    if (!quantisable(t)) {
      out.push_back(t.type);
      continue;
    }
    DType type = p.base;
    const int64_t row = t.dims[0];
    if (p.rules && !is_float(p.base)) {
      if (t.name == "output.weight" || (tied && t.name == "token_embd.weight")) {
        if (row % dtype_block_elems(p.base) != 0)
          type = DType::Q8_0;
        else if (p.base != DType::Q8_0)
          type = DType::Q6_K;
      } else if (t.name.find("attn_v.weight") != std::string::npos) {
        if (k_mix && use_more_bits(i_attn_v, n_attn_v)) type = DType::Q6_K;
        ++i_attn_v;
      } else if (t.name.find("ffn_down") != std::string::npos) {
        if (k_mix && use_more_bits(i_ffn_down, n_ffn_down)) type = DType::Q6_K;
        ++i_ffn_down;
      }
    }
    out.push_back(is_float(type) ? type : fallback(type, row));
  }
  return out;
}

}  // namespace duet
