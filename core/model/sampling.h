#pragma once
// Picking the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k and top-p, deterministic for a given seed (the generator is std::mt19937_64 and the
// uniform draw is computed here, so results do not depend on the standard library).
#include <cstdint>
#include <random>
#include <span>
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

}  // namespace duet
