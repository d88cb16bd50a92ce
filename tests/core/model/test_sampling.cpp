// Sampling: greedy, temperature, top-k, top-p, seeds and validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/sampling.h"
#include "tests/support/error_code.h"

namespace duet {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

std::map<int, int> histogram(SamplingParams p, int draws) {
  Sampler s(p);
  std::map<int, int> h;
  for (int i = 0; i < draws; ++i) ++h[s.sample(kLogits)];
  return h;
}

TEST(Sampling, GreedyTakesTheHighestLogitAndTheLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.sample(kLogits), 1);
}

// A restarted frontend rebuilds a request's sampler from (seed, draws) in its journal: the rest of
// the sequence is the undisturbed sampler's.
TEST(Sampling, ARestoredSamplerContinuesTheSequenceOfTheOriginal) {
  const SamplingParams p{.temperature = 1.5f, .top_p = 0.9f, .seed = 77};
  Sampler original(p);
  std::vector<int32_t> first;
  for (int i = 0; i < 37; ++i) first.push_back(original.sample(kLogits));
  ASSERT_EQ(original.draws(), 37u);
  Sampler restored = Sampler::restore(p, original.draws());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(restored.sample(kLogits), original.sample(kLogits)) << i;
  EXPECT_EQ(restored.draws(), original.draws());
  Sampler greedy({});
  greedy.sample(kLogits);
  EXPECT_EQ(greedy.draws(), 0u) << "greedy draws nothing";
}

TEST(Sampling, TopKOneIsGreedyAtAnyTemperature) {
  const auto h = histogram({.temperature = 5.0f, .top_k = 1, .seed = 3}, 200);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 1);
}

TEST(Sampling, TopKLimitsTheCandidates) {
  const auto h = histogram({.temperature = 1.0f, .top_k = 3, .seed = 4}, 2000);
  for (const auto& [id, count] : h) EXPECT_TRUE(id == 1 || id == 4 || id == 2) << "id " << id;
  EXPECT_EQ(h.size(), 3u);
}

TEST(Sampling, TemperatureOneFollowsTheSoftmax) {
  const int draws = 20000;
  const auto h = histogram({.temperature = 1.0f, .seed = 5}, draws);
  double sum = 0;
  for (float l : kLogits) sum += std::exp(l);
  for (int id = 0; id < 6; ++id) {
    const double expect = std::exp(kLogits[id]) / sum;
    const double got = h.count(id) ? double(h.at(id)) / draws : 0.0;
    EXPECT_NEAR(got, expect, 0.015) << "id " << id;
  }
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  // p(1) = p(4) ~ 0.35 each, p(2) ~ 0.21: top_p 0.6 keeps only ids 1 and 4.
  const auto h = histogram({.temperature = 1.0f, .top_p = 0.6f, .seed = 6}, 2000);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(1) && h.count(4));
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto run = [](uint64_t seed) {
    Sampler s({.temperature = 2.0f, .seed = seed});
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(kLogits));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampling, InvalidParametersAndLogitsAreRejected) {
  for (SamplingParams p : {SamplingParams{.temperature = -1.0f}, SamplingParams{.temperature = NAN},
                           SamplingParams{.top_k = -2}, SamplingParams{.top_p = 0.0f},
                           SamplingParams{.top_p = 1.5f}, SamplingParams{.top_p = NAN}}) {
    try {
      Sampler s(p);
      FAIL() << "accepted temperature " << p.temperature << " top_k " << p.top_k << " top_p "
             << p.top_p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
    }
  }
  Sampler s({});
  EXPECT_THROW(s.sample({}), Error);
  const std::vector<float> nan_logits = {0.0f, NAN};
  EXPECT_THROW(s.sample(nan_logits), Error);
  // The error names the first NaN, wherever it is and however large the maximum.
  std::vector<float> row(4096, 1.0f);
  row[3000] = 50.0f;
  row[1234] = NAN;
  row[2000] = NAN;
  std::string message;
  EXPECT_EQ(test_support::error_code_of([&] { s.sample(row); }, &message), Errc::invalid_argument);
  EXPECT_NE(message.find("logit 1234 is NaN"), std::string::npos) << message;
}

// Log-probabilities are the logits' log-softmax at temperature 1, whatever the sampler does; the
// likeliest come most likely first, equal ones lower id first.
TEST(Sampling, TokenLogprobsAreTheLogSoftmaxAndTheLikeliestInOrder) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  double z = 0;
  for (const float v : logits) z += std::exp(double(v));
  const TokenLogprobs lp = token_logprobs(logits, 2, 3);
  EXPECT_EQ(lp.id, 2);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_FLOAT_EQ(lp.top[2].second, lp.logprob);
  EXPECT_TRUE(token_logprobs(logits, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 0, 20).top.size(), logits.size());
  // Large logits stay finite (the maximum is taken out before the exponentials).
  const std::vector<float> big = {1000.0f, 999.0f};
  EXPECT_NEAR(token_logprobs(big, 1, 0).logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_THROW(token_logprobs(logits, 5, 1), Error);
  EXPECT_THROW(token_logprobs(logits, -1, 1), Error);
}

}  // namespace
}  // namespace duet
