#pragma once
// Picking the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k and top-p, deterministic for a given seed (the generator is std::mt19937_64 and the
// uniform draw is computed here, so results do not depend on the standard library).
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace duet {

struct SamplingParams {
  float temperature = 0;  // 0 = greedy
  int top_k = 0;          // 0 = all tokens
  float top_p = 1;        // 1 = no nucleus cut
  uint64_t seed = 0;
  void validate()
      const;  // throws invalid_argument: NaN/negative temperature, top_p outside (0,1], top_k < 0
};

class Sampler {
 public:
  explicit Sampler(SamplingParams p);
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return p_; }
  // The generator's whole state is (seed, draws made): a restarted frontend rebuilds a sampler
  // from the request journal with restore() and samples what the undisturbed one would have.
  uint64_t draws() const { return draws_; }
  static Sampler restore(SamplingParams p, uint64_t draws);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;          // rng_() calls so far
  std::vector<int32_t> order_;  // candidate ids, reused between calls
  std::vector<double> probs_;
};

// A token's log-probability under the logits' own distribution (log-softmax at temperature 1,
// in double: what OpenAI's and vLLM's logprobs report, before any sampling transform), and the
// top_n likeliest tokens', most likely first (ties: the lower id first).
struct TokenLogprobs {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob)
};
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t id, int top_n);
// How many of the likeliest tokens a request may ask log-probabilities of (OpenAI's cap):
// the frontend's, http_svc's and the CLI's bound.
constexpr int kMaxTopLogprobs = 20;

}  // namespace duet
