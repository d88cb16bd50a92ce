#include "core/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/base/error.h"

namespace duet {

void SamplingParams::validate() const {
  if (std::isnan(temperature) || temperature < 0 || std::isinf(temperature)) {
    throw Error(Errc::invalid_argument,
                "temperature must be a finite number >= 0, got " + std::to_string(temperature));
  }
  if (std::isnan(top_p) || top_p <= 0 || top_p > 1) {
    throw Error(Errc::invalid_argument, "top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (top_k < 0)
    throw Error(Errc::invalid_argument, "top_k must be >= 0, got " + std::to_string(top_k));
}

Sampler::Sampler(SamplingParams p) : p_(p), rng_(p.seed) {
  p_.validate();
}

Sampler Sampler::restore(SamplingParams p, uint64_t draws) {
  Sampler s(p);
  s.rng_.discard(draws);
  s.draws_ = draws;
  return s;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error(Errc::invalid_argument, "sample: no logits");
  // The check runs on every row of every step: a pass without an early exit vectorises; the
  // index is looked for only to name it.
  bool any_nan = false;
  for (const float v : logits) any_nan |= std::isnan(v);
  if (any_nan) {
    const size_t i = static_cast<size_t>(
        std::find_if(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }) -
        logits.begin());
    throw Error(Errc::invalid_argument, "sample: logit " + std::to_string(i) + " is NaN");
  }
  if (p_.temperature == 0) {  // greedy; ties go to the lowest id
    // The maximum, then its first position: two passes that vectorise where std::max_element's
    // one does not (with the NaN check, 94 against 413 us a 128k row: bench/sampling).
    float best = logits[0];
    for (const float v : logits) best = std::max(best, v);
    return static_cast<int32_t>(std::find(logits.begin(), logits.end(), best) - logits.begin());
  }
  const int n = static_cast<int>(logits.size());
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  // Highest logit first; equal logits by id so the order is fully determined.
  auto higher = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int k = (p_.top_k > 0 && p_.top_k < n) ? p_.top_k : n;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), higher);
  order_.resize(k);

  probs_.resize(k);
  const double max_logit = logits[order_[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += probs_[i] = std::exp((logits[order_[i]] - max_logit) / p_.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  int keep = k;
  if (p_.top_p < 1) {
    double cumulative = 0;
    for (int i = 0; i < k; ++i) {
      cumulative += probs_[i] / sum;
      if (cumulative >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_sum = 0;
  for (int i = 0; i < keep; ++i) kept_sum += probs_[i];
  const double u =
      static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept_sum;  // uniform in [0, kept_sum)
  ++draws_;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[keep - 1];
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t id, int top_n) {
  if (id < 0 || static_cast<size_t>(id) >= logits.size())
    throw Error(Errc::invalid_argument, "token_logprobs: id " + std::to_string(id) +
                                            " is outside the " + std::to_string(logits.size()) +
                                            " logits");
  const float best = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float v : logits) sum += std::exp(double(v) - best);
  const double log_z = best + std::log(sum);
  TokenLogprobs out;
  out.id = id;
  out.logprob = static_cast<float>(double(logits[static_cast<size_t>(id)]) - log_z);
  const size_t n = std::min(static_cast<size_t>(std::max(top_n, 0)), logits.size());
  if (n == 0) return out;
  // The n largest by one pass over a small sorted list (n <= 20 here; the vocab is ~1e5).
  auto before = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  std::vector<std::pair<int32_t, float>>& top = out.top;
  top.reserve(n + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const std::pair<int32_t, float> c{static_cast<int32_t>(i), logits[i]};
    if (top.size() == n && !before(c, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), c, before), c);
    if (top.size() > n) top.pop_back();
  }
  for (auto& [tok, v] : top) v = static_cast<float>(double(v) - log_z);
  return out;
}

}  // namespace duet
