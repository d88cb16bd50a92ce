#pragma once
// How far a correct engine may be from llama.cpp's committed answers (tests/data/llamacpp/).
// llama.cpp rounds activations before each matmul (to F16 for F16 weights, to Q8_0 blocks for
// Q8_0/Q4_0) and keeps an F16 KV cache. Measured against the exact float64 forward pass of
// tiny-fortune (tests/data/llamacpp/noise-tiny-fortune.json), its largest logit error relative to
// the largest |logit| was 1.2e-3 (F16: 0.029 of 25.5), 1.5e-2 (Q8_0: 0.46 of 30.3) and 2.2e-2
// (Q4_0: 0.55 of 25.5). Those errors scale with the activations, and so with the logits: the
// tolerance is 3x the measured ratio times the answer's own largest top-1 logit, used both as
// the bound on |ours - llama.cpp| for llama.cpp's top-k logits and as the top-1 margin above
// which no correct engine may pick another token (2x the noise, with 1.5x headroom). Header-only.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace duet::test_support {

// K-quant files (q4_k_m, q5_k_m, q6_k): llama.cpp quantises activations to Q8_K for their dot
// products; against its own run on the file's exact F32 expansion
// (tests/data/llamacpp/noise-kquant-fortune.json) the largest logit error was 0.62 of 24.5
// (Q4_K_M), 0.57 of 25.6 (Q5_K_M), 0.55 of 25.6 (Q6_K): 2.8e-2 covers all three.
inline double llamacpp_relative_noise(const std::string& model_name) {
  if (model_name.find("f16") != std::string::npos) return 1.2e-3;
  if (model_name.find("_k") != std::string::npos) return 2.8e-2;
  return 2.2e-2;  // Q8_0 and Q4_0: the larger of the two measurements
}

// For one answer of tools/llamacpp-oracle's `logits` (or the scale of one, for greedy).
inline double llamacpp_tolerance(const std::string& model_name, double logit_scale) {
  return 3.0 * llamacpp_relative_noise(model_name) * logit_scale;
}

inline double llamacpp_logit_scale(const nlohmann::json& logits_answer) {
  double s = 0;
  for (const auto& p : logits_answer.at("positions"))
    s = std::max(s, std::fabs(p.at("top_logits").at(0).get<double>()));
  return s;
}

inline double llamacpp_tolerance(const nlohmann::json& logits_answer) {
  return llamacpp_tolerance(logits_answer.at("model").get<std::string>(),
                            llamacpp_logit_scale(logits_answer));
}

}  // namespace duet::test_support
