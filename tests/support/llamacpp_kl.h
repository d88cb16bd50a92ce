#pragma once
// KL(llama.cpp || duet) at one position of a llama.cpp logits answer (tests/data/llamacpp/
// logits-*.json keeps llama.cpp's top-64 logits and its exact logsumexp). Header-only.
#include <cmath>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <vector>

namespace duet::test_support {

// KL(P || Q) in nats from llama.cpp's top-k (P's top logits and exact logsumexp) and duet's full
// row: the top-k terms plus the remaining mass as one bucket, a lower bound by the log-sum
// inequality, exact when the top-k holds all of P's mass (it holds > 99% here).
inline double kl_topk(const nlohmann::json& p, const float* row, size_t n_vocab) {
  double m = row[0];
  for (size_t i = 1; i < n_vocab; ++i) m = std::max(m, double(row[i]));
  double s = 0;
  for (size_t i = 0; i < n_vocab; ++i) s += std::exp(double(row[i]) - m);
  const double lse_q = m + std::log(s), lse_p = p.at("logsumexp").get<double>();
  const auto ids = p.at("top_ids").get<std::vector<size_t>>();
  const auto logits = p.at("top_logits").get<std::vector<double>>();
  double kl = 0, p_top = 0, q_top = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const double lp = logits[k] - lse_p, lq = row[ids[k]] - lse_q;
    kl += std::exp(lp) * (lp - lq);
    p_top += std::exp(lp);
    q_top += std::exp(lq);
  }
  const double p_tail = 1 - p_top, q_tail = 1 - q_top;
  if (p_tail > 1e-12 && q_tail > 1e-12) kl += p_tail * std::log(p_tail / q_tail);
  return kl;
}

}  // namespace duet::test_support
